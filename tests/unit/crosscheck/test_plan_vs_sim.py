"""The tuner's plan, launched on the simulated node, gives exactly the values the plan expects.

The tuner (fleetgen.tuning.planner) and the simulator (sglang_sim) implement SGLang 0.5.23's sizing
separately; here each plan's flags plus the user's extra args go through the simulator's start-up
sizing (``sglang_sim.dryrun``: context, pre-load baseline, weights, pools, draft pool, CUDA-graph
capture) on the node whose nvidia-smi output the tuner planned from. The effective
max_running_requests, max_mamba_cache_size and max_total_num_tokens must be equal, not close, and
the launch must survive graph capture with the user's margin still free.
"""

import os
import signal
import subprocess
import sys

import httpx
import pytest
from sglang_sim.args import parse_args
from sglang_sim.dryrun import StartupSizing, dry_run
from devstack.local_fleet import wait_healthy
from sglang_sim.modelcfg import load_model_dir
from sglang_sim.resolve import resolve_launch
from fleetgen.nodes.readiness import parse_server_info
from fleetgen.tuning.planner import TunerBounds, compare_expected
from fleetgen.tuning.sizing import (
    auto_mem_fraction_static,
    gpu_table,
    sglang_reserve_mb,
)

MIB = 1 << 20
GIB = 1 << 30


def _plan_and_start(xc, node, case):
    """Plan ``case`` from the node's nvidia-smi, size its launch on the simulator, check they agree."""
    plan = case.plan(node)
    sizing: StartupSizing = dry_run(node, case.server_argv(plan), list(case.gpu_ids))  # raises where SGLang dies
    assert sizing.server_info_limits() == plan.expected
    rows = xc.budget(plan)
    pools = sizing.plan
    # Both sides model the same physical GPU: baseline, weights and every pool to the byte.
    assert rows["pre-load free (SGLang baseline)"] == sizing.pre_load_free_bytes
    assert rows["CUDA context of the new server"] == sizing.process_overhead_bytes
    assert rows["weights per GPU"] == sizing.weights_bytes_per_gpu
    assert rows["static budget"] == int(sizing.pre_load_free_bytes * sizing.launch.mem_fraction_static)
    assert rows["multimodal cache reservation"] == pools.mm_reservation_bytes
    assert rows["KV pool"] == pools.max_total_num_tokens * pools.kv_cell_bytes
    assert rows.get("state slots", 0) == pools.mamba_state_bytes
    assert rows.get("speculative buffers", 0) == pools.mamba_intermediate_bytes
    assert rows.get("MTP draft KV pool", 0) == pools.draft_kv_outside_bytes
    if plan.mode == "tuned":
        assert sizing.launch.mem_fraction_static == plan.flags["--mem-fraction-static"]
        assert sizing.free_after_start_bytes >= rows["user margin"]  # the margin really stays free
    return plan, sizing


def test_seed_plan_on_seven_b200_matches_the_simulated_server(xc, models, seed_node):
    plans = []
    for gpu in range(xc.SEED_GPUS):
        case = xc.Case(models.seed, (gpu,), tuple(xc.SEED_EXTRA_ARGS), port=30000 + gpu)
        plan, sizing = _plan_and_start(xc, seed_node, case)
        plans.append(plan)
        # real SGLang on this checkpoint: 65,536 B/token budgeted, the draft's 4,096 B/token outside
        assert sizing.plan.kv_cell_bytes == 65_536 and sizing.plan.draft_kv_cell_bytes == 4_096
        assert sizing.launch.mm_reservation_mb == 100
    assert len({tuple(p.expected.items()) for p in plans}) == 1
    expected = plans[0].expected
    assert expected["max_running_requests"] >= 60  # hand tuning reached 40, SGLang's defaults 16
    assert expected["max_mamba_cache_size"] == 5 * expected["max_running_requests"]


