"""The plan's inputs and its refusals: the inventory it is given, the context and chunk it derives from
the workload, calibration, our own processes, opt-ins that do not apply, SGLang's automatic sizing,
user pins, repeated back-offs, and the exact text of each error."""

import pytest

from fleetgen.errors import ModelConfigError, PlanError
from fleetgen.tuning.planner import CUDA_CONTEXT_MIB, TunerBounds, Workload, backoff, plan_server
from fleetgen.tuning.profile import GIB, MIB, LaunchOptions, profile_model
from fleetgen.tuning.sizing import gpu_table, sglang_reserve_mb

SERVER = "[host gpu-node-1, server gpu-node-1:30000] "


def _workload(prompt_max=1900, output=4096):
    return Workload(max_output_tokens=output, prompt_tokens_mean=100.0, prompt_tokens_max=prompt_max,
                    prompt_count=1000)


def _plan(cases, profile, options, *, gpus=None, gpu_ids=None, bounds=None, workload=None, calibration_bytes=0):
    gpus = gpus or [cases.gpu_row(0)]
    return plan_server(host="gpu-node-1", gpu_ids=gpu_ids or [g["index"] for g in gpus], port=30000, gpus=gpus,
                       profile=profile, options=options, workload=workload or cases.SEED_WORKLOAD,
                       bounds=bounds or TunerBounds(), calibration_bytes=calibration_bytes)


def _row_bytes(plan, item):
    return next(r["bytes"] for r in plan.budget if r["item"].strip() == item)


def _llama(cases, weights=16 * 10**9, args=()):
    options = LaunchOptions.from_args(list(args))
    return profile_model(cases.load_config("llama-3.1-8b-style.json"), weights, options), options


# -- errors ---------------------------------------------------------------------------------------------

def test_inventory_rows_of_other_gpus_are_refused_with_the_server(cases):
    profile, options = _llama(cases)
    with pytest.raises(PlanError) as failure:
        _plan(cases, profile, options, gpus=[cases.gpu_row(0)], gpu_ids=[1])
    assert str(failure.value) == SERVER + "inventory rows [0] do not match gpu_ids [1]"


def test_context_longer_than_the_model_names_the_server_and_the_escape_hatch(cases):
    profile, options = _llama(cases)
    with pytest.raises(PlanError) as failure:
        _plan(cases, profile, options, bounds=TunerBounds(context_length=200_000))
    assert str(failure.value) == (SERVER + "context length 200000 exceeds the model's 131072\nWhat to check next: "
                                  "SGLang refuses it unless SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1; lower the "
                                  "context length bound")


