"""The whole DAG with dag.test() over real SSH against the simulated node."""

import json
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def _task_states(dag_run):
    return {(ti.task_id, ti.map_index): ti.state for ti in dag_run.get_task_instances()}


def test_every_prompt_gets_exactly_one_completion(dag, sim_env, fleet_file):
    conf = {"fleet_file": str(fleet_file()), "prompts_path": str(sim_env.prompts_path),
            "output_root": str(sim_env.output_root), "shard_size": 50,
            "max_tokens": 4096, "ready_timeout_s": 120,
            "gpu_hour_price": {"currency": "USD", "per_gpu_hour": {sim_env.gpu_name: 6.03}}}
    dag_run = dag.test(run_conf=conf)
    states = _task_states(dag_run)
    assert dag_run.state == "success", states
    run_dir = next(Path(sim_env.output_root).glob("*/report/report.json")).parent.parent
    ids = [json.loads(line)["id"] for path in sorted((run_dir / "completions").glob("*.jsonl"))
           for line in path.read_text().splitlines()]
    expected = [json.loads(line)["id"] for line in sim_env.prompts_path.read_text().splitlines()]
    assert sorted(ids) == sorted(expected) and len(ids) == len(set(ids)) == 120
    # the validated completions as a Parquet dataset, the same rows
    import pyarrow.dataset

    dataset = pyarrow.dataset.dataset(run_dir / "dataset", format="parquet").to_table()
    assert sorted(dataset.column("id").to_pylist()) == sorted(ids)
    report = json.loads((run_dir / "report" / "report.json").read_text())
    assert report["throughput"]["tokens_per_s"] > 0
    # the simulator, launched with the plan, reports exactly the limits the plan expected
    for server in report["tuning"]:
        assert all(server["matches"].values()), server
    # each readiness check recorded its readback: the node's overhead is fleetgen's constant, so no correction
    readbacks = json.loads((run_dir / "calibration.json").read_text())
    assert len(readbacks) == len(report["tuning"])
    assert all(entry["exact"] and entry["correction_bytes"] == 0 and entry["sglang_version"] == "0.5.23"
               for entry in readbacks.values()), readbacks
    shared = json.loads((Path(sim_env.output_root) / "calibration.json").read_text())
    assert {entry["key"] for entry in readbacks.values()} == set(shared)
    # GPU-hours from each server's launch to the report (release_servers runs after it), priced by GPU name
    cost = report["gpu_hours"]
    assert set(cost["per_server"]) == {server["server"] for server in report["tuning"]}, cost
    for name, server in cost["per_server"].items():
        seconds = server["seconds"]
        assert server["gpu_names"] == [sim_env.gpu_name] and server["end_basis"] == "report", (name, server)
        assert server["start"] < server["ready"] < server["end"] and seconds["loading"] > 0, (name, server)
        # requests in flight only on a server that answered some: the first server's workers take a shard's prompts
        # first, and these shards of 50 fit in its in-flight share
        assert (0 < seconds["generating"] < seconds["held"]) is (server["completion_tokens"] > 0), (name, server)
        assert seconds["held"] == pytest.approx(seconds["loading"] + seconds["generating"] + seconds["idle"], abs=0.01)
    assert (cost["unpriced"], cost["not_recorded"], cost["completion_tokens"]) == (
        {}, [], report["totals"]["completion_tokens"])
    # money is rounded to 4 decimals and GPU-hours to 6 (report/gpu_hours.py): a run of seconds costs cents, where
    # half a unit of the money's last decimal is more than a relative 1e-3
    assert cost["cost"] == pytest.approx(6.03 * cost["gpu_hours"]["held"], abs=0.5e-4 + 6.03 * 0.5e-6)
    assert cost["currency"] == "USD"
    assert "## GPU-hours and cost" in (run_dir / "report" / "report.md").read_text()


