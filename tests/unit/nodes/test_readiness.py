"""Every fatal pattern, its kind and hint, and every field of the /server_info readback (DP included)."""

import pytest
from fleetgen.nodes import readiness
from fleetgen.errors import ServerError
from fleetgen.errors import FailureKind, ServerError
from fleetgen.nodes.readiness import LOG_LINE_CHARS, args_as_flags, format_log_excerpt, launch_differences

KV_OOM = ("RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. "
          "Current value: mem_fraction_static=0.5")


@pytest.mark.parametrize("line, kind", [
    ("ValueError: Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static=0.3.", "oom_weights"),
    (KV_OOM, "oom_kv"),
    ("RuntimeError: Not enough GPU memory for hybrid (mamba/linear-attention) state cache. Computed "
     "max_mamba_cache_size=0 (total_rest_memory=1.00 GB, mamba_cache_per_req=146.81 MB).", "oom_mamba"),
    ("Capture cuda graph failed: CUDA out of memory.", "oom_cuda_graph"),
    ("ValueError: SWA pool (128 tokens) cannot hold even one request: the prefill admission floor is "
     "sliding_window_size (127) + page_size (1). Increase --swa-full-tokens-ratio or the total KV budget.", "oom_kv"),
    ("sglang serve: error: ambiguous option: --cuda-graph-max-bs could match --cuda-graph-max-bs-decode, "
     "--cuda-graph-max-bs-prefill", "bad_args"),
])
def test_fatal_kinds(line, kind):
    fatal = readiness.find_fatal(["[2026] Load weight begin.", line, "more"])
    assert fatal is not None and fatal.kind == kind and fatal.line_number == 2 and fatal.hint


def test_specific_beats_generic_and_healthy_log_is_none():
    lines = ["Traceback (most recent call last):", "  File x", KV_OOM,
             "Rank 0 scheduler died during initialization (exit code: 1)."]
    assert readiness.find_fatal(lines).kind == "oom_kv"
    assert readiness.find_fatal(["Rank 0 scheduler died during initialization (exit code: -9)."]).kind == "exited"
    assert readiness.find_fatal(["Load weight end.", "The server is fired up and ready to roll!"]) is None


def test_parse_server_info_uses_effective_cap_not_requested():
    info = {"max_running_requests": 64, "max_total_num_tokens": 798000, "version": "0.5.23",
            "internal_states": [{"effective_max_running_requests_per_dp": 40, "max_mamba_cache_size": 200}]}
    limits = readiness.parse_server_info(info, server="n:1")
    assert (limits.effective_max_running_requests, limits.max_total_num_tokens, limits.max_mamba_cache_size) == (
        40, 798000, 200)


def test_server_info_survives_the_xcom_round_trip():
    info = {"max_total_num_tokens": 1000, "version": "0.5.23", "context_length": 8192,
            "internal_states": [{"effective_max_running_requests_per_dp": 40, "max_mamba_cache_size": 200},
                                {"effective_max_running_requests_per_dp": 39, "max_mamba_cache_size": 195}]}
    parsed = readiness.parse_server_info(info, server="n:1")
    again = readiness.ServerInfo.from_dict(parsed.to_dict(), server="n:1")
    assert again == parsed
    assert (again.effective_max_running_requests, again.max_mamba_cache_size, len(again.ranks)) == (79, 395, 2)


def test_parse_server_info_errors_name_the_server():
    with pytest.raises(ServerError, match=r"\[server n:1\] /server_info has no internal_states"):
        readiness.parse_server_info({"max_total_num_tokens": 1}, server="n:1")


def test_a_simulated_server_is_told_apart_by_the_sim_state_it_reports():
    state = {"effective_max_running_requests_per_dp": 40, "max_mamba_cache_size": 200}
    real = readiness.parse_server_info({"max_total_num_tokens": 1000, "internal_states": [state]}, server="n:1")
    simulated = readiness.parse_server_info(
        {"max_total_num_tokens": 1000, "internal_states": [{**state, "sim": {"decode_tokens_per_s": 1.0}}]},
        server="n:1")
    assert (real.simulated, simulated.simulated) == (False, True)
    assert readiness.ServerInfo.from_dict(simulated.to_dict(), server="n:1").simulated


# Real SGLang 0.5.23 logs on CPU (tests/real_sglang/test_fatal_starts.py launches each), trimmed; the failing
# line is the one the readiness wait must report.
_AT = "[2026-12-01 14:59:02] "


