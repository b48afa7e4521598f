"""What the workload mode reads from the previous run: its plan record, stats and the servers' log lines."""

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
