"""Simulated SGLang server processes on loopback, launched directly (no SSH, no Airflow).

For benchmarks and the slow generation tests, where only the servers matter: one node, one server
per simulated GPU, each with the seed's post-tuning flags unless told otherwise.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from fleetgen.generate import ServerEndpoint, server_limits
from sglang_sim.node import create_node, write_faults
from sglang_sim.presets import install_model

# The worked case (docs/sglang-memory-model.md §4.2): the launch options every arm shares, and the
# hand-tuned memory flags (effective max_running_requests 40).
SEED_BASE_FLAGS = ["--speculative-algorithm", "NEXTN", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
                   "--speculative-num-draft-tokens", "4", "--mamba-radix-cache-strategy", "extra_buffer",
                   "--context-length", "8192", "--reasoning-parser", "qwen3"]
SEED_HAND_TUNED_FLAGS = ["--max-mamba-cache-size", "200", "--mem-fraction-static", "0.93", "--max-running-requests", "64"]
SEED_FLAGS = SEED_BASE_FLAGS + SEED_HAND_TUNED_FLAGS


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def get_json(url: str, timeout: float = 5.0) -> dict:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.loads(response.read())


def wait_healthy(process: subprocess.Popen, url: str, timeout_s: float = 30.0) -> None:
    """Until ``url``/health answers 200 (the port opens only after weights, pools and graphs).
    Raises RuntimeError if the process exits first or the time runs out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the simulated server behind {url} exited with status {process.returncode}")
        try:
            if urllib.request.urlopen(f"{url}/health", timeout=1).status == 200:
                return
        except OSError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"the simulated server behind {url} was not healthy after {timeout_s:.0f} s")


class LocalSimFleet:
    """``count`` servers, one per simulated GPU of one node; ``faults`` maps a server index to its faults."""

    def __init__(self, root: Path, count: int, *, sim: dict, faults: dict[int, dict] | None = None,
                 extra_flags: tuple[str, ...] = (), flags: list[str] | None = None) -> None:
        self.root = root
        self.flags = list(SEED_FLAGS if flags is None else flags) + list(extra_flags)
        self.ports = [free_port() for _ in range(count)]
        self.node = create_node(root / "node", name="node0", gpus=count, sim=sim)
        self.model_dir = root / "model"
        install_model(self.model_dir, "qwen3.6-27b")
        for index, fault in (faults or {}).items():
            write_faults(self.node, self.ports[index], fault)
        self.processes: list[subprocess.Popen] = []

    def __enter__(self) -> "LocalSimFleet":
        for index, port in enumerate(self.ports):
            env = {**os.environ, **self.node.env(), "CUDA_VISIBLE_DEVICES": str(index)}
            log = (self.root / f"server-{port}.log").open("wb")
            self.processes.append(subprocess.Popen(
                [sys.executable, "-m", "sglang_sim.server", "--model-path", str(self.model_dir),
                 "--host", "127.0.0.1", "--port", str(port), *self.flags],
                env=env, stdout=log, stderr=subprocess.STDOUT))
        for port, process in zip(self.ports, self.processes):
            try:
                wait_healthy(process, f"http://127.0.0.1:{port}", timeout_s=90)
            except RuntimeError as error:
                self.__exit__()
                raise RuntimeError(f"{error}; see {self.root}") from None
        return self

    def __exit__(self, *exc) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.terminate()
        for process in self.processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def url(self, index: int) -> str:
        return f"http://127.0.0.1:{self.ports[index]}"

    def capacity(self, index: int) -> dict:
        """The simulator's own figures: max batch, tokens/s at full batch, finished requests."""
        return get_json(self.url(index) + "/server_info")["internal_states"][0]["sim"]

    def endpoints(self, *, headroom: float = 1.25, parallel_shards: int = 1) -> list[ServerEndpoint]:
        mrr = {f"127.0.0.1:{port}": get_json(self.url(i) + "/server_info")["internal_states"][0]
               ["effective_max_running_requests_per_dp"] for i, port in enumerate(self.ports)}
        limits = server_limits(mrr, headroom=headroom, parallel_shards=parallel_shards)
        return [ServerEndpoint(name=name, url=f"http://{name}", max_in_flight=limit) for name, limit in limits.items()]
