"""Functions for loader tests. They live in a module of their own so that spawned workers can import them."""

import os
import signal
import threading
import time

import numpy as np

import lazyseq

# The loader suites run with the default settings (processes compute every item in their workers; threads
# compute cheap items in the reader, see tests/test_item_cost.py); a test about worker threads themselves says
# inline_below=0.
prefetch = lazyseq.prefetch
load_buffers = lazyseq.load_buffers


def square(x):
    return x * x


def fail_on_seven(x):
    if x == 7:
        raise ValueError(f"bad value {x}")
    return x


class Unpicklable(Exception):
    """An exception that cannot be pickled: it holds a lock (and unpickling would call it with one argument)."""

    def __init__(self, code, detail):
        super().__init__(f"code {code}: {detail}")
        self.lock = threading.Lock()


def raise_unpicklable(x):
    raise Unpicklable(3, f"item {x}")


def return_unpicklable(x):
    return threading.Lock()


def return_unpicklable_beside_an_array(x):
    """Item 7 holds an array (in a shared-memory slot by then) and a lock; the others an array and None."""
    return (np.full(3, x), threading.Lock()) if x == 7 else (np.full(3, x), None)


def die_on(target, how):
    def item(x):
        if x == target:
            if how == "sigkill":
                os.kill(os.getpid(), signal.SIGKILL)
            elif how == "exit":
                os._exit(3)
            elif how == "segfault":
                import ctypes

                ctypes.string_at(0)
        return x

    return item


# what WorkerDied adds for a worker process that ended itself (an exit code, no crash)
ENDED_ITSELF = (
    "; what it printed as it ended (the reason, usually) went to the standard error of the process that started it "
    "(for a notebook, the terminal that runs Jupyter)"
)

WORKER_STATE = {}


def remember_worker(index):
    WORKER_STATE["index"] = index


def worker_index(_):
    return WORKER_STATE.get("index")


def slow_in_worker_zero(_):
    """The index of the worker computing this item; worker 0 takes 50 times longer than the others."""
    time.sleep(0.05 if WORKER_STATE["index"] == 0 else 0.001)
    return WORKER_STATE["index"]


def nested(i):
    """A result mixing arrays of several dtypes, strings, numbers, dicts and lists."""
    return {
        "x": np.full((3, 2), i, dtype=np.float32),
        "pair": (np.arange(i % 4, dtype=np.int16), f"item-{i}"),
        "more": [i, np.bool_(i % 2), np.array(["a", "bc"], dtype=object)],
        "empty": np.zeros((0, 5)),
    }


def noisy(i):
    """A random transform made deterministic with lazyseq.rng."""
    return float(i + lazyseq.rng(7, 0, i).normal())


def blas_threads(_):
    """The BLAS thread counts in this process, after a product large enough for BLAS to use its threads."""
    from threadpoolctl import threadpool_info

    matrix = np.ones((400, 400))
    matrix @ matrix
    return sorted({pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"})


def thread_count(_):
    """Threads of this process, native ones included."""
    return len(os.listdir("/proc/self/task"))


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, ended but not reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False


def torch_draw():
    """A value from torch's global generator, as a training loop's augmentation would draw it.

    In float64: float32 draws take one of 2**24 values, and 100 of them, however well seeded, are all distinct only
    99.97% of the time.
    """
    import torch

    return np.array([torch.rand(1, dtype=torch.float64).item()])


def _missing(x):
    raise KeyError(x)


def read_another_view(i):
    """Reads an item of another view, as a pipeline may: how its error propagates follows lazyseq.seterr."""
    return lazyseq.smap(_missing, range(5))[i]


def _write_then_look(first, second, end):
    first[:] = -1  # its own copy: the parent's item stays as it was
    end.send("written")
    end.recv()  # the parent let go of its copy of second, and read on: that slot held other items since
    end.send(second.tolist())


def check_a_forked_child_keeps_what_it_inherited(reading, rows):
    """With the first two items of ``reading`` (rows 0 and 1 of ``rows``) held, fork a child: each side keeps its own.

    The child writes into its copy of the first item (the parent's must not
    change), the parent lets go of the second and reads on (so its slot
    takes other items), then the child looks at its copy of the second.
    """
    import gc
    import multiprocessing

    fork = multiprocessing.get_context("fork")
    first, second = next(reading), next(reading)
    ends = fork.Pipe()
    child = fork.Process(target=_write_then_look, args=(first, second, ends[1]))
    child.start()
    try:
        assert ends[0].recv() == "written"
        assert first.tolist() == rows[0].tolist()
        del second
        gc.collect()
        assert [int(x[0]) for x in reading] == [int(row[0]) for row in rows[2:]]
        ends[0].send("look")
        assert ends[0].recv() == rows[1].tolist()
    finally:
        child.join()
    assert child.exitcode == 0


def same(a, b):
    """Equal values of the same types, arrays of the same dtype and shape (nan equal to nan)."""
    assert type(a) is type(b), (a, b)
    if isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert np.array_equal(a, b, equal_nan=a.dtype.kind in "fc")
    elif isinstance(a, (tuple, list)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            same(x, y)
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for key in a:
            same(a[key], b[key])
    elif isinstance(a, (float, np.floating)) and a != a:
        assert b != b
    else:
        assert a == b


def running_lazyseq_threads():
    """lazyseq's threads still running, once those that end the consumers of a server closed by the garbage
    collector have ended (they end on their own a moment later: see ``lazyseq.serving.connection._end``)."""
    for thread in threading.enumerate():
        if thread.name == "lazyseq-connect-close":
            thread.join(30)
    return [thread for thread in threading.enumerate() if thread.name.startswith("lazyseq-")]
