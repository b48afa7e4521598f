"""Task callables of the ``sglang_generation`` DAG: each reads the run configuration, calls the core, logs
one line before and one after, and returns small JSON for XCom (data goes to files)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging

from fleetgen.airflow import failures, lifecycle
from fleetgen.airflow.context import fail_fast, mapped_values, run_context
from fleetgen.airflow.hooks import NodeShell
from fleetgen.airflow.run_config import RunConfig
from fleetgen.errors import ConfigError, ValidationFailed
from fleetgen.nodes import probe
from fleetgen.nodes.fleet import FleetSpec, fleet_from_json, load_fleet_file, load_fleet_text

log = logging.getLogger("fleetgen")
FLEET_VARIABLE = "fleetgen_fleet"

def _read_fleet(config: RunConfig) -> FleetSpec:
    if config.inputs.fleet_file:
        return load_fleet_file(config.inputs.fleet_file)
    from airflow.sdk import Variable

    text = Variable.get(FLEET_VARIABLE, default=None)
    if not text:
        raise ConfigError(f"no fleet description: set the 'fleet_file' param or the Airflow Variable "
                          f"'{FLEET_VARIABLE}'", hint="see airflow_settings.yaml for an example")
    return load_fleet_text(text, source=f"Variable {FLEET_VARIABLE}")


@fail_fast
def load_fleet() -> dict:
    _, config, _ = run_context()  # the whole run configuration, checked once: unknown conf keys stop here
    config.inputs.require_prompts_file()
    log.info("Reading the fleet description (%s)", config.inputs.fleet_file or f"Variable {FLEET_VARIABLE}")
    fleet = _read_fleet(config)
    servers = fleet.servers()
    log.info("Fleet: %d node(s), %d server(s): %s", len(fleet.nodes), len(servers),
             ", ".join(f"{s.name} GPU{list(s.gpu_ids)}" for s in servers))
    return fleet.to_dict()


def node_names(fleet: dict) -> list[str]:
    return [node["name"] for node in fleet["nodes"]]


@fail_fast
def probe_gpus(node: str, fleet: dict) -> dict:
    spec = fleet_from_json(fleet)
    log.info("Probing the GPUs of %s over SSH (%s)", node, spec.node(node).ssh_conn_id)
    with NodeShell(node, spec.node(node).ssh_conn_id) as shell:
        inventory = lifecycle.probe_node(shell, spec, node)
    for gpu_ids in spec.node(node).gpu_groups:
        probe.select_gpus(inventory, gpu_ids)  # every GPU the fleet names must exist
    log.info("%s", probe.format_inventory(inventory))
    return inventory


def _prompt_length_limit(spec: FleetSpec, config: RunConfig):
    """The context prompts must fit: the servers' --context-length, the param, or the model's own."""
    from fleetgen.nodes import remote
    from fleetgen.prompts.length import length_limit
    from fleetgen.tuning import LaunchOptions
    from fleetgen.tuning.geometry import context_length_of
    from fleetgen.tuning.model_files import read_model_config

    node = spec.nodes[0]
    with NodeShell(node.name, node.ssh_conn_id) as shell:
        model_config = read_model_config(
            lambda path: shell.run(remote.read_file_command(path), describe=f"read {path}")[1], spec.model.path,
            host=node.name)
    return length_limit(model_context=context_length_of(model_config), max_tokens=config.generation.max_tokens,
                        launch_context=LaunchOptions.from_args(list(spec.server.extra_args)).context_length,
                        param_context=config.tuning.context_length or None)


@fail_fast
def scan_prompts(fleet: dict) -> dict:
    from fleetgen.prompts.scan import scan_prompts as scan_file
    from fleetgen.report.previous import prompts_identity

    _, config, layout = run_context()
    layout.root.mkdir(parents=True, exist_ok=True)
    limit = _prompt_length_limit(fleet_from_json(fleet), config)
    log.info("Validating prompts %s (rejects go to %s); prompts must fit a context of %d tokens with max_tokens "
             "%d (%s)", config.inputs.prompts_path, layout.rejects, limit.context_tokens, limit.max_tokens,
             limit.source)
    scan = scan_file(config.inputs.prompts_path, rejects_path=layout.rejects, length_limit=limit)
    # The scan (with its sparse byte index, ~1,000 pairs per million prompts) travels on so that
    # plan_shards does not read the file a second time.
    summary = {**scan.to_dict(), "out_dir": str(layout.root),
               "prompt_tokens_mean": round(scan.est_prompt_tokens_mean, 1),
               "prompt_tokens_max": scan.est_prompt_tokens_max}
    layout.prompts_identity.write_text(json.dumps(prompts_identity(summary)))
    log.info("Prompts: %d valid, %d rejected; prompt tokens mean %.0f, max %d (estimated from characters)",
             scan.count, scan.rejected, scan.est_prompt_tokens_mean, scan.est_prompt_tokens_max)
    if scan.too_long:
        log.warning("%d prompt(s) set aside as too long for the context of %d tokens (%s): estimated prompt tokens "
                    "+ max_tokens %d exceed it; the plan sizes the servers for the other prompts; each is in %s "
                    "with its estimate", scan.too_long, limit.context_tokens, limit.source, limit.max_tokens,
                    layout.rejects)
    return summary


@fail_fast
def derive_plan(fleet: dict, inventories: list[dict], prompt_scan: dict) -> list[dict]:
    from fleetgen.nodes import remote
    from fleetgen.report.previous import prompt_token_statistics
    from fleetgen.tuning import LaunchOptions, Workload, plan_server, profile_model, render_budget_table
    from fleetgen.outputs import calibration_file
    from fleetgen.tuning.calibration import CalibrationStore, model_key
    from fleetgen.tuning.model_files import read_model
    from fleetgen.tuning.planner import resolved_page_size

    _, config, layout = run_context()
    spec = fleet_from_json(fleet)
    log.info("Deriving launch flags for %d server(s) (mode %s)", len(spec.servers()), config.tuning.mode)
    node = spec.nodes[0]
    with NodeShell(node.name, node.ssh_conn_id) as shell:
        model_config, weights_bytes = read_model(
            lambda path: shell.run(remote.read_file_command(path), describe=f"read {path}")[1], spec.model.path,
            host=node.name)
    options = dataclasses.replace(LaunchOptions.from_args(list(spec.server.extra_args)), tp_size=spec.server.tp_size)
    profile = profile_model(model_config, weights_bytes, options, config_path=f"{spec.model.path}/config.json")
    tokens = prompt_token_statistics(config.inputs.output_root, layout, prompt_scan)
    log.info("Prompt tokens for the plan: mean %.0f, max %d (%s); %d prompt(s) too long for the context were set "
             "aside at scan time", tokens.mean, tokens.max, tokens.source, prompt_scan.get("too_long", 0))
    workload = Workload(max_output_tokens=config.generation.max_tokens, prompt_tokens_mean=tokens.mean,
                        prompt_tokens_max=tokens.max, prompt_count=int(prompt_scan["count"]))
    by_host = {inventory["host"]: inventory for inventory in mapped_values(inventories)}
    store = CalibrationStore(calibration_file(config.inputs.output_root))

    def planner(slot):
        gpus = probe.select_gpus(by_host[slot.node], slot.gpu_ids)
        measured = store.latest(str(gpus[0]["name"]), model_key(spec.model.path), spec.server.tp_size)
        if measured:
            log.info("Calibration for %s from an earlier readback: %d bytes less pre-load memory", slot.name,
                     measured["correction_bytes"])
        correction = int(measured["correction_bytes"]) if measured else 0
        return lambda bounds: plan_server(host=slot.node, gpu_ids=list(slot.gpu_ids), port=slot.port, gpus=gpus,
                                          profile=profile, options=options, workload=workload, bounds=bounds,
                                          calibration_bytes=correction)

    plan_for = {slot.name: planner(slot) for slot in spec.servers()}
    if config.tuning.mode == "tuned":
        first = spec.servers()[0]
        page_size = resolved_page_size(profile, options, probe.select_gpus(by_host[first.node], first.gpu_ids),
                                       config.tuning.bounds())
        server_plans = _workload_plans(config, layout, spec, plan_for, profile, options, page_size)
    else:
        server_plans = [plan_with(config.tuning.bounds()) for plan_with in plan_for.values()]
    plans = []
    for name, plan in zip(plan_for, server_plans):
        log.info("Plan for %s:\n%s", name, render_budget_table(plan))
        plans.append(plan.to_dict())
    caps = sorted({p["expected"]["max_running_requests"] for p in plans})
    log.info("Planned %d server(s); expected effective max_running_requests %s", len(plans), caps)
    return plans


def _workload_plans(config: RunConfig, layout, spec: FleetSpec, plan_for: dict, profile, options,
                    page_size: int) -> list:
    """The workload mode (docs/sglang-scheduler.md §7): learn from the previous run, record tonight's plan."""
    from fleetgen.tuning import workload_history
    from fleetgen.tuning.workload import decode_reserve_tokens

    def run_on_node(node: str, command: str) -> str:
        with NodeShell(node, spec.node(node).ssh_conn_id) as shell:
            return shell.run(command, describe="read the previous run's scheduler lines")[1]

    learned = workload_history.learn_from_previous_run(
        config.inputs.output_root, layout, page_size=page_size,
        reserve_tokens=decode_reserve_tokens(profile.spec_steps, profile.spec_topk, profile.draft_tokens, page_size),
        log_dir=spec.server.log_dir, ports_by_node={node.name: list(node.ports) for node in spec.nodes},
        run_on_node=run_on_node)
    log.info("Workload mode: %s, %d server(s) observed", learned.source, len(learned.seen))
    plans = workload_history.plan_fleet(plan_for, config.tuning.bounds(), demand=learned.demand, seen=learned.seen,
                                        record=learned.record, pin_full_context=config.tuning.pin_full_context_plan)
    workload_history.write_plan_record(layout, plans)
    return plans


