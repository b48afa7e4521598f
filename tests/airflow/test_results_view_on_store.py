"""The results view (plugins/fleetgen_results.py) of a deployment whose output root is on an object store: a running
Airflow API server that shares no disk with the workers reads a run's report from SeaweedFS through the deployment's
connection, serves it to a signed-in user in a real browser, and reaches no key outside the run's prefix, nor a
prefix or a connection a triggering user names."""

import io
import json
import os
import re
import shutil

import httpx
import pytest

from tests.airflow.api_server import DAG_ID, PROJECT_ROOT, api_server

pytestmark = pytest.mark.slow
STORE_CONN_ID = "fleetgen_test_store"  # tests/conftest.py: the connection the seaweedfs fixture defines
USERS = {"trigger": ("user", "trigger-pw"), "watcher": ("viewer", "watcher-pw")}
RUN_ID = "manual__2026-12-01T02:00:00+00:00"
REPORT = "# Report of the run on the store\n\n| server | cap |\n|---|---|\n| node0:30000 | 71 |\n\n![plot](plot.png)\n"
CHROMIUM = os.environ.get("FLEETGEN_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run"]
SHOTS = PROJECT_ROOT / "out" / "browser"
WAIT_CAP_MS = 180_000


def _png() -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    figure, axes = pyplot.subplots(figsize=(4, 2))
    axes.plot([0, 1, 2], [3, 1, 2])
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    pyplot.close(figure)
    return buffer.getvalue()


@pytest.fixture(scope="module")
def deployment(tmp_path_factory, seaweedfs):
    """An API server whose FLEETGEN_OUTPUT_ROOT is a prefix of the store; its own folder holds nothing of a run."""
    from fleetgen.storage.location import parse_location
    from fleetgen.storage.objects import ObjectStore

    prefix = f"s3://{seaweedfs.bucket}/results-view-{os.getpid()}"
    store = ObjectStore.connect(parse_location(prefix, parameter="output_root"), conn_id=STORE_CONN_ID,
                                parameter="output_root")
    root = tmp_path_factory.mktemp("results-view-store")
    dags = root / "dags"
    dags.mkdir()
    shutil.copy(PROJECT_ROOT / "dags" / "sglang_generation.py", dags)
    with api_server(root, USERS, dags_folder=dags, plugins=True,
                    env={"FLEETGEN_OUTPUT_ROOT": prefix, "FLEETGEN_STORAGE_CONN_ID": STORE_CONN_ID}) as server:
        yield {"store": store, "prefix": prefix, "clients": server.clients, "base": server.base}


@pytest.fixture(scope="module")
def runs(deployment):
    """A run of the deployment's root with its report on the store; runs whose conf names elsewhere."""
    from fleetgen.outputs import run_folder_name

    trigger = deployment["clients"]["trigger"]
    for run_id, conf in ((RUN_ID, {"output_root": deployment["prefix"], "storage_conn_id": STORE_CONN_ID}),
                         ("elsewhere", {"output_root": f"{deployment['prefix']}-other"}),
                         ("other_conn", {"storage_conn_id": "aws_default"})):
        response = trigger.post(f"/api/v2/dags/{DAG_ID}/dagRuns",
                                json={"dag_run_id": run_id, "logical_date": None, "conf": conf})
        assert response.status_code == 200, response.text
    store = deployment["store"]
    for run_id in (RUN_ID, "elsewhere", "other_conn"):
        store.put(f"{run_folder_name(run_id)}/report/report.md", REPORT.encode())
    store.put(f"{run_folder_name(RUN_ID)}/report/plot.png", _png())
    store.put(f"{run_folder_name(RUN_ID)}/failures.jsonl",
              json.dumps({"task": "load_fleet", "task_id": "load_fleet", "first_line": "no fleet file"}).encode())
    store.put("secret.txt", b"beside the runs")
    return deployment


def _view(client, run_id: str, page: str) -> httpx.Response:
    return client.get(f"/fleetgen/runs/{DAG_ID}/{run_id.replace(':', '%3A').replace('+', '%2B')}/{page}")


@pytest.mark.parametrize("user", ["trigger", "watcher"])
def test_the_report_and_failures_of_a_run_are_read_from_the_store(runs, user):
    client = runs["clients"][user]
    report = _view(client, RUN_ID, "files/report/report.md")
    assert report.status_code == 200, report.text
    assert "Report of the run on the store" in report.text and "<table>" in report.text
    plot = _view(client, RUN_ID, "files/report/plot.png")
    assert plot.status_code == 200 and plot.headers["content-type"] == "image/png"
    assert "no fleet file" in _view(client, RUN_ID, "failures").text


@pytest.mark.parametrize("run_id, page, says", [
    ("elsewhere", "files/report/report.md", "outside the deployment's output root"),
    ("other_conn", "files/report/report.md", "not the deployment's 'fleetgen_test_store'"),
    (RUN_ID, "files/..%2Fsecret.txt", "is not a file of this run"),
    (RUN_ID, "files/report/missing.md", "is not a file of this run"),
])
def test_nothing_outside_the_runs_prefix_of_the_deployments_root_is_served(runs, run_id, page, says):
    response = _view(runs["clients"]["trigger"], run_id, page)
    assert response.status_code == 404, response.text
    assert says in response.json()["detail"] and "beside the runs" not in response.text


def test_a_signed_in_user_sees_the_report_from_the_store_in_the_browser(runs):
    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip(f"{CHROMIUM} not found: install Debian's chromium (make test does when run as root)")
    from playwright.sync_api import sync_playwright

    SHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        try:
            context = browser.new_context(viewport={"width": 1200, "height": 800})
            context.set_default_timeout(WAIT_CAP_MS)
            context.set_default_navigation_timeout(WAIT_CAP_MS)
            page = context.new_page()
            page.goto(f"{runs['base']}/")
            page.wait_for_url(re.compile(r"/auth/login"))
            page.get_by_label("Username").fill("watcher")
            page.get_by_label("Password").fill(USERS["watcher"][1])
            page.get_by_role("button", name="Sign in").click()
            page.wait_for_url(lambda url: "/auth/login" not in url)
            page.goto(f"{runs['base']}/fleetgen/runs/{DAG_ID}/{RUN_ID}/files/report/report.md")
            page.get_by_role("heading", name="Report of the run on the store").wait_for()
            assert "node0:30000" in page.inner_text("main")
            width = page.locator("main img").evaluate("img => img.decode().then(() => img.naturalWidth, () => 0)")
            assert width > 100, width
            page.screenshot(path=str(SHOTS / "20-report-from-the-object-store.png"))
        finally:
            browser.close()
