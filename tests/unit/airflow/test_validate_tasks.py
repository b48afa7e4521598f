"""The validate tasks (fleetgen.airflow.validate_tasks) called as Airflow calls them: a fake task context, the
suite, the reuse index and the report builder replaced by recorders; the prompts file and its scan are real."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from fleetgen.airflow import context as task_context_module
from fleetgen.airflow import validate_tasks
from fleetgen.airflow.run_config import RunConfig
from fleetgen.errors import ValidationFailed
from fleetgen.generate import reuse
from fleetgen.prompts.scan import scan_prompts
from fleetgen.report import build, previous
from fleetgen.validation import suite

RUN_ID = "manual__2026-01-02T00:00:00+00:00"
FLEET = {"model": {"path": "/models/m", "served_name": "served-m"},
         "server": {"python": "/opt/py", "module": "sglang.launch_server"},
         "nodes": [{"name": "n0", "ssh_conn_id": "ssh_n0", "address": "10.0.0.5", "gpus": [0], "base_port": 30000}]}
IDENTITY = {"path": "/models/m", "parts": {"weights": "w" * 64, "sglang": "0.5.2"}}


class TaskInstance:
    def __init__(self):
        self.pushed = []

    def xcom_push(self, *, key, value):
        self.pushed.append((key, value))


@pytest.fixture
def run(tmp_path, monkeypatch):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"id": "a", "prompt": "x"}) + "\n"
                       + json.dumps({"id": "b", "prompt": "y", "sampling": {"max_tokens": 50}}) + "\n")
    monkeypatch.setenv("FLEETGEN_OUTPUT_ROOT", str(tmp_path))  # the deployment's root: the run's output_root is in it
    defaults = {spec.name: spec.default_value() for spec in RunConfig.settings()}
    state = SimpleNamespace(tmp=tmp_path, prompts=prompts, ti=TaskInstance(), outlet_events={},
                            task=SimpleNamespace(outlets=[]),
                            params={**defaults, "fleet_file": "", "prompts_path": str(prompts),
                                    "output_root": str(tmp_path / "out")})

    def call(task, *args, **params):
        state.config = RunConfig.from_params({**state.params, **params})
        context = {"params": {**state.params, **params}, "run_id": RUN_ID, "ti": state.ti, "task": state.task,
                   "outlet_events": state.outlet_events}
        monkeypatch.setattr(task_context_module, "task_context", lambda: context)
        return task(*args)

    state.call = call
    state.layout = lambda: state.config.layout(RUN_ID)
    return state


def _validated(monkeypatch, outcome):
    """validate_run answers ``outcome`` (a summary, or an exception to raise); its arguments are kept."""
    seen = []

    def validate_run(out_dir, expected_ids, thresholds, *, own_max_tokens=None, run_name=None, **_):
        seen.append(SimpleNamespace(out_dir=out_dir, ids=list(expected_ids), thresholds=thresholds,
                                    own_max_tokens=own_max_tokens, run_name=run_name))
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    monkeypatch.setattr(suite, "validate_run", validate_run)
    return seen


def _messages(caplog) -> list[str]:
    return [record.getMessage() for record in caplog.records if record.name == "fleetgen"]


def test_validation_checks_the_planned_prompts_against_the_runs_thresholds(run, monkeypatch, caplog):
    seen = _validated(monkeypatch, {"rows": 2, "data_docs": "/docs"})
    scan = scan_prompts(run.prompts).to_dict()
    with caplog.at_level("INFO", logger="fleetgen"):
        summary = run.call(validate_tasks.validate, scan, [], max_error_share=0.25)
    assert _messages(caplog) == [
        f"Validating 2 expected completions in {run.layout().root} with Great Expectations",
        "Validation passed: 2 rows, every prompt exactly once; Data Docs at /docs"]
    assert summary == {"rows": 2, "data_docs": "/docs"}
    [call] = seen
    assert call.out_dir == run.layout().root and call.ids == ["a", "b"] and call.own_max_tokens == {"b": 50}
    assert call.thresholds.max_error_share == 0.25 and call.run_name == RUN_ID
    assert run.ti.pushed == []


def test_the_planned_prompts_are_the_scans_not_lines_appended_since(run, monkeypatch):
    seen = _validated(monkeypatch, {"rows": 2})
    scan = scan_prompts(run.prompts).to_dict()
    with run.prompts.open("a") as handle:
        handle.write(json.dumps({"id": "late", "prompt": "z"}) + "\n")
    run.call(validate_tasks.validate, scan, [])
    assert seen[0].ids == ["a", "b"]


def test_a_failed_validation_pushes_its_summary_first_then_fails_for_good(run, monkeypatch):
    _validated(monkeypatch, ValidationFailed("2 expectations failed", summary={"failed": ["rows"], "rows": 1}))
    with pytest.raises(ValidationFailed, match="2 expectations failed"):
        run.call(validate_tasks.validate, scan_prompts(run.prompts).to_dict(), [])
    assert run.ti.pushed == [("validation_summary", {"failed": ["rows"], "rows": 1})]


@pytest.fixture
def reporting(monkeypatch):
    """write_reuse_index, find_previous_report and build_report replaced by recorders."""
    seen = SimpleNamespace(indexed=[], previous=[], built=[], previous_report=None)

    def write_reuse_index(layout, *, material, run_id, launches):
        seen.indexed.append((layout.root, material, run_id, launches))
        return 7

    def find_previous_report(root, current_run_id):
        seen.previous.append((root, current_run_id))
        return seen.previous_report

    def build_report(out_dir, **kwargs):
        seen.built.append((out_dir, kwargs))
        return {"report_md": f"{out_dir}/report/report.md", "report_json": f"{out_dir}/report/report.json",
                "tokens_per_s": 12.5}

    monkeypatch.setattr(reuse, "write_reuse_index", write_reuse_index)
    monkeypatch.setattr(previous, "find_previous_report", find_previous_report)
    monkeypatch.setattr(build, "build_report", build_report)
    return seen


def test_the_report_indexes_the_completions_and_builds_from_every_shard_and_server(run, reporting, caplog):
    reporting.previous_report = "/out/earlier/report/report.json"
    plans = [{"host": "n0", "port": 30000}, {"host": "n1", "port": 30000}]
    readiness = [{"server": "n0:30000", "version": "0.5.2",
                  "launch_fields": {"model_path": "/models/m", "weight_version": f"fleetgen/{RUN_ID}", "tp_size": 1}},
                 {"server": "n1:30000"}]  # one that reported nothing of its launch
    shards = [{"shard_id": 0}, {"shard_id": 1}]
    run.config = RunConfig.from_params(run.params)
    written = _summary_written(run, {"success": True, "rows": 2})
    with caplog.at_level("INFO", logger="fleetgen"):
        summary = run.call(validate_tasks.report, plans, readiness, shards, {"rows": 2}, IDENTITY, FLEET,
                           max_tokens=99)
    root = run.layout().root
    assert _messages(caplog) == [
        f"Indexed 7 completion(s) for later runs to reuse ({run.layout().reuse_index})",
        f"Parquet dataset: 0 completion(s) in 0 file(s) under {run.layout().dataset_dir}",
        f"Writing the run report to {run.layout().report_dir} (previous run: /out/earlier/report/report.json)",
        f"Report: {root}/report/report.md; 12.5 output tokens/s overall"]
    [(indexed_root, material, run_id, launches)] = reporting.indexed
    assert indexed_root == root and run_id == RUN_ID
    assert launches == {"n0:30000": {"model_path": "/models/m", "weight_version": f"fleetgen/{RUN_ID}",
                                     "version": "0.5.2"},
                        "n1:30000": {"model_path": None, "weight_version": None, "version": None}}
    assert material["model"] == IDENTITY["parts"] and material["sampling"]["max_tokens"] == 99
    assert reporting.previous == [(run.config.inputs.output_root, root.name)]
    [(out_dir, kwargs)] = reporting.built
    assert out_dir == root and kwargs == {"run_id": RUN_ID, "plan": plans, "readiness": readiness,
                                          "shard_results": shards, "validation": written,
                                          "previous_report": "/out/earlier/report/report.json",
                                          "gpu_hour_price": run.config.report.prices(),
                                          "location": str(root)}  # on local disk, the run's folder itself
    assert summary["tokens_per_s"] == 12.5


def test_the_finished_dataset_is_announced_on_every_outlet_with_the_runs_output(run, reporting, caplog):
    first, second = object(), object()
    run.task = SimpleNamespace(outlets=[first, second])
    run.outlet_events = {first: SimpleNamespace(extra=None), second: SimpleNamespace(extra=None)}
    run.config = RunConfig.from_params(run.params)
    _summary_written(run, {"success": True, "rows": 5})
    with caplog.at_level("INFO", logger="fleetgen"):
        run.call(validate_tasks.report, [], [], [], {"rows": 5}, IDENTITY, FLEET)
    assert f"Writing the run report to {run.layout().report_dir} (previous run: none)" in _messages(caplog)
    root = run.layout().root
    expected = {"run_id": RUN_ID, "out_dir": str(root), "completions": str(run.layout().kind_dir("completions")),
                "dataset": str(run.layout().dataset_dir), "rows": 5, "report": f"{root}/report/report.json"}
    assert run.outlet_events[first].extra == expected and run.outlet_events[second].extra == expected


def _summary_written(run, summary: dict) -> dict:
    """The validation summary as validate_run leaves it in the run's folder."""
    path = run.layout().validation_summary
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(summary))
    return summary


