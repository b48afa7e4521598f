"""The budget table's state-slot note names the radix strategy the ratio comes from, or that it is off; a
sliding-window model's table shows its SWA pool, and its readback is checked against the planned SWA tokens."""

from fleetgen.nodes.readiness import parse_server_info
from fleetgen.tuning.budget import compare_expected
from fleetgen.tuning.planner import TunerBounds, plan_server
from fleetgen.tuning.profile import LaunchOptions, profile_model


def _state_note(cases, args):
    options = LaunchOptions.from_args(args)
    profile = profile_model(cases.load_config("seed-qwen3.6-27b.json"), cases.SEED_WEIGHTS_BYTES, options)
    plan = plan_server(host="gpu-node-1", gpu_ids=[0], port=30000, gpus=[cases.gpu_row(0)], profile=profile,
                       options=options, workload=cases.SEED_WORKLOAD, bounds=TunerBounds())
    return next(row["note"] for row in plan.budget if row["item"].strip() == "state slots")


def test_state_slot_note_says_radix_off_without_a_radix_cache(cases):
    assert _state_note(cases, ["--disable-radix-cache"]).endswith("; ratio 1 slots/request (radix off) (2.3)")


def test_state_slot_note_names_the_radix_strategy(cases):
    assert _state_note(cases, cases.SEED_EXTRA_ARGS).endswith("slots/request (extra_buffer) (2.3)")


def _gpt_oss_plan(cases, args=()):
    from sglang_sim.presets import preset_config

    options = LaunchOptions.from_args(list(args))
    profile = profile_model(preset_config("gpt-oss-20b"), 13_761_316_904, options)
    return plan_server(host="gpu-node-1", gpu_ids=[0], port=30000, gpus=[cases.gpu_row(0)], profile=profile,
                       options=options, workload=cases.SEED_WORKLOAD, bounds=TunerBounds())


def test_sliding_window_models_table_shows_the_swa_pool_with_its_ratio(cases):
    plan = _gpt_oss_plan(cases, ["--swa-full-tokens-ratio", "0.5"])
    swa = plan.expected["swa_max_total_num_tokens"]
    row = next(row for row in plan.budget if "SWA" in row["item"])
    assert row == {"item": "  SWA KV pool", "bytes": swa * 24_576,
                   "note": f"{swa} tokens (--swa-full-tokens-ratio 0.5 x full) x 24576 B/token (2.5)"}


def test_static_budget_rows_add_up_with_the_swa_pool(cases):
    """The indented rows under the static budget, the SWA pool and what is left unused among them, sum to it."""
    budget = _gpt_oss_plan(cases).budget
    start = next(i for i, row in enumerate(budget) if row["item"] == "static budget")
    end = next(i for i, row in enumerate(budget) if row["item"] == "non-static (free after pools)")
    parts = budget[start + 1:end]
    assert [row["item"] for row in parts] == ["  weights per GPU", "  multimodal cache reservation", "  KV pool",
                                              "  SWA KV pool", "  unused in the static budget"]
    assert sum(row["bytes"] for row in parts) == budget[start]["bytes"]
    assert 0 <= parts[-1]["bytes"] < parts[-2]["bytes"]


def _swa_readback(plan, swa_tokens):
    state = {"effective_max_running_requests_per_dp": plan.expected["max_running_requests"],
             "max_mamba_cache_size": None, "memory_usage": {"token_capacity_swa": swa_tokens}}
    body = {"max_total_num_tokens": plan.expected["max_total_num_tokens"], "internal_states": [state, dict(state)]}
    return parse_server_info(body, server=plan.server)


def test_swa_pool_readback_that_agrees_gives_no_lines(cases):
    plan = _gpt_oss_plan(cases)
    assert compare_expected(plan, _swa_readback(plan, plan.expected["swa_max_total_num_tokens"])) == []


def test_swa_pool_readback_that_differs_names_the_field_and_the_source(cases):
    plan = _gpt_oss_plan(cases)
    swa = plan.expected["swa_max_total_num_tokens"]
    assert compare_expected(plan, _swa_readback(plan, swa - 64)) == [
        f"gpu-node-1:30000: swa_max_total_num_tokens: expected {swa}, SGLang reports {swa - 64} "
        f"(internal_states[{index}].memory_usage.token_capacity_swa)" for index in (0, 1)]


def test_swa_pool_missing_from_the_readback_is_reported(cases):
    plan = _gpt_oss_plan(cases)
    swa = plan.expected["swa_max_total_num_tokens"]
    assert compare_expected(plan, _swa_readback(plan, None)) == [
        f"gpu-node-1:30000: swa_max_total_num_tokens: expected {swa}, "
        f"/server_info has no internal_states[{index}].memory_usage.token_capacity_swa" for index in (0, 1)]
