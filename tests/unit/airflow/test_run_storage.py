"""Where a task finds its run (airflow/run_storage.py): unchanged on local disk; on an object store, a private copy
that holds what the task declared it reads and goes back when the task ends, failed or not."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from fleetgen.airflow.context import run_context
from fleetgen.airflow.run_config import RunConfig
from fleetgen.airflow.run_storage import (current_store_run, fetch_prompts, planned_on_store, run_url, scan_as_stored,
                                          scan_here, shard_prompts, task_run)
from fleetgen.errors import ConfigError
from fleetgen.generate.commit_log import commit_name, part_name, plan_name
from fleetgen.outputs import RunLayout

STORE_CONN_ID = "fleetgen_test_store"  # tests/conftest.py: the connection the seaweedfs fixture defines
RUN_ID = "manual__night"
DEFAULTS = {spec.name: spec.default_value() for spec in RunConfig.settings()}
PROMPTS = b"".join(json.dumps({"id": f"p{n}", "prompt": f"say {n}"}).encode() + b"\n" for n in range(20))


@pytest.fixture
def on_store(object_store, store_prefix, monkeypatch, tmp_path):
    """Params of a run whose prompts and outputs are on the store, allowed by the deployment."""
    object_store.put("in/prompts.jsonl", PROMPTS)
    monkeypatch.setenv("FLEETGEN_OUTPUT_ROOT", f"{store_prefix}/runs")
    monkeypatch.setenv("FLEETGEN_SCRATCH_DIR", str(tmp_path / "scratch"))
    return {**DEFAULTS, "fleet_file": "", "prompts_path": f"{store_prefix}/in/prompts.jsonl",
            "output_root": f"{store_prefix}/runs", "storage_conn_id": STORE_CONN_ID}


@pytest.fixture
def in_task(monkeypatch):
    """run_context's Airflow context, for params and the run id."""
    def enter(params):
        monkeypatch.setattr("fleetgen.airflow.context.task_context", lambda: {"params": params, "run_id": RUN_ID})
    return enter


def test_a_run_on_local_disk_is_left_as_it_is(tmp_path, in_task, monkeypatch):
    monkeypatch.setenv("FLEETGEN_OUTPUT_ROOT", str(tmp_path))
    params = {**DEFAULTS, "fleet_file": "", "prompts_path": str(tmp_path / "p.jsonl"), "output_root": str(tmp_path)}
    in_task(params)
    with task_run(params, RUN_ID, reads=["prompts", "stats"]) as run:
        assert run is None and current_store_run() is None
        _, config, layout = run_context()
        assert layout.root == tmp_path / RUN_ID and config.inputs.prompts_path == tmp_path / "p.jsonl"
        assert run_url(layout) == str(tmp_path / RUN_ID) and run_url(layout, "dataset") == str(tmp_path / RUN_ID /
                                                                                               "dataset")
        assert scan_as_stored({"path": "x"}) == {"path": "x"} and shard_prompts({"start": 0}) == {"start": 0}


def test_a_task_on_the_store_works_on_a_copy_holding_what_it_reads_and_sends_back_what_it_wrote(
        on_store, in_task, object_store, tmp_path):
    run_store = object_store.below("runs", RUN_ID)
    run_store.put("plan-notes.json", b"{}")
    run_store.put(plan_name(0), b"{}")
    run_store.put(part_name(0, 1, "t", "stats"), b'{"id": "p1"}\n')
    run_store.put(commit_name(0, 1), json.dumps({"seq": 1, "token": "t", "kind": "open", "parts": {
        "stats": {"name": part_name(0, 1, "t", "stats"), "lines": 1, "bytes": 13}}}).encode())
    in_task(on_store)
    with task_run(on_store, RUN_ID, reads=["prompts", "stats"]) as run:
        _, config, layout = run_context()
        assert run is current_store_run() and layout.root == run.mirror.run_root
        assert str(layout.root).startswith(str(tmp_path / "scratch"))
        assert (layout.root / "plan-notes.json").read_bytes() == b"{}"
        assert config.inputs.prompts_path.read_bytes() == PROMPTS
        assert layout.shard_file("stats", 0).read_bytes() == b'{"id": "p1"}\n'
        assert run_url(layout, "dataset") == run_store.url("dataset")
        assert scan_as_stored({"path": str(config.inputs.prompts_path)})["path"] == object_store.url(
            "in/prompts.jsonl")
        assert scan_here({"path": object_store.url("in/prompts.jsonl")}, config.inputs.prompts_path) == {
            "path": str(config.inputs.prompts_path)}
        layout.report_dir.mkdir()
        layout.report_json.write_text('{"done": true}')
    assert json.loads(run_store.get("report/report.json")) == {"done": True}
    assert run_store.head("stats/shard-00000.jsonl") is None  # read from the commit log, never sent back
    assert os.listdir(tmp_path / "scratch") == []  # the copy is gone


