"""The data server: nothing but loopback without keys, CURVE keys and allowed clients.

Servers listen on 127.0.0.1 only; every server, consumer and process a test starts is stopped by it.
"""

import gc
import logging
import socket
import traceback

import numpy as np
import pytest

import lazyseq

zmq = pytest.importorskip("zmq")

from serve_helpers import LOOPBACK, lazyseq_threads  # noqa: E402


def test_a_public_address_needs_keys():
    with pytest.raises(ValueError) as caught:
        lazyseq.serve(range(3), "tcp://0.0.0.0:5557")
    assert str(caught.value).startswith(
        "serve: tcp://0.0.0.0:5557 can be reached from other machines, and anyone who reaches it could read the "
        "data; give curve_keypair=zmq.curve_keypair()"
    )
    zmq_keys = pytest.importorskip("zmq").curve_keypair
    with pytest.raises(ValueError) as caught:  # no keys to tell clients apart by: every client would get in
        lazyseq.serve(range(3), LOOPBACK, allowed_clients=[zmq_keys()[0]])
    assert str(caught.value).startswith("serve: allowed_clients needs curve_keypair: clients are told apart by")
    assert lazyseq_threads() == []


@pytest.mark.parametrize(
    ("call", "address", "message"),
    [
        ("serve", "tcp://127.0.0.1:70000", "the port of 'tcp://127.0.0.1:70000' must be a number from 0 to 65535"),
        ("serve", "tcp://127.0.0.1:-1", "the port of 'tcp://127.0.0.1:-1' must be a number from 0 to 65535"),
        ("connect", "tcp://127.0.0.1:0", "the port of 'tcp://127.0.0.1:0' must be a number from 1 to 65535, got '0'"),
        ("serve", "inproc://data", "'inproc://data' is an inproc:// endpoint, which only sockets of one ZeroMQ"),
        ("connect", "inproc://data", "'inproc://data' is an inproc:// endpoint, which only sockets of one ZeroMQ"),
        ("serve", "udp://127.0.0.1:0", "'udp://127.0.0.1:0' is a udp:// endpoint; a lazyseq server and its clients"),
        # (it said the port had to be a number, and that the host was the port)
        ("connect", "tcp://localhost", "'tcp://localhost' has no port: add one, as in 'tcp://localhost:5557'"),
        ("serve", "tcp://[::1]", "'tcp://[::1]' has no port: add one, as in 'tcp://[::1]:5557', or port 0 for any"),
        # (it said the address could be reached from other machines; with insecure=True, ZeroMQ: "No such device")
        ("serve", "tcp://256.1.1.1:5557", "cannot listen at 'tcp://256.1.1.1:5557': '256.1.1.1' is no IPv4 address"),
    ],
)
def test_endpoints_no_server_can_use_are_refused(call, address, message):
    # libzmq binds port 70000 as 4464 and -1 as 65535; an inproc client waited out its timeout, then "lost" the server
    with pytest.raises(ValueError) as caught:
        lazyseq.serve(range(3), address) if call == "serve" else lazyseq.connect(address, timeout=0.5)
    assert str(caught.value).startswith(f"{call}: {message}")
    assert lazyseq_threads() == []


@pytest.mark.parametrize("host", ["127.1", "2130706433"])
def test_the_short_forms_of_an_ipv4_address_are_taken_as_zeromq_takes_them(host):
    with lazyseq.serve(range(3), f"tcp://{host}:0") as server, lazyseq.connect(server.address, timeout=10) as remote:
        assert server.address.startswith("tcp://127.0.0.1:") and list(remote) == [0, 1, 2]
    assert lazyseq_threads() == []


def test_an_address_of_another_machine_is_refused_saying_so():
    address = "tcp://192.0.2.1:5557"  # (TEST-NET-1: documentation's, no machine's)
    with pytest.raises(OSError) as caught:
        lazyseq.serve(range(3), address, insecure=True)
    assert str(caught.value) == (
        f"serve: cannot listen at {address}: Cannot assign requested address (addr='{address}'): the host is not an "
        "address of this machine (a server listens at one of its own)"
    )
    assert lazyseq_threads() == []


