"""Memory profile numbers against docs/sglang-memory-model.md §4 (the Qwen3-Next table, the seed scenario)
and hand arithmetic."""

import pytest
from fleetgen.errors import ModelConfigError
from fleetgen.tuning.profile import LaunchOptions, MemoryProfile, profile_model, weights_bytes_from_index
from fleetgen.tuning.geometry import model_geometry

MIB = 1 << 20


def test_seed_profile_matches_the_worked_case(seed_profile):
    # Seed README "Computed per-unit sizes (tp 1)".
    assert seed_profile.layout == "hybrid_gdn"
    assert seed_profile.state_conv_bytes_per_slot == 61_440 * 48
    assert seed_profile.state_ssm_bytes_per_slot == 3_145_728 * 48
    assert seed_profile.state_bytes_per_slot == 153_944_064
    assert round(seed_profile.state_bytes_per_slot / MIB, 2) == 146.81
    # 4 KV heads x (256 + 256) x 16 full-attention layers x 2 bytes.
    assert seed_profile.kv_bytes_per_token == 65_536
    assert seed_profile.state_slots_per_request == 5  # extra_buffer with overlap
    assert (seed_profile.spec_algorithm, seed_profile.spec_steps, seed_profile.spec_topk,
            seed_profile.draft_tokens) == ("EAGLE", 3, 1, 4)
    assert seed_profile.spec_bytes_per_request == 4 * 153_944_064
    assert seed_profile.weights_bytes_per_gpu == 54_000_000_000
    assert seed_profile.model_context_length == 262_144
    assert seed_profile.ssm_dtype == "float32"


def test_seed_mtp_head_is_a_draft_pool_outside_the_budget(seed_profile):
    # Qwen3.5 names its MTP head mtp_num_hidden_layers; SGLang folds only num_nextn_predict_layers.
    assert seed_profile.draft_kv_bytes_per_token_outside == 4 * 512 * 2
    assert any("outside SGLang's static budget" in note for note in seed_profile.notes)


def test_num_nextn_predict_layers_folds_the_draft_layer_into_the_cell(seed_config, seed_options):
    seed_config["text_config"]["num_nextn_predict_layers"] = 1
    profile = profile_model(seed_config, 54_000_000_000, seed_options)
    assert profile.kv_bytes_per_token == 69_632  # README: "69,632 B with the MTP layer folded in"
    assert profile.draft_kv_bytes_per_token_outside == 0


def test_seed_is_multimodal_and_reserves_the_vlm_cache(seed_profile, seed_config, seed_options):
    assert seed_profile.multimodal_reserve_bytes == 100 * MIB
    # SGLang 0.5.23 refuses --language-model-only on Qwen3.5/3.6 (arg_groups/model_hook.py): the tuner says so
    # before anything is launched instead of planning a server that dies at start-up.
    with pytest.raises(ModelConfigError, match="refuses --language-model-only"):
        profile_model(seed_config, 54_000_000_000, seed_options.replace(language_model_only=True))


def test_multimodal_follows_sglangs_architecture_list():
    """configs/model_config.py: a text_config alone does not make a model multimodal; the architecture does."""
    text_with_sub_config = {"architectures": ["Qwen3ForCausalLM"], "text_config": {
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
        "torch_dtype": "bfloat16"}}
    assert not profile_model(text_with_sub_config, 10**9, LaunchOptions()).multimodal_reserve_bytes
    off_by_default = dict(text_with_sub_config, architectures=["Gemma3ForConditionalGeneration"])
    assert not profile_model(off_by_default, 10**9, LaunchOptions()).multimodal_reserve_bytes
    vlm = dict(text_with_sub_config, architectures=["Qwen3VLForConditionalGeneration"])
    assert profile_model(vlm, 10**9, LaunchOptions()).multimodal_reserve_bytes == 100 * MIB


@pytest.mark.parametrize("tp, conv_per_layer, ssm_per_layer, p_fp32, p_bf16, kv", [
    (1, 49_152, 2_097_152, 77_266_944, 39_518_208, 24_576),
    (2, 24_576, 1_048_576, 38_633_472, 19_759_104, 12_288),
    (4, 12_288, 524_288, 19_316_736, 9_879_552, 12_288),
    (8, 6_144, 262_144, 9_658_368, 4_939_776, 12_288),
])
def test_qwen3_next_matches_sglang_facts_section_4(qwen3_next_config, tp, conv_per_layer, ssm_per_layer,
                                                   p_fp32, p_bf16, kv):
    fp32 = profile_model(qwen3_next_config, 160 * 10**9, LaunchOptions(tp_size=tp))
    bf16 = profile_model(qwen3_next_config, 160 * 10**9, LaunchOptions(tp_size=tp, mamba_ssm_dtype="bfloat16"))
    assert fp32.state_conv_bytes_per_slot == conv_per_layer * 36
    assert fp32.state_ssm_bytes_per_slot == ssm_per_layer * 36
    assert fp32.state_bytes_per_slot == p_fp32
    assert bf16.state_bytes_per_slot == p_bf16
    assert fp32.kv_bytes_per_token == kv
    assert fp32.weights_bytes_per_gpu == 160 * 10**9 // tp


