"""Failures in workers: every one reaches the consumer, named, and nothing hangs."""

import contextlib
import ctypes
import functools
import multiprocessing
import os
import re
import select
import signal
import subprocess
import sys
import textwrap
import threading
import time

import loader_helpers
import numpy as np
import pytest
from loader_helpers import (
    ENDED_ITSELF,
    Unpicklable,
    alive,
    die_on,
    fail_on_seven,
    prefetch,
    raise_unpicklable,
    read_another_view,
    return_unpicklable,
    return_unpicklable_beside_an_array,
)

import lazyseq
from lazyseq.loading.engine import Engine
from lazyseq.loading.failures import LoaderClosed

METHODS = ["thread", "process"]


@pytest.mark.parametrize("method", METHODS)
def test_an_exception_in_a_worker_names_the_item_and_the_chain(method):
    pipeline = lazyseq.batch(lazyseq.smap(fail_on_seven, range(20)), 4)
    with prefetch(pipeline, nworkers=2, method=method) as ahead:
        with pytest.raises(lazyseq.EvaluationError) as info:
            ahead[1]
        assert str(info.value) == (
            "failed to compute prefetch[1] -> batch[1] -> smap(fail_on_seven)[7]: ValueError: bad value 7"
        )
        cause = info.value.__cause__
        assert type(cause) is ValueError and str(cause) == "bad value 7"
        if method == "process":  # the worker's traceback comes along as a note
            assert "in fail_on_seven" in cause.__notes__[0] and "raised in worker process" in cause.__notes__[0]
        # the loader stays usable, for the other items and for iteration past the failure
        assert list(ahead[2]) == [8, 9, 10, 11]
        items = iter(ahead)
        assert list(next(items)) == [0, 1, 2, 3]
        with pytest.raises(lazyseq.EvaluationError, match=r"prefetch\[1\]"):
            next(items)
        assert [list(b) for b in items] == [[8, 9, 10, 11], [12, 13, 14, 15], [16, 17, 18, 19]]


@pytest.mark.parametrize("method", METHODS)
def test_passthrough_raises_the_original_exception_with_the_chain_as_a_note(method):
    previous = lazyseq.seterr("passthrough")
    try:
        with prefetch(lazyseq.smap(fail_on_seven, range(10)), nworkers=1, method=method) as ahead:
            with pytest.raises(ValueError, match="bad value 7") as info:
                ahead[7]
        assert "while computing prefetch[7] -> smap(fail_on_seven)[7]" in info.value.__notes__
    finally:
        lazyseq.seterr(previous)


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_worker_processes_follow_the_consumers_seterr(start_method):
    # a spawned worker started with the default: a read inside the pipeline raised EvaluationError, not KeyError
    previous = lazyseq.seterr("passthrough")
    try:
        reads = lazyseq.smap(read_another_view, range(5))
        with prefetch(reads, nworkers=1, method="process", start_method=start_method) as ahead:
            with pytest.raises(KeyError):
                ahead[2]
    finally:
        lazyseq.seterr(previous)


def test_an_exception_that_cannot_be_pickled_arrives_with_its_name_message_and_traceback():
    with prefetch(lazyseq.smap(raise_unpicklable, range(3)), nworkers=1, method="process") as ahead:
        with pytest.raises(lazyseq.EvaluationError) as info:
            ahead[2]
    assert str(info.value) == (
        "failed to compute prefetch[2] -> smap(raise_unpicklable)[2]: RemoteError: Unpicklable: code 3: item 2"
    )
    cause = info.value.__cause__
    assert type(cause) is lazyseq.RemoteError and cause.type_name == "Unpicklable"
    assert 'raise Unpicklable(3, f"item {x}")' in cause.__notes__[0]
    with prefetch(lazyseq.smap(raise_unpicklable, range(3)), nworkers=1) as ahead:
        with pytest.raises(lazyseq.EvaluationError) as info:
            ahead[0]
    assert type(info.value.__cause__) is Unpicklable  # threads hand over the exception itself


