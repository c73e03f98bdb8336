"""Which boot of which machine this process runs on: whether two processes see the same files and memory.

Two processes that give the same answer can name a file by its device and
inode, or open each other's descriptors through ``/proc``. Linux only (the
boot's random id); elsewhere the answer is None, and nothing is assumed.

>>> this_machine() == this_machine()
True
"""

from __future__ import annotations

import functools
import socket

__all__ = ["this_machine"]


@functools.cache
def this_machine() -> tuple[str, str] | None:
    """This boot of this machine: its boot id and host name (None where the system does not say)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as boot:
            return (boot.read().strip(), socket.gethostname())
    except OSError:
        return None
