"""The launch plan: the seed acceptance, the objective's constraints, pins, opt-ins and modes."""

import json

import pytest

from fleetgen.errors import ConfigError, PlanError
from fleetgen.tuning.profile import GIB, MIB, LaunchOptions, profile_model
from fleetgen.tuning.planner import (CUDA_CONTEXT_MIB, ServerPlan, TunerBounds, Workload, plan_server,
                            render_budget_table)
from fleetgen.tuning.sizing import size_pools

TUNER_FLAGS = {"--mem-fraction-static", "--max-mamba-cache-size", "--max-running-requests", "--context-length",
               "--cuda-graph-max-bs-decode", "--chunked-prefill-size", "--mamba-radix-cache-strategy",
               "--mamba-ssm-dtype"}


def _plan(cases, profile, options, *, gpus=None, bounds=None, workload=None, port=30000, gpu_ids=None):
    gpus = gpus or [cases.gpu_row(0)]
    return plan_server(host="gpu-node-1", gpu_ids=gpu_ids or [g["index"] for g in gpus], port=port, gpus=gpus,
                       profile=profile, options=options, workload=workload or cases.SEED_WORKLOAD,
                       bounds=bounds or TunerBounds())


def _resize_from_args(profile, plan, options, pre_free):
    """SGLang's arithmetic fed with the plan's flags as they travel on the command line (strings)."""
    parsed = LaunchOptions.from_args(plan.command_args())
    defaults = LaunchOptions().to_dict()
    merged = options.replace(**{k: v for k, v in parsed.to_dict().items() if v != defaults[k]})
    return size_pools(profile, pre_load_free_bytes=pre_free, mem_fraction_static=merged.mem_fraction_static,
                      max_running_requests=merged.max_running_requests,
                      max_mamba_cache_size=merged.max_mamba_cache_size,
                      context_length=merged.context_length or 8192, page_size=merged.page_size or 1)


def test_seed_kv_pool_is_a_multiple_of_blackwells_page(cases, seed_profile, seed_options):
    """Qwen3.5/3.6 with speculative decoding on B200: SGLang picks trtllm_mha with page size 64
    (arg_groups/model_overrides/qwen3_5.py), so its KV pool is floored to a multiple of 64 tokens."""
    plan = _plan(cases, seed_profile, seed_options)
    assert plan.expected["max_total_num_tokens"] % 64 == 0
    pre = (cases.B200_TOTAL_MIB - CUDA_CONTEXT_MIB) * MIB
    unpaged = _resize_from_args(seed_profile, plan, seed_options, pre)
    assert unpaged.max_total_num_tokens > plan.expected["max_total_num_tokens"]  # page 1 would expect more


def test_seed_acceptance_on_seven_b200(cases, seed_profile, seed_options):
    plans = [_plan(cases, seed_profile, seed_options, gpus=[cases.gpu_row(i)], port=30000 + i) for i in range(7)]
    for plan in plans:
        requests = plan.expected["max_running_requests"]
        assert requests >= 60  # the seed's starting flags gave 16, the hand tuning 40
        assert plan.expected["max_mamba_cache_size"] == 5 * requests
        assert plan.expected["max_total_num_tokens"] >= requests * 8192  # KV for all at full context
        assert plan.flags["--max-running-requests"] == requests
        assert plan.flags["--cuda-graph-max-bs-decode"] == requests
        assert plan.flags["--chunked-prefill-size"] == 2048  # prompts up to 1,900 tokens
        assert set(plan.flags) <= TUNER_FLAGS
        # The user's own flags are not repeated (context length, radix strategy).
        assert "--context-length" not in plan.flags and "--mamba-radix-cache-strategy" not in plan.flags
    assert len({json.dumps(p.flags, sort_keys=True) for p in plans}) == 1  # identical GPUs, identical plans


def test_seed_plan_stays_within_the_free_memory(cases, seed_profile, seed_options):
    plan = _plan(cases, seed_profile, seed_options)
    rows = {row["item"].strip(): row["bytes"] for row in plan.budget}
    assert rows["stays free"] >= 0
    assert rows["SGLang reserve"] == 10_240 * MIB
    assert rows["user margin"] == 1024 * MIB
    # The static rows add up to the static budget, the non-static ones to the rest of pre-load free.
    static_parts = ("weights per GPU", "multimodal cache reservation", "state slots", "speculative buffers",
                    "KV pool", "unused in the static budget")
    assert sum(rows[k] for k in static_parts) == rows["static budget"]
    assert rows["static budget"] + rows["non-static (free after pools)"] == rows["pre-load free (SGLang baseline)"]
    assert rows["pre-load free (SGLang baseline)"] == (cases.B200_TOTAL_MIB - CUDA_CONTEXT_MIB) * MIB
    # One more request would not fit: mfs is as high as the reserve, margin and draft pool allow.
    mfs = plan.flags["--mem-fraction-static"]
    pre = rows["pre-load free (SGLang baseline)"]
    assert pre - pre * (mfs + 0.001) < rows["SGLang reserve"] + rows["user margin"] + rows["MTP draft KV pool"]


