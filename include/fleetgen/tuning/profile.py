"""Memory profile of a model under given launch options: the per-unit sizes the tuner plans with.

From the model's ``config.json`` (plain or with ``text_config``), its safetensors index and the SGLang
launch options, compute what SGLang 0.5.23 charges (docs/sglang-memory-model.md, sections cited per field):

- weights per GPU (2.1: target and draft weights are both inside the static budget);
- full-attention KV bytes per token, the MTP/draft layer folded in where SGLang folds it (2.2);
- linear-attention / Mamba state bytes per slot ``P`` (2.3, section 4);
- speculative intermediate bytes per running request ``P * D`` (2.3);
- state slots per running request, the ``ratio`` of the Mamba cap (2.3, section 3).

The arithmetic mirrors SGLang's code paths named in the comments; nothing here imports the simulator.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from fleetgen.errors import ModelConfigError
from fleetgen.tuning.architectures import architecture, names_with
from fleetgen.tuning.geometry import (DEFAULT_SWA_FULL_TOKENS_RATIO, DTYPE_BYTES, LANGUAGE_MODEL_ONLY_ARCHITECTURES,
                                      ModelGeometry, model_geometry)
from fleetgen.tuning.options import LaunchOptions
from fleetgen.tuning.quantization import checkpoint_quantization
from fleetgen.tuning.state_shapes import state_elements

__all__ = ["LaunchOptions", "MemoryProfile", "ModelGeometry", "profile_model", "profile_geometry",
           "weights_bytes_from_index", "MIB", "GIB"]

MIB = 1 << 20
GIB = 1 << 30
# Conv state dtype: env SGLANG_MAMBA_CONV_DTYPE, default bfloat16 (mamba_utils.mamba2_state_dtype).
CONV_STATE_BYTES = 2
# kv_cache_configurator.mm_runtime_reservation_gb: SGLANG_VLM_CACHE_SIZE_MB (100) for any multimodal
# model, plus SGLANG_MM_FEATURE_CACHE_MB (1024) with a GPU feature transport.
VLM_CACHE_MIB = 100
MM_FEATURE_CACHE_MIB = 1024
# --mamba-full-memory-ratio fallback (docs/sglang-memory-model.md §1; arg_groups/fields/schedule.py).
DEFAULT_MAMBA_FULL_MEMORY_RATIO = 0.9
# Architectures whose path-less MTP draft SGLang builds by rewriting the target config (architectures.py).
MTP_REWRITE_ARCHITECTURES = names_with("mtp_draft_rewrite")
# configs/model_config.py::_STR_DTYPE_TO_TORCH_DTYPE: the config dtypes SGLang recognises.
_CONFIG_DTYPES = {"half": "float16", "float16": "float16", "float": "float32", "float32": "float32",
                  "bfloat16": "bfloat16"}
_KV_DTYPE_BYTES = {"bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2, "half": 2, "float32": 4,
                   "fp8_e4m3": 1, "fp8_e5m2": 1}


@dataclass(frozen=True)
class MemoryProfile:
    """Per-unit sizes for one model under one set of launch options (all bytes, per GPU)."""

    architecture: str
    layout: str
    is_hybrid: bool
    tp_size: int
    weights_bytes_total: int
    weights_bytes_per_gpu: int
    kv_dtype_bytes: int
    kv_bytes_per_token: int            # what SGLang's budget charges per token (2.2 cell, fold included)
    draft_kv_bytes_per_token_outside: int  # draft pool SGLang allocates outside that budget (0 if folded)
    state_bytes_per_slot: int          # P (2.3)
    state_conv_bytes_per_slot: int
    state_ssm_bytes_per_slot: int
    ssm_dtype: str | None
    state_slots_per_request: int       # ratio (2.3)
    radix_strategy: str | None         # resolved Mamba radix strategy, None when not hybrid / radix off
    overlap_schedule: bool
    spec_algorithm: str | None         # resolved (NEXTN -> EAGLE)
    spec_steps: int
    spec_topk: int
    draft_tokens: int                  # D, 0 without speculative decoding
    spec_bytes_per_request: int        # P * D (2.3); 0 for non-hybrids
    model_context_length: int
    multimodal_reserve_bytes: int      # mm_reservation (2.1)
    mamba_full_memory_ratio: float
    uses_mla: bool
    draft_model_layers: int | None = None  # a separate draft model's layer count (draft path given)
    draft_weights_bytes: int = 0           # a separate draft model's weights, inside weights_bytes_total
    # The checkpoint's quantization as SGLang resolves it (quantization.py) and the KV-cache algorithm it
    # carries; "FP8" stores the KV cache in FP8 under --kv-cache-dtype auto (2.2).
    quantization: str | None = None
    kv_cache_quant_algo: str | None = None
    # Hybrid SWA pool (2.5): bytes per SWA-pool token over the SWA layers, the SWA/full token ratio and
    # the model's window; 0 / None when every layer keeps full KV (kv_bytes_per_token then covers them all).
    swa_kv_bytes_per_token: int = 0
    swa_full_tokens_ratio: float | None = None
    sliding_window_size: int | None = None
    notes: tuple[str, ...] = ()
    geometry: dict = field(default_factory=dict, compare=False)

    def to_dict(self) -> dict:
        data = asdict(self)
        data["notes"] = list(self.notes)
        return data

    @classmethod
    def from_dict(cls, data: dict) -> "MemoryProfile":
        values = dict(data)
        values["notes"] = tuple(values.get("notes", ()))
        return cls(**values)


def weights_bytes_from_index(index: dict, *, path: str = "model.safetensors.index.json") -> int:
    """Total weight bytes from a safetensors index (``metadata.total_size``)."""
    metadata = index.get("metadata") if isinstance(index, dict) else None
    total = metadata.get("total_size") if isinstance(metadata, dict) else None
    try:
        value = int(total)
    except (TypeError, ValueError):
        raise ModelConfigError(f"the safetensors index has no numeric metadata.total_size (found {total!r})",
                               path=path, hint="pass the model's model.safetensors.index.json; a single-file "
                               "checkpoint's weight bytes are the file size") from None
    if value <= 0:
        raise ModelConfigError(f"metadata.total_size is {value}, not a positive byte count", path=path)
    return value


def profile_model(config: dict, weights_bytes: int, options: LaunchOptions, *,
                  config_path: str = "config.json", draft_config: dict | None = None,
                  draft_weights_bytes: int = 0, hf_quant_config: dict | None = None) -> MemoryProfile:
    """Profile a model from its config.json dict. ``draft_config``/``draft_weights_bytes`` describe a
    separate draft model (``--speculative-draft-model-path``); a built-in MTP head needs neither.
    ``hf_quant_config``: the checkpoint's hf_quant_config.json (ModelOpt exports), None without one."""
    geometry = model_geometry(config, config_path=config_path)
    quantization = checkpoint_quantization(config, hf_quant_config, options.quantization, config_path=config_path)
    draft_layers = None
    if options.speculative_draft_model_path is not None:
        if draft_config is None:
            raise ModelConfigError("--speculative-draft-model-path is set but the draft's config.json was not "
                                   "given", path=options.speculative_draft_model_path,
                                   hint="read the draft model's config.json too and pass it as draft_config")
        draft_text = draft_config.get("text_config", draft_config)
        draft_layers = draft_text.get("num_nextn_predict_layers") or draft_text.get("num_hidden_layers")
        if draft_layers is None:
            raise ModelConfigError("the draft config has neither num_nextn_predict_layers nor num_hidden_layers",
                                   path=f"{options.speculative_draft_model_path}/config.json")
    return profile_geometry(geometry, weights_bytes, options, draft_layers=draft_layers,
                            draft_weights_bytes=draft_weights_bytes, config_path=config_path,
                            quantization=quantization.method, kv_cache_quant_algo=quantization.kv_cache_quant_algo)


