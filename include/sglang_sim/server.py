"""``python -m sglang_sim.server <SGLang flags>``: the stand-in for ``python -m sglang.launch_server``.

Start-up follows SGLang's order (docs/sglang-memory-model.md §2, §5): CUDA context on each GPU, pre-load free memory
(min over the server's GPUs), weights, pool sizing, pools, CUDA-graph capture, then the HTTP port
opens, a warm-up request runs and ``/health`` turns 200. Each step registers this process's memory
on the node (``state/gpu<i>/<pid>.json``) so ``nvidia-smi`` shows it; the files go on exit/SIGTERM
(and a killed process's files are ignored by readers). Failures print SGLang's messages and exit 1.
GPUs come from ``CUDA_VISIBLE_DEVICES`` (indices or UUIDs; all node GPUs when unset), the node from
``$FLEETGEN_SIM_NODE``.
"""

from __future__ import annotations

import os
import signal
import sys
import time
import traceback

from sglang_sim.errors import SimError
from sglang_sim.args import parse_args
from sglang_sim.faults import read_faults
from sglang_sim.graphs import capture_failure, graph_memory
from sglang_sim.modelcfg import ModelShape, load_model_dir
from sglang_sim.node import SimNode
from sglang_sim.perf import derive_timing
from sglang_sim.pools import (GB, PoolPlan, cuda_oom_error, kv_oom_error, mamba_oom_error, size_pools,
                                weights_oom_error)
from sglang_sim.resolve import Launch, LaunchError, resolve_launch
from sglang_sim.gpu_load import remove_load
from sglang_sim.simlog import log, prefix, set_parallel

MIB = 1 << 20
# share of sim.load_seconds spent in each start-up phase
PHASES = {"context": 0.05, "weights": 0.6, "pools": 0.1, "graphs": 0.25}


class OutOfMemoryError(RuntimeError):
    """Printed as ``torch.OutOfMemoryError`` like PyTorch's own."""


OutOfMemoryError.__module__ = "torch"


class _Terminated(BaseException):
    pass


def _on_sigterm(signum, frame):
    raise _Terminated()


def _exception_text(exc_type: str, message: str) -> str:
    cls = {"ValueError": ValueError, "RuntimeError": RuntimeError, "OutOfMemoryError": OutOfMemoryError}.get(
        exc_type, Exception)
    try:
        raise cls(message) from None
    except BaseException:  # format a real traceback ending in "<Type>: <message>"
        return traceback.format_exc().rstrip("\n")


def _die_in_scheduler(err: LaunchError, rank: int = 0) -> int:
    # the scheduler's traceback ends in a newline, hence the blank line (sglang/srt/managers/scheduler.py)
    log(f"Scheduler hit an exception: {_exception_text(err.exc_type, err.message)}\n", rank=rank)
    # the launcher's SIGQUIT handler, which then kills the process tree (sglang/srt/entrypoints/engine.py)
    log("Received sigquit from a child process. It usually means the child failed.")
    log(f"kill_process_tree called: parent_pid={os.getpid()}, include_parent=True, pid={os.getpid()}")
    return 1


