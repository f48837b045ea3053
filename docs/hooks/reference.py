"""The API reference's Griffe extension: docstrings written for Python's ``help()`` (reST
roles, double-backquote literals, ``::`` blocks) become the site's Markdown when the site is
built, and the plug-in folders are read under the names they are installed as.

The docstrings stay as they are in the code; only the copy Griffe hands to mkdocstrings is
converted (docs/decisions/docstrings-converted-at-build-time.md says why). mkdocs.yml names
this file in the Python handler's ``extensions``.

- ``:class:`~sentinel.errors.ValidationError```, ``:meth:`start```, ``:func:``, ``:attr:``,
  ``:mod:``, ``:data:``, ``:exc:``, ``:obj:`` become cross-references (``[`title`][path]``)
  to the object's canonical path, which mkdocs-autorefs resolves to wherever the reference
  renders it; a relative name is looked up as Sphinx does: in the current class, its module,
  then as written. A name outside the project (``DeprecationWarning``) becomes code.
- ````literal```` becomes a code span; a paragraph ending in ``::`` followed by an indented
  block becomes the paragraph (ending in ``:``) and a fenced code block.
- A docstring parameter's default (``default ``$SENTINEL_ZK``, else ...``) is made Markdown
  (a Python value as code, prose with its literals as code spans) in a
  ``<span class="doc-default">``, which docs/templates renders as Markdown.
- ``policies/`` and ``balancers/`` are read as ``sentinel.policies`` and ``sentinel.balancers``
  (pyproject.toml's ``package-dir``), so their anchors are the names a user imports.
- docs/api/examples/ holds a runnable example for each public method of the facade and its role
  objects (tests/integration/test_api_examples.py runs them); each is added to its method's
  docstring as its Examples section.
"""

from __future__ import annotations

import ast
import re
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import griffe

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "docs" / "api" / "examples"

ROLES = ("class", "meth", "func", "attr", "mod", "data", "exc", "obj")
ROLE = re.compile(r":(?:py:)?(?P<role>" + "|".join(ROLES) + r"):`(?P<body>[^`]+)`")
LITERAL = re.compile(r"``(?P<text>[^`]+?)``")
# A numpy parameter line: "name : type, default <prose>".
PARAMETER_DEFAULT = re.compile(r"^(?P<head>\s*\S[^:\n]* : [^\n]*?, default )(?P<default>.+)$", re.M)


def installed_packages(pyproject: Path = ROOT / "pyproject.toml") -> dict[str, Path]:
    """``sentinel.policies`` -> the folder setuptools installs it from (``package-dir``)."""
    setuptools = tomllib.loads(pyproject.read_text())["tool"]["setuptools"]
    return {name: ROOT / folder for name, folder in setuptools.get("package-dir", {}).items()}


# --- reST to Markdown, one docstring at a time ------------------------------------------------


def convert(text: str, resolve: Any) -> str:
    """The docstring ``text`` as Markdown; ``resolve(target)`` gives a role's target its
    canonical path, or None for a name outside the project."""
    out: list[str] = []
    for kind, chunk in _split_code(text):
        out.append(chunk if kind == "code" else _inline(chunk, resolve))
    return "".join(out)


def _split_code(text: str) -> Iterator[tuple[str, str]]:
    """The text in pieces: ("prose", ...) with ``::`` blocks turned into fenced ("code", ...)
    blocks, and fenced blocks already there kept as ("code", ...)."""
    lines = text.split("\n")
    prose: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.lstrip().startswith("```"):  # a fence written in Markdown already: keep it
            end = i + 1
            while end < len(lines) and not lines[end].lstrip().startswith("```"):
                end += 1
            yield "prose", "\n".join(prose) + "\n" if prose else ""
            prose = []
            yield "code", "\n".join(lines[i : end + 1]) + "\n"
            i = end + 1
            continue
        block = _literal_block(lines, i) if line.rstrip().endswith("::") else None
        if block is None:
            prose.append(line)
            i += 1
            continue
        end, indent, body = block
        before = line.rstrip()[:-2].rstrip()
        if before.strip():
            prose.append(before + ":" if not line.rstrip().endswith(" ::") else before)
        yield "prose", "\n".join(prose) + "\n" if prose else ""
        prose = []
        fence = f"{indent}```{_language(body)}\n"
        code = "".join(f"{indent}{b}\n" if b else "\n" for b in body)
        yield "code", f"\n{fence}{code}{indent}```\n"
        i = end
    if prose:
        yield "prose", "\n".join(prose)


