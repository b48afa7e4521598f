"""A model's ``config.json`` -> the shapes SGLang sizes its pools from.

Four layouts are covered, each the way SGLang 0.5.23 reads it:

- dense GQA/MHA: every layer keeps K and V per KV head (docs/sglang-memory-model.md §2.2);
- MLA (DeepSeek-V2/V3 style): one latent of ``kv_lora_rank + qk_rope_head_dim`` per layer (2.2);
- hybrid GatedDeltaNet (Qwen3-Next, Qwen3.5/3.6): full attention on every
  ``full_attention_interval``-th layer, linear attention elsewhere (§2.3);
- hybrid Mamba2 (Nemotron-H: a ``M``/``*``/``-``/``E`` layer pattern; Falcon-H1, recognised by its
  architecture or model_type: attention and Mamba in every layer), both through
  ``Mamba2StateShape.create`` (2.3);
- every other state-cache family SGLang sizes (Granite 4.0-H, LFM2, Kimi-Linear, Mamba-1/2, Jet-Nemotron, ...):
  the architecture registry names its SGLang config class, shape rule and layer naming, and ``state_shapes.py``
  reads the config as that class's ``mamba2_cache_params`` does; its attention layers keep dense or MLA KV.

A config that matches none of them is an error that names the keys it lacks: sizing an unknown
layout as if it were dense would silently leave its state out of the budget.

Sliding-window layers (docs/sglang-memory-model.md §2.5): SGLang keeps a separate SWA pool only for the
architectures ``configs/model_config.py::is_hybrid_swa_model`` lists; every other model, Gemma-2/3
among them (``model_overrides/gemma2_gemma3.py`` forces ``--disable-hybrid-swa-memory``), keeps full KV
on every layer, which is how the dense layout here sizes it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from fleetgen.errors import ModelConfigError
from fleetgen.tuning.architectures import ARCHITECTURES, STATE_CACHE_REFUSALS, architecture as registry_entry, names_with
from fleetgen.tuning.state_shapes import READS_CONFIG_SSM_DTYPE, layer_split, state_fields

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
# utils/hf_transformers/common.py::get_context_length (docs/sglang-memory-model.md §1.6): the first key present wins.
CONTEXT_LENGTH_KEYS = ("max_sequence_length", "seq_length", "max_seq_len", "model_max_length",
                       "max_position_embeddings")
SGLANG_FALLBACK_CONTEXT_LENGTH = 2048
# Keys that mark a layout with recurrent state or windowed attention; a config carrying one of
# these that none of the covered layouts claims must not be sized as dense.
_STATEFUL_HINTS = ("mamba", "ssm", "linear_attn", "linear_num", "hybrid_override_pattern",
                   "layers_block_type", "attn_layer_period", "block_types", "index_topk")
# The vision tower a config class builds when config.json has none (architectures.py): the VLM factor reads it.
_DEFAULT_VISION_TOWER = {name: {"hidden_size": size} for name, size in
                         ((entry.name, entry.default_vision_hidden_size) for entry in ARCHITECTURES) if size}
_SUB_CONFIG_KEYS = ("thinker_config", "llm_config", "language_config", "text_config")
# Views of the architecture registry (architectures.py, where each trait is explained and cited).
MULTIMODAL_ARCHITECTURES = names_with("multimodal")
HYBRID_SWA_ARCHITECTURES = names_with("hybrid_swa")
SWA_LAYER_TYPES_ARCHITECTURES = names_with("swa_layers", "layer_types")
LLAMA4_SWA_ARCHITECTURES = names_with("swa_layers", "llama4")
# get_hybrid_layer_ids: Llama 4 keeps every 4th layer full, the rest chunked (window attention_chunk_size).
LLAMA4_FULL_ATTENTION_INTERVAL = 4
MXFP4_BF16_ARCHITECTURES = names_with("mxfp4_bf16")
# swa_full_tokens_ratio fallback (arg_groups/fields/schedule.py): SWA-layer tokens per full-layer token.
DEFAULT_SWA_FULL_TOKENS_RATIO = 0.8
MULTIMODAL_OFF_BY_DEFAULT = names_with("multimodal_off_by_default")
MULTIMODAL_PREFILL_GRAPH_ARCHITECTURES = names_with("keeps_multimodal_prefill_graph")
LANGUAGE_MODEL_ONLY_ARCHITECTURES = names_with("language_model_only")
# The SGLang config classes read here through state_shapes.py (the Qwen3-Next/3.5, Nemotron-H and Falcon-H1
# families keep their readers below).
_STATE_FAMILY_CONFIGS = frozenset({"GraniteMoeHybridConfig", "Lfm2Config", "Lfm2MoeConfig", "Lfm2VlConfig",
                                   "Mamba2Config", "MambaConfig", "FalconMambaConfig", "JetNemotronConfig",
                                   "GigaChat35Config", "KimiLinearConfig", "BailingHybridConfig",
                                   "MiniCPMHybridConfig", "ZayaConfig"})


@dataclass(frozen=True)
class ModelGeometry:
    """Model shapes independent of the launch options (tp size, dtypes)."""

    architecture: str
    layout: str  # "dense" | "mla" | "hybrid_gdn" | "nemotron_h" | "falcon_h1"
    num_layers: int
    attention_layers: int  # layers that keep KV (full attention only on hybrids)
    kv_heads: int
    head_dim: int
    v_head_dim: int
    model_dtype: str | None
    context_length: int
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    # Linear-attention / Mamba2 state (Mamba2StateShape.create arguments), zero when dense.
    state_layers: int = 0
    state_intermediate: int = 0
    state_groups: int = 0
    state_heads: int = 0
    state_head_dim: int = 0
    state_size: int = 0
    conv_kernel: int = 0
    config_ssm_dtype: str | None = None
    state_rule: str | None = None  # state_shapes.STATE_SHAPE_RULES, None when not hybrid
    state_unsharded_conv: int = 0  # conv channels every TP rank keeps whole (Zaya's prev_hs, window 1)
    # Multi-token-prediction head: num_nextn_predict_layers is what SGLang reads for the KV fold
    # (spec_aux_hidden_state._resolve_eagle_aux_hidden_state); mtp_num_hidden_layers is Qwen3.5's key.
    nextn_predict_layers: int | None = None
    mtp_hidden_layers: int | None = None
    is_multimodal: bool = False
    model_type: str = ""  # hf_config.model_type (the top-level config's)
    vision_layers: int | None = None
    vision_hidden_size: int | None = None
    # Hybrid SWA (HYBRID_SWA_ARCHITECTURES): of the attention layers, those SGLang keeps in its SWA pool,
    # their KV shape (ModelConfig.get_swa_num_kv_heads, swa_head_dim, swa_v_head_dim) and the window the
    # model reports (model_runner_components/load_model_utils.py::resolve_sliding_window_size).
    swa_layers: int = 0
    swa_kv_heads: int = 0
    swa_head_dim: int = 0
    swa_v_head_dim: int = 0
    sliding_window_size: int | None = None
    hybrid_swa_unmodeled: bool = False  # a hybrid-SWA architecture whose layer split is not modelled here

    @property
    def is_hybrid(self) -> bool:
        return self.state_layers > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def is_hybrid_swa(self) -> bool:
        return self.swa_layers > 0

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "ModelGeometry":
        return cls(**data)


def text_config_of(config: dict) -> dict:
    """The language-model sub-config (``get_hf_text_config``), or the config itself."""
    for key in _SUB_CONFIG_KEYS:
        sub = config.get(key)
        if isinstance(sub, dict):
            return sub
    return config


def model_geometry(config: dict, *, config_path: str = "config.json") -> ModelGeometry:
    if not isinstance(config, dict):
        raise ModelConfigError("config.json is not a JSON object", path=config_path)
    text = text_config_of(config)
    architectures = config.get("architectures") or text.get("architectures") or []
    architecture = str(architectures[0]) if architectures else "<no architectures>"

    def get(key: str, default=None):
        return text.get(key, config.get(key, default))

    def need(keys: list[str], what: str) -> None:
        missing = [k for k in keys if get(k) is None]
        if missing:
            raise ModelConfigError(
                f"{architecture}: a {what} config needs {', '.join(keys)}; missing: {', '.join(missing)}",
                path=config_path,
                hint="check that this is the model's own config.json (for multimodal models the "
                     "language model's keys live under text_config)")

    common = _common_fields(text, config, architecture)
    entry = registry_entry(architecture)
    if entry.state_config in STATE_CACHE_REFUSALS:
        raise ModelConfigError(f"{architecture}: {STATE_CACHE_REFUSALS[entry.state_config]}", path=config_path,
                               hint="plan this model by hand with explicit SGLang flags")
    if entry.state_config in _STATE_FAMILY_CONFIGS:
        family = _state_family(entry, get, common, config_path)
        if family is not None:
            return family
    if get("index_topk") is not None:
        raise ModelConfigError(f"{architecture}: DSA sparse attention (index_topk) keeps an indexer KV cache "
                               "that the tuner does not model", path=config_path,
                               hint="plan this model by hand with explicit SGLang flags")
    swa = {}
    # is_hybrid_swa_model reads the opt-in flag from hf_text_config only, the outer config of a wrapped model not.
    if architecture in HYBRID_SWA_ARCHITECTURES or text.get("is_hybrid_swa"):
        swa = _hybrid_swa_fields(get, need, architecture, config_path)
        if get("linear_num_value_heads") is not None or get("kv_lora_rank") is not None or any(
                get(key) is not None for key in ("hybrid_override_pattern", "mamba_d_ssm", "mamba_n_heads")):
            # an SWA pool beside MLA or recurrent state: only the dense split is modelled
            common = {**common, "hybrid_swa_unmodeled": True}

    if get("linear_num_value_heads") is not None:
        return _hybrid_gdn(get, need, common)
    if get("hybrid_override_pattern") is not None or (
            isinstance(get("layers_block_type"), list) and "nemotron" in architecture.lower()):
        return _nemotron_h(get, need, common, architecture, config_path)
    if "falconh1" in architecture.lower() or get("model_type") == "falcon_h1":
        return _falcon_h1(get, need, common)
    if get("kv_lora_rank") is not None:
        need(["num_hidden_layers", "kv_lora_rank", "qk_rope_head_dim"], "MLA")
        layers = int(get("num_hidden_layers"))
        return ModelGeometry(layout="mla", num_layers=layers, attention_layers=layers, kv_heads=1,
                             head_dim=0, v_head_dim=0, kv_lora_rank=int(get("kv_lora_rank")),
                             qk_rope_head_dim=int(get("qk_rope_head_dim")), **common)
    stateful = sorted(k for k in set(text) | set(config) if any(h in k for h in _STATEFUL_HINTS))
    if stateful and entry.state_config not in _STATE_FAMILY_CONFIGS:
        raise ModelConfigError(
            f"{architecture}: unknown layout with recurrent/sparse state keys {', '.join(stateful)}; the tuner "
            "covers dense GQA, MLA, hybrid GatedDeltaNet (linear_num_value_heads, full_attention_interval, ...) "
            "and Mamba2 hybrids (Nemotron-H hybrid_override_pattern, FalconH1ForCausalLM)",
            path=config_path, hint="plan this model by hand with explicit SGLang flags")
    need(["num_hidden_layers", "num_attention_heads"], "dense attention")
    if get("head_dim") is None:
        need(["num_hidden_layers", "num_attention_heads", "hidden_size"], "dense attention (no head_dim)")
    layers = int(get("num_hidden_layers"))
    return ModelGeometry(layout="dense", num_layers=layers, attention_layers=layers,
                         **_attention_fields(get), **common, **swa)


def _hybrid_swa_fields(get, need, architecture: str, config_path: str) -> dict:
    """The SWA split ``get_hybrid_layer_ids`` makes for the hybrid-SWA architectures modelled here."""
    need(["num_hidden_layers", "num_attention_heads"], "hybrid sliding-window")
    layers = int(get("num_hidden_layers"))
    if architecture in SWA_LAYER_TYPES_ARCHITECTURES:
        layer_types = [str(t) for t in (get("layer_types") or [])]
        if get("sliding_window") is None or not layer_types:
            raise ModelConfigError(f"{architecture}: a sliding-window config needs layer_types and sliding_window",
                                   path=config_path)
        swa_layers = sum(1 for t in layer_types[:layers] if t == "sliding_attention")
        window = int(get("sliding_window")) - 1
    elif architecture in LLAMA4_SWA_ARCHITECTURES:
        swa_layers = sum(1 for i in range(layers) if (i + 1) % LLAMA4_FULL_ATTENTION_INTERVAL != 0)
        chunk = get("attention_chunk_size")
        window = int(chunk) if chunk is not None else None
    else:
        # Refused by the profile unless --disable-hybrid-swa-memory puts every layer in the full pool.
        return {"hybrid_swa_unmodeled": True}
    attention = _attention_fields(get)
    kv_heads = int(get("swa_num_key_value_heads") or attention["kv_heads"])
    head_dim = int(get("swa_head_dim") or attention["head_dim"])
    return {"swa_layers": swa_layers, "swa_kv_heads": kv_heads, "swa_head_dim": head_dim,
            "swa_v_head_dim": int(get("swa_v_head_dim") or head_dim), "sliding_window_size": window}


def context_length_of(config: dict) -> int:
    """The model's own context length as SGLang derives it from config.json (``get_context_length``)."""
    text = text_config_of(config)
    rope = text.get("rope_scaling") or {}
    factor = 1
    if isinstance(rope, dict) and rope:
        factor = rope.get("factor", 1) or 1
        if "original_max_position_embeddings" in rope or rope.get("rope_type") == "llama3":
            factor = 1
    for key in CONTEXT_LENGTH_KEYS:
        if text.get(key) is not None:
            return int(factor * text[key])
    return SGLANG_FALLBACK_CONTEXT_LENGTH


