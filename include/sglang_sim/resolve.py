"""From parsed flags to the values SGLang 0.5.23 actually runs with (docs/sglang-memory-model.md §1, §2.3).

This is the simulator's own reading of SGLang's start-up hooks: GPU-table defaults, automatic
``mem_fraction_static`` (with the VLM factor for multimodal architectures), CUDA-graph batch sizes,
speculative defaults and which draft KV layers the budget counts, the multimodal KV-budget
reservation, the Mamba radix-cache strategy and the context length. It shares no code with the
project's tuner on purpose.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass

from sglang_sim.modelcfg import DTYPE_BYTES, ModelShape

GIB_MIB = 1024
EAGLE_FAMILY = {"EAGLE", "EAGLE3", "STANDALONE"}
SPEC_MRR_DEFAULT_ALGOS = {"EAGLE", "EAGLE3", "STANDALONE", "NGRAM", "DFLASH", "DSPARK"}
SPEC_MRR_DEFAULT = 48
# architectures whose triton linear-attention kernels support extra_buffer (docs/sglang-memory-model.md §1.5)
EXTRA_BUFFER_MODEL_TYPES = {"qwen3_next", "qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text",
                            "kimi_linear", "falcon_h1", "nemotron_h", "granitemoehybrid", "bailing_hybrid"}
# arg_groups/overrides.py::_mamba_radix_cache_resolution runs only for these stateful architectures (plus
# GigaChat 3.5's linear-attention registry spec); for any other, --mamba-radix-cache-strategy auto stays auto:
# no tracking slot, overlap scheduling kept.
RADIX_RESOLVED_ARCHITECTURES = {
    "KimiLinearForCausalLM", "KimiK3ForConditionalGeneration", "BailingMoeV2_5ForCausalLM", "BailingMoeV3ForCausalLM",
    "BailingMoeV3VLForConditionalGeneration", "Qwen3NextForCausalLM", "Qwen3_5MoeForConditionalGeneration",
    "InternS2PreviewForConditionalGeneration", "InternS2MobiusForConditionalGeneration",
    "Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForCausalLM", "Qwen3_5ForCausalLM",
    "Qwen4ExpForConditionalGeneration", "MiniCPMV4_6ForConditionalGeneration", "MiniCPMV4_7ForConditionalGeneration",
    "NemotronHForCausalLM", "NemotronHPuzzleForCausalLM", "NemotronH_Omni_Reasoning_V3", "FalconH1ForCausalLM",
    "JetNemotronForCausalLM", "JetVLMForConditionalGeneration", "Lfm2ForCausalLM", "Lfm2MoeForCausalLM",
    "ZayaForCausalLM", "Glm5NextForConditionalGeneration", "GraniteMoeHybridForCausalLM", "GigaChat35ForCausalLM"}
# model_overrides/minicpm.py: MiniCPM-SALA's hybrid attention turns the radix cache off.
RADIX_OFF_ARCHITECTURES = {"MiniCPMSALAForCausalLM"}
# configs/model_config.py::ModelConfig._config_draft_model: a path-less MTP draft of these
# architectures is the target checkpoint rewritten with num_nextn_predict_layers = 1.
MTP_DRAFT_REWRITE_ARCHITECTURES = {
    "DeepseekV4ForCausalLM", "Glm5NextForConditionalGeneration", "MiMoV2ForCausalLM", "Qwen3NextForCausalLM",
    "Qwen4ExpForConditionalGeneration", "Qwen3MoeForCausalLM", "Qwen3_5ForConditionalGeneration",
    "Qwen3_5MoeForConditionalGeneration", "Qwen3_5ForCausalLM", "Qwen3_5MoeForCausalLM",
    "InternS2PreviewForConditionalGeneration", "InternS2MobiusForConditionalGeneration", "ExaoneMoEForCausalLM",
    "ExaoneMoeForCausalLM", "NemotronH_Omni_Reasoning_V3", "NemotronHForCausalLM", "NemotronHPuzzleForCausalLM",
    "HYV3ForCausalLM", "HYV4ForCausalLM"}
# mem_cache/kv_cache_configurator.py::mm_runtime_reservation_gb: envs SGLANG_VLM_CACHE_SIZE_MB (100) and,
# with a GPU feature transport, SGLANG_MM_FEATURE_CACHE_MB (1024) (environ.py defaults).
VLM_CACHE_MB_DEFAULT = 100
MM_FEATURE_CACHE_MB_DEFAULT = 1024
# Model overrides on SM100 (arg_groups/model_overrides/): Qwen3.5/3.6 and Qwen3-Next take trtllm_mha only
# with extra-buffer radix caching, the radix cache off or speculative decoding; Falcon-H1 always triton.
QWEN35_HYBRID_ARCHITECTURES = {"Qwen3NextForCausalLM", "Qwen3_5MoeForConditionalGeneration",
                               "Qwen3_5ForConditionalGeneration", "InternS2PreviewForConditionalGeneration",
                               "InternS2MobiusForConditionalGeneration"}
SM100_TRITON_ARCHITECTURES = {"FalconH1ForCausalLM", "JetNemotronForCausalLM", "JetVLMForConditionalGeneration"}
# model_overrides/granitemoehybrid.py (with Mamba layers) and lfm2.py: flashinfer on SM100.
SM100_FLASHINFER_ARCHITECTURES = {"GraniteMoeHybridForCausalLM", "Lfm2ForCausalLM", "Lfm2MoeForCausalLM"}
# model_overrides/deepseek_v2.py: the DeepSeek family (DSA variants aside) takes trtllm_mla on SM100 when no
# attention backend is given.
SM100_TRTLLM_MLA_ARCHITECTURES = {
    "DeepseekV3ForCausalLM", "DeepseekV32ForCausalLM", "KimiK25ForConditionalGeneration", "MistralLarge3ForCausalLM",
    "PixtralForConditionalGeneration", "GlmMoeDsaForCausalLM", "Glm5NextForConditionalGeneration", "HYV4ForCausalLM",
    "HYV4ForCausalLMNextN", "LongcatFlashForCausalLM", "LongcatFlashForCausalLMNextN", "Dots3NoteForCausalLM"}
# overrides.py::_mla_backend_page_constraints: page sizes each backend accepts; it moves any other to 64.
BACKEND_PAGE_SIZES = {"trtllm_mha": (16, 32, 64, 128), "trtllm_mla": (32, 64), "cutedsl_mla": (32, 64),
                      "flashmla": (64,), "hpc_ops": (64,)}
# overrides.py::_mla_kv_cache_dtype_checks, _cutedsl_prefill_backend_fill and attention_hook.py: the SM versions
# and --kv-cache-dtype values these backends start with (None: any), and the ValueErrors SGLang raises otherwise.
BACKEND_START_LIMITS = {
    "trtllm_mla": ((100,), ("fp8_e4m3", "bf16", "auto"), "TRTLLM MLA backend is only supported on Blackwell GPUs "
                   "(SM100/SM12x). Please use a different backend.",
                   "TensorRT-LLM MLA backend only supports kv-cache-dtype of fp8_e4m3, bf16, or auto."),
    "cutedsl_mla": ((100,), ("fp8_e4m3", "bf16", "bfloat16", "auto"), "CuteDSL MLA backend is only supported on "
                    "Blackwell GPUs (SM100). Please use a different backend.",
                    "CuteDSL MLA backend only supports kv-cache-dtype of fp8_e4m3, bf16, or auto."),
    "trtllm_mha": ((90, 100), None, "TRTLLM MHA backend for prefill requires Hopper (SM90), Blackwell (SM100), or "
                   "SM120 GPUs. Please use a different prefill backend.", None),
}
# model_overrides/gpt_oss.py, llama4.py: with no --attention-backend, trtllm_mha on SM100, fa3 on SM90,
# triton on other CUDA GPUs.
ARCH_PINNED_BACKEND = {"GptOssForCausalLM", "Llama4ForConditionalGeneration", "Llama4ForCausalLM"}
# arg_groups/fields/schedule.py: --swa-full-tokens-ratio falls back to 0.8.
SWA_FULL_TOKENS_RATIO_DEFAULT = 0.8
# configs/model_config.py::multimodal_breakable_cuda_graph_supported_model_archs (the ones modelled here)
BREAKABLE_PREFILL_MULTIMODAL = {"Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration",
                                "Qwen4ExpForConditionalGeneration", "KimiK25ForConditionalGeneration",
                                "Cohere2VisionForConditionalGeneration", "Glm5NextForConditionalGeneration",
                                "InternS2MobiusForConditionalGeneration", "PaddleOCRVLForConditionalGeneration",
                                "MuseGlimmerForConditionalGeneration", "MuseSparkForConditionalGeneration",
                                "KimiK3ForConditionalGeneration", "MiniMaxM3SparseForConditionalGeneration"}
# server_args.py::ServerArgs.LANGUAGE_MODEL_ONLY_ARCHITECTURES
LANGUAGE_MODEL_ONLY_ARCHITECTURES = ("DeepseekV4ForCausalLM", "MuseGlimmerForConditionalGeneration",
                                     "Cosmos3ForConditionalGeneration", "Cosmos3EdgeForConditionalGeneration")
SPEC_RESET_MESSAGE = ("Max running requests is reset to 48 for speculative decoding. You can override "
                      "this by explicitly setting --max-running-requests.")
DRAFT_ADJUST_MESSAGE = ("speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 when "
                        "speculative_eagle_topk == 1")


class LaunchError(Exception):
    """A start-up failure with SGLang's exception type and exact message."""

    def __init__(self, exc_type: str, message: str, *, kind: str, in_scheduler: bool) -> None:
        super().__init__(message)
        self.exc_type = exc_type
        self.message = message
        self.kind = kind
        self.in_scheduler = in_scheduler


