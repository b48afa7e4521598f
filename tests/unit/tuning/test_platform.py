"""The plan under the flags SGLang resolves on each GPU: the no_buffer radix strategy's attention flags,
Qwen3-VL's feature pool on large Hopper GPUs, prefill graphs off for multimodal models, unknown GPUs,
the page size the workload mode rounds to, and the platform the calibration reads back."""

import pytest

from fleetgen.errors import PlanError
from fleetgen.tuning.planner import TunerBounds, Workload, plan_server, resolved_page_size
from fleetgen.tuning.platform import gpu_generation
from fleetgen.tuning.profile import GIB, MIB, LaunchOptions, profile_model
from fleetgen.tuning.sizing import size_pools

B200_MIB, H200_MIB, L40S_MIB = 183_359, 143_771, 46_068
# The seed's speculative flags without its pinned radix strategy, so the no_buffer bound applies.
SEED_ARGS = ["--speculative-algorithm", "NEXTN", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
             "--speculative-num-draft-tokens", "4", "--context-length", "8192"]
NO_BUFFER_ERROR = ("the no_buffer Mamba radix strategy needs page size 1 and an attention backend other than "
                   "trtllm_mha, but the extra args pin --attention-backend {backend} / --page-size {page} (SGLang "
                   "refuses to start)\nWhat to check next: drop --attention-backend/--page-size from the extra args, "
                   "or turn the no_buffer_radix bound off")
# A small Qwen3-VL (text tower of a 2B model, the usual 24-layer vision tower).
QWEN3_VL = {"architectures": ["Qwen3VLForConditionalGeneration"], "model_type": "qwen3_vl",
            "text_config": {"model_type": "qwen3_vl_text", "hidden_size": 2048, "num_hidden_layers": 28,
                            "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
                            "intermediate_size": 6144, "max_position_embeddings": 262144, "vocab_size": 151936,
                            "torch_dtype": "bfloat16"},
            "vision_config": {"depth": 24, "num_hidden_layers": 24, "hidden_size": 1024}}
SHORT = Workload(max_output_tokens=1024, prompt_tokens_mean=200.0, prompt_tokens_max=900, prompt_count=1000)


def _row(index=0, *, name="NVIDIA B200", total_mib=B200_MIB):
    return {"index": index, "uuid": f"GPU-{index}", "name": name, "total_mib": total_mib, "used_mib": 0,
            "free_mib": total_mib, "processes": []}


def _plan(profile, options, *, gpus=None, bounds=None, workload=None):
    return plan_server(host="gpu-node-1", gpu_ids=[g["index"] for g in gpus or [_row()]], port=30000,
                       gpus=gpus or [_row()], profile=profile, options=options, workload=workload or SHORT,
                       bounds=bounds or TunerBounds())


def _row_bytes(plan, item):
    return next(r["bytes"] for r in plan.budget if r["item"].strip() == item)


@pytest.fixture
def seed(cases):
    options = LaunchOptions.from_args(SEED_ARGS)
    return profile_model(cases.load_config("seed-qwen3.6-27b.json"), cases.SEED_WEIGHTS_BYTES, options), options


@pytest.fixture
def qwen3_vl():
    options = LaunchOptions()
    return profile_model(QWEN3_VL, 4 * 10**9, options), options


# -- no_buffer radix strategy on Blackwell: SGLang needs page size 1 and no trtllm_mha --------------

def test_no_buffer_on_blackwell_switches_to_triton_with_page_one(cases, seed):
    profile, options = seed
    plan = _plan(profile, options, bounds=TunerBounds(no_buffer_radix=True), workload=cases.SEED_WORKLOAD)
    assert {key: plan.flags[key] for key in ("--mamba-radix-cache-strategy", "--disable-overlap-schedule",
                                             "--attention-backend", "--page-size")} == {
        "--mamba-radix-cache-strategy": "no_buffer", "--disable-overlap-schedule": True,
        "--attention-backend": "triton", "--page-size": 1}
    args = " ".join(plan.command_args())
    assert "--attention-backend triton" in args and "--page-size 1" in args and "--disable-overlap-schedule" in args
    resolved = plan.inputs["resolved_profile"]
    assert resolved["radix_strategy"] == "no_buffer" and resolved["overlap_schedule"] is False
    assert ("no_buffer radix strategy: --attention-backend triton --page-size 1 instead of SGLang's trtllm_mha "
            "with page size 64 on this GPU") in plan.notes
    assert plan.inputs["platform"]["attention_backend"] == "triton" and plan.inputs["platform"]["page_size"] == 1
    # The KV pool is sized at page 1: not floored to a multiple of 64 tokens.
    sizing = size_pools(profile.__class__.from_dict(plan.inputs["resolved_profile"]),
                        pre_load_free_bytes=_row_bytes(plan, "pre-load free (SGLang baseline)"),
                        mem_fraction_static=plan.flags["--mem-fraction-static"],
                        max_running_requests=plan.flags["--max-running-requests"],
                        max_mamba_cache_size=plan.flags["--max-mamba-cache-size"], context_length=8192, page_size=1)
    assert sizing.max_total_num_tokens == plan.expected["max_total_num_tokens"]


