"""`fastload bench`: measures every stage of a rig's feeding path (memory, disk, the
host-to-device link), fastload itself and the loaders a user would pick instead, all on
the same records, and names the stage that bounds the path. Every figure is the median of
several repetitions with its spread.

The parts: `runner` (`run`, the stage registry), `measure` (figures and their timing),
`stages` (limits and fastload), `baselines` (the other loaders), `machine` (what it ran on),
`report` (targets, verdict, plot, console table)."""

from fastload.bench.baselines import MemmapRecords
from fastload.bench.machine import describe_machine
from fastload.bench.report import (
    CACHE_FACTOR,
    LIMIT_TOLERANCE,
    TARGET_MIN_BYTES,
    draw,
    limit_problem,
    memcpy_limit,
    plot,
    print_report,
    report_lines,
    table_rows,
    targets,
    verdict,
)
from fastload.bench.runner import (
    BENCHES,
    NOISY_SPREAD_PCT,
    STAGES,
    noise_warnings,
    parse_stages,
    run,
    write_synthetic_store,
)

__all__ = [
    "run",
    "BENCHES",
    "STAGES",
    "NOISY_SPREAD_PCT",
    "TARGET_MIN_BYTES",
    "LIMIT_TOLERANCE",
    "CACHE_FACTOR",
    "limit_problem",
    "memcpy_limit",
    "noise_warnings",
    "parse_stages",
    "write_synthetic_store",
    "describe_machine",
    "MemmapRecords",
    "targets",
    "verdict",
    "draw",
    "plot",
    "table_rows",
    "report_lines",
    "print_report",
]
