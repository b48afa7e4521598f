"""Calibration from readback: the memory a server really had, learned from what it reports at readiness.

The plan rests on constants nothing here can measure (the CUDA context of a fresh process, what PyTorch
and NCCL keep; fleetgen's ``CUDA_CONTEXT_MIB`` / ``NCCL_BUFFERS_MIB``). SGLang names the truth twice:
its log line ``Load weight begin. avail mem=X GB`` (``model_executor/model_runner.py``) is the pre-load
free memory it sized from, and ``/server_info`` reports the pools that memory gave
(``max_total_num_tokens``, ``internal_states[i].max_mamba_cache_size``,
``effective_max_running_requests_per_dp``).

``calibrate`` turns a plan and its readback into the pre-load memory the server really had: the log's
two-decimal GiB value narrows it to a few MiB, then the MiB value whose sizing reproduces every reported
value exactly is taken (SGLang's own arithmetic, ``sizing.size_pools``, with the plan's flags). The
difference from the plan's assumption is the correction the next plan of the same (GPU, SGLang version,
model, tp) starts from; ``CalibrationStore`` keeps it in a small JSON file.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from fleetgen.errors import ConfigError
from fleetgen.nodes.readiness import ServerInfo
from fleetgen.tuning.budget import compare_expected
from fleetgen.tuning.plan import ServerPlan
from fleetgen.tuning.profile import GIB, MIB, MemoryProfile
from fleetgen.tuning.sizing import SPEC_DEFAULT_MAX_RUNNING_REQUESTS, size_pools

PLANNED_SGLANG_VERSION = "0.5.23"
# SGLang's pre-load memory line (model_executor/model_runner.py): found by this mark, read by the pattern.
LOAD_BEGIN_MARK = "Load weight begin"
_LOAD_BEGIN = re.compile(re.escape(LOAD_BEGIN_MARK) + r"\. avail mem=([0-9.]+) GB")
# How far from the plan's assumption the bisection looks, and how many MiB can give the same sizing
# (a KV page of the largest models is a few MiB).
_SEARCH_RANGE_MIB = 64 * 1024
_MAX_MATCHING_MIB = 64


@dataclass(frozen=True)
class Calibration:
    """What one server's readback says about the memory the plan assumed."""

    gpu_name: str
    sglang_version: str
    model: str
    tp_size: int
    planned_pre_load_bytes: int
    measured_pre_load_bytes: int
    applied_correction_bytes: int  # the correction the plan already carried
    exact: bool                 # a MiB value reproduced every reported value
    mismatches: tuple[str, ...]  # the plan's expected values SGLang did not report
    logged_pre_load_bytes: int | None = None  # the server's own ``Load weight begin`` figure
    # Why this readback measures nothing of the plan's GPU memory (None when it does): no correction is learnt.
    unmeasured: str | None = None

    @property
    def key(self) -> str:
        return calibration_key(self.gpu_name, self.sglang_version, self.model, self.tp_size)

    @property
    def correction_bytes(self) -> int:
        """How much less pre-load memory than fleetgen's constants give the next plan assumes (negative: more):
        the correction this plan carried plus what it still missed; the carried one alone when the readback
        measured nothing of the GPU."""
        if self.unmeasured:
            return self.applied_correction_bytes
        return self.applied_correction_bytes + self.planned_pre_load_bytes - self.measured_pre_load_bytes

    def report_line(self) -> str:
        if self.unmeasured:
            logged = ("no Load weight line" if self.logged_pre_load_bytes is None
                      else f"its log says {self.logged_pre_load_bytes / MIB:,.0f} MiB free before the weights")
            return (f"{self.key}: the plan assumed {self.planned_pre_load_bytes / MIB:,.0f} MiB pre-load free; "
                    f"{logged}; not a measure of the plan's memory: {self.unmeasured} (no correction learnt)")
        text = (f"{self.key}: the plan assumed {self.planned_pre_load_bytes / MIB:,.0f} MiB pre-load free, "
                f"the server had {self.measured_pre_load_bytes / MIB:,.0f} MiB "
                f"({self.correction_bytes / MIB:,.0f} MiB correction for the next plan"
                f"{'' if self.exact else ', estimated from the log only'})")
        if self.sglang_version != PLANNED_SGLANG_VERSION:
            text += (f"; SGLang {self.sglang_version} is not {PLANNED_SGLANG_VERSION}: its plan is verified by this "
                     "readback and corrected on the next run")
        return text

    def to_dict(self) -> dict:
        data = asdict(self)
        data["mismatches"] = list(self.mismatches)
        return data


