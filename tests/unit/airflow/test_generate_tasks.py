"""The generate tasks (fleetgen.airflow.generate_tasks) called as Airflow calls them: a fake task context, the
shard runner, reuse look-up and GPU sampling replaced by recorders; the prompts file is real."""

from __future__ import annotations

import json
from enum import Enum
from types import SimpleNamespace

import pytest
from airflow.sdk import conf

import fleetgen.generate as generate
from fleetgen.airflow import context as task_context_module
from fleetgen.airflow import generate_tasks, lifecycle
from fleetgen.airflow.run_config import RunConfig
from fleetgen.generate import ShardRunOptions, reuse
from fleetgen.nodes import gpu_sampling
from fleetgen.errors import PromptsError
from fleetgen.outputs import read_failures
from fleetgen.prompts.scan import scan_prompts

RUN_ID = "scheduled__2026-01-01T00:00:00+00:00"
FLEET = {"model": {"path": "/models/m", "served_name": "served-m"},
         "server": {"python": "/opt/py", "module": "sglang.launch_server"},
         "nodes": [{"name": "n0", "ssh_conn_id": "ssh_n0", "address": "10.0.0.5", "gpus": [0, 1], "base_port": 30000},
                   {"name": "n1", "ssh_conn_id": "ssh_n1", "address": "10.0.0.6", "gpus": [0], "base_port": 30000}]}
# Two servers on two nodes sharing a port number, with different limits.
READINESS = [{"server": "n0:30000", "url": "http://10.0.0.5:30000", "host": "n0", "gpu_ids": [0],
              "effective_max_running_requests": 40},
             {"server": "n1:30000", "url": "http://10.0.0.6:30000", "host": "n1", "gpu_ids": [0],
              "effective_max_running_requests": 80}]
IDENTITY = {"path": "/models/m", "parts": {"weights": "w" * 64, "sglang": "0.5.2"}}


class RunType(Enum):
    SCHEDULED = "scheduled"
    MANUAL = "manual"


class TaskInstance:
    def __init__(self, try_number=1):
        self.try_number, self.task_id, self.dag_id, self.run_id = try_number, "generate.generate_shard", "d", RUN_ID
        self.counted = []

    def get_ti_count(self, **query):
        self.counted.append(query)
        return 3


@pytest.fixture
def run(tmp_path, monkeypatch):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "prompt": f"prompt {i}"}) + "\n" for i in range(10)))
    monkeypatch.setenv("FLEETGEN_OUTPUT_ROOT", str(tmp_path))  # the deployment's root: the run's output_root is in it
    defaults = {spec.name: spec.default_value() for spec in RunConfig.settings()}
    state = SimpleNamespace(tmp=tmp_path, prompts=prompts, ti=TaskInstance(), run_type=RunType.SCHEDULED,
                            params={**defaults, "fleet_file": "", "prompts_path": str(prompts),
                                    "output_root": str(tmp_path / "out")})

    def call(task, *args, **params):
        state.config = RunConfig.from_params({**state.params, **params})
        context = {"params": {**state.params, **params}, "run_id": RUN_ID, "ti": state.ti,
                   "dag_run": SimpleNamespace(run_type=state.run_type)}
        if state.run_type is None:  # a context without its DAG run (e.g. a task tested on its own)
            del context["dag_run"]
        monkeypatch.setattr(task_context_module, "task_context", lambda: context)
        return task(*args)

    state.call = call
    state.layout = lambda: state.config.layout(RUN_ID)
    return state


def _messages(caplog) -> list[str]:
    return [record.getMessage() for record in caplog.records if record.name == "fleetgen"]


# --- settings -----------------------------------------------------------------------------------------------------

def test_the_generation_settings_are_the_runs_sampling_for_the_served_model(run):
    config = RunConfig.from_params({**run.params, "max_tokens": 123, "temperature": 0.3, "top_p": 0.7,
                                    "sample_interval_s": 2.5})
    settings = generate_tasks.generation_settings(config, generate_tasks.fleet_from_json(FLEET))
    assert (settings.model, settings.max_tokens, settings.temperature, settings.top_p, settings.sample_interval_s) == \
        ("served-m", 123, 0.3, 0.7, 2.5)


