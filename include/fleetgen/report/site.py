"""A run's results as web pages: the report (Markdown rendered here, its plots beside it), the Data Docs and
``failures.jsonl``, read from the run's folder only, or from the run's prefix when the deployment's output root is
on an object store (``RunObjects``, through ``storage/objects.py``). The Airflow plugin
(``plugins/fleetgen_results.py``) serves these; nothing here imports Airflow or a web framework.
"""

from __future__ import annotations

import html
import json
import mimetypes
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from fleetgen.errors import ConfigError, ObjectMissing, PathOutsideRun
from fleetgen.outputs import RunLayout, parse_failures, read_failures, run_folder_name
from fleetgen.storage.location import default_storage_conn_id, parse_location

# One small stylesheet inlined in every page: no request leaves the machine.
_STYLE = """
body{font:15px/1.5 system-ui,-apple-system,"Segoe UI",sans-serif;margin:0;color:#1c2127;background:#fafbfc}
main{max-width:1100px;margin:0 auto;padding:24px}
nav{background:#017cee;color:#fff;padding:10px 24px}nav a{color:#fff;margin-right:18px}
table{border-collapse:collapse;margin:8px 0 20px;font-size:14px}th,td{border:1px solid #d0d7de;padding:4px 8px}
th{background:#eef2f6;text-align:left}img{max-width:100%;border:1px solid #d0d7de;margin:8px 0}
blockquote{margin:12px 0;padding:8px 14px;background:#fff4e5;border-left:4px solid #e07b00}
code{background:#eef2f6;padding:1px 4px;border-radius:3px}.hint{color:#555}
"""


def _page(title: str, body: str, nav: dict[str, str] | None = None) -> str:
    links = "".join(f'<a href="{html.escape(href)}">{html.escape(text)}</a>' for text, href in (nav or {}).items())
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
            f"<style>{_STYLE}</style></head><body>{f'<nav>{links}</nav>' if links else ''}"
            f"<main>{body}</main></body></html>")


@dataclass(frozen=True)
class RunObjects:
    """A run's prefix on an object store (an ``ObjectStore``), as the view reads it: a key below it only."""

    store: object

    @property
    def where(self) -> str:
        return self.store.url()

    def read(self, relative: str) -> bytes:
        _check_relative(relative, self.where)
        try:
            return self.store.get(relative)
        except ObjectMissing:
            raise PathOutsideRun(f"{relative!r} is not a file of this run", path=self.where) from None

    def failures(self) -> list[dict]:
        try:
            return parse_failures(self.store.get(RunLayout.FAILURES))
        except ObjectMissing:
            return []


RunSource = RunLayout | RunObjects


def served_run_layout(deployment_root: str | Path, run_id: str, run_output_root: str | None = None,
                      run_conn_id: str | None = None, *, connect=None) -> RunSource:
    """The folder the results view serves for a run: ``<deployment_root>/<run folder>``, the deployment's output
    root (``FLEETGEN_OUTPUT_ROOT``), never a root taken from the run's conf (``run_output_root``), which whoever
    triggers the run chooses. Refuses a run whose conf names another output root, a run id that is not a plain
    folder name, and a run folder that is a symlink (docs/security-and-ssh.md §5). A deployment root on an object
    store gives the run's prefix there, read through the deployment's connection (``FLEETGEN_STORAGE_CONN_ID``):
    a run whose conf names another connection is refused too. ``connect(location, conn_id)`` makes the store."""
    if not run_id or any(character in run_id for character in "/\\\x00"):
        raise PathOutsideRun(f"run id {run_id!r} is not a plain folder name; the results view does not serve it")
    try:
        name = run_folder_name(run_id)
    except ConfigError as error:
        raise PathOutsideRun(f"{error.message}; the results view does not serve it") from None
    if "://" in str(deployment_root) and not str(deployment_root).startswith("file:"):
        return _served_objects(str(deployment_root), name, run_id, run_output_root, run_conn_id, connect)
    root = Path(deployment_root).expanduser().resolve()
    if run_output_root and Path(run_output_root).expanduser().resolve() != root:
        raise _other_root(run_id, run_output_root, str(root))
    layout = RunLayout(root / name)
    if layout.root.is_symlink():
        raise PathOutsideRun(f"the folder of run {run_id} is a symlink; the results view does not follow it",
                             path=str(layout.root))
    return layout


def _other_root(run_id: str, run_output_root: str, root: str) -> PathOutsideRun:
    return PathOutsideRun(
        f"the results of run {run_id} live under {run_output_root}, outside the deployment's output root: the "
        "results view serves only runs of the deployment's output root", path=root,
        hint="read its folder on the workers' storage, or trigger the run without the DAG parameter "
             "output_root (the deployment's FLEETGEN_OUTPUT_ROOT is its default)")