_FRAME = ['  File "/venv/sglang/srt/managers/scheduler.py", line 6362, in run_scheduler_process',
          "    scheduler = Scheduler(server_args, port_args)"]


_SCHEDULER_DIED = [  # a scheduler raised: its traceback, then the launcher kills its process tree (exit -9)
    f"{_AT}Scheduler hit an exception: Traceback (most recent call last):", *_FRAME, "{line}", "",
    f"{_AT}Received sigquit from a child process. It usually means the child failed.",
    f"{_AT}kill_process_tree called: parent_pid=20191, include_parent=True, pid=20191"]


_LAUNCHER_DIED = [  # the launcher raised while resolving its arguments (exit 1)
    f"{_AT}kill_process_tree called: parent_pid=18874, include_parent=False, pid=18874",
    "Traceback (most recent call last):",
    '  File "/venv/sglang/srt/utils/hf_transformers/config.py", line 379, in get_config', "{line}"]


REAL_FAILURES = {
    "kv_pool_below_one_page": (_SCHEDULER_DIED, "oom_kv",
                               "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static."),
    "static_fraction_below_weights": (
        _SCHEDULER_DIED, "oom_weights",
        "ValueError: Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static=1e-05. Raise "
        "--mem-fraction-static above 0.009 (minimum viable = 1 - available/pre = 0.0085). If using speculative "
        "decoding, draft weights are now counted."),
    "unknown_architecture": (
        _SCHEDULER_DIED, "exited",
        "ValueError: Cannot find model module. 'NoSuchModelForCausalLM' is not a registered model in the "
        "Transformers library (only relevant if the model is meant to be in Transformers)"),
    "context_longer_than_the_models": (
        _LAUNCHER_DIED, "bad_args",
        "ValueError: Warning: User-specified context_length (4096) is greater than the derived context_length "
        "(2048). This may lead to incorrect model outputs or CUDA errors. Note that the derived context_length may "
        "differ from max_position_embeddings in the model's config. To allow overriding this maximum, set the env "
        "var SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1"),
    "folder_without_config": (
        _LAUNCHER_DIED, "exited",
        "ValueError: Unrecognized model in /models/m. Should have a `model_type` key in its config.json."),
    "folder_without_tokenizer": (_LAUNCHER_DIED, "exited",
                                 "ValueError: Couldn't instantiate the backend tokenizer from one of:"),
    "model_path_not_there": (
        _LAUNCHER_DIED, "exited",
        "huggingface_hub.errors.HFValidationError: Repo id must be in the form 'repo_name' or "
        "'namespace/repo_name': '/models/gone'. Use `repo_type` argument if needed."),
    "unknown_flag": (["                    [--enable-flashinfer-allreduce-fusion]", "{line}"], "bad_args",
                     "sglang serve: error: unrecognized arguments: --no-such-flag 1"),
    "port_in_use": ([f"{_AT}INFO:     Application startup complete.", "{line}",
                     f"{_AT}INFO:     Waiting for application shutdown."], "port_in_use",
                    f"{_AT}ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', 25000): "
                    "address already in use"),
}


@pytest.mark.parametrize("case", sorted(REAL_FAILURES))
def test_a_real_failure_is_reported_by_the_line_that_names_its_cause(case):
    template, kind, line = REAL_FAILURES[case]
    lines = [line if entry == "{line}" else entry for entry in template]
    assert readiness.find_fatal(lines) == readiness.FatalLine(kind, line, lines.index(line) + 1)


def test_the_scheduler_exception_wins_over_a_later_launcher_traceback():
    # a scheduler killed without its own SIGQUIT: the launcher's RuntimeError follows the first exception
    lines = [*_SCHEDULER_DIED[:3], "ValueError: the cause", "", "Traceback (most recent call last):",
             "RuntimeError: Rank 0 scheduler died during initialization (exit code: 1)."]
    assert readiness.find_fatal(lines) == readiness.FatalLine("exited", "ValueError: the cause", 4)


def test_a_cause_whose_exception_class_does_not_end_in_error_wins_over_the_launchers_sigquit():
    # a package's own exception class is the root cause; the launcher's SIGQUIT line after it only follows it
    lines = ["pkg.SomeException: the cause" if line == "{line}" else line for line in _SCHEDULER_DIED]
    assert readiness.find_fatal(lines) == readiness.FatalLine("exited", "pkg.SomeException: the cause", 4)


