"""A model's shape, read from its ``config.json`` (with or without ``text_config``).

Covers what the simulated server must size: dense GQA/MHA (Llama/Qwen2/Qwen3-like), MLA
(DeepSeek: kv_lora_rank + qk_rope_head_dim), and hybrid full/linear attention with GatedDeltaNet
state (Qwen3-Next, Qwen3.5/3.6). Parameter counts are estimates used for speed and activations;
memory for weights always comes from the safetensors index, or without one from the safetensors files' headers.
The checkpoint's quantization (config.json, ModelOpt's hf_quant_config.json) decides the KV dtype under
``--kv-cache-dtype auto``; a text config's missing keys take its transformers class's defaults.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path

from sglang_sim.errors import SimModelConfigError
# configs/model_config.py::multimodal_model_archs and the archs ModelConfig turns off by default: one table,
# SGLang's, for the product and the simulator alike.
from sglang_sim.multimodal import MULTIMODAL_ARCHITECTURES, MULTIMODAL_OFF_BY_DEFAULT
from sglang_sim.statecfg import RecurrentState, read_state
from sglang_sim.quantcfg import checkpoint_quantization

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4, "fp8": 1,
               "float8_e4m3fn": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}
# get_context_length (docs/sglang-memory-model.md §1.6): first key found, times the rope factor
CONTEXT_KEYS = ("max_sequence_length", "seq_length", "max_seq_len", "model_max_length",
                "max_position_embeddings")
# configs/model_config.py::is_hybrid_swa_model, the architectures whose SWA split the simulator knows
# (get_hybrid_layer_ids): layer_types for the SWA_SINK_ARCHS, every 4th layer full for Llama 4. Each
# reports its window as models/<arch>.py::get_attention_sliding_window_size does (sliding_window - 1),
# Llama 4 as attention_chunk_size (load_model_utils.resolve_sliding_window_size).
SWA_BY_LAYER_TYPES = {"GptOssForCausalLM", "GraniteSWAForCausalLM", "GraniteMoeSWAForCausalLM", "IQuestQ1ForCausalLM"}
SWA_EVERY_FOURTH_FULL = {"Llama4ForConditionalGeneration"}
# What the transformers config class SGLang builds (utils/hf_transformers/config.py, AutoConfig) gives the keys a
# text config leaves out, per model_type: Gemma3TextConfig's defaults (transformers 5.19). "rope_by_layer_type":
# the class keys rope_scaling by layer type (sliding_attention/full_attention), so get_context_length finds no
# "factor" at its top level and applies none.
TEXT_CONFIG_DEFAULTS = {
    "gemma3_text": {"vocab_size": 262_208, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
                    "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
                    "max_position_embeddings": 131_072, "sliding_window": 4096, "tie_word_embeddings": True,
                    "rope_by_layer_type": True},
}
# The checkpoint's quantization files: ModelOpt's beside config.json (configs/model_config.py::_parse_quant_hf_config).
QUANT_CONFIG_FILE = "hf_quant_config.json"
INDEX_FILE = "model.safetensors.index.json"
# Models whose every layer is a Mamba layer (statecfg.py): no attention heads in config.json, no KV cache.
STATE_ONLY = {"MambaForCausalLM", "FalconMambaForCausalLM", "Mamba2ForCausalLM"}
# Vision hidden size of the tower a config class builds when config.json has no vision_config.
DEFAULT_VISION_HIDDEN = {"Qwen3_5ForConditionalGeneration": 1152, "Qwen3_5MoeForConditionalGeneration": 1152}


@dataclass(frozen=True)
class LinearAttention:
    """GatedDeltaNet (Mamba2-style) state shape per linear-attention layer (docs/sglang-memory-model.md §2.3, §4)."""

    num_key_heads: int
    num_value_heads: int
    key_head_dim: int
    value_head_dim: int
    conv_kernel: int
    ssm_dtype: str  # config's mamba_ssm_dtype, float32 when absent

    def conv_dim(self, tp: int) -> int:
        n_groups = self.num_key_heads
        if n_groups % tp:
            n_groups = tp  # extra groups so heads shard evenly
        return self.value_head_dim * self.num_value_heads + 2 * n_groups * self.key_head_dim

    def conv_bytes(self, tp: int, conv_dtype_bytes: int = 2) -> int:
        return self.conv_dim(tp) // tp * (self.conv_kernel - 1) * conv_dtype_bytes

    def ssm_bytes(self, tp: int, ssm_dtype_bytes: int) -> int:
        return self.num_value_heads // tp * self.value_head_dim * self.key_head_dim * ssm_dtype_bytes


@dataclass(frozen=True)
class ModelShape:
    architecture: str
    model_type: str
    dtype_bytes: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    v_head_dim: int
    vocab_size: int
    derived_context_length: int
    full_attention_layers: int  # layers holding a KV cache
    dense_ffn_size: int          # intermediate size of dense MLP layers (0 if none)
    moe_layers: int
    num_experts: int
    experts_per_token: int
    moe_ffn_size: int
    shared_ffn_size: int
    tie_word_embeddings: bool
    mtp_layers: int              # mtp_num_hidden_layers or num_nextn_predict_layers (0 if none)
    kv_lora_rank: int = 0        # MLA only
    qk_rope_head_dim: int = 0
    q_lora_rank: int = 0
    linear: LinearAttention | RecurrentState | None = None
    eos_token_id: int | None = None
    # ModelConfig.num_nextn_predict_layers: the only MTP key SGLang reads off the target config
    # (Qwen3.5/3.6 name theirs mtp_num_hidden_layers, which it does not read); None when absent.
    nextn_predict_layers: int | None = None
    # configs/model_config.py::is_multimodal_model (architecture list) and hf_config.vision_config:
    # (layers, hidden size) of the vision tower the VLM mem-fraction factor reads, None without one.
    is_multimodal: bool = False
    vision_tower: tuple[int, int] | None = None
    mamba_layers: int | None = None  # Mamba2 hybrids: layers holding state (None: every non-attention layer)
    # The checkpoint's quantization method (quant_method as the checkpoint names it, a ModelOpt quant_algo mapped
    # to modelopt_fp8 / modelopt_fp4) and the KV-cache algorithm its config carries ("FP8": an FP8 KV cache
    # under --kv-cache-dtype auto, mem_cache/kv_cache_dtype.py); None when unquantized.
    quantization: str | None = None
    kv_cache_quant_algo: str | None = None
    # Hybrid SWA: the layers SGLang keeps in its SWA pool (counted in full_attention_layers too), their
    # KV heads and head dims, and the model's window.
    swa_layers: int = 0
    swa_kv_heads: int = 0
    swa_head_dim: int = 0
    swa_v_head_dim: int = 0
    sliding_window_size: int | None = None

    def __post_init__(self) -> None:
        if min(self.hidden_size, self.num_layers, self.num_heads, self.vocab_size) <= 0:
            raise ValueError(f"model shape has a non-positive size: {self}")
        # a pure Mamba model keeps no KV at all
        lowest = 0 if self.linear is not None else 1
        if not lowest <= self.full_attention_layers <= self.num_layers:
            raise ValueError(f"full_attention_layers {self.full_attention_layers} not in {lowest}..{self.num_layers}")

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def is_hybrid(self) -> bool:
        return self.linear is not None

    @property
    def linear_layers(self) -> int:
        if self.linear is None:
            return 0
        return self.mamba_layers if self.mamba_layers is not None else self.num_layers - self.full_attention_layers

    def kv_bytes_per_token(self, attn_tp: int, kv_dtype_bytes: int) -> int:
        """Full-attention KV cell of the target model (docs/sglang-memory-model.md §2.2), before any draft fold."""
        if self.is_mla:
            return (self.kv_lora_rank + self.qk_rope_head_dim) * self.full_attention_layers * kv_dtype_bytes
        heads = max(1, self.num_kv_heads // attn_tp)
        return heads * (self.head_dim + self.v_head_dim) * self.full_attention_layers * kv_dtype_bytes

    def swa_split_bytes_per_token(self, attn_tp: int, kv_dtype_bytes: int) -> tuple[int, int]:
        """(full-pool cell over the full layers, SWA-pool cell over the SWA layers) of a hybrid-SWA model
        (``HybridSWAPoolConfigurator._full_per_token`` / ``_swa_per_token`` times their layer counts)."""
        per_layer = self.kv_bytes_per_token(attn_tp, kv_dtype_bytes) // self.full_attention_layers
        swa_per_layer = max(1, self.swa_kv_heads // attn_tp) * (self.swa_head_dim + self.swa_v_head_dim) * kv_dtype_bytes
        return per_layer * (self.full_attention_layers - self.swa_layers), swa_per_layer * self.swa_layers

    def mamba_bytes_per_slot(self, tp: int, ssm_dtype_bytes: int) -> tuple[int, int]:
        """(conv bytes, ssm bytes) of one state slot over all linear layers; (0, 0) if not hybrid."""
        if self.linear is None:
            return 0, 0
        return (self.linear.conv_bytes(tp) * self.linear_layers,
                self.linear.ssm_bytes(tp, ssm_dtype_bytes) * self.linear_layers)

    # ---- parameter estimates (speed and activation models only) ----
    def _attention_params(self) -> int:
        h = self.hidden_size
        if self.is_mla:
            qk = self.head_dim  # qk_nope + rope folded into head_dim by from_config
            q = h * self.q_lora_rank + self.q_lora_rank * self.num_heads * qk if self.q_lora_rank \
                else h * self.num_heads * qk
            kv = h * (self.kv_lora_rank + self.qk_rope_head_dim) + \
                self.kv_lora_rank * self.num_heads * (qk - self.qk_rope_head_dim + self.v_head_dim)
            return q + kv + self.num_heads * self.v_head_dim * h
        return h * self.num_heads * self.head_dim * 2 + 2 * h * self.num_kv_heads * self.head_dim

    def _linear_params(self) -> int:
        lin = self.linear
        if lin is None:
            return 0
        qkvz = 2 * lin.num_key_heads * lin.key_head_dim + 2 * lin.num_value_heads * lin.value_head_dim
        return self.hidden_size * (qkvz + 2 * lin.num_value_heads) + \
            lin.num_value_heads * lin.value_head_dim * self.hidden_size + lin.conv_dim(1) * lin.conv_kernel

    def _ffn_params(self, active: bool) -> int:
        h = self.hidden_size
        dense = (self.num_layers - self.moe_layers) * 3 * h * self.dense_ffn_size
        experts = self.experts_per_token if active else self.num_experts
        moe = self.moe_layers * (3 * h * (experts * self.moe_ffn_size + self.shared_ffn_size)
                                 + h * self.num_experts)
        return dense + moe

    def param_count(self, *, active: bool = False) -> int:
        embed = self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2)
        attn = self.full_attention_layers * self._attention_params() + self.linear_layers * self._linear_params()
        per_layer_ffn = self._ffn_params(active) / max(1, self.num_layers)
        mtp = self.mtp_layers * (self._attention_params() + per_layer_ffn + 2 * self.hidden_size ** 2)
        return int(embed + attn + self._ffn_params(active) + mtp)


def _vision_tower(config: dict, architecture: str) -> tuple[int, int] | None:
    """(num_hidden_layers, hidden_size) as ``adjust_mem_fraction_for_vlm`` reads them: getattr with
    defaults 24 and 1024. Qwen3.5 configs without a vision_config get Qwen3_5VisionConfig's defaults
    (configs/qwen3_5.py: a Qwen3VLVisionConfig with hidden_size 1152 and no num_hidden_layers)."""
    vision = config.get("vision_config")
    if not isinstance(vision, dict):
        if architecture not in DEFAULT_VISION_HIDDEN:
            return None
        vision = {}
    hidden = vision.get("hidden_size", DEFAULT_VISION_HIDDEN.get(architecture, 1024))
    return int(vision.get("num_hidden_layers", 24)), int(hidden)


def _first(d: dict, *keys, default=None):
    for key in keys:
        if d.get(key) is not None:
            return d[key]
    return default


def _context_length(text: dict) -> int:
    rope = text.get("rope_scaling") or {}
    if text.get("rope_by_layer_type"):
        rope = {}
    factor = rope.get("factor", 1) if isinstance(rope, dict) else 1
    if isinstance(rope, dict) and ("original_max_position_embeddings" in rope or
                                   rope.get("rope_type") == "llama3"):
        factor = 1
    for key in CONTEXT_KEYS:
        if text.get(key) is not None:
            return int(factor * text[key])
    return 2048


# NemotronHConfig's block names and the hybrid_override_pattern characters they stand for.
NEMOTRON_H_BLOCKS = {"mamba": "M", "attention": "*", "mlp": "-", "moe": "E"}


def _mamba2_state(text: dict, layers: int) -> tuple[LinearAttention, int, int] | None:
    """Mamba2 hybrids as SGLang's configs describe them to ``Mamba2StateShape.create``: Nemotron-H (a layer
    pattern, ``M`` Mamba2 and ``*`` attention, or the ``layers_block_type`` list) and Falcon-H1 (attention and
    Mamba2 in every layer).
    Returns (state shape, attention layers, Mamba layers), None for other models."""
    ssm_dtype = str(text.get("mamba_ssm_dtype") or "float32")
    pattern = text.get("hybrid_override_pattern")
    blocks = text.get("layers_block_type")
    if isinstance(blocks, list) and text.get("model_type") == "nemotron_h":
        # configs/nemotron_h.py::_resolve_layers_block_type: the list newer configs give wins over the pattern
        pattern = "".join(NEMOTRON_H_BLOCKS.get(str(block), "?") for block in blocks)
    if pattern:
        shape = LinearAttention(int(text["n_groups"]), int(text["mamba_num_heads"]), int(text["ssm_state_size"]),
                                int(text["mamba_head_dim"]), int(text.get("conv_kernel", 4)), ssm_dtype)
        return shape, pattern.count("*"), pattern.count("M")
    if text.get("model_type") == "falcon_h1" or text.get("mamba_d_ssm") is not None:
        heads = int(text["mamba_n_heads"])
        inner = int(text.get("mamba_d_ssm") or int(text.get("mamba_expand", 2)) * int(text["hidden_size"]))
        head_dim = text.get("mamba_d_head")
        head_dim = inner // heads if head_dim in (None, "auto") else int(head_dim)
        shape = LinearAttention(int(text["mamba_n_groups"]), heads, int(text["mamba_d_state"]), head_dim,
                                int(text.get("mamba_d_conv", 4)), ssm_dtype)
        return shape, layers, layers
    return None


def from_config(config: dict, *, path: str | None = None) -> ModelShape:
    text = config.get("text_config") or config
    text = {**TEXT_CONFIG_DEFAULTS.get(str(text.get("model_type")), {}), **text}
    try:
        hidden = int(text["hidden_size"])
        layers = int(text["num_hidden_layers"])
        architecture = str((config.get("architectures") or text.get("architectures") or ["unknown"])[0])
        # pure Mamba checkpoints name no attention heads
        heads = int(text["num_attention_heads"]) if architecture not in STATE_ONLY else 1
        vocab = int(_first(text, "vocab_size", default=config.get("vocab_size")))
    except (KeyError, TypeError, ValueError) as exc:
        raise SimModelConfigError(f"config.json lacks a required key: {exc}", path=path,
                               hint="hidden_size, num_hidden_layers, num_attention_heads and vocab_size are needed") from exc
    dtype = str(_first(text, "dtype", "torch_dtype", default=_first(config, "dtype", "torch_dtype",
                                                                      default="bfloat16")))
    kv_heads = int(_first(text, "num_key_value_heads", default=heads))
    head_dim = int(_first(text, "head_dim", default=hidden // heads))
    kv_lora = int(text.get("kv_lora_rank") or 0)
    rope_dim = int(text.get("qk_rope_head_dim") or 0)
    v_head = head_dim
    if kv_lora:
        head_dim = int(text.get("qk_nope_head_dim", 128)) + rope_dim
        v_head = int(text.get("v_head_dim", 128))

    linear = None
    full_layers = layers
    if text.get("linear_num_value_heads"):
        interval = text.get("full_attention_interval")
        if interval:
            full_layers = sum(1 for i in range(layers) if (i + 1) % int(interval) == 0)
        elif text.get("layer_types"):
            full_layers = sum(1 for t in text["layer_types"] if t == "full_attention")
        else:
            raise SimModelConfigError("hybrid config has neither full_attention_interval nor layer_types",
                                   path=path, hint="add full_attention_interval (e.g. 4) to config.json")
        linear = LinearAttention(int(text["linear_num_key_heads"]), int(text["linear_num_value_heads"]),
                                 int(text["linear_key_head_dim"]), int(text["linear_value_head_dim"]),
                                 int(text.get("linear_conv_kernel_dim", 4)),
                                 str(text.get("mamba_ssm_dtype") or "float32"))

    mamba_layers = None
    mamba2 = _mamba2_state(text, layers)
    if mamba2 is not None:
        linear, full_layers, mamba_layers = mamba2
    family = read_state(architecture, text, path=path)
    if family is not None:
        linear, full_layers, mamba_layers = family

    experts = int(_first(text, "num_experts", "n_routed_experts", default=0) or 0)
    if experts:
        first_dense = int(text.get("first_k_dense_replace", 0))
        step = int(text.get("decoder_sparse_step", 1) or 1)
        dense_only = set(text.get("mlp_only_layers") or [])
        moe_layers = sum(1 for i in range(first_dense, layers) if (i + 1) % step == 0 and i not in dense_only)
        shared = int(_first(text, "shared_expert_intermediate_size", default=0) or 0) or \
            int(text.get("n_shared_experts", 0) or 0) * int(text.get("moe_intermediate_size", 0))
    else:
        moe_layers, shared = 0, 0
    eos = _first(text, "eos_token_id", default=config.get("eos_token_id"))
    nextn = text.get("num_nextn_predict_layers")
    swa: dict = {}
    if architecture in SWA_BY_LAYER_TYPES | SWA_EVERY_FOURTH_FULL and not linear and not kv_lora:
        if architecture in SWA_BY_LAYER_TYPES:
            count = sum(1 for t in (text.get("layer_types") or [])[:layers] if t == "sliding_attention")
            window = int(text["sliding_window"]) - 1 if text.get("sliding_window") is not None else None
        else:
            count = sum(1 for i in range(layers) if (i + 1) % 4)
            window = text.get("attention_chunk_size")
        swa_head = int(text.get("swa_head_dim") or head_dim)
        swa = {"swa_layers": count, "swa_kv_heads": int(text.get("swa_num_key_value_heads") or kv_heads),
               "swa_head_dim": swa_head, "swa_v_head_dim": int(text.get("swa_v_head_dim") or swa_head),
               "sliding_window_size": window}
    try:
        return ModelShape(
            architecture=architecture,
            # /model_info reports hf_config.model_type: the top-level config's (qwen3_5, not qwen3_5_text)
            model_type=str(config.get("model_type") or text.get("model_type") or "unknown"),
            dtype_bytes=DTYPE_BYTES.get(dtype, 2), hidden_size=hidden, num_layers=layers,
            num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim, v_head_dim=v_head,
            vocab_size=vocab, derived_context_length=_context_length(text),
            full_attention_layers=full_layers,
            dense_ffn_size=int(text.get("intermediate_size") or 0),
            moe_layers=moe_layers, num_experts=experts,
            experts_per_token=int(text.get("num_experts_per_tok", 0) or 0),
            moe_ffn_size=int(text.get("moe_intermediate_size", 0) or 0), shared_ffn_size=shared,
            tie_word_embeddings=bool(_first(text, "tie_word_embeddings",
                                            default=config.get("tie_word_embeddings", False))),
            mtp_layers=int(_first(text, "mtp_num_hidden_layers", "num_nextn_predict_layers", default=0) or 0),
            kv_lora_rank=kv_lora, qk_rope_head_dim=rope_dim,
            q_lora_rank=int(text.get("q_lora_rank") or 0), linear=linear,
            eos_token_id=eos[0] if isinstance(eos, list) and eos else (eos if isinstance(eos, int) else None),
            nextn_predict_layers=int(nextn) if nextn is not None else None,
            is_multimodal=architecture in MULTIMODAL_ARCHITECTURES - MULTIMODAL_OFF_BY_DEFAULT,
            vision_tower=_vision_tower(config, architecture), mamba_layers=mamba_layers, **swa,
        )
    except ValueError as exc:
        raise SimModelConfigError(str(exc), path=path) from exc


def safetensors_bytes(path: Path) -> int:
    """Tensor bytes one safetensors file declares: an 8-byte little-endian header length, then a JSON header
    whose entries (all but ``__metadata__``) span ``data_offsets``."""
    with open(path, "rb") as handle:
        prefix = handle.read(8)
        if len(prefix) < 8:
            raise SimModelConfigError("shorter than a safetensors header", path=str(path))
        header = json.loads(handle.read(int.from_bytes(prefix, "little")))
    return sum(end - start for key, entry in header.items() if key != "__metadata__"
               for start, end in [entry["data_offsets"]])


def load_model_dir(model_path: str | os.PathLike) -> tuple[ModelShape, dict, int | None]:
    """(shape, raw config, weights bytes from model.safetensors.index.json, else the safetensors files' headers,
    else None)."""
    root = Path(model_path)
    config_file = root / "config.json"
    try:
        config = json.loads(config_file.read_text())
    except FileNotFoundError:
        raise SimModelConfigError(f"{root} does not appear to have a file named config.json",
                               path=str(config_file), hint="install one with `fleetgen-sim install-model`") from None
    except json.JSONDecodeError as exc:
        raise SimModelConfigError(f"config.json is not valid JSON: {exc}", path=str(config_file),
                               line=exc.lineno) from exc
    weights = None
    index_file = root / INDEX_FILE
    if index_file.exists():
        try:
            weights = int(json.loads(index_file.read_text())["metadata"]["total_size"])
        except (ValueError, KeyError, TypeError) as exc:
            raise SimModelConfigError(f"safetensors index has no metadata.total_size: {exc}",
                                   path=str(index_file)) from exc
    elif any(root.glob("*.safetensors")):
        # model_loader/weight_utils.py: without an index every *.safetensors file in the folder is loaded
        weights = sum(safetensors_bytes(path) for path in sorted(root.glob("*.safetensors")))
    quant_file = root / QUANT_CONFIG_FILE
    quant = json.loads(quant_file.read_text()) if quant_file.is_file() else None
    method, kv_algo = checkpoint_quantization(config, quant)
    shape = dataclasses.replace(from_config(config, path=str(config_file)), quantization=method,
                                kv_cache_quant_algo=kv_algo)
    return shape, config, weights
