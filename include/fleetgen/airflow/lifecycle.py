"""Stop, launch and memory checks for one node's servers, over SSH. Used by tasks and the readiness operator."""

from __future__ import annotations

import logging
import time

from fleetgen.nodes import launch_identity, probe, readiness
from fleetgen.nodes import remote
from fleetgen.airflow.node_shell import NodeShell
from fleetgen.errors import RemoteError, ServerStartupError
from fleetgen.nodes.fleet import FleetSpec, ServerSlot

log = logging.getLogger(__name__)


def api_key(fleet: FleetSpec) -> str | None:
    """The SGLang API key from the Airflow connection named in the fleet (its password), or None."""
    if not fleet.server.api_key_conn_id:
        return None
    from airflow.sdk import BaseHook

    key = BaseHook.get_connection(fleet.server.api_key_conn_id).password
    if not key:
        from fleetgen.errors import ConfigError

        raise ConfigError(f"connection '{fleet.server.api_key_conn_id}' has no password to use as the API key",
                          hint="set the connection's password to the SGLang --api-key value")
    try:
        remote.api_key_config(key)
    except ValueError as exc:  # the message never holds the key
        from fleetgen.errors import ConfigError

        raise ConfigError(f"the password of connection '{fleet.server.api_key_conn_id}' cannot be an API key: {exc}",
                          hint="set the connection's password to a key of one line not starting with '-'") from None
    return key


def probe_node(shell: NodeShell, fleet: FleetSpec, node_name: str) -> dict:
    node = fleet.node(node_name)
    _, out, _ = shell.run(probe.probe_command(run_dir=fleet.server.run_dir, module=fleet.server.module,
                                              ports=node.ports), describe="GPU probe", timeout_s=60)
    return probe.parse_probe_output(out, host=node_name)


def stop_ports(shell: NodeShell, fleet: FleetSpec, ports: list[int]) -> list[dict]:
    """Stop our servers on ``ports`` (only ours: pid file + our launch marker or command line), one record per
    port; ``launched_under_other_module`` / ``pid_file_missing`` say that one was found despite the fleet file
    naming another module today or its pid file being gone."""
    command = remote.stop_command(run_dir=fleet.server.run_dir, module=fleet.server.module, ports=ports,
                                  grace_s=fleet.server.stop_grace_s)
    # every port at once (remote.stop_command): one grace, not one per port
    _, out, _ = shell.run(command, describe="stop servers", timeout_s=fleet.server.stop_grace_s + 60)
    records = [{"outcome": outcome, "port": int(fields["port"]),
             "pid": int(fields["pid"]) if fields.get("pid", "").isdigit() else None, "signal": fields.get("signal"),
             "launched_under_other_module": fields.get("module") == "other",
             "pid_file_missing": fields.get("pid_file") == "missing"}
            for outcome, fields in remote.parse_records(out, ("stopped", "absent", "stale"))]
    order = [int(port) for port in ports]  # the ports' order, whichever ended first (the script prints only these)
    return sorted(records, key=lambda record: order.index(record["port"]))


def wait_memory_released(shell: NodeShell, fleet: FleetSpec, node_name: str, pids: set[int],
                         timeout_s: float = 120.0) -> dict:
    """Probe until none of ``pids`` holds GPU memory any more; return the fresh inventory."""
    deadline = time.monotonic() + timeout_s
    while True:
        inventory = probe_node(shell, fleet, node_name)
        holding = sorted({p["pid"] for gpu in inventory["gpus"] for p in gpu["processes"]} & pids)
        if not holding:
            return inventory
        if time.monotonic() > deadline:
            raise RemoteError(f"stopped servers (pids {holding}) still hold GPU memory after {timeout_s:.0f} s",
                              host=node_name, hint="check `nvidia-smi` on the node; a zombie or a stuck driver "
                                                   "context may need a manual kill")
        time.sleep(1.0)


# Every server exposes SGLang's Prometheus metrics: the shards sample them for the occupancy report.
ALWAYS_ARGS = ("--enable-metrics",)


def launch_spec(fleet: FleetSpec, slot: ServerSlot, plan: dict, *, with_api_key: bool,
                run_id: str | None) -> remote.LaunchSpec:
    """The launch of ``slot`` on ``plan``; with ``run_id``, carrying that run's launch identity
    (nodes/launch_identity.py); without, what a server kept on plan is compared with. The args after the plan's
    flags are the plan's own (its candidate's, tuning/candidates.py), else the fleet's ``server.extra_args``."""
    extra = launch_extra_args(fleet, plan)
    args = remote.flags_to_args(plan["flags"]) + [arg for arg in ALWAYS_ARGS if arg not in extra] + extra
    if run_id is not None:
        args += launch_identity.launch_args(run_id)
    return remote.LaunchSpec(
        python=fleet.server.python, module=fleet.server.module, model_path=fleet.model.path,
        served_name=fleet.model.served_name, port=slot.port, gpu_ids=slot.gpu_ids,
        bind_host=fleet.server.bind_host, run_dir=fleet.server.run_dir, log_dir=fleet.server.log_dir,
        args=tuple(args), env=fleet.server.env, api_key_on_stdin=with_api_key)


