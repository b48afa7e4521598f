"""Calibration records: the log's pre-load figure, a readback's correction and the store the next plan reads.

The readbacks themselves, sized against the simulated node, are in tests/unit/crosscheck/test_calibration.py.
"""

import json
from types import SimpleNamespace

import pytest

from fleetgen.errors import ConfigError
from fleetgen.nodes.readiness import RankLimits, ServerInfo
from fleetgen.tuning import calibration as calibration_module
from fleetgen.tuning.calibration import (PLANNED_SGLANG_VERSION, Calibration, CalibrationStore, _reported,
                                         calibration_key, model_key, pre_load_from_log)

MIB = 1 << 20
GIB = 1 << 30


def _calibration(**changes) -> Calibration:
    values = dict(gpu_name="NVIDIA B200", sglang_version=PLANNED_SGLANG_VERSION, model="qwen3.6-27b", tp_size=1,
                  planned_pre_load_bytes=170_000 * MIB, measured_pre_load_bytes=168_000 * MIB,
                  applied_correction_bytes=0, exact=True, mismatches=())
    return Calibration(**{**values, **changes})


@pytest.fixture
def clock(monkeypatch):
    """The store's clock, set by the test: readbacks recorded at chosen times."""
    now = [1_000.0]
    monkeypatch.setattr(calibration_module.time, "time", lambda: now[0])
    return now


def test_the_log_figure_is_gibibytes_as_sglang_counts_them():
    # SGLang divides by 1 << 30 and calls it GB: 80 GB in its log is 80 GiB, not 80e9 bytes
    assert pre_load_from_log("Load weight begin. avail mem=80.00 GB") == 80 * GIB
    assert pre_load_from_log("[TP0] Load weight begin. avail mem=21.60 GB") == int(21.60 * GIB)


def test_the_last_load_line_of_a_restarted_server_is_the_one_read():
    log = ("[12:00 TP0] Load weight begin. avail mem=70.25 GB\n[12:01 TP0] something else\n"
           "[12:05 TP0] Load weight begin. avail mem=65.50 GB\n")
    assert pre_load_from_log(log) == int(65.50 * GIB)


@pytest.mark.parametrize("log", ["", None, "avail mem=70.00 GB", "Load weight begin avail mem=70.00 GB",
                                 "Load weight end. avail mem=70.00 GB"])
def test_a_log_without_the_load_line_gives_no_figure(log):
    assert pre_load_from_log(log) is None


def test_the_model_key_is_the_model_folders_name():
    assert model_key("/models/qwen3.6-27b") == "qwen3.6-27b"
    assert model_key("/models/qwen3.6-27b/") == "qwen3.6-27b"
    assert model_key("/") == "/"
    # the folder's name as it is: a trailing X or space is part of it
    assert model_key("/models/Qwen3-X") == "Qwen3-X" and model_key("/models/m ") == "m "
    assert calibration_key("NVIDIA B200", "0.5.23", "m", 2) == "NVIDIA B200|0.5.23|m|tp2"
    assert _calibration(tp_size=4).key == "NVIDIA B200|0.5.23|qwen3.6-27b|tp4"


def test_the_correction_adds_what_the_plan_still_missed_to_what_it_carried():
    measured = _calibration(planned_pre_load_bytes=100 * GIB, measured_pre_load_bytes=98 * GIB,
                            applied_correction_bytes=1 * GIB)
    assert measured.correction_bytes == 3 * GIB
    # more memory than assumed: a negative correction
    roomier = _calibration(planned_pre_load_bytes=100 * GIB, measured_pre_load_bytes=101 * GIB)
    assert roomier.correction_bytes == -GIB
    unmeasured = _calibration(planned_pre_load_bytes=100 * GIB, measured_pre_load_bytes=50 * GIB,
                              applied_correction_bytes=1 * GIB, unmeasured="--device cpu")
    assert unmeasured.correction_bytes == GIB


def test_the_report_line_names_the_plan_the_server_and_the_correction_in_mib():
    line = _calibration(planned_pre_load_bytes=170_000 * MIB, measured_pre_load_bytes=168_464 * MIB).report_line()
    assert line == ("NVIDIA B200|0.5.23|qwen3.6-27b|tp1: the plan assumed 170,000 MiB pre-load free, the server had "
                    "168,464 MiB (1,536 MiB correction for the next plan)")
    estimated = _calibration(exact=False).report_line()
    assert estimated.endswith("correction for the next plan, estimated from the log only)")
    newer = _calibration(sglang_version="0.5.24").report_line()
    assert newer == ("NVIDIA B200|0.5.24|qwen3.6-27b|tp1: the plan assumed 170,000 MiB pre-load free, the server had "
                     "168,000 MiB (2,000 MiB correction for the next plan); SGLang 0.5.24 is not 0.5.23: its plan is "
                     "verified by this readback and corrected on the next run")


