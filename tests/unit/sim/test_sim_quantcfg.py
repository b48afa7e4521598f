"""The simulator reads a checkpoint's quantization, dtype and Nemotron-H layer list as SGLang 0.5.23 does.

The blocks are public checkpoints' own, abridged to the keys SGLang's reading looks at.
"""

import argparse

import pytest

from sglang_sim.modelcfg import from_config
from sglang_sim.presets import preset_config
from sglang_sim.quantcfg import checkpoint_quantization
from sglang_sim.resolve import _kv_dtype

# nvidia/Qwen3.6-35B-A3B-NVFP4: config.json's block has the per-layer map but no KV-cache key
MIXED_LAYERS = {"model.language_model.layers.0.mlp.experts": {"quant_algo": "W4A16_NVFP4", "group_size": 16},
                "model.language_model.layers.3.self_attn.q_proj": {"quant_algo": "FP8"}}
MIXED = {"quant_method": "modelopt", "quant_algo": "MIXED_PRECISION", "quantized_layers": MIXED_LAYERS}
MIXED_FILE = {"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "MIXED_PRECISION",
                                                                 "kv_cache_quant_algo": "FP8",
                                                                 "quantized_layers": MIXED_LAYERS}}
# nvidia/Llama-3.3-70B-Instruct-FP4
NVFP4_FILE = {"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": "FP8"}}


def _config(quant=None):
    config = {"architectures": ["Qwen3_5MoeForConditionalGeneration"], "model_type": "qwen3_5_moe"}
    return {**config, "quantization_config": quant} if quant else config


@pytest.mark.parametrize("quant, quant_file, expected", [
    # get_quant_config passes over an incomplete modelopt_mixed block for hf_quant_config.json
    (MIXED, MIXED_FILE, ("modelopt_mixed", "FP8")),
    (MIXED, None, ("modelopt_mixed", None)),
    ({**MIXED, "kv_cache_scheme": {"type": "float", "num_bits": 8}}, None, ("modelopt_mixed", "FP8")),
    ({**MIXED, "kv_cache_scheme": {"type": "float", "num_bits": 4}}, MIXED_FILE, ("modelopt_mixed", "NVFP4")),
    ({**MIXED, "kv_cache_quant_algo": None}, MIXED_FILE, ("modelopt_mixed", None)),
    # the file alone (Nemotron-3.5-Lightning's NVFP4 export)
    (None, MIXED_FILE, ("modelopt_mixed", "FP8")),
    # a mixed checkpoint without NVFP4 layers is w4afp8 (_parse_modelopt_quant_config)
    ({"quant_algo": "MIXED_PRECISION", "quantized_layers": {"l0": {"quant_algo": "FP8"}}}, None, ("w4afp8", None)),
    (None, NVFP4_FILE, ("modelopt_fp4", "FP8")),
    ({"quant_algo": "FP8", "kv_cache_scheme": {"type": "float", "num_bits": 8}}, None, ("modelopt_fp8", "FP8")),
    ({"quant_method": "fp8", "weight_block_size": [128, 128]}, NVFP4_FILE, ("fp8", None)),
    (None, {"quantization": {"quant_algo": "W8A8"}}, (None, None)),
    (None, None, (None, None)),
])
def test_the_method_and_kv_cache_are_read_where_sglang_reads_them(quant, quant_file, expected):
    assert checkpoint_quantization(_config(quant), quant_file) == expected


def _args(kv_cache_dtype="auto"):
    return argparse.Namespace(kv_cache_dtype=kv_cache_dtype)


@pytest.mark.parametrize("dtype, model_type, name", [
    (None, "minimax_m2", None),  # no torch_dtype: float32 to SGLang, run in float16; 2 bytes either way
    ("float32", "llama", "float16"),
    ("float32", "gemma3_text", "bfloat16"),
    ("bfloat16", "llama", "bfloat16"),
])
def test_kv_auto_is_two_bytes_in_the_dtype_sglang_runs_the_model_in(dtype, model_type, name):
    config = {"architectures": ["X"], "model_type": model_type, "hidden_size": 64, "num_hidden_layers": 2,
              "num_attention_heads": 4, "vocab_size": 100}
    if dtype:
        config["torch_dtype"] = dtype
    kv_name, kv_bytes = _kv_dtype(_args(), from_config(config))
    assert kv_bytes == 2 and (name is None or kv_name == name)
    assert _kv_dtype(_args("fp8_e4m3"), from_config(config)) == ("float8_e4m3fn", 1)


def test_a_nemotron_h_layer_list_is_its_pattern():
    """NVIDIA-Nemotron-3.5-Lightning-30B-A3B names its 52 layers in layers_block_type (23 Mamba2, 6 attention)."""
    config = preset_config("nemotron-3.5-lightning-30b-a3b")
    assert "hybrid_override_pattern" not in config
    shape = from_config(config)
    assert (shape.is_hybrid, shape.full_attention_layers, shape.linear_layers) == (True, 6, 23)
    assert shape.mamba_bytes_per_slot(1, 4) == (23 * 6144 * 3 * 2, 23 * 64 * 64 * 128 * 4)
    pattern = {"mamba": "M", "attention": "*", "moe": "E", "mlp": "-"}
    legacy = {**{k: v for k, v in config.items() if k != "layers_block_type"},
              "hybrid_override_pattern": "".join(pattern[b] for b in config["layers_block_type"])}
    assert from_config(legacy) == shape
