"""Nothing is left behind: no thread, no child process, no shared memory, no file descriptor."""

import functools
import gc
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from loader_helpers import load_buffers, prefetch, running_lazyseq_threads, square

import lazyseq
import lazyseq.loading.closing
import lazyseq.loading.engine
import lazyseq.loading.prefetch
import lazyseq.loading.process_workers


def lazyseq_threads():
    return running_lazyseq_threads()


def shm_entries():
    """lazyseq's entries in /dev/shm (where no memfd, its pools are files named lazyseq-*): other programs on the
    machine make and remove their own there at any time."""
    if not os.path.isdir("/dev/shm"):
        return []
    return sorted(name for name in os.listdir("/dev/shm") if name.startswith("lazyseq-"))


def open_fds():
    return len(os.listdir(f"/proc/{os.getpid()}/fd"))


@pytest.fixture
def clean():
    """Check that a test leaves no worker, segment or descriptor behind."""
    gc.collect()
    before = (shm_entries(), open_fds())
    yield
    gc.collect()
    assert lazyseq_threads() == []
    assert multiprocessing.active_children() == []
    assert shm_entries() == before[0]
    assert open_fds() <= before[1]


def test_hundreds_of_thread_loaders_leave_nothing(clean):
    source = lazyseq.smap(square, range(50))
    for k in range(300):
        with prefetch(source, nworkers=2) as ahead:
            assert ahead[k % 50] == (k % 50) ** 2
        with load_buffers(lambda: np.zeros(4), nworkers=2) as batches:
            next(batches)


def test_hundreds_of_process_loaders_leave_nothing(clean):
    source = lazyseq.smap(lambda i: np.full(64, i), range(40))
    for k in range(100):
        with prefetch(source, nworkers=2, method="process", start_method="fork", max_buffered=4) as ahead:
            batch = ahead[k % 40]  # held past close: its memory stays valid
        assert (batch == k % 40).all()
        with load_buffers(lambda: np.zeros(256), nworkers=2, method="process", start_method="fork") as b:
            next(b), next(b), next(b)
        del batch


FIRST_LOADER = """
import os, numpy as np, lazyseq

def descriptors():
    found = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            found.add(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:  # the listing's own descriptor, closed since
            pass
    return found

before = descriptors()
with lazyseq.prefetch(lazyseq.smap(abs, range(8)), nworkers=2, method="process", start_method="fork") as ahead:
    assert list(ahead) == list(range(8))
with lazyseq.load_buffers(lambda: np.zeros(4), nworkers=2, method="process", start_method="fork") as batches:
    next(batches)
print(sorted(descriptors() - before))
"""


def test_the_first_process_loader_of_a_program_leaves_no_descriptor_open():
    # Its workers' progress counters once lived in multiprocessing's heap, whose file stays open for the program's life.
    run = subprocess.run([sys.executable, "-c", FIRST_LOADER], capture_output=True, text=True, timeout=120)
    assert (run.stdout, run.stderr) == ("[]\n", "")


def test_garbage_collection_stops_the_workers(clean):
    for method in ("thread", "process"):
        ahead = prefetch(lazyseq.smap(square, range(100)), nworkers=2, method=method)
        assert ahead[10] == 100
        batches = load_buffers(lambda: np.ones(3), nworkers=2, method=method)
        next(batches)
        del ahead, batches


def test_an_iteration_abandoned_halfway_leaves_nothing_once_closed(clean):
    with prefetch(lazyseq.smap(square, range(1000)), nworkers=2, method="process") as ahead:
        for x in ahead:
            if x > 100:
                break


def test_an_error_in_a_worker_leaves_nothing(clean):
    def broken(x):
        raise RuntimeError("broken")

    for method in ("thread", "process"):
        with prefetch(lazyseq.smap(broken, range(10)), nworkers=2, method=method) as ahead:
            with pytest.raises(lazyseq.EvaluationError):
                list(ahead)