def test_the_generation_material_is_the_models_identity_and_the_sampling(run):
    config = RunConfig.from_params({**run.params, "max_tokens": 123, "temperature": 0.3, "top_p": 0.7})
    settings = generate_tasks.generation_settings(config, generate_tasks.fleet_from_json(FLEET))
    assert generate_tasks.generation_material(IDENTITY, settings) == reuse.generation_material(
        IDENTITY, max_tokens=123, temperature=0.3, top_p=0.7, extra_body=settings.extra_body)


# --- shards -------------------------------------------------------------------------------------------------------

def _scan(run):
    return scan_prompts(run.prompts).to_dict()


def test_the_prompts_are_cut_into_shards_of_the_requested_size(run, monkeypatch, caplog):
    monkeypatch.setattr(conf, "getint", lambda section, key: {("core", "max_map_length"): 1024}[(section, key)])
    with caplog.at_level("INFO", logger="fleetgen"):
        shards = run.call(generate_tasks.plan_shards, _scan(run), shard_size=4)
    assert [(s["shard_id"], s["first"], s["count"]) for s in shards] == [(0, 0, 4), (1, 4, 4), (2, 8, 2)]
    assert shards[0]["input_path"] == str(run.prompts)
    assert _messages(caplog) == [f"Planned 3 shard(s) of up to 4 prompts over {run.prompts}"]


def test_shards_are_cut_from_the_scan_and_a_file_changed_since_fails_for_good(run, monkeypatch):
    monkeypatch.setattr(conf, "getint", lambda section, key: 1024)
    scan = _scan(run)
    with run.prompts.open("a") as handle:
        handle.write(json.dumps({"id": "late", "prompt": "z"}) + "\n")
    with pytest.raises(PromptsError, match="the prompts file changed after it was scanned"):
        run.call(generate_tasks.plan_shards, scan, shard_size=4)


def test_shards_grow_to_stay_within_max_map_length_and_say_so(run, monkeypatch, caplog):
    monkeypatch.setattr(conf, "getint", lambda section, key: 3)
    with caplog.at_level("WARNING", logger="fleetgen"):
        shards = run.call(generate_tasks.plan_shards, _scan(run), shard_size=2)
    assert [s["count"] for s in shards] == [4, 4, 2]
    assert _messages(caplog) == ["10 prompts in shards of 2 would map more than [core] max_map_length=3 tasks; using "
                                 "shards of 4 instead (raise max_map_length to keep smaller shards)"]


def test_exactly_max_map_length_shards_keep_the_requested_size(run, monkeypatch, caplog):
    monkeypatch.setattr(conf, "getint", lambda section, key: 5)
    with caplog.at_level("WARNING", logger="fleetgen"):
        shards = run.call(generate_tasks.plan_shards, _scan(run), shard_size=2)
    assert len(shards) == 5 and caplog.text == ""


# --- generating a shard -------------------------------------------------------------------------------------------

class Recorder:
    """run_shard, look_up_reuse, GpuSampling and NodeShell replaced: what each was given is kept here."""

    def __init__(self, monkeypatch):
        self.run_shard, self.lookups, self.sampling, self.streams, self.keyed = [], [], [], [], []
        self.logs = []  # the logger each collaborator was given
        self.result = {"done": 3, "failed": 0, "completion_tokens": 30, "seconds": 1.5, "lost_try": None}
        self.source = None
        recorder = self

        def run_shard(shard, endpoints, out_dir, settings, *, options):
            assert isinstance(options, ShardRunOptions), options
            recorder.logs.append(("run_shard", options.log))
            recorder.run_shard.append(SimpleNamespace(shard=shard, endpoints=endpoints, out_dir=out_dir,
                                                      settings=settings, api_key=options.api_key,
                                                      sharing=options.sharing, try_number=options.try_number,
                                                      reuse=options.reuse, stop_taking_at=options.stop_taking_at))
            return dict(recorder.result)

        def look_up_reuse(output_root, current_run_folder, material, log=None):
            recorder.logs.append(("look_up_reuse", log))
            recorder.lookups.append((output_root, current_run_folder, material))
            return SimpleNamespace(source=recorder.source, summary=lambda: {"source": "the summary"})

        class Sampling:
            def __init__(self, **kwargs):
                recorder.logs.append(("GpuSampling", kwargs.get("log")))
                recorder.sampling.append(kwargs)

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                pass

        class Shell:
            def __init__(self, node, ssh_conn_id, **_):
                self.node, self.ssh_conn_id = node, ssh_conn_id

            def stream(self, command, *, describe):
                recorder.streams.append((self.node, self.ssh_conn_id, command, describe))
                return "lines"

        monkeypatch.setattr(generate, "run_shard", run_shard)
        monkeypatch.setattr(reuse, "look_up_reuse", look_up_reuse)
        monkeypatch.setattr(gpu_sampling, "GpuSampling", Sampling)
        monkeypatch.setattr(generate_tasks, "NodeShell", Shell)
        monkeypatch.setattr(lifecycle, "api_key", lambda spec: recorder.keyed.append(spec.model.path) or "k")


