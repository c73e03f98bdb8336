"""Errors of a data server and its consumers, and how an item's failure travels as text."""

from __future__ import annotations

import traceback
from typing import Any

from ..loading.failures import LoaderError, RemoteError
from ..views.errors import REMOTE_CHAIN, EndOfData, message_of, traced_chain

__all__ = ["ServerLost", "failure_header", "restore_failure", "unsendable_header"]


class ServerLost(LoaderError):
    """A data server stopped answering for longer than the consumer's ``timeout``.

    The message names the address and what the consumer was waiting for; if
    the server said it was closing (its ``close()``: the end of its program,
    Ctrl-C, SIGTERM) and none answered there since, it says so too.

    >>> import lazyseq
    >>> issubclass(lazyseq.ServerLost, lazyseq.LoaderError)
    True
    """


ServerLost.__module__ = "lazyseq"


def failure_header(error: BaseException) -> dict[str, Any]:
    """What a consumer needs to know of ``error``, raised while computing an item: text only.

    It never raises: an error whose own ``__str__`` raises is described all
    the same, and one that cannot be described at all (its notes not a list,
    its ``__str__`` raising what cannot be printed either) by its type, so that
    its item is answered.

    >>> class Odd(Exception):
    ...     def __str__(self):
    ...         raise RuntimeError("no")
    >>> failure_header(Odd())["message"]
    '<str() of Odd failed: RuntimeError: no>'
    """
    try:
        return _described(error)
    except Exception as failure:
        message = f"<{type(error).__name__} could not be described: {type(failure).__name__}>"
        return {"type": type(error).__qualname__, "message": message, "chain": "", "traceback": ""}


def _described(error: BaseException) -> dict[str, Any]:
    chain = traced_chain(error)
    text = "".join(traceback.format_exception(error))
    for note in getattr(error, "__notes__", ()):
        if isinstance(note, str) and note not in text:
            text += note + "\n"
    if isinstance(error, RemoteError):  # (from a worker process: named as it was raised there)
        name, message = error.type_name, error.message
    else:
        name, message = type(error).__qualname__, message_of(error)
    header: dict[str, Any] = {
        "type": name,
        "message": message,
        "chain": chain,
        "traceback": text,
    }
    if isinstance(error, EndOfData):  # not a failure: the end of a view whose length is not known (uniter)
        header["end_of_data"] = True
    return header


def unsendable_header(what: str, error: TypeError) -> dict[str, str]:
    """What a consumer is told of items that ``wire.encode`` refused (``what``: ``item 3``, ``items 0 to 63``)."""
    return {"type": "TypeError", "message": f"{what} cannot be sent: {error}", "chain": "", "traceback": ""}


def restore_failure(header: dict, where: str) -> RemoteError | EndOfData:
    """The exception a consumer raises for an item that failed on the server (``where`` names it).

    The end of a served view of unknown length is :class:`~lazyseq.views.errors.EndOfData`
    there too, which ends an iteration as it does locally.
    """
    if header.get("end_of_data") is True:
        return EndOfData(_text(header.get("message"), "past the end of the served view"))
    error = RemoteError(_text(header.get("type"), "Exception"), _text(header.get("message"), ""))
    text = _text(header.get("traceback"), "").rstrip()
    error.add_note(f"raised on {where}; its traceback there:\n{text}" if text else f"raised on {where}")
    setattr(error, REMOTE_CHAIN, _text(header.get("chain"), ""))
    return error


def _text(value: Any, default: str) -> str:
    return value if isinstance(value, str) else default