@fail_fast
def model_identity(fleet: dict) -> dict:
    from fleetgen.tuning.model_files import model_identity as read_identity

    spec = fleet_from_json(fleet)
    node = spec.nodes[0]
    with NodeShell(node.name, node.ssh_conn_id) as shell:
        identity = read_identity(lambda command: shell.run(command, describe="model file hashes")[1], spec.model.path)
    log.info("Model %s: config.json sha256 %s, index sha256 %s (completions of runs with the same identity and "
             "sampling can be reused)", identity["path"], identity["config_sha256"][:12], identity["index_sha256"][:12])
    return identity


def _generation_settings(config: RunConfig, spec: FleetSpec):
    from fleetgen.generate import GenerationSettings

    generation = config.generation
    return GenerationSettings(model=spec.model.served_name, max_tokens=generation.max_tokens,
                              temperature=generation.temperature, top_p=generation.top_p,
                              sample_interval_s=generation.sample_interval_s)


def _generation_key(identity: dict, settings) -> str:
    from fleetgen.generate.reuse import generation_key

    return generation_key(identity, max_tokens=settings.max_tokens, temperature=settings.temperature,
                          top_p=settings.top_p, extra_body=settings.extra_body)


def go_live() -> bool:
    _, config, _ = run_context()
    if config.inputs.dry_run:
        log.info("dry_run is set: the plan above was printed; no server is touched")
        return False
    return True


