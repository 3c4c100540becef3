"""What a bench run concludes and shows: the speed targets, the verdict naming the narrowest
stage, the plot, and the console table and lines."""

from __future__ import annotations

import statistics
import sys
from pathlib import Path
from typing import List, Optional, Tuple

import numpy as np

from fastload._checks import import_optional
from fastload.bench.measure import INSTALL_EXTRA
from fastload.files import replace_atomically
from fastload.inspect import memory_plan_line
from fastload.progress import gigabytes
from fastload.store import PathLike


def _reference(rows: List[dict], *methods: str) -> Optional[dict]:
    for method in methods:
        for row in rows:
            if row["method"].startswith(method):
                return row
    return None


FASTLOAD_REFERENCE = ("FastLoadDataset, warm, random", "Store.gather, warm, random")
#: The decode stage's rows: fastload's gather of JPEG records, one thread's libjpeg-turbo, and
#: the DataLoader a user writes.
DECODE_GATHER, DECODE_ONE_THREAD, DECODE_DATALOADER = (
    "Store.gather, JPEG records",
    "libjpeg-turbo, 1 thread",
    "JPEG bytes + Pillow + DataLoader",
)


# A loader whose per-round ratio to the copy limit stays above 1 in every round, and above this
# factor at the median, beats the limit beyond the run's noise: the limit is then no limit at all.
LIMIT_TOLERANCE = 1.05


def _round_rates(row: dict) -> List[float]:
    """A figure's images/s in each round (one rate when it lacks per-run times)."""
    if "per_round" in row:  # the copy limit: the faster copy of each round
        return row["per_round"]
    seconds = row.get("seconds") or []
    if seconds and row.get("images_per_run"):
        return [row["images_per_run"] / s for s in seconds]
    return [row["images_per_s"]]


def memcpy_limit(rows: List[dict]) -> Optional[dict]:
    """The machine's copy limit as the loader is judged against it: in each round, the faster
    of the memcpy figures of that round (rounds run every figure in turn, so a copy and the
    loader it judges ran seconds apart); its rate is the median over rounds. None without a
    memcpy figure."""
    copies = [r for r in rows if r["stage"] == "memcpy"]
    if not copies:
        return None
    per_copy = [_round_rates(r) for r in copies]
    if len({len(rates) for rates in per_copy}) != 1:  # rounds that do not line up: the medians
        per_copy = [[r["images_per_s"]] for r in copies]
    best = [max(rates) for rates in zip(*per_copy)]
    fastest = max(copies, key=lambda r: r["images_per_s"])
    rate = statistics.median(best)
    return {
        "stage": "memcpy",
        "method": fastest["method"] if len(copies) == 1 else "memcpy, the faster copy of each round",
        "kind": "limit",
        "images_per_s": rate,
        "gb_per_s": fastest["gb_per_s"] * rate / fastest["images_per_s"] if "gb_per_s" in fastest else None,
        "per_round": best,
    }


def _per_round_ratios(row: dict, limit: dict) -> List[float]:
    rates, limits = _round_rates(row), limit["per_round"]
    if len(rates) != len(limits):
        return [row["images_per_s"] / limit["images_per_s"]]
    return [a / b for a, b in zip(rates, limits)]


def limit_problem(rows: List[dict]) -> Optional[str]:
    """Why the memcpy figure cannot be the machine's copy limit: a fastload figure beats the
    faster copy of every round, by more than LIMIT_TOLERANCE at the median; naming both and
    the per-round range. None when it holds, is level within the noise, or was not measured."""
    limit = memcpy_limit(rows)
    if limit is None:
        return None
    beaten = []
    for row in rows:
        # The resident row gathers in the GPU's own memory, which no host copy bounds.
        if row.get("kind") != "fastload" or row["stage"] == "resident":
            continue
        ratios = _per_round_ratios(row, limit)
        if min(ratios) > 1.0 and statistics.median(ratios) > LIMIT_TOLERANCE:
            beaten.append((statistics.median(ratios), min(ratios), max(ratios), row))
    if not beaten:
        return None
    ratio, low, high, fastest = max(beaten, key=lambda b: b[0])
    spread = f" (per round {low:.2f}x to {high:.2f}x)" if high > low else ""
    return (
        f"the memcpy limit is wrong: {fastest['method']} delivers {_rate(fastest)}, "
        f'{ratio:.2f}x{spread} the {_rate(limit)} of "{limit["method"]}", and a loader cannot copy '
        "faster than the machine copies, so that figure is no limit and nothing is compared with it"
    )


