"""fastload.inspect: where a store lives (a disk or a RAM disk), the memory plan, whether the
store fits on this machine's GPU, and what `fastload info` says of each (#34, #35 item 4)."""

import os

import numpy as np
import pytest
import torch

import fastload.cli
import fastload.inspect
from fastload import StoreWriter

#: A mount table as the kernel writes it: the root on a disk, tmpfs and ramfs, a zram disk, a
#: mount point with a space (escaped as \040), and a tmpfs mounted over an earlier ext4 mount.
MOUNTINFO = """\
22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
30 22 0:25 / /dev/shm rw,nosuid,nodev shared:2 - tmpfs tmpfs rw,size=24683784k
31 22 0:26 / /mnt/ram rw,relatime - ramfs none rw
32 22 252:0 / /mnt/zram rw,relatime - ext4 /dev/zram0 rw
33 22 254:16 / /mnt/my\\040data rw,relatime - xfs /dev/vdb rw
34 22 254:32 / /scratch rw,relatime - ext4 /dev/vdc rw
35 34 0:40 / /scratch rw,relatime - tmpfs tmpfs rw
"""


#: The device number ("major:minor") each test path's file has.
DEVICES = {
    "/dev/shm": "0:25",
    "/mnt/ram": "0:26",
    "/mnt/zram": "252:0",
    "/mnt/my data": "254:16",
    "/scratch": "0:40",
}


@pytest.mark.parametrize(
    "path, filesystem, mount_point, source, in_ram",
    [
        ("/home/u/s.fastload", "ext4", "/", "/dev/vda", False),
        ("/dev/shm/s.fastload", "tmpfs", "/dev/shm", "tmpfs", True),
        ("/mnt/ram/a/s.fastload", "ramfs", "/mnt/ram", "none", True),
        ("/mnt/zram/s.fastload", "ext4", "/mnt/zram", "/dev/zram0", True),
        ("/mnt/my data/s.fastload", "xfs", "/mnt/my data", "/dev/vdb", False),
        ("/scratch/s.fastload", "tmpfs", "/scratch", "tmpfs", True),  # the later mount hides the ext4
        ("/dev/shmx/s.fastload", "ext4", "/", "/dev/vda", False),  # a prefix, not the folder
    ],
)
def test_storage_names_the_filesystem_a_store_lives_on_and_whether_it_is_ram(
    path, filesystem, mount_point, source, in_ram
):
    folder = max((m for m in DEVICES if path.startswith(m + "/")), key=len, default=None)
    device = DEVICES.get(folder, "254:0")
    assert fastload.inspect.find_mount(path, device, MOUNTINFO.splitlines()) == {
        "filesystem": filesystem,
        "mount_point": mount_point,
        "source": source,
        "in_ram": in_ram,
    }


def test_storage_without_a_mount_table_knows_nothing_and_assumes_a_disk(tmp_path):
    (tmp_path / "s.fastload").write_bytes(b"")
    assert fastload.inspect.storage(tmp_path / "s.fastload", str(tmp_path / "missing")) == {
        "filesystem": None,
        "mount_point": None,
        "source": None,
        "in_ram": False,
    }


def test_storage_of_this_machines_files(tmp_path):
    (tmp_path / "s.fastload").write_bytes(b"")
    where = fastload.inspect.storage(tmp_path / "s.fastload")
    assert where["filesystem"] and where["mount_point"] and str(tmp_path).startswith(where["mount_point"])
    assert where["in_ram"] is (where["filesystem"] in ("tmpfs", "ramfs"))
    with pytest.raises(FileNotFoundError):
        fastload.inspect.storage(tmp_path / "missing")


def write_small_store(path):
    rng = np.random.default_rng(0)
    with StoreWriter(path, (8, 8, 3)) as writer:
        writer.extend(rng.integers(0, 256, (10, 8, 8, 3), dtype=np.uint8), np.arange(10.0))
    return path


