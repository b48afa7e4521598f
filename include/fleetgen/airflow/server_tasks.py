"""Task callables of the ``servers`` group: stop only our servers, launch the plan, release at the end."""

from __future__ import annotations

import logging

from fleetgen.airflow import lifecycle
from fleetgen.airflow.context import fail_fast, mapped_values, run_context
from fleetgen.airflow.hooks import NodeShell
from fleetgen.nodes import probe
from fleetgen.nodes.fleet import fleet_from_json

log = logging.getLogger("fleetgen")


@fail_fast
def stop_servers(node: str, fleet: dict) -> dict:
    spec = fleet_from_json(fleet)
    ports = list(spec.node(node).ports)
    log.info("Stopping our servers on %s ports %s (only pids from our pid files whose command line matches)",
             node, ports)
    with NodeShell(node, spec.node(node).ssh_conn_id) as shell:
        records = lifecycle.stop_ports(shell, spec, ports)
        stopped = {r["pid"] for r in records if r["outcome"] == "stopped"}
        inventory = lifecycle.wait_memory_released(shell, spec, node, stopped)
    for record in records:
        if record["outcome"] == "stale":
            log.warning("port %s: pid file named pid %s, which is not our server any more; left it alone",
                        record["port"], record["pid"])
    log.info("Stopped %d server(s) on %s; memory released:\n%s", len(stopped), node, probe.format_inventory(inventory))
    return {"node": node, "records": records}


@fail_fast
def release_servers(node: str, fleet: dict) -> dict:
    """After the run: stop our servers if the run asked for it (the default keeps them up for the next run)."""
    _, config, _ = run_context()
    if config.inputs.keep_servers_up:
        log.info("keep_servers_up is set: servers on %s stay up for the next run", node)
        return {"node": node, "records": []}
    return stop_servers(node, fleet)


@fail_fast
def launch_servers(node: str, fleet: dict, plans: list[dict]) -> list[dict]:
    spec = fleet_from_json(fleet)
    slots = [slot for slot in spec.servers() if slot.node == node]
    plan_by_port = {(p["host"], p["port"]): p for p in plans}
    log.info("Launching %d server(s) on %s", len(slots), node)
    key = lifecycle.api_key(spec)
    with NodeShell(node, spec.node(node).ssh_conn_id) as shell:
        launched = [lifecycle.launch_server(shell, spec, slot, plan_by_port[(slot.node, slot.port)], key)
                    for slot in slots]
    log.info("Launched %d server(s) on %s: pids %s", len(launched), node, [s["pid"] for s in launched])
    return launched


def flatten(nested: list[list[dict]]) -> list[dict]:
    return [item for group in mapped_values(nested) for item in group]
