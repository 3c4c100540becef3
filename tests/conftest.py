"""Under CI (the CI environment variable set, as `.ci/run` does) Hypothesis tries a fixed set of
examples, so a red CI run is red again on a developer's machine with CI=1; elsewhere it draws
new examples every run, which is how the property tests keep finding bugs."""

import os

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
