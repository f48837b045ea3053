"""The public surface, declared: each module the docs import from, or the API reference renders
whole, has an ``__all__``, and it is exactly the names the docs document for that module.

"Documented" is read from the docs themselves, not from the code:

- the names the Python examples of docs/*.md, docs/api/ and README.md import from the module,
  and the module's names a page that imports from it mentions in its prose (``LOCAL_ONLY``,
  ``Credential``);
- the objects the API reference shows (docs/api/*.md's ``::: name`` lines, rendered by
  mkdocstrings as mkdocs.yml configures it: a module's public members that have a docstring,
  its imports where its ``__all__`` exports them), at their canonical path;
- for ``sentinel`` itself, the names its package docstring introduces (``:class:`Name```).

A name exported but documented nowhere fails, so does a name the docs import that the module
does not export, and so does an export without a docstring (``help()`` is a user's first
reference). httpx keeps the same contract (its tests/test_exported_members.py) by naming every
internal with an underscore; here the docs are the declaration instead.
"""

from __future__ import annotations

import ast
import importlib.util
import re
import textwrap
from collections import defaultdict
from functools import cache
from pathlib import Path
from typing import Any

import griffe
import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
# A fenced Python example, or a pycon one (docs/api/examples/), at any indentation.
FENCE = re.compile(r"^ *```(?P<lang>python|pycon)\n(?P<code>.*?)^ *```", re.S | re.M)
DIRECTIVE = re.compile(r"^::: (\S+)", re.M)
# A name in a page's prose: `LOCAL_ONLY`, `Failover()`, `Credential.version`.
MENTION = re.compile(r"`(?P<name>[A-Za-z]\w*)(?:[.(][^`]*)?`")
ROLE = re.compile(r":(?:class|func|data|obj):`~?(?:sentinel\.)?(?P<name>\w+)`")
# Read from the installed distribution's metadata: a value, which has no docstring of its own.
VALUES = {"__version__"}

_spec = importlib.util.spec_from_file_location("reference", ROOT / "docs/hooks/reference.py")
reference = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(reference)


def mentions(page: Path) -> set[str]:
    """The names in ``page``'s prose, its examples left out."""
    return set(MENTION.findall(FENCE.sub("", page.read_text())))


def examples() -> list[tuple[Path, str]]:
    """Every Python example of the docs, as a program."""
    found = []
    for page in PAGES:
        for match in FENCE.finditer(page.read_text()):
            code = textwrap.dedent(match["code"])
            if match["lang"] == "pycon":
                code = "\n".join(
                    line[4:] for line in code.splitlines() if line[:4] in (">>> ", "... ")
                )
            found.append((page, code))
    return found


@cache
def page_imports() -> dict[tuple[Path, str], set[str]]:
    """(page, module) -> the names the page's examples import from the module (``import m``
    counts the module, with no name)."""
    imported: dict[tuple[Path, str], set[str]] = defaultdict(set)
    for page, code in examples():
        try:
            tree = ast.parse(code)
        except SyntaxError:
            continue  # a fragment (``stub.Charge(...)``), not a program
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "sentinel":
                imported[page, node.module].update(alias.name for alias in node.names)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] == "sentinel":
                        imported[page, alias.name] |= set()
    return dict(imported)


def doc_imports() -> dict[str, set[str]]:
    """Module -> the names the docs' examples import from it."""
    imported: dict[str, set[str]] = defaultdict(set)
    for (_, module), names in page_imports().items():
        imported[module] |= names
    return dict(imported)


def holds(module: str, name: str) -> bool:
    """Whether ``module.name`` is a public object the module defines, or, for a package, one
    its ``__init__`` imports from the project (a package's names are its re-exports)."""
    try:
        owner = collection().get_member(module)
        member = owner.members[name]
        target = member.final_target if member.is_alias else member
    except (KeyError, griffe.AliasResolutionError, griffe.CyclicAliasError):
        return False
    if name.startswith("_") or target.is_module or not target.path.startswith("sentinel."):
        return False
    return not member.is_alias or owner.is_init_module


def directives() -> list[str]:
    """The reference's ``::: name`` lines, page by page."""
    return [
        d
        for page in sorted((ROOT / "docs/api").glob("*.md"))
        for d in DIRECTIVE.findall(page.read_text())
    ]


class _InstalledNames(griffe.Extension):
    """policies/ and balancers/ read as sentinel.policies and sentinel.balancers, as the
    reference reads them (docs/hooks/reference.py), without its docstring conversion."""

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **_: Any) -> None:
        if pkg.path == "sentinel":
            for name, folder in reference.installed_packages().items():
                parent, _, leaf = name.rpartition(".")
                reference._graft(loader.modules_collection.get_member(parent), leaf, folder, loader)


