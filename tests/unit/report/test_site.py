"""A run's results as web pages: files confined to the run's folder, the report as HTML, offline Data Docs."""

from __future__ import annotations

import json
import os

import pytest
from validate_fixtures import MAX_TOKENS, good_row, write_run

from fleetgen.errors import PathOutsideRun
from fleetgen.outputs import RunLayout
from fleetgen.report.site import RunPages, render_markdown_html, resolve_in_run, served_run_layout
from fleetgen.validation.offline_docs import external_references
from fleetgen.validation.suite import ValidationThresholds, validate_run


@pytest.fixture
def run(tmp_path):
    layout = RunLayout(tmp_path / "out" / "manual__1")
    (layout.report_dir).mkdir(parents=True)
    (layout.report_dir / "report.md").write_text("# Run\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n![plot](per_server.png)\n"
                                                 "\n<script>alert(1)</script>\n")
    (layout.report_dir / "per_server.png").write_bytes(b"\x89PNG fake")
    (tmp_path / "secret.txt").write_text("outside")
    (tmp_path / "out" / "other_run").mkdir()
    (tmp_path / "out" / "other_run" / "x.txt").write_text("another run")
    os.symlink(tmp_path / "secret.txt", layout.root / "link_out.txt")
    return layout


@pytest.mark.parametrize("relative", [
    "../secret.txt", "report/../../secret.txt", "../other_run/x.txt", "/etc/passwd", str("/tmp"),
    "report\\..\\..\\secret.txt", "link_out.txt", "report", "", "nothere.txt", "a\x00b",
])
def test_paths_that_leave_the_run_folder_or_name_no_file_are_refused(run, relative):
    with pytest.raises(PathOutsideRun):
        resolve_in_run(run, relative)


def test_files_of_the_run_are_served_and_markdown_becomes_a_page(run):
    pages = RunPages(run, "manual__1", base="/fleetgen/runs/d/manual__1/")
    body, media = pages.file("report/report.md")
    page = body.decode()
    assert media.startswith("text/html") and "<table>" in page and '<img src="per_server.png"' in page
    assert "<script>alert(1)</script>" not in page and "&lt;script&gt;" in page  # raw HTML is escaped
    assert "http://" not in page and "https://" not in page  # no CDN: the style is inline
    assert pages.file("report/per_server.png") == (b"\x89PNG fake", "image/png")


def test_the_failures_page_lists_each_record(run):
    record = {"at": "2026-01-01T00:00:00+00:00", "task": "servers.wait_ready[n1:30001 (GPU 1)]",
              "task_id": "servers.wait_ready", "error": "ServerStartupError", "first_line": "died: <oom>",
              "hint": "set the DAG parameter max_running_requests lower"}
    run.failures.write_text(json.dumps(record) + "\n")
    page = RunPages(run, "manual__1", base="/x/").failures()
    assert "servers.wait_ready[n1:30001 (GPU 1)]" in page and "died: &lt;oom&gt;" in page
    assert "max_running_requests" in page


def test_markdown_tables_render():
    assert "<th>a</th>" in render_markdown_html("| a |\n|---|\n| 1 |\n")


def test_data_docs_are_offline_and_named_after_the_airflow_run(tmp_path):
    rows = [good_row(index) for index in range(20)]
    out = write_run(tmp_path / "run", rows)
    summary = validate_run(out, [f"p{index:05d}" for index in range(20)], ValidationThresholds(max_tokens=MAX_TOKENS),
                           run_name="scheduled__2026-11-30T02:00:00+00:00")
    site = RunLayout(out).data_docs_dir
    assert summary["data_docs"] == str(site / "index.html")
    assert external_references(site) == []
    pages = [page.relative_to(site).as_posix() for page in site.rglob("*.html")]
    assert not any("__none__" in page for page in pages)
    assert any("scheduled__2026-11-30T02" in page for page in pages), pages
    assert (site / "static" / "styles" / "offline.css").is_file()
    index = (site / "index.html").read_text()
    assert 'href="static/styles/offline.css"' in index and 'src="static/scripts/offline.js"' in index
    assert (site / "static" / "scripts" / "offline.js").is_file()
    # The index lists the validation pages from data GX embeds (rendered by offline.js): each names the run.
    assert "scheduled__2026-11-30T02:00:00+00:00" in index


