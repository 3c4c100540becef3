"""`fastload bench` as a user runs it: every stage reported or skipped with a reason, the
JSON and the chart, --only, the memory plan, a temporary store cleaned up, and clear errors.
Speeds are never asserted here; benches/RESULTS.md records them."""

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch

import fastload
from fastload import StoreWriter, _core, bench

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def importable(module):
    try:
        __import__(module)
    except ImportError:
        return False
    return True


@pytest.fixture(scope="module")
def tiny_store(tmp_path_factory):
    path = tmp_path_factory.mktemp("bench") / "tiny.fastload"
    images = np.random.default_rng(0).integers(0, 256, (400, 48, 48, 3), dtype=np.uint8)
    with StoreWriter(path, (48, 48, 3), label_dtype="int64") as writer:
        writer.extend(images, np.arange(400) % 10)
    return path


@pytest.fixture(scope="module")
def quick_run(tiny_store, tmp_path_factory):
    out = tmp_path_factory.mktemp("bench-out")
    plot_path = out / "bench.png" if importable("matplotlib") else None  # an optional extra
    results = bench.run(
        tiny_store, quick=True, json_path=out / "bench.json", plot_path=plot_path, console=False
    )
    return results, out


def test_quick_run_reports_every_stage_in_the_json(quick_run, tiny_store):
    results, out = quick_run
    saved = json.loads((out / "bench.json").read_text())
    assert list(saved["stages"]) == list(bench.STAGES)
    for name, stage in saved["stages"].items():
        if stage["status"] == "skipped":
            assert stage["reason"], name
        else:
            assert stage["status"] == "ok"
            rows = [r for r in saved["rows"] if r["stage"] == name]
            assert [r["method"] for r in rows] == stage["methods"] != []
    for row in saved["rows"]:
        assert row["images_per_s"] > 0 and row["gb_per_s"] > 0, row["method"]
        assert len(row["seconds"]) == 3 and min(row["seconds"]) > 0
        assert row["spread_pct"] >= 0 and row["vs_fastload"] > 0
        # No share of a limit that a fastload figure beat (on a busy machine the noise can).
        assert (row["vs_memcpy"] is None) == (saved["limit_problem"] is not None), saved["limit_problem"]
    # The stages every machine can run did run.
    for name in ("memcpy", "disk", "gather", "dataset", "memmap", "dataloader"):
        assert saved["stages"][name]["status"] == "ok", saved["stages"][name]
    # DeviceLoader(cpu) beside the same gather and conversion in a plain loop (#43: what the
    # device stage costs beyond its work).
    assert {"DeviceLoader(cpu), warm, random", "Store.gather + to_device(cpu), warm, random"} <= set(
        saved["stages"]["dataset"]["methods"]
    )
    if importable("PIL"):
        assert saved["stages"]["jpeg"]["status"] == "ok"
        assert saved["stages"]["decode"]["methods"] == [
            "libjpeg-turbo, 1 thread",
            "Pillow decode, 1 thread",
            "Store.gather, JPEG records, warm, random",
            "JPEG bytes + Pillow + DataLoader",
        ]
        assert "compressed (JPEG) records decode at" in saved["verdict"]
    else:
        assert "pip install" in saved["stages"]["jpeg"]["reason"]
    if not torch.cuda.is_available():
        for name in ("h2d", "to_device"):
            assert saved["stages"][name]["status"] == "skipped"
            assert "CUDA is not available" in saved["stages"][name]["reason"]
    for name, package in (("litdata", "litdata"), ("streaming", "mosaicml-streaming")):
        if not importable(name):
            assert f"pip install {package}" in saved["stages"][name]["reason"]
    assert saved == json.loads(json.dumps(results))