def test_foreign_process_holding_40_gib(xc, models, seed_node):
    clean, _ = _plan_and_start(xc, seed_node, xc.Case(models.seed, (0,), tuple(xc.SEED_EXTRA_ARGS)))
    # a process that is not one of our servers (the probe finds no pid file of ours for it)
    seed_node.set_holder(2, os.getpid(), "python", 40 * 1024)
    row = xc.inventory_from_nvidia_smi(seed_node)["gpus"][2]
    assert row["processes"] == [{"pid": os.getpid(), "process_name": "python", "used_mib": 40 * 1024,
                                 "ours": False, "port": None}]
    assert row["used_mib"] == seed_node.sim.driver_baseline_mib + 40 * 1024
    plan, sizing = _plan_and_start(xc, seed_node, xc.Case(models.seed, (2,), tuple(xc.SEED_EXTRA_ARGS), port=30002))
    assert xc.budget(plan)["held by other processes"] == 40 * GIB
    assert sizing.pre_load_free_bytes == (xc.B200_MIB - seed_node.sim.driver_baseline_mib - 40 * 1024
                                          - seed_node.sim.cuda_context_mib) * MIB
    assert plan.expected["max_running_requests"] < clean.expected["max_running_requests"]


def test_our_old_server_counts_as_free_because_it_is_stopped_first(xc, models, seed_node):
    clean = xc.Case(models.seed, (0,), tuple(xc.SEED_EXTRA_ARGS)).plan(seed_node)
    seed_node.set_holder(4, os.getpid(), "sglang::scheduler_TP0", 170_000)
    case = xc.Case(models.seed, (4,), tuple(xc.SEED_EXTRA_ARGS), port=30004)
    ours = {os.getpid(): 30004}
    assert xc.inventory_from_nvidia_smi(seed_node, ours)["gpus"][4]["processes"][0]["ours"]
    plan = case.plan(seed_node, ours)
    assert plan.flags == clean.flags and plan.expected == clean.expected
    seed_node.remove_holder(4, os.getpid())  # the DAG stops our servers before it launches
    sizing = dry_run(seed_node, case.server_argv(plan), [4])
    assert sizing.server_info_limits() == plan.expected


@pytest.mark.parametrize("memory_args, requests", [
    ([], None),                                   # nothing pinned: automatic mfs and Mamba joint solve
    (["--max-mamba-cache-size", "80"], 16),       # the seed's starting flags: 80 // 5
])
def test_sglang_defaults_mode_predicts_the_automatic_sizing(xc, models, seed_node, memory_args, requests):
    case = xc.Case(models.seed, (0,), tuple(xc.SEED_EXTRA_ARGS + memory_args),
                   bounds=TunerBounds(mode="sglang_defaults"))
    plan, sizing = _plan_and_start(xc, seed_node, case)
    assert plan.flags == {}
    # automatic: the B200 row 0.854 with the VLM factor of Qwen3.5's default vision tower
    assert sizing.launch.mem_fraction_static == pytest.approx(0.78975, abs=1e-5)
    assert sizing.launch.max_running_requests == 48  # the speculative default
    if requests is not None:
        assert plan.expected["max_running_requests"] == requests
        assert plan.expected["max_total_num_tokens"] == pytest.approx(1.14e6, rel=0.02)  # reported ~1.14M


def test_bf16_ssm_state(xc, models, seed_node):
    fp32, _ = _plan_and_start(xc, seed_node, xc.Case(models.seed, (0,), tuple(xc.SEED_EXTRA_ARGS)))
    plan, sizing = _plan_and_start(xc, seed_node, xc.Case(models.seed, (1,), tuple(xc.SEED_EXTRA_ARGS),
                                                          bounds=TunerBounds(bf16_ssm_state=True), port=30001))
    assert plan.flags["--mamba-ssm-dtype"] == "bfloat16"
    assert sizing.plan.mamba_slot_bytes == 48 * (61_440 + 48 * 128 * 128 * 2)
    assert plan.expected["max_running_requests"] > fp32.expected["max_running_requests"]


