"""load_buffers: fixed-shape batches from repeated calls, through reused slots, never overwritten while held."""

import functools
import itertools
import multiprocessing
import os
import pickle
import re
import signal
import subprocess
import sys
import threading

import numpy as np
import pytest
from loader_helpers import load_buffers, prefetch, remember_worker, slow_in_worker_zero

import lazyseq

METHODS = ["thread", "process"]
START_METHODS = [m for m in ("fork", "forkserver", "spawn") if m in multiprocessing.get_all_start_methods()]


class Counter:
    """Batches that say which worker made them and in which order: ``(x, (pid, count))``."""

    def __init__(self):
        self.count = itertools.count()

    def __call__(self):
        n = next(self.count)
        return np.full((16, 3), n, dtype=np.float32), np.array([os.getpid(), n])


def pairs():
    return {"x": np.ones((4, 2)), "y": np.arange(4, dtype=np.int8), "name": "batch"}


@pytest.mark.parametrize("method", METHODS)
def test_batches_are_what_func_returns(method):
    with load_buffers(pairs, max_cached=3, nworkers=2, method=method) as batches:
        for batch in itertools.islice(batches, 20):
            assert list(batch) == ["x", "y", "name"]
            np.testing.assert_array_equal(batch["x"], np.ones((4, 2)))
            assert batch["y"].dtype == np.int8 and batch["name"] == "batch"


@pytest.mark.parametrize("start_method", START_METHODS)
def test_every_start_method_works_with_a_lambda(start_method):
    offset = 10
    func = lambda: np.arange(5) + offset  # noqa: E731
    with load_buffers(func, nworkers=2, method="process", start_method=start_method) as batches:
        assert [list(next(batches)) for _ in range(3)] == [[10, 11, 12, 13, 14]] * 3


def test_a_batch_is_not_overwritten_while_it_is_held():
    """Keep the last ``max_cached - 1`` batches, or every batch: each keeps its own values."""
    with load_buffers(Counter(), max_cached=4, nworkers=2, method="process") as batches:
        recent = []
        for batch in itertools.islice(batches, 60):
            recent = (recent + [batch])[-3:]
            for x, (_, n) in recent:
                assert (x == n).all()
        hoard = list(itertools.islice(batches, 30))  # more than the slots: the extra ones are pickled
        assert all((x == n).all() for x, (_, n) in hoard)
        assert len({(int(pid), int(n)) for _, (pid, n) in hoard}) == 30


def test_batches_from_slots_are_views_and_copy_gives_owned_arrays():
    with load_buffers(Counter(), max_cached=2, method="process") as batches:
        next(batches), next(batches)  # the batches asked for before the first one came back are pickled
        x, _ = next(batches)
        assert not x.flags.owndata
    with load_buffers(Counter(), max_cached=2, method="process", copy=True) as batches:
        x, info = next(batches)
        assert x.flags.owndata and info.flags.owndata


@pytest.mark.parametrize("method", METHODS)
def test_a_batch_of_another_shape_is_a_clear_error(method):
    sizes = iter([4, 4, 3, 4])

    def func():
        return np.zeros((next(sizes, 4), 2)), np.zeros(2, dtype=np.int64)

    with load_buffers(func, max_cached=2, nworkers=1, method=method, start_method=None) as batches:
        next(batches), next(batches)
        with pytest.raises(ValueError) as info:
            next(batches)
    assert str(info.value) == (
        "load_buffers: batch 2 is (float64 (3, 2), int64 (2,)), but the first batch was "
        "(float64 (4, 2), int64 (2,)); func must return batches of fixed shapes and dtypes"
    )


class KeysInTurns:
    """Dict batches alike but for the order of their keys, which alternates."""

    def __init__(self):
        self.count = itertools.count()

    def __call__(self):
        if next(self.count) % 2:
            return {"a": np.zeros(2), "b": np.ones(1)}
        return {"b": np.ones(1), "a": np.zeros(2)}


@pytest.mark.parametrize("method", METHODS)
def test_dict_batches_with_their_keys_in_another_order_are_alike(method):
    with load_buffers(KeysInTurns(), max_cached=2, nworkers=1, method=method) as batches:
        got = [next(batches) for _ in range(4)]
    assert all(sorted(batch) == ["a", "b"] and batch["a"].tolist() == [0.0, 0.0] for batch in got)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("max_cached", [1, 2, 3])
