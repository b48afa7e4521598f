"""Start-up pool sizing as SGLang 0.5.23 does it (docs/sglang-memory-model.md §2.1-§2.3, §3).

Budget: ``rest = available - pre_load_free * (1 - mfs) - mm_reservation`` (GB floats, as
``mem_cache/kv_cache_configurator.py::KVCacheConfigurator._profile_available_bytes`` computes them),
then the Mamba state pool is carved out first (three branches, with the speculative joint solve),
then the KV pool takes what remains, then max_running_requests is resolved and capped by the state
pool. Failures raise ``LaunchError`` carrying SGLang's exact exception type and message.

Under EAGLE-family speculative decoding the draft worker allocates its own KV pool with the target's
token count, after the target's pools and before CUDA-graph capture
(``managers/scheduler.py::Scheduler.init_memory_pools`` from ``init_model_worker``). The budget
counts it only when SGLang knows the draft's layer count (``eagle_draft_num_layers``, see
``resolve.draft_kv_layers``); otherwise that pool is real memory taken from the non-static share.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sglang_sim.modelcfg import ModelShape
from sglang_sim.resolve import Launch, LaunchError

GB = 1 << 30


@dataclass(frozen=True)
class PoolPlan:
    pre_load_free_bytes: int
    available_bytes: int         # free after weights, before pools
    rest_bytes: int              # budget left for the KV pool after the state pool
    kv_cell_bytes: int           # per token the budget charges: target cell + folded draft layers
    max_total_num_tokens: int
    kv_bytes: int                # the target's KV pool: tokens x target cell
    draft_kv_cell_bytes: int     # the draft worker's own pool per token (0 without one)
    draft_kv_bytes: int          # tokens x draft cell, budgeted (folded) or not
    draft_kv_outside_bytes: int  # the part of draft_kv_bytes the budget did not charge
    mm_reservation_bytes: int    # kept out of the KV budget for multimodal runtime allocations
    mamba_slot_bytes: int        # P: one state slot over all linear layers (0 if not hybrid)
    mamba_conv_slot_bytes: int
    mamba_ratio: int             # state slots per running request (0 if not hybrid)
    max_mamba_cache_size: int    # K per attention-DP rank (0 if not hybrid)
    spec_state_requests: int     # requests given speculative intermediate buffers
    mamba_state_bytes: int       # (K + 1) * P
    mamba_intermediate_bytes: int
    max_running_requests: int    # effective, per DP worker
    max_req_input_len: int
    warnings: tuple[str, ...]
    swa_max_total_num_tokens: int | None = None  # the SWA pool's tokens (hybrid SWA), None without one

    def __post_init__(self) -> None:
        if self.max_total_num_tokens <= 0 or self.max_running_requests <= 0:
            raise ValueError("a pool plan needs tokens and requests > 0")

    @property
    def mamba_total_bytes(self) -> int:
        return self.mamba_state_bytes + self.mamba_intermediate_bytes

    @property
    def allocated_kv_cell_bytes(self) -> int:
        """Per token over both KV pools, target and draft: what decoding reads."""
        return self.kv_bytes // self.max_total_num_tokens + self.draft_kv_cell_bytes

    @property
    def target_pool_bytes(self) -> int:
        """What the target worker allocates: its KV pool and the Mamba state pool."""
        return self.kv_bytes + self.mamba_total_bytes

    @property
    def pool_bytes(self) -> int:
        """Target pools plus the draft worker's KV pool."""
        return self.target_pool_bytes + self.draft_kv_bytes


def mamba_ratio(launch: Launch) -> int:
    """State slots per running request (``_calculate_mamba_ratio``)."""
    if launch.radix_disabled:
        return 1
    tracking = {"extra_buffer": 1 if launch.overlap_disabled else 2, "extra_buffer_lazy": 1}
    return 3 + tracking.get(launch.mamba_strategy, 0)


def kv_cell_bytes(model: ModelShape, launch: Launch) -> int:
    """The cell the budget charges (``model_executor/pool_configurator.py::DefaultPoolConfigurator``):
    the target's full-attention cell, plus ``int(cell * eagle_draft_num_layers / L_kv)`` when known."""
    cell = model.kv_bytes_per_token(launch.attn_tp, launch.kv_dtype_bytes)
    if launch.draft_layers and model.full_attention_layers:
        cell += int(cell * launch.draft_layers / model.full_attention_layers)
    return cell


def draft_kv_cell_bytes(model: ModelShape, launch: Launch, draft_model: ModelShape | None = None) -> int:
    """Bytes per token of the draft worker's own KV pool: its layers at the draft's per-layer cell
    (the target's geometry for a path-less MTP head)."""
    if not launch.draft_kv_layers or not (draft_model or model).full_attention_layers:
        return 0
    geometry = draft_model or model
    per_layer = geometry.kv_bytes_per_token(launch.attn_tp, launch.kv_dtype_bytes) // geometry.full_attention_layers
    return per_layer * launch.draft_kv_layers


