"""Task callables of the ``sglang_generation`` DAG: each reads its inputs, calls the pure core, logs
one line before and one after, and returns small JSON for XCom (data goes to files)."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

from fleetgen.nodes import probe
from fleetgen.airflow import lifecycle
from fleetgen.airflow.hooks import NodeShell
from fleetgen.errors import (ConfigError, FleetgenError, ModelConfigError, PlanError, ProbeError, PromptsError,
                             ValidationFailed)
from fleetgen.nodes.fleet import FleetSpec, fleet_from_json, load_fleet_file, load_fleet_text

log = logging.getLogger("fleetgen")
FLEET_VARIABLE = "fleetgen_fleet"
PROMPTS_IDENTITY = "prompts.json"  # which prompts file a run read, beside its outputs


# Errors a retry cannot fix: bad input, a model we cannot size, a plan that cannot fit, failed data.
DETERMINISTIC_ERRORS = (ConfigError, ModelConfigError, PlanError, ProbeError, PromptsError, ValidationFailed)


def fail_fast(function):
    """Turn a deterministic error into AirflowFailException (no retry: the same input fails the same
    way), keeping the message and the original as its cause."""
    import functools

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        try:
            return function(*args, **kwargs)
        except DETERMINISTIC_ERRORS as error:
            from airflow.sdk.exceptions import AirflowFailException

            raise AirflowFailException(str(error)) from error

    return wrapper


def _context():
    from airflow.sdk import get_current_context

    return get_current_context()


def _values(mapped) -> list:
    """All values of a mapped task's output in one request (``list()`` on the lazy sequence asks
    index by index and logs a spurious "XCom not found" at the end)."""
    return list(mapped[:]) if hasattr(mapped, "__getitem__") and not isinstance(mapped, list) else list(mapped)


def prompts_path(params: dict) -> Path:
    return Path(params["prompts_path"]).expanduser()


def run_output_dir(params: dict, run_id: str) -> Path:
    root = Path(params["output_root"]).expanduser()
    return root / re.sub(r"[^A-Za-z0-9_.-]+", "_", run_id)


def _read_fleet(params: dict) -> FleetSpec:
    if params.get("fleet_file"):
        return load_fleet_file(params["fleet_file"])
    from airflow.sdk import Variable

    text = Variable.get(FLEET_VARIABLE, default=None)
    if not text:
        raise ConfigError(f"no fleet description: set the 'fleet_file' param or the Airflow Variable "
                          f"'{FLEET_VARIABLE}'", hint="see airflow_settings.yaml for an example")
    return load_fleet_text(text, source=f"Variable {FLEET_VARIABLE}")


@fail_fast
def load_fleet() -> dict:
    params = _context()["params"]
    log.info("Reading the fleet description (%s)", params.get("fleet_file") or f"Variable {FLEET_VARIABLE}")
    fleet = _read_fleet(params)
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


@fail_fast
def scan_prompts() -> dict:
    from fleetgen.prompts import scan as prompts

    context = _context()
    params = context["params"]
    out_dir = run_output_dir(params, context["run_id"])
    out_dir.mkdir(parents=True, exist_ok=True)
    log.info("Validating prompts %s (rejects go to %s)", prompts_path(params), out_dir / "rejects.jsonl")
    scan = prompts.scan_prompts(prompts_path(params), rejects_path=out_dir / "rejects.jsonl")
    # The scan (with its sparse byte index, ~1,000 pairs per million prompts) travels on so that
    # plan_shards does not read the file a second time.
    summary = {**scan.to_dict(), "out_dir": str(out_dir),
               "prompt_tokens_mean": round(scan.est_prompt_tokens_mean, 1),
               "prompt_tokens_max": scan.est_prompt_tokens_max}
    (out_dir / PROMPTS_IDENTITY).write_text(json.dumps(_prompts_identity(summary)))
    log.info("Prompts: %d valid, %d rejected; prompt tokens mean %.0f, max %d (estimated from characters)",
             scan.count, scan.rejected, scan.est_prompt_tokens_mean, scan.est_prompt_tokens_max)
    return summary


def _read_model(spec: FleetSpec) -> tuple[dict, int]:
    from fleetgen.nodes import remote
    from fleetgen.tuning.profile import weights_bytes_from_index

    node = spec.nodes[0]
    config_path = f"{spec.model.path.rstrip('/')}/config.json"
    index_path = f"{spec.model.path.rstrip('/')}/model.safetensors.index.json"
    with NodeShell(node.name, node.ssh_conn_id) as shell:
        documents = {}
        for path in (config_path, index_path):
            _, text, _ = shell.run(remote.read_file_command(path), describe=f"read {path}")
            try:
                documents[path] = json.loads(text)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"not valid JSON: {exc.msg}", host=node.name, path=path, line=exc.lineno) from None
    return documents[config_path], weights_bytes_from_index(documents[index_path], path=index_path)


def _prompt_token_statistics(params: dict, prompt_scan: dict) -> tuple[float, int, str]:
    """Prompt-token mean and max: measured by the servers in the previous successful run when it read
    the very same prompts file (same path, size and mtime), else estimated from the file's characters."""
    from fleetgen.report.build import find_previous_report

    estimated = (float(prompt_scan["prompt_tokens_mean"]), int(prompt_scan["prompt_tokens_max"]))
    root = Path(params["output_root"]).expanduser()
    previous = find_previous_report(root, run_output_dir(params, _context()["run_id"]).name) if root.exists() else None
    if previous is None:
        return (*estimated, "estimated from the prompts file at ~4 characters per token; no previous run")
    try:
        previous_input = json.loads((Path(previous).parent.parent / PROMPTS_IDENTITY).read_text())
        measured = json.loads(Path(previous).read_text()).get("prompt_tokens") or {}
    except (OSError, ValueError):
        previous_input, measured = {}, {}
    if previous_input != _prompts_identity(prompt_scan) or not measured.get("max"):
        return (*estimated, "estimated from the prompts file; the previous run read other prompts")
    return float(measured["mean"]), int(measured["max"]), f"measured by the servers in the previous run ({previous})"


