"""Worker processes, as seen from the consumer: tasks out over pipes, results back through shared slots.

The consumer's thread does the bookkeeping: it keeps the tasks it was given
in a backlog, sends each worker about ``QUEUED_SECONDS`` of work at a time (at
least two tasks: the one it computes and the next; with a free shared-memory
slot when there is one), and sends more whenever it collects results, so that
whichever worker is free first takes the next task: a worker that runs slower
(on a busier core, or given costlier items) gets fewer. Cheap tasks thus go
out several to a message. What the workers send back is read and decoded,
and a result in a slot made into its value (the slot leased, its arrays
built), by the consumer as it waits or, while it is away between reads, by a
thread of its own (:mod:`.message_reader`), which also watches the workers'
process sentinels, so a worker that dies is noticed at once.
"""

from __future__ import annotations

import functools
import importlib
import multiprocessing
import multiprocessing.util
import os
import sys
from collections.abc import Callable, Hashable, Iterable, Sequence, Sized
from multiprocessing.connection import wait
from multiprocessing.reduction import send_handle
from typing import Any, NamedTuple

import numpy as np

from ..views.errors import seterr
from .backends import Done
from .blas_limits import limits_for_workers
from .buffering import ITEMS_AHEAD
from .closing import blocked_for_children, interrupts_deferred, wait_unless_hurried
from .crash_reports import CrashReport
from .failures import LoaderError, WorkerDied, could_not_start, describe_items, exit_description, restore
from .fork_safety import forking_workers, started_worker
from .item_cost import ItemCost
from .jobs import Job
from .message_reader import EXITED, MessageReader, Unreadable
from .messages import (
    PickledResult,
    Ready,
    SharedResult,
    StartFailed,
    Stop,
    UseSlots,
    WorkerStart,
    decode,
    decode_alike,
    decode_shared,
    encode,
    encode_run,
    frame_header,
    is_alike,
    is_shared,
    write_all,
)
from .options import LoaderOptions, serialize_work
from .seeding import seeding_death
from .shared_counters import SharedCounters
from .shared_slots import SharedSlots, slot_bytes_for
from .structure import ONE_ARRAY, rebuild
from .task_queue import Backlog
from .worker_process import run_worker

__all__ = ["ProcessWorkers"]

STOP_SECONDS = 0.5  # grace for workers to finish their task after "stop", before SIGTERM
QUEUED_SECONDS = 0.002  # work each worker holds: the granularity with which the workers share the tasks
MIN_DEPTH = 2  # tasks a worker holds at least: the one it computes and the next, so that it never waits for one
TIME_FIRST, TIME_ONE_IN = 8, 4  # the results whose timings go to the estimate (see ProcessWorkers._timed)


def check_main_module(start_method: str, owner: str) -> None:
    """Refuse to start workers that would die at once: spawned ones re-run a main script they cannot read.

    Python's ``spawn`` and ``forkserver`` start each worker by running the main
    module again from its file; a script fed on standard input (``python - <
    script.py``) has none, and every worker would exit with code 1 before
    running anything.
    """
    main = sys.modules.get("__main__")
    if main is None or getattr(main, "__spec__", None) is not None:  # run with -m: imported by name
        return
    path = getattr(main, "__file__", None)
    if path is None:  # interactive or -c: nothing to re-run
        return
    original_dir = getattr(multiprocessing.process, "ORIGINAL_DIR", None)  # where Python started (not in the stubs)
    if not os.path.isabs(path) and original_dir is not None:
        path = os.path.join(original_dir, path)
    if not os.path.isfile(path):
        raise LoaderError(
            f"{owner}: worker processes started with {start_method!r} run the main module again from its file, "
            f"but it came from {main.__file__!r}, which is not a file they can read; save the script "
            "to a file, or use start_method='fork' or method='thread'"
        )


def _main_is_a_script() -> bool:
    """Whether the main module comes from a file (a script, or ``-m``), which ``spawn`` and ``forkserver`` run again."""
    return getattr(sys.modules.get("__main__"), "__file__", None) is not None


