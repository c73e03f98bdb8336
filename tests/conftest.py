"""Shared test settings (property-based tests are reproducible in CI, exploratory elsewhere) and fixtures."""

import os
import signal

import pytest
from hypothesis import settings

# A test run started in the background of a script (`pytest &`, nohup) inherits SIGINT ignored: the tests of Ctrl-C
# need Python's handler, here and in the programs they start (exec resets a handled signal to its default).
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# CI must not fail on an example that no earlier run met; local runs keep exploring new ones.
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")


@pytest.fixture
def server_process():
    """Start ``python -m lazyseq.serve served_pipelines:NAME`` servers, each in a process of its own (see
    :class:`serve_helpers.ServerProcess`); every one is stopped after the test."""
    from serve_helpers import LOOPBACK, ServerProcess

    started = []

    def start(name, address=LOOPBACK, *extra):
        server = ServerProcess(name, address, *extra)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()
