"""Running shards are counted through Airflow's execution API: this run's running tries of this task."""

from fleetgen.airflow.sharing import running_shards_counter


class _TaskInstance:
    """A task instance answering get_ti_count from a table of (dag, task, run, state) rows."""

    dag_id, task_id, run_id = "fleetgen", "generate.generate_shard", "manual__2"

    def __init__(self, rows):
        self.rows = rows
        self.asked = []

    def get_ti_count(self, *, dag_id, task_ids, run_ids, states):
        self.asked.append({"dag_id": dag_id, "task_ids": task_ids, "run_ids": run_ids, "states": states})
        return sum(1 for row in self.rows if row[0] == dag_id and row[1] in task_ids and row[2] in run_ids
                   and row[3] in states)


def test_the_counter_counts_this_runs_running_tries_of_this_task_only():
    ti = _TaskInstance([
        ("fleetgen", "generate.generate_shard", "manual__2", "running"),
        ("fleetgen", "generate.generate_shard", "manual__2", "running"),
        ("fleetgen", "generate.generate_shard", "manual__2", "success"),  # finished shards take no share
        ("fleetgen", "generate.generate_shard", "manual__1", "running"),  # another run's shard
        ("fleetgen", "servers.wait_ready", "manual__2", "running"),       # another task of this run
        ("other_dag", "generate.generate_shard", "manual__2", "running"),
    ])
    count = running_shards_counter(ti)
    assert count() == 2
    assert ti.asked == [{"dag_id": "fleetgen", "task_ids": ["generate.generate_shard"], "run_ids": ["manual__2"],
                         "states": ["running"]}]


def test_each_call_asks_again_so_a_shard_that_finished_stops_counting():
    ti = _TaskInstance([("fleetgen", "generate.generate_shard", "manual__2", "running")] * 3)
    count = running_shards_counter(ti)
    assert count() == 3
    ti.rows[0] = ("fleetgen", "generate.generate_shard", "manual__2", "success")
    assert count() == 2 and len(ti.asked) == 2