def test_every_page_has_the_inline_style_and_the_runs_navigation(run):
    pages = RunPages(run, "manual__1", base="/fleetgen/runs/d/manual__1/")
    page = pages.file("report/report.md")[0].decode()
    assert page.startswith('<!doctype html><html lang="en"><head><meta charset="utf-8"><title>Report manual__1</title>'
                           '<style>\nbody{font:15px/1.5 system-ui')
    assert ('<nav><a href="/fleetgen/runs/d/manual__1/files/report/report.md">Report</a>'
            '<a href="/fleetgen/runs/d/manual__1/files/validation/data_docs/index.html">Data Docs</a>'
            '<a href="/fleetgen/runs/d/manual__1/failures">Failures</a></nav><main>') in page
    assert page.endswith("</main></body></html>")
    failures = pages.failures()
    assert "<title>Failures manual__1</title>" in failures and "<nav><a href=" in failures


def test_a_page_without_navigation_has_no_nav_bar():
    from fleetgen.report.site import _page

    page = _page("t <1>", "<p>x</p>")
    assert "<nav>" not in page and "<title>t &lt;1&gt;</title>" in page and "<main><p>x</p></main>" in page


def test_files_are_served_with_their_media_type_and_text_says_its_charset(run):
    pages = RunPages(run, "manual__1", base="/x/")
    (run.report_dir / "report.json").write_text('{"a": 1}')
    (run.report_dir / "notes.txt").write_text("plain")
    (run.report_dir / "blob.zzunknown").write_bytes(b"\x00\x01")
    (run.report_dir / "logo.svg").write_text("<svg/>")
    (run.report_dir / "app.js").write_text("x=1")
    assert pages.file("report/report.json") == (b'{"a": 1}', "application/json; charset=utf-8")
    assert pages.file("report/notes.txt") == (b"plain", "text/plain; charset=utf-8")
    assert pages.file("report/blob.zzunknown") == (b"\x00\x01", "application/octet-stream")
    assert pages.file("report/logo.svg")[1] == "image/svg+xml"
    assert pages.file("report/app.js")[1] in ("application/javascript; charset=utf-8", "text/javascript; charset=utf-8")


def test_a_file_inside_a_subfolder_and_a_link_that_stays_inside_are_served(run):
    os.symlink(run.report_dir / "per_server.png", run.root / "link_in.png")
    assert resolve_in_run(run, "report/per_server.png") == (run.root / "report" / "per_server.png").resolve()
    assert resolve_in_run(run, "link_in.png") == (run.root / "report" / "per_server.png").resolve()
    with pytest.raises(PathOutsideRun) as refused:
        resolve_in_run(run, "../secret.txt")
    assert "'../secret.txt' is not a file of this run" in str(refused.value)


def test_a_run_without_failures_says_so(run):
    page = RunPages(run, "manual__1", base="/x/").failures()
    assert "<h1>Failures of manual__1</h1><p>No task of this run has failed.</p>" in page and "<table>" not in page


def test_every_try_of_a_task_that_failed_several_times_is_listed_in_order(run):
    records = [{"at": f"2026-01-01T00:0{attempt}:00+00:00", "task": "generate.run_shard", "map_index": 0,
                "try": attempt, "error": f"Error{attempt}", "first_line": f"try {attempt} <failed>",
                "hint": f"hint {attempt}"} for attempt in (1, 2, 3)]
    run.failures.write_text("".join(json.dumps(record) + "\n" for record in records) + '{"torn')
    page = RunPages(run, "manual<1>", base="/x/").failures()
    assert "<h1>Failures of manual&lt;1&gt;</h1>" in page
    assert ("<tr><th>at</th><th>task</th><th>try</th><th>error</th><th>what failed</th>"
            "<th>what to check next</th></tr>") in page
    rows = [f'<tr><td>2026-01-01T00:0{n}:00+00:00</td><td>generate.run_shard</td><td>{n}</td><td>Error{n}</td>'
            f'<td>try {n} &lt;failed&gt;</td><td class="hint">hint {n}</td></tr>' for n in (1, 2, 3)]
    assert "".join(rows) in page
    assert "<details><summary>failures.jsonl</summary><pre>" in page
    assert html_escaped_lines(records) in page


