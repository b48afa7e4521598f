"""What the workload mode reads from the previous run: its plan record, stats and the servers' log lines."""

import json
import subprocess

import pandas as pd

from fleetgen.nodes import remote
from fleetgen.outputs import STATS_COLUMNS, RunLayout
from fleetgen.tuning.plan import TunerBounds
from fleetgen.tuning.planner import plan_server
from fleetgen.tuning.workload import KvDemand, RunObservation
from fleetgen.tuning import workload_history

LOG = """[2026-11-30 15:00:00 TP0] Decode batch, #running-req: 3, #full token: 1200, full token usage: 0.10
[2026-11-30 15:00:01 TP0] Decode batch, #running-req: 5, #full token: 98765, full token usage: 0.90, #queue-req: 2
[2026-11-30 15:00:02] KV cache pool is full. Retract requests. #retracted_reqs: 2, #new_tokens_gained: 100
[2026-11-30 15:00:03] KV cache pool is full. Retract requests. #retracted_reqs: 1, #new_tokens_gained: 100
"""


def test_scheduler_log_command_reads_peak_and_retractions(tmp_path):
    log_dir = tmp_path / "logs dir"  # a space: the path is quoted
    log_dir.mkdir()
    (tmp_path / "logs dir" / remote.log_file(str(log_dir), 30001).rsplit("/", 1)[1]).write_text(LOG)
    command = remote.scheduler_log_command(str(log_dir), [30001, 30002])
    out = subprocess.run(["bash", "-c", command], capture_output=True, text=True, check=True).stdout
    assert remote.parse_records(out, ("scheduler",)) == [
        ("scheduler", {"port": "30001", "peak_full_tokens": "98765", "retracted": "3"}),
        ("scheduler", {"port": "30002", "missing": "1"})]


def _stats():
    rows = [{"prompt_tokens": 300, "completion_tokens": 2000, "server": "node0:30001"}] * 3 + \
        [{"prompt_tokens": 300, "completion_tokens": None, "server": "node0:30002"}]
    return pd.DataFrame(rows, columns=list(STATS_COLUMNS))


def test_observations_join_the_log_the_plan_record_and_the_stats():
    out = ("scheduler port=30001 peak_full_tokens=98765 retracted=3\n"
           "scheduler port=30002 peak_full_tokens=5 retracted=0\nscheduler port=30003 missing=1\n")
    record = {"node0:30001": {"max_running_requests": 63, "max_total_num_tokens": 530968, "ceiling": None},
              "node0:30002": {"max_running_requests": 63, "max_total_num_tokens": 530968, "ceiling": None}}
    finished = workload_history.finished_by_server(_stats())
    assert finished == {"node0:30001": 3}
    seen = workload_history.observations(out, "node0", record, finished)
    # 30002 finished nothing, 30003 has no log: neither is observed
    assert seen == {"node0:30001": RunObservation(63, 530968, 98765, 3, 3)}


def test_plan_record_round_trip_and_fleet_plans(tmp_path, cases, seed_profile, seed_options):
    def plan_with_port(port):
        return lambda bounds: plan_server(host="node0", gpu_ids=[0], port=port, gpus=[cases.gpu_row(0)],
                                          profile=seed_profile, options=seed_options,
                                          workload=cases.SEED_WORKLOAD, bounds=bounds)

    plan_for = {"node0:30001": plan_with_port(30001), "node0:30002": plan_with_port(30002)}
    demand = KvDemand.from_lengths([300] * 50, [2500] * 50, page_size=1, reserve_tokens=8)
    full_cap = plan_with_port(30001)(TunerBounds()).expected["max_running_requests"]
    seen = {"node0:30001": RunObservation(full_cap, 530968, full_cap * 1500, 0, 400)}
    plans = workload_history.plan_workload_fleet(plan_for, TunerBounds(), demand=demand, seen=seen, record={},
                                        pin_full_context=False)
    # the observed server steps up, the unobserved one starts from the full-context plan
    assert plans[0].expected["max_running_requests"] > full_cap
    assert plans[1].expected["max_running_requests"] == full_cap
    layout = RunLayout(tmp_path / "run")
    workload_history.write_plan_record(layout, plans)
    record = workload_history.read_plan_record(layout)
    assert record["node0:30001"]["max_running_requests"] == plans[0].expected["max_running_requests"]
    assert record["node0:30002"]["max_total_num_tokens"] == plans[1].expected["max_total_num_tokens"]
    assert workload_history.read_plan_record(RunLayout(tmp_path / "absent")) == {}
    pinned = workload_history.plan_workload_fleet(plan_for, TunerBounds(), demand=demand, seen=seen, record=record,
                                         pin_full_context=True)
    assert [p.expected["max_running_requests"] for p in pinned] == [full_cap, full_cap]


