"""The run folder's contract (fleetgen/outputs.py): every shard file named in one place, as documented."""

import re
from pathlib import Path

import pytest

from fleetgen.errors import ConfigError
from fleetgen.outputs import (SHARD_KINDS, RunLayout, calibration_file, default_output_root, read_failures,
                              read_server_times, record_server_time, run_folder_name, run_root_of_report,
                              trial_history_file)

# The nearest docs/ above this file: the checkout's, also from the copy of tests/ a mutation run makes inside it.
DOC = next(folder / "docs" / "output-formats.md" for folder in Path(__file__).resolve().parents
           if (folder / "docs" / "output-formats.md").is_file())


def test_every_shard_file_has_its_own_name_and_the_documented_one():
    layout = RunLayout(Path("/out/run"))
    paths = layout.shard(42)
    bookkeeping = [paths.plan, paths.mark, paths.lock, paths.lease, paths.heartbeat, paths.lost_tries]
    data = [layout.shard_file(kind, 42) for kind in SHARD_KINDS if kind != "shards"]
    everything = bookkeeping + data
    assert len(set(everything)) == len(everything)
    assert all(path.name.startswith("shard-00042.") for path in everything)
    documented = set(re.findall(r"^(\w+/shard-NNNNN\.[\w.]+)", DOC.read_text(), flags=re.M))
    named = {str(path.relative_to(layout.root)).replace("00042", "NNNNN") for path in everything}
    assert named <= documented, sorted(named - documented)


def test_the_run_finds_heartbeats_and_lost_tries_by_the_names_a_shard_writes(tmp_path):
    layout = RunLayout(tmp_path)
    layout.kind_dir("shards").mkdir(parents=True)
    for shard in (3, 1):
        layout.shard(shard).heartbeat.write_text("{}")
        layout.shard(shard).lost_tries.write_text("")
        layout.shard(shard).mark.write_text("{}")
    assert layout.heartbeat_files() == [layout.shard(1).heartbeat, layout.shard(3).heartbeat]
    assert layout.lost_try_files() == [layout.shard(1).lost_tries, layout.shard(3).lost_tries]


def test_a_run_id_becomes_one_folder_name_any_filesystem_takes():
    assert run_folder_name("manual__2026-05-01T02:00:00+00:00") == "manual__2026-05-01T02_00_00_00_00"
    assert run_folder_name("scheduled a/b..c") == "scheduled_a_b..c"
    assert run_folder_name("ok-Name_1.2") == "ok-Name_1.2"


@pytest.mark.parametrize("run_id", [".", "..", "", ".hidden", "...", ".x:y"])
def test_a_run_id_whose_folder_would_not_be_a_folder_of_its_own_is_refused(tmp_path, run_id):
    # run "." would write into the output root itself, beside every other run and the shared calibration.json
    with pytest.raises(ConfigError) as refused:
        RunLayout.for_run(tmp_path, run_id)
    assert repr(run_id) in refused.value.message and "run id" in refused.value.hint


