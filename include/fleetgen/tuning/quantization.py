"""A checkpoint's quantization as SGLang 0.5.23 resolves it: the method it loads with and its KV-cache dtype.

Three things in SGLang decide it (docs/sglang-memory-model.md §2.2):

- ``configs/model_config.py::_parse_quant_hf_config``: ``quantization_config`` in config.json (a ModelOpt one, with
  ``quant_algo`` and no or a ``modelopt`` ``quant_method``, is renamed ``modelopt_fp8``/``modelopt_fp4``/...), else
  ``compression_config``, else ModelOpt's ``hf_quant_config.json`` beside it;
- ``_verify_quantization``: the checkpoint's method, upgraded to its Marlin kernel where SGLang's
  ``override_quantization_method`` does (AWQ, GPTQ), must agree with ``--quantization``; otherwise it raises
  before anything loads;
- ``model_loader/weight_utils.py::get_quant_config`` builds the method's config, whose ``kv_cache_quant_algo``
  makes ``mem_cache/kv_cache_dtype.py::configure_kv_cache_dtype`` store the KV cache in FP8 when
  ``--kv-cache-dtype`` is ``auto``; ``model_loader/loader.py`` refuses a GPU below the method's capability. A
  ModelOpt mixed-precision (``modelopt_mixed``) config.json that lacks the per-layer map or the KV-cache keys is
  read from ``hf_quant_config.json`` instead, as an NVFP4 Qwen3.6-35B-A3B export's is (its config.json has no KV key).

The weights SGLang loads are the checkpoint's tensors as stored, so their bytes are the index's or the headers'
(model_files.py) whatever the method.
"""

from __future__ import annotations

from dataclasses import dataclass

from fleetgen.errors import ModelConfigError

# get_min_capability of each method's config class (layers/quantization/*): the GPU's compute capability
# (major * 10 + minor) must reach it (model_loader/loader.py::_get_quantization_config). modelopt_mixed's is
# ModelOptFp4Config's.
MIN_CAPABILITY = {"fp8": 80, "modelopt_fp8": 89, "modelopt_fp4": 80, "modelopt_mixed": 80, "awq": 75,
                  "awq_marlin": 80, "gptq_marlin": 80, "compressed-tensors": 70, "mxfp4": 80, "w8a8_fp8": 89,
                  "w8a8_int8": 75}
# _verify_quantization's compatible_quantization_methods: a --quantization that may differ from the checkpoint's.
COMPATIBLE_FLAGS = {"modelopt_fp8": {"modelopt"}, "modelopt_fp4": {"modelopt", "fp8"}, "modelopt_mixed": {"modelopt"},
                    "nvfp4_online": {"fp8", "modelopt_fp8"}, "petit_nvfp4": {"modelopt"},
                    "w8a8_int8": {"compressed-tensors", "compressed_tensors"},
                    "w8a8_fp8": {"compressed-tensors", "compressed_tensors"},
                    "auto-round-int8": {"compressed-tensors", "compressed_tensors"}}
# Methods that requantize a checkpoint online (model_config.py REQUANTIZATION_METHODS, nvfp4_online).
ONLINE_REQUANTIZATION = frozenset({"quark_mxfp4", "nvfp4_online"})
# A ModelOpt checkpoint keeps its own method whatever --quantization names: base_config.py's
# _modelopt_override_quantization_method, ModelOptMixedPrecisionConfig.override_quantization_method.
MODELOPT_METHODS = frozenset({"modelopt_fp8", "modelopt_fp4", "modelopt_mixed"})
# awq_marlin / gptq_marlin override_quantization_method: the user's flag that still lets the upgrade happen.
_MARLIN_FLAGS = {"awq": {None, "marlin", "awq_marlin"}, "gptq": {None, "marlin", "gptq_marlin"}}
# AWQMarlinConfig.TYPE_MAP / GPTQMarlinConfig.TYPE_MAP (symmetric only) and marlin_utils' group sizes.
_MARLIN_BITS = {"awq": {4, 8}, "gptq": {4, 8}}
_MARLIN_GROUP_SIZES = {-1, 32, 64, 128}
_FP8_KV_SCHEME = {"type": "float", "num_bits": 8}
_HINT = "drop or change --quantization in the extra SGLang args, or serve a checkpoint this GPU supports"


