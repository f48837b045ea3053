"""The ``sentinel`` command line: one module per group of commands.

Exit codes: 0 success; 1 not found, nothing eligible or problems found; 2 usage or bad input
(no ZooKeeper given included); 3 ZooKeeper unreachable; 4 ZooKeeper could not be started (not
installed, it failed, or its port is taken).

:func:`main` is the one place where a command's failure becomes an exit code and one line on
stderr: no traceback reaches the user unless ``-v`` asks for it. The options every command
shares (``-v``, ``--zk``, ``--namespace``, the ``--zk-tls`` ones) go before or after the
command's name.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import Any

from sentinel.cli.options import (
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_USAGE,
    Handler,
    HelpFormatter,
    add_parser,
    add_verbose_option,
    add_zk_options,
    exit_code,
    fail,
)
from sentinel.cli.parsers import COMMAND_GROUPS
from sentinel.errors import SentinelError

SHELLS = ("bash", "zsh")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``sentinel`` command."""
    parser = argparse.ArgumentParser(
        prog="sentinel",
        description="Service discovery on ZooKeeper for partitioned, multi-tenant services. "
        "-v, --zk, --namespace and the --zk-tls options go before or after COMMAND; "
        "`sentinel COMMAND --help` shows a command's options and examples.",
        epilog="Exit codes: 0 ok, 1 not found / nothing eligible / problems found, 2 usage "
        "error or bad input (no ZooKeeper given too), 3 ZooKeeper unreachable, 4 ZooKeeper "
        "could not be started.",
        formatter_class=HelpFormatter,
    )
    parser.add_argument("--version", action=_Version, help="show the version and exit")
    add_verbose_option(parser, top=True)
    add_zk_options(parser, top=True)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for group in COMMAND_GROUPS:
        group.register(commands)
    completion = add_parser(
        commands,
        "completion",
        "print a shell completion script (bash or zsh)",
        "Print a script that completes sentinel's commands and options in SHELL. Load it in "
        "the current shell with eval or source, or install it where the shell looks for "
        "completions.",
        (
            "sentinel completion bash > ~/.local/share/bash-completion/completions/sentinel",
            "sentinel completion zsh > ~/.zfunc/_sentinel    # with fpath+=(~/.zfunc) in .zshrc",
            'eval "$(sentinel completion bash)"             # this bash session only',
        ),
    )
    completion.add_argument("shell", choices=SHELLS, metavar="SHELL", help="bash or zsh")
    completion.set_defaults(handler=Handler("__init__:_completion"))
    return parser


class _Version(argparse.Action):
    """``--version``: reads the installed version (package metadata) only when asked."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> None:
        from sentinel.version import __version__

        parser.exit(message=f"sentinel {__version__}\n")


def _completion(args: argparse.Namespace) -> int:
    # shtab writes a static script from the parser: nothing runs at completion time.
    import shtab

    print(shtab.complete(build_parser(), shell=args.shell))
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=(logging.WARNING, logging.INFO, logging.DEBUG)[min(args.verbose, 2)],
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if args.verbose == 0:
        # kazoo logs every dropped connection as a warning; a command reports what matters.
        logging.getLogger("kazoo").setLevel(logging.ERROR)
    handler: Callable[[argparse.Namespace], int] = args.handler
    # Loaded once a command runs: sentinel --help and a usage error need none of them.
    from kazoo.exceptions import KazooException
    from kazoo.handlers.threading import KazooTimeoutError

    from sentinel.zk.errors import translate

    try:
        from sentinel.cli.regions import apply as apply_regions

        apply_regions(args)
        code = handler(args)
        sys.stdout.flush()  # a closed pipe shows here, inside the handler below
        return code
    except SentinelError as exc:
        return fail(str(exc), exit_code(exc))
    except (KazooException, KazooTimeoutError) as exc:
        error = translate(exc, f"sentinel {args.command}")
        return fail(str(error), exit_code(error))
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return _reader_went_away()
    except UnicodeError as exc:
        # Text that is not UTF-8 where ZooKeeper needs it: an argument given as bytes that are
        # not UTF-8 (Python keeps them as lone surrogates) or such a value in an input file.
        return fail(f"not UTF-8: {exc}", EXIT_USAGE)
    except OSError as exc:
        if exc.filename is None:
            return _unexpected(exc, args.verbose)
        # A file named on the command line that cannot be read or written: bad input.
        return fail(f"{exc.filename}: {exc.strerror or exc}", EXIT_USAGE)
    except Exception as exc:  # the last line of defence: one line, no traceback
        return _unexpected(exc, args.verbose)


def _reader_went_away() -> int:
    """Output piped into a command that stopped reading (``sentinel ls | head -1``).

    As Python's documentation on SIGPIPE recommends: point stdout at /dev/null so that the
    interpreter's final flush does not fail again, and exit 1 without a word.
    """
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return EXIT_NOT_FOUND


def _unexpected(exc: BaseException, verbose: int) -> int:
    """A failure no command expected (a bug): one line, and the traceback only with ``-v``."""
    if verbose:
        traceback.print_exception(exc, file=sys.stderr)
        return fail(f"unexpected {type(exc).__name__}: {exc}", EXIT_NOT_FOUND)
    return fail(
        f"unexpected {type(exc).__name__}: {exc} (run with -v for the traceback)", EXIT_NOT_FOUND
    )


if __name__ == "__main__":
    sys.exit(main())
