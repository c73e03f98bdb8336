"""The data server: bounded memory, and nothing left behind (threads, processes, sockets) after close.

Servers listen on 127.0.0.1 only; every server, consumer and process a test starts is stopped by it.
"""

import gc
import logging
import multiprocessing
import os
import queue
import select
import signal
import subprocess
import sys
import threading
import time
import weakref

import numpy as np
import pytest
import served_pipelines

import lazyseq
from lazyseq.loading.thread_workers import worker_stopping

zmq = pytest.importorskip("zmq")

from serve_helpers import LOOPBACK, TESTS, bare_dealer, lazyseq_threads, losing_the_first  # noqa: E402

from lazyseq.serving import wire  # noqa: E402
from lazyseq.serving.connection import Connection, Patience  # noqa: E402
from lazyseq.serving.view_service import ViewService  # noqa: E402


def test_what_is_held_for_a_consumer_stays_bounded():
    with lazyseq.serve(served_pipelines.numbers(), LOOPBACK, nworkers=2, max_buffered=3) as server:
        with lazyseq.connect(server.address, ahead=2) as remote:
            reads = server._loop._service._reads
            for i in range(100):
                assert remote[i] == i
                held = [len(r.held) for r in list(reads.values())]
                assert all(n <= 3 + 2 + 1 for n in held), held
                assert len(remote._asked) + len(remote._arrived) <= 2


def test_close_and_garbage_collection_leave_nothing_behind():
    def serve_large_items():  # pyzmq starts a thread of its own, for the buffers sent without a copy, and keeps it
        with lazyseq.serve(lazyseq.smap(np.ones, [2**17, 2**18]), LOOPBACK, nworkers=2) as server:
            with lazyseq.connect(server.address, shared_memory=False) as remote:
                assert [x.nbytes for x in remote] == [2**20, 2**21]

    serve_large_items()
    gc.collect()
    threads = set(threading.enumerate())
    fds = len(os.listdir("/proc/self/fd"))
    serve_large_items()
    with lazyseq.serve(range(20), LOOPBACK, nworkers=2) as server:
        remote = lazyseq.connect(server.address)
        assert list(remote) == list(range(20))
        remote.close()
    server = lazyseq.serve(iter(range(20)), LOOPBACK)
    stream = lazyseq.connect(server.address)
    assert next(stream) == 0
    del server, stream  # garbage collection closes both
    gc.collect()
    assert lazyseq_threads() == []
    assert set(threading.enumerate()) == threads
    assert len(os.listdir("/proc/self/fd")) == fds


def test_a_server_collected_leaves_a_busy_worker_thread_to_end_on_its_own(monkeypatch):
    # Dropped unclosed (a notebook's cell run again), it waited up to 10 s for worker threads busy in an item: the
    # collector's close reached them through the server's own thread, which did not know who closed it.
    import lazyseq.loading.thread_workers as thread_workers

    waits = []
    monkeypatch.setattr(thread_workers, "wait_unless_hurried", lambda wait, seconds: waits.append(seconds))
    started, release = threading.Event(), threading.Event()

    def blocking():
        started.set()
        release.wait()  # the first item takes its time (a stream is drawn before anyone asks)
        yield np.zeros(2)

    before = set(threading.enumerate())
    server = lazyseq.serve(blocking(), LOOPBACK)
    assert started.wait(10)
    busy = set(threading.enumerate()) - before
    del server
    gc.collect()
    assert waits == [] and any(thread in thread_workers._busy_at_exit for thread in busy)
    release.set()
    for thread in busy:
        thread.join(10)
    assert not any(thread.is_alive() for thread in busy)


def test_a_server_collected_in_its_own_thread_stops_and_releases_all():
    # The collector ran in the server's thread (which allocates as it polls): stop() waited in context.term() for
    # the sockets that very thread held, for ever; its workers were never stopped, its consumers lost it.
    server = lazyseq.serve(lazyseq.view(np.arange(10)), LOOPBACK, nworkers=2)
    service, collect = server._loop._service, threading.Event()
    real_work = service.work

    def work():  # what the server's thread runs at each turn of its loop: the collection comes there
        if collect.is_set():
            collect.clear()
            gc.collect()
        return real_work()

    service.work = work
    cycle = {"server": server}
    cycle["self"] = cycle  # freed by the cyclic collector only
    thread = server._loop.thread
    del server, cycle
    collect.set()
    thread.join(30)
    assert not thread.is_alive() and not collect.is_set()
    for worker in threading.enumerate():
        if worker.name.startswith("lazyseq-"):
            worker.join(10)
    assert lazyseq_threads() == []


