"""Scripts under benches/ imported as modules, so their tests call their functions."""

from __future__ import annotations

import contextlib
import importlib.util
import sys
from pathlib import Path

BENCHES = Path(__file__).resolve().parent.parent / "benches"


@contextlib.contextmanager
def bench_script(name: str):
    """``benches/<name>.py`` as a module for the block, registered in ``sys.modules`` while
    it is (dataclasses look their module up while a class is made)."""
    spec = importlib.util.spec_from_file_location(name, BENCHES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules[name]
