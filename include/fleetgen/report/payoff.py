"""The report's "Tuning payoff": what the tuning trial measured, what it decided, and what the configuration in
use gained over SGLang's own sizing and over the previous night (docs/tuning-trial.md §6).

Read from the run's ``trial-decision.json`` (``RunLayout.trial_decision``, written by the decide task) and the
servers' ``metrics/`` rows; the rates are ``fleetgen.tuning.trial``'s steady-state output tokens/s per GPU, so a
run with a trial and one without measure alike and compare night to night.
"""

from __future__ import annotations

import json
import math

from fleetgen.errors import ConfigError
from fleetgen.outputs import RunLayout
from fleetgen.report.occupancy import read_rows
from fleetgen.tuning.plan import INCUMBENT, SGLANG_DEFAULTS
from fleetgen.tuning.plan_notes import read_plan_notes
from fleetgen.tuning.trial import TrialDecision, score, steady_window_rates

# The measuring window when the run's decision does not name the trial's own: six samples at the shards' 5 s
# sampling interval (docs/output-formats.md §3.6), about 30 completions at a cap of 64 with 60 s requests.
REPORT_WINDOW_S = 30.0
AUTO_SIZING_MODE = SGLANG_DEFAULTS  # SGLang's automatic sizing
IN_USE = "in use"


def fleet_signature(plan: list[dict] | None) -> dict | None:
    """What a measurement carries over with between runs of one output root: the GPU names and the model (its
    architecture and weight bytes), from the plan's inputs; None without a plan."""
    gpus, models = set(), set()
    for item in plan or []:
        inputs = item.get("inputs") or {}
        gpus |= {str(gpu.get("name")) for gpu in inputs.get("gpus") or []}
        profile = inputs.get("profile") or {}
        if profile:
            models.add((str(profile.get("architecture")), int(profile.get("weights_bytes_total") or 0)))
    if not gpus and not models:
        return None
    return {"gpus": sorted(gpus), "models": [list(model) for model in sorted(models)]}


def tuning_mode(plan: list[dict] | None) -> str | None:
    """The plan's mode when every server has the same one."""
    modes = {item.get("mode", "tuned") for item in plan or []}
    return modes.pop() if len(modes) == 1 else None


def _read_record(layout: RunLayout) -> tuple[dict | None, str | None]:
    """(the decision file's content, None) or (None, why it is unusable); (None, None) when there is none."""
    path = layout.trial_decision
    if not path.is_file():
        return None, None
    try:
        record = json.loads(path.read_text())
        if not isinstance(record, dict):
            raise ValueError("not an object")
        if "skipped" not in record:
            TrialDecision.from_dict(record)
        return record, None
    except (OSError, ValueError, ConfigError) as error:
        return None, f"{path.name} is not usable: {error}"


def _rows(layout: RunLayout) -> list[dict]:
    frame = read_rows(layout.shard_files("metrics"))
    if frame.empty:
        return []
    return [{key: value for key, value in row.items() if not (isinstance(value, float) and math.isnan(value))}
            for row in frame.to_dict("records")]


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or not denominator:
        return None
    return round(numerator / denominator, 4)


def _mean(values: list) -> float | None:
    values = [float(value) for value in values if value is not None]
    return round(sum(values) / len(values), 2) if values else None


def _in_use(rows: list[dict], gpus: dict[str, int], window_s: float, since: float | None) -> dict:
    """Every server's steady windows after ``since`` (the decision; the whole run without one), pooled."""
    after = [row for row in rows if row.get("server") in gpus and (since is None or row.get("t", 0) >= since)]
    rates = steady_window_rates(after, window_s=window_s, gpus_per_server=gpus)
    caps: dict[str, float] = {}
    for row in sorted(after, key=lambda row: row["t"]):
        caps[str(row["server"])] = row.get("cap")
    judged = score(IN_USE, [rate for server_rates in rates.values() for rate in server_rates])
    return {"score": judged.to_dict() if judged else None, "windows": sum(map(len, rates.values())),
            "cap": _mean(list(caps.values())), "servers": len(rates)}