@dataclass(frozen=True)
class Launch:
    tp: int
    dp: int
    attn_dp: int
    pp: int
    context_len: int
    page_size: int
    kv_dtype_bytes: int
    kv_dtype_name: str
    chunked_prefill_size: int          # -1: chunked prefill off
    max_prefill_tokens: int
    decode_graph: bool
    prefill_graph: bool
    decode_max_bs: int
    decode_bs: tuple[int, ...] | None  # explicit --cuda-graph-bs-decode
    prefill_bs: tuple[int, ...]        # prefill capture buckets
    mem_fraction_static: float
    mfs_reserved_mb: float | None      # the auto heuristic's reserve, None when given
    mfs_vlm_factor: float | None       # adjust_mem_fraction_for_vlm's factor on the auto value, if any
    max_running_requests: int | None   # user value, or the speculative default
    max_running_requests_user: int | None
    max_total_tokens: int | None
    spec_algorithm: str | None         # NEXTN already rewritten to EAGLE
    spec_steps: int
    spec_topk: int
    spec_draft_tokens: int
    draft_layers: int                  # eagle_draft_num_layers: folded into the budgeted KV cell (0: none)
    draft_kv_layers: int               # layers of the draft worker's own KV pool (0: no draft pool)
    mm_reservation_mb: float           # multimodal reservation taken from the KV budget
    radix_disabled: bool
    mamba_strategy: str                # resolved; "" for non-hybrid models
    overlap_disabled: bool
    max_mamba_cache_size: int | None   # user value
    mamba_full_memory_ratio: float
    ssm_dtype_bytes: int
    ssm_dtype_name: str
    messages: tuple[str, ...]          # log lines start-up hooks emit
    attention_backend: str = ""        # resolved --attention-backend ("": GPU generation unknown)
    hybrid_swa: bool = False           # ModelConfig.is_hybrid_swa: a separate SWA KV pool
    swa_full_tokens_ratio: float = SWA_FULL_TOKENS_RATIO_DEFAULT

    def __post_init__(self) -> None:
        if min(self.draft_layers, self.draft_kv_layers) < 0 or self.mm_reservation_mb < 0:
            raise ValueError("draft layer counts and the multimodal reservation must be >= 0")
        if min(self.tp, self.dp, self.attn_dp, self.pp) < 1:
            raise ValueError("parallel sizes must be >= 1")
        if not self.mem_fraction_static > 0:  # above 1 is accepted, as SGLang does; allocation then fails
            raise ValueError(f"mem_fraction_static must be > 0, got {self.mem_fraction_static}")
        if self.context_len < 1 or self.page_size < 1:
            raise ValueError("context_len and page_size must be >= 1")

    @property
    def attn_tp(self) -> int:
        return max(1, self.tp // self.attn_dp)

    @property
    def gpus_needed(self) -> int:
        return self.tp * self.pp * self.dp


def gpu_table(gpu_mem_mib: float | None, tp: int) -> tuple[int, int]:
    """(chunked_prefill_size, decode max_bs) defaults by GPU memory (docs/sglang-memory-model.md §1.1 table)."""
    if gpu_mem_mib is None:
        return 4096, 160
    if gpu_mem_mib < 20 * GIB_MIB:
        return 2048, 8
    if gpu_mem_mib < 35 * GIB_MIB:
        return 4096, 48 if tp < 4 else 160
    if gpu_mem_mib < 60 * GIB_MIB:
        return 4096, 32 if tp < 4 else 160
    if gpu_mem_mib < 160 * GIB_MIB:
        return 8192, 256 if tp < 4 else 512
    return 16384, 512


def prefill_buckets(max_bs: int) -> tuple[int, ...]:
    """Prefill CUDA-graph token buckets up to ``max_bs`` (74 for 16384, 58 for 8192)."""
    ranges = [(4, 32, 4), (48, 256, 16), (288, 512, 32), (576, 1024, 64), (1280, 4096, 256),
              (4608, max(4608, max_bs), 512)]
    return tuple(b for lo, hi, step in ranges for b in range(lo, hi + 1, step) if b <= max_bs)


def _context_len(args: argparse.Namespace, model: ModelShape, messages: list[str]) -> int:
    derived = model.derived_context_length
    wanted = args.context_length
    if wanted is None:
        return derived
    if wanted > derived:
        msg = (f"Warning: User-specified context_length ({wanted}) is greater than the derived "
               f"context_length ({derived}). This may lead to incorrect model outputs or CUDA errors. "
               f"Note that the derived context_length may differ from max_position_embeddings in the "
               f"model's config.")
        if os.environ.get("SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN", "").lower() in ("1", "true"):
            messages.append(msg)
            return wanted
        raise LaunchError("ValueError", f"{msg} To allow overriding this maximum, set the env var "
                          "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1", kind="context_length",
                          in_scheduler=False)
    return wanted


def _spec(args: argparse.Namespace, model: ModelShape, messages: list[str]) -> tuple:
    algo = args.speculative_algorithm
    if algo is None:
        return None, 0, 0, 0
    if algo == "NEXTN":
        algo = "EAGLE"
    steps, topk, draft = args.speculative_num_steps, args.speculative_eagle_topk, args.speculative_num_draft_tokens
    if steps is None and topk is None and draft is None:
        steps, topk, draft = (5, 4, 8) if model.architecture.startswith(("Llama", "Grok")) else (3, 1, 4)
    steps = 3 if steps is None else steps
    topk = 1 if topk is None else topk
    draft = steps + 1 if draft is None else draft
    if topk == 1 and draft != steps + 1:
        messages.append(DRAFT_ADJUST_MESSAGE)
        draft = steps + 1
    return algo, steps, topk, draft


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    try:
        return int(raw) if raw not in (None, "") else default
    except ValueError:
        raise LaunchError("ValueError", f"invalid literal for int() with base 10: {raw!r} (env {name})",
                          kind="env", in_scheduler=False) from None


def _large_hopper_qwen3_vl(model: ModelShape, sm: int | None, gpu_mem: float | None) -> bool:
    """``model_overrides/qwen3_vl.py::large_hopper_qwen3_vl_model_type``."""
    return sm == 90 and gpu_mem is not None and gpu_mem >= 60 * GIB_MIB and model.is_multimodal \
        and model.model_type in ("qwen3_vl", "qwen3_vl_moe")


def multimodal_reservation_mb(args: argparse.Namespace, model: ModelShape, hopper_vl: bool = False) -> float:
    """``mem_cache/kv_cache_configurator.py::mm_runtime_reservation_gb`` in MB: the VLM embedding cache, plus the
    feature-transport pool with a GPU transport, for models ``ModelConfig.is_multimodal`` calls
    multimodal (the architecture list, unless ``--language-model-only``)."""
    if not model.is_multimodal or args.language_model_only:
        return 0.0
    transport = args.mm_feature_transport
    feature_default = MM_FEATURE_CACHE_MB_DEFAULT
    if hopper_vl:
        # The Hopper Qwen3-VL serving defaults: no embedding cache, image features over CUDA IPC, and a
        # 3 GiB feature pool for >= 400 running requests.
        vlm_cache = _env_int("SGLANG_VLM_CACHE_SIZE_MB", 0)
        if transport is None and vlm_cache == 0:
            transport = "cuda_ipc"
        if args.max_running_requests is not None and args.max_running_requests >= 400 and vlm_cache == 0:
            feature_default = 3 * 1024
    else:
        vlm_cache = _env_int("SGLANG_VLM_CACHE_SIZE_MB", VLM_CACHE_MB_DEFAULT)
    reserved = vlm_cache
    if transport in ("cuda_ipc", "cuda_vmm"):
        reserved += _env_int("SGLANG_MM_FEATURE_CACHE_MB", feature_default)
    return float(reserved)


def vlm_mem_fraction_factor(model: ModelShape) -> float | None:
    """``arg_groups/memory_hook.py::adjust_mem_fraction_for_vlm`` (pre-capture path): 0.95 times a
    factor in [0.8, 1.05] that falls by 10 % each time the vision tower's layers x hidden^2 doubles
    over ViT-L/14 (24 x 1024^2). None when hf_config has no vision_config (no adjustment)."""
    if model.vision_tower is None:
        return None
    layers, hidden = model.vision_tower
    complexity_ratio = (layers * hidden ** 2) / (24 * 1024 ** 2)
    dynamic = max(0.8, min(1.05, 1.0 - 0.1 * (complexity_ratio - 1.0)))
    return 0.95 * dynamic


def draft_kv_layers(algo: str | None, model: ModelShape, draft_model: ModelShape | None) -> tuple[int, int]:
    """(eagle_draft_num_layers folded into the target's budgeted KV cell, layers of the draft
    worker's own KV pool), per ``model_runner_components/spec_aux_hidden_state.py::
    _resolve_eagle_aux_hidden_state``.

    With a draft path both come from the draft checkpoint (its num_nextn_predict_layers, else its
    layer count). Path-less, the fold reads only the *target* ModelConfig's
    ``num_nextn_predict_layers`` (read from hf_text_config at ``ModelConfig.__init__``; every
    ModelConfig deep-copies the cached hf_config, so the draft-mode rewrite never reaches it).
    Qwen3.5/3.6 call their head ``mtp_num_hidden_layers``, so nothing is folded, while the draft
    worker still builds its pool from the draft-mode rewrite of the target
    (``configs/model_config.py::ModelConfig._config_draft_model``: num_nextn_predict_layers = 1 for the
    rewritten MTP architectures) with the target's token count. A hybrid draft's pool keeps one
    full-attention layer (``mem_cache/kv_cache_configurator.py::KVCacheConfigurator.
    _build_hybrid_linear_kv_pool``: layer ids ``[0]`` for a draft worker).
    """
    if algo not in EAGLE_FAMILY:
        return 0, 0
    if draft_model is not None:
        nextn = 1 if draft_model.architecture in MTP_DRAFT_REWRITE_ARCHITECTURES else draft_model.nextn_predict_layers
        layers = nextn if nextn is not None else draft_model.num_layers
        return layers, (1 if draft_model.is_hybrid and layers else layers)
    folded = model.nextn_predict_layers or 0
    draft_nextn = 1 if model.architecture in MTP_DRAFT_REWRITE_ARCHITECTURES else model.nextn_predict_layers
    pool = draft_nextn if draft_nextn is not None else model.mtp_layers
    return folded, (1 if model.is_hybrid and pool else pool)


def compute_capability(gpu_name: str | None) -> int | None:
    """The SM version SGLang's platform probes see, from the GPU's marketing name (None: unknown)."""
    name = (gpu_name or "").upper()
    for keys, sm in ((("B200", "B300"), 100), (("H100", "H200", "H20", "H800"), 90), (("L40", "L4 "), 89),
                     (("A100", "A800"), 80), (("A10", "A40"), 86)):
        if any(key in name for key in keys) or (sm == 89 and name.endswith(" L4")):
            return sm
    return None


def attention_backend(args: argparse.Namespace, model: ModelShape, sm: int | None, topk: int,
                      spec_on: bool) -> str:
    """``get_default_attn_backend`` plus the model overrides that replace it (qwen3_5.py, falcon_h1.py,
    deepseek_v2.py): what ``--attention-backend`` resolves to when it is not given."""
    if args.attention_backend:
        return args.attention_backend
    if model.architecture in ARCH_PINNED_BACKEND:
        return {90: "fa3", 100: "trtllm_mha"}.get(sm, "triton")
    if sm == 100 and model.architecture in SM100_TRTLLM_MLA_ARCHITECTURES:
        return "trtllm_mla"
    if model.is_mla:
        return "fa3" if sm == 90 else "flashinfer" if sm == 100 else "triton"
    if sm == 90 and topk <= 1:
        return "fa3"
    if sm != 100:
        return "flashinfer"
    if model.architecture in SM100_TRITON_ARCHITECTURES:
        return "triton"
    if model.architecture in SM100_FLASHINFER_ARCHITECTURES and model.is_hybrid:
        return "flashinfer"
    # the default is chosen before the speculative hook fills in top-k: with speculative decoding,
    # trtllm_mha needs --speculative-eagle-topk on the command line
    topk_known = not spec_on or args.speculative_eagle_topk is not None or args.speculative_algorithm == "DFLASH"
    default = "trtllm_mha" if topk <= 1 and topk_known else "flashinfer"
    if model.architecture in QWEN35_HYBRID_ARCHITECTURES:
        keeps_extra_buffer = args.mamba_radix_cache_strategy in ("extra_buffer", "extra_buffer_lazy")
        wants_trtllm = keeps_extra_buffer or args.disable_radix_cache or spec_on
        return "trtllm_mha" if default == "trtllm_mha" and wants_trtllm else "triton"
    return default


def _page_size(args: argparse.Namespace, backend: str) -> int:
    """``_mla_backend_page_constraints`` and ``_page_size_default``: trtllm_mha pages hold 16-128 tokens,
    trtllm_mla ones 32 or 64 (64 unless one of those is given); everything else defaults to 1."""
    allowed = BACKEND_PAGE_SIZES.get(backend)
    if allowed is not None:
        return args.page_size if args.page_size in allowed else 64
    return args.page_size or 1


def _check_backend_starts(backend: str, kv_cache_dtype: str, sm: int | None) -> None:
    """The backend's GPU and KV-dtype checks at argument resolution (an unknown GPU passes)."""
    if backend not in BACKEND_START_LIMITS:
        return
    sms, kv_dtypes, gpu_message, kv_message = BACKEND_START_LIMITS[backend]
    if sm is not None and sm not in sms:
        raise LaunchError("ValueError", gpu_message, kind="args", in_scheduler=False)
    if kv_dtypes is not None and kv_cache_dtype not in kv_dtypes:
        raise LaunchError("ValueError", kv_message, kind="args", in_scheduler=False)


def _check_no_buffer(page_size: int, overlap_disabled: bool, backend: str) -> None:
    """``arg_groups/mamba_hook.py::validate_mamba_no_buffer``: AssertionErrors at argument resolution."""
    for failed, message in ((page_size != 1, "no_buffer only supports page_size=1."),
                            (not overlap_disabled, "no_buffer do not support overlap schedule. Try to set "
                                                   "disable_overlap_schedule=True."),
                            (backend == "trtllm_mha", "no_buffer do not support trtllm_mha attention backend.")):
        if failed:
            raise LaunchError("AssertionError", message, kind="args", in_scheduler=False)


def _prefill_sizes(args: argparse.Namespace, model: ModelShape, chunked: int) -> tuple[int, ...]:
    if args.cuda_graph_bs_prefill:
        return tuple(sorted(set(args.cuda_graph_bs_prefill)))
    prefill_max = args.cuda_graph_max_bs_prefill or (chunked if chunked != -1 else args.max_prefill_tokens)
    if model.is_mla:
        prefill_max = min(prefill_max, 8192)
    if args.max_total_tokens is not None:
        prefill_max = min(prefill_max, args.max_total_tokens)
    return prefill_buckets(prefill_max)


def _auto_mem_fraction(args: argparse.Namespace, model: ModelShape, gpu_mem: float | None, activation_tokens: int,
                       graph_mb: float, decode_max_bs: int, attn_dp: int) -> tuple[float, float, float | None]:
    """``memory_hook.handle_gpu_memory_settings``: (mem_fraction_static, reserved MB, VLM factor)."""
    if attn_dp > 1:
        graph_mb += 3 * decode_max_bs * attn_dp + (1.5 * decode_max_bs * attn_dp if decode_max_bs > 300 else 0)
    reserved = 512 + 1.5 * activation_tokens + args.tp_size * args.pp_size / 8 * 1024 + graph_mb
    if gpu_mem is not None and gpu_mem > 60 * GIB_MIB:
        reserved = max(reserved, 10240)
    if args.moe_a2a_backend == "deepep":
        reserved += 2048
    mfs = round((gpu_mem - reserved) / gpu_mem, 3) if gpu_mem else 0.95
    vlm_factor = None
    if model.is_multimodal and not args.language_model_only:
        vlm_factor = vlm_mem_fraction_factor(model)
        if vlm_factor is not None:
            mfs = mfs * vlm_factor  # not rounded again, as SGLang leaves it
    return mfs, reserved, vlm_factor


def _radix_strategy(args: argparse.Namespace, model: ModelShape, page_size: int, backend: str) -> tuple[str, bool]:
    """(resolved Mamba radix strategy, overlap scheduling off): ``_mamba_radix_cache_resolution``, then
    the no_buffer checks."""
    overlap_disabled = bool(args.disable_overlap_schedule)
    if not model.is_hybrid:
        return "", overlap_disabled
    strategy = args.mamba_radix_cache_strategy
    buffered = strategy in ("extra_buffer", "extra_buffer_lazy")
    if model.architecture not in RADIX_RESOLVED_ARCHITECTURES:
        if buffered and not args.disable_radix_cache:  # model_hook.py::handle_mamba_radix_cache
            raise LaunchError("ValueError", f"--mamba-radix-cache-strategy {strategy} needs mamba state, got "
                              f"{model.architecture}.", kind="args", in_scheduler=False)
        return strategy, overlap_disabled
    if buffered and model.model_type not in EXTRA_BUFFER_MODEL_TYPES and not args.disable_radix_cache:
        raise LaunchError("AssertionError", f"extra_buffer is not supported for {model.architecture}; use no_buffer.",
                          kind="args", in_scheduler=False)
    if strategy == "auto":
        supported = model.model_type in EXTRA_BUFFER_MODEL_TYPES
        if supported and (not overlap_disabled or page_size > 1):
            strategy = "extra_buffer"
        else:
            strategy, overlap_disabled = "no_buffer", True
    if strategy == "no_buffer" and not args.disable_radix_cache:
        _check_no_buffer(page_size, overlap_disabled, backend)
    return strategy, overlap_disabled


def _kv_dtype(args: argparse.Namespace, model: ModelShape) -> tuple[str, int]:
    # mem_cache/kv_cache_dtype.py::configure_kv_cache_dtype: "auto" takes the checkpoint's FP8 KV cache, else the
    # model dtype, which for a float32 config is float16 (a Gemma's bfloat16): configs/model_config.py's
    # _get_and_verify_dtype under --dtype auto
    auto = "float8_e4m3fn" if str(model.kv_cache_quant_algo or "").upper() == "FP8" else \
        "bfloat16" if model.dtype_bytes == 2 or model.model_type.startswith("gemma") else "float16"
    kv_name = {"auto": auto, "bf16": "bfloat16",
               "fp8_e4m3": "float8_e4m3fn", "fp8_e5m2": "float8_e5m2",
               "fp4_e2m1": "float4_e2m1fn_x2"}.get(args.kv_cache_dtype, args.kv_cache_dtype)
    return kv_name, {"float8_e4m3fn": 1, "float8_e5m2": 1, "float4_e2m1fn_x2": 1}.get(kv_name,
                                                                                     DTYPE_BYTES.get(kv_name, 2))


# configs/model_config.py::_verify_quantization, compatible_quantization_methods: a --quantization that may
# differ from the checkpoint's method.
COMPATIBLE_QUANTIZATION = {"modelopt_fp8": {"modelopt"}, "modelopt_fp4": {"modelopt", "fp8"},
                           "modelopt_mixed": {"modelopt"}, "nvfp4_online": {"fp8", "modelopt_fp8"},
                           "w8a8_int8": {"compressed-tensors"}, "w8a8_fp8": {"compressed-tensors"}}


def _check_quantization(args: argparse.Namespace, model: ModelShape) -> None:
    """ModelConfig refuses a --quantization that contradicts the checkpoint's (before anything loads)."""
    flag = (args.quantization or "").lower() or None
    if flag is None or model.quantization is None or flag == model.quantization:
        return
    if model.quantization in ("modelopt_fp8", "modelopt_fp4", "modelopt_mixed") and \
            flag not in ("nvfp4_online", "quark_mxfp4"):
        # base_config.py::_modelopt_override_quantization_method (ModelOptMixedPrecisionConfig's own for the mixed
        # method): the checkpoint's method wins
        return
    if model.quantization in COMPATIBLE_QUANTIZATION.get(flag, ()):
        return
    if flag in ("marlin", f"{model.quantization}_marlin"):
        return
    raise LaunchError("ValueError", "Quantization method specified in the model config "
                      f"({model.quantization}) does not match the quantization method specified in the "
                      f"`quantization` argument ({flag}).", kind="args", in_scheduler=False)


# get_min_capability of each method SGLang loads a checkpoint with (layers/quantization/*; AWQ and GPTQ load
# through Marlin on CUDA).
QUANTIZATION_MIN_SM = {"modelopt_fp8": 89, "modelopt_fp4": 80, "modelopt_mixed": 80, "fp8": 80, "mxfp4": 80,
                       "awq": 80, "gptq": 80, "compressed-tensors": 70}


def _check_quantization_capability(model: ModelShape, sm: int | None) -> None:
    """model_loader/loader.py refuses a GPU below the quantization method's minimum capability."""
    needed = QUANTIZATION_MIN_SM.get(model.quantization or "", 0)
    if sm is not None and sm < needed:
        raise LaunchError("ValueError", f"The quantization method {model.quantization} is not supported for the "
                          f"current GPU. Minimum capability: {needed}. Current capability: {sm}.", kind="args",
                          in_scheduler=True)


def resolve_launch(args: argparse.Namespace, model: ModelShape, gpu_totals_mib: list[int],
                   draft_model: ModelShape | None = None, gpu_name: str | None = None) -> Launch:
    """Apply SGLang's start-up hooks to parsed flags. ``gpu_totals_mib``: nvidia-smi memory.total
    of every GPU on the node (the heuristic reads the minimum); ``draft_model``: the checkpoint at
    ``--speculative-draft-model-path``, if one is given."""
    messages: list[str] = []
    if args.language_model_only and model.architecture not in LANGUAGE_MODEL_ONLY_ARCHITECTURES:
        raise LaunchError("ValueError", f"--language-model-only does not support ['{model.architecture}']. "
                          f"Supported: {list(LANGUAGE_MODEL_ONLY_ARCHITECTURES)}.", kind="args", in_scheduler=False)
    _check_quantization(args, model)
    _check_quantization_capability(model, compute_capability(gpu_name))
    ratio = args.swa_full_tokens_ratio
    if ratio is not None and not 0 < ratio <= 1.0:
        # arg_groups/kv_cache_hook.py::_handle_cache_compatibility
        raise LaunchError("ValueError", "--swa-full-tokens-ratio should be in range (0, 1.0].", kind="args",
                          in_scheduler=False)
    sm = compute_capability(gpu_name)
    tp, pp = args.tp_size, args.pp_size
    attn_dp, dp = args.attn_dp_size, args.dp_size
    if args.enable_dp_attention and dp > 1:  # old spelling: --dp-size N --enable-dp-attention
        attn_dp, dp = dp, 1
    context_len = _context_len(args, model, messages)
    gpu_mem = min(gpu_totals_mib) if gpu_totals_mib else None
    table_chunk, table_bs = gpu_table(gpu_mem, tp)

    chunked = args.chunked_prefill_size if args.chunked_prefill_size is not None else table_chunk
    if chunked != -1 and attn_dp > 1:
        chunked = max(1, chunked // attn_dp)
    decode_backend = "disabled" if args.disable_cuda_graph else (args.cuda_graph_backend_decode or "full")
    prefill_backend = "disabled" if args.disable_cuda_graph else (args.cuda_graph_backend_prefill or "breakable")
    if model.is_multimodal and not args.cuda_graph_backend_prefill and \
            model.architecture not in BREAKABLE_PREFILL_MULTIMODAL:
        # Breakable prefill graphs are off for multimodal models outside SGLang's allow-list
        # (cuda_graph_hook.disable_breakable_cudagraph_if_incompatible).
        prefill_backend = "disabled"
    decode_bs = tuple(sorted(set(args.cuda_graph_bs_decode))) if args.cuda_graph_bs_decode else None
    if decode_bs:
        decode_max_bs = max(decode_bs)
    elif args.cuda_graph_max_bs_decode is not None:
        decode_max_bs = args.cuda_graph_max_bs_decode
    else:
        decode_max_bs = table_bs
        if args.max_running_requests is not None and args.max_running_requests < decode_max_bs:
            decode_max_bs = args.max_running_requests
    activation_tokens = max(chunked, 2048) if chunked != -1 else args.max_prefill_tokens
    prefill_bs = _prefill_sizes(args, model, chunked)

    reserved = vlm_factor = None
    mfs = args.mem_fraction_static
    if mfs is None:
        graph = 0.0
        if decode_backend != "disabled":
            graph += 2 * decode_max_bs
        if prefill_backend != "disabled":
            graph += 1536 if model.is_mla else 8 * len(prefill_bs)
        mfs, reserved, vlm_factor = _auto_mem_fraction(args, model, gpu_mem, activation_tokens, graph, decode_max_bs,
                                                       attn_dp)

    algo, steps, topk, draft = _spec(args, model, messages)
    mrr = args.max_running_requests
    if algo in SPEC_MRR_DEFAULT_ALGOS and mrr is None:
        mrr = SPEC_MRR_DEFAULT
        messages.append(SPEC_RESET_MESSAGE)
    draft_layers, draft_pool_layers = draft_kv_layers(algo, model, draft_model)

    backend = attention_backend(args, model, sm, topk if algo else 1, algo is not None)
    page_size = _page_size(args, backend)
    _check_backend_starts(backend, args.kv_cache_dtype, sm)
    strategy, overlap_disabled = _radix_strategy(args, model, page_size, backend)
    ssm_name = args.mamba_ssm_dtype or (model.linear.ssm_dtype if model.linear else "float32")
    kv_name, kv_bytes = _kv_dtype(args, model)
    return Launch(
        tp=tp, dp=dp, attn_dp=attn_dp, pp=pp, context_len=context_len, page_size=page_size,
        kv_dtype_bytes=kv_bytes, kv_dtype_name=f"torch.{kv_name}",
        chunked_prefill_size=chunked, max_prefill_tokens=args.max_prefill_tokens,
        decode_graph=decode_backend != "disabled", prefill_graph=prefill_backend != "disabled",
        decode_max_bs=decode_max_bs, decode_bs=decode_bs, prefill_bs=prefill_bs,
        mem_fraction_static=mfs, mfs_reserved_mb=reserved, mfs_vlm_factor=vlm_factor,
        max_running_requests=mrr, max_running_requests_user=args.max_running_requests,
        max_total_tokens=args.max_total_tokens, spec_algorithm=algo, spec_steps=steps,
        spec_topk=topk, spec_draft_tokens=draft, draft_layers=draft_layers, draft_kv_layers=draft_pool_layers,
        mm_reservation_mb=multimodal_reservation_mb(args, model, hopper_vl=_large_hopper_qwen3_vl(model, sm, gpu_mem)),
        radix_disabled=bool(args.disable_radix_cache) or (model.architecture in RADIX_OFF_ARCHITECTURES
                                                          and model.is_hybrid), mamba_strategy=strategy,
        overlap_disabled=overlap_disabled, max_mamba_cache_size=args.max_mamba_cache_size,
        mamba_full_memory_ratio=0.9 if args.mamba_full_memory_ratio is None else args.mamba_full_memory_ratio,
        ssm_dtype_bytes=DTYPE_BYTES[ssm_name], ssm_dtype_name=ssm_name, messages=tuple(messages),
        attention_backend=backend if sm is not None or args.attention_backend else "",
        hybrid_swa=model.swa_layers > 0 and not args.disable_hybrid_swa_memory,
        swa_full_tokens_ratio=SWA_FULL_TOKENS_RATIO_DEFAULT if ratio is None else ratio,
    )