@pytest.mark.parametrize("mode", ["wrap", "passthrough"])
def test_except_evaluation_error_catches_an_exception_that_cannot_be_pickled(mode):
    """With either seterr mode, ``except EvaluationError`` catches every failure of an item, RemoteError too."""
    previous = lazyseq.seterr(mode)
    try:
        with prefetch(lazyseq.smap(raise_unpicklable, range(3)), nworkers=1, method="process") as ahead:
            try:
                ahead[1]
            except lazyseq.EvaluationError as error:
                caught = error
        with lazyseq.load_buffers(lambda: raise_unpicklable(5), nworkers=1, method="process") as batches:
            try:
                next(batches)
            except lazyseq.EvaluationError as error:
                caught_batch = error
    finally:
        lazyseq.seterr(previous)
    if mode == "passthrough":
        assert type(caught) is type(caught_batch) is lazyseq.RemoteError
        assert str(caught) == "Unpicklable: code 3: item 1"
        assert "while computing prefetch[1] -> smap(raise_unpicklable)[1]" in caught.__notes__
    else:
        assert type(caught) is type(caught_batch) is lazyseq.EvaluationError
        assert type(caught.__cause__) is type(caught_batch.__cause__) is lazyseq.RemoteError
        assert str(caught_batch) == "failed to compute load_buffers batch 0: RemoteError: Unpicklable: code 3: item 5"
    assert not issubclass(lazyseq.WorkerDied, lazyseq.EvaluationError)  # a loader failure, not an item's


def test_a_result_that_cannot_be_pickled_is_an_error_for_that_item_only():
    source = lazyseq.smap(return_unpicklable, range(3))
    with prefetch(source, nworkers=1, method="process", start_method="fork") as ahead:
        with pytest.raises(lazyseq.EvaluationError, match=r"prefetch\[1\]: TypeError: the result cannot be sent"):
            ahead[1]


def test_a_result_with_arrays_and_a_part_that_cannot_be_pickled_is_an_error_for_that_item_only():
    source = lazyseq.smap(return_unpicklable_beside_an_array, range(12))
    with prefetch(source, nworkers=2, method="process", start_method="fork") as ahead:
        values = []
        for i in range(12):
            try:
                values.append(int(ahead[i][0][0]))
            except lazyseq.EvaluationError as error:
                values.append(str(error).split(": ")[:3])
        assert ahead.workers_running  # no worker died of it
    failure = ["failed to compute prefetch[7]", "TypeError", "the result cannot be sent from the worker process"]
    assert values == [0, 1, 2, 3, 4, 5, 6, failure, 8, 9, 10, 11]


def test_a_pipeline_that_cannot_be_pickled_is_reported_before_workers_start_naming_the_part():
    lock = threading.Lock()
    pipeline = lazyseq.smap(lambda x: x if lock else None, range(4)).batch(2)
    with pytest.raises(
        TypeError, match=r"prefetch: cannot send the smap\(.*<lambda>\) view to worker processes"
    ) as caught:
        prefetch(pipeline, nworkers=2, method="process", start_method="spawn")
    assert caught.value.__cause__.__context__ is None  # the traceback shows the pickling error once, not twice
    assert multiprocessing.active_children() == []
    with prefetch(pipeline, nworkers=2, method="process", start_method="fork") as ahead:
        assert list(ahead[1]) == [2, 3]  # forked workers inherit the pipeline: nothing is pickled


def test_a_start_hook_that_cannot_be_pickled_is_reported_by_name():
    lock = threading.Lock()
    pipeline = lazyseq.view(np.arange(4)).batch(2)
    for loader in (
        lambda hook: prefetch(pipeline, nworkers=2, method="process", start_method="spawn", start_hook=hook),
        lambda hook: lazyseq.load_buffers(
            lambda: None, nworkers=2, method="process", start_method="spawn", start_hook=hook
        ),
    ):
        with pytest.raises(TypeError, match=r"cannot send start_hook to worker processes: TypeError: cannot pickle"):
            loader(lambda worker: lock)
    assert multiprocessing.active_children() == []


