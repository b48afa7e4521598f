"""The task side of an unwritable output: no retry while the disk is full, and the failure summary
reaches the task log when failures.jsonl cannot be written either."""

import errno
import json
import logging
from types import SimpleNamespace

import pytest

from fleetgen.airflow.context import fail_fast
from fleetgen.airflow.failures import describe_failure
from fleetgen.errors import OutputError, OutputUnwritable


def test_a_still_full_disk_fails_the_task_without_retry_and_a_freed_one_is_retried():
    from airflow.sdk.exceptions import AirflowFailException

    def full():
        raise OutputUnwritable("cannot write", errno=errno.ENOSPC, shard=4, path="/out/stats/shard-00004.jsonl")

    def freed():
        raise OutputError("cannot write; space is free again", errno=errno.ENOSPC, shard=4)

    with pytest.raises(AirflowFailException, match=r"\[shard 4, /out/stats/shard-00004.jsonl\] cannot write"):
        fail_fast(full)()
    with pytest.raises(OutputError):  # left to Airflow's retries
        fail_fast(freed)()


def test_the_failure_summary_goes_to_the_log_when_failures_jsonl_cannot_be_written(tmp_path, caplog, monkeypatch):
    monkeypatch.setenv("FLEETGEN_OUTPUT_ROOT", str(tmp_path))  # an allowed root: only the write fails
    blocked = tmp_path / "root"
    blocked.write_text("a file where the output folder should be")  # mkdir fails like a full or read-only disk
    error = OutputUnwritable("cannot write the shard's output: No space left on device", errno=errno.ENOSPC,
                             shard=4, path="/out/completions/shard-00004.jsonl", hint="free space")
    ti = SimpleNamespace(task_id="generate.generate_shard", map_index=4, try_number=2)
    context = {"exception": error, "task_instance": ti, "params": {"output_root": str(blocked)},
               "run_id": "manual__1"}
    with caplog.at_level(logging.WARNING, logger="fleetgen"):
        describe_failure(context)
    summary_line = caplog.records[-1].getMessage()
    assert "could not append the failure summary" in summary_line
    summary = json.loads(summary_line.split("it was: ", 1)[1])
    assert summary["error"] == "OutputUnwritable" and summary["shard"] == 4 and summary["try"] == 2
    assert summary["path"] == "/out/completions/shard-00004.jsonl" and summary["hint"] == "free space"
