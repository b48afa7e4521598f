"""What the servers and GPUs did during generation, from the series the shards recorded.

- occupancy: the servers' own ``/metrics`` samples (``metrics/shard-*.jsonl``); a server's occupancy is
  its mean ``num_running_reqs`` / its effective cap over the generation span, the fleet's is the sum
  of the servers' mean running over the sum of their caps. A server under ``LOW_OCCUPANCY`` is called
  out with the likely reason read from the same samples (KV pool full, Mamba slots full, queue empty
  because the client sent too little, or down for part of the span).
- failures: the server events (``events/shard-*.jsonl``): when each server was marked down, by which
  shard, for how long, and the prompts retried or written off per server.

Samples from several shards at the same moment are all kept: each shard samples at the same interval,
so they weigh the same in every mean.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

from fleetgen.outputs import RunLayout

LOW_OCCUPANCY = 0.5  # running / cap under this is called out
FULL_USAGE = 0.9  # a pool this full is what holds the batch back
MAX_SERIES_POINTS = 120


def read_rows(files: list[Path]) -> pd.DataFrame:
    """Every JSONL row of ``files`` (torn last lines of a killed shard are skipped)."""
    rows = []
    for path in files:
        with path.open("rb") as handle:
            for line in handle:
                try:
                    rows.append(json.loads(line))
                except ValueError:
                    continue
    return pd.DataFrame(rows)


def _mean(frame: pd.DataFrame, column: str) -> float | None:
    if column not in frame or frame[column].isna().all():
        return None
    return round(float(frame[column].mean()), 4)


def _likely_reason(row: dict, down_s: float) -> str:
    span = row.get("span_s") or 0.0
    if span and down_s >= 0.2 * span:
        return f"down for {down_s:.0f} s of the {span:.0f} s span (see Failures)"
    if (row.get("token_usage_max") or 0) >= FULL_USAGE and (row.get("queue_mean") or 0) >= 1:
        return (f"KV cache full (token_usage up to {row['token_usage_max']:.2f}) with requests queued: the pool "
                f"holds fewer requests than the cap; plan for the real output lengths or give KV more memory")
    if (row.get("mamba_usage_max") or 0) >= FULL_USAGE and (row.get("queue_mean") or 0) >= 1:
        return "Mamba state slots full with requests queued: raise --max-mamba-cache-size"
    if (row.get("queue_mean") or 0) < 1:
        return (f"the client kept too few requests there (queue empty, {row.get('sent_mean') or 0:.0f} in flight "
                f"from the shards on average): raise headroom, or check parallel_shards and the shards' retries")
    return (f"requests queued ({row['queue_mean']:.0f} on average) while KV use stayed at "
            f"{row.get('token_usage_mean') or 0:.2f}: admission is slower than the finishes (prefill-bound)")


def occupancy(layout: RunLayout, *, span: tuple[float, float] | None, down_seconds: dict[str, float]) -> dict | None:
    """Per server and fleet occupancy, pool use and queue, the series to plot, and call-outs."""
    frame = read_rows(layout.shard_files("metrics"))
    if frame.empty or "running" not in frame:
        return None
    if span is not None:
        inside = frame[(frame["t"] >= span[0]) & (frame["t"] <= span[1])]
        frame = inside if not inside.empty else frame
    start, end = float(frame["t"].min()), float(frame["t"].max())
    width = max(1.0, math.ceil((end - start) / MAX_SERIES_POINTS)) if end > start else 1.0
    frame = frame.assign(bucket=((frame["t"] - start) // width).astype(int))
    servers: dict[str, dict] = {}
    for server, rows in frame.groupby("server", sort=True):
        cap = int(rows["cap"].max()) if "cap" in rows else 0
        running = float(rows["running"].mean())
        row = {"cap": cap, "samples": len(rows), "running_mean": round(running, 2),
               "running_max": float(rows["running"].max()),
               "occupancy": round(running / cap, 4) if cap else None,
               "queue_mean": _mean(rows, "queue"), "token_usage_mean": _mean(rows, "token_usage"),
               "token_usage_max": round(float(rows["token_usage"].max()), 4) if "token_usage" in rows
               and rows["token_usage"].notna().any() else None,
               "mamba_usage_max": round(float(rows["mamba_usage"].max()), 4) if "mamba_usage" in rows
               and rows["mamba_usage"].notna().any() else None,
               "accept_length_mean": _mean(rows, "accept_length"), "sent_mean": _mean(rows, "sent"),
               "span_s": round(end - start, 1)}
        by_bucket = rows.groupby("bucket")
        row["series"] = {"bucket": [int(b) for b in by_bucket.groups],
                         "running": [round(float(v), 2) for v in by_bucket["running"].mean()],
                         "queue": [round(float(v), 2) for v in by_bucket["queue"].mean()] if "queue" in rows else [],
                         "token_usage": [round(float(v), 4) for v in by_bucket["token_usage"].mean()]
                         if "token_usage" in rows else []}
        if row["occupancy"] is not None and row["occupancy"] < LOW_OCCUPANCY:
            row["low"] = _likely_reason(row, down_seconds.get(str(server), 0.0))
        servers[str(server)] = row
    caps = sum(row["cap"] for row in servers.values())
    fleet = round(sum(row["running_mean"] for row in servers.values()) / caps, 4) if caps else None
    return {"fleet_occupancy": fleet, "start": start, "bucket_seconds": width, "low_threshold": LOW_OCCUPANCY,
            "per_server": servers}


def failures(layout: RunLayout) -> dict:
    """Server events per server: down periods (when, which shard, why, how long), retried and failed prompts."""
    frame = read_rows(layout.shard_files("events"))
    per_server: dict[str, dict] = {}
    if frame.empty:
        return {"down_events": 0, "retried": 0, "failed": 0, "per_server": per_server}
    for server, rows in frame.groupby("server", sort=True):
        downs = rows[rows["event"] == "down"].sort_values("t")
        backs = rows[rows["event"] == "recovered"].sort_values("t")
        periods = []
        for _, down in downs.iterrows():
            later = backs[(backs["shard"] == down["shard"]) & (backs["t"] >= down["t"])]
            back = later.iloc[0] if not later.empty else None
            periods.append({"at": down["at"], "shard": int(down["shard"]), "reason": down.get("reason"),
                            "recovered_at": back["at"] if back is not None else None,
                            "down_s": float(back["down_s"]) if back is not None else None})
        per_server[str(server)] = {"down": periods, "retried": int((rows["event"] == "retried").sum()),
                                   "failed": int((rows["event"] == "failed").sum()),
                                   "down_seconds": round(sum(p["down_s"] or 0.0 for p in periods), 1)}
    return {"down_events": sum(len(row["down"]) for row in per_server.values()),
            "retried": sum(row["retried"] for row in per_server.values()),
            "failed": sum(row["failed"] for row in per_server.values()), "per_server": per_server}


def gpu_usage(layout: RunLayout, *, span: tuple[float, float] | None, completion_tokens: int) -> dict | None:
    """Per GPU: utilisation and power over time (``gpu/*.jsonl``), and the energy of the generation.

    A GPU's energy is its mean power over the samples inside the generation span times the span, so
    a sampling gap (a lease handed over, a lost session) does not count as zero watts. The fleet's
    energy per million output tokens divides the sum over every sampled GPU by the run's completion tokens.
    """
    frame = read_rows(layout.shard_files("gpu"))
    if frame.empty:
        return None
    if span is not None:
        inside = frame[(frame["t"] >= span[0]) & (frame["t"] <= span[1])]
        frame = inside if not inside.empty else frame
    start, end = float(frame["t"].min()), float(frame["t"].max())
    seconds = (span[1] - span[0]) if span is not None else end - start
    width = max(1.0, math.ceil((end - start) / MAX_SERIES_POINTS)) if end > start else 1.0
    frame = frame.assign(bucket=((frame["t"] - start) // width).astype(int))
    per_gpu: dict[str, dict] = {}
    for (node, gpu), rows in frame.groupby(["node", "gpu"], sort=True):
        power = rows["power_w"].dropna()
        by_bucket = rows.groupby("bucket")
        per_gpu[f"{node}:gpu{int(gpu)}"] = {
            "samples": len(rows), "util_mean": _mean(rows, "util"),
            "util_min": float(rows["util"].min()) if rows["util"].notna().any() else None,
            "power_mean_w": round(float(power.mean()), 1) if len(power) else None,
            "power_max_w": round(float(power.max()), 1) if len(power) else None,
            "mem_max_mib": float(rows["mem_mib"].max()) if rows["mem_mib"].notna().any() else None,
            "energy_j": round(float(power.mean()) * seconds, 1) if len(power) else None,
            "series": {"bucket": [int(b) for b in by_bucket.groups],
                       "util": [None if pd.isna(v) else round(float(v), 1) for v in by_bucket["util"].mean()],
                       "power_w": [None if pd.isna(v) else round(float(v), 1) for v in by_bucket["power_w"].mean()]}}
    energies = [row["energy_j"] for row in per_gpu.values() if row["energy_j"] is not None]
    energy = sum(energies) if energies else None
    per_million = energy / completion_tokens * 1e6 if energy is not None and completion_tokens else None
    return {"start": start, "bucket_seconds": width, "seconds": round(seconds, 3), "per_gpu": per_gpu,
            "energy_j": round(energy, 1) if energy is not None else None,
            "energy_kwh": round(energy / 3.6e6, 4) if energy is not None else None,
            "joules_per_million_tokens": round(per_million, 1) if per_million is not None else None,
            "kwh_per_million_tokens": round(per_million / 3.6e6, 4) if per_million is not None else None}
