"""The real SGLang 0.5.23 server on this CPU-only machine: paths, flags and a launcher for the tests.

The server runs from ``.sglang-venv`` (``scripts/sglang-venv.sh`` then ``scripts/sglang-server-venv.sh``) with
``tests/real_sglang/stand_ins`` on its ``PYTHONPATH`` (the ``sgl_kernel`` stand-in). docs/real-sglang.md says what
each flag and variable below is for and what the real server answers.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from fleetgen.errors import FailureKind
from fleetgen.nodes.readiness import find_fatal

PROJECT_ROOT = Path(__file__).resolve().parents[2]
VENV = PROJECT_ROOT / ".sglang-venv"
PYTHON = VENV / "bin" / "python"
SERVER_STAMP = VENV / ".server-built"
STAND_INS = Path(__file__).resolve().parent / "stand_ins"
TINY_MODELS = Path(__file__).resolve().parent / "tiny_models.py"
MODULE = "sglang.launch_server"
VERSION = "0.5.23"

# The environment the server needs on a CPU-only machine: the CPU engine (else rotary embedding imports vllm),
# the sgl_kernel stand-in, one OpenMP thread per process (two cores serve several servers and the tests).
ENV = {"SGLANG_USE_CPU_ENGINE": "1", "PYTHONPATH": str(STAND_INS), "OMP_NUM_THREADS": "1"}
# A KV pool the tests pin: without it SGLang sizes the pool from free host RAM (tens of millions of tokens).
KV_TOKENS = 32768
# What a user with a CPU node passes as server.extra_args; random weights, no weight files. --sleep-on-idle: an
# idle scheduler otherwise polls its sockets without pause, taking a whole core per server from the tests.
CPU_FLAGS = ("--load-format", "dummy", "--device", "cpu", "--attention-backend", "torch_native",
             "--sampling-backend", "pytorch", "--disable-cuda-graph", "--grammar-backend", "none", "--sleep-on-idle")
# Hybrid (Gated DeltaNet) models on CPU: extra_buffer needs Mamba state snapshots the CPU platform lacks,
# and no_buffer needs the overlap scheduler off (sglang/srt/arg_groups/mamba_hook.py).
HYBRID_FLAGS = ("--mamba-radix-cache-strategy", "no_buffer", "--disable-overlap-schedule")


def missing() -> str | None:
    """Why the real server cannot run here, or None."""
    if not PYTHON.exists():
        return f"{PYTHON} is missing: run `make test` (it builds .sglang-venv) or scripts/sglang-venv.sh"
    if not SERVER_STAMP.exists():
        return f"{SERVER_STAMP} is missing: run scripts/sglang-server-venv.sh (make test does)"
    return None


def require_real_sglang() -> None:
    """Skip the calling test when the real server cannot run here, saying what to run; under CI, fail."""
    import pytest

    reason = missing()
    if reason is None:
        return
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"CI must build the real SGLang server: {reason}", pytrace=False)
    pytest.skip(reason)


def write_tiny_models(dest: Path) -> dict[str, Path]:
    """``{"dense": folder, "hybrid": folder}`` under ``dest`` (tests/real_sglang/tiny_models.py)."""
    subprocess.run([str(PYTHON), str(TINY_MODELS), str(dest)], check=True)
    return {name: dest / name for name in ("dense", "hybrid")}


def real_fleet(fleet: dict, model_dir: Path, served_name: str = "tiny-dense") -> dict:
    """A fleet description (``SimEnvironment.fleet()``'s) whose servers are real SGLang on this CPU: described
    as a user with an unusual node would, in ``server.python``/``module``/``env``/``extra_args``."""
    return {**fleet, "model": {"path": str(model_dir), "served_name": served_name},
            "server": {**fleet["server"], "python": str(PYTHON), "module": MODULE, "stop_grace_s": 30,
                       "extra_args": [*CPU_FLAGS, "--max-total-tokens", str(KV_TOKENS)], "env": dict(ENV)}}


def write_short_prompts(path: Path, count: int) -> Path:
    """``count`` short chat prompts (ids ``r0000``...): the tiny model's context is small and CPU prefill slow."""
    topics = ("tidal energy", "graph search", "Roman law", "jazz harmony", "bird migration", "soil chemistry")
    with path.open("w") as out:
        for index in range(count):
            out.write(json.dumps({"id": f"r{index:04d}", "messages": [
                {"role": "user", "content": f"Question {index}: explain {topics[index % len(topics)]} step by step, "
                                            "briefly."}]}) + "\n")
    return path


# Random weights write junk that rarely stops on its own and carries no reasoning: the DAG's thresholds on
# content are the user's to set, and these say "any text".
CONTENT_THRESHOLDS = {"min_reasoning_share": 0.0, "max_length_share": 1.0, "max_empty_answer_share": 1.0}


def stop_fleet_servers(environment) -> None:
    """Stop the real servers a DAG run left on the simulated nodes (as the DAG does: pid file, SIGTERM)."""
    from fleetgen.nodes.remote import stop_command
    from sglang_sim import sshd

    for index in range(environment.nodes):
        ports = [environment.node_base_port(index) + gpu for gpu in range(environment.gpus_per_node)]
        command = stop_command(run_dir="~/fleetgen/run", module=MODULE, ports=ports, grace_s=30)
        subprocess.run(["bash", "-c", command], env=sshd.node_environment(environment.node_dir(index)),
                       stdout=subprocess.DEVNULL, check=False)


def launch_argv(model_dir: Path, port: int, *flags: str, kv_tokens: int | None = KV_TOKENS) -> list[str]:
    argv = [str(PYTHON), "-m", MODULE, "--model-path", str(model_dir), *CPU_FLAGS,
            "--host", "127.0.0.1", "--port", str(port), "--enable-metrics"]
    if kv_tokens is not None:
        argv += ["--max-total-tokens", str(kv_tokens)]
    return argv + list(flags)


def get(url: str, timeout: float = 10.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def post_json(url: str, body: dict, timeout: float = 120.0) -> tuple[int, dict | bytes]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            raw = response.read()
            status = response.status
    except urllib.error.HTTPError as error:
        raw, status = error.read(), error.code
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw


class ServerProcess:
    """What the real server and its simulated twin (``probes.SimServer``) share: readiness by ``/health``, the log,
    and ``with server:`` starting it, waiting until ready, and stopping it."""

    KIND = "server"
    READY_TIMEOUT_S = 240.0
    POLL_S = 0.25

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait_ready(self, timeout_s: float | None = None):
        """Until ``/health`` answers 200 (each status kept in ``health_codes``); RuntimeError with the log's end if
        the process exits first or the time runs out."""
        timeout_s = self.READY_TIMEOUT_S if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the {self.KIND} on port {self.port} exited with {self.process.returncode}:\n"
                                   f"{self.log_tail()}")
            if self.port_taken():  # SGLang keeps running after uvicorn's bind failed: /health would be another's
                raise RuntimeError(f"the {self.KIND} could not bind port {self.port} (another process holds it):\n"
                                   f"{self.log_tail()}")
            try:
                status, _ = get(f"{self.url}/health", timeout=5)
                self.health_codes.append(status)
                if status == 200:
                    return self
            except OSError:
                pass
            time.sleep(self.POLL_S)
        raise RuntimeError(f"the {self.KIND} on port {self.port} was not ready after {timeout_s:.0f} s:\n"
                           f"{self.log_tail()}")

    def port_taken(self) -> bool:
        """Whether the log holds the bind failure the product's readiness check reports as a port in use."""
        fatal = find_fatal(self.log_text().splitlines())
        return fatal is not None and fatal.kind is FailureKind.PORT_IN_USE

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def __enter__(self):
        self.start()
        try:
            return self.wait_ready()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc) -> None:
        self.stop()


@dataclass
class RealServer(ServerProcess):
    """One ``sglang.launch_server`` process in its own session, its output in ``log_path``."""

    KIND = "real SGLang server"

    model_dir: Path
    port: int
    log_path: Path
    flags: tuple[str, ...] = ()
    kv_tokens: int | None = KV_TOKENS
    env: dict = field(default_factory=dict)
    process: subprocess.Popen | None = None
    health_codes: list = field(default_factory=list)  # every /health status seen while starting

    def start(self) -> "RealServer":
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                launch_argv(self.model_dir, self.port, *self.flags, kv_tokens=self.kv_tokens),
                env={**os.environ, **ENV, **self.env}, stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True)
        return self

    def wait_exit(self, timeout_s: float = 240.0) -> int:
        """The exit status of a server expected to fail at start-up."""
        try:
            return self.process.wait(timeout=timeout_s)
        finally:
            self.stop()

    def stop(self, grace_s: float = 30.0) -> int | None:
        """SIGTERM to the server's session (SGLang drains and exits), SIGKILL after ``grace_s``."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.process.pid, signal.SIGKILL)  # children left behind, if any
        except ProcessLookupError:
            pass
        self.process.wait()
        return self.process.returncode
