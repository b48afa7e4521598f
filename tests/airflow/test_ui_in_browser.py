"""The Airflow UI as its users meet it, in a real browser: Playwright driving Debian's Chromium against
Airflow standalone started the way ``make ui`` starts it, on a simulated 2-GPU node.

Screenshots of every step go to ``out/browser/`` (the file names say what each shows). Needs ``chromium``
(``make test`` installs it when run as root; see the README) and no network: every request the browser makes
is recorded and must stay on this machine.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path
from urllib.parse import quote, unquote, urlparse

import httpx
import pytest

pytestmark = pytest.mark.slow
PROJECT_ROOT = Path(__file__).resolve().parents[2]
SHOTS = PROJECT_ROOT / "out" / "browser"
CHROMIUM = os.environ.get("FLEETGEN_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run"]
DAG_ID = "sglang_generation"
PASSWORD = "browser-test"
GPUS = 2
OOM_GPU = 1  # the server on this GPU fails to start with SGLang's KV-pool out-of-memory error
LOCAL_HOSTS = {"localhost", "127.0.0.1"}
# No fire time between the DAG's start_date and now (2026 has no 29 February): "unpause on trigger" adds no
# scheduled run to wait for. make ui keeps the real schedule; its runs find their prompts (FLEETGEN_PROMPTS_PATH).
NO_SCHEDULED_RUN = "0 0 29 2 *"
# Caps on waits that end with their event (a page showing a text, a run reaching a final state, an answer of the
# API server): generous, since machines of one kind differ by 2x or more in speed and the suite runs beside
# other work. Playwright's own default is 30 s, which a grid page's first render on a slow machine outlasted.
BROWSER_WAIT_CAP_MS = 180_000
RUN_CAP_S = 900.0
STANDALONE_UP_CAP_S = 600.0
DAG_PARSED_CAP_S = 600.0
API_CALL_CAP_S = 120.0


@pytest.fixture(scope="module")
def airflow_ui(tmp_path_factory):
    from sglang_sim.sshd import free_port
    from devstack.ui import AirflowUI

    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip(f"{CHROMIUM} not found: install Debian's chromium (make test does when run as root), or "
                    f"point FLEETGEN_CHROMIUM at a Chromium binary")
    root = tmp_path_factory.mktemp("ui")
    ui = AirflowUI(root=root, port=free_port(), password=PASSWORD, prompts=60, gpus_per_node=GPUS,
                   sim={"time_scale": 200.0, "load_seconds": 20.0},
                   extra_env={"FLEETGEN_RETRY_DELAY_S": "1", "FLEETGEN_SCHEDULE": NO_SCHEDULED_RUN,
                              "AIRFLOW__SCHEDULER__MIN_FILE_PROCESS_INTERVAL": "5"})
    try:
        ui.start(log_path=root / "standalone.log")
        ui.wait_until_up(timeout_s=STANDALONE_UP_CAP_S)  # db migrate, user, scheduler, API server: ends once it answers
        yield ui
    finally:
        ui.stop()


@pytest.fixture(scope="module")
def api(airflow_ui):
    """The REST API as admin; waits until the DAG is parsed."""
    token = httpx.post(f"{airflow_ui.url}/auth/token", json={"username": "admin", "password": PASSWORD},
                       timeout=API_CALL_CAP_S).json()["access_token"]
    client = httpx.Client(base_url=airflow_ui.url, headers={"Authorization": f"Bearer {token}"},
                          timeout=API_CALL_CAP_S)
    deadline = time.monotonic() + DAG_PARSED_CAP_S
    while (status := client.get(f"/api/v2/dags/{DAG_ID}").status_code) != 200:
        assert time.monotonic() < deadline, f"the DAG was not parsed in {DAG_PARSED_CAP_S:.0f} s (last: {status})"
        time.sleep(2)
    yield client
    client.close()


@pytest.fixture(scope="module")
def browser_context(airflow_ui):
    from playwright.sync_api import sync_playwright

    SHOTS.mkdir(parents=True, exist_ok=True)
    for old in SHOTS.glob("*.png"):
        old.unlink()
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        context = browser.new_context(viewport={"width": 1400, "height": 1000})
        # every wait_for, click, goto and load-state wait of the pages below ends with its event, within this cap
        context.set_default_timeout(BROWSER_WAIT_CAP_MS)
        context.set_default_navigation_timeout(BROWSER_WAIT_CAP_MS)
        context.requests = []
        context.on("request", lambda request: context.requests.append(request.url))
        yield context
        browser.close()


@pytest.fixture(scope="module")
def page(browser_context, airflow_ui):
    page = browser_context.new_page()
    page.goto(f"{airflow_ui.url}/")
    page.wait_for_url(re.compile(r"/auth/login"))
    shot(page, "01-login")
    page.get_by_label("Username").fill("admin")
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(lambda url: "/auth/login" not in url)
    return page


def shot(page, name: str) -> None:
    page.wait_for_load_state("networkidle")
    page.screenshot(path=str(SHOTS / f"{name}.png"))


def on_screen(page, text: str) -> bool:
    """Whether a text node holding ``text`` starts inside the window (not scrolled away)."""
    return page.evaluate("""text => {
        const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
        while (walker.nextNode()) {
            if (!walker.currentNode.textContent.includes(text)) continue;
            const range = document.createRange();
            range.selectNodeContents(walker.currentNode);
            const box = range.getBoundingClientRect();
            if (box.width > 0 && box.top >= 0 && box.top < window.innerHeight) return true;
        }
        return false;
    }""", text)


def run_url(ui, run_id: str, tail: str = "") -> str:
    return f"{ui.url}/dags/{DAG_ID}/runs/{run_id}{tail}"


def wait_for_run(api, run_id: str, timeout_s: float = RUN_CAP_S) -> str:
    """The run's final state, as soon as it has one; past the cap, fails with its tasks' states."""
    deadline = time.monotonic() + timeout_s
    state = None
    while True:
        try:
            state = api.get(f"/api/v2/dags/{DAG_ID}/dagRuns/{quote(run_id, safe='')}").json()["state"]
        except httpx.TimeoutException:
            pass  # the API server of a standalone Airflow on a busy machine: ask again until the deadline
        if state in ("success", "failed"):
            return state
        if time.monotonic() > deadline:
            tasks = sorted((ti["task_id"], ti.get("rendered_map_index"), ti["state"])
                           for ti in task_instances(api, run_id))
            pytest.fail(f"run {run_id} still {state} after {timeout_s:.0f} s; its tasks: {tasks}")
        time.sleep(3)


def open_trigger_form(page, ui):
    page.goto(f"{ui.url}/dags/{DAG_ID}")
    page.get_by_role("button", name="Trigger").first.click()
    dialog = page.locator("[role=dialog][data-state=open]")
    dialog.get_by_text("Inputs", exact=True).wait_for()
    return dialog


def task_instances(api, run_id: str) -> list[dict]:
    return api.get(f"/api/v2/dags/{DAG_ID}/dagRuns/{quote(run_id, safe='')}/taskInstances",
                   params={"limit": 100}).json()["task_instances"]


def assert_stayed_local(requests: list[str]) -> None:
    hosts = {urlparse(url).hostname for url in requests if urlparse(url).scheme in ("http", "https", "ws", "wss")}
    assert hosts <= LOCAL_HOSTS, f"requests left the machine: {sorted(hosts - LOCAL_HOSTS)}"


@pytest.fixture(scope="module")
def successful_run(page, airflow_ui, api):
    """A run triggered from the form with its defaults (the deployment's prompts and output root)."""
    dialog = open_trigger_form(page, airflow_ui)
    dialog.get_by_role("button", name="Trigger", exact=True).click()
    page.wait_for_url(re.compile(r"/runs/manual__"))
    run_id = unquote(page.url.split("/runs/")[1].split("/")[0])
    assert wait_for_run(api, run_id) == "success", task_instances(api, run_id)
    return run_id


def test_the_trigger_form_is_valid_with_its_defaults_and_explains_an_invalid_value(page, airflow_ui):
    dialog = open_trigger_form(page, airflow_ui)
    sections = [name for name in ("Inputs", "Tuning", "Generation", "Validation thresholds")
                if dialog.get_by_text(name, exact=True).count()]
    assert sections == ["Inputs", "Tuning", "Generation", "Validation thresholds"]
    trigger = dialog.get_by_role("button", name="Trigger", exact=True)
    assert trigger.is_enabled()
    assert "This field is required" not in dialog.inner_text()
    dialog.get_by_text("Inputs", exact=True).click()
    dialog.get_by_text("Generation", exact=True).click()
    assert "Allowed: 1 to 262,144" in dialog.inner_text()
    shot(page, "02-trigger-form-defaults-valid")
    # A value out of range, as a REST caller or the JSON editor would send it: refused, with the reason.
    dialog.get_by_text("Advanced Options", exact=True).click()
    # the run's conf editor: the last JSON editor of the form (list and mapping params have editors of their own)
    dialog.locator("[data-mode-id=json]").last.click()
    page.keyboard.press("Control+A")
    page.keyboard.press("Delete")
    page.keyboard.insert_text(json.dumps({"max_tokens": 999999999}))
    trigger.click()
    reason = dialog.get_by_text(re.compile(r"max_tokens: 999999999 is greater than the maximum of 262144"))
    reason.wait_for()
    shot(page, "03-trigger-form-invalid-value-reason")
    page.keyboard.press("Escape")


def test_a_run_triggered_from_the_form_succeeds_with_named_map_indexes(page, airflow_ui, api, successful_run):
    labels = {(ti["task_id"], ti.get("rendered_map_index")) for ti in task_instances(api, successful_run)}
    for gpu in range(GPUS):
        assert any(task == "servers.wait_ready" and re.fullmatch(rf"node0:\d+ \(GPU {gpu}\)", label or "")
                   for task, label in labels), labels
    assert ("tune.probe_gpus", "node0") in labels
    assert ("generate.generate_shard", "shard 0: prompts 0-59") in labels
    page.goto(run_url(airflow_ui, successful_run, "/tasks/servers.wait_ready/mapped"))
    page.get_by_text(re.compile(r"node0:\d+ \(GPU 0\)")).first.wait_for()
    shot(page, "04-grid-wait-ready-named-by-server")
    page.goto(run_url(airflow_ui, successful_run, "/tasks/generate.generate_shard/mapped"))
    page.get_by_text("shard 0: prompts 0-59").wait_for()
    shot(page, "05-grid-shards-named-by-prompt-range")


def test_a_task_shows_its_documentation(page, airflow_ui, successful_run):
    page.goto(f"{airflow_ui.url}/dags/{DAG_ID}/tasks/servers.wait_ready")
    page.get_by_role("button", name="Documentation").click()
    docs = page.locator("[role=dialog][data-state=open]")
    docs.get_by_text("Waits (deferred, in the triggerer) until one server is ready").wait_for()
    assert "ready_timeout_s" in docs.inner_text()
    shot(page, "06-task-documentation")
    page.keyboard.press("Escape")


def test_the_report_link_opens_the_rendered_report_with_its_plots(page, airflow_ui, successful_run):
    page.goto(run_url(airflow_ui, successful_run, "/tasks/validate.report/details"))
    link = page.get_by_role("link", name="Report", exact=True)
    link.wait_for()
    shot(page, "07-report-task-extra-links")
    link.click()
    page.get_by_role("heading", name=re.compile(r"^Generation run manual__")).wait_for()
    assert "Simulated fleet" in page.inner_text("main")
    images = page.locator("main img")
    assert images.count() >= 3
    # decode() settles once the image has loaded (0: it failed to): a plot still loading is waited for
    widths = [image.evaluate("img => img.decode().then(() => img.naturalWidth, () => 0)") for image in images.all()]
    assert all(width > 100 for width in widths), widths
    shot(page, "08-report-rendered-with-plots")


def test_the_data_docs_render_with_styles_and_no_request_leaves_the_machine(page, browser_context, airflow_ui,
                                                                           successful_run):
    page.goto(run_url(airflow_ui, successful_run, "/tasks/validate.validate/details"))
    link = page.get_by_role("link", name="Data Docs", exact=True)
    link.wait_for()
    browser_context.requests.clear()
    link.click()
    row_link = page.locator("a.ge-offline-row-link").first
    row_link.wait_for()
    # Styled: the offline stylesheet applies (Bootstrap's .card gets its border and radius).
    assert page.evaluate("getComputedStyle(document.body).fontFamily").startswith("system-ui")
    shot(page, "09-data-docs-index-offline")
    row_link.click()
    page.get_by_text("Run Name").wait_for()
    assert successful_run in page.inner_text("body")  # the validation run is named after the Airflow run
    card = page.locator(".card").first
    assert card.evaluate("e => getComputedStyle(e).borderTopStyle") == "solid"
    shot(page, "10-data-docs-validation-page-offline")
    assert_stayed_local(browser_context.requests)


def test_the_results_view_serves_only_files_of_the_run(airflow_ui, api, successful_run):
    from fleetgen.outputs import RunLayout

    layout = RunLayout.for_run(airflow_ui.environment.output_root, successful_run)
    secret = airflow_ui.root / "outside.txt"
    secret.write_text("not a file of the run")
    (layout.root / "link-out.txt").symlink_to(secret)
    base = f"/fleetgen/runs/{DAG_ID}/{quote(successful_run, safe='')}/files/"
    assert api.get(base + "report/report.md").status_code == 200
    for attempt in ("../../outside.txt", "%2e%2e/%2e%2e/outside.txt", "report%2F..%2F..%2F..%2Foutside.txt",
                    "%2Fetc%2Fpasswd", "/etc/passwd", "link-out.txt", "report/..%5C..%5Coutside.txt"):
        response = api.get(base + attempt)
        assert response.status_code in (404, 400), (attempt, response.status_code)
        assert "not a file of the run" not in response.text and "root:" not in response.text
    assert httpx.get(f"{airflow_ui.url}{base}report/report.md").status_code == 401  # signed-in users only


def test_a_failing_run_names_the_server_and_the_parameter_to_change(page, airflow_ui, api, successful_run):
    environment = airflow_ui.environment
    port = environment.base_port + OOM_GPU
    faults = environment.node_dir(0) / "faults"
    faults.mkdir(exist_ok=True)
    (faults / f"{port}.json").write_text(json.dumps({"fail_at_launch": "oom"}))
    try:
        # The servers of the earlier runs are on tonight's plan and would be kept: relaunch them, so the
        # injected launch fault fires.
        response = api.post(f"/api/v2/dags/{DAG_ID}/dagRuns", json={"logical_date": None,
                                                                    "conf": {"relaunch_servers": True}})
        assert response.status_code == 200, response.text
        run_id = response.json()["dag_run_id"]
        assert wait_for_run(api, run_id) == "failed"
    finally:
        shutil.rmtree(faults)
    failed = [ti for ti in task_instances(api, run_id) if ti["state"] == "failed"]
    label = f"node0:{port} (GPU {OOM_GPU})"
    assert {(ti["task_id"], ti.get("rendered_map_index")) for ti in failed} == {
        ("servers.wait_ready", label), ("run_outcome", None)}, failed
    map_index = next(ti["map_index"] for ti in failed if ti["task_id"] == "servers.wait_ready")
    page.goto(run_url(airflow_ui, run_id, "/tasks/servers.wait_ready/mapped"))
    page.get_by_text(label).wait_for()
    shot(page, "11-failed-run-grid-names-the-server")
    page.goto(run_url(airflow_ui, run_id, f"/tasks/servers.wait_ready/mapped/{map_index}"))
    page.get_by_text("failed to start (oom_kv)").first.wait_for()
    page.keyboard.press("w")  # the log viewer's own shortcut: wrap long lines
    page.keyboard.press("Control+ArrowUp")  # its shortcut to the top of the log (it opens at the end)
    page.get_by_text(re.compile(r"Waiting for node0:")).first.wait_for()
    shot(page, "12-failed-task-log-first-screen")
    # On the first screen of the log: what failed (SGLang's own line) and which parameter to change.
    assert on_screen(page, "failed to start (oom_kv): RuntimeError: Not enough memory")
    assert on_screen(page, "set the DAG parameter max_running_requests lower (drives --max-running-requests")
    page.keyboard.press("Control+ArrowDown")
    page.get_by_text("Task failed with exception").first.scroll_into_view_if_needed()
    shot(page, "13-failed-task-log-final-error")
    assert on_screen(page, "set the DAG parameter max_running_requests lower (drives --max-running-requests")
    page.goto(run_url(airflow_ui, run_id, "/tasks/run_outcome"))
    page.get_by_text(f"servers.wait_ready[{label}]").first.wait_for()
    shot(page, "14-run-outcome-names-the-failed-task")
    from fleetgen.outputs import RunLayout, read_failures

    records = read_failures(RunLayout.for_run(environment.output_root, run_id).failures)
    assert [record["task"] for record in records] == [f"servers.wait_ready[{label}]"]
    assert all(value not in (None, "") for record in records for value in record.values())