def test_no_buffer_keeps_the_users_own_overlap_switch(seed):
    profile, _ = seed
    options = LaunchOptions.from_args(SEED_ARGS + ["--disable-overlap-schedule"])
    plan = _plan(profile, options, bounds=TunerBounds(no_buffer_radix=True))
    assert "--disable-overlap-schedule" not in plan.flags  # the extra args already carry it
    assert plan.flags["--attention-backend"] == "triton" and plan.flags["--page-size"] == 1


def test_no_buffer_with_a_backend_that_pages_by_one_adds_no_attention_flags(seed):
    profile, _ = seed
    options = LaunchOptions.from_args(SEED_ARGS + ["--attention-backend", "flashinfer"])
    plan = _plan(profile, options, bounds=TunerBounds(no_buffer_radix=True))
    assert plan.flags["--mamba-radix-cache-strategy"] == "no_buffer"
    assert "--attention-backend" not in plan.flags and "--page-size" not in plan.flags
    assert not any(note.startswith("no_buffer radix strategy:") for note in plan.notes)


@pytest.mark.parametrize("extra, backend, page", [(["--page-size", "64"], None, 64),
                                                  (["--attention-backend", "trtllm_mha"], "trtllm_mha", None)])
def test_no_buffer_against_pinned_attention_flags_is_a_plan_error(seed, extra, backend, page):
    profile, _ = seed
    options = LaunchOptions.from_args(SEED_ARGS + extra)
    with pytest.raises(PlanError) as failure:
        _plan(profile, options, bounds=TunerBounds(no_buffer_radix=True))
    assert str(failure.value) == ("[host gpu-node-1, server gpu-node-1:30000] "
                                  + NO_BUFFER_ERROR.format(backend=backend, page=page))


# -- the page size the workload mode rounds KV demand to -----------------------------------------------

def test_resolved_page_size_is_the_page_the_plan_runs_with(cases, seed):
    profile, options = seed
    llama_options = LaunchOptions()
    llama = profile_model(cases.load_config("llama-3.1-8b-style.json"), 16 * 10**9, llama_options)
    assert resolved_page_size(profile, options, [_row()], TunerBounds()) == 64  # trtllm_mha on Blackwell
    assert resolved_page_size(profile, options, [_row(name="NVIDIA H200", total_mib=H200_MIB)], TunerBounds()) == 1
    assert resolved_page_size(llama, llama_options, [_row(name="Tesla T4", total_mib=15_360)], TunerBounds()) == 1
    assert resolved_page_size(llama, llama_options, [_row(0), _row(1)], TunerBounds()) == 64
    # The no_buffer bound runs the plan at page 1 (triton), so its KV demand rounds to 1 too.
    bounds = TunerBounds(no_buffer_radix=True)
    assert _plan(profile, options, bounds=bounds).inputs["platform"]["page_size"] == 1
    assert resolved_page_size(profile, options, [_row()], bounds) == 1


def test_resolved_page_size_for_qwen3_vl_on_hopper(qwen3_vl):
    profile, options = qwen3_vl
    assert resolved_page_size(profile, options, [_row(name="NVIDIA H200", total_mib=H200_MIB)], TunerBounds()) == 1


def test_resolved_page_size_error_names_no_empty_host(seed):
    profile, _ = seed
    options = LaunchOptions.from_args(SEED_ARGS + ["--page-size", "64"])
    with pytest.raises(PlanError) as failure:
        resolved_page_size(profile, options, [_row()], TunerBounds(no_buffer_radix=True))
    assert str(failure.value) == NO_BUFFER_ERROR.format(backend=None, page=64)


