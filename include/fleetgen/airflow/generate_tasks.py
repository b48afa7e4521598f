"""Task callables of the ``generate`` group: plan the shards, then generate each one."""

from __future__ import annotations

import contextlib
import logging

from fleetgen.airflow import failures, lifecycle
from fleetgen.airflow.context import mapped_values, run_context, run_type
from fleetgen.airflow.node_shell import NodeShell
from fleetgen.airflow.run_config import RunConfig
from fleetgen.airflow.run_storage import (current_store_run, look_up_reuse_here, planned_on_store, shard_prompts,
                                          shared_run_files)
from fleetgen.nodes.fleet import FleetSpec, fleet_from_json

log = logging.getLogger("fleetgen")


def generation_settings(config: RunConfig, spec: FleetSpec):
    from fleetgen.generate import GenerationSettings

    generation = config.generation
    return GenerationSettings(model=spec.model.served_name, max_tokens=generation.max_tokens,
                              temperature=generation.temperature, top_p=generation.top_p,
                              sample_interval_s=generation.sample_interval_s)


def generation_material(identity: dict, settings) -> dict:
    from fleetgen.generate.reuse import generation_material

    return generation_material(identity, max_tokens=settings.max_tokens, temperature=settings.temperature,
                               top_p=settings.top_p, extra_body=settings.extra_body)


def plan_shards(prompt_scan: dict, plans: list[dict] | None = None) -> list[dict]:
    """Cuts the valid prompts into byte-range shards of `shard_size` prompts. With a tuning trial tonight (`plans`
    put a challenger on some server), the first `tuning_trial_share` of the prompts are the trial's shards
    (`plan_trial_shards`) and these are the rest, generated once every server runs the winner; with a time cap
    (`tuning_trial_max_s`) the trial's shards come first again, so that what the cap left of them is generated too
    (a trial shard it did not cut is already done: its task only checks that).
    """
    trial, rest = _cut(prompt_scan, plans)
    _, config, _ = run_context()
    return trial + rest if config.tuning.trial_max_s > 0 else rest


def plan_trial_shards(prompt_scan: dict, plans: list[dict] | None = None) -> list[dict]:
    """The tuning trial's shards: the first `tuning_trial_share` of the prompts, cut like every shard, when tonight's
    plans put a challenger on some server; none otherwise (the trial's shard task is then skipped).
    """
    return _cut(prompt_scan, plans, log_it=False)[0]


def _cut(prompt_scan: dict, plans: list[dict] | None, *, log_it: bool = True) -> tuple[list[dict], list[dict]]:
    """(the trial's shards, the others): one cut for both tasks, so that their shard ids never overlap."""
    from airflow.sdk import conf

    from fleetgen.airflow.trial_tasks import trial_prompt_count
    from fleetgen.prompts import scan as prompts

    _, config, _ = run_context()
    scan = prompts.PromptScan.from_dict(prompt_scan)
    requested = config.generation.shard_size
    max_shards = conf.getint("core", "max_map_length")
    shard_size = prompts.shard_size_within(scan.count, requested, max_shards)
    if shard_size != requested and log_it:
        log.warning("%d prompts in shards of %d would map more than [core] max_map_length=%d tasks; using shards "
                    "of %d instead (raise max_map_length to keep smaller shards)", scan.count, requested,
                    max_shards, shard_size)
    head = trial_prompt_count(config, plans, scan.count)
    shards = [planned_on_store(shard) for shard in
              prompts.plan_shards(config.inputs.prompts_path, shard_size=shard_size, scan=scan, head=head)]
    trial = [shard for shard in shards if shard["first"] < head]
    rest = shards[len(trial):]
    if log_it:
        log.info("Planned %d shard(s) of up to %d prompts over %s", len(rest), shard_size, config.inputs.prompts_path)
        if trial:
            log.info("The tuning trial generates the first %d prompt(s) (tuning_trial_share %g) in shard(s) %s; the "
                     "other shards run once every server runs the trial's winner", head, config.tuning.trial_share,
                     [shard["shard_id"] for shard in trial])
    return trial, rest


def generate_shard(shard: dict, readiness: list[dict], fleet: dict, model_identity: dict) -> dict:
    """**Generates one shard** (labelled with its prompt range) through every ready server, keeping each at its
    effective limit × `headroom`; resumes from its checkpoint when retried, and finishes a trial shard that the
    trial's time cap (`tuning_trial_max_s`) cut short.

    *When it fails*: every server went down (the progress is saved; a retry resumes), or the servers refuse requests
    (the log shows SGLang's answer).
    """
    return _generate(shard, readiness, fleet, model_identity, stop_taking_at=None)