@dataclass(frozen=True)
class Quantization:
    """What SGLang loads the checkpoint with."""

    method: str | None               # ModelConfig.quantization after _verify_quantization
    kv_cache_quant_algo: str | None  # the method config's kv_cache_quant_algo ("FP8" stores KV in FP8)
    source: str | None               # where it was read: config.json or hf_quant_config.json

    @property
    def kv_cache_fp8(self) -> bool:
        return isinstance(self.kv_cache_quant_algo, str) and self.kv_cache_quant_algo.upper() == "FP8"


def _modelopt_section(quant: dict) -> dict:
    """configs/model_config.py::unwrap_modelopt_quantization_config."""
    section = quant.get("quantization", quant)
    if not isinstance(section, dict):
        return {}
    nested = section.get("quantization")
    return nested if isinstance(nested, dict) else section


def _modelopt_method(quant: dict) -> str | None:
    """_parse_modelopt_quant_config: the method a ModelOpt quant_algo names."""
    section = _modelopt_section(quant)
    algo = section.get("quant_algo")
    if algo == "MIXED_PRECISION":
        layers = section.get("quantized_layers") or {}
        nvfp4 = any(str(info.get("quant_algo", "")).upper() in ("NVFP4", "W4A16_NVFP4")
                    for info in layers.values() if isinstance(info, dict))
        return "modelopt_mixed" if nvfp4 else "w4afp8"
    if algo and "FP4" in algo:
        return "modelopt_fp4"
    return {"FP8": "modelopt_fp8", "MXFP8": "mxfp8"}.get(algo)


def _mixed_kv_algo(quant: dict, source: str, hf_quant_config: dict | None, config_path: str) -> str | None:
    """ModelOptMixedPrecisionConfig.from_config's kv_cache_quant_algo, from config.json's flat quantization_config
    unless get_quant_config passes over it as incomplete (no quantized_layers, or neither kv_cache_quant_algo nor
    kv_cache_scheme) for the checkpoint's hf_quant_config.json."""
    complete = "quantized_layers" in quant and ("kv_cache_quant_algo" in quant or "kv_cache_scheme" in quant)
    if source == "config.json" and not complete:
        if not isinstance(hf_quant_config, dict):
            raise ModelConfigError("SGLang refuses this launch: Cannot find the config file for modelopt_mixed (its "
                                   "config.json quantization_config has no per-layer map or KV-cache keys, and there "
                                   "is no hf_quant_config.json beside it)", path=config_path,
                                   hint="copy the checkpoint's hf_quant_config.json into the model directory named by "
                                        "model.path in the fleet description")
        quant = hf_quant_config
    if "quant_algo" not in quant:  # the file's nested form
        return _modelopt_section(quant).get("kv_cache_quant_algo")
    scheme = quant.get("kv_cache_scheme")
    if isinstance(scheme, dict):
        if scheme.get("type") == "float" and scheme.get("num_bits") in (8, 4):
            return "FP8" if scheme["num_bits"] == 8 else "NVFP4"
        return "auto"
    return quant.get("kv_cache_quant_algo")


def _kv_algo(method: str, quant: dict) -> str | None:
    """The kv_cache_quant_algo the method's from_config reads (ModelOptFp8Config/ModelOptFp4Config, Fp8Config)."""
    if method.startswith("modelopt") or method == "mxfp8":
        if "quant_algo" in quant:  # flat format: config.json's quantization_config
            scheme = quant.get("kv_cache_scheme")
            if isinstance(scheme, dict):
                return "FP8" if all(scheme.get(k) == v for k, v in _FP8_KV_SCHEME.items()) else None
            return quant.get("kv_cache_quant_algo")
        return _modelopt_section(quant).get("kv_cache_quant_algo")
    if method == "fp8":
        return quant.get("kv_cache_quant_algo")
    return None