def test_qwen3_next_mtp_layer_adds_a_twelfth_when_sglang_knows_it(qwen3_next_config):
    qwen3_next_config["num_nextn_predict_layers"] = 1
    profile = profile_model(qwen3_next_config, 160 * 10**9, LaunchOptions(speculative_algorithm="NEXTN"))
    assert profile.kv_bytes_per_token == 26_624  # 24,576 + 24,576 / 12
    assert profile.spec_bytes_per_request == 4 * 77_266_944


@pytest.mark.parametrize("args, ratio, strategy", [
    ([], 5, "extra_buffer"),                                   # auto + overlap -> extra_buffer
    (["--disable-overlap-schedule"], 3, "no_buffer"),          # auto, no overlap, page 1 -> no_buffer
    (["--disable-overlap-schedule", "--page-size", "16"], 4, "extra_buffer"),
    (["--mamba-radix-cache-strategy", "extra_buffer", "--disable-overlap-schedule"], 4, "extra_buffer"),
    (["--mamba-radix-cache-strategy", "extra_buffer_lazy"], 4, "extra_buffer_lazy"),
    (["--mamba-radix-cache-strategy", "no_buffer"], 3, "no_buffer"),
    (["--disable-radix-cache"], 1, None),
])
def test_state_slots_per_request(qwen3_next_config, args, ratio, strategy):
    profile = profile_model(qwen3_next_config, 10**9, LaunchOptions.from_args(args))
    assert (profile.state_slots_per_request, profile.radix_strategy) == (ratio, strategy)


def test_lazy_extra_buffer_without_overlap_is_refused(qwen3_next_config):
    options = LaunchOptions.from_args(["--mamba-radix-cache-strategy", "extra_buffer_lazy",
                                       "--disable-overlap-schedule"])
    with pytest.raises(ModelConfigError, match="extra_buffer_lazy needs overlap"):
        profile_model(qwen3_next_config, 10**9, options)


@pytest.mark.parametrize("tp, kv_dtype, expected", [
    (1, "auto", 8 * 256 * 32 * 2),
    (8, "auto", 1 * 256 * 32 * 2),
    (16, "auto", 1 * 256 * 32 * 2),  # fewer KV heads than ranks: each keeps one
    (1, "fp8_e4m3", 8 * 256 * 32 * 1),
])
def test_dense_gqa_kv_per_token(tp, kv_dtype, expected, cases):
    config = cases.load_config("llama-3.1-8b-style.json")
    profile = profile_model(config, 16 * 10**9, LaunchOptions(tp_size=tp, kv_cache_dtype=kv_dtype))
    assert profile.layout == "dense" and not profile.is_hybrid
    assert profile.kv_bytes_per_token == expected
    assert profile.state_bytes_per_slot == 0 and profile.spec_bytes_per_request == 0
    # head_dim is derived from hidden_size / heads; the llama3 rope factor does not stretch the context.
    assert profile.model_context_length == 131_072


def test_dense_llama_speculative_defaults_are_5_4_8(cases):
    config = cases.load_config("llama-3.1-8b-style.json")
    draft = {"architectures": ["LlamaForCausalLMEagle3"], "num_hidden_layers": 1}
    options = LaunchOptions(speculative_algorithm="EAGLE3", speculative_draft_model_path="/models/eagle3")
    profile = profile_model(config, 16 * 10**9, options, draft_config=draft, draft_weights_bytes=10**9)
    assert (profile.spec_steps, profile.spec_topk, profile.draft_tokens) == (5, 4, 8)
    assert profile.kv_bytes_per_token == 131_072 + 131_072 // 32  # one draft layer folded in
    assert profile.weights_bytes_per_gpu == 17 * 10**9


def test_separate_draft_model_needs_its_config(cases):
    config = cases.load_config("llama-3.1-8b-style.json")
    options = LaunchOptions(speculative_algorithm="EAGLE3", speculative_draft_model_path="/models/eagle3")
    with pytest.raises(ModelConfigError, match="draft's config.json"):
        profile_model(config, 16 * 10**9, options)


def test_mla_latent_is_replicated_and_folds_nextn(cases):
    config = cases.load_config("deepseek-v3-style.json")
    plain = profile_model(config, 10**12, LaunchOptions(tp_size=8))
    assert plain.layout == "mla" and plain.uses_mla
    assert plain.kv_bytes_per_token == (512 + 64) * 61 * 2  # not divided by tp
    spec = profile_model(config, 10**12, LaunchOptions(tp_size=8, speculative_algorithm="NEXTN"))
    assert spec.kv_bytes_per_token == 70_272 + 70_272 // 61
    assert spec.draft_tokens == 4
    # yarn with original_max_position_embeddings keeps the factor at 1.
    assert plain.model_context_length == 163_840


