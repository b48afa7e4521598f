"""The trigger form's Params, through the REST API of a running Airflow: invalid values are refused with the reason."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.slow
PROJECT_ROOT = Path(__file__).resolve().parents[2]
DAG_ID = "sglang_generation"


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    from devstack.sessions import STOP_GRACE_S, terminate_sessions
    from sglang_sim.sshd import free_port, wait_for_port

    home = tmp_path_factory.mktemp("airflow-api")
    port = free_port()
    env = {**os.environ, "AIRFLOW_HOME": str(home), "AIRFLOW__CORE__DAGS_FOLDER": str(PROJECT_ROOT / "dags"),
           "AIRFLOW__CORE__LOAD_EXAMPLES": "False", "AIRFLOW__API__PORT": str(port),
           "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{port}", "AIRFLOW__API__WORKERS": "1",
           "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin"}
    airflow = str(Path(sys.executable).parent / "airflow")
    subprocess.run([airflow, "db", "migrate"], env=env, check=True, capture_output=True)
    subprocess.run([airflow, "dags", "reserialize"], env=env, check=True, capture_output=True)
    (home / "simple_auth_manager_passwords.json.generated").write_text(json.dumps({"admin": "secret-pw"}))
    log = (home / "api-server.log").open("wb")
    server = subprocess.Popen([airflow, "api-server", "--port", str(port), "--host", "127.0.0.1"], env=env,
                              stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for_port("127.0.0.1", port, timeout_s=120)
        base = f"http://127.0.0.1:{port}"
        # the first answers of an API server on a busy machine can take many seconds: each call and the whole
        # wait are capped generously, and the wait ends with the first token
        deadline = time.monotonic() + 300
        response = None
        while True:
            try:
                response = httpx.post(f"{base}/auth/token", json={"username": "admin", "password": "secret-pw"},
                                      timeout=60)
            except httpx.TimeoutException:
                pass
            if response is not None and response.status_code in (200, 201):
                break
            assert time.monotonic() < deadline, f"no token from the API server in 300 s (last: {response})"
            time.sleep(1)
        client = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {response.json()['access_token']}"},
                              timeout=120)
        yield client
        client.close()
    finally:
        terminate_sessions([server.pid], signal.SIGTERM, STOP_GRACE_S)
        server.wait(timeout=10)


def _trigger(api, conf):
    return api.post(f"/api/v2/dags/{DAG_ID}/dagRuns", json={"logical_date": None, "conf": conf})


@pytest.mark.parametrize("conf, reason", [
    ({"max_tokens": 0}, "max_tokens"),
    ({"tuning": "fastest"}, "tuning"),
    ({"headroom": 9}, "headroom"),
    ({"prompts_path": ""}, "prompts_path"),
    ({"dry_run": "yes"}, "dry_run"),
])
def test_invalid_params_are_refused_with_the_reason(api, conf, reason):
    response = _trigger(api, conf)
    assert response.status_code == 400, response.text
    assert reason in response.text


def test_valid_params_create_a_run(api):
    response = _trigger(api, {"dry_run": True, "max_tokens": 2048})
    assert response.status_code == 200, response.text
    assert response.json()["conf"]["max_tokens"] == 2048


def test_form_exposes_titles_descriptions_and_bounds(api):
    params = {}
    details = api.get(f"/api/v2/dags/{DAG_ID}/details").json()
    params = details["params"]
    for name, param in params.items():
        schema = param["schema"]
        assert schema.get("title") and param.get("description"), name
    assert params["max_tokens"]["schema"]["minimum"] == 1
