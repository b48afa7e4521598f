"""The DAG folder imports cleanly, fast, without I/O, and the DAG is wired as the job reads."""

import inspect
import json
import os
import subprocess
import sys

import pytest

from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def dagbag():
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(PROJECT_ROOT / "dags"))


def test_no_import_errors(dagbag):
    assert dagbag.import_errors == {}
    assert "sglang_generation" in dagbag.dags


def test_parse_imports_nothing_heavy():
    # Parse in a fresh interpreter once Airflow itself is imported: what the DAG processor pays per parse.
    # The data stack (pandas, GX, plotting) and the HTTP client load only inside the tasks that use them.
    code = ("import sys, time, runpy, airflow.sdk\n"
            "before = set(sys.modules)\n"
            "t = time.perf_counter(); runpy.run_path(sys.argv[1]); seconds = time.perf_counter() - t\n"
            "print(seconds, ' '.join(sorted(m for m in set(sys.modules) - before if '.' not in m)))\n")
    out = subprocess.run([sys.executable, "-c", code, str(PROJECT_ROOT / "dags/sglang_generation.py")],
                         capture_output=True, text=True, check=True)
    seconds, *loaded = out.stdout.strip().splitlines()[-1].split()
    print(f"DAG parse time: {float(seconds) * 1000:.0f} ms; top-level modules loaded: {loaded}")
    heavy = {"pandas", "numpy", "great_expectations", "matplotlib", "httpx", "asyncssh", "paramiko", "sglang_sim"}
    assert heavy.isdisjoint(loaded), sorted(heavy & set(loaded))


def test_structure_retries_tags_and_params(dagbag):
    dag = dagbag.dags["sglang_generation"]
    assert dag.max_active_runs == 1 and not dag.catchup
    assert {"sglang", "generation"} <= set(dag.tags)
    assert dag.doc_md and "dry_run" in dag.doc_md
    ids = {t.task_id for t in dag.tasks}
    for expected in ("tune.probe_gpus", "tune.derive_plan", "servers.stop_servers", "servers.launch_servers",
                     "servers.wait_ready", "generate.plan_shards", "generate.generate_shard", "validate.validate",
                     "validate.report"):
        assert expected in ids
    assert dag.get_task("generate.generate_shard").retries >= 1
    assert dag.get_task("tune.probe_gpus").retries >= 1
    # A refused SSH connection at launch time is retried: a retry never launches a server twice.
    assert dag.get_task("servers.launch_servers").retries >= 1
    for name in dag.params:
        param = dag.params.get_param(name)
        assert param.schema.get("type") or param.schema.get("enum"), name
        assert param.schema.get("title") and param.description, f"param {name} needs a title and a description"
    # no cycles: a topological sort covers every task
    assert len(dag.topological_sort()) == len(dag.tasks)


def test_dag_import_does_no_io(tmp_path):
    """Importing the DAG file must not touch the network or read the fleet: run it with sockets disabled."""
    code = ("import socket, runpy, sys\n"
            "def refuse(*a, **k): raise RuntimeError('network at import')\n"
            "socket.socket.connect = refuse\n"
            "runpy.run_path(sys.argv[1])\n")
    subprocess.run([sys.executable, "-c", code, str(PROJECT_ROOT / "dags/sglang_generation.py")], check=True,
                   capture_output=True)


def test_the_dag_declares_exactly_the_run_configuration(dagbag):
    from fleetgen.airflow.run_config import RunConfig

    dag = dagbag.dags["sglang_generation"]
    assert set(dag.params) == RunConfig.param_names()
    RunConfig.from_params({name: dag.params[name] for name in dag.params})  # every default is valid


def test_every_default_is_valid_in_the_form_and_params_come_in_sections(dagbag):
    dag = dagbag.dags["sglang_generation"]
    sections = [dag.params.get_param(name).schema.get("section") for name in dag.params]
    assert all(sections), "every param belongs to a section"
    # The form groups params by section in the order they first appear: the everyday ones first.
    assert list(dict.fromkeys(sections)) == ["Inputs", "Tuning", "Generation", "Validation thresholds", "Report"]
    for name in dag.params:
        param = dag.params.get_param(name)
        schema_type = param.schema.get("type")
        # The form calls a field required when its type does not allow null, and refuses an empty value.
        if param.value in (None, ""):
            assert isinstance(schema_type, list) and "null" in schema_type, name
        param.resolve()  # the default passes its own schema


def test_every_task_has_docs_and_every_mapped_task_a_label(dagbag):
    from airflow.sdk.definitions.mappedoperator import MappedOperator

    dag = dagbag.dags["sglang_generation"]
    mapped = [t for t in dag.tasks if isinstance(t, MappedOperator)]
    assert {t.task_id for t in mapped} >= {"tune.probe_gpus", "servers.wait_ready", "generate.generate_shard"}
    for t in dag.tasks:
        assert t.doc_md and len(t.doc_md.strip()) > 30, t.task_id
    for t in mapped:
        assert t.map_index_template, t.task_id