def _exiting() -> bool:
    """Whether multiprocessing's exit handler has begun (it stops every child process it knows of)."""
    return bool(getattr(multiprocessing.util, "_exiting", False))  # set first thing by util._exit_function


class _InSlots(NamedTuple):
    """Results read from their slots (one :class:`~.messages.SharedResult`, or :class:`~.messages.AlikeResults`)."""

    found: list[Done]  # their outcomes, whose arrays are views of their leased slots
    seconds: list[float]  # what each took in its worker


POPEN_MODULES = {
    "fork": "multiprocessing.popen_fork",
    "spawn": "multiprocessing.popen_spawn_posix",
    "forkserver": "multiprocessing.popen_forkserver",
}


def import_for_start(start_method: str) -> None:
    """Import what starting workers with ``start_method`` imports, in the thread that calls this.

    Loaders call it as they are made, so that the thread that first reads one
    (and starts its workers) imports nothing: an import under way in another
    thread as the program forks leaves the child that module's import lock
    held for ever, and the child's own workers would never start.
    """
    # Every worker seeds numpy's global generator first thing; numpy imports numpy.random at first use, which
    # takes 15-25 ms: imported once for the program, forked workers find it imported.
    import numpy.random  # noqa: F401

    importlib.import_module(POPEN_MODULES.get(start_method, POPEN_MODULES["spawn"]))
    if start_method != "fork":  # their workers' resources are tracked: the tracker is started with the first ones
        import multiprocessing.resource_tracker  # noqa: F401


