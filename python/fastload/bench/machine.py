"""The machine a bench ran on: CPU, cores, RAM, GPU, library versions and how fastload was built."""

from __future__ import annotations

import os
import platform

import numpy as np
import torch

from fastload import _core
from fastload._core import __version__
from fastload.inspect import build_info, machine_memory, usable_cores


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
