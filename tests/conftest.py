"""Shared test settings: property-based tests are reproducible in CI, exploratory elsewhere."""

import os

from hypothesis import settings

# CI must not fail on an example that no earlier run met; local runs keep exploring new ones.
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")