def _common_fields(text: dict, config: dict, architecture: str) -> dict:
    dtype = text.get("torch_dtype") or text.get("dtype") or config.get("torch_dtype") or config.get("dtype")
    quantization = config.get("quantization_config") or text.get("quantization_config") or {}
    if architecture in MXFP4_BF16_ARCHITECTURES and isinstance(quantization, dict) \
            and quantization.get("quant_method") == "mxfp4":
        dtype = "bfloat16"  # model_overrides/gpt_oss.py: MXFP4 checkpoints run in bfloat16 (their KV too)
    context = context_length_of(config)
    vision = config.get("vision_config") if isinstance(config.get("vision_config"), dict) else None
    if vision is None and architecture in _DEFAULT_VISION_TOWER:
        vision = _DEFAULT_VISION_TOWER[architecture]
    # ModelConfig.is_multimodal (configs/model_config.py): the architecture is in SGLang's multimodal
    # list and not one it turns off by default; it reserves the VLM cache out of the KV budget (2.1).
    multimodal = architecture in MULTIMODAL_ARCHITECTURES and architecture not in MULTIMODAL_OFF_BY_DEFAULT
    mtp = text.get("mtp_num_hidden_layers")
    nextn = text.get("num_nextn_predict_layers")
    return {
        "architecture": architecture,
        "model_dtype": str(dtype) if dtype is not None else None,
        "context_length": context,
        "nextn_predict_layers": int(nextn) if nextn is not None else None,
        "mtp_hidden_layers": int(mtp) if mtp is not None else None,
        "is_multimodal": multimodal,
        "model_type": str(config.get("model_type") or text.get("model_type") or ""),
        "vision_layers": int(vision.get("num_hidden_layers", 24)) if vision else None,
        "vision_hidden_size": int(vision.get("hidden_size", 1024)) if vision else None,
        "config_ssm_dtype": text.get("mamba_ssm_dtype"),
    }


