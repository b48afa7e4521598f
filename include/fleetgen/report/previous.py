"""What the previous successful run left behind: its report, and the prompt lengths its servers measured.

A nightly run re-reads the same prompts; the servers' own token counts from the last run are better
than the character estimate of the scan, so the plan uses them when the prompts file is unchanged.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from fleetgen.outputs import RunLayout, run_root_of_report

log = logging.getLogger(__name__)

REPORT_SCHEMA = 1
IDENTITY_KEYS = ("path", "bytes", "mtime_ns", "count")


def find_previous_report(root: str | Path, current_run_id: str,
                         where: Callable[[dict], bool] | None = None) -> Path | None:
    """The newest ``root/<run_id>/report/report.json`` of another run whose validation passed (and, with ``where``,
    whose report it accepts)."""
    newest: tuple[float, Path] | None = None
    for path in Path(root).glob(f"*/{RunLayout(Path()).report_json}"):
        if run_root_of_report(path).name == current_run_id:
            continue
        try:
            report = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            log.warning("ignoring unreadable report %s: %s", path, exc)
            continue
        if not isinstance(report, dict) or report.get("schema") != REPORT_SCHEMA or not report.get("run_succeeded"):
            continue
        if where is not None and not where(report):
            continue
        when = report.get("generated_at_epoch")
        when = float(when) if isinstance(when, (int, float)) else path.stat().st_mtime
        if newest is None or when > newest[0]:
            newest = (when, path)
    return newest[1] if newest else None


def prompts_identity(prompt_scan: dict) -> dict:
    """Which prompts file a run read: path, size, mtime and count (kept beside its outputs)."""
    return {key: prompt_scan[key] for key in IDENTITY_KEYS}


@dataclass(frozen=True)
class PromptTokens:
    mean: float
    max: int
    source: str  # for the log: where the figures come from


def prompt_token_statistics(output_root: Path, current: RunLayout, prompt_scan: dict) -> PromptTokens:
    """Prompt-token mean and max: measured by the servers in the previous successful run when it read
    the very same prompts file (same path, size and mtime), else estimated from the file's characters."""
    estimated = (float(prompt_scan["prompt_tokens_mean"]), int(prompt_scan["prompt_tokens_max"]))
    previous = find_previous_report(output_root, current.root.name) if output_root.exists() else None
    if previous is None:
        return PromptTokens(*estimated, "estimated from the prompts file at ~4 characters per token; no previous run")
    try:
        previous_input = json.loads(RunLayout(run_root_of_report(previous)).prompts_identity.read_text())
        measured = json.loads(Path(previous).read_text()).get("prompt_tokens") or {}
    except (OSError, ValueError):
        previous_input, measured = {}, {}
    if previous_input != prompts_identity(prompt_scan) or not measured.get("max"):
        return PromptTokens(*estimated, "estimated from the prompts file; the previous run read other prompts")
    return PromptTokens(float(measured["mean"]), int(measured["max"]),
                        f"measured by the servers in the previous run ({previous})")
