"""Task callables of the ``sglang_generation`` DAG, the fleet and ``tune`` group: each reads the run configuration,
calls the core, logs one line before and one after, and returns small JSON for XCom (data goes to files).
The other groups: ``server_tasks``, ``generate_tasks``, ``validate_tasks``. Each callable raises fleetgen's own
errors; the DAG wraps every one with ``fail_fast`` (fleetgen.airflow.context), which fails the deterministic ones
at once."""

from __future__ import annotations

import dataclasses
import json
import logging
import math

from fleetgen.airflow import lifecycle, trial_tasks
from fleetgen.airflow.context import mapped_values, run_context, run_type
from fleetgen.airflow.node_shell import NodeShell
from fleetgen.airflow.run_config import RunConfig
from fleetgen.airflow.run_storage import run_url, scan_as_stored
from fleetgen.errors import AuthenticationRefused, ConfigError, HostKeyMismatch, HostUnreachable
from fleetgen.nodes import probe
from fleetgen.nodes.fleet import FleetSpec, fleet_from_json, load_fleet_file, load_fleet_text

log = logging.getLogger("fleetgen")
FLEET_VARIABLE = "fleetgen_fleet"
# What probe_gpus returns for a node it left out (skip_unreachable_nodes): why, instead of its GPUs.
UNREACHABLE = "unreachable"

def _read_fleet(config: RunConfig) -> FleetSpec:
    if config.inputs.fleet_file:
        return load_fleet_file(config.inputs.fleet_file)
    from airflow.sdk import Variable

    text = Variable.get(FLEET_VARIABLE, default=None)
    if not text:
        raise ConfigError(f"no fleet description: set the 'fleet_file' param or the Airflow Variable "
                          f"'{FLEET_VARIABLE}'", hint="see airflow_settings.yaml for an example")
    return load_fleet_text(text, source=f"Variable {FLEET_VARIABLE}")


def load_fleet() -> dict:
    """**Reads the fleet description** (the `fleet_file` parameter, else the Airflow Variable `fleetgen_fleet`) and
    checks the run's parameters: an unknown key in the run's conf, an `output_root` outside the deployment's
    `FLEETGEN_OUTPUT_ROOT` (and the roots `FLEETGEN_ALLOW_OUTPUT_ROOTS` lists) or a prompts file that does not exist
    stops the run here, before any node is touched or any file written.

    *When it fails*: the message names the parameter or the line of the fleet YAML to fix.
    """
    _, config, _ = run_context()  # the whole configuration, checked once: unknown keys, an output_root not allowed
    config.inputs.require_prompts_file()
    log.info("Reading the fleet description (%s)", config.inputs.fleet_file or f"Variable {FLEET_VARIABLE}")
    fleet = _read_fleet(config)
    servers = fleet.servers()
    log.info("Fleet: %d node(s), %d server(s): %s", len(fleet.nodes), len(servers),
             ", ".join(f"{s.name} GPU{list(s.gpu_ids)}" for s in servers))
    return fleet.to_dict()


def node_names(fleet: dict) -> list[str]:
    """The node names of the fleet: what the per-node tasks are mapped over.
    """
    return [node["name"] for node in fleet["nodes"]]


def probe_gpus(node: str, fleet: dict) -> dict:
    """**Runs `nvidia-smi` on one node over SSH** (one task per node, labelled with the node's name): total, used and
    free memory per GPU, and which processes hold memory (ours or foreign).

    *When it fails*: the SSH connection (`ssh_conn_id` of the node, host key in its `host_key` extra) or a GPU the
    fleet names that the node does not have. With `skip_unreachable_nodes`, a node that cannot be reached on the
    probe's last try is left out of tonight's plan instead (the task succeeds and says so).
    """
    context, config, _ = run_context()
    spec = fleet_from_json(fleet)
    log.info("Probing the GPUs of %s over SSH (%s)", node, spec.node(node).ssh_conn_id)
    try:
        with NodeShell(node, spec.node(node).ssh_conn_id) as shell:
            inventory = lifecycle.probe_node(shell, spec, node)
    except HostUnreachable as error:
        if not (config.inputs.skip_unreachable_nodes and _unreachable(error) and _last_try(context)):
            raise
        log.warning("%s cannot be reached and skip_unreachable_nodes is set: left out of tonight's plan, the run "
                    "goes on with the other nodes (%s)", node, error.message)
        return {"host": node, "gpus": [], UNREACHABLE: error.message}
    for gpu_ids in spec.node(node).gpu_groups:
        probe.select_gpus(inventory, gpu_ids)  # every GPU the fleet names must exist
    log.info("%s", probe.format_inventory(inventory))
    return inventory