def _attention_fields(get) -> dict:
    """KV heads and head dims as ModelConfig derives them (head_dim falls back to hidden/heads;
    v_head_dim to head_dim; KV heads to attention heads, the HF convention for MHA)."""
    heads = int(get("num_attention_heads"))
    kv_heads = int(get("num_key_value_heads") or heads)
    head_dim = get("head_dim")
    head_dim = int(head_dim) if head_dim is not None else int(get("hidden_size")) // heads
    v_head_dim = int(get("v_head_dim") or head_dim)
    return {"kv_heads": kv_heads, "head_dim": head_dim, "v_head_dim": v_head_dim}


def _hybrid_gdn(get, need, common: dict) -> ModelGeometry:
    # Qwen3NextConfig.layers_block_type: layer i is full attention iff (i+1) % interval == 0;
    # layer_types is ignored (docs/sglang-memory-model.md §2.3). mamba2_cache_params: the arguments of §2.3 / §4.1.
    keys = ["num_hidden_layers", "full_attention_interval", "num_attention_heads", "num_key_value_heads",
            "head_dim", "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
            "linear_value_head_dim", "linear_conv_kernel_dim"]
    need(keys, "hybrid GatedDeltaNet")
    layers = int(get("num_hidden_layers"))
    interval = int(get("full_attention_interval"))
    full = sum(1 for i in range(layers) if (i + 1) % interval == 0)
    return ModelGeometry(
        layout="hybrid_gdn", num_layers=layers, attention_layers=full, **_attention_fields(get),
        state_layers=layers - full,
        state_intermediate=int(get("linear_value_head_dim")) * int(get("linear_num_value_heads")),
        state_groups=int(get("linear_num_key_heads")), state_heads=int(get("linear_num_value_heads")),
        state_head_dim=int(get("linear_value_head_dim")), state_size=int(get("linear_key_head_dim")),
        conv_kernel=int(get("linear_conv_kernel_dim")), state_rule="mamba2", **common)