def test_max_cached_counts_the_batch_being_read(method, max_cached):
    with load_buffers(Counter(), max_cached=max_cached, nworkers=1, method=method, inline_below=0) as batches:
        for _ in range(5):
            held = next(batches)
            engine = batches._engine  # what is computed or on its way besides the batch held
            assert len(engine.ready) + len(engine.pending) <= max_cached - 1
        del held
    with pytest.raises(TypeError, match="^a load_buffers iterator cannot be pickled: it runs workers of its own"):
        pickle.dumps(batches)


@pytest.mark.parametrize("method", METHODS)
def test_an_exception_in_func_is_raised_for_that_batch_and_iteration_goes_on(method):
    calls = itertools.count()

    def func():
        if next(calls) == 1:
            raise ValueError("no data")
        return np.zeros(3)

    start_method = "fork" if method == "process" else None
    with load_buffers(func, max_cached=2, nworkers=1, method=method, start_method=start_method) as batches:
        outcomes = []
        for _ in range(4):
            try:
                outcomes.append(next(batches).shape)
            except lazyseq.EvaluationError as error:
                outcomes.append(str(error))
                assert type(error.__cause__) is ValueError
    # Batches come in the order they are done: with threads, the reader computes cheap ones too, so which read gets
    # the failed one depends on timing (and so does its number, counted as batches are given out).
    failures = [outcome for outcome in outcomes if isinstance(outcome, str)]
    assert len(failures) == 1 and re.fullmatch(
        r"failed to compute load_buffers batch \d+: ValueError: no data", failures[0]
    )
    assert [outcome for outcome in outcomes if outcome != failures[0]] == [(3,)] * 3


def test_closing_ends_iteration_and_stops_the_workers():
    batches = load_buffers(Counter(), nworkers=2, method="process")
    next(batches)
    batches.close()
    batches.close()
    assert list(batches) == [] and multiprocessing.active_children() == []
    assert repr(batches) == "load_buffers(Counter, max_cached=3)  [closed]"  # by default, nworkers + 1


def test_by_default_every_worker_has_a_batch_to_make_while_one_is_read():
    # max_cached was 2 whatever nworkers: while one batch was read, the second worker had nothing to make.
    calls = itertools.count()
    all_three = threading.Barrier(3, timeout=10)  # the reader, holding the first batch, and both workers

    def made_together():
        if next(calls) in (1, 2):  # the two batches after the first
            all_three.wait()
        return np.zeros(2)

    with load_buffers(made_together, nworkers=2, inline_below=0) as batches:
        first = next(batches)
        all_three.wait()  # BrokenBarrierError if only one worker got a batch to make
        assert [next(batches).tolist() for _ in range(3)] == [[0.0, 0.0]] * 3 and first.shape == (2,)


def _generated_batches():
    yield np.zeros(4)


def test_a_generator_is_refused_with_the_way_to_load_what_it_yields():
    # A generator function was taken: its workers handed out generator objects, for ever.
    for given, what in ((_generated_batches, "generator function"), (_generated_batches(), "generator")):
        with pytest.raises(TypeError) as refused:
            load_buffers(given)
        assert str(refused.value) == (
            f"load_buffers: func must be a function that returns a batch each call, got a {what}; for the batches "
            "a generator yields, lazyseq.prefetch(lazyseq.uniter(batches())) computes them in the background"
        )


@pytest.mark.parametrize("method", METHODS)
def test_a_function_that_returns_none_is_told_what_a_batch_is(method):
    with load_buffers(lambda: None, nworkers=1, method=method) as batches:
        with pytest.raises(TypeError) as refused:
            next(batches)
    assert str(refused.value) == (
        "load_buffers: func returned None for batch 0; it must return a batch: an array, or a tuple, list, "
        "namedtuple or dict of arrays (a return statement missing?)"
    )


def test_bad_arguments():
    with pytest.raises(TypeError, match="load_buffers: func must be callable, got list"):
        load_buffers([1])
    with pytest.raises(ValueError, match="load_buffers: max_cached must be a positive integer, got 0"):
        load_buffers(pairs, max_cached=0)
    with pytest.raises(ValueError, match="load_buffers: nworkers must be at least 1"):
        load_buffers(pairs, nworkers=0)
    with pytest.raises(TypeError, match="^load_buffers: copy must be True or False, got 'yes'$"):
        load_buffers(pairs, copy="yes")


