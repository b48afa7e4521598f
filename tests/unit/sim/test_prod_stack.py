"""The production-shaped stack's pure parts: what is missing is named, secrets are shared, each worker differs
only where it must."""

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from devstack import prod, sessions
from devstack.demo import SimEnvironment


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]  # released on close: nothing listens there


def test_a_missing_service_is_named_with_how_to_start_it():
    with pytest.raises(prod.ServiceMissing) as missing:
        prod.check_services(f"postgresql://root@127.0.0.1:{_closed_port()}/postgres", "redis://127.0.0.1:6379/0")
    assert str(missing.value).startswith("PostgreSQL is not reachable at 127.0.0.1:")
    assert "apt-get install postgresql" in str(missing.value) and "FLEETGEN_PG_ADMIN_URL" in str(missing.value)


def test_secrets_are_generated_once_private_and_a_valid_fernet_key(tmp_path):
    from cryptography.fernet import Fernet

    path = tmp_path / "airflow" / "secrets.json"
    first = prod.shared_secrets(path)
    assert prod.shared_secrets(path) == first and path.stat().st_mode & 0o777 == 0o600
    Fernet(first["fernet_key"].encode())  # raises on an invalid key
    assert len({first["jwt_secret"], first["api_secret_key"], first["fernet_key"]}) == 3