def test_an_ipc_file_is_not_taken_from_a_live_server_and_is_removed_at_close(tmp_path):
    path = tmp_path / "data.sock"
    address = f"ipc://{path}"
    with lazyseq.serve(np.arange(3), address):
        with pytest.raises(OSError) as caught:  # ZeroMQ alone replaced the file: new clients read the second server
            lazyseq.serve(np.arange(100, 103), address)
        assert str(caught.value) == (
            f"serve: cannot listen at {address}: another server is listening there (Address already in use); a "
            "server made in this process listens there, still open: close it first (server.close(), or serve in a "
            "with block)"
        )
        # the server that did not start, as a traceback's locals show it (its repr raised AttributeError)
        frames = [frame for frame, _ in traceback.walk_tb(caught.value.__traceback__)]
        unstarted = next(f.f_locals["self"] for f in frames if type(f.f_locals.get("self")).__name__ == "Server")
        assert repr(unstarted) == "<lazyseq.Server that did not start>"
        with lazyseq.connect(address, timeout=5) as remote:
            assert list(remote) == [0, 1, 2]
    assert not path.exists()
    leftover = socket.socket(socket.AF_UNIX)  # the file of a server that ended without removing it
    leftover.bind(str(path))
    leftover.close()
    with lazyseq.serve(np.arange(3), address), lazyseq.connect(address, timeout=5) as remote:
        assert list(remote) == [0, 1, 2]
    assert not path.exists() and lazyseq_threads() == []


def test_serving_at_an_ipc_path_that_is_not_a_socket_leaves_what_is_there(tmp_path):
    # ZeroMQ deleted whatever was at the path: a mistyped path cost the user a file.
    data = tmp_path / "important.csv"
    data.write_text("a,b\n1,2\n")
    folder = tmp_path / "folder"
    folder.mkdir()
    link = tmp_path / "link"
    link.symlink_to(data)
    for path in (data, folder, link):
        address = f"ipc://{path}"
        with pytest.raises(OSError) as caught:
            lazyseq.serve(range(3), address)
        assert str(caught.value) == (
            f"serve: cannot listen at {address}: {path} exists and is not a socket (ZeroMQ would delete it); "
            "choose another path"
        )
    assert data.read_text() == "a,b\n1,2\n" and folder.is_dir() and link.is_symlink()
    assert lazyseq_threads() == []


def test_a_curve_keypair_must_be_a_public_key_and_its_secret_key():
    public, secret = zmq.curve_keypair()
    for pair in [(secret, public), (zmq.curve_keypair()[0], secret)]:  # swapped, or the public key of another pair
        with pytest.raises(ValueError) as caught:  # accepted, and every client then waited out its timeout
            lazyseq.serve(range(3), LOOPBACK, curve_keypair=pair)
        assert str(caught.value) == (
            "serve: curve_keypair[0] is not the public key of curve_keypair[1]: give (public, secret) in that order, "
            "both from one call of zmq.curve_keypair()"
        )
        with pytest.raises(ValueError, match=r"^connect: curve_keypair\[0\] is not the public key of"):
            lazyseq.connect("tcp://127.0.0.1:5557", server_key=public, curve_keypair=pair)
    assert lazyseq_threads() == []


def test_a_wrong_key_leaves_no_zmq_context_behind(recwarn):
    # The consumer's ZeroMQ context was made before its keys were checked, and left to the collector.
    with pytest.raises(ValueError, match="^connect: server_key"):
        lazyseq.connect("tcp://127.0.0.1:5557", server_key=b"not a key")
    gc.collect()
    assert [str(w.message) for w in recwarn if "Unclosed context" in str(w.message)] == []


@pytest.mark.parametrize("key", ["~" * 40, "é" * 40, b"~" * 40])
def test_a_key_of_40_characters_that_are_not_z85_is_refused(key):
    # "~" * 40 raised a KeyError from the Z85 decoder; "é" * 40 became "?" * 40, another valid key.
    message = f"serve: each key of allowed_clients must be a 40-character Z85 key as made by zmq.curve_keypair(), got {key!r:.60}"
    with pytest.raises(ValueError) as caught:
        lazyseq.serve(range(3), LOOPBACK, curve_keypair=zmq.curve_keypair(), allowed_clients=[key])
    assert str(caught.value) == message
    with pytest.raises(ValueError, match="^connect: server_key must be a 40-character Z85 key"):
        lazyseq.connect("tcp://127.0.0.1:5557", server_key=key)
    assert lazyseq_threads() == []


