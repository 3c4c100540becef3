"""Under CI (the CI environment variable set, as `.ci/run` does) Hypothesis tries a fixed set of
examples, so a red CI run is red again on a developer's machine with CI=1; elsewhere it draws
new examples every run, which is how the property tests keep finding bugs."""

import os

from hypothesis import settings

settings.register_profile("ci", derandomize=True)
if os.environ.get("CI"):
    settings.load_profile("ci")
