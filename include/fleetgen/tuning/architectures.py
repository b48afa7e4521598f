"""Which architecture SGLang 0.5.23 treats how, as far as the plan's memory and flags depend on it: one entry per
architecture, every trait of it in that entry.

Supporting a new architecture: add its entry here (the traits it shares with SGLang's lists, each cited below),
plus one oracle case (tests/oracle/) that compares the plan with SGLang's own sizing. Architectures without an
entry are plain: dense or MLA attention from their config's keys (``geometry.py``), no multimodal reserve, the
default attention backend. The simulator keeps its own tables, written separately from SGLang's source, so that
the cross-checks catch a wrong entry here.

Traits, and where SGLang decides them:

- ``multimodal``: ``configs/model_config.py::multimodal_model_archs``; ``ModelConfig.is_multimodal`` is then true
  (multimodal is on by default), the KV budget reserves the vision cache and the automatic
  ``mem_fraction_static`` takes the VLM factor.
- ``multimodal_off_by_default``: ``ModelConfig.__init__`` (``mm_disabled_models``) turns multimodal off unless
  ``--enable-multimodal``.
- ``keeps_multimodal_prefill_graph``: ``multimodal_breakable_cuda_graph_supported_model_archs``; SGLang turns
  the breakable prefill CUDA graph off for every other multimodal model.
- ``language_model_only``: ``server_args.py::ServerArgs.LANGUAGE_MODEL_ONLY_ARCHITECTURES``;
  ``--language-model-only`` is fatal for any other (``arg_groups/model_hook.py::handle_language_model_only``).
- ``hybrid_swa``: ``configs/model_config.py::is_hybrid_swa_model``: a separate sliding-window KV pool.
- ``swa_layers``: how ``get_hybrid_layer_ids`` picks the sliding layers: ``"layer_types"`` (``SWA_SINK_ARCHS``:
  the config's ``layer_types``; the model reports ``sliding_window - 1``, ``models/gpt_oss.py``) or
  ``"llama4"`` (every 4th layer full, the rest chunked with ``attention_chunk_size``).
- ``mxfp4_bf16``: an MXFP4 checkpoint whose KV cache and activations stay bf16.
- ``attention_backend``: the backend SGLang picks when none is given: ``"qwen3_5"`` (the Qwen3.5 family rules,
  ``platform.py``), ``"triton_on_sm100"``, ``"pinned"`` (``model_overrides/gpt_oss.py``, ``llama4.py``:
  trtllm_mha on SM100, fa3 on Hopper, triton elsewhere), ``"trtllm_mla_on_sm100"``
  (``model_overrides/deepseek_v2.py::_deepseek_family_overrides``).
- ``mtp_draft_rewrite``: a path-less MTP draft SGLang builds by rewriting the target config
  (``configs/model_config.py``, the ``is_draft_model`` branches that set ``num_nextn_predict_layers = 1``).
- ``default_vision_hidden_size``: the vision tower the config class builds when ``config.json`` has none
  (``Qwen3_5Config``: ``Qwen3VLVisionConfig``, hidden_size 1152); the VLM mem-fraction factor reads it.
- ``eagle_defaults``: (steps, topk, draft tokens) ``_auto_choose_speculative_params`` picks for the Eagle family
  with nothing set (every other architecture: (3, 1, 4)).
- ``state_config``: the SGLang config class (``configs/``) whose ``mamba2_cache_params`` sizes this architecture's
  linear-attention / Mamba state; ``state_shape`` the shape rule that property uses and ``state_layers`` how the
  config names its state and attention layers (both explained in ``state_shapes.py``). Config classes with a
  state cache the tuner does not plan are in ``STATE_CACHE_REFUSALS`` with the reason.
- ``mamba_radix``: ``arg_groups/overrides.py::_MAMBA_RADIX_CACHE_ARCHS`` (or a ``linear_attn_model_registry`` spec
  with ``uses_mamba_radix_cache``): ``--mamba-radix-cache-strategy auto`` is resolved for it; for any other
  stateful architecture it stays ``auto``, no tracking slots, overlap scheduling kept.
- ``mamba_extra_buffer``: ``_MAMBA_EXTRA_BUFFER_ARCHS``: ``auto`` can resolve to ``extra_buffer``; otherwise to
  ``no_buffer`` with overlap scheduling off (``_mamba_radix_cache_resolution``).
- ``radix_cache_off``: a model override that turns the radix cache off (one state slot a request), its source.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any


@dataclass(frozen=True)
class Architecture:
    name: str
    multimodal: bool = False
    multimodal_off_by_default: bool = False
    keeps_multimodal_prefill_graph: bool = False
    language_model_only: bool = False
    hybrid_swa: bool = False
    swa_layers: str | None = None
    mxfp4_bf16: bool = False
    attention_backend: str | None = None
    mtp_draft_rewrite: bool = False
    default_vision_hidden_size: int | None = None
    eagle_defaults: tuple[int, int, int] | None = None
    state_config: str | None = None
    state_shape: str | None = None
    state_layers: str | None = None
    mamba_radix: bool = False
    mamba_extra_buffer: bool = False
    radix_cache_off: str | None = None


SWA_LAYER_RULES = ("layer_types", "llama4")
ATTENTION_BACKEND_RULES = ("qwen3_5", "triton_on_sm100", "pinned", "trtllm_mla_on_sm100", "flashinfer_on_sm100")
# Shorthands for the state traits of the entries below (state_shapes.py explains each rule).
_RADIX = dict(mamba_radix=True, mamba_extra_buffer=True)
_RADIX_NO_BUFFER = dict(mamba_radix=True)

ARCHITECTURES: tuple[Architecture, ...] = (
    Architecture("BailingMM2NativeForConditionalGeneration", multimodal=True),
    Architecture("BailingMMNativeForConditionalGeneration", multimodal=True),
    Architecture("BailingMoeV2_5ForCausalLM", state_config="BailingHybridConfig", state_shape="mamba2",
                 state_layers=("layer_group_size",), **_RADIX),
    Architecture("BailingMoeV3ForCausalLM", state_config="BailingHybridConfig", state_shape="kda",
                 state_layers=("layer_group_size",), **_RADIX),
    Architecture("BailingMoeV3VLForConditionalGeneration", multimodal=True, state_config="BailingHybridConfig",
                 state_shape="kda", state_layers=("layer_group_size",), **_RADIX),
    Architecture("BeamForCausalLM", hybrid_swa=True),
    Architecture("CLIPModel", multimodal=True),
    Architecture("Cohere2VisionForConditionalGeneration", multimodal=True, keeps_multimodal_prefill_graph=True),
    Architecture("Cosmos3EdgeForConditionalGeneration", multimodal=True, language_model_only=True),
    Architecture("Cosmos3ForConditionalGeneration", language_model_only=True),
    Architecture("DeepseekOCRForCausalLM", multimodal=True),
    Architecture("DeepseekV32ForCausalLM", attention_backend="trtllm_mla_on_sm100"),
    Architecture("DeepseekV3ForCausalLM", attention_backend="trtllm_mla_on_sm100"),
    Architecture("DeepseekV4ForCausalLM", language_model_only=True, hybrid_swa=True, mtp_draft_rewrite=True),
    Architecture("DeepseekV4ForCausalLMDSpark", hybrid_swa=True),
    Architecture("DeepseekV4ForCausalLMNextN", hybrid_swa=True),
    Architecture("DeepseekVL2ForCausalLM", multimodal=True),
    Architecture("DiffusionGemmaForBlockDiffusion", multimodal=True, hybrid_swa=True),
    Architecture("Dots3NoteForCausalLM", multimodal=True, attention_backend="trtllm_mla_on_sm100"),
    Architecture("DotsOCRForCausalLM", multimodal=True),
    Architecture("DotsVLMForCausalLM", multimodal=True),
    Architecture("EmbeddingGemma2Model", multimodal=True, hybrid_swa=True),
    Architecture("Ernie4_5_VLMoeForConditionalGeneration", multimodal=True),
    Architecture("ExaoneMoEForCausalLM", mtp_draft_rewrite=True),
    Architecture("ExaoneMoeForCausalLM", mtp_draft_rewrite=True),
    Architecture("FalconH1ForCausalLM", attention_backend="triton_on_sm100", state_config="FalconH1Config",
                 state_shape="mamba2", state_layers=("every_layer",), **_RADIX),
    Architecture("FalconMambaForCausalLM", state_config="FalconMambaConfig", state_shape="mamba1",
                 state_layers=("no_attention",)),
    Architecture("Gemma3ForConditionalGeneration", multimodal=True, multimodal_off_by_default=True),
    Architecture("Gemma3nForConditionalGeneration", multimodal=True),
    Architecture("Gemma4ForCausalLM", hybrid_swa=True),
    Architecture("Gemma4ForConditionalGeneration", multimodal=True, hybrid_swa=True),
    Architecture("Gemma4UnifiedForConditionalGeneration", multimodal=True, hybrid_swa=True),
    Architecture("Glm4vForConditionalGeneration", multimodal=True),
    Architecture("Glm4vMoeForConditionalGeneration", multimodal=True),
    Architecture("GigaChat35ForCausalLM", state_config="GigaChat35Config", state_shape="mamba2",
                 state_layers=("layer_types", ("linear_attention",), ("attention", "full_attention")),
                 mamba_radix=True),
    Architecture("Glm5NextForConditionalGeneration", multimodal=True, keeps_multimodal_prefill_graph=True,
                 attention_backend="trtllm_mla_on_sm100", mtp_draft_rewrite=True, state_config="Glm5NextTextConfig", **_RADIX),
    Architecture("GlmAsrForConditionalGeneration", multimodal=True),
    Architecture("GlmImageForConditionalGeneration", multimodal=True),
    Architecture("GlmMoeDsaForCausalLM", attention_backend="trtllm_mla_on_sm100"),
    Architecture("GlmOcrForConditionalGeneration", multimodal=True),
    Architecture("GptOssForCausalLM", hybrid_swa=True, swa_layers="layer_types", mxfp4_bf16=True,
                 attention_backend="pinned"),
    Architecture("GraniteMoeHybridForCausalLM", attention_backend="flashinfer_on_sm100",
                 state_config="GraniteMoeHybridConfig", state_shape="mamba2",
                 state_layers=("layer_types", ("mamba", "linear_attention"), ("attention", "full_attention")), **_RADIX),
    Architecture("GraniteMoeSWAForCausalLM", hybrid_swa=True, swa_layers="layer_types"),
    Architecture("GraniteSWAForCausalLM", hybrid_swa=True, swa_layers="layer_types"),
    Architecture("Grok1AForCausalLM", multimodal=True),
    Architecture("Grok1ForCausalLM", eagle_defaults=(5, 4, 8)),
    Architecture("Grok1VForCausalLM", multimodal=True, eagle_defaults=(5, 4, 8)),
    Architecture("HYV3ForCausalLM", mtp_draft_rewrite=True),
    Architecture("HYV4ForCausalLM", attention_backend="trtllm_mla_on_sm100", mtp_draft_rewrite=True),
    Architecture("HYV4ForCausalLMNextN", attention_backend="trtllm_mla_on_sm100"),
    Architecture("InklingForConditionalGeneration", multimodal_off_by_default=True, hybrid_swa=True,
                 state_config="InklingMMConfig", mamba_extra_buffer=True),
    Architecture("InklingForConditionalGenerationMTP", hybrid_swa=True, state_config="InklingModelConfig",
                 mamba_extra_buffer=True),
    Architecture("InternS1ForConditionalGeneration", multimodal=True),
    Architecture("InternS1ProForConditionalGeneration", multimodal=True),
    Architecture("InternS2MobiusForConditionalGeneration", multimodal=True, keeps_multimodal_prefill_graph=True,
                 attention_backend="qwen3_5", mtp_draft_rewrite=True, state_config="InternS2MobiusTextConfig",
                 state_shape="mamba2", state_layers=("interval",), **_RADIX_NO_BUFFER),
    Architecture("InternS2PreviewForConditionalGeneration", multimodal=True, attention_backend="qwen3_5",
                 mtp_draft_rewrite=True, **_RADIX),
    Architecture("InternVLChatModel", multimodal=True),
    Architecture("IQuestQ1ForCausalLM", hybrid_swa=True, swa_layers="layer_types"),
    Architecture("IQuestQ1MTP", hybrid_swa=True),
    Architecture("JetNemotronForCausalLM", attention_backend="triton_on_sm100", state_config="JetNemotronConfig",
                 state_shape="mamba2", state_layers=("layer_types", ("jet",), ("attn", "swa")), **_RADIX_NO_BUFFER),
    Architecture("JetVLMForConditionalGeneration", multimodal=True, attention_backend="triton_on_sm100",
                 state_config="JetNemotronConfig", state_shape="mamba2",
                 state_layers=("layer_types", ("jet",), ("attn", "swa")), **_RADIX_NO_BUFFER),
    Architecture("KimiK25ForConditionalGeneration", multimodal=True, keeps_multimodal_prefill_graph=True,
                 attention_backend="trtllm_mla_on_sm100"),
    Architecture("KimiK3ForConditionalGeneration", keeps_multimodal_prefill_graph=True, **_RADIX),
    Architecture("KimiLinearForCausalLM", state_config="KimiLinearConfig", state_shape="kda",
                 state_layers=("kda_layers",), **_RADIX),
    Architecture("KimiVLForConditionalGeneration", multimodal=True),
    Architecture("LagunaForCausalLM", hybrid_swa=True),
    Architecture("Lfm2ForCausalLM", attention_backend="flashinfer_on_sm100", state_config="Lfm2Config",
                 state_shape="mamba2", state_layers=("layer_types", ("conv", "short_conv"), ("full_attention",)),
                 **_RADIX_NO_BUFFER),
    Architecture("Lfm2MoeForCausalLM", attention_backend="flashinfer_on_sm100", state_config="Lfm2MoeConfig",
                 state_shape="mamba2", state_layers=("layer_types", ("conv", "short_conv"), ("full_attention",)),
                 **_RADIX_NO_BUFFER),
    Architecture("Lfm2VlForConditionalGeneration", multimodal=True, state_config="Lfm2VlConfig", state_shape="mamba2",
                 state_layers=("layer_types", ("conv", "short_conv"), ("full_attention",))),
    Architecture("LightOnOCRForConditionalGeneration", multimodal=True),
    Architecture("Llama4ForCausalLM", attention_backend="pinned"),
    Architecture("Llama4ForConditionalGeneration", multimodal=True, multimodal_off_by_default=True, hybrid_swa=True,
                 swa_layers="llama4", attention_backend="pinned"),
    Architecture("LlamaForCausalLM", eagle_defaults=(5, 4, 8)),
    Architecture("LlavaForConditionalGeneration", multimodal=True),
    Architecture("LlavaLlamaForCausalLM", multimodal=True),
    Architecture("LlavaMistralForCausalLM", multimodal=True),
    Architecture("LlavaQwenForCausalLM", multimodal=True),
    Architecture("LlavaVidForCausalLM", multimodal=True),
    Architecture("LocateAnythingForConditionalGeneration", multimodal=True),
    Architecture("LongcatFlashForCausalLM", attention_backend="trtllm_mla_on_sm100"),
    Architecture("LongcatFlashForCausalLMNextN", attention_backend="trtllm_mla_on_sm100"),
    Architecture("MellumForCausalLM", hybrid_swa=True),
    Architecture("MiDashengLMModel", multimodal=True),
    Architecture("MiMoV2ASRForCausalLM", multimodal=True),
    Architecture("MiMoV2FlashForCausalLM", hybrid_swa=True, mtp_draft_rewrite=True),
    Architecture("MiMoV2ForCausalLM", multimodal=True, hybrid_swa=True, mtp_draft_rewrite=True),
    Architecture("MiMoV2MTP", hybrid_swa=True),
    Architecture("Mamba2ForCausalLM", state_config="Mamba2Config", state_shape="mamba2", state_layers=("no_attention",)),
    Architecture("MambaForCausalLM", state_config="MambaConfig", state_shape="mamba1", state_layers=("no_attention",)),
    Architecture("MiniCPMO", multimodal=True),
    Architecture("MiniCPMSALAForCausalLM", state_config="MiniCPMHybridConfig", state_shape="mamba2",
                 state_layers=("mixer_types", ("lightning-attn",), ("minicpm4",)),
                 radix_cache_off="model_overrides/minicpm.py::_minicpm_sala_overrides"),
    Architecture("MiniCPMV", multimodal=True),
    Architecture("MiniCPMV4_6ForConditionalGeneration", **_RADIX),
    Architecture("MiniCPMV4_7ForConditionalGeneration", **_RADIX),
    Architecture("MiniMaxM3SparseForCausalLM", keeps_multimodal_prefill_graph=True),
    Architecture("MiniMaxM3SparseForConditionalGeneration", multimodal=True, keeps_multimodal_prefill_graph=True),
    Architecture("Mistral3ForConditionalGeneration", multimodal=True),
    Architecture("MistralLarge3ForCausalLM", attention_backend="trtllm_mla_on_sm100"),
    Architecture("MllamaForConditionalGeneration", multimodal=True),
    Architecture("MossVLForConditionalGeneration", multimodal=True),
    Architecture("MultiModalityCausalLM", multimodal=True),
    Architecture("MuseGlimmerForCausalLM", hybrid_swa=True),
    Architecture("MuseGlimmerForConditionalGeneration", multimodal=True, keeps_multimodal_prefill_graph=True,
                 language_model_only=True, hybrid_swa=True),
    Architecture("MuseSparkForConditionalGeneration", multimodal=True, keeps_multimodal_prefill_graph=True),
    Architecture("NemotronH_Nano_Omni_Reasoning_V3", multimodal=True),
    Architecture("NemotronH_Nano_VL_V2", multimodal=True),
    Architecture("NemotronH_Omni_Reasoning_V3", multimodal=True, mtp_draft_rewrite=True, **_RADIX),
    Architecture("NemotronHForCausalLM", mtp_draft_rewrite=True, state_config="NemotronHConfig", state_shape="mamba2",
                 state_layers=("pattern",), **_RADIX),
    Architecture("NemotronHPuzzleForCausalLM", mtp_draft_rewrite=True, state_config="NemotronHPuzzleConfig",
                 state_shape="mamba2", state_layers=("pattern",), **_RADIX),
    Architecture("NVILAForConditionalGeneration", multimodal=True),
    Architecture("NVILALiteForConditionalGeneration", multimodal=True),
    Architecture("PaddleOCRVLForConditionalGeneration", multimodal=True, keeps_multimodal_prefill_graph=True),
    Architecture("Phi4MMForCausalLM", multimodal=True),
    Architecture("PixtralForConditionalGeneration", multimodal=True, attention_backend="trtllm_mla_on_sm100"),
    Architecture("POINTSV15ChatModel", multimodal=True),
    Architecture("Qwen2_5_VLForConditionalGeneration", multimodal=True),
    Architecture("Qwen2AudioForConditionalGeneration", multimodal=True),
    Architecture("Qwen2VLForConditionalGeneration", multimodal=True),
    Architecture("Qwen3_5ForCausalLM", mtp_draft_rewrite=True, state_config="Qwen3_5TextConfig", state_shape="mamba2",
                 state_layers=("interval",), **_RADIX),
    Architecture("Qwen3_5ForConditionalGeneration", multimodal=True, keeps_multimodal_prefill_graph=True,
                 attention_backend="qwen3_5", mtp_draft_rewrite=True, default_vision_hidden_size=1152,
                 state_config="Qwen3_5TextConfig", state_shape="mamba2", state_layers=("interval",), **_RADIX),
    Architecture("Qwen3_5MoeForCausalLM", mtp_draft_rewrite=True, state_config="Qwen3_5MoeTextConfig",
                 state_shape="mamba2", state_layers=("interval",), **_RADIX),
    Architecture("Qwen3_5MoeForConditionalGeneration", multimodal=True, keeps_multimodal_prefill_graph=True,
                 attention_backend="qwen3_5", mtp_draft_rewrite=True, default_vision_hidden_size=1152,
                 state_config="Qwen3_5MoeTextConfig", state_shape="mamba2", state_layers=("interval",), **_RADIX),
    Architecture("Qwen3ASRForConditionalGeneration", multimodal=True),
    Architecture("Qwen3MoeForCausalLM", mtp_draft_rewrite=True),
    Architecture("Qwen3NextForCausalLM", attention_backend="qwen3_5", mtp_draft_rewrite=True,
                 state_config="Qwen3NextConfig", state_shape="mamba2", state_layers=("interval",), **_RADIX),
    Architecture("Qwen3OmniMoeForConditionalGeneration", multimodal=True),
    Architecture("Qwen3VLForConditionalGeneration", multimodal=True),
    Architecture("Qwen3VLMoeForConditionalGeneration", multimodal=True),
    Architecture("Qwen4ExpForConditionalGeneration", multimodal=True, keeps_multimodal_prefill_graph=True,
                 mtp_draft_rewrite=True, state_config="Qwen4ExpTextConfig", **_RADIX),
    Architecture("Sarashina2VisionForCausalLM", multimodal=True),
    Architecture("Step3p5ForCausalLM", hybrid_swa=True),
    Architecture("Step3p5MTP", hybrid_swa=True),
    Architecture("Step3p7ForConditionalGeneration", multimodal=True, hybrid_swa=True),
    Architecture("Step3VLForConditionalGeneration", multimodal=True, multimodal_off_by_default=True),
    Architecture("StepVLForConditionalGeneration", multimodal=True),
    Architecture("UnlimitedOCRForCausalLM", multimodal=True, hybrid_swa=True),
    Architecture("VoxtralForConditionalGeneration", multimodal=True),
    Architecture("WhisperForConditionalGeneration", multimodal=True),
    Architecture("ZayaForCausalLM", state_config="ZayaConfig", state_shape="zaya_cca", state_layers=("zaya_layers",),
                 **_RADIX_NO_BUFFER),
)
REGISTRY: dict[str, Architecture] = {entry.name: entry for entry in ARCHITECTURES}

# SGLang config classes whose ``mamba2_cache_params`` sizes a state the tuner does not plan, and why; an
# architecture naming one as its ``state_config`` is refused with that reason (tests/oracle/test_state_families.py
# holds this table and the entries above to every state-cache class SGLang 0.5.23 defines).
_INKLING = ("Inkling keeps six short-convolution windows per layer (configs/inkling.py::InklingConvStateShape, "
            "bfloat16) beside a hybrid sliding-window KV pool with its own MTP window geometry, and SGLang pins "
            "extra_buffer for it (arg_groups/model_overrides/inkling.py); the tuner does not model that split")
STATE_CACHE_REFUSALS: dict[str, str] = {
    "Glm5NextTextConfig": "GLM-5-Next's full-attention layers are DSA sparse attention (index_topk): SGLang adds an "
                          "indexer KV cache per token (model_executor/pool_configurator.py::"
                          "_compute_dsa_indexer_cell_size) that the tuner does not size",
    "InklingMMConfig": _INKLING,
    "InklingModelConfig": _INKLING,
    "Qwen4ExpTextConfig": "Qwen4-Exp adds short-convolution layers and an n-gram context to the GatedDeltaNet state "
                          "pool (mem_cache/kv_cache_configurator.py: short_conv_layer_ids, short_conv_state_shape, "
                          "ngram_context_len), which the tuner does not size",
}


def architecture(name: str) -> Architecture:
    """The entry of ``name``; a plain architecture when it has none."""
    return REGISTRY.get(name) or Architecture(name)


def names_with(trait: str, value: Any = True) -> frozenset[str]:
    """The architectures whose ``trait`` is ``value``."""
    if trait not in {item.name for item in fields(Architecture)}:
        raise ValueError(f"no architecture trait {trait!r}")
    return frozenset(entry.name for entry in ARCHITECTURES if getattr(entry, trait) == value)
