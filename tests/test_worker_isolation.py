"""What a user asking for worker processes gets: distinct random states, isolation, clean forks, clear deaths."""

import contextlib
import functools
import gc
import multiprocessing
import os
import random
import re
import select
import signal
import subprocess
import sys
import textwrap
import threading
import traceback

import numpy as np
import pytest
from loader_helpers import ENDED_ITSELF, alive, die_on, torch_draw

import lazyseq
from lazyseq.loading.seeding import seed_torch, worker_states

START_METHODS = multiprocessing.get_all_start_methods()

SAMPLES = np.arange(18_000 * 8, dtype=np.float64).reshape(18_000, 8)
TRAIN = lazyseq.collate([lazyseq.view(SAMPLES), lazyseq.view(np.arange(18_000) % 10)])


def readme_sample():
    """The README's load_buffers sampler: a random minibatch drawn with numpy's global generator."""
    picks = np.random.randint(len(TRAIN), size=64)
    return TRAIN.gather(picks).batch(64)[0]


def python_random_draw():
    return np.array([random.random()])


@pytest.mark.parametrize("start_method", START_METHODS)
def test_process_workers_never_deliver_the_same_random_minibatch_twice(start_method):
    seen = set()
    with lazyseq.load_buffers(
        readme_sample, max_cached=10, nworkers=2, method="process", start_method=start_method
    ) as minibatches:
        for _ in range(1000):
            x, y = next(minibatches)
            seen.add(x.tobytes())
    assert len(seen) == 1000


def test_python_random_is_reseeded_in_each_worker_process_too():
    with lazyseq.load_buffers(python_random_draw, max_cached=4, nworkers=2, method="process") as draws:
        values = [float(next(draws)[0]) for _ in range(200)]
    assert len(set(values)) == 200


@pytest.mark.parametrize("start_method", START_METHODS)
def test_torch_is_reseeded_in_each_worker_process_when_imported(start_method):
    pytest.importorskip("torch")
    with lazyseq.load_buffers(
        torch_draw, max_cached=4, nworkers=2, method="process", start_method=start_method
    ) as draws:
        values = [float(next(draws)[0]) for _ in range(100)]
    assert len(set(values)) == 100


def test_torch_is_seeded_as_manual_seed_seeds_it_and_tracebacks_format_again_after():
    torch = pytest.importorskip("torch")
    saved = torch.get_rng_state()
    try:
        seed_torch(torch, 2**40 + 3)
        assert torch.initial_seed() == 2**40 + 3
        drawn = torch.rand(3)
        torch.manual_seed(2**40 + 3)
        assert torch.equal(torch.rand(3), drawn)
    finally:
        torch.set_rng_state(saved)
    assert traceback.format_stack()[-1].startswith('  File "')


def test_rng_gives_independent_generators_for_different_keys():
    # keys were handed to default_rng as they are: trailing zeros ignored, large keys spilling into the next one,
    # and rng(seed, epoch, 0) drew the very numbers that shuffle(seed=seed, epoch=epoch) drew for its order
    draws = {
        keys: tuple(lazyseq.rng(*keys).integers(2**62, size=4))
        for keys in [(42, 3), (42, 3, 0), (2**32, 5), (0, 1 + 5 * 2**32)]
    }
    assert len(set(draws.values())) == 4
    assert tuple(lazyseq.rng(42).integers(2**62, size=4)) != tuple(np.random.default_rng(42).integers(2**62, size=4))
    order = list(lazyseq.shuffle(range(100), seed=42, epoch=3))
    assert order != lazyseq.rng(42, 3, 0).permutation(100).tolist()
    assert lazyseq.rng(7, 1, 2).normal() == lazyseq.rng(7, 1, 2).normal()


def test_a_seed_gives_each_worker_its_own_reproducible_state():
    first_worker = lazyseq.smap(lambda _: int(np.random.randint(2**31)), range(4))
    runs = []
    for _ in range(2):
        with lazyseq.prefetch(first_worker, nworkers=1, method="process", seed=5) as ahead:
            runs.append(list(ahead))
    assert runs[0] == runs[1] and len(set(runs[0])) == 4
    assert worker_states(11, 0) != worker_states(11, 1)


def test_restarting_the_workers_gives_them_new_states():
    draws = lazyseq.smap(lambda _: int(np.random.randint(2**31)), range(3))
    ahead = lazyseq.prefetch(draws, nworkers=1, method="process", seed=5)
    first = list(ahead)
    ahead.close()
    second = list(ahead)
    ahead.close()
    assert first != second


