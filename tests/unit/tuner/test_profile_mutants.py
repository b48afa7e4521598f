"""The memory profile's edges no other test pins: every refusal's whole error (message, file, hint), the
options that change a number only in one branch (GPU feature transport, --mamba-full-memory-ratio,
a config's mamba_ssm_dtype, page size 2), and the profile's byte counts as the plan's JSON stores them.

Each value is what SGLang 0.5.23 does (docs/sglang-memory-model.md; the SGLang source named per test).
"""

import json

import pytest

from fleetgen.errors import ModelConfigError
from fleetgen.tuning.geometry import model_geometry
from fleetgen.tuning.profile import LaunchOptions, MemoryProfile, profile_geometry, profile_model, \
    weights_bytes_from_index

MIB = 1 << 20


def _error(call, *args, **kwargs) -> ModelConfigError:
    with pytest.raises(ModelConfigError) as caught:
        call(*args, **kwargs)
    return caught.value


def _assert_error(error: ModelConfigError, *, message: str, path: str | None, hint: str | None) -> None:
    assert (error.message, error.path, error.hint) == (message, path, hint)
    assert str(error) == (f"[{path}] {message}" if path else message) + (
        f"\nWhat to check next: {hint}" if hint else "")


# -- weights ---------------------------------------------------------------------------------------------

def test_weights_must_be_positive_and_the_error_names_the_config(cases):
    geometry = model_geometry(cases.load_config("llama-3.1-8b-style.json"))
    _assert_error(_error(profile_geometry, geometry, 0, LaunchOptions(), config_path="/m/llama/config.json"),
                  message="weights bytes must be positive, got 0", path="/m/llama/config.json", hint=None)
    # Without a path the error still says which file: the model's config.json.
    assert _error(profile_geometry, geometry, -5, LaunchOptions()).path == "config.json"
    # One byte is a (tiny) positive weight: profiled, not refused.
    assert profile_geometry(geometry, 1, LaunchOptions()).weights_bytes_total == 1


def test_profile_geometry_without_a_draft_counts_only_the_target_weights(cases):
    geometry = model_geometry(cases.load_config("llama-3.1-8b-style.json"))
    profile = profile_geometry(geometry, 16 * 10**9, LaunchOptions(tp_size=2))
    assert (profile.weights_bytes_total, profile.weights_bytes_per_gpu, profile.draft_weights_bytes) == \
        (16 * 10**9, 8 * 10**9, 0)


def test_weights_per_gpu_are_whole_bytes(cases):
    # An odd byte count over tp 2: each rank holds a whole number of bytes, and the plan's JSON an integer.
    profile = profile_model(cases.load_config("llama-3.1-8b-style.json"), 10**9 + 1, LaunchOptions(tp_size=2))
    assert profile.weights_bytes_per_gpu == 500_000_000
    assert json.dumps(profile.to_dict()["weights_bytes_per_gpu"]) == "500000000"


def test_index_total_size_must_be_positive_and_names_the_index_file():
    _assert_error(_error(weights_bytes_from_index, {"metadata": {"total_size": 0}}, path="/m/x/index.json"),
                  message="metadata.total_size is 0, not a positive byte count", path="/m/x/index.json", hint=None)
    missing = _error(weights_bytes_from_index, {"metadata": {}})
    _assert_error(missing, message="the safetensors index has no numeric metadata.total_size (found None)",
                  path="model.safetensors.index.json",
                  hint="pass the model's model.safetensors.index.json; a single-file checkpoint's weight bytes "
                       "are the file size")
    assert weights_bytes_from_index({"metadata": {"total_size": "1"}}) == 1


def test_language_model_only_refusal_names_file_supported_list_and_hint(seed_config, seed_options):
    """model_hook.handle_language_model_only raises for any architecture off SGLang's list."""
    error = _error(profile_model, seed_config, 54 * 10**9, seed_options.replace(language_model_only=True),
                   config_path="/m/qwen3.6/config.json")
    _assert_error(error, message="Qwen3_5ForConditionalGeneration: SGLang 0.5.23 refuses --language-model-only for "
                                 "this architecture (supported: Cosmos3EdgeForConditionalGeneration, "
                                 "Cosmos3ForConditionalGeneration, DeepseekV4ForCausalLM, "
                                 "MuseGlimmerForConditionalGeneration)",
                  path="/m/qwen3.6/config.json", hint="drop --language-model-only from the extra SGLang args")


