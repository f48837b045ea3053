"""The import graph of sentinel with its plug-in packages, drawn from the source, has no circle,
and the core never loads a plug-in package when it is imported.

No circle, counting every import: also those under ``if TYPE_CHECKING:`` and those inside
functions. A circle hidden that way still ties two modules together: neither can be read,
changed or moved alone, and a deferred import only moves the failure to the first call.

Loading, counting only the imports that run when a module is imported: those at module level,
in module-level ``if``/``try``/``with`` blocks, but not under ``if TYPE_CHECKING:`` and not
inside functions.

Floors, counting every import: the modules stand on floors (``FLOORS``, lowest first, drawn in
docs/overview.md), each package whole on its package's floor, and no import climbs one, unless
it is named in ``UPWARD`` with its reason (none is).

Rooms, counting every import: each module or package right under ``sentinel`` (and each plug-in
package) is one room, as ``farm-studio look`` draws the house; stood each on a floor above
everything it imports, no import climbs back up (a circle of rooms makes one climb) but those
named in ``ROOM_CLIMBS``, at most three, each explained in a decision record (none is).

``from a import b`` is an edge to ``a.b`` when that is a module, else to ``a``. Importing
``a.b`` also runs ``a/__init__``, but no edge is drawn to parent packages: ``sentinel/__init__``
is lazy, and counting it would make every module of a package depend on all of it.
"""

from __future__ import annotations

import ast
import functools
import tomllib
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Installed package name to its folder: the plug-in folders at the repository's root install
# inside sentinel (pyproject.toml's package-dir), and their modules are named as installed.
PACKAGES = {
    "sentinel": "sentinel",
    **tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"],
}
PLUGINS = ("sentinel.policies", "sentinel.balancers")
# An application of the SDK shipped with it (``sentinel demo``): it uses the built-in policies as
# any application would. The CLI imports it only when the demo runs, and the check below makes
# sure no other module reaches it at import time.
APPLICATIONS = ("sentinel.demo",)


def modules(root: Path, packages: Iterable[str] | Mapping[str, str]) -> dict[str, Path]:
    """Every module of ``packages`` under ``root``, by dotted name; a mapping gives each
    package's folder (relative to ``root``), else a package's folder is its name."""
    folders = packages if isinstance(packages, Mapping) else {p: p for p in packages}
    found = {}
    for package, folder in folders.items():
        for path in (root / folder).rglob("*.py"):
            parts = (*package.split("."), *path.relative_to(root / folder).with_suffix("").parts)
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return ast.unparse(test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")


def _import_time_statements(body: list[ast.stmt]) -> Iterator[ast.Import | ast.ImportFrom]:
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.If):
            if not _is_type_checking(node.test):
                yield from _import_time_statements(node.body)
            yield from _import_time_statements(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody, *(h.body for h in node.handlers)):
                yield from _import_time_statements(block)
        elif isinstance(node, ast.With):
            yield from _import_time_statements(node.body)


def _every_import(body: list[ast.stmt]) -> Iterator[ast.Import | ast.ImportFrom]:
    for statement in body:
        for node in ast.walk(statement):
            if isinstance(node, ast.Import | ast.ImportFrom):
                yield node