@pytest.mark.parametrize("method", ["thread", "process"])
def test_load_buffers_closed_by_another_thread_ends_the_iteration_waiting_in_it(clean, method):
    # The waiting thread went on polling the closed descriptors, spinning, and wrote into reused descriptor numbers.
    release = multiprocessing.Event() if method == "process" else threading.Event()  # the worker process is killed
    batches = lazyseq.load_buffers(
        functools.partial(wait_then_zeros, release), nworkers=1, method=method, inline_below=0
    )
    ended = []

    def read():
        try:
            for _ in batches:
                pass
        except BaseException as error:  # noqa: BLE001  # what the reader saw, whatever it is
            ended.append(error)
        else:
            ended.append("StopIteration")

    reader = threading.Thread(target=read)
    reader.start()
    deadline = time.monotonic() + 60
    while not batches._engine.pending and time.monotonic() < deadline:  # the reader waits for the first batch
        time.sleep(0.001)
    closer = threading.Thread(target=batches.close)
    closer.start()
    if method == "thread":  # a worker thread cannot be stopped: its batch ends once released
        release.set()
    closer.join()
    reader.join(60)
    assert ended == ["StopIteration"]


def wait_then_zeros(release):
    release.wait()
    return np.zeros(4)


def wait_then_same(release, x):
    release.wait()
    return x


@pytest.mark.parametrize("method", ["thread", "process"])
def test_prefetch_closed_by_another_thread_ends_the_read_waiting_in_it(clean, method):
    # close() waited for the lock that the waiting read held: a watchdog could not stop a stuck loader. With worker
    # threads, the read got its item once the busy thread (which cannot be stopped) finished it.
    release = multiprocessing.Event() if method == "process" else threading.Event()  # the worker process is killed
    ahead = lazyseq.prefetch(
        lazyseq.smap(functools.partial(wait_then_same, release), range(10)),
        nworkers=1,
        method=method,
        inline_below=0,
    )
    ended = []

    def read():
        try:
            ahead[0]
        except BaseException as error:  # noqa: BLE001  # what the reader saw, whatever it is
            ended.append(error)

    reader = threading.Thread(target=read)
    reader.start()
    deadline = time.monotonic() + 60
    while (ahead._engine is None or not ahead._engine.pending) and time.monotonic() < deadline:
        time.sleep(0.001)
    closer = threading.Thread(target=ahead.close)
    closer.start()
    if method == "thread":  # a worker thread cannot be stopped: its item ends once released
        release.set()
    closer.join()
    reader.join(60)
    assert len(ended) == 1 and isinstance(ended[0], lazyseq.LoaderError)
    assert str(ended[0]) == "prefetch: the loader was closed while a result was awaited"


@pytest.mark.parametrize("loader", ["prefetch", "load_buffers"])
def test_a_loader_closed_while_its_reader_computes_an_item_delivers_nothing(clean, loader):
    # Cheap items are computed by the reader itself (threads): closed meanwhile, the read returned the item.
    release, computing = threading.Event(), threading.Event()

    def item(x=0):
        computing.set()
        release.wait()
        return np.full(2, x)

    if loader == "prefetch":
        ahead = lazyseq.prefetch(lazyseq.smap(item, range(10)), nworkers=1, inline_below=10.0)
        read, close = (lambda: ahead[0]), ahead.close
    else:
        batches = lazyseq.load_buffers(item, nworkers=1, inline_below=10.0)
        read, close = (lambda: next(batches)), batches.close
    ended = []

    def reader():
        try:
            ended.append(read())
        except BaseException as error:  # noqa: BLE001  # what the reader saw, whatever it is
            ended.append(error)

    thread = threading.Thread(target=reader)
    thread.start()
    assert computing.wait(60)
    close()
    release.set()
    thread.join(60)
    if loader == "prefetch":
        assert type(ended[0]) is lazyseq.loading.failures.LoaderClosed
    else:
        assert type(ended[0]) is StopIteration


def blocks_from_one(blocked, i):
    if i >= 1:
        blocked.release()
        threading.Event().wait()  # never returns: stopped by the close
    time.sleep(0.001)  # not a cheap item, whose result would wait for the next one of its run (Outbox)
    return np.full(4, i)