def _prompts_identity(prompt_scan: dict) -> dict:
    return {key: prompt_scan[key] for key in ("path", "bytes", "mtime_ns", "count")}


@fail_fast
def derive_plan(fleet: dict, inventories: list[dict], prompt_scan: dict) -> list[dict]:
    import dataclasses

    from fleetgen.tuning.profile import LaunchOptions, profile_model
    from fleetgen.tuning.planner import TunerBounds, Workload, plan_server, render_budget_table

    params = _context()["params"]
    spec = fleet_from_json(fleet)
    log.info("Deriving launch flags for %d server(s) (mode %s)", len(spec.servers()), params["tuning"])
    config, weights_bytes = _read_model(spec)
    options = dataclasses.replace(LaunchOptions.from_args(list(spec.server.extra_args)), tp_size=spec.server.tp_size)
    profile = profile_model(config, weights_bytes, options, config_path=f"{spec.model.path}/config.json")
    mean, longest, source = _prompt_token_statistics(params, prompt_scan)
    log.info("Prompt tokens for the plan: mean %.0f, max %d (%s)", mean, longest, source)
    workload = Workload(max_output_tokens=int(params["max_tokens"]), prompt_tokens_mean=mean,
                        prompt_tokens_max=longest, prompt_count=int(prompt_scan["count"]))
    bounds = TunerBounds(margin_mib=int(params["memory_margin_mib"]),
                         max_running_requests=params.get("max_running_requests") or None,
                         context_length=params.get("context_length") or None,
                         bf16_ssm_state=bool(params["bf16_ssm_state"]),
                         no_buffer_radix=bool(params["no_buffer_radix"]), mode=params["tuning"])
    by_host = {inventory["host"]: inventory for inventory in _values(inventories)}
    plans = []
    for slot in spec.servers():
        gpus = probe.select_gpus(by_host[slot.node], slot.gpu_ids)
        plan = plan_server(host=slot.node, gpu_ids=list(slot.gpu_ids), port=slot.port, gpus=gpus, profile=profile,
                           options=options, workload=workload, bounds=bounds)
        log.info("Plan for %s:\n%s", slot.name, render_budget_table(plan))
        plans.append(plan.to_dict())
    caps = sorted({p["expected"]["max_running_requests"] for p in plans})
    log.info("Planned %d server(s); expected effective max_running_requests %s", len(plans), caps)
    return plans


def go_live() -> bool:
    params = _context()["params"]
    if params["dry_run"]:
        log.info("dry_run is set: the plan above was printed; no server is touched")
        return False
    return True