def test_what_a_failed_task_wrote_goes_back_and_its_error_stands(on_store, in_task, object_store):
    in_task(on_store)
    with pytest.raises(RuntimeError, match="the servers went away"):
        with task_run(on_store, RUN_ID):
            _, _, layout = run_context()
            layout.root.joinpath("server-times").mkdir()
            layout.root.joinpath("server-times", "n_1.jsonl").write_text('{"event": "launched"}\n')
            raise RuntimeError("the servers went away")
    assert object_store.get(f"runs/{RUN_ID}/server-times/n_1.jsonl") == b'{"event": "launched"}\n'


def test_an_output_root_outside_the_deployments_prefixes_is_refused_before_anything_is_read(on_store, store_prefix):
    params = {**on_store, "output_root": f"{store_prefix}/runs-elsewhere"}
    with pytest.raises(ConfigError, match="lies outside the object store prefixes runs may write in") as caught:
        with task_run(params, RUN_ID):
            pass
    assert f"{store_prefix}/runs" in caught.value.message and "FLEETGEN_ALLOW_OUTPUT_ROOTS" in caught.value.hint


def test_a_shard_reads_its_range_and_the_blocks_it_checks_from_a_sparse_copy(on_store, in_task, object_store):
    in_task(on_store)
    line = len(PROMPTS) // 20
    shard = {"shard_id": 3, "start": 5 * line, "end": 8 * line, "count": 3, "blocks": [[4, 4 * line, 10 * line, "d"]]}
    with task_run(on_store, RUN_ID):
        stored = planned_on_store({**shard, "input_path": "/elsewhere/copy.jsonl"})
        assert stored["input_path"] == object_store.url("in/prompts.jsonl")
        local = shard_prompts(stored)
        assert local["source"] == object_store.url("in/prompts.jsonl") and local["input_path"] != stored["input_path"]
        data = open(local["input_path"], "rb").read()
        assert len(data) == len(PROMPTS)  # the byte offsets of the scan hold
        assert data[4 * line:10 * line] == PROMPTS[4 * line:10 * line]
        assert data[:4 * line] == bytes(4 * line) and data[10 * line:] == bytes(len(PROMPTS) - 10 * line)


def test_a_copy_of_the_prompts_has_the_objects_time_on_every_worker(object_store, tmp_path):
    object_store.put("p.jsonl", PROMPTS)
    modified = object_store.head("p.jsonl").modified
    whole = fetch_prompts(object_store, "p.jsonl", tmp_path / "a" / "deeper" / "p.jsonl")
    part = fetch_prompts(object_store, "p.jsonl", tmp_path / "b" / "p.jsonl", start=10, end=20)
    assert whole.stat().st_atime_ns == round(modified) * 10**9  # before a read sets it
    assert whole.read_bytes() == PROMPTS and part.stat().st_size == len(PROMPTS)
    assert whole.stat().st_mtime_ns == part.stat().st_mtime_ns == round(modified) * 10**9


def test_a_missing_prompts_object_names_its_url_and_the_parameters(object_store, tmp_path):
    with pytest.raises(ConfigError, match="not found") as caught:
        fetch_prompts(object_store, "nowhere.jsonl", tmp_path / "p.jsonl")
    assert caught.value.path == object_store.url("nowhere.jsonl")
    assert "prompts_path" in caught.value.hint and "storage_conn_id" in caught.value.hint


