"""argparse types that more than one subcommand takes."""

from __future__ import annotations

import argparse


def positive_int(text: str) -> int:
    """An argparse type: an integer of at least 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


# argparse names the type in its message for a value that is no integer ("argument --limit:
# invalid _parse_positive_int value: 'all'"): the name it had before the command line was split
# into modules, kept so that the output stays the same.
positive_int.__name__ = "_parse_positive_int"