@fail_fast
def stop_servers(node: str, fleet: dict) -> dict:
    spec = fleet_from_json(fleet)
    ports = list(spec.node(node).ports)
    log.info("Stopping our servers on %s ports %s (only pids from our pid files whose command line matches)",
             node, ports)
    with NodeShell(node, spec.node(node).ssh_conn_id) as shell:
        records = lifecycle.stop_ports(shell, spec, ports)
        stopped = {r["pid"] for r in records if r["outcome"] == "stopped"}
        inventory = lifecycle.wait_memory_released(shell, spec, node, stopped)
    for record in records:
        if record["outcome"] == "stale":
            log.warning("port %s: pid file named pid %s, which is not our server any more; left it alone",
                        record["port"], record["pid"])
    log.info("Stopped %d server(s) on %s; memory released:\n%s", len(stopped), node, probe.format_inventory(inventory))
    return {"node": node, "records": records}


@fail_fast
def release_servers(node: str, fleet: dict) -> dict:
    """After the run: stop our servers if the run asked for it (the default keeps them up for the next run)."""
    params = _context()["params"]
    if params["keep_servers_up"]:
        log.info("keep_servers_up is set: servers on %s stay up for the next run", node)
        return {"node": node, "records": []}
    return stop_servers(node, fleet)


@fail_fast
def launch_servers(node: str, fleet: dict, plans: list[dict]) -> list[dict]:
    spec = fleet_from_json(fleet)
    slots = [slot for slot in spec.servers() if slot.node == node]
    plan_by_port = {(p["host"], p["port"]): p for p in plans}
    log.info("Launching %d server(s) on %s", len(slots), node)
    key = lifecycle.api_key(spec)
    launched = []
    with NodeShell(node, spec.node(node).ssh_conn_id) as shell:
        for slot in slots:
            launched.append(lifecycle.launch_server(shell, spec, slot, plan_by_port[(slot.node, slot.port)], key))
    log.info("Launched %d server(s) on %s: pids %s", len(launched), node, [s["pid"] for s in launched])
    return launched


def flatten(nested: list[list[dict]]) -> list[dict]:
    return [item for group in _values(nested) for item in group]


@fail_fast
def plan_shards(prompt_scan: dict) -> list[dict]:
    from fleetgen.prompts import scan as prompts

    params = _context()["params"]
    from airflow.configuration import conf

    scan = prompts.PromptScan.from_dict(prompt_scan)
    max_shards = conf.getint("core", "max_map_length")
    shard_size = prompts.shard_size_within(scan.count, int(params["shard_size"]), max_shards)
    if shard_size != int(params["shard_size"]):
        log.warning("%d prompts in shards of %d would map more than [core] max_map_length=%d tasks; using shards "
                    "of %d instead (raise max_map_length to keep smaller shards)", scan.count, params["shard_size"],
                    max_shards, shard_size)
    shards = prompts.plan_shards(prompts_path(params), shard_size=shard_size, scan=scan)
    log.info("Planned %d shard(s) of up to %d prompts over %s", len(shards), shard_size, prompts_path(params))
    return shards


def _running_shards(ti):
    """How many generate_shard tasks of this run are running now (this one included), asked of
    Airflow's execution API: concurrent shards then split each server's limit between them."""
    from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance

    def count() -> int:
        return RuntimeTaskInstance.get_ti_count(dag_id=ti.dag_id, task_ids=[ti.task_id], run_ids=[ti.run_id],
                                                states=["running"])

    return count


@fail_fast
def generate_shard(shard: dict, readiness: list[dict], fleet: dict) -> dict:
    from fleetgen.generate import GenerationSettings, ServerEndpoint, run_shard, server_limits

    context = _context()
    params = context["params"]
    spec = fleet_from_json(fleet)
    ready = _values(readiness)
    parallel = int(params["parallel_shards"])
    # 0 (auto): start with the whole limit and follow how many shards of this run are generating.
    limits = server_limits({r["server"]: r["effective_max_running_requests"] for r in ready},
                           headroom=float(params["headroom"]), parallel_shards=parallel or 1)
    sharing = _running_shards(context["ti"]) if parallel == 0 else None
    endpoints = [ServerEndpoint(name=r["server"], url=r["url"], max_in_flight=limits[r["server"]], host=r["host"],
                                gpu_ids=tuple(r["gpu_ids"])) for r in ready]
    settings = GenerationSettings(model=spec.model.served_name, max_tokens=int(params["max_tokens"]),
                                  temperature=float(params["temperature"]), top_p=float(params["top_p"]))
    out_dir = run_output_dir(params, context["run_id"])
    log.info("Generating shard %d (%d prompts from byte %d) on %d server(s), in-flight limits %s%s",
             shard["shard_id"], shard["count"], shard["start"], len(endpoints), limits,
             ", shared with the other running shards" if sharing else f" (1/{parallel} of each server's)")
    result = run_shard(shard, endpoints, out_dir, settings, api_key=lifecycle.api_key(spec), log=log,
                       sharing=sharing)
    log.info("Shard %d done: %d completed, %d failed, %d already done before; %d output tokens in %.1f s",
             shard["shard_id"], result["done"], result["failed"], result.get("skipped_already_done", 0),
             result["completion_tokens"], result["seconds"])
    return result


