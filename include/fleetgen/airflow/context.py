"""What every task callable starts from: the Airflow context, the run configuration, the run's output
layout; and the rule that an error a retry cannot fix fails the task at once."""

from __future__ import annotations

import functools

from fleetgen.airflow.run_config import RunConfig
from fleetgen.errors import (AuthenticationRefused, ConfigError, HostKeyMismatch, ModelConfigError, OutputUnwritable,
                             PlanError, ProbeError, PromptsError, ServerReplaced, ShardPlanChanged,
                             StoreBucketMissing, StoreDenied, ValidationFailed)
from fleetgen.outputs import RunLayout

# Errors a retry cannot fix: bad input, a model we cannot size, a plan that cannot fit, failed data, a node
# presenting another host key than its connection's or refusing its login or key (a missing key file is a
# ConfigError), an output disk that is still full or not writable, a server that is not the launch wait_ready read,
# a shard's output written for another plan, an object store that refuses the connection's credentials or has no
# such bucket.
DETERMINISTIC_ERRORS = (ConfigError, ModelConfigError, PlanError, ProbeError, PromptsError, ValidationFailed,
                        HostKeyMismatch, AuthenticationRefused, OutputUnwritable, ServerReplaced, ShardPlanChanged,
                        StoreDenied, StoreBucketMissing)


def fail_fast(function):
    """Turn a deterministic error into AirflowFailException (no retry: the same input fails the same
    way), keeping the message and the original as its cause.

    Applied in one place, the DAG's ``_task`` helper (dags/sglang_generation.py), to every task callable: the
    callables themselves stay undecorated and raise fleetgen's own errors (what their tests check)."""

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        try:
            return function(*args, **kwargs)
        except DETERMINISTIC_ERRORS as error:
            from airflow.sdk.exceptions import AirflowFailException

            raise AirflowFailException(str(error)) from error

    return wrapper


def task_context():
    from airflow.sdk import get_current_context

    return get_current_context()


def run_context() -> tuple[dict, RunConfig, RunLayout]:
    """The task's context, the run configuration and the run's output layout. For a run on an object store, inside
    ``run_storage.task_run``: the layout of the task's scratch copy, and a configuration whose ``output_root`` (and
    ``prompts_path``, when the task reads the prompts) are that copy's."""
    from fleetgen.airflow.run_storage import current_store_run, local_config

    context = task_context()
    run = current_store_run()
    config = local_config(RunConfig.from_params(context["params"]), run)
    return context, config, RunLayout(run.mirror.run_root) if run is not None else config.layout(context["run_id"])


def run_type(context: dict) -> str | None:
    """The run's type as text (``scheduled``, ``manual``, ...; Airflow gives an enum), or None in a context without
    its DAG run (a task tested on its own)."""
    value = getattr(context.get("dag_run"), "run_type", None)
    return getattr(value, "value", value)


def mapped_values(mapped) -> list:
    """All values of a mapped task's output in one request (``list()`` on the lazy sequence asks
    index by index and logs a spurious "XCom not found" at the end)."""
    return list(mapped[:]) if hasattr(mapped, "__getitem__") and not isinstance(mapped, list) else list(mapped)