# -- DeepSeek-V3 on Blackwell: model_overrides/deepseek_v2.py picks trtllm_mla, which pages by 32 or 64 ------

@pytest.mark.parametrize("extra, backend, page", [([], "trtllm_mla", 64), (["--page-size", "32"], "trtllm_mla", 32),
                                                  (["--page-size", "16"], "trtllm_mla", 64),
                                                  (["--attention-backend", "flashinfer"], "flashinfer", 1)])
def test_deepseek_v3_on_blackwell_plans_trtllm_mla_pages(cases, extra, backend, page):
    options = LaunchOptions.from_args(["--tp-size", "8"] + extra)
    profile = profile_model(cases.load_config("deepseek-v3-style.json"), 680 * 10**9, options)
    plan = _plan(profile, options, gpus=[_row(index) for index in range(8)])
    assert (plan.inputs["platform"]["attention_backend"], plan.inputs["platform"]["page_size"]) == (backend, page)
    assert plan.expected["max_total_num_tokens"] % page == 0


@pytest.mark.parametrize("config, extra, gpu, reason", [
    ("deepseek-v3-style.json", ["--attention-backend", "trtllm_mla"], "NVIDIA H200",
     "TRTLLM MLA backend is only supported on Blackwell GPUs (SM100/SM12x)"),
    ("deepseek-v3-style.json", ["--kv-cache-dtype", "bfloat16"], "NVIDIA B200",
     "TensorRT-LLM MLA backend only supports kv-cache-dtype of fp8_e4m3, bf16, or auto"),
    ("deepseek-v3-style.json", ["--attention-backend", "cutedsl_mla"], "NVIDIA H200",
     "CuteDSL MLA backend is only supported on Blackwell GPUs (SM100)"),
    ("llama-3.1-8b-style.json", ["--attention-backend", "trtllm_mha"], "NVIDIA L40S",
     "TRTLLM MHA backend for prefill requires Hopper (SM90), Blackwell (SM100), or SM120 GPUs")])
def test_a_backend_sglang_refuses_on_this_gpu_is_a_plan_error(cases, config, extra, gpu, reason):
    tp = 8 if config.startswith("deepseek") else 1
    options = LaunchOptions.from_args(["--tp-size", str(tp)] + extra)
    profile = profile_model(cases.load_config(config), 680 * 10**9 if tp == 8 else 16 * 10**9, options)
    with pytest.raises(PlanError) as failure:
        _plan(profile, options, gpus=[_row(index, name=gpu, total_mib=B200_MIB) for index in range(tp)])
    assert reason in str(failure.value) and "refuses to start" in str(failure.value)


def test_trtllm_mla_takes_the_bf16_spelling_of_the_kv_dtype(cases):
    options = LaunchOptions.from_args(["--tp-size", "8", "--kv-cache-dtype", "bf16"])
    profile = profile_model(cases.load_config("deepseek-v3-style.json"), 680 * 10**9, options)
    plan = _plan(profile, options, gpus=[_row(index) for index in range(8)])
    assert plan.inputs["platform"]["attention_backend"] == "trtllm_mla"


def test_deepseek_v3_on_hopper_keeps_fa3_with_page_one(cases):
    options = LaunchOptions.from_args(["--tp-size", "8"])
    profile = profile_model(cases.load_config("deepseek-v3-style.json"), 680 * 10**9, options)
    plan = _plan(profile, options, gpus=[_row(index, name="NVIDIA H200", total_mib=H200_MIB) for index in range(8)])
    assert (plan.inputs["platform"]["attention_backend"], plan.inputs["platform"]["page_size"]) == ("fa3", 1)


# -- GPUs -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name, generation", [("NVIDIA L4", "sm89"), ("NVIDIA L40S", "sm89"), ("NVIDIA A10G", "sm86"),
                                              ("NVIDIA A100-SXM4-40GB", "sm80"), ("NVIDIA GH200 480GB", "sm90")])
def test_gpu_generation_from_nvidia_smi_names(name, generation):
    assert gpu_generation(name) == generation