@fail_fast
def validate(prompt_scan: dict, shard_results: list[dict]) -> dict:
    from fleetgen.prompts import scan as prompts
    from fleetgen.errors import ValidationFailed
    from fleetgen.validation.suite import ValidationThresholds, validate_run

    context = _context()
    params = context["params"]
    out_dir = run_output_dir(params, context["run_id"])
    thresholds = ValidationThresholds.from_mapping({key: params[key] for key in (
        "max_tokens", "max_length_share", "min_reasoning_share", "max_empty_answer_share", "max_error_share")})
    log.info("Validating %d expected completions in %s with Great Expectations", prompt_scan["count"], out_dir)
    try:
        summary = validate_run(out_dir, prompts.iter_prompt_ids(prompts_path(params)), thresholds)
    except ValidationFailed as failure:
        # The small JSON summary goes to XCom first, so the report and on-call can read it; then fail.
        context["ti"].xcom_push(key="validation_summary", value=failure.summary)
        raise
    log.info("Validation passed: %d rows, every prompt exactly once; Data Docs at %s", summary["rows"],
             summary.get("data_docs"))
    return summary


@fail_fast
def report(plans: list[dict], readiness: list[dict], shard_results: list[dict], validation: dict) -> dict:
    from fleetgen.report.build import build_report, find_previous_report

    context = _context()
    params = context["params"]
    out_dir = run_output_dir(params, context["run_id"])
    previous = find_previous_report(Path(params["output_root"]).expanduser(), out_dir.name)
    log.info("Writing the run report to %s (previous run: %s)", out_dir / "report", previous or "none")
    # Throughput is measured over the generation itself (first request sent to last completion), not
    # the run's wall time, which also holds server start-up and validation.
    summary = build_report(out_dir, run_id=context["run_id"], plan=list(plans), readiness=_values(readiness),
                           shard_results=_values(shard_results), validation=validation, previous_report=previous)
    for asset in context["task"].outlets:  # the finished dataset, for downstream training DAGs
        context["outlet_events"][asset].extra = {"run_id": context["run_id"], "out_dir": str(out_dir),
                                                 "completions": str(out_dir / "completions"),
                                                 "rows": validation.get("rows"), "report": summary["report_json"]}
    log.info("Report: %s; %.1f output tokens/s overall", summary["report_md"], summary["tokens_per_s"])
    return summary


def run_outcome() -> None:
    """Runs only when a task failed (trigger rule one_failed): keeps the run failed although the
    release_servers clean-up, a leaf that runs whatever happened, succeeded."""
    from fleetgen.errors import FleetgenError as _Failure

    raise _Failure("a task of this run failed; see the first failed task's log for what broke and what to check")


def describe_failure(context) -> None:
    """on_failure_callback: one short summary an on-call engineer can act on, in the log and appended
    to ``<run output>/failures.jsonl``."""
    import datetime

    exception = context.get("exception")
    if exception is not None and isinstance(exception.__cause__, FleetgenError):
        exception = exception.__cause__  # unwrapped from AirflowFailException by fail_fast
    ti = context.get("task_instance")
    where = f"{ti.task_id}[{ti.map_index}]" if ti is not None and ti.map_index >= 0 else getattr(ti, "task_id", "?")
    if isinstance(exception, FleetgenError):
        hint = exception.hint
        log.error("FAILED %s: %s", where, exception)
    else:
        hint = "this is not an error fleetgen anticipated; read the traceback above"
        log.error("FAILED %s: %s: %s\nWhat to check next: %s", where, type(exception).__name__, exception, hint)
    record = {"at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "task": where,
              "try": getattr(ti, "try_number", None), "error": type(exception).__name__,
              "message": getattr(exception, "message", str(exception))[:2000], "hint": hint,
              "host": getattr(exception, "host", None), "server": getattr(exception, "server", None)}
    try:
        out_dir = run_output_dir(context["params"], context["run_id"])
        out_dir.mkdir(parents=True, exist_ok=True)
        with (out_dir / "failures.jsonl").open("a") as failures:
            failures.write(json.dumps(record, default=str) + "\n")
    except (OSError, KeyError) as error:
        log.warning("could not append the failure summary: %s", error)