def test_a_run_folder_lies_under_the_output_root_with_home_expanded(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    layout = RunLayout.for_run("~/out", "manual__1:2")
    assert layout.root == tmp_path / "out" / "manual__1_2"
    assert calibration_file("~/out") == tmp_path / "out" / "calibration.json"


def test_the_output_root_defaults_to_the_deployments_setting(monkeypatch):
    monkeypatch.setenv("FLEETGEN_OUTPUT_ROOT", "/data/fleetgen")
    assert default_output_root() == "/data/fleetgen"
    monkeypatch.delenv("FLEETGEN_OUTPUT_ROOT")
    assert default_output_root() == "~/fleetgen-output"


def test_every_run_file_has_its_documented_place():
    layout = RunLayout(Path("/out/run"))
    places = {
        layout.prompts_identity: "prompts.json", layout.rejects: "rejects.jsonl",
        layout.servers_health: "servers-health.json", layout.servers_health_lock: "servers-health.lock",
        layout.failures: "failures.jsonl", layout.validation_dir: "validation",
        layout.validation_summary: "validation/summary.json", layout.data_docs_dir: "validation/data_docs",
        layout.report_dir: "report",
        layout.report_json: "report/report.json", layout.calibration: "calibration.json",
        layout.workload_plan: "workload_plan.json", layout.reuse_index: "reuse/index.npy",
        layout.reuse_index_meta: "reuse/index.json",
    }
    assert {path: str(path.relative_to(layout.root)) for path in places} == places
    assert run_root_of_report(layout.report_json) == layout.root
    documented = DOC.read_text()
    assert all(name.split("/")[-1] in documented for name in places.values())


def test_the_tuning_trials_files_have_their_documented_places():
    layout = RunLayout(Path("/out/run"))
    assert layout.trial_decision == Path("/out/run/trial-decision.json")
    assert trial_history_file("/out") == Path("/out/tuning-trials.jsonl")
    documented = DOC.read_text()
    assert "trial-decision.json" in documented and "tuning-trials.jsonl" in documented


def test_the_first_shard_and_large_shard_numbers_are_named_with_five_digits():
    layout = RunLayout(Path("/out/run"))
    assert layout.shard_file("stats", 0) == Path("/out/run/stats/shard-00000.jsonl")
    assert layout.shard(0).plan == Path("/out/run/shards/shard-00000.json")
    assert layout.shard_file("gpu", 123456).name == "shard-123456.jsonl"


def test_an_unknown_kind_of_shard_file_is_refused_naming_the_known_ones():
    layout = RunLayout(Path("/out/run"))
    with pytest.raises(ValueError, match=r"unknown per-shard output kind 'stat'; expected one of \('completions'"):
        layout.shard_file("stat", 1)


def test_shard_files_of_one_kind_are_listed_in_shard_order(tmp_path):
    layout = RunLayout(tmp_path)
    layout.kind_dir("errors").mkdir()
    for shard in (10, 2, 0):
        layout.shard_file("errors", shard).write_text("")
    (layout.kind_dir("errors") / "notes.txt").write_text("")
    assert layout.shard_files("errors") == [layout.shard_file("errors", shard) for shard in (0, 2, 10)]
    assert layout.shard_files("gpu") == []


def test_failure_records_are_read_and_a_torn_last_line_is_skipped(tmp_path):
    path = tmp_path / "failures.jsonl"
    assert read_failures(path) == []
    path.write_text('{"task": "generate", "map_index": 0}\n\n{"task": "validate"}\n{"task": "rep', encoding="utf-8")
    assert read_failures(path) == [{"task": "generate", "map_index": 0}, {"task": "validate"}]


def test_a_nodes_gpu_sampler_claim_sits_beside_the_gpu_samples_named_for_the_node(tmp_path):
    layout = RunLayout(tmp_path)
    assert layout.gpu_sampler_claim("gpu-node-1") == tmp_path / "gpu" / "gpu-node-1.sampler"
    assert layout.gpu_sampler_claim("gpu-node-1").parent == layout.shard_file("gpu", 0).parent


def test_only_stops_found_by_the_launch_marker_are_kept_for_the_report_per_node(tmp_path):
    from fleetgen.outputs import read_marker_stops, write_marker_stops

    layout = RunLayout(tmp_path / "run")
    plain = {"outcome": "stopped", "port": 30000, "pid": 11, "signal": "TERM", "launched_under_other_module": False,
             "pid_file_missing": False}
    assert write_marker_stops(layout, "node0", [plain]) == [] and read_marker_stops(layout) == []
    other = {**plain, "port": 30001, "launched_under_other_module": True}
    gone = {**plain, "port": 30002, "pid_file_missing": True}
    write_marker_stops(layout, "node1", [gone])
    write_marker_stops(layout, "node0", [plain, other])
    assert read_marker_stops(layout) == [{"node": "node0", **other}, {"node": "node1", **gone}]


def test_each_servers_times_are_kept_in_its_own_documented_file_and_read_back_in_time_order(tmp_path):
    layout = RunLayout(tmp_path / "run")
    record_server_time(layout, "gpu-a:30000", "launched", pid=7, at=100.0)
    record_server_time(layout, "gpu-b:30000", "kept", pid=9, at=90.0)
    record_server_time(layout, "gpu-a:30000", "ready", pid=7, at=160.0)
    record_server_time(layout, "gpu-a:30000", "stopped", pid=7, at=150.5)  # another worker's clock: ordered by t
    assert sorted(path.name for path in layout.server_times_dir.iterdir()) == ["gpu-a_30000.jsonl",
                                                                              "gpu-b_30000.jsonl"]
    assert "server-times/" in DOC.read_text()
    with (layout.server_times_dir / "gpu-a_30000.jsonl").open("a") as handle:
        handle.write('{"server": "gpu-a:30000", "event": "rea')  # a task killed mid-write
    record_server_time(layout, "gpu-a:30000", "ready", pid=7, at=170.0)  # its retry: a line of its own
    assert {server: [(e["event"], e["t"], e["pid"]) for e in events]
            for server, events in read_server_times(layout).items()} == {
        "gpu-a:30000": [("launched", 100.0, 7), ("stopped", 150.5, 7), ("ready", 160.0, 7), ("ready", 170.0, 7)],
        "gpu-b:30000": [("kept", 90.0, 9)]}
    assert read_server_times(RunLayout(tmp_path / "no-run")) == {}
    with pytest.raises(ValueError, match="unknown server event 'started'"):
        record_server_time(layout, "gpu-a:30000", "started")