def test_unknown_gpu_is_noted_and_planned_with_the_generic_backend(cases):
    options = LaunchOptions()
    profile = profile_model(cases.load_config("llama-3.1-8b-style.json"), 2 * 10**9, options)
    plan = _plan(profile, options, gpus=[_row(name="Tesla T4", total_mib=15_360)])
    assert "unknown GPU generation: assuming SGLang's non-Hopper, non-Blackwell attention backend" in plan.notes
    assert plan.inputs["platform"]["generation"] is None


def test_plan_records_the_platform_the_calibration_reads_back(cases, seed):
    profile, options = seed
    plan = _plan(profile, options, workload=cases.SEED_WORKLOAD)
    assert plan.inputs["platform"] == {
        "generation": "sm100", "attention_backend": "trtllm_mha", "page_size": 64, "chunked_prefill_size": 2048,
        "decode_max_bs": plan.expected["max_running_requests"],
        "mem_fraction_static": plan.flags["--mem-fraction-static"]}
    resolved = plan.inputs["resolved_profile"]
    assert resolved["radix_strategy"] == plan.flags["--mamba-radix-cache-strategy"] == "extra_buffer"


def test_sglang_defaults_mode_records_sglangs_own_chunk_and_graph_batch(cases, seed):
    profile, options = seed
    plan = _plan(profile, options, bounds=TunerBounds(mode="sglang_defaults"))
    assert plan.inputs["platform"]["chunked_prefill_size"] == 16384  # B200 row of SGLang's GPU table
    assert plan.inputs["platform"]["decode_max_bs"] == 512


# -- Qwen3-VL on a large Hopper GPU: the CUDA-IPC feature pool ---------------------------------------

def test_qwen3_vl_on_h200_reserves_one_gib_below_400_requests(qwen3_vl):
    profile, options = qwen3_vl
    plan = _plan(profile, options, gpus=[_row(name="NVIDIA H200", total_mib=H200_MIB)],
                 bounds=TunerBounds(max_running_requests=100))
    assert plan.expected["max_running_requests"] == 100
    assert _row_bytes(plan, "multimodal cache reservation") == GIB
    assert ("Qwen3-VL on a large Hopper GPU: SGLang reserves the CUDA-IPC image feature pool (1 GiB, 3 GiB at "
            ">= 400 running requests) instead of the VLM embedding cache") in plan.notes


def test_qwen3_vl_on_h200_reserves_three_gib_at_400_requests_or_more(qwen3_vl):
    profile, options = qwen3_vl
    plan = _plan(profile, options, gpus=[_row(name="NVIDIA H200", total_mib=H200_MIB)])
    requests = plan.expected["max_running_requests"]
    assert requests >= 400
    assert _row_bytes(plan, "multimodal cache reservation") == 3 * GIB
    # The expected pool is SGLang's arithmetic with the 3 GiB pool taken out of the static budget.
    resolved = profile.__class__.from_dict(plan.inputs["resolved_profile"])
    assert resolved.multimodal_reserve_bytes == 3 * GIB
    sizing = size_pools(resolved, pre_load_free_bytes=_row_bytes(plan, "pre-load free (SGLang baseline)"),
                        mem_fraction_static=plan.flags["--mem-fraction-static"], max_running_requests=requests,
                        max_mamba_cache_size=None, context_length=plan.flags["--context-length"])
    assert sizing.max_total_num_tokens == plan.expected["max_total_num_tokens"]


def test_qwen3_vl_pinned_requests_set_the_pool_in_sglang_defaults_mode(qwen3_vl):
    profile, _ = qwen3_vl
    options = LaunchOptions.from_args(["--max-running-requests", "500"])
    plan = _plan(profile, options, gpus=[_row(name="NVIDIA H200", total_mib=H200_MIB)],
                 bounds=TunerBounds(mode="sglang_defaults"))
    assert _row_bytes(plan, "multimodal cache reservation") == 3 * GIB


def test_qwen3_vl_on_a_small_gpu_keeps_the_vlm_cache(qwen3_vl):
    profile, options = qwen3_vl
    plan = _plan(profile, options, gpus=[_row(name="NVIDIA L40S", total_mib=L40S_MIB)])
    assert _row_bytes(plan, "multimodal cache reservation") == 100 * MIB
    assert not any("Hopper" in note for note in plan.notes)


