"""`fastload verify STORE`: every record checked against its checksum."""

from __future__ import annotations

import argparse
import sys

from fastload import inspect
from fastload import store as store_mod
from fastload.cli.args import positive_int
from fastload.pack.display import printable


def add_parser(commands) -> None:
    p = commands.add_parser(
        "verify",
        help="check every record of a store against its checksum",
        description="Recompute the checksum of every record of STORE (image and label) and list the "
        "records that differ, with their source file when the store names it. Exit status 0: every "
        "record matches; 1: damaged records (or not a readable store).",
    )
    p.add_argument("store", metavar="STORE", help="a store file written by `fastload pack` or StoreWriter")
    p.add_argument(
        "--limit",
        type=positive_int,
        default=store_mod.VERIFY_LIMIT,
        help=f"damaged records to list (default {store_mod.VERIFY_LIMIT})",
    )
    p.add_argument(
        "--decode",
        action="store_true",
        help="also decode every JPEG-encoded record of a compressed store (slower; finds damage a "
        "checksum cannot, such as a record a fastload of another build cannot decode)",
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    damaged = inspect.verify(args.store, limit=args.limit, decode=args.decode)
    store = printable(args.store)
    for index, source in damaged:  # a source name is the store's metadata: escaped, it cannot fake a pass
        print(f"damaged record {index}" + (f" ({printable(source)})" if source else ""))
    if damaged.total > len(damaged):
        print(f"... and {damaged.total - len(damaged):,} more damaged records")
    if damaged.total:
        print(f"{store}: {damaged.total:,} damaged record(s)", file=sys.stderr)
        return 1
    print(f"{store}: every record matches its checksum" + (" and decodes" if args.decode else ""))
    return 0
