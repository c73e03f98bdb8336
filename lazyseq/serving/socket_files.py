"""The file of an ``ipc://`` endpoint: never taken from a live server, removed when its server closes.

ZeroMQ binds ``ipc://PATH`` by deleting whatever file is at ``PATH`` first:
a second server at the path of a running one would silently take its clients.
So a server first tries to connect there: a file that answers belongs to a
live server (the bind is refused as a TCP port in use is), one that does not
is left over from a server that crashed, and is replaced. Anything else at
the path (a file, a folder, a link) is the user's: the bind is refused. At close, the
server removes its file, if it is still the one it made.

>>> socket_path("ipc:///tmp/data.sock"), socket_path("ipc://@abstract"), socket_path("tcp://127.0.0.1:0")
('/tmp/data.sock', None, None)
"""

from __future__ import annotations

import contextlib
import os
import socket
import stat

__all__ = ["SocketFile", "refuse_if_listening", "socket_path"]


def socket_path(address: str) -> str | None:
    """The file an ``ipc://`` endpoint names; ``None`` for any other, and for Linux's abstract names (``@``)."""
    if not address.startswith("ipc://"):
        return None
    path = address[len("ipc://") :]
    return None if not path or path.startswith("@") or path == "*" else path


def refuse_if_listening(address: str, owner: str) -> None:
    """``OSError`` if a server listens at the ``ipc://`` file of ``address``, or if that file is not a socket.

    A socket file left over by a server that ended is no obstacle.
    """
    path = socket_path(address)
    if path is None or not os.path.lexists(path):
        return
    if not _is_socket(path):
        raise OSError(
            f"{owner}: cannot listen at {address}: {path} exists and is not a socket (ZeroMQ would delete it); "
            "choose another path"
        )
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except OSError:  # nobody listens: the file of a server that ended without removing it
        return
    finally:
        probe.close()
    raise OSError(f"{owner}: cannot listen at {address}: another server is listening there (Address already in use)")


class SocketFile:
    """The ``ipc://`` file a server has just bound, to remove at close unless another took the path since."""

    def __init__(self, address: str) -> None:
        self.path = socket_path(address)
        self._identity = _identity(self.path) if self.path is not None else None

    def remove(self) -> None:
        if self._identity is not None and _identity(self.path) == self._identity:
            with contextlib.suppress(OSError):  # removed meanwhile
                os.unlink(self.path)  # type: ignore[arg-type]  # a path whenever there is an identity


def _is_socket(path: str) -> bool:
    try:
        return stat.S_ISSOCK(os.lstat(path).st_mode)
    except OSError:
        return False


def _identity(path: str | None) -> tuple[int, int] | None:
    try:
        info = os.stat(path)  # type: ignore[arg-type]
    except (OSError, TypeError):
        return None
    return (info.st_dev, info.st_ino) if stat.S_ISSOCK(info.st_mode) else None
