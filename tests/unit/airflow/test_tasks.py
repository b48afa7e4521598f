"""The fleet and tune tasks (fleetgen.airflow.tasks) called as Airflow calls them, with a fake task context and
nodes whose commands run in a local bash (the model directory is a local folder): no SSH, no DAG run."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
from airflow.sdk import Variable

from fleetgen.airflow import context as task_context_module
from fleetgen.airflow import lifecycle, tasks
from fleetgen.airflow.run_config import RunConfig
from fleetgen.errors import ConfigError, ProbeError, RemoteError

CONFIGS = Path(__file__).resolve().parents[1] / "tuning" / "configs"
RUN_ID = "manual__2026-01-01T00:00:00+00:00"


class LocalNodes:
    """Stands in for NodeShell: every session records its node and connection, every command runs in bash here."""

    sessions: list[tuple[str, str]] = []
    commands: list[tuple[str, str, str]] = []

    def __init__(self, node, ssh_conn_id, **_):
        self.node = node
        LocalNodes.sessions.append((node, ssh_conn_id))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass

    def run(self, command, *, stdin=None, timeout_s=120.0, check=True, describe="command"):
        LocalNodes.commands.append((self.node, describe, command))
        result = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=30)
        if check and result.returncode != 0:
            raise RemoteError(f"{describe} failed: {result.stderr}", host=self.node)
        return result.returncode, result.stdout, result.stderr


@pytest.fixture
def nodes(monkeypatch):
    LocalNodes.sessions, LocalNodes.commands = [], []
    monkeypatch.setattr(tasks, "NodeShell", LocalNodes)
    return LocalNodes


def fleet_document(model_path: str, *extra_args: str) -> dict:
    """n0 (two servers) and n1 (one) at different addresses on the same port numbers."""
    return {"model": {"path": model_path, "served_name": "m"},
            "server": {"python": "/opt/py", "module": "sglang.launch_server", "extra_args": list(extra_args)},
            "nodes": [{"name": "n0", "ssh_conn_id": "ssh_n0", "address": "10.0.0.5", "gpus": [0, 1],
                       "base_port": 30000},
                      {"name": "n1", "ssh_conn_id": "ssh_n1", "address": "10.0.0.6", "gpus": [0, 1],
                       "base_port": 30000}]}


@pytest.fixture
def run(tmp_path, monkeypatch):
    """Runs a task with the given DAG params over a prompts file and a model folder in tmp_path."""
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "prompt": "x" * (40 * (i + 1))}) + "\n" for i in range(5)))
    model = tmp_path / "model"
    model.mkdir()
    shutil.copy(CONFIGS / "seed-qwen3.6-27b.json", model / "config.json")
    monkeypatch.setenv("FLEETGEN_OUTPUT_ROOT", str(tmp_path))  # the deployment's root: the run's output_root is in it
    defaults = {spec.name: spec.default_value() for spec in RunConfig.settings()}
    state = SimpleNamespace(tmp=tmp_path, prompts=prompts, model=model, context=None,
                            params={**defaults, "fleet_file": "", "prompts_path": str(prompts),
                                    "output_root": str(tmp_path / "out")})

    def call(task, *args, **params):
        state.context = {"params": {**state.params, **params}, "run_id": RUN_ID, "ti": None}
        monkeypatch.setattr(task_context_module, "task_context", lambda: state.context)
        return task(*args)

    state.call = call
    return state


# --- the fleet ----------------------------------------------------------------------------------------------------

def _messages(caplog) -> list[str]:
    return [record.getMessage() for record in caplog.records if record.name == "fleetgen"]


def test_the_fleet_file_param_is_read_and_returned_in_its_canonical_form(run, monkeypatch, caplog):
    fleet_file = run.tmp / "fleet.json"
    fleet_file.write_text(json.dumps(fleet_document("/models/m")))
    monkeypatch.setattr(Variable, "get", staticmethod(lambda *a, **k: pytest.fail("the Variable is not read")))
    with caplog.at_level("INFO", logger="fleetgen"):
        fleet = run.call(tasks.load_fleet, fleet_file=str(fleet_file))
    assert _messages(caplog) == [f"Reading the fleet description ({fleet_file})",
                                 "Fleet: 2 node(s), 4 server(s): n0:30000 GPU[0], n0:30001 GPU[1], n1:30000 GPU[0], "
                                 "n1:30001 GPU[1]"]
    assert [(n["name"], n["ports"]) for n in fleet["nodes"]] == [("n0", [30000, 30001]), ("n1", [30000, 30001])]
    assert tasks.node_names(fleet) == ["n0", "n1"]


def test_without_a_fleet_file_the_variable_holds_the_fleet(run, monkeypatch, caplog):
    asked = []
    monkeypatch.setattr(Variable, "get", staticmethod(
        lambda key, default="unset": asked.append((key, default)) or json.dumps(fleet_document("/models/m"))))
    with caplog.at_level("INFO", logger="fleetgen"):
        fleet = run.call(tasks.load_fleet)
    assert asked == [("fleetgen_fleet", None)] and fleet["model"]["path"] == "/models/m"
    assert _messages(caplog)[0] == "Reading the fleet description (Variable fleetgen_fleet)"


def test_a_broken_fleet_in_the_variable_is_refused_naming_the_variable(run, monkeypatch):
    monkeypatch.setattr(Variable, "get", staticmethod(lambda key, default=None: "nodes: []\n"))
    with pytest.raises(ConfigError, match="Variable fleetgen_fleet"):
        run.call(tasks.load_fleet)


def test_no_fleet_anywhere_fails_the_run_at_once_naming_both_places(run, monkeypatch):
    monkeypatch.setattr(Variable, "get", staticmethod(lambda key, default=None: default))
    with pytest.raises(ConfigError, match="set the 'fleet_file' param or the Airflow Variable 'fleetgen_fleet'"
                                          "\nWhat to check next: see airflow_settings.yaml for an example"):
        run.call(tasks.load_fleet)


def test_a_missing_prompts_file_fails_before_the_fleet_is_read(run, monkeypatch):
    monkeypatch.setattr(Variable, "get", staticmethod(lambda *a, **k: pytest.fail("the fleet is not read")))
    with pytest.raises(ConfigError, match="prompts file .*missing.jsonl not found"):
        run.call(tasks.load_fleet, prompts_path=str(run.tmp / "missing.jsonl"))


@pytest.mark.parametrize("run_id", [".", ".."])
def test_a_run_id_naming_no_folder_of_its_own_fails_the_first_task_before_the_fleet_is_read(run, monkeypatch,
                                                                                            run_id):
    # run "." would write into the output root itself, ".." beside it
    monkeypatch.setattr(Variable, "get", staticmethod(lambda *a, **k: pytest.fail("the fleet is not read")))
    monkeypatch.setattr(task_context_module, "task_context",
                        lambda: {"params": run.params, "run_id": run_id, "ti": None})
    with pytest.raises(ConfigError, match=f"run id {re.escape(repr(run_id))} does not name a folder of its own"):
        tasks.load_fleet()


def test_an_output_root_outside_the_deployments_fails_the_first_task_at_once_writing_nothing(run, monkeypatch):
    from airflow.sdk.exceptions import AirflowFailException

    from fleetgen.airflow.context import fail_fast

    # whoever may trigger a run names the folder; the workers would write there (and reuse read there)
    monkeypatch.setattr(Variable, "get", staticmethod(lambda *a, **k: pytest.fail("the fleet is not read")))
    elsewhere = run.tmp.parent / f"{run.tmp.name}-elsewhere"
    with pytest.raises(AirflowFailException, match="DAG parameter output_root .* lies outside") as caught:
        run.call(fail_fast(tasks.load_fleet), output_root=str(elsewhere), prompts_path=str(run.tmp / "missing"))
    refused = caught.value.__cause__
    assert isinstance(refused, ConfigError) and str(elsewhere) in refused.message
    assert f"FLEETGEN_OUTPUT_ROOT, {run.tmp}" in refused.message and "FLEETGEN_ALLOW_OUTPUT_ROOTS" in refused.hint
    assert not elsewhere.exists()


# --- probe --------------------------------------------------------------------------------------------------------

def _inventory(host, indices):
    return {"host": host, "gpus": [{"index": i, "uuid": f"GPU-{i}", "name": "Fake", "total_mib": 1000,
                                    "used_mib": 0, "free_mib": 1000, "processes": []} for i in indices]}


def test_the_probe_runs_on_the_named_nodes_connection(run, nodes, monkeypatch, caplog):
    probed = []
    monkeypatch.setattr(lifecycle, "probe_node", lambda shell, spec, node: probed.append(
        (shell.node, node, spec.node(node).address)) or _inventory(node, [0, 1]))
    with caplog.at_level("INFO", logger="fleetgen"):
        inventory = run.call(tasks.probe_gpus, "n1", fleet_document("/models/m"))
    assert _messages(caplog) == ["Probing the GPUs of n1 over SSH (ssh_n1)",
                                 "n1: 2 GPU(s)\n  GPU 0 Fake: total 1000 MiB, used 0, free 1000 (no processes)\n"
                                 "  GPU 1 Fake: total 1000 MiB, used 0, free 1000 (no processes)"]
    assert inventory["host"] == "n1" and probed == [("n1", "n1", "10.0.0.6")] and nodes.sessions == [("n1", "ssh_n1")]


def test_a_gpu_the_fleet_names_but_the_node_lacks_fails_the_probe_for_good(run, nodes, monkeypatch):
    monkeypatch.setattr(lifecycle, "probe_node", lambda shell, spec, node: _inventory(node, [0]))
    with pytest.raises(ProbeError, match=r"the fleet names GPU\(s\) \[1\] but nvidia-smi lists only \[0\]"):
        run.call(tasks.probe_gpus, "n0", fleet_document("/models/m"), skip_unreachable_nodes=True)


# --- prompts ------------------------------------------------------------------------------------------------------

def test_the_prompt_scan_reads_the_models_context_on_the_first_node_and_records_the_prompts_identity(run, nodes,
                                                                                                    caplog):
    with caplog.at_level("INFO", logger="fleetgen"):
        summary = run.call(tasks.scan_prompts, fleet_document(str(run.model)))
    assert nodes.sessions == [("n0", "ssh_n0")] and str(run.model / "config.json") in nodes.commands[0][2]
    assert nodes.commands[0][1] == f"read {run.model / 'config.json'}"
    layout = RunConfig.from_params(run.context["params"]).layout(RUN_ID)
    assert summary["count"] == 5 and summary["rejected"] == 0 and summary["out_dir"] == str(layout.root)
    assert summary["length_limit"]["context_tokens"] == 262144
    assert summary["length_limit"]["source"] == "the model's context length"
    assert summary["prompt_tokens_mean"] == round(summary["est_prompt_tokens_mean"], 1) > 0
    assert summary["prompt_tokens_max"] == summary["est_prompt_tokens_max"] > summary["prompt_tokens_mean"]
    assert json.loads(layout.prompts_identity.read_text()) == {
        "path": str(run.prompts), "bytes": run.prompts.stat().st_size,
        "mtime_ns": run.prompts.stat().st_mtime_ns, "count": 5}
    assert _messages(caplog) == [
        f"Validating prompts {run.prompts} (rejects go to {layout.rejects}); prompts must fit a context of 262144 "
        f"tokens with max_tokens 4096 (the model's context length)",
        f"Prompts: 5 valid, 0 rejected; prompt tokens mean {summary['est_prompt_tokens_mean']:.0f}, max "
        f"{summary['est_prompt_tokens_max']} (estimated from characters)"]


def test_the_context_param_limits_the_prompts_and_the_fleets_context_length_wins_over_it(run, nodes, caplog):
    # Estimated at ~4 characters per token: 40..200 characters are 10..50 tokens, + max_tokens 10.
    with caplog.at_level("INFO", logger="fleetgen"):
        summary = run.call(tasks.scan_prompts, fleet_document(str(run.model)), context_length=45, max_tokens=10)
    assert summary["length_limit"] == {"context_tokens": 45, "max_tokens": 10, "source": "the context_length param"}
    assert summary["too_long"] == 2 and summary["count"] == 3
    layout = RunConfig.from_params(run.context["params"]).layout(RUN_ID)
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == [
        f"2 prompt(s) set aside as too long for the context of 45 tokens (the context_length param): estimated "
        f"prompt tokens + max_tokens 10 exceed it; the plan sizes the servers for the other prompts; each is in "
        f"{layout.rejects} with its estimate"]
    summary = run.call(tasks.scan_prompts, fleet_document(str(run.model), "--context-length", "1000"),
                       context_length=45, max_tokens=10)
    assert summary["length_limit"]["context_tokens"] == 1000 and summary["too_long"] == 0


def test_a_batch_api_file_is_scanned_and_its_requests_naming_another_model_are_told_once(run, nodes, caplog):
    run.prompts.write_text("".join(json.dumps({
        "custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions",
        "body": {"model": model, "messages": [{"role": "user", "content": "hi"}]}}) + "\n"
        for i, model in enumerate(["m", "gpt-4o-mini", "m", "o3"])))
    with caplog.at_level("INFO", logger="fleetgen"):
        summary = run.call(tasks.scan_prompts, fleet_document(str(run.model)))  # the fleet serves "m"
    assert (summary["format"], summary["count"], summary["other_model_lines"]) == ("openai_batch", 4, 2)
    messages = _messages(caplog)
    assert messages[1].startswith("Prompts in the OpenAI Batch API's input format ({\"custom_id\", \"method\", "
                                  "\"url\", \"body\"}): 4 valid, 0 rejected")
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == [
        "2 Batch API request(s) name another model than the fleet's 'm' (the first: 'gpt-4o-mini' at line 2); they "
        "are generated with the fleet's model, which their completions name"]


def test_a_scan_with_nothing_too_long_warns_of_nothing(run, nodes, caplog):
    with caplog.at_level("WARNING", logger="fleetgen"):
        run.call(tasks.scan_prompts, fleet_document(str(run.model)))
    assert "too long" not in caplog.text


# --- plan ---------------------------------------------------------------------------------------------------------

class PlannedServer:
    def __init__(self, slot, cap):
        self.slot, self.cap = slot, cap

    def to_dict(self):
        return {"host": self.slot.node, "port": self.slot.port, "expected": {"max_running_requests": self.cap}}


@pytest.fixture
def planner(monkeypatch, run):
    """read_model, prompt_token_statistics and plan_fleet replaced by recorders; each server's cap is 30 + its
    position, so that the order of the plans shows. The tuning trial is off (its plans are tested below)."""
    from fleetgen.report import previous
    from fleetgen.tuning import fleet_plan, model_files
    import fleetgen.tuning as tuning

    seen = SimpleNamespace()

    def read_model(run_command, model_path, *, host):
        seen.model_read = (run_command("echo weights"), model_path, host)
        seen.model = SimpleNamespace(weights_bytes=123, weights_source="index")
        return seen.model

    def plan_fleet(spec, inventories, model, options, workload, bounds, run, log):
        seen.plan_args = SimpleNamespace(inventories=inventories, model=model, options=options, workload=workload,
                                         bounds=bounds, run=run, log=log,
                                         scheduler_lines=run.run_on_node(spec.nodes[-1].name, "echo scheduler"))
        return [PlannedServer(slot, 30 + position) for position, slot in enumerate(spec.servers())]

    def prompt_token_statistics(root, layout, scan):
        seen.token_statistics_args = (root, layout, scan)
        return previous.PromptTokens(270.5, 1900, "estimated")

    monkeypatch.setattr(model_files, "read_model", read_model)
    monkeypatch.setattr(fleet_plan, "plan_fleet", plan_fleet)
    monkeypatch.setattr(tuning, "render_budget_table", lambda plan: f"table of {plan.slot.name}")
    monkeypatch.setattr(previous, "prompt_token_statistics", prompt_token_statistics)
    run.params["tuning_trial"] = False
    return seen


def _scan(run, nodes, **params):
    summary = run.call(tasks.scan_prompts, fleet_document(str(run.model)), **params)
    nodes.sessions.clear()
    nodes.commands.clear()
    return summary


def test_the_plan_sizes_every_server_of_every_node_from_its_own_inventory(run, nodes, planner, caplog):
    scan = _scan(run, nodes)
    inventories = [_inventory("n0", [0, 1]), _inventory("n1", [0, 1, 2])]
    caplog.clear()
    with caplog.at_level("INFO", logger="fleetgen"):
        plans = run.call(tasks.derive_plan, fleet_document("/models/m"), inventories, scan,
                         pin_full_context_plan=True)
    assert _messages(caplog)[:3] == [
        "Deriving launch flags for 4 server(s) (mode tuned)", "Model weights: 123 bytes (index)",
        "Prompt tokens for the plan: mean 270, max 1900 (estimated); 0 prompt(s) too long for the context were "
        "set aside at scan time"]
    assert _messages(caplog)[3:] == ["no tuning trial: the DAG parameter tuning_trial is off"] + [
        f"Plan for {name}:\ntable of {name}" for name in
                                     ("n0:30000", "n0:30001", "n1:30000", "n1:30001")] + [
        "Planned 4 server(s); expected effective max_running_requests [30, 31, 32, 33]"]
    assert [(p["host"], p["port"]) for p in plans] == [("n0", 30000), ("n0", 30001), ("n1", 30000), ("n1", 30001)]
    assert [p["expected"]["max_running_requests"] for p in plans] == [30, 31, 32, 33]
    args = planner.plan_args
    assert {host: len(inv["gpus"]) for host, inv in args.inventories.items()} == {"n0": 2, "n1": 3}
    assert planner.model_read == ("weights\n", "/models/m", "n0")
    assert args.scheduler_lines == "scheduler\n" and nodes.sessions == [("n0", "ssh_n0"), ("n1", "ssh_n1")]
    # What each node command is for: the words an SSH failure's message names it by.
    assert [(node, what) for node, what, _ in nodes.commands] == [
        ("n0", "read the model's config and weights"), ("n1", "read the previous run's scheduler lines")]
    assert args.model is planner.model and args.log is tasks.log
    config = RunConfig.from_params(run.context["params"])
    assert args.run.output_root == config.inputs.output_root
    root, layout, scan_given = planner.token_statistics_args
    assert root == config.inputs.output_root and layout.root == config.layout(RUN_ID).root and scan_given is scan
    assert (args.workload.max_output_tokens, args.workload.prompt_tokens_mean, args.workload.prompt_tokens_max,
            args.workload.prompt_count) == (4096, 270.5, 1900, 5)
    assert args.options.tp_size == 1 and args.run.pin_full_context is True
    assert args.run.layout.root.name == RunConfig.from_params(run.context["params"]).layout(RUN_ID).root.name
    assert "Plan for n1:30001:\ntable of n1:30001" in caplog.text
    assert "expected effective max_running_requests [30, 31, 32, 33]" in caplog.text


def test_a_prompts_own_max_tokens_above_the_runs_sizes_the_plan(run, nodes, planner):
    run.prompts.write_text(json.dumps({"id": "a", "prompt": "hi", "sampling": {"max_tokens": 9000}}) + "\n"
                           + json.dumps({"id": "b", "prompt": "hi"}) + "\n")
    scan = _scan(run, nodes, max_tokens=100)
    run.call(tasks.derive_plan, fleet_document("/models/m"), [_inventory("n0", [0, 1]), _inventory("n1", [0, 1])],
             scan, max_tokens=100)
    assert planner.plan_args.workload.max_output_tokens == 9000 and planner.plan_args.workload.prompt_count == 2


def test_the_plan_takes_the_tuning_bounds_and_the_fleets_tp_size(run, nodes, planner):
    scan = _scan(run, nodes)
    document = fleet_document("/models/m")
    document["server"]["tp_size"] = 2
    document["nodes"] = [{**document["nodes"][0], "gpus": [0, 1, 2, 3]}]
    plans = run.call(tasks.derive_plan, document, [_inventory("n0", [0, 1, 2, 3])], scan, max_running_requests=64)
    assert len(plans) == 2 and planner.plan_args.options.tp_size == 2
    assert planner.plan_args.bounds.max_running_requests == 64 and planner.plan_args.run.pin_full_context is False


def test_each_node_command_opens_a_session_on_that_nodes_connection(nodes):
    run_on = tasks._node_runner(tasks.fleet_from_json(fleet_document("/models/m")))
    assert run_on("n1", "echo one", "first") == "one\n"
    assert run_on("n0", "echo two", "second") == "two\n"
    assert nodes.sessions == [("n1", "ssh_n1"), ("n0", "ssh_n0")]
    assert [(node, what) for node, what, _ in nodes.commands] == [("n1", "first"), ("n0", "second")]


# --- model identity and dry run -----------------------------------------------------------------------------------

def test_the_model_identity_is_read_on_the_first_node_with_the_fleets_server_and_the_hash_param(run, nodes,
                                                                                               monkeypatch, caplog):
    from fleetgen.tuning import model_files

    seen = {}

    def read_identity(run_command, model_path, *, python, module, extra_args, weights_hash, host):
        seen.update(output=run_command("echo identity", 90), path=model_path, python=python, module=module,
                    extra_args=extra_args, weights_hash=weights_hash, host=host)
        return {"path": model_path, "weight_files": 1, "weight_bytes": 10, "weights_hash": weights_hash,
                "parts": {"path": "p" * 64, "sglang": "0.5.2", "config": "c" * 64}}

    monkeypatch.setattr(model_files, "model_identity", read_identity)
    timeouts = []
    monkeypatch.setattr(LocalNodes, "run", lambda self, command, *, timeout_s=120.0, describe="", **_:
                        timeouts.append((self.node, command, timeout_s, describe)) or (0, "out\n", ""))
    with caplog.at_level("INFO", logger="fleetgen"):
        identity = run.call(tasks.model_identity, fleet_document("/models/m", "--reasoning-parser", "qwen3"),
                            weights_hash="full")
    assert _messages(caplog) == [
        "Model /models/m: 1 safetensors file(s), 10 bytes (full hashed), SGLang 0.5.2; identity {'config': 'cccccccccccc'}"
        " (completions of runs with the same identity and sampling can be reused)"]
    assert identity["weights_hash"] == "full" and nodes.sessions == [("n0", "ssh_n0")]
    assert seen == {"output": "out\n", "path": "/models/m", "python": "/opt/py", "module": "sglang.launch_server",
                    "extra_args": ("--reasoning-parser", "qwen3"), "weights_hash": "full", "host": "n0"}
    assert timeouts == [("n0", "echo identity", 90, "model identity")]


def test_a_dry_run_stops_before_any_server_is_touched(run, caplog):
    with caplog.at_level("INFO", logger="fleetgen"):
        assert run.call(tasks.go_live) is True
        assert _messages(caplog) == []
        assert run.call(tasks.go_live, dry_run=True) is False
    assert _messages(caplog) == ["dry_run is set: the plan above was printed; no server is touched"]


def test_an_unreadable_model_config_fails_the_scan_naming_the_first_node(run, nodes):
    (run.model / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match=r"^\[host n0, .*config.json:1\] not valid JSON"):
        run.call(tasks.scan_prompts, fleet_document(str(run.model)))


def test_the_plan_log_counts_the_prompts_the_scan_set_aside_as_too_long(run, nodes, planner, caplog):
    scan = _scan(run, nodes, context_length=45, max_tokens=10)
    with caplog.at_level("INFO", logger="fleetgen"):
        run.call(tasks.derive_plan, fleet_document("/models/m"), [_inventory("n0", [0, 1]), _inventory("n1", [0, 1])],
                 scan, context_length=45, max_tokens=10)
    assert "; 2 prompt(s) too long for the context were set aside at scan time" in caplog.text


def test_a_scan_from_before_too_long_was_counted_plans_with_none_set_aside(run, nodes, planner, caplog):
    scan = _scan(run, nodes)
    del scan["too_long"]  # an XCom written before the scan counted prompts too long for the context
    with caplog.at_level("INFO", logger="fleetgen"):
        run.call(tasks.derive_plan, fleet_document("/models/m"), [_inventory("n0", [0, 1]), _inventory("n1", [0, 1])],
                 scan)
    assert "; 0 prompt(s) too long for the context were set aside at scan time" in caplog.text


def test_the_prompts_too_long_for_the_context_go_to_the_runs_rejects_file(run, nodes):
    run.call(tasks.scan_prompts, fleet_document(str(run.model)), context_length=45, max_tokens=10)
    rejects = RunConfig.from_params(run.context["params"]).layout(RUN_ID).rejects
    assert len(rejects.read_text().splitlines()) == 2


def test_the_mean_prompt_tokens_travel_rounded_to_one_decimal(run, nodes):
    # 1, 1 and 2 characters: a mean of 4/3 characters, 1/3 of a token at ~4 characters per token.
    run.prompts.write_text("".join(json.dumps({"id": f"p{i}", "prompt": "x" * chars}) + "\n"
                                   for i, chars in enumerate((1, 1, 2))))
    summary = run.call(tasks.scan_prompts, fleet_document(str(run.model)))
    assert summary["prompt_tokens_mean"] == 0.3


# --- nodes left out (skip_unreachable_nodes) and a prompt that cuts every cap ------------------------------------

def _down(monkeypatch, error):
    def probe_node(shell, spec, node):
        raise error
    monkeypatch.setattr(lifecycle, "probe_node", probe_node)


def test_an_unreachable_node_is_left_out_on_the_probes_last_try_when_asked(run, nodes, monkeypatch, caplog):
    from fleetgen.errors import HostUnreachable

    _down(monkeypatch, HostUnreachable("cannot reach the node via connection 'ssh_n1': OSError: down", host="n1"))
    with caplog.at_level("WARNING", logger="fleetgen"):
        inventory = run.call(tasks.probe_gpus, "n1", fleet_document("/models/m"), skip_unreachable_nodes=True)
    assert inventory == {"host": "n1", "gpus": [],
                         "unreachable": "cannot reach the node via connection 'ssh_n1': OSError: down"}
    assert _messages(caplog) == ["n1 cannot be reached and skip_unreachable_nodes is set: left out of tonight's "
                                 "plan, the run goes on with the other nodes (cannot reach the node via connection "
                                 "'ssh_n1': OSError: down)"]


@pytest.mark.parametrize("skip, try_number, max_tries", [(False, 3, 2), (True, 1, 2), (True, 2, 2)])
def test_an_unreachable_node_fails_the_probe_unless_asked_and_until_its_last_try(run, nodes, monkeypatch, skip,
                                                                                  try_number, max_tries):
    from fleetgen.errors import HostUnreachable

    _down(monkeypatch, HostUnreachable("down", host="n1"))
    run.params["skip_unreachable_nodes"] = skip
    run.context = {"params": run.params, "run_id": RUN_ID,
                   "ti": SimpleNamespace(try_number=try_number, max_tries=max_tries)}
    monkeypatch.setattr(task_context_module, "task_context", lambda: run.context)
    with pytest.raises(HostUnreachable):
        tasks.probe_gpus("n1", fleet_document("/models/m"))


def test_a_node_that_refuses_who_we_are_is_never_left_out(run, nodes, monkeypatch):
    from fleetgen.airflow.node_shell import authentication_refused, host_key_mismatch

    for refusal in (authentication_refused("n1", "ssh_n1", "denied"),
                    host_key_mismatch("n1", "ssh_n1", "10.0.0.6", expected="a", received="b")):
        _down(monkeypatch, refusal)
        with pytest.raises(type(refusal)):
            run.call(tasks.probe_gpus, "n1", fleet_document("/models/m"), skip_unreachable_nodes=True)


def test_a_node_left_out_is_not_planned_and_the_notes_say_why(run, nodes, planner, caplog):
    from fleetgen.tuning.plan_notes import read_plan_notes

    scan = _scan(run, nodes)
    inventories = [_inventory("n0", [0, 1]), {"host": "n1", "gpus": [], "unreachable": "cannot reach n1"}]
    caplog.clear()
    with caplog.at_level("WARNING", logger="fleetgen"):
        plans = run.call(tasks.derive_plan, fleet_document("/models/m"), inventories, scan,
                         skip_unreachable_nodes=True)
    assert [(p["host"], p["port"]) for p in plans] == [("n0", 30000), ("n0", 30001)]
    assert set(planner.plan_args.inventories) == {"n0"}
    assert _messages(caplog) == ["Left out of tonight's plan (skip_unreachable_nodes): n1: cannot reach n1"]
    notes = read_plan_notes(RunConfig.from_params(run.context["params"]).layout(RUN_ID))
    assert notes == {"nodes_left_out": [{"node": "n1", "reason": "cannot reach n1"}], "long_prompt": None}


def test_no_node_left_to_plan_fails_naming_each(run, nodes, planner):
    from fleetgen.errors import HostUnreachable

    scan = _scan(run, nodes)
    inventories = [{"host": "n0", "gpus": [], "unreachable": "n0 down"},
                   {"host": "n1", "gpus": [], "unreachable": "n1 down"}]
    with pytest.raises(HostUnreachable, match="no node of the fleet could be reached: n0: n0 down; n1: n1 down"):
        run.call(tasks.derive_plan, fleet_document("/models/m"), inventories, scan, skip_unreachable_nodes=True)


def test_the_model_is_read_on_the_next_node_when_the_first_cannot_be_reached(run, nodes, monkeypatch):
    from fleetgen.errors import HostUnreachable

    real_run = LocalNodes.run

    def run_unless_n0(self, command, **kwargs):
        if self.node == "n0":
            raise HostUnreachable("down", host="n0")
        return real_run(self, command, **kwargs)

    monkeypatch.setattr(LocalNodes, "run", run_unless_n0)
    summary = run.call(tasks.scan_prompts, fleet_document(str(run.model)), skip_unreachable_nodes=True)
    assert summary["count"] == 5 and nodes.sessions == [("n0", "ssh_n0"), ("n1", "ssh_n1")]
    with pytest.raises(HostUnreachable):
        run.call(tasks.scan_prompts, fleet_document(str(run.model)))  # not asked: the first node's failure fails it


def _with_one_long_prompt(run, chars=40_000):
    run.prompts.write_text("".join(json.dumps({"id": f"p{i}", "prompt": "x" * 400}) + "\n" for i in range(20))
                           + json.dumps({"id": "long", "prompt": "y" * chars}) + "\n")


def test_a_prompt_that_cuts_every_cap_is_warned_about_and_noted_for_the_report(run, nodes, planner, monkeypatch,
                                                                               caplog):
    from fleetgen.tuning import fleet_plan
    from fleetgen.tuning.plan_notes import read_plan_notes
    from fleetgen.tuning.plan import ServerPlan

    _with_one_long_prompt(run)
    scan = _scan(run, nodes, max_tokens=100)
    asked = []

    def first_server_plans(spec, inventories, model, options, workloads, bounds, output_root):
        asked.append([(w.prompt_tokens_max, w.max_output_tokens) for w in workloads])
        return [ServerPlan(host="n0", gpu_ids=[0], port=30000, flags={"--context-length": context}, budget=[],
                           expected={"max_running_requests": cap, "max_mamba_cache_size": cap,
                                     "max_total_num_tokens": 1}) for cap, context in ((7, 11264), (71, 1024))]

    monkeypatch.setattr(fleet_plan, "first_server_plans", first_server_plans)
    caplog.clear()
    with caplog.at_level("WARNING", logger="fleetgen"):
        run.call(tasks.derive_plan, fleet_document("/models/m"), [_inventory("n0", [0, 1]), _inventory("n1", [0, 1])],
                 scan, max_tokens=100)
    # the planner's fixture plans with a max of 1900 tokens: the next longest (100 estimated) scaled to it
    assert asked == [[(1900, 100), (19, 100)]]
    warning = ("One prompt cuts every server's running requests: prompt 'long' (line 21, ~10000 tokens estimated) "
               "sets every server's context: --context-length 11264 with it, 1024 without; max_running_requests of "
               "n0:30000 7 with it, 71 without it. Set the DAG parameter max_cap_cut_factor (e.g. 4) to set such "
               "prompts aside into rejects.jsonl, or shorten it")
    assert _messages(caplog) == [warning]
    notes = read_plan_notes(RunConfig.from_params(run.context["params"]).layout(RUN_ID))
    assert notes["long_prompt"]["id"] == "long" and warning.endswith(": " + notes["long_prompt"]["warning"])


def test_the_cap_cut_factor_sets_the_long_prompt_aside_at_scan_time(run, nodes, caplog):
    _with_one_long_prompt(run)
    with caplog.at_level("WARNING", logger="fleetgen"):
        summary = run.call(tasks.scan_prompts, fleet_document(str(run.model)), max_tokens=100, max_cap_cut_factor=4)
    assert (summary["count"], summary["too_long"]) == (20, 1) and summary["longest"]["id"] == "p0"
    layout = RunConfig.from_params(run.context["params"]).layout(RUN_ID)
    [reject] = [json.loads(line) for line in layout.rejects.read_text().splitlines()]
    assert reject["id"] == "long" and "max_cap_cut_factor 4 × the median request of 200 tokens" in reject["error"]
    assert _messages(caplog) == [
        f"1 prompt(s) set aside as too long for the context of 800 tokens (max_cap_cut_factor 4 × the median request "
        f"of 200 tokens: a longer prompt would cut every server's running requests by more than that): estimated "
        f"prompt tokens + max_tokens 100 exceed it; the plan sizes the servers for the other prompts; each is in "
        f"{layout.rejects} with its estimate"]


def test_an_unwritable_output_root_fails_the_scan_once_naming_the_folder_and_the_parameter(run, nodes, tmp_path):
    from airflow.sdk.exceptions import AirflowFailException

    from fleetgen.airflow.context import fail_fast
    from fleetgen.errors import OutputUnwritable

    blocked = tmp_path / "not-a-folder"
    blocked.write_text("a file where the output root should be")  # mkdir fails as on a read-only root
    with pytest.raises(OutputUnwritable) as raised:
        run.call(tasks.scan_prompts, fleet_document(str(run.model)), output_root=str(blocked))
    run_folder = RunConfig.from_params(run.context["params"]).layout(RUN_ID).root
    assert raised.value.path == str(run_folder) and str(run_folder) in str(raised.value)
    assert "output_root" in raised.value.hint
    with pytest.raises(AirflowFailException, match="cannot create or write the run's folder"):  # not retried
        run.call(fail_fast(tasks.scan_prompts), fleet_document(str(run.model)), output_root=str(blocked))


@pytest.mark.parametrize("reuse, run_type, reused", [("always", "manual", True), ("scheduled", "scheduled", True),
                                                     ("scheduled", "manual", False), ("never", "scheduled", False)])
def test_the_plan_counts_the_trials_prompts_an_earlier_run_fills_only_when_this_run_reuses(
        run, nodes, planner, monkeypatch, reuse, run_type, reused):
    from fleetgen.airflow import trial_tasks

    scan = _scan(run, nodes)
    given = {}
    real_tonight = trial_tasks.tonights_plans

    def tonights_plans(*args, reused_in_trial):
        given["answer"] = reused_in_trial(7)
        return real_tonight(*args)

    def reused_trial_prompts(config, spec, layout, prompt_scan, identity, head):
        given["asked"] = (config.generation.reuse_completions, len(spec.servers()), layout.root.name, prompt_scan,
                          identity, head)
        return 3, "scheduled__night1"

    monkeypatch.setattr(trial_tasks, "tonights_plans", tonights_plans)
    monkeypatch.setattr(trial_tasks, "reused_trial_prompts", reused_trial_prompts)
    real_call = run.call

    def call(task, *args, **params):  # the run's type is on its DAG run, as Airflow gives it
        def with_dag_run():
            run.context["dag_run"] = SimpleNamespace(run_type=SimpleNamespace(value=run_type))
            return task(*args)
        return real_call(with_dag_run, **params)

    identity = {"path": "/models/m", "parts": {"weights": "w"}}
    call(tasks.derive_plan, fleet_document("/models/m"), [_inventory("n0", [0, 1]), _inventory("n1", [0, 1])],
         scan, identity, reuse_completions=reuse)
    if reused:
        assert given["answer"] == (3, "scheduled__night1")
        assert given["asked"] == (reuse, 4, RunConfig.from_params(run.context["params"]).layout(RUN_ID).root.name,
                                  scan, identity, 7)
    else:
        assert given == {"answer": (0, None)}
