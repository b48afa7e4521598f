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
# nvidia/Qwen3.6-35B-A3B-NVFP4 (abridged to one layer of each kind): config.json names the per-layer map but no
# KV-cache key; its hf_quant_config.json carries kv_cache_quant_algo FP8
MIXED_LAYERS = {"model.language_model.layers.0.mlp.experts": {"quant_algo": "W4A16_NVFP4", "group_size": 16},
                "model.language_model.layers.3.self_attn.q_proj": {"quant_algo": "FP8"}}
MIXED = {"quant_method": "modelopt", "quant_algo": "MIXED_PRECISION", "quantized_layers": MIXED_LAYERS,
         "producer": {"name": "modelopt", "version": "0.37.0"}, "ignore": ["mtp.layers.0*", "mtp*"]}
MIXED_FILE = {"producer": {"name": "modelopt", "version": "0.44.0"},
              "quantization": {"quant_algo": "MIXED_PRECISION", "kv_cache_quant_algo": "FP8",
                               "exclude_modules": ["mtp.layers.0*", "mtp*"], "quantized_layers": MIXED_LAYERS}}


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


@pytest.mark.parametrize("algo, fp8", [("FP8", True), ("fp8", True), ("INT8", False), (None, False), (8, False)])
def test_only_an_fp8_kv_algorithm_stores_the_kv_cache_in_fp8(algo, fp8):
    assert Quantization("fp8", algo, "config.json").kv_cache_fp8 is fp8


@pytest.mark.parametrize("quant, flag, method", [
    (AWQ, "marlin", "awq_marlin"),
    (AWQ, "awq_marlin", "awq_marlin"),
    (AWQ, "AWQ_Marlin", "awq_marlin"),   # SGLang lowercases the flag
    ({**AWQ, "bits": 8, "group_size": -1}, None, "awq_marlin"),
    ({**AWQ, "group_size": 32}, None, "awq_marlin"),
    ({**AWQ, "bits": 3}, None, "awq"),
    ({**AWQ, "group_size": 256}, None, "awq"),
    ({**AWQ, "zero_point": None}, None, "awq"),
    ({**AWQ, "zero_point": False}, None, "awq_marlin"),
    (GPTQ, "gptq_marlin", "gptq_marlin"),
    ({**GPTQ, "bits": 8, "group_size": 64}, "marlin", "gptq_marlin"),
    ({**GPTQ, "desc_act": True}, None, "gptq_marlin"),
])
def test_awq_and_gptq_upgrade_to_marlin_where_sglang_does(quant, flag, method):
    assert resolve(quant, flag=flag).method == method


@pytest.mark.parametrize("quant", [{**GPTQ, "desc_act": None}, {**GPTQ, "sym": None}, {**GPTQ, "is_marlin_format": True},
                                   {**GPTQ, "checkpoint_format": "marlin"}, {**GPTQ, "bits": 3}])
def test_a_gptq_checkpoint_marlin_cannot_take_is_plain_gptq_which_the_tuner_does_not_model(quant):
    with pytest.raises(ModelConfigError, match=r"quantization method gptq \(checkpoint: gptq\) is not one the tuner "
                       r"models \(awq, awq_marlin, compressed-tensors"):
        resolve(quant)


