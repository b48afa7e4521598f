"""Task callables of the ``servers`` group: stop only our servers, launch the plan, release at the end."""

from __future__ import annotations

import logging

from fleetgen.airflow import lifecycle
from fleetgen.airflow.context import mapped_values, run_context
from fleetgen.airflow.node_shell import NodeShell
from fleetgen.nodes import probe
from fleetgen.nodes.fleet import fleet_from_json
from fleetgen.outputs import record_server_time, write_marker_stops

log = logging.getLogger("fleetgen")


def stop_servers(node: str, fleet: dict, plans: list[dict] | None = None,
                 trial_plans: list[dict] | None = None) -> dict:
    """**Keeps our servers that already run tonight's plan on one node and stops the others** (only ours: pid file
    and command line must match; all of them with `relaunch_servers`), TERM then KILL, and waits until the GPU
    memory is back. After a tuning trial (`trial_plans`: the plans the trial ran), every server that ran a losing
    candidate is stopped, whatever it reports, and the servers already on the winner are kept.

    *When it fails*: memory did not come back (another process holds the GPU) or SSH failed.
    """
    _, config, layout = run_context()
    spec = fleet_from_json(fleet)
    if left_out(node, plans):
        return {"node": node, "records": [], "decisions": [], "left_out": True}
    ports = list(spec.node(node).ports)
    with NodeShell(node, spec.node(node).ssh_conn_id) as shell:
        decisions = []
        if plans is not None:
            # relaunch_servers relaunches the servers of the first round; after the trial only the losers go
            decisions = lifecycle.keep_or_relaunch(shell, spec, node, list(plans),
                                                   force=config.inputs.relaunch_servers and trial_plans is None,
                                                   key=lifecycle.api_key(spec))
            if trial_plans is not None:
                decisions = _losers_relaunched(decisions, node, list(plans), mapped_values(trial_plans))
            for decision in decisions:
                if decision["decision"] == "keep":
                    log.info("%s: kept (pid %s): it runs tonight's plan, model and version", decision["server"],
                             decision["pid"])
                else:
                    log.info("%s: relaunched: %s", decision["server"], "; ".join(decision["reasons"]))
            kept = {d["port"] for d in decisions if d["decision"] == "keep"}
            ports = [port for port in ports if port not in kept]
        log.info("Stopping our servers on %s ports %s (only pids from our pid files whose command line matches)",
                 node, ports)
        records = lifecycle.stop_ports(shell, spec, ports) if ports else []
        stopped = {r["pid"] for r in records if r["outcome"] == "stopped"}
        inventory = lifecycle.wait_memory_released(shell, spec, node, stopped)
    for record in records:  # the end of its GPU time in this run (the report's GPU-hours), once its memory is back
        if record["outcome"] == "stopped":
            record_server_time(layout, f"{node}:{record['port']}", "stopped", pid=record["pid"])
    write_marker_stops(layout, node, records)  # the report lists them
    for record in records:
        if record.get("launched_under_other_module") or record.get("pid_file_missing"):
            log.warning("port %s: stopped pid %s, a server of ours (its launch marker) %s", record["port"],
                        record["pid"], "launched under another server.module than the fleet file names now"
                        if record.get("launched_under_other_module") else "whose pid file was gone")
        if record["outcome"] == "stale":
            log.warning("port %s: pid file named pid %s, which is not our server any more; left it alone",
                        record["port"], record["pid"])
    log.info("Stopped %d server(s) on %s; memory released:\n%s", len(stopped), node, probe.format_inventory(inventory))
    return {"node": node, "records": records, "decisions": decisions}


def _losers_relaunched(decisions: list[dict], node: str, plans: list[dict], trial_plans: list[dict]) -> list[dict]:
    """``decisions`` with every server of ``node`` whose trial plan was another candidate than ``plans`` gives it
    marked for relaunch: the keep-on-plan comparison reads only the flags a launch sets, not one a loser set and
    the winner leaves out."""
    ran = {(plan["host"], plan["port"]): plan.get("candidate") for plan in trial_plans}
    winner = {(plan["host"], plan["port"]): plan.get("candidate") for plan in plans}
    marked = []
    for decision in decisions:
        server = (node, decision["port"])
        if ran.get(server) != winner.get(server):
            reason = f"ran {ran.get(server)} in the tuning trial, which {winner.get(server)} won"
            decision = {**decision, "decision": "relaunch", "reasons": [reason, *decision["reasons"]]}
        marked.append(decision)
    return marked