def _unreachable(error: HostUnreachable) -> bool:
    """The node could not be reached, as opposed to refusing who we are (which a person must fix)."""
    return not isinstance(error, (HostKeyMismatch, AuthenticationRefused))


def _last_try(context: dict) -> bool:
    """This is the task's last try (a node down for a moment is tried again before it is left out)."""
    ti = context.get("ti")
    return ti is None or ti.try_number > ti.max_tries


def _on_a_reachable_node(spec: FleetSpec, config: RunConfig, read):
    """``read(node name)`` on the first node, or with ``skip_unreachable_nodes`` on the first that can be reached
    (what is read, the model's files, is the same on every node)."""
    for position, node in enumerate(spec.nodes):
        try:
            return read(node.name)
        except HostUnreachable as error:
            if not (config.inputs.skip_unreachable_nodes and _unreachable(error)) or position == len(spec.nodes) - 1:
                raise
            log.warning("%s cannot be reached (%s): reading the model on the next node", node.name, error.message)
    raise ConfigError("the fleet has no nodes")


def _prompt_length_limit(spec: FleetSpec, config: RunConfig):
    """The context prompts must fit: the servers' --context-length, the param, or the model's own."""
    from fleetgen.nodes import remote
    from fleetgen.prompts.length import length_limit
    from fleetgen.tuning import LaunchOptions
    from fleetgen.tuning.geometry import context_length_of
    from fleetgen.tuning.model_files import read_model_config

    run_on_node = _node_runner(spec)
    model_config = _on_a_reachable_node(spec, config, lambda node: read_model_config(
        lambda path: run_on_node(node, remote.read_file_command(path), f"read {path}"), spec.model.path, host=node))
    return length_limit(model_context=context_length_of(model_config), max_tokens=config.generation.max_tokens,
                        launch_context=LaunchOptions.from_args(list(spec.server.extra_args)).context_length,
                        param_context=config.tuning.context_length or None)


def _create_run_folder(layout) -> None:
    """The run's folder, or ``OutputUnwritable`` naming it and ``output_root``: the first write of a run, and
    a read-only, immutable or foreign output root fails the same way on every try."""
    import os

    from fleetgen.errors import OutputUnwritable

    try:
        layout.root.mkdir(parents=True, exist_ok=True)
        if not os.access(layout.root, os.W_OK | os.X_OK):  # a read-only or immutable folder that exists
            raise PermissionError(13, "Permission denied", str(layout.root))
    except OSError as error:
        raise OutputUnwritable(f"cannot create or write the run's folder {layout.root}: "
                               f"{error.strerror or error}", errno=error.errno, path=str(layout.root),
                               hint="the DAG parameter output_root (or FLEETGEN_OUTPUT_ROOT) must name a folder "
                                    "the worker's user can write on every worker: fix its permissions or "
                                    "choose another") from None


def scan_prompts(fleet: dict) -> dict:
    """**Validates the prompts file** (`prompts_path`): structural errors fail with file:line; invalid prompts go to
    `rejects.jsonl` in the run's folder.

    *When it fails*: the file is not readable on the worker or a line is not JSON; the log names the line.
    """
    from fleetgen.prompts.length import LengthLimit
    from fleetgen.prompts.lines import FLEETGEN_FORMAT, FORMAT_NAMES
    from fleetgen.prompts.scan import scan_prompts as scan_file
    from fleetgen.report.previous import prompts_identity

    _, config, layout = run_context()
    _create_run_folder(layout)
    spec = fleet_from_json(fleet)
    limit = _prompt_length_limit(spec, config)
    log.info("Validating prompts %s (rejects go to %s); prompts must fit a context of %d tokens with max_tokens "
             "%d (%s)", config.inputs.prompts_path, layout.rejects, limit.context_tokens, limit.max_tokens,
             limit.source)
    scan = scan_file(config.inputs.prompts_path, rejects_path=layout.rejects, length_limit=limit,
                     max_cap_cut_factor=config.tuning.max_cap_cut_factor, run_model=spec.model.served_name)
    applied = LengthLimit.from_dict(scan.length_limit)  # tighter than ``limit`` when max_cap_cut_factor set some aside
    # The scan (with its sparse byte index, ~1,000 pairs per million prompts) travels on so that
    # plan_shards does not read the file a second time.
    summary = {**scan_as_stored(scan.to_dict()), "out_dir": run_url(layout),
               "prompt_tokens_mean": round(scan.est_prompt_tokens_mean, 1),
               "prompt_tokens_max": scan.est_prompt_tokens_max}
    layout.prompts_identity.write_text(json.dumps(prompts_identity(summary)))
    log.info("Prompts%s: %d valid, %d rejected; prompt tokens mean %.0f, max %d (estimated from characters)",
             "" if scan.format == FLEETGEN_FORMAT else f" in {FORMAT_NAMES[scan.format]}", scan.count, scan.rejected,
             scan.est_prompt_tokens_mean, scan.est_prompt_tokens_max)
    if scan.other_model_lines:  # docs/output-formats.md §1.1: the fleet's model answers every request
        log.warning("%d Batch API request(s) name another model than the fleet's %r (the first: %r at line %d); "
                    "they are generated with the fleet's model, which their completions name", scan.other_model_lines,
                    spec.model.served_name, scan.other_model["model"], scan.other_model["line"])
    if scan.too_long:
        log.warning("%d prompt(s) set aside as too long for the context of %d tokens (%s): estimated prompt tokens "
                    "+ max_tokens %d exceed it; the plan sizes the servers for the other prompts; each is in %s "
                    "with its estimate", scan.too_long, applied.context_tokens, applied.source, applied.max_tokens,
                    layout.rejects)
    return summary


