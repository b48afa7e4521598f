"""A simulated node behind a real SSH server.

The deferred readiness wait over an SSH server that goes away: killed and restarted while the server
loads (the wait reconnects and succeeds), killed for good (the wait fails naming the host, the server
and the reconnect budget spent), or answering with another host key (never retried). And the API key:
in no process's command line on the node, in a 0600 file, still the bearer token the server wants.
"""

import asyncio
import json
import os
import signal
import stat
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
from devstack.sessions import hold_sessions, release_sessions

pytestmark = pytest.mark.slow

CONN_ID = "resilience_node0"


def _connection(environment, host_key: str) -> str:
    return json.dumps({"conn_type": "ssh", "host": "127.0.0.1", "port": environment.ssh_ports[0], "login": "fleetgen",
                       "extra": {"key_file": str(environment.key_dir / "id_ed25519"), "host_key": host_key,
                                 "look_for_keys": False}})


@pytest.fixture
def node(tmp_path, monkeypatch):
    """One simulated GPU whose server takes 8 s to load, behind its own SSH server (the tests kill it)."""
    from devstack.demo import SimEnvironment
    from sglang_sim.sshd import ensure_keys

    environment = SimEnvironment(root=tmp_path / "fleet", gpus_per_node=1, prompts=10,
                                 sim={"time_scale": 100.0, "load_seconds": 8.0}).prepare().start()
    monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}",
                       _connection(environment, ensure_keys(environment.key_dir).host_public_key))
    yield environment
    environment.stop()


def _fleet(environment, **server):
    from fleetgen.nodes.fleet import parse_fleet

    return parse_fleet({
        "model": {"path": str(environment.model_dir), "served_name": "qwen3.6-27b"},
        "server": {"python": sys.executable, "module": "sglang_sim.server", "bind_host": "127.0.0.1",
                   "stop_grace_s": 5, **server},
        "nodes": [{"name": "node0", "ssh_conn_id": CONN_ID, "address": "127.0.0.1", "gpus": [0],
                   "base_port": environment.base_port}]})


def _launch(environment) -> dict:
    from fleetgen.airflow.node_shell import NodeShell
    from fleetgen.airflow.lifecycle import launch_server

    fleet = _fleet(environment)
    with NodeShell("node0", CONN_ID) as shell:
        return launch_server(shell, fleet, fleet.servers()[0], {"flags": {}}, None, run_id="manual__e2e")


def _trigger(launched: dict, **budget):
    from fleetgen.airflow.triggers import ReadinessTrigger

    return ReadinessTrigger(server={k: launched[k] for k in ("node", "name", "url", "port", "gpu_ids")},
                            ssh_conn_id=CONN_ID, log_path=launched["log_path"], pid=launched["pid"],
                            watch={"timeout_s": 120, "poll_s": 0.5, "resume_settle_s": 0.0, **budget},
                            context={"launched": launched, "attempt": 0})  # the hold: tests/unit/airflow/test_triggers_resume_hold.py


async def _first_event(trigger) -> dict:
    async for event in trigger.run():
        return event.payload
    raise AssertionError("the trigger ended without an event")


async def _wait_with_outage(environment, trigger, launched, *, down_at_s: float, down_for_s: float | None) -> dict:
    """Run the trigger; kill the node's sshd after down_at_s, start it again after down_for_s (None: never).
    The server is held meanwhile (``_held_loading``): it is still loading whenever SSH goes."""

    async def outage():
        await asyncio.sleep(down_at_s)
        environment.kill_sshd(0)
        if down_for_s is not None:
            await asyncio.sleep(down_for_s)
            await asyncio.to_thread(environment.restart_sshd, 0)
            release_sessions([launched["pid"]])

    with _held_loading(launched):
        disruption = asyncio.ensure_future(outage())
        try:
            return await _first_event(trigger)
        finally:
            await disruption


@contextmanager
def _held_loading(launched: dict):
    """The launched server held (SIGSTOP to its session: ``setsid`` made it a session leader) from now until it is
    let go on (``release_sessions``) or the block ends: it loads nothing meanwhile, so a disruption the test
    starts lands while it loads, however slowly the machine runs. A held server's process is alive and its
    port unbound, as a loading one's."""
    hold_sessions([launched["pid"]])
    try:
        yield
    finally:
        release_sessions([launched["pid"]])