@pytest.fixture
def recorder(monkeypatch):
    return Recorder(monkeypatch)


SHARD_0 = {"shard_id": 0, "count": 4, "start": 0, "first": 0}


def test_a_shard_sends_to_every_ready_server_with_its_share_of_the_limit(run, recorder, caplog):
    with caplog.at_level("INFO", logger="fleetgen"):
        result = run.call(generate_tasks.generate_shard, SHARD_0, READINESS, FLEET, IDENTITY, parallel_shards=2,
                          headroom=1.0, reuse_completions="never")
    assert _messages(caplog) == [
        "Generating shard 0 (4 prompts from byte 0) on 2 server(s), in-flight limits {'n0:30000': 20, 'n1:30000': 40}"
        " (1/2 of each server's)",
        "Shard 0 done: 3 completed, 0 failed, 0 already done before; 30 output tokens in 1.5 s"]
    [call] = recorder.run_shard
    assert [(e.name, e.url, e.max_in_flight) for e in call.endpoints] == [
        ("n0:30000", "http://10.0.0.5:30000", 20), ("n1:30000", "http://10.0.0.6:30000", 40)]
    assert call.sharing is None and call.api_key == "k" and call.try_number == 1 and call.reuse is None
    assert call.shard == SHARD_0 and recorder.keyed == ["/models/m"]
    assert call.out_dir == run.layout().root and call.settings.model == "served-m"
    assert "reuse" not in result and recorder.lookups == []


def test_automatic_sharing_starts_from_the_whole_limit_and_counts_the_running_shards(run, recorder, caplog):
    recorder.result.update(skipped_already_done=2, failed=1)
    with caplog.at_level("INFO", logger="fleetgen"):
        run.call(generate_tasks.generate_shard, {**SHARD_0, "shard_id": 5, "start": 77}, READINESS, FLEET, IDENTITY,
                 parallel_shards=0, headroom=1.0, reuse_completions="never")
    assert _messages(caplog) == [
        "Generating shard 5 (4 prompts from byte 77) on 2 server(s), in-flight limits {'n0:30000': 40, "
        "'n1:30000': 80}, shared with the other running shards",
        "Shard 5 done: 3 completed, 1 failed, 2 already done before; 30 output tokens in 1.5 s"]
    [call] = recorder.run_shard
    assert [e.max_in_flight for e in call.endpoints] == [40, 80]
    assert call.sharing() == 3
    assert run.ti.counted == [{"dag_id": "d", "task_ids": ["generate.generate_shard"], "run_ids": [RUN_ID],
                               "states": ["running"]}]


def test_the_try_number_is_passed_on_so_a_retry_resumes(run, recorder):
    run.ti = TaskInstance(try_number=3)
    run.call(generate_tasks.generate_shard, SHARD_0, READINESS, FLEET, IDENTITY)
    assert recorder.run_shard[0].try_number == 3


def test_every_node_is_sampled_through_its_own_connection_while_the_shard_runs(run, recorder):
    run.call(generate_tasks.generate_shard, SHARD_0, READINESS, FLEET, IDENTITY, sample_interval_s=2.5)
    [sampling] = recorder.sampling
    assert sampling["nodes"] == ["n0", "n1"] and sampling["shard_id"] == 0 and sampling["interval_s"] == 2.5
    assert sampling["layout"].root == run.layout().root
    assert sampling["open_stream"]("n1", "nvidia-smi") == "lines"
    assert recorder.streams == [("n1", "ssh_n1", "nvidia-smi", "GPU sampling on n1")]


