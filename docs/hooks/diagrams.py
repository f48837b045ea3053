"""mkdocs hook: each Graphviz source in docs/diagrams/ (``name.dot``) is drawn as
``diagrams/name.svg`` when the site is built, so a page shows it with
``![...](diagrams/name.svg)`` and the picture never drifts from its source.

Graphviz's ``dot`` must be installed (Debian: ``apt-get install graphviz``; ``./run.sh test``
installs it); without it the build stops and says so.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files


def render(source: Path) -> str:
    """The SVG Graphviz draws from ``source``."""
    dot = shutil.which("dot")
    if dot is None:
        raise PluginError(
            f"drawing {source.name} needs Graphviz's dot: install graphviz "
            "(Debian: apt-get install graphviz)"
        )
    result = subprocess.run(
        [dot, "-Tsvg", str(source)], capture_output=True, text=True, timeout=60, check=False
    )
    if result.returncode != 0:
        raise PluginError(f"dot could not draw {source.name}: {result.stderr.strip()}")
    return result.stdout


def on_files(files: Files, config: MkDocsConfig) -> Files:
    """Add ``diagrams/NAME.svg`` for every ``diagrams/NAME.dot`` of the docs."""
    for source in sorted((Path(config.docs_dir) / "diagrams").glob("*.dot")):
        uri = f"diagrams/{source.stem}.svg"
        files.append(File.generated(config, uri, content=render(source)))
    return files