def test_nemotron_h_pattern_and_state(cases):
    profile = profile_model(cases.load_config("nemotron-h-8b-style.json"), 16 * 10**9, LaunchOptions())
    geometry = model_geometry(cases.load_config("nemotron-h-8b-style.json"))
    assert (geometry.num_layers, geometry.attention_layers, geometry.state_layers) == (52, 4, 24)
    conv = (128 * 64 + 2 * 8 * 128) * 3 * 2
    ssm = 128 * 64 * 128 * 4
    assert profile.state_bytes_per_slot == (conv + ssm) * 24
    assert profile.kv_bytes_per_token == 8 * 256 * 4 * 2


def test_falcon_h1_has_attention_and_mamba_in_every_layer_and_extends_groups(cases):
    config = cases.load_config("falcon-h1-7b-style.json")
    tp1 = profile_model(config, 15 * 10**9, LaunchOptions())
    assert tp1.state_bytes_per_slot == ((6144 + 2 * 256) * 3 * 2 + 24 * 256 * 256 * 4) * 44
    assert tp1.kv_bytes_per_token == 2 * 256 * 44 * 2
    tp2 = profile_model(config, 15 * 10**9, LaunchOptions(tp_size=2))
    # n_groups 1 does not divide by 2: SGLang extends it to 2 groups (extra_groups_for_head_shards).
    assert tp2.state_conv_bytes_per_slot == (6144 + 2 * 2 * 256) // 2 * 3 * 2 * 44


def test_unknown_dense_layout_names_the_missing_keys():
    with pytest.raises(ModelConfigError) as error:
        profile_model({"architectures": ["FooForCausalLM"], "hidden_size": 1024, "torch_dtype": "bfloat16"},
                      10**9, LaunchOptions(), config_path="/models/foo/config.json")
    text = str(error.value)
    assert "num_hidden_layers" in text and "num_attention_heads" in text
    assert "/models/foo/config.json" in text and "FooForCausalLM" in text


def test_unknown_stateful_layout_is_not_sized_as_dense():
    jamba_like = {"architectures": ["JambaForCausalLM"], "num_hidden_layers": 32, "num_attention_heads": 32,
                  "num_key_value_heads": 8, "hidden_size": 4096, "torch_dtype": "bfloat16",
                  "mamba_d_state": 16, "mamba_d_conv": 4, "attn_layer_period": 8}
    with pytest.raises(ModelConfigError, match="unknown layout.*attn_layer_period.*mamba_d_conv"):
        profile_model(jamba_like, 10**9, LaunchOptions())


def test_hybrid_config_missing_a_key_names_it(qwen3_next_config):
    del qwen3_next_config["full_attention_interval"]
    with pytest.raises(ModelConfigError, match="missing: full_attention_interval"):
        profile_model(qwen3_next_config, 10**9, LaunchOptions())


def test_tp_that_does_not_divide_the_state_heads_is_an_error(qwen3_next_config):
    with pytest.raises(ModelConfigError, match="tp 3 does not divide"):
        profile_model(qwen3_next_config, 10**9, LaunchOptions(tp_size=3))


def test_kv_auto_without_a_model_dtype_is_an_error(cases):
    config = cases.load_config("llama-3.1-8b-style.json")
    del config["torch_dtype"]
    with pytest.raises(ModelConfigError, match="--kv-cache-dtype auto needs the model dtype"):
        profile_model(config, 10**9, LaunchOptions())
    assert profile_model(config, 10**9, LaunchOptions(kv_cache_dtype="bfloat16")).kv_bytes_per_token == 131_072


def test_nextn_without_an_mtp_head_is_an_error(cases):
    with pytest.raises(ModelConfigError, match="needs a built-in MTP head"):
        profile_model(cases.load_config("llama-3.1-8b-style.json"), 10**9, LaunchOptions(speculative_algorithm="NEXTN"))


def test_weights_bytes_from_index():
    assert weights_bytes_from_index({"metadata": {"total_size": 54_000_000_000}, "weight_map": {}}) == 54 * 10**9
    with pytest.raises(ModelConfigError, match="total_size") as error:
        weights_bytes_from_index({"weight_map": {}}, path="/models/x/model.safetensors.index.json")
    assert "/models/x/model.safetensors.index.json" in str(error.value)


def test_profile_round_trips_through_a_dict(seed_profile):
    assert MemoryProfile.from_dict(seed_profile.to_dict()) == seed_profile


@pytest.mark.parametrize("extra, message", [
    ({"layer_types": ["sliding_attention", "full_attention"] * 16}, "sliding-window layers"),
    ({"index_topk": 2048}, "DSA sparse attention"),
])
def test_layouts_with_unmodeled_pools_are_refused(cases, extra, message):
    config = {**cases.load_config("llama-3.1-8b-style.json"), **extra}
    with pytest.raises(ModelConfigError, match=message):
        profile_model(config, 10**9, LaunchOptions())