def test_a_consumer_collected_in_its_own_heartbeat_thread_releases_all(monkeypatch):
    # The collector ran in the consumer's heartbeat thread (which allocates as it reads a pong): the close waited in
    # context.term() for the socket that very thread held, for ever, and no other collection ran in the process.
    with lazyseq.serve(lazyseq.view(np.arange(10)), LOOPBACK) as server:
        remote = lazyseq.connect(server.address, timeout=0.4)  # a ping every 0.1 s
        assert remote[3] == 3
        context, heartbeat = remote._connection._context, remote._connection.heartbeat
        collect, collected_in = threading.Event(), []
        loads = wire.loads

        def loads_then_collect(data, **options):  # what the heartbeat thread runs at each pong: it collects there
            if collect.is_set() and threading.current_thread() is heartbeat:
                collect.clear()
                gc.collect()
            return loads(data, **options)

        monkeypatch.setattr(wire, "loads", loads_then_collect)
        cycle = {"remote": remote}
        cycle["self"] = cycle  # freed by the cyclic collector only
        weakref.finalize(remote, lambda: collected_in.append(threading.current_thread().name))
        gc.disable()  # by the heartbeat thread's collection only
        try:
            del remote, cycle
            collect.set()
            heartbeat.join(30)
        finally:
            gc.enable()
        assert collected_in == ["lazyseq-connect-heartbeat"] and not heartbeat.is_alive()
        for thread in threading.enumerate():
            if thread.name == "lazyseq-connect-close":  # (the context is ended apart: a collection waits for nothing)
                thread.join(30)
        assert context.closed


def test_a_consumer_collected_as_the_list_of_threads_is_read_releases_all():
    # A collection that began in threading.enumerate(), which holds the lock of threading's list of threads, waited
    # there for the heartbeat's thread to end, which takes that lock as it ends: for ever.
    with lazyseq.serve(np.arange(4), LOOPBACK) as server:
        remote = lazyseq.connect(server.address)
        assert remote[1] == 1
        context, heartbeat = remote._connection._context, remote._connection.heartbeat
        cycle = [remote]
        cycle.append(cycle)  # freed by the cyclic collector only
        del remote, cycle
        with threading._active_limbo_lock:  # as threading.enumerate() holds it
            gc.collect()
        heartbeat.join(30)
        assert not heartbeat.is_alive()
        assert not any(name.startswith("lazyseq-connect") for name in lazyseq_threads())  # (waits for that thread)
        assert context.closed


def read_one_item_and_return(address):
    remote = lazyseq.connect(address)
    assert remote[1] == 1  # dropped as this returns, just before the child ends (with os._exit)


def test_a_consumer_dropped_as_a_multiprocessing_child_ends_says_goodbye(monkeypatch, tmp_path):
    # Its close left the end of its ZeroMQ context (which waits for "bye" to leave) to a daemon thread, which the
    # child's exit cut short when that thread came late (one child in five, in a probe of 48 children started 12 at a
    # time): the server kept what it held for it until its timeout. The child now waits for that thread as it ends.
    from lazyseq.serving import connection
    from lazyseq.serving.server_loop import ServerLoop

    said, act_on, end = queue.SimpleQueue(), ServerLoop._act_on, connection._end

    def act_on_noting_byes(loop, consumer, kind, header):
        if kind == b"bye":
            said.put(consumer)
        return act_on(loop, consumer, kind, header)

    def end_as_the_child_ends(*args):  # (the child's copy): that thread late, the child ending meanwhile
        while threading.main_thread().is_alive():
            time.sleep(0.01)
        time.sleep(0.2)
        end(*args)
        (tmp_path / "ended").touch()

    monkeypatch.setattr(ServerLoop, "_act_on", act_on_noting_byes)
    monkeypatch.setattr(connection, "_end", end_as_the_child_ends)
    with lazyseq.serve(np.arange(4), LOOPBACK) as server:
        child = multiprocessing.get_context("fork").Process(target=read_one_item_and_return, args=(server.address,))
        child.start()
        child.join(30)
        assert child.exitcode == 0 and (tmp_path / "ended").exists()
        assert said.get(timeout=10)


def test_import_lazyseq_imports_no_zmq():
    code = "import sys, lazyseq; print([m for m in sys.modules if m.split('.')[0] == 'zmq'])"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "[]"


