"""End-to-end fixtures: a simulated GPU node behind a real SSH server, a real Airflow metadata DB."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

PROJECT_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def airflow_db():
    """A migrated SQLite metadata DB in the test run's own AIRFLOW_HOME."""
    home = Path(os.environ["AIRFLOW_HOME"])
    if not (home / "airflow.db").exists():
        subprocess.run([str(Path(sys.executable).parent / "airflow"), "db", "migrate"], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return home


def _require_openssh() -> None:
    from sglang_sim import openssh

    if not openssh.available():
        message = f"OpenSSH's sshd is not installed: {openssh.INSTALL_HINT}"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"CI must provide it: {message}", pytrace=False)
        pytest.skip(message)


@pytest.fixture(scope="module", params=["embedded", "openssh"])
def ssh_server(request) -> str:
    """Which SSH server the simulated nodes sit behind: the embedded asyncssh one or a real OpenSSH sshd."""
    if request.param == "openssh":
        _require_openssh()
    return request.param


@pytest.fixture(scope="module")
def sim_env(tmp_path_factory, airflow_db, ssh_server):
    """One simulated 2 x B200 node reachable over SSH, with the settings of airflow_settings.yaml applied."""
    from devstack.demo import SimEnvironment

    environment = SimEnvironment(root=tmp_path_factory.mktemp("fleet"), gpus_per_node=2, prompts=120,
                                 sim={"time_scale": 400.0, "load_seconds": 4.0}, ssh_server=ssh_server).prepare().start()
    try:
        with environment.airflow_settings_applied():
            yield environment
    finally:
        environment.stop()


@pytest.fixture
def fleet_file(sim_env, tmp_path):
    """Write the committed fleet (the settings' Variable) narrowed to the environment's GPUs; returns a writer."""

    def write(**server_overrides) -> Path:
        fleet = yaml.safe_load(os.environ["AIRFLOW_VAR_FLEETGEN_FLEET"])
        fleet["nodes"][0]["gpus"] = list(range(sim_env.gpus_per_node))
        fleet["server"].update(server_overrides)
        path = tmp_path / "fleet.json"
        path.write_text(json.dumps(fleet))
        return path

    return write


@pytest.fixture(scope="module")
def dag():
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(PROJECT_ROOT / "dags"))
    assert bag.import_errors == {}
    return bag.dags["sglang_generation"]


@pytest.fixture(scope="session")
def production_services() -> None:
    """PostgreSQL and Redis for the production-stack tests: skipped with what is missing and how to start
    it on a developer's machine, a failure under CI (CI=true), which always has them."""
    from devstack.prod import ServiceMissing, check_services

    try:
        check_services()
    except ServiceMissing as missing:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"CI must provide this service: {missing}", pytrace=False)
        pytest.skip(str(missing))
