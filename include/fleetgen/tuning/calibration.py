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

import json
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from fleetgen.errors import ConfigError
from fleetgen.nodes.readiness import ServerInfo
from fleetgen.tuning.budget import compare_expected
from fleetgen.tuning.plan import ServerPlan
from fleetgen.tuning.profile import GIB, MIB, MemoryProfile
from fleetgen.tuning.sizing import SPEC_DEFAULT_MAX_RUNNING_REQUESTS, size_pools

PLANNED_SGLANG_VERSION = "0.5.23"
_LOAD_BEGIN = re.compile(r"Load weight begin\. avail mem=([0-9.]+) GB")
# The log rounds to 0.01 GiB: the true value lies within half of that, searched MiB by MiB.
_SEARCH_MIB = 8


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

    @property
    def key(self) -> str:
        return calibration_key(self.gpu_name, self.sglang_version, self.model, self.tp_size)

    @property
    def correction_bytes(self) -> int:
        """How much less pre-load memory than fleetgen's constants give the next plan assumes (negative: more):
        the correction this plan carried plus what it still missed."""
        return self.applied_correction_bytes + self.planned_pre_load_bytes - self.measured_pre_load_bytes

    def report_line(self) -> str:
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


def calibrate(plan: ServerPlan, info: ServerInfo, log_text: str, *, gpu_name: str, model: str) -> Calibration:
    """The pre-load memory the server of ``plan`` really had, from its /server_info (read by
    ``nodes.readiness.parse_server_info``) and its log."""
    rows = {row["item"].strip(): row["bytes"] for row in plan.budget}
    planned = rows["pre-load free (SGLang baseline)"]
    reported = _reported(info)
    mismatches = tuple(compare_expected(plan, info))
    version = info.version or "unknown"
    logged = pre_load_from_log(log_text)
    centre = logged if logged is not None else planned
    measured, exact = centre, False
    if not mismatches:
        measured, exact = planned, True
    else:
        centre_mib = round(centre / MIB)
        for offset in sorted(range(-_SEARCH_MIB * 2, _SEARCH_MIB * 2 + 1), key=abs):
            candidate = (centre_mib + offset) * MIB
            if _sized(plan, candidate) == reported:
                measured, exact = candidate, True
                break
    tp_size = int(plan.inputs["options"].get("tp_size", 1))
    return Calibration(gpu_name=gpu_name, sglang_version=version, model=model, tp_size=tp_size,
                       planned_pre_load_bytes=planned, measured_pre_load_bytes=measured,
                       applied_correction_bytes=int(plan.inputs["adjust"].get("calibration_bytes", 0)), exact=exact,
                       mismatches=mismatches)


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

    def record(self, calibration: Calibration) -> None:
        """Store the correction the next plan of the same key starts from."""
        data = self.load()
        data[calibration.key] = {**calibration.to_dict(), "correction_bytes": calibration.correction_bytes}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
        os.replace(tmp, self.path)
