"""Calibration from readback: a node whose hidden per-process overhead is not fleetgen's constant.

The simulated node's new server takes 1.5 GiB more before SGLang's baseline than ``CUDA_CONTEXT_MIB``
says (as a different driver, PyTorch or NCCL would). The first run's plan then expects more than SGLang
allows and its readback (``/server_info`` and the ``Load weight begin`` log line) says by how much; the
correction is stored per (GPU, SGLang version, model, tp), and the second run's plan matches exactly.
"""

import pytest

from fleetgen.nodes.readiness import parse_server_info
from fleetgen.tuning.calibration import CalibrationStore, calibrate, pre_load_from_log
from fleetgen.tuning.planner import CUDA_CONTEXT_MIB, compare_expected, render_budget_table
from sglang_sim.dryrun import dry_run
from sglang_sim.node import create_node

MIB = 1 << 20
GIB = 1 << 30
HIDDEN_EXTRA_MIB = 1536
# The seed's NEXTN 3/1/4 speculative decoding alone.
SEED_SPEC_ARGS = ("--speculative-algorithm", "NEXTN", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
                  "--speculative-num-draft-tokens", "4")


def _readback(sizing, version="0.5.23"):
    """What the server reports at readiness: /server_info's limits and its start-up log line."""
    limits = sizing.server_info_limits()
    info = {"version": version, "max_total_num_tokens": limits["max_total_num_tokens"],
            "internal_states": [{"effective_max_running_requests_per_dp": limits["max_running_requests"],
                                 "max_mamba_cache_size": limits["max_mamba_cache_size"]}]}
    return (parse_server_info(info, server="sim-node-0:30000"),
            f"[2026-11-30 12:00:00 TP0] Load weight begin. avail mem={sizing.pre_load_free_bytes / GIB:.2f} GB")


def test_second_run_matches_after_a_readback_of_hidden_overhead(xc, models, tmp_path):
    node = create_node(tmp_path / "node", name=xc.HOST, gpus=2, total_mib=xc.B200_MIB,
                       sim={"load_seconds": 0.3, "time_scale": 1000, "cuda_context_mib": CUDA_CONTEXT_MIB
                            + HIDDEN_EXTRA_MIB})
    case = xc.Case(models.seed, (0,), tuple(xc.SEED_EXTRA_ARGS))
    store = CalibrationStore(tmp_path / "calibration.json")
    key = ("NVIDIA B200", "0.5.23", "qwen3.6-27b", 1)

    first = case.plan(node, calibration_bytes=store.correction_bytes(*key))
    sizing = dry_run(node, case.server_argv(first), [0])
    info, log = _readback(sizing)
    assert compare_expected(first, info)  # the first run's readback differs, and says so
    calibration = calibrate(first, info, log, gpu_name=key[0], model=key[2])
    assert calibration.exact and calibration.correction_bytes == HIDDEN_EXTRA_MIB * MIB
    assert "1,536 MiB correction" in calibration.report_line()
    store.record(calibration)

    second = case.plan(node, calibration_bytes=store.correction_bytes(*key))
    sizing = dry_run(node, case.server_argv(second), [0])
    assert sizing.server_info_limits() == second.expected
    assert compare_expected(second, _readback(sizing)[0]) == []
    assert "calibration from readback" in render_budget_table(second)
    # and a third readback confirms the correction instead of piling another one on
    again = calibrate(second, *_readback(sizing), gpu_name=key[0], model=key[2])
    assert again.correction_bytes == HIDDEN_EXTRA_MIB * MIB and not again.mismatches


def test_another_sglang_version_is_named_and_keyed_apart(xc, models, seed_node, tmp_path):
    case = xc.Case(models.seed, (0,), tuple(xc.SEED_EXTRA_ARGS))
    plan = case.plan(seed_node)
    info, log = _readback(dry_run(seed_node, case.server_argv(plan), [0]), version="0.5.24")
    calibration = calibrate(plan, info, log, gpu_name="NVIDIA B200", model="qwen3.6-27b")
    assert calibration.correction_bytes == 0 and calibration.exact
    assert "SGLang 0.5.24 is not 0.5.23" in calibration.report_line()
    store = CalibrationStore(tmp_path / "calibration.json")
    store.record(calibration)
    assert store.correction_bytes("NVIDIA B200", "0.5.23", "qwen3.6-27b", 1) == 0
    assert "NVIDIA B200|0.5.24|qwen3.6-27b|tp1" in store.load()
    assert pre_load_from_log("no such line") is None


