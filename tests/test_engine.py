"""The loader engine, driven through the worker protocol by a backend written here: any backend that keeps the
protocol of lazyseq.loading.backends works, without a change to the engine."""

import os
import select

import pytest

from lazyseq.loading.backends import Done, start_workers
from lazyseq.loading.engine import Engine, _close_in
from lazyseq.loading.fork_safety import fork_generation
from lazyseq.loading.options import LoaderOptions


class ManualBackend:
    """Computes a task only when the test says so, in any order: results arrive as a remote service's would."""

    unsent = ()

    def __init__(self, job):
        self.job = job
        self.closed = False
        self.queued = {}  # task -> arg
        self.finished = []
        self.cancelled = set()
        self.log = []

    def submit_many(self, tasks):
        self.log.append(("submit", [task for task, _ in tasks]))
        self.queued.update(tasks)

    def finish(self, task):
        arg = self.queued.pop(task)
        try:
            self.finished.append(Done(task, "ok", self.job(arg)))
        except Exception as error:
            self.finished.append(Done(task, "error", error))

    def poll(self, timeout):
        if not self.finished and not self.queued:
            return []
        if not self.finished:  # nothing done yet: this backend finishes the oldest task it holds
            self.finish(next(iter(self.queued)))
        found, self.finished = self.finished, []
        return found

    def cancel(self, task):
        if task in self.queued:
            del self.queued[task]
            self.cancelled.add(task)
            self.finished.append(Done(task, "skipped", None))

    def resume(self, task):
        self.log.append(("resume", task))

    def has_room(self, count):
        return True

    def most_held(self):
        return None

    def fds(self):
        return []

    def close(self):
        self.closed = True


def engine_over(backend_holder, capacity=4):
    def launch():
        backend_holder.append(ManualBackend(lambda x: 10 * x))
        return backend_holder[0]

    return Engine(abs, LoaderOptions.check("test", 2, inline_below=0), capacity, launch=launch)


def test_results_in_order_and_in_order_of_completion_from_any_backend():
    backends = []
    engine = engine_over(backends)
    assert not engine.started and backends == []  # started with the first task only
    engine.submit([(k, k) for k in range(4)])
    backend = backends[0]
    assert engine.started and backend.log == [("submit", [0, 1, 2, 3])]
    assert engine.room() == 0
    backend.finish(2)
    backend.finish(3)
    assert engine.wait_for(2, 2) == Done(2, "ok", 20)  # waited for out of order
    assert engine.next_done(lambda: None) == Done(3, "ok", 30)  # then whatever came first
    assert engine.wait_for(0, 0) == Done(0, "ok", 0)
    assert engine.room() == 3  # 1 pending of 4: room for 3 (a refill waits until half the room is free)
    assert engine.wait_for(1, 1) == Done(1, "ok", 10)
    assert engine.room() == 4
    engine.close()
    assert backend.closed and engine.closed


def test_a_worker_left_without_a_task_gets_the_room_there_is_at_once():
    # A refill waited until half the room was free, whatever the workers had left: one of them sat idle meanwhile.
    backends = []
    engine = engine_over(backends, capacity=6)  # 2 workers
    engine.submit([(k, k) for k in range(6)])
    backend = backends[0]
    for k in range(5):
        backend.finish(k)
    assert engine.wait_for(0, 0) == Done(0, "ok", 0)
    assert engine.room() == 1  # 5 held of 6, 1 pending: a worker has nothing to do
    engine.submit([(6, 6)])
    assert engine.wait_for(1, 1) == Done(1, "ok", 10)
    assert engine.room() == 0  # 2 pending for 2 workers: a refill waits until half the room is free
    engine.close()


def test_tasks_no_longer_wanted_are_cancelled_and_resubmitted_if_wanted_again():
    backends = []
    engine = engine_over(backends)
    engine.submit([(k, k) for k in range(4)])
    backend = backends[0]
    engine.wait_for(0, 0)
    assert engine.room() == 0  # 3 of 4 on their way: not worth a message yet (capacity 4, refill 2)
    engine.submit([(4, 4)])
    engine.keep_only(wanted=[3], current=0)
    assert backend.cancelled == {1, 2, 4}
    engine.collect(0.0)
    assert engine.pending == {3} and engine.cancelled == set()
    assert engine.wait_for(1, 1) == Done(1, "ok", 10)  # skipped, then asked for: sent again
    assert backend.log[-1] == ("submit", [1])
    engine.close()


def test_a_backend_failure_closes_the_engine():
    class Dying(ManualBackend):
        def poll(self, timeout):
            self.closed = True
            raise RuntimeError("the service went away")

    engine = Engine(abs, LoaderOptions.check("test", 1, inline_below=0), 2, launch=lambda: Dying(abs))
    engine.submit([(0, 0)])
    with pytest.raises(RuntimeError, match="the service went away"):
        engine.wait_for(0, 0)
    assert engine.closed and engine.pending == set()


class Stubborn(ManualBackend):
    """Cannot cancel: every task it was given runs, as with a task a worker has already started."""

    def cancel(self, task):
        pass


