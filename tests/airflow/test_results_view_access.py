"""The results view (plugins/fleetgen_results.py) on a running Airflow API server, signed in with the simple auth
manager as a user who may trigger runs (role *user*) and one who may only look (role *viewer*): a run serves the
files of its folder in the deployment's output root, and nothing a triggering user chooses (the DAG parameter
``output_root``, the run id, another DAG) reaches a file outside it."""

import json
import shutil

import httpx
import pytest

from fleetgen.outputs import RunLayout
from tests.airflow.api_server import DAG_ID, PROJECT_ROOT, api_server

pytestmark = pytest.mark.slow
OTHER_DAG_ID = "fleetgen_other_dag"
USERS = {"admin": ("admin", "admin-pw"), "trigger": ("user", "trigger-pw"), "watcher": ("viewer", "watcher-pw")}
LEGIT_RUN = "manual__2026-05-01T02:00:00+00:00"
REPORT = "# Report of the legitimate run\n\n| server | cap |\n|---|---|\n| node0:30000 | 71 |\n"


def _other_dag_file() -> str:
    return ("import pendulum\nfrom airflow.sdk import DAG\nfrom airflow.providers.standard.operators.empty import "
            f"EmptyOperator\nwith DAG({OTHER_DAG_ID!r}, schedule=None, start_date=pendulum.datetime(2026, 1, 1)):\n"
            "    EmptyOperator(task_id='nothing')\n")


@pytest.fixture(scope="module")
def airflow(tmp_path_factory):
    """An API server with our DAG, a second DAG and the results plugin; ``clients`` by user name."""
    root = tmp_path_factory.mktemp("results-view")
    dags, output_root = root / "dags", root / "fleetgen-output"
    for folder in (dags, output_root):
        folder.mkdir()
    shutil.copy(PROJECT_ROOT / "dags" / "sglang_generation.py", dags)
    (dags / "other_dag.py").write_text(_other_dag_file())
    with api_server(root, USERS, dags_folder=dags, plugins=True,
                    env={"FLEETGEN_OUTPUT_ROOT": str(output_root)}) as server:
        (server.home / "airflow.cfg").touch()  # the file the issue read through the view, whatever Airflow wrote
        yield {"home": server.home, "output_root": output_root, "clients": server.clients, "base": server.base}


def _trigger(client, run_id: str, conf: dict, dag_id: str = DAG_ID) -> None:
    response = client.post(f"/api/v2/dags/{dag_id}/dagRuns",
                           json={"dag_run_id": run_id, "logical_date": None, "conf": conf})
    assert response.status_code == 200, response.text


def _view(client, dag_id: str, run_id: str, page: str) -> httpx.Response:
    # "." and ".." escaped, or the client would fold them into the path before sending it
    segment = {".": "%2E", "..": "%2E%2E"}.get(run_id, run_id.replace(":", "%3A").replace("+", "%2B"))
    return client.get(f"/fleetgen/runs/{dag_id}/{segment}/{page}")


@pytest.fixture(scope="module")
def runs(airflow):
    """Triggered by the user who may trigger (the viewer may not); the legitimate run's report written by hand
    where the run would write it (no scheduler runs them)."""
    trigger = airflow["clients"]["trigger"]
    _trigger(trigger, LEGIT_RUN, {"output_root": str(airflow["output_root"])})  # the form sends every param
    _trigger(trigger, "plain", {})
    _trigger(trigger, "etc", {"output_root": "/"})
    _trigger(trigger, "airflow", {"output_root": str(airflow["home"].parent)})
    _trigger(trigger, ".", {})
    _trigger(trigger, "plain", {}, dag_id=OTHER_DAG_ID)
    for run_id in (LEGIT_RUN, "plain"):
        layout = RunLayout.for_run(airflow["output_root"], run_id)
        layout.report_dir.mkdir(parents=True)
        (layout.report_dir / "report.md").write_text(REPORT)
    (airflow["output_root"] / "calibration.json").write_text('{"shared": "by every run of the output root"}')
    return airflow


def test_the_viewer_may_not_trigger_a_run(airflow):
    response = airflow["clients"]["watcher"].post(f"/api/v2/dags/{DAG_ID}/dagRuns",
                                                  json={"dag_run_id": "by_viewer", "logical_date": None, "conf": {}})
    assert response.status_code == 403, response.text


@pytest.mark.parametrize("user", ["trigger", "watcher"])
def test_a_run_of_the_deployments_output_root_is_served_to_whoever_may_read_the_dag(runs, user):
    for run_id in (LEGIT_RUN, "plain"):
        response = _view(runs["clients"][user], DAG_ID, run_id, "files/report/report.md")
        assert response.status_code == 200, (run_id, response.text)
        assert "Report of the legitimate run" in response.text and "<table>" in response.text


def test_the_view_needs_a_signed_in_user(runs):
    response = httpx.get(f"{runs['base']}/fleetgen/runs/{DAG_ID}/plain/files/report/report.md", timeout=120)
    assert response.status_code == 401, response.text


@pytest.mark.parametrize("user", ["trigger", "watcher"])
@pytest.mark.parametrize("run_id, page", [
    ("etc", "files/passwd"),
    ("airflow", "files/airflow.cfg"),
    ("airflow", "files/simple_auth_manager_passwords.json.generated"),
    ("etc", "failures"),
])
def test_a_run_whose_conf_names_another_output_root_is_not_served(runs, user, run_id, page):
    response = _view(runs["clients"][user], DAG_ID, run_id, page)
    assert response.status_code == 404, response.text
    detail = response.json()["detail"]
    assert "outside the deployment's output root" in detail and "output_root" in detail
    assert "FLEETGEN_OUTPUT_ROOT" in detail
    assert "root:x:0" not in response.text and "admin-pw" not in response.text


@pytest.mark.parametrize("user", ["trigger", "watcher"])
@pytest.mark.parametrize("page", ["files/calibration.json", "files/plain/report/report.md", "failures"])
def test_a_run_id_that_is_not_a_plain_folder_name_is_not_served(runs, user, page):
    response = _view(runs["clients"][user], DAG_ID, ".", page)
    assert response.status_code == 404, response.text
    assert "'.'" in response.json()["detail"] and "shared" not in response.text


@pytest.mark.parametrize("user", ["trigger", "watcher"])
def test_another_dags_run_does_not_open_our_runs_folder(runs, user):
    response = _view(runs["clients"][user], OTHER_DAG_ID, "plain", "files/report/report.md")
    assert response.status_code == 404, response.text
    assert DAG_ID in response.json()["detail"] and "legitimate" not in response.text


@pytest.mark.parametrize("run_id, failures_link", [("etc", False), ("plain", True)])
def test_the_links_of_a_run_point_only_into_the_view_and_a_run_not_served_gets_no_failures_link(runs, run_id,
                                                                                                 failures_link):
    if failures_link:
        layout = RunLayout.for_run(runs["output_root"], run_id)
        layout.failures.write_text(json.dumps({"task": "load_fleet", "task_id": "load_fleet"}) + "\n")
    response = runs["clients"]["watcher"].get(f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/load_fleet/links")
    assert response.status_code == 200, response.text
    links = {name: url for name, url in response.json()["extra_links"].items() if url}
    assert links == ({"Failures": f"/fleetgen/runs/{DAG_ID}/{run_id}/failures"} if failures_link
                     else {}), links