def profile_geometry(geometry: ModelGeometry, weights_bytes: int, options: LaunchOptions, *,
                     draft_layers: int | None = None, draft_weights_bytes: int = 0,
                     config_path: str = "config.json", quantization: str | None = None,
                     kv_cache_quant_algo: str | None = None) -> MemoryProfile:
    """The profile from already-read geometry (the tuner re-profiles with changed options)."""
    if weights_bytes <= 0:
        raise ModelConfigError(f"weights bytes must be positive, got {weights_bytes}", path=config_path)
    tp = options.tp_size
    notes: list[str] = []
    if options.language_model_only and geometry.architecture not in LANGUAGE_MODEL_ONLY_ARCHITECTURES:
        # arg_groups/model_hook.py::handle_language_model_only raises before anything loads.
        raise ModelConfigError(f"{geometry.architecture}: SGLang 0.5.23 refuses --language-model-only for this "
                               f"architecture (supported: {', '.join(sorted(LANGUAGE_MODEL_ONLY_ARCHITECTURES))})",
                               path=config_path, hint="drop --language-model-only from the extra SGLang args")
    kv_bytes = _kv_dtype_bytes(geometry, options, kv_cache_quant_algo)
    # Per-layer KV cell (2.2): MHA/GQA max(1, kv_heads // tp) * (head_dim + v_head_dim) * bytes;
    # MLA (kv_lora_rank + qk_rope_head_dim) * bytes, replicated on every TP rank.
    if geometry.is_mla:
        per_layer = (geometry.kv_lora_rank + geometry.qk_rope_head_dim) * kv_bytes
    else:
        per_layer = max(1, geometry.kv_heads // tp) * (geometry.head_dim + geometry.v_head_dim) * kv_bytes
    swa_pool = _swa_pool(geometry, options, kv_bytes, config_path)
    full_layers = geometry.attention_layers - (geometry.swa_layers if swa_pool else 0)
    cell = per_layer * full_layers

    spec = options.resolved_spec(geometry.architecture)
    steps, topk, draft_tokens = spec if spec else (0, 0, 0)
    algorithm = options.speculative_algorithm
    resolved_algorithm = "EAGLE" if algorithm == "NEXTN" else algorithm
    draft_outside = 0
    if options.eagle_family:
        folded_layers, outside_layers = _draft_kv_layers(geometry, options, draft_layers, config_path)
        # pool_configurator.DefaultPoolConfigurator: cell += int(cell * draft_layers / L_kv).
        if folded_layers and geometry.attention_layers:
            cell += int(cell * folded_layers / geometry.attention_layers)
        if outside_layers:
            draft_outside = per_layer * outside_layers
            notes.append(f"the {outside_layers}-layer MTP draft KV pool ({draft_outside} B/token) is allocated "
                         "outside SGLang's static budget: config.json has no num_nextn_predict_layers")

    conv_bytes = ssm_bytes = 0
    ssm_dtype = None
    if geometry.is_hybrid and not geometry.attention_layers and options.max_total_tokens is None:
        # DefaultPoolConfigurator: a zero KV cell sizes the token pool at --max-total-tokens, else the context length
        notes.append("no layer keeps KV (a pure Mamba model): SGLang's token pool is the context length unless "
                     "--max-total-tokens is given, which costs no memory; give it in the extra SGLang args to run more "
                     "requests at once")
    if geometry.is_hybrid:
        ssm_dtype = _ssm_dtype(geometry, options, notes)
        conv_bytes, ssm_bytes = _state_bytes_per_layer(geometry, tp, ssm_dtype, config_path)
        conv_bytes *= geometry.state_layers
        ssm_bytes *= geometry.state_layers
    state_bytes = conv_bytes + ssm_bytes
    ratio, strategy, overlap = _state_slots_per_request(geometry, options, config_path)

    context = geometry.context_length
    mm_reserve = 0
    if geometry.is_multimodal and not options.language_model_only:
        mm_reserve = VLM_CACHE_MIB * MIB
        if options.mm_feature_transport in ("cuda_ipc", "cuda_vmm"):
            mm_reserve += MM_FEATURE_CACHE_MIB * MIB
    total_weights = weights_bytes + draft_weights_bytes
    return MemoryProfile(
        architecture=geometry.architecture, layout=geometry.layout, is_hybrid=geometry.is_hybrid, tp_size=tp,
        weights_bytes_total=total_weights, weights_bytes_per_gpu=total_weights // tp,
        kv_dtype_bytes=kv_bytes, kv_bytes_per_token=cell, draft_kv_bytes_per_token_outside=draft_outside,
        state_bytes_per_slot=state_bytes, state_conv_bytes_per_slot=conv_bytes,
        state_ssm_bytes_per_slot=ssm_bytes, ssm_dtype=ssm_dtype, state_slots_per_request=ratio,
        radix_strategy=strategy, overlap_schedule=overlap, spec_algorithm=resolved_algorithm,
        spec_steps=steps, spec_topk=topk, draft_tokens=draft_tokens,
        spec_bytes_per_request=state_bytes * draft_tokens if geometry.is_hybrid else 0,
        model_context_length=context, multimodal_reserve_bytes=mm_reserve,
        mamba_full_memory_ratio=(options.mamba_full_memory_ratio
                                 if options.mamba_full_memory_ratio is not None
                                 else DEFAULT_MAMBA_FULL_MEMORY_RATIO),
        uses_mla=geometry.is_mla, draft_model_layers=draft_layers, draft_weights_bytes=draft_weights_bytes,
        quantization=quantization, kv_cache_quant_algo=kv_cache_quant_algo,
        swa_kv_bytes_per_token=swa_pool[0] if swa_pool else 0, swa_full_tokens_ratio=swa_pool[1] if swa_pool else None,
        sliding_window_size=geometry.sliding_window_size if swa_pool else None,
        notes=tuple(notes), geometry=geometry.to_dict())


def _swa_pool(geometry: ModelGeometry, options: LaunchOptions, kv_bytes: int,
              config_path: str) -> tuple[int, float] | None:
    """(bytes per SWA-pool token over the SWA layers, swa_full_tokens_ratio) when SGLang splits the KV
    cache into a full and an SWA pool (``pool_configurator.HybridSWAPoolConfigurator``), else None."""
    if options.disable_hybrid_swa_memory:
        return None
    if geometry.hybrid_swa_unmodeled:
        raise ModelConfigError(f"{geometry.architecture}: SGLang keeps a separate sliding-window KV pool for this "
                               "architecture with a layer split the tuner does not model", path=config_path,
                               hint="add --disable-hybrid-swa-memory to the extra SGLang args (every layer then keeps "
                                    "full KV), or plan this model by hand")
    if not geometry.is_hybrid_swa:
        return None
    if options.disable_radix_cache:
        raise ModelConfigError(f"{geometry.architecture}: with the radix cache off SGLang sizes the SWA pool from "
                               "the request cap (pool_configurator.SWARequestCapPoolConfigurator), which the tuner "
                               "does not model", path=config_path,
                               hint="drop --disable-radix-cache, or add --disable-hybrid-swa-memory")
    if options.spec_enabled:
        raise ModelConfigError(f"{geometry.architecture}: speculative decoding splits its draft layers between "
                               "SGLang's full and SWA pools in a way the tuner does not model", path=config_path,
                               hint="drop speculative decoding, or add --disable-hybrid-swa-memory")
    per_layer = max(1, geometry.swa_kv_heads // options.tp_size) * (geometry.swa_head_dim + geometry.swa_v_head_dim)
    ratio = (options.swa_full_tokens_ratio if options.swa_full_tokens_ratio is not None
             else DEFAULT_SWA_FULL_TOKENS_RATIO)
    return per_layer * kv_bytes * geometry.swa_layers, ratio


def _kv_dtype_bytes(geometry: ModelGeometry, options: LaunchOptions, kv_cache_quant_algo: str | None) -> int:
    if options.kv_cache_dtype != "auto":
        return _KV_DTYPE_BYTES[options.kv_cache_dtype]
    # kv_cache_dtype.py::configure_kv_cache_dtype: "auto" takes the checkpoint's FP8 KV (float8_e4m3fn).
    if isinstance(kv_cache_quant_algo, str) and kv_cache_quant_algo.upper() == "FP8":
        return _KV_DTYPE_BYTES["fp8_e4m3"]
    # "auto" stores KV in the model dtype.
    return DTYPE_BYTES[auto_model_dtype(geometry)]


def auto_model_dtype(geometry: ModelGeometry) -> str:
    """ModelConfig.dtype under --dtype auto (configs/model_config.py::_get_and_verify_dtype): the config's dtype,
    float32 when it names none SGLang knows (MiniMax-M2's config.json has no torch_dtype), and a float32 model runs
    in float16 ("the common practice"), a Gemma in bfloat16."""
    dtype = _CONFIG_DTYPES.get(geometry.model_dtype or "", "float32")
    if dtype == "float32":
        return "bfloat16" if geometry.model_type.startswith("gemma") else "float16"
    return dtype


def _draft_kv_layers(geometry: ModelGeometry, options: LaunchOptions, draft_layers: int | None,
                     config_path: str) -> tuple[int, int]:
    """(layers folded into the budgeted cell, layers of a draft pool allocated outside it).

    spec_aux_hidden_state._resolve_eagle_aux_hidden_state: with a draft path the draft's layer count
    is folded in; path-less, only the *target* config's ``num_nextn_predict_layers`` is read. Qwen3.5
    configs name their MTP head ``mtp_num_hidden_layers`` instead, so SGLang budgets no draft KV for
    them while the draft worker still builds its own 1-layer pool of the same token count (2.2).
    """
    if draft_layers is not None:
        return int(draft_layers), 0
    if geometry.nextn_predict_layers:
        return geometry.nextn_predict_layers, 0
    if options.speculative_algorithm in ("NEXTN", "EAGLE") and (
            geometry.mtp_hidden_layers or geometry.architecture in MTP_REWRITE_ARCHITECTURES):
        # The draft-mode config rewrite (ModelConfig, is_draft_model) gives these MTP heads
        # num_nextn_predict_layers = 1: a 1-layer draft pool the target's budget never saw.
        return 0, 1
    raise ModelConfigError(
        f"{geometry.architecture}: --speculative-algorithm {options.speculative_algorithm} without "
        "--speculative-draft-model-path needs a built-in MTP head, but config.json has neither "
        "num_nextn_predict_layers nor mtp_num_hidden_layers", path=config_path,
        hint="give the draft model path in the extra SGLang args, or drop speculative decoding")


def _ssm_dtype(geometry: ModelGeometry, options: LaunchOptions, notes: list[str]) -> str:
    # mamba2_state_dtype: the flag (env SGLANG_MAMBA_SSM_DTYPE) > config mamba_ssm_dtype > float32.
    if options.mamba_ssm_dtype is not None:
        return options.mamba_ssm_dtype
    configured = geometry.config_ssm_dtype
    if configured is None:
        return "float32"
    if configured not in DTYPE_BYTES:
        notes.append(f"config mamba_ssm_dtype {configured!r} is invalid; SGLang falls back to float32")
        return "float32"
    return configured


def _state_bytes_per_layer(geometry: ModelGeometry, tp: int, ssm_dtype: str,
                           config_path: str) -> tuple[int, int]:
    """One layer's (conv, temporal) bytes per slot: the family's shape rule (state_shapes.py, 2.3)."""
    elements = state_elements(geometry, tp, config_path)
    return elements.conv * CONV_STATE_BYTES, elements.temporal * DTYPE_BYTES[ssm_dtype]


def _state_slots_per_request(geometry: ModelGeometry, options: LaunchOptions,
                             config_path: str = "config.json") -> tuple[int, str | None, bool]:
    """(ratio, resolved radix strategy, overlap scheduling on) per 2.3 / section 3.

    ``auto`` resolves (overrides._mamba_radix_cache_resolution) only for the architectures the registry marks
    ``mamba_radix``: to extra_buffer when overlap scheduling is on or page_size > 1 and the architecture supports
    extra buffers, else to no_buffer with overlap scheduling turned off; for any other stateful architecture it
    stays ``auto`` and holds no tracking slot. Ratio: 1 with the radix cache off (the flag, or a model override
    that turns it off), else 3 + tracking slots (extra_buffer 2 with overlap, 1 without; extra_buffer_lazy 1;
    no_buffer 0).
    """
    overlap = not options.disable_overlap_schedule
    if not geometry.is_hybrid:
        return 1, None, overlap
    entry = architecture(geometry.architecture)
    if options.disable_radix_cache or entry.radix_cache_off:
        return 1, None, overlap
    strategy = options.mamba_radix_cache_strategy
    if not entry.mamba_radix:
        if strategy in ("extra_buffer", "extra_buffer_lazy"):
            # model_hook.py::handle_mamba_radix_cache, for an architecture the resolution pass does not cover
            raise ModelConfigError(f"--mamba-radix-cache-strategy {strategy} needs mamba state, got "
                                   f"{geometry.architecture}.", path=config_path,
                                   hint="drop --mamba-radix-cache-strategy from the extra SGLang args")
        return 3, None, overlap
    if strategy == "auto":
        if (overlap or (options.page_size or 1) > 1) and entry.mamba_extra_buffer:
            strategy = "extra_buffer"
        else:
            strategy, overlap = "no_buffer", False
    if strategy in ("extra_buffer", "extra_buffer_lazy") and not entry.mamba_extra_buffer:
        # mamba_hook.py::validate_mamba_extra_buffer
        raise ModelConfigError(f"extra_buffer is not supported for {geometry.architecture}; use no_buffer.",
                               path=config_path, hint="drop --mamba-radix-cache-strategy from the extra SGLang args")
    if strategy == "extra_buffer":
        return 3 + (2 if overlap else 1), strategy, overlap
    if strategy == "extra_buffer_lazy":
        if not overlap:
            raise ModelConfigError("--mamba-radix-cache-strategy extra_buffer_lazy needs overlap scheduling "
                                   "(SGLang asserts against --disable-overlap-schedule)",
                                   hint="drop --disable-overlap-schedule or use extra_buffer")
        return 4, strategy, overlap
    return 3, strategy, overlap
