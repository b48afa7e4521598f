"""GPU sampling: the remote loop (run in a real bash against the fake nvidia-smi), its parsing, and one
sampling session per node however many shards run."""

from __future__ import annotations

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


def wait_until(condition, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_the_loop_is_one_shell_that_ends_with_its_session_and_its_output_parses(tmp_path):
    _, env = node_env(tmp_path)
    command = remote.sampling_loop_command(SAMPLE_QUERY, interval_s=0.05, max_seconds=600)
    assert "while" in command and "sleep 0.05" in command
    stream = LocalStream(command, env)
    lines = []
    for line in stream:  # one session: read three samples, then close it as a finished shard does
        lines.append(line)
        if sum(remote.timed_sample_time(seen) is not None for seen in lines) == 4:
            break
    stream.close()
    rows = list(parse_sample_lines(lines, node="gpu-node"))
    assert len({row["t"] for row in rows}) == 3 and [row["gpu"] for row in rows] == [0, 1] * 3
    assert rows[0] == {"t": rows[0]["t"], "node": "gpu-node", "gpu": 0, "util": 0.0, "power_w": 140.0,
                       "mem_mib": 512.0}
    assert abs(rows[0]["t"] - time.time()) < 60
    ended = subprocess.run(["bash", "-c", remote.sampling_loop_command(SAMPLE_QUERY, interval_s=1, max_seconds=0)],
                           capture_output=True, text=True, env=env, timeout=60)
    assert ended.returncode == 0 and ended.stdout == ""  # the loop's own end, should a session never close


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
    gpu_rows = lambda shard: layout.shard_file("gpu", shard).read_text().count("\n")  # noqa: E731
    with first:
        wait_until(lambda: gpu_rows(0) >= 4)
        with second:
            time.sleep(0.3)  # several of the second shard's lease checks
            assert len(LocalStream.opened) == 1  # the second shard waits on the lease
        # second ended first: it never sampled
    assert len(LocalStream.opened) == 1 and gpu_rows(1) == 0
    assert not (layout.kind_dir("gpu") / "gpu-node.lease").exists()  # released on exit

    third = GpuSampling(nodes=["gpu-node"], open_stream=open_stream, layout=layout, shard_id=2, interval_s=0.05,
                        log=log)
    with third:
        wait_until(lambda: gpu_rows(2) >= 2)
    assert len(LocalStream.opened) == 2


def test_a_stale_lease_is_taken_over(tmp_path):
    path = tmp_path / "gpu" / "n.lease"
    holder = NodeLease(path, "shard 0", stale_s=0.2)
    other = NodeLease(path, "shard 1", stale_s=0.2)
    assert holder.acquire() and not other.acquire()
    time.sleep(0.3)
    assert other.acquire() and path.read_text() == "shard 1"
    holder.release()  # not its lease any more: left alone
    assert path.exists()
