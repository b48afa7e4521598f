"""Every number the tuner produces, pinned for the model layouts it covers.

The plans below were checked against SGLang's own arithmetic (tests/unit/crosscheck) and the seed's
worked case; this test keeps them from drifting silently. A deliberate change to the sizing rules
regenerates the pinned file with ``FLEETGEN_UPDATE_GOLDEN=1`` and the diff is reviewed with the change.
"""

import json
import os
import pathlib

import pytest

from fleetgen.errors import FleetgenError
from fleetgen.tuning import TunerBounds, backoff, plan_server
from fleetgen.tuning.budget import render_budget_table
from fleetgen.tuning.profile import LaunchOptions, profile_model

GOLDEN = pathlib.Path(__file__).parent / "golden" / "plans.json"
WORKLOAD_KEYS = dict(max_output_tokens=4096, prompt_tokens_mean=270.0, prompt_tokens_max=1900, prompt_count=913_786)

# (name, config file, weight bytes, extra args, GPUs, bounds)
SCENARIOS = [
    ("seed", "seed-qwen3.6-27b.json", 54 * 10**9, None, 1, {}),
    ("seed-sglang-defaults", "seed-qwen3.6-27b.json", 54 * 10**9, None, 1, {"mode": "sglang_defaults"}),
    ("seed-bf16-no-buffer", "seed-qwen3.6-27b.json", 54 * 10**9, None, 1,
     {"bf16_ssm_state": True, "no_buffer_radix": True, "margin_mib": 4096}),
    ("seed-context-4k", "seed-qwen3.6-27b.json", 54 * 10**9, None, 1, {"context_length": 4096}),
    ("qwen3-next-tp2", "qwen3-next-80b-a3b.json", 160 * 10**9, ["--tp-size", "2"], 2, {}),
    ("qwen3-next-nextn", "qwen3-next-80b-a3b.json", 160 * 10**9,
     ["--tp-size", "2", "--speculative-algorithm", "NEXTN"], 2, {}),
    ("llama", "llama-3.1-8b-style.json", 16 * 10**9, [], 1, {}),
    ("llama-fp8-kv-pinned", "llama-3.1-8b-style.json", 16 * 10**9,
     ["--kv-cache-dtype", "fp8_e4m3", "--max-running-requests", "96", "--page-size", "64"], 1, {}),
    ("llama-spec", "llama-3.1-8b-style.json", 16 * 10**9, ["--speculative-algorithm", "EAGLE",
                                                           "--speculative-draft-model-path", "/d"], 1, {}),
    ("deepseek-tp8", "deepseek-v3-style.json", 10**12, ["--tp-size", "8"], 8, {}),
    ("deepseek-tp8-nextn", "deepseek-v3-style.json", 10**12, ["--tp-size", "8", "--speculative-algorithm", "NEXTN"],
     8, {}),
    ("nemotron-h", "nemotron-h-8b-style.json", 16 * 10**9, [], 1, {}),
    ("falcon-h1-tp2", "falcon-h1-7b-style.json", 15 * 10**9, ["--tp-size", "2"], 2, {}),
    ("too-big", "llama-3.1-8b-style.json", 190 * 10**9, [], 1, {}),
    ("no-fit", "llama-3.1-8b-style.json", 188 * 10**9, [], 1, {}),
    ("pinned-too-many", "llama-3.1-8b-style.json", 16 * 10**9, ["--max-running-requests", "100000"], 1, {}),
    ("tp-mismatch", "llama-3.1-8b-style.json", 16 * 10**9, ["--tp-size", "2"], 1, {}),
    ("hybrid-pinned", "qwen3-next-80b-a3b.json", 160 * 10**9,
     ["--tp-size", "2", "--max-running-requests", "64", "--max-mamba-cache-size", "400"], 2, {}),
    ("hybrid-defaults-spec", "qwen3-next-80b-a3b.json", 160 * 10**9,
     ["--tp-size", "2", "--speculative-algorithm", "NEXTN", "--cuda-graph-max-bs-decode", "32"], 2,
     {"mode": "sglang_defaults"}),
    ("seed-defaults-pinned", "seed-qwen3.6-27b.json", 54 * 10**9, ["--max-running-requests", "40"], 1,
     {"mode": "sglang_defaults"}),
    ("defaults-fail", "llama-3.1-8b-style.json", 188 * 10**9, [], 1, {"mode": "sglang_defaults"}),
    ("hybrid-pinned-too-many", "qwen3-next-80b-a3b.json", 160 * 10**9,
     ["--tp-size", "2", "--max-running-requests", "5000", "--max-mamba-cache-size", "25000"], 2, {}),
    ("seed-no-fit", "seed-qwen3.6-27b.json", 186 * 10**9, None, 1, {}),
    ("seed-one-request", "seed-qwen3.6-27b.json", 54 * 10**9, None, 1, {"max_running_requests": 1}),
    ("seed-two-requests", "seed-qwen3.6-27b.json", 54 * 10**9, None, 1, {"max_running_requests": 2}),
    ("llama-page-64-long-prompts", "llama-3.1-8b-style.json", 16 * 10**9, ["--page-size", "64"], 1,
     {"workload": {"prompt_tokens_max": 5000}}),
    ("llama-no-graphs", "llama-3.1-8b-style.json", 16 * 10**9, ["--disable-cuda-graph"], 1, {}),
]