@pytest.mark.parametrize("mode", ["tuned", "sglang_defaults"])
def test_multimodal_model_outside_sglangs_list_reserves_no_prefill_graphs(qwen3_vl, mode):
    """SGLang turns the prefill CUDA graph off for Qwen3-VL (not in its multimodal allow-list), so the
    reserve holds no prefill graph memory; on a 45 GiB GPU no 10 GiB floor hides the difference."""
    profile, options = qwen3_vl
    plan = _plan(profile, options, gpus=[_row(name="NVIDIA L40S", total_mib=L40S_MIB)],
                 bounds=TunerBounds(mode=mode))
    chunk, decode_bs = plan.inputs["platform"]["chunked_prefill_size"], plan.inputs["platform"]["decode_max_bs"]
    assert _row_bytes(plan, "SGLang reserve") == int((512 + 1.5 * max(chunk, 2048) + 128 + 2 * decode_bs) * MIB)


def test_no_buffer_refuses_a_pinned_page_other_than_one_on_any_backend(seed):
    profile, _ = seed
    options = LaunchOptions.from_args(SEED_ARGS + ["--attention-backend", "flashinfer", "--page-size", "16"])
    with pytest.raises(PlanError) as failure:
        _plan(profile, options, bounds=TunerBounds(no_buffer_radix=True))
    assert str(failure.value) == ("[host gpu-node-1, server gpu-node-1:30000] "
                                  + NO_BUFFER_ERROR.format(backend="flashinfer", page=16))


def test_resolved_page_size_when_the_extra_args_already_pin_the_strategy(seed_profile, seed_options):
    """The no_buffer bound does not apply over the user's own extra_buffer: Blackwell's page 64 stays."""
    assert resolved_page_size(seed_profile, seed_options, [_row()], TunerBounds(no_buffer_radix=True)) == 64


@pytest.mark.parametrize("generation, backend, page", [("sm100", "trtllm_mha", 64), ("sm90", "fa3", 1),
                                                       ("sm80", "triton", 1)])
def test_gpt_oss_takes_its_own_attention_backend_override(generation, backend, page):
    """model_overrides/gpt_oss.py: trtllm_mha on SM100, fa3 on Hopper, triton elsewhere, whatever the top-k."""
    from fleetgen.tuning.geometry import model_geometry
    from fleetgen.tuning.platform import attention_choice

    geometry = model_geometry({"architectures": ["GptOssForCausalLM"], "num_hidden_layers": 2, "num_attention_heads": 8,
                               "num_key_value_heads": 2, "head_dim": 64, "sliding_window": 128,
                               "layer_types": ["sliding_attention", "full_attention"], "torch_dtype": "bfloat16"})
    options = LaunchOptions(speculative_algorithm="EAGLE3", speculative_num_steps=3, speculative_eagle_topk=4)
    choice = attention_choice(geometry, options, generation)
    assert (choice.backend, choice.page_size) == (backend, page)


# -- the attention backend and page size SGLang resolves, rule by rule ---------------------------------

def _geometry(cases, name):
    from fleetgen.tuning.geometry import model_geometry

    return model_geometry(cases.load_config(name))


EAGLE_TOPK1 = dict(speculative_algorithm="EAGLE", speculative_num_steps=3, speculative_eagle_topk=1)
EAGLE_TREE = dict(speculative_algorithm="EAGLE", speculative_num_steps=3, speculative_eagle_topk=4)