def _literal_block(lines: list[str], i: int) -> tuple[int, str, list[str]] | None:
    """The indented block after line ``i`` (which ends in ``::``): the index after it, the
    paragraph's indentation, and the block's lines without their extra indentation."""
    indent = re.match(r"\s*", lines[i]).group()
    j = i + 1
    while j < len(lines) and not lines[j].strip():
        j += 1
    if j == len(lines) or j == i + 1:
        return None
    deeper = re.match(r"\s*", lines[j]).group()
    if len(deeper) <= len(indent):
        return None
    body: list[str] = []
    while j < len(lines) and (not lines[j].strip() or lines[j].startswith(deeper)):
        body.append(lines[j][len(deeper) :])
        j += 1
    while body and not body[-1].strip():
        body.pop()
        j -= 1
    return j, indent, body


def _language(body: list[str]) -> str:
    if body and body[0].startswith(">>>"):
        return "pycon"
    if body and body[0].startswith("$ "):
        return "console"
    try:
        ast.parse("\n".join(body))
    except SyntaxError:
        return "text"
    return "python"


def _inline(text: str, resolve: Any) -> str:
    """Roles to cross-references, literals to code spans, prose defaults to Markdown."""

    def role(match: re.Match[str]) -> str:
        body = match["body"]
        title, _, explicit = body.partition(" <")
        if explicit:
            target = explicit.removesuffix(">")
        else:
            target, title = body, None
        shortened = target.startswith("~")
        target = target.lstrip("~!.")
        name = target.removesuffix("()")
        if title is None:
            title = name.rsplit(".", 1)[-1] if shortened else name
            if match["role"] in ("meth", "func") and not title.endswith(")"):
                title += "()"
        path = resolve(name)
        return f"`{title}`" if path is None else f"[`{title}`][{path}]"

    text = PARAMETER_DEFAULT.sub(
        lambda m: f'{m["head"]}<span class="doc-default">{_default(m["default"])}</span>', text
    )
    text = ROLE.sub(role, text)
    return LITERAL.sub(lambda m: f"`{m['text']}`", text)


def _default(prose: str) -> str:
    """A parameter's default as Markdown: a Python value as code (``10.0``), a value with a
    note in parentheses as code and the note (``None (plain TCP)``), anything else as the
    prose it is, whose literals become code spans later."""
    stripped = prose.strip()
    if "``" in stripped:
        return prose
    head, _, note = stripped.partition(" (")
    if note and not note.endswith(")"):
        return prose
    try:
        ast.literal_eval(head)
    except (SyntaxError, ValueError):
        return prose
    return f"`{head}` ({note}" if note else f"`{head}`"


# --- names: the role's target looked up from where the docstring is ------------------------


def resolver(obj: griffe.Object, collection: griffe.ModulesCollection, shown: set[str]) -> Any:
    """``resolve(target)`` for docstrings of ``obj``: the canonical path of the object the
    target names, or None when the reference does not show that object (it is private, or
    outside the project): the name is then code, not a link."""
    scopes: list[str] = []
    here: griffe.Object | None = obj
    while here is not None:
        if here.is_class or here.is_module:
            scopes.append(here.path)
        here = here.parent
    scopes.append("")

    def resolve(target: str) -> str | None:
        for scope in scopes:
            found = _lookup(collection, f"{scope}.{target}" if scope else target)
            if found is not None:
                return found if found in shown else None
        return None

    return resolve


def _lookup(collection: griffe.ModulesCollection, path: str) -> str | None:
    try:
        found = collection.get_member(path)
    except (KeyError, ValueError, griffe.AliasResolutionError, griffe.CyclicAliasError):
        return None
    try:
        return found.canonical_path if not found.is_alias else found.final_target.canonical_path
    except (griffe.AliasResolutionError, griffe.CyclicAliasError):
        return None  # an import of a name outside the project