def test_a_process_loader_inside_a_worker_process_says_what_to_do_instead():
    def inner_sum(method):
        def read(i):
            with prefetch(lazyseq.smap(lambda x: 2 * x, range(i + 3)), nworkers=2, method=method) as inner:
                return sum(inner)

        return read

    with prefetch(lazyseq.smap(inner_sum("process"), range(4)), nworkers=2, method="process") as outer:
        with pytest.raises(lazyseq.LoaderError) as caught:
            outer[0]
    assert str(caught.value) == (  # was multiprocessing's "daemonic processes are not allowed to have children"
        "prefetch: cannot start worker processes here: this is a worker process of another loader, and "
        "multiprocessing lets such processes have no children; give this loader method='thread' (or nworkers=0), "
        "or the other one method='thread'"
    )
    with prefetch(lazyseq.smap(inner_sum("thread"), range(4)), nworkers=2, method="process") as outer:
        assert list(outer) == [6, 12, 20, 30]
    assert multiprocessing.active_children() == []


@pytest.mark.parametrize(
    "how, code", [("sigkill", "signal SIGKILL"), ("exit", "exit code 3"), ("segfault", "signal SIGSEGV")]
)
def test_a_worker_that_dies_is_reported_with_its_pid_and_exit_code(how, code):
    ahead = prefetch(lazyseq.smap(die_on(5, how), range(20)), nworkers=2, method="process", start_method="fork")
    with pytest.raises(lazyseq.WorkerDied) as info:
        list(ahead)
    message, crash = str(info.value).partition("; as it crashed, its Python reported:\n")[::2]
    ended_itself = ENDED_ITSELF if how == "exit" else ""  # (its reason, if it printed one, is in our stderr)
    assert message.startswith("prefetch: worker process ") and message.endswith(
        f"died with {code} while computing item 5{ended_itself}"
    )
    if how == "segfault":  # what Python printed as it crashed: the fatal error, and the stack down to the item's code
        ctypes_file, helpers_file = ctypes.__file__, os.path.abspath(loader_helpers.__file__)
        assert re.fullmatch(
            "Fatal Python error: Segmentation fault\n\n.*\n"
            f'  File "{re.escape(ctypes_file)}", line \\d+ in string_at\n'
            f'  File "{re.escape(helpers_file)}", line \\d+ in item\n'
            f'  File "{re.escape(os.path.dirname(lazyseq.__file__))}/views/mapping.py", line \\d+ in _get',
            crash,
        )
    else:  # nothing was said
        assert crash == ""
    assert 5 in info.value.tasks and info.value.suspects == (5,)  # held; what it was computing, as the engine names it
    assert "(pid " in message
    ahead.close()  # new workers went on with the next items if item 5 was computed ahead of the reader
    assert not ahead.workers_running and multiprocessing.active_children() == []


def record_computed(folder):
    def compute(i):
        if i == 7:
            os._exit(3)
        (folder / str(i)).touch()  # computed: its result may still be waiting in the worker to be sent
        return i

    return compute


def read_through_deaths(ahead, most):
    """The items of ``ahead`` read on through up to ``most`` WorkerDied; those as (items read before, cause, tasks,
    suspects)."""
    reading, got, deaths = iter(ahead), [], []
    while len(deaths) < most:
        try:
            got.append(next(reading))
        except StopIteration:
            break
        except lazyseq.WorkerDied as died:
            deaths.append((len(got), str(died).split(" died with ")[1], died.tasks, died.suspects))
    return got, deaths


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_reading_on_after_a_worker_died_loses_only_the_item_that_ended_it(tmp_path, start_method):
    # The read item was skipped if the dead worker merely held it: computed fine, it was never delivered.
    source = lazyseq.smap(record_computed(tmp_path), range(20))
    with prefetch(source, nworkers=2, method="process", start_method=start_method) as ahead:
        got, deaths = read_through_deaths(ahead, most=5)
    assert got == [i for i in range(20) if i != 7]
    assert deaths and {(cause, suspects) for _, cause, _, suspects in deaths} == {
        ("exit code 3 while computing item 7" + ENDED_ITSELF, (7,))
    }
    assert multiprocessing.active_children() == []