def test_the_runs_layout_on_a_store_is_only_reached_through_its_copy(on_store):
    with pytest.raises(ConfigError, match="is on an object store"):
        RunConfig.from_params(on_store).layout(RUN_ID)
    assert RunLayout  # the local layout is the copy's (run_context)


def test_what_a_task_did_not_declare_is_not_fetched_and_the_prompts_stay_a_url(on_store, in_task, object_store):
    from fleetgen.storage.location import ObjectLocation

    in_task(on_store)
    with task_run(on_store, RUN_ID) as run:
        _, config, layout = run_context()
        assert isinstance(config.inputs.prompts_path, ObjectLocation) and run.prompts_file is None
        assert config.inputs.output_root == run.mirror.scratch and not layout.kind_dir("stats").exists()


def test_a_prompts_copy_is_named_after_the_objects_key(on_store, in_task, object_store, store_prefix):
    object_store.put("in/Night 2 (all).JSONL", PROMPTS)
    params = {**on_store, "prompts_path": f"{store_prefix}/in/Night 2 (all).JSONL"}
    in_task(params)
    with task_run(params, RUN_ID, reads=["prompts"]):
        path = run_context()[1].inputs.prompts_path
        assert path.name == "Night_2_all_.JSONL" and path.read_bytes() == PROMPTS
        shard = shard_prompts({"shard_id": 0, "start": 0, "end": 10})
        assert shard["input_path"].endswith("/shard-0-Night_2_all_.JSONL")


def test_a_prompts_key_without_a_name_is_copied_as_prompts_jsonl(object_store, tmp_path):
    from fleetgen.airflow.run_storage import _base_name

    assert _base_name("in/") == "prompts.jsonl" and _base_name("a/b/c.jsonl") == "c.jsonl"


def test_the_scratch_folder_is_made_where_the_deployment_says(on_store, in_task, monkeypatch, tmp_path):
    monkeypatch.setenv("FLEETGEN_SCRATCH_DIR", str(tmp_path / "deep" / "er"))
    in_task(on_store)
    with task_run(on_store, RUN_ID) as run:
        assert run.mirror.scratch.parent.parent == tmp_path / "deep" / "er"
    with task_run(on_store, RUN_ID) as run:  # again: the folder exists
        assert run.mirror.scratch.is_dir()


def _ended_pid() -> int:
    """The id of a process that ran and is gone."""
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_task_on_the_store_removes_the_copies_of_tasks_killed_on_its_worker_and_no_other(
        on_store, in_task, tmp_path, caplog):
    from fleetgen.airflow.run_storage import scratch_prefix

    import subprocess
    import sys

    scratch = tmp_path / "scratch"
    killed = scratch / (scratch_prefix(_ended_pid()) + "x1")
    killed_too = scratch / (scratch_prefix(_ended_pid()) + "x0")
    # a live process of this host, this test's own: whatever a wrong sweep signals, nothing else is hit
    # (it dies of any signal a wrong check sends, even where its parent ignores SIGHUP, as under nohup)
    alive = subprocess.Popen([sys.executable, "-c", "import signal, time\nfor number in (signal.SIGHUP, signal.SIGINT, "
                              "signal.SIGTERM):\n    signal.signal(number, signal.SIG_DFL)\ntime.sleep(120)"])
    running = scratch / (scratch_prefix(alive.pid) + "x2")
    other_host = scratch / (scratch_prefix(_ended_pid()).replace("fleetgen-run-", "fleetgen-run-elsewhere") + "x3")
    not_ours = scratch / "fleetgen-runner-notes"
    for folder in (killed, killed_too, running, other_host, not_ours):
        (folder / "root").mkdir(parents=True)
    in_task(on_store)
    try:
        with caplog.at_level("INFO", logger="fleetgen.airflow.run_storage"):
            with task_run(on_store, RUN_ID) as run:
                assert run.mirror.scratch.parent.name.startswith(scratch_prefix(os.getpid()))
                assert sorted(entry.name for entry in scratch.iterdir()) == sorted(
                    [run.mirror.scratch.parent.name, running.name, other_host.name, not_ours.name])
        with pytest.raises(subprocess.TimeoutExpired):  # looked at, not signalled
            alive.wait(timeout=1)
        swept = ", ".join(sorted([killed.name, killed_too.name]))
        assert (f"removed the copies of 2 task(s) on {scratch} that ended without removing them (killed): "
                f"{swept}") in caplog.messages
    finally:
        alive.kill()
        alive.wait()


