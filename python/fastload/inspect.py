"""What a store and this machine hold: the summary behind `fastload info`, the damaged
records behind `fastload verify`, where a store lives (`storage`: a disk, or a RAM disk with
no cold epoch), the memory plan (uint8 records against cached float32 tensors, against this
machine's RAM and its GPU's free memory), and how this fastload was built (`build_info`)."""

from __future__ import annotations

import math
import os
import re
from typing import Dict, Optional, Sequence

import numpy as np

from fastload import _core
from fastload._checks import is_int
from fastload.progress import gigabytes
from fastload.store import VERIFY_LIMIT, DamagedRecords, PathLike, Store, shared_class_names

__all__ = [
    "info",
    "verify",
    "storage",
    "memory_plan",
    "machine_memory",
    "usable_cores",
    "build_info",
    "free_device_bytes",
    "device_plan",
    "DEFAULT_RESERVE_BYTES",
    "NO_JPEG_SIMD",
]

#: What a build whose JPEG decoder has no SIMD costs, and the fix.
NO_JPEG_SIMD = (
    "JPEG decoding in this fastload runs without SIMD (the extension was compiled without nasm, "
    "or this CPU lacks SSE2/NEON): `fastload pack` decodes JPEGs at full or half size 1.4-2.7x slower "
    "(benches/RESULTS.md). Install nasm (apt-get install nasm) and reinstall fastload"
)


def build_info() -> dict:
    """How this fastload was built, where it changes speed: ``version``, and ``jpeg_simd``,
    whether libjpeg-turbo decodes JPEGs with SIMD here. A build made without ``nasm`` on x86
    has none (the JPEG library's build only prints a warning, which pip hides), and neither
    has a CPU without SSE2/NEON; ``jpeg_simd_note`` then says what that costs."""
    simd = _core.pack_jpeg_simd()
    return {
        "version": _core.__version__,
        "jpeg_simd": simd,
        **({} if simd else {"jpeg_simd_note": NO_JPEG_SIMD}),
    }


def usable_cores() -> int:
    """Cores this process may run on (its affinity mask, e.g. under taskset or a container)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def machine_memory() -> int:
    """Total RAM of this machine in bytes (0 when unknown)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


#: Filesystems whose files are pages of RAM: reading one is a memory copy (no cold epoch), and
#: those pages are the RAM the store takes, so mapping it costs no second copy.
RAM_FILESYSTEMS = frozenset({"tmpfs", "ramfs"})
#: Block devices that are compressed RAM (a filesystem made on /dev/zram0, say).
RAM_BLOCK_DEVICE = re.compile(r"^/dev/zram\d+$")
MOUNTINFO = "/proc/self/mountinfo"


