"""Under CI (the CI environment variable set, as `.ci/run` does) Hypothesis tries a fixed set of
examples, so a red CI run is red again on a developer's machine with CI=1; elsewhere it draws
new examples every run, which is how the property tests keep finding bugs."""

import os
import shutil
import tempfile

import pytest
from dataset_helpers import N, write_store
from hypothesis import settings

settings.register_profile("ci", derandomize=True)
if os.environ.get("CI"):
    settings.load_profile("ci")


@pytest.fixture(scope="module")
def store_path(tmp_path_factory):
    """A store of N records, one per test module (tests/dataset_helpers.py)."""
    return write_store(tmp_path_factory.mktemp("ds") / "s.bin", N)


@pytest.fixture
def ram_disk_folder():
    """A fresh folder on this machine's tmpfs at /dev/shm (a RAM disk), removed afterwards."""
    from fastload.inspect import storage

    if storage("/dev/shm")["filesystem"] != "tmpfs":
        pytest.skip("no tmpfs at /dev/shm on this machine")
    folder = tempfile.mkdtemp(dir="/dev/shm", prefix="fastload-test-")
    yield folder
    shutil.rmtree(folder)