def _marlin_upgrade(method: str, quant: dict, flag: str | None) -> str | None:
    """AWQMarlinConfig / GPTQMarlinConfig.override_quantization_method on CUDA (is_awq_marlin_compatible,
    is_gptq_marlin_compatible: every key they read must be present)."""
    if method not in _MARLIN_FLAGS or flag not in _MARLIN_FLAGS[method]:
        return None
    bits, group = quant.get("bits"), quant.get("group_size")
    if bits not in _MARLIN_BITS[method] or group not in _MARLIN_GROUP_SIZES:
        return None
    if method == "awq" and quant.get("zero_point") is None:
        return None
    if method == "gptq" and (quant.get("sym") is not True or quant.get("desc_act") is None
                             or quant.get("is_marlin_format") or quant.get("checkpoint_format") == "marlin"):
        return None
    return f"{method}_marlin"


def checkpoint_quantization(config: dict, hf_quant_config: dict | None, flag: str | None, *,
                            config_path: str = "config.json") -> Quantization:
    """The resolved quantization of a checkpoint launched with ``--quantization flag`` (None: not given)."""
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    quant = config.get("quantization_config") or text.get("quantization_config")
    source = "config.json" if quant else None
    if isinstance(quant, dict) and quant and ("quant_method" not in quant or quant["quant_method"] == "modelopt"):
        renamed = _modelopt_method({"quantization": quant})
        quant = {**quant, "quant_method": renamed} if renamed else quant
    if not quant:
        quant = config.get("compression_config") or None
        source = "config.json" if quant else None
    if not quant and isinstance(hf_quant_config, dict):
        renamed = _modelopt_method(hf_quant_config)
        if renamed:
            quant, source = {**hf_quant_config, "quant_method": renamed}, "hf_quant_config.json"
    flag = flag.lower() if flag else None
    if not quant:
        if flag is not None:
            raise ModelConfigError(f"--quantization {flag} quantizes an unquantized checkpoint online; the tuner "
                                   "sizes the weights as stored and does not model that",
                                   path=config_path, hint="drop --quantization from the extra SGLang args")
        return Quantization(None, None, None)
    method = str(quant.get("quant_method", flag or "")).lower()
    checkpoint_method = method
    if flag in ONLINE_REQUANTIZATION:
        raise ModelConfigError(f"--quantization {flag} requantizes the {checkpoint_method} checkpoint online; the "
                               "tuner sizes the weights as stored and does not model that", path=config_path,
                               hint="drop --quantization from the extra SGLang args")
    upgraded = _marlin_upgrade(method, quant, flag)
    if method in MODELOPT_METHODS:
        # base_config.py::_modelopt_override_quantization_method: a ModelOpt checkpoint keeps its own method
        # whatever --quantization names (the online requantizations aside, refused above)
        flag = method
    elif upgraded:
        method = flag = upgraded
    if flag is None:
        flag = method
    elif flag != method and method not in COMPATIBLE_FLAGS.get(flag, ()):
        raise ModelConfigError(
            f"SGLang refuses this launch: Quantization method specified in the model config ({method}) does not "
            f"match the quantization method specified in the `quantization` argument ({flag}).",
            path=config_path, hint=_HINT)
    if flag not in MIN_CAPABILITY:
        # _verify_quantization: "Unknown quantization method" for what CUDA does not register (plain gptq), and
        # methods whose loading the tuner has not compared with SGLang's.
        raise ModelConfigError(f"quantization method {flag} (checkpoint: {checkpoint_method}) is not one the tuner "
                               f"models ({', '.join(sorted(MIN_CAPABILITY))})", path=config_path,
                               hint="plan this model by hand with explicit SGLang flags")
    if flag == "modelopt_mixed":
        return Quantization(flag, _mixed_kv_algo(quant, source, hf_quant_config, config_path), source)
    return Quantization(flag, _kv_algo(flag, quant), source)


def check_gpu_capability(method: str | None, generation: str | None, gpu_name: str, *, host: str | None = None):
    """model_loader/loader.py: SGLang refuses a GPU below the method's minimum compute capability
    (``generation``: platform.py's ``sm90``-style name; None, unknown, is not checked)."""
    needed = MIN_CAPABILITY.get(method or "", 0)
    capability = int(generation[2:]) if generation else None
    if capability is not None and capability < needed:
        raise ModelConfigError(
            f"SGLang refuses this launch on {gpu_name}: The quantization method {method} is not supported for the "
            f"current GPU. Minimum capability: {needed}. Current capability: {capability}.", host=host, hint=_HINT)
