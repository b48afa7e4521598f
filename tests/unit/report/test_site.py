"""A run's results as web pages: files confined to the run's folder, the report as HTML, offline Data Docs."""

from __future__ import annotations

import json
import os

import pytest
from validate_fixtures import MAX_TOKENS, good_row, write_run

from fleetgen.errors import PathOutsideRun
from fleetgen.outputs import RunLayout
from fleetgen.report.site import RunPages, render_markdown_html, resolve_in_run
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