def _previous_run(root, name, *, stats_rows, record=None, succeeded=True, at=1000.0):
    """A finished run folder as the next run finds it: its report, its stats shards and its plan record."""
    import json

    layout = RunLayout(root / name)
    layout.report_json.parent.mkdir(parents=True, exist_ok=True)
    layout.report_json.write_text(json.dumps({"schema": 1, "run_succeeded": succeeded, "generated_at_epoch": at}))
    stats = layout.shard_file("stats", 0)
    stats.parent.mkdir(parents=True, exist_ok=True)
    stats.write_text("".join(json.dumps({"id": f"p{i}", **row}) + "\n" for i, row in enumerate(stats_rows)))
    if record is not None:
        layout.workload_plan.write_text(json.dumps(record))
    return layout


ROWS = ([{"prompt_tokens": 300, "completion_tokens": 2000, "server": "a:30000"}] * 4
        + [{"prompt_tokens": 100, "completion_tokens": 1000, "server": "b:30000"}] * 2
        + [{"prompt_tokens": 200, "completion_tokens": 500, "server": "a:30001"}]
        + [{"prompt_tokens": 100, "completion_tokens": None, "server": "b:30001"}])
RECORD = {server: {"max_running_requests": 40, "max_total_num_tokens": 400_000, "ceiling": None}
          for server in ("a:30000", "a:30001", "b:30000", "b:30001")}


def _learn(root, current="tonight", reads=None, answers=None, ports=None):
    reads = [] if reads is None else reads
    answers = answers or {}

    def run_on_node(node, command):
        reads.append((node, command))
        return answers.get(node, "")

    return workload_history.learn_from_previous_run(
        root, RunLayout(root / current), page_size=64, reserve_tokens=8, log_dir="/var/log/sglang",
        ports_by_node=ports or {"a": [30000, 30001], "b": [30000, 30001]}, run_on_node=run_on_node)


def test_a_first_run_learns_nothing_and_reads_no_node(tmp_path):
    reads = []
    assert _learn(tmp_path / "absent", reads=reads) == workload_history.Learned()
    assert workload_history.Learned().source == "no previous run" and reads == []
    (tmp_path / "empty").mkdir()
    assert _learn(tmp_path / "empty", reads=reads).demand is None and reads == []


def test_every_node_of_the_previous_run_is_read_and_each_server_observed(tmp_path):
    previous = _previous_run(tmp_path, "last-night", stats_rows=ROWS, record=RECORD)
    reads = []
    # the servers that are not observed come first: each is skipped, not the end of its node's lines
    answers = {"a": "scheduler port=30001 missing=1\nscheduler port=30000 peak_full_tokens=90000 retracted=1\n",
               "b": "scheduler port=30001 peak_full_tokens=7 retracted=0\n"
                    "scheduler port=30000 peak_full_tokens=50000 retracted=0\n"}
    learned = _learn(tmp_path, reads=reads, answers=answers)
    assert [node for node, _ in reads] == ["a", "b"]
    assert reads[0][1] == remote.scheduler_log_command("/var/log/sglang", [30000, 30001])
    # a:30001 finished requests but left no log, b:30001 finished nothing: only the two others are observed
    assert learned.seen == {"a:30000": RunObservation(40, 400_000, 90_000, 1, 4),
                            "b:30000": RunObservation(40, 400_000, 50_000, 0, 2)}
    assert learned.record == RECORD and learned.source == f"previous run {previous.root}"
    # the demand of every finished completion, paged and reserved as tonight's servers run
    assert learned.demand == KvDemand.from_lengths([300] * 4 + [100] * 2 + [200], [2000] * 4 + [1000] * 2 + [500],
                                                   page_size=64, reserve_tokens=8)