def test_a_worker_that_died_ahead_of_the_reader_is_reported_once_at_the_item_it_was_computing(monkeypatch):
    # Reported at the read of item 3, and again at each restart as item 9 was computed ahead again (under spawn, a
    # real process loader reported five deaths and read no item after 6). The death comes as the process
    # backend reports it while the reader waits for item 3: the workers closed, item 9 named.
    computed = []
    source = lazyseq.smap(lambda i: computed.append(i) or i, range(20))
    wait_for = Engine.wait_for

    def died_computing_9(engine, task, arg, refill=None):
        if task == 3 and not died_computing_9.done:
            died_computing_9.done = True
            engine.workers.close()
            raise lazyseq.WorkerDied(
                "prefetch: worker process 1 (pid 7) died with exit code 3 while computing item 9", (5, 9), (9,)
            )
        return wait_for(engine, task, arg, refill)

    died_computing_9.done = False
    monkeypatch.setattr(Engine, "wait_for", died_computing_9)
    with prefetch(source, nworkers=2, inline_below=0, max_buffered=16) as ahead:
        got, deaths = read_through_deaths(ahead, most=3)
    assert got == [i for i in range(20) if i != 9]
    assert deaths == [(9, "exit code 3 while computing item 9", (5, 9), (9,))]
    assert computed.count(9) <= 1 and sorted(set(computed)) == list(range(20))  # 9: before the death, if at all


def five_read_then_one_failing(monkeypatch, error):
    """A prefetch of range(10) and its iterator, items 0 to 4 read, then a read of item 5 that raised ``error``."""
    ahead = prefetch(range(10), nworkers=2)
    reads = iter(ahead)
    assert [next(reads) for _ in range(5)] == [0, 1, 2, 3, 4]
    get = ahead._get

    def fails_once(i):
        monkeypatch.setattr(ahead, "_get", get)
        raise error

    monkeypatch.setattr(ahead, "_get", fails_once)
    ahead._run = None  # item 5 is read through _get, not taken from the items the reader computed with item 4
    with pytest.raises(type(error)):
        next(reads)
    return ahead, reads


@pytest.mark.parametrize(
    "held, suspects, position",
    [((7, 8), None, 5), ((5, 8), None, 6), ((5, 8), (), 5)],
    ids=["another's items", "its item", "between two tasks"],
)
def test_after_a_worker_died_iteration_goes_on_at_the_item_read_unless_the_dead_worker_held_it(
    monkeypatch, held, suspects, position
):
    # The item read had been computed by the other worker, and was dropped as the workers stopped: it was skipped.
    # A worker killed between two tasks (no suspects) is to blame for none of those it held: none is skipped.
    died = lazyseq.WorkerDied("worker process 0 died", tasks=held, suspects=suspects)
    ahead, reads = five_read_then_one_failing(monkeypatch, died)
    assert reads.state_dict()["position"] == position
    assert list(reads) == list(range(position, 10))
    ahead.close()


@pytest.mark.parametrize(
    "error, position",
    [
        (KeyboardInterrupt(), 5),
        (LoaderClosed("prefetch: the loader was closed while a result was awaited"), 5),
        (lazyseq.LoaderError("connect: item 5 failed on the server"), 6),  # the item's own failure, from below
        (SystemExit(2), 6),  # raised by the item's code (argparse, say): its failure
    ],
    ids=["interrupt", "closed", "item's loader error", "item's SystemExit"],
)
def test_an_item_awaited_when_the_loader_was_interrupted_or_closed_is_read_next(monkeypatch, error, position):
    # Its position was counted as read: a run resumed after Ctrl-C in a notebook went on without it.
    ahead, reads = five_read_then_one_failing(monkeypatch, error)
    assert reads.state_dict()["position"] == position
    assert list(reads) == list(range(position, 10))
    ahead.close()


def test_a_failing_start_hook_is_a_loader_error():
    def hook(index):
        raise OSError("no GPU here")

    for method in METHODS:
        ahead = prefetch(range(5), nworkers=2, method=method, start_hook=hook)
        with pytest.raises(lazyseq.LoaderError) as info:
            ahead[0]
        kind = "thread" if method == "thread" else "process"
        assert re.fullmatch(
            rf"prefetch: start_hook failed in worker {kind} [01]: OSError: no GPU here", str(info.value)
        )
        assert isinstance(info.value.__cause__, OSError)
        assert not ahead.workers_running


@pytest.mark.parametrize("method", METHODS)
def test_keyboard_interrupt_stops_the_loader_at_once(method):
    """The consumer is interrupted while it waits (a notebook's stop button): workers stop, the view restarts later."""

    def interrupt(x):
        if x == 3:
            os.kill(os.getppid() if method == "process" else os.getpid(), signal.SIGINT)
            time.sleep(1)  # the consumer does not wait for this item
        return x

    # Python's own Ctrl-C handler, even where the tests run in the background (a shell starts those with SIGINT
    # ignored, and Python then leaves it so)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        ahead = prefetch(lazyseq.smap(interrupt, range(6)), nworkers=1, method=method, start_method=None)
        with pytest.raises(KeyboardInterrupt):
            ahead[3]  # the first item asked for: the reader is waiting for it when the interrupt comes
        assert not ahead.workers_running
        assert multiprocessing.active_children() == []
    finally:
        signal.signal(signal.SIGINT, previous)


