"""The documentation site as a reader gets it: `mkdocs build --strict` once, then the built
HTML is read. No raw reST (roles, double backquotes, ``::``) in the API reference, no page that
loads anything from another host, every table within its column at 1280 px, the diagrams drawn
from their sources, and the plug-in folders anchored under their installed names.

The build is the one ``./run.sh test`` makes before pytest when it passes its directory in
``$SENTINEL_DOCS_SITE``; otherwise this module builds the site once (a few seconds).
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
API_PAGES = ["api", "api/events-errors", "api/policies", "api/integrations", "api/testing"]
# A role as written, or as Markdown renders it (the backquoted part becomes <code>).
ROLE = re.compile(r":(?:py:)?(?:class|meth|func|attr|mod|data|exc|obj):(?:`|<code)")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    built = os.environ.get("SENTINEL_DOCS_SITE")
    if built and (Path(built) / "api" / "index.html").is_file():
        return Path(built)
    if shutil.which("dot") is None:
        pytest.skip("the site's diagrams need Graphviz's dot (apt-get install graphviz)")
    directory = tmp_path_factory.mktemp("site")
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(directory)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return directory


def page(site: Path, name: str) -> str:
    return (site / name / "index.html").read_text()


def text_of(document: str) -> str:
    """The page's text outside code blocks (what reST would show raw), tags removed."""
    document = re.sub(r"<pre.*?</pre>", "", document, flags=re.S)
    return html.unescape(re.sub(r"<[^>]+>", "", document))


@pytest.mark.parametrize("name", API_PAGES)
def test_the_reference_shows_no_raw_restructured_text(site, name):
    document = page(site, name)
    text = text_of(document)
    assert not ROLE.findall(document), ROLE.findall(document)[:5]
    assert "``" not in document, re.findall(r".{40}``.{40}", text)[:5]
    assert not re.findall(r"\w::\s*$", text, re.M), "a paragraph still ends in '::'"
    assert "doc doc-object" in document, "the page rendered no API object"


def test_cross_references_resolve_to_the_reference(site):
    """Roles became links (strict mkdocs fails a link whose target is missing); a name the
    reference shows is a link, wherever the docstring that names it lives."""
    client = page(site, "api")
    assert re.search(
        r'<a [^>]*href="#sentinel.errors.ValidationError"|'
        r'href="events-errors/#sentinel.errors.ValidationError"',
        client,
    )
    assert 'href="#sentinel.Sentinel.start"' in client  # :meth:`start` inside Sentinel
    assert "<autoref" not in client


def test_plug_in_anchors_are_the_installed_names(site):
    policies = page(site, "api/policies")
    assert 'id="sentinel.policies.MinLag"' in policies
    assert 'id="sentinel.balancers.RoundRobin"' in policies or (
        'id="sentinel.balancers.Random"' in policies
    )
    assert 'id="policies.' not in policies and 'id="balancers.' not in policies


def test_the_side_panel_lists_each_class_s_methods(site):
    client = page(site, "api")
    start = client.index('class="md-nav md-nav--secondary"')
    toc = client[start : client.index('class="md-content"', start)]
    for method in ("get_service", "register", "close"):
        assert f'href="#sentinel.Sentinel.{method}"' in toc, method
    assert 'href="#sentinel.shards.writer.ShardMapWriter.assign"' in toc


def test_no_page_loads_anything_from_another_host(site):
    """The site reads offline: no script, stylesheet, font or image from elsewhere."""
    for document in site.rglob("*.html"):
        text = document.read_text()
        loaded = re.findall(r'<(?:script|link|img)\b[^>]*(?:src|href)="(https?:)?//', text)
        assert not loaded, f"{document.relative_to(site)} loads from another host"


def test_the_diagrams_are_drawn_from_their_sources(site):
    sources = sorted((ROOT / "docs" / "diagrams").glob("*.dot"))
    assert {p.stem for p in sources} >= {"architecture", "znodes"}
    for source in sources:
        drawn = site / "diagrams" / f"{source.stem}.svg"
        assert drawn.read_text().lstrip().startswith(("<?xml", "<svg")), drawn
    pages = "".join(p.read_text() for p in site.rglob("*.html"))
    for source in sources:
        assert f"diagrams/{source.stem}.svg" in pages, f"no page shows {source.stem}"