# -- KV dtype ----------------------------------------------------------------------------------------------

def test_kv_auto_without_a_model_dtype_error_names_file_and_hint(cases):
    config = cases.load_config("llama-3.1-8b-style.json")
    del config["torch_dtype"]
    expected = dict(message="LlamaForCausalLM: --kv-cache-dtype auto needs the model dtype, but config.json has "
                            "torch_dtype/dtype None",
                    hint="pass --kv-cache-dtype explicitly in the extra SGLang args")
    _assert_error(_error(profile_model, config, 10**9, LaunchOptions(), config_path="/m/llama/config.json"),
                  path="/m/llama/config.json", **expected)
    _assert_error(_error(profile_model, config, 10**9, LaunchOptions()), path="config.json", **expected)


# -- speculative decoding ----------------------------------------------------------------------------------

def test_eagle_without_a_draft_path_uses_the_mtp_head_like_nextn(seed_config):
    """speculative_hook rewrites NEXTN to EAGLE: a path-less EAGLE on Qwen3.5 builds the same 1-layer pool."""
    args = dict(speculative_num_steps=3, speculative_eagle_topk=1, speculative_num_draft_tokens=4)
    eagle = profile_model(seed_config, 54 * 10**9, LaunchOptions(speculative_algorithm="EAGLE", **args))
    nextn = profile_model(seed_config, 54 * 10**9, LaunchOptions(speculative_algorithm="NEXTN", **args))
    assert eagle.draft_kv_bytes_per_token_outside == nextn.draft_kv_bytes_per_token_outside == 4 * 512 * 2
    assert eagle.kv_bytes_per_token == nextn.kv_bytes_per_token == 65_536
    assert eagle.spec_algorithm == nextn.spec_algorithm == "EAGLE"


def test_nextn_without_an_mtp_head_error_names_file_and_hint(cases):
    config = cases.load_config("llama-3.1-8b-style.json")
    for algorithm in ("NEXTN", "EAGLE3"):
        error = _error(profile_model, config, 10**9, LaunchOptions(speculative_algorithm=algorithm),
                       config_path="/m/llama/config.json")
        _assert_error(error, message=f"LlamaForCausalLM: --speculative-algorithm {algorithm} without "
                                     "--speculative-draft-model-path needs a built-in MTP head, but config.json has "
                                     "neither num_nextn_predict_layers nor mtp_num_hidden_layers",
                      path="/m/llama/config.json",
                      hint="give the draft model path in the extra SGLang args, or drop speculative decoding")


def test_draft_path_without_its_config_error_names_the_draft(cases):
    options = LaunchOptions(speculative_algorithm="EAGLE3", speculative_draft_model_path="/models/eagle3")
    error = _error(profile_model, cases.load_config("llama-3.1-8b-style.json"), 10**9, options)
    _assert_error(error, message="--speculative-draft-model-path is set but the draft's config.json was not given",
                  path="/models/eagle3", hint="read the draft model's config.json too and pass it as draft_config")


def test_draft_config_without_a_layer_count_error_names_its_file(cases):
    options = LaunchOptions(speculative_algorithm="EAGLE3", speculative_draft_model_path="/models/eagle3")
    error = _error(profile_model, cases.load_config("llama-3.1-8b-style.json"), 10**9, options,
                   draft_config={"architectures": ["LlamaForCausalLMEagle3"]})
    _assert_error(error, message="the draft config has neither num_nextn_predict_layers nor num_hidden_layers",
                  path="/models/eagle3/config.json", hint=None)


# 32 layers x 8 KV heads x (128 + 128) x 2 bytes: the llama-style target's cell.
LLAMA_CELL = 131_072