def launch_extra_args(fleet: FleetSpec, plan: dict) -> list[str]:
    """The SGLang args ``plan`` launches with after its flags: its candidate's edit of the fleet's extra args, or
    (a plan naming none) the fleet's. Neither holds a flag the launch sets itself: the fleet file refuses them
    (nodes/fleet.py) and so does ``tuning_candidates`` (tuning/candidates.py)."""
    own = plan.get("extra_args")
    return list(fleet.server.extra_args) if own is None else [str(arg) for arg in own]


def launch_server(shell: NodeShell, fleet: FleetSpec, slot: ServerSlot, plan: dict, key: str | None, *,
                  run_id: str) -> dict:
    spec = launch_spec(fleet, slot, plan, with_api_key=key is not None, run_id=run_id)
    status, out, err = shell.run(remote.launch_command(spec), stdin=remote.api_key_config(key) if key else None,
                                 describe=f"launch of {slot.name}", check=False, timeout_s=60)
    if status != 0:
        raise ServerStartupError(f"launch refused (exit {status}): {(err or out).strip()[-1000:]}",
                                 host=slot.node, server=slot.name, kind="launch",
                                 hint="a server of ours may still hold the port; run the DAG again or stop it")
    launched = remote.parse_records(out, ("launched",))
    fields = launched[-1][1] if launched else {}
    if "pid" not in fields:
        raise ServerStartupError(f"the launch printed no pid: {out.strip()[-500:]}", host=slot.node,
                                 server=slot.name, kind="launch")
    record = launch_record(fleet, slot, plan, int(fields["pid"]), run_id=run_id)
    log.info("launched %s on GPU(s) %s: pid %s, log %s", slot.name, list(slot.gpu_ids), fields["pid"],
             record["log_path"])
    return record


def launch_record(fleet: FleetSpec, slot: ServerSlot, plan: dict, pid: int, *, run_id: str | None) -> dict:
    """What ``wait_ready`` is given for one server: launched now or by an earlier try of run ``run_id``, or
    kept running (``run_id`` None: it keeps the launch identity it was started with, read back by wait_ready)."""
    kept = run_id is None
    spec = launch_spec(fleet, slot, plan, with_api_key=False, run_id=run_id)
    return {**slot.to_dict(), "pid": int(pid), "log_path": remote.log_file(fleet.server.log_dir, slot.port),
            "plan": plan, "command": " ".join(spec.argv()), "args": spec.argv()[3:], "kept": kept}


def kept_server(fleet: FleetSpec, slot: ServerSlot, plan: dict, pid: int) -> dict:
    """The launch record of a server kept running (same shape as ``launch_server``'s, ``kept`` true)."""
    return launch_record(fleet, slot, plan, pid, run_id=None)


def live_server_of_ours(shell: NodeShell, fleet: FleetSpec, port: int) -> int | None:
    """The pid of the server of ours that the pid file of ``port`` names and that runs now, or None."""
    _, out, _ = shell.run(remote.our_pids_command(run_dir=fleet.server.run_dir, module=fleet.server.module,
                                                  ports=[port]), describe="our server on the port")
    return next((pid for pid, found in probe.parse_our_pids(out).items() if found == int(port)), None)


def already_launched(shell: NodeShell, fleet: FleetSpec, slots: list[ServerSlot], plan_by_port: dict,
                     key: str | None, *, run_id: str) -> tuple[dict[int, int], dict[int, int]]:
    """Our servers already running on the ports of ``slots``: ``({port: pid}`` of those whose command line is
    exactly this launch's, ``{port: pid}`` of the others).

    ``stop_servers`` leaves no server of ours on a port it did not keep, so one found here was started after
    it: by an earlier try of ``launch_servers`` whose connection dropped (the same command line: it is
    adopted, never launched twice), or with another plan (a relaunch by ``wait_ready`` before the task was
    cleared: it is stopped and launched afresh)."""
    if not slots:
        return {}, {}
    _, out, _ = shell.run(remote.our_pids_command(run_dir=fleet.server.run_dir, module=fleet.server.module,
                                                  ports=[slot.port for slot in slots]), describe="our servers")
    ours = {port: pid for pid, port in probe.parse_our_pids(out).items()}
    same, other = {}, {}
    for slot in slots:
        if slot.port not in ours:
            continue
        pid = ours[slot.port]
        status, cmdline, _ = shell.run(remote.read_file_command(f"/proc/{int(pid)}/cmdline"), check=False,
                                       describe=f"command line of pid {pid}")
        expected = launch_spec(fleet, slot, plan_by_port[(slot.node, slot.port)], with_api_key=key is not None,
                               run_id=run_id)
        running = cmdline.split("\0") if status == 0 else []
        if running and running[-1] == "":  # each word of /proc/PID/cmdline ends with a NUL
            running.pop()
        (same if _same_command(running, expected) else other)[slot.port] = pid
    return same, other