def weights_oom_error(launch: Launch, available_gb: float, pre_gb: float) -> LaunchError:
    minimum = 1 - available_gb / pre_gb
    suggested = math.ceil(minimum * 1000) / 1000
    return LaunchError(
        "ValueError",
        f"Loaded weights leave no GPU memory for the KV cache under "
        f"--mem-fraction-static={launch.mem_fraction_static}. Raise --mem-fraction-static above "
        f"{suggested:.3f} (minimum viable = 1 - available/pre = {minimum:.4f}). If using speculative "
        f"decoding, draft weights are now counted.", kind="oom_weights", in_scheduler=True)


def kv_oom_error(launch: Launch) -> LaunchError:
    return LaunchError("RuntimeError", "Not enough memory. Please try to increase --mem-fraction-static. "
                       f"Current value: mem_fraction_static={launch.mem_fraction_static}",
                       kind="oom_kv", in_scheduler=True)


def cuda_oom_error(need_bytes: int, rank: int, total_mib: int, free_bytes: int, process_bytes: int,
                   what: str) -> LaunchError:
    """A failed CUDA allocation of ``need_bytes`` during start-up phase ``what``, as PyTorch words it."""
    return LaunchError("OutOfMemoryError",
                       f"CUDA out of memory. Tried to allocate {need_bytes / GB:.2f} GiB. GPU {rank} has a total "
                       f"capacity of {total_mib / 1024:.2f} GiB of which {max(0, free_bytes) / (1 << 20):.2f} MiB is "
                       f"free. Including non-PyTorch memory, this process has {process_bytes / GB:.2f} GiB memory "
                       f"in use.", kind=f"oom_cuda_{what}", in_scheduler=True)


def mamba_oom_error(slots: int, rest_gb: float, slot_bytes: int) -> LaunchError:
    return LaunchError(
        "RuntimeError",
        f"Not enough GPU memory for hybrid (mamba/linear-attention) state cache. Computed "
        f"max_mamba_cache_size={slots} (total_rest_memory={rest_gb:.2f} GB, "
        f"mamba_cache_per_req={slot_bytes / (1 << 20):.2f} MB). Try: (1) reduce --max-running-requests, "
        f"(2) increase --mem-fraction-static, (3) reduce --speculative-num-draft-tokens, or "
        f"(4) use GPUs with more memory.", kind="oom_mamba", in_scheduler=True)