def test_results_of_tasks_no_longer_wanted_are_dropped_and_a_wanted_one_is_resumed():
    backends = []
    options = LoaderOptions.check("test", 2, inline_below=0)
    engine = Engine(abs, options, 4, launch=lambda: backends.append(Stubborn(abs)) or backends[0])
    engine.submit([(k, -k) for k in range(4)])
    engine.keep_only(wanted=[], current=0)
    assert engine.cancelled == {1, 2, 3}
    assert engine.wait_for(2, -2) == Done(2, "ok", 2)  # wanted again: resumed, and waited for
    assert backends[0].log[-1] == ("resume", 2)
    assert list(backends[0].queued) == [3]  # waiting for 2, the backend finished 0 and 1 first
    backends[0].finish(3)
    engine.collect(0.0)
    assert list(engine.ready) == [0]  # 1 and 3 ran all the same, and were dropped
    assert engine.pending == set() and engine.cancelled == set() and engine.room() == 3


def test_deferred_workers_start_only_for_a_task():
    from lazyseq.loading.backends import DeferredWorkers

    started = []
    workers = DeferredWorkers(lambda: started.append(1) or ManualBackend(abs))
    workers.submit_many([])
    assert started == [] and not workers.started
    workers.close()
    workers.submit_many([(0, 0)])  # closed: nothing starts any more
    assert started == [] and workers.closed


def test_workers_closed_while_they_start_are_closed_once_started():
    # close() while the workers started (from a finalizer in the starting thread, or from another thread) found no
    # workers to close; they were set after, and ran until the program ended.
    import threading

    from lazyseq.loading.backends import DeferredWorkers

    started = []

    def start_closed_meanwhile():
        workers.close()  # what a finalizer run by a garbage collection in the starting thread does
        started.append(ManualBackend(abs))
        return started[-1]

    workers = DeferredWorkers(start_closed_meanwhile)
    workers.submit_many([(0, 0)])
    assert workers.closed and started[0].closed and started[0].log == []
    proceed, starting = threading.Event(), threading.Event()

    def start_slowly():
        starting.set()
        proceed.wait(60)
        started.append(ManualBackend(abs))
        return started[-1]

    workers = DeferredWorkers(start_slowly)
    submitter = threading.Thread(target=workers.submit_many, args=([(0, 0)],))
    submitter.start()
    starting.wait(60)
    closer = threading.Thread(target=workers.close)  # waits for the start, then closes what it started
    closer.start()
    proceed.set()
    closer.join(60)
    submitter.join(60)
    assert workers.closed and started[1].closed


def test_workers_started_as_a_ctrl_c_comes_are_closed(monkeypatch):
    # A Ctrl-C after the workers started and before they were published left them running, with nobody to close them.
    from lazyseq.loading.backends import DeferredWorkers

    started = []
    workers = DeferredWorkers(lambda: started.append(ManualBackend(abs)) or started[-1])

    def interrupted():
        raise KeyboardInterrupt  # as the signal handler would, between two steps of the publication

    monkeypatch.setattr(workers, "_closed_meanwhile", interrupted)
    with pytest.raises(KeyboardInterrupt):
        workers.submit_many([(0, 0)])
    assert started[0].closed and not workers.started


@pytest.mark.parametrize("method", ["thread", "process"])
def test_fds_become_readable_when_a_result_waits(method):
    options = LoaderOptions.check(
        "fds", 1, method, inline_below=0, start_method="fork" if method == "process" else None
    )
    workers = start_workers(abs, options, 0, 0, 0, "task", None)
    try:
        fds = workers.fds()
        assert select.select(fds, [], [], 0)[0] == []
        workers.submit_many([("a", -4)])
        found = []
        while not found:  # a worker process also says when it is ready: not every wake-up brings a result
            assert select.select(fds, [], [], 60)[0]
            found = workers.poll(0)
        assert found == [Done("a", "ok", 4)]
        assert select.select(fds, [], [], 0)[0] == []  # read: nothing waits any more
    finally:
        workers.close()


@pytest.mark.parametrize("tasks", [["a", "b", "c"], [(0, 1), (0, 2), (1, 1)], [2**70, 2**71, 2**72]])
def test_results_in_slots_come_back_for_tasks_of_any_hashable_kind(tasks):
    import numpy as np

    import lazyseq
    from lazyseq.loading.jobs import ReadItem

    items = ReadItem(lazyseq.smap(lambda i: (np.full(3, i), {"n": np.arange(i)}), range(4)))
    options = LoaderOptions.check("kinds", 1, "process", inline_below=0, start_method="fork")
    workers = start_workers(items, options, 0, 2, 4096, "task", None)
    try:
        found = []
        for task, arg in zip(tasks, (1, 2, 3)):  # one at a time: each result in one of the two slots
            workers.submit_many([(task, arg)])
            while not found:
                found = workers.poll(60)
            (done,) = found
            found = []
            full, nested = done.value
            assert (done.task, done.status, full.tolist(), nested["n"].tolist()) == (
                task,
                "ok",
                [arg] * 3,
                list(range(arg)),
            )
            assert not full.flags.owndata  # read from its slot
            del done, full, nested
    finally:
        workers.close()


def test_the_finalizer_closes_the_workers_only_in_the_process_that_started_them():
    # A collection in a child being forked may run it before the fork is counted: the process id tells.
    closed = []
    _close_in(os.getpid() + 1, fork_generation(), lambda: closed.append("other process"))
    _close_in(os.getpid(), fork_generation() + 1, lambda: closed.append("other generation"))
    _close_in(os.getpid(), fork_generation(), lambda: closed.append("here"))
    assert closed == ["here"]
