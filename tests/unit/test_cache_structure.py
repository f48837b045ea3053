"""The cache by concern: one follower class per watch mode, and nothing else asks the mode."""

import ast
from pathlib import Path

import sentinel
from sentinel.cache import followers
from sentinel.cache.source import Follower

LIBRARY = Path(sentinel.__file__).parent


def _mode_branches(tree: ast.AST) -> list[int]:
    """Lines of the branches (if, conditional expression, while, boolean operation) whose
    condition names a watch mode: ``persistent``, ``fallback``, ``supported``, ``_one_shot``."""
    names = {"persistent", "fallback", "supported", "_one_shot", "one_shot"}
    lines = []
    for node in ast.walk(tree):
        tests = []
        if isinstance(node, ast.If | ast.IfExp | ast.While):
            tests = [node.test]
        elif isinstance(node, ast.BoolOp):
            tests = node.values
        elif isinstance(node, ast.comprehension):
            tests = node.ifs
        for test in tests:
            for inner in ast.walk(test):
                name = getattr(inner, "attr", None) or getattr(inner, "id", None)
                if name in names:
                    lines.append(node.lineno)
    return lines


def test_one_follower_class_per_watch_mode():
    modes = {
        cls.persistent: name
        for name, cls in vars(followers).items()
        if isinstance(cls, type) and "persistent" in vars(cls)
    }
    assert modes == {True: "PersistentFollower", False: "OneShotFollower"}
    for cls in (followers.PersistentFollower, followers.OneShotFollower):
        assert {"load_service", "resync"} <= set(dir(cls)) >= set(Follower.__annotations__)


def test_no_module_branches_on_the_watch_mode_but_where_the_follower_is_chosen():
    found = {}
    for path in sorted(LIBRARY.rglob("*.py")):
        relative = path.relative_to(LIBRARY).as_posix()
        if relative in ("zk/watches.py", "testing/convergence.py"):
            continue  # the protocol extension itself, and the fuzzer that runs both modes
        tree = ast.parse(path.read_text())
        lines = set(_mode_branches(tree))
        for function in ast.walk(tree):
            if isinstance(function, ast.FunctionDef):
                inside = range(function.lineno, function.end_lineno + 1)
                if lines & set(inside):
                    found.setdefault(relative, set()).add(function.name)
                    lines -= set(inside)
        if lines:
            found.setdefault(relative, set()).add(f"module level, lines {sorted(lines)}")
    # The one place that chooses a follower, once per session, and the property that says
    # which was chosen (or would be).
    assert found == {"cache/registry_cache.py": {"_follower_now", "persistent"}}


def test_the_branch_finder_finds_a_branch_on_the_mode():
    # the control: the check above would see the interleaving it forbids
    assert _mode_branches(ast.parse("if self.persistent:\n    pass\n")) == [1]
    assert _mode_branches(ast.parse("x = None if self.persistent else self._watch\n")) == [1]
