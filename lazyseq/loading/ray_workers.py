"""Ray tasks as workers: a loader's items computed on the nodes of a Ray cluster.

A :class:`~lazyseq.loading.backends.WorkerBackend` (see that module for the
protocol). The pipeline is put in Ray's object store once; a Ray worker
process loads it at its first task for that loader and keeps it for the next
ones. At most ``nworkers`` Ray tasks are in flight, each computing a run of
the loader's tasks: about 50 ms of work (one at first, then as many as the
timings of the first ones say, see :func:`.buffering.run_length`), since a
Ray task costs milliseconds to send and collect. The others wait here and go
out as results are collected, so tasks not sent yet can still be dropped
when reads jump elsewhere. Each Ray task seeds its worker's global random generators from the
loader's seed and its own number (see :mod:`.seeding`): no two draw the same
numbers, and a Ray task run again draws what it drew the first time.

A Ray task whose worker or node dies is run again by Ray, on another node if
need be (up to ``RETRIES`` times), and its results still arrive once. An
exception in the pipeline comes back as a value, with the worker's traceback
text; a Ray task that cannot complete (its worker crashed every time) closes
the loader with :class:`~lazyseq.WorkerDied`.

Results are looked for with ``ray.wait`` (a few microseconds): no code of
lazyseq runs in Ray's own threads, see :mod:`.ray_watch` for why, and for
the thread that writes to the pipe of :meth:`RayWorkers.fds`. A reader with
nothing to take waits with ``ray.wait`` too: in the main thread of a Ray
task, Ray lends the task's CPU to others meanwhile (a loader in tasks that
hold every CPU would otherwise never run). Ray lends nothing from an actor
(Ray Train workers, Tune trials).
"""

from __future__ import annotations

import functools
import os
import pickle
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence, Sized
from time import monotonic, perf_counter
from typing import Any, NamedTuple

import numpy as np
import ray
from ray.exceptions import NodeDiedError, RayTaskError, TaskCancelledError, WorkerCrashedError

from ..views.errors import ErrorMode, seterr
from .backends import Done
from .buffering import run_length
from .closing import interrupts_deferred, wait_unless_hurried
from .failures import LoaderError, SessionEnded, WorkerDied, capture, describe_items, restore
from .item_cost import ItemCost
from .messages import CapturedError
from .options import LoaderOptions, UnpicklablePipeline, serialize
from .ray_watch import CompletionWatch, completed
from .result_signal import ResultSignal
from .seeding import seed_this_worker
from .structure import flatten, rebuild
from .task_queue import Backlog

__all__ = ["RayWorkers", "connect_to_ray"]

RETRIES = 3  # runs of a Ray task after the first, when its worker or node dies
CANCEL_AFTER_SECONDS = 1.0  # close() waits until the youngest Ray task in flight is this old, then cancels
PIPELINES_KEPT = 4  # pipelines a Ray worker process keeps loaded (those of the loaders it served last)

Outcome = tuple[str, Any, Any]  # ("ok", value, seconds), ("error", CapturedError, where), ("load_failed", ...)


def _load_hint(type_name: str) -> str:
    """What to check when a node could not unpickle the pipeline, from the name of the exception it raised.

    >>> _load_hint("ModuleNotFoundError")[:40]
    'every node needs the modules the pipelin'
    >>> _load_hint("FileNotFoundError")[:40]
    'every node must see the files the pipeli'
    """
    name = type_name.rsplit(".", 1)[-1]
    modules = "every node needs the modules the pipeline uses (installed there, or sent with ray.init(runtime_env=...))"
    files = "every node must see the files the pipeline memory-maps, at the same paths (a shared filesystem)"
    if name in ("ModuleNotFoundError", "ImportError", "AttributeError"):
        return modules
    if name in ("FileNotFoundError", "PermissionError", "IsADirectoryError", "NotADirectoryError", "OSError"):
        return files
    return f"{modules}, and {files}"


