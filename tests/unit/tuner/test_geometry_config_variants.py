"""Config shapes the geometry reads beyond the usual ones: dtype only on the outer config (torch_dtype or
transformers 5's dtype), hybrid layer counts that are not a multiple of the interval, dense models that
list their layer types, and the exact text of the errors for configs the tuner cannot size."""

import json
import pathlib

import pytest

from fleetgen.errors import ModelConfigError
from fleetgen.tuning.geometry import model_geometry

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