def test_a_second_ctrl_c_while_worker_processes_stop_still_stops_them_all(clean, monkeypatch):
    # The close waits for the workers to finish their items; a Ctrl-C then (users press it again) used to cut it
    # short: workers running, descriptors open, the loader marked closed.
    real_wait = lazyseq.loading.process_workers.wait
    interrupts = []

    def interrupted_wait(things, timeout=None):
        if not interrupts:
            interrupts.append(True)
            signal.raise_signal(signal.SIGINT)
        return real_wait(things, timeout)

    blocked = multiprocessing.get_context("fork").Semaphore(0)
    items = lazyseq.smap(functools.partial(blocks_from_one, blocked), range(8))
    ahead = prefetch(items, nworkers=2, method="process", start_method="fork")
    assert ahead[0].tolist() == [0] * 4
    # Both workers inside an item that never ends: a worker still between two items when the close asks it to
    # stop would exit at once, and the close would have nothing to wait for.
    assert blocked.acquire(timeout=60) and blocked.acquire(timeout=60)
    monkeypatch.setattr(lazyseq.loading.process_workers, "wait", interrupted_wait)
    with pytest.raises(KeyboardInterrupt):
        ahead.close()
    assert interrupts == [True] and multiprocessing.active_children() == []


def test_a_second_ctrl_c_while_worker_threads_finish_their_items_ends_the_wait(clean, monkeypatch):
    # (The garbage collector's close does not wait for them: see test_thread_workers.)
    release = threading.Event()

    def blocks(i):
        if i >= 1:
            release.wait(timeout=60)
        return i

    real_join, interrupts, unraisable = threading.Thread.join, [], []

    def interrupted_join(thread, timeout=None):
        if thread.name.startswith("lazyseq-") and not interrupts:
            interrupts.append(True)
            signal.raise_signal(signal.SIGINT)
        return real_join(thread, timeout)

    ahead = prefetch(lazyseq.smap(blocks, range(8)), nworkers=2, inline_below=0)
    assert ahead[0] == 0
    monkeypatch.setattr(threading.Thread, "join", interrupted_join)
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    with pytest.raises(KeyboardInterrupt):
        ahead.close()  # without the second Ctrl-C: up to 10 s, until the items end
    monkeypatch.undo()
    busy = lazyseq_threads()
    release.set()  # the threads end their items on their own, and exit
    for thread in busy:
        thread.join(timeout=10)
    assert interrupts == [True] and busy and unraisable == []  # the close did not wait for the items to end


@pytest.mark.parametrize("method", ["thread", "process"])
def test_a_ctrl_c_while_workers_start_leaves_none_running(clean, monkeypatch, method):
    # Raised just after start() had started a worker (after the fork, for a process), before the loader counted
    # it: that worker was left running (a process and its pipes; a thread blocked for ever on its queue).
    cls = threading.Thread if method == "thread" else multiprocessing.process.BaseProcess
    real_start, starts = cls.start, []

    def interrupted_start(worker):
        real_start(worker)
        if worker.name.startswith("lazyseq-"):
            starts.append(worker.name)
            if len(starts) == 2:
                signal.raise_signal(signal.SIGINT)

    monkeypatch.setattr(cls, "start", interrupted_start)
    options = {"start_method": "fork"} if method == "process" else {}
    with pytest.raises(KeyboardInterrupt):
        with prefetch(lazyseq.smap(square, range(20)), nworkers=3, method=method, inline_below=0, **options) as ahead:
            list(ahead)
    assert starts == [f"lazyseq-prefetch-{k}" for k in range(3)]  # every worker started, then all were stopped


def rows(i):
    return np.full(64, i)


