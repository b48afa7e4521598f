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
