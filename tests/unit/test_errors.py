"""Failure kinds: one list for the log classifier, the readiness operator and the back-off; every kind tested.
And what every error says: where to look, then what to check next."""

import pytest

from fleetgen.errors import (ConfigError, FailureKind, FleetgenError, HostKeyMismatch, HostUnreachable, OutputError,
                             OutputUnwritable, PlanError, PromptsError, RemoteError, ServerStartupError,
                             ValidationFailed)
from fleetgen.nodes import readiness
from fleetgen.tuning import TunerBounds, backoff, plan_server

# One real SGLang 0.5.23 (or uvicorn/argparse) line per kind, as the server's log shows it.
LINES = {
    FailureKind.OOM_WEIGHTS: "ValueError: Loaded weights leave no GPU memory for the KV cache under "
                             "--mem-fraction-static=0.3.",
    FailureKind.OOM_KV: "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. "
                        "Current value: mem_fraction_static=0.5",
    FailureKind.OOM_MAMBA: "RuntimeError: Hybrid (mamba/linear-attention) state cache is too small to serve any "
                           "requests: max_mamba_cache_size=2.",
    FailureKind.OOM_CUDA_GRAPH: "Exception: Capture cuda graph failed: CUDA out of memory.",
    FailureKind.OOM_RUNTIME: "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
    FailureKind.BAD_ARGS: "launch_server.py: error: argument --mem-fraction-static: invalid float value: 'x'",
    FailureKind.PORT_IN_USE: "ERROR:    [Errno 98] error while attempting to bind on address ('0.0.0.0', 30000): "
                             "address already in use",
    FailureKind.EXITED: "Rank 0 scheduler died during initialization (exit code: -9).",
}
SHRINKS = {FailureKind.OOM_WEIGHTS: "pre_load", FailureKind.OOM_KV: "requests", FailureKind.OOM_MAMBA: "requests",
           FailureKind.OOM_CUDA_GRAPH: "reserve", FailureKind.OOM_RUNTIME: "reserve"}


def test_every_kind_has_a_log_line_here():
    assert set(LINES) == set(FailureKind)


@pytest.mark.parametrize("kind", list(FailureKind))
def test_the_classifier_names_each_kind(kind):
    fatal = readiness.find_fatal(["Load weight begin.", LINES[kind], "after"])
    assert fatal is not None and fatal.kind is kind and fatal.line == LINES[kind] and fatal.line_number == 2


@pytest.mark.parametrize("kind", list(FailureKind))
def test_each_kind_backs_off_in_its_own_dimension_or_not_at_all(kind, cases, seed_profile, seed_options):
    plan = plan_server(host="gpu-node-1", gpu_ids=[2], port=30002, gpus=[cases.gpu_row(2)], profile=seed_profile,
                       options=seed_options, workload=cases.SEED_WORKLOAD, bounds=TunerBounds())
    assert kind.backoff_step == SHRINKS.get(kind)
    assert kind.can_back_off() is (kind in SHRINKS)
    if not kind.can_back_off():
        with pytest.raises(PlanError, match=f"failed with {kind.value}, which a smaller plan cannot fix"):
            backoff(plan, kind)
        return
    smaller = backoff(plan, kind.value)  # the operator hands the JSON value over from the trigger event
    assert smaller.attempt == 1
    assert smaller.expected["max_running_requests"] < plan.expected["max_running_requests"]
    if SHRINKS[kind] == "reserve":
        assert smaller.flags["--mem-fraction-static"] < plan.flags["--mem-fraction-static"]


@pytest.mark.parametrize("kind", list(FailureKind))
def test_each_hint_says_what_to_change(kind):
    settings = ("memory_margin_mib", "max_running_requests", "bf16_ssm_state", "extra_args", "ports", "log lines")
    assert any(name in kind.hint for name in settings), kind.hint


# What an error says: where to look, then what to check next.


def test_the_kinds_keep_the_values_that_travel_in_trigger_events_and_failure_records():
    assert {kind.value for kind in FailureKind} == {"oom_weights", "oom_kv", "oom_mamba", "oom_cuda_graph",
                                                      "oom_runtime", "bad_args", "port_in_use", "exited"}
    assert FailureKind("oom_kv") is FailureKind.OOM_KV and FailureKind.OOM_KV == "oom_kv"


def test_an_error_names_host_server_shard_and_file_line_in_that_order():
    error = FleetgenError("it broke", host="gpu-node-1", server="gpu-node-1:30000", shard=7, path="fleet.yaml",
                          line=12, hint="fix it")
    assert str(error) == "[host gpu-node-1, server gpu-node-1:30000, shard 7, fleet.yaml:12] it broke\n" \
                         "What to check next: fix it"
    assert (error.message, error.host, error.server, error.shard, error.path, error.line, error.hint) == (
        "it broke", "gpu-node-1", "gpu-node-1:30000", 7, "fleet.yaml", 12, "fix it")