def model_key(model_path: str) -> str:
    """The model part of a calibration key: the model folder's name."""
    return Path(str(model_path).rstrip("/")).name or str(model_path)


def calibration_key(gpu_name: str, sglang_version: str, model: str, tp_size: int) -> str:
    return f"{gpu_name}|{sglang_version}|{model}|tp{tp_size}"


def pre_load_from_log(log_text: str) -> int | None:
    """The last ``Load weight begin. avail mem=X GB`` of a server log, in bytes (GiB as SGLang counts)."""
    found = _LOAD_BEGIN.findall(log_text or "")
    return int(float(found[-1]) * GIB) if found else None


def _reported(info: ServerInfo) -> dict:
    """Rank 0's values (every rank of a plan is sized alike)."""
    rank = info.ranks[0] if info.ranks else None
    return {"max_running_requests": rank.max_running_requests if rank else None,
            "max_mamba_cache_size": rank.max_mamba_cache_size if rank else None,
            "max_total_num_tokens": info.top_level_total_tokens if info.top_level_total_tokens is not None
            else (rank.max_total_num_tokens if rank else None)}


def _sized(plan: ServerPlan, pre_load_bytes: int) -> dict | None:
    """The three values SGLang would report had the server ``pre_load_bytes`` free before the weights."""
    profile = MemoryProfile.from_dict(plan.inputs["resolved_profile"])
    options = plan.inputs["options"]
    platform = plan.inputs.get("platform", {})
    flags = plan.flags
    mrr = flags.get("--max-running-requests", options.get("max_running_requests"))
    if mrr is None and profile.spec_algorithm:
        mrr = SPEC_DEFAULT_MAX_RUNNING_REQUESTS
    sizing = size_pools(profile, pre_load_free_bytes=pre_load_bytes,
                        mem_fraction_static=platform.get("mem_fraction_static")
                        or flags.get("--mem-fraction-static") or options.get("mem_fraction_static"),
                        max_running_requests=mrr,
                        max_mamba_cache_size=flags.get("--max-mamba-cache-size", options.get("max_mamba_cache_size")),
                        context_length=flags.get("--context-length") or options.get("context_length")
                        or profile.model_context_length,
                        page_size=platform.get("page_size") or 1, max_total_tokens=options.get("max_total_tokens"),
                        disable_radix_cache=bool(options.get("disable_radix_cache")))
    if not sizing.ok:
        return None
    return {"max_running_requests": sizing.effective_max_running_requests,
            "max_mamba_cache_size": sizing.max_mamba_cache_size if profile.is_hybrid else None,
            "max_total_num_tokens": sizing.max_total_num_tokens}


def _search_pre_load(plan: ServerPlan, reported: dict, logged: int | None) -> tuple[int | None, bool]:
    """The MiB of pre-load memory whose sizing gives exactly the reported values: (Mamba slots, KV tokens)
    grow with the memory, so a bisection finds where they start to match; among the matching MiB the one
    nearest the log's value wins. (None, False) when no value matches (the flags alone do not explain it).
    The KV tokens alone do not grow steadily where SGLang sizes the Mamba slots itself: each slot more takes
    memory from the KV pool, so the slots are compared first."""
    planned_mib = round(plan.budget_row("pre-load free (SGLang baseline)") / MIB)

    def pools(mib: int) -> tuple[int, int]:
        sized = _sized(plan, mib * MIB)
        return (-1, -1) if sized is None else (sized["max_mamba_cache_size"] or 0, sized["max_total_num_tokens"])

    if reported["max_total_num_tokens"] is None:
        return None, False
    want = (reported["max_mamba_cache_size"] or 0, reported["max_total_num_tokens"])
    low, high = max(1, planned_mib - _SEARCH_RANGE_MIB), planned_mib + _SEARCH_RANGE_MIB
    if pools(high) < want:
        return None, False
    while low < high:  # the smallest MiB giving at least the reported pools
        middle = (low + high) // 2
        if pools(middle) >= want:
            high = middle
        else:
            low = middle + 1
    matching = []
    mib = low
    while pools(mib) == want and len(matching) < _MAX_MATCHING_MIB:
        if _sized(plan, mib * MIB) == reported:
            matching.append(mib)
        mib += 1
    if not matching:
        return None, False
    centre = logged / MIB if logged is not None else planned_mib
    return min(matching, key=lambda value: abs(value - centre)) * MIB, True


def _pool_pinned(plan: ServerPlan, planned: int) -> bool:
    """True when ``--max-total-tokens`` caps the KV pool at the planned memory: SGLang then reports the cap
    whatever memory it had, and the readback's token count says nothing of the memory."""
    pinned = plan.inputs["options"].get("max_total_tokens")
    sized = _sized(plan, planned) if pinned is not None else None
    return sized is not None and sized["max_total_num_tokens"] == pinned