class InFlight(NamedTuple):
    """A Ray task sent: the reference to its results, the loader's tasks it computes, their arguments, and when."""

    ref: ray.ObjectRef
    tasks: list[Hashable]
    args: list
    sent: float  # time.monotonic()


def _session() -> tuple[str | None, str | None, str | None]:
    """What tells this process's Ray session from a later one: its cluster's address, node and job (one per
    connection of a driver, even to the same cluster)."""
    context = ray.get_runtime_context()
    return context.gcs_address, context.get_node_id(), context.get_job_id()


def connect_to_ray(owner: str) -> None:
    """Connect this process to Ray unless it is: ``ray.init()`` joins ``RAY_ADDRESS``, or starts a local Ray."""
    if ray.is_initialized():
        return
    try:
        ray.init()
    except Exception as error:
        raise LoaderError(
            f"{owner}: could not connect to Ray: {type(error).__name__}: {error}; call ray.init(address=...) "
            "before making the loader, or set RAY_ADDRESS"
        ) from error
    except BaseException:  # a Ctrl-C as a local Ray starts: what it started so far goes too (its agents outlived it)
        ray.shutdown()
        raise


class RayWorkers:
    """At most ``options.nworkers`` Ray tasks in flight, computing ``job(arg)`` on the nodes of the cluster.

    The seconds each result took go to ``cost``, where given (they also size
    the runs of tasks sent together).
    """

    unsent: Sized  # the backlog's tasks: they go out as results are collected

    def __init__(
        self, job: Callable[[Any], Any], options: LoaderOptions, seed: int, task_name: str, cost: ItemCost | None
    ) -> None:
        owner = self._owner = options.owner
        self._task_name = task_name
        self._cost = cost if cost is not None else ItemCost(0.0)  # 0: timings only, never "compute it here"
        self._seed = seed
        self._capacity = options.nworkers
        self.closed = False
        connect_to_ray(owner)
        self._session = _session()  # the tasks, results and pipeline sent live in it
        try:
            self._job = ray.put(job)
        except Exception as error:
            serialize(job, "the pipeline", owner, "Ray's workers")  # names the view that fails, where cloudpickle does
            raise UnpicklablePipeline(
                f"{owner}: cannot send the pipeline to Ray: {type(error).__name__}: {error}"
            ) from error
        self._remote = _run_remotely.options(max_retries=RETRIES, retry_exceptions=False, scheduling_strategy="SPREAD")
        self._sent = 0  # Ray tasks sent so far: the next one's number
        self._backlog = Backlog()  # not sent yet, in order
        self.unsent = self._backlog.waiting
        self.running: dict[ray.ObjectRef, InFlight] = {}  # in flight, in the order sent
        # the tasks of a run whose worker died every time, sent again one per Ray task: only the one at fault fails
        self._alone: list[tuple[Hashable, Any]] = []
        self._signal = ResultSignal()  # readable as Ray tasks complete, once fds() was asked for
        self._watch: CompletionWatch | None = None  # the thread that writes to it

    def submit_many(self, tasks: Sequence[tuple[Hashable, Any]]) -> None:
        """Queue ``(task, arg)`` pairs, and send what fits in ``nworkers`` Ray tasks in flight."""
        self._check_session()
        self._backlog.extend(tasks)
        self._dispatch()

    def _dispatch(self) -> None:
        backlog, running, alone = self._backlog, self.running, self._alone
        while alone and len(running) < self._capacity and not self.closed:
            task, arg = alone.pop(0)
            self._send([task], [arg])
        while backlog and len(running) < self._capacity and not self.closed:
            free = self._capacity - len(running)
            count = min(run_length(self._cost.estimate), -(-len(backlog) // free))  # a share for each free slot
            tasks: list[Hashable] = []
            args: list = []
            while len(tasks) < count:
                entry = backlog.next()
                if entry is None:
                    break
                task, arg = entry
                tasks.append(task)
                args.append(arg)
            if tasks:
                self._send(tasks, args)

    def _send(self, tasks: list[Hashable], args: list) -> None:
        """One Ray task computing ``tasks``, in order."""
        ref = self._remote.remote((self._job,), args, self._seed, self._sent, seterr())
        self.running[ref] = InFlight(ref, tasks, args, monotonic())
        if self._watch is not None:
            self._watch.watch([ref])
        self._sent += 1

    def has_room(self, count: int) -> bool:
        return True  # results come back through Ray's object store: no slots to run out of

    def most_held(self) -> int | None:
        return None

    def cancel(self, task: Hashable) -> None:
        """Drop ``task`` if it is not sent yet (a "skipped" result says so); one in flight runs to the end."""
        self._backlog.cancel(task)

    def resume(self, task: Hashable) -> None:
        """Undo ``cancel``, unless the task was already skipped."""
        self._backlog.resume(task)

    def fds(self) -> list[int]:
        """A pipe that a byte is written to as each Ray task completes (made at the first call)."""
        fds = self._signal.fds()
        if self._watch is None and not self.closed:
            self._watch = CompletionWatch(self._signal, f"lazyseq-{self._owner}-ray-watch", self._session_lasts)
            self._watch.watch(list(self.running))
        if self.closed and self._watch is not None:  # by another thread, perhaps before it saw the watch
            self._watch.close()
        return fds

    def poll(self, timeout: float) -> list[Done]:
        """The results that have arrived, waiting up to ``timeout`` seconds for one; then the next tasks go out."""
        found = self._backlog.take_skipped()
        if self.closed:
            return found
        self._check_session()
        self._signal.clear()  # before looking: a Ray task completing after this writes again
        self._dispatch()
        refs = list(self.running)  # in the order sent
        if refs:
            arrived = completed(refs, here=True)
            if not arrived and not found and timeout > 0:  # inside a Ray task, Ray lends its CPU to others meanwhile
                arrived = set(ray.wait(refs, num_returns=1, timeout=timeout)[0])
            for ref in refs:
                if ref in arrived:
                    self._receive(ref, found)
        self._dispatch()
        return found

    def _session_lasts(self) -> bool:
        """Whether the Ray session the tasks were sent in is this process's still."""
        return ray.is_initialized() and _session() == self._session

    def _check_session(self) -> None:
        """``LoaderError`` (the workers closed) if the Ray session they ran in ended: its tasks never finish."""
        if self._session_lasts():
            return
        self.close()
        raise SessionEnded(
            f"{self._owner}: the Ray session its tasks ran in has ended (ray.shutdown(), then perhaps another "
            "ray.init()); read again to start them in the current one"
        )

    def _receive(self, ref: ray.ObjectRef, found: list[Done]) -> None:
        """Take the results of the Ray task ``ref`` (it has completed) into ``found``."""
        outcomes: list[Outcome] = []
        error: Exception | None = None
        try:  # before it leaves ``running``: cut short by an interrupt, it is taken at the next poll
            outcomes = ray.get(ref)
        except Exception as raised:  # a Ray task that failed as a whole: Ray's exception says how
            error = raised
        entry = self.running.pop(ref, None)
        if entry is None:  # closed by another thread meanwhile: nobody waits for it
            return
        if self._watch is not None:
            self._watch.forget(ref)
        tasks, args = entry.tasks, entry.args
        if isinstance(error, TaskCancelledError):
            found.extend(Done(task, "skipped", None) for task in tasks)
            return
        # The items' own errors come back as outcomes: a task that failed as a whole could not send them back (a
        # result Ray cannot pickle), or its worker died every time (an item that ends it). One of the items is at
        # fault: each is sent again alone, and only that one fails.
        cause = error.cause if isinstance(error, RayTaskError) else None
        if _function_not_loaded(cause):  # no task of this loader can run there
            self.close()
            node = getattr(error, "ip", None)
            raise LoaderError(
                f"{self._owner}: a Ray worker{f' on {node}' if node else ''} could not load lazyseq's task ({cause}); "
                "every node needs lazyseq and the modules the pipeline imports, installed or sent with "
                "ray.init(runtime_env=...)"
            ) from error
        if (cause is not None or isinstance(error, (WorkerCrashedError, NodeDiedError))) and len(tasks) > 1:
            self._alone.extend(zip(tasks, args))
            return
        if cause is not None:
            failure = TypeError(f"the result cannot be sent from the Ray worker: {type(cause).__name__}: {cause}")
            found.append(Done(tasks[0], "error", failure))
            return
        if isinstance(error, (WorkerCrashedError, NodeDiedError)):
            self.close()
            raise WorkerDied(
                f"{self._owner}: the Ray worker computing {describe_items(self._task_name, zip(tasks, args))} died "
                f"{RETRIES + 1} times; the last time: {type(error).__name__}: {error}",
                tasks,
            ) from error
        if error is not None:
            self.close()
            raise LoaderError(
                f"{self._owner}: Ray could not compute {describe_items(self._task_name, zip(tasks, args))}: "
                f"{type(error).__name__}: {error}"
            ) from error
        if outcomes[0][0] == "load_failed":  # no task can run where the pipeline cannot be loaded
            _, captured, where = outcomes[0]
            self.close()
            raise LoaderError(
                f"{self._owner}: {where} could not load the pipeline ({captured.type_name}: "
                f"{captured.message}); {_load_hint(captured.type_name)}"
            ) from restore(captured, where)
        for task, (status, value, detail) in zip(tasks, outcomes):
            if status == "ok":
                self._cost.add(detail)  # the seconds it took
                found.append(Done(task, "ok", _writable(value)))
            elif status == "skipped":  # after an interrupt in the run: computed again
                found.append(Done(task, "skipped", None))
            else:
                found.append(Done(task, "error", restore(value, detail)))  # detail: where it was raised

    def close(self) -> None:
        """Forget every task; cancel those in flight (a running one gets KeyboardInterrupt) once a second old."""
        if self.closed:
            return
        with interrupts_deferred():  # a Ctrl-C cuts the wait short (see .closing), and is raised once all is released
            self.closed = True
            running, self.running = self.running, {}
            self._backlog.clear()
            self._alone.clear()
            try:
                if running and self._session_lasts():  # at interpreter exit, Ray may have shut down first
                    _cancel(running)
            finally:  # even when a program's own SIGINT handler raises in the wait
                del self._job  # the pipeline leaves the object store once no Ray task refers to it
                if self._watch is not None:
                    self._watch.close()
                self._signal.close()


def _cancel(running: dict[ray.ObjectRef, InFlight]) -> None:
    """Cancel the Ray tasks of ``running``, once the youngest is ``CANCEL_AFTER_SECONDS`` old, that have not completed.

    Ray 2.60 may abort the process when it cancels a Ray task as its results
    arrive, which a young one is likely to do: they get until then to
    complete (unless a Ctrl-C hurries the close). Interrupted, the wait
    cancels them all.
    """
    refs = list(running)
    youngest = max(entry.sent for entry in running.values())
    done: set[ray.ObjectRef] = set()
    try:
        wait_unless_hurried(functools.partial(_all_completed, refs), youngest + CANCEL_AFTER_SECONDS - monotonic())
        done = completed(refs)
    except Exception:  # its owner is going away
        pass
    finally:
        for ref in refs:
            if ref not in done:
                try:
                    ray.cancel(ref)
                except Exception:  # finished already, or its owner is going away
                    pass


def _all_completed(refs: list[ray.ObjectRef], timeout: float) -> bool:
    """Whether every Ray task of ``refs`` completes within ``timeout`` seconds."""
    return len(completed(refs, timeout)) == len(refs)


def _function_not_loaded(cause: BaseException | None) -> bool:
    """Whether ``cause`` is Ray's report that a worker could not import the task's function (lazyseq missing there).

    >>> _function_not_loaded(RuntimeError("The remote function failed to import on the worker. This may be ..."))
    True
    >>> _function_not_loaded(TypeError("cannot pickle '_thread.lock' object"))  # a result Ray cannot send back
    False
    """
    return isinstance(cause, RuntimeError) and "failed to import on the worker" in str(cause)  # Ray's own words


def _writable(value: Any) -> Any:
    """``value`` with arrays of its own: Ray hands arrays over read-only, in its object store."""
    arrays: list = []
    skeleton = flatten(value, arrays)
    if not any(isinstance(a, np.ndarray) and not a.flags.writeable for a in arrays):
        return value
    copies = [a.copy() if isinstance(a, np.ndarray) and not a.flags.writeable else a for a in arrays]
    return rebuild(skeleton, copies)


# -- in the Ray worker process -----------------------------------------------------

_loaded: OrderedDict[str, Callable[[Any], Any]] = OrderedDict()  # pipelines by object id, the latest last


def _pipeline(ref: ray.ObjectRef) -> Callable[[Any], Any]:
    key = ref.hex()
    job = _loaded.get(key)
    if job is None:
        job = _loaded[key] = ray.get(ref)
        if len(_loaded) > PIPELINES_KEPT:
            _loaded.popitem(last=False)
    else:
        _loaded.move_to_end(key)
    return job


@ray.remote
def _run_remotely(
    holder: tuple[ray.ObjectRef], args: list, seed: int, number: int, error_mode: ErrorMode
) -> list[Outcome]:
    """The outcome of ``job(arg)`` for each of ``args``, in order; ``number`` counts the loader's Ray tasks.

    The pipeline's reference comes in a tuple, so that Ray hands it over as
    it is instead of loading the pipeline anew for each Ray task. Errors read
    inside the pipeline propagate as the consumer's ``seterr`` says.
    """
    seterr(error_mode)
    try:
        job = _pipeline(holder[0])
    except Exception as error:
        # Ray reports a pipeline it could not unpickle as a RaySystemError around the exception unpickling raised
        cause = getattr(error, "client_exc", None)
        return [("load_failed", _captured(cause if isinstance(cause, Exception) else error), _where())]
    seed_this_worker(seed, number)
    outcomes: list[Outcome] = []
    for arg in args:
        began = perf_counter()
        try:
            value = job(arg)
        except KeyboardInterrupt as error:
            if _cancelled():  # Ray's way of cancelling this task (close()): it is reported as cancelled
                raise
            # the pipeline's own: its item fails, and the rest of the run is computed again (Ray may cancel too)
            outcomes.append(("error", _captured(error), _where()))
            outcomes.extend(("skipped", None, 0.0) for _ in args[len(outcomes) :])
            break
        except BaseException as error:  # SystemExit from a library's sys.exit, say: this item's failure alone
            outcomes.append(("error", _captured(error), _where()))
            continue
        outcomes.append(("ok", value, perf_counter() - began))
        del value
    return outcomes


def _cancelled() -> bool:
    """Whether Ray was asked to cancel the task that runs this (an interrupt is how a running one hears it)."""
    try:
        return bool(ray.get_runtime_context().is_canceled())
    except Exception:  # a Ray that cannot say: taken as cancelled, as Ray would report it
        return True


def _captured(error: BaseException) -> CapturedError:
    if isinstance(error, ray.exceptions.RayError) and error.__cause__ is not None:  # what ray.get wrapped
        return capture(error.__cause__, pickle.dumps)
    return capture(error, pickle.dumps)


def _where() -> str:
    return f"a Ray worker on node {ray.util.get_node_ip_address()} (pid {os.getpid()})"
