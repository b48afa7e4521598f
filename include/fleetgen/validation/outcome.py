"""Whether a run's validation passed, from the summary ``validate`` wrote (``RunLayout.validation_summary``).

One reader for the three that ask: the report (does it index the run for reuse), the reuse lookup of a later
run (may it copy from this one) and the report's verdict. A ``validate`` marked success by hand, after it
failed or before it ran, leaves a failed summary or none: neither counts as passed.
"""

from __future__ import annotations

import json

from fleetgen.outputs import RunLayout


def read_summary(layout: RunLayout) -> dict | None:
    """The summary ``validate`` wrote, or None when there is none or it cannot be read."""
    try:
        summary = json.loads(layout.validation_summary.read_text())
    except (OSError, ValueError):
        return None
    return summary if isinstance(summary, dict) else None


def why_not_passed(layout: RunLayout | str, summary: dict | None) -> str | None:
    """None when ``summary`` says the validation passed; else why the run does not count as validated. ``layout``:
    the run's folder, or where its summary is (a URL on an object store)."""
    where = layout.validation_summary if isinstance(layout, RunLayout) else layout
    if summary is None:
        return (f"no validation summary at {where}: validate did not run to its end "
                "(marked success by hand?)")
    if summary.get("success") is not True:
        failed = summary.get("failed_expectations") or []
        return (f"its validation did not pass ({len(failed)} expectation(s) failed: "
                f"{', '.join(map(str, failed[:5])) or 'unknown'}; {where})")
    return None