def _scenario(cases, config_name, weights, args, gpu_count, bounds):
    from fleetgen.tuning import Workload

    config = cases.load_config(config_name)
    options = LaunchOptions.from_args(cases.SEED_EXTRA_ARGS if args is None else args)
    draft = None
    if options.speculative_draft_model_path is not None:
        draft = {"num_hidden_layers": 1}
    gpus = [cases.gpu_row(index, driver_mib=500 + 100 * index,
                          processes=[{"pid": 7, "used_mib": 2000, "ours": False}] if index == 0 else [])
            for index in range(gpu_count)]
    result = {}
    bounds = dict(bounds)
    workload = Workload(**{**WORKLOAD_KEYS, **bounds.pop("workload", {})})
    try:
        profile = profile_model(config, weights, options, draft_config=draft, draft_weights_bytes=10**9 if draft else 0)
        result["profile"] = profile.to_dict()
        plan = plan_server(host="gpu-node-1", gpu_ids=list(range(gpu_count)), port=30000, gpus=gpus, profile=profile,
                           options=options, workload=workload, bounds=TunerBounds(**bounds))
    except FleetgenError as exc:
        result["error"] = str(exc)
        return result
    result["plan"] = {key: value for key, value in plan.to_dict().items() if key != "inputs"}
    result["command_args"] = plan.command_args()
    result["table"] = render_budget_table(plan).splitlines()
    backed = {}
    for kind in ("oom_kv", "oom_mamba", "oom_cuda_graph", "oom_runtime", "oom_weights", "bad_args", "exited",
                 "no_such_kind"):
        try:
            smaller = backoff(plan, kind)
            backed[kind] = {"flags": smaller.flags, "expected": smaller.expected, "notes": smaller.notes}
        except FleetgenError as exc:
            backed[kind] = {"error": str(exc)}
    result["backoff"] = backed
    chain, current = [], plan
    for _ in range(12):  # until the back-off gives up
        try:
            current = backoff(current, ("oom_cuda_graph", "oom_kv", "oom_weights")[len(chain) % 3])
        except FleetgenError as exc:
            chain.append(str(exc))
            break
        chain.append([current.attempt, current.expected, current.flags])
    result["backoff_chain"] = chain
    return result


def _snapshot(cases):
    return json.loads(json.dumps({name: _scenario(cases, *rest) for name, *rest in SCENARIOS}))


def test_plans_for_every_layout_match_the_pinned_numbers(cases):
    snapshot = _snapshot(cases)
    if os.environ.get("FLEETGEN_UPDATE_GOLDEN") == "1":
        GOLDEN.write_text(json.dumps(snapshot, indent=1, sort_keys=True) + "\n")
    golden = json.loads(GOLDEN.read_text())
    assert sorted(snapshot) == sorted(golden)
    for name in golden:
        assert snapshot[name] == golden[name], name
