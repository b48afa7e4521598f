"""How busy a simulated server keeps its GPUs, for the fake ``nvidia-smi``'s ``utilization.gpu`` and
``power.draw`` (docs/sglang-memory-model.md §8 explains the model).

A running server writes ``<node>/state/load/<pid>.json`` = ``{"pid", "gpus", "utilization", "power_share"}``
every ``WRITE_INTERVAL_S``; ``nvidia-smi`` reads the files of live pids:

- ``utilization`` (%, as nvidia-smi's "a kernel was running" share): 0 with nothing running; 100 during
  a prefill; while decoding, the share of a decode step that is GPU work, ``1 - overhead / step(batch)``,
  where ``overhead`` is the per-step CPU launch gap (``perf.STEP_OVERHEAD_S``) and ``step(batch)`` the
  step time of the current batch (``perf.Timing``);
- ``power_share`` (0-1 of the GPU's range from idle to its power limit): ``utilization x (0.85 + 0.15 x
  compute share)``, the compute share being the per-request (compute, state and KV-read) part of the step: a
  decode step streams the weights whatever the batch, so power tracks utilization first and batch second.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

from sglang_sim.perf import STEP_OVERHEAD_S

if TYPE_CHECKING:  # pragma: no cover
    from sglang_sim.node import SimNode
    from sglang_sim.service import Service

WRITE_INTERVAL_S = 0.5
# GPU name substring -> (idle W, power limit W); first match wins
GPU_POWER = (("B300", 160, 1100), ("B200", 140, 1000), ("H200", 90, 700), ("H100", 75, 700), ("H800", 75, 700),
             ("H20", 60, 500), ("A100", 55, 400), ("L40S", 35, 350), ("L4", 16, 72),
             ("A10", 25, 150))
DEFAULT_POWER = (60, 400)


def gpu_power(gpu_name: str) -> tuple[int, int]:
    for key, idle, limit in GPU_POWER:
        if key in gpu_name.upper():
            return idle, limit
    return DEFAULT_POWER


def load_dir(node_path: Path) -> Path:
    return Path(node_path) / "state" / "load"


def current_load(service: Service) -> tuple[float, float]:
    """(utilization %, power share) of the server's GPUs right now, from its engines."""
    timing, launch = service.timing, service.launch
    overhead = STEP_OVERHEAD_S[launch.decode_graph] / max(service.faults.speed, 1e-9)
    utilizations, powers = [], []
    for engine in service.engines:
        batch = engine.running
        if batch == 0 or service.hung:
            utilizations.append(0.0)
            powers.append(0.0)
            continue
        if engine.prefilling():
            utilizations.append(100.0)
            powers.append(1.0)
            continue
        context = engine.used_tokens
        step = timing.step_seconds(batch, context)
        busy = max(0.0, 1.0 - overhead / step) if step > 0 else 0.0
        per_request = timing.step_per_request_s * batch + timing.step_per_context_token_s * context
        compute = per_request / step if step > 0 else 0.0
        utilizations.append(100.0 * busy)
        powers.append(busy * (0.85 + 0.15 * compute))
    if not utilizations:
        return 0.0, 0.0
    return sum(utilizations) / len(utilizations), sum(powers) / len(powers)


def write_load(node: SimNode, pid: int, gpus: list[int], utilization: float, power_share: float) -> None:
    directory = load_dir(node.path)
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / f"{pid}.json"
    partial = directory / f".{pid}.json.partial"
    partial.write_text(json.dumps({"pid": pid, "gpus": gpus, "utilization": round(utilization, 1),
                                   "power_share": round(power_share, 4)}))
    os.replace(partial, target)


def remove_load(node: SimNode, pid: int) -> None:
    try:
        os.unlink(load_dir(node.path) / f"{pid}.json")
    except FileNotFoundError:
        pass


def gpu_loads(node: SimNode) -> dict[int, tuple[float, float]]:
    """GPU index -> (utilization %, power share) over the live servers on it (capped at 100 % / 1)."""
    from sglang_sim.node import pid_alive

    loads: dict[int, tuple[float, float]] = {}
    try:
        entries = list(os.scandir(load_dir(node.path)))
    except FileNotFoundError:
        return loads
    for entry in entries:
        if not entry.name.endswith(".json") or entry.name.startswith("."):
            continue
        try:
            data = json.loads(Path(entry.path).read_text())
            pid, gpus = int(data["pid"]), [int(g) for g in data["gpus"]]
            utilization, share = float(data["utilization"]), float(data["power_share"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if not pid_alive(pid):
            continue
        for gpu in gpus:
            old_util, old_share = loads.get(gpu, (0.0, 0.0))
            loads[gpu] = (min(100.0, old_util + utilization), min(1.0, old_share + share))
    return loads