@pytest.mark.parametrize(
    "made", ["lazyseq-progress", "lazyseq-slots", "lazyseq-prefetch-reader", "a slot's descriptor", "twice"]
)
def test_a_ctrl_c_just_as_worker_processes_get_a_descriptor_leaves_none_open(clean, monkeypatch, made):
    # Raised as the descriptor was made, before the workers held it: nothing closed it (the memory of the workers'
    # counters, of the slots made at the first result, the pipe that wakes the thread reading the workers, the
    # duplicate of the slots' descriptor sent to a worker); pressed again as the workers closed on their own after
    # the first, the close stopped there, counted as done.
    real_memfd_create, real_thread_init, interrupts = os.memfd_create, threading.Thread.__init__, []
    real_wait = lazyseq.loading.process_workers.wait

    def interrupt(name):
        if name == made.replace("twice", "lazyseq-slots") and not interrupts:
            interrupts.append(name)
            signal.raise_signal(signal.SIGINT)

    def fromfd(fd, family, kind, proto=0):  # as socket.fromfd does, for multiprocessing to send the descriptor
        duplicate = os.dup(fd)
        interrupt("a slot's descriptor")
        return socket.socket(family, kind, proto, duplicate)

    def wait(things, timeout=None):  # the close's wait for the workers to stop
        if made == "twice" and interrupts == ["lazyseq-slots"]:
            interrupts.append("again")
            signal.raise_signal(signal.SIGINT)
        return real_wait(things, timeout)

    monkeypatch.setattr(socket, "fromfd", fromfd)
    monkeypatch.setattr(lazyseq.loading.process_workers, "wait", wait)

    def memfd_create(name, *args):
        fd = real_memfd_create(name, *args)
        interrupt(name)
        return fd

    def thread_init(thread, *args, **kwargs):  # the reader's pipe is made just before its thread
        real_thread_init(thread, *args, **kwargs)
        interrupt(thread.name)

    monkeypatch.setattr(os, "memfd_create", memfd_create)
    monkeypatch.setattr(threading.Thread, "__init__", thread_init)
    with pytest.raises(KeyboardInterrupt):
        with prefetch(lazyseq.smap(rows, range(20)), nworkers=2, method="process", start_method="fork") as ahead:
            list(ahead)
    monkeypatch.undo()
    assert interrupts == (["lazyseq-slots", "again"] if made == "twice" else [made])
    assert multiprocessing.active_children() == []


def test_a_ctrl_c_as_a_prefetch_view_closes_still_closes_its_workers(clean, monkeypatch):
    # Raised once the view had let go of its engine and before it closed it: the workers ran on, and a second
    # close() had nothing left to close.
    real_read_order, interrupts = lazyseq.loading.prefetch.ReadOrder, []

    def read_order(*args):  # the view makes a new one after letting go of the engine
        if not interrupts:
            interrupts.append(True)
            signal.raise_signal(signal.SIGINT)
        return real_read_order(*args)

    ahead = prefetch(lazyseq.smap(square, range(20)), nworkers=2, method="process", start_method="fork")
    assert ahead[3] == 9
    workers = ahead._engine.workers
    monkeypatch.setattr(lazyseq.loading.prefetch, "ReadOrder", read_order)
    with pytest.raises(KeyboardInterrupt):
        ahead.close()
    assert interrupts == [True] and workers.closed and multiprocessing.active_children() == []


def test_a_ctrl_c_in_a_collected_close_is_left_to_the_programs_own_handler(monkeypatch):
    # Under the program's own SIGINT handler, what it raised was taken for a Ctrl-C that lazyseq deferred, and
    # raised again: the handler ran twice for one Ctrl-C (a "press again to quit" handler quit).
    later, unraisable = [], []

    class Owner:
        pass

    def close():
        raise KeyboardInterrupt  # as the program's handler raised it, or, under Python's, as lazyseq deferred it

    monkeypatch.setattr(lazyseq.loading.closing, "interrupt_later", lambda: later.append(True))
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    previous = signal.signal(signal.SIGINT, lambda signum, frame: None)
    try:
        owner = Owner()
        lazyseq.loading.closing.Finalizer(owner, close)
        del owner  # collected: its close runs
    finally:
        signal.signal(signal.SIGINT, previous)
    assert later == [] and [type(hook.exc_value) for hook in unraisable] == [KeyboardInterrupt]
    owner = Owner()
    lazyseq.loading.closing.Finalizer(owner, close)
    del owner  # under Python's handler: raised again later, not printed
    assert later == [True] and len(unraisable) == 1