def test_a_node_without_servers_tonight_is_not_sampled(run, recorder):
    # the plan left n1 out (skip_unreachable_nodes): none of tonight's servers runs there
    serving_n0 = [server for server in READINESS if server["host"] == "n0"]
    run.call(generate_tasks.generate_shard, SHARD_0, serving_n0, FLEET, IDENTITY, sample_interval_s=2.5)
    assert [sampling["nodes"] for sampling in recorder.sampling] == [["n0"]]


def test_a_sub_second_interval_still_samples(run, recorder):
    run.call(generate_tasks.generate_shard, SHARD_0, READINESS, FLEET, IDENTITY, sample_interval_s=0.5)
    assert [sampling["interval_s"] for sampling in recorder.sampling] == [0.5]


def test_every_collaborator_logs_to_the_tasks_log(run, recorder):
    run.call(generate_tasks.generate_shard, SHARD_0, READINESS, FLEET, IDENTITY, sample_interval_s=1.0,
             reuse_completions="always")
    assert recorder.logs == [("look_up_reuse", generate_tasks.log), ("GpuSampling", generate_tasks.log),
                             ("run_shard", generate_tasks.log)]


def test_a_context_without_its_dag_run_reuses_only_when_always(run, recorder):
    run.run_type = None
    run.call(generate_tasks.generate_shard, SHARD_0, READINESS, FLEET, IDENTITY, reuse_completions="scheduled")
    assert recorder.lookups == [] and len(recorder.run_shard) == 1
    run.call(generate_tasks.generate_shard, SHARD_0, READINESS, FLEET, IDENTITY, reuse_completions="always")
    assert len(recorder.lookups) == 1


def test_no_sampling_when_the_interval_is_zero(run, recorder):
    run.call(generate_tasks.generate_shard, SHARD_0, READINESS, FLEET, IDENTITY, sample_interval_s=0)
    assert recorder.sampling == [] and len(recorder.run_shard) == 1


def test_a_scheduled_run_reuses_from_the_earlier_run_the_look_up_found(run, recorder, caplog):
    recorder.source = SimpleNamespace(run_folder="scheduled__earlier")
    with caplog.at_level("INFO", logger="fleetgen"):
        result = run.call(generate_tasks.generate_shard, SHARD_0, READINESS, FLEET, IDENTITY, max_tokens=77,
                          reuse_completions="scheduled")
    assert "Reusing unchanged completions from scheduled__earlier" in _messages(caplog)
    [(root, folder, material)] = recorder.lookups
    assert root == run.config.inputs.output_root and folder == run.layout().root.name
    assert material["model"] == IDENTITY["parts"] and material["sampling"]["max_tokens"] == 77
    assert recorder.run_shard[0].reuse is recorder.source and result["reuse"] == {"source": "the summary"}


def test_a_manual_run_does_not_reuse_unless_always(run, recorder, caplog):
    run.run_type = RunType.MANUAL
    run.call(generate_tasks.generate_shard, SHARD_0, READINESS, FLEET, IDENTITY, reuse_completions="scheduled")
    assert recorder.lookups == []
    with caplog.at_level("INFO", logger="fleetgen"):
        run.call(generate_tasks.generate_shard, SHARD_0, READINESS, FLEET, IDENTITY, reuse_completions="always")
    assert len(recorder.lookups) == 1 and recorder.run_shard[-1].reuse is None
    assert ("Reusing unchanged completions from no earlier run (none with the same model and sampling has a readable "
            "index)") in _messages(caplog)


def test_a_run_type_given_as_text_is_read_too(run, recorder):
    run.run_type = "scheduled"
    run.call(generate_tasks.generate_shard, SHARD_0, READINESS, FLEET, IDENTITY, reuse_completions="scheduled")
    assert len(recorder.lookups) == 1


