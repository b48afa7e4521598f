"""How many shards of this run are generating now: running shards split every server's in-flight
limit between them (``fleetgen.generate.dispatch``). Airflow's count alone would keep counting a try
whose worker died until the scheduler's heartbeat timeout; the shards' own heartbeats (see
``fleetgen.generate.liveness``) stop at once, so the count is the smaller of the two."""

from __future__ import annotations

from collections.abc import Callable

from fleetgen.generate.liveness import live_shards
from fleetgen.outputs import RunLayout


def running_shards_counter(ti, layout: RunLayout) -> Callable[[], int]:
    """A callable counting this run's live ``generate_shard`` tries (this one included): Airflow's running
    tries, through the task instance's public ``get_ti_count`` (the execution API; no metadata-DB access
    from the worker), bounded by the shards whose heartbeat advanced lately."""

    def count() -> int:
        running = ti.get_ti_count(dag_id=ti.dag_id, task_ids=[ti.task_id], run_ids=[ti.run_id], states=["running"])
        return max(1, min(running, live_shards(layout)))

    return count
