"""The tuner's flags against SGLang 0.5.23's real argument parser.

SGLang imports on CPU in its own virtual environment (``scripts/sglang-venv.sh`` builds
``.sglang-venv/``); the parser is ``ServerArgs.add_cli_args(argparse.ArgumentParser())``. The test
skips, saying how to build it, when that environment is absent.
"""

import json
import os
import pathlib
import subprocess

import pytest

from fleetgen.tuning.profile import LaunchOptions, profile_model
from fleetgen.tuning.planner import TunerBounds, Workload, plan_server

REPO = pathlib.Path(__file__).resolve().parents[2]
VENV_PYTHON = pathlib.Path(os.environ.get("FLEETGEN_SGLANG_VENV", REPO / ".sglang-venv")) / "bin" / "python"
SEED_CONFIG = REPO / "tests" / "unit" / "tuning" / "configs" / "seed-qwen3.6-27b.json"
QWEN3_NEXT_CONFIG = REPO / "tests" / "unit" / "tuning" / "configs" / "qwen3-next-80b-a3b.json"
SEED_ARGS = ["--speculative-algorithm", "NEXTN", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
             "--speculative-num-draft-tokens", "4", "--mamba-radix-cache-strategy", "extra_buffer",
             "--context-length", "8192", "--reasoning-parser", "qwen3", "--tp-size", "1"]
WORKLOAD = Workload(max_output_tokens=4096, prompt_tokens_mean=270.0, prompt_tokens_max=1900, prompt_count=913_786)
B200 = {"index": 0, "uuid": "GPU-0", "name": "NVIDIA B200", "total_mib": 183_359, "used_mib": 0,
        "free_mib": 183_359, "processes": []}

# Runs inside the SGLang venv: parse each command line, report the parsed values or argparse's error.
PARSE_SCRIPT = r"""
import argparse, contextlib, io, json, sys
from sglang.srt.server_args import ServerArgs
results = []
for argv in json.load(sys.stdin):
    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            parsed = vars(parser.parse_args(argv))
        results.append({"ok": True, "values": {k: v for k, v in parsed.items()
                                               if isinstance(v, (int, float, str, bool)) or v is None}})
    except SystemExit:
        results.append({"ok": False, "error": err.getvalue().strip().splitlines()[-1]})
print(json.dumps(results))
"""


def _parse_with_sglang(command_lines: list[list[str]]) -> list[dict]:
    if not VENV_PYTHON.exists():
        # `make test` (and so CI) builds the venv first: there, a missing venv is a failure, not a skip.
        if os.environ.get("CI"):
            pytest.fail(f"no SGLang venv at {VENV_PYTHON.parent.parent}: scripts/sglang-venv.sh did not run")
        pytest.skip(f"no SGLang venv at {VENV_PYTHON.parent.parent}; build it with scripts/sglang-venv.sh")
    done = subprocess.run([str(VENV_PYTHON), "-c", PARSE_SCRIPT], input=json.dumps(command_lines),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _plan(config_path, extra_args, bounds=TunerBounds()):
    options = LaunchOptions.from_args(extra_args)
    profile = profile_model(json.loads(config_path.read_text()), 54_000_000_000, options)
    return plan_server(host="gpu-node-1", gpu_ids=[0], port=30000, gpus=[B200], profile=profile, options=options,
                       workload=WORKLOAD, bounds=bounds)


@pytest.mark.slow
def test_sglang_accepts_the_plans_and_rejects_old_names():
    seed = _plan(SEED_CONFIG, SEED_ARGS)
    opt_ins = _plan(QWEN3_NEXT_CONFIG, ["--speculative-algorithm", "NEXTN"],
                    TunerBounds(bf16_ssm_state=True, no_buffer_radix=True))
    model = ["--model-path", "/models/qwen3.6-27b", "--port", "30000"]
    results = _parse_with_sglang([
        model + seed.command_args() + SEED_ARGS,
        model + opt_ins.command_args() + ["--speculative-algorithm", "NEXTN"],
        model + ["--mamba-scheduler-strategy", "extra_buffer"],
        model + ["--cuda-graph-max-bs", "16"],
    ])
    seed_values = results[0]
    assert seed_values["ok"], seed_values
    values = seed_values["values"]
    assert values["mem_fraction_static"] == seed.flags["--mem-fraction-static"]
    assert values["max_running_requests"] == seed.flags["--max-running-requests"]
    assert values["max_mamba_cache_size"] == seed.flags["--max-mamba-cache-size"]
    assert values["cuda_graph_max_bs_decode"] == seed.flags["--cuda-graph-max-bs-decode"]
    assert values["chunked_prefill_size"] == seed.flags["--chunked-prefill-size"]
    assert values["context_length"] == 8192 and values["mamba_radix_cache_strategy"] == "extra_buffer"
    assert results[1]["ok"], results[1]
    assert results[1]["values"]["mamba_ssm_dtype"] == "bfloat16"
    assert results[1]["values"]["mamba_radix_cache_strategy"] == "no_buffer"
    assert results[1]["values"]["context_length"] == opt_ins.flags["--context-length"]
    assert not results[2]["ok"] and "unrecognized arguments: --mamba-scheduler-strategy" in results[2]["error"]
    assert not results[3]["ok"] and "ambiguous option: --cuda-graph-max-bs" in results[3]["error"]


@pytest.mark.slow
def test_every_launch_flag_is_the_server_args_field_keep_or_relaunch_compares():
    """Keep-or-relaunch reads each launch flag back from /server_info under the flag's name with '_' for '-'
    (fleetgen.nodes.readiness.launch_differences): SGLang's parser stores each one exactly there, with the
    value the comparison expects."""
    from fleetgen.nodes import remote
    from fleetgen.nodes.readiness import args_as_flags, launch_differences

    seed = _plan(SEED_CONFIG, SEED_ARGS)
    spec = remote.LaunchSpec(python="python3", module="sglang.launch_server", model_path="/models/qwen3.6-27b",
                             served_name="qwen", port=30000, gpu_ids=(0, 1), bind_host="0.0.0.0", run_dir="~/run",
                             log_dir="~/logs", args=tuple(remote.flags_to_args(seed.flags) + ["--enable-metrics"]
                                                          + SEED_ARGS))
    argv = spec.argv()[3:]
    (parsed,) = _parse_with_sglang([argv])
    assert parsed["ok"], parsed
    # SGLang rewrites NEXTN to EAGLE while resolving (not at parse time): report it as a running server would.
    reported = {**parsed["values"], "speculative_algorithm": "EAGLE"}
    assert launch_differences(reported, args_as_flags(argv), expected_version=None) == []
