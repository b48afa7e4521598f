"""A launch's start-up memory without a process: what ``python -m sglang_sim.server ARGV`` would
measure, size, allocate and capture on a node, or the SGLang error it would die with.

The steps and byte counts are the server's (server.py, docs/sglang-memory-model.md §2, §5): the new process's CUDA
context (+ NCCL buffers when tp > 1) comes out of the free memory nvidia-smi shows, the rest is the
pre-load baseline (min over the server's GPUs); the weights load; the state and KV pools are sized
(pools.py) and allocated, then the draft worker's KV pool; then CUDA graphs are captured in what is
left (graphs.py). Nothing is registered on the node and nothing sleeps, so this is the cheap way to
ask the simulator what a flag set gives.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass

from sglang_sim.args import parse_args
from sglang_sim.graphs import GraphMemory, capture_failure, graph_memory
from sglang_sim.modelcfg import ModelShape, load_model_dir
from sglang_sim.node import SimNode, SimSettings
from sglang_sim.pools import PoolPlan, cuda_oom_error, size_pools
from sglang_sim.resolve import Launch, LaunchError, resolve_launch

MIB = 1 << 20


@dataclass(frozen=True)
class GpuMemory:
    """One GPU as nvidia-smi shows it before the launch: total and free MiB (free = total - used,
    used = driver baseline + every process holding memory)."""

    index: int
    total_mib: int
    free_mib: int

    def __post_init__(self) -> None:
        if self.total_mib <= 0 or not 0 <= self.free_mib <= self.total_mib:
            raise ValueError(f"GPU {self.index}: free {self.free_mib} MiB must lie within [0, {self.total_mib}]")


@dataclass(frozen=True)
class StartupSizing:
    """What a server that starts ends up with, per GPU."""

    launch: Launch
    plan: PoolPlan
    graphs: GraphMemory
    process_overhead_bytes: int     # CUDA context (+ NCCL) taken before the baseline
    pre_load_free_bytes: int
    weights_bytes_per_gpu: int
    free_at_capture_bytes: int      # after weights and every pool, before graph capture

    @property
    def free_after_start_bytes(self) -> int:
        return self.free_at_capture_bytes - self.graphs.total_bytes

    def server_info_limits(self) -> dict:
        """The values /server_info reports for this launch (rank 0; every data-parallel replica sizes the
        same on equally free GPUs), with the SWA pool's tokens for a hybrid-SWA model."""
        limits = {"max_running_requests": self.plan.max_running_requests,
                  "max_mamba_cache_size": self.plan.max_mamba_cache_size if self.plan.mamba_ratio else None,
                  "max_total_num_tokens": self.plan.max_total_num_tokens}
        if self.plan.swa_max_total_num_tokens is not None:
            limits["swa_max_total_num_tokens"] = self.plan.swa_max_total_num_tokens
        return limits


def size_startup(args: argparse.Namespace, model: ModelShape, weights_bytes: int, *, gpus: list[GpuMemory],
                 node_gpu_totals_mib: list[int], settings: SimSettings, draft_model: ModelShape | None = None,
                 draft_weights_bytes: int = 0, gpu_name: str | None = None) -> StartupSizing:
    """Start-up of ``args`` on ``gpus`` (the server's GPUs, rank order). Raises ``LaunchError`` with
    SGLang's message where the server would die. ``node_gpu_totals_mib``: every GPU on the node (the
    automatic heuristics read the smallest)."""
    launch = resolve_launch(args, model, node_gpu_totals_mib, draft_model, gpu_name=gpu_name)
    if len(gpus) != launch.gpus_needed:
        raise ValueError(f"the launch needs {launch.gpus_needed} GPU(s), {len(gpus)} given")
    overhead = (settings.cuda_context_mib + (settings.nccl_mib if launch.tp > 1 else 0)) * MIB
    free = [g.free_mib * MIB for g in gpus]
    used = [0] * len(gpus)

    def allocate(per_gpu: int, what: str) -> None:
        for rank, gpu in enumerate(gpus):
            if per_gpu > free[rank]:
                raise cuda_oom_error(per_gpu, rank, gpu.total_mib, free[rank], used[rank], what)
        for rank in range(len(gpus)):
            free[rank] -= per_gpu
            used[rank] += per_gpu

    allocate(overhead, "context")
    if launch.tp > 1 and min(free) < 0.9 * max(free) and \
            os.environ.get("SGLANG_ENABLE_TP_MEMORY_INBALANCE_CHECK", "").lower() in ("1", "true"):
        pre_model_load_memory, local_gpu_memory = min(free) / (1 << 30), max(free) / (1 << 30)
        raise LaunchError("RuntimeError", "The memory capacity is unbalanced. Some GPUs may be occupied by other "
                          f"processes. {pre_model_load_memory=}, {local_gpu_memory=}, {local_gpu_memory * 0.9=}",
                          kind="unbalanced", in_scheduler=True)
    pre_free = min(free)
    weights_per_gpu = (weights_bytes + draft_weights_bytes) // launch.tp
    allocate(weights_per_gpu, "weights")
    plan = size_pools(model, launch, pre_free, min(free), draft_model)
    allocate(plan.target_pool_bytes, "pools")
    if plan.draft_kv_bytes:
        allocate(plan.draft_kv_bytes, "draft_pool")
    graphs = graph_memory(model, launch, plan.max_running_requests, settings.runtime_workspace_mib)
    at_capture = min(free)
    if launch.decode_graph or launch.prefill_graph:
        failure = capture_failure(graphs, at_capture, min(g.total_mib for g in gpus) * MIB, used[0])
        if failure:
            raise LaunchError("Exception", failure, kind="oom_cuda_graph", in_scheduler=True)
    return StartupSizing(launch=launch, plan=plan, graphs=graphs, process_overhead_bytes=overhead,
                         pre_load_free_bytes=pre_free, weights_bytes_per_gpu=weights_per_gpu,
                         free_at_capture_bytes=at_capture)


def dry_run(node: SimNode, argv: list[str], gpu_indices: list[int]) -> StartupSizing:
    """``size_startup`` for ``argv`` (SGLang flags with ``--model-path`` to an installed model) on the
    node's GPUs ``gpu_indices`` as they are now (live memory holders included)."""
    args = parse_args(argv)
    model, _, weights = load_model_dir(args.model_path)
    draft_model, draft_weights = None, 0
    if args.speculative_draft_model_path:
        draft_model, _, draft_weights = load_model_dir(args.speculative_draft_model_path)
    for path, found in ((args.model_path, weights), (args.speculative_draft_model_path, draft_weights)):
        if path and found is None:
            raise LaunchError("RuntimeError", f"Cannot find any model weights with `{path}`",
                              kind="weights_missing", in_scheduler=True)
    for index in gpu_indices:
        node.gpu(index)  # an unknown index is a ConfigError naming the node
    rows = {row["index"]: row for row in node.gpu_memory()}
    gpus = [GpuMemory(i, rows[i]["total_mib"], rows[i]["free_mib"]) for i in gpu_indices]
    return size_startup(args, model, weights, gpus=gpus, node_gpu_totals_mib=[g.total_mib for g in node.gpus],
                        settings=node.sim, draft_model=draft_model, draft_weights_bytes=draft_weights or 0,
                        gpu_name=node.gpu(gpu_indices[0]).name)
