"""The state-cache families beyond Qwen3-Next/3.5, Nemotron-H and Falcon-H1: each family's bytes per state slot,
layer split and slots per request as SGLang 0.5.23 sizes them (tests/oracle/test_state_families.py checks the
same public configs against SGLang's own config classes; the figures below are the ones it returned)."""

import dataclasses

import pytest

from fleetgen.errors import ModelConfigError
from fleetgen.tuning import LaunchOptions, profile_model
from fleetgen.tuning.geometry import model_geometry
from fleetgen.tuning.hf_config import as_sglang_reads
from fleetgen.tuning.sizing import size_pools
from fleetgen.tuning.state_shapes import state_elements
from sglang_sim.presets import preset_config

GIB = 1 << 30


def _profile(config: dict, tp: int = 1, **options):
    return profile_model(as_sglang_reads(config), 10**10, dataclasses.replace(LaunchOptions(**options), tp_size=tp))


# (preset, tp) -> (conv bytes, temporal bytes, state layers, attention layers, KV bytes per token)
FAMILIES = {
    # Granite 4.0-H: conv (8192 + 2 x 1 x 128) / tp x 3 x 2 B, temporal 128 / tp x 64 x 128 x 4 B, 36 Mamba layers;
    # 8 KV heads x (128 + 128) x 2 B over 4 attention layers
    ("granite-4.0-h-small", 1): (1_824_768, 150_994_944, 36, 4, 16_384),
    ("granite-4.0-h-small", 2): (940_032, 75_497_472, 36, 4, 8_192),
    # Kimi-Linear: conv 3 x 3 x 4096 / tp x 2 B, temporal 32 / tp x 128 x 128 x 4 B, 20 KDA layers; MLA latent
    # (512 + 64) x 2 B over 7 layers, the same on every rank
    ("kimi-linear-48b-a3b", 1): (1_474_560, 41_943_040, 20, 7, 8_064),
    ("kimi-linear-48b-a3b", 2): (737_280, 20_971_520, 20, 7, 8_064),
    # LFM2.5: conv 2048 / tp x 2 x 2 B and no temporal state over 22 short-conv layers; 8 KV heads x 128 x 2 B x 8
    ("lfm2.5-2.6b", 1): (180_224, 0, 22, 8, 16_384),
    ("lfm2.5-2.6b", 2): (90_112, 0, 22, 8, 8_192),
    # Jet-Nemotron: conv (12 x 256 + 2 x 12 x 96) / tp x 3 x 2 B, temporal 12 / tp x 256 x 96 x 4 B, 24 JetBlocks;
    # 2 full and 2 sliding-window layers in the one KV pool
    ("jet-nemotron-2b", 1): (774_144, 28_311_552, 24, 4, 4_096),
    ("jet-nemotron-2b", 2): (387_072, 14_155_776, 24, 4, 2_048),
}


@pytest.mark.parametrize("preset, tp", sorted(FAMILIES))
def test_each_familys_state_slot_layer_split_and_kv_cell(preset, tp):
    profile = _profile(preset_config(preset), tp)
    conv, temporal, state_layers, attention_layers, kv = FAMILIES[(preset, tp)]
    assert (profile.state_conv_bytes_per_slot, profile.state_ssm_bytes_per_slot) == (conv, temporal)
    assert (profile.geometry["state_layers"], profile.geometry["attention_layers"]) == (state_layers, attention_layers)
    assert profile.kv_bytes_per_token == kv and profile.is_hybrid


@pytest.mark.parametrize("preset, ratio, strategy, overlap", [
    ("granite-4.0-h-small", 5, "extra_buffer", True), ("kimi-linear-48b-a3b", 5, "extra_buffer", True),
    # outside SGLang's extra-buffer list: auto resolves to no_buffer and turns overlap scheduling off
    ("lfm2.5-2.6b", 3, "no_buffer", False), ("jet-nemotron-2b", 3, "no_buffer", False)])
def test_auto_radix_strategy_follows_the_families_extra_buffer_support(preset, ratio, strategy, overlap):
    profile = _profile(preset_config(preset))
    assert (profile.state_slots_per_request, profile.radix_strategy, profile.overlap_schedule) == (
        ratio, strategy, overlap)


def test_an_explicit_extra_buffer_on_a_family_without_it_is_refused_with_sglangs_words():
    with pytest.raises(ModelConfigError, match=r"extra_buffer is not supported for Lfm2ForCausalLM; use no_buffer\."):
        _profile(preset_config("lfm2.5-2.6b"), mamba_radix_cache_strategy="extra_buffer")


