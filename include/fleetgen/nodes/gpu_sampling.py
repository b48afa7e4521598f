"""GPU utilisation, power and memory on every node during generation, over one SSH session per node.

A generating shard starts one thread per node (``GpuSampling``); each runs ``nvidia-smi`` in a loop on
the node inside ONE remote shell (``remote.sampling_loop_command``) and appends a row per GPU per
sample to ``gpu/shard-NNNNN.jsonl``: ``{"t", "node", "gpu", "util", "power_w", "mem_mib"}``
(docs/output-formats.md §3.8). With several shards running, a claim per node among the run's shared files
(``gpu/<node>.sampler``, renewed every sample interval) lets only one of them sample that node; another takes
over when the holder finishes or stops renewing. (A claim kept by renewing it, unlike a shard's output
lease, which the kernel holds for the writing process: generate/lease.py.) Sampling never fails generation: a lost session is
logged and reopened after one interval.
"""

from __future__ import annotations

import csv
import io
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Protocol

from fleetgen.generate.watch import JsonlAppender
from fleetgen.nodes import remote
from fleetgen.outputs import RunLayout
from fleetgen.storage.run_files import LocalRunFiles, RunFiles

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
    """``gpu/<node>.sampler`` among the run's shared files (``storage/run_files.py``: a folder every worker sees, or
    the run's prefix on an object store): which shard samples a node now. Created only if absent; stale after
    ``stale_s`` without renewal (the holder died), then taken over. A renewal rewrites it, at most every
    ``renew_every_s`` (each one a PUT on a store)."""

    def __init__(self, files: RunFiles, name: str, owner: str, stale_s: float, *, renew_every_s: float = 0.0) -> None:
        self.files = files
        self.name = name
        self.owner = owner
        self.stale_s = stale_s
        self.renew_every_s = renew_every_s
        self._renewed_at = -math.inf

    @property
    def where(self) -> str:
        return self.files.where(self.name)

    def acquire(self) -> bool:
        for _ in range(2):
            if self.files.create(self.name, self.owner.encode()):
                self._renewed_at = time.monotonic()
                return True
            current = self.files.read(self.name)
            if current is None:  # released in between: try again
                continue
            if time.time() - current.time < self.stale_s:
                return False
            self.files.delete(self.name)  # the holder stopped renewing: take over
        return False

    def renew(self) -> None:
        if time.monotonic() - self._renewed_at >= self.renew_every_s:
            self.files.write(self.name, self.owner.encode())
            self._renewed_at = time.monotonic()

    def release(self) -> None:
        current = self.files.read(self.name)
        if current is not None and current.data == self.owner.encode():
            self.files.delete(self.name)


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
                 shard_id: int, interval_s: float, log: logging.Logger, claims: RunFiles | None = None) -> None:
        """``claims``: where the shards of the run claim the nodes (the run's folder unless given: its prefix on a
        store)."""
        self.out = JsonlAppender(layout.shard_file("gpu", shard_id))
        owner = f"shard {shard_id} pid {os.getpid()} at {time.time():.3f}"
        files = claims if claims is not None else LocalRunFiles(layout.root)
        self.samplers = [
            NodeSampler(node=node, open_stream=lambda command, node=node: open_stream(node, command), out=self.out,
                        claim=SamplerClaim(files, RunLayout.gpu_sampler_claim_name(node), owner,
                                           stale_s=3 * interval_s + 10, renew_every_s=interval_s),
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