@pytest.mark.parametrize("draft, layers", [
    # ModelConfig reads a draft's text_config like a target's (get_hf_text_config).
    ({"architectures": ["X"], "text_config": {"num_hidden_layers": 2}, "num_hidden_layers": 7}, 2),
    # spec_aux_hidden_state: the draft's num_nextn_predict_layers wins over its num_hidden_layers.
    ({"architectures": ["X"], "num_nextn_predict_layers": 1, "num_hidden_layers": 3}, 1),
    ({"architectures": ["X"], "num_hidden_layers": 3}, 3),
])
def test_separate_draft_layers_are_folded_into_the_cell(cases, draft, layers):
    """DefaultPoolConfigurator: cell += int(cell * draft_layers / L_kv)."""
    options = LaunchOptions(speculative_algorithm="EAGLE3", speculative_draft_model_path="/models/draft")
    profile = profile_model(cases.load_config("llama-3.1-8b-style.json"), 16 * 10**9, options,
                            draft_config=draft, draft_weights_bytes=10**9)
    assert profile.draft_model_layers == layers
    assert profile.kv_bytes_per_token == LLAMA_CELL + int(LLAMA_CELL * layers / 32)
    assert profile.draft_kv_bytes_per_token_outside == 0


def test_draft_errors_raised_in_profiling_name_the_callers_config_path(cases):
    """profile_model hands its config_path on: an error found past the geometry still names that file."""
    options = LaunchOptions(speculative_algorithm="NEXTN")
    error = _error(profile_model, cases.load_config("llama-3.1-8b-style.json"), 10**9, options,
                   config_path="/m/llama/config.json")
    assert error.path == "/m/llama/config.json"


# -- linear-attention state ----------------------------------------------------------------------------------

def test_config_mamba_ssm_dtype_sizes_the_ssm_state(qwen3_next_config):
    """mamba2_state_dtype: a valid config mamba_ssm_dtype sizes the temporal state (no flag given)."""
    qwen3_next_config["mamba_ssm_dtype"] = "bfloat16"
    profile = profile_model(qwen3_next_config, 160 * 10**9, LaunchOptions())
    assert profile.ssm_dtype == "bfloat16"
    assert profile.state_ssm_bytes_per_slot == 32 * 128 * 128 * 2 * 36
    assert profile.notes == ()
    # The flag wins over the config.
    flagged = profile_model(qwen3_next_config, 160 * 10**9, LaunchOptions(mamba_ssm_dtype="float32"))
    assert flagged.ssm_dtype == "float32"
    assert flagged.state_ssm_bytes_per_slot == 32 * 128 * 128 * 4 * 36


def test_invalid_config_mamba_ssm_dtype_falls_back_to_float32_with_a_note(qwen3_next_config):
    """mamba2_state_dtype logs 'Invalid mamba_ssm_dtype ... Using default float32' and sizes fp32 state."""
    qwen3_next_config["mamba_ssm_dtype"] = "fp8"
    profile = profile_model(qwen3_next_config, 160 * 10**9, LaunchOptions())
    assert profile.ssm_dtype == "float32"
    assert profile.state_ssm_bytes_per_slot == 32 * 128 * 128 * 4 * 36
    assert profile.notes == ("config mamba_ssm_dtype 'fp8' is invalid; SGLang falls back to float32",)


def test_tp_that_does_not_divide_the_state_heads_error_names_file_and_hint(cases):
    """Mamba2StateShape.create divides both conv_dim and the heads by tp; either one failing kills SGLang.
    Falcon-H1 at tp 16: its 1 group is extended to 16, conv_dim 6144 + 2 x 16 x 256 = 14336 divides, 24 heads do not."""
    config = cases.load_config("falcon-h1-7b-style.json")
    error = _error(profile_model, config, 15 * 10**9, LaunchOptions(tp_size=16), config_path="/m/falcon/config.json")
    _assert_error(error, message="FalconH1ForCausalLM: tp 16 does not divide the state shapes (conv_dim 14336, "
                                 "24 heads); SGLang's divide() would fail",
                  path="/m/falcon/config.json", hint="choose a tp size that divides the linear-attention head count")
    # tp 3: 1 group -> 3, conv_dim 7680 and 24 heads both divide: profiled.
    profile = profile_model(config, 15 * 10**9, LaunchOptions(tp_size=3))
    assert profile.state_conv_bytes_per_slot == 7680 // 3 * 3 * 2 * 44
    assert profile.state_ssm_bytes_per_slot == 8 * 256 * 256 * 4 * 44