def _memcpy_limit(rows: List[dict]) -> Optional[dict]:
    """The copy limit (:func:`memcpy_limit`), unless a fastload figure beats it
    (:func:`limit_problem`), when there is no limit to compare with."""
    return None if limit_problem(rows) else memcpy_limit(rows)


def _paired_ratio(row: dict, other: dict) -> Optional[float]:
    """Median over rounds of row's rate / other's rate in the same round: runs of one round
    ran minutes apart at most, so this ratio moves less with the machine's speed than the
    ratio of the medians does. None when the figures lack per-round rates."""
    a, b = _round_rates(row), _round_rates(other)
    if len(a) < 2 or len(a) != len(b):
        return None
    return statistics.median(x / y for x, y in zip(a, b))


# The speed targets are set for epochs over at least this many bytes (far beyond any CPU
# cache, and long enough that an epoch's start-up does not count): a --quick run's short
# epochs of 64 MB are reported against them but not judged.
TARGET_MIN_BYTES = 2_000_000_000


def targets(rows: List[dict], measured_bytes: int) -> List[dict]:
    """The project's speed targets, checked against this run's figures (the ratio of the
    medians decides; the median of per-round ratios is given beside it), judged only when
    the run read at least TARGET_MIN_BYTES."""
    ref = _reference(rows, *FASTLOAD_REFERENCE)
    checks = [
        ("fastload >= 85% of memcpy", 0.85, _memcpy_limit(rows)),
        ("fastload >= 4x the np.memmap DataLoader recipe", 4.0, _reference(rows, "np.memmap Dataset")),
        ("fastload >= 1.5x np.memmap fancy indexing", 1.5, _reference(rows, "np.memmap fancy")),
    ]
    targets = _decode_targets(rows)
    for name, goal, other in checks:
        if ref is None or other is None:
            continue
        ratio = ref["images_per_s"] / other["images_per_s"]
        targets.append(
            {
                "target": name,
                "fastload": ref["method"],
                "against": other["method"],
                "ratio": ratio,
                "paired_ratio": _paired_ratio(ref, other),
                "met": ratio >= goal,
                "judged": measured_bytes >= TARGET_MIN_BYTES,
            }
        )
    return targets


# The decode targets are judged on runs that decode at least this many records: decoding is
# bound by the cores, not by memory or a cache, but a quick run's few batches measure the start
# of each epoch (and the DataLoader's worker start-up), not the decoding.
DECODE_MIN_RECORDS = 1000


def _decode_targets(rows: List[dict]) -> List[dict]:
    """The compressed gather's targets: at least 90% of gather's threads times libjpeg-turbo's
    one-thread rate on the same records, and 1.5x the Pillow DataLoader of 2 workers on the
    same bytes; judged on runs of at least DECODE_MIN_RECORDS records."""
    decoding = _reference(rows, DECODE_GATHER)
    if decoding is None:
        return []
    threads = decoding.get("decode_threads", 1)
    checks = [
        (
            f"compressed gather >= 90% of {threads} threads x one-thread libjpeg-turbo",
            0.9,
            threads,
            _reference(rows, DECODE_ONE_THREAD),
        ),
        (
            "compressed gather >= 1.5x DataLoader(num_workers=2) + Pillow",
            1.5,
            1,
            _reference(rows, DECODE_DATALOADER),
        ),
    ]
    found = []
    for name, goal, times, other in checks:
        if other is None:
            continue
        ratio = decoding["images_per_s"] / (times * other["images_per_s"])
        paired = _paired_ratio(decoding, other)
        found.append(
            {
                "target": name,
                "fastload": decoding["method"],
                "against": other["method"] + (f" x {times}" if times > 1 else ""),
                "ratio": ratio,
                "paired_ratio": None if paired is None else paired / times,
                "met": ratio >= goal,
                "judged": decoding.get("records", 0) >= DECODE_MIN_RECORDS,
            }
        )
    return found


