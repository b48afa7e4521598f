"""config.json parsing the way SGLang 0.5.23 reads it: context-length keys, rope scaling, MHA, Falcon-H1, VLMs."""

import pytest
from fleetgen.errors import ModelConfigError
from fleetgen.tuning.geometry import model_geometry, text_config_of
import json
import pathlib
from fleetgen.tuning.geometry import model_geometry

def _dense(**extra):
    return {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 4, "num_attention_heads": 8,
            "num_key_value_heads": 2, "head_dim": 64, "torch_dtype": "bfloat16", **extra}


@pytest.mark.parametrize("keys, context", [
    ({"seq_length": 4096, "max_position_embeddings": 32768}, 4096),       # the first key present wins
    ({"max_sequence_length": 1000, "model_max_length": 9}, 1000),
    ({"max_seq_len": None, "model_max_length": 777}, 777),
    ({}, 2048),                                                           # SGLang's fallback
])
def test_the_first_context_length_key_wins(keys, context):
    assert model_geometry(_dense(**keys)).context_length == context


@pytest.mark.parametrize("rope, context", [
    ({"factor": 4.0, "rope_type": "yarn"}, 131072),
    ({"factor": 4.0, "original_max_position_embeddings": 8192}, 32768),
    ({"factor": 8.0, "rope_type": "llama3"}, 32768),
    ({"factor": None, "rope_type": "linear"}, 32768),
    ({"rope_type": "dynamic"}, 32768),
    ({}, 32768),
])
def test_rope_scaling_factor_multiplies_the_context(rope, context):
    assert model_geometry(_dense(max_position_embeddings=32768, rope_scaling=rope)).context_length == context


def test_mha_without_num_key_value_heads_has_one_kv_head_per_attention_head():
    config = _dense(hidden_size=1024)
    del config["num_key_value_heads"], config["head_dim"]
    geometry = model_geometry(config)
    assert (geometry.kv_heads, geometry.head_dim, geometry.v_head_dim) == (8, 128, 128)
    assert model_geometry(_dense(v_head_dim=32)).v_head_dim == 32


def test_dense_fields_and_dtype_fallbacks():
    geometry = model_geometry({"num_hidden_layers": 3, "num_attention_heads": 4, "head_dim": 16, "dtype": "float16"})
    assert (geometry.architecture, geometry.layout, geometry.num_layers, geometry.attention_layers) == (
        "<no architectures>", "dense", 3, 3)
    assert geometry.model_dtype == "float16" and not geometry.is_multimodal and not geometry.is_hybrid
    assert model_geometry(_dense(torch_dtype=None)).model_dtype is None


def _falcon(**extra):
    return {"architectures": ["FalconH1ForCausalLM"], "num_hidden_layers": 2, "num_attention_heads": 8,
            "num_key_value_heads": 2, "head_dim": 64, "mamba_n_heads": 16, "mamba_n_groups": 1,
            "mamba_d_state": 128, "mamba_d_conv": 4, "hidden_size": 1024, "mamba_expand": 2, **extra}


@pytest.mark.parametrize("extra, intermediate, head_dim", [
    ({"mamba_d_head": "auto"}, 2048, 128),
    ({}, 2048, 128),
    ({"mamba_d_head": None, "mamba_d_ssm": 3072}, 3072, 192),
    ({"mamba_d_head": 64, "mamba_d_ssm": 3072}, 3072, 64),
    ({"mamba_d_ssm": 3000}, 3000, 187),
])
def test_falcon_h1_mamba_head_dim_auto_is_intermediate_over_heads(extra, intermediate, head_dim):
    geometry = model_geometry(_falcon(**extra))
    assert (geometry.layout, geometry.state_intermediate, geometry.state_head_dim) == ("falcon_h1", intermediate,
                                                                                        head_dim)
    assert type(geometry.state_head_dim) is int
    assert (geometry.state_layers, geometry.attention_layers, geometry.state_heads, geometry.state_groups,
            geometry.state_size, geometry.conv_kernel) == (2, 2, 16, 1, 128, 4)


def test_falcon_h1_without_ssm_width_names_what_it_needs():
    config = _falcon()
    del config["mamba_expand"]
    with pytest.raises(ModelConfigError, match=r"Falcon-H1 \(no mamba_d_ssm\) config needs mamba_expand, "
                                               r"hidden_size; missing: mamba_expand"):
        model_geometry(config)


def test_text_config_without_a_vision_tower_reads_the_text_config_and_has_no_vision_shape():
    config = {"architectures": ["Qwen2VLForConditionalGeneration"], "text_config": _dense(max_position_embeddings=99)}
    geometry = model_geometry(config)
    assert geometry.is_multimodal and geometry.context_length == 99  # SGLang's list of multimodal architectures
    assert (geometry.vision_layers, geometry.vision_hidden_size) == (None, None)
    other = model_geometry({"architectures": ["SomeForCausalLM"], "text_config": _dense()})
    assert not other.is_multimodal
    assert text_config_of(config) is config["text_config"]
    assert text_config_of({"llm_config": [1]}) == {"llm_config": [1]}


