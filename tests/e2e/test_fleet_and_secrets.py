"""Two simulated nodes behind two SSH endpoints; the API key never reaches a log, an XCom or an output file."""

import json
import os
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.slow
PROJECT_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory, airflow_db):
    from fleetgen.airflow.apply_settings import apply_to_db
    from devstack.demo import SimEnvironment
    from fleetgen.airflow.settings_file import load_settings

    environment = SimEnvironment(root=tmp_path_factory.mktemp("two-nodes"), nodes=2, gpus_per_node=1, prompts=240,
                                 sim={"time_scale": 400.0, "load_seconds": 3.0}).prepare().start()
    settings = load_settings(PROJECT_ROOT / "airflow_settings.yaml", environment.settings_env())
    env = settings.environment()
    node0 = json.loads(env["AIRFLOW_CONN_FLEETGEN_NODE0"])
    env["AIRFLOW_CONN_FLEETGEN_NODE1"] = json.dumps({**node0, "port": environment.ssh_ports[1]})
    env["FLEETGEN_OUTPUT_ROOT"] = str(environment.output_root)  # the deployment's, where the runs write
    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    apply_to_db(settings)
    fleet = yaml.safe_load(env["AIRFLOW_VAR_FLEETGEN_FLEET"])
    fleet["nodes"] = [{"name": f"node{i}", "ssh_conn_id": f"fleetgen_node{i}", "address": "127.0.0.1", "gpus": [0],
                       "base_port": environment.node_base_port(i)} for i in range(2)]
    fleet_path = environment.root / "fleet.json"
    fleet_path.write_text(json.dumps(fleet))
    yield environment, fleet_path
    environment.stop()
    for key, value in saved.items():
        os.environ.pop(key, None) if value is None else os.environ.__setitem__(key, value)


def test_two_nodes_generate_everything_and_the_key_stays_secret(dag, two_nodes, capfd, caplog):
    environment, fleet_path = two_nodes
    api_key = (environment.root / "api_key").read_text().strip()
    conf = {"fleet_file": str(fleet_path), "prompts_path": str(environment.prompts_path),
            "output_root": str(environment.output_root), "shard_size": 240, "parallel_shards": 1,
            "keep_servers_up": False}
    dag_run = dag.test(run_conf=conf)
    assert dag_run.state == "success"
    states = {(ti.task_id, ti.map_index): ti.state for ti in dag_run.get_task_instances()}
    assert states[("tune.probe_gpus", 0)] == states[("tune.probe_gpus", 1)] == "success"
    assert states[("servers.wait_ready", 0)] == states[("servers.wait_ready", 1)] == "success"

    run_dir = next(environment.output_root.glob("*/report/report.json")).parent.parent
    stats = [json.loads(line) for path in (run_dir / "stats").glob("*.jsonl") for line in path.read_text().splitlines()]
    assert len(stats) == 240 and {row["server"].split(":")[0] for row in stats} == {"node0", "node1"}

    # The servers ran with the key (the launch read it from stdin; requests carried it, or they would have
    # been refused with 401 and the shard stopped) and it appears nowhere: not in the task logs, not in
    # XCom, not in any output file.
    out, err = capfd.readouterr()
    assert api_key not in out + err + caplog.text
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        rows = session.query(XComModel).filter(XComModel.run_id == dag_run.run_id).all()
        assert rows and all(api_key not in json.dumps(row.value, default=str) for row in rows)
    for path in run_dir.rglob("*"):
        if path.is_file() and path.stat().st_size < 50_000_000:
            assert api_key.encode() not in path.read_bytes(), path
    # keep_servers_up=False: the servers were stopped at the end
    assert not list((environment.node_dir(0) / "home" / "fleetgen" / "run").glob("*.pid"))

