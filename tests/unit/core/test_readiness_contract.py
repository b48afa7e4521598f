"""Every fatal pattern, its kind and hint, and every field of the /server_info readback (DP included)."""

import pytest

from fleetgen.errors import FailureKind, ServerError
from fleetgen.nodes import readiness

# One real line per pattern (SGLang 0.5.23, uvicorn, argparse), its kind, and how its hint begins.
FATAL_LINES = [
    ("ValueError: Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static=0.3.",
     "oom_weights", "the weights leave no room for the KV and state pools"),
    ("RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. Current value: 0.5",
     "oom_kv", "the KV pool did not fit"),
    ("RuntimeError: Not enough GPU memory for hybrid (mamba/linear-attention) state cache. Computed "
     "max_mamba_cache_size=0", "oom_mamba", "the Mamba state pool did not fit"),
    ("ValueError: Hybrid (mamba/linear-attention) state cache is too small to serve any requests "
     "(max_mamba_cache_size=1).", "oom_mamba", "the Mamba state pool did not fit"),
    ("Exception: Capture cuda graph failed: CUDA error", "oom_cuda_graph", "CUDA graphs/activations did not fit outside the static pool"),
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", "oom_runtime", "CUDA ran out of memory outside the static pool"),
    ("torch.OutOfMemoryError: allocation failed", "oom_runtime", "CUDA ran out of memory outside the static pool"),
    ("sglang serve: error: unrecognized arguments: --bogus", "bad_args", "SGLang refused its command line"),
    ("sglang serve: error: ambiguous option: --cuda-graph-max-bs could match --cuda-graph-max-bs-decode",
     "bad_args", "SGLang refused its command line"),
    ("sglang serve: error: argument --mem-fraction-static: invalid float value: 'x'", "bad_args",
     "SGLang refused its command line"),
    ("ValueError: User-specified context_length 9999999 is greater than the derived context_length. To allow "
     "overriding, set SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1", "bad_args", "SGLang refused its command line"),
    ("OSError: [Errno 98] Address already in use", "port_in_use", "another process listens on this port"),
    ("ERROR:    [Errno 98] error while attempting to bind on address ('0.0.0.0', 30000): address already in use",
     "port_in_use", "another process listens on this port"),
]


@pytest.mark.parametrize("line, kind, hint_start", FATAL_LINES)
def test_each_fatal_pattern_has_its_kind_line_and_hint(line, kind, hint_start):
    fatal = readiness.find_fatal(["[2026] Load weight begin.", f"  {line}  ", "more"])
    assert fatal == readiness.FatalLine(kind, line, 2)
    assert fatal.kind is FailureKind(kind) and fatal.hint.startswith(hint_start)


@pytest.mark.parametrize("line", ["Rank 0 scheduler died during initialization (exit code: 1).",
                                  "Initialization failed. warmup_thread_exception",
                                  "Traceback (most recent call last):"])
def test_generic_failures_are_exited(line):
    fatal = readiness.find_fatal(["ok", f"{line} "])
    assert fatal == readiness.FatalLine("exited", line, 2)
    assert fatal.kind is FailureKind.EXITED and fatal.hint.startswith("read the log lines above")


def test_the_first_generic_line_is_kept_and_mid_line_traceback_is_not_fatal():
    lines = ["x Traceback (most recent call last)", "Initialization failed. a",
             "Rank 1 scheduler died during initialization"]
    assert readiness.find_fatal(lines) == readiness.FatalLine("exited", "Initialization failed. a", 2)
    assert readiness.find_fatal(["Initialization failed, retrying"]) is None


def _state(effective, **extra):
    return {"effective_max_running_requests_per_dp": effective, **extra}