def _mamba(model: ModelShape, launch: Launch, rest_gb: float) -> tuple[float, int, int, int]:
    """``_handle_max_mamba_cache``: (rest GB left, K, spec requests, ratio)."""
    conv, ssm = model.mamba_bytes_per_slot(launch.tp, launch.ssm_dtype_bytes)
    slot = conv + ssm
    ratio = mamba_ratio(launch)
    spec = launch.spec_algorithm is not None
    draft = launch.spec_draft_tokens
    mrr = launch.max_running_requests
    spec_requests = 0
    if launch.max_mamba_cache_size is not None:
        slots = launch.max_mamba_cache_size // launch.attn_dp
        if spec:
            spec_requests = min(max(1, (mrr or 1) // launch.attn_dp), slots // ratio)
    elif launch.radix_disabled and mrr is not None:
        slots = max(1, mrr // launch.attn_dp)
        if spec:
            spec_requests = slots
    else:
        budget = rest_gb * GB * launch.mamba_full_memory_ratio / (1 + launch.mamba_full_memory_ratio)
        if spec:
            slots = math.floor((budget - slot * (1 + draft)) / (slot * (1 + draft / ratio)))
            spec_requests = min(max(1, (mrr or 1) // launch.attn_dp), max(0, slots) // ratio)
        else:
            slots = math.floor((budget - slot) / slot)
    if spec:
        rest_gb -= slot * (spec_requests + 1) * draft / GB
    if slots <= 0:
        raise mamba_oom_error(slots, rest_gb, slot)
    rest_gb -= (slots + 1) * slot / GB
    return rest_gb, slots, spec_requests, ratio


def resolve_max_running_requests(model: ModelShape, launch: Launch, tokens: int, slots: int,
                                 ratio: int, warnings: list[str]) -> int:
    """``resolve_max_num_reqs`` (docs/sglang-memory-model.md §3), per attention-DP worker."""
    estimated = max(min(int(tokens / launch.context_len * 512), 4096), 2048)
    requested = None
    if launch.max_running_requests is not None:
        requested = max(1, launch.max_running_requests // launch.attn_dp)
        count = min(requested, tokens // 2)
    else:
        count = min(estimated, tokens // 2)
    kv_bound = count
    if model.is_hybrid:
        cap = slots // ratio
        if cap < count:
            count = cap
            warnings.append(
                f"max_running_requests is capped to {count} by the mamba state cache "
                f"(max_mamba_cache_size={slots}, {ratio} state slots per request). To raise it: "
                f"increase --mamba-full-memory-ratio or --max-mamba-cache-size, or halve the state "
                f"size with --mamba-ssm-dtype bfloat16.")
        if count <= 0:
            raise LaunchError(
                "RuntimeError",
                f"Hybrid (mamba/linear-attention) state cache is too small to serve any requests. "
                f"max_mamba_cache_size={slots}, mamba_ratio={ratio}, resulting max_num_reqs={count}. "
                f"Try: (1) reduce --max-running-requests, (2) increase --mem-fraction-static, or "
                f"(3) use GPUs with more memory.", kind="oom_mamba_requests", in_scheduler=True)
    if requested is not None and kv_bound < requested:
        warnings.append(f"max_running_requests was reduced from the requested {requested} to "
                        f"{kv_bound} (per dp worker) due to the available KV cache capacity.")
    return count


def size_pools(model: ModelShape, launch: Launch, pre_load_free_bytes: int,
               available_bytes: int, draft_model: ModelShape | None = None) -> PoolPlan:
    """Size the state and KV pools from the measured free memory (min over the server's GPUs)."""
    pre_gb = pre_load_free_bytes / GB
    available_gb = available_bytes / GB
    mm_reservation_gb = launch.mm_reservation_mb / 1024
    rest_gb = available_gb - pre_gb * (1 - launch.mem_fraction_static) - mm_reservation_gb
    slots = spec_requests = ratio = 0
    if model.is_hybrid:
        rest_gb, slots, spec_requests, ratio = _mamba(model, launch, rest_gb)
    if rest_gb <= 0:
        raise weights_oom_error(launch, available_gb, pre_gb)
    rest_bytes = int(rest_gb * GB)
    cell = kv_cell_bytes(model, launch)
    page = launch.page_size
    swa_cell = 0
    if launch.hybrid_swa:
        # pool_configurator.HybridSWAPoolConfigurator: full tokens from the budget over the full cell plus
        # ratio x the SWA cell (a float division), page-floored; the SWA pool gets int(full x ratio).
        cell, swa_cell = model.swa_split_bytes_per_token(launch.attn_tp, launch.kv_dtype_bytes)
        tokens = int(rest_bytes // (cell + launch.swa_full_tokens_ratio * swa_cell)) // page * page
    elif cell == 0:
        # DefaultPoolConfigurator: a model without attention layers (pure Mamba) has a zero cell, and its token
        # pool is --max-total-tokens, else the context length
        tokens = (launch.max_total_tokens or launch.context_len) // page * page
    else:
        tokens = rest_bytes // cell // page * page
    warnings: list[str] = []
    if launch.max_total_tokens is not None:
        if launch.max_total_tokens > tokens:
            warnings.append(f"max_total_tokens={launch.max_total_tokens} is larger than the profiled "
                            f"value {tokens}. Use the profiled value instead.")
        tokens = min(tokens, launch.max_total_tokens // page * page)
    swa_tokens = None
    if launch.hybrid_swa:
        swa_tokens = int(tokens * launch.swa_full_tokens_ratio) // page * page
        window = model.sliding_window_size
        if window is not None and window + page >= swa_tokens:  # validate_swa_pool_size
            raise LaunchError("ValueError", f"SWA pool ({swa_tokens} tokens) cannot hold even one request: the "
                              f"prefill admission floor is sliding_window_size ({window}) + page_size ({page}). "
                              "Increase --swa-full-tokens-ratio or the total KV budget.", kind="swa_pool",
                              in_scheduler=True)
    if tokens <= 0:
        raise kv_oom_error(launch)
    requests = resolve_max_running_requests(model, launch, tokens, slots, ratio, warnings)
    if tokens < launch.context_len:
        warnings.append(f"KV pool holds {tokens} tokens, fewer than --context-length {launch.context_len}.")
    conv, ssm = model.mamba_bytes_per_slot(launch.tp, launch.ssm_dtype_bytes)
    draft = launch.spec_draft_tokens if launch.spec_algorithm else 0
    target_cell = cell if launch.hybrid_swa else model.kv_bytes_per_token(launch.attn_tp, launch.kv_dtype_bytes)
    draft_cell = draft_kv_cell_bytes(model, launch, draft_model)
    folded = cell - target_cell
    return PoolPlan(
        pre_load_free_bytes=pre_load_free_bytes, available_bytes=available_bytes, rest_bytes=rest_bytes,
        kv_cell_bytes=cell, max_total_num_tokens=tokens, kv_bytes=tokens * target_cell + (swa_tokens or 0) * swa_cell,
        draft_kv_cell_bytes=draft_cell, draft_kv_bytes=tokens * draft_cell,
        draft_kv_outside_bytes=tokens * max(0, draft_cell - folded),
        mm_reservation_bytes=int(launch.mm_reservation_mb * (1 << 20)),
        mamba_slot_bytes=conv + ssm, mamba_conv_slot_bytes=conv, mamba_ratio=ratio,
        max_mamba_cache_size=slots, spec_state_requests=spec_requests,
        mamba_state_bytes=(slots + 1) * (conv + ssm) if model.is_hybrid else 0,
        mamba_intermediate_bytes=(spec_requests + 1) * draft * (conv + ssm) if model.is_hybrid and draft else 0,
        max_running_requests=requests,
        max_req_input_len=min(launch.context_len - 1, tokens - 1) - 5, warnings=tuple(warnings),
        swa_max_total_num_tokens=swa_tokens,
    )