def test_dense_llama_without_speculative_decoding(xc, models, seed_node):
    plan, sizing = _plan_and_start(xc, seed_node, xc.Case(models.llama, (5,)))
    assert plan.expected["max_mamba_cache_size"] is None and sizing.plan.mamba_ratio == 0
    assert sizing.plan.draft_kv_bytes == 0 and sizing.launch.mm_reservation_mb == 0
    assert plan.expected["max_total_num_tokens"] >= plan.expected["max_running_requests"] * 6144


@pytest.mark.parametrize("extra_args", [[], ["--speculative-algorithm", "NEXTN"]])
def test_qwen3_next_at_tp2_on_two_gpus(xc, models, seed_node, extra_args):
    plan, sizing = _plan_and_start(xc, seed_node, xc.Case(models.qwen3_next, (3, 4), tuple(extra_args)))
    assert sizing.launch.tp == 2
    assert xc.budget(plan)["CUDA context of the new server"] == (600 + 400) * MIB  # NCCL buffers with tp > 1
    assert sizing.plan.mamba_slot_bytes == 38_633_472  # docs/sglang-memory-model.md §4.1, tp 2
    if extra_args:  # the rewritten MTP draft (1 layer, 1 KV head per rank) lies outside the budget
        assert sizing.plan.kv_cell_bytes == 12_288 and sizing.plan.draft_kv_cell_bytes == 1_024
        assert sizing.plan.draft_kv_outside_bytes > 0


@pytest.mark.parametrize("preset, tp", [("seed", 1), ("llama", 1), ("llama", 8), ("qwen3_next", 2)])
def test_automatic_mem_fraction_agrees_on_every_gpu_size(models, preset, tp):
    """The simulator's automatic mem_fraction_static (VLM factor included) equals the tuner's float."""
    model = load_model_dir(getattr(models, preset))[0]
    args = parse_args(["--model-path", "m", "--tp-size", str(tp)])
    vision = model.vision_tower if model.is_multimodal else None
    for total_mib in range(16_000, 200_000, 173):
        chunk, decode_bs = gpu_table(total_mib, tp)
        reserve = sglang_reserve_mb(gpu_mem_mib=total_mib, chunked_prefill_size=chunk, decode_max_bs=decode_bs,
                                    tp_size=tp, uses_mla=False, graphs_enabled=True,
                                    prefill_graph=True)  # Qwen3.5 keeps it; Llama and Qwen3-Next are text
        simulated = resolve_launch(args, model, [total_mib]).mem_fraction_static
        assert simulated == auto_mem_fraction_static(total_mib, reserve, vision), total_mib


def _wait_healthy(proc, url, timeout=30.0):
    try:
        wait_healthy(proc, url, timeout)
    except RuntimeError as error:
        raise AssertionError(f"{error}: {proc.stdout.read() if proc.poll() is not None else ''}") from None


