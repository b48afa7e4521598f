"""Task callables of the ``sglang_generation`` DAG, the fleet and ``tune`` group: each reads the run configuration,
calls the core, logs one line before and one after, and returns small JSON for XCom (data goes to files).
The other groups: ``server_tasks``, ``generate_tasks``, ``validate_tasks``."""

from __future__ import annotations

import dataclasses
import json
import logging

from fleetgen.airflow import lifecycle
from fleetgen.airflow.context import fail_fast, mapped_values, run_context
from fleetgen.airflow.hooks import NodeShell
from fleetgen.airflow.run_config import RunConfig
from fleetgen.errors import ConfigError
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


def go_live() -> bool:
    _, config, _ = run_context()
    if config.inputs.dry_run:
        log.info("dry_run is set: the plan above was printed; no server is touched")
        return False
    return True