def _same_command(running: list[str], spec: remote.LaunchSpec) -> bool:
    """``running`` (a /proc cmdline) is the argv ``launch_command`` starts for ``spec``. The interpreter and the
    model path may have had their ``~/`` expanded by the node's shell; with the API key the launch appends
    ``--config <file>``."""
    expected = spec.argv()
    if spec.api_key_on_stdin:
        if running[-2:-1] != ["--config"]:
            return False
        running = running[:-2]
    if len(running) != len(expected):
        return False
    expandable = {0, 4}  # the interpreter, the model path (remote.launch_command quotes them with quote_path)
    return all(remote.as_expanded(seen, wanted) if index in expandable else seen == wanted
               for index, (seen, wanted) in enumerate(zip(running, expected)))


def installed_version(shell: NodeShell, fleet: FleetSpec) -> tuple[str | None, str | None]:
    """(SGLang version installed for the fleet's python on the node, None) or (None, why it is unknown)."""
    status, out, err = shell.run(remote.package_version_command(fleet.server.python, fleet.server.module),
                                 describe="SGLang version", check=False, timeout_s=60)
    version = out.strip().splitlines()[-1] if status == 0 and out.strip() else None
    return (version, None) if version else (None, (err or out).strip()[-300:] or f"exit {status}")


def running_server_info(slot: ServerSlot, key: str | None, timeout_s: float = 10.0) -> tuple[dict | None, str | None]:
    """(``/server_info`` of the server on the slot, None) when ``/health`` is 200, else (None, why not)."""
    import httpx

    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        with httpx.Client(base_url=slot.url, timeout=timeout_s, headers=headers) as http:
            health = http.get("/health")
            if health.status_code != 200:
                return None, f"/health answered HTTP {health.status_code}"
            info = http.get("/server_info")
            if info.status_code != 200:
                return None, f"/server_info answered HTTP {info.status_code}"
            return info.json(), None
    except (httpx.HTTPError, ValueError) as exc:
        return None, f"{type(exc).__name__}: {exc}"


def keep_or_relaunch(shell: NodeShell, fleet: FleetSpec, node: str, plans: list[dict], *, force: bool,
                     key: str | None) -> list[dict]:
    """Per server of the node: keep the one of ours already running tonight's plan, else relaunch.

    Returns ``{"server", "port", "decision": "keep"|"relaunch", "reasons", "pid"}`` per slot; a kept
    server's pid is the running one. Nothing is stopped here (see ``stop_ports``).
    """
    slots = [slot for slot in fleet.servers() if slot.node == node]
    _, out, _ = shell.run(remote.our_pids_command(run_dir=fleet.server.run_dir, module=fleet.server.module,
                                                  ports=[slot.port for slot in slots]), describe="our servers")
    ours = {port: pid for pid, port in probe.parse_our_pids(out).items()}
    version, version_unknown = (None, "not needed") if force or not ours else installed_version(shell, fleet)
    plan_by_port = {(p["host"], p["port"]): p for p in plans}
    decisions = []
    for slot in slots:
        decision = {"server": slot.name, "port": slot.port, "pid": ours.get(slot.port)}
        if slot.port not in ours:
            reasons = ["no server of ours runs on the port"]
        elif force:
            reasons = ["relaunch_servers is set"]
        else:
            info, why = running_server_info(slot, key)
            if info is None:
                reasons = [f"not healthy: {why}"]
            else:
                spec = launch_spec(fleet, slot, plan_by_port[(slot.node, slot.port)], with_api_key=False,
                                   run_id=None)
                reasons = readiness.launch_differences(info, readiness.args_as_flags(spec.argv()[3:]),
                                                       expected_version=version)
                if version is None:
                    log.warning("%s: installed SGLang version unknown (%s); compared flags and model only",
                                slot.name, version_unknown)
        decisions.append({**decision, "decision": "relaunch" if reasons else "keep", "reasons": reasons})
    return decisions
