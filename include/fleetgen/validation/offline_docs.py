"""Great Expectations' Data Docs made usable offline: GX 1.24's pages load Bootstrap, jQuery, Font Awesome,
bootstrap-table and Vega from CDNs and a logo from S3. This rewrites every page of a built site so that no
request leaves the machine: external stylesheets and scripts are dropped, the external logo points at the copy
GX ships in the site's ``static/``, and two files of ours are linked instead: ``static/styles/offline.css``
(the Bootstrap subset the pages use) and ``static/scripts/offline.js`` (renders the index tables from the data
GX embeds, in place of jQuery and bootstrap-table). Sorting and filtering are what is lost.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

STATIC = Path(__file__).with_name("static")
# Our files, copied into the site's static/ folder: (name, its sub-folder there).
OFFLINE_FILES = (("offline.css", "styles"), ("offline.js", "scripts"))
_EXTERNAL_LINK = re.compile(r"<link\b[^>]*\bhref=\"(?:https?:)?//[^\"]*\"[^>]*>", re.IGNORECASE)
_EXTERNAL_SCRIPT = re.compile(r"<script\b[^>]*\bsrc=\"(?:https?:)?//[^\"]*\"[^>]*>\s*</script>", re.IGNORECASE)
_EXTERNAL_IMAGE = re.compile(r"(<img\b[^>]*\bsrc=\")(?:https?:)?//[^\"]*?/([\w.-]+\.(?:png|svg|gif))(?:\?[^\"]*)?\"",
                             re.IGNORECASE)
EXTERNAL_REFERENCE = re.compile(r"\b(?:src|href)=\"(?:https?:)?//", re.IGNORECASE)


def _offline_page(text: str, static: str) -> str:
    text = _EXTERNAL_LINK.sub("", text)
    text = _EXTERNAL_SCRIPT.sub("", text)
    text = _EXTERNAL_IMAGE.sub(lambda match: f'{match.group(1)}{static}/images/{match.group(2)}"', text)
    (css, css_dir), (js, js_dir) = OFFLINE_FILES
    offline = (f'<link rel="stylesheet" href="{static}/{css_dir}/{css}">\n'
               f'<script src="{static}/{js_dir}/{js}"></script>')
    return text.replace("</head>", f"{offline}\n</head>", 1)


def make_offline(site: Path) -> int:
    """Rewrite every HTML page under ``site`` (a Data Docs folder); returns how many pages were rewritten."""
    for name, folder in OFFLINE_FILES:
        (site / "static" / folder).mkdir(parents=True, exist_ok=True)
        shutil.copyfile(STATIC / name, site / "static" / folder / name)
    pages = 0
    for page in site.rglob("*.html"):
        static = os.path.relpath(site / "static", page.parent).replace(os.sep, "/")
        page.write_text(_offline_page(page.read_text(encoding="utf-8"), static), encoding="utf-8")
        pages += 1
    return pages


def external_references(site: Path) -> list[str]:
    """Every ``src``/``href`` of the site's pages that would fetch from another host (links that a person
    clicks, ``<a href>``, are not fetched and not counted)."""
    found = []
    for page in site.rglob("*.html"):
        for tag in re.findall(r"<(?!a\b)[a-z]+\b[^>]*>", page.read_text(encoding="utf-8"), re.IGNORECASE):
            if EXTERNAL_REFERENCE.search(tag):
                found.append(f"{page.relative_to(site)}: {tag[:120]}")
    return found
