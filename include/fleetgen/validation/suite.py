"""Validation of a run's output with Great Expectations Core, over the per-completion stats only.

The suite reads ``<out>/stats/*.jsonl`` (one small row per finished prompt) and
``<out>/errors/*.jsonl`` (prompts that failed permanently) through :mod:`fleetgen.validation.stats_table`
(whose readers are re-exported here). It never opens ``<out>/completions/``: memory and time
depend on the number of prompts, not on how long the generated texts are.

Two tables are validated:
- ``completions``: one row per stats line (nulls, token ranges, finish reasons, shares); a prompt's
  completion tokens are bounded by its own ``sampling.max_tokens`` when it has one, else by the run's;
- ``coverage``: one row per prompt id (expected, plus any unknown id seen), saying whether the prompt
  has exactly one outcome: a completion, or a permanent error record.

Great Expectations is imported inside :func:`validate_run` (it costs ~3 s), so importing this
module from a DAG file stays cheap.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np
import pandas as pd

from fleetgen.errors import ValidationFailed
# The table readers moved to their own module; re-exported so existing imports keep working.
from fleetgen.outputs import RunLayout
from fleetgen.validation.offline_docs import make_offline
from fleetgen.validation.thresholds import ValidationThresholds
from fleetgen.outputs import OPTIONAL_STATS_COLUMNS
from fleetgen.validation.stats_table import ERROR_COLUMNS, STATS_COLUMNS, load_errors, load_stats  # noqa: F401

__all__ = ["ValidationThresholds", "load_stats", "load_errors", "validate_run", "STATS_COLUMNS", "SAMPLE_IDS",
           "json_safe"]

log = logging.getLogger(__name__)

SAMPLE_IDS = 10  # ids listed per failed expectation / per missing or duplicate list
# completion_tokens / the row's max_tokens (the prompt's own, else the run's): in (0, 1] when in range.
TOKEN_SHARE_COLUMN = "completion_share_of_max_tokens"


@dataclass(frozen=True)
class _Check:
    """One expectation and how to read its result back: ``kind`` picks the observed value."""

    name: str
    table: str  # "completions" or "coverage"
    kind: str  # "count" (unexpected rows), "bad_share", "good_share" or "mean"
    bound: str  # the pass condition in words, for messages
    expectation: Any = field(repr=False)


def _mostly(passing_share: float) -> float:
    """GX's ``mostly``: it passes when passing rows / rows considered >= mostly. The 1e-9 slack keeps a
    share exactly at the threshold passing despite float rounding of ``1 - share`` (< 0.001 row at 1M)."""
    return max(0.0, passing_share - 1e-9)


def _quiet_gx_import() -> None:
    # GX logs ~200 INFO lines from this logger on first import (see the reference notes).
    logging.getLogger("great_expectations._docs_decorators").setLevel(logging.WARNING)
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "False")


def _checks(thresholds: ValidationThresholds, stats_columns: Iterable[str], own_max_tokens: int = 0) -> list[_Check]:
    """The suite; ``own_max_tokens`` is how many prompts bring their own max_tokens (for the bound's words)."""
    _quiet_gx_import()
    import great_expectations.expectations as gxe

    t = thresholds
    checks = [
        _Check(f"{column}_not_null", "completions", "count", "0 rows",
               gxe.ExpectColumnValuesToNotBeNull(column=column))
        for column in stats_columns if column not in OPTIONAL_STATS_COLUMNS
    ]
    checks += [
        # One row-wise bound for every row's own limit: tokens / max_tokens in (0, 1] is 1 <= tokens <= max_tokens.
        _Check("completion_tokens_in_range", "completions", "count",
               f"0 rows outside [1, {t.max_tokens}]" + (
                   f" ({own_max_tokens} prompt(s) bounded by their own sampling.max_tokens instead)"
                   if own_max_tokens else ""),
               gxe.ExpectColumnValuesToBeBetween(column=TOKEN_SHARE_COLUMN, min_value=0, strict_min=True,
                                                 max_value=1)),
        _Check("mean_completion_tokens", "completions", "mean",
               f"mean in [{t.min_mean_completion_tokens}, {t.max_mean_completion_tokens or 'inf'}]",
               gxe.ExpectColumnMeanToBeBetween(column="completion_tokens", min_value=t.min_mean_completion_tokens,
                                               max_value=t.max_mean_completion_tokens)),
        _Check("finish_reason_allowed", "completions", "count",
               f"0 rows outside {list(t.allowed_finish_reasons)}",
               gxe.ExpectColumnValuesToBeInSet(column="finish_reason", value_set=list(t.allowed_finish_reasons))),
        _Check("length_share", "completions", "bad_share", f"share of finish_reason=length <= {t.max_length_share}",
               gxe.ExpectColumnValuesToNotBeInSet(column="finish_reason", value_set=["length"],
                                                  mostly=_mostly(1 - t.max_length_share))),
        _Check("reasoning_share", "completions", "good_share",
               f"share with a reasoning trace >= {t.min_reasoning_share}",
               gxe.ExpectColumnValuesToBeBetween(column="reasoning_chars", min_value=1,
                                                 mostly=_mostly(t.min_reasoning_share))),
        _Check("empty_answer_share", "completions", "bad_share",
               f"share of empty answers <= {t.max_empty_answer_share}",
               gxe.ExpectColumnValuesToBeBetween(column="content_chars", min_value=1,
                                                 mostly=_mostly(1 - t.max_empty_answer_share))),
        _Check("no_missing_ids", "coverage", "count", "0 prompts without a completion or an error record",
               gxe.ExpectColumnValuesToNotBeInSet(column="outcome", value_set=["missing"])),
        _Check("no_duplicate_ids", "coverage", "count", "0 prompts with more than one completion",
               gxe.ExpectColumnValuesToBeBetween(column="completions", max_value=1)),
        _Check("no_unknown_ids", "coverage", "count", "0 completions for ids absent from the prompts",
               gxe.ExpectColumnValuesToBeInSet(column="expected", value_set=[True])),
        _Check("error_share", "coverage", "bad_share", f"share of prompts that failed <= {t.max_error_share}",
               gxe.ExpectColumnValuesToNotBeInSet(column="outcome", value_set=["failed"],
                                                  mostly=_mostly(1 - t.max_error_share))),
    ]
    for check in checks:
        check.expectation.meta = {"fleetgen_check": check.name}
    return checks


def _coverage(stats_ids: pd.Series, failed_ids: pd.Series, expected_ids: Iterable[str]) -> tuple[pd.DataFrame, int]:
    """One row per prompt id: expected ids in prompt order, then unknown ids in stats order.

    Returns the table and the number of duplicate ids in ``expected_ids`` (dropped here; the prompts
    reader reports them with line numbers).
    """
    expected = pd.Index(list(expected_ids), dtype=object)
    unique_expected = expected.drop_duplicates()
    completion_counts = stats_ids.dropna().value_counts(sort=False)
    unknown = completion_counts.index[~completion_counts.index.isin(unique_expected)]
    ids = unique_expected.append(pd.Index(unknown, dtype=object))
    completions = completion_counts.reindex(ids, fill_value=0).to_numpy(dtype=np.int64)
    failed = ids.isin(pd.Index(failed_ids.dropna().unique(), dtype=object))
    # A completion wins over an error record: a prompt retried after a failure is done.
    outcome_codes = np.where(completions > 0, 0, np.where(failed, 1, 2))
    table = pd.DataFrame({
        "id": ids.to_numpy(dtype=object),
        "completions": completions,
        "outcome": pd.Categorical.from_codes(outcome_codes, categories=["completed", "failed", "missing"]),
        "expected": np.arange(len(ids)) < len(unique_expected),
    })
    return table, len(expected) - len(unique_expected)


def _first_ids(ids: pd.Series | pd.Index, limit: int = SAMPLE_IDS) -> list[str]:
    return [str(value) for value in list(ids[:limit])]


def json_safe(value: Any) -> Any:
    """Plain JSON types only (numpy scalars unwrapped, NaN/inf -> None), for XCom."""
    if isinstance(value, dict):
        return {str(key): json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(item) for item in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value




def _raised_error(exception_info: dict) -> str | None:
    """The message of an exception GX caught while computing an expectation's metrics, if any. GX 1.x keys
    ``exception_info`` by metric (``{MetricConfigurationID: {"raised_exception", "exception_message", ...}}``);
    a flat ``{"raised_exception", ...}`` is read too."""
    infos = [exception_info] if "raised_exception" in exception_info else list(exception_info.values())
    messages = [str(info.get("exception_message")) for info in infos
                if isinstance(info, dict) and info.get("raised_exception")]
    return "; ".join(dict.fromkeys(messages)) if messages else None


def _read_result(check: _Check, result: Any) -> dict:
    body = result.result or {}
    entry: dict[str, Any] = {"name": check.name, "table": check.table,
                             "expectation": result.expectation_config.type,
                             "column": result.expectation_config.kwargs.get("column"),
                             "success": bool(result.success), "bound": check.bound}
    error = _raised_error(result.exception_info or {})
    if error is not None:
        entry["success"] = False
        entry["error"] = error[:500]
    if check.kind == "mean":
        mean = body.get("observed_value")
        entry["observed"] = round(float(mean), 4) if mean is not None else None
        entry["sample_ids"] = []
        return entry
    unexpected = int(body.get("unexpected_count") or 0)
    percent = body.get("unexpected_percent")
    bad_share = round(percent / 100, 6) if percent is not None else 0.0
    entry["unexpected_count"] = unexpected
    entry["observed"] = {"count": unexpected, "bad_share": bad_share,
                         "good_share": round(1 - bad_share, 6)}[check.kind]
    entry["sample_ids"] = [str(row.get("id")) for row in body.get("partial_unexpected_index_list") or []][:SAMPLE_IDS]
    return entry


def _run_gx(tables: dict[str, pd.DataFrame], checks: list[_Check],
            docs_dir: Path | None, run_name: str | None = None) -> tuple[list[dict], str | None]:
    _quiet_gx_import()
    import great_expectations as gx
    from great_expectations.core.run_identifier import RunIdentifier
    from great_expectations.data_context.types.base import (
        DataContextConfig, InMemoryStoreBackendDefaults, ProgressBarsConfig)

    # Stores in memory; the only thing written is the Data Docs site, when asked for.
    config = DataContextConfig(
        store_backend_defaults=InMemoryStoreBackendDefaults(init_temp_docs_sites=False),
        data_docs_sites={"fleetgen": {
            "class_name": "SiteBuilder", "show_how_to_buttons": False,
            "store_backend": {"class_name": "TupleFilesystemStoreBackend", "base_directory": str(docs_dir)},
            "site_index_builder": {"class_name": "DefaultSiteIndexBuilder"}}} if docs_dir else {},
        progress_bars=ProgressBarsConfig(globally=False),
        analytics_enabled=False,
    )
    context = gx.get_context(mode="ephemeral", project_config=config)
    source = context.data_sources.add_pandas("fleetgen_run")
    result_format = {"result_format": "SUMMARY", "partial_unexpected_count": SAMPLE_IDS,
                     "unexpected_index_column_names": ["id"]}
    by_name = {check.name: check for check in checks}
    entries: dict[str, dict] = {}
    for table_name, frame in tables.items():
        batch = source.add_dataframe_asset(table_name).add_batch_definition_whole_dataframe("whole_table")
        suite = context.suites.add(gx.ExpectationSuite(
            name=f"fleetgen_{table_name}",
            expectations=[check.expectation for check in checks if check.table == table_name]))
        definition = context.validation_definitions.add(
            gx.ValidationDefinition(name=f"fleetgen_{table_name}", data=batch, suite=suite))
        outcome = definition.run(batch_parameters={"dataframe": frame}, result_format=result_format,
                                 run_id=RunIdentifier(run_name=run_name) if run_name else None)
        for result in outcome.results:
            name = (result.expectation_config.meta or {}).get("fleetgen_check")
            entries[name] = _read_result(by_name[name], result)
    index = None
    if docs_dir:
        shutil.rmtree(docs_dir, ignore_errors=True)  # a retried task must not list an earlier attempt's pages
        context.build_data_docs(site_names=["fleetgen"])
        make_offline(docs_dir)
        index = str(docs_dir / "index.html")
    return [entries[check.name] for check in checks], index


def _describe(entry: dict) -> str:
    observed = entry["observed"]
    if "unexpected_count" in entry and entry["observed"] != entry["unexpected_count"]:
        observed = f"{observed} ({entry['unexpected_count']} rows)"
    text = f"- {entry['name']}: observed {observed}, expected {entry['bound']}"
    if entry.get("error"):
        text += f"; error: {entry['error']}"
    if entry["sample_ids"]:
        text += f"; sample ids: {', '.join(entry['sample_ids'])}"
    return text


def _with_token_share(stats: pd.DataFrame, max_tokens: int, own_max_tokens: Mapping[str, int]) -> pd.DataFrame:
    """The completions table with ``TOKEN_SHARE_COLUMN``: each row's tokens over its prompt's max_tokens."""
    limits: Any = max_tokens
    if own_max_tokens:
        limits = stats["id"].map(own_max_tokens).fillna(max_tokens).astype("float64")
    return stats.assign(**{TOKEN_SHARE_COLUMN: pd.to_numeric(stats["completion_tokens"], errors="coerce") / limits})


def validate_run(out_dir: str | Path, expected_ids: Iterable[str], thresholds: ValidationThresholds, *,
                 build_docs: bool = True, raise_on_failure: bool = True, run_name: str | None = None,
                 own_max_tokens: Mapping[str, int] | None = None, location: str | None = None) -> dict:
    """Validate a run's stats against ``thresholds``; return a small JSON-safe summary.

    ``location``: where people find the run, when ``out_dir`` is a working copy of it (a run on an object store,
    airflow/run_storage.py): the summary, the log and the error name the run's files there.

    ``own_max_tokens``: the prompts whose ``sampling.max_tokens`` replaces the run's, by id
    (``fleetgen.prompts.planned.read_planned_prompts``); their completions are bounded by it.

    The summary is also written to ``<out>/validation/summary.json``. On failure (and
    ``raise_on_failure``) raises :class:`ValidationFailed` listing each failed expectation with its
    observed value and sample ids; the summary rides along as ``.summary``.
    """
    started = time.monotonic()
    out = Path(out_dir)

    def shown(path: str | Path) -> str:
        return f"{location}/{Path(path).relative_to(out).as_posix()}" if location else str(path)

    stats, stats_info = load_stats(out, with_info=True)
    errors = load_errors(out)
    coverage, expected_duplicates = _coverage(stats["id"], errors["id"], expected_ids)
    own_max_tokens = dict(own_max_tokens or {})
    checks = _checks(thresholds, stats.columns, len(own_max_tokens))
    completions = _with_token_share(stats, thresholds.max_tokens, own_max_tokens)
    docs_dir = RunLayout(out).data_docs_dir if build_docs else None
    entries, docs_index = _run_gx({"completions": completions, "coverage": coverage}, checks, docs_dir, run_name)

    missing_ids = coverage.loc[coverage["outcome"] == "missing", "id"]
    duplicate_counts = coverage.loc[coverage["completions"] > 1, "completions"]
    unknown_ids = coverage.loc[~coverage["expected"], "id"]
    failed = [entry for entry in entries if not entry["success"]]
    summary = json_safe({
        "success": not failed,
        "out_dir": location or str(out),
        "rows": len(stats),
        "expected": int(coverage["expected"].sum()),
        "expected_duplicate_ids": expected_duplicates,
        "completed": int((coverage["outcome"] == "completed").sum()),
        "failed_prompts": int((coverage["outcome"] == "failed").sum()),
        "error_records": len(errors),
        "missing": {"count": len(missing_ids), "first_ids": _first_ids(missing_ids)},
        "duplicates": {"count": len(duplicate_counts), "extra_rows": int((duplicate_counts - 1).sum()),
                       "first_ids": _first_ids(coverage.loc[duplicate_counts.index, "id"])},
        "unknown_ids": {"count": len(unknown_ids), "first_ids": _first_ids(unknown_ids)},
        "stats_files": stats_info["files"],
        "torn_lines": stats_info["torn_lines"],
        "thresholds": thresholds.to_dict(),
        "expectations": entries,
        "failed_expectations": [entry["name"] for entry in failed],
        "data_docs": shown(docs_index) if docs_index else None,
        "seconds": round(time.monotonic() - started, 3),
    })
    summary_path = RunLayout(out).validation_summary
    summary_path.parent.mkdir(parents=True, exist_ok=True)
    summary_path.write_text(json.dumps(summary, indent=2) + "\n")
    log.info("validated %s: %d rows, %d expected ids, %d of %d expectations failed (%.1f s)",
             summary["out_dir"], summary["rows"], summary["expected"], len(failed), len(entries), summary["seconds"])
    if failed:
        for entry in failed:
            log.warning("expectation failed %s", _describe(entry)[2:])
        if raise_on_failure:
            lines = [f"validation failed: {len(failed)} of {len(entries)} expectations "
                     f"({summary['rows']} completion rows, {summary['expected']} prompts)"]
            lines += [_describe(entry) for entry in failed]
            raise ValidationFailed(
                "\n".join(lines), summary=summary, path=summary["out_dir"],
                hint=(f"open {summary['data_docs'] or shown(summary_path)} for every expectation; "
                      "missing ids usually mean a shard did not finish (clear its generate task: it resumes); "
                      "errors are listed in errors/*.jsonl: clearing a shard's generate task, once the servers are "
                      'fixed, sends its "fault": "server" prompts again (then clear validate); "fault": "prompt" '
                      "ones (e.g. too long) need their lines fixed and a new run"))
    return summary
