"""A run's results as web pages: the report (Markdown rendered here, its plots beside it), the Data Docs and
``failures.jsonl``, read from the run's folder only. The Airflow plugin (``plugins/fleetgen_results.py``)
serves these; nothing here imports Airflow or a web framework.
"""

from __future__ import annotations

import html
import json
import mimetypes
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from fleetgen.errors import ConfigError, PathOutsideRun
from fleetgen.outputs import RunLayout, read_failures, run_folder_name

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


def served_run_layout(deployment_root: str | Path, run_id: str, run_output_root: str | None = None) -> RunLayout:
    """The folder the results view serves for a run: ``<deployment_root>/<run folder>``, the deployment's output
    root (``FLEETGEN_OUTPUT_ROOT``), never a root taken from the run's conf (``run_output_root``), which whoever
    triggers the run chooses. Refuses a run whose conf names another output root, a run id that is not a plain
    folder name, and a run folder that is a symlink (docs/security-and-ssh.md §5)."""
    if not run_id or any(character in run_id for character in "/\\\x00"):
        raise PathOutsideRun(f"run id {run_id!r} is not a plain folder name; the results view does not serve it")
    try:
        name = run_folder_name(run_id)
    except ConfigError as error:
        raise PathOutsideRun(f"{error.message}; the results view does not serve it") from None
    root = Path(deployment_root).expanduser().resolve()
    if run_output_root and Path(run_output_root).expanduser().resolve() != root:
        raise PathOutsideRun(
            f"the results of run {run_id} live under {run_output_root}, outside the deployment's output root: the "
            "results view serves only runs of the deployment's output root", path=str(root),
            hint="read its folder on the workers' storage, or trigger the run without the DAG parameter "
                 "output_root (the deployment's FLEETGEN_OUTPUT_ROOT is its default)")
    layout = RunLayout(root / name)
    if layout.root.is_symlink():
        raise PathOutsideRun(f"the folder of run {run_id} is a symlink; the results view does not follow it",
                             path=str(layout.root))
    return layout


def resolve_in_run(layout: RunLayout, relative: str) -> Path:
    """The file of this run named by ``relative`` (a path inside the run's folder); refuses absolute paths,
    ``..``, backslashes, and symlinks that lead out of the folder."""
    refuse = PathOutsideRun(f"{relative!r} is not a file of this run", path=str(layout.root))
    if not relative or "\x00" in relative or "\\" in relative or relative.startswith("/"):
        raise refuse
    parts = PurePosixPath(relative).parts
    if any(part in ("..", "") for part in parts):
        raise refuse
    try:
        root = layout.root.resolve(strict=True)
        target = (root / relative).resolve(strict=True)
    except (OSError, RuntimeError):
        raise refuse from None
    if not target.is_relative_to(root) or not target.is_file():
        raise refuse
    return target


def render_markdown_html(text: str) -> str:
    """CommonMark with tables; raw HTML in the Markdown is escaped, not passed through."""
    from markdown_it import MarkdownIt

    return MarkdownIt("commonmark", {"html": False}).enable("table").render(text)


@dataclass(frozen=True)
class RunPages:
    """The pages of one run; ``base`` is the URL of the run's folder in the view (ends with ``/``)."""

    layout: RunLayout
    run_id: str
    base: str

    def nav(self) -> dict[str, str]:
        return {"Report": f"{self.base}files/report/report.md",
                "Data Docs": f"{self.base}files/validation/data_docs/index.html",
                "Failures": f"{self.base}failures"}

    def file(self, relative: str) -> tuple[bytes, str]:
        """A file of the run as (body, media type); Markdown comes back as an HTML page."""
        path = resolve_in_run(self.layout, relative)
        if path.suffix == ".md":
            body = render_markdown_html(path.read_text(encoding="utf-8"))
            return _page(f"Report {self.run_id}", body, self.nav()).encode(), "text/html; charset=utf-8"
        media = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
        if media.startswith("text/") or media in ("application/json", "application/javascript"):
            media += "; charset=utf-8"
        return path.read_bytes(), media

    def failures(self) -> str:
        """``failures.jsonl`` as a table: task, error, where, what to check next."""
        records = read_failures(self.layout.failures)
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