def test_an_unmeasured_report_line_says_why_and_what_the_log_said():
    blind = _calibration(unmeasured="no line", logged_pre_load_bytes=None).report_line()
    assert blind == ("NVIDIA B200|0.5.23|qwen3.6-27b|tp1: the plan assumed 170,000 MiB pre-load free; no Load weight "
                     "line; not a measure of the plan's memory: no line (no correction learnt)")
    logged = _calibration(unmeasured="--device cpu", logged_pre_load_bytes=2048 * MIB).report_line()
    assert "; its log says 2,048 MiB free before the weights;" in logged


def test_to_dict_lists_the_mismatches_as_json_does():
    data = _calibration(mismatches=("max_total_num_tokens: expected 1, got 2",)).to_dict()
    assert data["mismatches"] == ["max_total_num_tokens: expected 1, got 2"]
    assert json.loads(json.dumps(data)) == data


def test_the_reported_values_are_rank_zeros_with_the_top_level_token_count_first():
    ranks = (RankLimits(max_running_requests=48, max_total_num_tokens=1000, max_mamba_cache_size=96),
             RankLimits(max_running_requests=7, max_total_num_tokens=5, max_mamba_cache_size=9))
    info = ServerInfo(server="n:1", ranks=ranks, top_level_total_tokens=2000, context_length=None, version="0.5.23")
    assert _reported(info) == {"max_running_requests": 48, "max_mamba_cache_size": 96, "max_total_num_tokens": 2000}
    per_rank = ServerInfo(server="n:1", ranks=ranks, top_level_total_tokens=None, context_length=None, version=None)
    assert _reported(per_rank)["max_total_num_tokens"] == 1000
    # a zero at the top level is a value, not an absence
    zero = ServerInfo(server="n:1", ranks=ranks, top_level_total_tokens=0, context_length=None, version=None)
    assert _reported(zero)["max_total_num_tokens"] == 0
    empty = ServerInfo(server="n:1", ranks=(), top_level_total_tokens=None, context_length=None, version=None)
    assert _reported(empty) == {"max_running_requests": None, "max_mamba_cache_size": None,
                                "max_total_num_tokens": None}


def test_a_store_without_a_file_has_no_correction(tmp_path):
    store = CalibrationStore(tmp_path / "none" / "calibration.json")
    assert store.load() == {}
    assert store.correction_bytes("NVIDIA B200", "0.5.23", "qwen3.6-27b", 1) == 0
    assert store.latest("NVIDIA B200", "qwen3.6-27b", 1) is None


def test_an_unreadable_store_names_its_file_and_the_way_out(tmp_path):
    path = tmp_path / "calibration.json"
    path.write_text("{not json")
    with pytest.raises(ConfigError, match="calibration file is not readable JSON") as error:
        CalibrationStore(path).load()
    assert error.value.path == str(path) and error.value.hint == "delete it; the next run's readback writes a new one"


def test_a_store_holding_no_object_is_empty(tmp_path):
    path = tmp_path / "calibration.json"
    path.write_text("[1, 2]")
    assert CalibrationStore(path).load() == {}


def test_a_recorded_correction_is_read_back_by_its_key_only(tmp_path, clock):
    store = CalibrationStore(tmp_path / "output" / "root" / "calibration.json")
    store.record(_calibration(applied_correction_bytes=100 * MIB))
    assert store.correction_bytes("NVIDIA B200", "0.5.23", "qwen3.6-27b", 1) == 2_100 * MIB
    assert store.correction_bytes("NVIDIA B200", "0.5.23", "qwen3.6-27b", 2) == 0
    assert store.correction_bytes("NVIDIA H100", "0.5.23", "qwen3.6-27b", 1) == 0
    entry = store.load()["NVIDIA B200|0.5.23|qwen3.6-27b|tp1"]
    assert entry["key"] == "NVIDIA B200|0.5.23|qwen3.6-27b|tp1" and entry["recorded_at"] == 1_000.0
    assert entry["measured_pre_load_bytes"] == 168_000 * MIB
    # the write is atomic: no temporary file is left beside it
    assert sorted(p.name for p in store.path.parent.iterdir()) == [".calibration.json.lock", "calibration.json"]
    # sorted and indented: a person reads and diffs it
    assert store.path.read_text() == json.dumps(store.load(), indent=1, sort_keys=True) + "\n"


def test_a_servers_own_record_is_keyed_by_the_server_and_keeps_the_others(tmp_path, clock):
    store = CalibrationStore(tmp_path / "calibration.json")
    store.record(_calibration(), server="node-a:30000")
    store.record(_calibration(measured_pre_load_bytes=169_000 * MIB), server="node-a:30001")
    data = store.load()
    assert sorted(data) == ["node-a:30000", "node-a:30001"]
    assert data["node-a:30000"]["correction_bytes"] == 2_000 * MIB
    assert data["node-a:30001"]["correction_bytes"] == 1_000 * MIB
    assert data["node-a:30001"]["key"] == "NVIDIA B200|0.5.23|qwen3.6-27b|tp1"


