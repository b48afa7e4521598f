"""A model's ``config.json`` as SGLang 0.5.23 sees it: through the transformers config class of its model type.

SGLang never reads config.json keys by hand: ``utils/hf_transformers/config.py::HfModelConfigParser`` builds the
config object (``AutoConfig.from_pretrained``), and every key the file leaves out takes the class default. A
Gemma-3 ``text_config`` without ``max_position_embeddings`` is 131,072 tokens to SGLang (Gemma3TextConfig's
default), not the 2,048 of ``get_context_length``'s last resort. So the tuner builds the same object, with the
transformers release SGLang pins (requirements.txt), and plans from its values (docs/sglang-memory-model.md §1.6).

Model types SGLang registers a config class of its own for (``utils/hf_transformers/common.py::_CONFIG_REGISTRY``)
are kept as written: the tuner's geometry reads those keys the way SGLang's own classes do.
"""

from __future__ import annotations

import os
from functools import lru_cache

from fleetgen.errors import ModelConfigError

# utils/hf_transformers/common.py::_CONFIG_REGISTRY (0.5.23): model types whose config class is SGLang's own.
SGLANG_CONFIG_MODEL_TYPES = frozenset("""
    NemotronH_Nano_Omni_Reasoning_V3 NemotronH_Nano_VL_V2 afmoe bailing_hybrid bailing_moe_v3_vl
    bailingmm_moe_v2_lite beam chatglm dbrx deepseek-ocr deepseek_v32 deepseek_v4 deepseek_v41 deepseek_v41_text
    deepseek_v41_vision deepseek_vl_v2 dots3_note dots_ocr dots_vlm exaone falcon_h1 falcon_mamba gemma4_unified
    gigachat3_5 glm5_next glm5_next_text granitemoehybrid hy_v4 inkling_audio_model inkling_mm_model inkling_model
    inkling_vision_model intern_s2_preview interns2_mobius interns2_mobius_text internvl_chat iquest_q1
    iquest_q1_mtp jet_nemotron jet_vlm k2_horizon kimi_k2 kimi_k25 kimi_k3 kimi_linear kimi_vl laguna
    locateanything longcat_flash mamba mamba2 mellum minicpm_sala minicpmv4_6 minicpmv4_6_vision minicpmv4_7
    minimax_m3_vl multi_modality muse_glimmer muse_glimmer_assistant nanbeige nemotron_h nemotron_h_omni
    nemotron_h_puzzle olmo3 qwen3_5 qwen3_5_moe qwen3_5_moe_text qwen3_5_text qwen3_next qwen4_exp qwen4_exp_text
    spark2_5 step3_vl step3p5 step3p7 xllm
""".split())


@lru_cache(maxsize=1)
def _transformers():
    # Only the config classes are used: transformers' advice that PyTorch is missing would sit in every
    # derive_plan log as if something were wrong.
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    import transformers

    # Its validation warnings about a public config's own values (rope factors...) are not the user's to fix.
    transformers.logging.set_verbosity_error()
    from transformers import PretrainedConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    return transformers.__version__, PretrainedConfig, CONFIG_MAPPING


def as_sglang_reads(config: dict, *, path: str = "config.json", host: str | None = None) -> dict:
    """``config`` with every value the transformers config class fills in, as a plain dict (sub-configs such as
    ``text_config`` too). ``rope_scaling`` is the attribute SGLang's ``get_context_length`` reads (transformers 5
    keeps it as an alias of ``rope_parameters``, keyed by layer type where the model has several)."""
    model_type = config.get("model_type") if isinstance(config, dict) else None
    if not isinstance(model_type, str) or model_type in SGLANG_CONFIG_MODEL_TYPES:
        return config
    version, pretrained_config, mapping = _transformers()
    if model_type not in mapping:
        # A remote-code model: SGLang needs --trust-remote-code and the checkpoint's own class; its keys as written.
        return config
    try:
        built = mapping[model_type].from_dict(dict(config))
    except Exception as exc:  # noqa: BLE001  (transformers raises what its validators raise)
        raise ModelConfigError(f"transformers {version} cannot build {mapping[model_type].__name__} from "
                               f"config.json: {exc}", path=path, host=host,
                               hint="check the model directory named by model.path in the fleet description; "
                               "SGLang would fail to load this config the same way") from None
    return _plain(built, pretrained_config)


def _plain(built, pretrained_config) -> dict:
    data = built.to_dict()
    rope = getattr(built, "rope_scaling", None)
    data["rope_scaling"] = dict(rope) if isinstance(rope, dict) else rope
    for key, value in vars(built).items():
        if isinstance(value, pretrained_config):
            data[key] = _plain(value, pretrained_config)
    return data
