"""Several items read at once, and how they become a batch.

``View._get_many`` returns a *chunk*, in one of three forms:

- an ``np.ndarray`` whose first axis runs over the items (array-backed data,
  read with one vectorized call);
- a :class:`Columns`, the items of a ``collate`` view (tuples, or dicts) kept
  as one chunk per field, so that the fields stay vectorized;
- a torch tensor whose first axis runs over the items (a tensor's rows,
  read with one indexing call);
- a ``list`` of items, for everything else.

A batch is built from a chunk without going back to single items whenever the
chunk is already columnar.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Mapping, Sequence
from numbers import Number
from typing import Any

import numpy as np

from ..casting import keeps_values

__all__ = [
    "Columns",
    "aligned",
    "batches_as_its_rows",
    "MixedShapes",
    "default_collate",
    "chunk_rows",
    "is_rows",
    "is_tensor",
    "chunk_to_batch",
    "new_rows",
    "pad_chunk",
    "scatter",
    "typed_as",
    "writing",
    "writing_into",
]

ALIGN = 64  # bytes: arrays placed in an output buffer start on a cache line


def aligned(offset: int) -> int:
    """``offset`` rounded up to a multiple of :data:`ALIGN` (where the next array placed after it starts).

    >>> aligned(0), aligned(1), aligned(64)
    (0, 64, 64)
    """
    return -(-offset // ALIGN) * ALIGN


_output = threading.local()  # the buffer that new_rows() fills, while writing_into() is active


def new_rows(shape: tuple, dtype: np.dtype) -> np.ndarray:
    """An uninitialized array for a vectorized read: ``np.empty``, or room in the active output buffer.

    A view that builds a batch in memory it is given (``View._get_into``)
    lets these reads write straight into that memory, saving one copy.
    """
    buffer = getattr(_output, "buffer", None)
    if buffer is not None:
        dtype = np.dtype(dtype)
        nbytes = dtype.itemsize
        for extent in shape:
            nbytes *= extent
        start = aligned(_output.used)
        if start + nbytes <= len(buffer):
            _output.used = start + nbytes
            return np.ndarray(shape, dtype, buffer=buffer, offset=start)
    return np.empty(shape, dtype)


def writing() -> bool:
    """Whether :func:`new_rows` places arrays in an output buffer now (see :func:`writing_into`)."""
    return getattr(_output, "buffer", None) is not None


class writing_into:  # noqa: N801  # used as a function: ``with writing_into(buffer):``
    """Within the block, :func:`new_rows` places arrays one after the other in ``buffer`` (bytes) while they fit.

    A class rather than a generator: it is entered once per batch a worker
    process writes into shared memory, and costs a third as much.
    """

    __slots__ = ("_buffer",)

    def __init__(self, buffer: np.ndarray) -> None:
        self._buffer = buffer

    def __enter__(self) -> None:
        _output.buffer, _output.used = self._buffer, 0

    def __exit__(self, *exc_info: object) -> None:
        _output.buffer = None


class Columns:
    """The items of a ``collate`` view, stored field by field: tuples, or dicts with ``keys`` (one per field)."""

    __slots__ = ("fields", "keys")

    def __init__(self, fields: tuple, keys: tuple | None = None) -> None:
        self.fields = fields
        self.keys = keys

    def item(self, values: Any) -> Any:
        """One item (or batch) from one value per field: the tuple, or the dict of the keys."""
        return tuple(values) if self.keys is None else dict(zip(self.keys, values))


def chunk_rows(chunk: Any) -> list:
    """The items of a chunk, one Python object each."""
    if type(chunk) is list:
        return chunk
    if isinstance(chunk, Columns):
        rows = zip(*(chunk_rows(field) for field in chunk.fields))
        return list(rows) if chunk.keys is None else [chunk.item(row) for row in rows]
    return list(chunk)


def batches_as_its_rows(chunk: Any) -> bool:
    """Whether the chunk makes the batch that its rows, collated one by one, make: same structure and dtypes.

    Not so for arrays of Python objects (the array is the batch; its rows
    would be collated), nor for 1-D arrays of strings or of numbers in a byte
    order not the machine's (their rows are numpy scalars: collated, strings
    take the batch's widest and numbers the machine's byte order).

    >>> import numpy as np
    >>> batches_as_its_rows(np.zeros((4, 2), ">f8")), batches_as_its_rows(np.zeros(4, ">f8"))
    (True, False)
    """
    if type(chunk) is list or is_tensor(chunk):  # (a tensor's rows stack into the tensor again)
        return True
    if isinstance(chunk, Columns):
        return all(map(batches_as_its_rows, chunk.fields))
    dtype = chunk.dtype
    if dtype.hasobject:
        return False
    return chunk.ndim >= 2 or (dtype.kind not in "USV" and dtype.isnative)


def chunk_to_batch(chunk: Any, spec: tuple | None = None) -> Any:
    """What the default collation of the chunk's items gives, without splitting it into items.

    ``spec``, what the items are where that is known (``View._item_spec``),
    makes the batch of items read one by one the batch that a slice of their
    source gives: each field of a tuple collated as its own source's items,
    objects kept as an array of them, and arrays in their source's dtype
    (see :func:`typed_as`).
    """
    if type(chunk) is list:
        if spec is None:
            return default_collate(chunk)
        if spec[0] == "tuple":
            width = len(spec[1])
            if width and all(type(item) is tuple and len(item) == width for item in chunk):  # a collate's items
                return tuple(chunk_to_batch(list(field), s) for field, s in zip(zip(*chunk), spec[1]))
            return default_collate(chunk)
        if spec[0] == "dict":
            specs = dict(zip(spec[2], spec[1]))
            if chunk and all(type(item) is dict and item.keys() == specs.keys() for item in chunk):  # a collate's
                return {key: chunk_to_batch([item[key] for item in chunk], specs[key]) for key in chunk[0]}
            return default_collate(chunk)
        if holds_objects(spec):
            return _objects(chunk)  # a slice of an array of objects: the objects, not their collation
        return typed_as(default_collate(chunk), spec)
    if isinstance(chunk, Columns):
        return chunk.item(chunk_to_batch(field, s) for field, s in zip(chunk.fields, _field_specs(chunk, spec)))
    return chunk


def _field_specs(chunk: Columns, spec: tuple | None) -> list:
    """The spec of each field of ``chunk``, where ``spec`` gives them (None for each else)."""
    fields = len(chunk.fields)
    if spec is not None and spec[0] == "tuple" and chunk.keys is None and len(spec[1]) == fields:
        return list(spec[1])
    if spec is not None and spec[0] == "dict" and chunk.keys is not None and set(spec[2]) == set(chunk.keys):
        specs = dict(zip(spec[2], spec[1]))
        return [specs[key] for key in chunk.keys]
    return [None] * fields


def holds_objects(spec: tuple | None) -> bool:
    """Whether ``spec`` (see ``View._item_spec``) says the items are the elements of an array of Python objects."""
    return spec is not None and spec[0] == "array" and spec[1] == np.dtype(object) and spec[2] == ()


def _objects(items: list) -> np.ndarray:
    objects = np.empty(len(items), object)
    for k, item in enumerate(items):  # not objects[:] = items: sequences among them would be split up
        objects[k] = item
    return objects


def typed_as(batch: Any, spec: tuple) -> Any:
    """A batch collated from arrays or numbers read one by one, in the dtype of their source (``spec``, an array's).

    Such items lose what a slice of the source array keeps: the rows of a 1-D
    array are numpy scalars, so strings collate to the widest among them and
    numbers to the machine's byte order. Given the items' spec, the batch has
    the dtype a slice of the source has, whoever read the items (a loader's
    workers, or the reader). Only the width and byte order change: a dtype of
    another kind (a float for integers: values could change), one that the
    batch does not cast to safely, or a shape that differs, leaves it as it is.

    >>> import numpy as np
    >>> typed_as(np.array(["a", "bc"]), ("array", np.dtype("<U5"), ())).dtype
    dtype('<U5')
    >>> typed_as(np.array([1, 2]), ("array", np.dtype(">f8"), ())).dtype  # not made floats
    dtype('int64')
    """
    _, dtype, shape = spec
    if isinstance(batch, np.ndarray) and batch.dtype != dtype:  # unequal in byte order too
        if batch.dtype.kind == dtype.kind and batch.shape[1:] == shape and np.can_cast(batch.dtype, dtype, "safe"):
            return batch.astype(dtype)
    return batch


def pad_chunk(chunk: Any, pad: Any, count: int, collated: bool = True, spec: tuple | None = None) -> Any:
    """Append ``count`` copies of the item ``pad``, keeping the chunk's form and dtype.

    Items made one by one, to be ``collated`` by default, get a pad made as
    their ``spec`` says where it is known (an array's rows: as a slice of
    the array pads them), else like the first of them, so that it collates
    as they do (a ``collate_fn`` gets ``pad`` as it is).
    """
    if not collated:  # the items, as rows, and the pad as it is: however the items are stored
        return chunk_rows(chunk) + [pad] * count
    if type(chunk) is list:
        if spec is not None and spec[0] == "array" and chunk:  # its dtype; the shape of the items there
            return chunk + [_pad_rows(pad, spec[1], np.shape(chunk[0]), 1)[0]] * count
        return chunk + [_padding_like(chunk[0], pad) if chunk else pad] * count
    if isinstance(chunk, Columns):
        pads = _pad_fields(pad, chunk.keys, len(chunk.fields))
        return Columns(tuple(pad_chunk(f, p, count) for f, p in zip(chunk.fields, pads)), chunk.keys)
    if is_tensor(chunk):
        padding = _tensor_padding(chunk[0], pad)
        return sys.modules["torch"].cat([chunk, padding.expand(count, *padding.shape)])
    # dtype: numpy's concatenate gives the machine's byte order otherwise
    return np.concatenate([chunk, _pad_rows(pad, chunk.dtype, chunk.shape[1:], count)], dtype=chunk.dtype)


def _pad_fields(pad: Any, keys: Sequence[Any] | None, count: int) -> list:
    """The values of ``pad``, one per field of items that are dicts with ``keys``, or ``count``-tuples (no keys)."""
    if keys is not None:
        if not isinstance(pad, Mapping) or set(pad) != set(keys):
            raise ValueError(f"pad must be a dict with keys {list(keys)} to pad items that are dicts, got {pad!r}")
        return [pad[key] for key in keys]
    if not isinstance(pad, (tuple, list)) or len(pad) != count:
        raise ValueError(f"pad must be a tuple of {count} values to pad items that are {count}-tuples, got {pad!r}")
    return list(pad)


def _padding_like(item: Any, pad: Any) -> Any:
    """``pad`` as an item like ``item``: each value in its dtype (a ``TypeError`` if it cannot be held there)."""
    if isinstance(item, Mapping):
        pads = _pad_fields(pad, list(item), len(item))
        return {key: _padding_like(value, p) for (key, value), p in zip(item.items(), pads)}
    if isinstance(item, (tuple, list)):
        values = [_padding_like(v, p) for v, p in zip(item, _pad_fields(pad, None, len(item)))]
        kind: Any = type(item)
        return kind._make(values) if hasattr(kind, "_make") else kind(values)  # namedtuples too
    if is_tensor(item):
        return _tensor_padding(item, pad)
    if not isinstance(item, (np.ndarray, Number, np.generic)):  # collated into a list (strings...): pad as it is
        return pad
    value = np.asarray(item)
    dtype = value.dtype
    if dtype.kind in "US":  # strings read one by one stack as wide as the widest: as wide as the pad too
        wider = np.promote_types(dtype, np.asarray(pad).dtype)
        dtype = wider if wider.kind == dtype.kind else dtype
    return _pad_rows(pad, dtype, value.shape, 1)[0]


def _tensor_padding(item: Any, pad: Any) -> Any:
    """``pad`` as a tensor like ``item``: its shape, dtype and device (a ``TypeError`` if the dtype cannot hold it)."""
    torch = sys.modules["torch"]
    given = _tensor_values(pad) if is_tensor(pad) else pad
    try:
        dtype = np.dtype(str(item.dtype).removeprefix("torch."))  # float32, int64, bool...: numpy's names
    except TypeError:  # bfloat16, float8: no numpy dtype
        return _padding_without_numpy_dtype(item, pad, given, torch)
    row = _pad_rows(given, dtype, tuple(item.shape), 1)[0]
    return torch.as_tensor(np.array(row), device=item.device)


def _tensor_values(tensor: Any) -> np.ndarray:
    """A tensor's values as a numpy array (of float64 for a dtype numpy has not: bfloat16, float8)."""
    try:
        return tensor.numpy(force=True)
    except TypeError:
        return tensor.detach().cpu().double().numpy()


def _padding_without_numpy_dtype(item: Any, pad: Any, given: Any, torch: Any) -> Any:
    """``pad`` in a float dtype numpy has not: refused where it would change beyond rounding (inf, a float8's
    largest value for a larger one, an integer rounded), as :func:`_pad_rows` refuses it in other dtypes."""
    refused = TypeError(f"batch: pad {pad!r} cannot be held as the items' dtype {item.dtype} without a change")
    try:
        row = _pad_rows(given, np.dtype(np.float64), tuple(item.shape), 1)[0]
    except TypeError:
        raise refused from None
    wide = torch.as_tensor(np.array(row))
    narrow = wide.to(item.dtype)
    largest = torch.finfo(item.dtype).max
    if bool(((wide.abs() > largest) & wide.isfinite()).any()):  # made inf, or the largest value (float8 saturates)
        raise refused
    if np.asarray(given).dtype.kind in "iub" and not torch.equal(narrow.double(), wide):  # an integer rounded
        raise refused
    return narrow.to(item.device)


def _pad_rows(pad: Any, dtype: np.dtype, row_shape: tuple, count: int) -> np.ndarray:
    """``count`` rows of ``pad`` (one item, or a number for every value of one), as the items' dtype holds it."""
    if dtype.kind == "O" and not row_shape:  # items that are objects: the pad is one, whatever it is (a list too)
        rows = np.empty(count, object)
        for k in range(count):
            rows[k] = pad
        return rows
    value = np.asarray(pad)
    if value.ndim and value.shape != row_shape:  # would be spread over the rows, or fail to
        raise ValueError(
            f"batch: pad has shape {value.shape}, but the items have shape {row_shape}: pad is one item (or a number)"
        )
    integers = value.dtype.kind in "iub" and dtype.kind in "iub"  # pad=0 for uint8 items: a Python int is int64
    if not ((integers or np.can_cast(value.dtype, dtype, "same_kind")) and keeps_values(value, dtype)):
        raise TypeError(f"batch: pad {pad!r} cannot be held as the items' dtype {dtype} without a change")
    return np.broadcast_to(value.astype(dtype), (count, *row_shape))


def scatter(pieces: list, positions: list[np.ndarray], total: int) -> Any:
    """Merge chunks read from several parents back into request order.

    ``pieces[k]`` holds the items that go to ``positions[k]`` of the result.
    """
    if len(pieces) == 1:
        return pieces[0]
    first = pieces[0]
    kinds = {type(p) for p in pieces}
    if kinds == {np.ndarray} and all(p.dtype == first.dtype and p.shape[1:] == first.shape[1:] for p in pieces):
        out = np.empty((total,) + first.shape[1:], dtype=first.dtype)
        for piece, where in zip(pieces, positions):
            out[where] = piece
        return out
    if kinds == {Columns} and all(len(p.fields) == len(first.fields) and p.keys == first.keys for p in pieces):
        fields = range(len(first.fields))
        return Columns(tuple(scatter([p.fields[f] for p in pieces], positions, total) for f in fields), first.keys)
    rows: list = [None] * total
    for piece, where in zip(pieces, positions):
        for position, item in zip(where.tolist(), chunk_rows(piece)):
            rows[position] = item
    return rows


class MixedShapes(ValueError):
    """Arrays of different shapes where a batch stacks them: ``positions`` are the two items (in the batch) that differ."""

    def __init__(self, positions: tuple[int, int], shapes: tuple[tuple, tuple]) -> None:
        (a, b), (shape_a, shape_b) = positions, shapes
        super().__init__(
            f"cannot stack items of different shapes into one array: item {a} has shape {shape_a}, "
            f"item {b} has shape {shape_b}"
        )
        self.positions = positions
        self.shapes = shapes


def _stack(items: list) -> np.ndarray:
    try:
        batch = np.stack(items)
    except ValueError:
        _check_array_like(items)
        shape = items[0].shape
        for k, item in enumerate(items):
            if np.shape(item) != shape:
                raise MixedShapes((0, k), (shape, np.shape(item))) from None
        raise
    kind, first = batch.dtype.kind, items[0].dtype.kind
    if kind != first and kind in "OUS":  # None among 0-d arrays, or strings among numbers: numpy made them one
        _check_array_like(items)
        if kind in "US" and first not in "USV":  # strings within a list among arrays of numbers
            k = next(k for k, item in enumerate(items) if np.asarray(item).dtype.kind in "US")
            raise _not_like_the_first(items, k)
    if isinstance(batch, np.ma.MaskedArray):  # masked items: np.stack drops their masks
        return np.ma.stack(items)
    return batch


def is_tensor(value: Any) -> bool:
    """Whether ``value`` is a torch tensor (a tensor exists only once torch is imported: never imported here).

    >>> is_tensor([1.0]), is_tensor(np.zeros(1))
    (False, False)
    """
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def is_rows(value: Any) -> bool:
    """Whether ``value`` is an array or a tensor: rows, as a batch holds a field of its items that are arrays."""
    return isinstance(value, np.ndarray) or is_tensor(value)


def _stack_tensors(items: list, torch: Any) -> Any:
    """Torch tensors of one shape stacked into one tensor, as torch's ``default_collate`` stacks them."""
    shape = items[0].shape
    for k, item in enumerate(items):
        if not isinstance(item, torch.Tensor):
            raise _not_like_the_first(items, k)
        if item.shape != shape:
            raise MixedShapes((0, k), (tuple(shape), tuple(item.shape)))
    return torch.stack(items)


def _check_array_like(items: list) -> None:
    """``TypeError`` naming the first item that is no array, number or sequence of them (None, a dict), or a string
    (or a record) among arrays of numbers."""
    textual = items[0].dtype.kind in "USV"
    for k, item in enumerate(items):
        if isinstance(item, (str, bytes, np.str_, np.bytes_, np.void)):
            if not textual:
                raise _not_like_the_first(items, k) from None
        elif not isinstance(item, (np.ndarray, np.generic, Number, list, tuple)) and not hasattr(item, "__array__"):
            raise _not_like_the_first(items, k) from None


def _promoted(scalars: list[Any]) -> np.dtype | None:
    """The dtype that ``np.stack`` gives numpy scalars of several dtypes; None for one dtype, or other items.

    ``np.asarray`` promotes them two at a time: int8, uint16 and float32
    scalars make float64 there (int8 and uint16 make int32 first), float32
    with ``np.stack``, as an array of each would. Where ``np.stack`` refuses
    them (durations and dates, durations and floats), so does this, with
    its error; strings and numbers are left to ``np.asarray`` (a list then).
    """
    kinds = {type(item) for item in scalars}
    if len(kinds) == 1 or not all(issubclass(kind, np.generic) for kind in kinds):
        return None
    dtypes = {item.dtype for item in scalars}
    try:
        promoted = np.result_type(*dtypes)  # dtypes, not values (numpy 1 looks at values)
    except TypeError:
        if any(dtype.kind in "USO" for dtype in dtypes):  # no dtype holds them all: as np.asarray makes them
            return None
        promoted = None
    if promoted is None or not all(np.can_cast(dtype, promoted, "same_kind") for dtype in dtypes):
        np.stack([np.asarray(item) for item in scalars])  # numpy's own error (durations and dates promote to dates)
    return promoted


def default_collate(items: list[Any]) -> Any:
    """Assemble a list of items into one batch.

    Numbers and arrays are stacked into one ``ndarray``, torch tensors into
    one tensor; tuples, lists, namedtuples and dicts are collated field by
    field; anything else (strings, arbitrary objects, numbers mixed with
    strings) is returned as a list. Numpy values of several dtypes are
    stacked as ``np.stack`` stacks them, or refused with its error
    (durations and dates).

    >>> from lazyseq import default_collate
    >>> default_collate([(1, 'a'), (2, 'b')])
    (array([1, 2]), ['a', 'b'])
    >>> default_collate([{'x': [0.5, 1.0]}, {'x': [1.5, 2.0]}])
    {'x': [array([0.5, 1.5]), array([1., 2.])]}
    """
    if not items:
        raise ValueError("cannot collate no items: a batch holds at least one")
    first = items[0]
    if isinstance(first, np.ndarray):
        return _stack(items)
    if is_tensor(first):
        return _stack_tensors(items, sys.modules["torch"])
    if isinstance(first, (Number, np.generic)):
        try:
            batch = np.asarray(items)
            # numpy scalars of several dtypes (durations after a date may take its dtype: checked too)
            if isinstance(first, np.generic) and (batch.dtype != first.dtype or batch.dtype.kind in "mM"):
                promoted = _promoted(items)
                if promoted is not None and promoted != batch.dtype:
                    batch = np.asarray(items, dtype=promoted)
        except ValueError:  # an array (or what makes one) or a structure among the numbers
            for k, item in enumerate(items):
                if isinstance(item, (tuple, list, Mapping)):
                    raise _not_like_the_first(items, k) from None
            _stack([np.asarray(item) for item in items])  # raises MixedShapes, naming it
            raise
        kind = batch.dtype.kind
        if kind in "US" and not all(isinstance(item, (np.str_, np.bytes_)) for item in items):
            return list(items)  # numbers and strings: not the numbers made strings
        if kind == "O" and not all(
            isinstance(item, (Number, np.generic)) and not isinstance(item, (str, bytes)) for item in items
        ):
            return list(
                items
            )  # numbers and other objects (None, strings beside durations): not an array whose dtype depends on the order
        return batch
    if isinstance(first, Mapping):
        keys = set(first)
        for k, item in enumerate(items):
            if not isinstance(item, Mapping) or set(item) != keys:
                theirs = sorted(map(str, item)) if isinstance(item, Mapping) else type(item).__name__
                raise ValueError(
                    f"cannot collate dicts with different keys: item 0 has {sorted(map(str, keys))}, item {k} has "
                    f"{theirs}"
                )
        return {key: default_collate([item[key] for item in items]) for key in first}
    if isinstance(first, (tuple, list)):
        width = len(first)
        for k, item in enumerate(items):
            if not isinstance(item, (tuple, list)):
                raise _not_like_the_first(items, k)
            if len(item) != width:
                raise ValueError(
                    f"cannot collate items of different lengths field by field: item 0 has {width} fields, item {k} "
                    f"has {len(item)}; batch(..., collate_fn=list) gives such items as a list"
                )
        columns = [default_collate(list(column)) for column in zip(*items)]
        if hasattr(first, "_fields"):  # namedtuple
            return type(first)(*columns)
        return tuple(columns) if isinstance(first, tuple) else columns
    return list(items)


def _not_like_the_first(items: list[Any], k: int) -> TypeError:
    """The error for item ``k`` of ``items``, whose kind (a number, a tuple...) cannot be collated with item 0's."""
    return TypeError(
        f"cannot collate item {k} ({type(items[k]).__name__}) with item 0 ({type(items[0]).__name__}); "
        "batch(..., collate_fn=list) gives such items as a list"
    )