def test_readback_without_the_log_line_still_finds_the_memory(xc, models, tmp_path):
    """The readiness check sees only the log's tail: /server_info's values alone pin the memory down."""
    node = create_node(tmp_path / "node", name=xc.HOST, gpus=1, total_mib=xc.B200_MIB,
                       sim={"cuda_context_mib": CUDA_CONTEXT_MIB + 700})
    case = xc.Case(models.llama, (0,))
    plan = case.plan(node)
    info, _ = _readback(dry_run(node, case.server_argv(plan), [0]))
    calibration = calibrate(plan, info, "", gpu_name="NVIDIA B200", model="llama3.1-8b")
    # one 64-token KV page of this model is 8 MiB: the values pin the memory down to within a page
    assert calibration.exact and abs(calibration.correction_bytes - 700 * MIB) <= 8 * MIB
    second = case.plan(node, calibration_bytes=calibration.correction_bytes)
    assert dry_run(node, case.server_argv(second), [0]).server_info_limits() == second.expected


def _info_as_planned(plan, version="0.5.23"):
    expected = plan.expected
    return parse_server_info({"version": version, "max_total_num_tokens": expected["max_total_num_tokens"],
                              "internal_states": [{"effective_max_running_requests_per_dp":
                                                   expected["max_running_requests"],
                                                   "max_mamba_cache_size": expected["max_mamba_cache_size"]}]},
                             server="sim-node-0:30000")


def test_a_pinned_kv_pool_is_calibrated_from_the_log_not_claimed_exact(xc, models, tmp_path):
    """With --max-total-tokens below what memory allows, SGLang reports the cap at any memory: only the log's
    figure measures the memory (here 700 MiB less than the plan assumed)."""
    node = create_node(tmp_path / "node", name=xc.HOST, gpus=1, total_mib=xc.B200_MIB)
    case = xc.Case(models.llama, (0,), ("--max-total-tokens", "65536"))
    plan = case.plan(node)
    assert plan.expected["max_total_num_tokens"] == 65536
    planned = plan.budget_row("pre-load free (SGLang baseline)")
    logged_gib = round((planned - 700 * MIB) / GIB, 2)
    log = f"[2026-12-01 12:00:00] Load weight begin. avail mem={logged_gib:.2f} GB"
    calibration = calibrate(plan, _info_as_planned(plan), log, gpu_name="NVIDIA B200", model="llama3.1-8b")
    assert not calibration.mismatches and not calibration.exact and calibration.unmeasured is None
    assert calibration.measured_pre_load_bytes == calibration.logged_pre_load_bytes == int(logged_gib * GIB)
    assert abs(calibration.correction_bytes - 700 * MIB) <= 10 * MIB
    assert "estimated from the log only" in calibration.report_line()
    # without the line nothing is measured, and nothing is learnt
    blind = calibrate(plan, _info_as_planned(plan), "", gpu_name="NVIDIA B200", model="llama3.1-8b")
    assert blind.unmeasured and blind.correction_bytes == 0


def test_a_pool_the_memory_sizes_is_still_exact_without_the_log(xc, models, tmp_path):
    """--max-total-tokens above what memory gives does not bind: the readback measures the memory as before."""
    node = create_node(tmp_path / "node", name=xc.HOST, gpus=1, total_mib=xc.B200_MIB)
    case = xc.Case(models.llama, (0,), ("--max-total-tokens", "100000000"))
    plan = case.plan(node)
    assert plan.expected["max_total_num_tokens"] < 100000000
    calibration = calibrate(plan, _info_as_planned(plan), "", gpu_name="NVIDIA B200", model="llama3.1-8b")
    assert calibration.exact and calibration.unmeasured is None and calibration.correction_bytes == 0