@pytest.mark.parametrize("left", ["failed", "none"])
def test_a_report_after_a_validate_marked_success_by_hand_says_so_and_indexes_nothing(run, reporting, caplog, left):
    """validate failed (or never ran) and was marked success: its XCom is None. The report still runs, names
    why the run is not validated and indexes none of its completions."""
    outlet = object()
    run.task = SimpleNamespace(outlets=[outlet])
    run.outlet_events = {outlet: SimpleNamespace(extra=None)}
    run.config = RunConfig.from_params(run.params)
    if left == "failed":
        _summary_written(run, {"success": False, "rows": 3, "failed_expectations": ["missing_prompts"]})
    with caplog.at_level("INFO", logger="fleetgen"):
        run.call(validate_tasks.report, [], [], [], None, IDENTITY, FLEET)
    assert reporting.indexed == []
    [warning] = [record.getMessage() for record in caplog.records if record.levelname == "WARNING"]
    reason = ("its validation did not pass (1 expectation(s) failed: missing_prompts" if left == "failed"
              else "no validation summary at")
    assert warning.startswith("This run is not validated: ") and reason in warning
    assert "not indexed for later runs to reuse" in warning
    [(_, kwargs)] = reporting.built
    assert kwargs["validation"] == ({"success": False, "rows": 3, "failed_expectations": ["missing_prompts"]}
                                    if left == "failed" else None)
    assert run.outlet_events[outlet].extra["rows"] == (3 if left == "failed" else None)