def test_data_parallel_limits_sum_every_rank():
    info = {"max_total_num_tokens": 1000, "version": "0.5.23", "context_length": 8192,
            "internal_states": [_state(40, max_mamba_cache_size=200), _state(24, max_mamba_cache_size="120"),
                                _state("8", max_mamba_cache_size=40)]}
    limits = readiness.parse_server_info(info, server="n:1")
    assert (limits.effective_max_running_requests, limits.max_total_num_tokens, limits.max_mamba_cache_size,
            limits.context_length, limits.version, len(limits.ranks)) == (72, 1000, 360, 8192, "0.5.23", 3)
    assert limits.ranks[1] == readiness.RankLimits(24, None, 120)
    data = limits.to_dict()
    assert {key: value for key, value in data.items() if key != "ranks"} == {
        "effective_max_running_requests": 72, "max_total_num_tokens": 1000, "max_mamba_cache_size": 360,
        "context_length": 8192, "version": "0.5.23", "dp_ranks": 3, "top_level_total_tokens": 1000}
    assert data["ranks"][2] == {"max_running_requests": 8, "max_total_num_tokens": None, "max_mamba_cache_size": 40}


def test_tokens_and_context_fall_back_to_the_ranks():
    info = {"internal_states": [_state(8, max_total_num_tokens="640", context_length="4096"),
                                _state(8, max_total_num_tokens=600)]}
    limits = readiness.parse_server_info(info, server="n:1")
    assert (limits.max_total_num_tokens, limits.context_length, limits.version) == (1240, 4096, None)
    assert limits.max_mamba_cache_size is None and limits.top_level_total_tokens is None
    mixed = {"internal_states": [_state(1, max_mamba_cache_size=5), _state(1)], "max_total_num_tokens": 9}
    assert readiness.parse_server_info(mixed, server="n:1").max_mamba_cache_size is None


@pytest.mark.parametrize("info, message", [
    ([], "has no internal_states: is this SGLang >= 0.5.15?"),
    ({"internal_states": []}, "has no internal_states: is this SGLang >= 0.5.15?"),
    ({"internal_states": [{}]}, "internal_states[0] lacks effective_max_running_requests_per_dp"),
    ({"internal_states": [_state(1), "junk"]}, "internal_states[1] lacks effective_max_running_requests_per_dp"),
    ({"internal_states": [_state("many")]},
     "internal_states[0].effective_max_running_requests_per_dp is not a number: 'many'"),
    ({"internal_states": [_state(4, max_total_num_tokens=[1])]},
     "internal_states[0].max_total_num_tokens is not a number: [1]"),
    ({"internal_states": [_state(4, max_total_num_tokens=5, max_mamba_cache_size="k")]},
     "internal_states[0].max_mamba_cache_size is not a number: 'k'"),
    ({"internal_states": [_state(4)], "max_total_num_tokens": "lots"}, "max_total_num_tokens is not a number: 'lots'"),
    ({"internal_states": [_state(4, max_total_num_tokens=5)], "context_length": "long"},
     "context_length is not a number: 'long'"),
    ({"internal_states": [_state(4)]}, "has no max_total_num_tokens"),
    ({"internal_states": [_state(4, max_total_num_tokens=5), _state(4)]}, "has no max_total_num_tokens"),
])
def test_unreadable_server_info_names_the_server_and_the_field(info, message):
    with pytest.raises(ServerError) as raised:
        readiness.parse_server_info(info, server="node-7:30001")
    assert raised.value.server == "node-7:30001"
    assert str(raised.value).startswith(f"[server node-7:30001] /server_info {message}")


def test_missing_internal_states_hint_names_the_field_read():
    with pytest.raises(ServerError) as raised:
        readiness.parse_server_info({}, server="n:1")
    assert raised.value.hint == "fleetgen reads effective_max_running_requests_per_dp from internal_states"


def test_log_excerpt_keeps_the_last_lines_indented():
    assert readiness.format_log_excerpt(["a", "b", "c"], limit=2) == "    | b\n    | c"
    assert readiness.format_log_excerpt([str(i) for i in range(60)]).splitlines()[0] == "    | 10"
