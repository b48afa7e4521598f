"""config.json as SGLang sees it: completed by the transformers config class of its model type."""

import os

import pytest
import transformers

from fleetgen.errors import ModelConfigError
from fleetgen.tuning.hf_config import SGLANG_CONFIG_MODEL_TYPES, as_sglang_reads

LLAMA = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2,
         "intermediate_size": 128, "vocab_size": 100}
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}


def test_the_keys_a_config_leaves_out_take_their_class_defaults():
    read = as_sglang_reads(dict(LLAMA))
    # LlamaConfig's defaults: what SGLang sizes from when config.json is silent
    assert read["max_position_embeddings"] == 2048 and read["num_key_value_heads"] == 4
    assert read["rms_norm_eps"] == 1e-6 and read["hidden_size"] == 64


def test_the_file_as_written_is_left_untouched():
    config = dict(LLAMA)
    as_sglang_reads(config)
    assert config == LLAMA


def test_rope_scaling_is_the_attribute_sglang_reads_as_a_plain_dict():
    read = as_sglang_reads({**LLAMA, "rope_scaling": dict(LLAMA3_ROPE)})
    assert type(read["rope_scaling"]) is dict
    assert read["rope_scaling"]["rope_type"] == "llama3" and read["rope_scaling"]["factor"] == 8.0
    assert read["rope_scaling"]["original_max_position_embeddings"] == 8192


def test_a_sub_config_is_completed_by_its_own_class_and_kept_a_plain_dict():
    """Gemma-3's text_config without max_position_embeddings is 131,072 tokens to SGLang (Gemma3TextConfig)."""
    read = as_sglang_reads({"model_type": "gemma3", "text_config": {"model_type": "gemma3_text", "hidden_size": 64}})
    text = read["text_config"]
    assert type(text) is dict and text["max_position_embeddings"] == 131_072 and text["hidden_size"] == 64
    assert set(text["rope_scaling"]) == {"sliding_attention", "full_attention"}
    assert read["model_type"] == "gemma3"


@pytest.mark.parametrize("model_type", ["qwen3_5", "qwen3_next", "deepseek_v32", "falcon_h1", "mamba2", "kimi_k2",
                                        "nemotron_h", "dbrx", "spark2_5"])
def test_model_types_sglang_registers_a_class_for_are_kept_as_written(model_type):
    assert model_type in SGLANG_CONFIG_MODEL_TYPES
    config = {"model_type": model_type, "hidden_size": 64}
    assert as_sglang_reads(config) is config


@pytest.mark.parametrize("config", [{"hidden_size": 64}, {"model_type": 7}, {"model_type": None},
                                    {"model_type": "my_remote_code_model", "hidden_size": 64}])
def test_a_config_without_a_transformers_class_is_kept_as_written(config):
    assert as_sglang_reads(config) is config


def test_what_is_not_a_dict_is_returned_as_it_is():
    assert as_sglang_reads([1, 2]) == [1, 2]


def test_a_config_its_class_rejects_names_the_file_the_host_and_the_class():
    config = {**LLAMA, "hidden_size": 65}  # not a multiple of the 4 heads
    with pytest.raises(ModelConfigError, match=r"transformers \S+ cannot build LlamaConfig from config.json: ") as error:
        as_sglang_reads(config, path="/models/m/config.json", host="node-a")
    assert error.value.path == "/models/m/config.json" and error.value.host == "node-a"
    assert "model.path" in error.value.hint and "SGLang would fail" in error.value.hint
    assert transformers.__version__ in str(error.value)


def test_transformers_keeps_its_advice_and_warnings_out_of_the_plan_log():
    as_sglang_reads(dict(LLAMA))
    assert transformers.logging.get_verbosity() == transformers.logging.ERROR
    assert os.environ.get("TRANSFORMERS_NO_ADVISORY_WARNINGS") == "1"


def test_a_rejected_config_without_a_path_is_config_json_and_the_hint_is_whole():
    with pytest.raises(ModelConfigError) as error:
        as_sglang_reads({**LLAMA, "hidden_size": 65})
    assert error.value.path == "config.json" and error.value.host is None
    assert error.value.hint == ("check the model directory named by model.path in the fleet description; SGLang would "
                                "fail to load this config the same way")
