"""Shared helpers for the simulator tests: the seed scenario's flags and an in-process sizing run."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest

from sglang_sim.args import parse_args
from sglang_sim.faults import Faults
from sglang_sim.graphs import graph_memory
from sglang_sim.modelcfg import ModelShape, load_model_dir
from sglang_sim.node import SimSettings
from sglang_sim.perf import derive_timing
from sglang_sim.pools import PoolPlan, size_pools
from sglang_sim.resolve import Launch, resolve_launch
from sglang_sim.service import Service

MODELS = Path(__file__).resolve().parents[3] / "include" / "sglang_sim" / "models"
B200_MIB = 183_359
MIB = 1 << 20
GIB = 1 << 30
SEED_WEIGHTS = 54_000_000_000
# The seed scenario (docs/sglang-memory-model.md §4.2): NEXTN 3/1/4, extra_buffer with overlap,
# context 8192, reasoning parser
SEED_ARGS = ["--model-path", "/models/qwen3.6-27b", "--speculative-algorithm", "NEXTN",
             "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
             "--speculative-num-draft-tokens", "4", "--mamba-radix-cache-strategy", "extra_buffer",
             "--context-length", "8192", "--reasoning-parser", "qwen3"]
BEFORE = ["--max-mamba-cache-size", "80"]
AFTER = ["--max-mamba-cache-size", "200", "--mem-fraction-static", "0.93", "--max-running-requests", "64"]


def preset(name: str) -> ModelShape:
    return load_model_dir(MODELS / name)[0]


def b200_pre_load_free() -> int:
    """Free bytes on an idle simulated B200 after a tp1 server's CUDA context."""
    settings = SimSettings()
    return (B200_MIB - settings.driver_baseline_mib - settings.cuda_context_mib) * MIB


def seed_run(extra: list[str], *, weights: int = SEED_WEIGHTS) -> tuple[Launch, PoolPlan]:
    model = preset("qwen3.6-27b")
    launch = resolve_launch(parse_args(SEED_ARGS + extra), model, [B200_MIB] * 7, gpu_name="NVIDIA B200")
    pre = b200_pre_load_free()
    return launch, size_pools(model, launch, pre, pre - weights)


def seed_capture_fits(extra: list[str]) -> bool:
    launch, plan = seed_run(extra)
    need = graph_memory(preset("qwen3.6-27b"), launch, plan.max_running_requests,
                        SimSettings().runtime_workspace_mib)
    free_after_pools = b200_pre_load_free() - SEED_WEIGHTS - plan.pool_bytes
    return need.total_bytes <= free_after_pools


def make_service(extra: list[str], *, faults: Faults | None = None, time_scale: float = 10_000.0,
                 base: list[str] = SEED_ARGS) -> Service:
    """A seed-scenario Service as the server would build it, without a process or a port."""
    faults = faults or Faults()
    model = preset("qwen3.6-27b")
    args = parse_args(base + extra)
    launch = resolve_launch(args, model, [B200_MIB], gpu_name="NVIDIA B200")
    pre = b200_pre_load_free()
    plan = size_pools(model, launch, pre, pre - SEED_WEIGHTS)
    settings = SimSettings(time_scale=time_scale)
    graphs = graph_memory(model, launch, plan.max_running_requests, settings.runtime_workspace_mib)
    timing = derive_timing(model, launch, settings, "NVIDIA B200", SEED_WEIGHTS, plan.allocated_kv_cell_bytes,
                           plan.mamba_slot_bytes, speed=faults.speed)
    return Service(args=args, argv=base + extra, model=model, architectures=["Qwen3_5ForConditionalGeneration"],
                   launch=launch, plan=plan, graphs=graphs, timing=timing, settings=settings, faults=faults,
                   weights_bytes=SEED_WEIGHTS, startup_seconds=1.0, gpu_name="NVIDIA B200")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def tools():
    """This module: the seed flags and helpers above (tests cannot import conftest by name)."""
    return sys.modules[__name__]