def test_the_launchers_sigquit_line_is_fatal_when_the_traceback_scrolled_out_of_the_tail():
    fatal = readiness.find_fatal(_SCHEDULER_DIED[-2:])
    assert fatal == readiness.FatalLine(
        "exited", f"{_AT}Received sigquit from a child process. It usually means the child failed.", 1)


def test_a_healthy_real_start_up_has_no_fatal_line():
    lines = ["/venv/sglang/srt/layers/quantization/awq/awq.py:53: UserWarning: Only CUDA, HIP and XPU support AWQ "
             "currently.", '  warnings.warn(f"Only CUDA, HIP and XPU support AWQ currently.")',
             f"{_AT}Ignore import error when loading sglang.srt.models.grok: '_OpNamespace' 'sgl_kernel' object "
             "has no attribute 'fused_moe_router_cpu'",
             f"{_AT}OpenAI Responses API (/v1/responses) disabled: OpenAIServingResponses init failed "
             "(ModuleNotFoundError: No module named 'openai_harmony')",
             f"{_AT}The server is fired up and ready to roll!"]
    assert readiness.find_fatal(lines) is None


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
    ({"internal_states": [_state(4, max_total_num_tokens=5, memory_usage={"token_capacity_swa": "wide"})]},
     "internal_states[0].memory_usage.token_capacity_swa is not a number: 'wide'"),
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


def test_flags_are_read_with_values_after_a_space_or_an_equals_sign_and_bare_switches():
    args = ["python", "-m", "sglang.launch_server", "--tp-size", "2", "--json-model-override-args={\"a\": \"b=c\"}",
            "--enable-metrics", "--mem-fraction-static", "0.871", "positional", "--disable-radix-cache"]
    assert args_as_flags(args) == {"--tp-size": "2", "--json-model-override-args": "{\"a\": \"b=c\"}",
                                   "--enable-metrics": True, "--mem-fraction-static": "0.871",
                                   "--disable-radix-cache": True}


def test_a_switch_last_on_the_line_is_a_switch():
    assert args_as_flags(["--model-path", "/m", "--enable-metrics"]) == {"--model-path": "/m", "--enable-metrics": True}
    assert args_as_flags(["--a=1=2"]) == {"--a": "1=2"}


def test_the_same_plan_has_no_difference():
    info = {"tp_size": 2, "mem_fraction_static": 0.871, "enable_metrics": True, "kv_cache_dtype": "fp8_e4m3",
            "speculative_algorithm": "EAGLE", "model_path": "/models/m", "disable_cuda_graph": False,
            "enable_mixed_chunk": True, "version": "0.5.23"}
    flags = {"--tp-size": "2", "--mem-fraction-static": "0.871", "--enable-metrics": True,
             "--kv-cache-dtype": "fp8_e4m3", "--speculative-algorithm": "NEXTN", "--model-path": "/models/m",
             "--disable-cuda-graph": "False", "--enable-mixed-chunk": "true"}
    assert launch_differences(info, flags, expected_version="0.5.23") == []


@pytest.mark.parametrize(("flag", "expected", "reported"), [
    ("--tp-size", "2", 4),
    ("--mem-fraction-static", "0.871", 0.87),
    ("--enable-metrics", True, False),
    ("--disable-radix-cache", "false", True),
    ("--kv-cache-dtype", "fp8_e4m3", "auto"),
    ("--model-path", "/models/a", "/models/b"),
    ("--speculative-algorithm", "EAGLE3", "EAGLE"),
])
def test_each_changed_value_is_named_with_both_sides(flag, expected, reported):
    field = flag[2:].replace("-", "_")
    assert launch_differences({field: reported, "version": "v"}, {flag: expected}, expected_version="v") == [
        f"{flag}: running {reported!r}, tonight {expected!r}"]


def test_an_unreported_flag_and_another_version_are_differences():
    assert launch_differences({"version": "0.5.22"}, {"--max-running-requests": "64"}, expected_version="0.5.23") == [
        "--max-running-requests: the server does not report max_running_requests",
        "version: running '0.5.22', installed '0.5.23'"]
    assert launch_differences({"version": "0.5.22"}, {}, expected_version=None) == []


def test_a_long_log_line_is_cut_with_a_mark_and_a_line_at_the_limit_is_not():
    excerpt = format_log_excerpt(["x" * LOG_LINE_CHARS, "y" * (LOG_LINE_CHARS + 1)])
    assert excerpt == f"    | {'x' * LOG_LINE_CHARS}\n    | {'y' * LOG_LINE_CHARS} …"