def derive_plan(fleet: dict, inventories: list[dict], prompt_scan: dict,
                model_identity: dict | None = None) -> list[dict]:
    """**Sizes every server** from its GPUs' free memory and the model: `--mem-fraction-static`,
    `--max-running-requests`, `--max-mamba-cache-size`, `--context-length`. The log shows each server's budget table.
    With the tuning trial (`tuning_trial`, 3 servers or more) every candidate is planned for every server and each
    server gets the candidate the fleet's split gives it (the log says which, and why no trial otherwise).

    *When it fails*: the model does not fit the free memory: lower `max_tokens` or `context_length`, or free the GPUs
    (the probe's inventory lists foreign processes).
    """
    from fleetgen.prompts.scan import PromptScan
    from fleetgen.report.previous import prompt_token_statistics
    from fleetgen.tuning import LaunchOptions, Workload, render_budget_table
    from fleetgen.tuning import fleet_plan
    from fleetgen.tuning.fleet_plan import FleetPlanRun
    from fleetgen.tuning.model_files import read_model
    from fleetgen.tuning.plan_notes import write_plan_notes

    context, config, layout = run_context()
    spec, inventories = fleet_from_json(fleet), mapped_values(inventories)
    left_out = {inventory["host"]: inventory[UNREACHABLE] for inventory in inventories if UNREACHABLE in inventory}
    if left_out:
        spec = _reachable_fleet(spec, left_out)
    log.info("Deriving launch flags for %d server(s) (mode %s)", len(spec.servers()), config.tuning.mode)
    run_on_node = _node_runner(spec)
    model = read_model(lambda command: run_on_node(spec.nodes[0].name, command, "read the model's config and weights"),
                       spec.model.path, host=spec.nodes[0].name)
    log.info("Model weights: %d bytes (%s)", model.weights_bytes, model.weights_source)
    tokens = prompt_token_statistics(config.inputs.output_root, layout, prompt_scan)
    log.info("Prompt tokens for the plan: mean %.0f, max %d (%s); %d prompt(s) too long for the context were set "
             "aside at scan time", tokens.mean, tokens.max, tokens.source, prompt_scan.get("too_long", 0))
    # A prompt's own sampling.max_tokens may exceed the run's: the context must hold it (docs/shards.md §4).
    workload = Workload(max_output_tokens=PromptScan.from_dict(prompt_scan).output_tokens_max(
                            config.generation.max_tokens), prompt_tokens_mean=tokens.mean,
                        prompt_tokens_max=tokens.max, prompt_count=int(prompt_scan["count"]))
    options = dataclasses.replace(LaunchOptions.from_args(list(spec.server.extra_args)), tp_size=spec.server.tp_size)
    by_node = {inventory["host"]: inventory for inventory in inventories if inventory["host"] not in left_out}
    server_plans, trial_notes = trial_tasks.tonights_plans(
        spec, by_node, model, workload, config, layout,
        FleetPlanRun(config.inputs.output_root, layout, pin_full_context=config.tuning.pin_full_context_plan,
                     run_on_node=lambda node, command: run_on_node(node, command,
                                                                   "read the previous run's scheduler lines")),
        model_identity, reused_in_trial=lambda head: trial_tasks.reused_trial_prompts(
            config, spec, layout, prompt_scan, model_identity, head) if config.generation.reuses(
                run_type(context)) else (0, None))
    for note in trial_notes:
        log.info("%s", note)
    long_prompt = _long_prompt_cost(spec, by_node, model, options, workload, prompt_scan, config)
    if long_prompt is not None:
        log.warning("One prompt cuts every server's running requests: %s", long_prompt.describe())
    write_plan_notes(layout, nodes_left_out=left_out, long_prompt=long_prompt, tuning_trial=trial_notes)
    plans = []
    on_trial = layout.candidate_plans.exists()
    for slot, plan in zip(spec.servers(), server_plans):
        label = f"{slot.name} (candidate {plan.candidate})" if on_trial else slot.name
        log.info("Plan for %s:\n%s", label, render_budget_table(plan))
        plans.append(plan.to_dict())
    caps = sorted({p["expected"]["max_running_requests"] for p in plans})
    log.info("Planned %d server(s); expected effective max_running_requests %s", len(plans), caps)
    if left_out:
        log.warning("Left out of tonight's plan (skip_unreachable_nodes): %s",
                    "; ".join(f"{node}: {reason}" for node, reason in left_out.items()))
    return plans


