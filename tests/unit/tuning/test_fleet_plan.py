"""plan_fleet: every server's plan in the run's tuning mode, from its own GPUs and the calibration it measured."""

import json
import logging
from pathlib import Path

import pytest

from fleetgen.nodes.fleet import parse_fleet
from fleetgen.outputs import RunLayout, calibration_file
from fleetgen.tuning import LaunchOptions, TunerBounds, Workload
from fleetgen.tuning.calibration import model_key
from fleetgen.tuning.fleet_plan import FleetPlanRun, plan_fleet
from fleetgen.tuning.model_files import ModelFiles

CONFIG = Path(__file__).parents[1] / "tuning" / "configs" / "llama-3.1-8b-style.json"
FLEET = {"model": {"path": "/models/llama", "served_name": "llama"}, "server": {"python": "/venv/bin/python"},
         "nodes": [{"name": "a", "ssh_conn_id": "ssh_a", "address": "10.0.0.1", "gpus": [0, 1]},
                   {"name": "b", "ssh_conn_id": "ssh_b", "address": "10.0.0.2", "gpus": [0]}]}
WORKLOAD = Workload(max_output_tokens=2048, prompt_tokens_mean=300.0, prompt_tokens_max=1500, prompt_count=10_000)
LOG = logging.getLogger("test")


def _inventory(host: str, used_mib: list[int]) -> dict:
    gpus = [{"index": i, "uuid": f"GPU-{host}-{i}", "name": "NVIDIA H100 80GB HBM3", "total_mib": 81_559,
             "used_mib": used, "free_mib": 81_559 - used, "processes": []} for i, used in enumerate(used_mib)]
    return {"host": host, "gpus": gpus}


def _plan(tmp_path, mode: str, inventories: dict, reads: list):
    spec = parse_fleet(FLEET)
    model = ModelFiles(config=json.loads(CONFIG.read_text()), weights_bytes=16_060_522_496, hf_quant_config=None,
                       weights_source="index")
    run = FleetPlanRun(tmp_path, RunLayout(tmp_path / "run"), run_on_node=lambda node, command: reads.append(node)
                       or "")
    return plan_fleet(spec, inventories, model, LaunchOptions.from_args([]), WORKLOAD, TunerBounds(mode=mode), run,
                      LOG)


def test_each_server_is_planned_on_its_own_gpus_in_the_fleets_order(tmp_path):
    inventories = {"a": _inventory("a", [0, 20_000]), "b": _inventory("b", [0])}
    plans = _plan(tmp_path, "tuned", inventories, reads := [])
    assert [(p.host, p.gpu_ids, p.port) for p in plans] == [("a", [0], 30000), ("a", [1], 30001), ("b", [0], 30000)]
    first, crowded, other = (p.expected["max_total_num_tokens"] for p in plans)
    assert first == other > crowded  # 20 GB taken by a foreign process on a:1 leave it a smaller pool
    assert reads == []  # no previous run: nothing to read on the nodes
    assert RunLayout(tmp_path / "run").workload_plan.is_file()  # tonight's plan recorded for the next run


def test_sglang_defaults_mode_records_no_workload_plan(tmp_path):
    plans = _plan(tmp_path, "sglang_defaults", {"a": _inventory("a", [0, 0]), "b": _inventory("b", [0])}, [])
    assert {p.mode for p in plans} == {"sglang_defaults"} and len(plans) == 3
    assert not RunLayout(tmp_path / "run").workload_plan.exists()


def test_a_measured_calibration_shrinks_the_pool_of_its_gpu_type_and_model_only(tmp_path):
    from fleetgen.tuning.calibration import Calibration, CalibrationStore

    inventories = {"a": _inventory("a", [0, 0]), "b": _inventory("b", [0])}
    before = [p.expected["max_total_num_tokens"] for p in _plan(tmp_path, "sglang_defaults", inventories, [])]
    two_gib = 2 << 30
    llama, other = model_key("/models/llama"), model_key("/models/other")
    for gpu, model in (("NVIDIA H100 80GB HBM3", llama), ("NVIDIA B200", llama), ("NVIDIA H100 80GB HBM3", other)):
        CalibrationStore(calibration_file(tmp_path)).record(Calibration(
            gpu_name=gpu, sglang_version="0.5.23", model=model, tp_size=1, planned_pre_load_bytes=70 << 30,
            measured_pre_load_bytes=(70 << 30) - two_gib if (gpu, model) == ("NVIDIA H100 80GB HBM3", llama) else 1,
            applied_correction_bytes=0, exact=True, mismatches=()))
    after = [p.expected["max_total_num_tokens"] for p in _plan(tmp_path, "sglang_defaults", inventories, [])]
    assert all(smaller < larger for smaller, larger in zip(after, before))
    assert [p.inputs["adjust"]["calibration_bytes"] for p in _plan(tmp_path, "sglang_defaults", inventories, [])] \
        == [two_gib] * 3