def test_the_shared_pool_is_checked_against_free_memory(monkeypatch):
    from lazyseq.loading import shared_slots

    monkeypatch.setattr(shared_slots, "available_shared_memory", lambda: 10_000)
    with load_buffers(lambda: np.zeros(100_000), max_cached=3, method="process", start_method="fork") as b:
        with pytest.raises(
            MemoryError,
            match=r"load_buffers: the shared-memory pool needs 2\.6 MiB \(3 slots of 0\.86 MiB\) but only 0\.0 MiB",
        ):
            next(b)
    assert multiprocessing.active_children() == []


def test_blas_threads_in_worker_processes_are_set_and_overridable():
    pytest.importorskip("threadpoolctl")
    from loader_helpers import blas_threads

    with load_buffers(lambda: blas_threads(0), nworkers=1, method="process", blas_threads=1) as batches:
        next(batches)  # the first product started the BLAS threads: the limit is set after it
        assert next(batches) in ([], [1])
    with prefetch(lazyseq.smap(blas_threads, range(3)), nworkers=1, method="process", blas_threads=2) as p:
        assert p[2] in ([], [2])


def test_a_worker_asks_whether_blas_threads_started_after_its_first_tasks_then_now_and_then(monkeypatch):
    from lazyseq.loading import blas_limits

    for name in blas_limits.VARIABLES:  # a worker sets them for the libraries it loads later
        monkeypatch.setenv(name, "4")
    asked, tasks_done = [], [0]
    monkeypatch.setattr(blas_limits, "_native_threads_started", lambda: asked.append(tasks_done[0]) or False)
    limit = blas_limits.WorkerLimit(1, inherited=False)
    for _ in range(100):
        tasks_done[0] += 1
        limit.after_task()
    assert asked == [0, 1, 2, 3, 4, 5, 6, 7, 8, 32, 64, 96]
    assert limit.pending


def test_worker_processes_of_a_pipeline_without_linear_algebra_start_no_blas_threads():
    from loader_helpers import thread_count

    with prefetch(lazyseq.smap(thread_count, range(20)), nworkers=2, method="process") as ahead:
        assert set(ahead) == {3}  # the worker's own thread, the one that watches its parent, the late sender


def test_forked_workers_of_a_consumer_that_uses_torch_seed_it_without_a_thread_of_their_own():
    pytest.importorskip("torch")  # imported: a forked worker seeds torch's generator, in the parent-watching thread
    from loader_helpers import thread_count

    counts = set()
    for _ in range(8):  # a thread started to seed, ended but not yet gone, showed in some first tasks only
        with prefetch(
            lazyseq.smap(thread_count, range(20)), nworkers=2, method="process", start_method="fork"
        ) as ahead:
            counts.update(ahead)
    assert counts == {3}  # its own, the parent watch (which seeded torch) and the late sender


def test_a_tensor_made_from_a_batch_keeps_its_slot():
    torch = pytest.importorskip("torch")
    with load_buffers(Counter(), max_cached=2, nworkers=1, method="process") as batches:
        next(batches), next(batches)  # past the pickled ones: these come from slots
        x, (_, n) = next(batches)
        assert not x.flags.owndata
        tensor, n = torch.from_numpy(x), int(n)
        del x
        for _ in range(20):
            next(batches)
        assert bool((tensor == n).all())


def test_a_slow_worker_process_makes_fewer_batches():
    make = functools.partial(slow_in_worker_zero, None)
    with load_buffers(make, max_cached=4, nworkers=2, method="process", start_hook=remember_worker) as batches:
        workers = [int(next(batches)) for _ in range(60)]
    # Batches come in the order they complete, and the next task goes to whichever worker answers first:
    # worker 0 (50 ms a batch) makes a few while worker 1 (1 ms) makes the rest.
    assert workers.count(0) <= 6 and workers.count(1) >= 54


def first_batch_in_a_fork(batches, results):
    results.put(int(next(batches)[0]))
    batches.close()


def test_a_load_buffers_iterator_used_in_a_forked_child_starts_workers_there():
    ctx = multiprocessing.get_context("fork")
    with load_buffers(lambda: np.full(2, os.getpid()), nworkers=1, method="process") as batches:
        parent_worker = int(next(batches)[0])
        results = ctx.SimpleQueue()
        child = ctx.Process(target=first_batch_in_a_fork, args=(batches, results))
        child.start()
        child_worker = results.get()
        child.join()
        assert child.exitcode == 0 and child_worker not in (parent_worker, os.getpid(), child.pid)
        assert int(next(batches)[0]) == parent_worker  # the parent's workers were left alone


