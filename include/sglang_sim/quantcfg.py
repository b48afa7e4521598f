"""A checkpoint's quantization method and KV-cache algorithm, read as SGLang 0.5.23 reads them.

- The method: ``configs/model_config.py::_parse_quant_hf_config``: config.json's ``quantization_config`` (a ModelOpt
  one, with no or a ``modelopt`` quant_method, named by its ``quant_algo``), else ``compression_config``, else the
  ``hf_quant_config.json`` beside it (``_parse_modelopt_quant_config``).
- The KV-cache algorithm: the method's config built by ``model_loader/weight_utils.py::get_quant_config``:
  config.json's block where it has one, except for a ``modelopt_mixed`` block that lacks its per-layer map or its
  KV-cache keys, which is read from ``hf_quant_config.json`` instead (``ModelOptMixedPrecisionConfig.from_config``;
  an NVFP4 Qwen3.6-35B-A3B export's config.json names no KV cache, its hf_quant_config.json an FP8 one).
"""

from __future__ import annotations


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
    algo = str(section.get("quant_algo") or "")
    if algo == "MIXED_PRECISION":
        layers = section.get("quantized_layers") or {}
        nvfp4 = any(str(layer.get("quant_algo", "")).upper() in ("NVFP4", "W4A16_NVFP4")
                    for layer in layers.values() if isinstance(layer, dict))
        return "modelopt_mixed" if nvfp4 else "w4afp8"
    if "FP4" in algo:
        return "modelopt_fp4"
    return {"FP8": "modelopt_fp8", "MXFP8": "mxfp8"}.get(algo)


def _flat_kv(quant: dict, *, nvfp4_scheme: bool) -> str | None:
    """A flat (config.json) ModelOpt block's KV cache: kv_cache_scheme float/8 is FP8 (float/4 NVFP4 and any other
    scheme "auto" for the mixed config), else kv_cache_quant_algo."""
    scheme = quant.get("kv_cache_scheme")
    if isinstance(scheme, dict):
        if scheme.get("type") == "float" and scheme.get("num_bits") == 8:
            return "FP8"
        if not nvfp4_scheme:
            return None
        return "NVFP4" if scheme.get("type") == "float" and scheme.get("num_bits") == 4 else "auto"
    return quant.get("kv_cache_quant_algo")


def _mixed_kv(quant: dict | None, quant_file: dict | None) -> str | None:
    complete = isinstance(quant, dict) and "quantized_layers" in quant and (
        "kv_cache_quant_algo" in quant or "kv_cache_scheme" in quant)
    source = quant if complete else quant_file
    if not isinstance(source, dict):
        return None
    if "quant_algo" in source:
        return _flat_kv(source, nvfp4_scheme=True)
    return _modelopt_section(source).get("kv_cache_quant_algo")


def checkpoint_quantization(config: dict, quant_file: dict | None) -> tuple[str | None, str | None]:
    """(method, kv_cache_quant_algo) of a checkpoint (``quant_file``: its hf_quant_config.json, None without one);
    (None, None) when unquantized."""
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    quant = config.get("quantization_config") or text.get("quantization_config") or config.get("compression_config")
    if isinstance(quant, dict) and quant:
        method = str(quant.get("quant_method") or "modelopt").lower()
        if method == "modelopt":
            method = _modelopt_method(quant) or method
        if method == "modelopt_mixed":
            return method, _mixed_kv(quant, quant_file)
        if method.startswith("modelopt"):
            return method, _flat_kv(quant, nvfp4_scheme=False)
        return method, quant.get("kv_cache_quant_algo") if method == "fp8" else None
    if isinstance(quant_file, dict):
        method = _modelopt_method(quant_file)
        if method == "modelopt_mixed":
            return method, _mixed_kv(None, quant_file)
        return method, _modelopt_section(quant_file).get("kv_cache_quant_algo") if method else None
    return None, None