def _unescape_mount_field(field: str) -> str:
    """A mountinfo field with the kernel's octal escapes (space, tab, newline, backslash) undone."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def storage(path: PathLike, mountinfo: str = MOUNTINFO) -> dict:
    """Where the file at `path` lives: ``filesystem`` (its type, e.g. ext4 or tmpfs),
    ``mount_point``, ``source`` (the device or name it was mounted from) and ``in_ram``: True
    on tmpfs and ramfs, and on a zram block device, whose files are already held in RAM (the
    page cache cannot evict them, so there is no cold epoch, and their RAM is counted once).
    Read from the kernel's mount table `mountinfo` (see `find_mount`); where it cannot be read
    (not Linux) every field but ``in_ram`` (False) is None."""
    real = os.path.realpath(os.fspath(path))
    st_dev = os.stat(real).st_dev
    try:
        with open(mountinfo, encoding="utf-8", errors="surrogateescape") as f:
            table = f.read().splitlines()
    except OSError:
        table = []
    return find_mount(real, f"{os.major(st_dev)}:{os.minor(st_dev)}", table)


def find_mount(real_path: str, device: str, mountinfo_lines: Sequence[str]) -> dict:
    """`storage`'s answer for `real_path` (resolved) on `device` ("major:minor") from the lines
    of a mount table: the mount whose mount point is the longest that contains the path,
    preferring one whose device is the file's, and the later of two over the same point (it
    hides the earlier)."""
    best = None  # ((device matches, mount point length), (filesystem, mount point, source))
    for line in mountinfo_lines:
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or len(tail) < 2:
            continue
        mount_point = _unescape_mount_field(fields[4])
        if real_path != mount_point and not real_path.startswith(mount_point.rstrip("/") + "/"):
            continue
        rank = (fields[2] == device, len(mount_point))
        if best is None or rank >= best[0]:
            best = (rank, (tail[0], mount_point, _unescape_mount_field(tail[1])))
    if best is None:
        return {"filesystem": None, "mount_point": None, "source": None, "in_ram": False}
    filesystem, mount_point, source = best[1]
    in_ram = filesystem in RAM_FILESYSTEMS or bool(RAM_BLOCK_DEVICE.match(source))
    return {"filesystem": filesystem, "mount_point": mount_point, "source": source, "in_ram": in_ram}


def memory_plan(
    count: int, shape: Sequence[int], ram_bytes: Optional[int] = None, store_in_ram: bool = False
) -> dict:
    """What `count` images of `shape` cost as uint8 records and as cached float32 tensors,
    and how many of each fit in `ram_bytes` (this machine's RAM by default). `store_in_ram`:
    the store is on a RAM disk (`storage`), so its uint8 records already take that RAM, and
    mapping them adds no second copy."""
    ram = machine_memory() if ram_bytes is None else ram_bytes
    per_image = math.prod(int(side) for side in shape)  # Python ints: np.prod wraps at 2**63
    uint8_bytes = count * (per_image + 8)
    float32_bytes = count * (per_image * 4 + 8)
    return {
        "images": count,
        "shape": list(shape),
        "uint8_bytes": uint8_bytes,
        "float32_bytes": float32_bytes,
        "ram_bytes": ram,
        "fit_in_ram_uint8": ram // (per_image + 8),
        "fit_in_ram_float32": ram // (per_image * 4 + 8),
        "store_in_ram": store_in_ram,
    }


def memory_plan_line(plan: dict) -> str:
    """The memory plan in words, as `fastload info` and `fastload bench` print it."""
    line = (
        f"this machine's {gigabytes(plan['ram_bytes'])} RAM holds {plan['fit_in_ram_uint8']:,} images as "
        f"uint8, {plan['fit_in_ram_float32']:,} as float32"
    )
    if plan.get("store_in_ram"):
        line += (
            f"; the RAM disk already holds these {plan['images']:,} ({gigabytes(plan['uint8_bytes'])}), "
            "and mapping them takes no second copy"
        )
    return line


#: Device memory left free for the model, its gradients, optimizer state and activations unless
#: the caller says otherwise: a small CNN at batch 256 needs well under this.
DEFAULT_RESERVE_BYTES = 4 * 2**30


def free_device_bytes(device) -> int:
    """Memory free on the torch `device` now: the CUDA driver's figure, or the host's available
    RAM for the CPU (which stands in for the device in tests)."""
    if device.type == "cuda":
        import torch

        return int(torch.cuda.mem_get_info(device)[0])
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def device_plan(records: int, record_bytes: int, device, reserve_bytes: int = DEFAULT_RESERVE_BYTES) -> dict:
    """Whether `records` records of `record_bytes` (image and label) fit on the torch `device`,
    held there as uint8 (`fastload.DeviceStore`): its free memory less `reserve_bytes` left for
    the model, the bytes they need, and the most records that fit (in Python ints: no count or
    size wraps). A record larger than the memory available does not fit, even none of it (torch
    cannot even shape a tensor of records of 2**31 x 2**31 x 3 bytes)."""
    counts = (records, record_bytes, reserve_bytes)
    if not (all(is_int(n) for n in counts) and records >= 0 and record_bytes >= 1 and reserve_bytes >= 0):
        raise ValueError(
            "device_plan takes whole numbers: records >= 0, record_bytes >= 1 and reserve_bytes >= 0, "
            f"not {records!r}, {record_bytes!r} and {reserve_bytes!r}"
        )
    records, record_bytes, reserve_bytes = (int(n) for n in counts)
    free = free_device_bytes(device)
    available = max(free - reserve_bytes, 0)
    needed = records * record_bytes
    return {
        "device": str(device),
        "free_bytes": free,
        "reserve_bytes": reserve_bytes,
        "available_bytes": available,
        "needed_bytes": needed,
        "fits": needed <= available and record_bytes <= available,
        "largest_fit": available // record_bytes,
    }


def _gpu_plan(store: Store) -> Optional[dict]:
    """`device_plan` of the whole store on this machine's first CUDA device; None without one
    (torch is imported on this first use: `import fastload` needs none)."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    device = torch.device("cuda", torch.cuda.current_device())
    # DeviceStore holds records decoded by default, a compressed store's too; with
    # decode="device" it holds only the labels there (the compressed bytes stay in pinned RAM).
    plan = device_plan(len(store), store.image_nbytes + store.label_dtype.itemsize, device)
    return {"name": torch.cuda.get_device_name(device), **plan}


def _meta_list(store: Store, key: str) -> Optional[list]:
    """A list from the metadata, or None when it is missing or not a list (a hand-written store)."""
    value = store.meta.get(key)
    return value if isinstance(value, list) else None


def _class_counts(labels: np.ndarray, names: Optional[list]) -> Dict[str, int]:
    """Records per label, each under its class name (the label itself where the store names
    none). Where two labels would show under one key (a store written with one name for two
    classes, or a name that is another label's number), every class shows as 'NAME (LABEL)'
    ('unnamed (LABEL)' where it has none), so no class's count is merged into another's."""
    values, counts = np.unique(labels, return_counts=True)
    values = values.tolist()
    named = [str(names[v]) if names is not None and 0 <= v < len(names) else None for v in values]
    keys = [str(v) if name is None else name for v, name in zip(values, named)]
    if shared_class_names(keys):
        keys = [f"{'unnamed' if name is None else name} ({v})" for v, name in zip(values, named)]
    return dict(zip(keys, counts.tolist()))


def _label_range(labels: np.ndarray) -> dict:
    """min, max and mean of the labels that are numbers (None when none is), and ``nan``, how
    many are NaN: 'min nan max nan mean nan' told nothing of the others (and NaN is no JSON)."""
    missing = np.isnan(labels) if labels.dtype.kind == "f" else np.zeros(len(labels), bool)
    numbers = labels[~missing]
    stats = {key: None for key in ("min", "max", "mean")}
    if len(numbers):
        stats = {"min": float(numbers.min()), "max": float(numbers.max()), "mean": float(numbers.mean())}
    return {**stats, "nan": int(missing.sum())}


#: Distinct values of whole-number labels without class names that `info` counts one by one.
MAX_VALUES_COUNTED = 20


def info(path: PathLike) -> dict:
    """A summary of a store: size, shape, label statistics, page-cache residency and memory plan.

    Labels: records per class when the store names its classes (``classes``); else min, max
    and mean, with ``distinct`` and, for at most ``MAX_VALUES_COUNTED`` of them, the records
    per value (``values``) when they are whole numbers; nothing for a store packed without
    labels (``labelled`` False)."""
    with Store(path) as store:
        labels = np.asarray(store.labels)
        names = _meta_list(store, "class_names")
        if not store.labelled or not len(labels):
            stats = {}
        elif store.label_dtype == np.int64 and names is not None:
            stats = {"classes": _class_counts(labels, names)}
        else:
            stats = _label_range(labels)
            if store.label_dtype == np.int64:
                distinct = len(np.unique(labels))
                stats["distinct"] = distinct
                if distinct <= MAX_VALUES_COUNTED:
                    stats["values"] = _class_counts(labels, None)
        resident, size = store.resident_bytes()
        where = storage(store.path)
        return {
            "path": str(store.path),
            "records": len(store),
            "shape": list(store.shape),
            "label_dtype": str(store.label_dtype),
            "labelled": store.labelled,
            "labels": stats,
            "file_bytes": size,
            "resident_bytes": resident,
            "storage": where,
            "memory": memory_plan(len(store), store.shape, store_in_ram=where["in_ram"]),
            "encoding": _encoding_summary(store, size),
            "gpu": _gpu_plan(store),
            "meta": {k: v for k, v in store.meta.items() if k not in ("sources", "skipped")},
        }


def raw_ratio(count: int, image_nbytes: int, file_bytes: int) -> float:
    """How many times smaller a store file of `file_bytes` is than its `count` records' raw
    pixels and labels (`image_nbytes` + 8 bytes each): what encoding saved, as `fastload info`
    and `pack`'s report give it."""
    return count * (image_nbytes + 8) / max(file_bytes, 1)


def _encoding_summary(store: Store, file_bytes: int) -> Optional[dict]:
    """How a compressed store's records are stored (None for a raw one): the counts each way,
    how many times smaller the file is than the same records raw, the quality and PSNR its
    writer recorded, and how many such records fit in this machine's RAM as stored."""
    if not store.compressed:
        return None
    count = len(store)
    per_record = file_bytes / max(count, 1)
    recorded = store.meta.get("encoding")
    recorded = recorded if isinstance(recorded, dict) else {}
    return {
        **store.encodings,
        "ratio": raw_ratio(count, store.image_nbytes, file_bytes),
        "stored_bytes_per_record": per_record,
        "fit_in_ram_stored": int(machine_memory() // max(per_record, 1)),
        **{key: recorded.get(key) for key in ("quality", "psnr_mean", "psnr_min")},
    }


def verify(path: PathLike, limit: Optional[int] = VERIFY_LIMIT, decode: bool = False) -> DamagedRecords:
    """Damaged records of a store: (index, source file name or None) of the first `limit`
    (None: all), with `.total` counting every damaged record. With `decode`, every encoded
    record of a compressed store is also decoded (`Store.verify`)."""
    with Store(path) as store:
        damaged = store.verify(limit, decode=decode)
        sources = _meta_list(store, "sources") if damaged else None
        named = [(i, sources[i] if sources and i < len(sources) else None) for i in damaged]
        return DamagedRecords(named, damaged.total)


# Host bytes a step holds per image byte of its batch: the uint8 buffers in flight (the one in
# use and the prefetched ones) and the float32 copy a model (or a bench stage) reads.
BATCH_BYTES_PER_IMAGE_BYTE = 8


def check_batch_memory(batch_size: int, store: Store) -> None:
    """Refuses a batch whose buffers cannot fit in this machine's RAM (when it is known)."""
    per_record = BATCH_BYTES_PER_IMAGE_BYTE * store.image_nbytes
    ram = machine_memory()
    if ram and batch_size * per_record > ram:
        h, w, c = store.shape
        raise ValueError(
            f"batch_size must be between 1 and {ram // per_record:,} for {h}x{w}x{c} records of "
            f"{store.path} (a step holds about {per_record:,} bytes per record, this machine has "
            f"{ram / 1e9:.1f} GB of RAM), not {batch_size:,}"
        )