def test_a_server_on_another_device_learns_no_correction_and_says_why(xc, models, tmp_path):
    """A CPU server behind a node that reports a GPU (the real SGLang tests) logs host memory: that is not the
    GPU memory the plan sized, so the next plan must not start from it."""
    node = create_node(tmp_path / "node", name=xc.HOST, gpus=1, total_mib=xc.B200_MIB)
    case = xc.Case(models.llama, (0,), ("--device", "cpu", "--max-total-tokens", "32768"))
    plan = case.plan(node, calibration_bytes=123 * MIB)
    log = "[2026-12-01 14:51:26] Load weight begin. avail mem=21.60 GB"
    calibration = calibrate(plan, _info_as_planned(plan), log, gpu_name="NVIDIA B200", model="llama3.1-8b")
    assert calibration.unmeasured and "--device cpu" in calibration.unmeasured and not calibration.exact
    assert calibration.correction_bytes == 123 * MIB  # the carried correction, untouched
    assert calibration.logged_pre_load_bytes == int(21.60 * GIB)
    line = calibration.report_line()
    assert "22,118 MiB free before the weights" in line and "no correction learnt" in line


def test_the_log_line_picks_the_memory_among_those_the_values_allow(xc, models, tmp_path):
    """A KV page of this model is 8 MiB: several MiB give the same values. The log's two-decimal GiB figure
    (within 5 MiB) picks the one nearest it, the truth to within the log's own rounding."""
    node = create_node(tmp_path / "node", name=xc.HOST, gpus=1, total_mib=xc.B200_MIB,
                       sim={"cuda_context_mib": CUDA_CONTEXT_MIB + 700})
    case = xc.Case(models.llama, (0,))
    plan = case.plan(node)
    sizing = dry_run(node, case.server_argv(plan), [0])
    info, log = _readback(sizing)
    calibration = calibrate(plan, info, log, gpu_name="NVIDIA B200", model="llama3.1-8b")
    assert calibration.exact and calibration.logged_pre_load_bytes == pre_load_from_log(log)
    assert abs(calibration.measured_pre_load_bytes - sizing.pre_load_free_bytes) <= 6 * MIB
    assert calibration.measured_pre_load_bytes % MIB == 0
    # The exact choice: the ends of the matching MiB are what a log figure far below or above picks, and the
    # log's own figure picks the matching MiB nearest it (the plan, 700 MiB above, would pick the top end).
    def measured(log_mib: float) -> int:
        log_line = f"Load weight begin. avail mem={log_mib * MIB / GIB:.2f} GB"
        return calibrate(plan, info, log_line, gpu_name="NVIDIA B200", model="llama3.1-8b").measured_pre_load_bytes
    truth_mib = sizing.pre_load_free_bytes / MIB
    lowest, highest = measured(truth_mib - 60) // MIB, measured(truth_mib + 60) // MIB
    assert lowest < highest
    logged_mib = calibration.logged_pre_load_bytes / MIB
    assert calibration.measured_pre_load_bytes == min(max(round(logged_mib), lowest), highest) * MIB


def test_a_readback_no_memory_explains_is_measured_by_the_log_or_not_at_all(xc, models, tmp_path):
    """Values the plan's flags cannot produce at any memory (another launch answered): the log's figure is
    the estimate; without it the plan's own assumption stands, and neither is exact."""
    node = create_node(tmp_path / "node", name=xc.HOST, gpus=1, total_mib=xc.B200_MIB)
    case = xc.Case(models.llama, (0,))
    plan = case.plan(node, calibration_bytes=64 * MIB)
    expected = plan.expected
    info = parse_server_info({"version": "0.5.23", "max_total_num_tokens": expected["max_total_num_tokens"] * 100,
                              "internal_states": [{"effective_max_running_requests_per_dp":
                                                   expected["max_running_requests"]}]}, server="sim-node-0:30000")
    log = "Load weight begin. avail mem=150.00 GB"
    estimated = calibrate(plan, info, log, gpu_name="NVIDIA B200", model="llama3.1-8b")
    assert estimated.mismatches and not estimated.exact and estimated.unmeasured is None
    assert estimated.measured_pre_load_bytes == 150 * GIB
    planned = plan.budget_row("pre-load free (SGLang baseline)")
    assert estimated.correction_bytes == 64 * MIB + planned - 150 * GIB
    blind = calibrate(plan, info, "", gpu_name="NVIDIA B200", model="llama3.1-8b")
    assert blind.measured_pre_load_bytes == planned and not blind.exact and blind.correction_bytes == 64 * MIB


