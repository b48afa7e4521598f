"""Which architectures SGLang 0.5.23 serves as multimodal, written from its source for the simulator (the
tuner keeps its own table; the oracle matrix compares both with SGLang).

``configs/model_config.py``: ``multimodal_model_archs`` (``is_multimodal_model``), and the models whose
multimodal part is off unless ``--enable-multimodal`` (``ModelConfig.__init__``, ``mm_disabled_models``).
"""

MULTIMODAL_ARCHITECTURES = frozenset("""
    CLIPModel Cohere2VisionForConditionalGeneration Cosmos3EdgeForConditionalGeneration DeepseekVL2ForCausalLM
    Ernie4_5_VLMoeForConditionalGeneration MiniMaxM3SparseForConditionalGeneration Gemma3ForConditionalGeneration
    Gemma3nForConditionalGeneration Gemma4ForConditionalGeneration EmbeddingGemma2Model
    Gemma4UnifiedForConditionalGeneration DiffusionGemmaForBlockDiffusion Glm4vForConditionalGeneration
    Glm4vMoeForConditionalGeneration Glm5NextForConditionalGeneration GlmOcrForConditionalGeneration
    GlmAsrForConditionalGeneration GlmImageForConditionalGeneration Grok1VForCausalLM Grok1AForCausalLM
    LlavaLlamaForCausalLM Llama4ForConditionalGeneration LlavaMistralForCausalLM LlavaQwenForCausalLM
    LlavaForConditionalGeneration LlavaVidForCausalLM Lfm2VlForConditionalGeneration
    LightOnOCRForConditionalGeneration MiMoV2ForCausalLM MiMoV2ASRForCausalLM MiniCPMO MiniCPMV
    Mistral3ForConditionalGeneration MultiModalityCausalLM MllamaForConditionalGeneration
    MossVLForConditionalGeneration NemotronH_Nano_VL_V2 NemotronH_Nano_Omni_Reasoning_V3 NemotronH_Omni_Reasoning_V3
    MuseGlimmerForConditionalGeneration MuseSparkForConditionalGeneration PixtralForConditionalGeneration
    Qwen2AudioForConditionalGeneration Qwen2VLForConditionalGeneration Qwen2_5_VLForConditionalGeneration
    Qwen3VLForConditionalGeneration Qwen3VLMoeForConditionalGeneration Qwen3_5ForConditionalGeneration
    Qwen3_5MoeForConditionalGeneration Qwen4ExpForConditionalGeneration InternS2PreviewForConditionalGeneration
    InternS2MobiusForConditionalGeneration Qwen3ASRForConditionalGeneration Qwen3OmniMoeForConditionalGeneration
    KimiVLForConditionalGeneration LocateAnythingForConditionalGeneration InternVLChatModel
    InternS1ForConditionalGeneration InternS1ProForConditionalGeneration Phi4MMForCausalLM
    VoxtralForConditionalGeneration WhisperForConditionalGeneration Step3VLForConditionalGeneration
    POINTSV15ChatModel DotsVLMForCausalLM Dots3NoteForCausalLM DotsOCRForCausalLM Sarashina2VisionForCausalLM
    NVILAForConditionalGeneration NVILALiteForConditionalGeneration DeepseekOCRForCausalLM UnlimitedOCRForCausalLM
    JetVLMForConditionalGeneration PaddleOCRVLForConditionalGeneration MiDashengLMModel
    StepVLForConditionalGeneration Step3p7ForConditionalGeneration KimiK25ForConditionalGeneration
    BailingMMNativeForConditionalGeneration BailingMM2NativeForConditionalGeneration
    BailingMoeV3VLForConditionalGeneration
""".split())
MULTIMODAL_OFF_BY_DEFAULT = frozenset({"Gemma3ForConditionalGeneration", "Llama4ForConditionalGeneration",
                                       "Step3VLForConditionalGeneration", "InklingForConditionalGeneration"})
