"""What the data server's tests share: a server in a process of its own, consumers in processes of their own, and
helpers that drive a server's service or its wire by hand."""

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

import zmq
from loader_helpers import running_lazyseq_threads

import lazyseq
from lazyseq.serving import wire
from lazyseq.serving.connection import Connection

TESTS = Path(__file__).parent
LOOPBACK = "tcp://127.0.0.1:0"


class ServerProcess:
    """``python -m lazyseq.serve served_pipelines:NAME`` in a process of its own; its address from its first line."""

    def __init__(self, name, address=LOOPBACK, *extra):
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "lazyseq.serve", f"served_pipelines:{name}", "--address", address, *extra],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.address = self.process.stdout.readline().strip()
        assert self.address.startswith("tcp://127.0.0.1:"), self.address

    def kill(self):
        self.process.kill()
        self.process.wait()

    def stop(self):
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()
        self.process.stdout.close()


@contextlib.contextmanager
def consumer_process(script, *args):
    """A consumer running ``script`` (with ``args``) in a process of its own, its standard input and output piped;
    killed on the way out, whatever it does."""
    process = subprocess.Popen(
        [sys.executable, "-c", script, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        yield process
    finally:
        process.kill()
        process.wait()
        process.stdout.close()
        process.stdin.close()


def run_consumer(script, *args):
    """A consumer running ``script`` (with ``args``) in a process of its own, to its end: what it printed and how it
    ended."""
    return subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=60)


def lazyseq_threads():
    return sorted(t.name for t in running_lazyseq_threads())


def slept(i):
    time.sleep(0.002)
    return i


def losing_the_first(kind, also=lambda header: True):
    """A ``Connection.send`` that loses the first request of ``kind`` (for which ``also`` holds) as a connection that
    broke would, and the list of the headers it lost."""
    request_send, lost = Connection.send, []

    def send_request(connection, sent_kind, header, flags=0):
        if sent_kind == kind and not lost and also(header):
            lost.append(header)
            return None
        return request_send(connection, sent_kind, header, flags)

    return send_request, lost


def bare_dealer(context, address):
    """A ZeroMQ socket connected to ``address`` that sends and reads raw frames (no lazyseq client); closing it drops
    what it has not sent."""
    dealer = context.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(address)
    return dealer


def say_hello(dealer):
    """Say hello on a bare ZeroMQ socket, as a lazyseq consumer does first (else its requests for items are answered
    'forgotten'); the welcome's kind."""
    dealer.send_multipart([wire.TAG, b"hello", b'{"hello": 1, "timeout": 10.0}'])
    return dealer.recv_multipart()[1]


def sent_gets(monkeypatch):
    """The headers of the ``get`` requests that consumers in this process send, as they go out."""
    sent = []
    original = Connection.send

    def record(self, kind, header, flags=0):
        if kind == b"get":
            sent.append(dict(header))
        original(self, kind, header, flags)

    monkeypatch.setattr(Connection, "send", record)
    return sent


def noting_computed(items):
    """A view of ``items`` that notes each item it computes (served with one worker thread: one at a time), and the
    list of them."""
    computed = []

    def compute(x):
        computed.append(x)
        return x

    return lazyseq.smap(compute, items), computed


def drive(service, until, seconds=30):
    """Let the service take its workers' results until ``until()`` holds."""
    deadline = time.monotonic() + seconds
    while not until() and time.monotonic() < deadline:
        service.work()
        time.sleep(0.01)
    assert until()