def test_the_command_says_what_is_wrong_with_its_argument():
    env = {**os.environ, "PYTHONPATH": str(TESTS)}
    run = subprocess.run(
        [sys.executable, "-m", "lazyseq.serve", "served_pipelines:nothing"], capture_output=True, text=True, env=env
    )
    assert run.returncode == 1
    assert run.stderr.strip() == "lazyseq.serve: module 'served_pipelines' has no attribute 'nothing'"


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["nosuchmodule:x"], "lazyseq.serve: cannot import 'nosuchmodule': No module named 'nosuchmodule'"),
        (  # (a file's path ended in importlib's TypeError, with a traceback)
            ["./data.py:batches"],
            "lazyseq.serve: './data.py:batches' names a file: name its module and attribute as python -m would, "
            "e.g. data:batches",
        ),
        (
            ["../project/data.py:batches"],
            "lazyseq.serve: '../project/data.py:batches' names a file: name its module and attribute as python -m "
            "would (from ../project, or with it on PYTHONPATH), e.g. data:batches",
        ),
        (
            ["/srv/project/data.py:batches"],
            "lazyseq.serve: '/srv/project/data.py:batches' names a file: name its module and attribute as python -m "
            "would (from /srv/project, or with it on PYTHONPATH), e.g. data:batches",
        ),
        (
            ["string:digits", "--address", "bogus"],
            "lazyseq.serve: address must look like 'tcp://127.0.0.1:5557'",
        ),
        (
            ["os.path:join"],
            "lazyseq.serve: os.path:join is a function that needs arguments (missing a required argument: 'a'); "
            "name a view, or a function that takes none and returns one",
        ),
        (["string:digits", "--keys", "/nonexistent"], "lazyseq.serve: --keys /nonexistent: no /nonexistent/server.key"),
        (
            ["string:digits", "--address", "tcp://0.0.0.0:0"],
            "lazyseq.serve: tcp://0.0.0.0:0 can be reached from other machines, and anyone who reaches it could read "
            "the data; give --keys DIR (its server.key_secret, and clients/*.key for the clients let in), bind to "
            "127.0.0.1, or pass --insecure on a network you trust\n",
        ),
    ],
)
def test_the_command_says_what_is_wrong_without_a_traceback(arguments, message):
    run = subprocess.run([sys.executable, "-m", "lazyseq.serve", *arguments], capture_output=True, text=True)
    assert run.returncode == 1 and run.stderr.startswith(message) and "Traceback" not in run.stderr


COMMAND_MODULE = """
import numpy as np
print("loading the data...")


class Batches:
    pass


def nothing():
    pass


class Odd:
    def __len__(self):
        raise ValueError("the length is in another file")

    def __getitem__(self, i):
        return i


odd = Odd()
view = np.arange(4)
"""


