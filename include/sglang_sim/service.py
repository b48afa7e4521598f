"""The running server's state: engines (one per DP worker), faults, and the info endpoints' bodies.

``/server_info`` ``internal_states[i]["sim"]`` exposes the simulated capacity, in simulated tokens per
simulated second (divide wall-clock rates by ``time_scale`` before comparing): decode throughput at
a full batch, the per-request rate there, prefill speed, plus live running/waiting/finished counts.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import time
import uuid

from sglang_sim import __version__
from sglang_sim import observability
from sglang_sim.engine import BatchEngine, JobResult, SimClock
from sglang_sim.faults import Faults
from sglang_sim.graphs import GraphMemory, decode_capture_sizes
from sglang_sim.modelcfg import ModelShape
from sglang_sim.node import SimSettings
from sglang_sim.perf import Timing
from sglang_sim.pools import PoolPlan
from sglang_sim.resolve import Launch
from sglang_sim.simlog import log

VERSION = __version__
GB = 1 << 30


def decode_reserve_tokens(launch: Launch) -> int:
    """KV tokens a running request keeps allocated ahead of its committed length: one for the next
    token, or under EAGLE/MTP ``2 x max(num_steps x topk, num_draft_tokens)``
    (``mem_cache/allocation_sizing.py::get_alloc_reserve_per_decode``)."""
    if not launch.spec_algorithm:
        return 1
    steps, topk, page = max(1, launch.spec_steps), max(1, launch.spec_topk), launch.page_size
    if page == 1 or topk == 1:
        per_step = max(steps * topk, launch.spec_draft_tokens)
    else:  # tree drafts on pages: every topk branch may need its own page-aligned span
        per_step = max(((page - 1) + steps + page - 1) // page * page * topk, launch.spec_draft_tokens)
    return 2 * per_step


class Service:
    def __init__(self, *, args: argparse.Namespace, argv: list[str], model: ModelShape, architectures: list[str],
                 launch: Launch, plan: PoolPlan, graphs: GraphMemory, timing: Timing, settings: SimSettings,
                 faults: Faults, weights_bytes: int, startup_seconds: float, gpu_name: str | None = None,
                 startup_phases: dict | None = None) -> None:
        self.args, self.argv, self.model, self.architectures = args, argv, model, architectures
        self.launch, self.plan, self.graphs, self.timing = launch, plan, graphs, timing
        self.settings, self.faults = settings, faults
        self.weights_bytes, self.startup_seconds = weights_bytes, startup_seconds
        self.startup_phases = startup_phases or {}
        self.served_model_name = args.served_model_name or args.model_path
        # SGLang draws a seed when none is given (sglang/srt/arg_groups/serving_hook.py); this one is reproducible
        self.random_seed = args.random_seed if args.random_seed is not None else \
            random.Random(f"{settings.seed}/{args.port}").randint(0, 1 << 30)
        self.gpu_name = gpu_name  # /v1/loads "accelerator": the GPU's marketing name
        self.version = VERSION
        self.started_at = time.time()
        self.ready = False
        self.hung = False
        self.draining = False  # SIGTERM received: /health answers 503 while the requests in flight finish
        self.in_flight: set[str] = set()  # request ids, as the tokenizer manager's rid_to_state keys
        self.warmup_failed = False
        self.requests_received = 0
        self.finished_after_ready = 0
        self.engines: list[BatchEngine] = []
        self._last_prefill: dict[int, float] = {}
        self.gpu_load_target = None  # (SimNode, GPU indices): where the load for nvidia-smi is written
        ids = random.Random(model.vocab_size)
        self._output_ids = [ids.randrange(model.vocab_size) for _ in range(4096)]

    def clock_time(self) -> float:
        """Wall-clock seconds, as SGLang's load snapshots stamp them."""
        return time.time()

    def start_engines(self, loop: asyncio.AbstractEventLoop) -> None:
        clock = SimClock(loop, self.settings.time_scale)
        workers = self.launch.dp * self.launch.attn_dp
        self.engines = [BatchEngine(capacity=self.plan.max_running_requests,
                                    max_total_tokens=self.plan.max_total_num_tokens, timing=self.timing,
                                    clock=clock, page_size=self.launch.page_size,
                                    decode_reserve_tokens=decode_reserve_tokens(self.launch),
                                    conservativeness=self.args.schedule_conservativeness,
                                    max_prefill_tokens=self.launch.max_prefill_tokens)
                        for _ in range(workers)]
        for rank, engine in enumerate(self.engines):
            engine.decode_logger = self._log_decode_batch
            engine.prefill_logger = self._log_prefill_batch
            engine.dp_rank = rank
            engine.mamba_slots_per_request = self.plan.mamba_ratio if self.model.is_hybrid else None

    def _usage_parts(self, engine: BatchEngine, *, decode: bool) -> list[str]:
        """The pool fields of a batch line: ``PoolStats.get_decode_usage_msg_parts`` and
        ``get_prefill_usage_msg_parts`` (``scheduler_components/pool_stats_observer.py``). A hybrid (Mamba) model
        reports full-attention tokens and Mamba slots, a dense one its tokens."""
        pool = self.plan.max_total_num_tokens
        used = engine.used_tokens
        if not self.model.is_hybrid:
            return [f"#token: {used}", f"token usage: {used / pool:.2f}"] if decode else \
                [f"token usage: {used / pool:.2f}"]
        slots = engine.running * self.plan.mamba_ratio
        mamba = f"mamba usage: {slots / self.plan.max_mamba_cache_size:.2f}"
        if decode:
            return [f"#full token: {used}", f"full token usage: {used / pool:.2f}", f"mamba num: {slots}", mamba]
        return [f"full token usage: {used / pool:.2f}", mamba]

    def _log_decode_batch(self, engine: BatchEngine) -> None:
        """``report_decode_stats``'s line (``scheduler_components/metrics_reporter.py``)."""
        parts = [f"Decode batch, #running-req: {engine.running}", *self._usage_parts(engine, decode=True)]
        if self.launch.spec_algorithm:
            accept = self.timing.accept_length
            parts += [f"accept len: {accept:.2f}", f"accept rate: {(accept - 1) / max(1, self.launch.spec_steps):.2f}"]
        parts += [f"cuda graph: {self.launch.decode_graph}", f"gen throughput (token/s): {engine.throughput():.2f}",
                  f"#queue-req: {engine.waiting}"]
        log(", ".join(parts), rank=0, dp_rank=engine.dp_rank)

    def _log_prefill_batch(self, engine: BatchEngine, new_seqs: int, new_tokens: int, running: int) -> None:
        """``report_prefill_stats``'s line (``scheduler_components/metrics_reporter.py``); the input throughput
        is over the simulated time since the engine's previous prefill line."""
        now = engine.clock.now()
        gap = now - self._last_prefill.get(engine.dp_rank, 0.0)
        self._last_prefill[engine.dp_rank] = now
        throughput = new_tokens / gap if gap > 0 else 0.0
        parts = ["Prefill batch", f"#new-seq: {new_seqs}", f"#new-token: {new_tokens}", "#cached-token: 0",
                 *self._usage_parts(engine, decode=False), f"#running-req: {running}",
                 f"#queue-req: {engine.waiting}", "#pending-token: 0", f"cuda graph: {self.launch.prefill_graph}",
                 f"input throughput (token/s): {throughput:.2f}"]
        log(", ".join(parts), rank=0, dp_rank=engine.dp_rank)

    async def generate(self, prompt_tokens: int, output_tokens: int, *, max_new_tokens: int | None = None,
                       counted: bool = True) -> JobResult:
        """Run one generation of ``output_tokens`` under a ``max_new_tokens`` budget; ``counted`` ones
        (API requests, not health checks) drive the faults."""
        # DP workers: the least loaded takes the request, as SGLang's load-balancing controller does
        engine = min(self.engines, key=lambda e: e.running + e.waiting) if len(self.engines) > 1 \
            else self.engines[0]
        rid = uuid.uuid4().hex
        self.in_flight.add(rid)
        try:
            result = await engine.submit(prompt_tokens, output_tokens, max_new_tokens, metered=counted)
        finally:
            self.in_flight.discard(rid)
        if counted and self.ready:
            self._after_request()
        return result

    def _after_request(self) -> None:
        self.finished_after_ready += 1
        done = self.finished_after_ready
        if self.faults.crash_after_requests is not None and done == self.faults.crash_after_requests:
            log("Received sigquit from a child process. It usually means the child failed.")
            # let the N-th response leave, then die the way an OOM kill does: no cleanup at all
            asyncio.get_running_loop().call_later(0.05, os.kill, os.getpid(), signal.SIGKILL)
        if self.faults.hang_after_requests is not None and done == self.faults.hang_after_requests:
            self.hung = True
            for engine in self.engines:
                engine.freeze()

    # ---- bodies ----
    def output_ids(self, count: int, offset: int) -> list[int]:
        start = offset % len(self._output_ids)
        ids = self._output_ids[start:start + count]
        while len(ids) < count:
            ids.extend(self._output_ids[:count - len(ids)])
        return ids

    def spec_meta(self, result: JobResult) -> dict:
        accept = self.timing.accept_length
        proposed = result.decode_steps * self.launch.spec_steps
        correct = max(0, result.completion_tokens - result.decode_steps)
        return {"spec_accept_rate": round((accept - 1) / max(1, self.launch.spec_steps), 4),
                "spec_accept_length": round(accept, 4), "spec_num_correct_drafts": correct,
                "spec_num_proposed_drafts": proposed, "spec_verify_ct": result.decode_steps}

    def model_info(self) -> dict:
        return {"model_path": self.args.model_path, "served_model_name": self.served_model_name,
                "tokenizer_path": self.args.tokenizer_path or self.args.model_path, "is_generation": True,
                "preferred_sampling_params": self.args.preferred_sampling_params,
                "weight_version": self.args.weight_version, "load_format": self.args.load_format,
                "reasoning_parser": self.args.reasoning_parser, "tool_call_parser": self.args.tool_call_parser,
                "disaggregation_mode": "null",
                # ModelConfig.is_image_understandable_model: multimodal and a vision tower
                "has_image_understanding": (self.model.is_multimodal and not self.args.language_model_only
                                            and self.model.vision_tower is not None),
                "has_audio_understanding": False, "model_type": self.model.model_type,
                "architectures": self.architectures, "embedding": self.embedding_plan()}

    def embedding_plan(self) -> dict:
        """``/model_info`` ``embedding``: ``resolved_embedding_plan`` (``sglang/srt/configs/embedding_model_spec.py``)
        of a generation model, whose embedding spec is the empty one."""
        launch = self.launch
        return {"family": "none", "task": "none", "execution": "none", "attention": "none",
                "pooling": "model_defined", "normalize": False, "postprocessor": "none",
                "tokenizer_special_tokens": "model_default", "supports_dimensions": False,
                "supports_token_embeddings": False, "supports_multimodal": False, "requires_embedding_flag": False,
                "auto_enable_embedding": False, "bcg_eligibility": "disabled", "safe_disable_kv_cache": False,
                "safe_disable_radix_cache": False, "safe_disable_chunked_prefill": False, "enabled": False,
                "matryoshka_dimensions": [],
                "bcg": {"prefill_backend": "breakable" if launch.prefill_graph else "disabled",
                        "enabled": bool(launch.prefill_graph),
                        "capture_token_budget": max(launch.prefill_bs) if launch.prefill_bs else None,
                        "capture_batch_sizes": list(launch.prefill_bs)},
                "cache": {"kv_cache_disabled": False, "radix_cache_disabled": bool(self.args.disable_radix_cache),
                          "chunked_prefill_disabled": launch.chunked_prefill_size == -1}}

    def resolved_args(self) -> dict:
        args = dict(vars(self.args))
        args.pop("api_key", None)  # the info endpoints do not echo the secret
        args.pop("config", None)  # SGLang turns the --config file into flags and keeps no field for it
        launch = self.launch
        args.update({
            # resolved as SGLang resolves them (sglang/srt/arg_groups/serving_hook.py)
            "tokenizer_path": self.args.tokenizer_path or self.args.model_path,
            "served_model_name": self.served_model_name, "random_seed": self.random_seed,
            "mm_feature_transport": self.args.mm_feature_transport or "cpu", "device": self.args.device or "cuda",
            "mem_fraction_static": launch.mem_fraction_static, "chunked_prefill_size": launch.chunked_prefill_size,
            "max_running_requests": launch.max_running_requests, "context_length": self.args.context_length,
            "speculative_algorithm": launch.spec_algorithm, "speculative_num_steps": launch.spec_steps or None,
            "speculative_eagle_topk": launch.spec_topk or None,
            "speculative_num_draft_tokens": launch.spec_draft_tokens or None,
            "page_size": launch.page_size, "disable_overlap_schedule": launch.overlap_disabled,
            "mamba_full_memory_ratio": launch.mamba_full_memory_ratio,
            # a resolvable field: /server_info answers its fallback when unset (arg_groups/fields/schedule.py)
            "swa_full_tokens_ratio": launch.swa_full_tokens_ratio,
            "mamba_radix_cache_strategy": launch.mamba_strategy or self.args.mamba_radix_cache_strategy,
            "tp_size": launch.tp, "dp_size": launch.dp, "attn_dp_size": launch.attn_dp,
            # the --cuda-graph-max-bs-* fields stay as given: the resolved sizes are in cuda_graph_config
            # (sglang/srt/arg_groups/cuda_graph_hook.py)
            "cuda_graph_config": {"decode": {"backend": "full" if launch.decode_graph else "disabled",
                                             "max_bs": launch.decode_max_bs},
                                  "prefill": {"backend": "breakable" if launch.prefill_graph else "disabled",
                                              "max_bs": max(launch.prefill_bs) if launch.prefill_bs else None}},
        })
        return args

    def capacity(self) -> dict:
        engine = self.engines[0]
        batch = self.plan.max_running_requests
        return {"time_scale": self.settings.time_scale, "speed": self.faults.speed,
                "max_running_requests": batch, "workers": len(self.engines),
                "step_ms_at_full_batch": round(self.timing.step_seconds(batch, engine.full_batch_context()) * 1000, 3),
                "request_tokens_per_s_at_full_batch": round(
                    self.timing.request_rate(batch, engine.full_batch_context()), 3),
                "decode_tokens_per_s_at_full_batch": round(engine.full_batch_throughput() * len(self.engines), 3),
                "prefill_tokens_per_s": round(1 / self.timing.prefill_s_per_token, 1)
                if self.timing.prefill_s_per_token else None,
                "accept_length": self.timing.accept_length,
                "running": sum(e.running for e in self.engines), "waiting": sum(e.waiting for e in self.engines),
                "finished": sum(e.stats.finished for e in self.engines),
                "generated_tokens": sum(e.stats.generated_tokens for e in self.engines),
                # SGLang has no peak gauge; the simulator keeps the peak of what it would report
                "peak_used_tokens": max(e.stats.peak_used_tokens for e in self.engines),
                "decode_steps": round(sum(e.stats.decode_steps for e in self.engines))}

    def server_info(self) -> dict:
        plan, launch = self.plan, self.launch
        args = self.resolved_args()
        info = dict(args)
        # launch_command: the arguments as given, without the interpreter and module (sglang/srt/server_args.py)
        info.update({"launch_command": " ".join(self.argv), "custom_sigquit_handler": None,
                     "status": "ready" if self.ready else "starting",
                     "max_total_num_tokens": plan.max_total_num_tokens, "max_req_input_len": plan.max_req_input_len,
                     "startup_time": {**self.startup_time(), "tokenizer_e2e": round(self.startup_seconds, 3)},
                     "hicache_object_layout": self.hicache_layout(),
                     "kv_events": None, "version": VERSION, "frontend": "python"})
        memory = {"weight": round(self.weights_bytes / launch.tp / GB, 3), "kvcache": round(plan.kv_bytes / GB, 3),
                  "startup_available": round(plan.pre_load_free_bytes / GB, 3),
                  "token_capacity": plan.max_total_num_tokens, "token_capacity_swa": plan.swa_max_total_num_tokens,
                  "graph": {phase: round(value / GB, 3) for phase, value in self.graph_memory_by_phase().items()}}
        states = []
        for engine in self.engines:
            state = dict(args)
            state.update({"max_mamba_cache_size": plan.max_mamba_cache_size if self.model.is_hybrid
                          else args.get("max_mamba_cache_size"),
                          "effective_max_running_requests_per_dp": plan.max_running_requests,
                          "world_size": launch.tp * launch.pp, "last_gen_throughput": round(engine.throughput(), 3),
                          "memory_usage": memory, "startup_time": self.startup_time(),
                          # scheduler_components/internal_state.py: the captured decode sizes and their graphs
                          "decode_cuda_graph_bs": list(decode_capture_sizes(launch, plan.max_running_requests))
                          if launch.decode_graph else [],
                          "decode_cuda_graph_memory_gb": round(self.graphs.decode_bytes / GB, 3),
                          # the scheduler's counters under their /metrics names, readable without
                          # --enable-metrics, with the simulator's own figures (SGLang has no such key)
                          "sim": {**self.capacity(), **self.scheduler_counters()}})
            if launch.spec_algorithm:
                state["avg_spec_accept_length"] = self.timing.accept_length
            states.append(state)
        info["internal_states"] = states
        return info

    def startup_time(self) -> dict:
        """The scheduler's start-up durations in seconds (``sglang/srt/observability/startup_time.py``), each
        graph phase's capture time in the share of its graph memory."""
        phases = self.startup_phases
        memory = self.graph_memory_by_phase()
        total = sum(memory.values())
        capture = phases.get("cuda_graph_seconds", 0.0)
        return {"load_weight": round(phases.get("load_weight", 0.0), 3),
                "kv_cache_allocation": round(phases.get("kv_cache_allocation", 0.0), 3),
                "scheduler_e2e": round(phases.get("scheduler_e2e", self.startup_seconds), 3),
                "cuda_graph": {phase: round(capture * size / total, 3) if total else 0.0
                               for phase, size in memory.items()}}

    def hicache_layout(self) -> dict:
        """``/server_info`` ``hicache_object_layout`` (``sglang/srt/entrypoints/http_server.py``); the simulator
        models no host cache, so the layout holds no pools."""
        enabled = bool(self.args.enable_hierarchical_cache)
        return {"enabled": enabled, "backend": None, "page_size": self.launch.page_size,
                "hicache_object_layout": {"pools": []},
                "reason": None if enabled else "Hierarchical cache is disabled"}

    def scheduler_counters(self) -> dict:
        """Retraction and KV-usage figures under SGLang's metric names (``observability/metrics_collector.py``),
        summed over the DP workers; usage shares are of the whole fleet of workers' pools."""
        engines = self.engines
        pool = self.plan.max_total_num_tokens * len(engines)
        used = sum(e.used_tokens for e in engines)
        mamba_slots = self.plan.max_mamba_cache_size * len(engines) if self.model.is_hybrid else 0
        mamba_used = sum(e.running for e in engines) * self.plan.mamba_ratio if mamba_slots else 0
        full_usage = used / pool
        mamba_usage = mamba_used / mamba_slots if mamba_slots else 0.0
        return {"num_retracted_requests_total": sum(e.stats.retracted_requests for e in engines),
                "num_retracted_input_tokens_total": sum(e.stats.retracted_input_tokens for e in engines),
                "num_retracted_output_tokens_total": sum(e.stats.retracted_output_tokens for e in engines),
                "num_retracted_reqs": sum(e.stats.last_retracted for e in engines),
                "num_used_tokens": used, "full_token_usage": round(full_usage, 6),
                "mamba_usage": round(mamba_usage, 6), "token_usage": round(max(full_usage, mamba_usage), 6),
                "new_token_ratio": round(min(e.new_token_ratio for e in engines), 6)}

    def graph_memory_by_phase(self) -> dict[str, int]:
        """Captured-graph bytes under SGLang's phase names (model_executor/graph_memory_usage.py). Under
        EAGLE-family decoding the decode pool holds the target-verify, draft-decode and draft-extend graphs
        (one third each, as graphs.py charges them)."""
        phases = dict.fromkeys(("prefill", "decode", "target_verify", "draft_prefill", "draft_decode",
                                "draft_extend"), 0)
        phases["prefill"] = self.graphs.prefill_bytes
        if self.launch.spec_algorithm:
            third = self.graphs.decode_bytes // 3
            phases.update(target_verify=self.graphs.decode_bytes - 2 * third, draft_decode=third, draft_extend=third)
        else:
            phases["decode"] = self.graphs.decode_bytes
        return phases

    def metrics_text(self) -> str:
        return observability.metrics_text(self)