@fail_fast
def plan_shards(prompt_scan: dict) -> list[dict]:
    from airflow.sdk import conf

    from fleetgen.prompts import scan as prompts

    _, config, _ = run_context()
    scan = prompts.PromptScan.from_dict(prompt_scan)
    requested = config.generation.shard_size
    max_shards = conf.getint("core", "max_map_length")
    shard_size = prompts.shard_size_within(scan.count, requested, max_shards)
    if shard_size != requested:
        log.warning("%d prompts in shards of %d would map more than [core] max_map_length=%d tasks; using shards "
                    "of %d instead (raise max_map_length to keep smaller shards)", scan.count, requested,
                    max_shards, shard_size)
    shards = prompts.plan_shards(config.inputs.prompts_path, shard_size=shard_size, scan=scan)
    log.info("Planned %d shard(s) of up to %d prompts over %s", len(shards), shard_size, config.inputs.prompts_path)
    return shards


@fail_fast
def generate_shard(shard: dict, readiness: list[dict], fleet: dict, model_identity: dict) -> dict:
    from fleetgen.airflow.sharing import running_shards_counter
    from fleetgen.generate import run_shard, shard_endpoints
    from fleetgen.generate.reuse import find_reuse_source, reuse_enabled
    from fleetgen.nodes.gpu_sampling import GpuSampling

    context, config, layout = run_context()
    spec = fleet_from_json(fleet)
    parallel = config.generation.parallel_shards
    endpoints = shard_endpoints(mapped_values(readiness), headroom=config.generation.headroom, parallel_shards=parallel)
    # 0 (auto): start with the whole limit and follow how many shards of this run are generating.
    sharing = running_shards_counter(context["ti"]) if parallel == 0 else None
    log.info("Generating shard %d (%d prompts from byte %d) on %d server(s), in-flight limits %s%s",
             shard["shard_id"], shard["count"], shard["start"], len(endpoints),
             {e.name: e.max_in_flight for e in endpoints},
             ", shared with the other running shards" if sharing else f" (1/{parallel} of each server's)")
    settings = _generation_settings(config, spec)
    source = None
    run_type = getattr(context.get("dag_run"), "run_type", None)
    if reuse_enabled(config.generation.reuse_completions, getattr(run_type, "value", run_type)):
        source = find_reuse_source(config.inputs.output_root, layout.root.name,
                                   _generation_key(model_identity, settings), log=log)
        log.info("Reusing unchanged completions from %s", source.run_folder if source else
                 "no earlier run (none with the same model and sampling has an index)")

    def open_stream(node: str, command: str):  # one SSH session per node for the whole shard
        return NodeShell(node, spec.node(node).ssh_conn_id).stream(command, describe=f"GPU sampling on {node}")

    sampling = GpuSampling(nodes=[node.name for node in spec.nodes], open_stream=open_stream, layout=layout,
                           shard_id=int(shard["shard_id"]), interval_s=settings.sample_interval_s, log=log) \
        if settings.sample_interval_s > 0 else contextlib.nullcontext()
    with sampling:
        result = run_shard(shard, endpoints, layout.root, settings, api_key=lifecycle.api_key(spec), log=log,
                           sharing=sharing, try_number=context["ti"].try_number, reuse=source)
    if result["lost_try"]:
        failures.record_lost_try(layout, context["ti"].task_id, result["lost_try"])
    log.info("Shard %d done: %d completed, %d failed, %d already done before; %d output tokens in %.1f s",
             shard["shard_id"], result["done"], result["failed"], result.get("skipped_already_done", 0),
             result["completion_tokens"], result["seconds"])
    return result


