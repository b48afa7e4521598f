"""GPU sampling: the remote loop (run in a real bash against the fake nvidia-smi), its parsing, and one
sampling session per node however many shards run."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import threading
import time

from fleetgen.generate.watch import JsonlAppender
from fleetgen.nodes import remote
from fleetgen.storage.run_files import LocalRunFiles, ObjectRunFiles
from fleetgen.nodes.gpu_sampling import (MAX_LOOP_SECONDS, SAMPLE_QUERY, GpuSampling, SamplerClaim, NodeSampler,
                                         parse_sample_lines)
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



def _claim(path, owner, *, stale_s):
    """The claim ``path`` (a file of a run's folder on a disk every worker sees)."""
    return SamplerClaim(LocalRunFiles(path.parent), path.name, owner, stale_s=stale_s)

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
            time.sleep(0.3)  # several of the second shard's claim checks
            assert len(LocalStream.opened) == 1  # the second shard waits on the claim
        # second ended first: it never sampled
    assert len(LocalStream.opened) == 1 and gpu_rows(1) == 0
    assert not (layout.kind_dir("gpu") / "gpu-node.sampler").exists()  # released on exit

    third = GpuSampling(nodes=["gpu-node"], open_stream=open_stream, layout=layout, shard_id=2, interval_s=0.05,
                        log=log)
    with third:
        wait_until(lambda: gpu_rows(2) >= 2)
    assert len(LocalStream.opened) == 2


def test_a_stale_claim_is_taken_over(tmp_path):
    path = tmp_path / "gpu" / "n.sampler"
    holder = _claim(path, "shard 0", stale_s=0.2)
    other = _claim(path, "shard 1", stale_s=0.2)
    assert holder.acquire() and not other.acquire()
    time.sleep(0.3)
    assert other.acquire() and path.read_text() == "shard 1"
    holder.release()  # not its claim any more: left alone
    assert path.exists()


def test_a_claim_exactly_stale_s_old_is_taken_over(tmp_path, monkeypatch):
    from fleetgen.nodes import gpu_sampling

    path = tmp_path / "gpu" / "n.sampler"
    assert _claim(path, "shard 0", stale_s=30).acquire()
    os.utime(path, (1_000.0, 1_000.0))
    monkeypatch.setattr(gpu_sampling.time, "time", lambda: 1_029.5)
    assert not _claim(path, "shard 1", stale_s=30).acquire()
    monkeypatch.setattr(gpu_sampling.time, "time", lambda: 1_030.0)
    assert _claim(path, "shard 1", stale_s=30).acquire() and path.read_text() == "shard 1"


def test_a_claim_that_keeps_changing_hands_is_not_taken_after_two_tries(tmp_path):
    """Each try finds the claim there and gone again before it can be read (other shards taking it over)."""
    tries = []

    class ChangingHands(LocalRunFiles):
        def create(self, name, data):
            tries.append(name)
            return False

        def read(self, name):
            return None

    claim = SamplerClaim(ChangingHands(tmp_path), "gpu/n.sampler", "shard 0", stale_s=30)
    assert claim.acquire() is False and tries == ["gpu/n.sampler"] * 2


def test_on_an_object_store_one_shard_holds_the_claim_until_it_goes_stale(object_store):
    files = ObjectRunFiles(object_store)
    holder = SamplerClaim(files, "gpu/n.sampler", "shard 0", stale_s=30, renew_every_s=3600)
    other = SamplerClaim(files, "gpu/n.sampler", "shard 1", stale_s=30)
    assert holder.acquire() and not other.acquire()
    written = object_store.head("gpu/n.sampler").etag
    holder.renew()  # within renew_every_s of the last write: no request
    assert object_store.head("gpu/n.sampler").etag == written
    other.stale_s = 0  # as if the holder had not renewed for stale_s
    assert other.acquire() and object_store.get("gpu/n.sampler") == b"shard 1"
    holder.release()  # not its claim any more: left alone
    assert object_store.get("gpu/n.sampler") == b"shard 1"
    other.release()
    assert object_store.head("gpu/n.sampler") is None


# In-memory sessions: each node's loop output as scripted lines, then a session that stays open until closed.
# Their waits are short: each step takes milliseconds, and a broken sampler must fail fast, not hang.
SHORT_WAIT_S = 5.0

class ScriptedStream:
    """A sampling session's stdout: the scripted lines, then nothing until it is closed (the loop sleeping)."""

    def __init__(self, lines: list[str]) -> None:
        self.lines = lines
        self.closed = threading.Event()

    def __iter__(self):
        for line in self.lines:
            if self.closed.is_set():
                return
            yield line
        self.closed.wait(SHORT_WAIT_S)

    def close(self) -> None:
        self.closed.set()


def samples(at: float, *rows: str) -> list[str]:
    return [f"{remote.SECTION_MARKER}t={at}", *rows]


def read_rows(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_every_gpu_of_every_node_is_sampled_into_the_shards_file_one_session_and_claim_per_node(tmp_path):
    layout = RunLayout(tmp_path / "run")
    sessions = {"n0": samples(10.0, "0, 91, 700.5, 150000", "1, 0, 90, 512"),
                "n1": samples(11.0, "0, 50, 400, 1000", "1, 60, 410, 2000", "2, 70, 420, 3000")}
    opened = []

    def open_stream(node, command):
        opened.append((node, command))
        return ScriptedStream(sessions[node])

    sampling = GpuSampling(nodes=["n0", "n1"], open_stream=open_stream, layout=layout, shard_id=3, interval_s=0.5,
                           log=log)
    assert [sampler.claim.where for sampler in sampling.samplers] == [str(layout.kind_dir("gpu") / "n0.sampler"),
                                                                     str(layout.kind_dir("gpu") / "n1.sampler")]
    assert all(sampler.claim.stale_s == 3 * 0.5 + 10 and sampler.claim.renew_every_s == 0.5
               for sampler in sampling.samplers)
    with sampling:
        wait_until(lambda: [sampler.rows for sampler in sampling.samplers] == [2, 3], timeout_s=SHORT_WAIT_S)
        owners = {path.name: path.read_text() for path in layout.kind_dir("gpu").glob("*.sampler")}
        assert set(owners) == {"n0.sampler", "n1.sampler"}
        assert all(owner.startswith(f"shard 3 pid {os.getpid()} at ") for owner in owners.values())
    expected_command = remote.sampling_loop_command(SAMPLE_QUERY, interval_s=0.5, max_seconds=MAX_LOOP_SECONDS)
    assert sorted(opened) == [("n0", expected_command), ("n1", expected_command)]
    rows = read_rows(layout.shard_file("gpu", 3))
    assert sorted((row["node"], row["gpu"], row["util"], row["power_w"], row["mem_mib"], row["t"]) for row in rows) == [
        ("n0", 0, 91.0, 700.5, 150000.0, 10.0), ("n0", 1, 0.0, 90.0, 512.0, 10.0),
        ("n1", 0, 50.0, 400.0, 1000.0, 11.0), ("n1", 1, 60.0, 410.0, 2000.0, 11.0),
        ("n1", 2, 70.0, 420.0, 3000.0, 11.0)]
    assert list(layout.kind_dir("gpu").glob("*.sampler")) == []  # both released on exit
    assert not any(sampler.is_alive() for sampler in sampling.samplers)


class FlakyOpener:
    """Fails to open the first sessions (a dropped connection), then opens scripted ones."""

    def __init__(self, failures: int, lines: list[str]) -> None:
        self.failures = failures
        self.lines = lines
        self.opened = 0

    def __call__(self, command: str):
        self.opened += 1
        if self.opened <= self.failures:
            raise ConnectionResetError("connection reset by peer")
        return ScriptedStream(self.lines)


def _sampler(tmp_path, open_stream, *, interval_s=0.01, owner="shard 0"):
    out = JsonlAppender(tmp_path / "gpu" / "shard-00000.jsonl")
    claim = _claim(tmp_path / "gpu" / "n.sampler", owner, stale_s=60)
    return NodeSampler(node="n", open_stream=open_stream, out=out, claim=claim, interval_s=interval_s,
                       log=log), out


def test_a_lost_session_is_reopened_after_one_warning_and_sampling_goes_on(tmp_path, caplog):
    opener = FlakyOpener(failures=3, lines=samples(5.0, "0, 1, 2, 3"))
    sampler, out = _sampler(tmp_path, opener)
    with caplog.at_level(logging.WARNING, logger="test"):
        sampler.start()
        try:
            wait_until(lambda: sampler.rows == 1, timeout_s=SHORT_WAIT_S)
        finally:
            sampler.stop()
            sampler.join(timeout=SHORT_WAIT_S)
            out.close()
    assert opener.opened == 4 and not sampler.is_alive()
    warnings = [record.getMessage() for record in caplog.records if record.name == "test"]
    assert warnings == ["GPU sampling on n interrupted (ConnectionResetError: connection reset by peer); retrying "
                        "every 0 s"]
    assert read_rows(tmp_path / "gpu" / "shard-00000.jsonl") == [
        {"t": 5.0, "node": "n", "gpu": 0, "util": 1.0, "power_w": 2.0, "mem_mib": 3.0}]
    assert not (tmp_path / "gpu" / "n.sampler").exists()


def test_a_failed_session_gives_the_claim_back_so_another_shard_may_sample(tmp_path):
    claim_path = tmp_path / "gpu" / "n.sampler"
    seen_claim = []

    def open_stream(command):
        seen_claim.append(claim_path.read_text())
        raise OSError("no route to host")

    # The next try is an interval away, longer than the test: the free claim after the failed try is a state
    # that lasts until the sampler stops (with a short interval it was free only between tries, a window a
    # busy machine's poll could miss).
    sampler, out = _sampler(tmp_path, open_stream, interval_s=600)
    sampler.start()
    try:
        wait_until(lambda: seen_claim and not claim_path.exists(), timeout_s=SHORT_WAIT_S)
        other = _claim(claim_path, "shard 1", stale_s=60)
        assert other.acquire()  # another shard takes it
    finally:
        sampler.stop()
        sampler.join(timeout=SHORT_WAIT_S)
        out.close()
    assert seen_claim == ["shard 0"] and not sampler.is_alive()
    assert claim_path.read_text() == "shard 1"  # the stopped sampler left the other's claim alone


def test_a_node_another_shard_samples_is_not_opened_until_its_claim_is_free(tmp_path):
    holder = _claim(tmp_path / "gpu" / "n.sampler", "shard 9", stale_s=60)
    assert holder.acquire()
    opener = FlakyOpener(failures=0, lines=samples(1.0, "0, 1, 2, 3"))
    sampler, out = _sampler(tmp_path, opener)
    sampler.start()
    try:
        time.sleep(0.1)  # several claim checks at 0.01 s
        assert opener.opened == 0 and sampler.rows == 0
        holder.release()
        wait_until(lambda: sampler.rows == 1, timeout_s=SHORT_WAIT_S)
    finally:
        sampler.stop()
        sampler.join(timeout=SHORT_WAIT_S)
        out.close()
    assert opener.opened == 1


def test_stopping_closes_an_open_session_at_once(tmp_path):
    stream = ScriptedStream(samples(1.0, "0, 1, 2, 3"))
    sampler, out = _sampler(tmp_path, lambda command: stream, interval_s=0.01)
    sampler.start()
    wait_until(lambda: sampler.rows == 1, timeout_s=SHORT_WAIT_S)
    assert not stream.closed.is_set()  # the session stays open between samples
    started = time.monotonic()
    sampler.stop()
    sampler.join(timeout=SHORT_WAIT_S)
    out.close()
    assert stream.closed.is_set() and not sampler.is_alive() and time.monotonic() - started < 5


def test_each_row_renews_the_claim(tmp_path):
    claim_path = tmp_path / "gpu" / "n.sampler"
    renewed = []

    class RenewSpy(SamplerClaim):
        def renew(self):
            renewed.append((self.files.root / self.name).stat().st_mtime)
            super().renew()

    out = JsonlAppender(tmp_path / "gpu" / "shard-00000.jsonl")
    sampler = NodeSampler(node="n", open_stream=lambda command: ScriptedStream(samples(1.0, "0, 1, 2, 3",
                                                                                       "1, 1, 2, 3")),
                          out=out, claim=RenewSpy(LocalRunFiles(claim_path.parent), claim_path.name, "shard 0", stale_s=60), interval_s=0.01, log=log)
    sampler.start()
    try:
        wait_until(lambda: sampler.rows == 2, timeout_s=SHORT_WAIT_S)
    finally:
        sampler.stop()
        sampler.join(timeout=SHORT_WAIT_S)
        out.close()
    assert len(renewed) == 2


def test_renewing_keeps_a_claim_from_going_stale(tmp_path):
    path = tmp_path / "gpu" / "n.sampler"
    holder = _claim(path, "shard 0", stale_s=30)
    other = _claim(path, "shard 1", stale_s=30)
    assert holder.acquire() and path.read_text() == "shard 0"
    os.utime(path, (time.time() - 60, time.time() - 60))  # not renewed for a minute
    holder.renew()
    assert not other.acquire() and path.read_text() == "shard 0"
    os.utime(path, (time.time() - 31, time.time() - 31))
    assert other.acquire() and path.read_text() == "shard 1"


def test_releasing_a_claim_that_is_gone_is_harmless(tmp_path):
    claim = _claim(tmp_path / "gpu" / "n.sampler", "shard 0", stale_s=30)
    claim.release()
    assert claim.acquire() and claim.acquire() is False  # held, even by the same owner: one session per node
    claim.release()
    assert not (claim.files.root / claim.name).exists()


def test_rows_carry_the_latest_time_mark_and_skip_what_is_not_a_sample():
    lines = ["0, 1, 2, 3",  # before any time mark: no time to give it
             "@@fleetgen:t=1700000000.123456", "0, 10, 100.25, 40000", "", "1, 20, 200, 50000",
             "x, 1, 2, 3", "0, busy, 2, 3", "0, 1, 2", "0, 1, 2, 3, 4",
             "@@fleetgen:t=oops", "@@fleetgen:t=1700000005", "2, , N/A, [Not Supported]"]
    assert list(parse_sample_lines(lines, node="n")) == [
        {"t": 1700000000.123, "node": "n", "gpu": 0, "util": 10.0, "power_w": 100.25, "mem_mib": 40000.0},
        {"t": 1700000000.123, "node": "n", "gpu": 1, "util": 20.0, "power_w": 200.0, "mem_mib": 50000.0},
        {"t": 1700000005.0, "node": "n", "gpu": 2, "util": None, "power_w": None, "mem_mib": None}]


def test_memory_is_sampled_in_mib_as_nvidia_smi_reports_it():
    assert SAMPLE_QUERY == ("nvidia-smi --query-gpu=index,utilization.gpu,power.draw,memory.used "
                            "--format=csv,noheader,nounits")
    row = next(parse_sample_lines(["@@fleetgen:t=1", "0, 5, 6, 183359"], node="n"))
    assert row["mem_mib"] == 183359.0


def test_a_shards_samplers_are_named_daemon_threads_that_warn_in_the_shards_log(tmp_path, caplog):
    def unreachable(node, command):
        raise OSError(f"{node} is unreachable")

    shard_log = logging.getLogger("test.shard-4")
    sampling = GpuSampling(nodes=["n0"], open_stream=unreachable, layout=RunLayout(tmp_path / "run"), shard_id=4,
                           interval_s=0.01, log=shard_log)
    # A daemon: a sampler never keeps a worker process alive after its shard ended.
    assert [(sampler.name, sampler.daemon) for sampler in sampling.samplers] == [("gpu-sampler-n0", True)]
    with caplog.at_level(logging.WARNING, logger="test.shard-4"):
        with sampling:
            wait_until(lambda: any(record.name == "test.shard-4" for record in caplog.records),
                       timeout_s=SHORT_WAIT_S)
    assert "GPU sampling on n0 interrupted (OSError: n0 is unreachable)" in caplog.records[0].getMessage()


def test_the_first_claim_of_a_run_creates_the_gpu_folder(tmp_path):
    claim = _claim(tmp_path / "run" / "gpu" / "n.sampler", "shard 0", stale_s=30)
    path = claim.files.root / claim.name
    assert claim.acquire() and path.read_text() == "shard 0"
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o644 & ~umask  # readable by whoever looks, writable by us


def test_stopping_after_a_session_ended_is_harmless(tmp_path):
    # The next session an interval away, longer than the test: between sessions is a state that lasts until the
    # sampler stops (with a short interval the next session opened at once, and a poll could stop that one).
    sampler, out = _sampler(tmp_path, lambda command: EndedSession(samples(1.0, "0, 1, 2, 3")), interval_s=600)
    sampler.start()
    wait_until(lambda: sampler.rows == 1 and sampler._stream is None, timeout_s=SHORT_WAIT_S)
    sampler.stop()
    sampler.join(timeout=SHORT_WAIT_S)
    out.close()
    assert not sampler.is_alive() and sampler.rows == 1  # stopped in the wait: no session opened after it


class EndedSession(list):
    """A session that ends by itself after its lines (the remote loop exited)."""

    def close(self) -> None:
        pass