def test_the_relaunch_limit_the_docs_state_is_the_planners(dagbag):
    from fleetgen.tuning.planner import MAX_BACKOFF_ATTEMPTS

    dag = dagbag.dags["sglang_generation"]
    stated = f"({MAX_BACKOFF_ATTEMPTS} times at most)"
    assert stated in dag.doc_md and stated in dag.get_task("servers.wait_ready").doc_md


def test_the_fleet_reaches_tasks_through_one_edge(dagbag):
    """load_fleet is upstream of node_names and the two first readers of the model (scan_prompts,
    model_identity) only: the other tasks pull it when they render."""
    dag = dagbag.dags["sglang_generation"]
    assert dag.get_task("load_fleet").downstream_task_ids == {"node_names", "tune.scan_prompts",
                                                              "tune.model_identity"}


def test_every_python_task_runs_its_callable_through_fail_fast(dagbag):
    """The rule "an error a retry cannot fix fails the task at once" is applied by the DAG, not by the callables:
    every Python task's callable is fail_fast's wrapper around the fleetgen callable of the same name."""
    from fleetgen.airflow.context import fail_fast

    dag = dagbag.dags["sglang_generation"]
    python_tasks = [t for t in dag.tasks if getattr(t, "python_callable", None) is not None]
    assert {t.task_id for t in dag.tasks} - {t.task_id for t in python_tasks} == {"servers.wait_ready",
                                                                                  "relaunch.wait_ready"}
    from fleetgen.airflow.run_storage import on_run_storage

    wrapper_code, storage_code = fail_fast(print).__code__, on_run_storage(print).__code__
    for t in python_tasks:
        wrapped = getattr(t.python_callable, "__wrapped__", None)
        assert t.python_callable.__code__ is wrapper_code and wrapped is not None, f"{t.task_id} is not fail_fast"
        # inside it, the task runs on its run's storage (a private copy of a run on an object store)
        assert wrapped.__code__ is storage_code, f"{t.task_id} does not run on its run's storage"
        assert wrapped.__module__.startswith("fleetgen.airflow.") and t.python_callable.__name__ == wrapped.__name__



def test_only_the_tasks_that_shape_their_arguments_run_without_a_copy_of_the_run(dagbag):
    """A task declared to touch no file of the run (reads=None) runs without a copy of a run on a store: only those
    that compute from their arguments alone."""
    dag = dagbag.dags["sglang_generation"]
    without = {t.task_id for t in dag.tasks if getattr(t, "python_callable", None) is not None
               and t.python_callable.__wrapped__.reads is None}
    assert without == {"node_names", "servers.servers_to_wait", "relaunch.servers_to_wait", "trial.relaunch_needed",
                       "relaunch.servers_in_use"}


@pytest.mark.parametrize("task_id", ["load_fleet", "tune.go_live"])
def test_a_bad_run_configuration_fails_the_task_at_once_keeping_fleetgens_error(dagbag, monkeypatch, task_id):
    from airflow.sdk.exceptions import AirflowFailException

    from fleetgen.airflow import context
    from fleetgen.errors import ConfigError

    refused = ConfigError("unknown key 'max_token' in the run's conf")

    def refuse():
        raise refused

    monkeypatch.setattr(context, "task_context", refuse)
    with pytest.raises(AirflowFailException, match="unknown key 'max_token'") as caught:
        dagbag.dags["sglang_generation"].get_task(task_id).python_callable()
    assert caught.value.__cause__ is refused


def test_a_run_whose_output_root_lies_outside_the_deployments_fails_its_first_task_for_good(dagbag, monkeypatch,
                                                                                          tmp_path):
    from airflow.sdk.exceptions import AirflowFailException

    from fleetgen.airflow import context
    from fleetgen.errors import ConfigError

    dag = dagbag.dags["sglang_generation"]
    monkeypatch.setenv("FLEETGEN_OUTPUT_ROOT", str(tmp_path / "deployment"))
    params = {**{name: dag.params[name] for name in dag.params}, "output_root": str(tmp_path / "elsewhere")}
    monkeypatch.setattr(context, "task_context", lambda: {"params": params, "run_id": "manual__1", "ti": None})
    with pytest.raises(AirflowFailException, match="output_root") as caught:  # not retried, despite its retries
        dag.get_task("load_fleet").python_callable()
    assert isinstance(caught.value.__cause__, ConfigError) and "lies outside" in caught.value.__cause__.message
    assert not (tmp_path / "elsewhere").exists()


