"""``sentinel doctor``'s table: coloured on a terminal only, and never under NO_COLOR."""

import io

import pytest

from sentinel.cli.findings import Finding, print_findings

FINDINGS = [
    Finding("ok", "zookeeper", "127.0.0.1:2181: 3.8.0, standalone"),
    Finding("warn", "acl", "anyone can write under /sentinel", "sentinel init --secure"),
    Finding("error", "namespace", "/sentinel lacks /metrics", "sentinel init"),
]
RED, YELLOW, RESET = "\x1b[31m", "\x1b[33m", "\x1b[0m"


class Terminal(io.StringIO):
    """Output that says it is a terminal, as sys.stdout does in an interactive shell."""

    def isatty(self) -> bool:
        return True


def render(stream: io.StringIO) -> list[str]:
    print_findings(FINDINGS, stream)
    return stream.getvalue().splitlines()


def test_a_terminal_gets_error_lines_red_and_warn_lines_yellow(monkeypatch):
    monkeypatch.delenv("NO_COLOR", raising=False)
    header, ok, warn, error, summary = render(Terminal())
    assert warn.startswith(f"{YELLOW}WARN ") and warn.endswith(RESET)
    assert error.startswith(f"{RED}ERROR") and error.endswith(RESET)
    assert "\x1b[" not in header + ok + summary
    assert summary == "1 problem(s), 1 warning(s)"
    # Colour is added after aligning: the columns still line up once the codes are removed.
    plain = [
        line.removeprefix(YELLOW).removeprefix(RED).removesuffix(RESET) for line in (warn, error)
    ]
    column = header.index("CHECK")
    assert [line[column:].split()[0] for line in (ok, *plain)] == ["zookeeper", "acl", "namespace"]


@pytest.mark.parametrize("value", ["1", "0", "false"])
def test_no_color_set_to_anything_turns_colour_off(monkeypatch, value):
    monkeypatch.setenv("NO_COLOR", value)
    lines = render(Terminal())
    assert "\x1b[" not in "".join(lines)
    assert lines[3].startswith("ERROR")


def test_output_that_is_not_a_terminal_is_plain(monkeypatch):
    monkeypatch.delenv("NO_COLOR", raising=False)
    lines = render(io.StringIO())
    assert "\x1b[" not in "".join(lines)
    assert lines[2].startswith("WARN") and lines[3].startswith("ERROR")


def test_an_empty_no_color_does_not_turn_colour_off(monkeypatch):
    monkeypatch.setenv("NO_COLOR", "")
    assert render(Terminal())[3].startswith(RED)
