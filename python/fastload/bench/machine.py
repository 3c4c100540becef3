"""The machine a bench ran on: CPU, cores, RAM, GPU, library versions and how fastload was built."""

from __future__ import annotations

import glob
import os
import platform
from typing import Optional

import numpy as np
import torch

from fastload import _core
from fastload._core import __version__
from fastload.inspect import build_info, machine_memory, usable_cores


def last_level_cache_bytes() -> Optional[int]:
    """The largest CPU cache of core 0 (its last level, shared by the cores), from sysfs;
    None where the kernel does not say."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    sizes = []
    for index in glob.glob("/sys/devices/system/cpu/cpu0/cache/index*/size"):
        try:
            with open(index, encoding="ascii") as f:
                text = f.read().strip()
        except OSError:
            continue
        if text[:-1].isdigit() and text[-1] in units:
            sizes.append(int(text[:-1]) * units[text[-1]])
        elif text.isdigit():
            sizes.append(int(text))
    return max(sizes, default=None)


def describe_machine() -> dict:
    """CPU, cores, RAM, GPU, library versions and fastload's build (`build_info`), recorded with
    every figure."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        import PIL

        pillow = PIL.__version__
    except ImportError:
        pillow = None
    cuda = torch.cuda.is_available()
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "usable_cores": usable_cores(),
        "fastload_threads": _core.num_threads(),
        "ram_bytes": machine_memory(),
        "last_level_cache_bytes": last_level_cache_bytes(),
        "gpu": torch.cuda.get_device_name(0) if cuda else None,
        "platform": platform.platform(),
        "build": build_info(),
        "versions": {
            "python": platform.python_version(),
            "fastload": __version__,
            "numpy": np.__version__,
            "torch": torch.__version__,
            "pillow": pillow,
        },
    }
