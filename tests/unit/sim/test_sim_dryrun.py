"""The process-free start-up sizing: same bytes as the server's phases, same failures."""

import json
import os

import pytest

from sglang_sim.args import parse_args
from sglang_sim.dryrun import GpuMemory, dry_run, size_startup
from sglang_sim.modelcfg import load_model_dir
from sglang_sim.node import SimSettings, create_node
from sglang_sim.presets import install_model
from sglang_sim.resolve import LaunchError


@pytest.fixture
def seed_model(tmp_path, tools):
    return install_model(tmp_path / "model", "qwen3.6-27b", tools.SEED_WEIGHTS)


def _seed(tools, extra, *, free_mib=None, gpus=1, tp_args=()):
    settings = SimSettings()
    free = tools.B200_MIB - settings.driver_baseline_mib if free_mib is None else free_mib
    return size_startup(parse_args(tools.SEED_ARGS + list(tp_args) + extra), tools.preset("qwen3.6-27b"),
                        tools.SEED_WEIGHTS, gpus=[GpuMemory(i, tools.B200_MIB, free) for i in range(gpus)],
                        node_gpu_totals_mib=[tools.B200_MIB] * 7, settings=settings,
                        gpu_name="NVIDIA B200")


def test_idle_b200_gives_the_in_process_sizing(tools):
    sizing = _seed(tools, tools.AFTER)
    launch, plan = tools.seed_run(tools.AFTER)
    assert sizing.pre_load_free_bytes == tools.b200_pre_load_free()
    assert sizing.plan == plan and sizing.launch == launch
    assert sizing.server_info_limits() == {"max_running_requests": 40, "max_mamba_cache_size": 200,
                                           "max_total_num_tokens": plan.max_total_num_tokens}
    # at capture: pre-load free less weights, the target pools and the draft worker's KV pool
    assert sizing.free_at_capture_bytes == (tools.b200_pre_load_free() - tools.SEED_WEIGHTS - plan.kv_bytes
                                            - plan.mamba_total_bytes - plan.draft_kv_bytes)
    assert sizing.free_after_start_bytes == sizing.free_at_capture_bytes - sizing.graphs.total_bytes > 0


def test_failures_come_where_the_server_dies(tools):
    high = ["--max-mamba-cache-size", "200", "--max-running-requests", "64"]
    with pytest.raises(LaunchError) as capture:
        _seed(tools, high + ["--mem-fraction-static", "0.97"])
    assert capture.value.kind == "oom_cuda_graph"
    assert capture.value.message.startswith("Capture cuda graph failed: CUDA out of memory. Tried to allocate")
    with pytest.raises(LaunchError) as draft_pool:
        _seed(tools, high + ["--mem-fraction-static", "0.98"])
    assert draft_pool.value.kind == "oom_cuda_draft_pool" and draft_pool.value.exc_type == "OutOfMemoryError"
    with pytest.raises(LaunchError) as weights:
        _seed(tools, tools.AFTER, free_mib=50_000)
    assert weights.value.kind == "oom_cuda_weights"


def test_tensor_parallel_takes_nccl_buffers_and_the_smallest_gpu(tools):
    settings = SimSettings()
    gpus = [GpuMemory(0, tools.B200_MIB, 182_000), GpuMemory(1, tools.B200_MIB, 150_000)]
    sizing = size_startup(parse_args(["--model-path", "m", "--tp-size", "2"]), tools.preset("llama3.1-8b"),
                          16 * 10**9, gpus=gpus, node_gpu_totals_mib=[tools.B200_MIB] * 2, settings=settings)
    assert sizing.process_overhead_bytes == (settings.cuda_context_mib + settings.nccl_mib) * tools.MIB
    assert sizing.pre_load_free_bytes == (150_000 - 1000) * tools.MIB
    assert sizing.weights_bytes_per_gpu == 8 * 10**9
    with pytest.raises(ValueError, match="needs 2 GPU"):
        size_startup(parse_args(["--model-path", "m", "--tp-size", "2"]), tools.preset("llama3.1-8b"), 16 * 10**9,
                     gpus=gpus[:1], node_gpu_totals_mib=[tools.B200_MIB], settings=settings)


