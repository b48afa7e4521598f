"""The whole DAG with its prompts and its outputs on an object store (SeaweedFS's S3 gateway) and no folder shared
between tasks: every task works on a private copy of the run (airflow/run_storage.py), and every prompt still ends
with exactly one completion."""

import json

import pytest

from fleetgen.generate.commit_log import committed_lines, committed_shards
from fleetgen.outputs import run_folder_name
from fleetgen.storage.location import parse_location
from fleetgen.storage.objects import ObjectStore
STORE_CONN_ID = "fleetgen_test_store"  # tests/conftest.py: the connection the seaweedfs fixture defines

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def ssh_server() -> str:
    """One SSH server is enough: what is tested is where the run's files live (test_dag_end_to_end runs both)."""
    return "embedded"


def _rows(data: bytes) -> list[dict]:
    return [json.loads(line) for line in data.splitlines() if line.strip()]


def test_a_run_on_the_store_writes_nothing_to_the_workers_disk_and_completes_every_prompt_once_and_the_next_reuses_it(
        dag, sim_env, fleet_file, seaweedfs, store_prefix, monkeypatch, tmp_path):
    root = parse_location(store_prefix, parameter="output_root")
    store = ObjectStore.connect(root, conn_id=STORE_CONN_ID, parameter="output_root")
    prompts = sim_env.prompts_path.read_bytes()
    store.put("inputs/prompts.jsonl", prompts)
    scratch = tmp_path / "scratch"
    monkeypatch.setenv("FLEETGEN_SCRATCH_DIR", str(scratch))
    monkeypatch.setenv("FLEETGEN_ALLOW_OUTPUT_ROOTS", f"{sim_env.output_root}:{store_prefix}")
    local_before = sorted(path.name for path in sim_env.output_root.iterdir()) if sim_env.output_root.exists() else []

    conf = {"fleet_file": str(fleet_file()), "prompts_path": f"{store_prefix}/inputs/prompts.jsonl",
            "output_root": f"{store_prefix}/runs", "storage_conn_id": STORE_CONN_ID, "shard_size": 50,
            "max_tokens": 4096, "ready_timeout_s": 120, "reuse_completions": "never"}
    dag_run = dag.test(run_conf=conf)
    states = {(ti.task_id, ti.map_index): ti.state for ti in dag_run.get_task_instances()}
    assert dag_run.state == "success", states

    run = store.below("runs", run_folder_name(dag_run.run_id))
    expected = sorted(json.loads(line)["id"] for line in prompts.splitlines())
    ids = [row["id"] for shard in committed_shards(run)
           for row in _rows(b"".join(committed_lines(run, shard, "completions")))]
    assert sorted(ids) == expected and len(ids) == len(set(ids)) == 120
    # what the readers wrote back: the validation, the report, the Batch API files and the Parquet dataset
    summary = json.loads(run.get("validation/summary.json"))
    assert summary["rows"] == 120 and summary["out_dir"] == run.url()  # where people find it, not a task's copy
    assert summary["data_docs"] == run.url("validation/data_docs/index.html")
    report = json.loads(run.get("report/report.json"))
    assert report["out_dir"] == run.url()
    assert report["totals"]["completions"] == 120 and report["throughput"]["tokens_per_s"] > 0
    assert sorted(line["custom_id"] for line in _rows(run.get("batch/output.jsonl"))) == expected
    import pyarrow.dataset
    import s3fs

    names = [info.name for info in run.list("dataset/")]
    assert names and all(name.endswith(".parquet") for name in names)
    # the dataset as a downstream job reads it: straight from the store, through fsspec's S3 filesystem
    filesystem = s3fs.S3FileSystem(key=seaweedfs.access_key, secret=seaweedfs.secret_key,
                                   endpoint_url=seaweedfs.endpoint_url)
    dataset = pyarrow.dataset.dataset(run.url("dataset").removeprefix("s3://"), format="parquet",
                                      filesystem=filesystem).to_table()
    assert sorted(dataset.column("id").to_pylist()) == expected
    # the readiness checks' readbacks, merged from side-by-side tasks into one object, and the output root's own
    assert len(json.loads(run.get("calibration.json"))) == len(report["tuning"])
    assert json.loads(store.get("runs/calibration.json"))
    assert json.loads(run.get("prompts.json"))["path"] == f"{store_prefix}/inputs/prompts.jsonl"
    # the run left nothing on the workers' disk: no run folder in the local root, no scratch copy behind
    after = sorted(path.name for path in sim_env.output_root.iterdir()) if sim_env.output_root.exists() else []
    assert after == local_before
    assert not any(scratch.iterdir())

    # the next night on the store reuses every unchanged completion of this one, found and read on the store
    again = dag.test(run_conf={**conf, "reuse_completions": "always"})
    assert again.state == "success", {(ti.task_id, ti.map_index): ti.state for ti in again.get_task_instances()}
    second = store.below("runs", run_folder_name(again.run_id))
    copied = [json.loads(line) for shard in committed_shards(second) for line in committed_lines(second, shard,
                                                                                                 "completions")]
    assert sorted(row["id"] for row in copied) == expected
    assert {row["reused_from"] for row in copied} == {run_folder_name(dag_run.run_id)}
    second_report = json.loads(second.get("report/report.json"))
    assert second_report["reuse"]["reused"] == 120
    # and learns from it as on disk: the report compares with it, the plan steps from its measured demand
    assert second_report["comparison"]["available"], second_report["comparison"]
    assert second_report["comparison"]["previous_run_id"] == dag_run.run_id
    first_caps = {row["server"]: row["workload"]["cap"] for row in report["tuning"]}
    steps = {row["server"]: row["workload"] for row in second_report["tuning"]}
    assert {server: step["previous_cap"] for server, step in steps.items()} == first_caps, steps
    assert not any(step["reason"].startswith("no workload statistics") for step in steps.values()), steps
