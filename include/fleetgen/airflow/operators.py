"""WaitReadyOperator: defer until a launched server is ready; re-plan and relaunch on a memory error."""

from __future__ import annotations

import logging
from typing import Any

from airflow.sdk import BaseOperator

from fleetgen.airflow.node_shell import authentication_refused, host_key_mismatch, key_file_unreadable
from fleetgen.airflow.readiness_event import ReadinessEvent, ReadinessStatus
from fleetgen.airflow.run_storage import on_run_storage
from fleetgen.nodes import launch_identity, readiness
from fleetgen.errors import (FailureKind, FleetgenError, HostUnreachable, PlanError, ServerError, ServerNotReady,
                            ServerStartupError)
from fleetgen.nodes.reconnect import DEFAULT_COMMAND_TIMEOUT_S, DEFAULT_RECONNECT_ATTEMPTS, DEFAULT_RECONNECT_BUDGET_S
from fleetgen.nodes.fleet import ServerSlot, fleet_from_json
from fleetgen.tuning.planner import MAX_BACKOFF_ATTEMPTS

log = logging.getLogger(__name__)


# The task's documentation in the UI (its Details tab).
WAIT_READY_DOC = f"""
**Waits (deferred, in the triggerer) until one server is ready** (labelled `host:port (GPU ids)`), watching its log
for SGLang's fatal lines; reads the *effective* limits from `/server_info`. A memory error re-plans that server
one step smaller and relaunches it ({MAX_BACKOFF_ATTEMPTS} times at most).

*When it fails*: the log's first lines say SGLang's own fatal line and which DAG parameter to change
(`memory_margin_mib`, `max_running_requests`, `bf16_ssm_state`, ...), or that the wait timed out
(`ready_timeout_s`).
"""


