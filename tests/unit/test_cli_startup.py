"""The ``sentinel`` command starts without loading what its other commands need.

Which modules a command loads, read from ``sys.modules`` in a fresh interpreter: not a timed
test (docs/benchmarks.md has the times), so it holds on a loaded machine too.
"""

import json
import subprocess
import sys

import pytest

from sentinel.cli import build_parser
from sentinel.cli.options import Handler
from tests.parser_tree import leaves

# What one command group or another needs, and `sentinel --help` must not load.
HEAVY = (
    "cryptography",  # x509 (TLS certificates), HPKE and signatures: the auth commands
    "sentinel.client",
    "sentinel.cache",
    "sentinel.agent",
    "sentinel.auth.envelope",
    "sentinel.auth.keys",
    "sentinel.cli.common",
    "sentinel.cli.doctor",
    "sentinel.cli.backup",
    "sentinel.cli.agent",
    "sentinel.testing",  # the ZooKeeper launcher
    "sentinel.demo",
    "prometheus_client",
    "importlib.metadata",  # the version and the plug-ins' entry points
)


def loaded_after(argv: list[str]) -> set[str]:
    """The modules a fresh interpreter holds after ``sentinel ARGV`` ran (its exit included)."""
    script = (
        "import json, sys\n"
        "from sentinel.cli import main\n"
        "try:\n"
        f"    main({argv!r})\n"
        "except SystemExit:\n"
        "    pass\n"
        "print(json.dumps(sorted(sys.modules)), file=sys.__stdout__)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    )
    return set(json.loads(result.stdout.splitlines()[-1]))


def heavy_among(modules: set[str]) -> list[str]:
    return sorted(
        name for name in modules if any(name == h or name.startswith(f"{h}.") for h in HEAVY)
    )


@pytest.mark.parametrize(
    "argv", [["--help"], ["ls", "--help"], ["agent", "--help"], ["doctor", "--help"]]
)
def test_help_loads_no_command_implementation(argv):
    assert heavy_among(loaded_after(argv)) == []


def test_ls_loads_neither_the_client_nor_the_cache_nor_cryptography():
    # Port 1 refuses at once: the command gets as far as connecting, then exits 3.
    modules = loaded_after(["ls", "--zk", "127.0.0.1:1", "--timeout", "0.2"])
    assert "sentinel.cli.inspect" in modules  # it did run the command
    assert heavy_among(modules) == ["sentinel.cli.common"]


def test_a_command_loads_its_implementation_when_it_runs():
    # The agent's command is the one that needs the client and the cache: it loads them.
    modules = loaded_after(["agent", "--zk", "127.0.0.1:1", "--timeout", "0.2"])
    assert {"sentinel.cli.agent", "sentinel.client", "sentinel.agent.server"} <= modules


def test_every_command_names_a_handler_that_exists():
    # A handler is a "module:function" string until the command runs: a misspelt one would
    # only fail then.
    for words, parser in leaves(build_parser()):
        handler = parser.get_default("handler")
        assert isinstance(handler, Handler), words
        assert callable(handler.resolve()), words
