"""Endpoints that ZeroMQ would take but a data server cannot use, refused with a message that says why.

libzmq reads a TCP port modulo 2**16 (``tcp://127.0.0.1:70000`` binds port
4464, and ``:-1`` port 65535), and an ``inproc://`` endpoint is reachable
only from sockets of the same ZeroMQ context, which no client shares with a
server: a client would wait for its timeout, then report the server lost. A
server's address names its ``ipc://`` file by an absolute path.
"""

from __future__ import annotations

import ipaddress
import os
import socket

__all__ = ["absolute", "check_endpoint", "is_ipv6", "tcp_host"]

_HIGHEST_PORT = 65535


def check_endpoint(address: object, owner: str, *, binding: bool) -> str:
    """``address`` if a server can listen there (``binding``) or a client connect there; else ``ValueError``.

    >>> check_endpoint("tcp://127.0.0.1:0", "serve", binding=True)
    'tcp://127.0.0.1:0'
    >>> check_endpoint("tcp://127.0.0.1:70000", "serve", binding=True)
    Traceback (most recent call last):
    ...
    ValueError: serve: the port of 'tcp://127.0.0.1:70000' must be a number from 0 to 65535 (0: any free port), got '70000'
    """
    if not isinstance(address, str) or "://" not in address:
        served = getattr(address, "address", None)  # a Server itself
        hint = f"; pass its .address, {served!r}" if isinstance(served, str) else ""
        raise ValueError(f"{owner}: address must look like 'tcp://127.0.0.1:5557', got {address!r}{hint}")
    transport, _, rest = address.partition("://")
    if transport not in ("tcp", "ipc", "inproc"):
        raise ValueError(
            f"{owner}: {address!r} is a {transport}:// endpoint; a lazyseq server and its clients talk over "
            "tcp://HOST:PORT, or ipc://PATH on one machine"
        )
    if transport == "inproc":
        raise ValueError(
            f"{owner}: {address!r} is an inproc:// endpoint, which only sockets of one ZeroMQ context can reach, and "
            "a server and its clients never share one; use tcp://127.0.0.1:PORT, or ipc://PATH on this machine"
        )
    if transport == "tcp":
        if ":" not in rest or rest.endswith("]"):  # (an IPv6 host alone: tcp://[::1])
            example = f"tcp://{rest or '127.0.0.1'}:5557"
            free = ", or port 0 for any free one" if binding else ""
            raise ValueError(f"{owner}: {address!r} has no port: add one, as in {example!r}{free}")
        port = rest.rpartition(":")[2]
        low = 0 if binding else 1
        if not (binding and port == "*") and not (
            port.isascii() and port.isdigit() and low <= int(port) <= _HIGHEST_PORT
        ):
            which = "from 0 to 65535 (0: any free port)" if binding else "from 1 to 65535"
            hint = " (port 0 lets a server pick one: connect to the address it gives)" if port == "0" else ""
            raise ValueError(f"{owner}: the port of {address!r} must be a number {which}, got {port!r}{hint}")
        if binding:
            _check_bind_host(address, owner)
    return address


def _check_bind_host(address: str, owner: str) -> None:
    """``ValueError`` where the host of a ``tcp://`` endpoint to listen at is written as an IPv4 address and is
    none (ZeroMQ says "No such device", and the check for a server others could reach would speak of one that
    none can reach).

    >>> _check_bind_host("tcp://256.1.1.1:5557", "serve")
    Traceback (most recent call last):
    ...
    ValueError: serve: cannot listen at 'tcp://256.1.1.1:5557': '256.1.1.1' is no IPv4 address (four numbers from 0 to 255)
    """
    host = tcp_host(address) or ""
    if written_as_ipv4(host) and ipv4_address(host) is None:
        raise ValueError(
            f"{owner}: cannot listen at {address!r}: {host!r} is no IPv4 address (four numbers from 0 to 255)"
        )


def written_as_ipv4(host: str) -> bool:
    """Whether ``host`` is numbers and dots, as an IPv4 address is written (in one of its forms, or not)."""
    return bool(host) and all(part.isascii() and part.isdigit() for part in host.split("."))


def ipv4_address(host: str) -> ipaddress.IPv4Address | None:
    """The IPv4 address ``host`` writes, in any form ZeroMQ reads (``127.1`` and ``0`` too); None for another host.

    >>> ipv4_address("127.1"), ipv4_address("127.0.0.1 x"), ipv4_address("256.1.1.1")
    (IPv4Address('127.0.0.1'), None, None)
    """
    if not written_as_ipv4(host):  # (inet_aton takes trailing text)
        return None
    try:
        return ipaddress.IPv4Address(socket.inet_aton(host))
    except OSError:
        return None


def tcp_host(address: str) -> str | None:
    """The host of a ``tcp://`` endpoint as written (an IPv6 one in brackets), the destination's for
    ``tcp://source;destination``; None for other transports.

    >>> tcp_host("tcp://[::1]:5557"), tcp_host("tcp://eth0;10.0.0.2:5557"), tcp_host("ipc:///tmp/s")
    ('[::1]', '10.0.0.2', None)
    """
    transport, _, rest = address.partition("://")
    return rest.rpartition(":")[0].rpartition(";")[2] if transport == "tcp" else None


def is_ipv6(address: str) -> bool:
    """Whether ``address`` is a TCP endpoint at an IPv6 address (``tcp://[::1]:5557``), for which ZeroMQ needs its
    IPv6 option (set only then: with it, ``tcp://localhost`` may resolve to ``::ffff:127.0.0.1``).

    >>> is_ipv6("tcp://[::1]:5557"), is_ipv6("tcp://127.0.0.1:5557"), is_ipv6("ipc:///tmp/s")
    (True, False, False)
    """
    return (tcp_host(address) or "").startswith("[")


def absolute(endpoint: str) -> str:
    """``endpoint``, an ``ipc://`` one with its path made absolute (a relative one is the server's working
    directory's, which a client elsewhere does not share).

    >>> absolute("tcp://127.0.0.1:5557"), absolute("ipc:///tmp/a.sock")
    ('tcp://127.0.0.1:5557', 'ipc:///tmp/a.sock')
    >>> absolute("ipc://a.sock") == "ipc://" + os.path.abspath("a.sock")
    True
    """
    transport, _, path = endpoint.partition("://")
    if transport != "ipc" or os.path.isabs(path) or path.startswith("@"):  # (@: Linux's abstract namespace)
        return endpoint
    whole = os.path.abspath(path)
    return endpoint if len(os.fsencode(whole)) > _MAX_SOCKET_PATH else f"ipc://{whole}"  # (too long to connect to)


_MAX_SOCKET_PATH = 107  # bytes of a Unix socket's path (sun_path holds 108, with the final NUL)
