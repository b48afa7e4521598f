"""Launch plan per server: the SGLang flags that give the most concurrent requests the GPU can hold.

``plan_server`` sizes one server for a request cap: the largest ``max_running_requests`` such that

- the KV pool holds what the bounds ask for: every running request at its full context length (the
  full-context plan), or the pool the workload mode chose (``TunerBounds``, ``fleetgen.tuning.workload``:
  the pool the previous run's requests really needed, one bounded step per run), and
- SGLang's own reserve for activations and CUDA graphs (docs/sglang-memory-model.md §1.1), any draft KV pool SGLang
  allocates outside its static budget (2.2), and the user's margin all stay free.

The plan sets the Mamba slots explicitly (``--max-mamba-cache-size = ratio x requests``, branch 1 of
2.3), the request cap, ``--mem-fraction-static`` as high as that free memory allows, and sizes the
chunked-prefill size and decode CUDA-graph batch to the workload, which shrinks the reserve. Every
expected value comes from :func:`fleetgen.tuning.sizing.size_pools`, SGLang's own arithmetic, so the
server's /server_info must agree with the plan exactly; :func:`compare_expected` checks that.
``backoff`` gives the plan one step smaller after a memory failure.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from fleetgen.errors import FailureKind, PlanError
from fleetgen.tuning.profile import GIB, MIB, LaunchOptions, MemoryProfile, ModelGeometry, profile_geometry
from fleetgen.tuning.budget import budget_rows, compare_expected, render_budget_table
from fleetgen.tuning.geometry import MULTIMODAL_PREFILL_GRAPH_ARCHITECTURES
from fleetgen.tuning.platform import (attention_choice, backend_refusal, gpu_generation, is_large_hopper_qwen3_vl,
                                      qwen3_vl_hopper_reserve_mib)
from fleetgen.tuning.plan import INCUMBENT, ServerPlan, TunerBounds, Workload, format_flag_value
from fleetgen.tuning.quantization import check_gpu_capability
from fleetgen.tuning.sizing import (SPEC_DEFAULT_MAX_RUNNING_REQUESTS, PoolSizing, ReserveEstimate,
                                    auto_mem_fraction_static, gpu_table, sglang_reserve_mb, size_pools)

__all__ = ["Workload", "TunerBounds", "ServerPlan", "plan_server", "backoff", "compare_expected",
           "render_budget_table", "CUDA_CONTEXT_MIB", "MAX_BACKOFF_ATTEMPTS", "format_flag_value"]

# Device memory a fresh SGLang process holds per GPU before it measures its baseline: the CUDA
# context and torch start-up, plus NCCL / custom all-reduce buffers when tp > 1. nvidia-smi shows it
# as the used memory of a server that has not loaded weights yet. SGLang's baseline (2.1) is the
# free memory *after* it, so the plan subtracts it. The simulated node uses the same defaults.
CUDA_CONTEXT_MIB = 600
NCCL_BUFFERS_MIB = 400
MAX_BACKOFF_ATTEMPTS = 3
_MAX_REQUESTS_SEARCHED = 1 << 15
_BACKOFF_REQUEST_STEP = 0.10  # a memory failure re-plans with 10 % fewer requests (at least one)
_BACKOFF_MIN_RESERVE_STEP = 2 * GIB


@dataclass(frozen=True)
class _Candidate:
    requests: int
    mem_fraction_static: float
    chunked_prefill_size: int
    decode_max_bs: int
    reserve: ReserveEstimate
    sizing: PoolSizing
    max_running_requests_flag: int | None
    max_mamba_cache_size_flag: int | None
    profile: MemoryProfile | None = None  # when the plan's flags change the profile (Qwen3-VL on Hopper)


@dataclass(frozen=True)
class _SizingInputs:
    """What both sizing paths (SGLang's defaults, the tuner's search) read for one server."""
    profile: MemoryProfile
    options: LaunchOptions
    pre_free: int          # the free bytes per GPU SGLang measures before the weights load
    gpu_total_mib: int
    table_chunk: int       # SGLang's per-GPU defaults (platform.gpu_table)
    table_bs: int
    context: int
    host: str
    server: str

    def size(self, profile: MemoryProfile, *, mem_fraction_static: float, max_running_requests: int | None,
             max_mamba_cache_size: int | None) -> PoolSizing:
        return size_pools(profile, pre_load_free_bytes=self.pre_free, mem_fraction_static=mem_fraction_static,
                          max_running_requests=max_running_requests, max_mamba_cache_size=max_mamba_cache_size,
                          context_length=self.context, page_size=self.options.page_size,
                          max_total_tokens=self.options.max_total_tokens,
                          disable_radix_cache=self.options.disable_radix_cache)


def plan_server(*, host: str, gpu_ids: list[int], port: int, gpus: list[dict], profile: MemoryProfile,
                options: LaunchOptions, workload: Workload, bounds: TunerBounds,
                calibration_bytes: int = 0, candidate: str = INCUMBENT,
                extra_args: list[str] | tuple[str, ...] | None = None) -> ServerPlan:
    """Plan one server on ``gpus`` (the probe's inventory rows for ``gpu_ids``). ``calibration_bytes``:
    the correction a previous run's readback measured for this GPU, SGLang version, model and tp
    (``tuning/calibration.py``), taken off the pre-load free memory fleetgen's constants give.
    ``candidate`` / ``extra_args``: the configuration ``options`` were read from and the args it launches with
    (``ServerPlan``); a back-off keeps both."""
    for gpu in gpus[:1]:
        check_gpu_capability(profile.quantization, gpu_generation(str(gpu.get("name", ""))), str(gpu.get("name")),
                             host=host)
    inputs = {"gpus": [dict(g) for g in gpus], "profile": profile.to_dict(), "options": options.to_dict(),
              "workload": workload.to_dict(), "bounds": bounds.to_dict(),
              "adjust": {"mrr_cap": None, "extra_reserve_bytes": 0, "pre_free_shrink_bytes": 0,
                         "calibration_bytes": int(calibration_bytes)},
              "launch": {"candidate": candidate, "extra_args": None if extra_args is None else list(extra_args)}}
    return _plan(host=host, gpu_ids=list(gpu_ids), port=port, inputs=inputs, attempt=0)


def backoff(plan: ServerPlan, failure: FailureKind | str) -> ServerPlan:
    """A plan one step smaller in the dimension that failed (``FailureKind.backoff_step``; the failures are
    SGLang's, docs/sglang-memory-model.md §5.2).

    - ``requests`` (KV or Mamba pool): 10 % fewer running requests (K follows);
    - ``reserve`` (CUDA graphs, runtime CUDA OOM): one more step of free memory (lower ``--mem-fraction-static``);
    - ``pre_load`` (weights): assume one step less pre-load free memory than the probe saw.
    Raises PlanError for a failure no smaller plan can fix, when no smaller plan fits, or after
    ``MAX_BACKOFF_ATTEMPTS`` relaunches.
    """
    try:
        kind = FailureKind(failure)
    except ValueError:
        raise PlanError(f"unknown failure kind {failure!r}; expected one of {[k.value for k in FailureKind]}",
                        host=plan.host, server=plan.server) from None
    failure_kind = kind.value
    if not kind.can_back_off():
        raise PlanError(f"the server failed with {failure_kind}, which a smaller plan cannot fix",
                        host=plan.host, server=plan.server, hint=kind.hint)
    if plan.mode != "tuned":
        raise PlanError(f"the server died ({failure_kind}) with SGLang's automatic sizing; there are no "
                        "tuner flags to back off", host=plan.host, server=plan.server,
                        hint="run in tuned mode, or pass smaller memory flags in the extra args")
    if plan.attempt >= MAX_BACKOFF_ATTEMPTS:
        raise PlanError(f"the server still fails ({failure_kind}) after {plan.attempt} smaller relaunches",
                        host=plan.host, server=plan.server,
                        hint="read the server log excerpt; check for processes that took GPU memory after the probe")
    inputs = {**plan.inputs, "adjust": dict(plan.inputs["adjust"])}
    adjust = inputs["adjust"]
    requests = plan.expected["max_running_requests"]
    tp_size = int(plan.inputs["options"].get("tp_size", 1))
    step_bytes = max(_BACKOFF_MIN_RESERVE_STEP, _pre_load_free(plan.inputs["gpus"], 0, tp_size) // 100)
    if kind.backoff_step == "requests":
        if requests <= 1:
            raise PlanError(f"the server fails ({failure_kind}) even with 1 running request",
                            host=plan.host, server=plan.server, hint="the model does not fit these GPUs")
        adjust["mrr_cap"] = min(requests - 1, math.floor(requests * (1 - _BACKOFF_REQUEST_STEP)))
    elif kind.backoff_step == "reserve":
        adjust["extra_reserve_bytes"] += step_bytes
    else:
        adjust["pre_free_shrink_bytes"] += step_bytes
    smaller = _plan(host=plan.host, gpu_ids=plan.gpu_ids, port=plan.port, inputs=inputs, attempt=plan.attempt + 1)
    smaller.notes.append(f"attempt {smaller.attempt}: backed off after {failure_kind} "
                         f"(max_running_requests {requests} -> {smaller.expected['max_running_requests']}, "
                         f"--mem-fraction-static {plan.flags.get('--mem-fraction-static')} -> "
                         f"{smaller.flags.get('--mem-fraction-static')})")
    return smaller


# -- planning ---------------------------------------------------------------------------------------

def _process_overhead_mib(tp_size: int) -> int:
    return CUDA_CONTEXT_MIB + (NCCL_BUFFERS_MIB if tp_size > 1 else 0)


def _pre_load_free(gpus: list[dict], shrink_bytes: int, tp_size: int) -> int:
    """SGLang's baseline (2.1), MIN over ranks: free memory plus what our stopping servers hold,
    less the new process's own start-up memory. Every data-parallel replica sizes its own pools from its
    own GPUs; the plan takes the smallest, so each replica holds at least what the plan expects."""
    values = []
    for gpu in gpus:
        ours = sum(int(p.get("used_mib", 0)) for p in gpu.get("processes", []) if p.get("ours"))
        values.append((int(gpu["free_mib"]) + ours - _process_overhead_mib(tp_size)) * MIB)
    return min(values) - shrink_bytes


def _plan(*, host: str, gpu_ids: list[int], port: int, inputs: dict, attempt: int) -> ServerPlan:
    gpus = inputs["gpus"]
    base_profile = MemoryProfile.from_dict(inputs["profile"])
    options = LaunchOptions.from_dict(inputs["options"])
    workload = Workload(**inputs["workload"])
    bounds = TunerBounds(**inputs["bounds"])
    adjust = inputs["adjust"]
    server = f"{host}:{port}"
    if not gpus or len(gpus) != options.gpus_per_server or len(gpu_ids) != len(gpus):
        raise PlanError(f"server has {len(gpu_ids)} GPU id(s) and {len(gpus)} inventory row(s) but tp size "
                        f"{options.tp_size}" + (f" x dp size {options.dp_size}" if options.dp_size > 1 else ""),
                        host=host, server=server,
                        hint="give each server exactly tp_size x dp_size GPUs in the fleet description")
    if [int(g["index"]) for g in gpus] != [int(i) for i in gpu_ids]:
        raise PlanError(f"inventory rows {[g['index'] for g in gpus]} do not match gpu_ids {gpu_ids}",
                        host=host, server=server)

    flags: dict = {}
    notes: list[str] = list(base_profile.notes)
    if options.dp_size > 1:
        notes.append(f"--dp-size {options.dp_size}: {options.dp_size} replicas of {options.tp_size} GPU(s), each with "
                     "its own pools; the budget and the expected values are one replica's (the smallest free GPU)")
    options, flags = _apply_opt_ins(base_profile, options, bounds, flags, notes)
    geometry = ModelGeometry.from_dict(base_profile.geometry)
    generation = gpu_generation(str(gpus[0].get("name", "")))
    profile, options, hopper_vl = _platform_profile(base_profile, geometry, options, bounds, flags, generation,
                                                    min(int(g["total_mib"]) for g in gpus), notes, host, server)
    context = _context_length(profile, options, workload, bounds, host, server)
    if options.context_length is None and (bounds.mode == "tuned" or bounds.context_length is not None):
        flags["--context-length"] = context

    gpu_total_mib = min(int(g["total_mib"]) for g in gpus)
    calibration = int(adjust.get("calibration_bytes", 0))
    pre_free = _pre_load_free(gpus, adjust["pre_free_shrink_bytes"] + calibration, options.tp_size)
    if pre_free <= profile.weights_bytes_per_gpu:
        raise PlanError(f"weights need {profile.weights_bytes_per_gpu / GIB:.2f} GiB per GPU but only "
                        f"{pre_free / GIB:.2f} GiB are free", host=host, server=server,
                        hint="free the GPUs (foreign processes) or raise the tensor-parallel size")
    table_chunk, table_bs = gpu_table(gpu_total_mib, options.tp_size)
    sizing_inputs = _SizingInputs(profile=profile, options=options, pre_free=pre_free, gpu_total_mib=gpu_total_mib,
                                  table_chunk=table_chunk, table_bs=table_bs, context=context, host=host, server=server)

    if bounds.mode == "sglang_defaults":
        best = _sglang_defaults(sizing_inputs)
    else:
        best = _search(sizing_inputs, bounds=bounds, workload=workload, adjust=adjust, hopper_vl=hopper_vl)
        profile = best.profile or profile
        flags.update(_tuned_flags(profile, options, best))
        if bounds.kv_tokens_mean is None and \
                best.sizing.max_total_num_tokens < best.sizing.effective_max_running_requests * context:
            notes.append(f"the KV pool holds {best.sizing.max_total_num_tokens} tokens, less than "
                         f"{best.sizing.effective_max_running_requests} requests x {context} context")
    margin = bounds.margin_mib * MIB + adjust["extra_reserve_bytes"]
    # Per data-parallel replica: /server_info reports one internal state per replica (readiness.py).
    expected = {"max_running_requests": best.sizing.effective_max_running_requests,
                "max_mamba_cache_size": best.sizing.max_mamba_cache_size,
                "max_total_num_tokens": best.sizing.max_total_num_tokens}
    if best.sizing.swa_max_total_num_tokens is not None:
        expected["swa_max_total_num_tokens"] = best.sizing.swa_max_total_num_tokens
    summary = {"gpu_total_bytes": gpu_total_mib * MIB, "pre_load_free_bytes": pre_free,
               "foreign_bytes": _foreign_bytes(gpus),
               "cuda_context_bytes": _process_overhead_mib(options.tp_size) * MIB, "calibration_bytes": calibration,
               "margin_bytes": margin, "context_length": context, "decode_max_bs": best.decode_max_bs,
               "chunked_prefill_size": best.chunked_prefill_size}
    budget = budget_rows(profile, best.sizing, best.reserve, summary)
    if budget[-1]["bytes"] < 0:
        notes.append(f"{-budget[-1]['bytes'] / MIB:,.0f} MiB short of SGLang's reserve + margin: --mem-fraction-static "
                     f"{format_flag_value(best.mem_fraction_static)} leaves too little free memory for "
                     "activations and CUDA graphs")
    choice = attention_choice(geometry, options, generation)
    inputs = {**inputs, "resolved_profile": profile.to_dict(),
              "platform": {"generation": generation, "attention_backend": choice.backend, "page_size": choice.page_size,
                           "chunked_prefill_size": best.chunked_prefill_size, "decode_max_bs": best.decode_max_bs,
                           "mem_fraction_static": best.mem_fraction_static}}
    launch = inputs.get("launch") or {}
    return ServerPlan(host=host, gpu_ids=list(gpu_ids), port=port, flags=flags, expected=expected,
                      budget=budget, attempt=attempt, mode=bounds.mode, notes=notes, inputs=inputs,
                      candidate=launch.get("candidate", INCUMBENT), extra_args=launch.get("extra_args"))


def resolved_page_size(profile: MemoryProfile, options: LaunchOptions, gpus: list[dict], bounds: TunerBounds) -> int:
    """The KV page size SGLang will run a plan for ``gpus`` with (``tuning/platform.py``): the page the
    workload mode's KV demand rounds to, under the opt-ins the plan applies (no_buffer runs at page 1).
    It knows no server, so its errors name none."""
    options, _ = _apply_opt_ins(profile, options, bounds, {}, [])
    _, resolved, _ = _platform_profile(profile, ModelGeometry.from_dict(profile.geometry), options, bounds, {},
                                       gpu_generation(str(gpus[0].get("name", ""))),
                                       min(int(g["total_mib"]) for g in gpus), [], None, None)
    return resolved.page_size or 1


def _platform_profile(base_profile: MemoryProfile, geometry: ModelGeometry, options: LaunchOptions,
                      bounds: TunerBounds, flags: dict, generation: str | None, gpu_total_mib: int, notes: list[str],
                      host: str | None, server: str | None) -> tuple[MemoryProfile, LaunchOptions, bool]:
    """The profile under the flags SGLang will resolve on this GPU: the radix strategy the plan pins,
    the attention backend and page size, and Qwen3-VL's Hopper feature pool. Updates ``flags``."""
    def reprofile(opts: LaunchOptions) -> MemoryProfile:
        return profile_geometry(geometry, base_profile.weights_bytes_total - base_profile.draft_weights_bytes, opts,
                                draft_layers=base_profile.draft_model_layers,
                                draft_weights_bytes=base_profile.draft_weights_bytes,
                                quantization=base_profile.quantization,
                                kv_cache_quant_algo=base_profile.kv_cache_quant_algo)

    profile = reprofile(options)
    if profile.is_hybrid and profile.radix_strategy is not None and options.mamba_radix_cache_strategy == "auto" \
            and bounds.mode == "tuned":
        flags["--mamba-radix-cache-strategy"] = profile.radix_strategy
        options = options.replace(mamba_radix_cache_strategy=profile.radix_strategy)
    options, flags = _resolve_attention(geometry, profile, options, flags, generation, notes, host, server)
    profile = reprofile(options)
    hopper_vl = is_large_hopper_qwen3_vl(geometry, generation, gpu_total_mib)
    if hopper_vl:
        profile = _with_mm_reserve(profile, options.max_running_requests)
        notes.append("Qwen3-VL on a large Hopper GPU: SGLang reserves the CUDA-IPC image feature pool "
                     "(1 GiB, 3 GiB at >= 400 running requests) instead of the VLM embedding cache")
    return profile, options, hopper_vl


def _resolve_attention(geometry: ModelGeometry, profile: MemoryProfile, options: LaunchOptions, flags: dict,
                       generation: str | None, notes: list[str], host: str | None, server: str | None):
    """The attention backend and KV page size SGLang will pick (tuning/platform.py); under the no_buffer
    radix strategy, the flags SGLang then requires (arg_groups/mamba_hook.py::validate_mamba_no_buffer:
    overlap scheduling off, page size 1, a backend other than trtllm_mha), or the reason it cannot."""
    if profile.is_hybrid and profile.radix_strategy == "no_buffer":
        if not options.disable_overlap_schedule:
            flags["--disable-overlap-schedule"] = True
            options = options.replace(disable_overlap_schedule=True)
        choice = attention_choice(geometry, options, generation)
        if choice.backend == "trtllm_mha" or choice.page_size != 1:
            if options.attention_backend == "trtllm_mha" or (options.page_size or 1) != 1:
                raise PlanError(f"the no_buffer Mamba radix strategy needs page size 1 and an attention backend other "
                                f"than trtllm_mha, but the extra args pin --attention-backend "
                                f"{options.attention_backend} / --page-size {options.page_size} (SGLang refuses "
                                "to start)", host=host, server=server,
                                hint="drop --attention-backend/--page-size from the extra args, or turn the "
                                     "no_buffer_radix bound off")
            flags.update({"--attention-backend": "triton", "--page-size": 1})
            options = options.replace(attention_backend="triton", page_size=1)
            notes.append("no_buffer radix strategy: --attention-backend triton --page-size 1 instead of "
                         f"SGLang's {choice.backend} with page size {choice.page_size} on this GPU")
    choice = attention_choice(geometry, options, generation)
    refusal = backend_refusal(choice.backend, options.kv_cache_dtype, generation)
    if refusal is not None:
        raise PlanError(f"SGLang resolves --attention-backend {choice.backend} with --kv-cache-dtype "
                        f"{options.kv_cache_dtype} on this {generation} GPU and refuses to start: {refusal}",
                        host=host, server=server,
                        hint="drop --attention-backend/--kv-cache-dtype from the extra args, or pick values "
                             "this GPU supports")
    if generation is None:
        notes.append("unknown GPU generation: assuming SGLang's non-Hopper, non-Blackwell attention backend")
    return options.replace(page_size=choice.page_size), flags


def _prefill_graph_disabled(profile: MemoryProfile, options: LaunchOptions) -> bool:
    """SGLang turns the breakable prefill CUDA graph off for multimodal models outside its allow-list
    (configs/model_config.py::_derive_multimodal_cuda_graph_support, arg_groups/cuda_graph_hook.py)."""
    return bool(profile.geometry.get("is_multimodal")) and profile.architecture not in \
        MULTIMODAL_PREFILL_GRAPH_ARCHITECTURES


def _with_mm_reserve(profile: MemoryProfile, max_running_requests: int | None) -> MemoryProfile:
    reserve = qwen3_vl_hopper_reserve_mib(max_running_requests) * MIB
    return dataclasses.replace(profile, multimodal_reserve_bytes=reserve)


def _apply_opt_ins(profile: MemoryProfile, options: LaunchOptions, bounds: TunerBounds, flags: dict,
                   notes: list[str]) -> tuple[LaunchOptions, dict]:
    """The user's opt-in trade-offs, unless their own extra args already decide them."""
    if bounds.mode != "tuned" or not profile.is_hybrid:
        return options, flags
    if bounds.bf16_ssm_state:
        if options.mamba_ssm_dtype is None:
            options = options.replace(mamba_ssm_dtype="bfloat16")
            flags["--mamba-ssm-dtype"] = "bfloat16"
        else:
            notes.append(f"bf16 SSM state not applied: the extra args set --mamba-ssm-dtype {options.mamba_ssm_dtype}")
    if bounds.no_buffer_radix:
        if options.mamba_radix_cache_strategy == "auto" and not options.disable_radix_cache:
            options = options.replace(mamba_radix_cache_strategy="no_buffer")
            flags["--mamba-radix-cache-strategy"] = "no_buffer"
        else:
            notes.append("no_buffer radix strategy not applied: the extra args already set "
                         f"--mamba-radix-cache-strategy {options.mamba_radix_cache_strategy}"
                         + (" / --disable-radix-cache" if options.disable_radix_cache else ""))
    return options, flags


def _context_length(profile: MemoryProfile, options: LaunchOptions, workload: Workload, bounds: TunerBounds,
                    host: str, server: str) -> int:
    """The user's --context-length, else the bound, else the workload's longest prompt plus the
    output budget rounded up to 1024; never above the model's own (SGLang rejects that)."""
    if options.context_length is not None:
        context = options.context_length
    elif bounds.context_length is not None:
        context = bounds.context_length
    elif bounds.mode == "sglang_defaults":
        return profile.model_context_length
    else:
        context = min(profile.model_context_length, math.ceil(workload.full_context_tokens / 1024) * 1024)
    if context > profile.model_context_length:
        raise PlanError(f"context length {context} exceeds the model's {profile.model_context_length}",
                        host=host, server=server, hint="SGLang refuses it unless "
                        "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1; lower the context length bound")
    return context


def _foreign_bytes(gpus: list[dict]) -> int:
    return max(sum(int(p.get("used_mib", 0)) for p in g.get("processes", []) if not p.get("ours"))
               for g in gpus) * MIB


def _sglang_defaults(inputs: _SizingInputs) -> _Candidate:
    """What SGLang reaches with no tuner flags (1.1, then 2-3)."""
    profile, options = inputs.profile, inputs.options
    chunk = options.chunked_prefill_size or inputs.table_chunk
    decode_bs = options.cuda_graph_max_bs_decode or inputs.table_bs
    if options.cuda_graph_max_bs_decode is None and options.max_running_requests is not None:
        decode_bs = min(decode_bs, options.max_running_requests)
    reserve = sglang_reserve_mb(gpu_mem_mib=inputs.gpu_total_mib, chunked_prefill_size=chunk, decode_max_bs=decode_bs,
                                tp_size=options.tp_size, uses_mla=profile.uses_mla,
                                graphs_enabled=not options.disable_cuda_graph,
                                prefill_graph=not _prefill_graph_disabled(profile, options))
    vision = None
    geometry = profile.geometry
    if profile.multimodal_reserve_bytes and geometry.get("vision_layers") is not None:
        vision = (geometry["vision_layers"], geometry["vision_hidden_size"])
    mfs = options.mem_fraction_static or auto_mem_fraction_static(inputs.gpu_total_mib, reserve, vision)
    mrr = options.max_running_requests
    if mrr is None and options.spec_enabled:
        mrr = SPEC_DEFAULT_MAX_RUNNING_REQUESTS
    sizing = inputs.size(profile, mem_fraction_static=mfs, max_running_requests=mrr,
                         max_mamba_cache_size=options.max_mamba_cache_size)
    if not sizing.ok:
        raise PlanError(f"SGLang's automatic sizing would fail ({sizing.failure}): {sizing.message}",
                        host=inputs.host, server=inputs.server)
    return _Candidate(sizing.effective_max_running_requests, mfs, chunk, decode_bs, reserve, sizing, None, None)


def _search(inputs: _SizingInputs, *, bounds: TunerBounds, workload: Workload, adjust: dict,
            hopper_vl: bool) -> _Candidate:
    """Binary search for the most requests that fit (every constraint only tightens as requests grow)."""
    profile, options, pre_free, context = inputs.profile, inputs.options, inputs.pre_free, inputs.context
    # Chunked prefill sized to the workload's longest prompt, at least 2048 (the activation floor).
    chunk = options.chunked_prefill_size or min(inputs.table_chunk, max(2048, math.ceil(workload.prompt_tokens_max
                                                                                  / 1024) * 1024))
    margin = bounds.margin_mib * MIB + adjust["extra_reserve_bytes"]
    ratio = profile.state_slots_per_request
    caps = [c for c in (bounds.max_running_requests, options.max_running_requests, adjust["mrr_cap"]) if c]
    if profile.is_hybrid and options.max_mamba_cache_size is not None:
        caps.append(options.max_mamba_cache_size // ratio)
    controllable = options.max_running_requests is None or (profile.is_hybrid
                                                            and options.max_mamba_cache_size is None)
    page = options.page_size or 1
    needed_tokens_per_request = math.ceil(context / page) * page

    def evaluate(requests: int) -> _Candidate | None:
        decode_bs = options.cuda_graph_max_bs_decode or min(inputs.table_bs, requests)
        reserve = sglang_reserve_mb(gpu_mem_mib=inputs.gpu_total_mib, chunked_prefill_size=chunk,
                                    decode_max_bs=decode_bs, tp_size=options.tp_size, uses_mla=profile.uses_mla,
                                    graphs_enabled=not options.disable_cuda_graph,
                                    prefill_graph=not _prefill_graph_disabled(profile, options))
        mrr_flag = options.max_running_requests or requests
        mamba_flag = options.max_mamba_cache_size
        if profile.is_hybrid and mamba_flag is None:
            mamba_flag = ratio * requests
        held_free = reserve.total_bytes + margin
        sized = _with_mm_reserve(profile, mrr_flag) if hopper_vl else profile
        for mfs in _mem_fraction_candidates(options, pre_free, held_free):
            sizing = inputs.size(sized, mem_fraction_static=mfs, max_running_requests=mrr_flag,
                                 max_mamba_cache_size=mamba_flag)
            if not sizing.ok:
                return None
            outside = profile.draft_kv_bytes_per_token_outside * sizing.max_total_num_tokens
            if options.mem_fraction_static is None and pre_free - pre_free * mfs < held_free + outside:
                continue
            if controllable and (sizing.effective_max_running_requests < requests
                                 or sizing.max_total_num_tokens < bounds.kv_tokens_needed(requests,
                                                                                           needed_tokens_per_request)):
                return None
            return _Candidate(sizing.effective_max_running_requests, mfs, chunk, decode_bs, reserve, sizing,
                              None if options.max_running_requests else mrr_flag,
                              None if options.max_mamba_cache_size else (mamba_flag if profile.is_hybrid else None),
                              sized)
        return None

    if not controllable:
        only = evaluate(options.max_running_requests)
        if only is None:
            raise PlanError("the pinned --max-running-requests/--max-mamba-cache-size do not fit",
                            host=inputs.host, server=inputs.server, hint="drop them from the extra args and let the tuner size")
        return only
    low, high = 1, min(caps) if caps else _MAX_REQUESTS_SEARCHED
    best = evaluate(low)
    if best is None:
        raise PlanError(_no_fit_message(profile, pre_free, context), host=inputs.host, server=inputs.server,
                        hint="use GPUs with more free memory, a larger tp size, a shorter context, or the "
                             "bf16 SSM state / no_buffer radix options")
    while low < high:
        middle = (low + high + 1) // 2
        candidate = evaluate(middle)
        if candidate is None:
            high = middle - 1
        else:
            low, best = middle, candidate
    return best


def _mem_fraction_candidates(options, pre_free: int, held_free: int):
    """The pinned --mem-fraction-static; else 3-decimal values from the highest that leaves
    ``held_free`` free, counting down (the caller also keeps the outside draft pool free, which grows
    with the KV pool, so the first value that passes the exact check is the answer)."""
    if options.mem_fraction_static is not None:
        yield options.mem_fraction_static
        return
    mille = min(math.floor((pre_free - held_free) / pre_free * 1000), 999)
    for step in range(mille, 0, -1):
        yield step / 1000


def _tuned_flags(profile: MemoryProfile, options: LaunchOptions, best: _Candidate) -> dict:
    flags: dict = {}
    if options.mem_fraction_static is None:
        flags["--mem-fraction-static"] = best.mem_fraction_static
    if best.max_running_requests_flag is not None:
        flags["--max-running-requests"] = best.max_running_requests_flag
    if best.max_mamba_cache_size_flag is not None:
        flags["--max-mamba-cache-size"] = best.max_mamba_cache_size_flag
    if options.chunked_prefill_size is None:
        flags["--chunked-prefill-size"] = best.chunked_prefill_size
    if options.cuda_graph_max_bs_decode is None and not options.disable_cuda_graph:
        flags["--cuda-graph-max-bs-decode"] = best.decode_max_bs
    return flags


def _no_fit_message(profile: MemoryProfile, pre_free: int, context: int) -> str:
    one_request = (profile.kv_bytes_per_token * context
                   + profile.state_bytes_per_slot * (profile.state_slots_per_request + 1)
                   + profile.spec_bytes_per_request * 2)
    return (f"not even one request fits: {pre_free / GIB:.2f} GiB pre-load free, weights "
            f"{profile.weights_bytes_per_gpu / GIB:.2f} GiB per GPU, one request at context {context} needs "
            f"about {one_request / GIB:.2f} GiB of KV/state plus SGLang's reserve")
