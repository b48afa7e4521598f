"""GPU sampling: the remote loop (run in a real bash against the fake nvidia-smi), its parsing, and one
sampling session per node however many shards run."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import time

from fleetgen.nodes import remote
from fleetgen.nodes.gpu_sampling import SAMPLE_QUERY, GpuSampling, NodeLease, parse_sample_lines
from fleetgen.outputs import RunLayout
from sglang_sim.node import create_node

log = logging.getLogger("test")


class LocalStream:
    """A command run by bash here, read line by line: stands in for an SSH session."""

    opened: list[str] = []

    def __init__(self, command: str, env: dict) -> None:
        self.process = subprocess.Popen(["bash", "-c", command], stdout=subprocess.PIPE, text=True, env=env)
        LocalStream.opened.append(command)

    def __iter__(self):
        for line in self.process.stdout:
            yield line.rstrip("\n")

    def close(self) -> None:
        self.process.kill()
        self.process.wait()


def node_env(tmp_path):
    node = create_node(tmp_path / "node", name="gpu-node", gpus=2)
    return node, {**os.environ, **node.env()}


def test_the_loop_is_one_quoted_shell_and_its_output_parses(tmp_path):
    _, env = node_env(tmp_path)
    command = remote.sampling_loop_command(SAMPLE_QUERY, interval_s=0.05, max_seconds=2)
    assert "while" in command and "sleep 0.05" in command
    done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, env=env, timeout=20)
    assert done.returncode == 0, done.stderr  # ends by itself after max_seconds
    rows = list(parse_sample_lines(done.stdout.splitlines(), node="gpu-node"))
    assert len({row["t"] for row in rows}) >= 3 and {row["gpu"] for row in rows} == {0, 1}
    assert rows[0] == {"t": rows[0]["t"], "node": "gpu-node", "gpu": 0, "util": 0.0, "power_w": 140.0,
                       "mem_mib": 512.0}
    assert abs(rows[0]["t"] - time.time()) < 60


def test_unreadable_values_and_noise_lines():
    lines = ["warning: something", "@@fleetgen:t=100.5", "0, [N/A], [Not Supported], 1024", "garbage",
             "@@fleetgen:t=105.5", "0, 97, 901.5, 2048"]
    assert list(parse_sample_lines(lines, node="n")) == [
        {"t": 100.5, "node": "n", "gpu": 0, "util": None, "power_w": None, "mem_mib": 1024.0},
        {"t": 105.5, "node": "n", "gpu": 0, "util": 97.0, "power_w": 901.5, "mem_mib": 2048.0}]


def test_one_session_per_node_across_shards_and_a_takeover_when_the_holder_ends(tmp_path):
    _, env = node_env(tmp_path)
    layout = RunLayout(tmp_path / "run")
    LocalStream.opened = []

    def open_stream(node, command):
        return LocalStream(command, env)

    first = GpuSampling(nodes=["gpu-node"], open_stream=open_stream, layout=layout, shard_id=0, interval_s=0.05,
                        log=log)
    second = GpuSampling(nodes=["gpu-node"], open_stream=open_stream, layout=layout, shard_id=1, interval_s=0.05,
                         log=log)
    with first:
        time.sleep(0.4)
        with second:
            time.sleep(0.4)
            assert len(LocalStream.opened) == 1  # the second shard waits on the lease
        # second ended first: it never sampled
    assert len(LocalStream.opened) == 1
    rows = [json.loads(line) for line in layout.shard_file("gpu", 0).read_text().splitlines()]
    assert len(rows) >= 4 and not layout.shard_file("gpu", 1).read_text()
    assert not (layout.kind_dir("gpu") / "gpu-node.lease").exists()  # released on exit

    third = GpuSampling(nodes=["gpu-node"], open_stream=open_stream, layout=layout, shard_id=2, interval_s=0.05,
                        log=log)
    with third:
        time.sleep(0.4)
    assert len(LocalStream.opened) == 2 and layout.shard_file("gpu", 2).read_text()


def test_a_stale_lease_is_taken_over(tmp_path):
    path = tmp_path / "gpu" / "n.lease"
    holder = NodeLease(path, "shard 0", stale_s=0.2)
    other = NodeLease(path, "shard 1", stale_s=0.2)
    assert holder.acquire() and not other.acquire()
    time.sleep(0.3)
    assert other.acquire() and path.read_text() == "shard 1"
    holder.release()  # not its lease any more: left alone
    assert path.exists()
