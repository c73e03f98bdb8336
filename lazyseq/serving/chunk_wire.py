"""Several items of a served view sent as one message: a chunk (see :mod:`lazyseq.views.chunks`) as a wire value.

A consumer that reads many items at once (a batch of a served view) gets
them as the chunk that the server's view reads them as, so that what it
makes of them is what a local read makes, at the cost of one message:

=============================  ===============================
chunk                          as a wire value
=============================  ===============================
an array (its rows)            ``("rows", array)``
an array of Python objects     ``("objects", [its items])``
:class:`Columns` (a collate)   ``("columns", [field chunks], keys)``
a list of items                ``("items", [items])``
=============================  ===============================

>>> import numpy as np
>>> from lazyseq.views.chunks import Columns
>>> sent = to_wire(Columns((np.arange(3), ["a", "b", "c"]), ("x", "name")))
>>> sent
('columns', [('rows', array([0, 1, 2])), ('items', ['a', 'b', 'c'])], ('x', 'name'))
>>> chunk = from_wire(sent, 3)
>>> chunk.fields[0], chunk.fields[1], chunk.keys
(array([0, 1, 2]), ['a', 'b', 'c'], ('x', 'name'))
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..views.chunks import Columns, chunk_rows
from .wire import MAX_DEPTH, ProtocolError, encode

__all__ = ["from_wire", "to_wire", "unsendable_item"]


def to_wire(chunk: Any) -> tuple:
    """``chunk`` as a value that :func:`~lazyseq.serving.wire.encode` takes (where its contents are sendable)."""
    if isinstance(chunk, np.ndarray):
        if chunk.dtype == object and chunk.ndim == 1:  # (items that are arrays of objects travel no more than these)
            return ("objects", chunk.tolist())
        return ("rows", chunk)
    if isinstance(chunk, Columns):
        return ("columns", [to_wire(field) for field in chunk.fields], chunk.keys)
    if type(chunk) is list:
        return ("items", chunk)
    return ("items", list(chunk))  # (a tensor's rows: refused as items are, naming what they are)


def from_wire(value: Any, count: int, depth: int = 0) -> Any:
    """The chunk of ``count`` items that ``value`` (from :func:`to_wire`, decoded) is; ``ProtocolError`` if none."""
    if depth > MAX_DEPTH:
        raise ProtocolError(f"the items sent are nested more than {MAX_DEPTH} levels deep")
    if type(value) is tuple and len(value) == 2 and value[0] == "rows":
        rows = value[1]
        if isinstance(rows, np.ndarray) and rows.ndim >= 1 and len(rows) == count:
            return rows
    elif type(value) is tuple and len(value) == 2 and value[0] in ("items", "objects"):
        items = value[1]
        if type(items) is list and len(items) == count:
            # (an array of objects: each item one element, a list too, which np.array would make a row)
            return items if value[0] == "items" else np.fromiter(items, dtype=object, count=count)
    elif type(value) is tuple and len(value) == 3 and value[0] == "columns" and type(value[1]) is list:
        keys = value[2]
        if value[1] and (keys is None or (type(keys) is tuple and len(keys) == len(value[1]) and _distinct(keys))):
            return Columns(tuple(from_wire(field, count, depth + 1) for field in value[1]), keys)
    raise ProtocolError(f"not {count} items of a served view")


def _distinct(keys: tuple) -> bool:
    try:
        return len(set(keys)) == len(keys)
    except TypeError:  # a key that cannot be one (a list)
        return False


def unsendable_item(chunk: Any) -> tuple[int, TypeError] | None:
    """Which item of a chunk that cannot be sent is the first that cannot, and why; None if each one alone can.

    >>> import numpy as np
    >>> unsendable_item([np.arange(2), {1, 2}, None])
    (1, TypeError('the item is a builtins.set, which cannot be sent: ...'))
    """
    for k, item in enumerate(chunk_rows(chunk)):
        try:
            encode(item)
        except TypeError as error:
            return k, error
    return None
