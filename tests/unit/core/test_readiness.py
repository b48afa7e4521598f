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
