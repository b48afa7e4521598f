"""The report's "GPU-hours and cost": how long each server held its GPUs in this run, what it did with them, and
what that cost at the run's ``gpu_hour_price`` (docs/output-formats.md §6).

A server's time runs from when this run launched it (``launch_servers``), or took it over already running the plan
(kept from an earlier run), to its release: its last stop in ``server-times/`` when no launch came after it
(``release_servers``, or the trial's relaunch round stopping it for good), else the report's own time (the server
is still up: ``keep_servers_up``, or the report is being written before ``release_servers`` runs, as in the DAG).
That time is split three ways:

- loading: from a launch to the next ready (``wait_ready`` read ``/server_info``); a back-off relaunch is still
  loading, and so is a launch that never got ready;
- generating: the time at least one of tonight's requests was in flight on the server (the union of its
  completions' start, ``finished_at - latency_s``, to finish), so two shards on one server count once;
- idle: the rest (readiness checks, the trial's decision and relaunch, the shards starting, validation, the report).

The trial's relaunch round is counted once: a second ``kept``/``ready`` neither restarts a server's time nor loads;
a loser's stop-to-launch gap is idle, since its slot's GPUs stay the fleet's (docs/output-formats.md §6).

GPU-hours are those seconds times the server's GPUs over 3600. Per configuration (the tuning trial's candidates and
the one in use), GPU-hours per million output tokens come from the steady output tokens/s per GPU the Tuning payoff
measured (``report.payoff``): 10^6 / (rate x 3600), and the cost from them times the price per GPU-hour.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from fleetgen.outputs import RunLayout, read_server_times
from fleetgen.report.prices import GpuHourPrice

PARTS = ("held", "loading", "generating", "idle")
MILLION = 1_000_000
UNKNOWN_GPU = "GPU not named by the plan"  # a server without a plan entry: its GPUs' names are unknown


def server_span(events: list[dict], now: float) -> dict | None:
    """A server's time in this run from its events (``outputs.read_server_times``, in time order): start, end,
    how it ended, whether it was kept, and its loading seconds; None when this run never launched nor kept it (a
    server of an earlier run that stop_servers only stopped)."""
    start = next((event for event in events if event["event"] in ("launched", "kept")), None)
    if start is None:
        return None
    loading, loading_since, first_ready, end, basis = 0.0, None, None, now, "report"
    for event in events[events.index(start):]:
        kind, at = event["event"], float(event["t"])
        if kind == "launched":
            loading_since = at if loading_since is None else loading_since
            end, basis = now, "report"  # launched again after a stop: it runs on
        elif kind == "ready":
            first_ready = at if first_ready is None else first_ready
            if loading_since is not None:
                loading, loading_since = loading + at - loading_since, None
        elif kind == "stopped":
            if loading_since is not None:
                loading, loading_since = loading + at - loading_since, None
            end, basis = at, "released"
    if loading_since is not None:  # never got ready: loading until it ended
        loading += max(0.0, end - loading_since)
    return {"start": float(start["t"]), "ready": first_ready, "end": max(end, float(start["t"])), "end_basis": basis,
            "kept": start["event"] == "kept", "loading_s": loading}


def busy_seconds(starts: np.ndarray, ends: np.ndarray, low: float, high: float) -> float:
    """The length of the union of the intervals [starts, ends] inside [low, high]."""
    starts, ends = np.clip(starts, low, high), np.clip(ends, low, high)
    order = np.argsort(starts, kind="stable")
    starts, ends = starts[order], ends[order]
    if not len(starts):
        return 0.0
    reach = np.maximum.accumulate(ends)  # how far the intervals before each one reach
    gaps = np.maximum(0.0, starts[1:] - reach[:-1])  # the idle stretch before each interval
    return float(reach[-1] - starts[0] - gaps.sum())


def _gpu_names(plan: list[dict] | None) -> dict[str, list[str]]:
    """server -> the names of its GPUs as nvidia-smi printed them (the probe's rows the plan was made on)."""
    return {f"{item['host']}:{item['port']}": [str(gpu.get("name")) for gpu in (item.get("inputs") or {}).get("gpus")
                                              or []] for item in plan or []}


def _money(value: float | None) -> float | None:
    return round(value, 4) if value is not None else None


def _per_million(amount: float | None, tokens: int) -> float | None:
    return round(amount / tokens * MILLION, 4) if amount is not None and tokens else None


def _server(span: dict, rows: pd.DataFrame, gpus: int, names: list[str], prices: GpuHourPrice) -> dict:
    held = span["end"] - span["start"]
    started = (rows["finished_at"] - rows["latency_s"].fillna(0.0)).to_numpy(dtype=np.float64)
    generating = busy_seconds(started, rows["finished_at"].to_numpy(dtype=np.float64), span["start"], span["end"])
    loading = min(span["loading_s"], held)
    generating = min(generating, held - loading)
    seconds = {"held": held, "loading": loading, "generating": generating, "idle": held - loading - generating}
    tokens = int(rows["completion_tokens"].sum())
    hourly = [prices.of(name) for name in names] if names and len(names) == gpus else [None]
    price = sum(hourly) if prices.priced and None not in hourly else None
    cost = price * held / 3600 if price is not None else None
    return {"gpus": gpus, "gpu_names": names, "kept": span["kept"], "start": span["start"], "ready": span["ready"],
            "end": span["end"], "end_basis": span["end_basis"],
            "seconds": {part: round(value, 3) for part, value in seconds.items()},
            "gpu_hours": {part: round(value * gpus / 3600, 6) for part, value in seconds.items()},
            "completion_tokens": tokens,
            "gpu_hours_per_million_tokens": _per_million(held * gpus / 3600, tokens),
            "price_per_hour": _money(price), "cost": _money(cost),
            "cost_per_million_tokens": _per_million(cost, tokens)}


def _rate_cost(rate: float | None, price_per_gpu_hour: float | None) -> tuple[float | None, float | None]:
    """(GPU-hours, cost) per million output tokens at ``rate`` output tokens/s per GPU."""
    if not rate or rate <= 0:
        return None, None
    hours = MILLION / (rate * 3600)
    return round(hours, 6), _money(hours * price_per_gpu_hour) if price_per_gpu_hour is not None else None


def _mean_price(servers: list[str], per_server: dict[str, dict]) -> float | None:
    """Price per GPU-hour over the GPUs of ``servers`` (None when one of them has no price)."""
    rows = [per_server.get(server) for server in servers]
    if not rows or any(row is None or row["price_per_hour"] is None for row in rows):
        return None
    return sum(row["price_per_hour"] for row in rows) / sum(row["gpus"] for row in rows)


def _configurations(payoff: dict | None, per_server: dict[str, dict]) -> dict:
    """GPU-hours and cost per million output tokens of each trial candidate and of the configuration in use, at
    their steady rate, and what the one in use saves against the incumbent and SGLang's automatic sizing."""
    if not payoff:
        return {"rows": [], "savings": []}
    everyone = sorted(per_server)
    in_use_price = _mean_price(everyone, per_server)
    rows = []
    for candidate in payoff.get("candidates") or []:
        rate = (candidate.get("score") or {}).get("median")
        price = _mean_price(candidate["servers"], per_server)
        hours, cost = _rate_cost(rate, price)
        rows.append({"name": candidate["name"], "tokens_per_s_per_gpu": rate, "price_per_gpu_hour": _money(price),
                     "gpu_hours_per_million_tokens": hours, "cost_per_million_tokens": cost,
                     "winner": candidate["winner"], "incumbent": candidate["incumbent"]})
    in_use = payoff.get("in_use") or {}
    rate = (in_use.get("score") or {}).get("median")
    hours, cost = _rate_cost(rate, in_use_price)
    rows.append({"name": "in use" + (f" ({in_use['candidate']})" if in_use.get("candidate") else ""),
                 "tokens_per_s_per_gpu": rate, "price_per_gpu_hour": _money(in_use_price),
                 "gpu_hours_per_million_tokens": hours, "cost_per_million_tokens": cost, "winner": None,
                 "incumbent": None})
    savings = []
    decision = payoff.get("decision")
    if decision:
        chosen = next((row for row in rows if row["name"] == decision["winner"]), None)
        baseline = next((row for row in rows if row["name"] == decision["incumbent"]), None)
        if chosen and baseline:
            savings.append(_saving(decision["winner"], f"the incumbent ({decision['incumbent']})", baseline, chosen))
    auto = payoff.get("vs_auto_sizing") or {}
    if auto.get("measured") and auto.get("rate"):
        auto_hours, auto_cost = _rate_cost(auto["rate"], in_use_price)
        savings.append(_saving(f"the configuration {rows[-1]['name']}",
                               f"SGLang's automatic sizing ({auto['source']})",
                               {"gpu_hours_per_million_tokens": auto_hours, "cost_per_million_tokens": auto_cost},
                               rows[-1]))
    return {"rows": rows, "savings": savings}


def _saving(chosen_name: str, against: str, baseline: dict, chosen: dict) -> dict:
    def less(key: str) -> float | None:
        return round(baseline[key] - chosen[key], 6) if None not in (baseline[key], chosen[key]) else None

    return {"configuration": chosen_name, "against": against, "same": chosen is baseline,
            "gpu_hours_per_million_tokens": less("gpu_hours_per_million_tokens"),
            "cost_per_million_tokens": less("cost_per_million_tokens")}


def gpu_hours(layout: RunLayout, *, stats: pd.DataFrame, plan: list[dict] | None, server_gpus: dict[str, dict],
              prices: GpuHourPrice, now: float, payoff: dict | None = None) -> dict:
    """``report.json``'s ``gpu_hours``: per server and for the run, the time held split into loading, generating
    and idle, in seconds and GPU-hours, and its cost (see the module doc). ``stats``: tonight's generated rows."""
    frame = stats.dropna(subset=["completion_tokens", "finished_at", "server"])
    by_server = {str(server): rows for server, rows in frame.groupby(frame["server"].astype(object), sort=True)}
    names = _gpu_names(plan)
    per_server: dict[str, dict] = {}
    for server, events in read_server_times(layout).items():
        span = server_span(events, now)
        if span is None:
            continue
        gpu_ids = (server_gpus.get(server) or {}).get("gpu_ids") or []
        server_names = names.get(server, [])
        per_server[server] = _server(span, by_server.get(server, frame.iloc[:0]), len(gpu_ids) or len(server_names)
                                     or 1, server_names, prices)
    not_recorded = sorted(set(server_gpus) - set(per_server))
    unpriced: dict[str, list[str]] = {}  # GPU name -> the servers it leaves without a cost
    for server, row in per_server.items():
        for name in row["gpu_names"] or [UNKNOWN_GPU]:
            if prices.of(name) is None and server not in unpriced.get(name, []):
                unpriced.setdefault(name, []).append(server)
    # from the seconds, not the rounded per-server figures
    total = {part: sum(row["seconds"][part] * row["gpus"] for row in per_server.values()) / 3600 for part in PARTS}
    tokens = int(frame["completion_tokens"].sum())
    hourly = [row["price_per_hour"] for row in per_server.values()]
    cost = (sum(row["price_per_hour"] * row["seconds"]["held"] / 3600 for row in per_server.values())
            if prices.priced and hourly and None not in hourly else None)
    return {"currency": prices.currency, "priced": prices.priced, "prices": prices.to_dict(),
            "gpu_hours": {part: round(value, 6) for part, value in total.items()}, "completion_tokens": tokens,
            "gpu_hours_per_million_tokens": _per_million(total["held"], tokens),
            "cost": _money(cost), "cost_per_million_tokens": _per_million(cost, tokens),
            "ends": sorted({row["end_basis"] for row in per_server.values()}),
            "unpriced": {name: sorted(servers) for name, servers in sorted(unpriced.items())} if prices.priced else {},
            "unused_prices": prices.unused(name for row in per_server.values() for name in row["gpu_names"]),
            "not_recorded": not_recorded, "per_server": per_server,
            "configurations": _configurations(payoff, per_server)}
