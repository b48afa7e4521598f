"""The whole DAG with dag.test() over real SSH against the simulated node."""

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def _task_states(dag_run):
    return {(ti.task_id, ti.map_index): ti.state for ti in dag_run.get_task_instances()}


def test_every_prompt_gets_exactly_one_completion(dag, sim_env, fleet_file):
    conf = {"fleet_file": str(fleet_file()), "prompts_path": str(sim_env.prompts_path),
            "output_root": str(sim_env.output_root), "shard_size": 50, "parallel_shards": 1,
            "max_tokens": 4096, "ready_timeout_s": 120}
    dag_run = dag.test(run_conf=conf)
    states = _task_states(dag_run)
    assert dag_run.state == "success", states
    run_dir = next(Path(sim_env.output_root).glob("*/report/report.json")).parent.parent
    ids = [json.loads(line)["id"] for path in sorted((run_dir / "completions").glob("*.jsonl"))
           for line in path.read_text().splitlines()]
    expected = [json.loads(line)["id"] for line in sim_env.prompts_path.read_text().splitlines()]
    assert sorted(ids) == sorted(expected) and len(ids) == len(set(ids)) == 120
    report = json.loads((run_dir / "report" / "report.json").read_text())
    assert report["throughput"]["tokens_per_s"] > 0
    # the simulator, launched with the plan, reports exactly the limits the plan expected
    for server in report["tuning"]:
        assert all(server["matches"].values()), server
