"""The tuning trials across nights: one record per decision, keyed by what makes a measurement carry over.

A trial's answer holds for one GPU type, one model, one SGLang version and one shape of workload; the next
night with the same key starts from the winner and spends one server on a challenger not yet tried
(``latest_winner``, ``tried``). The file is ``outputs.trial_history_file`` under the output root, JSONL, written
like ``calibration.CalibrationStore`` writes its file: on the output root's disk, under a lock file, replaced
whole (a record per run: the decide task's retry replaces its own record). docs/tuning-trial.md describes it.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

from fleetgen.tuning.calibration import model_key
from fleetgen.tuning.trial import TrialDecision

# The model identity's parts (tuning/model_files.model_identity) that change how fast a server generates: the
# weights and the architecture, and the fleet's extra SGLang flags every candidate runs with. The tokenizer and
# the chat template change the text, not the speed per token.
SPEED_PARTS = ("weights", "config", "launch_args")


def model_identity_key(identity: dict) -> str:
    """``<model folder>@<12 hex digits>`` from a model identity (``model_files.model_identity``)."""
    parts = identity.get("parts") or {}
    digest = hashlib.sha256(json.dumps({part: parts.get(part) for part in SPEED_PARTS}, sort_keys=True).encode())
    return f"{model_key(identity.get('path') or '')}@{digest.hexdigest()[:12]}"


def nearest_power_of_two(value: float) -> int:
    return 2 ** max(0, round(math.log2(value))) if value >= 1 else 1


def workload_bucket(prompt_tokens_mean: float, completion_tokens_mean: float) -> str:
    """``out<N>-<short|long>``: the mean output length to the nearest power of two, and whether the prompts are
    long (their mean more tokens than the mean output's: a request's prefill outweighs its decode) or short.
    These two decide where speculation and larger batches pay; nearer lengths share their measurements."""
    prompts = "long" if prompt_tokens_mean > completion_tokens_mean else "short"
    return f"out{nearest_power_of_two(completion_tokens_mean)}-{prompts}"


@dataclass(frozen=True)
class TrialKey:
    gpu: str              # the GPU name the plan sized for (nvidia-smi's)
    model: str            # model_identity_key
    sglang_version: str
    workload: str         # workload_bucket

    @property
    def text(self) -> str:
        return f"{self.gpu}|{self.sglang_version}|{self.model}|{self.workload}"


class TrialHistory:
    """Decisions per ``TrialKey``, in one JSONL file the next run reads."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)

    def _lines(self) -> list[dict]:
        if not self.path.exists():
            return []
        records = []
        for line in self.path.read_text(encoding="utf-8").splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue  # not a record (a hand edit; every write replaces the file whole): the others stand
            if isinstance(record, dict) and isinstance(record.get("decision"), dict):
                records.append(record)
        return records

    def records(self, key: TrialKey) -> list[dict]:
        """The records of ``key``, oldest first."""
        return sorted((record for record in self._lines() if record.get("key") == key.text),
                      key=lambda record: record.get("recorded_at", 0))

    def decisions(self, key: TrialKey) -> list[TrialDecision]:
        return [TrialDecision.from_dict(record["decision"]) for record in self.records(key)]

    def latest_winner(self, key: TrialKey) -> str | None:
        """The configuration the last trial of ``key`` kept or chose; None before the first."""
        records = self.records(key)
        return str(records[-1]["decision"]["winner"]) if records else None

    def tried(self, key: TrialKey) -> set[str]:
        """Every candidate a trial of ``key`` ran, scored or not (too few windows counts as tried)."""
        return set().union(*(decision.candidates for decision in self.decisions(key)))

    def record(self, key: TrialKey, decision: TrialDecision, *, run_id: str) -> dict:
        """Keep ``decision`` of run ``run_id``; the run's earlier record of the same key is replaced. Returns it."""
        entry = {"key": key.text, "gpu": key.gpu, "model": key.model, "sglang_version": key.sglang_version,
                 "workload": key.workload, "run_id": run_id, "recorded_at": time.time(),
                 "decision": decision.to_dict()}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_name(f".{self.path.name}.lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            kept = [record for record in self._lines()
                    if not (record.get("key") == key.text and record.get("run_id") == run_id)]
            tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
            tmp.write_text("".join(json.dumps(record, sort_keys=True) + "\n" for record in [*kept, entry]))
            os.replace(tmp, self.path)
        return entry