def test_no_ctrl_c_is_raised_again_through_the_programs_own_handler(monkeypatch):
    # A fork hook that caught a KeyboardInterrupt its handler raised had it raised again: the handler ran twice
    timers = []
    monkeypatch.setattr(threading.Timer, "start", lambda timer: timers.append(timer))
    previous = signal.signal(signal.SIGINT, lambda signum, frame: None)
    try:
        lazyseq.loading.closing.interrupt_later()
    finally:
        signal.signal(signal.SIGINT, previous)
    assert timers == []
    lazyseq.loading.closing.interrupt_later()  # under Python's handler: raised again later
    assert len(timers) == 1


def test_a_ctrl_c_raised_again_in_ipython_is_dropped_once_its_cell_has_ended(monkeypatch):
    # In Jupyter, a Ctrl-C caught while the collector closed a loader was raised 0.2 s later: in the next cell.
    import types

    shell = types.SimpleNamespace(execution_count=5)  # what IPython counts its cells with
    monkeypatch.setitem(sys.modules, "IPython", types.SimpleNamespace(get_ipython=lambda: shell))
    timers = []
    monkeypatch.setattr(threading.Timer, "start", lambda timer: timers.append(timer))
    lazyseq.loading.closing.interrupt_later()
    assert [timer.args for timer in timers] == [((5, None),)]  # the cell it came in
    shell.execution_count = 6  # that cell has ended
    lazyseq.loading.closing._interrupt_main((5, None))  # nothing sent
    shell.parent_header = {"msg_id": "b"}  # in a kernel: the request that runs a cell (silent ones count none)
    lazyseq.loading.closing._interrupt_main((6, "a"))  # nothing sent
    with pytest.raises(KeyboardInterrupt):  # still in that cell: raised in it
        lazyseq.loading.closing._interrupt_main((6, "b"))
        for _ in range(1000):
            time.sleep(0.01)
    monkeypatch.delitem(sys.modules, "IPython")
    assert lazyseq.loading.closing._ipython_cell() is None


def test_a_ctrl_c_raised_again_during_another_close_is_raised_at_its_end():
    # The other close's deferring handler was taken for the program's own: nothing was sent, the Ctrl-C was lost.
    closing, reached = lazyseq.loading.closing, []
    with pytest.raises(KeyboardInterrupt):
        with closing.interrupts_deferred():  # another loader closing, in the main thread
            closing._interrupt_main()  # what the timer of interrupt_later does, 0.2 s after a collected close
            time.sleep(0.01)  # (a SIGINT to this thread is handled at once: here, noted by the deferral)
            reached.append("the end of the close")
    assert reached == ["the end of the close"]  # raised there, as the deferral raises what it noted


def test_a_second_ctrl_c_as_the_first_is_scheduled_again_is_merged_into_it(monkeypatch):
    # Raised as the timer's thread started (it waits for it), in a finalizer: printed as "Exception ignored".
    started = []

    def start(timer):
        signal.raise_signal(signal.SIGINT)  # the second Ctrl-C, as the thread starts
        started.append(timer)

    monkeypatch.setattr(threading.Timer, "start", start)
    try:
        lazyseq.loading.closing.interrupt_later()  # nothing raised here: the interrupt it schedules stands for both
    except KeyboardInterrupt:
        pytest.fail("the second Ctrl-C was raised where the first is scheduled again")
    assert len(started) == 1


def test_workers_started_just_as_a_ctrl_c_comes_are_published_for_close_to_close_them():
    # A Ctrl-C as the start returned, before they were published: they were left running, with nobody to close them
    from lazyseq.loading.backends import DeferredWorkers
    from lazyseq.loading.options import LoaderOptions
    from lazyseq.loading.thread_workers import ThreadWorkers

    started = []

    def start():
        started.append(ThreadWorkers(abs, LoaderOptions.check("example", 1)))
        signal.raise_signal(signal.SIGINT)
        return started[-1]

    workers = DeferredWorkers(start)
    with pytest.raises(KeyboardInterrupt):
        workers.submit_many([("task", -1)])
    assert workers.workers is started[0] and not started[0].closed
    workers.close()
    assert started[0].closed


