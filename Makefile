# fleetgen: `make demo` runs the DAG end to end on a simulated fleet; `make test` runs every test.
# Both set up what they need (a virtualenv in .venv with the pinned dependencies) on first use.
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# SGLang 0.5.23 on CPU in its own venv: the tests check the tuner's flags against SGLang's real parser.
SGLANG_STAMP := .sglang-venv/.built
# The real SGLang server on CPU for tests/real_sglang/: what launch_server needs, on top of the SGLang venv.
SGLANG_SERVER_STAMP := .sglang-venv/.server-built
SGLANG_SERVER_INPUTS := scripts/sglang-server-venv.sh tests/real_sglang/stand_ins/torchvision_meta_stub.pth \
	$(wildcard tests/real_sglang/patches/*)
PYTEST_ARGS ?=
# Three workers on the two cores: most tests wait (on SSH, simulated servers, Airflow's polling) more than they
# compute, so a third worker overlaps those waits. tests/conftest.py keeps each file, and all of
# tests/real_sglang/ (CPU-bound on real servers), on one worker.
PYTEST_WORKERS ?= 3
# The browser tests drive Debian's Chromium (Playwright cannot download browser builds here).
CHROMIUM ?= /usr/bin/chromium

.PHONY: setup demo test test-fast bench mutation ui prod-up prod-down openssh chromium clean

setup: $(STAMP)

$(STAMP): requirements.txt requirements-dev.txt constraints.txt pyproject.toml
	@$(PYTHON) -c 'import sys; assert sys.version_info[:2] == (3, 11), f"Python 3.11 is required, found {sys.version.split()[0]}"'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check pip==26.3 uv==0.13.9
	$(BIN)/uv pip install --quiet --python $(BIN)/python --compile-bytecode -r requirements.txt -r requirements-dev.txt -c constraints.txt -e .
	touch $(STAMP)

$(SGLANG_STAMP): scripts/sglang-venv.sh
	bash scripts/sglang-venv.sh
	touch $(SGLANG_STAMP)

$(SGLANG_SERVER_STAMP): $(SGLANG_STAMP) $(SGLANG_SERVER_INPUTS)
	bash scripts/sglang-server-venv.sh
	touch $(SGLANG_SERVER_STAMP)

demo: $(STAMP)
	$(BIN)/python -m devstack.demo

# The end-to-end tests also run the simulated nodes behind Debian's OpenSSH sshd (started unprivileged on
# loopback by the tests themselves). Installed here when we are root; otherwise those variants are skipped.
openssh:
	@if command -v /usr/sbin/sshd >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssh-server >/dev/null; \
	else echo "openssh-server is not installed and we are not root: the OpenSSH end-to-end variants will be skipped"; fi

test: $(STAMP) $(SGLANG_STAMP) $(SGLANG_SERVER_STAMP) openssh chromium
	FLEETGEN_CHROMIUM=$(CHROMIUM) $(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

# Installed with apt when running as root; otherwise the browser tests say how to provide it and skip.
chromium:
	@if [ ! -x "$(CHROMIUM)" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	  else \
	    echo "note: $(CHROMIUM) not found and not root: the browser tests will be skipped (see README)"; \
	  fi; \
	fi

test-fast: $(STAMP)
	$(BIN)/python -m pytest -m "not slow" $(PYTEST_ARGS)

bench: $(STAMP)
	for script in bench/[!_]*.py; do $(BIN)/python $$script || exit 1; done

# Mutation testing of the critical modules (mutation/modules.toml), not part of `make test`. By default only
# the modules whose source or mapped tests changed since their recorded result; MODULES=remote,store picks
# some, MODULES=all runs every one (over an hour on 2 cores). MUTATION_WORKERS caps the workers.
MUTATION_STAMP := $(VENV)/.mutation-installed
MODULES ?=
MUTATION_WORKERS ?= 2

$(MUTATION_STAMP): $(STAMP) requirements-mutation.txt
	$(BIN)/uv pip install --quiet --python $(BIN)/python -r requirements-mutation.txt -c constraints.txt
	touch $(MUTATION_STAMP)

mutation: $(MUTATION_STAMP)
	$(BIN)/python scripts/mutation.py --workers $(MUTATION_WORKERS) $(if $(MODULES),--modules $(MODULES))

ui: $(STAMP)
	$(BIN)/python -m devstack.ui

# Production-shaped Airflow (PostgreSQL + CeleryExecutor on Redis, two workers) against two simulated
# nodes; see README "Running on a production Airflow". prod-down stops it.
prod-up: $(STAMP)
	$(BIN)/python -m devstack.prod up

prod-down: $(STAMP)
	$(BIN)/python -m devstack.prod down

clean:
	rm -rf .demo .prod .pytest_cache mutation/.work