def _nemotron_h(get, need, common: dict, architecture: str, config_path: str) -> ModelGeometry:
    # NemotronHConfig: 'M' Mamba2, '*' attention, '-' MLP, 'E' MoE; mamba2_cache_params passes
    # intermediate = mamba_num_heads * mamba_head_dim, n_groups, ssm_state_size, conv_kernel.
    pattern = get("hybrid_override_pattern")
    if pattern is None:
        names = {"mamba": "M", "attention": "*", "mlp": "-", "moe": "E"}
        pattern = "".join(names.get(str(t), "?") for t in get("layers_block_type"))
    if any(ch not in "M*-E" for ch in str(pattern)):
        raise ModelConfigError(f"{architecture}: hybrid_override_pattern {pattern!r} has characters other "
                               "than M * - E", path=config_path)
    need(["num_attention_heads", "mamba_num_heads", "mamba_head_dim", "ssm_state_size"], "Nemotron-H")
    groups = get("n_groups") if get("n_groups") is not None else get("mamba_n_groups")
    kernel = get("conv_kernel") if get("conv_kernel") is not None else get("mamba_d_conv")
    missing = [name for name, value in (("n_groups (or mamba_n_groups)", groups),
                                        ("conv_kernel (or mamba_d_conv)", kernel)) if value is None]
    if missing:
        raise ModelConfigError(f"{architecture}: a Nemotron-H config needs {', '.join(missing)}",
                               path=config_path)
    heads, head_dim = int(get("mamba_num_heads")), int(get("mamba_head_dim"))
    return ModelGeometry(
        layout="nemotron_h", num_layers=len(pattern), attention_layers=str(pattern).count("*"),
        **_attention_fields(get), state_layers=str(pattern).count("M"),
        state_intermediate=heads * head_dim, state_groups=int(groups), state_heads=heads,
        state_head_dim=head_dim, state_size=int(get("ssm_state_size")), conv_kernel=int(kernel), state_rule="mamba2",
        **common)