def graph(known: dict[str, Path], *, every: bool = False) -> dict[str, set[str]]:
    """Each module's import-time imports among ``known``; with ``every``, all its imports
    (also typing-only ones and those inside functions)."""
    statements = _every_import if every else _import_time_statements

    def resolve(name: str) -> str | None:
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name or None

    edges: dict[str, set[str]] = {}
    for module, path in known.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        targets: set[str | None] = set()
        for node in statements(ast.parse(path.read_text()).body):
            if isinstance(node, ast.Import):
                targets.update(resolve(alias.name) for alias in node.names)
                continue
            base = package
            for _ in range(node.level - 1):
                base = base.rpartition(".")[0]
            source = ".".join(filter(None, (base if node.level else "", node.module or "")))
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                targets.add(submodule if submodule in known else resolve(source))
        edges[module] = {t for t in targets if t is not None and t != module}
    return edges


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One circle of the graph, as the modules along it (first repeated last), or None."""
    state: dict[str, str] = {}  # "open" while on the current path, "done" after
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = "open"
        path.append(module)
        for target in sorted(edges.get(module, ())):
            if state.get(target) == "open":
                return [*path[path.index(target) :], target]
            if target not in state and (cycle := visit(target)):
                return cycle
        state[module] = "done"
        path.pop()
        return None

    for module in sorted(edges):
        if module not in state and (cycle := visit(module)):
            return cycle
    return None


def reachable(edges: dict[str, set[str]], start: str) -> dict[str, str]:
    """The modules ``start`` imports directly or not, each with the module that imports it."""
    via: dict[str, str] = {}
    todo = [start]
    while todo:
        module = todo.pop()
        for target in edges.get(module, ()):
            if target not in via and target != start:
                via[target] = module
                todo.append(target)
    return via


def _within(module: str, packages: Iterable[str]) -> bool:
    return any(module == p or module.startswith(f"{p}.") for p in packages)


@functools.cache
def project() -> tuple[dict[str, Path], dict[str, set[str]], dict[str, set[str]]]:
    """The project's modules, their import-time imports and all their imports: read when a
    test first asks, not while every worker collects the suite."""
    known = modules(ROOT, PACKAGES)
    return known, graph(known), graph(known, every=True)


def test_the_import_graph_has_no_cycle_even_through_typing_only_or_function_level_imports():
    known, edges, every = project()
    # The walk sees the deferred imports of the real source, not only of the made-up package.
    assert any(every[m] > edges[m] for m in known)
    cycle = find_cycle(every)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_core_never_imports_a_plug_in_package_when_it_is_imported():
    _, edges, _ = project()
    core = [
        m for m in edges if _within(m, ("sentinel",)) and not _within(m, (*APPLICATIONS, *PLUGINS))
    ]
    assert "sentinel.client" in core and "sentinel.cache" in core
    for module in core:
        via = reachable(edges, module)
        for plugin in (m for m in via if _within(m, PLUGINS)):
            chain = [plugin]
            while chain[-1] != module:
                chain.append(via[chain[-1]])
            raise AssertionError(f"{module} imports a plug-in: {' -> '.join(reversed(chain))}")


# The two lowest layers: what each may import from sentinel (every import counted).
LAYERS = {
    "sentinel.zk": ("sentinel.errors", "sentinel.zk"),
    "sentinel.registry": ("sentinel.errors", "sentinel.zk", "sentinel.registry"),
}


def test_the_lowest_layers_import_nothing_above_them():
    every = project()[2]
    for layer, allowed in LAYERS.items():
        members = [m for m in every if _within(m, (layer,))]
        assert len(members) > 3, layer
        upward = {
            m: sorted(t for t in every[m] if _within(t, ("sentinel",)) and not _within(t, allowed))
            for m in members
        }
        assert not any(upward.values()), {m: t for m, t in upward.items() if t}


def test_the_walker_sees_cycles_through_packages_and_counts_deferred_imports_when_told(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("from pkg.a import A\n")
    (package / "a.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from pkg.c import C\n"
        "def later():\n    from pkg import c\n"
        "A = 1\n"
    )
    (package / "b.py").write_text("try:\n    from . import c\nexcept ImportError:\n    pass\n")
    (package / "c.py").write_text("from pkg import A\n")
    edges = graph(modules(tmp_path, ["pkg"]))
    assert edges == {"pkg": {"pkg.a"}, "pkg.a": set(), "pkg.b": {"pkg.c"}, "pkg.c": {"pkg"}}
    assert find_cycle(edges) is None
    # Counting every import, a's typing-only and function-level imports of c close a circle.
    every = graph(modules(tmp_path, ["pkg"]), every=True)
    assert every == {**edges, "pkg.a": {"pkg.c"}}
    assert find_cycle(every) == ["pkg", "pkg.a", "pkg.c", "pkg"]
    (package / "a.py").write_text("def later():\n    from pkg import c\nA = 1\n")
    assert find_cycle(graph(modules(tmp_path, ["pkg"]), every=True)) == [
        "pkg",
        "pkg.a",
        "pkg.c",
        "pkg",
    ]

    (package / "a.py").write_text("from pkg import b\nA = 1\n")
    cycle = find_cycle(graph(modules(tmp_path, ["pkg"])))
    assert cycle == ["pkg", "pkg.a", "pkg.b", "pkg.c", "pkg"]
    assert reachable(graph(modules(tmp_path, ["pkg"])), "pkg.c") == {
        "pkg": "pkg.c",
        "pkg.a": "pkg",
        "pkg.b": "pkg.a",
    }


# The floors of the house, lowest first: a module imports only from its own floor and those
# below it (every import counted, typing-only and function-level ones too). A package is on
# its floor with all its modules; docs/overview.md draws them.
FLOORS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "base",
        (
            "sentinel.errors",
            "sentinel.suggestions",
            "sentinel.version",
            "sentinel.validation",
            "sentinel.memo",
            "sentinel.rendezvous",
            "sentinel.freshness",
            "sentinel.eligibility",
            "sentinel.private_files",
            "sentinel.telemetry",
            "sentinel.tables",
        ),
    ),
    ("zk", ("sentinel.zk",)),
    (
        "registry",
        (
            "sentinel.registry",
            "sentinel.strategies",
            "sentinel.plugins",
            "sentinel.feedback",
            *PLUGINS,
        ),
    ),
    (
        "sections",
        (
            "sentinel.auth",
            "sentinel.shards",
            "sentinel.events",
            "sentinel.publisher",
            "sentinel.health",
            "sentinel.connection",
            "sentinel.devserver",
            "sentinel.curator",
            "sentinel.agentlink",
            "sentinel.metrics_writer",
        ),
    ),
    ("cache", ("sentinel.cache",)),
    (
        "session",
        (
            "sentinel.session",
            "sentinel.regions",
            "sentinel.explain",
            "sentinel.settings",
            "sentinel.builder",
        ),
    ),
    ("facade", ("sentinel", "sentinel.client", "sentinel.aio")),
    (
        "roles",
        (
            "sentinel.agent",
            "sentinel.collector",
            "sentinel.topology",
            "sentinel.shard_manager",
            "sentinel.integrations",
            "sentinel.testing",
        ),
    ),
    ("applications", ("sentinel.cli", "sentinel.ui", *APPLICATIONS)),
)
# Imports from a floor to a higher one, each with why it is right. None today: a new one
# fails the test below until it is inverted (the lower module takes what it needs as an
# argument, typed by a Protocol of its own, as the cache takes its AgentChannel) or named here.
UPWARD: dict[tuple[str, str], str] = {}


def _floor_names() -> list[str]:
    return [name for name, _ in FLOORS]


def floor_of(module: str) -> str:
    """The floor of ``module``: its longest listed package's."""
    best = ("", "")
    for name, packages in FLOORS:
        for package in packages:
            exact = package == "sentinel"  # the package's __init__ only, not all of sentinel
            if (module == package or (not exact and module.startswith(f"{package}."))) and len(
                package
            ) > len(best[1]):
                best = (name, package)
    assert best[0], f"{module} is on no floor: add its package to FLOORS"
    return best[0]