def test_json_describes_the_machine_and_the_store(quick_run, tiny_store):
    results, _ = quick_run
    machine = results["machine"]
    assert machine["cores"] >= 1 and machine["ram_bytes"] > 0 and machine["cpu"]
    assert machine["gpu"] == (torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)
    assert set(machine["versions"]) == {"python", "fastload", "numpy", "torch", "pillow"}
    config = results["config"]
    assert config["store"] == str(tiny_store.resolve()) and not config["temporary_store"]
    assert config["records"] == config["records_measured"] == 400
    assert config["shape"] == [48, 48, 3]
    plan = results["memory_plan"]
    assert plan["images"] == 400 and plan["uint8_bytes"] == 400 * (48 * 48 * 3 + 8)
    assert results["fastload_reference"] == "FastLoadDataset, warm, random"
    cache = results["machine"]["last_level_cache_bytes"]
    verdict = results["verdict"]
    measured = results["config"]["records_measured"] * results["config"]["image_bytes"]
    if cache and measured <= bench.CACHE_FACTOR * cache:  # a small store may sit in this CPU's cache
        assert verdict.startswith("too small to judge against memory: the ")
        verdict = verdict.split("for memory's figures); ", 1)[1]
    assert verdict.startswith("the loader (FastLoadDataset, warm, random) delivers")
    assert "the narrowest stage is" in results["verdict"]
    if not torch.cuda.is_available():
        assert "the host-to-device link was not measured" in results["verdict"]
    assert all(t["paired_ratio"] > 0 for t in results["targets"])
    expected = {"fastload >= 4x the np.memmap DataLoader recipe", "fastload >= 1.5x np.memmap fancy indexing"}
    if results["limit_problem"] is None:
        expected.add("fastload >= 85% of memcpy")
    if importable("PIL"):  # the decode stage ran on a JPEG copy of the records (#47)
        threads = _core.num_threads()
        expected |= {
            f"compressed gather >= 90% of {threads} threads x one-thread libjpeg-turbo",
            "compressed gather >= 1.5x DataLoader(num_workers=2) + Pillow",
        }
    assert {t["target"] for t in results["targets"]} == expected
    # A quick run's short epochs over a few MB are not what the targets are set for.
    assert not any(t["judged"] for t in results["targets"])
    lines = [line for line in bench.report_lines(results) if line.startswith("target ")]
    assert len(lines) == len(expected) and all(
        "not judged" in line and "MISSED" not in line for line in lines
    )


def test_noisy_figures_are_warned_about(quick_run):
    results, _ = quick_run
    noisy = {r["method"] for r in results["rows"] if r["spread_pct"] > bench.NOISY_SPREAD_PCT}
    busy = [
        w for w in results["warnings"] if w.startswith(("the machine was busy", "the figures were noisy"))
    ]
    if not busy:
        assert {w.split(": runs spread")[0] for w in results["warnings"] if ": runs spread" in w} == noisy
    assert results["config"]["load_average_before"] >= 0


def test_a_busy_machine_gets_one_warning_with_its_load_not_one_per_figure(monkeypatch):
    """#45: every run on a machine with other work printed 11 spread warnings. Few noisy
    figures on an idle machine are named one by one; a machine loaded beyond its cores before
    the run, or a third of the figures noisy, gets one line with the load instead."""
    monkeypatch.setattr("fastload.bench.runner.usable_cores", lambda: 2)
    rows = [{"method": f"m{i}", "spread_pct": spread} for i, spread in enumerate([30, 5, 5, 5, 5, 5])]
    assert bench.noise_warnings(rows, load_before=0.5) == [
        "m0: runs spread 30% around the median: the machine was noisy, rerun on an idle machine "
        "(or with more --repeats) before trusting this figure"
    ]
    (line,) = bench.noise_warnings(rows, load_before=3.4)
    assert line.startswith("the machine was busy: load average 3.4 on 2 cores before the run, and 1 of 6")
    for row in rows[:3]:
        row["spread_pct"] = 25
    (line,) = bench.noise_warnings(rows, load_before=0.5)
    assert line.startswith(
        "the figures were noisy: 3 of 6 figures spread over 20% between rounds (load average 0.5"
    )


