"""One node of two unreachable over SSH: the run stops at the probe, unless skip_unreachable_nodes leaves that node
out; then the run generates everything on the other node, touches the unreachable one nowhere, and the report says
which node was left out and why."""

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


@pytest.fixture
def fleet_with_a_gone_node(sim_env, fleet_file, monkeypatch):
    """The committed fleet plus node1, whose connection points at a loopback port nothing listens on."""
    from sglang_sim.sshd import ensure_keys, free_port

    monkeypatch.setenv("AIRFLOW_CONN_FLEETGEN_NODE1", json.dumps({
        "conn_type": "ssh", "host": "127.0.0.1", "port": free_port(), "login": sim_env.ssh_user,
        "extra": {"key_file": str(sim_env.key_dir / "id_ed25519"), "look_for_keys": False,
                  "host_key": ensure_keys(sim_env.key_dir).host_public_key}}))
    path = fleet_file()
    fleet = json.loads(path.read_text())
    fleet["nodes"].append({"name": "node1", "ssh_conn_id": "fleetgen_node1", "address": "127.0.0.1", "gpus": [0],
                           "base_port": fleet["nodes"][0]["base_port"] + 10})
    path.write_text(json.dumps(fleet))
    return path


def _states(dag_run) -> dict:
    return {(ti.task_id, ti.map_index): ti.state for ti in dag_run.get_task_instances()}


def test_an_unreachable_node_stops_the_run_at_the_probe_by_default(dag, sim_env, fleet_with_a_gone_node):
    conf = {"fleet_file": str(fleet_with_a_gone_node), "prompts_path": str(sim_env.prompts_path),
            "output_root": str(sim_env.output_root / "default"), "dry_run": True,
            # said, not left to the default: dag.test in one process keeps an earlier run's conf in the DAG's params
            "skip_unreachable_nodes": False}
    states = _states(dag.test(run_conf=conf))
    assert states[("tune.probe_gpus", 0)] == "success" and states[("tune.probe_gpus", 1)] == "failed", states
    assert states[("tune.derive_plan", -1)] == "upstream_failed", states


def test_with_skip_unreachable_nodes_the_run_goes_on_on_the_reachable_node_and_says_so(dag, sim_env,
                                                                                        fleet_with_a_gone_node):
    root = sim_env.output_root / "skip"
    conf = {"fleet_file": str(fleet_with_a_gone_node), "prompts_path": str(sim_env.prompts_path),
            "output_root": str(root), "shard_size": 60, "ready_timeout_s": 120, "skip_unreachable_nodes": True,
            "keep_servers_up": False, "dry_run": False}
    dag_run = dag.test(run_conf=conf)
    states = _states(dag_run)
    assert dag_run.state == "success", states
    # node1 is touched by no server task: each says it was left out and succeeds
    per_node = ("tune.probe_gpus", "servers.stop_servers", "servers.launch_servers", "release_servers")
    assert {task: states[(task, 1)] for task in per_node} == dict.fromkeys(per_node, "success"), states
    assert len([key for key in states if key[0] == "servers.wait_ready"]) == 2  # node0's two servers only
    [report_path] = Path(root).glob("*/report/report.json")
    report = json.loads(report_path.read_text())
    [left_out] = report["plan_notes"]["nodes_left_out"]
    assert left_out["node"] == "node1" and "connection 'fleetgen_node1'" in left_out["reason"], left_out
    assert {row["server"].split(":")[0] for row in report["tuning"]} == {"node0"}
    ids = [json.loads(line)["id"] for path in sorted((report_path.parent.parent / "completions").glob("*.jsonl"))
           for line in path.read_text().splitlines()]
    assert len(ids) == len(set(ids)) == 120
    assert "| node1 | " in (report_path.parent / "report.md").read_text()