def test_a_gpu_below_the_checkpoints_quantization_capability_is_refused_before_launch(cases):
    """model_loader/loader.py: ModelOpt FP8 needs compute capability 8.9; SGLang refuses an A100 (8.0)."""
    quant = {"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}}
    options = LaunchOptions()
    profile = profile_model(cases.load_config("llama-3.1-8b-style.json"), 9 * 10**9, options, hf_quant_config=quant)
    a100 = {**cases.gpu_row(0), "name": "NVIDIA A100-SXM4-80GB"}
    with pytest.raises(ModelConfigError, match="The quantization method modelopt_fp8 is not supported for the current "
                       "GPU. Minimum capability: 89. Current capability: 80.") as failure:
        _plan(cases, profile, options, gpus=[a100])
    assert failure.value.host == "gpu-node-1"
    assert _plan(cases, profile, options).expected["max_total_num_tokens"] > 0  # the B200 of the seed rows


def test_context_equal_to_the_models_is_accepted(cases):
    profile, options = _llama(cases)
    plan = _plan(cases, profile, options, bounds=TunerBounds(context_length=131_072, max_running_requests=2))
    assert plan.flags["--context-length"] == 131_072


def test_weights_that_fill_the_free_memory_exactly_do_not_fit(cases):
    pre_free = (cases.B200_TOTAL_MIB - CUDA_CONTEXT_MIB) * MIB
    profile, options = _llama(cases, weights=pre_free)
    with pytest.raises(PlanError) as failure:
        _plan(cases, profile, options)
    assert str(failure.value).startswith(SERVER + "weights need 178.48 GiB per GPU but only 178.48 GiB are free")


# -- what the plan derives from the workload ----------------------------------------------------------

def test_context_rounds_the_longest_request_up_to_1024(cases):
    profile, options = _llama(cases)
    plan = _plan(cases, profile, options, workload=_workload(prompt_max=2049, output=4096))  # 6145 tokens
    assert plan.flags["--context-length"] == 7168


def test_chunked_prefill_rounds_the_longest_prompt_up_to_1024(cases):
    profile, options = _llama(cases)
    plan = _plan(cases, profile, options, workload=_workload(prompt_max=2049))
    assert plan.flags["--chunked-prefill-size"] == 3072


def test_each_request_needs_its_context_rounded_up_to_whole_pages(cases):
    """Llama on Blackwell pages KV by 64 tokens: a 5,000-token context takes 79 pages (5,056 tokens)."""
    profile, options = _llama(cases)
    plan = _plan(cases, profile, options, bounds=TunerBounds(context_length=5000))
    assert plan.inputs["platform"]["page_size"] == 64
    requests = plan.expected["max_running_requests"]
    assert requests * 5056 <= plan.expected["max_total_num_tokens"] < (requests + 1) * 5056


# -- calibration and the processes on the GPU ---------------------------------------------------------

def test_calibration_from_readback_is_taken_off_the_pre_load_memory(cases, seed_profile, seed_options):
    clean = _plan(cases, seed_profile, seed_options)
    calibrated = _plan(cases, seed_profile, seed_options, calibration_bytes=3 * GIB)
    assert calibrated.inputs["adjust"]["calibration_bytes"] == 3 * GIB
    assert _row_bytes(calibrated, "calibration from readback") == 3 * GIB
    assert next(r["note"] for r in calibrated.budget if r["item"] == "calibration from readback") == \
        "measured by the last run's readback on this GPU / SGLang version / model / tp"
    assert not any(r["item"] == "calibration from readback" for r in clean.budget)
    assert _row_bytes(calibrated, "pre-load free (SGLang baseline)") == \
        _row_bytes(clean, "pre-load free (SGLang baseline)") - 3 * GIB
    assert calibrated.expected["max_total_num_tokens"] < clean.expected["max_total_num_tokens"]
    # A back-off keeps the correction.
    smaller = backoff(calibrated, "oom_weights")
    assert _row_bytes(smaller, "pre-load free (SGLang baseline)") == \
        _row_bytes(calibrated, "pre-load free (SGLang baseline)") - 2 * GIB


def test_our_own_server_is_not_held_by_other_processes(cases, seed_profile, seed_options):
    ours = _plan(cases, seed_profile, seed_options, gpus=[cases.gpu_row(
        0, processes=[{"pid": 777, "process_name": "sglang", "used_mib": 170_000, "ours": True}])])
    assert _row_bytes(ours, "held by other processes") == 0
    assert ours.budget == _plan(cases, seed_profile, seed_options).budget


# -- opt-ins that do not apply ---------------------------------------------------------------------------

def test_opt_ins_leave_sglang_defaults_mode_and_dense_models_alone(cases, seed_profile, seed_options):
    both = TunerBounds(bf16_ssm_state=True, no_buffer_radix=True)
    defaults = _plan(cases, seed_profile, seed_options,
                     bounds=TunerBounds(mode="sglang_defaults", bf16_ssm_state=True, no_buffer_radix=True))
    assert defaults.flags == {}
    profile, options = _llama(cases)
    dense = _plan(cases, profile, options, bounds=both)
    assert "--mamba-ssm-dtype" not in dense.flags and "--mamba-radix-cache-strategy" not in dense.flags


def test_opt_ins_say_why_they_were_not_applied(cases, seed_config):
    options = LaunchOptions.from_args(["--mamba-ssm-dtype", "float32", "--disable-radix-cache"])
    profile = profile_model(seed_config, cases.SEED_WEIGHTS_BYTES, options)
    plan = _plan(cases, profile, options, bounds=TunerBounds(bf16_ssm_state=True, no_buffer_radix=True))
    assert "bf16 SSM state not applied: the extra args set --mamba-ssm-dtype float32" in plan.notes
    assert ("no_buffer radix strategy not applied: the extra args already set --mamba-radix-cache-strategy auto "
            "/ --disable-radix-cache") in plan.notes


# -- SGLang's automatic sizing (sglang_defaults mode) ----------------------------------------------------

def test_sglang_defaults_reserve_is_floored_at_10_gib_on_a_large_gpu(cases):
    profile, options = _llama(cases, args=["--chunked-prefill-size", "2048", "--cuda-graph-max-bs-decode", "8"])
    plan = _plan(cases, profile, options, bounds=TunerBounds(mode="sglang_defaults"))
    assert _row_bytes(plan, "SGLang reserve") == 10_240 * MIB
    assert "--mem-fraction-static 0.944 (2.1)" in next(r["note"] for r in plan.budget if r["item"] == "static budget")


def test_sglang_defaults_reserve_of_an_mla_model(cases):
    options = LaunchOptions(tp_size=8)
    profile = profile_model(cases.load_config("deepseek-v3-style.json"), 680 * 10**9, options)
    plan = _plan(cases, profile, options, gpus=[cases.gpu_row(i) for i in range(8)],
                 bounds=TunerBounds(mode="sglang_defaults"))
    chunk, decode_bs = gpu_table(cases.B200_TOTAL_MIB, 8)
    reserve = sglang_reserve_mb(gpu_mem_mib=cases.B200_TOTAL_MIB, chunked_prefill_size=chunk, decode_max_bs=decode_bs,
                                tp_size=8, uses_mla=True, graphs_enabled=True)
    assert reserve.prefill_graph_mb == 1536.0  # MLA: a flat prefill graph budget
    assert _row_bytes(plan, "SGLang reserve") == reserve.total_bytes


def test_sglang_defaults_keeps_the_users_request_cap_under_speculative_decoding(cases):
    options = LaunchOptions.from_args(["--speculative-algorithm", "EAGLE", "--speculative-draft-model-path", "/d",
                                       "--max-running-requests", "20"])
    profile = profile_model(cases.load_config("llama-3.1-8b-style.json"), 16 * 10**9, options,
                            draft_config={"num_hidden_layers": 1}, draft_weights_bytes=10**9)
    plan = _plan(cases, profile, options, bounds=TunerBounds(mode="sglang_defaults"))
    assert plan.expected["max_running_requests"] == 20  # not the speculative default of 48


def test_sglang_defaults_sizes_mamba_slots_to_requests_without_radix_cache(cases, seed_config):
    options = LaunchOptions.from_args(["--disable-radix-cache", "--max-running-requests", "40"])
    profile = profile_model(seed_config, cases.SEED_WEIGHTS_BYTES, options)
    plan = _plan(cases, profile, options, bounds=TunerBounds(mode="sglang_defaults"))
    assert plan.expected["max_running_requests"] == 40
    assert plan.expected["max_mamba_cache_size"] == 40  # one slot per request when nothing is cached


# -- user pins ------------------------------------------------------------------------------------------

def test_pinned_max_total_tokens_caps_the_kv_pool(cases):
    profile, options = _llama(cases, args=["--max-total-tokens", "100000"])
    plan = _plan(cases, profile, options)
    assert plan.expected["max_total_num_tokens"] == 100_000
    assert plan.expected["max_running_requests"] == 100_000 // 6144


# -- back-off -------------------------------------------------------------------------------------------

def test_repeated_backoffs_add_up(cases, seed_profile, seed_options):
    plan = _plan(cases, seed_profile, seed_options)
    twice = backoff(backoff(plan, "oom_cuda_graph"), "oom_runtime")
    assert _row_bytes(twice, "user margin") == 1024 * MIB + 2 * 2 * GIB
    weights = backoff(backoff(plan, "oom_weights"), "oom_weights")
    assert _row_bytes(weights, "pre-load free (SGLang baseline)") == \
        _row_bytes(plan, "pre-load free (SGLang baseline)") - 2 * 2 * GIB


def test_backoff_step_is_one_percent_of_a_large_gpu(cases):
    """Above ~200 GiB of pre-load memory one step is 1 % of it (here exactly divisible by 100)."""
    total = 300_000 + CUDA_CONTEXT_MIB  # 300,000 MiB pre-load free: a multiple of 25 MiB, so of 100 bytes
    profile, options = _llama(cases)
    plan = _plan(cases, profile, options, gpus=[cases.gpu_row(0, total_mib=total)])
    pre = _row_bytes(plan, "pre-load free (SGLang baseline)")
    assert pre == 300_000 * MIB and pre % 100 == 0
    smaller = backoff(plan, "oom_weights")
    assert _row_bytes(smaller, "pre-load free (SGLang baseline)") == pre - pre // 100
    reserve = backoff(plan, "oom_cuda_graph")
    assert _row_bytes(reserve, "user margin") == 1024 * MIB + pre // 100


def test_sglang_defaults_estimates_requests_at_the_models_own_context(cases):
    """Without --context-length SGLang runs at the model's 131,072 tokens and estimates its request cap as
    tokens / context x 512 within [2048, 4096] (not at the workload's 6,144)."""
    profile, options = _llama(cases)
    plan = _plan(cases, profile, options, gpus=[cases.gpu_row(0, total_mib=81_559)],
                 bounds=TunerBounds(mode="sglang_defaults"))
    tokens = plan.expected["max_total_num_tokens"]
    assert tokens < 131_072 * 4096 // 512  # the estimate at the model's context stays below the 4096 cap
    assert plan.expected["max_running_requests"] == max(min(int(tokens / 131_072 * 512), 4096), 2048) == 2048


def test_a_tiny_model_plans_at_the_smallest_fraction_when_the_margin_leaves_only_that(cases):
    """--mem-fraction-static counts down to 0.001: a 10 MB model under a 172,300 MiB margin still plans."""
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "torch_dtype": "bfloat16",
              "hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "head_dim": 64, "max_position_embeddings": 4096, "vocab_size": 1000}
    options = LaunchOptions()
    profile = profile_model(config, 10 * 10**6, options)
    plan = _plan(cases, profile, options, bounds=TunerBounds(margin_mib=172_300),
                 workload=_workload(prompt_max=400, output=512))
    assert plan.flags["--mem-fraction-static"] == 0.001
    assert plan.expected["max_running_requests"] == 173


def test_backoff_step_of_a_tensor_parallel_server_is_one_percent_of_its_own_pre_load_memory(cases):
    """tp 2 holds NCCL buffers besides the CUDA context: the step is 1 % of what is left after both, the same
    figure the plan's budget starts from (not 1 % of a single-GPU server's larger pre-load memory)."""
    from fleetgen.tuning.planner import NCCL_BUFFERS_MIB

    total = 300_000 + CUDA_CONTEXT_MIB + NCCL_BUFFERS_MIB
    profile, options = _llama(cases, args=("--tp-size", "2"))
    plan = _plan(cases, profile, options, gpus=[cases.gpu_row(0, total_mib=total), cases.gpu_row(1, total_mib=total)])
    pre = _row_bytes(plan, "pre-load free (SGLang baseline)")
    assert pre == 300_000 * MIB
    assert _row_bytes(backoff(plan, "oom_weights"), "pre-load free (SGLang baseline)") == pre - 3_000 * MIB


def test_a_kv_pool_of_exactly_the_requests_full_contexts_holds_them_all(cases):
    """16 requests at the workload's 6,144-token context need 98,304 tokens: a pool pinned to exactly that holds
    16, and one token less holds 15."""
    for pool, requests in ((16 * 6144, 16), (16 * 6144 - 1, 15)):
        profile, options = _llama(cases, args=["--max-total-tokens", str(pool)])
        plan = _plan(cases, profile, options)
        assert plan.flags["--context-length"] == 6144
        assert (plan.expected["max_total_num_tokens"], plan.expected["max_running_requests"]) == (pool, requests)


def test_a_sliding_window_models_plan_expects_its_swa_pool_too(cases):
    """gpt-oss: the readback reports the SWA pool's tokens besides the full pool's; the plan expects both."""
    from sglang_sim.presets import preset_config

    options = LaunchOptions.from_args([])
    profile = profile_model(preset_config("gpt-oss-20b"), 13_761_316_904, options)
    plan = _plan(cases, profile, options)
    full = plan.expected["max_total_num_tokens"]
    assert plan.expected["swa_max_total_num_tokens"] == int(full * 0.8) // 64 * 64
    dense_profile, dense_options = _llama(cases)
    assert "swa_max_total_num_tokens" not in _plan(cases, dense_profile, dense_options).expected


def test_data_parallel_replicas_are_planned_as_one_and_say_so(cases):
    profile, options = _llama(cases, args=("--dp-size", "2"))
    plan = _plan(cases, profile, options, gpus=[cases.gpu_row(0), cases.gpu_row(1)])
    assert ("--dp-size 2: 2 replicas of 1 GPU(s), each with its own pools; the budget and the expected values are "
            "one replica's (the smallest free GPU)") in plan.notes
    single_profile, single_options = _llama(cases)
    single = _plan(cases, single_profile, single_options)
    assert not any(note.startswith("--dp-size") for note in single.notes)
    assert plan.expected == single.expected


def test_a_data_parallel_server_given_too_few_gpus_names_both_sizes(cases):
    profile, options = _llama(cases, args=("--dp-size", "2"))
    with pytest.raises(PlanError) as error:
        _plan(cases, profile, options)
    assert error.value.message == "server has 1 GPU id(s) and 1 inventory row(s) but tp size 1 x dp size 2"
    single_profile, single_options = _llama(cases)
    with pytest.raises(PlanError) as error:
        _plan(cases, single_profile, single_options, gpus=[cases.gpu_row(0), cases.gpu_row(1)])
    assert error.value.message == "server has 2 GPU id(s) and 2 inventory row(s) but tp size 1"


def test_a_quantization_the_gpu_cannot_run_names_the_gpu(cases):
    quant = {"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}}
    options = LaunchOptions()
    profile = profile_model(cases.load_config("llama-3.1-8b-style.json"), 9 * 10**9, options, hf_quant_config=quant)
    a100 = {**cases.gpu_row(0), "name": "NVIDIA A100-SXM4-80GB"}
    with pytest.raises(ModelConfigError) as failure:
        _plan(cases, profile, options, gpus=[a100])
    assert failure.value.message.startswith("SGLang refuses this launch on NVIDIA A100-SXM4-80GB: ")


def test_a_backend_sglang_refuses_names_the_server_and_the_flags_to_change(cases):
    profile, options = _llama(cases, args=("--attention-backend", "trtllm_mha"))
    l40s = {**cases.gpu_row(0), "name": "NVIDIA L40S"}
    with pytest.raises(PlanError) as failure:
        _plan(cases, profile, options, gpus=[l40s])
    assert (failure.value.host, failure.value.server) == ("gpu-node-1", "gpu-node-1:30000")
    assert failure.value.hint == ("drop --attention-backend/--kv-cache-dtype from the extra args, or pick values this "
                                  "GPU supports")


def test_a_checkpoints_fp8_kv_cache_holds_twice_the_tokens_of_bf16(cases):
    """ModelOpt's kv_cache_quant_algo FP8 halves each token's KV bytes: the plan, re-profiled for the platform,
    keeps the checkpoint's quantization and its KV dtype."""
    options = LaunchOptions()
    config = cases.load_config("llama-3.1-8b-style.json")
    bf16 = _plan(cases, profile_model(config, 9 * 10**9, options), options)
    quant = {"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}}
    fp8 = _plan(cases, profile_model(config, 9 * 10**9, options, hf_quant_config=quant), options)
    assert fp8.inputs["resolved_profile"]["kv_bytes_per_token"] * 2 == bf16.inputs["resolved_profile"]["kv_bytes_per_token"]
    assert fp8.expected["max_total_num_tokens"] > 1.9 * bf16.expected["max_total_num_tokens"]
    assert fp8.inputs["resolved_profile"]["quantization"] == "modelopt_fp8"
