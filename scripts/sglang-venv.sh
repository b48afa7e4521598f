#!/usr/bin/env bash
# Build .sglang-venv/: SGLang 0.5.23 importable on a CPU-only machine, so tests can run SGLang's real
# ServerArgs argparse parser over the command lines the tuner emits (tests/sglang_parser/), and its
# argument resolution and memory-pool sizing with the GPU mocked (tests/oracle/).
# SGLang is installed without its dependency tree (which wants CUDA wheels); the packages below are
# what `sglang.srt.server_args` needs at import time, plus transformers (the pinned release SGLang
# requires) for ModelConfig and prometheus_client for its metric names. From scratch: about a minute,
# about 2.4 GB.
# Usage: scripts/sglang-venv.sh [VENV_DIR]   (default: .sglang-venv in the repository root)
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv_dir="${1:-$repo_root/.sglang-venv}"
python_bin="${PYTHON:-python3.11}"
check='import argparse, dill, yaml, transformers, prometheus_client; from sglang.srt.server_args import ServerArgs; ServerArgs.add_cli_args(argparse.ArgumentParser())'

if [[ -x "$venv_dir/bin/python" ]] && "$venv_dir/bin/python" -c "$check" >/dev/null 2>&1; then
    echo "sglang-venv: $venv_dir already imports sglang.srt.server_args and transformers"
    exit 0
fi

started=$(date +%s)
"$python_bin" -m venv "$venv_dir"
# Keep the environment out of git whatever the repository's .gitignore says.
echo '*' > "$venv_dir/.gitignore"
log="$venv_dir/install.log"
install() {
    if ! "$venv_dir/bin/python" -m pip install --disable-pip-version-check "$@" >>"$log" 2>&1; then
        echo "sglang-venv: pip install $* failed; last lines of $log:" >&2
        tail -n 30 "$log" >&2
        exit 1
    fi
}
install --no-deps "sglang==0.5.23"
# torch CPU build: pip takes the local CPU wheel when one is on its find-links path.
install "torch==2.13.0"
install numpy==2.4.6 orjson==3.13.0 psutil==7.2.2 pybase64==1.5.1 requests==2.34.2 triton==3.9.0 \
    packaging==26.4 pillow==13.0.0 starlette==1.10.0 pydantic==2.14.4 pyzmq==27.3.0 tqdm==4.70.1 \
    ipython==9.18.1 aiohttp==3.14.5 msgspec==0.22.0
install transformers==5.19.0 tokenizers==0.23.2 prometheus-client==0.26.0 dill==0.4.1 pyyaml==6.0.3
"$venv_dir/bin/python" -c "$check"
echo "sglang-venv: built $venv_dir in $(( $(date +%s) - started )) s, $(du -sh "$venv_dir" | cut -f1)"