def test_a_missing_prompts_bucket_names_the_parameter(on_store, in_task):
    from fleetgen.errors import StoreBucketMissing

    params = {**on_store, "prompts_path": "s3://no-such-bucket-for-prompts/p.jsonl"}
    in_task(params)
    with pytest.raises(StoreBucketMissing) as caught:
        with task_run(params, RUN_ID, reads=["prompts"]):
            pass
    assert "the DAG parameter prompts_path (the URL)" in caught.value.hint


def test_the_reads_a_task_declares_are_what_its_copy_holds(on_store, in_task, object_store):
    from fleetgen.airflow.run_storage import on_run_storage

    run_store = object_store.below("runs", RUN_ID)
    run_store.put(plan_name(0), b"{}")
    run_store.put(part_name(0, 1, "t", "errors"), b'{"id": "p1"}\n')
    run_store.put(commit_name(0, 1), json.dumps({"seq": 1, "token": "t", "kind": "open", "parts": {
        "errors": {"name": part_name(0, 1, "t", "errors"), "lines": 1, "bytes": 13}}}).encode())
    in_task(on_store)

    def task(argument, *, keyword):
        _, _, layout = run_context()
        return argument, keyword, layout.shard_file("errors", 0).read_bytes()

    assert on_run_storage(task, reads=["errors"])(1, keyword=2) == (1, 2, b'{"id": "p1"}\n')
    assert on_run_storage(task, reads=("errors",)).__wrapped__ is task
    with pytest.raises(ValueError, match="unknown reads"):
        on_run_storage(task, reads=["everything"])(1, keyword=2)


def test_on_local_disk_the_plan_and_the_scan_name_the_file_itself(tmp_path):
    assert planned_on_store({"input_path": "/p.jsonl"}) == {"input_path": "/p.jsonl"}
    assert scan_here({"path": "/p.jsonl"}, tmp_path / "x") == {"path": "/p.jsonl"}


def test_the_shared_files_are_the_runs_prefix_on_a_store_and_its_folder_on_disk(on_store, in_task, object_store,
                                                                                 tmp_path):
    from fleetgen.airflow.run_storage import shared_run_files
    from fleetgen.storage.run_files import LocalRunFiles, ObjectRunFiles

    files = shared_run_files(RunLayout(tmp_path / "run"))
    assert isinstance(files, LocalRunFiles) and files.root == tmp_path / "run"
    in_task(on_store)
    with task_run(on_store, RUN_ID):
        files = shared_run_files(run_context()[2])
        assert isinstance(files, ObjectRunFiles) and files.where("x.json") == object_store.url(f"runs/{RUN_ID}/x.json")


def test_reuse_is_looked_up_among_the_runs_of_the_output_root_where_it_is(on_store, in_task, object_store, tmp_path,
                                                                          monkeypatch):
    import logging

    from fleetgen.airflow.run_storage import look_up_reuse_here
    from fleetgen.generate import reuse, reuse_store

    seen = []
    monkeypatch.setattr(reuse, "look_up_reuse", lambda *args, **kwargs: seen.append(("disk", args, kwargs)))
    monkeypatch.setattr(reuse_store, "look_up_reuse_on_store",
                        lambda *args, **kwargs: seen.append(("store", args, kwargs)))
    log = logging.getLogger("test")
    look_up_reuse_here(tmp_path, RunLayout(tmp_path / "night2"), {"m": 1}, log)
    assert seen.pop() == ("disk", (tmp_path, "night2", {"m": 1}), {"log": log})
    in_task(on_store)
    with task_run(on_store, RUN_ID) as run:
        look_up_reuse_here(run.mirror.scratch, run_context()[2], {"m": 1}, log)
        kind, args, kwargs = seen.pop()
    assert (kind, args[0].url(), args[1:3], kwargs) == ("store", object_store.url("runs"), (RUN_ID, {"m": 1}),
                                                         {"log": log})
    assert args[3] == run.mirror.scratch.parent / "reuse-sources"