def test_info_says_a_store_on_a_ram_disk_has_no_cold_epoch_and_its_ram_counts_once(
    ram_disk_folder, tmp_path, capsys
):
    path = write_small_store(os.path.join(ram_disk_folder, "s.fastload"))
    summary = fastload.inspect.info(path)
    assert summary["storage"]["in_ram"] and summary["storage"]["filesystem"] == "tmpfs"
    assert summary["memory"]["store_in_ram"]
    assert fastload.cli.main(["info", path]) == 0
    out = capsys.readouterr().out
    assert "in RAM     0.000 GB on tmpfs (tmpfs at /dev/shm): a RAM disk, so no epoch is cold" in out
    assert "the RAM disk already holds these 10 (0.000 GB), and mapping them takes no second copy" in out
    assert "on disk" not in out
    on_disk = write_small_store(tmp_path / "s.fastload")
    if not fastload.inspect.storage(on_disk)["in_ram"]:
        assert fastload.cli.main(["info", str(on_disk)]) == 0
        out = capsys.readouterr().out
        assert "on disk    0.000 GB" in out and "lives on   " in out and "RAM disk" not in out


def test_the_memory_plan_line_says_the_ram_disk_holds_the_store_only_when_it_does():
    plan = fastload.inspect.memory_plan(250_000, (384, 384, 3), ram_bytes=192 * 10**9)
    line = fastload.inspect.memory_plan_line(plan)
    assert line == "this machine's 192.000 GB RAM holds 434,019 images as uint8, 108,506 as float32"
    plan = fastload.inspect.memory_plan(250_000, (384, 384, 3), ram_bytes=192 * 10**9, store_in_ram=True)
    assert fastload.inspect.memory_plan_line(plan).endswith(
        "; the RAM disk already holds these 250,000 (110.594 GB), and mapping them takes no second copy"
    )


def test_device_plan_counts_the_reserve_and_the_largest_subset_that_fits(monkeypatch):
    monkeypatch.setattr(fastload.inspect, "free_device_bytes", lambda device: 10_000)
    plan = fastload.inspect.device_plan(100, 90, torch.device("cpu"), reserve_bytes=1_000)
    assert plan == {
        "device": "cpu",
        "free_bytes": 10_000,
        "reserve_bytes": 1_000,
        "available_bytes": 9_000,
        "needed_bytes": 9_000,
        "fits": True,
        "largest_fit": 100,
    }
    plan = fastload.inspect.device_plan(101, 90, torch.device("cpu"), reserve_bytes=1_000)
    assert not plan["fits"] and plan["largest_fit"] == 100
    plan = fastload.inspect.device_plan(1, 90, torch.device("cpu"), reserve_bytes=20_000)
    assert plan["available_bytes"] == 0 and not plan["fits"] and plan["largest_fit"] == 0


def test_info_says_whether_the_store_fits_this_machines_gpu(tmp_path, monkeypatch, capsys):
    path = write_small_store(tmp_path / "s.fastload")
    record = 8 * 8 * 3 + 8
    if not torch.cuda.is_available():
        assert fastload.inspect.info(path)["gpu"] is None
        fastload.cli.main(["info", str(path)])
        assert "gpu        none visible here (torch.cuda.is_available() is False)" in capsys.readouterr().out
    # A GPU, stubbed: 10 records' room after the 4 GiB reserve, then 9.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device: "Stub GPU")
    for room, fits in ((10, True), (9, False)):
        free = fastload.inspect.DEFAULT_RESERVE_BYTES + room * record
        monkeypatch.setattr(fastload.inspect, "free_device_bytes", lambda device, free=free: free)
        gpu = fastload.inspect.info(path)["gpu"]
        assert gpu["name"] == "Stub GPU" and gpu["device"] == "cuda:0"
        assert gpu["needed_bytes"] == 10 * record and gpu["fits"] is fits and gpu["largest_fit"] == room
        fastload.cli.main(["info", str(path)])
        line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("gpu "))
        assert line.startswith(
            "gpu        Stub GPU: 4.295 GB free, 0.000 GB after 4.295 GB left for the model"
        )
        held = "the store's 0.000 GB fit resident" if fits else "do not fit: at most 9 records do resident"
        assert held in line and line.endswith("(fit(on_device=True), --on-device)")
