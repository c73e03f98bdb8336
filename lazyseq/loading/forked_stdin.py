"""A worker forked while another thread reads standard input must not wait for that thread.

multiprocessing starts every worker process by closing ``sys.stdin`` (then
opening it again on ``os.devnull``). Closing a buffered stream takes its lock,
and a thread of the parent blocked reading standard input (``input()``, a
script waiting for Enter while a server or a loader runs in another thread)
holds that lock: a forked child inherits it held, with no thread left to
release it. The worker would wait forever, before any lazyseq code runs in it,
alive, so that nothing would report it. A child that :func:`forking_workers`
forks leaves the parent's stream object alone (it is kept, never closed) and
gets one of its own on ``os.devnull`` before multiprocessing's start-up runs.
Workers started with ``spawn`` or ``forkserver`` begin in a new interpreter,
with nothing locked.

>>> with forking_workers():
...     pass  # start worker processes here
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["forking_workers"]

_local = threading.local()  # in a forked child, the thread that forked lives on with its values
_kept: list[Any] = []  # a forked worker's inherited stdin: closing or collecting it would take its lock


@contextmanager
def forking_workers() -> Iterator[None]:
    """Within the block, processes forked by this thread get a standard input of their own."""
    _local.forking = True
    try:
        yield
    finally:
        _local.forking = False


def _in_forked_child() -> None:
    if getattr(_local, "forking", False) and sys.stdin is not None:
        _kept.append(sys.stdin)
        sys.stdin = open(os.devnull, encoding="utf-8")  # noqa: SIM115  # multiprocessing closes it next


os.register_at_fork(after_in_child=_in_forked_child)