def _candidates(record: dict, decision: TrialDecision) -> list[dict]:
    servers: dict[str, list[str]] = {}
    caps: dict[str, list] = {}
    for server, entry in record.get("servers", {}).items():
        servers.setdefault(entry["candidate"], []).append(server)
        caps.setdefault(entry["candidate"], []).append(entry.get("cap"))
    incumbent = decision.scores.get(decision.incumbent)
    incumbent_cap = _mean(caps.get(decision.incumbent, []))
    rows = []
    for name in sorted(decision.candidates | set(servers), key=lambda name: (name != decision.incumbent, name)):
        judged = decision.scores.get(name)
        cap = _mean(caps.get(name, []))
        rows.append({"name": name, "servers": sorted(servers.get(name, [])), "cap": cap,
                     "score": judged.to_dict() if judged else None,
                     "windows": judged.windows if judged else decision.unscored.get(name, 0),
                     "noisy": bool(judged and judged.noisy), "incumbent": name == decision.incumbent,
                     "winner": name == decision.winner,
                     "concurrency_x": _ratio(cap, incumbent_cap),
                     "throughput_x": _ratio(judged.median if judged else None, incumbent.median if incumbent else None)})
    return rows


def _cost(record: dict, decision: TrialDecision, job_gpu_seconds: float | None) -> dict:
    """GPU time the trial spent at a challenger's lower speed: (incumbent - challenger) / incumbent x its GPU-seconds."""
    incumbent = decision.scores.get(decision.incumbent)
    per_server, unmeasured, total = [], [], 0.0
    for server, entry in sorted(record.get("servers", {}).items()):
        if entry["candidate"] == decision.incumbent:
            continue
        challenger = decision.scores.get(entry["candidate"])
        gpu_seconds = float(entry.get("trial_seconds") or 0.0) * int(entry.get("gpus") or 1)
        if incumbent is None or challenger is None or incumbent.median <= 0:
            unmeasured.append(server)
            continue
        lost = max(0.0, incumbent.median - challenger.median) / incumbent.median * gpu_seconds
        total += lost
        per_server.append({"server": server, "candidate": entry["candidate"], "gpu_seconds": round(gpu_seconds, 1),
                           "gpu_minutes_lost": round(lost / 60, 3)})
    return {"gpu_minutes": round(total / 60, 3), "per_server": per_server, "unmeasured": unmeasured,
            "share_of_job": round(total / job_gpu_seconds, 6) if job_gpu_seconds else None}


def _against(in_use: dict, base_rate: float | None, base_cap: float | None, source: str) -> dict:
    rate = (in_use.get("score") or {}).get("median")
    throughput_x, concurrency_x = _ratio(rate, base_rate), _ratio(in_use.get("cap"), base_cap)
    return {"measured": throughput_x is not None, "source": source, "rate": base_rate, "cap": base_cap,
            "gain": round(throughput_x - 1, 4) if throughput_x is not None else None,
            "throughput_x": throughput_x, "concurrency_x": concurrency_x,
            "ratio_of_ratios": _ratio(throughput_x, concurrency_x)}


def _auto_sizing(record: dict | None, decision: TrialDecision | None, candidates: list[dict], in_use: dict,
                 mode: str | None, auto_report: dict | None) -> dict:
    """The configuration in use against SGLang's own automatic sizing, from the best source there is."""
    named = (record or {}).get("auto_sizing")
    if decision is not None and named in decision.scores:
        row = next(row for row in candidates if row["name"] == named)
        return _against(in_use, decision.scores[named].median, row["cap"], f"trial candidate {named}, tonight")
    if mode == AUTO_SIZING_MODE:
        return {**_against(in_use, (in_use.get("score") or {}).get("median"), in_use.get("cap"), "this run"),
                "note": "this run used SGLang's automatic sizing itself"}
    earlier = ((auto_report or {}).get("tuning_payoff") or {}).get("in_use") or {}
    if (earlier.get("score") or {}).get("median"):
        return _against(in_use, earlier["score"]["median"], earlier.get("cap"),
                        f"run {auto_report.get('run_id')} (tuning mode {AUTO_SIZING_MODE})")
    return {"measured": False, "why": "no trial candidate was SGLang's automatic sizing and no earlier validated run "
            f"of this output root and fleet was planned with tuning mode {AUTO_SIZING_MODE} (run one to measure it)"}