def test_ahead_has_a_bound():
    # ahead=10**9 was taken: every read looked over a billion items asked for (28 s for 2,000 reads).
    with pytest.raises(
        ValueError, match=r"^connect: ahead must be at most 4,096 \(items asked for ahead of use\), got 4,097$"
    ):
        lazyseq.connect("tcp://127.0.0.1:5557", ahead=4097)


def test_a_bool_is_not_a_count_and_a_string_is_not_a_flag():
    with pytest.raises(TypeError, match=r"^connect: ahead must be a positive integer, got True$"):
        lazyseq.connect("tcp://127.0.0.1:5557", ahead=True)
    with pytest.raises(TypeError, match=r"^connect: shared_memory must be True or False, got 'no'$"):
        lazyseq.connect("tcp://127.0.0.1:5557", shared_memory="no")  # (taken for True)


@pytest.mark.parametrize(
    ("timeout", "error"),
    [("10", TypeError), (True, TypeError), (0, ValueError), (float("inf"), ValueError), (1e5, ValueError)],
)
def test_a_timeout_must_be_seconds_the_server_accepts_too(timeout, error):
    expected = "connect: timeout must be a finite number of seconds > 0 and <= 86400, got "
    with pytest.raises(error) as caught:  # True was taken as 1 second, 1e5 was asked of a server that ignores it
        lazyseq.connect("tcp://127.0.0.1:5557", timeout=timeout)
    assert str(caught.value) == expected + repr(timeout)
    assert lazyseq_threads() == []


@pytest.mark.parametrize(("timeout", "most"), [(10.0, 500), (2.0, 250), (0.1, 50)])
def test_a_consumer_tries_to_reconnect_at_least_every_half_heartbeat(timeout, most):
    # Tries up to a second apart could miss a server back late within a short timeout: reported lost.
    with lazyseq.serve(range(5), LOOPBACK) as server, lazyseq.connect(server.address, timeout=timeout) as remote:
        sockets = (remote._connection._socket, remote._connection.heartbeat._socket)
        assert [socket.getsockopt(zmq.RECONNECT_IVL_MAX) for socket in sockets] == [most, most]


def test_curve_lets_allowed_clients_in_and_keeps_others_out(caplog):
    caplog.set_level(logging.INFO, logger="lazyseq.serve")
    server_keys, client_keys, stranger_keys = zmq.curve_keypair(), zmq.curve_keypair(), zmq.curve_keypair()
    with lazyseq.serve(range(5), LOOPBACK, curve_keypair=server_keys, allowed_clients=[client_keys[0]]) as server:
        with lazyseq.connect(server.address, server_key=server_keys[0], curve_keypair=client_keys) as remote:
            assert list(remote) == [0, 1, 2, 3, 4]
        with pytest.raises(lazyseq.ServerLost) as caught:
            lazyseq.connect(server.address, timeout=0.5, server_key=server_keys[0], curve_keypair=stranger_keys)
        # refused during the handshake: the hello waits unanswered, or cannot leave if the refusal came first
        assert str(caught.value).endswith(
            " (with CURVE: check server_key, and that the server allows this client's public key)"
        ) and (
            "while waiting for an answer to hello" in str(caught.value) or "could not send to it" in str(caught.value)
        )
        assert server._loop._seen == {}  # nothing the stranger sent was read
        with pytest.raises(lazyseq.ServerLost) as caught:  # without CURVE: no handshake either
            lazyseq.connect(server.address, timeout=0.5)
        assert str(caught.value).endswith(
            " (nothing answered at that address; a server with CURVE keys needs server_key and curve_keypair here)"
        )
    assert not [r for r in caplog.records if "rejected" in r.getMessage()]