@pytest.mark.parametrize("config, options, by_generation", [
    # MHA: fa3 on Hopper, trtllm_mha (page 64) on SM100 when the top-k is one and given, flashinfer elsewhere
    ("llama-3.1-8b-style.json", {}, ("trtllm_mha/64", "fa3/1", "flashinfer/1", "flashinfer/1")),
    ("llama-3.1-8b-style.json", EAGLE_TOPK1, ("trtllm_mha/64", "fa3/1", "flashinfer/1", "flashinfer/1")),
    # Llama's automatic EAGLE choice is a tree (top-k 4): no fa3, no trtllm_mha
    ("llama-3.1-8b-style.json", {"speculative_algorithm": "EAGLE"},
     ("flashinfer/1", "flashinfer/1", "flashinfer/1", "flashinfer/1")),
    ("llama-3.1-8b-style.json", EAGLE_TREE, ("flashinfer/1", "flashinfer/1", "flashinfer/1", "flashinfer/1")),
    ("llama-3.1-8b-style.json", {"speculative_algorithm": "DFLASH", "speculative_num_draft_tokens": 4},
     ("trtllm_mha/64", "fa3/1", "flashinfer/1", "flashinfer/1")),
    # MLA: DeepSeek-V3 takes trtllm_mla on SM100, fa3 on Hopper, triton elsewhere
    ("deepseek-v3-style.json", {}, ("trtllm_mla/64", "fa3/1", "triton/1", "triton/1")),
    ("deepseek-v3-style.json", EAGLE_TREE, ("trtllm_mla/64", "fa3/1", "triton/1", "triton/1")),
    # Falcon-H1: triton on SM100 whatever the flags
    ("falcon-h1-7b-style.json", {}, ("triton/1", "fa3/1", "flashinfer/1", "flashinfer/1")),
    ("falcon-h1-7b-style.json", EAGLE_TREE, ("triton/1", "flashinfer/1", "flashinfer/1", "flashinfer/1")),
    # Qwen3.5 family on SM100: trtllm_mha with extra buffers, the radix cache off or speculative decoding on
    ("seed-qwen3.6-27b.json", {}, ("triton/1", "fa3/1", "flashinfer/1", "flashinfer/1")),
    ("seed-qwen3.6-27b.json", EAGLE_TOPK1, ("trtllm_mha/64", "fa3/1", "flashinfer/1", "flashinfer/1")),
    ("seed-qwen3.6-27b.json", {"speculative_algorithm": "EAGLE"},
     ("triton/1", "fa3/1", "flashinfer/1", "flashinfer/1")),
    ("seed-qwen3.6-27b.json", EAGLE_TREE, ("triton/1", "flashinfer/1", "flashinfer/1", "flashinfer/1")),
    ("seed-qwen3.6-27b.json", {"mamba_radix_cache_strategy": "extra_buffer"},
     ("trtllm_mha/64", "fa3/1", "flashinfer/1", "flashinfer/1")),
    ("seed-qwen3.6-27b.json", {"mamba_radix_cache_strategy": "extra_buffer_lazy"},
     ("trtllm_mha/64", "fa3/1", "flashinfer/1", "flashinfer/1")),
    ("seed-qwen3.6-27b.json", {"mamba_radix_cache_strategy": "no_buffer"},
     ("triton/1", "fa3/1", "flashinfer/1", "flashinfer/1")),
    ("qwen3-next-80b-a3b.json", {"disable_radix_cache": True},
     ("trtllm_mha/64", "fa3/1", "flashinfer/1", "flashinfer/1")),
])
def test_the_default_attention_backend_follows_sglangs_rules(cases, config, options, by_generation):
    from fleetgen.tuning.platform import attention_choice

    geometry = _geometry(cases, config)
    found = []
    for generation in ("sm100", "sm90", "sm80", None):
        choice = attention_choice(geometry, LaunchOptions(**options), generation)
        found.append(f"{choice.backend}/{choice.page_size}")
    assert tuple(found) == by_generation


@pytest.mark.parametrize("backend, page, resolved", [
    ("trtllm_mha", None, 64), ("trtllm_mha", 1, 64), ("trtllm_mha", 16, 16), ("trtllm_mha", 128, 128),
    ("trtllm_mha", 256, 64), ("trtllm_mla", 32, 32), ("trtllm_mla", 16, 64), ("flashmla", 1, 64),
    ("cutedsl_mla", 64, 64), ("hpc_ops", 32, 64), ("flashinfer", 16, 16), ("triton", None, 1), ("fa3", 128, 128),
])
def test_a_backend_given_by_the_user_keeps_a_page_it_takes_and_else_pages_by_64(cases, backend, page, resolved):
    from fleetgen.tuning.platform import AttentionChoice, attention_choice

    options = LaunchOptions(attention_backend=backend, page_size=page)
    assert attention_choice(_geometry(cases, "llama-3.1-8b-style.json"), options, "sm100") == \
        AttentionChoice(backend, resolved)