def _previous_night(in_use: dict, previous: dict | None) -> dict | None:
    earlier = ((previous or {}).get("tuning_payoff") or {}).get("in_use") or {}
    if not (earlier.get("score") or {}).get("median"):
        return None
    return {**_against(in_use, earlier["score"]["median"], earlier.get("cap"), f"run {previous.get('run_id')}"),
            "previous_run_id": previous.get("run_id")}


def tuning_payoff(layout: RunLayout, *, plan: list[dict] | None, gpus_per_server: dict[str, int], simulated: bool,
                  generation_seconds: float | None, previous: dict | None = None,
                  auto_report: dict | None = None) -> dict:
    """``report.json``'s ``tuning_payoff`` (docs/tuning-trial.md §6)."""
    record, unusable = _read_record(layout)
    decision = TrialDecision.from_dict(record) if record is not None and "skipped" not in record else None
    gpus = {**gpus_per_server, **{server: int(entry.get("gpus") or 1)
                                  for server, entry in ((record or {}).get("servers") or {}).items()}}
    window_s = float((record or {}).get("window_s") or REPORT_WINDOW_S)
    rows = _rows(layout)
    mode = tuning_mode(plan)
    payoff: dict = {"simulated": simulated, "window_s": window_s, "tuning_mode": mode, "fleet": fleet_signature(plan)}
    if decision is None:
        payoff["trial"] = "unusable" if unusable else ("skipped" if record else "absent")
        payoff["why"] = unusable or (record or {}).get("skipped") or (
            "the run has no trial decision: the trial was off, or the run was made before trials existed")
        candidate = {item.get("candidate", INCUMBENT) for item in plan or []}
        in_use = _in_use(rows, gpus, window_s, since=None)
        in_use["candidate"] = candidate.pop() if len(candidate) == 1 else None
        in_use["source"] = "the whole run"
        # derive_plan's own reasons (plan_notes.py): the decide task's "skipped" may only say that none was planned
        notes = [str(note) for note in read_plan_notes(layout).get("tuning_trial") or []]
        payoff.update(candidates=[], decision=None, cost=None, in_use=in_use, plan_notes=notes)
    else:
        candidates = _candidates(record, decision)
        in_use = _in_use(rows, gpus, window_s, since=record.get("decided_at"))
        in_use["source"] = "after the decision"
        if in_use["score"] is None and decision.winner in decision.scores:
            winner = next(row for row in candidates if row["name"] == decision.winner)
            in_use.update(score=winner["score"], windows=winner["windows"], cap=winner["cap"],
                          source="the winner's trial windows (too few after the decision)")
        in_use["candidate"] = decision.winner
        servers = record.get("servers") or {}
        job_gpu_seconds = (sum(gpus.get(server, 1) for server in servers) * generation_seconds
                           if generation_seconds else None)
        payoff.update(trial="ran", why=None, plan_notes=[], candidates=candidates, in_use=in_use,
                      decision={"incumbent": decision.incumbent, "winner": decision.winner,
                                "changed": decision.changed, "reason": decision.reason, "min_gain": decision.min_gain,
                                "gain": round(decision.gain, 4) if decision.gain is not None else None},
                      cost=_cost(record, decision, job_gpu_seconds),
                      relaunch=record.get("relaunch"))  # whether the losers' relaunch paid (tuning/relaunch_payoff.py)
    payoff["vs_auto_sizing"] = _auto_sizing(record, decision, payoff["candidates"], payoff["in_use"], mode,
                                            auto_report if (auto_report or {}).get("tuning_payoff", {}).get("fleet")
                                            == payoff["fleet"] else None)
    payoff["vs_previous"] = _previous_night(payoff["in_use"], previous)
    return payoff