class Startup:
    """Runs the start-up phases and owns this process's memory registrations.

    The process counts its own memory in bytes (what ``torch.cuda.mem_get_info`` sees); the node
    shows it rounded up to whole MiB, as nvidia-smi does.
    """

    def __init__(self, node: SimNode, gpu_indices: list[int]) -> None:
        self.node = node
        self.gpus = gpu_indices
        self.pid = os.getpid()
        self.used_bytes = {i: 0 for i in gpu_indices}

    @property
    def used_mib(self) -> dict[int, int]:
        return {i: -(-used // MIB) for i, used in self.used_bytes.items()}

    def gpu_free_bytes(self, index: int) -> int:
        """Free bytes on one GPU as this process measures them: the node's free MiB, with this
        process's own MiB rounding given back."""
        return self.node.free_mib(index) * MIB + self.used_mib[index] * MIB - self.used_bytes[index]

    def free_bytes(self) -> int:
        return min(self.gpu_free_bytes(i) for i in self.gpus)

    def allocate(self, per_gpu_bytes: int, what: str) -> None:
        """Register ``per_gpu_bytes`` more on each GPU, or fail like a CUDA allocation would."""
        for rank, index in enumerate(self.gpus):
            free = self.gpu_free_bytes(index)
            if per_gpu_bytes > free:
                raise cuda_oom_error(per_gpu_bytes, rank, self.node.gpu(index).total_mib, free,
                                     self.used_bytes[index], what)
        for rank, index in enumerate(self.gpus):
            self.used_bytes[index] += per_gpu_bytes
            # the scheduler's process title (sglang/srt/managers/scheduler.py): ranks as in its log prefix
            title = "sglang::scheduler" + prefix(rank % 1000).replace(" ", "_")
            self.node.set_holder(index, self.pid, title, self.used_mib[index])

    def release(self) -> None:
        for index in self.gpus:
            self.node.remove_holder(index, self.pid)
        remove_load(self.node, self.pid)


def _visible_gpus(node: SimNode, launch: Launch, base: int, step: int) -> list[int]:
    raw = os.environ.get("CUDA_VISIBLE_DEVICES")
    if raw is None:
        visible = [g.index for g in node.gpus]
    else:
        visible = []
        for ident in (p.strip() for p in raw.split(",") if p.strip()):
            match = [g.index for g in node.gpus if ident in (str(g.index), g.uuid)]
            if not match:
                break  # CUDA stops enumerating at the first invalid entry
            visible.append(match[0])
    wanted = [base + rank * step for rank in range(launch.gpus_needed)]
    if any(w >= len(visible) for w in wanted):
        raise LaunchError("RuntimeError", "CUDA error: invalid device ordinal\nCUDA kernel errors might be "
                          "asynchronously reported at some other API call, so the stacktrace below might be "
                          "incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1", kind="gpus",
                          in_scheduler=True)
    return [visible[w] for w in wanted]


def _log_kv(launch: Launch, model: ModelShape, tokens: int, kv_bytes: int) -> None:
    if model.is_mla:
        log(f"KV Cache is allocated. #tokens: {tokens}, KV size: {kv_bytes / GB:.2f} GB", rank=0)
    else:
        half = kv_bytes / 2 / GB
        log(f"KV Cache is allocated. dtype: {launch.kv_dtype_name}, #tokens: {tokens}, "
            f"K size: {half:.2f} GB, V size: {half:.2f} GB", rank=0)


def _log_pools(model: ModelShape, launch: Launch, plan: PoolPlan) -> None:
    if model.is_hybrid:
        conv = plan.mamba_conv_slot_bytes
        ssm = plan.mamba_slot_bytes - conv
        slots = plan.max_mamba_cache_size + 1
        message = (f"Mamba Cache is allocated. max_mamba_cache_size: {plan.max_mamba_cache_size}, conv_state size: "
                   f"{slots * conv / GB:.2f}GB, ssm_state size: {slots * ssm / GB:.2f}GB ")
        if launch.spec_algorithm:  # the draft states' caches exist only under speculative decoding
            inter = (plan.spec_state_requests + 1) * launch.spec_draft_tokens
            message += (f"intermediate_ssm_state_cache size: {inter * ssm / GB:.2f}GB "
                        f"intermediate_conv_window_cache size: {inter * conv / GB:.2f}GB ")
        log(message, rank=0)  # sglang/srt/mem_cache/memory_pool.py, trailing space included
    _log_kv(launch, model, plan.max_total_num_tokens, plan.kv_bytes)


def run(argv: list[str]) -> int:
    started = time.monotonic()
    args = parse_args(argv)
    shown = {k: ("***" if k == "api_key" and v else v) for k, v in vars(args).items()}
    log(f"server_args={shown!r}")  # a dict, as SGLang prints it (sglang/srt/entrypoints/engine.py)
    try:
        node = SimNode.from_env()
        model, config, weights = load_model_dir(args.model_path)
        draft_model, draft_weights = None, 0
        if args.speculative_draft_model_path:
            draft_model, _, draft_weights = load_model_dir(args.speculative_draft_model_path)
        faults = read_faults(node.path, args.port)
    except SimError as exc:
        sys.stderr.write(_exception_text("RuntimeError", str(exc)) + "\n")
        return 1
    try:
        # SGLang probes the GPU it runs on: the first visible one names the generation.
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
        first = node.gpu(int(visible)) if visible.isdigit() else node.gpus[0]
        launch = resolve_launch(args, model, [g.total_mib for g in node.gpus], draft_model, gpu_name=first.name)
    except LaunchError as err:
        sys.stderr.write(_exception_text(err.exc_type, err.message) + "\n")
        return 1
    except ValueError as err:
        sys.stderr.write(_exception_text("ValueError", str(err)) + "\n")
        return 1
    set_parallel(tp_size=launch.tp, dp_size=launch.dp * launch.attn_dp)
    for message in launch.messages:
        log(message)
    startup = None
    try:
        try:
            startup = Startup(node, _visible_gpus(node, launch, args.base_gpu_id, args.gpu_id_step))
            service = _start_scheduler(args, argv, node, startup, model, config, launch, weights, draft_model,
                                       draft_weights, faults, started)
            service.gpu_load_target = (node, list(startup.gpus))
        except LaunchError as err:
            return _die_in_scheduler(err)
        from sglang_sim.serve import serve
        return serve(service)
    finally:
        if startup is not None:
            startup.release()


def _start_scheduler(args, argv, node, startup: Startup, model, config, launch, weights, draft_model,
                     draft_weights, faults, started):
    scheduler_start = time.monotonic()
    settings = node.sim
    load = settings.load_seconds
    if args.load_format == "dummy":
        # random weights, no files: SGLang's DummyModelLoader allocates every parameter
        # (sglang/srt/model_loader/loader.py)
        weights = model.param_count() * model.dtype_bytes if weights is None else weights
        if draft_model is not None and draft_weights is None:
            draft_weights = draft_model.param_count() * draft_model.dtype_bytes
    for path, found in ((args.model_path, weights), (args.speculative_draft_model_path, draft_weights)):
        if path and found is None:
            raise LaunchError("RuntimeError", f"Cannot find any model weights with `{path}`",
                              kind="weights_missing", in_scheduler=True)
    startup.allocate((settings.cuda_context_mib + (settings.nccl_mib if launch.tp > 1 else 0)) * MIB,
                     "context")
    time.sleep(load * PHASES["context"])
    frees = [startup.gpu_free_bytes(i) / GB for i in startup.gpus]
    if launch.tp > 1 and min(frees) < 0.9 * max(frees):
        pre_model_load_memory, local_gpu_memory = min(frees), max(frees)
        msg = ("The memory capacity is unbalanced. Some GPUs may be occupied by other processes. "
               f"{pre_model_load_memory=}, {local_gpu_memory=}, {local_gpu_memory * 0.9=}")
        if os.environ.get("SGLANG_ENABLE_TP_MEMORY_INBALANCE_CHECK", "").lower() in ("1", "true"):
            raise LaunchError("RuntimeError", msg, kind="unbalanced", in_scheduler=True)
        log(msg, rank=frees.index(local_gpu_memory))
    pre_free = startup.free_bytes()
    log(f"Load weight begin. avail mem={pre_free / GB:.2f} GB", rank=0)
    weight_start = time.monotonic()
    # MTP (NEXTN) layers are part of the target checkpoint's total_size; a separate draft model adds its own
    per_gpu_weights = (weights + draft_weights) // launch.tp
    startup.allocate(per_gpu_weights, "weights")
    time.sleep(load * PHASES["weights"] + faults.slow_start_seconds)
    weight_seconds = time.monotonic() - weight_start
    available = startup.free_bytes()
    log(f"Load weight end. elapsed={time.monotonic() - weight_start:.2f} s, type={model.architecture}, "
        f"avail mem={available / GB:.2f} GB, mem usage={per_gpu_weights / GB:.2f} GB.", rank=0)

    fault = faults.fail_at_launch
    rest_gb = available / GB - pre_free / GB * (1 - launch.mem_fraction_static) - launch.mm_reservation_mb / 1024
    if fault == "oom":
        raise kv_oom_error(launch)
    if fault == "weights_oom":
        raise weights_oom_error(launch, available / GB, pre_free / GB)
    if fault == "mamba_oom":
        conv, ssm = model.mamba_bytes_per_slot(launch.tp, launch.ssm_dtype_bytes)
        raise mamba_oom_error(0, rest_gb, conv + ssm)
    plan = size_pools(model, launch, pre_free, available, draft_model)
    for warning in plan.warnings:
        log(warning, rank=0)
    pools_start = time.monotonic()
    startup.allocate(plan.target_pool_bytes, "pools")
    _log_pools(model, launch, plan)
    if plan.draft_kv_bytes:  # the draft worker's own pool, same token count (Scheduler.init_memory_pools)
        startup.allocate(plan.draft_kv_bytes, "draft_pool")
        _log_kv(launch, model, plan.max_total_num_tokens, plan.draft_kv_bytes)
    time.sleep(load * PHASES["pools"])
    pools_seconds = time.monotonic() - pools_start
    log(f"Memory pool end. avail mem={startup.free_bytes() / GB:.2f} GB", rank=0)

    graphs = graph_memory(model, launch, plan.max_running_requests, settings.runtime_workspace_mib)
    free = startup.free_bytes()
    capture_start = time.monotonic()
    if launch.decode_graph or launch.prefill_graph:
        log(f"Capture cuda graph begin. This can take up to several minutes. avail mem={free / GB:.2f} GB", rank=0)
        gpu_total = min(node.gpu(i).total_mib for i in startup.gpus) * MIB
        process = startup.used_bytes[startup.gpus[0]]
        failure = capture_failure(graphs, 0 if fault == "cuda_graph_oom" else free, gpu_total, process)
        if failure:
            raise LaunchError("Exception", failure, kind="oom_cuda_graph", in_scheduler=True)
    startup.allocate(graphs.total_bytes, "graphs")
    time.sleep(load * PHASES["graphs"])
    capture_seconds = time.monotonic() - capture_start if launch.decode_graph or launch.prefill_graph else 0.0
    if launch.decode_graph or launch.prefill_graph:
        log(f"Capture cuda graph end. Time elapsed: {time.monotonic() - capture_start:.2f} s. "
            f"mem usage={graphs.total_bytes / GB:.2f} GB. avail mem={startup.free_bytes() / GB:.2f} GB.", rank=0)
    log(f"max_total_num_tokens={plan.max_total_num_tokens}, chunked_prefill_size={launch.chunked_prefill_size}, "
        f"max_prefill_tokens={launch.max_prefill_tokens}, max_running_requests={plan.max_running_requests}, "
        f"context_len={launch.context_len}, available_gpu_mem={startup.free_bytes() / GB:.2f} GB", rank=0)

    from sglang_sim.service import Service
    gpu_name = node.gpu(startup.gpus[0]).name
    timing = derive_timing(model, launch, settings, gpu_name, weights + draft_weights,
                           plan.allocated_kv_cell_bytes, plan.mamba_slot_bytes, speed=faults.speed)
    return Service(args=args, argv=argv, model=model, architectures=list(config.get("architectures") or []),
                   launch=launch, plan=plan, graphs=graphs, timing=timing, settings=settings, faults=faults,
                   weights_bytes=weights + draft_weights, startup_seconds=time.monotonic() - started,
                   gpu_name=gpu_name, startup_phases={"load_weight": weight_seconds,
                                                      "kv_cache_allocation": pools_seconds,
                                                      "scheduler_e2e": time.monotonic() - scheduler_start,
                                                      "cuda_graph_seconds": capture_seconds})


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        return run(sys.argv[1:] if argv is None else argv)
    except (_Terminated, KeyboardInterrupt):
        return 143


if __name__ == "__main__":
    sys.exit(main())