def test_shards_beyond_the_map_limit_grow_to_fit_and_the_report_compares_runs(dag, sim_env, fleet_file, monkeypatch,
                                                                                caplog):
    # 120 prompts in shards of 10 would map 12 tasks; with max_map_length 3 they become 3 shards of 40.
    monkeypatch.setenv("AIRFLOW__CORE__MAX_MAP_LENGTH", "3")
    conf = {"fleet_file": str(fleet_file()), "prompts_path": str(sim_env.prompts_path),
            "output_root": str(sim_env.output_root), "shard_size": 10, "parallel_shards": 1, "ready_timeout_s": 120}
    dag_run = dag.test(run_conf=conf)
    assert dag_run.state == "success"
    shard_tis = [ti for ti in dag_run.get_task_instances() if ti.task_id == "generate.generate_shard"]
    assert len(shard_tis) == 3
    reports = sorted(Path(sim_env.output_root).glob("*/report/report.json"), key=lambda p: p.stat().st_mtime)
    latest = json.loads(reports[-1].read_text())
    assert latest["totals"]["completions"] == 120
    assert latest["comparison"]["available"] is True
    assert latest["comparison"]["previous_report"] == str(reports[-2])
    # the second run over the same prompts plans from the prompt lengths the servers measured in the first
    assert "Prompt tokens for the plan" in caplog.text and "measured by the servers in the previous run" in caplog.text
    # the workload mode learnt from the first run: its plan record, its stats and its servers' log lines
    observed = re.search(r"Workload mode: previous run \S+, (\d+) server\(s\) observed", caplog.text)
    assert observed and int(observed.group(1)) >= 1, caplog.text[-2000:]
    record = json.loads((reports[-1].parent.parent / "workload_plan.json").read_text())
    assert record and all(entry["max_running_requests"] >= 1 for entry in record.values())


def test_a_nightly_run_keeps_the_servers_on_plan_and_regenerates_nothing_unchanged(dag, sim_env, fleet_file):
    # The servers of the runs above are still up (keep_servers_up); the prompts, model and sampling are the same,
    # and the plan is pinned (the workload mode would step it night after night, and a changed plan relaunches).
    conf = {"fleet_file": str(fleet_file()), "prompts_path": str(sim_env.prompts_path),
            "output_root": str(sim_env.output_root), "shard_size": 60, "ready_timeout_s": 120,
            "reuse_completions": "always", "pin_full_context_plan": True, "relaunch_servers": False}
    first = dag.test(run_conf=conf)
    assert first.state == "success"
    second = dag.test(run_conf=conf)
    assert second.state == "success"
    reports = sorted(Path(sim_env.output_root).glob("*/report/report.json"), key=lambda p: p.stat().st_mtime)
    latest = json.loads(reports[-1].read_text())
    assert latest["servers"]["kept"] == 2 and latest["servers"]["relaunched"] == 0, latest["servers"]
    assert latest["reuse"]["generated"] == 0 and latest["reuse"]["reused"] == 120
    run_dir = reports[-1].parent.parent
    ids = [json.loads(line)["id"] for path in sorted((run_dir / "completions").glob("*.jsonl"))
           for line in path.read_text().splitlines()]
    assert len(ids) == len(set(ids)) == 120 and latest["validation"]["success"]


def test_the_servers_are_launched_with_metrics_and_report_occupancy(dag, sim_env, fleet_file):
    conf = {"fleet_file": str(fleet_file()), "prompts_path": str(sim_env.prompts_path),
            "output_root": str(sim_env.output_root), "shard_size": 120, "ready_timeout_s": 120,
            "reuse_completions": "never", "relaunch_servers": True, "sample_interval_s": 0.5}
    dag_run = dag.test(run_conf=conf)
    assert dag_run.state == "success"
    report_path = sorted(Path(sim_env.output_root).glob("*/report/report.json"), key=lambda p: p.stat().st_mtime)[-1]
    report = json.loads(report_path.read_text())
    assert report["servers"]["relaunched"] == 2 and report["reuse"]["generated"] == 120
    occupancy = report["occupancy"]
    assert set(occupancy["per_server"]) == {row["server"] for row in report["tuning"]}
    assert all(row["cap"] == tuned["effective"]["max_running_requests"]
               for tuned in report["tuning"] for name, row in occupancy["per_server"].items()
               if name == tuned["server"])