def interrupted_at(k):
    """A function whose ``k``-th call raises KeyboardInterrupt (as a Ctrl-C caught there would), the others 2 ms."""
    calls = iter(range(10**9))

    def call(*_):
        if next(calls) == k:
            raise KeyboardInterrupt
        time.sleep(0.002)
        return np.zeros(2)

    return call


def test_a_keyboard_interrupt_in_a_worker_thread_stops_the_loader():
    # It came back as an item's failure (EvaluationError: "KeyboardInterrupt: "), the iteration went on, and with
    # prefetch the worker threads stayed up.
    batches = lazyseq.load_buffers(interrupted_at(3), nworkers=1, inline_below=0)
    got = []
    for _ in range(6):
        try:
            next(batches)
            got.append("batch")
        except BaseException as error:  # noqa: BLE001  # what the loop sees, whatever it is
            got.append(type(error).__name__)
    assert got[-1] == "StopIteration" and got.count("KeyboardInterrupt") == 1
    assert got[: got.index("KeyboardInterrupt")] == ["batch"] * got.index("KeyboardInterrupt")
    ahead = lazyseq.prefetch(lazyseq.smap(interrupted_at(3), range(10)), nworkers=1, inline_below=0)
    with pytest.raises(KeyboardInterrupt):
        list(ahead)
    assert not ahead.workers_running
    assert [t.name for t in threading.enumerate() if t.name.startswith("lazyseq")] == []


def gives_up_on_five_and_six(x, error):
    time.sleep(0.002)  # worth the workers, with the default settings too
    if x in (5, 6):
        raise error(f"item {x} gave up")
    return x


@pytest.mark.parametrize("settings", [{"inline_below": 0}, {}])
@pytest.mark.parametrize("error", [KeyboardInterrupt, SystemExit])
@pytest.mark.parametrize("method", METHODS)
def test_an_interrupt_raised_by_an_item_is_raised_at_its_read_and_the_iteration_goes_on(method, error, settings):
    # Threads raised it at whatever read came next (item 0's, before item 0 was delivered), and an iteration that
    # went on after it read that item again, for ever; a worker process died of it (WorkerDied, a traceback on
    # stderr), where threads, Ray and synchronous reading raise the item's own exception. With the default
    # settings, the workers started again computed their first item in the reader (to time it), where an
    # interrupt cannot be told from a Ctrl-C: item 6 was read again, for ever.
    pipeline = lazyseq.smap(functools.partial(gives_up_on_five_and_six, error=error), range(10))
    with prefetch(pipeline, nworkers=2, method=method, **settings) as ahead:
        reads, got = iter(ahead), []
        for _ in range(12):
            try:
                got.append(next(reads))
            except error as raised:
                assert not ahead.workers_running  # stopped, as by a Ctrl-C; the next read starts them again
                got.append(str(raised))
            except StopIteration:
                break
    assert got == [0, 1, 2, 3, 4, "item 5 gave up", "item 6 gave up", 7, 8, 9]
    assert multiprocessing.active_children() == []


def exits_on_eight(x):
    if x == 8:
        raise SystemExit("item 8's own")
    return x


def test_a_system_exit_of_a_cheap_item_is_raised_at_its_own_read_and_no_item_is_lost():
    # The reader computes cheap items a run at a time: the SystemExit of item 8 came out of the reads that started
    # the runs holding it (3 and 6), whose items were lost.
    with prefetch(lazyseq.smap(exits_on_eight, range(20)), nworkers=2) as ahead:
        reads, got = iter(ahead), []
        for _ in range(25):
            try:
                got.append(next(reads))
            except SystemExit as raised:
                got.append(str(raised))
            except StopIteration:
                break
    assert got == [*range(8), "item 8's own", *range(9, 20)]


