"""The real SGLang 0.5.23 server with a hybrid model on CPU, and what makes it run there.

The model is Qwen3NextForCausalLM (Gated DeltaNet layers, one full-attention layer, MoE; random weights). On a
CPU without AMX it needs the torch stand-ins for the Gated DeltaNet ops (tests/real_sglang/stand_ins/sgl_kernel:
``mamba.py``, ``_gdn_ops.py``), checked here against naive recurrences, and two source patches to the venv's
SGLang (tests/real_sglang/patches/apply.py), checked here for idempotence and clear failure.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.real_sglang import server as real

HERE = Path(__file__).resolve().parent
CHECKS = HERE / "stand_in_checks.py"
APPLY = HERE / "patches" / "apply.py"
CHECK_NAMES = ("fused_gdn_gating", "chunk_gated_delta_rule", "fused_sigmoid_gating_delta_rule_update",
               "prefill_then_decode", "causal_conv1d_fn", "causal_conv1d_update")
CAPPED = re.compile(r"max_running_requests is capped to (\d+) by the mamba state cache "
                    r"\(max_mamba_cache_size=(\d+), (\d+) state slots per request\)")
DECODE = re.compile(r"Decode batch, #running-req: (\d+), #full token: (\d+), .*mamba num: (\d+)")
RUNNING = re.compile(r"#running-req: (\d+)")


def _flag(server: real.RealServer, name: str) -> str:
    return server.flags[server.flags.index(name) + 1]


def _chat(content: str, **extra) -> dict:
    return {"model": "tiny-hybrid", "messages": [{"role": "user", "content": content}], **extra}


def _server_info(server: real.RealServer) -> dict:
    status, body = real.get(f"{server.url}/server_info")
    assert status == 200, body
    return json.loads(body)


def _wait_for_log(server: real.RealServer, pattern: re.Pattern, start: int = 0, timeout_s: float = 120.0) -> re.Match:
    """The first line matching ``pattern`` from character ``start`` of the log on. The server logs from its
    own processes: a line can land a moment after the answer (on a busy machine, many seconds after; the wait
    ends with the line)."""
    deadline = time.monotonic() + timeout_s
    while True:
        match = pattern.search(server.log_text(), start)
        if match or time.monotonic() > deadline:
            assert match, f"no line matching {pattern.pattern!r} in the server log:\n{server.log_tail()}"
            return match
        time.sleep(0.25)


# ---- the stand-in ops, against naive step-by-step references (no server) ----

@pytest.fixture(scope="module")
def stand_in_results(tiny_models) -> dict:
    """Every check of tests/real_sglang/stand_in_checks.py, run once in the SGLang venv (it has torch).
    ``tiny_models`` is only the gate: it skips (fails under CI) when the venv is missing."""
    done = subprocess.run([str(real.PYTHON), str(CHECKS)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(real.STAND_INS)})
    try:
        return json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        pytest.fail(f"stand_in_checks.py printed no result (exit {done.returncode}):\n{done.stderr[-3000:]}")


@pytest.mark.parametrize("check", CHECK_NAMES)
def test_stand_in_op_matches_naive_reference(stand_in_results, check):
    assert check in stand_in_results, sorted(stand_in_results)
    assert stand_in_results[check] is None, stand_in_results[check]


# ---- the source patches ----

def _patches():
    spec = importlib.util.spec_from_file_location("sglang_cpu_patches", APPLY)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module.PATCHES


def _site_packages() -> Path:
    return Path(subprocess.run([str(real.PYTHON), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())


def _apply(site_packages: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(APPLY), str(site_packages)], capture_output=True, text=True)


def _digest(paths) -> dict:
    return {path: hashlib.sha256(path.read_bytes()).hexdigest() for path in paths}


def test_patches_are_applied_to_the_venv_and_a_rerun_changes_nothing(tiny_models):
    site_packages = _site_packages()
    patches = _patches()
    files = {site_packages / patch.path for patch in patches}
    before = _digest(files)
    done = _apply(site_packages)
    assert done.returncode == 0, done.stderr
    for patch in patches:
        assert f"{patch.name}: already applied" in done.stdout, done.stdout
    assert _digest(files) == before


def test_patches_turn_the_original_sources_into_the_venvs(tiny_models, tmp_path):
    """On a copy of each file with its patches undone: applied once, the venv's text; applied again, skipped."""
    site_packages = _site_packages()
    patches = _patches()
    for patch in patches:
        target = tmp_path / patch.path
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text((site_packages / patch.path).read_text())
        target.write_text(target.read_text().replace(patch.new, patch.old))
    first = _apply(tmp_path)
    assert first.returncode == 0, first.stderr
    for patch in patches:
        assert f"{patch.name}: applied to {patch.path}" in first.stdout, first.stdout
        assert (tmp_path / patch.path).read_text() == (site_packages / patch.path).read_text()
    second = _apply(tmp_path)
    assert second.returncode == 0 and second.stdout.count("already applied") == len(patches), second.stdout