def _previous_run(root: Path, record: dict, rows: list[dict]) -> None:
    """Last night's run folder: a successful report, the stats of its completions and its plan record."""
    layout = RunLayout(root / "last-night")
    layout.report_json.parent.mkdir(parents=True)
    layout.report_json.write_text(json.dumps({"schema": 1, "run_succeeded": True, "generated_at_epoch": 1.0}))
    stats = layout.shard_file("stats", 0)
    stats.parent.mkdir(parents=True)
    stats.write_text("".join(json.dumps({"id": f"p{i}", **row}) + "\n" for i, row in enumerate(rows)))
    layout.workload_plan.write_text(json.dumps(record))


def _plan_with(tmp_path, inventories, run_on_node, *, mode="tuned", pin=False, model=None, fleet=None, args=()):
    spec = parse_fleet(fleet or FLEET)
    model = model or ModelFiles(config=json.loads(CONFIG.read_text()), weights_bytes=16_060_522_496,
                                hf_quant_config=None, weights_source="index")
    run = FleetPlanRun(tmp_path, RunLayout(tmp_path / "tonight"), run_on_node=run_on_node, pin_full_context=pin)
    return plan_fleet(spec, inventories, model, LaunchOptions.from_args(list(args)), WORKLOAD, TunerBounds(mode=mode),
                      run, LOG)


def test_tonights_plan_learns_from_last_nights_logs_on_every_node(tmp_path, caplog):
    from fleetgen.nodes import remote
    from fleetgen.tuning.workload import KvDemand

    inventories = {"a": _inventory("a", [0, 0]), "b": _inventory("b", [0])}
    full = _plan(tmp_path / "full", "tuned", inventories, [])
    caps = {p.server: p.expected["max_running_requests"] for p in full}
    record = {server: {"max_running_requests": cap, "max_total_num_tokens": 10**7, "ceiling": None}
              for server, cap in caps.items()}
    rows = [{"prompt_tokens": 300, "completion_tokens": 500, "server": server} for server in caps] * 5
    _previous_run(tmp_path, record, rows)
    reads = []

    def run_on_node(node, command):
        reads.append((node, command))
        return "".join(f"scheduler port={port} peak_full_tokens={caps[f'{node}:{port}'] * 400} retracted=0\n"
                       for port in (30000, 30001) if f"{node}:{port}" in caps)

    with caplog.at_level(logging.INFO, logger="test"):
        plans = _plan_with(tmp_path, inventories, run_on_node)
    log_dir = parse_fleet(FLEET).server.log_dir
    assert reads == [("a", remote.scheduler_log_command(log_dir, [30000, 30001])),
                     ("b", remote.scheduler_log_command(log_dir, [30000]))]
    assert f"Workload mode: previous run {tmp_path / 'last-night'}, 3 server(s) observed" in caplog.messages
    # every server ran short requests well under its pool: each climbs one step from last night's cap
    assert all(p.expected["max_running_requests"] > caps[p.server] for p in plans)
    # the demand counts pages and the decode reserve as tonight's servers run (H100, llama: fa3, page 1)
    demand = KvDemand.from_lengths([300] * 15, [500] * 15, page_size=1, reserve_tokens=1)
    assert plans[0].inputs["workload_mode"]["demand"]["mean"] == demand.mean
    assert {p.inputs["adjust"]["calibration_bytes"] for p in plans} == {0}
    assert json.loads(RunLayout(tmp_path / "tonight").workload_plan.read_text())["b:30000"][
        "max_running_requests"] == plans[2].expected["max_running_requests"]
    # pinned to the full-context plan, the same observations change nothing
    pinned = _plan_with(tmp_path, inventories, lambda node, command: run_on_node(node, command), pin=True)
    assert [p.expected["max_running_requests"] for p in pinned] == [caps[p.server] for p in pinned]


