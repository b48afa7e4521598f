"""Task callables of the tuning trial (docs/tuning-trial.md): tonight's split plan, the decision after the trial
shards, and the second server round that puts every server on the winner.

The shape in the DAG: ``tune.derive_plan`` plans every candidate for every server and launches the split
(``tonights_plans``); ``generate.trial_shard`` generates the first ``tuning_trial_share`` of the prompts on it;
``trial.decide`` measures each server's steady output tokens/s per GPU from the trial shards' ``/metrics`` samples
and keeps the winner; ``trial.relaunch_needed`` lets the ``relaunch`` group run only when some server ran a loser;
``relaunch.stop_servers`` stops those (the servers already on the winner are kept by the keep-on-plan rule),
``relaunch.launch_servers`` / ``relaunch.wait_ready`` start them on the winner, and ``relaunch.servers_in_use``
hands the servers the rest of the job runs on to ``generate.generate_shard``.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

from fleetgen.airflow.context import mapped_values, run_context
from fleetgen.airflow.run_config import RunConfig
from fleetgen.nodes.fleet import FleetSpec
from fleetgen.outputs import RunLayout
from fleetgen.tuning.candidates import MIN_TRIAL_SERVERS, SGLANG_AUTO
from fleetgen.tuning.trial import MIN_WINDOWS

log = logging.getLogger("fleetgen")


# --- derive_plan: tonight's split ---------------------------------------------------------------------------------

def why_no_trial(config: RunConfig, spec: FleetSpec) -> str | None:
    """Why tonight runs no trial before any candidate is planned (the parameter to change), or None."""
    if not config.tuning.trial:
        return "no tuning trial: the DAG parameter tuning_trial is off"
    if config.tuning.mode != "tuned":
        return (f"no tuning trial: the tuning mode is {config.tuning.mode} (SGLang sizes the servers itself; set "
                f"tuning to tuned to try candidates)")
    if len(spec.servers()) < MIN_TRIAL_SERVERS:
        return (f"no tuning trial: {len(spec.servers())} server(s), and a trial needs at least {MIN_TRIAL_SERVERS} "
                "(the incumbent on most, each challenger on one)")
    if config.generation.sample_interval_s <= 0:
        return "no tuning trial: the DAG parameter sample_interval_s is 0, so nothing samples the servers' speed"
    if config.generation.sample_interval_s >= config.tuning.trial_window_s:
        return (f"no tuning trial: sample_interval_s {config.generation.sample_interval_s:g} is not shorter than "
                f"tuning_trial_window_s {config.tuning.trial_window_s:g}, so no window holds two samples")
    least = (MIN_WINDOWS + 1) * config.tuning.trial_window_s  # the windows a decision needs, and a warm-up as long
    if 0 < config.tuning.trial_max_s < least:
        return (f"no tuning trial: tuning_trial_max_s {config.tuning.trial_max_s:g} cannot hold a warm-up and "
                f"{MIN_WINDOWS} windows of tuning_trial_window_s {config.tuning.trial_window_s:g} (at least "
                f"{least:g} s; 0 lifts the cap)")
    return None


def trial_key_parts(inventories: dict[str, dict], spec: FleetSpec, identity: dict | None) -> dict:
    """The parts of the trial's history key known before the trial: the GPU the plan sizes for, the model and
    the SGLang version (tuning/trial_history.py). Empty without a model identity."""
    from fleetgen.nodes import probe
    from fleetgen.tuning.trial_history import model_identity_key

    if not identity:
        return {}
    first = spec.servers()[0]
    gpu = probe.select_gpus(inventories[first.node], first.gpu_ids)[0]
    return {"gpu": str(gpu["name"]), "model": model_identity_key(identity),
            "sglang_version": str((identity.get("parts") or {}).get("sglang"))}


def previous_report(output_root: Path, layout: RunLayout) -> tuple[dict, str] | None:
    """(the report, the run's folder name) of the previous successful run under ``output_root``, or None."""
    from fleetgen.outputs import run_root_of_report
    from fleetgen.report.previous import find_previous_report

    previous = find_previous_report(output_root, layout.root.name) if Path(output_root).exists() else None
    if previous is None:
        return None
    try:
        return json.loads(Path(previous).read_text()), run_root_of_report(Path(previous)).name
    except (OSError, ValueError):
        return None


def previous_workload_bucket(previous: tuple[dict, str] | None) -> str | None:
    """The workload bucket of the previous successful run (its servers' own token counts), or None."""
    from fleetgen.tuning.trial_history import workload_bucket

    try:
        prompt, completion = previous[0]["prompt_tokens"]["mean"], previous[0]["completion_tokens"]["mean"]
    except (KeyError, TypeError):
        return None
    return workload_bucket(float(prompt), float(completion)) if prompt and completion else None


def previous_pace(previous: tuple[dict, str] | None, servers: list[str], window_s: float):
    """The previous successful run's finished requests per second per server (its completions over its generation
    span), when it ran on exactly tonight's servers; None otherwise (``trial_plan.TrialPace``)."""
    from fleetgen.tuning.trial_plan import TrialPace

    try:
        report, run = previous
        per_server, seconds = report["per_server"], float(report["timing"]["generation_seconds"])
        completions = sum(int(entry["completions"]) for entry in per_server.values())
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
    if set(per_server) != set(servers) or not seconds > 0 or completions <= 0:
        return None
    return TrialPace(requests_per_s=completions / seconds / len(servers), window_s=window_s, source=run)


def reused_trial_prompts(config: RunConfig, spec: FleetSpec, layout: RunLayout, prompt_scan: dict,
                         identity: dict | None, head: int) -> tuple[int, str | None]:
    """(how many of the trial's first ``head`` prompts have an unchanged completion in the earlier run this run
    reuses from, that run's folder): the trial's shards copy those and generate only the others, so only the others
    measure the split. (0, None) when the caller's run reuses nothing (``reuse_completions``, its run type) or no
    earlier run holds the same model and sampling."""
    from fleetgen.airflow.generate_tasks import generation_material, generation_settings
    from fleetgen.airflow.run_storage import look_up_reuse_here
    from fleetgen.generate.reuse import prompt_hash
    from fleetgen.prompts import scan as prompts
    from fleetgen.prompts.planned import iter_shard_positions

    if not identity or head <= 0:
        return 0, None
    lookup = look_up_reuse_here(config.inputs.output_root, layout,
                                generation_material(identity, generation_settings(config, spec)), log)
    source = lookup.source
    if source is None:
        return 0, None
    try:
        shard = prompts.plan_shards(config.inputs.prompts_path, shard_size=head,
                                    scan=prompts.PromptScan.from_dict(prompt_scan), head=head)[0]
        digests = [prompt_hash(prompt) for _, _, _, prompt in iter_shard_positions(
            shard["input_path"], shard["start"], int(shard["count"]), length_limit=shard.get("length_limit"),
            end=shard.get("end"), blocks=shard.get("blocks"), shard=int(shard["shard_id"]))]
        return sum(found is not None for found in source.find(digests)), source.run_folder
    finally:
        source.close()


def tonights_plans(spec: FleetSpec, inventories: dict[str, dict], model, workload, config: RunConfig,
                   layout: RunLayout, run, identity: dict | None, *,
                   reused_in_trial=lambda head: (0, None)) -> tuple[list, list[str]]:
    """(tonight's plans, one per server in the fleet's order; the trial's notes for the log and plan notes, none when
    the trial is off).

    With a trial: every candidate planned for every server and written to ``RunLayout.candidate_plans``; each server
    gets its candidate's plan. Without: ``fleet_plan.plan_fleet`` as before, and the note says why.
    ``reused_in_trial(head)``: how many of the trial's first ``head`` prompts this run will copy from an earlier run,
    and from which (``reused_trial_prompts``); only the others measure the split."""
    from fleetgen.tuning import fleet_plan, workload_history
    from fleetgen.tuning.trial_history import TrialHistory, TrialKey
    from fleetgen.tuning.trial_plan import plan_trial, write_trial_plan
    from fleetgen.outputs import trial_history_file

    why_not = why_no_trial(config, spec)
    if why_not is not None:
        layout.candidate_plans.unlink(missing_ok=True)  # a retried derive_plan of a run that had one
        plans = fleet_plan.plan_fleet(spec, inventories, model, fleet_plan.options_for(spec, spec.server.extra_args),
                                      workload, config.tuning.bounds(), run, log)
        if not config.tuning.trial:  # the user's choice: the log says it, the plan notes need not
            log.info("%s", why_not)
            return plans, []
        return plans, [why_not]
    parts = trial_key_parts(inventories, spec, identity)
    previous = previous_report(config.inputs.output_root, layout)
    bucket = previous_workload_bucket(previous)
    key = TrialKey(**parts, workload=bucket) if parts and bucket else None
    head = trial_share_of(config, workload.prompt_count)
    reused, source = reused_in_trial(head)
    trial = plan_trial(spec, inventories, model, workload, config.tuning.bounds(), run, log,
                       listed=config.tuning.listed_candidates(),
                       history=TrialHistory(trial_history_file(config.inputs.output_root)), key=key, key_parts=parts,
                       trial_prompts=head - reused,
                       pace=previous_pace(previous, [slot.name for slot in spec.servers()],
                                          config.tuning.trial_window_s))
    write_trial_plan(layout, trial)
    plans = trial.tonight()
    workload_history.write_plan_record(layout, plans)
    notes = list(trial.split.notes)
    if reused:
        notes.append(f"{reused} of the trial's {head} prompt(s) have unchanged completions in run {source}, which "
                     f"this run reuses: the trial generates {head - reused}")
    notes += [f"candidate {name}: {what}" for name, what in trial.described.items()]
    notes += [f"candidate {name} left out: {why}" for name, why in trial.skipped.items()]
    if not parts:
        notes.append("the trial is not recorded for later nights: derive_plan was given no model identity")
    elif key is None and trial.split.trial:
        notes.append("the trial's history key waits for its own completions (no earlier run measured the workload)")
    return plans, notes


# --- the plan of the shards ---------------------------------------------------------------------------------------

def trial_prompt_count(config: RunConfig, plans: list[dict] | None, count: int) -> int:
    """How many of the first prompts the trial shards take: ``trial_share_of`` them when tonight's plans put a
    challenger on some server, else none."""
    if not plans or len({plan.get("candidate") for plan in plans}) < 2:
        return 0
    return trial_share_of(config, count)


def trial_share_of(config: RunConfig, count: int) -> int:
    """``tuning_trial_share`` of ``count`` prompts: at least one, and never all (the rest runs on the winner)."""
    return min(count - 1, max(1, math.ceil(config.tuning.trial_share * count))) if count >= 2 else 0


# --- trial.decide -------------------------------------------------------------------------------------------------

def _rows(paths: list[Path]) -> list[dict]:
    """Every JSON row of ``paths`` that exist (a torn last line of a killed try is skipped)."""
    rows = []
    for path in paths:
        if not path.is_file():
            continue
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if isinstance(row, dict):
                rows.append(row)
    return rows


def _key(trial_plan, layout: RunLayout, shard_ids: list[int]):
    """The history key the trial is recorded under: the one derive_plan read history with, else its parts with the
    workload bucket of the trial's own completions (their prompt and output tokens as the servers counted them);
    None without a model identity or completions."""
    from fleetgen.tuning.trial_history import TrialKey, workload_bucket

    if trial_plan.key is not None or not trial_plan.key_parts:
        return trial_plan.key
    stats = [row for row in _rows([layout.shard_file("stats", shard_id) for shard_id in shard_ids])
             if isinstance(row.get("completion_tokens"), (int, float)) and isinstance(row.get("prompt_tokens"),
                                                                                       (int, float))]
    if not stats:
        return None
    prompt = sum(row["prompt_tokens"] for row in stats) / len(stats)
    completion = sum(row["completion_tokens"] for row in stats) / len(stats)
    return TrialKey(**trial_plan.key_parts, workload=workload_bucket(prompt, completion)) if completion else None


def _final_plan(plan: dict, ready: dict | None, trial_plan, winner: str) -> dict:
    """A server's plan for the rest of the job: the one it runs when it ran the winner (as it runs it: a server
    backed off at start-up keeps the smaller flags wait_ready read back, so the keep-on-plan rule keeps it), else
    the winner's plan for it, which derive_plan made with the rest."""
    if plan.get("candidate") == winner:
        if ready and int(ready.get("relaunches") or 0) > 0:
            return {**plan, "flags": dict(ready["flags"]), "expected": dict(ready["expected"]),
                    "attempt": int(ready["relaunches"])}
        return plan
    return trial_plan.plan_for(winner, f"{plan['host']}:{plan['port']}").to_dict()


def _score_table(decision, servers: dict[str, dict]) -> str:
    lines = [f"  {'candidate':<18} {'servers':>7} {'cap':>5} {'windows':>7} {'median':>10} {'lower..upper':>22}"]
    for name in sorted({entry["candidate"] for entry in servers.values()}, key=lambda n: (n != decision.incumbent, n)):
        on = [entry for entry in servers.values() if entry["candidate"] == name]
        caps = sorted({entry["cap"] for entry in on if entry.get("cap") is not None})
        cap = "/".join(str(c) for c in caps) or "-"
        score = decision.scores.get(name)
        if score is None:
            figures = f"{decision.unscored.get(name, 0):>7} {'-':>10} {'(too few windows)':>22}"
        else:
            figures = (f"{score.windows:>7} {score.median:>10,.0f} "
                       f"{f'{score.lower:,.0f}..{score.upper:,.0f}':>22}")
        mark = " (incumbent)" if name == decision.incumbent else " (winner)" if name == decision.winner else ""
        lines.append(f"  {name + mark:<18} {len(on):>7} {cap:>5} {figures}")
    return "\n".join(lines)


def decide(plans: list[dict], readiness: list[dict], trial_shards: list[dict],
           prompt_scan: dict | None = None) -> list[dict]:
    """**Decides the tuning trial** from the trial shards' `/metrics` samples: each server's output tokens/s per
    GPU in steady-state windows of `tuning_trial_window_s`, pooled per candidate and scored median - 1.4826 x MAD; a
    challenger replaces the incumbent only when its lower bound beats the incumbent's upper bound and its median
    the incumbent's by more than `tuning_trial_min_gain`. Logs the table, writes `trial-decision.json` and the
    record the next night starts from, and returns every server's plan on the winner (without a trial: tonight's).
    With `tuning_trial_relaunch` at `when_it_pays`, servers on a losing configuration keep it when the measurement
    says their relaunch round (the first round's launch-to-ready, every server waiting) costs more than it gains
    over the rest of the job (`prompt_scan`'s prompts at the trial's pace).

    *When it fails*: the run's candidate plans or metrics cannot be read; clear `tune.derive_plan` to plan again.
    """
    import time

    from fleetgen.outputs import trial_history_file
    from fleetgen.tuning import ServerPlan, relaunch_payoff, trial, workload_history
    from fleetgen.tuning.trial_history import TrialHistory
    from fleetgen.tuning.trial_plan import read_trial_plan

    context, config, layout = run_context()
    plans, shards = list(plans), mapped_values(trial_shards or [])
    trial_plan = read_trial_plan(layout)
    if trial_plan is None or not trial_plan.split.trial or not shards:
        why = (trial_plan.split.notes[-1] if trial_plan is not None and trial_plan.split.notes else
               "no tuning trial: " + ("no trial shards were planned" if trial_plan is not None else
                                      "derive_plan planned none (see its log for why)"))
        _write_json(layout.trial_decision, trial.skipped_record(why))
        log.info("%s; every server keeps tonight's plan", why)
        return plans
    shard_ids = [int(shard["shard_id"]) for shard in shards]
    samples = _rows([layout.shard_file("metrics", shard_id) for shard_id in shard_ids])
    by_server = {f"{plan['host']}:{plan['port']}": plan for plan in plans}
    ready = {entry["server"]: entry for entry in mapped_values(readiness or [])}
    servers = {server: {"candidate": plan.get("candidate"), "gpus": len(plan["gpu_ids"]),
                        "cap": (ready.get(server) or {}).get("effective_max_running_requests",
                                                             plan["expected"]["max_running_requests"])}
               for server, plan in by_server.items()}
    rates = trial.steady_window_rates(samples, window_s=config.tuning.trial_window_s,
                                      gpus_per_server={server: entry["gpus"] for server, entry in servers.items()})
    pooled = trial.pooled_rates(rates, {server: entry["candidate"] for server, entry in servers.items()})
    decision = trial.decide(pooled, incumbent=trial_plan.split.incumbent, min_gain=config.tuning.trial_min_gain)
    log.info("Tuning trial over shard(s) %s, %d metrics row(s), windows of %g s; output tokens/s per GPU:\n%s\n%s",
             shard_ids, len(samples), config.tuning.trial_window_s, _score_table(decision, servers), decision.reason)
    # the servers the decision moves to the winner (server -> the candidate each ran), unless their round would not pay
    moved = {server: plan.get("candidate") for server, plan in by_server.items()
             if plan.get("candidate") != decision.winner}
    relaunch = _relaunch_estimate(layout, decision.winner, moved, pooled, samples, len(by_server), prompt_scan)
    log.info("The relaunch round: %s", relaunch.reason())
    kept = moved if config.tuning.trial_relaunch == relaunch_payoff.WHEN_IT_PAYS and not relaunch.pays else {}
    final = [_final_plan(plan, ready.get(server), trial_plan, kept.get(server, decision.winner))
             for server, plan in by_server.items()]
    auto = SGLANG_AUTO if SGLANG_AUTO in decision.candidates else None  # SGLang's own sizing, measured beside
    _write_json(layout.trial_decision, {
        **trial.decision_record(decision, servers=servers, samples=samples, decided_at=time.time(),
                                auto_sizing=auto, window_s=config.tuning.trial_window_s),
        "relaunch": {**relaunch.to_dict(), "policy": config.tuning.trial_relaunch}})
    key = _key(trial_plan, layout, shard_ids)
    if not decision.scores:  # nothing measured (reused prompts, a trial too short): the next night tries again
        log.warning("The trial's decision is not recorded for later nights: it scored no candidate; raise "
                    "tuning_trial_share or lower tuning_trial_window_s for more windows")
    elif key is None:
        log.warning("The trial's decision is not recorded for later nights: no model identity or no completion "
                    "gave its history key")
    else:
        TrialHistory(trial_history_file(config.inputs.output_root)).record(key, decision, run_id=context["run_id"])
        log.info("Recorded for %s: the next night starts from %s", key.text, decision.winner)
    workload_history.write_plan_record(layout, [ServerPlan.from_dict(plan) for plan in final])
    log.info("The rest of the job runs on %s%s; relaunched: %s", decision.winner,
             "".join(f", {server} stays on {ran}" for server, ran in kept.items()),
             ", ".join(server for server in moved if server not in kept) or "none")
    return final


def _relaunch_estimate(layout, winner: str, moved: dict[str, str], pooled: dict[str, list[float]],
                       samples: list[dict], servers: int, prompt_scan: dict | None):
    """What relaunching ``moved`` would cost and gain, from the run's measurements (tuning/relaunch_payoff.py)."""
    from fleetgen.outputs import read_server_times
    from fleetgen.tuning import relaunch_payoff

    finished, seconds = relaunch_payoff.trial_completions(samples)
    total = int(prompt_scan["count"]) if prompt_scan and "count" in prompt_scan else None
    return relaunch_payoff.estimate(winner=winner, moved=moved, pooled=pooled, servers=servers,
                                    round_s=relaunch_payoff.first_round_s(read_server_times(layout)),
                                    rest_s=relaunch_payoff.rest_seconds(total, finished, seconds))


def _write_json(path: Path, document: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(document, indent=1, sort_keys=True))
    partial.replace(path)


# --- the relaunch round -------------------------------------------------------------------------------------------

def relaunch_needed(plans: list[dict], decided: list[dict]) -> bool:
    """Lets the `relaunch` group run only when the trial's decision moves some server to another candidate; the
    rest of the job then runs on the servers of the first round.
    """
    ran = {(plan["host"], plan["port"]): plan.get("candidate") for plan in plans or []}
    moved = [f"{plan['host']}:{plan['port']}" for plan in decided or []
             if ran.get((plan["host"], plan["port"])) != plan.get("candidate")]
    if moved:
        log.info("Relaunching %d server(s) on the trial's winner: %s", len(moved), ", ".join(moved))
    else:
        log.info("Every server already runs the plan for the rest of the job: no relaunch")
    return bool(moved)


def servers_in_use(first_round: list[dict], relaunched: list[dict]) -> list[dict]:
    """The ready servers the rest of the job runs on: those of the `relaunch` round when it ran (the trial's
    winner everywhere), else those of the first round.
    """
    again = mapped_values(relaunched or [])
    servers = again or mapped_values(first_round or [])
    log.info("The rest of the job runs on %d server(s) (%s round): %s", len(servers),
             "relaunch" if again else "first", ", ".join(entry["server"] for entry in servers))
    return servers
