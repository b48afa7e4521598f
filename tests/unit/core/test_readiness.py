import pytest

from fleetgen.nodes import readiness
from fleetgen.errors import ServerError

KV_OOM = ("RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. "
          "Current value: mem_fraction_static=0.5")


@pytest.mark.parametrize("line, kind", [
    ("ValueError: Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static=0.3.", "oom_weights"),
    (KV_OOM, "oom_kv"),
    ("RuntimeError: Not enough GPU memory for hybrid (mamba/linear-attention) state cache. Computed "
     "max_mamba_cache_size=0 (total_rest_memory=1.00 GB, mamba_cache_per_req=146.81 MB).", "oom_mamba"),
    ("Capture cuda graph failed: CUDA out of memory.", "oom_cuda_graph"),
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