def upward_imports(edges: dict[str, set[str]]) -> list[str]:
    """``a (floor) -> b (floor)`` for each import of ``edges`` that climbs a floor."""
    order = _floor_names()
    found = []
    for module in sorted(edges):
        here = order.index(floor_of(module))
        for target in sorted(edges[module]):
            there = order.index(floor_of(target))
            if there > here and (module, target) not in UPWARD:
                found.append(f"{module} ({order[here]}) -> {target} ({order[there]})")
    return found


def test_no_import_climbs_a_floor_unless_named():
    every = project()[2]
    assert not upward_imports(every), "imports from a lower floor to a higher one:\n" + "\n".join(
        upward_imports(every)
    )


def test_every_module_has_a_floor_and_every_named_exception_is_real():
    every = project()[2]
    for module in every:
        floor_of(module)
    for (module, target), reason in UPWARD.items():
        assert target in every[module] and reason, (module, target)


def test_the_floor_check_sees_an_upward_import():
    # The cache importing the agent's daemon, or the zk layer the client: both refused.
    edges = {"sentinel.cache.agent": {"sentinel.agent.server"}, "sentinel.zk.wire": set()}
    edges["sentinel.zk.wire"].add("sentinel.client")
    assert upward_imports(edges) == [
        "sentinel.cache.agent (cache) -> sentinel.agent.server (roles)",
        "sentinel.zk.wire (zk) -> sentinel.client (facade)",
    ]
    # Downward and sideways imports pass.
    assert upward_imports({"sentinel.client": {"sentinel.session", "sentinel.aio"}}) == []


