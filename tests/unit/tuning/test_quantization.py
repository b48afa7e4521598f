"""A checkpoint's quantization as SGLang 0.5.23 resolves it: the method, its KV-cache dtype, its refusals.

The quantization blocks are the public checkpoints' own (config.json ``quantization_config`` or ModelOpt's
``hf_quant_config.json``)."""

import pytest

from fleetgen.errors import ModelConfigError
from fleetgen.tuning.quantization import Quantization, check_gpu_capability, checkpoint_quantization

# Qwen/Qwen3-8B-FP8, deepseek-ai/DeepSeek-V3: FP8 with 128x128 weight blocks
FP8_BLOCK = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [128, 128]}
# Qwen/Qwen2.5-7B-Instruct-AWQ
AWQ = {"bits": 4, "group_size": 128, "modules_to_not_convert": None, "quant_method": "awq", "version": "gemm",
       "zero_point": True}
# Qwen/Qwen2.5-7B-Instruct-GPTQ-Int4
GPTQ = {"bits": 4, "damp_percent": 0.01, "desc_act": False, "group_size": 128, "modules_in_block_to_quantize": None,
        "quant_method": "gptq", "static_groups": False, "sym": True, "true_sequential": True}
# RedHatAI/Meta-Llama-3.1-8B-Instruct-FP8 (abridged: the keys SGLang's resolution reads)
COMPRESSED = {"quant_method": "compressed-tensors", "format": "float-quantized", "kv_cache_scheme": None,
              "config_groups": {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "float"}}}}
# nvidia/Llama-3.1-8B-Instruct-FP8, nvidia/Llama-3.3-70B-Instruct-FP4
MODELOPT_FP8 = {"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}}
MODELOPT_FP4 = {"producer": {"name": "modelopt"},
                "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": "FP8", "group_size": 16,
                                 "exclude_modules": ["lm_head"]}}
LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama"}


def resolve(quant=None, hf_quant=None, flag=None):
    config = {**LLAMA, "quantization_config": quant} if quant else dict(LLAMA)
    return checkpoint_quantization(config, hf_quant, flag, config_path="/models/m/config.json")


@pytest.mark.parametrize("quant, hf_quant, flag, expected", [
    (None, None, None, Quantization(None, None, None)),
    (FP8_BLOCK, None, None, Quantization("fp8", None, "config.json")),
    ({**FP8_BLOCK, "kv_cache_quant_algo": "FP8"}, None, None, Quantization("fp8", "FP8", "config.json")),
    (AWQ, None, None, Quantization("awq_marlin", None, "config.json")),
    (AWQ, None, "awq", Quantization("awq", None, "config.json")),
    (GPTQ, None, None, Quantization("gptq_marlin", None, "config.json")),
    (COMPRESSED, None, None, Quantization("compressed-tensors", None, "config.json")),
    (None, MODELOPT_FP8, None, Quantization("modelopt_fp8", "FP8", "hf_quant_config.json")),
    (None, MODELOPT_FP4, None, Quantization("modelopt_fp4", "FP8", "hf_quant_config.json")),
    # a ModelOpt checkpoint keeps its method whatever --quantization says (_modelopt_override_quantization_method)
    (None, MODELOPT_FP4, "awq", Quantization("modelopt_fp4", "FP8", "hf_quant_config.json")),
    # flat ModelOpt config.json: quant_algo without quant_method, the KV cache named by kv_cache_scheme
    ({"quant_algo": "FP8", "kv_cache_scheme": {"type": "float", "num_bits": 8}}, None, None,
     Quantization("modelopt_fp8", "FP8", "config.json")),
    # config.json's quantization_config wins over hf_quant_config.json
    (FP8_BLOCK, MODELOPT_FP8, None, Quantization("fp8", None, "config.json")),
])
def test_the_checkpoint_decides_the_method_and_the_kv_cache(quant, hf_quant, flag, expected):
    assert resolve(quant, hf_quant, flag) == expected


def test_modelopt_fp8_kv_from_hf_quant_config_is_an_fp8_kv_cache():
    assert resolve(hf_quant=MODELOPT_FP8).kv_cache_fp8 and not resolve(FP8_BLOCK).kv_cache_fp8


def test_a_flag_the_checkpoint_contradicts_is_refused_with_sglangs_reason():
    with pytest.raises(ModelConfigError, match=r"Quantization method specified in the model config \(fp8\) does not "
                       r"match the quantization method specified in the `quantization` argument \(gptq\)") as error:
        resolve(FP8_BLOCK, flag="gptq")
    assert error.value.path == "/models/m/config.json" and "--quantization" in error.value.hint


@pytest.mark.parametrize("quant, flag, words", [
    (None, "fp8", "quantizes an unquantized checkpoint online"),
    ({**GPTQ, "sym": False}, None, r"quantization method gptq \(checkpoint: gptq\) is not one the tuner models"),
    (FP8_BLOCK, "quark_mxfp4", "requantizes the fp8 checkpoint online"),
])
def test_what_the_tuner_does_not_model_is_refused(quant, flag, words):
    with pytest.raises(ModelConfigError, match=words):
        resolve(quant, flag=flag)


def test_a_gpu_below_the_methods_capability_is_refused_with_sglangs_reason():
    check_gpu_capability("modelopt_fp8", "sm89", "NVIDIA L40S")
    check_gpu_capability("fp8", "sm80", "NVIDIA A100-SXM4-80GB")
    check_gpu_capability("modelopt_fp8", None, "unknown GPU")
    with pytest.raises(ModelConfigError, match="The quantization method modelopt_fp8 is not supported for the current "
                       "GPU. Minimum capability: 89. Current capability: 80.") as error:
        check_gpu_capability("modelopt_fp8", "sm80", "NVIDIA A100-SXM4-80GB", host="gpu-node-1")
    assert error.value.host == "gpu-node-1"
