"""The ``sentinel`` argument parser: global options on either side, help, completion."""

import argparse
import itertools
import re
import shlex
import shutil
import subprocess

import pytest

from sentinel.cli import build_parser, main
from sentinel.registry.layout import DEFAULT_NAMESPACE
from tests.parser_tree import has_subcommands, leaves, subcommands


def parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(argv)


@pytest.mark.parametrize(
    "argv",
    [
        ("-v", "--zk", "zk1:2181", "--namespace", "/x", "ls"),
        ("ls", "-v", "--zk", "zk1:2181", "--namespace", "/x"),
        ("-v", "ls", "--zk", "zk1:2181", "--namespace", "/x"),
        ("--zk", "zk1:2181", "ls", "--namespace", "/x", "-v"),
    ],
)
def test_global_options_go_before_or_after_the_command(argv):
    args = parse(*argv)
    assert (args.verbose, args.zk, args.namespace, args.command) == (1, "zk1:2181", "/x", "ls")


def test_a_subcommand_does_not_reset_what_came_before_it():
    # argparse copies a subparser's defaults over the top-level values: these must survive.
    args = parse("-vv", "--zk", "zk1:2181", "--zk-tls", "shard", "list", "--policy", "t")
    assert (args.verbose, args.zk, args.zk_tls) == (2, "zk1:2181", True)
    plain = parse("ls")
    assert (plain.verbose, plain.zk, plain.zk_tls, plain.namespace) == (
        0,
        None,
        False,
        DEFAULT_NAMESPACE,
    )
    assert parse("zk", "status", "-v").verbose == 1


def test_demo_keeps_its_own_namespace_and_takes_zk_on_either_side():
    assert parse("demo").namespace == f"{DEFAULT_NAMESPACE}-demo"
    assert parse("--zk", "zk1:2181", "demo").zk == "zk1:2181"
    assert parse("demo", "--zk", "zk1:2181").zk == "zk1:2181"
    assert parse("demo").zk is None


def test_demo_databases_default_to_what_is_installed_or_are_chosen():
    assert parse("demo").databases is None  # PostgreSQL when installed, else SQLite
    assert parse("demo", "--databases", "sqlite").databases == "sqlite"
    with pytest.raises(SystemExit):
        parse("demo", "--databases", "mysql")


def test_demo_runs_spark_locally_unless_told_to_start_a_standalone_cluster(capsys):
    assert (parse("demo").spark, parse("demo").master) == ("local", "local[2]")
    assert parse("demo", "--spark", "standalone").spark == "standalone"
    with pytest.raises(SystemExit) as usage:
        parse("demo", "--spark", "standalone", "--master", "spark://elsewhere:7077")
    assert usage.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err


def test_every_command_has_examples_of_itself():
    for words, parser in leaves(build_parser()):
        help_text = parser.format_help()
        assert "Examples:\n  sentinel " + " ".join(words) in help_text, words


def command_of(example: str) -> list[str]:
    """The ``sentinel`` words of a shell line: before a pipe, a redirection or a comment, and
    inside ``eval "$(...)"``."""
    lexer = shlex.shlex(example, posix=True, punctuation_chars="|<>")
    lexer.whitespace_split = True
    words = list(itertools.takewhile(lambda word: word not in ("|", "<", ">"), lexer))
    if words[0] == "eval":
        return command_of(words[1].removeprefix("$(").removesuffix(")"))
    return words


def test_every_example_parses():
    for words, parser in leaves(build_parser()):
        for example in parser.epilog.splitlines()[1:]:
            argv = command_of(example)
            assert argv[: len(words) + 1] == ["sentinel", *words], example
            parse(*argv[1:])  # exits (a failed test) on a usage error


def test_resolve_help_explains_its_arguments_and_lists_the_registered_plugins():
    resolve = subcommands(build_parser())["resolve"].format_help()
    for text in ("a service's name", "a shard key", "min_lag", "zone_affinity", "round_robin"):
        assert text in resolve
    assert "sticky" in resolve and "power_of_two" in resolve


@pytest.mark.parametrize("port", ["-1", "65536", "http"])
def test_zk_start_refuses_a_port_that_is_not_one(port, capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse("zk", "start", "--port", port)
    assert exit_info.value.code == 2
    assert "port" in capsys.readouterr().err


def completion(shell: str, capsys) -> str:
    assert main(["completion", shell]) == 0
    return capsys.readouterr().out


def zsh_command_lists(script: str) -> dict[tuple[str, ...], list[str]]:
    """The command names each ``_shtab_sentinel[_GROUP]_commands`` function of a zsh script
    offers, by group words: ``{(): ["auth", ...], ("shard",): ["assign", ...]}``."""
    lists = {}
    pattern = r"^_shtab_sentinel((?:_[\w-]+)*)_commands\(\) \{\n  local _commands=\(\n(.*?)\n  \)$"
    for match in re.finditer(pattern, script, re.M | re.S):
        group = tuple(word for word in match[1].split("_") if word)
        lists[group] = [line.strip().split(":", 1)[0] for line in match[2].splitlines()]
    return lists


def test_zsh_completion_names_every_command(capsys):
    script = completion("zsh", capsys)
    assert script.startswith("#compdef sentinel")
    # Each list of commands the script completes, parsed out of it: a name found anywhere
    # else in the script (`zk` in `--zk`, `ls` in `tls`) proves nothing.
    offered = zsh_command_lists(script)
    parser = build_parser()
    expected = {(): sorted(subcommands(parser))}
    for name, sub in subcommands(parser).items():
        if has_subcommands(sub):
            expected[(name,)] = sorted(subcommands(sub))
    assert offered == expected
    # and the top-level list is the one completed after `sentinel`
    assert "': :_shtab_sentinel_commands'" in script


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash is not installed")
def test_bash_completion_loads_and_completes(capsys, tmp_path):
    script = tmp_path / "sentinel.bash"
    script.write_text(completion("bash", capsys))
    assert subprocess.run(["bash", "-n", str(script)], check=False).returncode == 0
    # Source it as a user's shell would, then complete `sentinel zk st` and `sentinel re`.
    probe = (
        f"source {script}; complete -p sentinel; "
        'for line in "sentinel zk st" "sentinel re"; do '
        "COMP_WORDS=($line); COMP_CWORD=$((${#COMP_WORDS[@]} - 1)); COMP_LINE=$line; "
        "COMP_POINT=${#line}; COMPREPLY=(); "
        '_shtab_sentinel sentinel "${COMP_WORDS[-1]}" "${COMP_WORDS[-2]}"; echo "${COMPREPLY[*]}"; '
        "done"
    )
    result = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    registered, zk_actions, commands = result.stdout.splitlines()
    assert registered.startswith("complete ") and registered.endswith(" sentinel")
    assert zk_actions.split() == ["start", "status", "stop"]
    assert sorted(commands.split()) == ["register", "resolve"]