MAMBA1 = {"architectures": ["FalconMambaForCausalLM"], "model_type": "falcon_mamba", "torch_dtype": "bfloat16",
          "hidden_size": 4096, "num_hidden_layers": 64, "state_size": 16, "conv_kernel": 4, "expand": 16,
          "intermediate_size": 8192, "vocab_size": 65024}


def test_mamba1_is_full_rank_and_keeps_no_kv():
    """create_full_rank: conv (8192 / tp, 3), temporal (8192 / tp, 1, 16): config.json's intermediate_size, not
    expand x hidden_size (Falcon-Mamba-7B's expand 16 would say 65,536). No attention layer, no KV cell."""
    profile = _profile(MAMBA1, 2)
    assert (profile.state_conv_bytes_per_slot, profile.state_ssm_bytes_per_slot) == (
        4096 * 3 * 2 * 64, 4096 * 16 * 4 * 64)
    assert profile.kv_bytes_per_token == 0 and profile.geometry["attention_layers"] == 0
    without = {key: value for key, value in MAMBA1.items() if key != "intermediate_size"}
    assert _profile({**without, "expand": 2}, 2).state_conv_bytes_per_slot == 4096 * 3 * 2 * 64


def test_a_pure_mamba_model_stays_on_auto_with_three_slots_and_overlap_on():
    """Not in _MAMBA_RADIX_CACHE_ARCHS: SGLang resolves no strategy and adds no tracking slot."""
    profile = _profile(MAMBA1)
    assert (profile.state_slots_per_request, profile.radix_strategy, profile.overlap_schedule) == (3, None, True)
    with pytest.raises(ModelConfigError, match=r"--mamba-radix-cache-strategy extra_buffer needs mamba state, got "
                                               r"FalconMambaForCausalLM\."):
        _profile(MAMBA1, mamba_radix_cache_strategy="extra_buffer")


def test_a_zero_kv_cell_holds_the_context_length_or_max_total_tokens():
    """DefaultPoolConfigurator: without attention layers the token pool is --max-total-tokens, else context_len."""
    profile = _profile(MAMBA1)
    common = dict(pre_load_free_bytes=70 * GIB, mem_fraction_static=0.85, max_running_requests=None,
                  max_mamba_cache_size=None, context_length=8192)
    assert size_pools(profile, **common).max_total_num_tokens == 8192
    assert size_pools(profile, **common, max_total_tokens=20_000, page_size=64).max_total_num_tokens == 19_968
    # the plan says so, until --max-total-tokens is given
    assert any("--max-total-tokens" in note for note in profile.notes)
    assert not _profile(MAMBA1, max_total_tokens=20_000).notes


def test_mamba2_without_intermediate_size_is_refused_as_sglang_fails():
    config = {"architectures": ["Mamba2ForCausalLM"], "model_type": "mamba2", "hidden_size": 4096,
              "num_hidden_layers": 64, "num_heads": 128, "head_dim": 64, "n_groups": 8, "state_size": 128,
              "torch_dtype": "bfloat16"}
    with pytest.raises(ModelConfigError, match="'Mamba2Config' object has no attribute 'intermediate_size'"):
        _profile(config)
    # with the key, Mamba2StateShape.create: conv (8192 + 2 x 8 x 128) x 3 x 2 B, temporal 128 x 64 x 128 x 4 B
    profile = _profile({**config, "intermediate_size": 8192})
    assert (profile.state_conv_bytes_per_slot, profile.state_ssm_bytes_per_slot) == (
        10240 * 3 * 2 * 64, 128 * 64 * 128 * 4 * 64)


def test_an_all_attention_granite_is_a_plain_model():
    """GraniteMoeHybridConfig with no mamba layer: mamba2_cache_params is not used and the model is dense."""
    config = {**preset_config("granite-4.0-h-small"), "layer_types": ["attention"] * 40}
    geometry = model_geometry(config)
    assert (geometry.layout, geometry.is_hybrid, geometry.attention_layers) == ("dense", False, 40)


def test_granite_without_layer_types_takes_its_classs_every_sixth_layer():
    config = {key: value for key, value in preset_config("granite-4.0-h-small").items() if key != "layer_types"}
    geometry = model_geometry(config)
    assert (geometry.attention_layers, geometry.state_layers) == (6, 34)


def test_kda_at_a_tp_that_does_not_divide_the_heads_is_refused():
    with pytest.raises(ModelConfigError, match=r"tp 3 does not divide the state shapes \(projection 4096, 32 heads\)"):
        _profile(preset_config("kimi-linear-48b-a3b"), 3)


