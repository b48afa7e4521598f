"""plan_fleet: every server's plan in the run's tuning mode, from its own GPUs and the calibration it measured."""

import json
import logging
from pathlib import Path

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