def test_every_component_shares_the_deployment_settings_and_workers_differ_only_in_name_log_port_and_scratch(tmp_path):
    environment = SimEnvironment(root=tmp_path, nodes=2, gpus_per_node=1)
    environment.ssh_ports, environment.base_port = [2201, 2202], 30000
    (tmp_path / "api_key").write_text("k")
    stack = prod.ProdStack(environment=environment, database="fleetgen_unit", queue="q1", api_port=18080)
    shared = stack.env()
    assert shared["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor"
    assert shared["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].endswith("/fleetgen_unit")
    assert shared["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"] == "http://127.0.0.1:18080/execution/"
    assert int(shared["AIRFLOW__CELERY_BROKER_TRANSPORT_OPTIONS__VISIBILITY_TIMEOUT"]) > 3600
    assert int(shared["AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT"]) < 300
    workers = [stack.worker_env(index) for index in range(2)]
    differing = {key for key in set(workers[0]) | set(workers[1]) if workers[0].get(key) != workers[1].get(key)}
    assert differing == {prod.HOSTNAME_ENV, "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT", "FLEETGEN_SCRATCH_DIR"}
    assert workers[0]["FLEETGEN_SCRATCH_DIR"] != workers[1]["FLEETGEN_SCRATCH_DIR"]  # a scratch folder of its own
    ports = {int(w["AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT"]) for w in workers}
    assert len(ports) == 2 and int(shared["AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT"]) not in ports
    for key in ("AIRFLOW__API_AUTH__JWT_SECRET", "AIRFLOW__API__SECRET_KEY", "AIRFLOW__CORE__FERNET_KEY"):
        assert workers[0][key] == workers[1][key] == shared[key]


def test_a_killed_component_takes_the_processes_of_its_whole_session():
    # A shell (session leader) whose child moves to a process group of its own, as Airflow's task processes do.
    leader = subprocess.Popen([sys.executable, "-c", "import os, subprocess, sys, time\n"
                               "subprocess.Popen([sys.executable, '-c', 'import os, time; os.setpgid(0, 0); "
                               "time.sleep(60)'])\ntime.sleep(60)"], start_new_session=True)
    try:
        deadline = time.monotonic() + 60  # ends when the child has started (two fresh pythons on a busy machine)
        while len(sessions.session_members(leader.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        members = sessions.session_members(leader.pid)
        assert len(members) == 2 and leader.pid in members
    finally:
        for pid in sessions.session_members(leader.pid):
            subprocess.run(["kill", "-9", str(pid)], check=False)
        leader.wait(timeout=10)


def _session(code: str) -> subprocess.Popen:
    leader = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, start_new_session=True)
    assert leader.stdout.readline() == b"ready\n"
    return leader


def test_a_component_that_exits_on_sigterm_is_not_waited_for_and_what_it_left_behind_is_killed():
    # The leader exits at once (a zombie until reaped); its child, in a process group of its own, ignores SIGTERM.
    leader = _session("import signal, subprocess, sys, time\n"
                      "child = subprocess.Popen([sys.executable, '-c', 'import os, signal, time; os.setpgid(0, 0); "
                      "signal.signal(signal.SIGTERM, signal.SIG_IGN); print(1, flush=True); time.sleep(120)'], "
                      "stdout=subprocess.PIPE)\n"
                      "child.stdout.readline(); print('ready', flush=True); time.sleep(120)")
    members = sessions.session_members(leader.pid)
    assert len(members) == 2
    assert sessions.terminate_sessions([leader.pid], grace_s=20) == []
    assert leader.wait(timeout=10) == -15
    deadline = time.monotonic() + 60  # ends when the killed members are gone
    while sessions.session_members(leader.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert sessions.session_members(leader.pid) == []


# Airflow 3.3's scheduler on SIGTERM: the handler logs, and when the signal lands inside a log write it
# waits on the (non-reentrant) lock that very write holds. Here the main thread holds the lock outright.
STUCK_IN_SIGTERM_HANDLER = ("import signal, threading, time\n"
                            "lock = threading.Lock()\n"
                            "signal.signal(signal.SIGTERM, lambda *_: lock.acquire())\n"
                            "with lock:\n"
                            "    print('ready', flush=True)\n"
                            "    while True:\n"
                            "        time.sleep(0.05)\n")


def test_a_component_stuck_in_its_sigterm_handler_is_named_and_killed_after_the_grace():
    leader = _session(STUCK_IN_SIGTERM_HANDLER)
    assert sessions.terminate_sessions([leader.pid], grace_s=1) == [leader.pid]
    assert leader.wait(timeout=10) == -9


def test_a_stack_component_stuck_on_sigterm_is_reported_with_its_log(tmp_path, capsys):
    stack = prod.ProdStack(environment=SimEnvironment(root=tmp_path, nodes=1, gpus_per_node=1))
    stack.processes["scheduler"] = _session(STUCK_IN_SIGTERM_HANDLER)
    assert stack.kill("scheduler", signal.SIGTERM, grace_s=1) is False
    assert stack.processes["scheduler"].returncode == -9
    error = capsys.readouterr().err
    assert error.startswith("scheduler did not exit within 1 s of SIGTERM: killed (SIGKILL)")
    assert str(tmp_path / "logs" / "scheduler.log") in error


def _state(pid: int) -> str:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2]


# A leader whose child moved to a process group of its own (an Airflow task process in a worker's session).
LEADER_AND_CHILD = ("import subprocess, sys, time\n"
                    "child = subprocess.Popen([sys.executable, '-c', 'import os, time; os.setpgid(0, 0); "
                    "print(1, flush=True); time.sleep(120)'], stdout=subprocess.PIPE)\n"
                    "child.stdout.readline(); print('ready', flush=True); time.sleep(120)")


def test_a_held_component_is_stopped_in_every_process_of_its_session_until_the_block_ends(tmp_path):
    stack = prod.ProdStack(environment=SimEnvironment(root=tmp_path, nodes=1, gpus_per_node=1))
    stack.processes["worker-a"] = leader = _session(LEADER_AND_CHILD)
    try:
        members = sessions.session_members(leader.pid)
        assert len(members) == 2
        with stack.held("worker-a"):
            assert {pid: _state(pid) for pid in members} == {pid: "T" for pid in members}
        assert all(_state(pid) != "T" for pid in members)
        with pytest.raises(AssertionError), stack.held("worker-a"):  # a failed check inside lets it go on too
            raise AssertionError("seen while held")
        assert all(_state(pid) != "T" for pid in members)
        with stack.held("worker-a"):
            assert stack.kill("worker-a") is True  # killed while held: nothing is left to let go on
        assert leader.returncode == -9
    finally:
        sessions.terminate_sessions([leader.pid], grace_s=0)
        leader.wait(timeout=10)