def test_dry_run_reads_the_node_and_its_holders(tools, tmp_path, seed_model):
    node = create_node(tmp_path / "node", name="n", gpus=2)
    argv = ["--model-path", str(seed_model), *tools.SEED_ARGS[2:], *tools.AFTER]
    idle = dry_run(node, argv, [1])
    assert idle.server_info_limits() == _seed(tools, tools.AFTER).server_info_limits()
    node.set_holder(1, os.getpid(), "foreign", 20_000)
    held = dry_run(node, argv, [1])
    assert held.pre_load_free_bytes == idle.pre_load_free_bytes - 20_000 * tools.MIB
    assert held.plan.max_total_num_tokens < idle.plan.max_total_num_tokens
    assert dry_run(node, argv, [0]).server_info_limits() == idle.server_info_limits()  # GPU 0 stays idle


# ---- checkpoints as SGLang reads them: single file, text-config defaults, quantization ----

def _h100_node(tmp_path):
    return create_node(tmp_path / "node", name="n", gpus=1, gpu_name="NVIDIA H100 80GB HBM3", total_mib=81_559)


def test_a_single_file_checkpoint_loads_the_bytes_its_header_declares(tmp_path):
    model = install_model(tmp_path / "model", "llama3.2-1b", 2_471_645_608)
    assert not (model / "model.safetensors.index.json").exists()
    assert (model / "model.safetensors").stat().st_size > 2_471_645_608  # header, then the (sparse) tensors
    sizing = dry_run(_h100_node(tmp_path), ["--model-path", str(model)], [0])
    assert sizing.weights_bytes_per_gpu == 2_471_645_608


def test_a_gemma3_text_config_takes_its_class_defaults(tmp_path):
    shape = load_model_dir(install_model(tmp_path / "model", "gemma-3-4b-it"))[0]
    # Gemma3TextConfig: 8 heads, 4 KV heads of 256; 131,072 positions; rope_scaling keyed by layer type
    assert (shape.num_heads, shape.num_kv_heads, shape.head_dim) == (8, 4, 256)
    assert shape.derived_context_length == 131_072


@pytest.mark.parametrize("args, dtype", [((), "torch.float8_e4m3fn"), (("--kv-cache-dtype", "bf16"), "torch.bfloat16")])
def test_a_modelopt_checkpoint_with_fp8_kv_stores_the_kv_cache_in_fp8(tmp_path, args, dtype):
    model = install_model(tmp_path / "model", "llama3.3-70b-nvfp4")
    assert (model / "hf_quant_config.json").is_file()
    node = create_node(tmp_path / "node", name="n", gpus=1, gpu_name="NVIDIA B200", total_mib=183_359)
    sizing = dry_run(node, ["--model-path", str(model), *args], [0])
    assert sizing.launch.kv_dtype_name == dtype


def test_a_quantization_flag_the_checkpoint_contradicts_is_refused(tmp_path):
    model = install_model(tmp_path / "model", "llama3.1-8b")
    config = json.loads((model / "config.json").read_text())
    config["quantization_config"] = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                     "weight_block_size": [128, 128]}
    (model / "config.json").write_text(json.dumps(config))
    with pytest.raises(LaunchError, match=r"model config \(fp8\) does not match the quantization method specified "
                       r"in the `quantization` argument \(gptq\)"):
        dry_run(_h100_node(tmp_path), ["--model-path", str(model), "--quantization", "gptq"], [0])
    agreeing = dry_run(_h100_node(tmp_path), ["--model-path", str(model), "--quantization", "fp8"], [0])
    assert agreeing.launch.kv_dtype_name == "torch.bfloat16"