def test_the_config_ssm_dtype_is_read_only_by_classes_that_read_it():
    """mamba2_state_dtype(self) for Jet-Nemotron; Granite's default factory ignores the config's value."""
    jet = _profile({**preset_config("jet-nemotron-2b"), "mamba_ssm_dtype": "bfloat16"})
    granite = _profile({**preset_config("granite-4.0-h-small"), "mamba_ssm_dtype": "bfloat16"})
    assert (jet.ssm_dtype, granite.ssm_dtype) == ("bfloat16", "float32")
    assert _profile(preset_config("granite-4.0-h-small"), mamba_ssm_dtype="bfloat16").ssm_dtype == "bfloat16"


LIGHTNING = {"architectures": ["BailingMoeV2_5ForCausalLM"], "model_type": "bailing_hybrid", "torch_dtype": "bfloat16",
             "hidden_size": 2048, "num_hidden_layers": 20, "num_attention_heads": 16, "head_dim": 128,
             "layer_group_size": 4, "kv_lora_rank": 512, "qk_rope_head_dim": 64, "vocab_size": 157184}


def test_lightning_attention_keeps_a_heads_by_head_dim_squared_state_and_no_conv():
    """BailingHybridConfig without short_conv_kernel_size: Mamba2StateShape.create(intermediate 0, groups 0,
    16 heads, 128 x 128, kernel 1); every 4th layer is MLA attention."""
    profile = _profile(LIGHTNING, 2)
    assert (profile.state_conv_bytes_per_slot, profile.state_ssm_bytes_per_slot) == (0, 8 * 128 * 128 * 4 * 15)
    assert (profile.geometry["attention_layers"], profile.kv_bytes_per_token) == (5, (512 + 64) * 2 * 5)
    kda = _profile({**LIGHTNING, "architectures": ["BailingMoeV3ForCausalLM"], "short_conv_kernel_size": 4,
                    "use_mla_nope": True}, 2)
    assert (kda.state_conv_bytes_per_slot, kda.geometry["state_rule"]) == (3 * 3 * 1024 * 2 * 15, "kda")
    assert kda.kv_bytes_per_token == 512 * 2 * 5  # Bailing 3 under use_mla_nope keeps no rope part


def test_minicpm_sala_runs_without_the_radix_cache():
    config = {"architectures": ["MiniCPMSALAForCausalLM"], "model_type": "minicpm_sala", "torch_dtype": "bfloat16",
              "hidden_size": 1024, "num_hidden_layers": 8, "num_attention_heads": 16, "num_key_value_heads": 16,
              "mixer_types": ["lightning", "lightning", "lightning", "minicpm4"], "vocab_size": 73448}
    profile = _profile(config)
    assert (profile.geometry["state_layers"], profile.geometry["attention_layers"]) == (6, 2)
    assert (profile.state_slots_per_request, profile.radix_strategy) == (1, None)


def test_zaya_keeps_a_cca_conv_window_and_the_whole_hidden_state():
    config = {"architectures": ["ZayaForCausalLM"], "model_type": "zaya", "torch_dtype": "bfloat16",
              "hidden_size": 2048, "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2,
              "head_dim": 128, "zaya_layers": ["a", "m", "a", "m"], "vocab_size": 262272}
    geometry = model_geometry(config)
    assert (geometry.state_layers, geometry.attention_layers) == (2, 2)
    # conv[0] (8 + 2) x 128 / tp by (2 - 1) + (2 - 1), conv[1] the full 2048 by 1, no temporal state
    assert state_elements(geometry, 2).conv == 640 * 2 + 2048 and state_elements(geometry, 2).temporal == 0


@pytest.mark.parametrize("architecture, model_type, words", [
    ("InklingForConditionalGeneration", "inkling_mm_model", "six short-convolution windows"),
    ("Qwen4ExpForConditionalGeneration", "qwen4_exp", "n-gram context"),
    ("Glm5NextForConditionalGeneration", "glm5_next", "indexer KV cache")])
def test_a_state_family_the_tuner_does_not_plan_is_refused_with_its_reason(architecture, model_type, words):
    config = {"architectures": [architecture], "model_type": model_type, "num_hidden_layers": 4,
              "num_attention_heads": 4, "head_dim": 8, "torch_dtype": "bfloat16"}
    with pytest.raises(ModelConfigError, match=words) as refused:
        model_geometry(config)
    assert refused.value.hint == "plan this model by hand with explicit SGLang flags"