def test_a_build_without_jpeg_simd_is_reported_by_build_info_and_bench(tiny_store, monkeypatch, capsys):
    built = fastload.build_info()
    assert built["jpeg_simd"] is _core.pack_jpeg_simd() and built["version"] == fastload.__version__
    assert ("jpeg_simd_note" in built) is not built["jpeg_simd"]
    monkeypatch.setattr(_core, "pack_jpeg_simd", lambda: False)
    note = fastload.build_info()["jpeg_simd_note"]
    assert "without SIMD" in note and "apt-get install nasm" in note
    results = bench.run(tiny_store, quick=True, only="memcpy")
    assert results["machine"]["build"] == {
        "version": fastload.__version__,
        "jpeg_simd": False,
        "jpeg_simd_note": note,
    }
    assert note in results["warnings"] and f"warning: {note}" in capsys.readouterr().out


def test_plot_is_a_png_chart(quick_run):
    pytest.importorskip("matplotlib")
    Image = pytest.importorskip("PIL.Image")

    _, out = quick_run
    data = (out / "bench.png").read_bytes()
    assert data.startswith(PNG_SIGNATURE) and len(data) > 10_000
    with Image.open(out / "bench.png") as image:
        assert image.width > 500 and image.height > 300


def test_the_plot_draws_the_limit_its_legend_names_and_no_line_when_the_limit_fails(quick_run):
    """#45: the legend promised "dashed: memcpy limit" and no dashed line was drawn."""
    pytest.importorskip("matplotlib")
    results, _ = quick_run

    def charted(row):
        return {**row, "gb_per_s_min": 0.9 * row["gb_per_s"], "gb_per_s_max": 1.1 * row["gb_per_s"]}

    limit = charted(_rounds("memcpy, 2 threads", [150, 140, 120], "memcpy", "limit"))
    for loader_rates, drawn in (([100, 110, 105], True), ([170, 160, 150], False)):
        loader = charted(_rounds("Store.gather, warm, random", loader_rates, "gather", "fastload"))
        fig = bench.draw({**results, "rows": [limit, loader]})
        (ax,) = fig.axes
        dashed = [line for line in ax.get_lines() if line.get_linestyle() == "--"]
        legend = [text.get_text() for text in ax.get_legend().get_texts()]
        if drawn:
            assert len(dashed) == 1 and dashed[0].get_xdata()[0] == pytest.approx(limit["gb_per_s"])
            assert "memcpy limit" in legend and "dashed: memcpy limit" in ax.get_xlabel()
        else:  # beaten in every round: no limit, so no line and no promise of one
            assert not dashed and "memcpy limit" not in legend and "dashed" not in ax.get_xlabel()
        fig.clf()


def test_plot_without_matplotlib_says_how_to_install_before_running(tiny_store, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ImportError, match=r"pip install 'fastload\[bench\]'"):
        bench.run(tiny_store, quick=True, plot_path=tmp_path / "x.png", console=False)
    assert not (tmp_path / "x.png").exists()


def test_only_selects_stages_and_console_prints_table(tiny_store, capsys):
    results = bench.run(tiny_store, quick=True, only="gather, memcpy", images=250_000, size=384)
    assert list(results["stages"]) == ["memcpy", "gather"]  # canonical order
    assert {r["stage"] for r in results["rows"]} == {"memcpy", "gather"}
    assert results["fastload_reference"] == "Store.gather, warm, random"
    plan = results["memory_plan"]
    assert plan["images"] == 250_000 and plan["float32_bytes"] == 250_000 * (384 * 384 * 3 * 4 + 8)
    printed = capsys.readouterr().out
    assert "img/s" in printed and "Store.gather, warm, random" in printed
    assert "250,000 images of 384x384x3" in printed and "verdict:" in printed


