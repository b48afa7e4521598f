"""What the workload mode learns from the run before: files in the run folders, and the plans they lead to.

- ``RunLayout.workload_plan`` (``workload_plan.json``): per server, the cap and KV pool the run was
  planned with and the ceiling it carried (written when the plan is derived);
- the previous run's stats (prompt and completion tokens per completion, finished requests per server);
- the servers' own logs, read on the nodes with ``remote.scheduler_log_command``: the peak
  ``#full token`` and the retractions SGLang logged (docs/sglang-scheduler.md §4, §5, §7).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from fleetgen.nodes import remote
from fleetgen.outputs import RunLayout, run_root_of_report
from fleetgen.tuning.plan import ServerPlan, TunerBounds
from fleetgen.tuning.workload import KvDemand, RunObservation, plan_workload_server


def plan_record(plans: list[ServerPlan]) -> dict:
    """``{server: {max_running_requests, max_total_num_tokens, ceiling}}`` for ``workload_plan.json``."""
    record = {}
    for plan in plans:
        step = (plan.inputs.get("workload_mode") or {}).get("step") or {}
        record[plan.server] = {"max_running_requests": plan.expected["max_running_requests"],
                               "max_total_num_tokens": plan.expected["max_total_num_tokens"],
                               "ceiling": step.get("ceiling")}
    return record


def write_plan_record(layout: RunLayout, plans: list[ServerPlan]) -> Path:
    layout.root.mkdir(parents=True, exist_ok=True)
    partial = layout.workload_plan.with_suffix(".partial")
    partial.write_text(json.dumps(plan_record(plans), indent=1, sort_keys=True))
    partial.replace(layout.workload_plan)
    return layout.workload_plan


def read_plan_record(layout: RunLayout) -> dict:
    """The previous run's record, or {} when it has none (an older run, or one planned elsewhere)."""
    try:
        record = json.loads(layout.workload_plan.read_text())
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def finished_by_server(stats) -> dict[str, int]:
    rows = stats.dropna(subset=["completion_tokens", "server"])
    return {str(server): int(count) for server, count in rows["server"].astype(str).value_counts().items()}


def observations(log_output: str, host: str, record: dict, finished: dict[str, int]) -> dict[str, RunObservation]:
    """``{server: RunObservation}`` from a node's ``scheduler_log_command`` output and the previous run's
    plan record and stats; servers without a log, a record or finished requests are left out."""
    result = {}
    for _, fields in remote.parse_records(log_output, ("scheduler",)):
        server = f"{host}:{fields['port']}"
        planned = record.get(server)
        if fields.get("missing") or not planned or not finished.get(server):
            continue
        result[server] = RunObservation(max_running_requests=int(planned["max_running_requests"]),
                                        max_total_num_tokens=int(planned["max_total_num_tokens"]),
                                        peak_used_tokens=int(fields["peak_full_tokens"]),
                                        retracted_requests=int(fields["retracted"]),
                                        finished_requests=finished[server])
    return result


def plan_workload_fleet(plan_for: dict[str, Callable[[TunerBounds], ServerPlan]], bounds: TunerBounds, *,
                        demand: KvDemand | None, seen: dict[str, RunObservation], record: dict,
                        pin_full_context: bool) -> list[ServerPlan]:
    """Tonight's plan for every server (``plan_for``: server -> its ``plan_server``), each from its own
    observation; a server the previous run did not observe starts from the full-context plan."""
    plans = []
    for server, plan_with in plan_for.items():
        ceiling = (record.get(server) or {}).get("ceiling")
        plans.append(plan_workload_server(plan_with, bounds, demand=demand, previous=seen.get(server),
                                          ceiling=ceiling, pin_full_context=pin_full_context))
    return plans


@dataclass(frozen=True)
class Learned:
    """What the previous run taught: the KV demand, each observed server and the plan record."""

    demand: KvDemand | None = None
    seen: dict = field(default_factory=dict)
    record: dict = field(default_factory=dict)
    source: str = "no previous run"


def learn_from_previous_run(output_root: Path, current: RunLayout, *, page_size: int, reserve_tokens: int,
                            log_dir: str, ports_by_node: dict[str, list[int]],
                            run_on_node: Callable[[str, str], str]) -> Learned:
    """Read the previous successful run (``fleetgen.report.previous.find_previous_report``): its stats,
    its plan record, and on every node (``run_on_node(node, command) -> stdout``) the servers' logs."""
    from fleetgen.report.previous import find_previous_report
    from fleetgen.validation.stats_table import load_stats

    previous = find_previous_report(output_root, current.root.name) if output_root.exists() else None
    if previous is None:
        return Learned()
    layout = RunLayout(run_root_of_report(previous))
    stats = load_stats(layout.root)
    finished = finished_by_server(stats)
    demand = KvDemand.from_stats(stats, page_size=page_size, reserve_tokens=reserve_tokens) if finished else None
    record = read_plan_record(layout)
    seen: dict[str, RunObservation] = {}
    if record:
        for node, ports in ports_by_node.items():
            seen.update(observations(run_on_node(node, remote.scheduler_log_command(log_dir, ports)), node, record,
                                     finished))
    return Learned(demand=demand, seen=seen, record=record, source=f"previous run {layout.root}")