@pytest.mark.slow
def test_simulated_server_process_reports_the_seed_plan(xc, models, seed_node):
    port = xc.free_port()
    case = xc.Case(models.seed, (3,), tuple(xc.SEED_EXTRA_ARGS), port=port)
    plan = case.plan(seed_node)
    env = dict(os.environ, **seed_node.env(), CUDA_VISIBLE_DEVICES="3")
    proc = subprocess.Popen([sys.executable, "-m", "sglang_sim.server", *case.server_argv(plan)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(proc, url)
        info = httpx.get(f"{url}/server_info", timeout=10).json()
        state = info["internal_states"][0]
        assert state["effective_max_running_requests_per_dp"] == plan.expected["max_running_requests"]
        assert info["max_total_num_tokens"] == plan.expected["max_total_num_tokens"]
        assert state["max_mamba_cache_size"] == plan.expected["max_mamba_cache_size"]
        assert compare_expected(plan, parse_server_info(info, server=plan.server)) == []
        assert info["mem_fraction_static"] == plan.flags["--mem-fraction-static"]
        # what nvidia-smi shows with the server up: the user's margin is still free on its GPU
        row = xc.inventory_from_nvidia_smi(seed_node)["gpus"][3]
        assert [p["pid"] for p in row["processes"]] == [proc.pid]
        assert row["free_mib"] >= plan.to_dict()["inputs"]["bounds"]["margin_mib"]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    log = proc.stdout.read()
    assert "The server is fired up and ready to roll!" in log
    assert log.count("KV Cache is allocated.") == 2  # the target's pool and the MTP draft worker's


def test_data_parallel_replicas_each_get_the_single_gpu_plan(xc, models, seed_node):
    """--dp-size 2 on two GPUs: two schedulers, each sizing its own GPU's pools as a tp-1 server does,
    with no NCCL buffers (each replica's world is its own tp group)."""
    single, _ = _plan_and_start(xc, seed_node, xc.Case(models.llama, (0,)))
    replicas, sizing = _plan_and_start(xc, seed_node, xc.Case(models.llama, (2, 3), ("--dp-size", "2"), port=30002))
    assert replicas.expected == single.expected and replicas.flags == single.flags
    assert sizing.launch.dp == 2 and sizing.launch.tp == 1
    assert xc.budget(replicas)["CUDA context of the new server"] == seed_node.sim.cuda_context_mib * MIB


@pytest.mark.parametrize("extra_args", [(), ("--swa-full-tokens-ratio", "0.5"), ("--disable-hybrid-swa-memory",)])
def test_sliding_window_model_plans_both_kv_pools_like_the_simulated_server(xc, models, seed_node, extra_args):
    """gpt-oss: full KV on its 12 full layers, the 12 sliding layers in a separate pool of ratio x the
    full pool's tokens; with --disable-hybrid-swa-memory every layer is in the one full pool."""
    plan, sizing = _plan_and_start(xc, seed_node, xc.Case(models.gpt_oss, (0,), extra_args))
    rows = xc.budget(plan)
    if "--disable-hybrid-swa-memory" in extra_args:
        assert "swa_max_total_num_tokens" not in plan.expected and "SWA KV pool" not in rows
        assert sizing.plan.kv_cell_bytes == 24 * 8 * 128 * 2
        return
    ratio = 0.5 if extra_args else 0.8
    full = plan.expected["max_total_num_tokens"]
    assert plan.expected["swa_max_total_num_tokens"] == int(full * ratio) // 64 * 64  # trtllm_mha pages on B200
    assert sizing.plan.kv_cell_bytes == 12 * 8 * 128 * 2
    assert rows["SWA KV pool"] == plan.expected["swa_max_total_num_tokens"] * 12 * 8 * 128 * 2


def test_readback_checks_every_replica_and_its_swa_pool(xc, models, seed_node):
    """A gpt-oss server with two data-parallel replicas: /server_info has one internal state per replica,
    each with its own request cap and SWA pool (memory_usage.token_capacity_swa); any replica off is a mismatch."""
    plan, _ = _plan_and_start(xc, seed_node, xc.Case(models.gpt_oss, (0, 1), ("--dp-size", "2")))
    expected = plan.expected

    def state(swa_tokens):
        return {"effective_max_running_requests_per_dp": expected["max_running_requests"],
                "memory_usage": {"token_capacity": expected["max_total_num_tokens"], "token_capacity_swa": swa_tokens}}

    info = {"max_total_num_tokens": expected["max_total_num_tokens"],
            "internal_states": [state(expected["swa_max_total_num_tokens"])] * 2}
    assert compare_expected(plan, parse_server_info(info, server=plan.server)) == []
    info["internal_states"] = [state(expected["swa_max_total_num_tokens"]), state(expected["swa_max_total_num_tokens"] - 64)]
    assert compare_expected(plan, parse_server_info(info, server=plan.server)) == [
        f"{plan.server}: swa_max_total_num_tokens: expected {expected['swa_max_total_num_tokens']}, SGLang reports "
        f"{expected['swa_max_total_num_tokens'] - 64} (internal_states[1].memory_usage.token_capacity_swa)"]