def test_a_later_readback_of_the_same_key_replaces_the_earlier(tmp_path, clock):
    store = CalibrationStore(tmp_path / "calibration.json")
    store.record(_calibration(measured_pre_load_bytes=168_000 * MIB))
    clock[0] = 2_000.0
    store.record(_calibration(measured_pre_load_bytes=169_500 * MIB))
    assert store.correction_bytes("NVIDIA B200", "0.5.23", "qwen3.6-27b", 1) == 500 * MIB
    assert len(store.load()) == 1


def test_the_latest_of_two_readbacks_at_different_times_is_the_one_used(tmp_path, clock):
    """Two SGLang versions on one GPU type: the plan, made before the server names its version, starts from
    the readback recorded last, whichever key sorts first."""
    store = CalibrationStore(tmp_path / "calibration.json")
    clock[0] = 5_000.0
    store.record(_calibration(sglang_version="0.5.22", measured_pre_load_bytes=169_000 * MIB))
    clock[0] = 9_000.0
    store.record(_calibration(sglang_version="0.5.24", measured_pre_load_bytes=167_000 * MIB))
    clock[0] = 7_000.0
    store.record(_calibration(sglang_version="0.5.23", measured_pre_load_bytes=168_000 * MIB))
    latest = store.latest("NVIDIA B200", "qwen3.6-27b", 1)
    assert latest["sglang_version"] == "0.5.24" and latest["correction_bytes"] == 3_000 * MIB


def test_the_latest_readback_is_of_the_same_gpu_model_and_tp(tmp_path, clock):
    store = CalibrationStore(tmp_path / "calibration.json")
    store.record(_calibration(measured_pre_load_bytes=169_000 * MIB))
    clock[0] = 2_000.0
    store.record(_calibration(gpu_name="NVIDIA H100", measured_pre_load_bytes=1))
    store.record(_calibration(model="other", measured_pre_load_bytes=2))
    store.record(_calibration(tp_size=2, measured_pre_load_bytes=3))
    assert store.latest("NVIDIA B200", "qwen3.6-27b", 1)["correction_bytes"] == 1_000 * MIB
    assert store.latest("NVIDIA B200", "qwen3.6-27b", 2)["measured_pre_load_bytes"] == 3
    assert store.latest("NVIDIA B200", "qwen3.6-27b", 4) is None


def test_the_latest_reads_a_tp_size_written_as_text_and_an_entry_without_a_time(tmp_path):
    path = tmp_path / "calibration.json"
    path.write_text(json.dumps({
        "old": {"gpu_name": "G", "model": "m", "tp_size": "2", "correction_bytes": 1},
        "new": {"gpu_name": "G", "model": "m", "tp_size": "2", "correction_bytes": 2, "recorded_at": 1.0},
        "untagged": {"gpu_name": "G", "model": "m", "correction_bytes": 3}}))
    store = CalibrationStore(path)
    assert store.latest("G", "m", 2)["correction_bytes"] == 2
    assert store.latest("G", "m", "2")["correction_bytes"] == 2
    assert store.latest("G", "m", 0)["correction_bytes"] == 3


def test_a_readback_is_recorded_for_the_next_plan_and_under_the_servers_name(tmp_path, clock, monkeypatch):
    seen = {}

    def calibrate(plan, info, log_text, *, gpu_name, model):
        seen.update(plan=plan, info=info, log_text=log_text, gpu_name=gpu_name, model=model)
        return _calibration(gpu_name=gpu_name, model=model, applied_correction_bytes=MIB)

    monkeypatch.setattr(calibration_module, "calibrate", calibrate)
    plan = SimpleNamespace(inputs={"gpus": [{"name": "NVIDIA B200"}, {"name": "NVIDIA H100"}]})
    shared, run = CalibrationStore(tmp_path / "shared.json"), CalibrationStore(tmp_path / "run" / "calibration.json")
    info = SimpleNamespace()
    recorded = calibration_module.record_readback(plan, info, "Load weight begin", server="node1:30000",
                                                  model_path="/models/qwen3.6-27b/", shared=shared, run=run)
    assert seen == {"plan": plan, "info": info, "log_text": "Load weight begin", "gpu_name": "NVIDIA B200",
                    "model": "qwen3.6-27b"}
    key = "NVIDIA B200|0.5.23|qwen3.6-27b|tp1"
    assert list(shared.load()) == [key] and list(run.load()) == ["node1:30000"]
    assert recorded["correction_bytes"] == shared.load()[key]["correction_bytes"] == 2_001 * MIB
    assert recorded["report_line"] == _calibration(applied_correction_bytes=MIB).report_line()
    assert recorded["mismatches"] == [] and recorded["gpu_name"] == "NVIDIA B200"
