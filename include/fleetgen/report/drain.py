"""The end of the job apart from steady state: the queue empties and the running requests fall, where speculative
decoding regains its value (docs/tuning-trial.md §6; report.json's ``drain``, docs/output-formats.md §6).

Pure: from the servers' ``metrics/`` rows (docs/output-formats.md §3.6) and their GPU counts. Rows without both
counters, or without ``t``, ``server``, ``cap`` or ``running``, are skipped, as the tuning trial skips them.

- **Last stretch.** A server's rows in time order (several shards' rows interleave), cut where the trial cuts its
  windows for a restart (the output tokens counter falls below half) or a relaunch (another cap):
  ``trial.breaks_window``, with no gap long enough to cut. Only the last stretch counts: the configuration the job
  ended on.
- **Drain.** From the stretch's last row at its batch (``trial.is_at_batch`` at ``STEADY_RUNNING_SHARE``) to the
  first row after its last row with requests on it (running or queued), the first that reads the server empty; the
  stretch's last row when none does. SGLang adds a request's output tokens to its counter when the request
  finishes, so the last requests' tokens show only in that empty reading (each shard samples the servers once
  more as it ends); without one the requests still running at the last row are left out, with the seconds they
  took.
  The requests in flight at the drain's start bring along the tokens they made before it: the drain's tokens are
  the counter's rise over it, not all made in it.
- **Steady.** The counter's rise from the end of the warm-up (``WARMUP_TURNOVERS`` caps of completions after the
  stretch first reached its batch, the trial's rule) to the drain's start, per GPU.
- **Generation.** From the server's first row with requests on it to the drain's end; its tokens are the counter's
  rise within each of its stretches.

The fleet's figures add up the servers whose drain was measured; a server never at its batch on its last stretch,
or whose GPU count is not known, is listed with why and has no figures.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from fleetgen.tuning.trial import (GENERATION_TOKENS, REQUESTS, STEADY_RUNNING_SHARE, WARMUP_TURNOVERS,
                                   breaks_window, is_at_batch)

NEEDED = ("t", "server", "cap", "running", GENERATION_TOKENS, REQUESTS)
NEVER_AT_BATCH = "never at its batch on the configuration it ended on (its last stretch of rows): no drain measured"
NO_GPUS = "its GPU count is not known (neither the plan nor readiness places it): no drain measured"


def _known(value) -> bool:
    return value is not None and not (isinstance(value, float) and math.isnan(value))


def _has_requests(row: dict) -> bool:
    return row["running"] > 0 or (row.get("queue") or 0) > 0


def _stretches(rows: list[dict]) -> list[list[dict]]:
    """A server's rows in time order, cut at each restart or relaunch (no gap cuts: ``window_s`` infinite)."""
    stretches: list[list[dict]] = []
    for row in sorted(rows, key=lambda row: row["t"]):
        if not stretches or breaks_window(stretches[-1][-1], row, math.inf):
            stretches.append([])
        stretches[-1].append(row)
    return stretches


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or not denominator:
        return None
    return round(numerator / denominator, 4)


def _steady(stretch: list[dict], start: int) -> tuple[float, float] | None:
    """(output tokens, seconds) from the warm-up's end to the drain's start; None when the warm-up outlasts it."""
    first = next(index for index, row in enumerate(stretch) if is_at_batch(row, STEADY_RUNNING_SHARE))
    warmed = stretch[first][REQUESTS] + WARMUP_TURNOVERS * stretch[first]["cap"]
    warm = next((index for index in range(first, start + 1) if is_at_batch(stretch[index], STEADY_RUNNING_SHARE)
                 and stretch[index][REQUESTS] >= warmed), None)
    if warm is None or stretch[start]["t"] <= stretch[warm]["t"]:
        return None
    return (stretch[start][GENERATION_TOKENS] - stretch[warm][GENERATION_TOKENS],
            stretch[start]["t"] - stretch[warm]["t"])


def _server(rows: list[dict], gpus: int) -> dict | None:
    """One server's drain, steady part and generation as seconds and tokens; None when its last stretch never was
    at its batch."""
    stretches = _stretches(rows)
    last = stretches[-1]
    at_batch = [index for index, row in enumerate(last) if is_at_batch(row, STEADY_RUNNING_SHARE)]
    if not at_batch:
        return None
    start = at_batch[-1]
    last_busy = max((index for index in range(start, len(last)) if _has_requests(last[index])), default=start)
    end = min(last_busy + 1, len(last) - 1)
    begin = next(row for stretch in stretches for row in stretch if _has_requests(row))
    steady_tokens, steady_s = _steady(last, start) or (0.0, 0.0)
    return {"gpus": gpus, "cap": int(last[start]["cap"]), "start": last[start]["t"], "end": last[end]["t"],
            "drain_s": last[end]["t"] - last[start]["t"], "generation_s": last[end]["t"] - begin["t"],
            "tokens": last[end][GENERATION_TOKENS] - last[start][GENERATION_TOKENS],
            "generation_tokens": sum(stretch[-1][GENERATION_TOKENS] - stretch[0][GENERATION_TOKENS]
                                     for stretch in stretches),
            "steady_s": steady_s, "steady_tokens": steady_tokens,
            # each reading of running holds until the next row
            "running_seconds": sum(last[index]["running"] * (last[index + 1]["t"] - last[index]["t"])
                                   for index in range(start, end))}


