"""What SGLang 0.5.23 decides from the GPU generation: the attention backend and its KV page size, and
the multimodal reservation of Qwen3-VL on large Hopper GPUs.

SGLang reads the compute capability; the tuner has nvidia-smi's GPU name, which names the generation.
The rules follow SGLang's own code:

- ``arg_groups/model_override_base.py::get_default_attn_backend``: MHA models get ``fa3`` on Hopper and
  ``trtllm_mha`` on SM100 (B200/B300/GB200) unless EAGLE top-k > 1; MLA models ``fa3`` on Hopper,
  ``flashinfer`` on SM100; ``flashinfer`` elsewhere.
- model overrides (``arg_groups/model_overrides/``): Qwen3.5/3.6 and Qwen3-Next on SM100 use
  ``trtllm_mha`` only when the radix cache keeps extra buffers, is off, or speculative decoding is on,
  else ``triton`` (``qwen3_5.py``); Falcon-H1 uses ``triton`` on SM100 (``falcon_h1.py``); DeepSeek-V3 and
  its family use ``trtllm_mla`` on SM100 (``deepseek_v2.py``).
- ``arg_groups/overrides.py::_mla_backend_page_constraints``: ``trtllm_mha`` needs a page of 16-128
  tokens, ``trtllm_mla`` one of 32 or 64, and both take 64 when none is given; every other backend here
  keeps page size 1.
- ``arg_groups/model_overrides/qwen3_vl.py``: Qwen3-VL on Hopper with >= 60 GiB turns the VLM embedding
  cache off and moves image features over CUDA IPC, whose GPU pool (``SGLANG_MM_FEATURE_CACHE_MB``) is
  1 GiB, 3 GiB at ``--max-running-requests`` >= 400.
"""

from __future__ import annotations

from dataclasses import dataclass

from fleetgen.tuning.architectures import names_with
from fleetgen.tuning.geometry import ModelGeometry
from fleetgen.tuning.options import LaunchOptions

# nvidia-smi name fragment -> SGLang's platform generation, most specific first.
_GENERATIONS = (("GB200", "sm100"), ("B300", "sm100"), ("B200", "sm100"), ("H200", "sm90"), ("H100", "sm90"),
                ("H800", "sm90"), ("H20", "sm90"), ("GH200", "sm90"), ("L40S", "sm89"), ("L40", "sm89"),
                ("L4", "sm89"), ("A100", "sm80"), ("A800", "sm80"), ("A10", "sm86"), ("A40", "sm86"))
# arg_groups/overrides.py::_mla_backend_page_constraints: the KV page sizes these backends take; any other page
# (the default 1 among them) becomes 64.
BACKEND_PAGE_SIZES = {"trtllm_mha": (16, 32, 64, 128), "trtllm_mla": (32, 64), "cutedsl_mla": (32, 64),
                      "flashmla": (64,), "hpc_ops": (64,)}
CONSTRAINED_BACKEND_DEFAULT_PAGE = 64
# The attention-backend rule of each architecture (architectures.py).
QWEN35_ARCHITECTURES = names_with("attention_backend", "qwen3_5")
TRITON_ON_SM100_ARCHITECTURES = names_with("attention_backend", "triton_on_sm100")
# model_overrides/granitemoehybrid.py, lfm2.py: flashinfer on SM100 when no backend is given (Granite only with a
# Mamba layer, which every hybrid geometry has).
FLASHINFER_ON_SM100_ARCHITECTURES = names_with("attention_backend", "flashinfer_on_sm100")
# model_overrides/gpt_oss.py, llama4.py: with no --attention-backend, trtllm_mha on SM100, fa3 on Hopper,
# triton elsewhere (CUDA), whatever the speculative top-k.
PINNED_BACKEND_ARCHITECTURES = names_with("attention_backend", "pinned")
PINNED_BACKENDS = {"sm100": "trtllm_mha", "sm90": "fa3"}
# model_overrides/deepseek_v2.py::_deepseek_family_overrides: without DSA sparse attention (which the geometry
# refuses) these take trtllm_mla on SM100 when no attention backend is given.
TRTLLM_MLA_ON_SM100_ARCHITECTURES = names_with("attention_backend", "trtllm_mla_on_sm100")
# Backends SGLang refuses to start outside some GPU generations or KV-cache dtypes, with its own reasons
# (overrides.py::_mla_kv_cache_dtype_checks / _cutedsl_prefill_backend_fill, attention_hook.py):
# backend -> (generations it runs on, --kv-cache-dtype values it takes (None: any), reasons).
BACKEND_LIMITS = {
    "trtllm_mla": (("sm100",), ("fp8_e4m3", "bf16", "auto"),
                   "TRTLLM MLA backend is only supported on Blackwell GPUs (SM100/SM12x)",
                   "TensorRT-LLM MLA backend only supports kv-cache-dtype of fp8_e4m3, bf16, or auto"),
    "cutedsl_mla": (("sm100",), ("fp8_e4m3", "bf16", "bfloat16", "auto"),
                    "CuteDSL MLA backend is only supported on Blackwell GPUs (SM100)",
                    "CuteDSL MLA backend only supports kv-cache-dtype of fp8_e4m3, bf16, or auto"),
    "trtllm_mha": (("sm90", "sm100"), None,
                   "TRTLLM MHA backend for prefill requires Hopper (SM90), Blackwell (SM100), or SM120 GPUs", None),
}
QWEN3_VL_HOPPER_TYPES = {"qwen3_vl", "qwen3_vl_moe"}
MM_FEATURE_CACHE_MIB = 1024
MM_FEATURE_CACHE_HIGH_CONCURRENCY_MIB = 3 * 1024
MM_FEATURE_CACHE_HIGH_CONCURRENCY_REQUESTS = 400


