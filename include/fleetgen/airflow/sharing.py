"""How many shards of this run are generating now, asked of Airflow: running shards split every
server's in-flight limit between them (``fleetgen.generate.dispatch``)."""

from __future__ import annotations

from collections.abc import Callable


def running_shards_counter(ti) -> Callable[[], int]:
    """A callable counting this run's running ``generate_shard`` tries (this one included), through the
    task instance's public ``get_ti_count`` (the execution API; no metadata-DB access from the worker)."""

    def count() -> int:
        return ti.get_ti_count(dag_id=ti.dag_id, task_ids=[ti.task_id], run_ids=[ti.run_id], states=["running"])

    return count