def _figures(parts: list[dict]) -> dict:
    """Shares and rates of one server's parts, or of several summed: a server weighs by its GPUs and seconds."""
    def total(key: str, per_gpu: bool = False) -> float:
        return sum(part[key] * (part["gpus"] if per_gpu else 1) for part in parts)

    gpu_seconds, steady_gpu_seconds = total("drain_s", per_gpu=True), total("steady_s", per_gpu=True)
    rate = total("tokens") / gpu_seconds if gpu_seconds > 0 else None
    steady_rate = total("steady_tokens") / steady_gpu_seconds if steady_gpu_seconds > 0 else None
    return {"gpu_seconds": round(gpu_seconds, 3),
            "generation_gpu_seconds": round(total("generation_s", per_gpu=True), 3),
            "gpu_time_share": _ratio(gpu_seconds, total("generation_s", per_gpu=True)),
            "tokens": round(total("tokens"), 1), "generation_tokens": round(total("generation_tokens"), 1),
            "token_share": _ratio(total("tokens"), total("generation_tokens")),
            "tokens_per_s_per_gpu": round(rate, 2) if rate is not None else None,
            "steady_tokens_per_s_per_gpu": round(steady_rate, 2) if steady_rate is not None else None,
            "rate_vs_steady": _ratio(rate, steady_rate),
            # running requests x seconds over cap x seconds
            "running_share": _ratio(total("running_seconds"), sum(part["cap"] * part["drain_s"] for part in parts))}


def _server_figures(part: dict) -> dict:
    running = part["running_seconds"] / part["drain_s"] if part["drain_s"] > 0 else None
    return {"gpus": part["gpus"], "cap": part["cap"], "start": part["start"], "end": part["end"],
            "drain_s": round(part["drain_s"], 3), "generation_s": round(part["generation_s"], 3),
            "running_mean": round(running, 2) if running is not None else None,
            "steady_s": round(part["steady_s"], 3) or None, **_figures([part])}


def _fleet_figures(parts: list[dict]) -> dict | None:
    if not parts:
        return None
    start, end = min(part["start"] for part in parts), max(part["end"] for part in parts)
    return {"servers": len(parts), "start": start, "end": end, "seconds": round(end - start, 3), **_figures(parts)}


def drain_report(samples: Iterable[dict], *, gpus_per_server: dict[str, int]) -> dict | None:
    """report.json's ``drain``: per server and for the fleet (see the module's docstring); None without a usable
    row. ``samples``: ``metrics/`` rows, missing values as None or NaN (a pandas frame's records)."""
    by_server: dict[str, list[dict]] = {}
    for sample in samples:
        row = {key: value for key, value in sample.items() if _known(value)}
        if all(name in row for name in NEEDED):
            by_server.setdefault(str(row["server"]), []).append(row)
    if not by_server:
        return None
    parts: dict[str, dict] = {}
    unmeasured: dict[str, str] = {}
    for server, rows in sorted(by_server.items()):
        gpus = gpus_per_server.get(server)
        part = _server(rows, gpus) if gpus else None
        if part is None:
            unmeasured[server] = NEVER_AT_BATCH if gpus else NO_GPUS
        else:
            parts[server] = part
    return {"per_server": {server: _server_figures(part) for server, part in parts.items()},
            "unmeasured": unmeasured, "fleet": _fleet_figures(list(parts.values()))}


def _figure(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def drain_lines(drain: dict | None) -> list[str]:
    """report.md's "End of the job" section; nothing without ``metrics/`` rows (Occupancy says so)."""
    if not drain:
        return []
    lines = ["## End of the job", ""]
    fleet = drain["fleet"]
    if fleet is None:
        lines += ["No drain measured: no server was at its batch on its last stretch.", ""]
    else:
        against = (f" against {_figure(fleet['steady_tokens_per_s_per_gpu'])} in steady state "
                   f"({fleet['rate_vs_steady']:.2f}x)" if fleet["rate_vs_steady"] is not None else "")
        lines += [f"From the first server leaving its batch to the last one empty: {_figure(fleet['seconds'])} s. "
                  f"The drain took {_share(fleet['gpu_time_share'])} of the servers' GPU time generating and made "
                  f"{_share(fleet['token_share'])} of their output tokens, at "
                  f"{_figure(fleet['tokens_per_s_per_gpu'])} output tokens/s per GPU{against}, with "
                  f"{_share(fleet['running_share'])} of the cap running on average.", "",
                  "Speculative decoding gains most at small batch (SGLang PR #34307: MTP on Qwen3.6-27B-FP8 on one "
                  "H200, 2.76x at batch 1, about 1.08x at batch 64): the configuration chosen in steady state may not "
                  "be the fastest here.", "",
                  "| server | GPUs | drain s | share of its generation | output tokens | tokens/s per GPU: drain / "
                  "steady | mean running / cap |", "|---|---|---|---|---|---|---|"]
        lines += [f"| {name} | {row['gpus']} | {_figure(row['drain_s'], 1)} | {_share(row['gpu_time_share'])} | "
                  f"{_figure(row['tokens'])} | {_figure(row['tokens_per_s_per_gpu'])} / "
                  f"{_figure(row['steady_tokens_per_s_per_gpu'])} | {_figure(row['running_mean'], 1)} / "
                  f"{row['cap']} ({_share(row['running_share'])}) |" for name, row in drain["per_server"].items()]
        lines += [""]
    lines += [f"- **{name}**: {why}." for name, why in drain["unmeasured"].items()]
    return lines + ([""] if drain["unmeasured"] else [])