def test_a_record_missing_fields_shows_empty_cells_and_a_zero_is_shown(run):
    run.failures.write_text(json.dumps({"task": "report.build"}) + "\n" + json.dumps({"task": "t[0]", "try": 0}) + "\n")
    page = RunPages(run, "manual__1", base="/x/").failures()
    assert '<tr><td></td><td>report.build</td><td></td><td></td><td></td><td class="hint"></td></tr>' in page
    assert '<tr><td></td><td>t[0]</td><td>0</td><td></td><td></td><td class="hint"></td></tr>' in page


def html_escaped_lines(records):
    import html

    return html.escape("\n".join(json.dumps(record) for record in records)) + "</pre></details>"


def test_a_page_without_navigation_opens_its_main_right_after_the_body():
    from fleetgen.report.site import _page

    assert "</style></head><body><main>" in _page("t", "x")


def test_paths_that_stay_inside_the_run_but_are_written_oddly_are_refused(run):
    (run.root / "a\\b.txt").write_text("a file whose name holds a backslash")
    inside = str(run.report_dir / "report.md")  # absolute, yet inside the run
    for relative in ("a\\b.txt", inside, "report/../report/report.md"):
        with pytest.raises(PathOutsideRun) as refused:
            resolve_in_run(run, relative)
        assert refused.value.path == str(run.root)


def test_javascript_is_served_as_text_in_utf_8(run, monkeypatch):
    from fleetgen.report import site

    (run.report_dir / "app.js").write_text("x=1")
    monkeypatch.setattr(site.mimetypes, "guess_type", lambda name: ("application/javascript", None))
    assert RunPages(run, "r", base="/x/").file("report/app.js") == (b"x=1", "application/javascript; charset=utf-8")


def test_the_failures_page_of_a_failed_run_has_the_navigation(run):
    run.failures.write_text(json.dumps({"task": "report.build"}) + "\n")
    assert '<nav><a href="/x/files/report/report.md">Report</a>' in RunPages(run, "r", base="/x/").failures()


def test_the_view_serves_a_run_from_the_deployments_output_root_whatever_the_conf_spells(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "out").mkdir()
    expected = RunLayout(tmp_path / "out" / "manual__2026-05-01T02_00_00_00_00")
    for conf_root in (None, "", "~/out", str(tmp_path / "out") + "/", str(tmp_path / "out" / "." / "x" / "..")):
        assert served_run_layout("~/out", "manual__2026-05-01T02:00:00+00:00", conf_root) == expected


@pytest.mark.parametrize("conf_root", ["/", "{home}", "{home}/out/..", "{home}/out/manual__1", "{home}/other"])
def test_a_run_whose_conf_names_another_output_root_is_not_served(tmp_path, conf_root):
    (tmp_path / "out" / "etc").mkdir(parents=True)
    with pytest.raises(PathOutsideRun) as refused:
        served_run_layout(tmp_path / "out", "etc", conf_root.format(home=tmp_path))
    assert "outside the deployment's output root" in refused.value.message
    assert "output_root" in refused.value.hint and "FLEETGEN_OUTPUT_ROOT" in refused.value.hint


@pytest.mark.parametrize("run_id", [".", "..", "", ".hidden", "a/b", "../etc", "a\\b", "a\x00b", "/etc"])
def test_a_run_id_that_is_not_a_plain_folder_name_is_not_served(tmp_path, run_id):
    with pytest.raises(PathOutsideRun) as refused:
        served_run_layout(tmp_path, run_id)
    assert repr(run_id) in refused.value.message and "not serve" in refused.value.message


def test_a_run_folder_that_is_a_symlink_out_of_the_output_root_is_not_served(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "passwd").write_text("secret")
    os.symlink(tmp_path / "elsewhere", tmp_path / "out" / "manual__1")
    with pytest.raises(PathOutsideRun) as refused:
        served_run_layout(tmp_path / "out", "manual__1")
    assert "symlink" in refused.value.message and refused.value.path == str(tmp_path / "out" / "manual__1")