def _falcon_h1(get, need, common: dict) -> ModelGeometry:
    # FalconH1Config: attention and Mamba2 in every layer; intermediate = mamba_d_ssm, else
    # mamba_expand * hidden_size; mamba_d_head "auto" = intermediate // mamba_n_heads.
    need(["num_hidden_layers", "num_attention_heads", "mamba_n_heads", "mamba_n_groups", "mamba_d_state",
          "mamba_d_conv"], "Falcon-H1")
    if get("mamba_d_ssm") is None:
        need(["mamba_expand", "hidden_size"], "Falcon-H1 (no mamba_d_ssm)")
        intermediate = int(get("mamba_expand") * get("hidden_size"))
    else:
        intermediate = int(get("mamba_d_ssm"))
    heads = int(get("mamba_n_heads"))
    head_dim = get("mamba_d_head", "auto")
    head_dim = intermediate // heads if head_dim in (None, "auto") else int(head_dim)
    layers = int(get("num_hidden_layers"))
    return ModelGeometry(
        layout="falcon_h1", num_layers=layers, attention_layers=layers, **_attention_fields(get),
        state_layers=layers, state_intermediate=intermediate, state_groups=int(get("mamba_n_groups")),
        state_heads=heads, state_head_dim=head_dim, state_size=int(get("mamba_d_state")),
        conv_kernel=int(get("mamba_d_conv")), state_rule="mamba2", **common)


def _state_family(entry, get, common: dict, config_path: str) -> ModelGeometry | None:
    """A state-cache family read through state_shapes.py; None when the config has no state layer (SGLang's
    ``mamba2_cache_params`` is then None and the model is plain: an all-attention Granite or LFM2)."""
    if get("num_hidden_layers") is None:
        raise ModelConfigError(f"{entry.name}: config.json has no num_hidden_layers", path=config_path)
    layers, state_layers, attention_layers = layer_split(entry, get, int(get("num_hidden_layers")), config_path)
    if state_layers == 0:
        return None
    fields = state_fields(entry, get, config_path)
    if entry.state_config not in READS_CONFIG_SSM_DTYPE:
        common = {**common, "config_ssm_dtype": None}  # mamba2_state_dtype(None): the config's value is ignored
    if get("kv_lora_rank") is not None:
        # ModelConfig's MLA branches for these architectures (Kimi-Linear, Bailing, GigaChat 3.5); Bailing 3 keeps
        # no rope part under use_mla_nope
        rope = 0 if entry.name.startswith("BailingMoeV3") and get("use_mla_nope") else int(get("qk_rope_head_dim"))
        attention = {"kv_heads": 1, "head_dim": 0, "v_head_dim": 0, "kv_lora_rank": int(get("kv_lora_rank")),
                     "qk_rope_head_dim": rope}
    elif attention_layers:
        attention = _attention_fields(get)
    else:
        attention = {"kv_heads": 0, "head_dim": 0, "v_head_dim": 0}
    layout = entry.state_config.removesuffix("Config").lower()
    return ModelGeometry(layout=layout, num_layers=layers, attention_layers=attention_layers,
                         state_layers=state_layers, **attention, **fields, **common)