def test_a_patch_whose_text_is_missing_stops_the_run_naming_file_and_patch(tiny_models, tmp_path):
    site_packages = _site_packages()
    patches = _patches()
    for patch in patches:
        target = tmp_path / patch.path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text((site_packages / patch.path).read_text().replace(patch.new, patch.old))
    broken = patches[-1]
    (tmp_path / broken.path).write_text("# another SGLang version\n")
    before = _digest(tmp_path / patch.path for patch in patches)
    done = _apply(tmp_path)
    assert done.returncode == 1
    assert broken.name in done.stderr and str(tmp_path / broken.path) in done.stderr, done.stderr
    assert _digest(tmp_path / patch.path for patch in patches) == before  # nothing half-applied


# ---- the server ----

def test_chat_completion(real_hybrid_server):
    status, body = real.post_json(f"{real_hybrid_server.url}/v1/chat/completions",
                                  _chat("Explain step by step why the sum of two even numbers is even.", max_tokens=12))
    assert status == 200, body
    usage, choice = body["usage"], body["choices"][0]
    assert usage["prompt_tokens"] > 0 and 0 < usage["completion_tokens"] <= 12
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert choice["finish_reason"] in ("length", "stop")
    if choice["finish_reason"] == "length":
        assert usage["completion_tokens"] == 12
    assert isinstance(choice["message"]["content"], str)


def test_streamed_completion_reports_usage(real_hybrid_server):
    body = json.dumps(_chat("The quick brown fox", max_tokens=8, stream=True,
                            stream_options={"include_usage": True})).encode()
    request = urllib.request.Request(f"{real_hybrid_server.url}/v1/chat/completions", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        assert response.status == 200
        events = [line[len(b"data: "):].decode() for line in response.read().splitlines()
                  if line.startswith(b"data: ")]
    assert events[-1] == "[DONE]", events[-3:]
    chunks = [json.loads(event) for event in events[:-1]]
    finishes = [choice["finish_reason"] for chunk in chunks for choice in chunk["choices"] if choice["finish_reason"]]
    assert finishes and finishes[-1] in ("length", "stop"), finishes
    usage = chunks[-1]["usage"]  # the usage chunk comes last, with no choices
    assert chunks[-1]["choices"] == []
    assert usage["prompt_tokens"] > 0 and 0 < usage["completion_tokens"] <= 8
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


def test_server_info_reports_the_mamba_pool_and_the_capped_running_requests(real_hybrid_server):
    info = _server_info(real_hybrid_server)
    capped = int(_wait_for_log(real_hybrid_server, CAPPED).group(1))
    assert info["max_mamba_cache_size"] == int(_flag(real_hybrid_server, "--max-mamba-cache-size"))
    assert info["uses_mamba_radix_cache"] is True
    assert info["mamba_radix_cache_strategy"] == "no_buffer"
    # The top level repeats the flag; the cap SGLang runs with is the scheduler's.
    assert info["max_running_requests"] == int(_flag(real_hybrid_server, "--max-running-requests"))
    assert info["internal_states"][0]["effective_max_running_requests_per_dp"] == capped


def test_log_says_the_mamba_state_cache_caps_running_requests(real_hybrid_server):
    capped, pool, slots = map(int, _wait_for_log(real_hybrid_server, CAPPED).groups())
    assert pool == int(_flag(real_hybrid_server, "--max-mamba-cache-size"))
    assert slots >= 1 and capped == pool // slots
    assert capped < int(_flag(real_hybrid_server, "--max-running-requests"))


def test_concurrent_requests_run_within_the_cap(real_hybrid_server):
    capped = int(_wait_for_log(real_hybrid_server, CAPPED).group(1))
    start = len(real_hybrid_server.log_text())

    def one(index):
        return real.post_json(f"{real_hybrid_server.url}/v1/completions",
                              {"model": "tiny-hybrid", "prompt": f"Tune a fleet {index}", "max_tokens": 6})

    with ThreadPoolExecutor(max_workers=capped + 2) as pool:
        answers = list(pool.map(one, range(capped + 2)))
    assert [status for status, _ in answers] == [200] * (capped + 2), answers
    assert all(body["usage"]["completion_tokens"] > 0 for _, body in answers)
    running = [int(count) for count in RUNNING.findall(real_hybrid_server.log_text()[start:])]
    assert running and max(running) <= capped, running


def test_log_has_hybrid_decode_lines(real_hybrid_server):
    """SGLang logs a decode batch every 40 decode steps; a hybrid model's line counts full-attention tokens
    and Mamba states (a dense model's says ``#token:``). A line logged as the last request finishes counts
    zero of both: 96 tokens span two intervals, so one line is logged while the request runs."""
    start = len(real_hybrid_server.log_text())
    status, body = real.post_json(f"{real_hybrid_server.url}/v1/chat/completions",
                                  _chat("Count to a hundred.", max_tokens=96, ignore_eos=True))
    assert status == 200 and body["usage"]["completion_tokens"] == 96, body
    _wait_for_log(real_hybrid_server, DECODE, start)
    lines = [tuple(map(int, found)) for found in DECODE.findall(real_hybrid_server.log_text(), start)]
    assert any(running >= 1 and full_tokens > 0 and mamba_states >= running
               for running, full_tokens, mamba_states in lines), lines