def gpu_generation(gpu_name: str) -> str | None:
    """``sm100`` / ``sm90`` / ``sm89`` / ``sm86`` / ``sm80`` from nvidia-smi's name, None if unknown."""
    upper = str(gpu_name).upper()
    for fragment, generation in _GENERATIONS:
        if fragment in upper:
            return generation
    return None


@dataclass(frozen=True)
class AttentionChoice:
    backend: str
    page_size: int


def attention_choice(geometry: ModelGeometry, options: LaunchOptions, generation: str | None) -> AttentionChoice:
    """The backend and page size SGLang resolves for ``options`` (the flags it will be given)."""
    backend = options.attention_backend or _default_backend(geometry, options, generation)
    page = options.page_size if options.page_size is not None else 1
    if backend in BACKEND_PAGE_SIZES and page not in BACKEND_PAGE_SIZES[backend]:
        page = CONSTRAINED_BACKEND_DEFAULT_PAGE
    return AttentionChoice(backend, page)


def backend_refusal(backend: str, kv_cache_dtype: str, generation: str | None) -> str | None:
    """SGLang's reason for refusing ``backend`` on this GPU generation with this ``--kv-cache-dtype``; None when
    it starts, or when the generation is unknown (the tuner cannot tell)."""
    if backend not in BACKEND_LIMITS:
        return None
    generations, kv_dtypes, gpu_reason, kv_reason = BACKEND_LIMITS[backend]
    if generation is not None and generation not in generations:
        return gpu_reason
    if kv_dtypes is not None and kv_cache_dtype not in kv_dtypes:
        return kv_reason
    return None


def _default_backend(geometry: ModelGeometry, options: LaunchOptions, generation: str | None) -> str:
    spec = options.resolved_spec(geometry.architecture)
    topk_one = spec is None or spec[1] == 1
    # get_default_attn_backend runs before the speculative defaults are chosen: trtllm_mha needs the
    # top-k given explicitly (or DFLASH) when speculative decoding is on.
    trtllm_allowed = topk_one and (spec is None or options.speculative_eagle_topk is not None
                                   or options.speculative_algorithm == "DFLASH")
    if geometry.architecture in PINNED_BACKEND_ARCHITECTURES:
        return PINNED_BACKENDS.get(generation or "", "triton")
    if generation == "sm100" and geometry.architecture in TRTLLM_MLA_ON_SM100_ARCHITECTURES:
        return "trtllm_mla"
    if geometry.is_mla:
        return {"sm90": "fa3", "sm100": "flashinfer"}.get(generation or "", "triton")
    if generation == "sm90" and topk_one:
        return "fa3"
    if generation != "sm100":
        return "flashinfer"
    if geometry.architecture in TRITON_ON_SM100_ARCHITECTURES:
        return "triton"
    if geometry.architecture in FLASHINFER_ON_SM100_ARCHITECTURES and geometry.is_hybrid:
        return "flashinfer"
    if not trtllm_allowed:
        return "triton" if geometry.architecture in QWEN35_ARCHITECTURES else "flashinfer"
    if geometry.architecture in QWEN35_ARCHITECTURES:
        extra_buffer = options.mamba_radix_cache_strategy in ("extra_buffer", "extra_buffer_lazy")
        if not (not extra_buffer and not options.disable_radix_cache and spec is None):
            return "trtllm_mha"
        return "triton"
    return "trtllm_mha"


def is_large_hopper_qwen3_vl(geometry: ModelGeometry, generation: str | None, gpu_total_mib: int) -> bool:
    return (generation == "sm90" and gpu_total_mib >= 60 * 1024 and geometry.is_multimodal
            and geometry.model_type in QWEN3_VL_HOPPER_TYPES)


def qwen3_vl_hopper_reserve_mib(max_running_requests: int | None) -> int:
    """The CUDA-IPC feature pool SGLang reserves out of the KV budget for Qwen3-VL on large Hopper."""
    if max_running_requests is not None and max_running_requests >= MM_FEATURE_CACHE_HIGH_CONCURRENCY_REQUESTS:
        return MM_FEATURE_CACHE_HIGH_CONCURRENCY_MIB
    return MM_FEATURE_CACHE_MIB
