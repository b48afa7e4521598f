"""The run report: ``report.json``, ``report.md`` and PNG plots in ``<out>/report/``.

Throughput is computed from the per-completion stats rows (never the completion texts):

- generation span = last ``finished_at`` - first request start, where a request started at
  ``finished_at - latency_s``. A resumed run's span includes the pause between attempts.
- ``tokens_per_s`` (the headline) = completion tokens / ``wall_seconds`` when the caller measured
  it (e.g. the generate stage's wall time), else / the generation span; ``timing.basis`` says which.
  ``tokens_per_s_generation`` is always the span-based figure, so two reports compare like for like.
- per server: the server's completion tokens / the run's generation span, so the servers add up
  to the fleet figure; ``tokens_per_s_active`` uses the server's own first start to last finish.
- per GPU: a server's figure split evenly over the GPUs it runs on (tensor parallel shares the work).
- over time: completion tokens counted in the bucket in which their request finished.
- net of dead time: a try that died (worker killed) held its shard until the next try resumed it;
  ``tokens_per_s_net_of_dead_time`` leaves those seconds out of the span (``timing.dead_seconds``).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import math
from pathlib import Path

import numpy as np
import pandas as pd

from fleetgen.generate.liveness import dead_seconds, lost_tries
from fleetgen.report.markdown import render_markdown
from fleetgen.report.gpu_hours import gpu_hours
from fleetgen.report.drain import drain_report
from fleetgen.report.occupancy import failures, gpu_usage, occupancy, read_rows
from fleetgen.report.plots import write_plots
from fleetgen.nodes.readiness import ServerInfo
from fleetgen.outputs import RunLayout, read_marker_stops
from fleetgen.report.payoff import AUTO_SIZING_MODE, tuning_payoff
from fleetgen.report.previous import REPORT_SCHEMA, find_previous_report
from fleetgen.report.prices import GpuHourPrice
from fleetgen.tuning.plan_notes import read_plan_notes
from fleetgen.validation.stats_table import load_errors, load_stats
from fleetgen.validation.outcome import why_not_passed
from fleetgen.validation.suite import json_safe

__all__ = ["build_report", "compare_reports", "summarize_stats"]

log = logging.getLogger(__name__)

_HISTOGRAM_BINS = 64
_MAX_TIMELINE_BUCKETS = 120
_NICE_BUCKET_SECONDS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 86400)
CAP_KEYS = ("max_running_requests", "max_mamba_cache_size", "max_total_num_tokens")


def _bucket_seconds(span: float) -> float:
    for width in _NICE_BUCKET_SECONDS:
        if span / width <= _MAX_TIMELINE_BUCKETS:
            return float(width)
    return float(math.ceil(span / _MAX_TIMELINE_BUCKETS))


def _server_gpus(plan: list[dict] | None, readiness: list[dict] | None) -> dict[str, dict]:
    """server "host:port" -> {"host", "gpu_ids"}; readiness (what runs) wins over the plan."""
    mapping: dict[str, dict] = {}
    for item in (plan or []) + (readiness or []):
        server = item.get("server") or f"{item['host']}:{item['port']}"
        mapping[server] = {"host": item.get("host") or server.rsplit(":", 1)[0],
                           "gpu_ids": [int(gpu) for gpu in item.get("gpu_ids") or []]}
    return mapping


def _timeline(frame: pd.DataFrame, start: float, span: float) -> dict:
    width = _bucket_seconds(max(span, 1.0))
    buckets = max(1, math.ceil(span / width))
    index = np.clip(((frame["finished_at"] - start) // width).to_numpy(dtype=np.int64), 0, buckets - 1)
    tokens = frame["completion_tokens"].to_numpy(dtype=np.float64)

    def series(mask: np.ndarray | slice) -> list[float]:
        sums = np.bincount(index[mask], weights=tokens[mask], minlength=buckets)
        return [round(value / width, 1) for value in sums]

    servers = frame["server"].astype(object).to_numpy()
    return {"start": start, "bucket_seconds": width, "overall": series(slice(None)),
            "per_server": {str(name): series(servers == name) for name in pd.unique(servers)}}


def summarize_stats(stats: pd.DataFrame, *, server_gpus: dict[str, dict] | None = None,
                    wall_seconds: float | None = None, max_tokens: int | None = None) -> dict:
    """Throughput, token statistics, finish reasons and timeline from a stats table (see module doc)."""
    frame = stats.dropna(subset=["completion_tokens", "finished_at", "server"])
    frame = frame.assign(started_at=frame["finished_at"] - frame["latency_s"].fillna(0.0))
    tokens = frame["completion_tokens"]
    total_tokens = int(tokens.sum())
    start = float(frame["started_at"].min()) if len(frame) else None
    last = float(frame["finished_at"].max()) if len(frame) else None
    span = (last - start) if len(frame) else 0.0
    per_span = total_tokens / span if span > 0 else None
    per_wall = total_tokens / wall_seconds if wall_seconds else None
    reasons = stats["finish_reason"].astype(object).fillna("null").value_counts()
    top = max(max_tokens or 1, int(tokens.max()) if len(tokens) else 1)  # out-of-range rows stay visible
    counts, edges = np.histogram(tokens, bins=_HISTOGRAM_BINS, range=(0, top)) if len(tokens) else ([], [])

    per_server: dict[str, dict] = {}
    for server, rows in frame.groupby(frame["server"].astype(object), sort=True):
        server_tokens = int(rows["completion_tokens"].sum())
        active = float(rows["finished_at"].max() - rows["started_at"].min())
        per_server[str(server)] = {
            "completions": len(rows), "completion_tokens": server_tokens,
            "tokens_per_s": round(server_tokens / span, 2) if span > 0 else None,
            "active_seconds": round(active, 3),
            "tokens_per_s_active": round(server_tokens / active, 2) if active > 0 else None,
            "mean_latency_s": round(float(rows["latency_s"].mean()), 3),
            "p95_latency_s": round(float(rows["latency_s"].quantile(0.95)), 3),
            "length_share": round(float((rows["finish_reason"] == "length").mean()), 6),
            "gpus": (server_gpus or {}).get(str(server), {}).get("gpu_ids", []),
        }
    per_gpu: dict[str, dict] = {}
    for server, figures in per_server.items():
        location = (server_gpus or {}).get(server)
        if not location or not location["gpu_ids"]:
            continue  # a server the plan/readiness does not know: no GPU to charge
        share = len(location["gpu_ids"])
        for gpu in location["gpu_ids"]:
            per_gpu[f"{location['host']}:gpu{gpu}"] = {
                "server": server, "completion_tokens": figures["completion_tokens"] / share,
                "tokens_per_s": round(figures["tokens_per_s"] / share, 2) if figures["tokens_per_s"] else None}

    def quantile(q: float) -> float | None:
        return float(tokens.quantile(q)) if len(tokens) else None

    return {
        "totals": {"completions": len(stats), "prompt_tokens": int(stats["prompt_tokens"].sum()),
                   "completion_tokens": total_tokens},
        "timing": {"first_start": start, "last_finish": last, "generation_seconds": round(span, 3),
                   "wall_seconds": wall_seconds,
                   "basis": "wall_seconds" if per_wall else "first_start_to_last_finish"},
        "throughput": {"tokens_per_s": round(per_wall or per_span or 0.0, 2),
                       "tokens_per_s_generation": round(per_span, 2) if per_span else None,
                       "tokens_per_s_wall": round(per_wall, 2) if per_wall else None,
                       "completions_per_s": round(len(frame) / (wall_seconds or span), 3)
                       if (wall_seconds or span) else None},
        "completion_tokens": {"mean": float(tokens.mean()) if len(tokens) else None,
                              "min": quantile(0), "p50": quantile(0.5), "p90": quantile(0.9),
                              "p99": quantile(0.99), "max": quantile(1),
                              "histogram": {"edges": [float(edge) for edge in edges],
                                            "counts": [int(count) for count in counts], "max_tokens": max_tokens}},
        # Measured prompt lengths (server tokenizer): the next run's tuner plans context from these.
        "prompt_tokens": {"mean": float(stats["prompt_tokens"].mean()) if len(stats) else None,
                          "p99": float(stats["prompt_tokens"].quantile(0.99)) if len(stats) else None,
                          "max": int(stats["prompt_tokens"].max()) if len(stats) else None},
        "finish_reasons": {str(name): int(count) for name, count in reasons.items()},
        "length_share": round(float((stats["finish_reason"] == "length").mean()), 6) if len(stats) else None,
        "per_server": per_server,
        "per_gpu": per_gpu,
        "timeline": _timeline(frame, start, span) if len(frame) else
        {"start": None, "bucket_seconds": None, "overall": [], "per_server": {}},
    }


def _tuning(plan: list[dict] | None, readiness: list[dict] | None) -> list[dict]:
    """Per server: launch flags, the caps the plan expected and the caps the server reported."""
    ready = {item.get("server") or f"{item['host']}:{item['port']}": item for item in readiness or []}
    rows = []
    for item in plan or []:
        server = f"{item['host']}:{item['port']}"
        seen = ready.pop(server, {})
        rows.append({"server": server, "host": item["host"], "port": item["port"],
                     "gpu_ids": item.get("gpu_ids", []), "flags": item.get("flags", {}),
                     "expected": {key: item.get("expected", {}).get(key) for key in CAP_KEYS},
                     "effective": _effective_caps(seen), "version": seen.get("version"),
                     # what the readback says of the memory the plan assumed (tuning/calibration.py)
                     "readback": (seen.get("calibration") or {}).get("report_line"),
                     # the workload mode's path: full-context cap, tonight's, the target, and why
                     "workload": (item.get("inputs", {}).get("workload_mode") or {}).get("step")})
    for server, seen in ready.items():  # running without a plan entry (e.g. plan not passed)
        rows.append({"server": server, "host": seen.get("host"), "port": seen.get("port"),
                     "gpu_ids": seen.get("gpu_ids", []), "flags": {},
                     "expected": dict.fromkeys(CAP_KEYS), "effective": _effective_caps(seen),
                     "version": seen.get("version")})
    for row in rows:
        row["matches"] = {key: (row["expected"][key] == row["effective"][key])
                          if None not in (row["expected"][key], row["effective"][key]) else None
                          for key in CAP_KEYS}
    return sorted(rows, key=lambda row: row["server"])


def _effective_caps(seen: dict) -> dict:
    """What the server reported at readiness (``ServerInfo.to_dict`` in the readiness result)."""
    if not seen.get("ranks"):
        return dict.fromkeys(CAP_KEYS)
    info = ServerInfo.from_dict(seen, server=seen.get("server", "?"))
    return {"max_running_requests": info.effective_max_running_requests,
            "max_mamba_cache_size": info.max_mamba_cache_size, "max_total_num_tokens": info.max_total_num_tokens}


def _servers(readiness: list[dict] | None) -> dict:
    """Servers kept running from an earlier run (they already ran tonight's plan) and (re)launched ones."""
    kept = sorted(item["server"] for item in readiness or [] if item.get("kept"))
    launched = sorted(item["server"] for item in readiness or [] if not item.get("kept"))
    return {"kept": len(kept), "relaunched": len(launched), "kept_servers": kept, "relaunched_servers": launched}


def _reuse_lookups(shard_results: list[dict] | None) -> dict:
    """What the shards' reuse lookups said (fleetgen.generate.reuse.ReuseLookup.summary): the runs copied from,
    the prompts generated again because their earlier copy could not be read (by reason), the runs passed over
    and, when no earlier run had tonight's generation key, which parts of it changed."""
    lookups = [item["reuse"] for item in shard_results or [] if item.get("reuse")]
    regenerated: dict[str, int] = {}
    passed_over: dict[str, str] = {}
    for lookup in lookups:
        for reason, count in lookup.get("regenerated", {}).items():
            regenerated[reason] = regenerated.get(reason, 0) + int(count)
        for skipped in lookup.get("skipped", []):
            passed_over.setdefault(skipped["run"], skipped["reason"])
    changed = next((lookup["changed"] for lookup in lookups if lookup.get("changed")), None)
    return {"source_runs": sorted({lookup["source"] for lookup in lookups if lookup.get("source")}),
            "regenerated": regenerated, "passed_over": [{"run": run, "reason": reason}
                                                         for run, reason in sorted(passed_over.items())],
            "changed": changed}


def _shards(shard_results: list[dict] | None) -> dict | None:
    if shard_results is None:
        return None
    seconds = [float(item.get("seconds") or 0.0) for item in shard_results]
    # a trial shard that its time cap cut short is finished by a generate_shard task: one shard, two results
    return {"count": len({item.get("shard_id") for item in shard_results}),
            "done": sum(int(item.get("done") or 0) for item in shard_results),
            "failed": sum(int(item.get("failed") or 0) for item in shard_results),
            "seconds_max": max(seconds, default=0.0), "seconds_total": round(sum(seconds), 3),
            "items": [{key: item.get(key) for key in ("shard_id", "done", "failed", "left", "prompt_tokens",
                                                      "completion_tokens", "seconds")}
                      for item in shard_results[:500]]}


def _delta(previous: float | int | None, current: float | int | None) -> dict:
    both = previous is not None and current is not None
    return {"previous": previous, "current": current, "delta": round(current - previous, 6) if both else None,
            "delta_pct": round((current - previous) / previous * 100, 2) if both and previous else None}


def compare_reports(current: dict, previous: dict, previous_path: str | None = None) -> dict:
    """Deltas of throughput, caps (per server and fleet total), token statistics and GPU-hours per million tokens."""
    old_hours, new_hours = previous.get("gpu_hours") or {}, current.get("gpu_hours") or {}
    metrics = {
        "tokens_per_s": (previous["throughput"]["tokens_per_s"], current["throughput"]["tokens_per_s"]),
        "tokens_per_s_generation": (previous["throughput"].get("tokens_per_s_generation"),
                                    current["throughput"].get("tokens_per_s_generation")),
        "completions": (previous["totals"]["completions"], current["totals"]["completions"]),
        "completion_tokens": (previous["totals"]["completion_tokens"], current["totals"]["completion_tokens"]),
        "generation_seconds": (previous["timing"]["generation_seconds"], current["timing"]["generation_seconds"]),
        "length_share": (previous.get("length_share"), current.get("length_share")),
        # what a million output tokens took and cost, night to night (report/gpu_hours.py): money only in one currency
        "gpu_hours_per_million_tokens": (old_hours.get("gpu_hours_per_million_tokens"),
                                         new_hours.get("gpu_hours_per_million_tokens")),
        "cost_per_million_tokens": (old_hours.get("cost_per_million_tokens")
                                    if old_hours.get("currency") == new_hours.get("currency") else None,
                                    new_hours.get("cost_per_million_tokens")),
    }
    for stat in ("mean", "p50", "p90", "p99"):
        metrics[f"completion_tokens_{stat}"] = (previous["completion_tokens"].get(stat),
                                                current["completion_tokens"].get(stat))
    old_caps = {row["server"]: row["effective"] for row in previous.get("tuning", [])}
    new_caps = {row["server"]: row["effective"] for row in current.get("tuning", [])}
    caps = {server: {key: _delta(old_caps.get(server, {}).get(key), new_caps.get(server, {}).get(key))
                     for key in CAP_KEYS} for server in sorted(set(old_caps) | set(new_caps))}

    def fleet_total(per_server: dict, key: str) -> int | None:
        values = [row.get(key) for row in per_server.values()]
        return sum(values) if values and None not in values else None

    servers = sorted(set(previous.get("per_server", {})) | set(current.get("per_server", {})))
    return {"available": True, "previous_run_id": previous.get("run_id"), "previous_report": previous_path,
            "metrics": {name: _delta(*pair) for name, pair in metrics.items()},
            "fleet_caps": {key: _delta(fleet_total(old_caps, key), fleet_total(new_caps, key)) for key in CAP_KEYS},
            "caps": caps,
            "per_server_tokens_per_s": {
                server: _delta(previous.get("per_server", {}).get(server, {}).get("tokens_per_s"),
                               current["per_server"].get(server, {}).get("tokens_per_s")) for server in servers}}


def _load_previous(previous_report: str | Path | None) -> tuple[dict | None, dict | None]:
    """(previous report, None) or (None, why it is not usable); a bad file must not fail the run."""
    if previous_report is None:
        return None, None
    try:
        previous = json.loads(Path(previous_report).read_text())
        if previous.get("schema") != REPORT_SCHEMA:
            raise ValueError(f"schema {previous.get('schema')!r}, expected {REPORT_SCHEMA}")
        return previous, None
    except (OSError, ValueError, AttributeError) as exc:
        log.warning("previous report %s not usable, no comparison: %s", previous_report, exc)
        return None, {"available": False, "previous_report": str(previous_report), "reason": str(exc)}


def _auto_sizing_report(out: Path) -> dict | None:
    """The newest earlier validated run of the same output root planned with SGLang's automatic sizing, whose
    measured tokens/s per GPU the Tuning payoff compares against (docs/tuning-trial.md §6)."""
    found = find_previous_report(out.parent, out.name, where=lambda report: (report.get("tuning_payoff") or {})
                                 .get("tuning_mode") == AUTO_SIZING_MODE) if out.parent.is_dir() else None
    return json.loads(found.read_text()) if found else None


def _net_of_dead_tries(report: dict, lost: list[dict]) -> None:
    """Tries that died held their shard's slot until the next try resumed it: ``timing.dead_seconds`` is
    the part of the generation span in which some dead try held one, and
    ``throughput.tokens_per_s_net_of_dead_time`` the generation figure over the span without it."""
    timing = report["timing"]
    dead = dead_seconds(lost, timing["first_start"], timing["last_finish"])
    live = timing["generation_seconds"] - dead
    timing["dead_seconds"] = round(dead, 3)
    timing["lost_tries"] = len(lost)
    report["throughput"]["tokens_per_s_net_of_dead_time"] = (
        round(report["totals"]["completion_tokens"] / live, 2) if live > 0 else None)


def build_report(out_dir: str | Path, *, run_id: str, plan: list[dict] | None, readiness: list[dict] | None,
                 shard_results: list[dict] | None, validation: dict | None,
                 previous_report: str | Path | None, wall_seconds: float | None = None,
                 gpu_hour_price: GpuHourPrice | None = None, location: str | None = None) -> dict:
    """Write ``<out>/report/{report.json, report.md, *.png}``; return a small JSON-safe summary. ``gpu_hour_price``:
    the run's prices (DAG parameter gpu_hour_price); without, GPU-hours and no money. ``location``: where people
    find the run, when ``out_dir`` is a working copy of it (a run on an object store)."""
    out = Path(out_dir)
    folder = RunLayout(out).report_dir
    folder.mkdir(parents=True, exist_ok=True)
    stats = load_stats(out)
    errors = load_errors(out)
    now = dt.datetime.now(dt.timezone.utc)
    max_tokens = ((validation or {}).get("thresholds") or {}).get("max_tokens")
    report = {"schema": REPORT_SCHEMA, "run_id": run_id, "out_dir": location or str(out),
              "generated_at": now.isoformat(timespec="seconds"), "generated_at_epoch": now.timestamp(),
              "run_succeeded": bool(validation and validation.get("success") is True)}
    # Completions copied from an earlier run count in validation, not in tonight's throughput.
    reused = stats["reused_from"].notna() if "reused_from" in stats else pd.Series(False, index=stats.index)
    report.update(summarize_stats(stats[~reused], server_gpus=_server_gpus(plan, readiness),
                                  wall_seconds=wall_seconds, max_tokens=max_tokens))
    report["reuse"] = {"reused": int(reused.sum()), "generated": int((~reused).sum()),
                       "from_runs": {str(run): int(count) for run, count in
                                     stats.loc[reused, "reused_from"].astype(object).value_counts().items()}
                       if "reused_from" in stats else {}, **_reuse_lookups(shard_results)}
    report["errors"] = {"records": len(errors), "prompts": int(errors["id"].nunique()),
                        "by_code": {str(code): int(count) for code, count in
                                    errors["code"].astype(object).fillna("none").value_counts().items()},
                        "per_server": {str(name): int(count) for name, count in
                                       errors["server"].astype(object).fillna("unknown").value_counts().items()}}
    _net_of_dead_tries(report, lost_tries(RunLayout(out)))
    report["tuning"] = _tuning(plan, readiness)
    report["plan_notes"] = read_plan_notes(RunLayout(out))  # nodes left out, a prompt that cuts every cap
    report["marker_stops"] = read_marker_stops(RunLayout(out))  # ours by the launch marker only (stop_servers)
    report["servers"] = _servers(readiness)
    report["failures"] = failures(RunLayout(out))
    timing = report["timing"]
    span = (timing["first_start"], timing["last_finish"]) if timing["first_start"] is not None else None
    report["occupancy"] = occupancy(RunLayout(out), span=span, down_seconds={
        server: row["down_seconds"] for server, row in report["failures"]["per_server"].items()})
    report["gpus"] = gpu_usage(RunLayout(out), span=span, completion_tokens=report["totals"]["completion_tokens"])
    # From what the servers said at readiness (/server_info), not from how the run was configured.
    report["simulated"] = any(bool(item.get("simulated")) for item in readiness or [])
    report["shards"] = _shards(shard_results)
    previous, unusable = _load_previous(previous_report)
    gpus = {server: len(where["gpu_ids"]) for server, where in _server_gpus(plan, readiness).items()
            if where["gpu_ids"]}
    report["tuning_payoff"] = tuning_payoff(
        RunLayout(out), plan=plan, gpus_per_server=gpus, simulated=report["simulated"],
        generation_seconds=timing["generation_seconds"], previous=previous, auto_report=_auto_sizing_report(out))
    # The job's tail apart from steady state, where speculation regains its value (report/drain.py).
    report["drain"] = drain_report(read_rows(RunLayout(out).shard_files("metrics")).to_dict("records"),
                                   gpus_per_server=gpus)
    # From launch to release, split into loading, generating and idle, and what it cost (report/gpu_hours.py).
    report["gpu_hours"] = gpu_hours(RunLayout(out), stats=stats[~reused], plan=plan,
                                    server_gpus=_server_gpus(plan, readiness), prices=gpu_hour_price or GpuHourPrice(),
                                    now=now.timestamp(), payoff=report["tuning_payoff"])
    report["validation"] = validation
    # Why the run does not count as validated (None when it does): it is then not indexed for reuse.
    report["not_validated"] = why_not_passed(RunLayout(out), validation)
    report["comparison"] = compare_reports(report, previous, str(previous_report)) if previous else unusable
    report = json_safe(report)
    report["plots"] = write_plots(report, folder)
    json_path, md_path = folder / "report.json", folder / "report.md"
    json_path.write_text(json.dumps(report, indent=2) + "\n")
    md_path.write_text(render_markdown(report))
    json_where, md_where = ((f"{location}/{path.relative_to(out).as_posix()}" if location else str(path))
                            for path in (json_path, md_path))
    log.info("report %s: %.1f completion tokens/s (%s), %d completions", json_where,
             report["throughput"]["tokens_per_s"], report["timing"]["basis"], report["totals"]["completions"])
    return {"report_json": json_where, "report_md": md_where,
            "tokens_per_s": report["throughput"]["tokens_per_s"], "basis": report["timing"]["basis"],
            "per_server": {name: row["tokens_per_s"] for name, row in report["per_server"].items()},
            "per_gpu": {name: row["tokens_per_s"] for name, row in report["per_gpu"].items()},
            "comparison": _comparison_brief(report["comparison"])}


def _comparison_brief(comparison: dict | None) -> dict | None:
    if not comparison or not comparison.get("available"):
        return comparison
    return {"previous_run_id": comparison["previous_run_id"],
            "tokens_per_s": comparison["metrics"]["tokens_per_s"],
            "tokens_per_s_generation": comparison["metrics"]["tokens_per_s_generation"],
            "completion_tokens_mean": comparison["metrics"]["completion_tokens_mean"],
            "fleet_max_running_requests": comparison["fleet_caps"]["max_running_requests"]}