@pytest.mark.parametrize("closed_by", ["close()", "the garbage collector"])
@pytest.mark.parametrize("method", ["thread", "process"])
def test_a_ctrl_c_as_a_close_begins_still_stops_the_workers(clean, monkeypatch, method, closed_by):
    # The engine's finalizer counts as run the moment it is called: an interrupt before its workers' close deferred
    # interrupts left them running, with nothing left to close them (run by the garbage collector too).
    real_close_in = lazyseq.loading.engine._close_in

    def interrupted_close_in(*args):
        signal.raise_signal(signal.SIGINT)
        real_close_in(*args)

    monkeypatch.setattr(lazyseq.loading.engine, "_close_in", interrupted_close_in)  # before the engine is made
    options = {"start_method": "fork"} if method == "process" else {}
    ahead = prefetch(lazyseq.smap(square, range(20)), nworkers=2, method=method, inline_below=0, **options)
    assert ahead[3] == 9
    workers = ahead._engine.workers
    try:
        with pytest.raises(KeyboardInterrupt):
            if closed_by == "close()":
                ahead.close()
            else:
                del ahead  # the last reference: the finalizer closes the loader
                threading.Event().wait(timeout=60)  # the interrupt comes here, once the close returned
        assert workers.closed and multiprocessing.active_children() == []
        for thread in lazyseq_threads():  # told to stop: the Ctrl-C hurried the wait for them, not their end
            thread.join(timeout=10)
    finally:
        workers.close()


def test_a_worker_death_read_while_another_thread_closes_the_loader_raises_nothing(clean):
    # Closed from another thread as the death was looked into: the closed process object (its exit code, its pid)
    # raised ValueError from the read, where a close meanwhile means the death is no news.
    ahead = prefetch(lazyseq.smap(square, range(50)), nworkers=2, method="process", start_method="fork", inline_below=0)
    assert ahead[1] == 1
    workers = ahead._engine.workers.workers
    counters = workers._progress

    class ClosedOnSecondRead:
        reads = 0

        def __getitem__(self, k):
            value = counters[k]
            ClosedOnSecondRead.reads += 1
            if ClosedOnSecondRead.reads == 2:  # another thread closes the loader now
                closing = threading.Thread(target=workers.close)
                closing.start()
                closing.join()
            return value

        def close(self):
            counters.close()

    workers._progress = ClosedOnSecondRead()
    victim = workers._processes[0]
    os.kill(victim.pid, signal.SIGKILL)
    victim.join(timeout=60)
    workers._died(0)  # returns: the loader is closed
    assert workers.closed and ClosedOnSecondRead.reads == 2
    ahead.close()


def test_batches_let_go_and_a_closed_loader_collected_run_no_callback_of_lazyseq():
    # A Ctrl-C whose handler runs in a callback of Python's that the garbage collector started is printed and lost:
    # each batch let go ran one of lazyseq's (its slot freed), and each worker process and pool collected one (a
    # WeakSet's). What is left is the standard library's.
    loader = lazyseq.prefetch(lazyseq.view(np.arange(64.0).reshape(16, 4)).batch(4), nworkers=2, method="process")
    batches = list(loader)
    loader.close()
    called = []
    standard_library = [threading._dangling, multiprocessing.process._dangling]  # their records of threads, processes

    ours = os.path.dirname(lazyseq.__file__)

    def note(frame, event, arg):
        code = frame.f_code
        if event != "call" or "multiprocessing" in code.co_filename:
            return
        if "site-packages" in code.co_filename and not code.co_filename.startswith(ours):
            return  # another library's (hypothesis times collections once its tests ran in this process)
        weak_set = frame.f_locals.get("selfref", lambda: None)() if code.co_name == "_remove" else None
        if any(weak_set is theirs for theirs in standard_library):
            return
        called.append(f"{code.co_filename}:{code.co_name}")

    sys.setprofile(note)
    try:
        del batches, loader
        gc.collect()
    finally:
        sys.setprofile(None)
    assert called == []