@pytest.mark.parametrize("error", [KeyboardInterrupt, SystemExit])
def test_an_interrupt_raised_in_a_worker_process_ends_the_batches_as_a_ctrl_c(error):
    calls = iter(range(10**9))

    def batch():
        if next(calls) == 3:
            raise error("batch gave up")
        return np.zeros(2)

    got = []
    with lazyseq.load_buffers(batch, nworkers=1, method="process", start_method="fork") as batches:
        for _ in range(8):
            try:
                next(batches)
                got.append("batch")
            except error:
                got.append("raised")
            except StopIteration:
                break
    assert got == ["batch"] * 3 + ["raised"]
    assert multiprocessing.active_children() == []


def test_a_worker_thread_that_cannot_start_leaves_no_thread(monkeypatch):
    start = threading.Thread.start

    def past_the_limit(thread):
        if thread.name == "lazyseq-prefetch-2":
            raise RuntimeError("can't start new thread")
        start(thread)

    monkeypatch.setattr(threading.Thread, "start", past_the_limit)
    ahead = lazyseq.prefetch(lazyseq.smap(lambda i: np.full(2, i), range(20)), nworkers=4, inline_below=0)
    with pytest.raises(lazyseq.LoaderError) as caught:  # was item 0's failure, two threads left running
        ahead[0]
    assert str(caught.value) == "prefetch: could not start worker thread 3 of 4 (nworkers): can't start new thread"
    assert [t.name for t in threading.enumerate() if t.name.startswith("lazyseq")] == []
    monkeypatch.undo()
    assert ahead[5].tolist() == [5, 5]
    ahead.close()


ORPHAN_SCRIPT = textwrap.dedent(
    """
    import sys, time
    import lazyseq

    def slow(x):
        time.sleep(0.05)
        return x

    if __name__ == "__main__":
        ahead = lazyseq.prefetch(lazyseq.smap(slow, range(10**6)), nworkers=2, method="process",
                                 start_method=sys.argv[1], inline_below=0)
        ahead[0]
        print(*ahead._engine.workers.workers.pids, flush=True)
        time.sleep(600)
    """
)


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_workers_exit_when_the_parent_is_killed(start_method, tmp_path):
    script = tmp_path / "parent.py"
    script.write_text(ORPHAN_SCRIPT)
    parent = subprocess.Popen([sys.executable, str(script), start_method], stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(p) for p in parent.stdout.readline().split()]
        assert len(pids) == 2
    finally:
        parent.kill()
        parent.wait()
        parent.stdout.close()
    deadline = time.monotonic() + 10
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)  # polling an outside condition, with a deadline
    assert not any(alive(pid) for pid in pids)


class UnprintableError(Exception):
    def __str__(self):
        raise RuntimeError("str broken")


def raise_unprintable(i):
    if i == 2:
        raise UnprintableError()
    return i


@pytest.mark.parametrize("method", ["thread", "process"])
def test_an_exception_whose_str_fails_is_reported_as_the_items_failure(method):
    # str(error) raised: a process worker died of it, and threads raised the RuntimeError instead.
    with prefetch(lazyseq.smap(raise_unprintable, range(5)), nworkers=2, method=method, inline_below=0) as ahead:
        with pytest.raises(lazyseq.EvaluationError) as info:
            ahead[2]
        assert str(info.value) == (
            "failed to compute prefetch[2] -> smap(raise_unprintable)[2]: UnprintableError: "
            "<str() of UnprintableError failed: RuntimeError: str broken>"
        )
        assert type(info.value.__cause__).__name__ == "UnprintableError"
        assert [ahead[i] for i in (0, 1, 3, 4)] == [0, 1, 3, 4] and ahead.workers_running


CONSUMER_THEN_KILLED = """
import sys, numpy as np, lazyseq

def slow(i):
    import time
    time.sleep(0.2)
    return i

if __name__ == "__main__":
    reading = iter(lazyseq.prefetch(lazyseq.smap(slow, range(100)), nworkers=2, method="process", start_method=sys.argv[1]))
    next(reading)
    print("reading", flush=True)
    for _ in reading:
        pass
"""