def test_the_newest_successful_run_other_than_tonights_is_the_one_learnt_from(tmp_path):
    _previous_run(tmp_path, "older", stats_rows=ROWS[:1], record=RECORD, at=1000.0)
    newest = _previous_run(tmp_path, "newer", stats_rows=ROWS, record=RECORD, at=3000.0)
    _previous_run(tmp_path, "failed", stats_rows=ROWS[:2], record=RECORD, at=4000.0, succeeded=False)
    _previous_run(tmp_path, "tonight", stats_rows=ROWS[:3], record=RECORD, at=5000.0)
    learned = _learn(tmp_path)
    assert learned.source == f"previous run {newest.root}" and learned.demand.requests == 7


def test_a_previous_run_without_a_plan_record_reads_no_log(tmp_path):
    _previous_run(tmp_path, "last-night", stats_rows=ROWS, record=None)
    reads = []
    learned = _learn(tmp_path, reads=reads)
    assert reads == [] and learned.seen == {} and learned.record == {} and learned.demand.requests == 7


def test_a_previous_run_that_finished_nothing_has_no_demand(tmp_path):
    _previous_run(tmp_path, "last-night", stats_rows=ROWS[-1:], record=RECORD)
    learned = _learn(tmp_path, answers={"b": "scheduler port=30001 peak_full_tokens=7 retracted=0\n"})
    assert learned.demand is None and learned.seen == {}


def test_a_plan_record_that_is_not_an_object_or_not_json_is_no_record(tmp_path):
    layout = RunLayout(tmp_path / "run")
    layout.root.mkdir()
    layout.workload_plan.write_text("[1, 2]")
    assert workload_history.read_plan_record(layout) == {}
    layout.workload_plan.write_text("{torn")
    assert workload_history.read_plan_record(layout) == {}


def test_the_plan_record_holds_each_servers_cap_pool_and_ceiling(cases, seed_profile, seed_options, tmp_path):
    def plan_with_port(port):
        return lambda bounds: plan_server(host="node0", gpu_ids=[0], port=port, gpus=[cases.gpu_row(0)],
                                          profile=seed_profile, options=seed_options,
                                          workload=cases.SEED_WORKLOAD, bounds=bounds)

    plan = plan_with_port(30001)(TunerBounds())
    stepped = workload_history.plan_workload_fleet(
        {"node0:30002": plan_with_port(30002)}, TunerBounds(),
        demand=KvDemand.from_lengths([300] * 50, [2500] * 50, page_size=1, reserve_tokens=8), seen={},
        record={"node0:30002": {"ceiling": 77}}, pin_full_context=False)[0]
    record = workload_history.plan_record([plan, stepped])
    assert record == {"node0:30001": {"max_running_requests": plan.expected["max_running_requests"],
                                      "max_total_num_tokens": plan.expected["max_total_num_tokens"],
                                      "ceiling": None},
                      "node0:30002": {"max_running_requests": stepped.expected["max_running_requests"],
                                      "max_total_num_tokens": stepped.expected["max_total_num_tokens"],
                                      "ceiling": 77}}
    layout = RunLayout(tmp_path / "new" / "run")
    assert workload_history.write_plan_record(layout, [plan]) == layout.workload_plan
    assert workload_history.read_plan_record(layout) == workload_history.plan_record([plan])
    assert [p.name for p in layout.root.iterdir()] == ["workload_plan.json"]  # no partial file left
    # a second derive_plan of the same run rewrites it, sorted and indented so that runs compare line by line
    workload_history.write_plan_record(layout, [stepped, plan])
    assert layout.workload_plan.read_text() == json.dumps(record, indent=1, sort_keys=True)


def test_finished_requests_are_counted_per_server_and_a_row_without_a_server_is_left_out():
    rows = [{"prompt_tokens": 1, "completion_tokens": 5, "server": "a:1"},
            {"prompt_tokens": 1, "completion_tokens": 5, "server": "a:1"},
            {"prompt_tokens": 1, "completion_tokens": 5, "server": None},
            {"prompt_tokens": 1, "completion_tokens": 0, "server": "b:1"}]
    finished = workload_history.finished_by_server(pd.DataFrame(rows, columns=list(STATS_COLUMNS)))
    assert finished == {"a:1": 2, "b:1": 1}