def _decode_part(rows: List[dict]) -> Optional[Tuple[str, dict]]:
    """The verdict's sentence on decoding compressed records, and its row; None unmeasured."""
    decoding = _reference(rows, DECODE_GATHER)
    if decoding is None:
        return None
    threads = decoding.get("decode_threads", 1)
    one = _reference(rows, DECODE_ONE_THREAD)
    share = (
        f", {100 * decoding['images_per_s'] / (threads * one['images_per_s']):.0f}% of {threads} threads x "
        f"libjpeg-turbo's one-thread {_rate(one)}"
        if one
        else ""
    )
    return (
        f"compressed (JPEG) records decode at {_rate(decoding)} "
        f"({decoding['images_per_s'] / threads:,.0f} img/s per thread){share}",
        decoding,
    )


def _rate(row: Optional[dict]) -> str:
    return f"{row['images_per_s']:,.0f} img/s" if row else "?"


# Records measured within this many times the CPU's last-level cache may be read from it.
CACHE_FACTOR = 2


def verdict(
    rows: List[dict], plan: dict, measured_bytes: Optional[int] = None, cache_bytes: Optional[int] = None
) -> str:
    """Names the narrowest stage of the path from storage to the training step, for the
    dataset of the memory plan `plan` (the store's, or the one the user plans). When the
    `measured_bytes` every stage read fit within CACHE_FACTOR times the CPU's `cache_bytes`,
    it says first that the run is too small to judge the loader against memory: loader and
    copy limit may both have read from the cache."""
    loader = _reference(rows, *FASTLOAD_REFERENCE)
    if loader is None:
        decode = _decode_part(rows)
        if decode is not None:
            return decode[0] + "."
        return "no fastload stage ran: nothing to compare the limits with"
    prefix = ""
    if measured_bytes is not None and cache_bytes and measured_bytes <= CACHE_FACTOR * cache_bytes:
        prefix = (
            f"too small to judge against memory: the {gigabytes(measured_bytes)} measured fit within "
            f"{CACHE_FACTOR}x this CPU's {cache_bytes >> 20} MiB last-level cache, so the loader and "
            f"the copy limit may both read from the cache (bench at least {gigabytes(4 * CACHE_FACTOR * cache_bytes)} "
            "with --size-gb for memory's figures); "
        )
    memcpy = _memcpy_limit(rows)
    wrong_limit = limit_problem(rows)
    disk = _reference(rows, "sequential read, cold")
    cold = _reference(rows, "FastLoadDataset, cold, random", "Store.gather, cold, random")
    f32 = _reference(rows, "host-to-device, pinned float32")
    u8 = _reference(rows, "host-to-device, pinned uint8")
    end_to_end = _reference(rows, "FastLoadDataset + to_device")
    fits = plan["uint8_bytes"] <= 0.8 * plan["ram_bytes"]
    parts = [f"the loader ({loader['method']}) delivers {_rate(loader)}"]
    path = [("the loader", loader)]
    if memcpy:
        parts[0] += (
            f", {100 * loader['images_per_s'] / memcpy['images_per_s']:.0f}% of the {_rate(memcpy)} memcpy limit"
        )
        path.append(("memory bandwidth", memcpy))
    elif wrong_limit:
        parts.append(wrong_limit)
    if f32 and u8:
        advice = "send uint8 (fastload.to_device converts on the GPU)"
        if u8["images_per_s"] < loader["images_per_s"]:
            advice = "the link bounds the path even as uint8"
        elif f32["images_per_s"] >= loader["images_per_s"]:
            advice = "the link keeps up either way"
        parts.append(
            f"your host-to-device link carries {_rate(f32)} as float32 and {_rate(u8)} as uint8: {advice}"
        )
        path.append(("the host-to-device link (uint8)", u8))
    else:
        parts.append("no GPU here, so the host-to-device link was not measured")
    if end_to_end:
        parts.append(f"end to end, normalized float32 batches reach the GPU at {_rate(end_to_end)}")
    decode = _decode_part(rows)
    if decode is not None:
        parts.append(decode[0])
        if decode[1].get("judges_this_store"):  # the store is compressed: every read decodes
            path.append(("decoding JPEG records", decode[1]))
    if plan.get("store_in_ram"):
        parts.append("the store is on a RAM disk, so no disk is in the path and no epoch is cold")
    if cold and disk:
        parts.append(f"a cold epoch delivers {_rate(cold)}, the disk reads {_rate(disk)} sequentially")
        if not fits:
            path.append(("the disk (the store does not fit in RAM)", disk))
        elif disk["images_per_s"] < loader["images_per_s"]:
            parts.append("the store fits in RAM, so the disk bounds only the first epoch")
    name, narrowest = min(path, key=lambda stage: stage[1]["images_per_s"])
    parts.append(f"the narrowest stage is {name}, at {_rate(narrowest)}")
    return prefix + "; ".join(parts) + "."