# In the browser, every page at once, each in a 1280 px wide frame. A table of the API
# reference must fit the text column outright; elsewhere a table may scroll sideways inside its
# own frame (Material's way with a table of many figures), but the frame must not run past the
# column. What breaks either rule is listed in an attribute that --dump-dom prints.
MEASURE = """<!doctype html><html><body>%(frames)s<script>
window.addEventListener("load", () => {
  const wide = [];
  let tables = 0;
  document.querySelectorAll("iframe").forEach((frame) => {
    const page = frame.contentDocument;
    const column = page.querySelector("article.md-content__inner");
    // Material's frame reaches into the column's margin by design: the content area's edge.
    const textEdge = column.getBoundingClientRect().right + 1;
    const contentEdge = page.querySelector(".md-content").getBoundingClientRect().right + 1;
    const reference = frame.dataset.page.startsWith("api");
    page.querySelectorAll("article table").forEach((table) => {
      tables += 1;
      const frameOf = table.closest(".md-typeset__scrollwrap") || table.parentElement;
      const box = (reference ? table : frameOf).getBoundingClientRect();
      const scrolls = frameOf.scrollWidth > frameOf.clientWidth + 1;
      if (box.right > (reference ? textEdge : contentEdge) || (reference && scrolls)) {
        wide.push([frame.dataset.page, Math.round(box.width), Math.round(column.clientWidth),
                   table.querySelector("tr").innerText.slice(0, 80)]);
      }
    });
  });
  document.body.setAttribute("data-wide-tables", JSON.stringify(wide));
  document.body.setAttribute("data-tables", tables);
});
</script></body></html>"""


def measured(site: Path) -> list[str]:
    """Every page of the site that holds a table."""
    return sorted(
        str(p.parent.relative_to(site))
        for p in site.rglob("index.html")
        if p.parent != site and "<table" in p.read_text()
    )


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def test_no_table_is_wider_than_its_column_at_1280_px(site):
    browser = chromium()
    if browser is None:
        pytest.skip("headless Chromium is not installed (apt-get install chromium)")
    pages = measured(site)
    assert set(API_PAGES) & set(pages), "the reference's tables are among those measured"
    assert "benchmarks" in pages  # and the widest tables of the guides
    frames = "".join(
        f'<iframe data-page="{name}" src="{name}/index.html" '
        'style="width:1280px;height:900px;border:0"></iframe>'
        for name in pages
    )
    measure = site / "measure-tables.html"
    measure.write_text(MEASURE % {"frames": frames})
    result = subprocess.run(
        [
            browser,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--window-size=1300,900",
            "--allow-file-access-from-files",
            "--virtual-time-budget=10000",
            "--dump-dom",
            measure.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    measure.unlink()
    tables = re.search(r'data-tables="(\d+)"', result.stdout)
    assert tables, f"the pages were not measured: {result.stderr[-500:]}"
    # Every frame was measured: as many tables as the pages' HTML holds.
    assert int(tables[1]) == sum(page(site, name).count("<table") for name in pages)
    wide = json.loads(html.unescape(re.search(r'data-wide-tables="([^"]*)"', result.stdout)[1]))
    assert wide == [], f"tables wider than the column: {wide}"


def test_every_table_is_sized_by_the_stylesheet(site):
    """The structural half, for a machine without a browser: the stylesheet that keeps the
    reference's tables within the column is on every reference page, and its parameter tables
    are the ones it sizes."""
    css = (site / "css" / "reference.css").read_text()
    assert "overflow-wrap: anywhere" in css and "table-layout: fixed" in css
    assert "white-space: pre-wrap" in css  # a code block in a cell wraps too
    for name in API_PAGES:
        text = page(site, name)
        assert "css/reference.css" in text, name
        for table in re.findall(r"<table.*?</table>", text, re.S):
            if "<th>Default</th>" in table:
                start = text.index(table)
                assert text.rfind('<div class="doc-parameters">', 0, start) > text.rfind(
                    "</table>", 0, start
                ), f"{name}: a parameter table outside div.doc-parameters"