def _unmeasured(plan: ServerPlan) -> str | None:
    """Why no readback of this server can measure the GPU memory the plan sized, or None."""
    device = plan.inputs["options"].get("device")
    if device not in (None, "cuda"):
        return (f"the server runs with --device {device}, so SGLang measures that device's memory, "
                f"not the GPU's the plan sized")
    return None


def calibrate(plan: ServerPlan, info: ServerInfo, log_text: str, *, gpu_name: str, model: str) -> Calibration:
    """The pre-load memory the server of ``plan`` really had, from its /server_info (read by
    ``nodes.readiness.parse_server_info``) and its log. With the KV pool pinned by ``--max-total-tokens`` the
    readback matches at any memory, so the log's figure is the measure; a server on another device than a
    GPU measures nothing of the plan's memory (``Calibration.unmeasured``)."""
    planned = plan.budget_row("pre-load free (SGLang baseline)")
    reported = _reported(info)
    mismatches = tuple(compare_expected(plan, info))
    version = info.version or "unknown"
    logged = pre_load_from_log(log_text)
    unmeasured = _unmeasured(plan)
    if unmeasured:
        measured, exact = planned, False
    elif not mismatches and _pool_pinned(plan, planned):
        measured, exact = (logged, False) if logged is not None else (planned, False)
        if logged is None:
            unmeasured = "--max-total-tokens pins the KV pool and the log had no Load weight line"
    else:
        measured, exact = (planned, True) if not mismatches else _search_pre_load(plan, reported, logged)
    if measured is None:
        measured, exact = (logged if logged is not None else planned), False
    tp_size = int(plan.inputs["options"].get("tp_size", 1))
    return Calibration(gpu_name=gpu_name, sglang_version=version, model=model, tp_size=tp_size,
                       planned_pre_load_bytes=planned, measured_pre_load_bytes=measured,
                       applied_correction_bytes=int(plan.inputs["adjust"].get("calibration_bytes", 0)), exact=exact,
                       mismatches=mismatches, logged_pre_load_bytes=logged, unmeasured=unmeasured)


def record_readback(plan: ServerPlan, info: ServerInfo, log_text: str, *, model_path: str,
                    shared: "CalibrationStore", run: "CalibrationStore", server: str) -> dict:
    """Calibrate one server's readback and record it twice: in ``shared``, where the next plan of the same key
    starts from, and in the run's own ``run`` under the server's name. Returns what the server's readiness
    output carries (the calibration, its correction and its report line)."""
    calibration = calibrate(plan, info, log_text, gpu_name=str(plan.inputs["gpus"][0]["name"]),
                            model=model_key(model_path))
    shared.record(calibration)
    run.record(calibration, server=server)
    return {**calibration.to_dict(), "correction_bytes": calibration.correction_bytes,
            "report_line": calibration.report_line()}


class CalibrationStore:
    """Corrections per (GPU name, SGLang version, model, tp), in one JSON file the next run reads."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)

    def load(self) -> dict[str, dict]:
        if not self.path.exists():
            return {}
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError) as error:
            raise ConfigError(f"calibration file is not readable JSON: {error}", path=str(self.path),
                              hint="delete it; the next run's readback writes a new one") from None
        return data if isinstance(data, dict) else {}

    def correction_bytes(self, gpu_name: str, sglang_version: str, model: str, tp_size: int) -> int:
        entry = self.load().get(calibration_key(gpu_name, sglang_version, model, tp_size))
        return int(entry["correction_bytes"]) if entry else 0

    def latest(self, gpu_name: str, model: str, tp_size: int) -> dict | None:
        """The most recent readback for this GPU, model and tp, whatever SGLang version it ran (the plan
        is made before the server names its version)."""
        entries = [entry for entry in self.load().values() if entry.get("gpu_name") == gpu_name
                   and entry.get("model") == model and int(entry.get("tp_size", 0)) == int(tp_size)]
        return max(entries, key=lambda entry: entry.get("recorded_at", 0), default=None)

    def record(self, calibration: Calibration, *, server: str | None = None) -> None:
        """Store the correction the next plan of the same key starts from (keyed by ``server`` instead, for
        a run's own record of each server). Readiness checks of one run record in parallel: a lock file
        serialises them."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_name(f".{self.path.name}.lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            data = self.load()
            data[server or calibration.key] = {**calibration.to_dict(), "key": calibration.key,
                                               "correction_bytes": calibration.correction_bytes,
                                               "recorded_at": time.time()}
            tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
            os.replace(tmp, self.path)