@pytest.mark.parametrize(("flag", "expected", "reported"), [
    ("--mem-fraction-static", "0.50", 0.5),
    ("--max-running-requests", "64", 64.0),
    ("--chunked-prefill-size", "8192", "8192"),
])
def test_numbers_are_compared_as_numbers(flag, expected, reported):
    field = flag[2:].replace("-", "_")
    assert launch_differences({field: reported}, {flag: expected}, expected_version=None) == []


@pytest.mark.parametrize(("flag", "field"), [("--tensor-parallel-size", "tp_size"), ("--model", "model_path"),
                                             ("--data-parallel-size", "dp_size"),
                                             ("--pipeline-parallel-size", "pp_size")])
def test_an_alias_flag_is_compared_with_the_field_it_sets(flag, field):
    # SGLang reports the field (tp_size), never the alias a user's extra args may spell
    assert launch_differences({field: 2, "version": "v"}, {flag: "2"}, expected_version="v") == []
    assert launch_differences({field: 4, "version": "v"}, {flag: "2"}, expected_version="v") == [
        f"{flag}: running 4, tonight '2'"]


def test_the_sliding_window_pool_is_read_from_each_ranks_memory_usage():
    info = {"max_total_num_tokens": 1000,
            "internal_states": [_state(8, memory_usage={"token_capacity_swa": "4096", "token_capacity": 1000}),
                                _state(8, memory_usage="not reported"), _state(8, memory_usage={})]}
    limits = readiness.parse_server_info(info, server="n:1")
    assert [rank.swa_max_total_num_tokens for rank in limits.ranks] == [4096, None, None]
    plain = {"max_running_requests": 8, "max_total_num_tokens": None, "max_mamba_cache_size": None}
    assert [rank.to_dict() for rank in limits.ranks] == [{**plain, "swa_max_total_num_tokens": 4096}, plain, plain]
    assert readiness.ServerInfo.from_dict(limits.to_dict(), server="n:1") == limits


def test_a_launch_is_read_by_its_model_path_identity_and_the_field_of_each_planned_flag():
    started = {"load_weight": 41.2, "kv_cache_allocation": 3.1, "scheduler_e2e": 58.7, "tokenizer_e2e": 61.0}
    info = {"model_path": "/models/a", "weight_version": "fleetgen/night-1", "max_running_requests": 71,
            "mem_fraction_static": 0.83, "tp_size": 2, "context_length": 8192, "startup_time": started}
    fields = readiness.launch_fields(info, {"--max-running-requests": 71, "--mem-fraction-static": 0.83,
                                            "--tensor-parallel-size": 2})
    assert fields == {"model_path": "/models/a", "weight_version": "fleetgen/night-1", "startup_time": started,
                      "max_running_requests": 71, "mem_fraction_static": 0.83, "tp_size": 2}


def test_a_server_restarted_with_the_very_same_command_line_is_told_apart_by_its_start_up_durations():
    info = {"model_path": "/models/a", "weight_version": "fleetgen/night-1", "max_running_requests": 71,
            "startup_time": {"load_weight": 41.2, "scheduler_e2e": 58.7}}
    read = readiness.launch_fields(info, {"--max-running-requests": 71})
    again = {**info, "startup_time": {"load_weight": 40.9, "scheduler_e2e": 58.1}}
    assert readiness.launch_changes(read, again) == [
        "startup_time: read {'load_weight': 41.2, 'scheduler_e2e': 58.7}, now {'load_weight': 40.9, 'scheduler_e2e': "
        "58.1}"]


def test_the_same_launch_read_again_has_no_change():
    info = {"model_path": "/models/a", "weight_version": "fleetgen/night-1", "max_running_requests": 71}
    read = readiness.launch_fields(info, {"--max-running-requests": 71})
    assert readiness.launch_changes(read, {**info, "last_gen_throughput": 812.5}) == []


def test_a_server_restarted_with_another_checkpoint_and_cap_names_each_changed_field_both_ways():
    read = readiness.launch_fields({"model_path": "/models/a", "weight_version": "fleetgen/night-1",
                                    "max_running_requests": 71}, {"--max-running-requests": 71})
    now = {"model_path": "/models/b", "weight_version": "fleetgen/night-1", "max_running_requests": 4}
    assert readiness.launch_changes(read, now) == ["model_path: read '/models/a', now '/models/b'",
                                                   "max_running_requests: read 71, now 4"]
    assert readiness.launch_changes(read, {}) == ["model_path: read '/models/a', now None",
                                                  "weight_version: read 'fleetgen/night-1', now None",
                                                  "max_running_requests: read 71, now None"]
