"""Launches of public models SGLang 0.5.23 refuses while resolving its arguments, before any weight loads: the
tuner refuses to plan them and the simulator to start them, each naming SGLang's own reason.

SGLang gets the user's flags as they are (there is no plan); resolution fails before the memory readings matter.
"""

import pytest

from sglang_sim.dryrun import dry_run
from sglang_sim.resolve import LaunchError

from oracle_harness import GPUS, MatrixCase, oracle_case, prepare, run_sglang

MIB = 1 << 20
# (case, SGLang's reason: the text all three sides must name)
REFUSALS = [
    (MatrixCase("deepseek-v3-tp8-h200-trtllm-mla", "deepseek-v3", "H200", tp=8,
                extra_args=("--attention-backend", "trtllm_mla")),
     "TRTLLM MLA backend is only supported on Blackwell GPUs (SM100/SM12x)"),
    # SGLang's own trtllm_mla for DeepSeek on B200 takes bf16 or fp8_e4m3, not the spelling bfloat16
    (MatrixCase("deepseek-v3-tp8-b200-bfloat16-kv", "deepseek-v3", "B200", tp=8,
                extra_args=("--kv-cache-dtype", "bfloat16")),
     "TensorRT-LLM MLA backend only supports kv-cache-dtype of fp8_e4m3, bf16, or auto"),
    (MatrixCase("deepseek-v3-tp8-b200-fp8-e5m2-kv", "deepseek-v3", "B200", tp=8,
                extra_args=("--kv-cache-dtype", "fp8_e5m2")),
     "TensorRT-LLM MLA backend only supports kv-cache-dtype of fp8_e4m3, bf16, or auto"),
    (MatrixCase("deepseek-v3-tp8-h200-cutedsl-mla", "deepseek-v3", "H200", tp=8,
                extra_args=("--attention-backend", "cutedsl_mla")),
     "CuteDSL MLA backend is only supported on Blackwell GPUs (SM100)"),
    (MatrixCase("llama-3b-l4-trtllm-mha", "llama3.2-3b", "L4", extra_args=("--attention-backend", "trtllm_mha")),
     "TRTLLM MHA backend for prefill requires Hopper (SM90), Blackwell (SM100), or SM120 GPUs"),
    (MatrixCase("qwen3-4b-a10g-trtllm-mha", "qwen3-4b", "A10G", extra_args=("--attention-backend", "trtllm_mha")),
     "TRTLLM MHA backend for prefill requires Hopper (SM90), Blackwell (SM100), or SM120 GPUs"),
]


@pytest.fixture(scope="module")
def refusals(tmp_path_factory):
    root = tmp_path_factory.mktemp("refusals")
    prepared = {case.id: prepare(case, root) for case, _ in REFUSALS}
    argvs = {case.id: ["--model-path", str(prepared[case.id].model_dir), "--tp-size", str(case.tp), *case.extra_args]
             for case, _ in REFUSALS}
    totals = {case.id: GPUS[case.gpu][1] * MIB for case, _ in REFUSALS}
    oracle = run_sglang([oracle_case(case.id, argvs[case.id], case.gpu, int(totals[case.id] * 0.95),
                                     int(totals[case.id] * 0.5)) for case, _ in REFUSALS])
    return prepared, argvs, oracle


@pytest.mark.parametrize("case, reason", REFUSALS, ids=[case.id for case, _ in REFUSALS])
def test_tuner_simulator_and_sglang_refuse_with_sglangs_reason(refusals, case, reason):
    prepared, argvs, oracle = refusals
    item = prepared[case.id]
    assert not oracle[case.id]["ok"] and reason in oracle[case.id]["error"]
    assert item.plan is None and reason in item.plan_error
    with pytest.raises(LaunchError) as failure:
        dry_run(item.node, argvs[case.id], list(range(case.tp)))
    assert reason in failure.value.message