def _reconnect_lines(capfd, caplog) -> list[str]:
    """The trigger's reconnect warnings, wherever Airflow's logging sent them (terminal or records)."""
    out, err = capfd.readouterr()
    return [line for line in (out + err + caplog.text).splitlines() if "SSH to node0 lost while waiting for" in line]


def test_wait_reconnects_after_the_ssh_server_is_killed_and_restarted(node, capfd, caplog):
    launched = _launch(node)
    trigger = _trigger(launched)
    caplog.set_level("WARNING")
    event = asyncio.run(_wait_with_outage(node, trigger, launched, down_at_s=1.5, down_for_s=3.0))
    assert event["status"] == "ready", event
    assert event["server_info"]["internal_states"][0]["effective_max_running_requests_per_dp"] > 0
    reconnects = _reconnect_lines(capfd, caplog)
    assert reconnects and "reconnect 1 of 8" in reconnects[0], reconnects
    print(f"readiness survived the outage after {len(reconnects)} reconnect(s), ready after {event['waited_s']} s")


def test_a_wedged_ssh_server_times_the_command_out_and_the_wait_goes_on(node, capfd, caplog):
    launched = _launch(node)
    trigger = _trigger(launched, command_timeout_s=1.0)

    async def wedge():
        await asyncio.sleep(1.5)
        node.signal_sshd(signal.SIGSTOP)  # the connection stays up; nothing answers on it
        await asyncio.sleep(4.0)
        node.signal_sshd(signal.SIGCONT)
        release_sessions([launched["pid"]])

    async def wait():
        disruption = asyncio.ensure_future(wedge())
        try:
            return await _first_event(trigger)
        finally:
            await disruption

    with _held_loading(launched):
        event = asyncio.run(wait())
    assert event["status"] == "ready", event
    reconnects = _reconnect_lines(capfd, caplog)
    assert any("TimeoutError" in line for line in reconnects), reconnects


def test_wait_fails_naming_host_server_and_budget_when_the_node_stays_away(node, capfd, caplog):
    from fleetgen.airflow.operators import WaitReadyOperator
    from fleetgen.errors import HostUnreachable

    launched = _launch(node)
    trigger = _trigger(launched, reconnect_attempts=3, reconnect_budget_s=60.0)
    caplog.set_level("WARNING")
    event = asyncio.run(_wait_with_outage(node, trigger, launched, down_at_s=1.0, down_for_s=None))
    assert event["status"] == "unreachable", event
    # The server was still loading when SSH went: the wait could not know it would come up, so it fails.
    assert event["budget"]["failures"] == 4 and event["budget"]["attempts"] == 3
    assert len(_reconnect_lines(capfd, caplog)) == 3
    operator = WaitReadyOperator(task_id="wait_ready", server=launched, fleet=_fleet(node).to_dict())
    with pytest.raises(HostUnreachable) as failure:
        operator.execute_complete({}, event)
    message = str(failure.value)
    assert f"[host node0, server {launched['name']}]" in message
    assert f"lost SSH to node0 while waiting for {launched['name']}" in message
    assert "4 failed connection(s) over" in message and "(budget: 3 reconnects, 60 s)" in message
    assert "ssh_reconnect_attempts" in message  # the hint names what to raise
    print(f"gave up after {event['budget']['spent_s']} s of reconnecting: {message}")


def test_a_hostile_model_path_read_over_ssh_runs_nothing_and_is_named_intact(node, tmp_path):
    """The issue's reproduction, through the real SSH server: a model path that does not exist."""
    from fleetgen.airflow.node_shell import NodeShell
    from fleetgen.errors import RemoteError
    from fleetgen.nodes import remote

    canary = tmp_path / "pwned"
    for model_path in (f"/tmp/x $(touch {canary})", f'/tmp/x"; touch {canary}; "', f"/tmp/x`touch {canary}`\n"):
        path = f"{model_path}/config.json"
        with NodeShell("node0", CONN_ID) as shell:
            status, out, err = shell.run(remote.read_file_command(path), check=False)
            assert (status, out, err) == (4, "", f"cannot read {path}\n")
            with pytest.raises(RemoteError) as failed:
                shell.run(remote.read_file_command(path), describe=f"read {path}")
        assert f"cannot read {path}" in str(failed.value) and not canary.exists()


