"""The docs' own rules: decision records have their three sections and are indexed, and no page
cites a file outside the repository (links within docs/ are checked by `mkdocs build --strict`).
"""

import re
from pathlib import Path

import pytest

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
