"""SGLang 0.5.23's own memory arithmetic, mirrored: given the resolved flags and the memory SGLang will
measure, what pools it builds and what concurrency it allows.

- ``gpu_table`` / ``sglang_reserve_mb`` / ``auto_mem_fraction_static``: docs/sglang-memory-model.md §1.1
  (``arg_groups/memory_hook.py::handle_gpu_memory_settings``).
- ``size_pools``: docs/sglang-memory-model.md §2.1-§2.3 and §3 (``KVCacheConfigurator._profile_available_bytes``,
  ``_handle_max_mamba_cache``, ``DefaultPoolConfigurator.calculate_pool_sizes``,
  ``resolve_max_num_reqs``), computed in GiB floats in the same order as SGLang so that floors land
  on the same integers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fleetgen.tuning.profile import GIB, MIB, MemoryProfile

MAX_PREFILL_TOKENS_DEFAULT = 16384  # --max-prefill-tokens (docs/sglang-memory-model.md §1)
SPEC_DEFAULT_MAX_RUNNING_REQUESTS = 48  # speculative_hook: "reset to 48 for speculative decoding"
# Logical-page KV sharding scratch (page_interleave.compute_page_shard_scratch_bytes) is the only
# fixed overhead DefaultPoolConfigurator subtracts; it is 0 unless that sharding is turned on.
KV_FIXED_OVERHEAD_BYTES = 0


def gpu_table(gpu_mem_mib: int | None, tp_size: int) -> tuple[int, int]:
    """(chunked_prefill_size, decode cuda-graph max_bs) SGLang fills in by GPU size (1.1)."""
    if gpu_mem_mib is None:
        return 4096, 160
    if gpu_mem_mib < 20 * 1024:
        return 2048, 8
    if gpu_mem_mib < 35 * 1024:
        return 4096, 48 if tp_size < 4 else 160
    if gpu_mem_mib < 60 * 1024:
        return 4096, 32 if tp_size < 4 else 160
    if gpu_mem_mib < 160 * 1024:  # H100 (< 90 GiB) and H200/H20 rows are the same
        return 8192, 256 if tp_size < 4 else 512
    return 16384, 512


def prefill_graph_batch_sizes(max_bs: int) -> list[int]:
    """cuda_graph_hook.generate_prefill_cuda_graph_batch_sizes: 58 sizes for 8192, 74 for 16384."""
    sizes = (list(range(4, 33, 4)) + list(range(48, 257, 16)) + list(range(288, 513, 32))
             + list(range(576, 1025, 64)) + list(range(1280, 4097, 256)) + list(range(4608, max_bs + 1, 512)))
    return [s for s in sizes if s <= max_bs]


@dataclass(frozen=True)
class ReserveEstimate:
    """SGLang's estimate of activation and CUDA-graph memory, in MB as its code counts them (MiB)."""

    activation_tokens: int
    activation_mb: float
    base_mb: float
    parallel_mb: float
    decode_graph_mb: float
    prefill_graph_mb: float
    prefill_graph_sizes: int
    floor_mb: float  # 10240 on GPUs over 60 GiB, else 0
    total_mb: float

    @property
    def total_bytes(self) -> int:
        return math.ceil(self.total_mb * MIB)

    def formula(self) -> str:
        text = (f"512 + 1.5 x {self.activation_tokens} tok + {self.parallel_mb:g} (tp/8 GiB) + "
                f"{self.decode_graph_mb:g} (2 x decode bs) + {self.prefill_graph_mb:g} (prefill graphs)")
        if self.floor_mb and self.total_mb == self.floor_mb:
            text += f", floored to {self.floor_mb:g} MB (GPU > 60 GiB)"
        return text