class WaitReadyOperator(BaseOperator):
    """Wait (deferred, in the triggerer) for one server; return its effective limits (``WAIT_READY_DOC`` is what
    the UI shows).

    On an SGLang memory error the server's plan is backed off one step (``fleetgen.tuning.planner.backoff``)
    and the server alone is relaunched; when ``backoff`` finds no smaller plan (its relaunch limit,
    ``MAX_BACKOFF_ATTEMPTS``, is the only one), the task fails with SGLang's own fatal line and the log tail.
    """

    template_fields = ("server", "fleet", "timeout_s", "ssh_reconnect_attempts",
                       "ssh_reconnect_budget_s", "ssh_command_timeout_s")
    ui_color = "#d8f3dc"

    def __init__(self, *, server: Any, fleet: Any, timeout_s: Any = None, poll_s: float = 1.0,
                 ssh_reconnect_attempts: Any = DEFAULT_RECONNECT_ATTEMPTS,
                 ssh_reconnect_budget_s: Any = DEFAULT_RECONNECT_BUDGET_S,
                 ssh_command_timeout_s: Any = DEFAULT_COMMAND_TIMEOUT_S, resume_settle_s: float | None = None,
                 **kwargs) -> None:
        kwargs.setdefault("doc_md", WAIT_READY_DOC)
        super().__init__(**kwargs)
        self.server = server
        self.fleet = fleet
        self.timeout_s = timeout_s  # None: the run's ready_timeout_s (fleetgen.airflow.run_config.Tuning)
        self.poll_s = poll_s
        # How long the deferred wait keeps reconnecting when the node's SSH drops (fleetgen.nodes.reconnect).
        self.ssh_reconnect_attempts = ssh_reconnect_attempts
        self.ssh_reconnect_budget_s = ssh_reconnect_budget_s
        self.ssh_command_timeout_s = ssh_command_timeout_s
        # None: the trigger's DEFAULT_RESUME_SETTLE_S (Airflow's fast-resume race, triggers.py).
        self.resume_settle_s = resume_settle_s

    def _trigger(self, launched: dict, attempt: int):
        from fleetgen.airflow.triggers import ReadinessTrigger

        fleet = fleet_from_json(self.fleet)
        if self.timeout_s is None:
            from fleetgen.airflow.context import run_context

            timeout_s = run_context()[1].tuning.ready_timeout_s
        else:
            timeout_s = self.timeout_s
        watch = {"timeout_s": timeout_s, "poll_s": self.poll_s, "reconnect_attempts": self.ssh_reconnect_attempts,
                 "reconnect_budget_s": self.ssh_reconnect_budget_s, "command_timeout_s": self.ssh_command_timeout_s,
                 **({} if self.resume_settle_s is None else {"resume_settle_s": self.resume_settle_s})}
        return ReadinessTrigger(
            server={k: launched[k] for k in ("node", "name", "url", "port", "gpu_ids")},
            ssh_conn_id=launched["ssh_conn_id"], log_path=launched["log_path"], pid=launched["pid"],
            watch=watch, api_key_conn_id=fleet.server.api_key_conn_id,
            context={"launched": launched, "attempt": attempt})

    @on_run_storage
    def execute(self, context) -> None:
        log.info("Waiting for %s (GPU %s, pid %s) to become ready; watching %s", self.server["name"],
                 self.server["gpu_ids"], self.server["pid"], self.server["log_path"])
        self.defer(trigger=self._trigger(self.server, 0), method_name="execute_complete")

    @on_run_storage
    def execute_complete(self, context, event: dict) -> dict:
        event = ReadinessEvent.from_payload(event)
        launched, attempt = event.launched, event.attempt
        name, node = launched["name"], launched["node"]
        where = f"{name} (GPU {launched['gpu_ids']}, pid {launched['pid']})"
        if event.status is ReadinessStatus.READY:
            return self._ready(launched, event, attempt)
        tail = event.log_tail
        if event.status is ReadinessStatus.HOST_KEY_MISMATCH:
            from airflow.sdk.exceptions import AirflowFailException

            mismatch = host_key_mismatch(node, launched["ssh_conn_id"], event.address,
                                         expected=event.expected, received=event.received)
            raise AirflowFailException(str(mismatch)) from mismatch
        if event.status is ReadinessStatus.SSH_CREDENTIALS:
            ssh_conn_id = launched["ssh_conn_id"]
            raise (key_file_unreadable(node, ssh_conn_id, event.key_file, event.error) if event.key_file
                   else authentication_refused(node, ssh_conn_id, event.error))
        if event.status is ReadinessStatus.UNREACHABLE:
            raise HostUnreachable(f"cannot watch {where}: {event.error}", host=node, server=name,
                                  hint="is the node up and its sshd running? The server may still be loading: "
                                       "raise wait_ready's ssh_reconnect_attempts / ssh_reconnect_budget_s to "
                                       "ride out longer outages")
        if event.status is ReadinessStatus.TIMEOUT:
            raise ServerNotReady(
                f"{where} not ready after {event.waited_s:.0f} s; the log last said:\n"
                f"{readiness.format_log_excerpt(tail)}", host=node, server=name,
                hint=f"read {launched['log_path']} on {node}; raise the DAG parameter ready_timeout_s if the model "
                     f"loads slowly")
        kind, fatal_line = event.kind, event.fatal_line
        if kind == FailureKind.EXITED:
            self._fail_if_replaced(launched, where)
        log.error("%s failed to start (%s): %s\nWhat to change: %s", where, kind.value, fatal_line, kind.hint)
        from fleetgen.tuning import ServerPlan, backoff, render_budget_table

        hint, no_smaller = kind.hint, ""
        if kind.can_back_off():  # a memory failure: relaunch one step smaller, unless no smaller plan exists
            self._fail_if_foreign_holds_memory(launched, where, kind, fatal_line, tail)
            plan = ServerPlan.from_dict(launched["plan"])
            try:
                smaller = backoff(plan, kind)
            except PlanError as exc:  # the hint still names the DAG parameter that changes the plan
                no_smaller = f"; no smaller plan: {exc.message}"
                hint = f"{kind.hint}; {exc.hint}" if exc.hint else kind.hint
                log.error("The plan %s was last launched with:\n%s", name, render_budget_table(plan))
            else:
                return self._relaunch_smaller(launched, smaller, fatal_line)
        raise ServerStartupError(
            f"{where} died while starting: {fatal_line}\n(log {launched['log_path']}, after {attempt} relaunch(es)"
            f"{no_smaller}; last {len(tail)} lines:)\n{readiness.format_log_excerpt(tail)}",
            host=node, server=name, fatal_line=fatal_line, kind=kind.value, log_tail=tail, hint=hint)

    def _fail_if_foreign_holds_memory(self, launched: dict, where: str, kind: FailureKind, fatal_line: str,
                                      tail: list[str]) -> None:
        """A memory failure while a process not ours holds memory on the server's GPUs (it came after the probe):
        no smaller plan can win that memory back, so fail at once naming what nvidia-smi lists now."""
        from fleetgen.airflow.lifecycle import probe_node
        from fleetgen.airflow.node_shell import NodeShell
        from fleetgen.nodes.probe import select_gpus

        try:
            with NodeShell(launched["node"], launched["ssh_conn_id"]) as shell:
                inventory = probe_node(shell, fleet_from_json(self.fleet), launched["node"])
            gpus = select_gpus(inventory, launched["gpu_ids"])
        except (FleetgenError, OSError, KeyError, ValueError) as exc:  # the back-off below stands
            log.warning("could not look at the GPUs of %s again: %s", launched["name"], exc)
            return
        foreign = [f"pid {p['pid']} ({p['process_name']}, {p['used_mib']} MiB on GPU {gpu['index']})"
                   for gpu in gpus for p in gpu["processes"] if not p["ours"] and p["used_mib"] > 0]
        if foreign:
            raise ServerStartupError(
                f"{where} ran out of memory while foreign processes hold its GPUs: {'; '.join(foreign)}\n"
                f"(SGLang said: {fatal_line})", host=launched["node"], server=launched["name"],
                fatal_line=fatal_line, kind=kind.value, log_tail=tail,
                hint=f"free the GPUs (stop {', '.join(foreign)}: nvidia-smi on {launched['node']} lists it now, "
                     f"it came after the probe), then clear wait_ready; a smaller plan cannot win that memory back")

    def _fail_if_replaced(self, launched: dict, where: str) -> None:
        """A pid gone while a later launch's server holds the port (its pid file names another live server of
        ours): this run's wait was cleared after a later run relaunched. Not a failed start: say so."""
        from fleetgen.airflow.lifecycle import live_server_of_ours
        from fleetgen.airflow.node_shell import NodeShell

        try:
            with NodeShell(launched["node"], launched["ssh_conn_id"]) as shell:
                later = live_server_of_ours(shell, fleet_from_json(self.fleet), launched["port"])
        except (FleetgenError, OSError, KeyError, ValueError) as exc:  # the usual failure below stands
            log.warning("could not read the pid file of %s: %s", launched["name"], exc)
            return
        if later is not None and later != int(launched["pid"]):
            raise ServerError(f"{where} is gone: its pid file names pid {later}, a later launch of ours that runs "
                              f"on the port now", host=launched["node"], server=launched["name"],
                              hint="this run's servers were replaced by a later run; re-run with a new run "
                                   "(trigger the DAG again) instead of clearing this one's wait_ready")

    def _ready(self, launched: dict, event: ReadinessEvent, attempt: int) -> dict:
        from fleetgen.tuning import ServerPlan, compare_expected

        info = event.server_info
        limits = readiness.parse_server_info(info, server=launched["name"])
        plan = ServerPlan.from_dict(launched["plan"])
        mismatches = compare_expected(plan, limits)
        for line in mismatches:
            log.warning("expected vs effective on %s: %s", launched["name"], line)
        expected = plan.expected
        self._record_time(launched, "ready")
        log.info("%s ready after %.0f s: effective max_running_requests=%d, max_total_num_tokens=%d, "
                 "max_mamba_cache_size=%s (expected %s, %s, %s)", launched["name"], event.waited_s,
                 limits.effective_max_running_requests, limits.max_total_num_tokens, limits.max_mamba_cache_size,
                 expected.get("max_running_requests"), expected.get("max_total_num_tokens"),
                 expected.get("max_mamba_cache_size"))
        return {"server": launched["name"], "host": launched["node"], "port": launched["port"],
                "url": launched["url"], "gpu_ids": launched["gpu_ids"], "pid": launched["pid"],
                **limits.to_dict(), "expected": plan.expected, "mismatches": mismatches, "relaunches": attempt,
                "flags": plan.flags, "model": (info.get("_model_info") or {}).get("served_model_name"),
                "kept": bool(launched.get("kept")), "waited_s": event.waited_s,
                # which launch answered: each completion a shard accepts must name the same (launch_identity.py)
                "launch_id": launch_identity.reported(info),
                # what the shards re-read from /server_info to know it is still this launch (generate/launch_check.py)
                "launch_fields": readiness.launch_fields(info, plan.flags),
                "calibration": self._calibrate(launched, plan, limits, event.log_tail)}

    @staticmethod
    def _record_time(launched: dict, event: str) -> None:
        """When the server got ready or was relaunched, for the report's GPU-hours (outputs.record_server_time); a
        record that cannot be written is a warning (the report then counts that server's loading as unknown)."""
        from fleetgen.airflow.context import run_context
        from fleetgen.outputs import record_server_time

        try:
            record_server_time(run_context()[2], launched["name"], event, pid=launched["pid"])
        except (FleetgenError, OSError) as exc:
            log.warning("when %s was %s is not recorded for the GPU-hours: %s", launched["name"], event, exc)

    def _calibrate(self, launched: dict, plan, limits, log_lines: list[str]) -> dict | None:
        """The readback's calibration (tuning/calibration.py), recorded for the next plan and in the run's
        output. A calibration that cannot be computed or stored is a warning, never a failed server."""
        from fleetgen.airflow.context import run_context
        from fleetgen.outputs import calibration_file
        from fleetgen.tuning.calibration import CalibrationStore, record_readback

        fleet = fleet_from_json(self.fleet)
        try:
            _, config, layout = run_context()
            recorded = record_readback(plan, limits, "\n".join(log_lines), model_path=fleet.model.path,
                                       shared=CalibrationStore(calibration_file(config.inputs.output_root)),
                                       run=CalibrationStore(layout.calibration), server=launched["name"])
        except (FleetgenError, OSError, KeyError, ValueError) as exc:
            log.warning("no calibration for %s: %s", launched["name"], exc)
            return None
        log.info("readback of %s: %s", launched["name"], recorded["report_line"])
        return recorded

    def _relaunch_smaller(self, launched: dict, smaller, fatal_line: str) -> None:
        from fleetgen.airflow.context import run_context
        from fleetgen.airflow.lifecycle import api_key, launch_server, stop_ports
        from fleetgen.airflow.node_shell import NodeShell
        from fleetgen.tuning import MAX_BACKOFF_ATTEMPTS, render_budget_table

        fleet = fleet_from_json(self.fleet)
        log.warning("Relaunching %s with a smaller plan (attempt %d of %d) after: %s\n%s", launched["name"],
                    smaller.attempt, MAX_BACKOFF_ATTEMPTS, fatal_line, render_budget_table(smaller))
        slot = ServerSlot(launched["node"], launched["ssh_conn_id"], launched["address"],
                          tuple(launched["gpu_ids"]), launched["port"])
        with NodeShell(slot.node, slot.ssh_conn_id) as shell:
            stop_ports(shell, fleet, [slot.port])
            relaunched = launch_server(shell, fleet, slot, smaller.to_dict(), api_key(fleet),
                                       run_id=run_context()[0]["run_id"])
        self._record_time(relaunched, "launched")  # still loading: its first launch stays the start
        self.defer(trigger=self._trigger(relaunched, smaller.attempt), method_name="execute_complete")