@pytest.mark.parametrize("start_method", ["fork", "forkserver", "spawn"])
def test_workers_of_a_consumer_killed_end_without_a_word(tmp_path, start_method):
    # A forkserver's worker wrote to the pipe of its dead consumer before noticing: BrokenPipeError tracebacks.
    script = tmp_path / "consumer.py"
    script.write_text(CONSUMER_THEN_KILLED)
    consumer = subprocess.Popen(
        [sys.executable, str(script), start_method],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "TMPDIR": str(tmp_path)},  # a process killed leaves its forkserver's folder: here
    )
    try:
        assert consumer.stdout.readline() == "reading\n"
        consumer.kill()
        consumer.wait()
        error_output = consumer.stderr.read()  # to its end: once the workers, which write there too, are gone
    finally:
        consumer.kill()
        consumer.wait()
        consumer.stdout.close()
        consumer.stderr.close()
    assert error_output == ""


def test_a_ctrl_c_taken_by_another_thread_while_workers_are_spawned_is_raised_after(monkeypatch):
    # SIGINT was ignored while workers were spawned: the main thread held it back, but another thread (a notebook's
    # kernel has several) took it in and it was lost; the cell ran on to its end.
    from lazyseq.loading import closing

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    done = threading.Event()
    other = threading.Thread(target=done.wait, args=(30,), daemon=True)
    other.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            with closing.interrupts_deferred(), closing.blocked_for_children():
                signal.pthread_kill(other.ident, signal.SIGINT)  # where the system sends it: a thread that takes it
                deadline = time.monotonic() + 10
                while not closing._hurry[0] and time.monotonic() < deadline:  # noted in the main thread
                    time.sleep(0.001)
    finally:
        signal.signal(signal.SIGINT, previous)
        done.set()  # a thread left waiting makes every later fork() in this process warn (Python 3.12 on)
        other.join()


def test_processes_spawned_from_any_thread_start_with_ctrl_c_held_back():
    # Spawned from another thread than the main one (a data server's), workers took a Ctrl-C sent to the process
    # group while they imported, and printed its traceback.
    from lazyseq.loading import closing

    masks = []

    def spawn():
        with closing.blocked_for_children():
            probe = "import signal; print(signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, []))"
            masks.append(subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True).stdout)

    spawner = threading.Thread(target=spawn)
    spawner.start()
    spawner.join()
    assert masks == ["True\n"]


def test_workers_that_cannot_start_are_a_loader_error_not_the_items(monkeypatch):
    # multiprocessing's own error (a forkserver ended by a Ctrl-C: EOFError) was reported as item 0's failure.
    def no_forkserver(self):
        raise EOFError("unexpected EOF")

    monkeypatch.setattr(
        multiprocessing.context.ForkServerProcess, "_Popen", staticmethod(lambda process: no_forkserver(process))
    )
    ahead = prefetch(range(5), nworkers=2, method="process", start_method="forkserver")
    with pytest.raises(lazyseq.LoaderError) as caught:
        ahead[0]
    assert str(caught.value) == "prefetch: worker process 0 could not start: EOFError: unexpected EOF"
    assert isinstance(caught.value.__cause__, EOFError) and not ahead.workers_running
    assert multiprocessing.active_children() == []


SPAWNED_WHILE_INTERRUPTED = """
import os
import select
if __name__ == "__mp_main__":  # a spawned worker, importing this script: slowly, as with a large library
    with open(os.environ["IMPORTING_FIFO"], "w") as fifo:
        fifo.write("importing\\n")
    import time
    time.sleep(5)
import numpy as np, lazyseq
if __name__ == "__main__":
    try:
        with lazyseq.prefetch(lazyseq.view(np.arange(4)), nworkers=1, method="process", start_method="spawn") as p:
            print("started", flush=True)
            list(p)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
"""


def test_a_ctrl_c_while_spawned_workers_start_prints_no_traceback_of_theirs(tmp_path):
    # The worker's Python took the Ctrl-C sent to the process group: a KeyboardInterrupt traceback from its imports.
    script, fifo = tmp_path / "consumer.py", tmp_path / "importing"
    script.write_text(SPAWNED_WHILE_INTERRUPTED)
    os.mkfifo(fifo)
    env = {**os.environ, "IMPORTING_FIFO": str(fifo)}
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
    with subprocess.Popen([sys.executable, str(script)], env=env, start_new_session=True, **pipes) as consumer:
        try:
            reading = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
            try:
                waiting = select.poll()
                waiting.register(reading, select.POLLIN)
                assert waiting.poll(60_000), "the worker never started importing"
                assert os.read(reading, 100) == b"importing\n"
            finally:
                os.close(reading)
            os.killpg(consumer.pid, signal.SIGINT)  # Ctrl-C in a terminal: to every process of the group
            out, err = consumer.communicate(timeout=60)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(consumer.pid, signal.SIGKILL)
    assert (out, err) == ("started\ninterrupted\n", "")