def shown(collection: griffe.ModulesCollection, pages: Path = ROOT / "docs" / "api") -> set[str]:
    """The canonical paths of the objects the reference's pages show: each ``::: name`` of
    docs/api/*.md and its documented public members (a module's submodules have their own
    ``:::``; a module's imports count where its ``__all__`` exports them)."""
    found: set[str] = set()

    def add(obj: griffe.Object | griffe.Alias, root: bool) -> None:
        try:
            target = obj.final_target if obj.is_alias else obj
        except (griffe.AliasResolutionError, griffe.CyclicAliasError):
            return
        if not root and (not target.has_docstrings or target.canonical_path in found):
            return
        found.add(target.canonical_path)
        for name, member in target.members.items():
            if name.startswith("_") or (member.is_alias and not member.is_exported):
                continue
            try:
                if not member.is_module:
                    add(member, False)
            except (griffe.AliasResolutionError, griffe.CyclicAliasError):
                continue  # an export of a name from outside the project

    for page in sorted(pages.glob("*.md")):
        for identifier in re.findall(r"^::: (\S+)", page.read_text(), re.M):
            try:
                add(collection.get_member(identifier), True)
            except (KeyError, griffe.AliasResolutionError):
                continue
    return found


# --- examples kept beside the reference -------------------------------------------------------

HEADING = re.compile(r"^## (?P<name>\S+)\s*$", re.M)
FENCE = re.compile(r"^```pycon\n(?P<code>.*?)^```\n", re.M | re.S)


def examples(directory: Path = EXAMPLES) -> dict[str, str]:
    """Each documented object's path -> its examples (prose and ``>>>`` lines), from the
    files of ``directory``: one file per class, ``## name`` per member (``## .`` is the
    class itself)."""
    found: dict[str, str] = {}
    for page in sorted(directory.glob("*.md")):
        owner = page.stem
        parts = HEADING.split(page.read_text())
        for name, body in zip(parts[1::2], parts[2::2], strict=True):
            path = owner if name == "." else f"{owner}.{name}"
            found[path] = FENCE.sub(lambda m: m["code"] + "\n", body).strip()
    return found


# --- the extension ------------------------------------------------------------------------------


class SentinelReference(griffe.Extension):
    """Installed names for the plug-in folders; docstrings as Markdown, with examples."""

    def __init__(self) -> None:
        super().__init__()
        self._examples = examples()

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **_: Any) -> None:
        if pkg.path != "sentinel":
            return
        collection = loader.modules_collection
        for name, folder in installed_packages().items():
            parent, _, leaf = name.rpartition(".")
            _graft(collection.get_member(parent), leaf, folder, loader)
        # Examples are filed under the names users import; docstrings belong to the
        # canonical objects.
        by_object = {_lookup(collection, p) or p: text for p, text in self._examples.items()}
        documented = shown(collection)
        for obj in _walk(pkg):
            if obj.docstring is None:
                continue
            text = convert(obj.docstring.value, resolver(obj, collection, documented))
            if obj.path in by_object:
                text += "\n\nExamples\n--------\n" + by_object[obj.path]
            obj.docstring.value = text


def _graft(parent: griffe.Module, name: str, folder: Path, loader: griffe.GriffeLoader) -> None:
    """Read ``folder`` as the package ``parent.name`` (the plug-in folders install inside
    sentinel, so relative imports and anchors follow the installed name)."""
    options = {
        "extensions": loader.extensions,
        "docstring_parser": loader.docstring_parser,
        "docstring_options": loader.docstring_options,
        "lines_collection": loader.lines_collection,
        "modules_collection": loader.modules_collection,
    }
    init = folder / "__init__.py"
    package = griffe.visit(name, init, init.read_text(), parent=parent, **options)
    parent.set_member(name, package)
    for module in sorted(folder.glob("*.py")):
        if module.name != "__init__.py":
            code = module.read_text()
            package.set_member(
                module.stem, griffe.visit(module.stem, module, code, parent=package, **options)
            )
    loader.expand_exports(package)


def _walk(obj: griffe.Object) -> Iterator[griffe.Object]:
    yield obj
    for member in obj.members.values():
        if not member.is_alias:
            yield from _walk(member)


__all__ = ["SentinelReference", "convert", "examples", "installed_packages"]
