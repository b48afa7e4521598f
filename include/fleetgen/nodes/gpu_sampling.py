"""GPU utilisation, power and memory on every node during generation, over one SSH session per node.

A generating shard starts one thread per node (``GpuSampling``); each runs ``nvidia-smi`` in a loop on
the node inside ONE remote shell (``remote.sampling_loop_command``) and appends a row per GPU per
sample to ``gpu/shard-NNNNN.jsonl``: ``{"t", "node", "gpu", "util", "power_w", "mem_mib"}``
(docs/output-formats.md §3.8). With several shards running, a claim file per node in the run folder
(``gpu/<node>.sampler``, renewed at every sample) lets only one of them sample that node; another takes
over when the holder finishes or stops renewing. (A claim kept by renewing it, unlike a shard's output
lease, which the kernel holds for the writing process: generate/lease.py.) Sampling never fails generation: a lost session is
logged and reopened after one interval.
"""

from __future__ import annotations

import csv
import io
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Protocol

from fleetgen.generate.watch import JsonlAppender
from fleetgen.nodes import remote
from fleetgen.outputs import RunLayout

SAMPLE_FIELDS = ("index", "utilization.gpu", "power.draw", "memory.used")
SAMPLE_QUERY = f"nvidia-smi --query-gpu={','.join(SAMPLE_FIELDS)} --format=csv,noheader,nounits"
MAX_LOOP_SECONDS = 7 * 24 * 3600  # the remote loop's own end, should the channel never close
_NOT_A_NUMBER = ("[N/A]", "[Not Supported]", "N/A", "")


class LineStream(Protocol):
    """A remote command's stdout, line by line; ``close`` ends the session and unblocks the reader."""

    def __iter__(self) -> Iterator[str]: ...

    def close(self) -> None: ...


def _number(text: str) -> float | None:
    text = text.strip()
    return None if text in _NOT_A_NUMBER else float(text)


def parse_sample_lines(lines: Iterable[str], *, node: str) -> Iterator[dict]:
    """Rows of the sampling loop's output: each CSV line of :data:`SAMPLE_QUERY` under the latest time mark.

    Lines that are not CSV of the four fields (an nvidia-smi warning) are skipped."""
    at: float | None = None
    for line in lines:
        mark = remote.timed_sample_time(line)
        if mark is not None:
            at = mark
            continue
        if at is None or not line.strip():
            continue
        cells = next(csv.reader(io.StringIO(line)), [])
        if len(cells) != len(SAMPLE_FIELDS):
            continue
        try:
            gpu = int(cells[0])
            util, power, memory = (_number(cell) for cell in cells[1:])
        except ValueError:
            continue
        yield {"t": round(at, 3), "node": node, "gpu": gpu, "util": util, "power_w": power, "mem_mib": memory}


class SamplerClaim:
    """``gpu/<node>.sampler``: which shard samples a node now. Created exclusively; stale after ``stale_s``
    without renewal (the holder died), then taken over."""

    def __init__(self, path: Path, owner: str, stale_s: float) -> None:
        self.path = path
        self.owner = owner
        self.stale_s = stale_s

    def acquire(self) -> bool:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for _ in range(2):
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                try:
                    if time.time() - self.path.stat().st_mtime < self.stale_s:
                        return False
                    self.path.unlink()  # the holder stopped renewing: take over
                except FileNotFoundError:
                    pass
                continue
            with os.fdopen(fd, "w") as handle:
                handle.write(self.owner)
            return True
        return False

    def renew(self) -> None:
        os.utime(self.path)

    def release(self) -> None:
        try:
            if self.path.read_text() == self.owner:
                self.path.unlink()
        except FileNotFoundError:
            pass


class NodeSampler(threading.Thread):
    """Samples one node while ``stop`` is not set (see the module doc)."""

    def __init__(self, *, node: str, open_stream: Callable[[str], LineStream], out: JsonlAppender,
                 claim: SamplerClaim, interval_s: float, log: logging.Logger) -> None:
        super().__init__(name=f"gpu-sampler-{node}", daemon=True)
        self.node = node
        self.open_stream = open_stream
        self.out = out
        self.claim = claim
        self.interval_s = interval_s
        self.log = log
        self.stopping = threading.Event()
        self.rows = 0
        self._stream: LineStream | None = None
        self._lock = threading.Lock()

    def run(self) -> None:
        command = remote.sampling_loop_command(SAMPLE_QUERY, interval_s=self.interval_s, max_seconds=MAX_LOOP_SECONDS)
        warned = False
        while not self.stopping.is_set():
            if not self.claim.acquire():
                self.stopping.wait(self.interval_s)  # another shard samples this node
                continue
            try:
                self._sample(command)
            except Exception as exc:  # never fail generation over a sample
                if not warned:
                    self.log.warning("GPU sampling on %s interrupted (%s: %s); retrying every %.0f s",
                                     self.node, type(exc).__name__, exc, self.interval_s)
                    warned = True
            finally:
                self.claim.release()
            self.stopping.wait(self.interval_s)

    def _sample(self, command: str) -> None:
        stream = self.open_stream(command)
        with self._lock:
            self._stream = stream
        try:
            if self.stopping.is_set():
                return
            for row in parse_sample_lines(stream, node=self.node):
                self.out.append(row)
                self.rows += 1
                self.claim.renew()
                if self.stopping.is_set():
                    return
        finally:
            with self._lock:
                self._stream = None
            stream.close()

    def stop(self) -> None:
        self.stopping.set()
        with self._lock:
            if self._stream is not None:
                self._stream.close()


class GpuSampling:
    """Context manager: one ``NodeSampler`` per node while a shard generates."""

    def __init__(self, *, nodes: list[str], open_stream: Callable[[str, str], LineStream], layout: RunLayout,
                 shard_id: int, interval_s: float, log: logging.Logger) -> None:
        self.out = JsonlAppender(layout.shard_file("gpu", shard_id))
        owner = f"shard {shard_id} pid {os.getpid()} at {time.time():.3f}"
        self.samplers = [
            NodeSampler(node=node, open_stream=lambda command, node=node: open_stream(node, command), out=self.out,
                        claim=SamplerClaim(layout.gpu_sampler_claim(node), owner, stale_s=3 * interval_s + 10),
                        interval_s=interval_s, log=log)
            for node in nodes]

    def __enter__(self) -> GpuSampling:
        for sampler in self.samplers:
            sampler.start()
        return self

    def __exit__(self, *exc_info) -> None:
        for sampler in self.samplers:
            sampler.stop()
        for sampler in self.samplers:
            sampler.join(timeout=10)
        self.out.close()
