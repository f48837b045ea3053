"""The service dependency graph, from who uses what under ``/clients`` (the paper's analysis).

An edge ``a -> b`` means a client of app ``a`` (``Sentinel(app="a")``, else its client id)
resolves service ``b``. Cycles are found as strongly connected components (Tarjan); the impact
of losing a service is everything that depends on it, directly or not.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from sentinel.registry.records import ClientRecord


@dataclass(frozen=True)
class DependencyGraph:
    """``edges[a][b]`` is the sorted client ids through which ``a`` uses ``b``."""

    edges: Mapping[str, Mapping[str, tuple[str, ...]]]

    @classmethod
    def from_clients(cls, clients: Mapping[str, Mapping[str, ClientRecord]]) -> DependencyGraph:
        """Build it from ``registry.read_clients``: service → client id → record."""
        edges: dict[str, dict[str, list[str]]] = {}
        for service, by_client in clients.items():
            for client_id, record in by_client.items():
                source = record.app or client_id
                edges.setdefault(source, {}).setdefault(service, []).append(client_id)
        return cls(
            {
                a: {b: tuple(sorted(c)) for b, c in sorted(to.items())}
                for a, to in sorted(edges.items())
            }
        )

    @property
    def nodes(self) -> list[str]:
        """Every app and service that appears, sorted."""
        return sorted(set(self.edges) | {b for to in self.edges.values() for b in to})

    def dependencies(self, node: str) -> list[str]:
        """What ``node`` uses directly."""
        return list(self.edges.get(node, {}))

    def dependents(self, node: str) -> list[str]:
        """What uses ``node`` directly."""
        return sorted(a for a, to in self.edges.items() if node in to)

    def impact(self, service: str) -> list[str]:
        """Everything that depends on ``service``, directly or through others."""
        seen: set[str] = set()
        pending = [service]
        while pending:
            for dependent in self.dependents(pending.pop()):
                if dependent not in seen and dependent != service:
                    seen.add(dependent)
                    pending.append(dependent)
        return sorted(seen)

    def cycles(self) -> list[list[str]]:
        """The strongly connected components with a cycle (two or more nodes, or a self-use)."""
        index: dict[str, int] = {}
        low: dict[str, int] = {}
        stack: list[str] = []
        on_stack: set[str] = set()
        found: list[list[str]] = []

        def visit(node: str) -> None:  # Tarjan; graphs here are small enough to recurse
            index[node] = low[node] = len(index)
            stack.append(node)
            on_stack.add(node)
            for target in self.dependencies(node):
                if target not in index:
                    visit(target)
                    low[node] = min(low[node], low[target])
                elif target in on_stack:
                    low[node] = min(low[node], index[target])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in self.edges.get(node, {}):
                    found.append(sorted(component))

        for node in self.nodes:
            if node not in index:
                visit(node)
        return sorted(found)

    def tree(self, root: str) -> Iterator[str]:
        """What ``root`` uses, recursively, drawn as a tree; a repeat on the path is a cycle."""
        yield root

        def walk(node: str, prefix: str, path: tuple[str, ...]) -> Iterator[str]:
            children = self.dependencies(node)
            for i, child in enumerate(children):
                last = i == len(children) - 1
                branch, extend = ("└── ", "    ") if last else ("├── ", "│   ")
                if child in path:
                    yield f"{prefix}{branch}{child} (cycle)"
                    continue
                yield f"{prefix}{branch}{child}"
                yield from walk(child, prefix + extend, (*path, child))

        yield from walk(root, "", (root,))

    def roots(self) -> list[str]:
        """Nodes nothing depends on (where trees start), plus one node of each cycle that
        has no other way in."""
        roots = [n for n in self.nodes if not self.dependents(n)]
        reached = {n for r in roots for n in self._reachable(r)}
        for cycle in self.cycles():
            if not reached & set(cycle):
                roots.append(cycle[0])
                reached |= set(self._reachable(cycle[0]))
        return roots

    def _reachable(self, node: str) -> set[str]:
        seen, pending = {node}, [node]
        while pending:
            for target in self.dependencies(pending.pop()):
                if target not in seen:
                    seen.add(target)
                    pending.append(target)
        return seen

    def dot(self) -> str:
        """Graphviz DOT; edges on a cycle are red."""
        cyclic = [set(c) for c in self.cycles()]
        lines = ["digraph sentinel {", "  rankdir=LR;", "  node [shape=box];"]
        for node in self.nodes:
            lines.append(f'  "{node}";')
        for a, targets in self.edges.items():
            for b, clients in targets.items():
                attributes = f'label="{len(clients)}"'
                if any(a in c and b in c for c in cyclic):
                    attributes += ", color=red"
                lines.append(f'  "{a}" -> "{b}" [{attributes}];')
        lines.append("}")
        return "\n".join(lines)