@cache
def collection() -> griffe.ModulesCollection:
    loader = griffe.GriffeLoader(
        search_paths=[str(ROOT)], extensions=griffe.load_extensions(_InstalledNames)
    )
    loader.load("sentinel")
    return loader.modules_collection


def rendered(module: griffe.Module) -> set[str]:
    """The members mkdocstrings shows of ``::: module`` (mkdocs.yml: ``filters: ["!^_"]``, no
    member without a docstring, an import only where ``__all__`` exports it, submodules on
    their own pages)."""
    names = set()
    for name, member in module.members.items():
        if name.startswith("_") or (member.is_alias and not member.is_exported):
            continue
        target = member.final_target if member.is_alias else member
        if not target.is_module and target.has_docstrings:
            names.add(name)
    return names


@cache
def documented() -> dict[str, set[str]]:
    """Module -> the names the docs document for it."""
    found: dict[str, set[str]] = defaultdict(set)
    for (page, module), names in page_imports().items():
        found[module] |= names
        found[module] |= {name for name in mentions(page) if holds(module, name)}
    objects = collection()
    for path in reference.shown(objects):
        module, _, name = path.rpartition(".")
        owner = objects.get_member(module) if module else None
        if owner is not None and owner.is_module and not objects.get_member(path).is_module:
            found[module].add(name)
    for identifier in directives():
        obj = objects.get_member(identifier)
        if obj.is_module:
            found[identifier] |= rendered(obj)
        else:
            module, _, name = identifier.rpartition(".")
            found[module].add(name)
    found["sentinel"] |= introduced()
    return dict(found)


def public_modules() -> list[str]:
    """The modules the docs import from, and those the reference renders whole."""
    whole = [d for d in directives() if collection().get_member(d).is_module]
    return sorted({*doc_imports(), *whole})


def test_the_docs_import_from_and_render_the_modules_expected(model):
    # The scan itself: if it found nothing, every test below would pass on nothing.
    modules = public_modules()
    assert {
        "sentinel",
        "sentinel.errors",
        "sentinel.testing.zookeeper",
        "sentinel.policies",
    } <= set(modules), modules
    assert {"Sentinel", "CacheConfig", "TlsConfig"} <= doc_imports()["sentinel"]
    assert "LocalZooKeeper" in documented()["sentinel.testing.zookeeper"]


def exports(name: str) -> list[str] | None:
    """The module's ``__all__``, read as the reference reads it (from this checkout: the
    plug-in folders under their installed names, whatever the environment installed)."""
    declared = collection().get_member(name).exports
    return None if declared is None else [str(export) for export in declared]


@pytest.fixture(scope="module")
def model() -> griffe.ModulesCollection:
    """The code as the reference reads it, loaded once (seconds): a module-scoped fixture keeps
    this module's tests on one worker of the suite (tests/conftest.py)."""
    return collection()


# One test for all the modules, not one per module: a parametrized list would load the model
# at collection, on every worker.
def test_the_exports_are_what_the_docs_document(model):
    wrong = []
    for name in public_modules():
        exported = exports(name)
        want = documented().get(name, set())
        if exported is None:
            wrong.append(f"{name}: the docs import from it or render it, but it has no __all__")
        elif len(exported) != len(set(exported)):
            wrong.append(f"{name}: __all__ repeats a name")
        elif set(exported) != want:
            wrong.append(
                f"{name}: exported, not documented: {sorted(set(exported) - want)}; "
                f"documented, not exported: {sorted(want - set(exported))}"
            )
    assert not wrong, "\n".join(wrong)


def test_every_export_exists_and_has_a_docstring(model):
    wrong = []
    for name in public_modules():
        module = model.get_member(name)
        for export in exports(name) or ():
            if export not in module.members:
                wrong.append(f"{name}.__all__ names {export}, which it does not have")
                continue
            member = module.members[export]
            target = member.final_target if member.is_alias else member
            if export not in VALUES and not (target.docstring and target.docstring.value.strip()):
                wrong.append(f"{name}.{export} ({target.canonical_path}) has no docstring")
    assert not wrong, "\n".join(wrong)


def introduced() -> set[str]:
    """The names ``sentinel``'s package docstring introduces."""
    text = collection().get_member("sentinel").docstring.value
    return set(ROLE.findall(text)) | (VALUES & set(re.findall(r"``(\w+)``", text)))


def test_the_package_docstring_introduces_every_export_and_only_those(model):
    exported = set(exports("sentinel") or ())
    assert introduced() == exported, (
        f"exported, not introduced: {sorted(exported - introduced())}; "
        f"introduced, not exported: {sorted(introduced() - exported)}"
    )