def test_vision_tower_shape_and_qwen35_default_tower():
    tower = model_geometry({**_dense(), "vision_config": {"num_hidden_layers": 32, "hidden_size": 1280}})
    assert (tower.vision_layers, tower.vision_hidden_size) == (32, 1280)
    layers_only = model_geometry({**_dense(), "vision_config": {"num_hidden_layers": 12}})
    assert (layers_only.vision_layers, layers_only.vision_hidden_size) == (12, 1024)
    width_only = model_geometry({**_dense(), "vision_config": {"hidden_size": 640}})
    assert (width_only.vision_layers, width_only.vision_hidden_size) == (24, 640)
    qwen = model_geometry({"architectures": ["Qwen3_5ForConditionalGeneration"], "text_config": _dense()})
    assert (qwen.vision_layers, qwen.vision_hidden_size) == (24, 1152)


def test_mtp_keys_are_read_from_the_text_config():
    geometry = model_geometry(_falcon(num_nextn_predict_layers="1", mtp_num_hidden_layers=2,
                                      mamba_ssm_dtype="float32"))
    assert (geometry.nextn_predict_layers, geometry.mtp_hidden_layers, geometry.config_ssm_dtype) == (1, 2, "float32")
    assert model_geometry(_dense()).nextn_predict_layers is None


def test_hybrid_full_attention_every_interval_th_layer():
    config = {"architectures": ["Qwen3NextForCausalLM"], "num_hidden_layers": 7, "full_attention_interval": 4,
              "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256, "linear_num_key_heads": 16,
              "linear_num_value_heads": 32, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
              "linear_conv_kernel_dim": 4, "max_position_embeddings": 4096}
    geometry = model_geometry(config)
    assert (geometry.attention_layers, geometry.state_layers) == (1, 6)


def test_errors_name_config_json_by_default_and_every_missing_key():
    with pytest.raises(ModelConfigError) as not_object:
        model_geometry([1])
    assert not_object.value.path == "config.json"
    with pytest.raises(ModelConfigError) as two_missing:
        model_geometry({"architectures": ["X"], "head_dim": 8})
    assert two_missing.value.message.endswith("missing: num_hidden_layers, num_attention_heads")
    full_only = _dense(layer_types=["full_attention", "full_attention"])
    assert model_geometry(full_only).layout == "dense"


def test_dtype_falls_back_to_the_outer_config_and_a_non_object_vision_config_is_ignored():
    inner = _dense()
    del inner["torch_dtype"]
    assert model_geometry({"text_config": inner, "torch_dtype": "float16"}).model_dtype == "float16"
    assert model_geometry({"text_config": inner, "dtype": "float32"}).model_dtype == "float32"
    assert model_geometry({"text_config": dict(inner, dtype="bfloat16"), "torch_dtype": "x"}).model_dtype == "bfloat16"
    odd = model_geometry({**_dense(), "vision_config": "none"})
    assert (odd.is_multimodal, odd.vision_layers) == (False, None)


CONFIGS = pathlib.Path(__file__).parent / "configs"


