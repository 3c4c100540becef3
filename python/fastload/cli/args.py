"""argparse types that more than one subcommand takes."""

from __future__ import annotations

import argparse


def positive_int(text: str) -> int:
    """An argparse type: an integer of at least 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


# argparse names the type in its message for a value that is no integer: "argument --limit:
# invalid positive integer value: 'all'".
positive_int.__name__ = "positive integer"
