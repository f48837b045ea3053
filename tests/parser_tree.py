"""Walk the ``sentinel`` argument parser: its commands, as the tests enumerate them."""

from __future__ import annotations

import argparse
from collections.abc import Iterator


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The commands directly under ``parser``, by name."""
    return next(
        action.choices
        for action in parser._actions
        if isinstance(action, argparse._SubParsersAction)
    )


def summaries(parser: argparse.ArgumentParser) -> dict[str, str]:
    """The one-line summary (``help=``) of each command directly under ``parser``."""
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {choice.dest: choice.help for choice in action._choices_actions}


def has_subcommands(parser: argparse.ArgumentParser) -> bool:
    return any(isinstance(action, argparse._SubParsersAction) for action in parser._actions)


def every_command(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Every command with its words, groups (``("shard",)``) and their commands alike."""
    for name, sub in subcommands(parser).items():
        yield (*path, name), sub
        if has_subcommands(sub):
            yield from every_command(sub, (*path, name))


def leaves(
    parser: argparse.ArgumentParser,
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Every command that runs something, with its words: ``("shard", "move")``."""
    return ((words, sub) for words, sub in every_command(parser) if not has_subcommands(sub))