@pytest.mark.parametrize("quant, flag, expected", [
    # _verify_quantization's compatible methods: the flag names the method, the checkpoint stays as stored
    (COMPRESSED, "w8a8_fp8", Quantization("w8a8_fp8", None, "config.json")),
    (COMPRESSED, "w8a8_int8", Quantization("w8a8_int8", None, "config.json")),
    (FP8_BLOCK, "modelopt_fp4", Quantization("modelopt_fp4", None, "config.json")),
    (FP8_BLOCK, "FP8", Quantization("fp8", None, "config.json")),
    # a ModelOpt checkpoint in config.json written with quant_method "modelopt"
    ({"quant_method": "modelopt", "quant_algo": "NVFP4", "kv_cache_quant_algo": "FP8"}, None,
     Quantization("modelopt_fp4", "FP8", "config.json")),
    ({"quant_algo": "W4A16_NVFP4"}, None, Quantization("modelopt_fp4", None, "config.json")),
    # the flat format: the kv_cache_scheme decides, an 8-bit int scheme is no FP8 cache
    ({"quant_algo": "FP8", "kv_cache_scheme": {"type": "int", "num_bits": 8}}, None,
     Quantization("modelopt_fp8", None, "config.json")),
    ({"quant_algo": "FP8", "kv_cache_scheme": {"type": "float", "num_bits": 16}}, None,
     Quantization("modelopt_fp8", None, "config.json")),
    ({"quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}, None, Quantization("modelopt_fp8", "FP8", "config.json")),
])
def test_the_flag_and_the_checkpoint_agree_on_the_method(quant, flag, expected):
    assert resolve(quant, flag=flag) == expected


def test_a_vlms_quantization_is_read_from_its_text_config():
    config = {**LLAMA, "text_config": {"quantization_config": FP8_BLOCK}}
    assert checkpoint_quantization(config, None, None) == Quantization("fp8", None, "config.json")


def test_a_compression_config_counts_when_there_is_no_quantization_config():
    config = {**LLAMA, "compression_config": COMPRESSED}
    assert checkpoint_quantization(config, MODELOPT_FP8, None) == Quantization("compressed-tensors", None,
                                                                               "config.json")


def test_a_doubly_wrapped_modelopt_file_is_unwrapped():
    nested = {"producer": {"name": "modelopt"}, "quantization": {"quantization": {"quant_algo": "FP8",
                                                                                   "kv_cache_quant_algo": "FP8"}}}
    assert resolve(hf_quant=nested) == Quantization("modelopt_fp8", "FP8", "hf_quant_config.json")


@pytest.mark.parametrize("hf_quant", [{"quantization": {"quant_algo": "W8A8"}}, {"quantization": "FP8"}, {}])
def test_an_hf_quant_config_that_names_no_modelopt_method_leaves_the_checkpoint_unquantized(hf_quant):
    assert resolve(hf_quant=hf_quant) == Quantization(None, None, None)


@pytest.mark.parametrize("quant, named", [
    ({"quant_algo": "MIXED_PRECISION", "quantized_layers": {"l0": {"quant_algo": "FP8"}, "l1": "x"}}, "w4afp8"),
    ({"quant_algo": "MIXED_PRECISION"}, "w4afp8"),
    ({"quant_algo": "MXFP8"}, "mxfp8"),
])
def test_modelopt_methods_the_tuner_does_not_model_are_named_in_the_refusal(quant, named):
    with pytest.raises(ModelConfigError, match=rf"quantization method {named} \(checkpoint: {named}\)") as error:
        resolve(quant)
    assert error.value.path == "/models/m/config.json" and "by hand" in error.value.hint


@pytest.mark.parametrize("quant, hf_quant, flag, expected", [
    # get_quant_config passes over config.json's map without a KV-cache key for hf_quant_config.json's
    (MIXED, MIXED_FILE, None, Quantization("modelopt_mixed", "FP8", "config.json")),
    # a config.json with its KV-cache key is read as it stands (ModelOptMixedPrecisionConfig.from_config, flat)
    ({**MIXED, "kv_cache_scheme": {"type": "float", "num_bits": 8}}, None, None,
     Quantization("modelopt_mixed", "FP8", "config.json")),
    ({**MIXED, "kv_cache_quant_algo": None}, MIXED_FILE, None, Quantization("modelopt_mixed", None, "config.json")),
    ({**MIXED, "kv_cache_scheme": {"type": "float", "num_bits": 4}}, None, None,
     Quantization("modelopt_mixed", "NVFP4", "config.json")),
    ({**MIXED, "kv_cache_scheme": {"type": "int", "num_bits": 8}}, None, None,
     Quantization("modelopt_mixed", "auto", "config.json")),
    # only hf_quant_config.json (nvidia/NVIDIA-Nemotron-3.5-Lightning-30B-A3B-NVFP4)
    (None, MIXED_FILE, None, Quantization("modelopt_mixed", "FP8", "hf_quant_config.json")),
    # the checkpoint's method whatever --quantization names (override_quantization_method)
    (MIXED, MIXED_FILE, "awq", Quantization("modelopt_mixed", "FP8", "config.json")),
])
def test_a_modelopt_mixed_checkpoint_takes_its_kv_cache_where_sglang_finds_it(quant, hf_quant, flag, expected):
    assert resolve(quant, hf_quant, flag) == expected


def test_an_fp8_kv_cache_only_hf_quant_config_names_is_an_fp8_kv_cache():
    assert resolve(MIXED, MIXED_FILE).kv_cache_fp8 and not resolve({**MIXED, "kv_cache_quant_algo": None}).kv_cache_fp8


def test_a_modelopt_mixed_config_without_its_kv_key_or_file_is_refused_as_sglang_refuses_it():
    with pytest.raises(ModelConfigError, match="Cannot find the config file for modelopt_mixed") as error:
        resolve(MIXED)
    assert error.value.path == "/models/m/config.json" and "hf_quant_config.json" in error.value.hint


def test_online_requantization_is_refused_naming_the_flag_and_the_checkpoint():
    with pytest.raises(ModelConfigError, match="--quantization nvfp4_online requantizes the modelopt_fp8 checkpoint "
                       "online") as error:
        resolve(hf_quant=MODELOPT_FP8, flag="NVFP4_ONLINE")
    assert error.value.path == "/models/m/config.json" and "drop --quantization" in error.value.hint
    with pytest.raises(ModelConfigError, match="--quantization fp8 quantizes an unquantized checkpoint") as error:
        resolve(flag="FP8")
    assert error.value.path == "/models/m/config.json"


@pytest.mark.parametrize("method, generation", [("awq", "sm75"), ("fp8", "sm80"), ("modelopt_fp8", "sm89"),
                                                ("modelopt_fp8", "sm100"), (None, "sm70"), ("unknown", "sm70"),
                                                ("compressed-tensors", "sm70")])
def test_a_gpu_at_or_above_the_methods_capability_is_accepted(method, generation):
    check_gpu_capability(method, generation, "GPU")


@pytest.mark.parametrize("method, generation, needed, current", [
    ("fp8", "sm75", 80, 75), ("modelopt_fp8", "sm86", 89, 86), ("w8a8_fp8", "sm80", 89, 80),
    ("awq", "sm70", 75, 70), ("awq_marlin", "sm75", 80, 75), ("gptq_marlin", "sm75", 80, 75),
    ("modelopt_fp4", "sm75", 80, 75), ("modelopt_mixed", "sm75", 80, 75), ("mxfp4", "sm75", 80, 75),
    ("compressed-tensors", "sm61", 70, 61),
    ("w8a8_int8", "sm70", 75, 70),
])
def test_a_gpu_below_the_methods_capability_is_refused(method, generation, needed, current):
    with pytest.raises(ModelConfigError, match=f"The quantization method {method} is not supported for the current "
                       f"GPU. Minimum capability: {needed}. Current capability: {current}.") as error:
        check_gpu_capability(method, generation, "Some GPU")
    assert "Some GPU" in str(error.value) and "--quantization" in error.value.hint


@pytest.mark.parametrize("quant", [{**AWQ, "kv_cache_quant_algo": "FP8"}, {**COMPRESSED, "kv_cache_quant_algo": "FP8"},
                                   {**GPTQ, "kv_cache_quant_algo": "FP8"}])
def test_only_fp8_and_modelopt_configs_read_a_kv_cache_algorithm(quant):
    # AWQ/GPTQ/compressed-tensors' from_config never reads kv_cache_quant_algo: the KV cache stays as --kv-cache-dtype
    assert resolve(quant).kv_cache_quant_algo is None


def test_the_refusals_say_exactly_what_to_do():
    with pytest.raises(ModelConfigError) as online:
        resolve(flag="fp8")
    assert str(online.value).endswith("--quantization fp8 quantizes an unquantized checkpoint online; the tuner sizes "
                                      "the weights as stored and does not model that\nWhat to check next: drop "
                                      "--quantization from the extra SGLang args")
    with pytest.raises(ModelConfigError) as requantized:
        resolve(FP8_BLOCK, flag="quark_mxfp4")
    assert requantized.value.hint == "drop --quantization from the extra SGLang args"
    assert "requantizes the fp8 checkpoint online; the tuner sizes the weights as stored and does not model that" \
        in str(requantized.value)
    with pytest.raises(ModelConfigError) as unmodeled:
        resolve({"quant_method": "bitsandbytes"})
    assert unmodeled.value.hint == "plan this model by hand with explicit SGLang flags"
    with pytest.raises(ModelConfigError) as refused:
        resolve(FP8_BLOCK, flag="awq")
    assert refused.value.hint == ("drop or change --quantization in the extra SGLang args, or serve a checkpoint this "
                                  "GPU supports")


def test_an_error_without_a_path_names_config_json():
    with pytest.raises(ModelConfigError) as error:
        checkpoint_quantization(dict(LLAMA), None, "fp8")
    assert error.value.path == "config.json"


def test_a_quantization_config_without_a_method_takes_the_flags():
    assert resolve({"activation_scheme": "dynamic"}, flag="fp8") == Quantization("fp8", None, "config.json")
    with pytest.raises(ModelConfigError, match=r"quantization method  \(checkpoint: \) is not one the tuner models"):
        resolve({"activation_scheme": "dynamic"})


def test_a_checkpoint_that_names_its_method_is_not_renamed_by_a_modelopt_algorithm():
    quant = {**FP8_BLOCK, "quant_algo": "FP8"}
    assert resolve(quant) == Quantization("fp8", None, "config.json")


def test_a_modelopt_flag_over_an_fp8_checkpoint_reads_its_kv_algorithm():
    quant = {**FP8_BLOCK, "kv_cache_quant_algo": "FP8"}
    assert resolve(quant, flag="modelopt_fp4") == Quantization("modelopt_fp4", "FP8", "config.json")