def test_seed_flags_reproduce_the_expected_values_through_the_command_line(cases, seed_profile, seed_options):
    plan = _plan(cases, seed_profile, seed_options)
    pre = (cases.B200_TOTAL_MIB - CUDA_CONTEXT_MIB) * MIB
    sizing = _resize_from_args(seed_profile, plan, seed_options.replace(page_size=64), pre)
    assert sizing.ok
    assert {"max_running_requests": sizing.effective_max_running_requests,
            "max_mamba_cache_size": sizing.max_mamba_cache_size,
            "max_total_num_tokens": sizing.max_total_num_tokens} == plan.expected


def test_plan_is_deterministic_and_json_safe(cases, seed_profile, seed_options):
    first = _plan(cases, seed_profile, seed_options)
    second = _plan(cases, seed_profile, seed_options)
    assert first.to_dict() == second.to_dict()
    restored = ServerPlan.from_dict(json.loads(json.dumps(first.to_dict())))
    assert restored == first
    assert restored.command_args() == first.command_args()


def test_foreign_process_gets_its_own_smaller_plan_and_ours_counts_as_free(cases, seed_profile, seed_options):
    clean = _plan(cases, seed_profile, seed_options)
    foreign = _plan(cases, seed_profile, seed_options, gpus=[cases.gpu_row(
        3, processes=[{"pid": 4242, "process_name": "python", "used_mib": 20_000, "ours": False}])], port=30003)
    ours = _plan(cases, seed_profile, seed_options, gpus=[cases.gpu_row(
        4, processes=[{"pid": 777, "process_name": "sglang", "used_mib": 170_000, "ours": True}])], port=30004)
    assert foreign.expected["max_running_requests"] < clean.expected["max_running_requests"]
    assert ours.flags == clean.flags and ours.expected == clean.expected
    foreign_row = next(r for r in foreign.budget if r["item"] == "held by other processes")
    assert foreign_row["bytes"] == 20_000 * MIB


def test_tensor_parallel_server_plans_for_the_smallest_gpu(cases, qwen3_next_config):
    profile = profile_model(qwen3_next_config, 160 * 10**9, LaunchOptions(tp_size=2))
    gpus = [cases.gpu_row(0), cases.gpu_row(1, processes=[{"pid": 9, "process_name": "x", "used_mib": 8000,
                                                            "ours": False}])]
    plan = _plan(cases, profile, LaunchOptions(tp_size=2), gpus=gpus)
    pre = next(r["bytes"] for r in plan.budget if r["item"] == "pre-load free (SGLang baseline)")
    assert pre == (cases.B200_TOTAL_MIB - 8000 - CUDA_CONTEXT_MIB - 400) * MIB  # NCCL buffers with tp > 1
    assert plan.flags["--context-length"] == 6144  # 1,900 + 4,096 rounded up to 1024
    assert plan.flags["--mamba-radix-cache-strategy"] == "extra_buffer"
    with pytest.raises(PlanError, match="tp size 2"):
        _plan(cases, profile, LaunchOptions(tp_size=2), gpus=[cases.gpu_row(0)])


def test_user_pins_are_used_and_not_emitted(cases, seed_config):
    args = cases.SEED_EXTRA_ARGS + ["--max-running-requests", "40", "--mem-fraction-static", "0.9",
                                    "--chunked-prefill-size", "4096"]
    options = LaunchOptions.from_args(args)
    profile = profile_model(seed_config, cases.SEED_WEIGHTS_BYTES, options)
    plan = _plan(cases, profile, options)
    assert not {"--max-running-requests", "--mem-fraction-static", "--chunked-prefill-size"} & set(plan.flags)
    assert plan.expected["max_running_requests"] == 40
    assert plan.flags["--max-mamba-cache-size"] == 200


def test_bound_caps_requests(cases, seed_profile, seed_options):
    plan = _plan(cases, seed_profile, seed_options, bounds=TunerBounds(max_running_requests=24))
    assert plan.expected["max_running_requests"] == 24
    assert plan.flags["--max-mamba-cache-size"] == 120


def test_opt_ins_raise_concurrency(cases, qwen3_next_config):
    options = LaunchOptions.from_args(["--speculative-algorithm", "NEXTN", "--context-length", "8192"])
    qwen3_next_config["num_nextn_predict_layers"] = 1
    profile = profile_model(qwen3_next_config, 160 * 10**9, options)
    base = _plan(cases, profile, options)
    bf16 = _plan(cases, profile, options, bounds=TunerBounds(bf16_ssm_state=True))
    no_buffer = _plan(cases, profile, options, bounds=TunerBounds(no_buffer_radix=True))
    assert base.flags["--mamba-radix-cache-strategy"] == "extra_buffer"
    assert bf16.flags["--mamba-ssm-dtype"] == "bfloat16"
    assert no_buffer.flags["--mamba-radix-cache-strategy"] == "no_buffer"
    assert no_buffer.expected["max_mamba_cache_size"] == 3 * no_buffer.expected["max_running_requests"]
    assert bf16.expected["max_running_requests"] > base.expected["max_running_requests"]
    assert no_buffer.expected["max_running_requests"] > base.expected["max_running_requests"]


