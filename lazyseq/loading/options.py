"""The options every loader shares, checked once, in one place: :class:`LoaderOptions`.

Where an item is computed is decided here too, and nowhere else: an explicit
``method="process"`` runs the user's code in worker processes only, unless the
user opts into computing cheap items in the reader by giving ``inline_below``.
Thread loaders compute cheap items in the reader by default (same process,
same semantics), except with a ``start_hook``, whose state only the worker
threads have.
"""

from __future__ import annotations

import inspect
import multiprocessing
import os
import select
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, cast

from ..arguments import function, integer, seconds
from ..extras import require
from ..views.errors import LoaderFailure
from . import array_pickling

__all__ = [
    "INLINE_BELOW",
    "LoaderOptions",
    "Method",
    "StartMethod",
    "UnpicklablePipeline",
    "available_cores",
    "positive",
    "serialize",
    "serialize_work",
]

Method = Literal["thread", "process", "ray"]
StartMethod = Literal["fork", "forkserver", "spawn"]
StartHook = Callable[[int], Any] | Callable[[], Any]  # called with the worker's index, unless it takes no argument

METHODS = ("thread", "process", "ray")
INLINE_BELOW = 250e-6  # seconds: about what handing an item over from a worker thread costs on a small VM


def available_cores() -> int:
    """Cores this process may run on (its CPU affinity where the platform tells it)."""
    if hasattr(os, "process_cpu_count"):  # Python 3.13
        return os.process_cpu_count() or 1
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1


def positive(value: Any, name: str, owner: str) -> int:
    """``value`` as an int >= 1; errors name the option and its loader."""
    return integer(value, f"{owner}: {name}", low=1)