def test_a_start_that_fails_after_a_ctrl_c_raises_the_interrupt_alone(monkeypatch):
    # A Ctrl-C in a terminal ends a forkserver being started too: the KeyboardInterrupt came chained to
    # multiprocessing's EOFError, two tracebacks for one Ctrl-C.
    def interrupted_then_ended(self):
        signal.raise_signal(signal.SIGINT)  # noted, not raised, while the workers start
        raise EOFError("unexpected EOF")

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    monkeypatch.setattr(
        multiprocessing.context.ForkServerProcess,
        "_Popen",
        staticmethod(lambda process: interrupted_then_ended(process)),
    )
    try:
        ahead = prefetch(range(5), nworkers=2, method="process", start_method="forkserver")
        with pytest.raises(KeyboardInterrupt) as caught:
            ahead[0]
    finally:
        signal.signal(signal.SIGINT, previous)
    assert caught.value.__cause__ is None and caught.value.__suppress_context__
    assert caught.value.__notes__ == [
        "while this stopped: LoaderError: prefetch: worker process 0 could not start: EOFError: unexpected EOF"
    ]
    assert not ahead.workers_running and multiprocessing.active_children() == []


class DiesFirstElseWaits:
    """A batch maker: the first worker process to call it dies; the other makes its batch once that one has ended."""

    def __init__(self):
        context = multiprocessing.get_context("fork")
        self.first, self.dead, self.made = context.Lock(), context.Value("i", 0), context.Event()

    def __call__(self):
        if self.first.acquire(block=False):
            self.dead.value = os.getpid()
            os._exit(1)
        while not self.dead.value:
            time.sleep(0.001)
        status = f"/proc/{self.dead.value}/status"
        while os.path.exists(status) and "State:\tZ" not in open(status).read():  # its pipe closes as it ends
            time.sleep(0.001)
        self.made.set()
        return np.zeros(4)


def test_a_worker_that_died_before_the_first_batch_of_load_buffers_arrived_is_a_worker_died():
    # The first batch sizes the shared-memory slots, which are then sent to every worker: writing to the dead one
    # raised BrokenPipeError from the read.
    maker = DiesFirstElseWaits()
    with lazyseq.load_buffers(maker, nworkers=2, method="process", start_method="fork") as batches:
        assert maker.made.wait(timeout=60)
        time.sleep(0.2)  # (the batch and the death arrive before the first read: the batch was taken in first)
        outcomes = []
        for _ in range(5):
            try:
                outcomes.append(next(batches).tolist())
            except lazyseq.WorkerDied:
                outcomes.append("WorkerDied")
            except StopIteration:
                break
    assert "WorkerDied" in outcomes and multiprocessing.active_children() == []


def _end_on(arg):
    if arg == "end":
        os._exit(3)
    return arg


def test_a_worker_that_started_then_died_on_a_task_is_not_said_to_have_died_starting():
    # Its death found by a write before anything read its "ready": it was said to have died as it started, and a
    # server failed every waiting request rather than the one of the item that ended it.
    from lazyseq.loading.failures import WorkerDied
    from lazyseq.loading.options import LoaderOptions
    from lazyseq.loading.process_workers import ProcessWorkers

    options = LoaderOptions.check("prefetch", nworkers=1, method="process", start_method="fork")
    workers = ProcessWorkers(_end_on, options, seed=0, slot_count=0)
    try:
        workers.submit_many([(0, "end")])
        workers._processes[0].join(60)  # it started, took task 0 and ended; nothing read what it said
        with pytest.raises(WorkerDied) as info:
            workers.submit_many([(1, 1)])
            for _ in range(300):
                workers.poll(0.1)
    finally:
        workers.close()
    assert (info.value.while_starting, info.value.suspects) == (False, (0,))
    assert "while computing" in str(info.value) and "while starting" not in str(info.value)