TEXT = {"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64}


def _config(name):
    return json.loads((CONFIGS / name).read_text())


@pytest.mark.parametrize("key", ["torch_dtype", "dtype"])
def test_dtype_on_the_outer_config_of_a_multimodal_model(key):
    config = {"architectures": ["Qwen3VLForConditionalGeneration"], "model_type": "qwen3_vl", key: "float32",
              "text_config": dict(TEXT)}
    assert model_geometry(config).model_dtype == "float32"


def test_dtype_of_the_text_config_wins_over_the_outer_one():
    config = {"architectures": ["Qwen3VLForConditionalGeneration"], "torch_dtype": "float32", "dtype": "float16",
              "text_config": dict(TEXT, dtype="bfloat16")}
    assert model_geometry(config).model_dtype == "bfloat16"


def test_hybrid_full_attention_layers_when_the_count_is_not_a_multiple_of_the_interval():
    """Qwen3NextConfig: layer i is full attention iff (i + 1) % interval == 0; 47 layers at interval 4
    hold 11 of them (layers 3, 7, ..., 43)."""
    config = dict(_config("qwen3-next-80b-a3b.json"), num_hidden_layers=47)
    geometry = model_geometry(config)
    assert (geometry.num_layers, geometry.attention_layers) == (47, 11)
    assert model_geometry(dict(config, num_hidden_layers=50)).attention_layers == 12


def test_a_dense_model_that_lists_full_attention_layer_types_is_sized():
    config = dict(_config("llama-3.1-8b-style.json"), layer_types=["full_attention"] * 32)
    assert model_geometry(config).layout == "dense"


def test_missing_keys_are_named_in_the_error():
    with pytest.raises(ModelConfigError) as failure:
        model_geometry({"architectures": ["LlamaForCausalLM"]})
    assert str(failure.value).startswith(
        "[config.json] LlamaForCausalLM: a dense attention config needs num_hidden_layers, num_attention_heads; "
        "missing: num_hidden_layers, num_attention_heads\n")


def test_unknown_stateful_keys_are_named_in_the_error():
    with pytest.raises(ModelConfigError) as failure:
        model_geometry({"architectures": ["FooForCausalLM"], "num_hidden_layers": 2, "mamba_x": 1, "ssm_y": 2})
    assert str(failure.value).startswith(
        "[config.json] FooForCausalLM: unknown layout with recurrent/sparse state keys mamba_x, ssm_y; the tuner ")


# gpt-oss-20b's shape; SGLang's gpt-oss model reports its window as sliding_window - 1 (models/gpt_oss.py).
GPT_OSS = {"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "num_hidden_layers": 24,
           "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64, "hidden_size": 2880,
           "sliding_window": 128, "layer_types": ["sliding_attention", "full_attention"] * 12,
           "max_position_embeddings": 131072, "torch_dtype": "bfloat16"}


def test_only_gpt_oss_runs_an_mxfp4_checkpoint_in_bfloat16():
    """model_overrides/gpt_oss.py forces bfloat16 on GptOssForCausalLM's MXFP4 checkpoints only; another
    architecture quantized to MXFP4 keeps the dtype its config.json names (and so does its KV cache)."""
    mxfp4 = {"quant_method": "mxfp4"}
    assert model_geometry(_dense(torch_dtype="float16", quantization_config=mxfp4)).model_dtype == "float16"
    assert model_geometry(dict(GPT_OSS, torch_dtype="float32", quantization_config=mxfp4)).model_dtype == "bfloat16"
    assert model_geometry(dict(GPT_OSS, torch_dtype="float32")).model_dtype == "float32"


def test_model_type_is_empty_when_the_config_names_none():
    assert model_geometry(_dense()).model_type == ""
    assert model_geometry({"model_type": "qwen3_vl", "text_config": _dense(model_type="qwen3_vl_text")}).model_type \
        == "qwen3_vl"
    assert model_geometry({"text_config": _dense(model_type="qwen3")}).model_type == "qwen3"


def test_sliding_layers_are_the_sliding_attention_entries_of_layer_types():
    """get_hybrid_layer_ids (SWA_SINK_ARCHS): the SWA pool holds the layers layer_types marks sliding."""
    three_to_one = dict(GPT_OSS, layer_types=(["sliding_attention"] * 3 + ["full_attention"]) * 6)
    geometry = model_geometry(three_to_one)
    assert (geometry.num_layers, geometry.attention_layers, geometry.swa_layers) == (24, 24, 18)
    assert (geometry.swa_kv_heads, geometry.swa_head_dim, geometry.swa_v_head_dim) == (8, 64, 64)
    assert geometry.sliding_window_size == 127 and geometry.is_hybrid_swa and not geometry.hybrid_swa_unmodeled


def test_swa_kv_shape_keys_override_the_full_attention_shape():
    """ModelConfig.get_swa_num_kv_heads / swa_head_dim / swa_v_head_dim: an SWA model may give its sliding layers
    their own KV heads and head dims; swa_v_head_dim falls back to swa_head_dim, not to v_head_dim."""
    own = model_geometry(dict(GPT_OSS, swa_num_key_value_heads=4, swa_head_dim=128, swa_v_head_dim=96))
    assert (own.swa_kv_heads, own.swa_head_dim, own.swa_v_head_dim) == (4, 128, 96)
    assert (own.kv_heads, own.head_dim, own.v_head_dim) == (8, 64, 64)
    k_only = model_geometry(dict(GPT_OSS, swa_head_dim=128, v_head_dim=32))
    assert (k_only.swa_kv_heads, k_only.swa_head_dim, k_only.swa_v_head_dim) == (8, 128, 128)


@pytest.mark.parametrize("missing", ["sliding_window", "layer_types"])
def test_a_layer_types_swa_config_without_its_window_or_layer_types_is_an_error(missing):
    config = {key: value for key, value in GPT_OSS.items() if key != missing}
    with pytest.raises(ModelConfigError) as failure:
        model_geometry(config, config_path="/m/gpt-oss/config.json")
    assert (failure.value.message, failure.value.path, failure.value.hint) == (
        "GptOssForCausalLM: a sliding-window config needs layer_types and sliding_window",
        "/m/gpt-oss/config.json", None)


def test_a_sliding_window_config_without_attention_heads_names_the_missing_key():
    config = {key: value for key, value in GPT_OSS.items() if key != "num_attention_heads"}
    with pytest.raises(ModelConfigError) as failure:
        model_geometry(config)
    assert failure.value.message == ("GptOssForCausalLM: a hybrid sliding-window config needs num_hidden_layers, "
                                     "num_attention_heads; missing: num_attention_heads")


# Llama-4-Scout-17B-16E-Instruct's shape (its text_config carries the language model's keys).
LLAMA4_SCOUT = {"architectures": ["Llama4ForConditionalGeneration"], "model_type": "llama4",
                "torch_dtype": "bfloat16",
                "text_config": {"model_type": "llama4_text", "num_hidden_layers": 48, "num_attention_heads": 40,
                                "num_key_value_heads": 8, "head_dim": 128, "hidden_size": 5120,
                                "attention_chunk_size": 8192, "max_position_embeddings": 10485760,
                                "torch_dtype": "bfloat16"},
                "vision_config": {"num_hidden_layers": 34, "hidden_size": 1408}}


@pytest.mark.parametrize("layers, full", [(48, 12), (47, 11), (46, 11)])
def test_llama4_keeps_every_fourth_layer_full_and_chunks_the_rest(layers, full):
    """get_hybrid_layer_ids: layer i of Llama 4 is full attention iff (i + 1) % 4 == 0, every other layer keeps
    an attention_chunk_size window (load_model_utils.resolve_sliding_window_size)."""
    config = {**LLAMA4_SCOUT, "text_config": {**LLAMA4_SCOUT["text_config"], "num_hidden_layers": layers}}
    geometry = model_geometry(config)
    assert (geometry.num_layers, geometry.attention_layers, geometry.swa_layers) == (layers, layers, layers - full)
    assert (geometry.swa_kv_heads, geometry.swa_head_dim, geometry.swa_v_head_dim) == (8, 128, 128)
    assert geometry.sliding_window_size == 8192 and not geometry.hybrid_swa_unmodeled


def test_llama4_without_attention_chunk_size_reports_no_window():
    text = {key: value for key, value in LLAMA4_SCOUT["text_config"].items() if key != "attention_chunk_size"}
    geometry = model_geometry({**LLAMA4_SCOUT, "text_config": text})
    assert geometry.swa_layers == 36 and geometry.sliding_window_size is None


def test_is_hybrid_swa_is_read_from_the_text_config_only():
    """is_hybrid_swa_model: a model outside SGLang's list opts into the SWA pool with is_hybrid_swa on its text
    config (hf_text_config); the outer config of a wrapped model is not read."""
    flat = model_geometry(_dense(is_hybrid_swa=True))
    assert flat.hybrid_swa_unmodeled and flat.layout == "dense"
    inner = model_geometry({"architectures": ["SomeForConditionalGeneration"], "text_config": _dense(is_hybrid_swa=True)})
    assert inner.hybrid_swa_unmodeled
    outer = model_geometry({"architectures": ["SomeForConditionalGeneration"], "is_hybrid_swa": True,
                            "text_config": _dense()})
    assert not outer.hybrid_swa_unmodeled and not outer.is_hybrid_swa


@pytest.mark.parametrize("name, drop, layout", [
    ("qwen3-next-80b-a3b.json", None, "hybrid_gdn"),          # linear_num_value_heads
    ("deepseek-v3-style.json", None, "mla"),                  # kv_lora_rank
    ("nemotron-h-8b-style.json", None, "nemotron_h"),         # hybrid_override_pattern
    ("falcon-h1-7b-style.json", "mamba_d_ssm", "falcon_h1"),  # mamba_n_heads (width from mamba_expand)
])
def test_an_swa_pool_beside_mla_or_recurrent_state_is_not_modelled(name, drop, layout):
    """Only a dense model's split between the full and the SWA pool is modelled: an MLA or recurrent layout that
    opts into the SWA pool keeps its own layout and is marked for the profile to refuse."""
    config = {key: value for key, value in _config(name).items() if key != drop}
    if "hybrid_override_pattern" in config:  # Nemotron-H's config.json also counts its layers
        config["num_hidden_layers"] = len(config["hybrid_override_pattern"])
    plain = model_geometry(config)
    opted_in = model_geometry(dict(config, is_hybrid_swa=True))
    assert (plain.layout, plain.hybrid_swa_unmodeled) == (layout, False)
    assert (opted_in.layout, opted_in.hybrid_swa_unmodeled) == (layout, True)
    assert dict(opted_in.to_dict(), hybrid_swa_unmodeled=False) == plain.to_dict()