def test_an_output_root_reached_through_a_symlink_still_serves_its_runs(tmp_path):
    (tmp_path / "real" / "manual__1").mkdir(parents=True)
    os.symlink(tmp_path / "real", tmp_path / "out")
    layout = served_run_layout(tmp_path / "out", "manual__1", str(tmp_path / "out"))
    assert layout.root == tmp_path / "real" / "manual__1"


STORE_CONN_ID = "fleetgen_test_store"  # tests/conftest.py: the connection the seaweedfs fixture defines


def _connect(location, conn_id):
    from fleetgen.storage.objects import ObjectStore

    return ObjectStore.connect(location, conn_id=conn_id, parameter="FLEETGEN_OUTPUT_ROOT")


@pytest.fixture
def stored_run(object_store, store_prefix, monkeypatch):
    """A run's report and failures on the store, the deployment's output root being the store's prefix."""
    monkeypatch.setenv("FLEETGEN_STORAGE_CONN_ID", STORE_CONN_ID)
    object_store.put("manual__1/report/report.md", b"# Run\n\n| a | b |\n|---|---|\n| 1 | 2 |\n<script>x</script>\n")
    object_store.put("manual__1/report/per_server.png", b"\x89PNG fake")
    object_store.put("manual__1/failures.jsonl", json.dumps({"task": "load_fleet", "first_line": "no fleet"}).encode()
                     + b"\n{torn")
    object_store.put("other_run/secret.txt", b"another run")
    object_store.put("manual__1.txt", b"beside the run")
    return served_run_layout(store_prefix, "manual__1", store_prefix, None, connect=_connect)


def test_a_run_on_the_store_is_served_from_its_prefix(stored_run, object_store):
    pages = RunPages(stored_run, "manual__1", base="/x/")
    body, media = pages.file("report/report.md")
    assert media == "text/html; charset=utf-8" and b"<td>1</td>" in body and b"<script>" not in body
    assert pages.file("report/per_server.png") == (b"\x89PNG fake", "image/png")
    assert "<td>no fleet</td>" in pages.failures() and stored_run.where == object_store.url("manual__1")


@pytest.mark.parametrize("relative", ["../other_run/secret.txt", "../manual__1.txt", "/manual__1/report/report.md",
                                      "report//report.md", "./report/report.md", "report\\report.md", "", "nothere",
                                      "report", "a\x00b"])
def test_a_key_outside_the_runs_prefix_or_no_object_is_not_served_from_the_store(stored_run, relative):
    with pytest.raises(PathOutsideRun, match="is not a file of this run") as refused:
        RunPages(stored_run, "manual__1", base="/x/").file(relative)
    assert refused.value.path == stored_run.where


def test_a_run_on_the_store_whose_conf_names_another_root_or_connection_is_not_served(store_prefix, monkeypatch):
    monkeypatch.setenv("FLEETGEN_STORAGE_CONN_ID", STORE_CONN_ID)
    for conf_root in (f"{store_prefix}/deeper", "s3://other-bucket/runs", "/local/out"):
        with pytest.raises(PathOutsideRun, match="outside the deployment's output root"):
            served_run_layout(store_prefix, "manual__1", conf_root, connect=_connect)
    with pytest.raises(PathOutsideRun, match="not the deployment's 'fleetgen_test_store'") as refused:
        served_run_layout(store_prefix, "manual__1", None, "admin_conn", connect=_connect)
    assert "storage_conn_id" in refused.value.hint
    assert served_run_layout(store_prefix, "manual__1", None, STORE_CONN_ID,
                             connect=lambda location, conn_id: (location.url, conn_id)).store == (
        f"{store_prefix}/manual__1", STORE_CONN_ID)


def test_a_run_without_failures_on_the_store_says_so(object_store, store_prefix, monkeypatch):
    monkeypatch.setenv("FLEETGEN_STORAGE_CONN_ID", STORE_CONN_ID)
    source = served_run_layout(store_prefix, "manual__2", connect=_connect)
    assert "No task of this run has failed." in RunPages(source, "manual__2", base="/x/").failures()