def _reachable_fleet(spec: FleetSpec, left_out: dict[str, str]) -> FleetSpec:
    """The fleet without the nodes the probe could not reach; none left fails the run naming each."""
    reachable = tuple(node for node in spec.nodes if node.name not in left_out)
    if not reachable:
        raise HostUnreachable("no node of the fleet could be reached: " + "; ".join(
            f"{node}: {reason}" for node, reason in left_out.items()),
            hint="is any node up and its SSH port open from the workers? skip_unreachable_nodes runs on the "
                 "reachable ones only")
    return dataclasses.replace(spec, nodes=reachable)


def _long_prompt_cost(spec: FleetSpec, inventories: dict, model, options, workload, prompt_scan: dict,
                      config: RunConfig):
    """What the longest prompt costs the first server's cap, when it cuts it by CAP_CUT_WARNING or more; else None.
    The next longest prompt is the scan's estimate, scaled to the plan's figure when the plan's come from the servers'
    own count in an earlier run (``prompt_token_statistics``)."""
    from fleetgen.tuning import fleet_plan
    from fleetgen.tuning.plan_notes import LongPromptCost, without_longest

    runner_up, estimated_max = prompt_scan.get("runner_up_prompt_tokens"), prompt_scan["prompt_tokens_max"]
    if not (runner_up and prompt_scan.get("longest")):
        return None
    without = without_longest(workload, math.ceil(runner_up * workload.prompt_tokens_max / estimated_max))
    if without is None:
        return None
    with_it, without_it = fleet_plan.first_server_plans(spec, inventories, model, options, (workload, without),
                                                        config.tuning.bounds(), config.inputs.output_root)
    return LongPromptCost.of(prompt_scan["longest"], with_it, without_it)


def _node_runner(spec: FleetSpec):
    """``run(node, command, what) -> stdout``: one SSH session per call, on the node's connection."""
    def run(node: str, command: str, what: str) -> str:
        with NodeShell(node, spec.node(node).ssh_conn_id) as shell:
            return shell.run(command, describe=what)[1]
    return run


def model_identity(fleet: dict) -> dict:
    """Reads on the node, in one SSH command, what changes the text the servers write: each safetensors file's size,
    header and sampled blocks (every byte with `weights_hash` = full), `config.json`, `generation_config.json`, the
    tokenizer files, the chat template, the fleet's extra SGLang flags and the SGLang version. This is the model
    identity a completion may be reused under (`reuse_completions`); no weight crosses the network. A failure here
    is the node (SSH) or an unreadable model directory: check `model.path` and `server.python` in the fleet description.
    """
    from fleetgen.tuning.model_files import model_identity as read_identity

    _, config, _ = run_context()
    spec = fleet_from_json(fleet)

    def read_on(node: str) -> dict:
        with NodeShell(node, spec.node(node).ssh_conn_id) as shell:
            return read_identity(
                lambda command, timeout_s: shell.run(command, describe="model identity", timeout_s=timeout_s)[1],
                spec.model.path, python=spec.server.python, module=spec.server.module,
                extra_args=spec.server.extra_args, weights_hash=config.generation.weights_hash, host=node)

    identity = _on_a_reachable_node(spec, config, read_on)
    log.info("Model %s: %d safetensors file(s), %d bytes (%s hashed), SGLang %s; identity %s (completions of runs "
             "with the same identity and sampling can be reused)", identity["path"], identity["weight_files"],
             identity["weight_bytes"], identity["weights_hash"], identity["parts"]["sglang"],
             {part: digest[:12] for part, digest in identity["parts"].items() if part not in ("path", "sglang")})
    return identity


def go_live() -> bool:
    """Stops the run here (skipping the rest) when `dry_run` is set: the plan was printed above.
    """
    _, config, _ = run_context()
    if config.inputs.dry_run:
        log.info("dry_run is set: the plan above was printed; no server is touched")
        return False
    return True