def test_a_readback_as_planned_keeps_the_correction_the_plan_carried(xc, models, tmp_path):
    node = create_node(tmp_path / "node", name=xc.HOST, gpus=2, total_mib=xc.B200_MIB)
    case = xc.Case(models.llama, (0, 1))
    plan = case.plan(node, calibration_bytes=300 * MIB)
    calibration = calibrate(plan, _info_as_planned(plan), "", gpu_name="NVIDIA B200", model="llama3.1-8b")
    assert calibration.exact and not calibration.mismatches and calibration.correction_bytes == 300 * MIB
    assert calibration.measured_pre_load_bytes == calibration.planned_pre_load_bytes
    assert calibration.tp_size == 2 and calibration.key == "NVIDIA B200|0.5.23|llama3.1-8b|tp2"
    assert calibration.applied_correction_bytes == 300 * MIB and calibration.logged_pre_load_bytes is None


def test_a_server_that_names_no_version_is_keyed_as_unknown(xc, models, tmp_path):
    node = create_node(tmp_path / "node", name=xc.HOST, gpus=1, total_mib=xc.B200_MIB)
    case = xc.Case(models.llama, (0,))
    plan = case.plan(node)
    calibration = calibrate(plan, _info_as_planned(plan, version=None), "", gpu_name="NVIDIA B200", model="m")
    assert calibration.sglang_version == "unknown" and "SGLang unknown is not 0.5.23" in calibration.report_line()


def test_a_hybrid_models_readback_matches_its_mamba_slots_too(xc, models, seed_node):
    """The seed (Qwen3.6, hybrid): the readback's Mamba slots and request cap are part of the match."""
    case = xc.Case(models.seed, (0,), tuple(xc.SEED_EXTRA_ARGS))
    plan = case.plan(seed_node)
    assert plan.expected["max_mamba_cache_size"] is not None
    calibration = calibrate(plan, _info_as_planned(plan), "", gpu_name="NVIDIA B200", model="qwen3.6-27b")
    assert calibration.exact and calibration.correction_bytes == 0
    # a request cap SGLang did not report: the tokens alone do not match, nothing is exact
    expected = plan.expected
    other = parse_server_info({"version": "0.5.23", "max_total_num_tokens": expected["max_total_num_tokens"],
                               "internal_states": [{"effective_max_running_requests_per_dp":
                                                    expected["max_running_requests"] + 1,
                                                    "max_mamba_cache_size": expected["max_mamba_cache_size"]}]},
                              server="sim-node-0:30000")
    mismatched = calibrate(plan, other, "", gpu_name="NVIDIA B200", model="qwen3.6-27b")
    assert mismatched.mismatches and not mismatched.exact


def _hidden_overhead_node(xc, tmp_path, extra_mib=HIDDEN_EXTRA_MIB, total_mib=None):
    return create_node(tmp_path / "node", name=xc.HOST, gpus=1, total_mib=total_mib or xc.B200_MIB,
                       sim={"cuda_context_mib": CUDA_CONTEXT_MIB + extra_mib})


def test_sglangs_own_request_cap_under_speculative_decoding_is_sized_as_sglang_does(xc, models, tmp_path):
    """sglang_defaults mode emits no --max-running-requests: with NEXTN SGLang's default cap of 48 applies, and
    the search for the memory sizes with it."""
    from fleetgen.tuning.planner import TunerBounds

    node = _hidden_overhead_node(xc, tmp_path)
    case = xc.Case(models.seed, (0,), tuple(xc.SEED_EXTRA_ARGS), bounds=TunerBounds(mode="sglang_defaults"))
    plan = case.plan(node)
    assert "--max-running-requests" not in plan.flags
    info, _ = _readback(dry_run(node, case.server_argv(plan), [0]))
    calibration = calibrate(plan, info, "", gpu_name="NVIDIA B200", model="qwen3.6-27b")
    assert calibration.mismatches and calibration.exact
    assert abs(calibration.correction_bytes - HIDDEN_EXTRA_MIB * MIB) <= 4 * MIB


def test_a_server_without_a_radix_cache_is_sized_without_one(xc, models, tmp_path):
    """SGLang's own sizing (no --max-mamba-cache-size) without a radix cache: one Mamba slot per request, the
    speculative default of 48 requests; the search for the memory sizes it the same way."""
    from fleetgen.tuning.planner import TunerBounds

    node = _hidden_overhead_node(xc, tmp_path)
    case = xc.Case(models.seed, (0,), (*xc.SEED_EXTRA_ARGS[:8], "--disable-radix-cache", "--context-length", "8192"),
                   bounds=TunerBounds(mode="sglang_defaults"))
    plan = case.plan(node)
    assert plan.expected["max_mamba_cache_size"] == 48
    info, _ = _readback(dry_run(node, case.server_argv(plan), [0]))
    calibration = calibrate(plan, info, "", gpu_name="NVIDIA B200", model="qwen3.6-27b")
    assert calibration.mismatches and calibration.exact
    assert abs(calibration.correction_bytes - HIDDEN_EXTRA_MIB * MIB) <= 4 * MIB