def test_state_bytes_are_whole_numbers_in_the_plans_json(qwen3_next_config):
    profile = profile_model(qwen3_next_config, 160 * 10**9, LaunchOptions(tp_size=2))
    stored = json.loads(json.dumps(profile.to_dict()))
    for key in ("state_conv_bytes_per_slot", "state_ssm_bytes_per_slot", "state_bytes_per_slot",
                "spec_bytes_per_request", "kv_bytes_per_token", "weights_bytes_per_gpu"):
        assert type(stored[key]) is int, key
    assert stored["state_conv_bytes_per_slot"] == 24_576 * 36
    assert stored["state_ssm_bytes_per_slot"] == 1_048_576 * 36


@pytest.mark.parametrize("args, ratio, strategy, overlap", [
    # overrides._mamba_radix_cache_resolution: paging is page_size > 1, so 2 already asks for extra_buffer.
    (["--disable-overlap-schedule", "--page-size", "2"], 4, "extra_buffer", False),
    # auto without overlap or paging: no_buffer, and SGLang turns overlap scheduling off.
    (["--disable-overlap-schedule"], 3, "no_buffer", False),
    (["--disable-overlap-schedule", "--page-size", "1"], 3, "no_buffer", False),
    ([], 5, "extra_buffer", True),
])
def test_auto_radix_strategy_and_overlap(qwen3_next_config, args, ratio, strategy, overlap):
    profile = profile_model(qwen3_next_config, 10**9, LaunchOptions.from_args(args))
    assert (profile.state_slots_per_request, profile.radix_strategy, profile.overlap_schedule) == \
        (ratio, strategy, overlap)


def test_lazy_extra_buffer_without_overlap_error_says_what_to_change(qwen3_next_config):
    options = LaunchOptions.from_args(["--mamba-radix-cache-strategy", "extra_buffer_lazy",
                                       "--disable-overlap-schedule"])
    _assert_error(_error(profile_model, qwen3_next_config, 10**9, options),
                  message="--mamba-radix-cache-strategy extra_buffer_lazy needs overlap scheduling (SGLang asserts "
                          "against --disable-overlap-schedule)",
                  path=None, hint="drop --disable-overlap-schedule or use extra_buffer")


def test_mamba_full_memory_ratio_flag_is_kept(qwen3_next_config):
    """schedule.py: --mamba-full-memory-ratio falls back to 0.9 only when unset."""
    assert profile_model(qwen3_next_config, 10**9, LaunchOptions()).mamba_full_memory_ratio == 0.9
    pinned = profile_model(qwen3_next_config, 10**9, LaunchOptions.from_args(["--mamba-full-memory-ratio", "0.5"]))
    assert pinned.mamba_full_memory_ratio == 0.5


# -- multimodal reservation -----------------------------------------------------------------------------------

@pytest.mark.parametrize("transport, reserve_mib", [
    (None, 100), ("cpu", 100), ("cuda_ipc", 100 + 1024), ("cuda_vmm", 100 + 1024),
])
def test_gpu_feature_transport_reserves_the_feature_pool(seed_config, seed_options, transport, reserve_mib):
    """kv_cache_configurator.mm_runtime_reservation_gb: SGLANG_VLM_CACHE_SIZE_MB (100), plus
    SGLANG_MM_FEATURE_CACHE_MB (1024) with --mm-feature-transport cuda_ipc or cuda_vmm."""
    profile = profile_model(seed_config, 54 * 10**9, seed_options.replace(mm_feature_transport=transport))
    assert profile.multimodal_reserve_bytes == reserve_mib * MIB


# -- stored profiles ---------------------------------------------------------------------------------------------

def test_a_stored_profile_without_notes_reads_back(seed_profile):
    data = seed_profile.to_dict()
    del data["notes"]
    assert MemoryProfile.from_dict(data).notes == ()