def test_temporary_store_is_written_and_removed(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    results = bench.run(size_gb=0.003, only="gather", console=False)
    assert (
        results["config"]["temporary_store"] and results["config"]["records"] == 20
    )  # at least 3 MB of 224*224*3
    assert results["stages"]["gather"]["status"] == "ok"
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"only": "memcpy,bogus"}, "unknown stage"),
        ({"repeats": 2}, "at least 3"),
        ({"images": 10}, "go together"),
        ({"size_gb": 1.0}, "not both"),
        ({"json_path": "/nonexistent-dir/b.json"}, "directory does not exist"),
        ({"batch_size": 0}, "batch_size must be an integer >= 1, not 0"),
        ({"batch_size": 10**26}, "batch_size must be below 2\\*\\*62"),
        ({"batch_size": 10**15}, "batch_size must be between 1 and .* records of .*this machine has"),
    ],
)
def test_bad_arguments_are_refused(tiny_store, kwargs, message):
    with pytest.raises(ValueError, match=message):
        bench.run(tiny_store, quick=True, console=False, **kwargs)


def _cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "fastload", "bench", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_cli_quick_run_writes_json(tiny_store, tmp_path):
    proc = _cli(tiny_store, "--quick", "--only", "memcpy,h2d", "--json", tmp_path / "b.json")
    assert proc.returncode == 0, proc.stderr
    saved = json.loads((tmp_path / "b.json").read_text())
    assert list(saved["stages"]) == ["memcpy", "h2d"]
    assert all(r["images_per_s"] > 0 for r in saved["rows"])
    assert "verdict:" in proc.stdout
    # Progress as plain lines when stderr is not a terminal.
    assert "fastload bench: [1/2] setting up memcpy" in proc.stderr
    assert "fastload bench: round 3/3: memcpy, 1 thread" in proc.stderr


def test_cli_bad_store_exits_1_naming_the_file(tmp_path):
    missing = tmp_path / "missing.fastload"
    proc = _cli(missing, "--quick")
    assert proc.returncode == 1
    assert proc.stderr.startswith("fastload bench: error:") and "missing.fastload" in proc.stderr
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"not a store" * 1000)
    proc = _cli(junk, "--quick")
    assert proc.returncode == 1
    assert "fastload bench: error:" in proc.stderr and "junk.bin" in proc.stderr
    proc = _cli(junk, "--only", "nope")
    assert proc.returncode == 1 and "unknown stage" in proc.stderr


def test_plain_table_without_rich(quick_run, monkeypatch, capsys):
    results, _ = quick_run
    monkeypatch.setitem(sys.modules, "rich", None)
    monkeypatch.setitem(sys.modules, "rich.console", None)
    bench.print_report(results)
    lines = capsys.readouterr().out.splitlines()
    header = lines[0].split()
    assert header[:3] == ["method", "img/s", "GB/s"]
    rows = lines[1 : 1 + len(results["rows"])]
    assert [r.startswith(row["method"]) for r, row in zip(rows, results["rows"])] == [True] * len(rows)
    assert len({len(r) for r in [lines[0], *rows]}) == 1  # aligned columns
    assert any(line.startswith("verdict: ") for line in lines)


def _row(method, images_per_s, stage="x", kind="x"):
    return {
        "method": method,
        "stage": stage,
        "kind": kind,
        "images_per_s": images_per_s,
        "gb_per_s": images_per_s / 1e4,
    }


def _h200_rows(memcpy):
    """The figures of the first GPU run (#25: 224x224x3 records, 16 cores), with the memcpy
    limit given."""
    return [
        _row("memcpy, 16 threads", memcpy, stage="memcpy", kind="limit"),
        _row("host-to-device, pinned uint8", 365_827, stage="h2d", kind="limit"),
        _row("host-to-device, pinned float32", 91_457, stage="h2d", kind="limit"),
        _row("Store.gather, warm, random", 321_441, stage="gather", kind="fastload"),
        _row("FastLoadDataset, warm, random", 312_969, stage="dataset", kind="fastload"),
        _row("FastLoadDataset + to_device, float32 on GPU", 125_775, stage="to_device", kind="fastload"),
        _row("np.memmap fancy indexing, warm, random", 60_000, stage="memmap", kind="baseline"),
    ]