def test_the_page_size_of_the_demand_is_the_first_servers(tmp_path):
    """A B200 beside an H100 on one node: llama pages by 64 on the B200 (trtllm_mha), by 1 on the H100."""
    from fleetgen.tuning.workload import KvDemand

    node_a = _inventory("a", [0, 0])
    node_a["gpus"][0].update(name="NVIDIA B200", total_mib=183_359, free_mib=183_359)
    inventories = {"a": node_a, "b": _inventory("b", [0])}
    _previous_run(tmp_path, {}, [{"prompt_tokens": 300, "completion_tokens": 500, "server": "a:30000"}])
    plans = _plan_with(tmp_path, inventories, lambda node, command: "")
    demand = KvDemand.from_lengths([300], [500], page_size=64, reserve_tokens=1)
    assert plans[0].inputs["workload_mode"]["demand"]["mean"] == demand.mean


def test_the_latest_of_two_readbacks_is_the_calibration_each_server_starts_from(tmp_path, caplog, monkeypatch):
    from fleetgen.tuning import calibration
    from fleetgen.tuning.calibration import Calibration, CalibrationStore

    store = CalibrationStore(calibration_file(tmp_path))
    for version, at, missed in (("0.5.24", 2_000.0, 3 << 30), ("0.5.23", 1_000.0, 1 << 30)):
        monkeypatch.setattr(calibration.time, "time", lambda at=at: at)
        store.record(Calibration(gpu_name="NVIDIA H100 80GB HBM3", sglang_version=version, model="llama", tp_size=1,
                                 planned_pre_load_bytes=70 << 30, measured_pre_load_bytes=(70 << 30) - missed,
                                 applied_correction_bytes=0, exact=True, mismatches=()))
    inventories = {"a": _inventory("a", [0, 0]), "b": _inventory("b", [0])}
    with caplog.at_level(logging.INFO, logger="test"):
        plans = _plan_with(tmp_path, inventories, lambda node, command: "", mode="sglang_defaults")
    assert [p.inputs["adjust"]["calibration_bytes"] for p in plans] == [3 << 30] * 3
    assert ("Calibration for b:30000 from an earlier readback: 3221225472 bytes less pre-load memory"
            in caplog.messages)


