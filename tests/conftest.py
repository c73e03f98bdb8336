"""Shared test settings: property-based tests are reproducible in CI, exploratory elsewhere."""

import os
import signal

from hypothesis import settings

# A test run started in the background of a script (`pytest &`, nohup) inherits SIGINT ignored: the tests of Ctrl-C
# need Python's handler, here and in the programs they start (exec resets a handled signal to its default).
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# CI must not fail on an example that no earlier run met; local runs keep exploring new ones.
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")