def test_a_connection_that_does_not_exist_ends_the_wait_at_once():
    from fleetgen.airflow.triggers import ReadinessTrigger

    trigger = ReadinessTrigger(server={"node": "node0", "name": "node0:1", "url": "http://127.0.0.1:1"},
                               ssh_conn_id="no_such_connection", log_path="/x.log", pid=1,
                               watch={"timeout_s": 60, "poll_s": 0.1, "resume_settle_s": 0.0})
    event = asyncio.run(_first_event(trigger))
    assert event["status"] == "unreachable" and "cannot open SSH connection 'no_such_connection'" in event["error"]


def test_wait_fails_at_once_on_a_host_key_mismatch_with_both_fingerprints(node, monkeypatch):
    import asyncssh

    from airflow.sdk.exceptions import AirflowFailException
    from fleetgen.airflow.operators import WaitReadyOperator
    from fleetgen.errors import HostKeyMismatch

    launched = _launch(node)
    impostor = " ".join(asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode().split()[:2])
    monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", _connection(node, impostor))
    event = asyncio.run(_first_event(_trigger(launched)))
    assert event["status"] == "host_key_mismatch", event
    expected = _ssh_keygen_fingerprint(impostor, node.root / "impostor.pub")
    received = _ssh_keygen_fingerprint((node.key_dir / "ssh_host_ed25519_key.pub").read_text(),
                                       node.root / "host.pub")
    assert event["expected"] == f"ssh-ed25519 {expected}" and event["received"] == f"ssh-ed25519 {received}"
    operator = WaitReadyOperator(task_id="wait_ready", server=launched, fleet=_fleet(node).to_dict())
    with pytest.raises(AirflowFailException) as failure:  # no retry
        operator.execute_complete({}, event)
    assert isinstance(failure.value.__cause__, HostKeyMismatch)
    assert expected in str(failure.value) and received in str(failure.value) and "[host node0]" in str(failure.value)


def _ssh_keygen_fingerprint(public_line: str, path) -> str:
    """What OpenSSH prints for a key: ``ssh-keygen -lf`` -> ``SHA256:...``."""
    path.write_text(public_line.strip() + "\n")
    listed = subprocess.run(["ssh-keygen", "-lf", str(path)], capture_output=True, text=True, check=True).stdout
    return listed.split()[1]


def _command_lines_holding(secret: bytes) -> tuple[int, list[str]]:
    """How many processes' command lines were read, and those that hold ``secret``."""
    read, holding = 0, []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            data = cmdline.read_bytes()
        except OSError:  # the process ended meanwhile
            continue
        read += 1
        if secret in data:
            program = data.split(b"\0")[0].decode(errors="replace")  # never the secret itself in a report
            holding.append(f"pid {cmdline.parent.name} ({program})")
    return read, holding


def test_the_api_key_is_in_no_command_line_on_the_node(node, monkeypatch):
    import httpx

    from fleetgen.airflow.node_shell import NodeShell
    from fleetgen.airflow.lifecycle import api_key, launch_server, stop_ports

    key = "sk-" + os.urandom(16).hex()
    monkeypatch.setenv("AIRFLOW_CONN_NODE_API_KEY", json.dumps({"conn_type": "generic", "password": key}))
    fleet = _fleet(node, api_key_conn_id="node_api_key")
    slot = fleet.servers()[0]
    with NodeShell("node0", CONN_ID) as shell:
        launched = launch_server(shell, fleet, slot, {"flags": {}}, api_key(fleet), run_id="manual__e2e")
        scanned, deadline, status = 0, time.monotonic() + 60, None
        while status != 200 and time.monotonic() < deadline:  # every command line, while it loads and once up
            read, holding = _command_lines_holding(key.encode())
            assert not holding, holding
            scanned += read
            status = httpx.get(f"{slot.url}/health", timeout=2).status_code if _port_open(slot.port) else None
            time.sleep(0.2)
        assert key.encode() not in Path(f"/proc/{launched['pid']}/environ").read_bytes()
        config = node.node_dir(0) / "home" / "fleetgen" / "run" / f"sglang-{slot.port}.yaml"
        assert stat.S_IMODE(config.stat().st_mode) == 0o600
        assert httpx.get(f"{slot.url}/model_info", timeout=5).status_code == 401
        authorised = httpx.get(f"{slot.url}/model_info", headers={"Authorization": f"Bearer {key}"}, timeout=5)
        assert authorised.status_code == 200, authorised.text
        assert key not in launched["command"]
        stop_ports(shell, fleet, [slot.port])
    assert not config.exists()  # stopping removes the key's file with the pid file
    print(f"read {scanned} process command lines on the node while the server loaded: none held the key")


def _port_open(port: int) -> bool:
    import socket

    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0