@pytest.mark.parametrize("backend, kv, generation, reason", [
    ("trtllm_mla", "auto", "sm100", None), ("trtllm_mla", "bf16", "sm100", None),
    ("trtllm_mla", "fp8_e4m3", None, None),
    ("trtllm_mla", "auto", "sm90", "TRTLLM MLA backend is only supported on Blackwell GPUs (SM100/SM12x)"),
    ("trtllm_mla", "fp8_e5m2", "sm100", "TensorRT-LLM MLA backend only supports kv-cache-dtype of fp8_e4m3, bf16, "
                                        "or auto"),
    ("trtllm_mla", "bfloat16", None, "TensorRT-LLM MLA backend only supports kv-cache-dtype of fp8_e4m3, bf16, "
                                     "or auto"),
    ("cutedsl_mla", "bfloat16", "sm100", None),
    ("cutedsl_mla", "auto", "sm90", "CuteDSL MLA backend is only supported on Blackwell GPUs (SM100)"),
    ("cutedsl_mla", "float16", "sm100", "CuteDSL MLA backend only supports kv-cache-dtype of fp8_e4m3, bf16, or auto"),
    ("trtllm_mha", "fp8_e5m2", "sm90", None), ("trtllm_mha", "auto", "sm100", None),
    ("trtllm_mha", "auto", "sm89", "TRTLLM MHA backend for prefill requires Hopper (SM90), Blackwell (SM100), or "
                                   "SM120 GPUs"),
    ("trtllm_mha", "auto", None, None), ("fa3", "fp8_e5m2", "sm80", None),
])
def test_sglang_refuses_a_backend_outside_its_gpus_and_kv_dtypes(backend, kv, generation, reason):
    from fleetgen.tuning.platform import backend_refusal

    assert backend_refusal(backend, kv, generation) == reason


@pytest.mark.parametrize("name, generation", [
    ("NVIDIA GB200", "sm100"), ("NVIDIA B300 SXM6 AC", "sm100"), ("NVIDIA B200", "sm100"), ("NVIDIA H200", "sm90"),
    ("NVIDIA H100 80GB HBM3", "sm90"), ("NVIDIA H800", "sm90"), ("NVIDIA H20", "sm90"), ("NVIDIA L40", "sm89"),
    ("NVIDIA A100 80GB PCIe", "sm80"), ("NVIDIA A800-SXM4-80GB", "sm80"), ("NVIDIA A10", "sm86"),
    ("NVIDIA A40", "sm86"), ("nvidia h100 pcie", "sm90"), ("Tesla V100-SXM2-16GB", None), ("", None),
])
def test_every_generation_sglang_tells_apart_is_named_from_nvidia_smi(name, generation):
    assert gpu_generation(name) == generation


def test_the_qwen3_vl_feature_pool_needs_hopper_with_at_least_60_gib(qwen3_vl):
    from fleetgen.tuning.platform import is_large_hopper_qwen3_vl

    from fleetgen.tuning.geometry import model_geometry

    geometry = model_geometry(QWEN3_VL)
    assert is_large_hopper_qwen3_vl(geometry, "sm90", 60 * 1024)
    assert not is_large_hopper_qwen3_vl(geometry, "sm90", 60 * 1024 - 1)
    assert not is_large_hopper_qwen3_vl(geometry, "sm100", B200_MIB)
    assert not is_large_hopper_qwen3_vl(geometry, None, H200_MIB)


def test_a_text_model_on_large_hopper_reserves_no_feature_pool(cases):
    from fleetgen.tuning.platform import is_large_hopper_qwen3_vl

    assert not is_large_hopper_qwen3_vl(_geometry(cases, "llama-3.1-8b-style.json"), "sm90", H200_MIB)


@pytest.mark.parametrize("requests, mib", [(None, 1024), (1, 1024), (399, 1024), (400, 3072), (4096, 3072)])
def test_the_feature_pool_grows_to_three_gib_at_400_requests(requests, mib):
    from fleetgen.tuning.platform import qwen3_vl_hopper_reserve_mib

    assert qwen3_vl_hopper_reserve_mib(requests) == mib


def test_an_mla_model_outside_the_deepseek_family_takes_flashinfer_on_blackwell(cases):
    """get_default_attn_backend for MLA: flashinfer on SM100 unless a model override picks trtllm_mla."""
    from fleetgen.tuning.geometry import model_geometry
    from fleetgen.tuning.platform import attention_choice

    config = {**cases.load_config("deepseek-v3-style.json"), "architectures": ["DeepseekV2ForCausalLM"]}
    geometry = model_geometry(config)
    assert [attention_choice(geometry, LaunchOptions(), generation).backend
            for generation in ("sm100", "sm90", "sm80", None)] == ["flashinfer", "fa3", "triton", "triton"]