def test_a_limit_below_the_loader_is_called_wrong_and_never_compared_with():
    # #25: "memcpy, 16 threads" measured 98,802 img/s, Store.gather 321,441: the verdict said
    # "317% of the memcpy limit" and named memory bandwidth as the narrowest stage.
    rows = _h200_rows(memcpy=98_802)
    problem = bench.limit_problem(rows)
    assert problem.startswith("the memcpy limit is wrong: Store.gather, warm, random delivers 321,441 img/s")
    assert '3.25x the 98,802 img/s of "memcpy, 16 threads"' in problem
    text = bench.verdict(rows, {"ram_bytes": 10**12, "uint8_bytes": 10**9})
    assert problem in text and "% of the" not in text and "memory bandwidth" not in text
    assert text.endswith("the narrowest stage is the loader, at 312,969 img/s.")
    assert [t["target"] for t in bench.targets(rows, bench.TARGET_MIN_BYTES)] == [
        "fastload >= 1.5x np.memmap fancy indexing"
    ]
    # Within the tolerance a loader level with the limit is noise, not a wrong limit.
    level = _h200_rows(memcpy=321_441 / bench.LIMIT_TOLERANCE + 1)
    assert bench.limit_problem(level) is None
    assert "102% of the" in bench.verdict(level, {"ram_bytes": 10**12, "uint8_bytes": 10**9})


def _rounds(method, rates, stage, kind):
    """A figure timed in rounds: 1,000 images a run at each of `rates` images/s."""
    return {
        **_row(method, statistics.median(rates), stage=stage, kind=kind),
        "images_per_run": 1000,
        "seconds": [1000 / r for r in rates],
    }


def test_the_limit_is_the_faster_copy_of_each_round_and_wrong_only_when_beaten_in_every_round():
    """#45: on a busy machine `memcpy, 2 threads` came out below `memcpy, 1 thread`, and the
    loader's median beat the slower copy's: "the memcpy limit is wrong" on every run. The limit
    is now the faster copy of each round, and wrong only when the loader beats it in every
    round and by more than LIMIT_TOLERANCE at the median."""
    one = _rounds("memcpy, 1 thread", [100, 140, 90], "memcpy", "limit")
    two = _rounds("memcpy, 2 threads", [150, 80, 120], "memcpy", "limit")
    loader = _rounds("Store.gather, warm, random", [130, 135, 125], "gather", "fastload")
    limit = bench.memcpy_limit([one, two, loader])
    assert limit["per_round"] == pytest.approx([150, 140, 120]) and limit["images_per_s"] == pytest.approx(
        140
    )
    assert limit["method"] == "memcpy, the faster copy of each round"
    assert bench.limit_problem([one, two, loader]) is None  # below the limit in two rounds of three
    text = bench.verdict([one, two, loader], {"ram_bytes": 10**12, "uint8_bytes": 10**9})
    assert "delivers 130 img/s, 93% of the 140 img/s memcpy limit" in text
    beating = _rounds("Store.gather, warm, random", [170, 160, 150], "gather", "fastload")
    problem = bench.limit_problem([one, two, beating])
    assert problem.startswith(
        "the memcpy limit is wrong: Store.gather, warm, random delivers 160 img/s, 1.14x"
    )
    assert "(per round 1.13x to 1.25x)" in problem
    target = bench.targets([one, two, beating], bench.TARGET_MIN_BYTES)
    assert [t["target"] for t in target] == []  # nothing judged against a limit that does not hold