def test_a_store_that_fails_while_the_copy_is_made_leaves_no_scratch_folder(on_store, in_task, monkeypatch, tmp_path):
    from fleetgen.errors import StoreUnreachable
    from fleetgen.storage import mirror

    def unreachable(*args, **kwargs):
        raise StoreUnreachable("could not list the objects: the store does not answer", path="s3://x")

    monkeypatch.setattr(mirror.RunMirror, "open", unreachable)
    with pytest.raises(StoreUnreachable):
        with task_run(on_store, RUN_ID):
            pass
    assert os.listdir(tmp_path / "scratch") == []


def test_a_task_may_read_every_kind_a_shard_commits():
    from fleetgen.airflow.run_storage import COMMITTED_KINDS
    from fleetgen.generate.commit_log import PART_KINDS

    assert COMMITTED_KINDS == PART_KINDS


def test_a_copy_of_another_users_process_counts_as_running(monkeypatch, tmp_path):
    from fleetgen.airflow import run_storage

    def refused(pid, signal):
        raise PermissionError(1, "Operation not permitted")

    copy = tmp_path / (run_storage.scratch_prefix(4242) + "x")
    copy.mkdir()
    monkeypatch.setattr(run_storage.os, "kill", refused)
    assert run_storage.sweep_scratch(tmp_path) == [] and copy.is_dir()
    assert run_storage.sweep_scratch(tmp_path / "absent") == []


def test_a_callable_that_reads_no_run_files_runs_without_a_copy(on_store, in_task, monkeypatch):
    from fleetgen.airflow import run_storage

    in_task(on_store)
    seen = []
    plain = run_storage.on_run_storage(lambda value: seen.append(current_store_run()) or value * 2, reads=None)
    with_copy = run_storage.on_run_storage(lambda: seen.append(current_store_run()), reads=["stats"])
    assert plain(21) == 42 and plain.reads is None and seen == [None]
    with_copy()
    assert seen[1] is not None and with_copy.reads == ("stats",)


def _earlier_run(run_store, *, succeeded: bool, at: float, stats: bytes | None = None) -> None:
    """A finished run on the store: its report, and its files the tuner reads."""
    from fleetgen.report.previous import REPORT_SCHEMA

    run_store.put("report/report.json", json.dumps({"schema": REPORT_SCHEMA, "run_succeeded": succeeded,
                                                    "generated_at_epoch": at}).encode())
    relative = RunLayout(Path())
    run_store.put(relative.prompts_identity.as_posix(), b'{"path": "s3://b/p.jsonl"}')
    run_store.put(relative.workload_plan.as_posix(), b'{"node0:30000": {"cap": 80}}')
    if stats is not None:
        run_store.put(plan_name(0), b"{}")
        run_store.put(part_name(0, 1, "t", "stats"), stats)
        run_store.put(commit_name(0, 1), json.dumps({"seq": 1, "token": "t", "kind": "open", "parts": {
            "stats": {"name": part_name(0, 1, "t", "stats"), "lines": 1, "bytes": len(stats)}}}).encode())


