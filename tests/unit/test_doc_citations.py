"""Citations in code point at sections of docs/ that exist, and never at notes outside the repository."""

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
CODE_DIRS = ("include", "dags", "plugins", "tests", "bench")
# Background notes that are not part of the repository; code cites docs/ or SGLang's own source instead.
# Written with character classes so that this file does not match the pattern itself.
FORBIDDEN = re.compile(r"sglang[-]facts|DESIGN[.]md|[.][.]/shared")
HEADING = re.compile(r"^#{2,4} (\d+(?:\.\d+)*)[. ]", re.MULTILINE)
CITATION = re.compile(r"docs/([\w-]+\.md)([^\n)\"]*)")
SECTION = re.compile(r"§(\d+(?:\.\d+)*)")
BUDGET_NOTE_SECTION = re.compile(r"\((\d+\.\d+)\)\"")


def _sections(page: pathlib.Path) -> set[str]:
    return set(HEADING.findall(page.read_text()))


def _code_files():
    this = pathlib.Path(__file__).resolve()
    for folder in CODE_DIRS:
        for path in sorted((ROOT / folder).rglob("*")):
            if path.suffix in (".py", ".md", ".yaml", ".cfg", ".toml") and path.resolve() != this:
                yield path


def _citations(text: str):
    for match in CITATION.finditer(text):
        yield match.group(1), SECTION.findall(match.group(2))


def test_section_headings_are_found():
    # A guard on the parser itself: the pages number their sections.
    assert {"1.1", "2.2", "2.3", "3", "4.1", "4.2", "5.5"} <= _sections(DOCS / "sglang-memory-model.md")
    assert {"1", "3.2", "8"} <= _sections(DOCS / "output-formats.md")


def test_citation_parser_reads_every_section_of_a_parenthesis():
    text = "sizing (docs/sglang-memory-model.md §2.1-§2.3, §3), then (docs/output-formats.md §3.2)"
    assert list(_citations(text)) == [("sglang-memory-model.md", ["2.1", "2.3", "3"]),
                                      ("output-formats.md", ["3.2"])]


def test_no_citation_of_notes_outside_the_repository():
    offenders = [f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
                 for path in _code_files()
                 for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
                 if FORBIDDEN.search(line)]
    assert offenders == []


def test_every_cited_page_and_section_exists():
    sections = {page.name: _sections(page) for page in DOCS.glob("*.md")}
    broken = []
    for path in _code_files():
        for page, cited in _citations(path.read_text(errors="replace")):
            if page not in sections:
                broken.append(f"{path.relative_to(ROOT)}: docs/{page} does not exist")
                continue
            broken += [f"{path.relative_to(ROOT)}: docs/{page} has no §{number}"
                       for number in cited if number not in sections[page]]
    assert broken == []


def test_budget_table_notes_cite_sections_of_the_memory_model():
    notes = BUDGET_NOTE_SECTION.findall((ROOT / "include/fleetgen/tuning/budget.py").read_text())
    assert notes, "the budget notes cite sections as (N.N)"
    assert set(notes) <= _sections(DOCS / "sglang-memory-model.md")


@pytest.mark.parametrize("page", sorted(p.name for p in DOCS.glob("*.md")))
def test_links_between_doc_pages_resolve(page):
    text = (DOCS / page).read_text()
    targets = re.findall(r"\]\(([\w-]+\.md)(?:#[\w-]*)?\)", text)
    assert [target for target in targets if not (DOCS / target).exists()] == []