def test_the_first_shards_lost_try_is_recorded_with_its_map_index(run, recorder):
    recorder.result["lost_try"] = {"resumed_at": "2026-01-01T00:10:00+00:00", "shard_id": 0, "try": 1,
                                   "host": "worker-1", "pid": 4242, "last_beat": "2026-01-01T00:05:00+00:00",
                                   "dead_s": 300.0}
    run.ti = TaskInstance(try_number=2)
    run.call(generate_tasks.generate_shard, SHARD_0, READINESS, FLEET, IDENTITY)
    [record] = read_failures(run.layout().failures)
    assert (record["task"], record["map_index"], record["try"], record["task_id"]) == \
        ("generate.generate_shard[0]", 0, 1, "generate.generate_shard")


def test_a_shard_without_a_lost_try_records_no_failure(run, recorder):
    run.call(generate_tasks.generate_shard, SHARD_0, READINESS, FLEET, IDENTITY)
    assert not run.layout().failures.exists()


def test_a_shard_whose_output_was_written_for_another_plan_fails_at_once_saying_what_to_do(run, monkeypatch):
    """Clearing a whole run after a prompt line was edited re-plans its shards: no retry can match the plan the
    output on disk was written for, so the task fails at once and names a new run or the files to delete."""
    from airflow.sdk.exceptions import AirflowFailException

    from fleetgen.airflow.context import fail_fast
    from fleetgen.errors import ShardPlanChanged
    from fleetgen.generate.store import ShardStore

    monkeypatch.setattr(conf, "getint", lambda section, key: 1024)
    monkeypatch.setattr(lifecycle, "api_key", lambda spec: None)
    [shard, _] = run.call(generate_tasks.plan_shards, _scan(run), shard_size=5, sample_interval_s=0)
    earlier, _ = ShardStore.open(run.layout().root, {**shard, "count": 6})  # the plan before the edit
    earlier.close()
    with pytest.raises(AirflowFailException) as caught:
        run.call(fail_fast(generate_tasks.generate_shard), shard, READINESS, FLEET, IDENTITY, sample_interval_s=0)
    error = caught.value.__cause__
    assert isinstance(error, ShardPlanChanged) and error.shard == 0
    assert ": count changed (the prompts file or shard_size changed" in error.message
    assert error.hint.startswith("trigger a new run for the edited prompts file")
    for path in earlier.output_files():
        assert str(path) in error.hint


# --- the tuning trial's shards and their time cap -----------------------------------------------------------------

def test_a_trial_shard_stops_taking_prompts_the_time_cap_after_the_first_trial_shard_began(run, recorder):
    import time

    before = time.time()
    run.call(generate_tasks.trial_shard, SHARD_0, READINESS, FLEET, IDENTITY, tuning_trial_max_s=600)
    after = time.time()
    time.sleep(0.01)
    run.call(generate_tasks.trial_shard, {**SHARD_0, "shard_id": 1}, READINESS, FLEET, IDENTITY,
             tuning_trial_max_s=600)
    first, second = (call.stop_taking_at for call in recorder.run_shard)
    began = json.loads(run.layout().trial_began.read_text())["began_at"]
    assert before <= began <= after and first == second == began + 600


def test_a_trial_shard_without_a_time_cap_and_every_generate_shard_take_every_prompt(run, recorder):
    run.call(generate_tasks.trial_shard, SHARD_0, READINESS, FLEET, IDENTITY, tuning_trial_max_s=0)
    run.call(generate_tasks.generate_shard, SHARD_0, READINESS, FLEET, IDENTITY, tuning_trial_max_s=600)
    assert [call.stop_taking_at for call in recorder.run_shard] == [None, None]
    assert not run.layout().trial_began.exists()


def test_what_the_time_cap_left_is_said_to_go_to_generate_shard(run, recorder, caplog):
    recorder.result["left"] = 7
    with caplog.at_level("INFO", logger="fleetgen"):
        result = run.call(generate_tasks.trial_shard, SHARD_0, READINESS, FLEET, IDENTITY, tuning_trial_max_s=900)
    assert result["left"] == 7
    assert ("The trial's time cap (tuning_trial_max_s 900 s) left 7 prompt(s) of shard 0: generate_shard generates "
            "them on the trial's winner") in _messages(caplog)