def test_a_task_that_learns_from_the_previous_run_reads_it_from_the_store_and_writes_nothing_of_it_back(
        on_store, in_task, object_store, caplog):
    from fleetgen.airflow.run_storage import PREVIOUS_RUN
    from fleetgen.outputs import run_root_of_report
    from fleetgen.report.previous import find_previous_report

    _earlier_run(object_store.below("runs", "night1"), succeeded=True, at=100.0, stats=b'{"id": "p1"}\n')
    _earlier_run(object_store.below("runs", "night2"), succeeded=False, at=200.0)  # newer, but it failed
    _earlier_run(object_store.below("runs", RUN_ID), succeeded=True, at=300.0)  # this run's own (a retry): not earlier
    before = {info.name: info.etag for info in object_store.iter_objects("runs/")}
    in_task(on_store)
    with caplog.at_level("INFO", logger="fleetgen.airflow.run_storage"):
        with task_run(on_store, RUN_ID, reads=[PREVIOUS_RUN]):
            _, config, layout = run_context()
            found = find_previous_report(config.inputs.output_root, layout.root.name)
            previous = RunLayout(run_root_of_report(found))
            assert previous.root.name == "night1"
            assert previous.shard_file("stats", 0).read_bytes() == b'{"id": "p1"}\n'
            assert json.loads(previous.workload_plan.read_text()) == {"node0:30000": {"cap": 80}}
            assert previous.prompts_identity.is_file()
            assert (config.inputs.output_root / "night2" / "report" / "report.json").is_file()
    assert {info.name: info.etag for info in object_store.iter_objects("runs/")} == before
    assert f"earlier runs of {object_store.url('runs')}: the previous successful one is night1" in caplog.messages


def test_a_task_that_compares_with_earlier_runs_reads_their_reports_only(on_store, in_task, object_store):
    from fleetgen.airflow.run_storage import PREVIOUS_REPORTS

    _earlier_run(object_store.below("runs", "night1"), succeeded=True, at=100.0, stats=b'{"id": "p1"}\n')
    in_task(on_store)
    with task_run(on_store, RUN_ID, reads=[PREVIOUS_REPORTS]):
        root = run_context()[1].inputs.output_root
        assert sorted(path.relative_to(root).as_posix() for path in (root / "night1").rglob("*")
                      if path.is_file()) == ["night1/report/report.json"]
    with task_run(on_store, RUN_ID):  # a task that declares neither gets no earlier run
        root = run_context()[1].inputs.output_root
        assert not (root / "night1").exists()


def test_no_earlier_successful_run_reads_no_more_than_the_reports(on_store, in_task, object_store, caplog):
    from fleetgen.airflow.run_storage import PREVIOUS_RUN

    _earlier_run(object_store.below("runs", "night2"), succeeded=False, at=200.0)
    in_task(on_store)
    with caplog.at_level("INFO", logger="fleetgen.airflow.run_storage"):
        with task_run(on_store, RUN_ID, reads=[PREVIOUS_RUN]):
            root = run_context()[1].inputs.output_root
            assert [path.name for path in (root / "night2").rglob("*") if path.is_file()] == ["report.json"]
    assert f"earlier runs of {object_store.url('runs')}: none succeeded" in caplog.messages


def test_a_folder_name_of_the_store_that_climbs_out_of_the_copy_is_passed_over(on_store, in_task, object_store,
                                                                                 monkeypatch):
    from fleetgen.airflow.run_storage import PREVIOUS_REPORTS
    from fleetgen.storage.objects import ObjectStore

    _earlier_run(object_store.below("runs", "night1"), succeeded=True, at=100.0)
    listed = ObjectStore.folders
    monkeypatch.setattr(ObjectStore, "folders", lambda self, prefix="": ["..", ".", *listed(self, prefix)])
    in_task(on_store)
    with task_run(on_store, RUN_ID, reads=[PREVIOUS_REPORTS]):
        root = run_context()[1].inputs.output_root
        assert (root / "night1" / "report" / "report.json").is_file()
        assert not (root.parent / "report").exists()


@pytest.mark.parametrize("name, host", [("Web-01.example_x", "Web_01.example_x"), ("", "host"), ("a b", "a_b")])
def test_a_copy_is_named_after_its_host_in_plain_characters(monkeypatch, name, host):
    from fleetgen.airflow import run_storage

    monkeypatch.setattr(run_storage.socket, "gethostname", lambda: name)
    assert run_storage.scratch_prefix(42) == f"fleetgen-run-{host}-42-"
