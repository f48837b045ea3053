"""No module of the library reads or writes another object's private attributes.

The rule, checked on the source (``ast``) of every module under ``sentinel/``, ``policies/`` and
``balancers/``: an attribute access ``X._name`` (one leading underscore; dunders are Python's
own) is allowed only when

1. ``X`` is ``self``, ``cls`` or ``super()``: the object's own attribute;
2. ``X`` is a class defined in the same module (``Session._forked(session)``): a module may use
   what it defines, the underscore's meaning in Python;
3. ``X`` is a plain name the same function says is an instance of a class of its module: a
   parameter annotated with that class, a name assigned ``C(...)``, or a name tested with
   ``isinstance(X, C)`` (``__eq__`` comparing its own kind);
4. ``_name`` is one of a named tuple's methods (``_asdict``, ``_replace``, ``_make``,
   ``_fields``): public despite their underscore (Python's documentation says so);

or when the access is named in :data:`ALLOWED` with the reason it is right. Everything else
(``sentinel._zk`` in a daemon, ``client._snapshots`` in a helper, ``kazoo_client._state``
outside the contained extension) fails, with the file, line and expression.

The role daemons reach a client's session, nodes, watches and cache through the one internal
seam, :class:`sentinel.session.Session` (``client.session``), not through the client's private
attributes. Tests and benchmarks are not checked: they instrument internals on purpose.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CHECKED = ("sentinel", "policies", "balancers")
NAMEDTUPLE_API = frozenset({"_asdict", "_replace", "_make", "_fields"})

# (file, expression) -> why it is right. A file alone ("*") allows every access in it.
ALLOWED: dict[tuple[str, str], str] = {
    ("sentinel/zk/kazoo_internals.py", "*"): (
        "THE one place that touches kazoo's private names, by design: its table lists each "
        "name it needs and install() checks kazoo's version and every name's presence and "
        "shape, falling back to plain kazoo with one warning (docs/zookeeper.md)"
    ),
    ("sentinel/integrations/httpx.py", "url._uri_reference._replace"): (
        "routed_url combines httpx's parsed URL forms instead of printing and re-parsing "
        "(most of the routing's cost); _has_parsed_forms() checks the form at import and "
        "routed_url falls back to the public copy_with() without it"
    ),
    ("sentinel/integrations/httpx.py", "url._uri_reference"): "see url._uri_reference._replace",
    ("sentinel/integrations/httpx.py", "routed._uri_reference"): (
        "see url._uri_reference._replace"
    ),
    ("sentinel/integrations/httpx.py", "httpx.URL(uri)._uri_reference"): (
        "see url._uri_reference._replace"
    ),
    ("sentinel/cli/*", "argparse._SubParsersAction"): (
        "the type argparse's add_subparsers() returns, in annotations only: argparse gives it "
        "no public name"
    ),
}


def _matches(where: str, path: str) -> bool:
    return where == path or (where.endswith("/*") and path.startswith(where[:-1]))


def _allowed(path: str, expression: str) -> bool:
    return any(_matches(where, path) and what in ("*", expression) for where, what in ALLOWED)


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _own_kind(function: ast.AST, classes: set[str]) -> set[str]:
    """The plain names ``function`` says are instances of one of the module's ``classes``."""
    names: set[str] = set()
    if isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
        arguments = function.args
        for argument in (*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs):
            annotation = argument.annotation
            if annotation is not None and ast.unparse(annotation).strip("'\"") in classes:
                names.add(argument.arg)
    for node in ast.walk(function):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            made = node.value.func
            if isinstance(made, ast.Name) and made.id in classes:
                names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif (
            isinstance(node, ast.Call)
            and ast.unparse(node.func) == "isinstance"
            and len(node.args) == 2
            and isinstance(node.args[0], ast.Name)
            and ast.unparse(node.args[1]) in classes
        ):
            names.add(node.args[0].id)
    return names


def violations(source: str, path: str) -> list[str]:
    """``path:line: expression`` for each access in ``source`` the rule refuses, by line."""
    return [f"{path}:{line}: {expression}" for line, expression in sorted(_refused(source, path))]


def _refused(source: str, path: str) -> Iterator[tuple[int, str]]:
    tree = ast.parse(source)
    classes = {node.name for node in ast.walk(tree) if isinstance(node, ast.ClassDef)}
    own_kind: dict[int, set[str]] = {}  # id of an attribute node -> names of the own kind

    def visit(node: ast.AST, kind: set[str]) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            kind = kind | _own_kind(node, classes)
        if isinstance(node, ast.Attribute):
            own_kind[id(node)] = kind
        for child in ast.iter_child_nodes(node):
            visit(child, kind)

    visit(tree, set())
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or not _private(node.attr):
            continue
        owner = node.value
        if node.attr in NAMEDTUPLE_API:
            continue
        if isinstance(owner, ast.Name) and owner.id in {"self", "cls", *classes}:
            continue
        if isinstance(owner, ast.Call) and ast.unparse(owner.func) == "super":
            continue
        if isinstance(owner, ast.Name) and owner.id in own_kind[id(node)]:
            continue
        expression = ast.unparse(node)
        if not _allowed(path, expression):
            yield node.lineno, expression


def library_violations() -> list[str]:
    """Every refused access in the library's modules."""
    found = []
    for package in CHECKED:
        for file in sorted((ROOT / package).rglob("*.py")):
            path = file.relative_to(ROOT).as_posix()
            found.extend(violations(file.read_text(), path))
    return found


def test_no_module_touches_another_objects_private_attributes():
    found = library_violations()
    assert not found, "private attributes reached from outside their object:\n" + "\n".join(found)


def test_every_allowed_exception_is_still_there():
    # An entry whose access is gone would quietly allow a new one: each must still match.
    sources = {
        file.relative_to(ROOT).as_posix(): file.read_text()
        for package in CHECKED
        for file in (ROOT / package).rglob("*.py")
    }
    for where, what in ALLOWED:
        paths = [p for p in sources if _matches(where, p)]
        assert paths, where
        if what == "*":
            continue
        seen = {
            ast.unparse(node)
            for path in paths
            for node in ast.walk(ast.parse(sources[path]))
            if isinstance(node, ast.Attribute)
        }
        assert what in seen, (where, what)


def test_the_rule_refuses_other_objects_privates_and_allows_the_own_kind():
    source = """
import argparse
from kazoo.client import KazooClient

class Own:
    def __init__(self, other: "Own", client, zk: KazooClient) -> None:
        self._x = other._x                      # a parameter annotated with its class
        self._zk = client._zk                   # another object's: refused
        self._state = zk._state                 # kazoo's: refused
        super()._setup()
        made = Own(other, client, zk)
        made._x
        Own._helper(made)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Own) and other._x == self._x

    def named(self, point):
        return point._replace(x=1), point._asdict()

def hook(session):
    session._forked()                           # not said to be an Own: refused
"""
    assert violations(source, "sentinel/made_up.py") == [
        "sentinel/made_up.py:8: client._zk",
        "sentinel/made_up.py:9: zk._state",
        "sentinel/made_up.py:22: session._forked",
    ]
