"""How file names, metadata and problems are shown: as stored in the metadata (valid UTF-8), as
printed to a terminal (control characters escaped: pack's reports, and every command's output
and messages through `terminal_text`), and as the one-per-line lists of pack's messages."""

from __future__ import annotations

import re
from typing import List, Optional, Sequence, Tuple

#: Problems listed in one error message before the rest are only counted.
MAX_LISTED = 20
#: Characters never printed raw: C0 and C1 controls, DEL, line and paragraph separators,
#: and the bidirectional overrides that reorder what a terminal shows.
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def display(name: str) -> str:
    """A file name that JSON accepts (undecodable bytes become U+FFFD), as stored in the metadata."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def printable(name: str) -> str:
    """A file name safe to print to a terminal: `display`, with control characters
    escaped as `repr` does (\\x1b, \\r, \\n), so a name cannot move the cursor or recolour."""
    return _UNPRINTABLE.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), display(name))


def terminal_text(text: str) -> str:
    """Any text fastload prints (what a store's metadata holds, a message naming files):
    each line `printable`, the line breaks kept, so nothing read from a file can move the
    cursor, erase a line or hide the text after it."""
    return "\n".join(printable(line) for line in text.split("\n"))


def named(problems: Sequence[Tuple[str, str]]) -> List[str]:
    """`file: reason` lines, the names made printable."""
    return [f"{printable(name)}: {reason}" for name, reason in problems]


def warned(decode_warnings: Sequence[Tuple[str, List[str]]]) -> List[Tuple[str, str]]:
    """(file, "decoded with warnings: ...") of each image libjpeg warned about."""
    return [(name, "decoded with warnings: " + "; ".join(warnings)) for name, warnings in decode_warnings]


def listed(problems: Sequence[str], limit: Optional[int] = MAX_LISTED) -> str:
    """One problem a line; past `limit` (None: no limit) the rest are only counted."""
    limit = len(problems) if limit is None else limit
    shown = "\n  ".join(problems[:limit])
    more = f"\n  ... and {len(problems) - limit} more" if len(problems) > limit else ""
    return f"\n  {shown}{more}"