def left_out(node: str, plans: list[dict] | None) -> bool:
    """Whether tonight's plan left ``node`` out (it was unreachable at probe time, ``skip_unreachable_nodes``):
    then no task touches it. Without a plan (derive_plan did not run) no node is left out."""
    if plans is None or any(plan["host"] == node for plan in plans):
        return False
    log.warning("%s was left out of tonight's plan (unreachable at probe time, skip_unreachable_nodes): not "
                "touched", node)
    return True


def release_servers(node: str, fleet: dict, plans: list[dict] | None = None) -> dict:
    """Stops our servers after the run unless `keep_servers_up` is set (the default keeps them up for the next
    run); runs whatever happened. A node tonight's plan left out is not touched."""
    _, config, _ = run_context()
    if config.inputs.keep_servers_up:
        log.info("keep_servers_up is set: servers on %s stay up for the next run", node)
        return {"node": node, "records": []}
    if left_out(node, plans):
        return {"node": node, "records": [], "left_out": True}
    return stop_servers(node, fleet, None)


def launch_servers(node: str, fleet: dict, plans: list[dict], stopped: list[dict] | None = None) -> list[dict]:
    """**Launches one SGLang server per GPU / TP group on one node** under `setsid`, with the plan's flags; pid and log
    files go to the node's run directory.

    A server `stop_servers` kept is passed on as running.

    *When it fails*: SSH (retried: a retry passes on the servers an earlier try launched with the same command
    line, never launching one twice), or the server's Python/module in the fleet description is wrong.
    """
    context, _, layout = run_context()
    spec = fleet_from_json(fleet)
    if left_out(node, plans):
        return []
    slots = [slot for slot in spec.servers() if slot.node == node]
    plan_by_port = {(p["host"], p["port"]): p for p in plans}
    kept = {d["port"]: d["pid"] for result in mapped_values(stopped or []) if result["node"] == node
            for d in result.get("decisions", []) if d["decision"] == "keep"}
    key = lifecycle.api_key(spec)
    launched = [lifecycle.kept_server(spec, slot, plan_by_port[(slot.node, slot.port)], kept[slot.port])
                for slot in slots if slot.port in kept]
    to_launch = [slot for slot in slots if slot.port not in kept]
    log.info("Launching %d server(s) on %s; %d kept running", len(to_launch), node, len(launched))
    if to_launch:
        with NodeShell(node, spec.node(node).ssh_conn_id) as shell:
            earlier, other_plan = lifecycle.already_launched(shell, spec, to_launch, plan_by_port, key,
                                                               run_id=context["run_id"])
            if other_plan:
                log.warning("ports %s run a server of ours launched with another command line after stop_servers "
                            "(pids %s): stopping them to launch tonight's plan", sorted(other_plan),
                            sorted(other_plan.values()))
                records = lifecycle.stop_ports(shell, spec, sorted(other_plan))
                lifecycle.wait_memory_released(shell, spec, node, {r["pid"] for r in records
                                                                    if r["outcome"] == "stopped"})
            for slot in to_launch:
                plan = plan_by_port[(slot.node, slot.port)]
                if slot.port in earlier:
                    log.info("%s: already launched by an earlier try of this task (pid %s, same command line); "
                             "not launched again", slot.name, earlier[slot.port])
                    launched.append(lifecycle.launch_record(spec, slot, plan, earlier[slot.port],
                                                            run_id=context["run_id"]))
                else:
                    launched.append(lifecycle.launch_server(shell, spec, slot, plan, key,
                                                            run_id=context["run_id"]))
                # when its GPU time starts in this run (the report's GPU-hours); an earlier try's launch, if it
                # recorded one, stays the start
                record_server_time(layout, slot.name, "launched", pid=launched[-1]["pid"])
    for server in launched:
        if server["kept"]:  # already running the plan: this run holds it from now on
            record_server_time(layout, server["name"], "kept", pid=server["pid"])
    log.info("Servers on %s: pids %s", node, [s["pid"] for s in launched])
    return launched


def flatten(nested: list[list[dict]]) -> list[dict]:
    """Flattens the launched servers into one list: what `wait_ready` is mapped over.
    """
    return [item for group in mapped_values(nested) for item in group]