def require_matplotlib():
    """matplotlib's pyplot, drawing off screen (Agg)."""
    import_optional("matplotlib", "--plot", INSTALL_EXTRA).use("Agg")
    return import_optional("matplotlib.pyplot", "--plot", INSTALL_EXTRA)


KIND_COLOURS = {"limit": "#9e9e9e", "fastload": "#2e7d32", "baseline": "#ef6c00"}


def draw(results: dict):
    """The bench's chart as a matplotlib Figure: a horizontal bar of GB/s per method on a log
    scale (loaders differ by orders of magnitude), limits in grey, fastload in green, whiskers
    from the slowest to the fastest run, and the copy limit as a dashed line when it holds,
    named in the legend."""
    plt = require_matplotlib()
    rows = results["rows"]
    fig, ax = plt.subplots(figsize=(10, 0.42 * len(rows) + 1.8))
    y = np.arange(len(rows))[::-1]
    rates = np.array([r["gb_per_s"] for r in rows])
    slowest = np.array([r["gb_per_s_min"] for r in rows])
    fastest = np.array([r["gb_per_s_max"] for r in rows])
    ax.barh(y, rates, color=[KIND_COLOURS[r["kind"]] for r in rows])
    ax.errorbar(
        rates, y, xerr=[rates - slowest, fastest - rates], fmt="none", ecolor="black", capsize=2, lw=0.8
    )
    for yi, top, r in zip(y, fastest, rows):
        ax.text(top * 1.08, yi, f"{r['images_per_s']:,.0f} img/s", va="center", fontsize=7)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in KIND_COLOURS.values()]
    labels = list(KIND_COLOURS)
    label = "GB/s, log scale (median of the runs; whiskers: slowest to fastest"
    memcpy = _memcpy_limit(rows)
    if memcpy:
        line = ax.axvline(memcpy["gb_per_s"], color="#616161", linestyle="--", linewidth=0.8)
        handles.append(line)
        labels.append("memcpy limit")
        label += "; dashed: memcpy limit"
    ax.set_xscale("log")
    ax.set_xlim(min(slowest.min(), 0.01) / 2, fastest.max() * 4)
    ax.set_yticks(y)
    ax.set_yticklabels([r["method"] for r in rows], fontsize=8)
    ax.set_xlabel(label + ")")
    machine = results["machine"]
    h, w, c = results["config"]["shape"]
    ax.set_title(
        f"fastload bench: {h}x{w}x{c} uint8 records, {machine['usable_cores']} cores, {machine['gpu'] or 'no GPU'}",
        fontsize=10,
    )
    ax.legend(handles, labels, loc="lower right", fontsize=8)
    fig.tight_layout()
    return fig