def sglang_reserve_mb(*, gpu_mem_mib: int | None, chunked_prefill_size: int, decode_max_bs: int,
                      tp_size: int, uses_mla: bool, graphs_enabled: bool,
                      max_prefill_tokens: int = MAX_PREFILL_TOKENS_DEFAULT,
                      prefill_graph: bool = True) -> ReserveEstimate:
    """The 1.1 reserve: ``512 + 1.5 * activation_tokens + tp*pp/8*1024 + graph``, floored at 10240 MB
    on GPUs larger than 60 GiB. Prefill graphs capture up to chunked_prefill_size tokens (MLA: a flat
    1536 MB, its max_bs capped at 8192). ``prefill_graph`` False: SGLang turned the prefill graph off
    (multimodal models, ``cuda_graph_hook.disable_breakable_cudagraph_if_incompatible``)."""
    if chunked_prefill_size > 0:
        activation_tokens = max(chunked_prefill_size, 2048)
    else:
        activation_tokens = max(max_prefill_tokens, 2048)
    decode_mb = 2.0 * decode_max_bs if graphs_enabled else 0.0
    sizes = 0
    if not graphs_enabled or not prefill_graph:
        prefill_mb = 0.0
    elif uses_mla:
        prefill_mb = 1536.0
    else:
        sizes = len(prefill_graph_batch_sizes(chunked_prefill_size))
        prefill_mb = 8.0 * sizes
    parallel_mb = tp_size / 8 * 1024
    activation_mb = activation_tokens * 1.5
    total = 512 + activation_mb + parallel_mb + decode_mb + prefill_mb
    floor = 10 * 1024.0 if gpu_mem_mib is not None and gpu_mem_mib > 60 * 1024 else 0.0
    return ReserveEstimate(activation_tokens=activation_tokens, activation_mb=activation_mb, base_mb=512.0,
                           parallel_mb=parallel_mb, decode_graph_mb=decode_mb, prefill_graph_mb=prefill_mb,
                           prefill_graph_sizes=sizes, floor_mb=floor, total_mb=max(total, floor))


def auto_mem_fraction_static(gpu_mem_mib: int | None, reserve: ReserveEstimate,
                             vision: tuple[int, int] | None = None) -> float:
    """``round((gpu_mem - reserved) / gpu_mem, 3)`` (0.95 if the GPU size is unknown), then the VLM
    factor of ``adjust_mem_fraction_for_vlm`` when the model has a vision tower ``(layers, hidden)``."""
    mfs = round((gpu_mem_mib - reserve.total_mb) / gpu_mem_mib, 3) if gpu_mem_mib is not None else 0.95
    if vision is not None:
        layers, hidden = vision
        complexity = (layers * hidden ** 2) / (24 * 1024 ** 2)
        factor = max(0.8, min(1.05, 1.0 - 0.1 * (complexity - 1.0)))
        mfs = mfs * (0.95 * factor)  # SGLang multiplies by the combined factor: same float, same floors
    return mfs


@dataclass(frozen=True)
class PoolSizing:
    """What SGLang sizes for one server: pools, concurrency, or the failure it dies with."""

    mem_fraction_static: float
    pre_load_free_bytes: int
    static_budget_bytes: float       # pre-load free x mfs
    max_mamba_cache_size: int | None
    spec_requests: int               # requests the speculative buffers are sized for (before +1)
    state_bytes: int                 # (K + 1) x P
    spec_bytes: int                  # (spec_requests + 1) x D x P
    kv_budget_bytes: int             # what is left for KV after state and buffers
    max_total_num_tokens: int
    kv_bytes: int
    requested_max_running_requests: int | None
    effective_max_running_requests: int
    failure: str | None = None       # "oom_weights" | "oom_kv" | "oom_mamba" | "swa_pool"
    message: str | None = None
    swa_max_total_num_tokens: int | None = None  # the SWA pool's tokens (2.5), None without one
    swa_kv_bytes: int = 0

    @property
    def ok(self) -> bool:
        return self.failure is None


