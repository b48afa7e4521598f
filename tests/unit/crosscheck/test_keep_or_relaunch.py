"""Keep or relaunch: a running server's /server_info (the simulator's, built from the launch argv exactly as
fleetgen builds it) against tonight's launch flags. Equal plan, model and version: kept; any change: relaunched."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetgen.nodes import remote
from fleetgen.nodes.readiness import args_as_flags, launch_differences
import sglang_sim
from sglang_sim import __version__ as SIM_VERSION
from sglang_sim.args import parse_args
from sglang_sim.faults import Faults
from sglang_sim.graphs import graph_memory
from sglang_sim.modelcfg import load_model_dir
from sglang_sim.node import SimSettings
from sglang_sim.perf import derive_timing
from sglang_sim.pools import size_pools
from sglang_sim.resolve import resolve_launch
from sglang_sim.service import Service

B200_MIB = 183_359
SEED_WEIGHTS = 54_000_000_000
# The seed scenario's extra arguments (docs/sglang-memory-model.md §4.2)
SEED_EXTRA_ARGS = ["--speculative-algorithm", "NEXTN", "--speculative-num-steps", "3",
                   "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4",
                   "--mamba-radix-cache-strategy", "extra_buffer", "--context-length", "8192",
                   "--reasoning-parser", "qwen3"]
# Beside the simulator package, wherever it is imported from (mutation testing stages a copy of it).
MODELS = Path(sglang_sim.__file__).resolve().parent / "models"
PLAN_FLAGS = {"--mem-fraction-static": 0.93, "--max-running-requests": 40, "--max-mamba-cache-size": 200,
              "--disable-radix-cache": False}


def launch_argv(plan_flags: dict, extra: list[str], model: str = "/models/qwen3.6-27b") -> list[str]:
    spec = remote.LaunchSpec(python="python3", module="sglang.launch_server", model_path=model,
                             served_name="qwen", port=30000, gpu_ids=(0,), bind_host="0.0.0.0", run_dir="~/run",
                             log_dir="~/logs", args=tuple(remote.flags_to_args(plan_flags) + ["--enable-metrics"]
                                                          + extra))
    return spec.argv()


def running_server_info(argv: list[str]) -> dict:
    """What the simulated server launched with ``argv`` answers on /server_info."""
    shape = load_model_dir(MODELS / "qwen3.6-27b")[0]
    args = parse_args(argv[3:])
    launch = resolve_launch(args, shape, [B200_MIB])
    settings = SimSettings()
    free = (B200_MIB - settings.driver_baseline_mib - settings.cuda_context_mib) * (1 << 20)
    plan = size_pools(shape, launch, free, free - SEED_WEIGHTS)
    graphs = graph_memory(shape, launch, plan.max_running_requests, settings.runtime_workspace_mib)
    timing = derive_timing(shape, launch, settings, "NVIDIA B200", SEED_WEIGHTS, plan.allocated_kv_cell_bytes,
                           plan.mamba_slot_bytes)
    service = Service(args=args, argv=argv[3:], model=shape, architectures=[], launch=launch, plan=plan,
                      graphs=graphs, timing=timing, settings=settings, faults=Faults(), weights_bytes=SEED_WEIGHTS,
                      startup_seconds=1.0)
    return service.server_info()


RUNNING = launch_argv(PLAN_FLAGS, SEED_EXTRA_ARGS)


def differences(tonight: list[str], version: str | None = SIM_VERSION) -> list[str]:
    return launch_differences(running_server_info(RUNNING), args_as_flags(tonight[3:]), expected_version=version)


def test_the_same_plan_keeps_the_server_even_though_sglang_reports_nextn_as_eagle():
    assert running_server_info(RUNNING)["speculative_algorithm"] == "EAGLE"
    assert differences(RUNNING) == []


@pytest.mark.parametrize("change, flag", [
    ({"--mem-fraction-static": 0.9}, "--mem-fraction-static"),
    ({"--max-running-requests": 48}, "--max-running-requests"),
    ({"--max-mamba-cache-size": 160}, "--max-mamba-cache-size"),
    ({"--disable-radix-cache": True}, "--disable-radix-cache"),
])
def test_any_planned_flag_that_changed_relaunches(change, flag):
    found = differences(launch_argv({**PLAN_FLAGS, **change}, SEED_EXTRA_ARGS))
    assert len(found) == 1 and found[0].startswith(flag + ":")


def test_a_changed_extra_argument_or_model_relaunches():
    extra = [word if word != "8192" else "16384" for word in SEED_EXTRA_ARGS]
    assert differences(launch_argv(PLAN_FLAGS, extra))[0].startswith("--context-length: running 8192")
    found = differences(launch_argv(PLAN_FLAGS, SEED_EXTRA_ARGS, model="/models/qwen3.6-27b-v2"))
    assert found == ["--model-path: running '/models/qwen3.6-27b', tonight '/models/qwen3.6-27b-v2'"]


def test_a_new_sglang_on_the_node_relaunches():
    assert differences(RUNNING, version="0.5.24") == ["version: running '0.5.23', installed '0.5.24'"]
    assert differences(RUNNING, version=None) == []  # version unknown: flags and model decide


def test_a_flag_the_server_does_not_report_relaunches():
    assert differences(RUNNING + ["--no-such-flag", "1"]) == ["--no-such-flag: the server does not report no_such_flag"]


def test_flags_are_read_as_sglangs_parser_reads_them():
    assert args_as_flags(["--tp-size", "2", "--enable-metrics", "--json=x", "--mem-fraction-static", "0.9"]) == {
        "--tp-size": "2", "--enable-metrics": True, "--json": "x", "--mem-fraction-static": "0.9"}


def _two_gpu_argv(extra: list[str]) -> list[str]:
    spec = remote.LaunchSpec(python="python3", module="sglang.launch_server", model_path="/models/qwen3.6-27b",
                             served_name="qwen", port=30000, gpu_ids=(0, 1), bind_host="0.0.0.0", run_dir="~/run",
                             log_dir="~/logs", args=tuple(remote.flags_to_args(PLAN_FLAGS) + SEED_EXTRA_ARGS + extra))
    return spec.argv()


def test_data_parallel_replicas_are_kept_and_a_changed_layout_relaunches():
    """Two GPUs as two --dp-size replicas run at tp 1: the same layout tonight keeps the server; the same
    GPUs as one tp-2 server are another launch."""
    replicas = _two_gpu_argv(["--dp-size", "2"])
    info = running_server_info(replicas)
    assert (info["tp_size"], info["dp_size"]) == (1, 2)
    assert launch_differences(info, args_as_flags(replicas[3:]), expected_version=SIM_VERSION) == []
    one_server = _two_gpu_argv([])
    assert launch_differences(info, args_as_flags(one_server[3:]), expected_version=SIM_VERSION) == [
        "--tp-size: running 1, tonight '2'"]