def test_seed_is_checked():
    with pytest.raises(ValueError, match="^prefetch: seed must be a non-negative integer or None, got -1$"):
        lazyseq.prefetch(range(3), nworkers=1, seed=-1)
    with pytest.raises(TypeError):
        lazyseq.load_buffers(lambda: 1, seed=1.5)


@pytest.mark.parametrize("loader", ["prefetch", "load_buffers"])
def test_method_process_runs_the_users_code_in_worker_processes_only(loader):
    """A cheap item that kills its process kills a worker, never the reader, with the default settings."""
    if loader == "prefetch":
        with lazyseq.prefetch(lazyseq.smap(die_on(3, "exit"), range(10)), nworkers=2, method="process") as ahead:
            with pytest.raises(lazyseq.WorkerDied, match=r"died with exit code 3 while computing (item 3|items .*3)"):
                list(ahead)
    else:
        with lazyseq.load_buffers(
            functools.partial(die_on(None, "exit"), None), nworkers=2, method="process"
        ) as batches:
            with pytest.raises(
                lazyseq.WorkerDied,
                match=r"died with exit code 3 while computing (batch \d+|batches \d+(, \d+)+)"
                + re.escape(ENDED_ITSELF)
                + "$",
            ):
                next(batches)
    assert multiprocessing.active_children() == []


def collect_garbage(x):
    gc.collect()  # a forked worker collects garbage that the parent had not collected yet
    return x


def test_a_loader_inherited_by_a_forked_worker_is_not_closed_there():
    gc.collect()
    gc.disable()
    try:
        items = lazyseq.smap(abs, range(20))
        ahead = lazyseq.prefetch(items, nworkers=2, method="process", start_method="fork", inline_below=0)
        assert ahead[0] == 0
        pids = ahead._engine.workers.workers.pids
        assert len(pids) == 2
        cycle = [ahead]
        cycle.append(cycle)  # garbage that only a collection frees
        del ahead, cycle
        items = lazyseq.smap(collect_garbage, range(4))
        with lazyseq.prefetch(items, nworkers=2, method="process", start_method="fork", inline_below=0) as other:
            assert list(other) == [0, 1, 2, 3]
        # the first loader's workers were not stopped by the children (they held copies of its pipes)
        assert all(alive(pid) for pid in pids)
    finally:
        gc.enable()
    gc.collect()
    assert multiprocessing.active_children() == []


STRAY_SCRIPT = textwrap.dedent(
    """
    import gc
    import lazyseq

    def collect_garbage(x):
        gc.collect()
        return x

    def broken(x):
        if x == 3:
            raise ValueError("bad item")
        return x

    def run():
        ahead = lazyseq.prefetch(lazyseq.smap(broken, range(20)), nworkers=2, method="process", inline_below=0)
        cycle = [ahead]
        cycle.append(cycle)  # left for the garbage collector, which has not run when the next workers fork
        return list(ahead)

    gc.disable()
    try:
        run()
    except lazyseq.EvaluationError:
        print("failed as expected")
    with lazyseq.prefetch(lazyseq.smap(collect_garbage, range(20)), nworkers=2, method="process",
                          inline_below=0) as ahead:
        print(sum(ahead))
    gc.enable()
    """
)


def test_no_stray_traceback_from_a_loader_left_unclosed_after_an_error(tmp_path):
    script = tmp_path / "stray.py"
    script.write_text(STRAY_SCRIPT)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["failed", "as", "expected", "190"]
    assert done.stderr == ""


STDIN_SCRIPT = textwrap.dedent(
    """
    import lazyseq

    def double(x):
        return 2 * x

    try:
        with lazyseq.prefetch(lazyseq.smap(double, range(10)), nworkers=2, method="process",
                              start_method=START_METHOD) as ahead:
            print(list(ahead))
    except lazyseq.LoaderError as error:
        print(type(error).__name__, error)
    """
)


