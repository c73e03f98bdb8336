"""Who may talk to a data server: loopback by default, CURVE encryption and a list of allowed clients otherwise.

ZeroMQ's CURVE mechanism encrypts every frame and authenticates the server to
its clients (they must know its public key). Which clients may connect is
decided by a ZAP handler (:class:`ClientCheck`), which the server's I/O thread
answers: a client whose public key is not allowed is refused during the
handshake, before the server reads anything it sent.

Keys are made with ``zmq.curve_keypair()``: a ``(public, secret)`` pair of
40-character Z85 strings. Keep the secret one in a file only its owner can
read (``zmq.auth.create_certificates`` writes both halves, the secret one with
the permissions of the process's umask: ``chmod 600`` it), and give the public
one to the other side.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from typing import Any

from .endpoints import ipv4_address, tcp_host

__all__ = ["ClientCheck", "check_address", "is_loopback", "key_bytes"]

ZAP_ENDPOINT = "inproc://zeromq.zap.01"


def is_loopback(address: str) -> bool:
    """Whether ``address`` (a ZeroMQ endpoint) can only be reached from this machine.

    >>> is_loopback("tcp://127.0.0.1:5557"), is_loopback("tcp://localhost:0"), is_loopback("ipc:///tmp/s")
    (True, True, True)
    >>> is_loopback("tcp://0.0.0.0:5557"), is_loopback("tcp://*:5557"), is_loopback("tcp://10.0.0.2:5557")
    (False, False, False)
    """
    if address.startswith(("ipc://", "inproc://")):
        return True
    host = tcp_host(address)  # of the destination, in "source;destination": what is bound
    if host is None:
        return False
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # "*", an interface name, a host name, or an IPv4 address in a short form (127.1)
        pass
    ipv4 = ipv4_address(host)  # as ZeroMQ reads it
    return ipv4 is not None and ipv4.is_loopback


API_WAYS = (
    "give curve_keypair=zmq.curve_keypair() (clients then need its public key) and allowed_clients=[their public keys]",
    "pass insecure=True",
)


def check_address(
    address: str, curve_keypair: Any, insecure: bool, allowed_clients: Any = None, ways: tuple[str, str] = API_WAYS
) -> None:
    """``ValueError`` for a server bound where others can reach it, with nothing to keep them out.

    ``ways``: how the caller gives keys, and how it says the network is trusted (the message names them).
    """
    if curve_keypair is not None:
        keypair_bytes(curve_keypair, "serve")
    if curve_keypair is None and allowed_clients is not None:
        raise ValueError(
            "serve: allowed_clients needs curve_keypair: clients are told apart by the CURVE keys they encrypt "
            "with, and without encryption anyone who reaches the address is let in"
        )
    if curve_keypair is None and not insecure and not is_loopback(address):
        raise ValueError(
            f"serve: {address} can be reached from other machines, and anyone who reaches it could read the data; "
            f"{ways[0]}, bind to 127.0.0.1, or {ways[1]} on a network you trust"
        )


_Z85 = frozenset(b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#")


def key_bytes(key: Any, what: str) -> bytes:
    """A CURVE key as the 40 bytes of its Z85 text; ``ValueError`` naming ``what`` otherwise.

    >>> key_bytes("é" * 40, "serve: each key of allowed_clients")
    Traceback (most recent call last):
    ...
    ValueError: serve: each key of allowed_clients must be a 40-character Z85 key as made by zmq.curve_keypair(), got 'éééééééééééééééééééééééééééééééééééééééé'
    """
    text = key.encode("ascii") if isinstance(key, str) and key.isascii() else key
    if not isinstance(text, bytes) or len(text) != 40 or not _Z85.issuperset(text):
        raise ValueError(f"{what} must be a 40-character Z85 key as made by zmq.curve_keypair(), got {key!r:.60}")
    return text


def is_pair(public: bytes, secret: bytes) -> bool:
    """Whether ``public`` is the public key of ``secret`` (two 40-byte Z85 keys)."""
    import zmq

    try:
        return bool(zmq.curve_public(secret) == public)
    except zmq.ZMQError:  # not Z85
        return False


def keypair_bytes(keypair: Any, owner: str) -> tuple[bytes, bytes]:
    """A ``(public, secret)`` CURVE pair as two 40-byte Z85 keys; ``ValueError`` unless ``public`` is ``secret``'s."""
    if not (isinstance(keypair, (tuple, list)) and len(keypair) == 2):
        raise ValueError(
            f"{owner}: curve_keypair must be a (public, secret) pair, as zmq.curve_keypair() makes, got {keypair!r:.60}"
        )
    public = key_bytes(keypair[0], f"{owner}: curve_keypair[0] (the public key)")
    secret = key_bytes(keypair[1], f"{owner}: curve_keypair[1] (the secret key)")
    if not is_pair(public, secret):
        raise ValueError(
            f"{owner}: curve_keypair[0] is not the public key of curve_keypair[1]: give (public, secret) in that "
            "order, both from one call of zmq.curve_keypair()"
        )
    return public, secret


class ClientCheck:
    """Answers ZeroMQ's authentication requests (ZAP) for a CURVE server: allowed public keys, or any."""

    def __init__(self, allowed_clients: Iterable[Any] | None) -> None:
        from zmq.utils import z85

        self._z85_decode = z85.decode
        self.allowed: set[bytes] | None = None
        if allowed_clients is not None:
            if isinstance(allowed_clients, (str, bytes)):
                raise ValueError("serve: allowed_clients must be a list of public keys, not one key")
            self.allowed = {
                self._z85_decode(key_bytes(k, "serve: each key of allowed_clients")) for k in allowed_clients
            }

    def answer(self, request: list[bytes]) -> list[bytes]:
        """The reply to one ZAP request: ``200`` for a client let in, ``400`` otherwise."""
        version, request_id = (request + [b"", b""])[:2]
        mechanism = request[5] if len(request) > 5 else b""
        ok = mechanism == b"CURVE" and len(request) > 6
        if ok and self.allowed is not None:
            ok = request[6] in self.allowed  # the client's public key, 32 raw bytes
        status = (b"200", b"OK") if ok else (b"400", b"client key not allowed")
        return [version, request_id, *status, b"", b""]
