"""Failure kinds: one list for the log classifier, the readiness operator and the back-off; every kind tested."""

import pytest

from fleetgen.errors import FailureKind, PlanError, ServerStartupError
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
