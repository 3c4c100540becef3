"""The `fastload` command: parses arguments and calls the same functions users call from Python.
Each subcommand is a module of this package holding its parser (``add_parser``) and its
handler (``run``); this one assembles them and turns errors into exit statuses.

Exit status: 0 success, 1 failure (bad store, damaged records, failed run), 2 usage error.
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from typing import List, Optional

from fastload import StoreError, __version__
from fastload.cli import augment, bench, demo, info, pack, train, verify
from fastload.pack.display import terminal_text

#: The subcommands in the order `fastload --help` lists them.
COMMANDS = (info, verify, pack, bench, train, demo, augment)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fastload",
        description="Pack image folders into one store file and feed PyTorch training from it fast. "
        "Start with `fastload pack`, then read the store with fastload.FastLoadDataset.",
        epilog="exit status: 0 success, 1 failure, 2 usage error. `fastload COMMAND --help` tells more.",
    )
    parser.add_argument("--version", action="version", version=f"fastload {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        command.add_parser(commands)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    # A warning (classes made from unnamed labels, a JPEG decoder without SIMD, ...) is a line
    # of the command's output, in the words of its command's `explain_warning`, not Python's
    # file:line report.
    explain = getattr(args, "explain_warning", str)
    with warnings.catch_warnings():
        warnings.showwarning = lambda message, *_, **__: print(
            f"fastload {args.command}: warning: {terminal_text(explain(str(message)))}", file=sys.stderr
        )
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    """The command's handler, its errors turned into messages and exit statuses."""
    try:
        return args.run(args)
    except BrokenPipeError:
        # The reader of our output went away (`fastload info X | head`): not a failure.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (StoreError, OSError, ValueError, TypeError, ImportError) as exc:
        print(f"fastload {args.command}: error: {terminal_text(str(exc))}", file=sys.stderr)
        return 1
    except MemoryError as exc:  # e.g. a store too large for this machine's RAM
        detail = f": {exc}" if str(exc) else ""
        print(f"fastload {args.command}: error: out of memory{detail}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"fastload {args.command}: interrupted", file=sys.stderr)
        return 130
