"""Server lifecycle through the DAG over real SSH: fatal lines fail fast, OOM backs off, timeouts explain."""

import json
import os
import time

import pytest

from sglang_sim.node import write_faults

pytestmark = pytest.mark.slow


def _conf(sim_env, fleet_path, **overrides):
    conf = {"fleet_file": str(fleet_path), "prompts_path": str(sim_env.prompts_path),
            "output_root": str(sim_env.output_root), "shard_size": 60, "parallel_shards": 1, "max_tokens": 4096,
            "ready_timeout_s": 60, "keep_servers_up": False}
    conf.update(overrides)
    return conf


def _states(dag_run):
    return {(ti.task_id, ti.map_index): ti.state for ti in dag_run.get_task_instances()}


@pytest.fixture
def task_log(capfd, caplog):
    """Everything the run logged: task output on the terminal and records pytest captured."""

    def read() -> str:
        out, err = capfd.readouterr()
        return out + err + caplog.text

    return read


@pytest.fixture
def faults(sim_env):
    written = []

    def inject(server_index: int, **fault):
        port = sim_env.base_port + server_index
        written.append(write_faults(sim_env.node_dir(0), port, fault))

    yield inject
    for path in written:
        path.unlink(missing_ok=True)


def test_bad_flag_fails_the_wait_within_seconds_with_sglangs_line(dag, sim_env, fleet_file, task_log):
    # A flag this SGLang does not have: its argparse dies at once.
    path = fleet_file(extra_args=["--enable-turbo-mode"])
    started = time.monotonic()
    dag_run = dag.test(run_conf=_conf(sim_env, path))
    elapsed = time.monotonic() - started
    states = _states(dag_run)
    assert dag_run.state == "failed"
    assert states[("servers.wait_ready", 0)] == "failed" and states[("servers.wait_ready", 1)] == "failed"
    log = task_log()
    assert "error: unrecognized arguments: --enable-turbo-mode" in log
    assert "died while starting" in log and "What to check next" in log
    # Seconds from SGLang's fatal line landing in the log to the failed task (a figure, not an assertion).
    log_path = sim_env.node_dir(0) / "home" / "fleetgen" / "logs" / f"sglang-{sim_env.base_port}.log"
    waited = next(ti for ti in dag_run.get_task_instances() if ti.task_id == "servers.wait_ready" and ti.map_index == 0)
    latency = waited.end_date.timestamp() - log_path.stat().st_mtime
    print(f"bad-flag run failed after {elapsed:.1f} s; fatal line to failed wait_ready[0]: {latency:.2f} s")


def test_old_flag_names_are_refused_before_anything_is_touched(dag, sim_env, fleet_file, task_log):
    dag_run = dag.test(run_conf=_conf(sim_env, fleet_file(extra_args=["--cuda-graph-max-bs", "8"])))
    states = _states(dag_run)
    # scan_prompts reads the flags first (a --context-length there bounds the prompts), so it is the one to fail
    assert states[("tune.scan_prompts", -1)] == "failed" and states[("tune.derive_plan", -1)] == "upstream_failed"
    assert ("servers.launch_servers", 0) not in states
    assert "--cuda-graph-max-bs no longer exists in SGLang 0.5.23" in task_log()


def test_persistent_oom_is_replanned_three_times_then_fails_with_the_log(dag, sim_env, fleet_file, faults, task_log):
    faults(1, fail_at_launch="oom")
    dag_run = dag.test(run_conf=_conf(sim_env, fleet_file()))
    states = _states(dag_run)
    assert dag_run.state == "failed"
    assert states[("servers.wait_ready", 0)] == "success"
    assert states[("servers.wait_ready", 1)] == "failed"
    log = task_log()
    assert log.count("Relaunching node0:") == 3
    assert "Not enough memory. Please try to increase --mem-fraction-static" in log
    assert "after 3 relaunch(es)" in log


def test_server_that_never_becomes_ready_times_out_with_what_the_log_said(dag, sim_env, fleet_file, faults, task_log):
    faults(0, slow_start_seconds=600)
    dag_run = dag.test(run_conf=_conf(sim_env, fleet_file(), ready_timeout_s=10))
    states = _states(dag_run)
    assert states[("servers.wait_ready", 0)] == "failed" and dag_run.state == "failed"
    log = task_log()
    assert "not ready after" in log and "the log last said" in log


def test_unreachable_node_is_named(dag, sim_env, tmp_path, task_log):
    import yaml

    fleet = yaml.safe_load(os.environ["AIRFLOW_VAR_FLEETGEN_FLEET"])
    fleet["nodes"][0]["gpus"] = [0, 1]
    fleet["nodes"].append({"name": "gpu-node-9", "ssh_conn_id": "fleetgen_node9", "address": "127.0.0.1",
                           "gpus": [0], "base_port": sim_env.base_port + 10})
    path = tmp_path / "fleet.json"
    path.write_text(json.dumps(fleet))
    node0 = json.loads(os.environ["AIRFLOW_CONN_FLEETGEN_NODE0"])
    from sglang_sim.sshd import free_port

    os.environ["AIRFLOW_CONN_FLEETGEN_NODE9"] = json.dumps({**node0, "port": free_port()})  # nothing listens
    try:
        dag_run = dag.test(run_conf=_conf(sim_env, path, dry_run=True))
    finally:
        del os.environ["AIRFLOW_CONN_FLEETGEN_NODE9"]
    states = _states(dag_run)
    assert states[("tune.probe_gpus", 0)] == "success" and states[("tune.probe_gpus", 1)] == "failed"
    log = task_log()
    assert "[host gpu-node-9] cannot reach the node via connection 'fleetgen_node9'" in log


def test_foreign_process_gets_its_own_plan_and_survives_the_stop(dag, sim_env, fleet_file, task_log):
    import subprocess
    import sys

    from sglang_sim.node import SimNode

    node = SimNode.load(sim_env.node_dir(0))
    holder = subprocess.Popen([sys.executable, "-m", "sglang_sim.cli", "hold", "--gpu", "0", "--mib", "40960",
                               "--name", "someone-elses-job", "--node", str(node.path)],
                              env={**os.environ, **node.env()}, stdout=subprocess.PIPE, text=True)
    try:
        assert "holding 40960 MiB" in holder.stdout.readline()
        dag_run = dag.test(run_conf=_conf(sim_env, fleet_file()))
        assert dag_run.state == "success"
        assert holder.poll() is None, "the stop killed a process that is not ours"
        log = task_log()
        assert "someone-elses-job" in log  # the probe names who holds memory
        run_dir = max(sim_env.output_root.glob("*/report/report.json"), key=lambda p: p.stat().st_mtime).parent.parent
        tuning = {t["gpu_ids"][0]: t for t in json.loads((run_dir / "report" / "report.json").read_text())["tuning"]}
        # GPU 0 has 40 GiB less: its own, smaller plan, which the server then honours exactly.
        assert tuning[0]["expected"]["max_running_requests"] < tuning[1]["expected"]["max_running_requests"]
        assert all(all(t["matches"].values()) for t in tuning.values())
    finally:
        holder.terminate()
        holder.wait(timeout=10)
