"""The production-shaped stack's pure parts: what is missing is named, secrets are shared, each worker differs
only where it must."""

import socket
import subprocess
import sys
import time

import pytest

from sglang_sim import prod
from sglang_sim.demo import SimEnvironment


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


def test_every_component_shares_the_deployment_settings_and_workers_differ_only_in_name_and_log_port(tmp_path):
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
    assert differing == {prod.HOSTNAME_ENV, "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT"}
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
        deadline = time.monotonic() + 20
        while len(prod.session_members(leader.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        members = prod.session_members(leader.pid)
        assert len(members) == 2 and leader.pid in members
    finally:
        for pid in prod.session_members(leader.pid):
            subprocess.run(["kill", "-9", str(pid)], check=False)
        leader.wait(timeout=10)