def _served_objects(deployment_root: str, name: str, run_id: str, run_output_root: str | None,
                    run_conn_id: str | None, connect) -> RunObjects:
    try:
        root = parse_location(deployment_root, parameter="FLEETGEN_OUTPUT_ROOT")
        conf_root = parse_location(run_output_root, parameter="output_root") if run_output_root else root
    except ConfigError as error:
        raise PathOutsideRun(error.message, path=deployment_root) from None
    if conf_root != root:
        raise _other_root(run_id, str(run_output_root), root.url)
    conn_id = default_storage_conn_id()
    if run_conn_id and run_conn_id != conn_id:
        raise PathOutsideRun(
            f"run {run_id} wrote through the connection {run_conn_id!r}, not the deployment's {conn_id!r}: the results "
            "view reads only through the deployment's connection", path=root.url,
            hint="trigger the run without the DAG parameter storage_conn_id (the deployment's FLEETGEN_STORAGE_CONN_ID "
                 "is its default)")
    return RunObjects(connect(root.child(name), conn_id))


def _check_relative(relative: str, where: str) -> None:
    """Refuse what is no plain relative path: absolute, ``..``, an empty segment, a backslash or a NUL."""
    refuse = PathOutsideRun(f"{relative!r} is not a file of this run", path=where)
    if not relative or "\x00" in relative or "\\" in relative or relative.startswith("/"):
        raise refuse
    if any(part in ("..", ".", "") for part in relative.split("/")):
        raise refuse


def resolve_in_run(layout: RunLayout, relative: str) -> Path:
    """The file of this run named by ``relative`` (a path inside the run's folder); refuses absolute paths,
    ``..``, backslashes, and symlinks that lead out of the folder."""
    refuse = PathOutsideRun(f"{relative!r} is not a file of this run", path=str(layout.root))
    _check_relative(relative, str(layout.root))
    try:
        root = layout.root.resolve(strict=True)
        target = (root / relative).resolve(strict=True)
    except (OSError, RuntimeError):
        raise refuse from None
    if not target.is_relative_to(root) or not target.is_file():
        raise refuse
    return target


def run_failures(source: RunSource) -> list[dict]:
    """The records of the run's ``failures.jsonl``, wherever the run is."""
    return source.failures() if isinstance(source, RunObjects) else read_failures(source.failures)


def render_markdown_html(text: str) -> str:
    """CommonMark with tables; raw HTML in the Markdown is escaped, not passed through."""
    from markdown_it import MarkdownIt

    return MarkdownIt("commonmark", {"html": False}).enable("table").render(text)


@dataclass(frozen=True)
class RunPages:
    """The pages of one run (its folder, or its prefix on a store); ``base`` is the URL of the run's folder in the
    view (ends with ``/``)."""

    layout: RunSource
    run_id: str
    base: str

    def nav(self) -> dict[str, str]:
        return {"Report": f"{self.base}files/report/report.md",
                "Data Docs": f"{self.base}files/validation/data_docs/index.html",
                "Failures": f"{self.base}failures"}

    def file(self, relative: str) -> tuple[bytes, str]:
        """A file of the run as (body, media type); Markdown comes back as an HTML page."""
        if isinstance(self.layout, RunObjects):
            data, file_name = self.layout.read(relative), PurePosixPath(relative).name
        else:
            path = resolve_in_run(self.layout, relative)
            data, file_name = path.read_bytes(), path.name
        if file_name.endswith(".md"):
            body = render_markdown_html(data.decode("utf-8"))
            return _page(f"Report {self.run_id}", body, self.nav()).encode(), "text/html; charset=utf-8"
        media = mimetypes.guess_type(file_name)[0] or "application/octet-stream"
        if media.startswith("text/") or media in ("application/json", "application/javascript"):
            media += "; charset=utf-8"
        return data, media

    def failures(self) -> str:
        """``failures.jsonl`` as a table: task, error, where, what to check next."""
        records = run_failures(self.layout)
        if not records:
            return _page(f"Failures {self.run_id}", f"<h1>Failures of {html.escape(self.run_id)}</h1>"
                         "<p>No task of this run has failed.</p>", self.nav())
        rows = "".join(
            "<tr>" + "".join(f"<td>{html.escape(str(record.get(key, '')))}</td>"
                             for key in ("at", "task", "try", "error", "first_line")) +
            f'<td class="hint">{html.escape(str(record.get("hint", "")))}</td></tr>' for record in records)
        body = (f"<h1>Failures of {html.escape(self.run_id)}</h1><table><tr><th>at</th><th>task</th><th>try</th>"
                f"<th>error</th><th>what failed</th><th>what to check next</th></tr>{rows}</table>"
                f"<details><summary>failures.jsonl</summary><pre>"
                f"{html.escape(chr(10).join(json.dumps(r) for r in records))}</pre></details>")
        return _page(f"Failures {self.run_id}", body, self.nav())
