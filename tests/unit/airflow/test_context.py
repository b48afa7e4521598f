"""What every task starts from: deterministic errors fail at once (no retry), the rest are retried; the
run's configuration and output layout come from the task's context; a mapped output is read in one request."""

import errno

import pytest
from airflow.sdk.exceptions import AirflowFailException

from fleetgen.airflow import context as task_context_module
from fleetgen.airflow.context import DETERMINISTIC_ERRORS, fail_fast, mapped_values, run_context
from fleetgen.airflow.run_config import RunConfig
from fleetgen.errors import (AuthenticationRefused, ConfigError, FleetgenError, HostKeyMismatch, HostUnreachable,
                             ModelConfigError, OutputError, OutputUnwritable, PlanError, ProbeError, PromptsError,
                             RemoteError, ServerReplaced, ShardLeaseLost, ShardPlanChanged, StoreBucketMissing,
                             StoreConflict, StoreDenied, StoreError, StoreUnreachable, ValidationFailed)


def _raising(error):
    def task():
        raise error

    return task


@pytest.mark.parametrize("error", [
    ConfigError("bad fleet file"), ModelConfigError("no num_hidden_layers"), PlanError("does not fit"),
    ProbeError("no GPU"), PromptsError("no prompt"), ValidationFailed("too many truncated"),
    HostKeyMismatch("n1 presents another host key", expected="ssh-ed25519 SHA256:a", received="ssh-ed25519 SHA256:b",
                    host="n1"),
    OutputUnwritable("disk full", errno=errno.ENOSPC), ShardPlanChanged("written for a different plan", shard=3),
    StoreDenied("refused the credentials", path="s3://b/k", conn_id="aws_default"),
    StoreBucketMissing("no bucket", path="s3://b/k")])
def test_an_error_a_retry_cannot_fix_fails_the_task_at_once_keeping_message_and_cause(error):
    with pytest.raises(AirflowFailException) as caught:
        fail_fast(_raising(error))()
    assert str(caught.value) == str(error) and caught.value.__cause__ is error


@pytest.mark.parametrize("error", [FleetgenError("transient"), HostUnreachable("n1 refused", host="n1"),
                                   RemoteError("exit 255", host="n1"), OutputError("full, space free again",
                                                                           errno=errno.ENOSPC),
                                   OSError("connection reset"), KeyError("x"),
                                   StoreError("503 SlowDown after 5 tries", path="s3://b/k"),
                                   StoreUnreachable("the store does not answer", path="s3://b/k"),
                                   StoreConflict("another writer", path="s3://b/k"),
                                   ShardLeaseLost("a newer try took over", shard=1)])
def test_any_other_error_is_left_to_airflows_retries(error):
    with pytest.raises(type(error)) as caught:
        fail_fast(_raising(error))()
    assert caught.value is error


def test_the_deterministic_errors_are_exactly_those_a_retry_cannot_fix():
    assert set(DETERMINISTIC_ERRORS) == {ConfigError, ModelConfigError, PlanError, ProbeError, PromptsError,
                                         ValidationFailed, HostKeyMismatch, AuthenticationRefused, OutputUnwritable,
                                         ServerReplaced, ShardPlanChanged, StoreDenied, StoreBucketMissing}


def test_a_wrapped_task_keeps_its_name_docs_arguments_and_result():
    def load_fleet(node, *, port):
        """Load the fleet."""
        return f"{node}:{port}"

    wrapped = fail_fast(load_fleet)
    assert wrapped("n1", port=30000) == "n1:30000"
    assert (wrapped.__name__, wrapped.__doc__, wrapped.__wrapped__) == ("load_fleet", "Load the fleet.", load_fleet)


def test_the_run_context_reads_the_params_and_lays_out_this_runs_output(monkeypatch, tmp_path):
    params = {spec.name: spec.default_value() for spec in RunConfig.settings()}
    params.update(output_root=str(tmp_path), max_tokens=77)
    monkeypatch.setenv("FLEETGEN_OUTPUT_ROOT", str(tmp_path))  # the deployment's root, as a run's default
    airflow_context = {"params": params, "run_id": "manual__2026-01-01T00:00:00+00:00"}
    monkeypatch.setattr(task_context_module, "task_context", lambda: airflow_context)
    context, config, layout = run_context()
    assert context is airflow_context and config.generation.max_tokens == 77
    assert layout.root == tmp_path / "manual__2026-01-01T00_00_00_00_00"


def test_the_task_context_is_airflows_current_one(monkeypatch):
    import airflow.sdk

    current = {"run_id": "manual__3"}
    monkeypatch.setattr(airflow.sdk, "get_current_context", lambda: current)
    assert task_context_module.task_context() is current


class _LazyMappedOutput:
    """Airflow's lazy sequence of a mapped task's XComs: a slice is one request, an index is one each."""

    def __init__(self, values):
        self.values = values
        self.requests = []

    def __getitem__(self, key):
        self.requests.append(key)
        return self.values[key]

    def __len__(self):
        return len(self.values)


def test_a_mapped_output_is_read_in_one_request_first_value_included():
    mapped = _LazyMappedOutput([{"shard_id": 0}, {"shard_id": 1}, {"shard_id": 2}])
    assert mapped_values(mapped) == [{"shard_id": 0}, {"shard_id": 1}, {"shard_id": 2}]
    assert mapped.requests == [slice(None, None, None)]


def test_plain_lists_and_iterables_are_copied_as_they_are():
    plain = [3, 1, 2]
    copied = mapped_values(plain)
    assert copied == [3, 1, 2] and copied is not plain
    assert mapped_values(iter([0, 1])) == [0, 1]
    assert mapped_values((0, 1)) == [0, 1]
