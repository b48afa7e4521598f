"""The plan's expected values, the simulator's and SGLang 0.5.23's own are equal on every case of the matrix.

Compared per case: mem_fraction_static, chunked prefill size, decode CUDA-graph max batch, KV page size, KV
tokens, Mamba slots and the effective max_running_requests. A case the tuner refuses must be one SGLang
refuses too (it names the reason before anything is launched).
"""

import re

import pytest

from sglang_sim.dryrun import dry_run
from fleetgen.tuning import TunerBounds

from oracle_harness import SEED_ARGS, SEED_SPEC, MatrixCase, oracle_case, prepare, run_oracle
from cases_checkpoints import CHECKPOINT_CASES
from cases_config_readers import CONFIG_READER_CASES
from cases_parallel_and_window import PARALLEL_AND_WINDOW_CASES
from cases_public_models import PUBLIC_MODEL_CASES
from cases_state_families import STATE_FAMILY_CASES

# The first test's setup sizes every case in one SGLang subprocess (oracle_harness.run_sglang): about two minutes
# on two quiet cores, several times that beside the real servers of the other workers.
pytestmark = pytest.mark.timeout(1800)

CONTEXT_LONG = ("--context-length", "131072")
MATRIX = [
    MatrixCase("seed-b200", "qwen3.6-27b", "B200", extra_args=SEED_ARGS),
    MatrixCase("seed-b200-defaults", "qwen3.6-27b", "B200", extra_args=SEED_ARGS,
               bounds=TunerBounds(mode="sglang_defaults")),
    MatrixCase("seed-b200-bf16-ssm", "qwen3.6-27b", "B200", extra_args=SEED_ARGS,
               bounds=TunerBounds(bf16_ssm_state=True)),
    MatrixCase("seed-b200-no-buffer", "qwen3.6-27b", "B200", extra_args=SEED_SPEC,
               bounds=TunerBounds(no_buffer_radix=True)),
    MatrixCase("seed-b200-foreign-40g", "qwen3.6-27b", "B200", extra_args=SEED_ARGS, foreign_mib=40 * 1024),
    MatrixCase("seed-b200-mrr-32", "qwen3.6-27b", "B200", extra_args=SEED_ARGS,
               bounds=TunerBounds(max_running_requests=32)),
    MatrixCase("seed-h200", "qwen3.6-27b", "H200", extra_args=SEED_ARGS),
    MatrixCase("seed-h100-no-buffer", "qwen3.6-27b", "H100", extra_args=SEED_SPEC,
               bounds=TunerBounds(no_buffer_radix=True)),
    MatrixCase("qwen3-next-tp1-b200", "qwen3-next-80b-a3b", "B200"),
    MatrixCase("qwen3-next-tp2-h200", "qwen3-next-80b-a3b", "H200", tp=2),
    MatrixCase("qwen3-next-tp4-h100", "qwen3-next-80b-a3b", "H100", tp=4),
    MatrixCase("qwen3-next-tp2-b200-nextn", "qwen3-next-80b-a3b", "B200", tp=2, extra_args=("--speculative-algorithm",
                                                                                             "NEXTN")),
    MatrixCase("llama-8b-h100", "llama3.1-8b", "H100"),
    MatrixCase("llama-8b-h100-defaults", "llama3.1-8b", "H100", bounds=TunerBounds(mode="sglang_defaults")),
    MatrixCase("llama-8b-a100-40g", "llama3.1-8b", "A100-40G"),
    MatrixCase("llama-8b-l40s", "llama3.1-8b", "L40S"),
    MatrixCase("llama-8b-b200-long-context", "llama3.1-8b", "B200", extra_args=CONTEXT_LONG),
    MatrixCase("llama-70b-tp4-h100", "llama3.1-70b", "H100", tp=4),
    MatrixCase("llama-70b-tp4-a100-80g", "llama3.1-70b", "A100-80G", tp=4),
    MatrixCase("mla-dsv2-lite-h200", "deepseek-v2-lite", "H200"),
    MatrixCase("mla-dsv2-lite-b200", "deepseek-v2-lite", "B200"),
    MatrixCase("nemotron-h-b200", "nemotron-h-8b", "B200"),
    MatrixCase("nemotron-h-h100-no-buffer", "nemotron-h-8b", "H100", bounds=TunerBounds(no_buffer_radix=True)),
    MatrixCase("falcon-h1-h200", "falcon-h1-7b", "H200"),
    MatrixCase("falcon-h1-b200-bf16-ssm", "falcon-h1-7b", "B200", bounds=TunerBounds(bf16_ssm_state=True)),
    MatrixCase("qwen3-vl-8b-h100", "qwen3-vl-8b", "H100"),
    MatrixCase("qwen3-vl-8b-h200-mrr-500", "qwen3-vl-8b", "H200", bounds=TunerBounds(max_running_requests=500)),
    MatrixCase("qwen3-vl-8b-b200-defaults", "qwen3-vl-8b", "B200", bounds=TunerBounds(mode="sglang_defaults")),
] + CHECKPOINT_CASES + PARALLEL_AND_WINDOW_CASES + PUBLIC_MODEL_CASES + CONFIG_READER_CASES + STATE_FAMILY_CASES
COMPARED = ("mem_fraction_static", "chunked_prefill_size", "decode_max_bs", "page_size", "max_total_num_tokens",
            "max_mamba_cache_size", "max_running_requests")