def test_records_that_fit_in_the_cpu_cache_are_too_few_to_judge_against_memory():
    """#45: a 64 MB quick store stayed in a server CPU's last-level cache, so the loader read
    from cache while the limit was taken as memory's: the verdict says so first."""
    rows = _h200_rows(memcpy=340_000)
    plan = {"ram_bytes": 10**12, "uint8_bytes": 10**9}
    text = bench.verdict(rows, plan, measured_bytes=64 << 20, cache_bytes=40 << 20)
    assert text.startswith(
        "too small to judge against memory: the 0.067 GB measured fit within 2x this CPU's 40 MiB"
    )
    assert "(bench at least 0.336 GB with --size-gb for memory's figures)" in text
    assert bench.verdict(rows, plan, measured_bytes=2 << 30, cache_bytes=40 << 20) == bench.verdict(
        rows, plan
    )


def test_a_link_narrower_than_the_loader_is_the_narrowest_stage():
    rows = _h200_rows(memcpy=340_000)
    rows[1]["images_per_s"] = 200_000  # pinned uint8: narrower than the loader
    text = bench.verdict(rows, {"ram_bytes": 10**12, "uint8_bytes": 10**9})
    assert "delivers 312,969 img/s, 92% of the 340,000 img/s memcpy limit" in text
    assert "the link bounds the path even as uint8" in text
    assert text.endswith("the narrowest stage is the host-to-device link (uint8), at 200,000 img/s.")


def test_a_disk_narrower_than_loader_and_link_is_the_narrowest_stage_of_a_store_beyond_ram():
    rows = _h200_rows(memcpy=340_000) + [
        _row("FastLoadDataset, cold, random", 20_000, stage="dataset", kind="fastload"),
        _row("sequential read, cold", 25_000, stage="disk", kind="limit"),
    ]
    text = bench.verdict(rows, {"ram_bytes": 10**11, "uint8_bytes": 10**12})
    assert "a cold epoch delivers 20,000 img/s, the disk reads 25,000 img/s sequentially" in text
    assert text.endswith("the narrowest stage is the disk (the store does not fit in RAM), at 25,000 img/s.")


@pytest.mark.parametrize(
    "f32, u8, advice, narrowest",
    [
        (5_600, 22_000, "send uint8", "the loader, at 14,000 img/s"),
        (20_000, 80_000, "the link keeps up either way", "the loader, at 14,000 img/s"),
        (
            2_000,
            8_000,
            "the link bounds the path even as uint8",
            "the host-to-device link (uint8), at 8,000 img/s",
        ),
    ],
)
def test_verdict_names_the_narrowest_stage_with_a_gpu(f32, u8, advice, narrowest):
    # The CUDA stages cannot run on a machine without a GPU; their verdict can be checked.
    rows = [
        _row("memcpy, 2 threads", 60_000, stage="memcpy"),
        _row("FastLoadDataset, warm, random", 14_000),
        _row("host-to-device, pinned float32", f32),
        _row("host-to-device, pinned uint8", u8),
    ]
    text = bench.verdict(rows, {"ram_bytes": 10**12, "uint8_bytes": 10**9})
    assert f"as float32 and {u8:,} img/s as uint8: {advice}" in text
    assert text.endswith(f"the narrowest stage is {narrowest}.")


def test_verdict_blames_the_disk_when_the_store_does_not_fit_in_ram():
    rows = [
        _row("FastLoadDataset, warm, random", 14_000),
        _row("FastLoadDataset, cold, random", 900),
        _row("sequential read, cold", 1_200),
    ]
    text = bench.verdict(rows, {"ram_bytes": 10**9, "uint8_bytes": 10**10})
    assert text.endswith("the narrowest stage is the disk (the store does not fit in RAM), at 1,200 img/s.")
    fits = bench.verdict(rows, {"ram_bytes": 10**12, "uint8_bytes": 10**10})
    assert "the disk bounds only the first epoch" in fits and fits.endswith("the loader, at 14,000 img/s.")