def plot(results: dict, path: PathLike) -> Path:
    """Writes :func:`draw`'s chart to `path` as a PNG, atomically."""
    fig = draw(results)
    try:
        with replace_atomically(path, "plot") as f:
            fig.savefig(f, format="png", dpi=110)
    finally:
        require_matplotlib().close(fig)
    return Path(path)


COLUMNS = ("method", "img/s", "GB/s", "spread", "x memcpy", "x fastload", "CPU us/img")


def table_rows(results: dict) -> List[Tuple[str, ...]]:
    """The figures as text cells, one tuple per method, in COLUMNS order."""

    def ratio(x: Optional[float]) -> str:
        return "-" if x is None else f"{x:.2f}"

    return [
        (
            r["method"],
            f"{r['images_per_s']:,.0f}",
            f"{r['gb_per_s']:.2f}",
            f"{r['spread_pct']:.0f}%",
            ratio(r["vs_memcpy"]),
            ratio(r["vs_fastload"]),
            "-" if r["kind"] == "limit" else f"{r['cpu_us_per_image']:,.0f}",
        )
        for r in results["rows"]
    ]


def report_lines(results: dict) -> List[str]:
    """Everything after the table: skipped stages, memory plan, targets, verdict, warnings."""
    lines = [
        f"skipped {name}: {s['reason']}" for name, s in results["stages"].items() if s["status"] == "skipped"
    ]
    if results.get("not_cold"):
        lines.append(f"no cold rows: {results['not_cold']}")
    m = results["memory_plan"]
    h, w, c = m["shape"]
    lines.append(
        f"memory plan: {m['images']:,} images of {h}x{w}x{c} take {gigabytes(m['uint8_bytes'])} as uint8 and "
        f"{gigabytes(m['float32_bytes'])} as float32; {memory_plan_line(m)}"
    )
    for t in results["targets"]:
        paired = (
            "" if t.get("paired_ratio") is None else f" (median of per-round ratios {t['paired_ratio']:.2f}x)"
        )
        if t["judged"]:
            outcome = "met" if t["met"] else "MISSED"
        else:
            measured = results["config"]["records_measured"] * results["config"]["image_bytes"]
            outcome = f"not judged: the targets hold for epochs over >= {gigabytes(TARGET_MIN_BYTES)}, this run read {gigabytes(measured)}"
        lines.append(f"target {t['target']}: {t['ratio']:.2f}x{paired}, {outcome}")
    lines.append(f"verdict: {results['verdict']}")
    lines.extend(f"warning: {w}" for w in results["warnings"])
    return lines


def print_report(results: dict) -> None:
    cells = table_rows(results)
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        widths = [max(len(row[i]) for row in [COLUMNS, *cells]) for i in range(len(COLUMNS))]
        for row in [COLUMNS, *cells]:
            print(
                "  ".join(
                    cell.ljust(wd) if i == 0 else cell.rjust(wd)
                    for i, (cell, wd) in enumerate(zip(row, widths))
                )
            )
    else:
        table = Table(title="fastload bench (medians)")
        for i, name in enumerate(COLUMNS):
            if i == 0:  # on a narrow terminal the method names wrap, never the figures
                table.add_column(name)
            else:
                table.add_column(name, justify="right", no_wrap=True, min_width=max(len(r[i]) for r in cells))
        for row in cells:
            table.add_row(*row)
        Console(width=None if sys.stdout.isatty() else 160).print(table)
    for line in report_lines(results):
        print(line)