def test_opt_in_does_not_override_the_users_strategy(cases, seed_profile, seed_options):
    plan = _plan(cases, seed_profile, seed_options, bounds=TunerBounds(no_buffer_radix=True))
    assert "--mamba-radix-cache-strategy" not in plan.flags
    assert any("no_buffer radix strategy not applied" in note for note in plan.notes)


def test_dense_and_mla_plans_hold_every_request_at_full_context(cases):
    for name, weights, tp in (("llama-3.1-8b-style.json", 16 * 10**9, 1), ("deepseek-v3-style.json", 680 * 10**9, 8)):
        options = LaunchOptions(tp_size=tp)
        profile = profile_model(cases.load_config(name), weights, options)
        plan = _plan(cases, profile, options, gpus=[cases.gpu_row(i) for i in range(tp)])
        requests = plan.expected["max_running_requests"]
        assert plan.expected["max_mamba_cache_size"] is None
        assert "--max-mamba-cache-size" not in plan.flags
        assert requests * 6144 <= plan.expected["max_total_num_tokens"] < (requests + 2) * 6144 + 10**6


def test_model_that_does_not_fit_is_a_plan_error(cases, seed_profile, seed_options):
    with pytest.raises(PlanError, match="weights need"):
        _plan(cases, seed_profile, seed_options, gpus=[cases.gpu_row(0, total_mib=40_960)])
    with pytest.raises(PlanError, match="not even one request fits"):
        _plan(cases, seed_profile, seed_options, gpus=[cases.gpu_row(0, total_mib=62_000)])


def test_context_longer_than_the_model_is_refused(cases, qwen3_next_config):
    profile = profile_model(qwen3_next_config, 160 * 10**9, LaunchOptions())
    with pytest.raises(PlanError, match="exceeds the model's 262144"):
        _plan(cases, profile, LaunchOptions(), bounds=TunerBounds(context_length=300_000))


def test_sglang_defaults_mode_emits_no_memory_flags_and_predicts_sglang(cases, seed_config):
    options = LaunchOptions.from_args(cases.SEED_EXTRA_ARGS + ["--max-mamba-cache-size", "80"])
    profile = profile_model(seed_config, cases.SEED_WEIGHTS_BYTES, options)
    plan = _plan(cases, profile, options, bounds=TunerBounds(mode="sglang_defaults"))
    assert plan.flags == {}
    assert plan.expected["max_running_requests"] == 16  # the seed's starting point: 80 // 5
    assert plan.expected["max_mamba_cache_size"] == 80
    assert "(none: SGLang sizes automatically)" in render_budget_table(plan)


def test_sglang_defaults_auto_fraction_and_spec_default(cases, qwen3_next_config):
    qwen3_next_config["num_nextn_predict_layers"] = 1
    options = LaunchOptions(speculative_algorithm="NEXTN")
    profile = profile_model(qwen3_next_config, 80 * 10**9, options)  # an FP8 checkpoint on one B200
    plan = _plan(cases, profile, options, bounds=TunerBounds(mode="sglang_defaults"))
    static = next(r for r in plan.budget if r["item"] == "static budget")
    assert "0.854" in static["note"]  # B200 tp1 with chunk 16384 and decode bs 512
    assert plan.expected["max_running_requests"] == 48  # the speculative default, below the Mamba cap


def test_budget_table_is_readable(cases, seed_profile, seed_options):
    text = render_budget_table(_plan(cases, seed_profile, seed_options))
    lines = text.splitlines()
    assert lines[0].startswith("plan for gpu-node-1:30000 GPUs [0]")
    assert "--mem-fraction-static 0." in lines[1] and "--max-mamba-cache-size" in lines[1]
    assert all(word in text for word in ("MiB", "GiB", "(2.1)", "(2.2)", "(2.3)", "(1.1)", "stays free"))
    header = next(line for line in lines if line.strip().startswith("item"))
    assert header.index("MiB") > 0


def test_workload_and_bounds_validate_themselves():
    with pytest.raises(ConfigError, match="prompt_tokens_mean"):
        Workload(max_output_tokens=10, prompt_tokens_mean=500, prompt_tokens_max=100, prompt_count=1)
    with pytest.raises(ConfigError, match="mode"):
        TunerBounds(mode="fastest")
    with pytest.raises(ConfigError, match="margin_mib"):
        TunerBounds(margin_mib=-1)
    assert Workload(max_output_tokens=4096, prompt_tokens_mean=270, prompt_tokens_max=1900,
                    prompt_count=3).full_context_tokens == 5996
    assert GIB == 1024 * MIB