@pytest.mark.parametrize(
    ("source", "says", "traceback"),
    [
        ("data:Batches", "lazyseq.serve: data:Batches is a class: name an instance of it in data (a view, a", False),
        (
            "data:nothing",
            "lazyseq.serve: data:nothing() returned None: it should return a view (or an iterable)",
            False,
        ),
        ("needs_more:x", "ModuleNotFoundError: No module named 'nosuchdependency'", True),  # the module's own import
        (
            "data:odd",
            "ValueError: the length is in another file",
            True,
        ),  # the pipeline's own error: where it was raised
    ],
)
def test_the_command_says_what_is_wrong_with_the_source_and_shows_where_the_pipeline_failed(
    tmp_path, source, says, traceback
):
    # A class got "call it: serve(f())", which the command does not do; a function that returned None, "got NoneType";
    # a module that imports a missing one, "cannot import 'needs_more'"; an error of the pipeline, one line, no trace.
    (tmp_path / "data.py").write_text(COMMAND_MODULE)
    (tmp_path / "needs_more.py").write_text("import nosuchdependency\n")
    run = subprocess.run(
        [sys.executable, "-m", "lazyseq.serve", source, "--address", "tcp://127.0.0.1:0"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 1 and run.stdout == ""
    assert (says in run.stderr, "Traceback" in run.stderr) == (True, traceback)


def test_the_command_prints_the_address_first_whatever_the_module_prints(tmp_path):
    (tmp_path / "data.py").write_text(COMMAND_MODULE)
    server = subprocess.Popen(
        [sys.executable, "-m", "lazyseq.serve", "data:view", "--address", "tcp://127.0.0.1:0"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        address = server.stdout.readline().strip()
        with lazyseq.connect(address, timeout=30) as remote:
            assert list(remote) == [0, 1, 2, 3]
    finally:
        server.terminate()
        _, err = server.communicate(timeout=60)
    assert server.returncode == 0 and err == "loading the data...\n"


def test_the_command_names_the_key_file_that_is_wrong(tmp_path):
    # A pair whose halves differ was refused in the words of serve()'s curve_keypair, which the command hides.
    import zmq.auth

    zmq.auth.create_certificates(str(tmp_path), "server")
    os.chmod(tmp_path / "server.key_secret", 0o600)
    other_public, _ = zmq.curve_keypair()
    pair = (tmp_path / "server.key_secret").read_text()
    public = zmq.auth.load_certificate(tmp_path / "server.key_secret")[0].decode()
    (tmp_path / "server.key_secret").write_text(pair.replace(public, other_public.decode()))
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "lazyseq.serve",
            "string:digits",
            "--keys",
            str(tmp_path),
            "--address",
            "tcp://127.0.0.1:0",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 1
    assert run.stderr == (
        f"lazyseq.serve: {tmp_path / 'server.key_secret'}: its public key is not that of its secret key; make the "
        "pair again with zmq.auth.create_certificates\n"
    )


def test_the_command_says_a_key_directory_cannot_be_read_without_a_traceback():
    # Read where the pipeline's own errors keep their traceback, an unreadable directory printed one. (In a process of
    # its own: importing the command's module makes it the package's serve.)
    code = (
        "import lazyseq.serve as command\n"
        "def unreadable(directory):\n"
        "    raise PermissionError(13, 'Permission denied', directory + '/server.key_secret')\n"
        "command.read_keys = unreadable\n"
        "command.main(['string:digits', '--keys', '/locked', '--address', 'tcp://127.0.0.1:0'])\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert (run.returncode, run.stderr) == (
        1,
        "lazyseq.serve: [Errno 13] Permission denied: '/locked/server.key_secret'\n",
    )


def test_the_commands_sigterm_is_handled_as_ctrl_c_is_at_that_moment():
    # SIGTERM raised KeyboardInterrupt wherever it came, in a close that defers a Ctrl-C too: a second one left the
    # ipc:// file and ZeroMQ's context behind.
    code = (
        "import signal, lazyseq.serve as command\n"
        "heard = []\n"
        "signal.signal(signal.SIGINT, lambda signum, frame: heard.append(signum))\n"
        "command._as_ctrl_c(signal.SIGTERM, None)\n"
        "signal.signal(signal.SIGINT, signal.SIG_IGN)  # (a background job of a shell script): it still stops\n"
        "try:\n"
        "    command._as_ctrl_c(signal.SIGTERM, None)\n"
        "except KeyboardInterrupt:\n"
        "    heard.append('stopped')\n"
        "print(heard == [signal.SIGINT, 'stopped'])\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert (run.stdout, run.stderr) == ("True\n", "")


def test_importing_the_command_module_leaves_serve_callable():
    # import lazyseq.serve (documentation tools do) made lazyseq.serve that module: "'module' object is not callable"
    code = (
        "import lazyseq.serve, lazyseq\n"
        "with lazyseq.serve(range(3), 'tcp://127.0.0.1:0') as server:\n"
        "    print(list(lazyseq.connect(server.address)))\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert (run.stdout, run.stderr) == ("[0, 1, 2]\n", "")


def test_serve_forever_returns_when_closed_from_another_thread():
    server = lazyseq.serve(range(3), LOOPBACK)
    closer = threading.Timer(0.05, server.close)
    closer.start()
    server.serve_forever()
    closer.join()
    assert server.closed and lazyseq_threads() == []


def test_serve_forever_returns_when_a_signal_handler_closes_the_server_as_its_wait_ends(monkeypatch):
    # python -m lazyseq.serve stopped by SIGTERM (docker stop, systemd) exited with status 1 and "stopped on an
    # error": its handler, close(), had run between the end of a wait and the look at the server's thread.
    server = lazyseq.serve(range(3), LOOPBACK)
    waits = []

    def wait(timeout):
        waits.append(timeout)
        if len(waits) == 1:
            server.close()  # the handler, run as the wait timed out
            return False
        return True

    monkeypatch.setattr(server._stopped, "wait", wait)
    server.serve_forever()
    assert server.closed and lazyseq_threads() == []


@pytest.mark.parametrize("served", ["data:batches", "data:stream"])
def test_the_guide_two_script_workflow_runs_as_written(tmp_path, served):
    guide = (TESTS.parent / "docs" / "guide" / "serving.md").read_text()
    blocks = [block.split("```")[0] for block in guide.split("```python\n")[1:]]
    for name in ("data.py", "train.py"):
        (tmp_path / name).write_text(next(b for b in blocks if b.startswith(f'"""{name}')))
    alone = subprocess.run([sys.executable, "train.py"], cwd=tmp_path, capture_output=True, text=True, check=True)
    assert alone.stdout.startswith("training took ")
    server = subprocess.Popen(
        [sys.executable, "-m", "lazyseq.serve", served, "--address", "tcp://127.0.0.1:0"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        address = server.stdout.readline().strip()
        train = (tmp_path / "train.py").read_text().replace("tcp://127.0.0.1:5557", address)
        (tmp_path / "train.py").write_text(train)
        parallel = subprocess.run(
            [sys.executable, "train.py", "--parallel"], cwd=tmp_path, capture_output=True, text=True, check=True
        )
        assert parallel.stdout.startswith("training took ")
    finally:
        server.terminate()
        server.wait()
        server.stdout.close()


class Counter:
    def __init__(self):
        self.count = 0

    def __call__(self):
        self.count += 1
        return np.full(3, self.count)


def test_a_load_buffers_iterator_is_served_as_a_stream_of_copies():
    with lazyseq.load_buffers(Counter(), max_cached=2, nworkers=1) as buffers:  # slots reused: the server copies
        with lazyseq.serve(buffers, LOOPBACK, max_buffered=3) as server, lazyseq.connect(server.address) as stream:
            got = [next(stream) for _ in range(12)]
    assert sorted(int(x[0]) for x in got) == list(range(1, 13))
    assert all((x == x[0]).all() for x in got)


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_worker_processes_read_a_served_view_over_connections_of_their_own(start_method):
    with lazyseq.serve(served_pipelines.numbers(), LOOPBACK) as server, lazyseq.connect(server.address) as remote:
        assert remote[0] == 0  # connected in the parent before the workers fork
        doubled = remote.smap(served_pipelines.double)
        with lazyseq.prefetch(doubled, nworkers=2, method="process", start_method=start_method) as ahead:
            assert list(ahead) == [2 * i for i in range(100)]
        assert remote[99] == 99  # the parent's connection is still its own


def test_a_huge_request_or_item_harms_only_itself(caplog):
    caplog.set_level(logging.WARNING, logger="lazyseq.serve")
    items = lazyseq.smap(lambda i: 10**5000 if i == 1 else i, range(5))
    with lazyseq.serve(items, LOOPBACK) as server, lazyseq.connect(server.address) as remote:
        context = zmq.Context()
        rogue = bare_dealer(context, server.address)
        rogue.send_multipart([wire.TAG, b"get", b'{"req": ' + b"1" * 5000 + b', "index": 0}'])
        assert rogue.recv_multipart()[1] == b"refused"
        rogue.close()
        context.term()
        with pytest.raises(lazyseq.EvaluationError, match="item 1 cannot be sent: the item is an int of 16610 bits"):
            remote[1]
        assert [remote[i] for i in range(5) if i != 1] == [0, 2, 3, 4]
    assert any("an integer of 5000 digits: longer than any count" in r.getMessage() for r in caplog.records)


def test_what_was_computed_ahead_for_a_consumer_gone_quiet_goes_before_its_timeout(monkeypatch):
    # A consumer with a long timeout that was killed kept its items computed ahead until then: so many consumers
    # said hello with a timeout of a day, asked for an item and left, and the server's memory grew with each.
    from lazyseq.serving import server_loop

    monkeypatch.setattr(server_loop, "QUIET_HEARTBEATS", 0.2)  # a fifth of a heartbeat: quiet at once
    idled, real_idle = threading.Event(), ViewService.idle

    def idle(service, consumer):
        real_idle(service, consumer)
        idled.set()

    monkeypatch.setattr(ViewService, "idle", idle)
    with lazyseq.serve(lazyseq.smap(abs, range(30)), LOOPBACK, nworkers=1, max_buffered=8) as server:
        context = zmq.Context()
        quiet = bare_dealer(context, server.address)  # no heartbeats
        quiet.send_multipart([wire.TAG, b"hello", wire.dumps({"timeout": 86400})])
        assert quiet.recv_multipart()[1] == b"welcome"
        quiet.send_multipart([wire.TAG, b"get", wire.dumps({"req": 0, "index": 0})])
        assert wire.loads(quiet.recv_multipart()[2])["tree"] == 0
        assert idled.wait(30)
        [reads] = server._loop._service._reads.values()  # not forgotten: its hello, its reads go on
        assert reads.held == set()
        quiet.send_multipart([wire.TAG, b"get", wire.dumps({"req": 1, "index": 1})])
        assert wire.loads(quiet.recv_multipart()[2])["tree"] == 1
        quiet.close()
        context.term()


def test_pings_from_strangers_leave_nothing_on_the_server():
    with lazyseq.serve(range(3), LOOPBACK) as server:
        context = zmq.Context()
        rogue = bare_dealer(context, server.address)
        for _ in range(200):
            rogue.send_multipart([wire.TAG, b"ping", wire.dumps({"client": os.urandom(16).hex(), "timeout": 9e4})])
        for _ in range(200):
            assert rogue.recv_multipart()[1] == b"pong"
        assert server._loop._seen == {}
        rogue.close()
        context.term()


def test_out_of_order_reads_compute_only_what_is_read():
    computed = []
    items = lazyseq.smap(lambda i: computed.append(i) or i, range(100))  # worker threads: the same process
    with (
        lazyseq.serve(items, LOOPBACK, nworkers=2, max_buffered=8) as server,
        lazyseq.connect(server.address) as remote,
    ):
        picks = np.random.default_rng(0).permutation(100)[:20].tolist()
        assert [remote[i] for i in picks] == picks
        assert sorted(computed) == sorted(picks)


def test_a_forked_child_leaves_the_parent_server_running():
    with lazyseq.serve(range(3), LOOPBACK) as server:
        pid = os.fork()
        if pid == 0:  # the child inherits the server object: what its exit runs must not stop the parent's
            server._finalizer()
            os._exit(0)
        os.waitpid(pid, 0)
        with lazyseq.connect(server.address, timeout=5) as remote:
            assert list(remote) == [0, 1, 2]


def test_a_forked_child_that_closes_its_copy_of_a_consumer_leaves_the_parent_waiting_quietly():
    # The child's close() woke the parent's reader through their shared pipe, for ever: 100% CPU in every wait.
    with lazyseq.serve(range(3), LOOPBACK) as server, lazyseq.connect(server.address, timeout=5) as remote:
        assert remote[0] == 0
        pid = os.fork()
        if pid == 0:
            remote.close()
            os._exit(0)
        os.waitpid(pid, 0)
        connection = remote._connection
        assert not connection.closed
        assert select.select([connection._wake_fd], [], [], 0)[0] == []  # the wake-up pipe stayed empty
        assert remote[1] == 1


def test_keys_without_clients_warn_that_nobody_gets_in(tmp_path):
    zmq_auth = pytest.importorskip("zmq.auth")
    os.chmod(zmq_auth.create_certificates(str(tmp_path), "server")[1], 0o600)
    code = f"from lazyseq.serve import read_keys\nprint(read_keys({str(tmp_path)!r})[1])"  # not imported here
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert (run.stdout, run.stderr) == (
        "[]\n",
        f"lazyseq.serve: warning: --keys {tmp_path}: no {tmp_path / 'clients' / '*.key'}: no client will be let in\n",
    )


def test_a_secret_key_that_others_can_read_is_warned_about(tmp_path):
    zmq_auth = pytest.importorskip("zmq.auth")
    secret = zmq_auth.create_certificates(str(tmp_path), "server")[1]
    os.chmod(secret, 0o644)  # what zmq.auth leaves under the usual umask
    os.makedirs(tmp_path / "clients")
    zmq_auth.create_certificates(str(tmp_path / "clients"), "trainer")
    os.remove(tmp_path / "clients" / "trainer.key_secret")
    code = f"from lazyseq.serve import read_keys\nprint(len(read_keys({str(tmp_path)!r})[1]))"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert (run.stdout, run.stderr) == (
        "1\n",
        f"lazyseq.serve: warning: {secret} can be read by other users (mode 644): whoever reads it can pose as this "
        "server; chmod 600 it\n",
    )


READER_AT_EXIT = """
import threading, time
import lazyseq

def slow(x):
    time.sleep(1)
    return x

server = lazyseq.serve(lazyseq.view(range(5)).smap(slow), "tcp://127.0.0.1:0")
remote = lazyseq.connect(server.address, timeout=10)
reading = threading.Event()

def read():
    reading.set()
    remote[0]

threading.Thread(target=read, daemon=True).start()
reading.wait()
print("main thread exits")
"""


def test_a_reader_thread_still_waiting_at_exit_gets_no_zeromq_error():
    # At exit, the connection's finalizer closed the socket under the waiting thread: ZMQError, non-socket.
    done = subprocess.run([sys.executable, "-c", READER_AT_EXIT], capture_output=True, text=True, timeout=120)
    assert (done.stdout, done.stderr, done.returncode) == ("main thread exits\n", "", 0)


class InterruptedSend:
    """Raises KeyboardInterrupt, as a Ctrl-C landing there would, in the next send of a request of ``kind``: after
    its first frame went out (``part_way``), or before anything of it did."""

    def __init__(self, monkeypatch, kind, part_way):
        self.kind, self.part_way, self.armed = kind, part_way, False
        frame_send, request_send = zmq.Socket.send, Connection.send

        def send_frame(socket, data, flags=0, **options):
            sent = frame_send(socket, data, flags, **options)
            reader = threading.current_thread() is threading.main_thread()  # not the server's thread
            if self.armed and self.part_way and self.sending and reader and flags & zmq.SNDMORE:
                self.armed = False
                raise KeyboardInterrupt
            return sent

        def send_request(connection, kind, header, flags=0):
            self.sending = kind == self.kind
            if self.armed and not self.part_way and self.sending:
                self.armed = False
                raise KeyboardInterrupt
            return request_send(connection, kind, header, flags)

        self.sending = False
        monkeypatch.setattr(zmq.Socket, "send", send_frame)
        monkeypatch.setattr(Connection, "send", send_request)


@pytest.mark.parametrize("part_way", [True, False])
def test_a_ctrl_c_while_a_request_is_sent_loses_nothing(monkeypatch, part_way):
    # Part-way: the next request was glued to the frames sent, and refused ("unknown request b'lazyseq/2'"); a stream
    # then waited for ever for the item asked for. Before: the item taken out was lost, and the stream waited too.
    interrupt = InterruptedSend(monkeypatch, b"get", part_way)
    with lazyseq.serve(np.arange(100) * 10, LOOPBACK) as server:
        with lazyseq.connect(server.address, timeout=3, ahead=1, shared_memory=False) as remote:
            assert remote[0] == 0
            interrupt.armed = True
            with pytest.raises(KeyboardInterrupt):
                remote[50]
            assert [remote[60], remote[50], remote[61]] == [600, 500, 610]
    interrupt.kind = b"next"
    with lazyseq.serve(iter(range(10)), LOOPBACK) as server:
        with lazyseq.connect(server.address, timeout=2, ahead=1) as stream:
            got = [next(stream)]
            interrupt.armed = True
            with pytest.raises(KeyboardInterrupt):
                next(stream)
            got.extend(stream)
        with lazyseq.connect(server.address, timeout=2) as other:
            assert list(other) == []
    assert got == list(range(10))


class InterruptedReceive:
    """Raises KeyboardInterrupt in the reader's next receive of a frame, once the frame is received: pyzmq looks for
    signals then, so a Ctrl-C landing as a message arrives loses it (the frames after it are dropped as a message
    that is not a lazyseq one)."""

    def __init__(self, monkeypatch):
        self.armed, self.interrupts = False, 0
        frame_recv = zmq.Socket.recv

        def recv(socket, flags=0, **options):
            frame = frame_recv(socket, flags, **options)
            if self.armed and threading.current_thread() is threading.main_thread():  # not the heartbeat's thread
                self.armed = False
                self.interrupts += 1
                raise KeyboardInterrupt
            return frame

        monkeypatch.setattr(zmq.Socket, "recv", recv)


def silences(monkeypatch):
    """The times a consumer in this process ran out of patience with a server that answers heartbeats and nothing
    else (after which it asks again for what it waits for)."""
    lost = []
    monkeypatch.setattr(Patience, "lost_patience", lambda patience: lost.append(patience.seconds))
    return lost


def reading_in_turn(view):
    """A function that reads the next item of ``view`` at each call, or the same one again if the last call was
    interrupted (by index: an interrupt ends an iterator over it); IndexError after the last."""
    read = [0]

    def next_item():
        item = view[read[0]]
        read[0] += 1
        return item

    return next_item


def read_through_ctrl_c(interrupt, read):
    """Arm ``interrupt`` before each read, and read again when it fires; what the reads gave."""
    got = []
    while True:
        interrupt.armed = True
        try:
            try:
                got.append(read())
            except KeyboardInterrupt:
                got.append(read())
        except (StopIteration, IndexError):
            return got


@pytest.mark.parametrize("shared_memory", [True, False])
def test_a_ctrl_c_as_an_answer_arrives_costs_no_wait(monkeypatch, shared_memory):
    # The answer read as the interrupt came was lost, and the next read waited for the server's silence (1 s at
    # timeout=2, twice as long at each silence up to the timeout): under Ctrl-Cs quicker than that, for ever.
    interrupt, waits = InterruptedReceive(monkeypatch), silences(monkeypatch)
    with lazyseq.serve(np.arange(60) * 10, LOOPBACK) as server:
        with lazyseq.connect(server.address, timeout=2, shared_memory=shared_memory) as remote:
            got = read_through_ctrl_c(interrupt, reading_in_turn(remote))
            batches = read_through_ctrl_c(interrupt, reading_in_turn(remote.batch(7)))
    assert (got, np.concatenate(batches).tolist(), waits) == ([i * 10 for i in range(60)], got, [])
    assert interrupt.interrupts > 10


def test_a_ctrl_c_as_a_stream_item_arrives_loses_nothing_and_costs_no_wait(monkeypatch):
    interrupt, waits = InterruptedReceive(monkeypatch), silences(monkeypatch)
    with lazyseq.serve(iter(range(60)), LOOPBACK) as server:
        with lazyseq.connect(server.address, timeout=2) as stream:
            got = read_through_ctrl_c(interrupt, stream.__next__)
    # (an item sent again comes when it arrives: after those already on their way)
    assert (sorted(got), waits) == (list(range(60)), [])
    assert interrupt.interrupts > 10


def test_a_stream_whose_request_was_lost_asks_again_after_a_silence(monkeypatch):
    # A 'next' lost on the way (a connection that broke as it was sent): the consumer waited for the item it had
    # asked for, and the server, alive and answering heartbeats, for a request: for ever.
    send_request, lost = losing_the_first(
        b"next", lambda header: header.get("more") and threading.current_thread().name == "MainThread"
    )
    with lazyseq.serve(iter(range(5)), LOOPBACK) as server:
        with lazyseq.connect(server.address, timeout=1, ahead=1) as stream:
            monkeypatch.setattr(Connection, "send", send_request)
            assert list(stream) == [0, 1, 2, 3, 4]
    assert [(header["more"], header["ack"]) for header in lost] == [(1, [])]  # the first: asking for item 0


def test_a_ctrl_c_while_a_server_closes_cuts_the_wait_short_and_still_releases_everything(tmp_path):
    # The close stopped where the interrupt came (the wait for a thread drawing a slow stream item): the socket file
    # and a pipe stayed, and a second close() did nothing.
    release, drawing = threading.Event(), threading.Event()

    def slow():
        yield 0
        drawing.set()
        while not worker_stopping():  # drawing item 1 as the server closes
            release.wait(0.01)
        os.kill(os.getpid(), signal.SIGINT)  # the user presses Ctrl-C during the close
        release.wait(30)
        yield 1

    path = tmp_path / "stream.sock"
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        server = lazyseq.serve(slow(), f"ipc://{path}")
        assert drawing.wait(10)
        with pytest.raises(KeyboardInterrupt):
            server.close()
    finally:
        signal.signal(signal.SIGINT, previous)
        release.set()
    assert not path.exists() and not server._loop.thread.is_alive()


SERVE_INTERRUPTED = """
import signal, zmq, lazyseq

class Interrupted(zmq.Context):
    def socket(self, *args, **kwargs):
        made = super().socket(*args, **kwargs)
        signal.raise_signal(signal.SIGINT)  # a Ctrl-C as the socket is made, before serve() holds it
        return made

zmq.Context = Interrupted
try:
    lazyseq.serve(range(10), "tcp://127.0.0.1:0")
except KeyboardInterrupt:
    print("interrupted", flush=True)
"""


def test_a_ctrl_c_while_serve_makes_its_socket_is_raised_once_the_socket_is_closed():
    # The socket was not listed yet: closing the context waited for it, for ever.
    done = subprocess.run([sys.executable, "-c", SERVE_INTERRUPTED], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout) == (0, "interrupted\n"), done.stderr


def test_a_ctrl_c_while_a_consumer_closes_is_raised_once_all_is_released(monkeypatch):
    # Raised at once, it left the heartbeat thread and ZeroMQ's context running.
    from lazyseq.serving import connection

    release = connection._release

    def interrupted(*args):
        signal.raise_signal(signal.SIGINT)  # a second Ctrl-C (the first one ended a read) as the consumer closes
        release(*args)

    with lazyseq.serve(iter(range(10)), LOOPBACK) as server:
        stream = lazyseq.connect(server.address)
        assert next(stream) == 0
        monkeypatch.setattr(connection, "_release", interrupted)
        with pytest.raises(KeyboardInterrupt):
            stream.close()
        assert stream._connection._context.closed and "lazyseq-connect-heartbeat" not in lazyseq_threads()


def test_a_ctrl_c_while_the_garbage_collector_closes_a_consumer_is_raised_once_all_is_released(monkeypatch):
    # The close run for a consumer dropped unclosed deferred nothing: it stopped at the Ctrl-C, and left the
    # heartbeat thread, ZeroMQ's context and the pipes that wake the threads; the interrupt was printed and dropped.
    from lazyseq.serving import connection

    stop = connection._Heartbeat.stop

    def interrupted(heartbeat):
        signal.raise_signal(signal.SIGINT)  # a Ctrl-C as the heartbeat thread stops
        stop(heartbeat)

    def described(fd):
        try:
            return os.readlink(f"/proc/self/fd/{fd}")
        except FileNotFoundError:
            return None

    with lazyseq.serve(iter(range(10)), LOOPBACK) as server:
        stream = lazyseq.connect(server.address)
        assert next(stream) == 0
        context, heartbeat = stream._connection._context, stream._connection.heartbeat
        pipes = {
            fd: described(fd)
            for fd in (
                stream._connection._wake_fd,
                stream._connection._waker_fd,
                heartbeat._wake_fd,
                heartbeat._waker_fd,
            )
        }
        monkeypatch.setattr(connection._Heartbeat, "stop", interrupted)
        with pytest.raises(KeyboardInterrupt):
            del stream  # the last reference: the finalizer closes the connection
            threading.Event().wait(timeout=60)  # the interrupt comes here, once the close returned
        monkeypatch.undo()
        assert "lazyseq-connect-close" not in lazyseq_threads()  # (waits for the thread that ends the context)
        assert context.closed and not heartbeat.is_alive()
        assert all(described(fd) != pipe for fd, pipe in pipes.items())  # closed (or another's since)