@pytest.mark.parametrize("start_method", [m for m in START_METHODS if m != "fork"])
def test_spawned_workers_of_a_script_fed_on_stdin_say_why_they_cannot_start(start_method):
    source = STDIN_SCRIPT.replace("START_METHOD", repr(start_method))
    done = subprocess.run([sys.executable, "-"], input=source, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (
        f"LoaderError prefetch: worker processes started with {start_method!r} run the main module again from its "
        "file, but it came from '<stdin>', which is not a file they can read; save the script to a file, or use "
        "start_method='fork' or method='thread'"
    )
    fork = subprocess.run(
        [sys.executable, "-"],
        input=STDIN_SCRIPT.replace("START_METHOD", "'fork'"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert fork.stdout.strip() == "[0, 2, 4, 6, 8, 10, 12, 14, 16, 18]"


UNGUARDED_SCRIPT = textwrap.dedent(
    """
    import lazyseq

    def double(x):
        return 2 * x

    try:  # no `if __name__ == "__main__":`: each spawned worker runs this again
        with lazyseq.prefetch(lazyseq.smap(double, range(10)), nworkers=1, method="process",
                              start_method=START_METHOD) as ahead:
            print(list(ahead))
    except lazyseq.WorkerDied as error:
        print(type(error).__name__, str(error).split("; ", 1)[1])
    """
)


@pytest.mark.parametrize("start_method", [m for m in START_METHODS if m != "fork"])
def test_workers_that_die_running_a_script_without_a_main_guard_say_what_it_needs(tmp_path, start_method):
    # The message ended at "went to the standard error of this process"
    script = tmp_path / "unguarded.py"
    script.write_text(UNGUARDED_SCRIPT.replace("START_METHOD", repr(start_method)))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == (
        "WorkerDied what it printed (the cause, usually a traceback) went to the standard error of this process; "
        "each worker runs the main script again as it starts: a script that makes its loaders outside "
        '`if __name__ == "__main__":` ends them so'
    )


READING_STDIN_SCRIPT = textwrap.dedent(
    """
    import sys, threading, time
    import numpy as np
    import lazyseq

    def main_thread_reads_stdin():
        main = threading.main_thread()
        with open(f"/proc/self/task/{main.native_id}/stat") as stat:
            sleeping = stat.read().rpartition(")")[2].split()[0] == "S"
        return sleeping and sys._current_frames()[main.ident].f_lineno == READ_LINE

    def load():
        while not main_thread_reads_stdin():  # blocked in readline, holding the lock of sys.stdin
            time.sleep(0.001)
        with lazyseq.prefetch(lazyseq.view(np.arange(10.0)), nworkers=2, method="process",
                              start_method="fork") as ahead:
            print("loaded", sum(ahead), flush=True)

    thread = threading.Thread(target=load)
    thread.start()
    READ_LINE = sys._getframe().f_lineno + 1
    line = sys.stdin.readline()
    thread.join()
    print("read", line.strip(), flush=True)
    """
)


@pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="finds the reading thread through /proc")
def test_workers_forked_while_another_thread_reads_stdin_start(tmp_path):
    # multiprocessing closes stdin in a new worker: a forked one inherited its lock held by the reading thread.
    script = tmp_path / "reading_stdin.py"
    script.write_text(READING_STDIN_SCRIPT)
    command = [sys.executable, str(script)]
    pipes = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
    with subprocess.Popen(command, **pipes, text=True, start_new_session=True) as p:
        try:
            ready, _, _ = select.select([p.stdout], [], [], 60)
            assert ready, "the loader started while another thread read stdin never delivered"
            assert p.stdout.readline() == "loaded 45.0\n"
            out, err = p.communicate("go\n", timeout=60)
        finally:
            with contextlib.suppress(ProcessLookupError):  # its workers too, had they hung
                os.killpg(p.pid, signal.SIGKILL)
    assert (out, err, p.returncode) == ("read go\n", "", 0)


def run_unless_hung(folder, source, argument, hung, timeout=120):
    """``(stdout, stderr, exit code)`` of ``source`` run as a script; a failure saying ``hung`` if it hangs.

    It runs in a session of its own, killed whole at the end: its workers too, had they hung. Its temporary files
    go in ``folder`` (multiprocessing's folder for a forkserver's socket, which a process that ends with
    ``os._exit`` leaves behind).
    """
    script = folder / "script.py"
    script.write_text(source)
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
    env = {**os.environ, "TMPDIR": str(folder)}
    with subprocess.Popen(
        [sys.executable, str(script), argument], **pipes, text=True, start_new_session=True, env=env
    ) as p:
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"hung: {hung}")
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
    return out, err, p.returncode


DRAWING_SCRIPT = textwrap.dedent(
    """
    import os, sys, threading
    import numpy as np
    import lazyseq

    if sys.argv[1] == "torch":
        import torch

        def draw():
            torch.randn(10**7)
    else:
        def draw():
            np.random.standard_normal(10**7)

    drawing = threading.Event()

    def keep_drawing():  # holds the generator's lock nearly all the time
        while True:
            drawing.set()
            draw()

    threading.Thread(target=keep_drawing, daemon=True).start()
    drawing.wait()
    for _ in range(3):
        with lazyseq.prefetch(lazyseq.view(np.arange(10.0)), nworkers=2, method="process",
                              start_method="fork") as ahead:
            print(sum(ahead), flush=True)
    os._exit(0)  # not waiting for the drawing thread
    """
)


class LockedTorch:
    """torch as a forked worker sees it when a draw held the generator's lock at the fork: seeding never returns."""

    @staticmethod
    def manual_seed(seed):
        threading.Event().wait()


def test_a_forked_worker_whose_torch_generator_stays_locked_is_ended_and_says_why(monkeypatch):
    # A draw that began without the GIL between the consumer's last look and the fork leaves the lock held.
    monkeypatch.setitem(sys.modules, "torch", LockedTorch)
    monkeypatch.setattr("lazyseq.loading.seeding.TORCH_LOCK_SECONDS", 0.05)
    with lazyseq.prefetch(range(4), nworkers=1, method="process", start_method="fork") as ahead:
        with pytest.raises(lazyseq.WorkerDied) as raised:
            ahead[0]
    pid = str(raised.value).split("(pid ")[1].split(")")[0]
    assert str(raised.value) == (
        f"prefetch: worker process 0 (pid {pid}) died with signal SIGALRM while starting: torch's random generator "
        "was locked when this worker was forked: another thread of the consumer was drawing from it (torch.randn, "
        "...) at that moment, and its lock stays held in the worker, whose seeding of the generator had not "
        "returned after 0.05 s; start the workers with start_method='forkserver' or 'spawn', or keep other "
        "threads from drawing while they start"
    )


def test_a_forked_worker_whose_torch_generator_stays_locked_is_ended_even_with_sigalrm_blocked(monkeypatch):
    # A forked worker keeps the signal mask of the thread that forked it: one that blocks SIGALRM
    monkeypatch.setitem(sys.modules, "torch", LockedTorch)
    monkeypatch.setattr("lazyseq.loading.seeding.TORCH_LOCK_SECONDS", 0.05)
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
    try:
        with lazyseq.prefetch(range(4), nworkers=1, method="process", start_method="fork") as ahead:
            with pytest.raises(lazyseq.WorkerDied, match="torch's random generator was locked"):
                ahead[0]
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


def alarm_in_start_hook(worker):
    signal.signal(signal.SIGALRM, signal.SIG_DFL)
    signal.setitimer(signal.ITIMER_REAL, 0.01)
    threading.Event().wait()


def test_a_worker_ended_by_an_alarm_of_its_own_without_torch_is_not_blamed_on_torch(monkeypatch):
    monkeypatch.delitem(sys.modules, "torch", raising=False)  # not imported: nothing to seed under a timer
    with lazyseq.prefetch(
        range(4), nworkers=1, method="process", start_method="fork", start_hook=alarm_in_start_hook
    ) as ahead:
        with pytest.raises(lazyseq.WorkerDied) as raised:
            ahead[0]
    assert "died with signal SIGALRM while starting, before it could compute anything" in str(raised.value)


class SeededTorch:
    @staticmethod
    def manual_seed(seed):
        pass


def alarm_state(item):
    return signal.getsignal(signal.SIGALRM).__name__, signal.getitimer(signal.ITIMER_REAL)


def test_a_forked_worker_seeds_torch_under_a_timer_it_then_clears(monkeypatch):
    def on_alarm(signum, frame):  # the consumer's own handler: the worker has it back after seeding
        pass

    monkeypatch.setitem(sys.modules, "torch", SeededTorch)
    previous = signal.signal(signal.SIGALRM, on_alarm)
    try:
        with lazyseq.prefetch(
            lazyseq.smap(alarm_state, range(2)), nworkers=1, method="process", start_method="fork"
        ) as ahead:
            assert list(ahead) == [("on_alarm", (0.0, 0.0))] * 2
    finally:
        signal.signal(signal.SIGALRM, previous)


@pytest.mark.parametrize("library", ["numpy", "torch"])
def test_workers_forked_while_another_thread_draws_random_numbers_start(tmp_path, library):
    # Each worker seeds the global generators: a forked one inherited their locks held by the drawing thread.
    if library == "torch":
        pytest.importorskip("torch")
    done = run_unless_hung(tmp_path, DRAWING_SCRIPT, library, hung=f"forked while drawing from {library}")
    # Rarely (a few runs in a hundred), a torch draw begins between the last look and the fork: the loader says so.
    locked = library == "torch" and "torch's random generator was locked when this worker was forked" in done[1]
    assert done == ("45.0\n" * 3, "", 0) or (locked and done[2] != 0)


MAIN_SCRIPT_TYPES_SCRIPT = textwrap.dedent(
    """
    import collections, sys
    import numpy as np
    import lazyseq

    Pair = collections.namedtuple("Pair", "x y")

    class Label:
        def __init__(self, value):
            self.value = value

    def make(i):
        return Pair(np.full(2, i), Label(i))

    if __name__ == "__main__":
        options = dict(nworkers=1, method="process", start_method=sys.argv[1])
        with lazyseq.prefetch(lazyseq.smap(make, range(4)), **options) as ahead:
            x = ahead[3]
        with lazyseq.load_buffers(lambda: make(5), **options) as batches:
            y = next(batches)
        print(type(x) is Pair, x.x.tolist(), type(x.y) is Label, x.y.value, type(y) is Pair, y.y.value)
    """
)


@pytest.mark.parametrize("start_method", ["spawn", "forkserver"])
def test_items_of_types_defined_in_the_main_script_come_back_from_spawned_workers(tmp_path, start_method):
    # The worker's copy of the class (unpickled with the pipeline) was not its main script's: PicklingError.
    pytest.importorskip("cloudpickle")
    done = run_unless_hung(tmp_path, MAIN_SCRIPT_TYPES_SCRIPT, start_method, hung="items of the main script's types")
    assert done == ("True [3, 3] True 3 True 5\n", "", 0)


HOOK_STATE_SCRIPT = textwrap.dedent(
    """
    import sys
    import numpy as np
    import lazyseq

    state = {}

    def remember(worker):
        state["worker"] = worker  # what a hook sets up for the pipeline: a file, a connection

    def read(i):
        return np.array([i, state.get("worker", -1)])

    if __name__ == "__main__":
        options = dict(nworkers=2, method="process", start_method=sys.argv[1], start_hook=remember)
        with lazyseq.prefetch(lazyseq.smap(read, range(6)), **options) as ahead:
            print(sorted({int(w) for _, w in ahead}))
    """
)


@pytest.mark.parametrize("start_method", ["fork", "spawn", "forkserver"])
def test_a_global_that_start_hook_sets_in_the_main_script_is_what_the_pipeline_reads(tmp_path, start_method):
    # Pickled apart, the hook and the pipeline each got their own copy of the script's globals: -1 everywhere.
    done = run_unless_hung(tmp_path, HOOK_STATE_SCRIPT, start_method, hung="a hook setting a global")
    assert done == ("[0, 1]\n", "", 0)


CHILD_EXITS_SCRIPT = textwrap.dedent(
    """
    import os, sys
    import numpy as np
    import lazyseq

    with lazyseq.prefetch(lazyseq.view(np.arange(100.0)), nworkers=2, method="process") as ahead:
        first = ahead[0]
        child = os.fork()
        if child == 0:
            sys.exit(0)  # multiprocessing stops the children it knows of at exit: not its parent's workers
        os.waitpid(child, 0)
        print(first, ahead[50], flush=True)
    """
)


def test_a_forked_child_that_exits_normally_leaves_the_parents_workers_running(tmp_path):
    script = tmp_path / "child_exits.py"
    script.write_text(CHILD_EXITS_SCRIPT)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert (done.stdout, done.stderr, done.returncode) == ("0.0 50.0\n", "", 0)


FORKSERVER_IN_CHILD_SCRIPT = textwrap.dedent(
    """
    import os, sys
    import lazyseq

    def square(x):
        return x * x

    def squares():
        items = lazyseq.smap(square, range(6))
        with lazyseq.prefetch(items, nworkers=2, method="process", start_method="forkserver") as ahead:
            return list(ahead)

    if __name__ == "__main__":
        print("parent", squares(), flush=True)  # starts multiprocessing's forkserver, the parent's
        parent_ended, parent_alive = os.pipe()
        child = os.fork()
        if child == 0:
            try:
                os.close(parent_alive)
                print("child", squares(), flush=True)  # a forkserver of its own
                if sys.argv[1] == "outliving":
                    os.read(parent_ended, 1)  # the end of file: the parent has ended, its temporary folder removed
                    print("child", squares(), flush=True)
            finally:
                os._exit(0)
        if sys.argv[1] == "alongside":
            os.waitpid(child, 0)
            print("parent", squares(), flush=True)
    """
)


@pytest.mark.parametrize("child", ["alongside", "outliving"])
def test_a_forked_child_starts_forkserver_workers_of_its_own(tmp_path, child):
    # The child inherited the parent's forkserver, which multiprocessing waits on as its own child: the workers
    # could not start (ChildProcessError). Then its forkserver had its socket in the parent's temporary folder,
    # which the parent removes as it ends.
    script = tmp_path / "forkserver_in_child.py"
    script.write_text(FORKSERVER_IN_CHILD_SCRIPT)
    temporary = {**os.environ, "TMPDIR": str(tmp_path)}  # the child's own folder, which its os._exit leaves
    done = subprocess.run(
        [sys.executable, str(script), child], capture_output=True, text=True, timeout=120, env=temporary
    )  # to the end of both outputs: the child's too
    squares = "[0, 1, 4, 9, 16, 25]"
    last = "parent" if child == "alongside" else "child"
    assert (done.stdout, done.stderr) == (f"parent {squares}\nchild {squares}\n{last} {squares}\n", "")


FORK_WHILE_WAITING_SCRIPT = textwrap.dedent(
    """
    import os, sys, threading, time, warnings
    import numpy as np
    import lazyseq

    # Python 3.12 on warns of a fork while other threads run, as this one forks on purpose
    warnings.filterwarnings("ignore", r"This process \\(pid=\\d+\\) is multi-threaded, use of fork", DeprecationWarning)

    release = threading.Event()

    def held(x):  # the parent's worker threads wait here until after the fork
        release.wait()
        return x

    if sys.argv[1] == "prefetch":
        loader = lazyseq.prefetch(lazyseq.smap(held, range(10)), nworkers=1, inline_below=0)
        read = lambda: loader[3]
    else:
        loader = lazyseq.load_buffers(lambda: held(np.zeros(3)), nworkers=1, inline_below=0)
        read = lambda: next(loader)
    waiting = threading.Thread(target=read)
    waiting.start()
    while loader._engine is None or not loader._engine.pending:  # the thread waits in the loader, holding its lock
        time.sleep(0.001)
    child = os.fork()
    if child == 0:  # the parent's worker threads are not here: release is set for the child's own
        release.set()
        print("child read", read(), flush=True)
        os._exit(0)
    _, status = os.waitpid(child, 0)
    release.set()
    waiting.join()
    loader.close()
    print("child exit", os.waitstatus_to_exitcode(status), flush=True)
    """
)


@pytest.mark.parametrize("loader", ["prefetch", "load_buffers"])
def test_a_forked_child_reads_a_loader_that_a_parent_thread_was_waiting_on(tmp_path, loader):
    done = run_unless_hung(tmp_path, FORK_WHILE_WAITING_SCRIPT, loader, hung="the forked child waited for a lock")
    first = "3" if loader == "prefetch" else "[0. 0. 0.]"
    assert done == (f"child read {first}\nchild exit 0\n", "", 0)


CHILD_READS = """
        child = os.fork()
        if child == 0:
            faulthandler.dump_traceback_later(30, exit=True)
            print("child read", ahead[5], flush=True)
            ahead.close()
            os._exit(0)
        release.set()
        other.join()
        _, status = os.waitpid(child, 0)
        ahead.close()
        print("child exit", os.waitstatus_to_exitcode(status), flush=True)
"""  # the end of the scripts below: a child forked as another thread holds a lock reads the loader


FORK_WHILE_IMPORTING_SCRIPT = textwrap.dedent(
    """
    import faulthandler, importlib.abc, os, sys, threading, warnings
    import lazyseq

    warnings.filterwarnings("ignore", r"This process \\(pid=\\d+\\) is multi-threaded, use of fork", DeprecationWarning)

    turn, release = threading.Event(), threading.Event()

    class SlowImport(importlib.abc.MetaPathFinder):
        \"\"\"The first module that another thread than the main one imports comes slowly (its import lock held).\"\"\"

        def find_spec(self, name, path, target=None):
            if threading.current_thread() is not threading.main_thread() and not turn.is_set():
                turn.set()
                release.wait()
            return None

    def same(i):
        return i

    if __name__ == "__main__":
        sys.meta_path.insert(0, SlowImport())
        ahead = lazyseq.prefetch(lazyseq.smap(same, range(10)), nworkers=2, method="process", start_method=sys.argv[1])
        other = threading.Thread(target=lambda: (list(ahead), turn.set()))  # its first read starts the workers
        other.start()
        turn.wait()  # it imports a module, or has read everything
    """
    + CHILD_READS
)


@pytest.mark.parametrize("start_method", ["fork", "spawn", "forkserver"])
def test_a_child_forked_while_a_thread_starts_process_workers_starts_its_own(tmp_path, start_method):
    # The reader imported modules as it started the workers (the workers' own, numpy.random, multiprocessing's): a
    # child forked meanwhile inherited that module's import lock held, for ever.
    done = run_unless_hung(tmp_path, FORK_WHILE_IMPORTING_SCRIPT, start_method, hung="the parent waiting for its child")
    assert done == ("child read 5\nchild exit 0\n", "", 0)


FORK_WHILE_TRACKING_SCRIPT = textwrap.dedent(
    """
    import faulthandler, os, sys, threading, warnings
    from multiprocessing import resource_tracker
    import lazyseq

    warnings.filterwarnings("ignore", r"This process \\(pid=\\d+\\) is multi-threaded, use of fork", DeprecationWarning)

    def same(i):
        return i

    if __name__ == "__main__":
        ahead = lazyseq.prefetch(lazyseq.smap(same, range(10)), nworkers=1, method="process", start_method=sys.argv[1])
        holding, release = threading.Event(), threading.Event()

        def hold():  # as a thread starting spawn or forkserver workers does, making sure the tracker runs
            with resource_tracker._resource_tracker._lock:
                holding.set()
                release.wait()

        other = threading.Thread(target=hold)
        other.start()
        holding.wait()
    """
    + CHILD_READS
)


@pytest.mark.parametrize("start_method", ["spawn", "forkserver"])
def test_a_child_forked_while_a_thread_holds_the_resource_trackers_lock_starts_workers(tmp_path, start_method):
    # The child inherited multiprocessing's resource tracker lock held, and waited for it for ever.
    done = run_unless_hung(tmp_path, FORK_WHILE_TRACKING_SCRIPT, start_method, hung="the parent waiting for its child")
    assert done == ("child read 5\nchild exit 0\n", "", 0)


class FailsWhenUnpickled:
    """A part of a pipeline that raises as a spawned worker unpickles it."""

    def __reduce__(self):
        return (int, ("not a number",))


class ExitsWhenUnpickled:
    """A part of a pipeline that ends the worker process as it is unpickled, before the worker is ready."""

    def __reduce__(self):
        return (os._exit, (1,))


def error_of_first_read(part) -> lazyseq.LoaderError:
    """What reading a pipeline holding ``part`` raises, with one spawned worker."""
    broken = lazyseq.smap(lambda x: (part, x)[1], range(4))
    with lazyseq.prefetch(broken, nworkers=1, method="process", start_method="spawn") as ahead:
        with pytest.raises(lazyseq.LoaderError) as raised:
            ahead[0]
    return raised.value


def test_a_worker_that_fails_to_start_says_what_failed():
    error = error_of_first_read(FailsWhenUnpickled())
    assert str(error) == (  # the reason too: a message printed or logged alone says it
        "prefetch: worker process 0 could not start: unpickling the pipeline failed: ValueError: invalid literal for "
        "int() with base 10: 'not a number'"
    )
    assert type(error.__cause__) is ValueError


def test_a_worker_that_dies_while_starting_says_so_and_where_its_output_went():
    error = error_of_first_read(ExitsWhenUnpickled())
    assert type(error) is lazyseq.WorkerDied
    assert (  # (then, where the main module has a file, the condition of loaders made outside its main guard)
        "died with exit code 1 while starting, before it could compute anything; what it printed (the cause, "
        "usually a traceback) went to the standard error of this process"
    ) in str(error)


def masked_item(x):
    return np.ma.masked_array([float(x), -1000.0], mask=[False, True])


def masked_pair():
    return np.zeros(2), masked_item(1)


def test_subclasses_of_ndarray_come_back_whole_from_worker_processes():
    # Results go through shared slots once their layout is known: a masked array's bytes alone lost its mask.
    with lazyseq.prefetch(lazyseq.smap(masked_item, range(8)), nworkers=2, method="process") as items:
        got = list(items)
    assert [type(x) for x in got] == [np.ma.MaskedArray] * 8
    assert [float(x.mean()) for x in got] == [float(k) for k in range(8)]
    with lazyseq.load_buffers(masked_pair, nworkers=1, method="process") as batches:
        pairs = [next(batches) for _ in range(4)]
    assert [(type(a), type(m), float(m.mean())) for a, m in pairs] == [(np.ndarray, np.ma.MaskedArray, 1.0)] * 4


DAEMON_READER_AT_EXIT_SCRIPT = textwrap.dedent(
    """
    import sys, threading, time, weakref

    class Anything:
        pass

    # As in programs that made a weakref.finalize before importing multiprocessing: at exit, multiprocessing stops
    # the workers first, then the loader's finalizer runs.
    anything = Anything()
    weakref.finalize(anything, lambda: None)
    import numpy as np
    import lazyseq

    def slow(i):
        time.sleep(0.05)
        return np.full(1000, i)

    if sys.argv[1] == "prefetch":
        loader = lazyseq.prefetch(lazyseq.smap(slow, range(10**6)), nworkers=2, method="process")
    else:
        loader = lazyseq.load_buffers(lambda: slow(0), nworkers=2, method="process")
    started = threading.Event()

    def read():
        for k, _ in enumerate(loader):
            if k == 2:
                started.set()

    threading.Thread(target=read, daemon=True).start()
    started.wait(60)
    print("leaving")
    """
)


@pytest.mark.parametrize("loader", ["prefetch", "load_buffers"])
def test_a_daemon_thread_reading_a_process_loader_at_exit_prints_nothing(tmp_path, loader):
    # It got WorkerDied (multiprocessing stops its children at exit) and printed a traceback, and multiprocessing's
    # exit handler failed on a worker the loader had closed meanwhile ("ValueError: process object is closed").
    for _ in range(3):
        out, err, code = run_unless_hung(tmp_path, DAEMON_READER_AT_EXIT_SCRIPT, loader, "at exit")
        assert (out, err, code) == ("leaving\n", "", 0)


CONSUMER_ENDS_SCRIPT = textwrap.dedent(
    """
    import os, sys, threading
    import lazyseq

    def item(i):
        if i >= 2:
            threading.Event().wait()  # busy for good: only the watch on the consumer ends the worker
        return i

    if __name__ == "__main__":
        ahead = lazyseq.prefetch(lazyseq.smap(item, range(10)), nworkers=2, method="process",
                                 start_method="forkserver", inline_below=0)
        assert ahead[0] == 0
        import multiprocessing
        pids = [p.pid for p in multiprocessing.active_children() if p.name.startswith("lazyseq-")]
        with open(sys.argv[1], "w") as file:
            file.write(" ".join(map(str, pids)))
        os._exit(0)  # no close: as a crash, a SIGKILL
    """
)


@pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="waits for other processes' ends with pidfd_open (Linux)")
def test_forkserver_workers_end_with_their_consumer(tmp_path):
    # Their parent is the forkserver, which they keep alive: they watched it, not the consumer, and went on.
    import select

    script = tmp_path / "consumer_ends.py"
    script.write_text(CONSUMER_ENDS_SCRIPT)
    pids = tmp_path / "workers.txt"
    # (no pipe for its output: the processes it leaves would hold it open)
    env = {**os.environ, "TMPDIR": str(tmp_path)}  # (the forkserver's folder, which its os._exit leaves)
    subprocess.run(
        [sys.executable, str(script), str(pids)], stdout=subprocess.DEVNULL, timeout=120, check=True, env=env
    )
    workers = [int(pid) for pid in pids.read_text().split()]
    assert len(workers) == 2
    left = []
    for pid in workers:
        try:
            watch = os.pidfd_open(pid)
        except ProcessLookupError:  # ended already
            continue
        try:
            if not select.select([watch], [], [], 10)[0]:  # readable once the process has ended
                left.append(pid)
                os.kill(pid, signal.SIGKILL)
        finally:
            os.close(watch)
    assert left == []


def _sigterm_handled_by_default(i):
    return signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_a_worker_process_ends_on_sigterm_whatever_handler_its_program_has():
    # Forked from `python -m lazyseq.serve`, which takes SIGTERM as Ctrl-C, a worker raised KeyboardInterrupt in the
    # item it was computing when its loader closed it (and printed its traceback).
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: None)
    try:
        with lazyseq.prefetch(lazyseq.smap(_sigterm_handled_by_default, range(4)), nworkers=2, method="process") as p:
            assert list(p) == [True] * 4
    finally:
        signal.signal(signal.SIGTERM, previous)