def numbered_batches():
    count = itertools.count()
    return lambda: np.full(100_000, float(next(count)))


def test_a_batch_a_forked_child_inherits_is_copied_before_the_parent_reads_on():
    # The parent could let go of the batch and reuse its slot before the child had copied it: the child then saw
    # another batch in it (in 6 of 10 forks).
    changed = 0
    with load_buffers(numbered_batches(), nworkers=2, method="process", max_cached=3) as batches:
        for _ in range(10):
            batch = next(batches)
            expected = float(batch[0])
            pid = os.fork()
            if pid == 0:
                os._exit(0 if (batch == expected).all() else 1)
            del batch
            for _ in range(20):
                next(batches)
            changed += os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) != 0
    assert changed == 0


def test_a_fork_while_batches_are_held_in_a_process_with_many_files_waits_for_its_child(monkeypatch):
    # Past descriptor 1023 select() refused the wait: it was skipped (the child's batch could change), and the
    # child, telling a parent that no longer listened, was ended by SIGPIPE where the program let it.
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 2048:
        pytest.skip("needs 2048 open files")
    unraisable = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 2048), hard))
    spare = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        with load_buffers(numbered_batches(), nworkers=1, method="process", max_cached=3) as batches:
            for _ in range(3):  # the first batches come pickled: they size the slots
                next(batches)
            batch = next(batches)
            expected = float(batch[0])
            previous = signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # as command-line programs often do
            try:
                pid = os.fork()
            finally:
                if pid:
                    signal.signal(signal.SIGPIPE, previous)
            if pid == 0:
                os._exit(0 if (batch == expected).all() else 1)
            del batch
            for _ in range(10):
                next(batches)
            assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
    finally:
        for fd in spare:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert unraisable == []


def test_a_pool_that_cannot_be_made_closes_the_iterator(monkeypatch):
    # The result that asked for the pool was lost, and the next read waited for it forever.
    from lazyseq.loading import shared_slots

    monkeypatch.setattr(shared_slots, "available_shared_memory", lambda: 1000)
    batches = load_buffers(lambda: np.ones(1024), nworkers=1, method="process", max_cached=2)
    with pytest.raises(lazyseq.LoaderError, match=r"^load_buffers: the shared-memory pool needs "):
        next(batches)
    with pytest.raises(StopIteration):
        next(batches)
    assert multiprocessing.active_children() == []


FORK_INTERRUPTED = """
import itertools, os, sys, time, warnings
import numpy as np, lazyseq
from lazyseq.loading import shared_slots

# Python 3.12 on warns of a fork in a process with threads, counted (3.13) once the fork hooks have run: here the
# timer that raises the Ctrl-C again. The fork is what is tested.
warnings.filterwarnings("ignore", r"This process \\(pid=\\d+\\) is multi-threaded, use of fork", DeprecationWarning)

class InterruptedPoll:  # a Ctrl-C while the parent waits for the child's copies
    def register(self, *_):
        pass
    def poll(self, _):
        raise KeyboardInterrupt

unraisable = []
sys.unraisablehook = unraisable.append
count = itertools.count()
with lazyseq.load_buffers(lambda: np.full(100_000, float(next(count))), nworkers=1, method="process") as batches:
    for _ in range(3):  # the first batches come pickled: they size the slots
        next(batches)
    held = next(batches)
    assert shared_slots._pools and any(pool.has_leases() for pool in shared_slots._pools)
    shared_slots.select.poll = InterruptedPoll
    try:
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        for _ in range(1000):  # raised within INTERRUPT_AGAIN_SECONDS
            time.sleep(0.005)
        print("not interrupted")
    except KeyboardInterrupt:
        print("interrupted", os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), float(held[0]), unraisable)
"""


def test_a_ctrl_c_while_fork_waits_for_the_child_is_raised_once_fork_returns():
    # Raised in the fork hook's wait, it was printed ("Exception ignored") and dropped: the cell ran on. (In a
    # program of its own: a library that runs Python code in its own fork hooks after these would be where the
    # interrupt comes back, and drop it again.)
    run = subprocess.run([sys.executable, "-c", FORK_INTERRUPTED], capture_output=True, text=True, timeout=120)
    assert (run.stdout, run.stderr) == ("interrupted 0 3.0 []\n", "")