def test_the_first_shard_and_the_first_line_are_named_too():
    assert str(FleetgenError("failed", shard=0)) == "[shard 0] failed"
    assert str(FleetgenError("bad", path="prompts.jsonl", line=0)) == "[prompts.jsonl:0] bad"


def test_an_error_without_context_or_hint_is_just_its_message():
    assert str(FleetgenError("plain")) == "plain"
    assert str(FleetgenError("plain", hint="")) == "plain"
    assert str(ConfigError("no such file", path="/etc/fleet.yaml")) == "[/etc/fleet.yaml] no such file"
    assert FleetgenError("plain").context() == ""


def test_a_host_key_mismatch_says_both_fingerprints_and_where():
    error = HostKeyMismatch("the host key of 10.0.0.5 does not match connection 'ssh_n1'",
                            expected="ssh-ed25519 SHA256:aaa", received="ssh-ed25519 SHA256:bbb", host="n1",
                            hint="compare with ssh-keygen -lf")
    assert (error.expected, error.received, error.host) == ("ssh-ed25519 SHA256:aaa", "ssh-ed25519 SHA256:bbb", "n1")
    assert str(error) == ("[host n1] the host key of 10.0.0.5 does not match connection 'ssh_n1': expected "
                          "ssh-ed25519 SHA256:aaa, received ssh-ed25519 SHA256:bbb\n"
                          "What to check next: compare with ssh-keygen -lf")


def _clause_that_catches(error: Exception) -> str:
    """The order a caller writes: the mismatch first (never retried), then unreachability (retried)."""
    try:
        raise error
    except HostKeyMismatch:
        return "mismatch"
    except HostUnreachable:
        return "unreachable"
    except RemoteError:
        return "remote"


def test_a_host_key_mismatch_is_a_kind_of_unreachable_node_that_its_own_clause_catches_first():
    mismatch = HostKeyMismatch("m", expected="a", received="b")
    assert isinstance(mismatch, HostUnreachable) and isinstance(mismatch, FleetgenError)
    assert _clause_that_catches(mismatch) == "mismatch"
    # A refused connection is not a mismatch: it stays retryable.
    assert _clause_that_catches(HostUnreachable("refused", host="n1")) == "unreachable"
    assert _clause_that_catches(RemoteError("exit 1", host="n1")) == "remote"


def test_a_startup_error_puts_what_to_check_under_the_headline_and_before_the_log_tail():
    error = ServerStartupError("server n1:30000 died\nlog tail:\n  line 1\n  line 2", host="n1", server="n1:30000",
                               hint="lower max_running_requests", fatal_line="RuntimeError: Not enough memory",
                               kind="oom_kv", log_tail=["line 1", "line 2"])
    assert str(error) == ("[host n1, server n1:30000] server n1:30000 died\n"
                          "What to check next: lower max_running_requests\n"
                          "log tail:\n  line 1\n  line 2")
    assert (error.fatal_line, error.kind, error.log_tail) == ("RuntimeError: Not enough memory", "oom_kv",
                                                              ["line 1", "line 2"])


def test_a_startup_error_without_hint_context_or_tail_is_its_headline():
    error = ServerStartupError("died")
    assert str(error) == "died"
    assert (error.fatal_line, error.kind, error.log_tail) == (None, None, [])
    assert str(ServerStartupError("died\ntail", server="s")) == "[server s] died\ntail"


def test_the_log_tail_is_the_errors_own_copy():
    tail = ["line 1"]
    error = ServerStartupError("died", log_tail=tail)
    tail.append("written later")
    assert error.log_tail == ["line 1"]


def test_errors_carry_their_details_and_default_to_empty_ones():
    problems = [(3, "not JSON")]
    prompts = PromptsError("bad prompts", problems=problems, path="p.jsonl")
    problems.append((4, "later"))
    assert prompts.problems == [(3, "not JSON")] and PromptsError("x").problems == []
    assert str(prompts) == "[p.jsonl] bad prompts"
    full = OutputUnwritable("disk full", errno=28, shard=0)
    assert full.errno == 28 and isinstance(full, OutputError) and str(full) == "[shard 0] disk full"
    assert OutputError("x").errno is None
    failed = ValidationFailed("3 expectations failed", summary={"passed": False}, path="validation/summary.json")
    assert failed.summary == {"passed": False} and str(failed) == "[validation/summary.json] 3 expectations failed"
    assert ValidationFailed("failed").summary == {}
