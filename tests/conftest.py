"""Test-suite settings shared by every test module."""

import os

from hypothesis import settings

# Locally hypothesis explores new examples on each run; in CI (CI=true) the examples are
# derandomized so that a run is reproducible and a failure can be replayed exactly.
settings.register_profile("spherenet", max_examples=60, deadline=None)
settings.register_profile("ci", parent=settings.get_profile("spherenet"), derandomize=True)
settings.load_profile("ci" if os.environ.get("CI") else "spherenet")
