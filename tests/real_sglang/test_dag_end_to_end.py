"""The whole DAG against real SGLang 0.5.23 servers: two dense servers on CPU behind a simulated node's SSH.

The node is the simulator's (its fake ``nvidia-smi`` reports two B200s, its SSH endpoint runs the commands);
the servers are ``sglang.launch_server`` processes, launched by the DAG's own ``launch_servers`` task from the
fleet description, as a user with an unusual node would describe it: ``server.python`` and ``server.module``
name the SGLang venv, ``server.extra_args`` carry the CPU flags and a pinned ``--max-total-tokens``,
``server.env`` the CPU engine and the ``sgl_kernel`` stand-in (docs/real-sglang.md).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.real_sglang import server as real

PROJECT_ROOT = Path(__file__).resolve().parents[2]
PROMPTS = 24
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def real_env(tmp_path_factory, tiny_models):
    """Two simulated GPUs on one node behind the embedded SSH server, Airflow's settings applied, and a fleet
    file whose servers are real SGLang."""
    from devstack.demo import SimEnvironment

    if not (Path(os.environ["AIRFLOW_HOME"]) / "airflow.db").exists():
        subprocess.run([str(Path(os.sys.executable).parent / "airflow"), "db", "migrate"], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    environment = SimEnvironment(root=tmp_path_factory.mktemp("real-fleet"), gpus_per_node=2, prompts=1,
                                 sim={"load_seconds": 0.0}).prepare().start()
    real.write_short_prompts(environment.prompts_path, PROMPTS)
    environment.real_fleet_path = environment.root / "fleet-real.json"
    environment.real_fleet_path.write_text(json.dumps(real.real_fleet(environment.fleet(), tiny_models["dense"])))
    try:
        with environment.airflow_settings_applied():
            yield environment
    finally:
        real.stop_fleet_servers(environment)
        environment.stop()


@pytest.fixture(scope="module")
def dag():
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(PROJECT_ROOT / "dags"))
    assert bag.import_errors == {}
    return bag.dags["sglang_generation"]


def _conf(env, **overrides) -> dict:
    return {"fleet_file": str(env.real_fleet_path), "prompts_path": str(env.prompts_path),
            "output_root": str(env.output_root), "shard_size": 12, "max_tokens": MAX_TOKENS,
            "ready_timeout_s": 300, "sample_interval_s": 0.5, **real.CONTENT_THRESHOLDS, **overrides}


def _latest_report(env) -> tuple[dict, Path]:
    reports = sorted(Path(env.output_root).glob("*/report/report.json"), key=lambda p: p.stat().st_mtime)
    return json.loads(reports[-1].read_text()), reports[-1].parent.parent


def _session_processes(pid: int) -> list[str]:
    """Processes still in the session a launch started (launch_command runs the server under setsid)."""
    ps = subprocess.run(["ps", "-eo", "sid=,pid=,args="], capture_output=True, text=True, check=True).stdout
    return [line for line in ps.splitlines() if line.split(None, 1)[0] == str(pid)]


def test_the_dag_runs_end_to_end_against_two_real_sglang_servers(dag, real_env):
    dag_run = dag.test(run_conf=_conf(real_env, relaunch_servers=True, reuse_completions="never"))
    states = {(ti.task_id, ti.map_index): ti.state for ti in dag_run.get_task_instances()}
    assert dag_run.state == "success", states
    report, run_dir = _latest_report(real_env)
    ids = sorted(json.loads(line)["id"] for path in (run_dir / "completions").glob("*.jsonl")
                 for line in path.read_text().splitlines())
    assert ids == [f"r{index:04d}" for index in range(PROMPTS)]
    assert report["servers"]["relaunched"] == 2 and report["simulated"] is False
    # the readback: SGLang's own /server_info gives exactly the caps the plan expected, KV tokens as pinned
    for row in report["tuning"]:
        assert row["version"] == real.VERSION
        assert row["expected"]["max_total_num_tokens"] == row["effective"]["max_total_num_tokens"] == real.KV_TOKENS
        assert row["matches"]["max_running_requests"] is True, row
        # the CPU server's memory line was read, and is reported as what it is
        assert "--device cpu" in row["readback"] and "MiB free before the weights" in row["readback"], row
    # usage counts from the real server's responses
    assert report["totals"]["prompt_tokens"] > 0 and report["totals"]["completion_tokens"] > 0
    # /metrics was sampled on both servers: the occupancy section has each, with the real cap
    occupancy = report["occupancy"]["per_server"]
    assert set(occupancy) == {row["server"] for row in report["tuning"]}
    assert all(occupancy[row["server"]]["cap"] == row["effective"]["max_running_requests"] for row in report["tuning"])


def test_a_second_run_keeps_both_real_servers_and_release_drains_them(dag, real_env):
    pid_files = sorted((real_env.node_dir(0) / "home" / "fleetgen" / "run").glob("sglang-*.pid"))
    pids = [int(path.read_text()) for path in pid_files]
    assert len(pids) == 2
    # The plan is pinned: the workload mode would step the cap of a server the first run observed, and a
    # changed plan relaunches (the nightly test of the simulated fleet pins it for the same reason).
    dag_run = dag.test(run_conf=_conf(real_env, relaunch_servers=False, reuse_completions="never",
                                      keep_servers_up=False, pin_full_context_plan=True))
    assert dag_run.state == "success"
    report, run_dir = _latest_report(real_env)
    assert report["servers"]["kept"] == 2 and report["servers"]["relaunched"] == 0, report["servers"]
    # release_servers stopped them with SIGTERM: SGLang drained and exited, leaving nothing in its session
    logs = sorted((real_env.node_dir(0) / "home" / "fleetgen" / "logs").glob("sglang-*.log"))
    assert len(logs) == 2
    for log in logs:
        text = log.read_text(errors="replace")
        assert "SIGTERM received" in text and "Gracefully exiting" in text, text[-3000:]
    for pid in pids:
        assert _session_processes(pid) == [], f"server {pid} left processes behind"