def test_the_checkpoints_own_quantization_file_is_planned_with(tmp_path):
    """ModelOpt's hf_quant_config.json beside config.json: FP8 KV cache, so twice the tokens in the same pool."""
    inventories = {"a": _inventory("a", [0, 0]), "b": _inventory("b", [0])}
    plain = _plan_with(tmp_path, inventories, lambda node, command: "", mode="sglang_defaults")
    quant = {"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}}
    model = ModelFiles(config=json.loads(CONFIG.read_text()), weights_bytes=16_060_522_496, hf_quant_config=quant,
                       weights_source="index")
    fp8 = _plan_with(tmp_path, inventories, lambda node, command: "", mode="sglang_defaults", model=model)
    assert fp8[0].expected["max_total_num_tokens"] > 1.9 * plain[0].expected["max_total_num_tokens"]


def test_a_config_the_tuner_cannot_read_names_the_fleets_model_file(tmp_path):
    from fleetgen.errors import ModelConfigError

    config = json.loads(CONFIG.read_text())
    del config["num_hidden_layers"]
    model = ModelFiles(config=config, weights_bytes=16_060_522_496, hf_quant_config=None, weights_source="index")
    inventories = {"a": _inventory("a", [0, 0]), "b": _inventory("b", [0])}
    with pytest.raises(ModelConfigError) as error:
        _plan_with(tmp_path, inventories, lambda node, command: "", model=model)
    assert error.value.path == "/models/llama/config.json"


def test_the_demand_reserves_the_speculative_drafts_of_each_running_request(tmp_path):
    from fleetgen.tuning.workload import KvDemand

    inventories = {"a": _inventory("a", [0, 0]), "b": _inventory("b", [0])}
    _previous_run(tmp_path, {}, [{"prompt_tokens": 300, "completion_tokens": 500, "server": "a:30000"}])
    plans = _plan_with(tmp_path, inventories, lambda node, command: "",
                       args=("--speculative-algorithm", "NGRAM", "--speculative-eagle-topk", "2",
                             "--speculative-num-draft-tokens", "8"))
    # 2 x max(1 step x 2 branches, 8 draft tokens) = 16 tokens past each request's committed length
    demand = KvDemand.from_lengths([300], [500], page_size=1, reserve_tokens=16)
    assert plans[0].inputs["workload_mode"]["demand"]["mean"] == demand.mean


def test_the_first_servers_plans_follow_each_workload_and_record_nothing(tmp_path):
    from fleetgen.tuning.fleet_plan import first_server_plans

    spec = parse_fleet(FLEET)
    model = ModelFiles(config=json.loads(CONFIG.read_text()), weights_bytes=16_060_522_496, hf_quant_config=None,
                       weights_source="index")
    long = Workload(max_output_tokens=2048, prompt_tokens_mean=300.0, prompt_tokens_max=100_000, prompt_count=101)
    inventories = {"a": _inventory("a", [0, 20_000]), "b": _inventory("b", [0])}
    with_it, without_it = first_server_plans(spec, inventories, model, LaunchOptions.from_args([]), (long, WORKLOAD),
                                             TunerBounds(), tmp_path)
    assert (with_it.server, without_it.server) == ("a:30000", "a:30000")
    assert with_it.flags["--context-length"] == 102_400 and without_it.flags["--context-length"] == 4096
    assert without_it.expected["max_running_requests"] > 4 * with_it.expected["max_running_requests"]
    assert not any(tmp_path.iterdir())  # a what-if: no plan record, no calibration written


# --- the tuning trial's candidates --------------------------------------------------------------------------------

SEED_CONFIG = Path(__file__).parents[1] / "tuning" / "configs" / "seed-qwen3.6-27b.json"
SEED_ARGS = ["--speculative-algorithm", "NEXTN", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
             "--speculative-num-draft-tokens", "4", "--reasoning-parser", "qwen3"]


def _b200s(host: str, count: int) -> dict:
    gpus = [{"index": i, "uuid": f"GPU-{host}-{i}", "name": "NVIDIA B200", "total_mib": 183_359, "used_mib": 500,
             "free_mib": 183_359 - 500, "processes": []} for i in range(count)]
    return {"host": host, "gpus": gpus}


def _candidate_plans(tmp_path, candidates, *, args=SEED_ARGS, bounds=None):
    from fleetgen.tuning.candidates import candidate_set, default_candidates
    from fleetgen.tuning.fleet_plan import plan_fleet_candidates

    fleet = {"model": {"path": "/models/seed", "served_name": "seed"},
             "server": {"python": "/venv/bin/python", "extra_args": list(args)},
             "nodes": [{"name": "a", "ssh_conn_id": "ssh_a", "address": "10.0.0.1", "gpus": [0, 1, 2]}]}
    model = ModelFiles(config=json.loads(SEED_CONFIG.read_text()), weights_bytes=54 * 10**9, hf_quant_config=None,
                       weights_source="index")
    run = FleetPlanRun(tmp_path, RunLayout(tmp_path / "run"), run_on_node=lambda node, command: "")
    if candidates is None:
        candidates = candidate_set(default_candidates(args, (3, 1, 4), eagle_family=True), [])
    return plan_fleet_candidates(parse_fleet(fleet), {"a": _b200s("a", 3)}, model, candidates, WORKLOAD,
                                 bounds or TunerBounds(), run, LOG)


def test_every_candidate_is_a_whole_plan_for_its_own_options_on_every_server(tmp_path):
    from fleetgen.tuning import LaunchOptions, backoff

    result = _candidate_plans(tmp_path, None)
    assert list(result.plans) == ["incumbent", "no_speculation", "draft_minus_1", "cap_3_4", "cap_1_2", "sglang_auto"]
    assert result.skipped == {}
    incumbent = result.plans["incumbent"]
    cap = incumbent[0].expected["max_running_requests"]
    for name, plans in result.plans.items():
        assert [(p.port, p.candidate) for p in plans] == [(30000, name), (30001, name), (30002, name)]
        assert all(LaunchOptions.from_args(p.extra_args).tp_size == 1 for p in plans)
    caps = {name: plans[0].expected["max_running_requests"] for name, plans in result.plans.items()}
    assert (caps["cap_3_4"], caps["cap_1_2"]) == (int(cap * 0.75), cap // 2)
    # without speculation a request holds fewer Mamba state slots and no draft buffers: more requests fit
    assert caps["no_speculation"] > cap
    no_spec = result.plans["no_speculation"][0]
    assert no_spec.extra_args == ["--reasoning-parser", "qwen3"]
    assert no_spec.inputs["profile"]["draft_tokens"] == 0
    assert result.plans["draft_minus_1"][0].inputs["profile"]["draft_tokens"] == 3
    assert incumbent[0].extra_args == SEED_ARGS and result.plans["cap_1_2"][0].extra_args == SEED_ARGS
    # a server of a challenger that runs out of memory backs off on its own configuration
    smaller = backoff(no_spec, "oom_kv")
    assert (smaller.candidate, smaller.extra_args) == ("no_speculation", ["--reasoning-parser", "qwen3"])
    assert smaller.expected["max_running_requests"] < no_spec.expected["max_running_requests"]


def test_a_cap_the_fleet_pins_is_scaled_through_its_flag(tmp_path):
    result = _candidate_plans(tmp_path, None, args=SEED_ARGS + ["--max-running-requests", "40"])
    assert result.plans["incumbent"][0].expected["max_running_requests"] == 40
    half = result.plans["cap_1_2"][0]
    assert half.expected["max_running_requests"] == 20 and half.extra_args[-2:] == ["--max-running-requests", "20"]


def test_a_candidate_that_cannot_be_planned_or_changes_nothing_is_left_out_saying_why(tmp_path):
    from fleetgen.tuning.candidates import INCUMBENT, Candidate

    candidates = [Candidate(INCUMBENT), Candidate("huge", (("--max-running-requests", 100_000),
                                                           ("--max-mamba-cache-size", 500_000)), listed=True),
                  Candidate("same", (("--reasoning-parser", "qwen3"),), listed=True),
                  Candidate("bf16", (("--mamba-ssm-dtype", "bfloat16"),), listed=True)]
    result = _candidate_plans(tmp_path, candidates)
    assert list(result.plans) == ["incumbent", "bf16"]
    assert result.skipped["huge"].startswith("cannot be planned: ")
    assert result.skipped["same"] == "plans the incumbent's very launch on every server"
    assert result.plans["bf16"][0].expected["max_running_requests"] > \
        result.plans["incumbent"][0].expected["max_running_requests"]


def test_sglang_auto_is_the_fleets_own_launch_as_sglang_sizes_it_beside_the_tuned_incumbent(tmp_path):
    import dataclasses

    from fleetgen.tuning.fleet_plan import options_for

    result = _candidate_plans(tmp_path, None)
    auto, incumbent = result.plans["sglang_auto"], result.plans["incumbent"]
    fleet = parse_fleet({"model": {"path": "/models/seed", "served_name": "seed"},
                         "server": {"python": "/venv/bin/python", "extra_args": list(SEED_ARGS)},
                         "nodes": [{"name": "a", "ssh_conn_id": "ssh_a", "address": "10.0.0.1", "gpus": [0, 1, 2]}]})
    model = ModelFiles(config=json.loads(SEED_CONFIG.read_text()), weights_bytes=54 * 10**9, hf_quant_config=None,
                       weights_source="index")
    # exactly the plans of a run in the sglang_defaults mode, under the candidate's name
    defaults = plan_fleet(fleet, {"a": _b200s("a", 3)}, model, options_for(fleet, SEED_ARGS), WORKLOAD,
                          TunerBounds(mode="sglang_defaults"),
                          FleetPlanRun(tmp_path, RunLayout(tmp_path / "other"), run_on_node=lambda n, c: ""), LOG)
    def without_name(plan):  # the candidate's name and launch args, which a plan records twice
        data = dataclasses.replace(plan, candidate="incumbent", extra_args=None).to_dict()
        data["inputs"].pop("launch", None)
        return data

    assert [without_name(plan) for plan in auto] == [without_name(plan) for plan in defaults]
    assert {plan.mode for plan in auto} == {"sglang_defaults"} and {plan.mode for plan in incumbent} == {"tuned"}
    assert all(plan.extra_args == SEED_ARGS for plan in auto)
    assert auto[0].flags != incumbent[0].flags  # the tuner's own sizing flags are the difference