@dataclass(frozen=True)
class LoaderOptions:
    """How a loader's workers run, checked when the loader is made.

    ``inline_below`` is resolved here: seconds under which an item is computed
    by the reader itself (0: never).

    >>> options = LoaderOptions.check("prefetch", nworkers=2, method="process")
    >>> options.nworkers, options.method, options.inline_below
    (2, 'process', 0.0)
    >>> LoaderOptions.check("prefetch", nworkers=2).inline_below  # threads: cheap items stay in the reader
    0.00025
    >>> LoaderOptions.check("prefetch", nworkers=2, method="processes")
    Traceback (most recent call last):
    ...
    ValueError: prefetch: method must be 'thread', 'process' or 'ray', got 'processes'
    """

    owner: str
    nworkers: int
    method: Method
    start_hook: Callable[[int], Any] | None
    start_method: StartMethod | None
    blas_threads: int
    inline_below: float
    seed: int | None

    @classmethod
    def check(
        cls,
        owner: str,
        nworkers: int,
        method: Method = "thread",
        start_hook: StartHook | None = None,
        start_method: StartMethod | None = None,
        blas_threads: int | None = None,
        inline_below: float | None = None,
        seed: int | None = None,
    ) -> LoaderOptions:
        count = integer(nworkers, f"{owner}: nworkers")
        if count < 0:  # all available cores but -nworkers
            count = max(1, available_cores() + count)
        if method not in METHODS:
            raise ValueError(f"{owner}: method must be 'thread', 'process' or 'ray', got {method!r}")
        if method == "ray" and count > 0:
            require("ray", f"{owner}: method='ray'", "ray")
        if method == "process" and not hasattr(select, "poll"):  # Windows: no poll(), no descriptor passing
            raise NotImplementedError(f"{owner}: method='process' needs a POSIX system (Linux, macOS); use 'thread'")
        if start_method is not None:
            available = multiprocessing.get_all_start_methods()
            if start_method not in available:
                raise ValueError(f"{owner}: start_method must be one of {available} or None, got {start_method!r}")
            if method != "process":
                raise ValueError(f"{owner}: start_method only applies to method='process'")
        if start_hook is not None and method == "ray":
            raise ValueError(
                f"{owner}: start_hook does not apply to method='ray' (Ray tasks run in whatever worker process "
                "Ray picks, so no worker is started for it); prepare state lazily in the pipeline instead"
            )
        if start_hook is not None:
            function(start_hook, f"{owner}: start_hook")
        hook = None if start_hook is None else _called_with_the_index(start_hook)
        if blas_threads is None:  # the cores shared out between the workers
            blas = max(1, available_cores() // max(1, count))
        else:
            blas = positive(blas_threads, "blas_threads", owner)
        if seed is not None:
            seed = integer(seed, f"{owner}: seed", low=0, expected="a non-negative integer or None")
        where = _where(owner, method, hook, inline_below)
        if method == "process" and count:  # what starting the workers imports: now, not in the thread that reads
            from .process_workers import import_for_start

            import_for_start(multiprocessing.get_context(start_method).get_start_method())
        return cls(owner, count, method, hook, start_method, blas, where, seed)

    @property
    def pickles_pipeline(self) -> bool:
        """Whether workers get the pipeline pickled (not threads, nor forked processes, which inherit it)."""
        if self.method == "ray":
            return True
        return self.method == "process" and multiprocessing.get_context(self.start_method).get_start_method() != "fork"

    def check_sendable(self, job: Any) -> None:
        """:class:`UnpicklablePipeline` now, not once reading starts, where workers get ``job`` pickled and cannot."""
        if self.nworkers and self.pickles_pipeline:
            to = "Ray's workers" if self.method == "ray" else "worker processes"
            serialize_work(job, self.start_hook, self.owner, to)


class WithoutIndex:
    """A start hook that takes no argument (seqtools' kind), called with the worker's index left out."""

    __slots__ = ("hook",)

    def __init__(self, hook: Callable[[], Any]) -> None:
        self.hook = hook

    def __call__(self, worker_index: int) -> Any:
        return self.hook()


def _called_with_the_index(hook: StartHook) -> Callable[[int], Any]:
    """``hook``, or one that calls it without the worker's index if it takes no argument."""
    if _takes_an_argument(hook):
        return cast("Callable[[int], Any]", hook)
    return WithoutIndex(cast("Callable[[], Any]", hook))


def _takes_an_argument(hook: Callable) -> bool:
    """Whether ``hook`` is called with the worker's index: unless its signature takes no argument at all."""
    try:
        signature = inspect.signature(hook)
    except (TypeError, ValueError):  # no signature to read (some builtins): called as documented
        return True
    for args in ((0,), ()):
        try:
            signature.bind(*args)
        except TypeError:
            continue
        return bool(args)
    return True  # neither fits: the call with the index fails in the worker and says why


def _where(owner: str, method: str, start_hook: Callable[[int], Any] | None, inline_below: float | None) -> float:
    """The ``inline_below`` in force: the user's, or the default for ``method``."""
    if inline_below is None:
        return INLINE_BELOW if method == "thread" and start_hook is None else 0.0
    inline_below = seconds(inline_below, f"{owner}: inline_below", or_none=True)
    if inline_below and start_hook is not None:
        raise ValueError(
            f"{owner}: inline_below={inline_below!r} would compute items in the reader, where start_hook "
            "never ran; leave inline_below unset (or 0) with a start_hook"
        )
    return float(inline_below)


class UnpicklablePipeline(LoaderFailure, TypeError):
    """What a loader cannot send to its worker processes (raised as it is, not as an item's failure)."""


def serialize(obj: Any, what: str, owner: str, to: str = "worker processes") -> bytes:
    """``obj`` pickled for a worker process (cloudpickle where installed, so lambdas travel too).

    A failure names the innermost part of a pipeline that cannot be pickled,
    and where it was to go (``to``).
    """
    dumps, hint = _pickler()
    try:
        return dumps(obj)
    except Exception as error:
        culprit = _unpicklable_part(obj, dumps) or what
        raise UnpicklablePipeline(
            f"{owner}: cannot send {culprit} to {to}: {type(error).__name__}: {error}{hint}; "
            "use method='thread', or make it picklable"
        ) from error


def serialize_work(job: Any, start_hook: Callable | None, owner: str, to: str = "worker processes") -> bytes:
    """``(job, start_hook)`` pickled together for a worker process.

    cloudpickle sends the functions of the main script by value, with a copy
    of the script's globals for each pickling: pickled together, the hook and
    the pipeline share one copy in the worker, as they share the script's
    globals here (a hook that sets a global, a function that reads it). A
    failure names the part that cannot be pickled.
    """
    dumps, _ = _pickler()
    try:
        return dumps((job, start_hook))
    except Exception as error:
        failure = error
    # outside the except block: the error raised names the part, once, not after the same error of the whole
    serialize(job, "the pipeline", owner, to)
    serialize(start_hook, "start_hook", owner, to)
    raise failure


def _pickler() -> tuple[Callable[[Any], bytes], str]:
    """cloudpickle's ``dumps`` where installed, else pickle's, and what to say when it fails."""
    try:
        import cloudpickle  # noqa: F401

        return array_pickling.cloud_dumps, ""
    except ImportError:  # plain pickle: functions must then be importable by name
        return (
            array_pickling.dumps,
            " (installing cloudpickle, lazyseq[processes], lets lambdas and local functions travel)",
        )


def _unpicklable_part(obj: Any, dumps: Callable[[Any], bytes]) -> str | None:
    """The label of the innermost view of a pipeline that fails to pickle, if ``obj`` is a view."""
    from ..views.base import View

    target = getattr(obj, "view", obj)  # a job wraps the view it reads
    if not isinstance(target, View):
        return None
    for parent in target._parents:
        try:
            dumps(parent)
        except Exception:
            return _unpicklable_part(parent, dumps) or f"the {parent._label()} view"
    return f"the {target._label()} view"