class ProcessWorkers:
    """``options.nworkers`` worker processes computing ``job(arg)``, with ``slot_count`` shared slots for results.

    A :class:`~lazyseq.loading.backends.WorkerBackend`. ``slot_bytes=0`` sizes
    the slots from the first result that holds arrays; a ``slot_budget``
    (bytes) makes fewer slots of large results (but ``ITEMS_AHEAD + 2``).
    Worker ``k`` seeds its
    global random generators from ``seed`` and ``k`` (see :mod:`.seeding`). The
    seconds each result took in its worker go to ``cost``, where given (they
    also size the workers' share).
    """

    unsent: Sized  # the backlog's tasks: they go out as results are collected (poll)

    def __init__(
        self,
        job: Callable[[Any], Any],
        options: LoaderOptions,
        seed: int,
        slot_count: int,
        slot_bytes: int = 0,
        task_name: str = "task",
        cost: ItemCost | None = None,
        slot_budget: int = 0,
    ) -> None:
        owner = self._owner = options.owner
        self._cost = cost if cost is not None else ItemCost(0.0)  # 0: timings only, never "compute it here"
        # Where the reader decides from them whether to compute items itself, every timing counts (see _timed).
        self._time_all = cost is not None and cost.inline_below > 0
        self._task_name = task_name
        self._slot_count = slot_count
        self._slot_budget = slot_budget
        self._slots: SharedSlots | None = None
        self._reader: MessageReader | None = None
        self.closed = False
        if multiprocessing.current_process().daemon:
            raise LoaderError(
                f"{owner}: cannot start worker processes here: this is a worker process of another loader, and "
                "multiprocessing lets such processes have no children; give this loader method='thread' (or "
                "nworkers=0), or the other one method='thread'"
            )
        context = multiprocessing.get_context(options.start_method)
        # a forked worker seeds torch under a timer if torch was imported (see .seeding): what a death by it means
        self._seeds_torch_timed = context.get_start_method() == "fork" and "torch" in sys.modules
        self._runs_script = context.get_start_method() != "fork" and _main_is_a_script()  # again, in each worker
        import_for_start(context.get_start_method())  # (done as the loader was made, where options were checked)

        work: Any = (job, options.start_hook)
        if options.pickles_pipeline:
            check_main_module(context.get_start_method(), owner)
            work = serialize_work(job, options.start_hook, owner)
        elif isinstance(job, Job):  # a forked worker inherits the objects themselves, and what they made before
            job.before_fork()
        self._conns, self._processes = [], []
        self._crash_reports: list[CrashReport] = []  # where each worker reports a crash (see .crash_reports)
        # A spawned worker is a new Python; a forkserver's workers are forked from it (its own mask, which its other
        # children would inherit too: left alone)
        spawns = context.get_start_method() == "spawn"
        # task -> (its argument, its number among those sent to the worker), for the tasks sent to each worker and
        # not answered yet; the workers count the tasks they begin and finish in _progress (see worker_process._serve)
        self._busy: list[dict] = []
        self._sent_counts = [0] * options.nworkers
        with interrupts_deferred():  # a Ctrl-C as they are made: raised once they are (released when collected)
            self._progress = SharedCounters(2 * options.nworkers)
        self._backlog = Backlog()  # (task, arg) not sent yet, in order
        self.unsent = self._backlog.waiting
        self._started: set[int] = set()  # workers that said they are ready
        self._results = 0  # results received, timed or not (see _timed)
        try:
            with (
                interrupts_deferred(),  # a Ctrl-C in start(), after the fork, would leave that worker unknown here
                limits_for_workers(context.get_start_method(), options.blas_threads) as inherited,
                forking_workers(),
            ):
                for k in range(options.nworkers):
                    report = CrashReport()
                    self._crash_reports.append(report)
                    mine, theirs = context.Pipe(duplex=True)
                    process = context.Process(  # type: ignore[attr-defined]  # the stubs give it to subclasses only
                        target=run_worker,
                        args=(
                            theirs,
                            WorkerStart(
                                k, work, self._progress, options.blas_threads, inherited, seed, seterr(), os.getpid()
                            ),
                        ),
                        name=f"lazyseq-{owner}-{k}",
                        daemon=True,
                    )
                    if spawns:  # a new Python: Ctrl-C held back through its start-up (imports included)
                        with blocked_for_children():
                            process.start()
                    else:  # forked: inherits the deferring handler, and ignores Ctrl-C from its first line
                        process.start()
                    started_worker(process)
                    theirs.close()
                    self._conns.append(mine)
                    self._processes.append(process)
                    self._busy.append({})
                for conn, process, report in zip(self._conns, self._processes, self._crash_reports):
                    report.send(conn, process.pid)  # the first message a worker reads (once all started: see send)
        except LoaderError:
            self.close()
            raise
        except Exception as error:  # multiprocessing's (a forkserver that ended, no more processes): not an item's
            self.close()
            raise could_not_start(f"{owner}: worker process {len(self._processes)} could not start", error) from error
        except BaseException:
            self.close()
            raise
        try:
            with interrupts_deferred():  # a Ctrl-C as its pipe is made: raised once the reader is ours to close
                self._reader = MessageReader(
                    [conn.fileno() for conn in self._conns],
                    [p.sentinel for p in self._processes],
                    name=f"lazyseq-{owner}-reader",
                    decode=self._decode,
                )
        except BaseException:
            self.close()
            raise
        if slot_bytes:
            try:
                self._make_slots(slot_bytes)
            except BaseException:  # no memory for them: no worker is left running
                self.close()
                raise

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._processes]

    def submit_many(self, tasks: Sequence[tuple[Hashable, Any]]) -> None:
        """Queue ``(task, arg)`` pairs, and send what the workers have room for."""
        self._backlog.extend(tasks)
        self._dispatch()

    def _dispatch(self) -> None:
        """Send queued tasks to the least busy workers, topping up those down to half their share; one message each."""
        backlog, busy = self._backlog, self._busy
        if not backlog.waiting:
            return
        depth = self._depth()
        held = [len(tasks) for tasks in busy]
        if min(held) > depth // 2:  # every worker has enough: the common case, decided without a loop
            return
        plan: list[int] = []  # the worker of each task sent, in order
        chosen = [False] * len(held)
        for _ in range(len(backlog.waiting)):
            k = held.index(min(held))
            if held[k] >= depth or (not chosen[k] and held[k] > depth // 2):
                break
            chosen[k] = True
            held[k] += 1
            plan.append(k)
        tasks = backlog.take(len(plan))  # fewer if only cancelled ones were left
        slots = self._slots.take_many(len(tasks)) if self._slots is not None else [-1] * len(tasks)
        runs: dict[int, tuple[list, list]] = {}  # worker: its tasks and their slots
        for entry, slot, k in zip(tasks, slots, plan):
            run = runs.get(k)
            if run is None:
                run = runs[k] = ([], [])
            run[0].append(entry)
            run[1].append(slot)
        sent = self._sent_counts
        for k, (its_tasks, its_slots) in runs.items():
            its_busy = busy[k]
            for task, arg in its_tasks:
                sent[k] += 1
                its_busy[task] = (arg, sent[k])
            try:
                self._write(k, encode_run(its_tasks, its_slots))
            except OSError:  # the worker is gone: say so, not "broken pipe"
                self._died(k)

    def _write(self, k: int, data: bytes) -> None:
        """Write the message ``data`` to worker ``k``'s pipe, framed as the worker reads it."""
        write_all(self._conns[k].fileno(), frame_header(len(data)) + data)

    def _send(self, k: int, message: tuple) -> None:
        """Write ``message`` to worker ``k``'s pipe."""
        self._write(k, encode(message))

    def _depth(self) -> int:
        """How many tasks a worker should hold: about ``QUEUED_SECONDS`` of work, at least ``MIN_DEPTH``."""
        seconds = self._cost.estimate
        if seconds is None:  # nothing timed yet: as few as keep a worker busy
            return MIN_DEPTH
        return max(MIN_DEPTH, int(QUEUED_SECONDS / max(seconds, 1e-6)))

    def has_room(self, count: int) -> bool:
        """Whether ``count`` more tasks would each get a shared slot (or the slots do not exist yet)."""
        return self._slots is None or self._slots.free_count() - len(self._backlog) >= count

    def most_held(self) -> int | None:
        """The results the slots hold while the reader holds two items (None until the slots exist)."""
        return None if self._slots is None else self._slots.count - 2

    def cancel(self, task: Hashable) -> None:
        """Drop ``task`` if it is still queued here (a "skipped" result says so); one sent runs to the end."""
        self._backlog.cancel(task)

    def resume(self, task: Hashable) -> None:
        """Undo ``cancel``, unless the task was already skipped."""
        self._backlog.resume(task)

    def poll(self, timeout: float) -> list[Done]:
        """The results that have arrived, waiting up to ``timeout`` seconds for one; then the next tasks go out."""
        if self.closed:  # by another thread, while this one waited: the pipes are not ours now
            return []
        backlog = self._backlog
        found = backlog.take_skipped() if backlog.skipped else []
        reader = self._reader
        assert reader is not None, "poll() on workers that failed to start"
        exited = []
        for k, message in reader.take(0 if found else timeout):
            if type(message) is _InSlots:  # the common case first
                busy = self._busy[k]
                for done in message.found:
                    busy.pop(done.task, None)
                self._timed(message.seconds)
                found += message.found
            elif message is EXITED:
                exited.append(k)
            elif type(message) is Unreadable:
                self.close()
                raise LoaderError(f"{self._owner}: {message}") from message.__cause__
            else:
                self._receive(k, message, found)
        for k in exited:
            self._died(k)
        if backlog.waiting:
            self._dispatch()
        return found

    def fds(self) -> list[int]:
        """Descriptors that become readable when a result or a death is waiting."""
        return [] if self._reader is None else self._reader.fds()

    def _receive(self, k: int, message: Any, found: list[Done]) -> None:
        kind = type(message)
        if kind is Ready:
            self._started.add(k)
            return
        if kind is StartFailed:
            error = restore(message.error, f"worker process {k}")
            self.close()
            if message.stage == "start_hook":
                raise could_not_start(f"{self._owner}: start_hook failed in worker process {k}", error) from error
            raise could_not_start(
                f"{self._owner}: worker process {k} could not start: {message.stage} failed", error
            ) from error
        task, slot = message.task, message.slot
        self._busy[k].pop(task, None)
        if slot >= 0:
            assert self._slots is not None
            self._slots.give_back(slot)
        if kind is PickledResult:
            self._timed([message.seconds])
            if self._slots is None and message.array_bytes and self._slot_count:
                try:
                    self._make_slots(slot_bytes_for(message.array_bytes))
                except BaseException:  # no memory for them (NoSharedMemory): the loader cannot go on
                    self.close()
                    raise
            found.append(Done(task, "ok", message.result))
        else:  # TaskFailed
            where = f"worker process {k} (pid {self._processes[k].pid})"
            found.append(Done(task, "error", restore(message.error, where)))

    def _timed(self, seconds: list[float]) -> None:
        """Note the seconds that results took. Where they only size the workers' share: the first
        ``TIME_FIRST``, then about one in ``TIME_ONE_IN`` (a timing noted costs about as much as the rest of a
        cheap result's bookkeeping); where the reader decides from them whether to compute items itself, every one."""
        before = self._results
        self._results = after = before + len(seconds)
        if self._time_all or before < TIME_FIRST:
            for one in seconds:
                self._cost.add(one)
        elif before // TIME_ONE_IN != after // TIME_ONE_IN:
            self._cost.add(seconds[0])

    def _decode(self, k: int, raw: bytes) -> Any:
        """The message ``raw``; results in slots as the values they hold (read by :class:`.MessageReader`)."""
        numbers: Iterable[tuple[int, int, float]]  # each result's task, slot and seconds
        if is_alike(raw):  # the common case: batches of a view
            skeleton, layout, numbers = decode_alike(raw)
        else:
            if is_shared(raw):  # packed: an int task
                task, slot, skeleton, layout, took = decode_shared(raw)
            else:
                message = decode(raw)
                if type(message) is not SharedResult:
                    return message
                task, slot, skeleton, layout, took = message
            numbers = [(task, slot, took)]
        slots = self._slots
        assert slots is not None, "a result in a slot before the slots exist"  # they go to the workers after
        lease = slots.lease
        found, seconds = [], []
        if skeleton is ONE_ARRAY:  # one array a result: made without rebuilding a structure
            ((dtype, shape, offset),) = layout
            for task, slot, took in numbers:
                found.append(Done(task, "ok", np.ndarray(shape, dtype, buffer=lease(slot), offset=offset)))
                seconds.append(took)
        else:
            for task, slot, took in numbers:
                holder = lease(slot)
                value = rebuild(skeleton, [np.ndarray(s, d, buffer=holder, offset=o) for d, s, o in layout])
                found.append(Done(task, "ok", value))
                seconds.append(took)
        return _InSlots(found, seconds)

    def _make_slots(self, slot_bytes: int) -> None:
        count = self._slot_count
        if self._slot_budget and count * slot_bytes > self._slot_budget:  # as many as the budget allows
            count = max(ITEMS_AHEAD + 2, self._slot_budget // slot_bytes)
        # A Ctrl-C as the pool is made and handed over (a duplicate of its descriptor each time) is raised once
        # every worker has it, and the pool is ours to close
        with interrupts_deferred():
            self._slots = SharedSlots(count, slot_bytes, self._owner)
            for k, (conn, process) in enumerate(zip(self._conns, self._processes)):
                try:
                    self._send(k, UseSlots(count, slot_bytes))
                    send_handle(conn, self._slots.fd, process.pid)
                except OSError:  # it has ended (its pipe is broken): its death is reported as its end is read
                    pass

    def _died(self, k: int) -> None:
        if self.closed or _exiting():  # closed by another thread meanwhile, or by multiprocessing at exit: expected
            self.close()
            return
        try:
            said, message, held, suspects = self._death_of(k)
        except (ValueError, OSError):  # a process, counter or pipe closed under it: by another thread closing, expected
            if self._closed_meanwhile():
                return
            raise
        if said is not None:  # a start_hook that raised, say: why it ended
            self._receive(k, said, [])  # raises
        self.close()
        raise WorkerDied(message, held, suspects, while_starting=k not in self._started)

    def _closed_meanwhile(self) -> bool:
        """Whether close() was called, read anew (another thread may have called it since)."""
        return self.closed

    def _death_of(self, k: int) -> tuple[StartFailed | None, str, list, list]:
        """What worker ``k`` said as it ended without starting (if it did), else what to say of its death: the message,
        the tasks it held and those it was computing."""
        process = self._processes[k]
        process.join(STOP_SECONDS)  # the sentinel fires as it exits, a moment before its exit code is known
        if k not in self._started:
            said = self._start_failure(k)
            if said is not None:
                return said, "", [], []
        busy = self._busy[k]
        began, finished = self._progress[2 * k], self._progress[2 * k + 1]
        # the last task it began is what it was in, unless it finished it (its result not sent yet)
        suspects = [task for task, (_, number) in busy.items() if number == began] if finished < began else []
        doing = ""
        if suspects:
            doing = f" while computing {describe_items(self._task_name, ((t, busy[t][0]) for t in suspects))}"
        elif busy:
            unsent = describe_items(self._task_name, ((task, arg) for task, (arg, _) in busy.items()))
            doing = f" between two tasks, with {unsent} not sent back"
        if k not in self._started:  # before our code ran, or while unpickling the pipeline or running start_hook
            doing = (
                " while starting, before it could compute anything; what it printed (the cause, usually a "
                "traceback) went to the standard error of this process"
            )
            if self._runs_script:
                doing += (
                    "; each worker runs the main script again as it starts: a script that makes its loaders outside "
                    '`if __name__ == "__main__":` ends them so'
                )
            seeding = seeding_death(process.exitcode) if self._seeds_torch_timed else None
            if seeding is not None:
                doing = f" while starting: {seeding}"
        message = (
            f"{self._owner}: worker process {k} (pid {process.pid}) died with "
            f"{exit_description(process.exitcode)}{doing}"
        )
        crash = self._crash_reports[k].text()  # (made before its process)
        if crash:  # a fatal signal that Python saw: what it said, and where the worker was
            message += f"; as it crashed, its Python reported:\n{crash}"
        elif k in self._started and (process.exitcode or 0) > 0:  # it ended itself: os._exit, a C library's exit()
            message += (
                "; what it printed as it ended (the reason, usually) went to the standard error of the process that "
                "started it (for a notebook, the terminal that runs Jupyter)"
            )
        return None, message, list(busy), suspects

    def _start_failure(self, k: int) -> StartFailed | None:
        """What worker ``k`` said before it ended without starting (a start_hook that raised), if it said it.

        A task sent to it as it ended finds its pipe closed before the reader
        has read its last message: that message says why, not the death.
        """
        if self._reader is None:
            return None
        for j, message in self._reader.take(0.0):  # the workers are stopped next: the others' results do not matter
            if j == k and type(message) is StartFailed:
                return message
            if type(message) is Ready:  # (unread until its death was noticed: it had started)
                self._started.add(j)
        return None

    def close(self) -> None:
        """Stop every worker: ask, then SIGTERM, then SIGKILL; release the slots."""
        # A second Ctrl-C (or the first, in a close the workers began on their own) waits for the end (see .closing)
        with interrupts_deferred():
            if self.closed:
                return
            self.closed = True
            if self._reader is not None:
                self._reader.close()
            for k in range(len(self._conns)):
                try:
                    self._send(k, Stop())
                except OSError:  # the worker is gone already
                    pass
            running = [p.sentinel for p in self._processes if p.is_alive()]

            def ended(timeout: float) -> bool:
                for sentinel in wait(running, timeout):
                    running.remove(sentinel)
                return not running

            if running:
                wait_unless_hurried(ended, STOP_SECONDS)  # a second Ctrl-C: terminated at once (see .closing)
            for process in self._processes:
                if process.is_alive():
                    process.terminate()
                    wait_unless_hurried(functools.partial(_joined, process), STOP_SECONDS)
                if process.is_alive():
                    process.kill()
                    process.join()
                if not _exiting():  # multiprocessing's exit handler joins the children it listed: one closed breaks it
                    process.close()
            for conn in self._conns:
                conn.close()
            for report in self._crash_reports:
                report.close()
            if self._slots is not None:
                self._slots.close()
            self._progress.close()


def _joined(process: multiprocessing.process.BaseProcess, timeout: float) -> bool:
    """Whether ``process`` ended within ``timeout`` seconds."""
    process.join(timeout)
    return not process.is_alive()