def plan_values(plan) -> dict:
    platform = plan.inputs["platform"]
    return {"mem_fraction_static": platform["mem_fraction_static"],
            "chunked_prefill_size": platform["chunked_prefill_size"], "decode_max_bs": platform["decode_max_bs"],
            "page_size": platform["page_size"], **plan.expected}


def sim_values(sizing) -> dict:
    launch = sizing.launch
    return {"mem_fraction_static": launch.mem_fraction_static, "chunked_prefill_size": launch.chunked_prefill_size,
            "decode_max_bs": launch.decode_max_bs, "page_size": launch.page_size, **sizing.server_info_limits()}


def sglang_values(result: dict) -> dict:
    return {"mem_fraction_static": result["mem_fraction_static"],
            "chunked_prefill_size": result["chunked_prefill_size"], "decode_max_bs": result["decode_max_bs"],
            "page_size": result["page_size"], "max_total_num_tokens": result["max_total_num_tokens"],
            "max_mamba_cache_size": result["max_mamba_cache_size"],
            "max_running_requests": result["max_running_requests_effective"]}


REFUSED_ARGS = SEED_SPEC + ("--attention-backend", "trtllm_mha")


@pytest.fixture(scope="module")
def matrix(tmp_path_factory):
    root = tmp_path_factory.mktemp("matrix")
    prepared = {case.id: prepare(case, root) for case in MATRIX}
    # the no_buffer launch the tuner refuses (see the last test), as SGLang would get it
    refused = prepare(MatrixCase("refused", "qwen3.6-27b", "B200", extra_args=REFUSED_ARGS,
                                 bounds=TunerBounds(no_buffer_radix=True)), root)
    argv = ["--model-path", str(refused.model_dir), *REFUSED_ARGS, "--mamba-radix-cache-strategy", "no_buffer",
            "--disable-overlap-schedule"]
    oracle = run_oracle(list(prepared.values()), [oracle_case("refused", argv, "B200", 170 << 30, 110 << 30)])
    return {**prepared, "refused": refused}, oracle


def test_matrix_is_large_enough():
    assert len(MATRIX) >= 24 and len({case.id for case in MATRIX}) == len(MATRIX)


@pytest.mark.parametrize("case_id", [case.id for case in MATRIX])
def test_plan_simulator_and_sglang_agree(matrix, case_id):
    prepared, oracle = matrix
    item = prepared[case_id]
    if item.case.refused:
        assert item.plan is None and item.case.refused in item.plan_error, item.plan_error
        assert not oracle[case_id]["ok"] and item.case.refused in oracle[case_id]["error"], oracle[case_id]
        argv = ["--model-path", str(item.model_dir), "--tp-size", str(item.case.tp), *item.case.extra_args]
        with pytest.raises(Exception, match=re.escape(item.case.refused)):
            dry_run(item.node, argv, list(range(item.case.tp)))
        return
    assert item.plan is not None, item.plan_error
    sglang = oracle[case_id]
    assert sglang["ok"], sglang["error"]
    sizing = dry_run(item.node, item.argv, item.plan.gpu_ids)
    expected = plan_values(item.plan)
    assert {k: sim_values(sizing)[k] for k in COMPARED} == {k: expected[k] for k in COMPARED}
    assert {k: sglang_values(sglang)[k] for k in COMPARED} == {k: expected[k] for k in COMPARED}
    # the checkpoint's quantization method as SGLang resolved it (ModelConfig.quantization)
    assert sglang["quantization"] == item.plan.inputs["profile"]["quantization"]
    # hybrid sliding-window models: the SWA pool's tokens too (absent from the plan without an SWA pool)
    swa = expected.get("swa_max_total_num_tokens")
    assert (sim_values(sizing).get("swa_max_total_num_tokens"), sglang.get("swa_max_total_num_tokens")) == (swa, swa)


def test_no_buffer_that_sglang_refuses_is_refused_before_launch(matrix):
    """The user pins trtllm_mha (64-token pages on B200) and asks for no_buffer: SGLang's own resolution
    asserts; the tuner names the reason instead of planning a server that cannot start."""
    prepared, oracle = matrix
    item = prepared["refused"]
    assert item.plan is None and "no_buffer Mamba radix strategy needs page size 1" in item.plan_error
    assert not oracle["refused"]["ok"] and "no_buffer" in oracle["refused"]["error"]