def test_a_server_on_the_gpu_named_explicitly_is_measured_as_usual(xc, models, tmp_path):
    node = _hidden_overhead_node(xc, tmp_path, extra_mib=700)
    case = xc.Case(models.llama, (0,), ("--device", "cuda"))
    plan = case.plan(node)
    info, log = _readback(dry_run(node, case.server_argv(plan), [0]))
    calibration = calibrate(plan, info, log, gpu_name="NVIDIA B200", model="llama3.1-8b")
    assert calibration.unmeasured is None and calibration.exact
    assert abs(calibration.correction_bytes - 700 * MIB) <= 8 * MIB


def test_a_pinned_pool_without_the_log_line_says_why_nothing_is_learnt(xc, models, tmp_path):
    node = create_node(tmp_path / "node", name=xc.HOST, gpus=1, total_mib=xc.B200_MIB)
    case = xc.Case(models.llama, (0,), ("--max-total-tokens", "65536"))
    plan = case.plan(node)
    blind = calibrate(plan, _info_as_planned(plan), "", gpu_name="NVIDIA B200", model="llama3.1-8b")
    assert blind.unmeasured == "--max-total-tokens pins the KV pool and the log had no Load weight line"
    assert blind.measured_pre_load_bytes == blind.planned_pre_load_bytes and not blind.exact


def _measured(xc, node, case):
    """The calibration of ``case``'s first plan on ``node`` from its dry-run readback, without the log line."""
    plan = case.plan(node)
    info, _ = _readback(dry_run(node, case.server_argv(plan), [0]))
    return plan, calibrate(plan, info, "", gpu_name="NVIDIA B200", model=case.model_dir.name)


@pytest.mark.parametrize("model, args, bounds, total_mib", [
    # the user's own caps: the tuner emits no flag of them, the sizing reads them from the options
    ("llama", ("--max-running-requests", "32"), "tuned", None),
    # on 80 GB SGLang's request cap follows the context (tokens / context x 512, at least 2,048)
    ("llama", ("--context-length", "4096"), "sglang_defaults", 81_559),
    ("seed", (*SEED_SPEC_ARGS, "--max-mamba-cache-size", "120", "--max-running-requests", "24"), "tuned", None),
])
def test_the_users_own_caps_are_sized_as_sglang_sizes_them(xc, models, tmp_path, model, args, bounds, total_mib):
    from fleetgen.tuning.planner import TunerBounds

    node = _hidden_overhead_node(xc, tmp_path, total_mib=total_mib)
    case = xc.Case(getattr(models, model), (0,), args, bounds=TunerBounds(mode=bounds))
    plan, calibration = _measured(xc, node, case)
    assert not any(flag in plan.flags for flag in args if flag.startswith("--max") or flag == "--context-length")
    assert calibration.mismatches and calibration.exact
    assert abs(calibration.correction_bytes - HIDDEN_EXTRA_MIB * MIB) <= 8 * MIB


def test_a_context_bound_the_tuner_emits_sizes_sglangs_own_request_cap(xc, models, tmp_path):
    """sglang_defaults mode with a context-length bound: the plan's --context-length (not the model's 131,072)
    sets SGLang's own request cap on 80 GB (tokens / context x 512), and the search for the memory uses it."""
    from fleetgen.tuning.planner import TunerBounds

    node = _hidden_overhead_node(xc, tmp_path, total_mib=81_559)
    case = xc.Case(models.llama, (0,), bounds=TunerBounds(mode="sglang_defaults", context_length=4096))
    plan, calibration = _measured(xc, node, case)
    assert plan.flags["--context-length"] == 4096 and "--max-running-requests" not in plan.flags
    assert calibration.mismatches and calibration.exact
    assert abs(calibration.correction_bytes - HIDDEN_EXTRA_MIB * MIB) <= 8 * MIB
