"""The docs' own rules: decision records have their three sections and are indexed, and no page
cites a file outside the repository (links within docs/ are checked by `mkdocs build --strict`).
"""

import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DECISIONS = ROOT / "docs" / "decisions"
PAGES = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").rglob("*.md"))]
RECORDS = sorted(p for p in DECISIONS.glob("*.md") if p.name != "README.md")


@pytest.mark.parametrize("record", RECORDS, ids=lambda p: p.stem)
def test_a_decision_record_is_context_decision_status_and_indexed(record):
    headings = re.findall(r"^(#{1,2}) (.+)$", record.read_text(), re.M)
    assert [level for level, _ in headings][:1] == ["#"], "a record starts with its title"
    assert [text for level, text in headings if level == "##"] == [
        "Context",
        "Decision",
        "Status",
    ]
    assert f"]({record.name})" in (DECISIONS / "README.md").read_text(), (
        f"docs/decisions/README.md does not list {record.name}"
    )


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_a_page_cites_nothing_outside_the_repository(page):
    text = page.read_text()
    assert "DESIGN.md" not in text and "../shared/" not in text
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        path = (page.parent / target).resolve()
        assert path.is_relative_to(ROOT), f"{target} is outside the repository"
        if path.parent.name == "diagrams" and path.suffix == ".svg":
            path = path.with_suffix(".dot")  # drawn from its source when the site is built
        assert path.exists(), f"{target} does not exist"


def nav_pages(entries: list) -> list[str]:
    """Every page mkdocs.yml's nav lists, in order, as many times as it lists it."""
    pages = []
    for entry in entries:
        for value in entry.values() if isinstance(entry, dict) else [entry]:
            pages.extend(nav_pages(value) if isinstance(value, list) else [value])
    return pages


GUIDES = sorted(p.name for p in (ROOT / "docs").glob("*.md"))


def test_every_page_is_in_the_index_and_once_in_the_nav():
    """A page the reading order or the site's navigation leaves out is a page nobody finds;
    one listed twice is a navigation that repeats itself."""
    nav = nav_pages(yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"])
    index = (ROOT / "docs" / "index.md").read_text()
    linked = set(re.findall(r"\]\(([^)#\s]+)", index))
    assert [p for p in GUIDES if p != "index.md" and p not in linked] == [], "not in index.md"
    assert [p for p in GUIDES if nav.count(p) != 1] == [], "not once in mkdocs.yml's nav"
    assert [p for p in nav if not (ROOT / "docs" / p).is_file()] == [], "nav names no page"