def test_targets_give_the_median_of_per_round_ratios_beside_the_ratio_of_medians():
    def timed(method, seconds, stage):
        return {
            **_row(method, 100 / statistics.median(seconds), stage),
            "seconds": seconds,
            "images_per_run": 100,
        }

    rows = [
        timed("FastLoadDataset, warm, random", [1.0, 1.0, 4.0], "dataset"),  # 100, 100, 25 img/s
        timed("np.memmap fancy indexing, warm, random", [2.0, 1.0, 2.0], "memmap"),  # 50, 100, 50 img/s
    ]
    (target,) = bench.targets(rows, bench.TARGET_MIN_BYTES)
    assert target["ratio"] == pytest.approx(2.0)  # 100 / 50: the medians come from different rounds
    assert target["paired_ratio"] == pytest.approx(1.0)  # rounds: 2, 1, 0.5
    assert target["met"] and target["judged"]  # the ratio of the medians decides
    assert not bench.targets(rows, bench.TARGET_MIN_BYTES - 1)[0]["judged"]
    rows[1].pop("seconds")
    assert bench.targets(rows, bench.TARGET_MIN_BYTES)[0]["paired_ratio"] is None


def test_a_store_on_a_ram_disk_gets_no_cold_rows_and_a_verdict_without_a_disk(ram_disk_folder, capsys):
    # #35: on /dev/shm the bench printed cold rows and "the disk bounds only the first epoch".
    path = os.path.join(ram_disk_folder, "tiny.fastload")
    images = np.random.default_rng(0).integers(0, 256, (64, 16, 16, 3), dtype=np.uint8)
    with StoreWriter(path, (16, 16, 3)) as writer:
        writer.extend(images, np.arange(64.0))
    results = bench.run(path, quick=True, only="memcpy,disk,gather")
    methods = [r["method"] for r in results["rows"]]
    assert "sequential read, warm" in methods and "Store.gather, warm, random" in methods
    assert not [m for m in methods if "cold" in m]
    assert results["config"]["storage"]["in_ram"] and results["memory_plan"]["store_in_ram"]
    assert results["not_cold"].startswith("the store is on tmpfs (/dev/shm), held in RAM: no epoch is cold")
    assert "sequential read, cold, Store.gather, cold, random" in results["not_cold"]
    assert "the store is on a RAM disk, so no disk is in the path and no epoch is cold" in results["verdict"]
    assert "the disk reads" not in results["verdict"]
    printed = capsys.readouterr().out
    assert "no cold rows: the store is on tmpfs" in printed
    assert "the RAM disk already holds these 64" in printed


def test_a_store_on_a_disk_keeps_its_cold_rows(quick_run):
    results, _ = quick_run
    if results["config"]["storage"]["in_ram"]:
        pytest.skip("this machine's temporary folder is a RAM disk")
    assert results["not_cold"] is None and not results["memory_plan"]["store_in_ram"]
    assert {"sequential read, cold", "Store.gather, cold, random"} <= {r["method"] for r in results["rows"]}


def test_the_ram_disk_write_bench_writes_verified_stores_on_both_and_reports_each(ram_disk_folder, tmp_path):
    script = Path(__file__).resolve().parents[2] / "benches" / "bench_ram_disk_write.py"
    argv = [sys.executable, str(script), "--mb", "2", "--rounds", "1"]
    done = subprocess.run(
        argv + ["--ram-dir", ram_disk_folder, "--disk-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("tmpfs: tmpfs at /dev/shm, in RAM True, O_DIRECT taken ")
    assert [line.split()[:2] for line in lines[3:7]] == [
        ["tmpfs", "fastload"],
        ["tmpfs", "buffered"],
        ["disk", "fastload"],
        ["disk", "buffered"],
    ]
    assert os.listdir(ram_disk_folder) == [] and os.listdir(tmp_path) == []
