"""A running Airflow API server for the tests of this folder: its own home and metadata DB, our DAG serialized, the
simple auth manager's users signed in, one HTTP client per user."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

PROJECT_ROOT = Path(__file__).resolve().parents[2]
DAG_ID = "sglang_generation"
API_CAP_S = 300  # the first answers of an API server on a busy 2-core machine take many seconds


@dataclass
class ApiServer:
    home: Path
    base: str
    clients: dict[str, httpx.Client]  # by user name, each with its bearer token


def _token(base: str, user: str, password: str) -> str:
    """A user's token, once the API server answers (each call and the whole wait capped generously)."""
    deadline = time.monotonic() + API_CAP_S
    response = None
    while True:
        try:
            response = httpx.post(f"{base}/auth/token", json={"username": user, "password": password}, timeout=60)
        except httpx.TransportError:
            pass
        if response is not None and response.status_code in (200, 201):
            return response.json()["access_token"]
        assert time.monotonic() < deadline, f"no token for {user} in {API_CAP_S} s (last: {response})"
        time.sleep(1)


@contextmanager
def api_server(root: Path, users: dict[str, tuple[str, str]], *, dags_folder: Path | None = None,
               env: dict[str, str] | None = None, plugins: bool = False) -> Iterator[ApiServer]:
    """An API server under ``root`` serving ``dags_folder`` (default: the project's ``dags/``), ``users`` (name ->
    (role, password)) signed in, ``env`` over this process's environment, the results plugin when ``plugins``."""
    from devstack.sessions import STOP_GRACE_S, terminate_sessions
    from sglang_sim.sshd import free_port, wait_for_port

    home = root / "airflow"
    home.mkdir(parents=True, exist_ok=True)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    server_env = {**os.environ, "AIRFLOW_HOME": str(home),
                  "AIRFLOW__CORE__DAGS_FOLDER": str(dags_folder or PROJECT_ROOT / "dags"),
                  "AIRFLOW__CORE__LOAD_EXAMPLES": "False", "AIRFLOW__API__PORT": str(port),
                  "AIRFLOW__API__BASE_URL": base, "AIRFLOW__API__WORKERS": "1",
                  "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": ",".join(
                      f"{name}:{role}" for name, (role, _) in users.items()),
                  **({"AIRFLOW__CORE__PLUGINS_FOLDER": str(PROJECT_ROOT / "plugins")} if plugins else {}),
                  **(env or {})}
    airflow_cli = str(Path(sys.executable).parent / "airflow")
    subprocess.run([airflow_cli, "db", "migrate"], env=server_env, check=True, capture_output=True)
    subprocess.run([airflow_cli, "dags", "reserialize"], env=server_env, check=True, capture_output=True)
    (home / "simple_auth_manager_passwords.json.generated").write_text(
        json.dumps({name: password for name, (_, password) in users.items()}))
    log = (home / "api-server.log").open("wb")
    server = subprocess.Popen([airflow_cli, "api-server", "--port", str(port), "--host", "127.0.0.1"],
                              env=server_env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    clients: dict[str, httpx.Client] = {}
    try:
        wait_for_port("127.0.0.1", port, timeout_s=120)
        for name, (_, password) in users.items():
            clients[name] = httpx.Client(base_url=base, timeout=120,
                                         headers={"Authorization": f"Bearer {_token(base, name, password)}"})
        yield ApiServer(home=home, base=base, clients=clients)
    finally:
        for client in clients.values():
            client.close()
        terminate_sessions([server.pid], signal.SIGTERM, STOP_GRACE_S)
        server.wait(timeout=10)
        log.close()
