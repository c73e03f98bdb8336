"""How failures inside a pipeline reach the user.

An exception raised while an item is computed is re-raised at the public
boundary (indexing, iteration) as :class:`EvaluationError`, whose message names
the item and the chain of views it went through. The chain is read from the
traceback *after* the failure, so the success path pays nothing for it.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any, Literal, NoReturn

__all__ = ["EvaluationError", "seterr"]

ErrorMode = Literal["wrap", "passthrough"]
_MODES = ("wrap", "passthrough")
_mode: ErrorMode = "wrap"

# Frames of these methods, whose ``self`` is a view, make up the chain. By
# convention their local ``i`` is always an index into ``self``.
_TRACED_METHODS = frozenset({"_get", "_get_many", "_iter", "_set"})

# An exception computed in another process carries the chain seen there under this attribute.
REMOTE_CHAIN = "__lazyseq_remote_chain__"


class EvaluationError(Exception):
    """An item of a view could not be computed.

    The message names the item and the views it went through, outermost first;
    the original exception is the ``__cause__``.

    >>> import lazyseq
    >>> def inverse(x):
    ...     return 1 / x
    >>> v = lazyseq.smap(inverse, [1, 0, 2])
    >>> v[1]
    Traceback (most recent call last):
    ...
    lazyseq.EvaluationError: failed to compute smap(inverse)[1]: ZeroDivisionError: division by zero
    """


def seterr(evaluation: ErrorMode | None = None) -> ErrorMode:
    """Choose how errors raised while computing items propagate; return the previous setting.

    ``"wrap"`` (the default) raises :class:`EvaluationError` with the original
    error as its cause. ``"passthrough"`` re-raises the original exception
    itself, with the chain of views added as a note; it is handy under a
    debugger. ``None`` changes nothing. The setting is process-wide.

    >>> import lazyseq
    >>> previous = lazyseq.seterr("passthrough")
    >>> try:
    ...     lazyseq.smap(int, ["x"])[0]
    ... except ValueError as error:
    ...     print(error, *error.__notes__, sep="\\n")
    invalid literal for int() with base 10: 'x'
    while computing smap(int)[0]
    >>> lazyseq.seterr(previous)
    'passthrough'
    """
    global _mode
    previous = _mode
    if evaluation is not None:
        if evaluation not in _MODES:
            raise ValueError(f"seterr: evaluation must be one of {_MODES} or None, got {evaluation!r}")
        _mode = evaluation
    return previous


def reraise(error: Exception) -> NoReturn:
    """Raise ``error`` (caught at a public boundary) the way :func:`seterr` says."""
    if isinstance(error, (EndOfData, LoaderFailure)):
        raise error
    chain = chain_of(error)
    if _mode == "passthrough":
        if chain:
            error.add_note(f"while computing {chain}")
        raise error
    where = chain or "an item"
    raised = item_failure(error)
    if isinstance(raised, EvaluationError) and chain and str(raised).startswith(_FAILED):
        # The item's own code read another view, whose item failed: one chain, down to the first failure.
        cause = raised.__cause__ if raised.__cause__ is not None else error  # (none: a worker process's, restored)
        raise EvaluationError(f"{_FAILED}{chain} -> {str(raised).removeprefix(_FAILED)}") from cause
    raise EvaluationError(f"{_FAILED}{where}: {type(raised).__name__}: {message_of(raised)}") from raised


_FAILED = "failed to compute "


def item_failure(error: BaseException) -> BaseException:
    """What an item raised: a ``StopIteration`` that a generator over the items turned into a ``RuntimeError``.

    >>> def items():  # a generator over the items, as lazyseq's own are
    ...     yield next(iter([]))  # an item that raises StopIteration
    >>> try:
    ...     list(items())
    ... except RuntimeError as error:
    ...     wrapped = error
    >>> type(wrapped.__cause__).__name__, type(item_failure(wrapped)).__name__, type(item_failure(ValueError())).__name__
    ('StopIteration', 'StopIteration', 'ValueError')
    """
    cause = error.__cause__
    if type(error) is RuntimeError and isinstance(cause, StopIteration) and "raised StopIteration" in str(error):
        # Python's own wrapping (PEP 479), by a generator of lazyseq's over the items (not one of an item's code)
        tb = error.__traceback__
        while tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
        if tb is not None and tb.tb_frame.f_globals.get("__name__", "").startswith("lazyseq."):
            return cause
    return error


def chain_of(error: BaseException) -> str:
    """The chain of views that ``error`` went through, where it was raised (another process's included)."""
    return traced_chain(item_failure(error))


def traced_chain(error: BaseException) -> str:
    """The chain of views in ``error``'s traceback, followed by the one it went through in another process, if any.

    What travels to another process with an error, so that the chain goes on there.
    """
    return " -> ".join(part for part in (describe_chain(error.__traceback__), getattr(error, REMOTE_CHAIN, "")) if part)


def message_of(error: BaseException) -> str:
    """``str(error)``, or what says it failed: an exception's own ``__str__`` may raise.

    >>> class Odd(Exception):
    ...     def __str__(self):
    ...         raise RuntimeError("no")
    >>> message_of(Odd()), message_of(ValueError("bad row"))
    ('<str() of Odd failed: RuntimeError: no>', 'bad row')
    """
    try:
        return str(error)
    except Exception as failure:
        return f"<str() of {type(error).__name__} failed: {type(failure).__name__}: {failure}>"


def named(error: BaseException) -> str:
    """``error`` in one line, its type first (a ``RemoteError``'s message begins with the type it stands for).

    >>> named(ValueError("bad row"))
    'ValueError: bad row'
    """
    said = message_of(error)
    return said if hasattr(error, "type_name") else f"{type(error).__name__}: {said}"


def describe_chain(tb: TracebackType | None) -> str:
    """``batch[12] -> gather[768] -> smap(f)[4021]`` from the frames of a traceback."""
    from .base import View  # here, not at the top: base imports this module

    steps: list[tuple[View, dict]] = []
    while tb is not None:
        frame = tb.tb_frame
        if frame.f_code.co_name in _TRACED_METHODS:
            local_vars = frame.f_locals
            owner = local_vars.get("self")
            if isinstance(owner, View):
                steps.append((owner, local_vars))
        tb = tb.tb_next
    parts: list[str] = []
    inner: tuple[View, int] | None = None
    for owner, local_vars in reversed(steps):
        index = local_vars.get("i")
        if index is None and inner is not None:
            if inner[0] is owner:  # the same view, reading many items through its own _get (or again)
                continue
            index = _find_source_index(owner, local_vars.get("idx"), inner)
        if parts and index is not None and (owner, index) == inner:
            continue  # the same item seen from two methods of one view
        parts.append(f"{owner._label()}[{index if index is not None else '?'}]")
        inner = (owner, int(index)) if index is not None else None
    return " -> ".join(reversed(parts))


def describe_origin(view: Any, i: int, steps: int = 5) -> str:
    """``concatenate[4] -> part 1: smap(g)[0]``: where item ``i`` of ``view`` is read from.

    The path follows views whose item comes from one parent item, and says
    which parent when a view has several; at most ``steps`` views.
    """
    parts: list[str] = []
    which = ""
    while True:
        parts.append(f"{which}{view._label()}[{i}]")
        sources = view._sources(i)
        if len(sources) != 1 or len(parts) == steps:
            return " -> ".join(parts)
        parent, i = sources[0]
        which = f"part {view._parents.index(parent)}: " if len(view._parents) > 1 else ""
        view = parent


def _find_source_index(owner: Any, idx: Any, inner: tuple[Any, int] | None) -> int | None:
    """Which of the indexes ``owner`` was asked for reads item ``inner`` of a parent."""
    if idx is None:
        return None
    for i in idx:
        i = int(i)
        if inner in owner._sources(i):
            return i
    return None


EvaluationError.__module__ = "lazyseq"  # where users import it from


class EndOfData(IndexError):
    """An index past the end of a view whose length was not known in advance (``uniter``).

    It is an ``IndexError`` and is never wrapped into :class:`EvaluationError`.
    """


class LoaderFailure(Exception):
    """Base of the errors of a loader itself (not of an item): never wrapped into :class:`EvaluationError`."""