def trial_shard(shard: dict, readiness: list[dict], fleet: dict, model_identity: dict) -> dict:
    """**Generates one shard of the tuning trial** on tonight's split fleet (the incumbent on most servers, a
    challenger on each of the others) while `trial.decide` measures them; starts no prompt once
    `tuning_trial_max_s` has passed since the trial's first shard started, and leaves the rest of the shard to
    `generate_shard`, on the winner.

    *When it fails*: as `generate_shard`: every server went down (a retry resumes), or the servers refuse requests.
    """
    import time

    from fleetgen.tuning.trial_clock import stop_taking_at

    _, config, layout = run_context()
    return _generate(shard, readiness, fleet, model_identity,
                     stop_taking_at=stop_taking_at(shared_run_files(layout), config.tuning.trial_max_s, time.time()))


def _generate(shard: dict, readiness: list[dict], fleet: dict, model_identity: dict, *,
              stop_taking_at: float | None) -> dict:
    from fleetgen.airflow.sharing import running_shards_counter
    from fleetgen.generate import ShardRunOptions, run_shard, shard_endpoints
    from fleetgen.nodes.gpu_sampling import GpuSampling

    context, config, layout = run_context()
    spec = fleet_from_json(fleet)
    parallel = config.generation.parallel_shards
    ready = mapped_values(readiness)
    endpoints = shard_endpoints(ready, headroom=config.generation.headroom, parallel_shards=parallel)
    # 0 (auto): start with the whole limit and follow how many shards of this run are generating.
    sharing = running_shards_counter(context["ti"]) if parallel == 0 else None
    log.info("Generating shard %d (%d prompts from byte %d) on %d server(s), in-flight limits %s%s",
             shard["shard_id"], shard["count"], shard["start"], len(endpoints),
             {e.name: e.max_in_flight for e in endpoints},
             ", shared with the other running shards" if sharing else f" (1/{parallel} of each server's)")
    settings = generation_settings(config, spec)
    lookup = None
    if config.generation.reuses(run_type(context)):
        lookup = look_up_reuse_here(config.inputs.output_root, layout, generation_material(model_identity, settings),
                                    log)
        log.info("Reusing unchanged completions from %s", lookup.source.run_folder if lookup.source else
                 "no earlier run (none with the same model and sampling has a readable index)")
    source = lookup.source if lookup else None

    def open_stream(node: str, command: str):  # one SSH session per node for the whole shard
        return NodeShell(node, spec.node(node).ssh_conn_id).stream(command, describe=f"GPU sampling on {node}")

    # the nodes of tonight's servers: not one the plan left out (skip_unreachable_nodes)
    serving = {server["host"] for server in ready}
    sampling = GpuSampling(nodes=[node.name for node in spec.nodes if node.name in serving], open_stream=open_stream,
                           layout=layout, shard_id=int(shard["shard_id"]), interval_s=settings.sample_interval_s,
                           log=log, claims=shared_run_files(layout)) \
        if settings.sample_interval_s > 0 else contextlib.nullcontext()
    store_run = current_store_run()
    with sampling:
        result = run_shard(shard_prompts(shard), endpoints, layout.root, settings, options=ShardRunOptions(
            api_key=lifecycle.api_key(spec), try_number=context["ti"].try_number, reuse=source, sharing=sharing,
            log=log, stop_taking_at=stop_taking_at, output=store_run.output if store_run is not None else None))
    if lookup is not None:  # the report's reuse section: where from, what was passed over, what changed
        result["reuse"] = lookup.summary()
    if result["lost_try"]:
        failures.record_lost_try(layout, context["ti"].task_id, result["lost_try"])
    log.info("Shard %d done: %d completed, %d failed, %d already done before; %d output tokens in %.1f s",
             shard["shard_id"], result["done"], result["failed"], result.get("skipped_already_done", 0),
             result["completion_tokens"], result["seconds"])
    if result.get("left"):
        log.info("The trial's time cap (tuning_trial_max_s %g s) left %d prompt(s) of shard %d: generate_shard "
                 "generates them on the trial's winner", config.tuning.trial_max_s, result["left"], shard["shard_id"])
    return result