# Imports between rooms that climb back up (close a circle of rooms), each with the decision
# record that explains it: at most three. None today.
ROOM_CLIMBS: dict[tuple[str, str], str] = {}
MAX_ROOM_CLIMBS = 3


def room_of(module: str) -> str:
    """The room ``module`` is in: its plug-in package, else the module or package right under
    ``sentinel`` (``sentinel`` itself for the package's ``__init__``)."""
    for plugin in PLUGINS:
        if _within(module, (plugin,)):
            return plugin
    return ".".join(module.split(".")[:2])


def room_climbs(edges: dict[str, set[str]]) -> list[tuple[str, str]]:
    """The imports between rooms that lie on a circle of rooms, as (room, room), but those
    named in ``ROOM_CLIMBS``: with none, every room stands above all that it imports."""
    rooms: dict[str, set[str]] = {}
    for module, targets in edges.items():
        here = room_of(module)
        for target in targets:
            there = room_of(target)
            if there != here and (here, there) not in ROOM_CLIMBS:
                rooms.setdefault(here, set()).add(there)
    # An arrow a -> b closes a circle when a is reachable from b.
    return sorted(
        (room, target)
        for room, targets in rooms.items()
        for target in targets
        if room in reachable(rooms, target)
    )


def test_no_import_climbs_back_up_between_rooms_unless_named():
    every = project()[2]
    climbs = room_climbs(every)
    assert climbs == [], "imports that climb back up between rooms:\n" + "\n".join(
        f"{a} -> {b}: "
        + ", ".join(
            sorted(m for m in every if room_of(m) == a and any(room_of(t) == b for t in every[m]))
        )
        for a, b in climbs
    )
    assert len(ROOM_CLIMBS) <= MAX_ROOM_CLIMBS
    for (room, target), record in ROOM_CLIMBS.items():
        assert (ROOT / "docs" / "decisions" / record).is_file(), record
        assert any(room_of(t) == target for m in every if room_of(m) == room for t in every[m])


def test_the_room_check_sees_a_circle_of_rooms():
    # The shard manager inside sentinel.shards, importing the client that imports the shards'
    # writer: the two rooms close a circle, both arrows on it.
    edges = {
        "sentinel.client": {"sentinel.shards.writer"},
        "sentinel.shards.manager": {"sentinel.client"},
        "sentinel.shards.writer": {"sentinel.errors"},
        "sentinel.policies.metrics": {"sentinel.strategies"},
    }
    assert room_of("sentinel.policies.metrics") == "sentinel.policies"
    assert room_of("sentinel") == "sentinel" and room_of("sentinel.cache.views") == "sentinel.cache"
    assert room_climbs(edges) == [
        ("sentinel.client", "sentinel.shards"),
        ("sentinel.shards", "sentinel.client"),
    ]
    # Apart, the manager above the client: no climb.
    edges["sentinel.shard_manager"] = edges.pop("sentinel.shards.manager")
    assert room_climbs(edges) == []