def size_pools(profile: MemoryProfile, *, pre_load_free_bytes: int, mem_fraction_static: float,
               max_running_requests: int | None, max_mamba_cache_size: int | None,
               context_length: int, page_size: int = 1, max_total_tokens: int | None = None,
               disable_radix_cache: bool = False) -> PoolSizing:
    """Pool sizes as SGLang computes them (2.1-2.3, 3). ``max_running_requests`` is the value SGLang
    holds after its hooks (the user's, or 48 under speculative decoding, or None)."""
    mfs = mem_fraction_static
    pre_gib = pre_load_free_bytes / GIB
    available_gib = (pre_load_free_bytes - profile.weights_bytes_per_gpu) / GIB
    slack_gib = pre_gib * (1 - mfs)
    # 2.1: rest = available - pre_load * (1 - mfs) - mm_reservation.
    rest = available_gib - slack_gib - profile.multimodal_reserve_bytes / GIB

    def failed(kind: str, message: str, *, k: int | None = None) -> PoolSizing:
        return PoolSizing(mfs, pre_load_free_bytes, pre_load_free_bytes * mfs, k, 0, 0, 0, 0, 0, 0,
                          max_running_requests, 0, kind, message)

    state_slot = profile.state_bytes_per_slot
    draft = profile.draft_tokens
    ratio = profile.state_slots_per_request
    k: int | None = None
    spec_requests = 0
    if profile.is_hybrid:
        k, spec_requests, rest = _mamba_slots(profile, rest, max_running_requests=max_running_requests,
                                              max_mamba_cache_size=max_mamba_cache_size,
                                              disable_radix_cache=disable_radix_cache)
        if k <= 0:
            return failed("oom_mamba", "Not enough GPU memory for hybrid (mamba/linear-attention) state cache. "
                          f"Computed max_mamba_cache_size={k} (total_rest_memory={rest:.2f} GB, "
                          f"mamba_cache_per_req={state_slot / MIB:.2f} MB).", k=k)
        rest -= (k + 1) * state_slot / GIB
    if rest <= 0:
        minimum = 1 - available_gib / pre_gib
        return failed("oom_weights", "Loaded weights leave no GPU memory for the KV cache under "
                      f"--mem-fraction-static={mfs}. Raise --mem-fraction-static above "
                      f"{math.ceil(minimum * 1000) / 1000:.3f} (minimum viable = 1 - available/pre = "
                      f"{minimum:.4f}).", k=k)
    kv_budget = int(rest * GIB)
    tokens, swa_tokens = _kv_tokens(profile, kv_budget, page_size=page_size, max_total_tokens=max_total_tokens,
                                    context_length=context_length)
    if swa_tokens is not None and profile.sliding_window_size is not None \
            and profile.sliding_window_size + page_size >= swa_tokens:
        # MemoryPoolConfigurator.validate_swa_pool_size, checked before the pool config exists
        return failed("swa_pool", f"SWA pool ({swa_tokens} tokens) cannot hold even one request: the prefill "
                      f"admission floor is sliding_window_size ({profile.sliding_window_size}) + page_size "
                      f"({page_size}). Increase --swa-full-tokens-ratio or the total KV budget.", k=k)
    if tokens <= 0:
        return failed("oom_kv", "Not enough memory. Please try to increase --mem-fraction-static. "
                      f"Current value: mem_fraction_static={mfs}", k=k)
    effective = _max_num_reqs(tokens, context_length, max_running_requests)
    if profile.is_hybrid:
        effective = min(effective, k // ratio)
        if effective <= 0:
            return failed("oom_mamba", "Hybrid (mamba/linear-attention) state cache is too small to serve any "
                          f"requests. max_mamba_cache_size={k}, mamba_ratio={ratio}, resulting "
                          f"max_num_reqs={effective}.", k=k)
    state_bytes = (k + 1) * state_slot if k is not None else 0
    spec_bytes = state_slot * (spec_requests + 1) * draft if profile.is_hybrid and draft else 0
    return PoolSizing(mfs, pre_load_free_bytes, pre_load_free_bytes * mfs, k, spec_requests, state_bytes,
                      spec_bytes, kv_budget, tokens, tokens * profile.kv_bytes_per_token, max_running_requests,
                      effective, swa_max_total_num_tokens=swa_tokens,
                      swa_kv_bytes=(swa_tokens or 0) * profile.swa_kv_bytes_per_token)


def _mamba_slots(profile: MemoryProfile, rest: float, *, max_running_requests: int | None,
                 max_mamba_cache_size: int | None, disable_radix_cache: bool) -> tuple[int, int, float]:
    """A hybrid model's Mamba slots K (2.2): the user's, one per request without the radix cache, or SGLang's
    share of the rest; with speculative decoding, the requests its buffers are sized for. Returns (K, those
    requests, the rest in GiB after the buffers)."""
    state_slot, draft, ratio = profile.state_bytes_per_slot, profile.draft_tokens, profile.state_slots_per_request
    spec_on = draft > 0
    spec_requests = 0
    if max_mamba_cache_size is not None:
        k = max_mamba_cache_size
        if spec_on:
            spec_requests = min(max(1, max_running_requests), k // ratio)
            rest -= state_slot * (spec_requests + 1) * draft / GIB
    elif disable_radix_cache and max_running_requests is not None:
        k = max(1, max_running_requests)
        if spec_on:
            spec_requests = k
            rest -= state_slot * (k + 1) * draft / GIB
    else:
        ratio_full = profile.mamba_full_memory_ratio
        budget_bytes = rest * ratio_full / (1 + ratio_full) * GIB
        if spec_on:
            # Joint solve: K = (B_m - P(1+D)) // (P(1 + D/ratio)).
            k = int((budget_bytes - state_slot * (1 + draft)) // (state_slot * (1 + draft / ratio)))
            spec_requests = min(max(1, max_running_requests), k // ratio)
            rest -= state_slot * (spec_requests + 1) * draft / GIB
        else:
            k = int((budget_bytes - state_slot) // state_slot)
    return k, spec_requests, rest


def _kv_tokens(profile: MemoryProfile, kv_budget: int, *, page_size: int, max_total_tokens: int | None,
               context_length: int) -> tuple[int, int | None]:
    """The KV pool's tokens from its budget (2.3), page-floored and capped by --max-total-tokens; with a
    sliding-window pool (2.5), also that pool's tokens (else None). A model with no attention layer (pure Mamba)
    has a zero cell: DefaultPoolConfigurator then takes --max-total-tokens, else the context length."""
    if profile.kv_bytes_per_token == 0:
        return (max_total_tokens or context_length) // page_size * page_size, None
    if profile.swa_full_tokens_ratio is not None:
        # 2.5, HybridSWAPoolConfigurator: full tokens = budget // (full cell + ratio x SWA cell) (a float
        # division), page-floored; the SWA pool holds int(full x ratio), page-floored.
        ratio_swa = profile.swa_full_tokens_ratio
        tokens = int(kv_budget // (profile.kv_bytes_per_token + ratio_swa * profile.swa_kv_bytes_per_token))
        tokens = tokens // page_size * page_size
        if max_total_tokens is not None:
            tokens = min(tokens, max_total_tokens) // page_size * page_size
        return tokens, int(tokens * ratio_swa) // page_size * page_size
    tokens = max(kv_budget - KV_FIXED_OVERHEAD_BYTES, 0) // profile.kv_bytes_per_token
    tokens = tokens // page_size * page_size
    if max_total_tokens is not None:
        tokens = min(tokens, max_total_tokens)
    return tokens, None


def _max_num_reqs(tokens: int, context_length: int, max_running_requests: int | None) -> int:
    """Section 3, resolve_max_num_reqs: the requested cap, else SGLang's estimate from the context, both at most
    half the KV tokens."""
    if max_running_requests is not None:
        return min(max(1, max_running_requests), tokens // 2)
    estimated = max(min(int(tokens / context_length * 512), 4096), 2048)
    return min(estimated, tokens // 2)