def test_a_run_on_a_store_that_refuses_the_connections_keys_fails_its_first_task_for_good_naming_it(
        dagbag, monkeypatch, seaweedfs, store_prefix):
    from airflow.sdk.exceptions import AirflowFailException

    from fleetgen.airflow import context
    from fleetgen.errors import StoreDenied

    dag = dagbag.dags["sglang_generation"]
    connection = json.loads(os.environ["AIRFLOW_CONN_FLEETGEN_TEST_STORE"])
    connection["password"] = "a-wrong-secret-value"
    monkeypatch.setenv("AIRFLOW_CONN_FLEETGEN_WRONG_KEY", json.dumps(connection))
    monkeypatch.setenv("FLEETGEN_OUTPUT_ROOT", store_prefix)
    params = {**{name: dag.params[name] for name in dag.params}, "output_root": store_prefix,
              "prompts_path": f"{store_prefix}/prompts.jsonl", "storage_conn_id": "fleetgen_wrong_key"}
    monkeypatch.setattr(context, "task_context", lambda: {"params": params, "run_id": "manual__1", "ti": None})
    with pytest.raises(AirflowFailException, match="fleetgen_wrong_key") as caught:  # not retried
        dag.get_task("load_fleet").python_callable()
    error = caught.value.__cause__
    assert isinstance(error, StoreDenied) and error.path.startswith(store_prefix) and error.conn_id == \
        "fleetgen_wrong_key"
    assert "a-wrong-secret-value" not in str(caught.value)


def test_the_trial_round_runs_between_the_first_servers_and_the_rest_of_the_job(dagbag):
    """The trial's shards run on the first round's servers; the decision, then the relaunch round (only when the
    decision moves a server), then the rest of the shards on the servers in use."""
    dag = dagbag.dags["sglang_generation"]

    def upstream(task_id):
        return dag.get_task(task_id).upstream_task_ids

    assert {"servers.wait_ready", "tune.derive_plan"} <= upstream("generate.plan_trial_shards")
    assert upstream("generate.trial_shard") >= {"generate.plan_trial_shards", "servers.wait_ready"}
    assert upstream("trial.decide") >= {"generate.trial_shard", "generate.plan_trial_shards", "servers.wait_ready",
                                        "tune.derive_plan"}
    assert upstream("trial.relaunch_needed") == {"trial.decide", "tune.derive_plan"}
    assert "trial.relaunch_needed" in upstream("relaunch.stop_servers")
    assert "relaunch.stop_servers" in upstream("relaunch.launch_servers")
    assert upstream("relaunch.wait_ready") == {"relaunch.servers_to_wait"}
    assert upstream("relaunch.servers_in_use") == {"servers.wait_ready", "relaunch.wait_ready"}
    assert "relaunch.servers_in_use" in upstream("generate.generate_shard")
    assert "servers.wait_ready" not in upstream("generate.generate_shard")
    assert {"generate.trial_shard", "generate.generate_shard"} <= upstream("validate.validate")
    assert {"generate.trial_shard", "relaunch.servers_in_use", "trial.decide"} <= upstream("validate.report")
    assert {"relaunch.wait_ready", "servers.wait_ready"} <= upstream("release_servers")


def test_the_trial_round_reuses_the_first_rounds_callables_and_runs_when_there_was_no_trial(dagbag):
    from airflow.providers.standard.operators.python import ShortCircuitOperator

    dag = dagbag.dags["sglang_generation"]
    task = dag.get_task
    # the trial's shard task is generate_shard's own, with the trial's time cap (generate_tasks.trial_shard)
    assert inspect.unwrap(task("generate.trial_shard").python_callable).__name__ == "trial_shard"
    assert inspect.unwrap(task("generate.generate_shard").python_callable).__name__ == "generate_shard"
    assert {key: value for key, value in vars(task("generate.trial_shard")).items() if key in (
        "retries", "pool", "max_active_tis_per_dagrun")} == {key: value for key, value in vars(
            task("generate.generate_shard")).items() if key in ("retries", "pool", "max_active_tis_per_dagrun")}
    for first, again in (("servers.stop_servers", "relaunch.stop_servers"),
                         ("servers.launch_servers", "relaunch.launch_servers"),
                         ("servers.servers_to_wait", "relaunch.servers_to_wait")):
        assert inspect.unwrap(task(first).python_callable) is inspect.unwrap(task(again).python_callable), again
    assert type(task("relaunch.wait_ready")) is type(task("servers.wait_ready"))
    assert task("relaunch.stop_servers").partial_kwargs["op_kwargs"].keys() >= {"plans", "trial_plans"}
    # a night without a trial skips the trial's shard task (no shards) and the relaunch round; what follows runs
    for task_id in ("trial.decide", "relaunch.servers_in_use", "validate.validate", "validate.report"):
        assert task(task_id).trigger_rule == "none_failed", task_id
    needed = task("trial.relaunch_needed")
    assert isinstance(needed, ShortCircuitOperator) and needed.ignore_downstream_trigger_rules is False
    assert task("generate.trial_shard").retries == task("generate.generate_shard").retries
    stated = "times at most)"
    assert stated in task("relaunch.wait_ready").doc_md