@fail_fast
def validate(prompt_scan: dict, shard_results: list[dict]) -> dict:
    from fleetgen.prompts.scan import iter_prompt_ids
    from fleetgen.validation.suite import validate_run

    context, config, layout = run_context()
    log.info("Validating %d expected completions in %s with Great Expectations", prompt_scan["count"], layout.root)
    try:
        expected = iter_prompt_ids(config.inputs.prompts_path, length_limit=prompt_scan.get("length_limit"))
        summary = validate_run(layout.root, expected, config.validation,
                               run_name=context["run_id"])  # the Data Docs name the Airflow run
    except ValidationFailed as failure:
        # The small JSON summary goes to XCom first, so the report and on-call can read it; then fail.
        context["ti"].xcom_push(key="validation_summary", value=failure.summary)
        raise
    log.info("Validation passed: %d rows, every prompt exactly once; Data Docs at %s", summary["rows"],
             summary.get("data_docs"))
    return summary


@fail_fast
def report(plans: list[dict], readiness: list[dict], shard_results: list[dict], validation: dict,
           model_identity: dict, fleet: dict) -> dict:
    from fleetgen.generate.reuse import write_reuse_index
    from fleetgen.report.build import build_report
    from fleetgen.report.previous import find_previous_report

    context, config, layout = run_context()
    # Validation passed (this task runs only then): the run's completions may be reused from now on.
    settings = _generation_settings(config, fleet_from_json(fleet))
    indexed = write_reuse_index(layout, key=_generation_key(model_identity, settings), run_id=context["run_id"])
    log.info("Indexed %d completion(s) for later runs to reuse (%s)", indexed, layout.reuse_index)
    previous = find_previous_report(config.inputs.output_root, layout.root.name)
    log.info("Writing the run report to %s (previous run: %s)", layout.report_dir, previous or "none")
    # Throughput is measured over the generation itself (first request sent to last completion), not
    # the run's wall time, which also holds server start-up and validation.
    summary = build_report(layout.root, run_id=context["run_id"], plan=list(plans), readiness=mapped_values(readiness),
                           shard_results=mapped_values(shard_results), validation=validation, previous_report=previous)
    for asset in context["task"].outlets:  # the finished dataset, for downstream training DAGs
        context["outlet_events"][asset].extra = {"run_id": context["run_id"], "out_dir": str(layout.root),
                                                 "completions": str(layout.kind_dir("completions")),
                                                 "rows": validation.get("rows"), "report": summary["report_json"]}
    log.info("Report: %s; %.1f output tokens/s overall", summary["report_md"], summary["tokens_per_s"])
    return summary
