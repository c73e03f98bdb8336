"""How ``write_npy`` lays items out on disk: fields, shards of consecutive rows, file names, records.

An item is an array (one field, ``data``), a tuple of arrays (fields ``f0``,
``f1``, ...) or a dict of arrays (one field per key). Each field gets its own
set of ``.npy`` files, ``{field}-{shard:05d}.npy``, and shard ``k`` holds
items ``k * rows_per_shard`` to ``(k + 1) * rows_per_shard - 1`` (the last
one fewer): what a shard holds depends on the layout alone, never on who
computed it. Everything here is plain data that turns into the JSON of the
manifest and back.
"""

from __future__ import annotations

import functools
import math
import operator
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

import numpy as np

from ..casting import keeps_values, same_kind_of_value
from ..views.base import View
from ..views.chunks import MixedShapes, chunk_rows, chunk_to_batch, is_tensor

__all__ = [
    "BLOCK_BYTES",
    "FIRST_BLOCK_ROWS",
    "MANIFEST",
    "PROGRESS",
    "SHARD_FILE_NAME",
    "Field",
    "Layout",
    "ShardFile",
    "ShardRecord",
    "read_batch",
]

BLOCK_BYTES = 4 * 2**20  # about how much of a shard is computed (and held in memory) at once, at most
BLOCK_SECONDS = 0.1  # and about how long that takes, at most: a run that fails or is interrupted stops that soon
FIRST_BLOCK_ROWS = 8  # a shard's first block, timed to size the next ones
ARRAY_FIELD = "data"  # the name of the one field of array items
_FIELD_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+=-]*")  # a dict key that can be part of a file name
MAX_FIELD_NAME = 200  # characters: "<key>-<shard>.npy", written as ".<that>.<8 hex>.tmp", within 255 bytes
_SUM64 = re.compile(r"[0-9a-f]{32}")
SHARD_FILE_NAME = re.compile(_FIELD_NAME.pattern + r"-[0-9]{5,}\.npy")  # as file_name() makes them
MANIFEST = "manifest.json"  # written last: the directory is complete
PROGRESS = "progress.jsonl"  # the shards written so far, while a run goes on

Kind = Literal["array", "tuple", "dict"]


@dataclass(frozen=True)
class Field:
    """One field of the items: its name, dtype and the shape of one row."""

    name: str
    dtype: np.dtype
    row_shape: tuple[int, ...]

    @property
    def row_bytes(self) -> int:
        return self.dtype.itemsize * math.prod(self.row_shape)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "dtype": self.dtype.str, "row_shape": list(self.row_shape)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Field:
        try:
            dtype = np.dtype(data["dtype"])
        except SyntaxError as error:  # numpy reads some dtype names as Python literals
            raise ValueError(f"{data['dtype']!r} is not a dtype ({error})") from None
        return cls(str(data["name"]), dtype, tuple(int(n) for n in data["row_shape"]))


@dataclass(frozen=True)
class ShardFile:
    """One ``.npy`` file as written: its name in the directory, its size, and the checksum of all its bytes.

    ``checksum`` is hexadecimal digits of the kind ``kind`` names: ``"sum64"``
    (32 digits, see :mod:`.checksum`), or, in records written by version 1 of
    the format, ``"crc32"`` (8 digits of ``zlib.crc32``; a number in JSON).
    """

    name: str
    size: int
    checksum: str
    kind: str = "sum64"

    def to_json(self) -> dict[str, Any]:
        value = self.checksum if self.kind == "sum64" else int(self.checksum, 16)
        return {"name": self.name, "bytes": self.size, self.kind: value}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ShardFile:
        name, size = str(data["name"]), int(data["bytes"])
        if not SHARD_FILE_NAME.fullmatch(name):  # a path elsewhere ("../x.npy", "/x.npy") is no shard of the directory
            raise ValueError(f"{name!r} is not the name of a shard file")
        if size < 0:
            raise ValueError(f"the size of {name} is {size}")
        if "sum64" in data:
            digits = data["sum64"]
            if not isinstance(digits, str) or not _SUM64.fullmatch(digits):
                raise ValueError(f"the checksum of {name} is {digits!r}, not 32 hexadecimal digits")
            return cls(name, size, digits)
        if "crc32" in data:
            return cls(name, size, f"{int(data['crc32']):08x}", "crc32")
        raise ValueError(f"the record of {name} has no checksum")


@dataclass(frozen=True)
class ShardRecord:
    """A shard as written: its number, how many rows it holds, and its files (one per field, in field order)."""

    shard: int
    rows: int
    files: tuple[ShardFile, ...]

    def to_json(self) -> dict[str, Any]:
        return {"shard": self.shard, "rows": self.rows, "files": [f.to_json() for f in self.files]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ShardRecord:
        return cls(int(data["shard"]), int(data["rows"]), tuple(ShardFile.from_json(f) for f in data["files"]))


@dataclass(frozen=True)
class Layout:
    """``length`` items of ``kind`` with ``fields``, ``rows_per_shard`` to a shard: what decides the files' contents.

    >>> import numpy as np
    >>> layout = Layout.of_items(np.zeros((1, 3), np.float32), length=10, rows_per_shard=4)
    >>> layout.shard_count, layout.rows(2), layout.file_name(layout.fields[0], 2)
    (3, range(8, 10), 'data-00002.npy')
    """

    kind: Kind
    fields: tuple[Field, ...]
    length: int
    rows_per_shard: int

    @classmethod
    def of_items(
        cls, batch: Any, length: int, rows_per_shard: int | None = None, bytes_per_shard: int = 256 * 2**20
    ) -> Layout:
        """The layout of ``length`` items like those in ``batch`` (collated; item 0 alone, as :meth:`read` gives it)."""
        try:
            kind, names, values = _parts(batch)
        except TypeError as error:
            raise TypeError(f"write_npy: item 0: {error}") from None
        if not names:
            raise TypeError(f"write_npy: item 0 is an empty {kind}: there is nothing to write")
        fields = tuple(_field(name, value) for name, value in zip(names, values))
        if rows_per_shard is None:
            row_bytes = sum(f.row_bytes for f in fields)
            rows_per_shard = max(1, bytes_per_shard // row_bytes) if row_bytes else length
        return cls(kind, fields, length, min(rows_per_shard, length))

    # -- shards ------------------------------------------------------------------

    @property
    def shard_count(self) -> int:
        return -(-self.length // self.rows_per_shard)

    def rows(self, shard: int) -> range:
        """The items that shard ``shard`` holds."""
        start = shard * self.rows_per_shard
        return range(start, min(start + self.rows_per_shard, self.length))

    def row_count(self, shard: int) -> int:
        """How many items shard ``shard`` holds (``len(rows(shard))``, which Python refuses above ``sys.maxsize``)."""
        rows = self.rows(shard)
        return rows.stop - rows.start

    @property
    def block_rows(self) -> int:
        """How many rows of a shard are computed at once: one vectorized read of about ``BLOCK_BYTES``."""
        row_bytes = sum(f.row_bytes for f in self.fields)
        return max(1, min(self.rows_per_shard, BLOCK_BYTES // max(1, row_bytes)))

    def next_block_rows(self, rows: int, seconds: float) -> int:
        """How many rows to read next, after ``rows`` took ``seconds``: ``BLOCK_SECONDS`` of them, up to ``block_rows``.

        Blocks grow at most eightfold at a time, from ``FIRST_BLOCK_ROWS``:

        >>> import numpy as np
        >>> layout = Layout.of_items(np.zeros((1,)), length=10**6, rows_per_shard=10**6)  # blocks of 524288 rows
        >>> layout.next_block_rows(8, 1e-5), layout.next_block_rows(512, 1e-5), layout.next_block_rows(512, 0.4)
        (64, 4096, 128)
        """
        wanted = int(rows * BLOCK_SECONDS / max(seconds, 1e-9))
        return max(1, min(wanted, 8 * rows, self.block_rows))

    def file_name(self, field: Field, shard: int) -> str:
        digits = max(5, len(str(self.shard_count - 1)))  # names sort in shard order
        return f"{field.name}-{shard:0{digits}d}.npy"

    def file_names(self, shard: int) -> list[str]:
        return [self.file_name(field, shard) for field in self.fields]

    def describes(self, record: ShardRecord) -> bool:
        """Whether ``record`` is of a shard of this layout: its rows, and its files' names."""
        shard = record.shard
        return (
            0 <= shard < self.shard_count
            and record.rows == len(self.rows(shard))
            and [f.name for f in record.files] == self.file_names(shard)
        )

    # -- items -------------------------------------------------------------------

    def field_arrays(self, batch: Any, rows: range) -> list[np.ndarray]:
        """The arrays of each field in ``batch``, the items ``rows`` collated; errors name the items."""
        one = len(rows) == 1
        what = f"item {rows.start}" if one else f"items {rows.start} to {rows[-1]}"
        try:
            kind, names, values = _parts(batch)
        except TypeError as error:
            raise TypeError(f"{what}: {error}") from None
        expected = [f.name for f in self.fields]
        if kind == "dict" == self.kind and names != expected and sorted(names) == sorted(expected):
            names, values = expected, [batch[name] for name in expected]  # the same keys in another order
        if (kind, names) != (self.kind, expected):
            raise TypeError(
                f"{what} {'is' if one else 'are'} {_shown(kind, names, one)}, but item 0 is "
                f"{_shown(self.kind, expected, True)}"
            )
        _refuse_array_subclasses(values, rows.start if one else rows)  # (read at once: a custom view's own)
        arrays = []
        for field, value in zip(self.fields, values):
            array = np.asarray(value)
            name = "" if self.kind == "array" else f" field {field.name!r}:"
            if array.shape != (len(rows), *field.row_shape):
                raise ValueError(
                    f"{what}:{name} rows of shape {array.shape[1:]}, but item 0 has rows of shape {field.row_shape}"
                    + _short_batch_hint(array.shape[1:], field.row_shape)
                )
            if array.dtype != field.dtype:
                if not _holds(field.dtype, array):
                    fix = "make every item the same dtype (.astype in the pipeline)"
                    if field.dtype.kind in "US" and array.dtype.kind == field.dtype.kind:  # a longer string
                        fix = f"give every item one width that holds the longest (.astype('{field.dtype.kind}20'), say)"
                    raise ValueError(
                        f"{what}:{name} {array.dtype} values, which do not fit the {field.dtype} of item 0: {fix}"
                    )
                array = array.astype(field.dtype)
            arrays.append(array)
        return arrays

    def read(self, view: View, rows: range) -> list[np.ndarray]:
        """Items ``rows`` of ``view``, read with one vectorized call, as one array per field.

        Rows that an array holds as they are (``open_npy``, an array, slices
        and concatenations of them) are given as that array, not copied.
        Items that do not collate together as item 0 would have them are
        taken one by one: what is accepted then does not depend on where a
        block of rows begins (int16 and uint16 items stack into int32, which
        a float32 field cannot hold, though each alone fits), and an error
        names its item (``failed_item`` on the exception).
        """
        stored = view._stored_rows(rows) if self.kind == "array" else None
        if stored is not None:
            return self.field_arrays(stored, rows)
        chunk = view._get_many(rows)  # the pipeline's own errors propagate as they are
        # Items made one by one collate as the first one is made (an array among tuples is indexed as one): each
        # is checked to be of the kind of item 0 first, or the block's items are taken one by one.
        kind = self.kind
        if type(chunk) is not list or (
            all(_kind_of(item) == kind for item in chunk) and not self._stacking_hides(chunk)
        ):
            try:
                return self.field_arrays(_collated(chunk, rows), rows)
            except (TypeError, ValueError) as error:
                if len(rows) == 1:
                    error.failed_item = rows.start  # type: ignore[union-attr]  # read by write_npy's message
                    raise
        per_item = []
        for i, item in zip(rows, chunk_rows(chunk)):
            try:
                per_item.append(self.field_arrays(_collated([item], range(i, i + 1)), range(i, i + 1)))
            except (TypeError, ValueError) as error:
                error.failed_item = i  # type: ignore[union-attr]  # read by write_npy's message
                raise
        return [np.concatenate(parts) for parts in zip(*per_item)]

    def _stacking_hides(self, items: list) -> bool:
        """Whether stacking ``items`` could change some of their values unseen (then they are taken one by one).

        numpy stacks a field's values in one dtype that holds them all: numbers
        among strings become strings ("3"), times of several units the finest,
        where the others may wrap around, and integers above 2**53 among
        ``float64`` (or ``int64`` among ``uint64``) round. Items are taken one
        by one, each checked against item 0's dtype, where a field holds Python
        values of several types, arrays (or numpy scalars) whose dtypes do not
        all stack exactly, or values other than strings or times of item 0's kind
        (and unit).
        """
        for k, field in enumerate(self.fields):
            try:
                values = items if self.kind == "array" else list(map(self._getters[k], items))
            except (KeyError, IndexError, TypeError):  # a field missing: the item is named item by item
                return True
            try:
                dtypes = set(map(_dtype, values))  # (arrays and numpy's scalars)
            except AttributeError:  # Python's numbers, strings, lists: of one type, numpy gives them one dtype
                if len(set(map(type, values))) > 1:
                    return True
            else:
                if _dtypes_round(dtypes):
                    return True
            if field.dtype.kind in "USmM" and _strings_or_times_differ(field.dtype, values):
                return True
        return False

    @functools.cached_property
    def _getters(self) -> list[Callable[[Any], Any]]:
        """For each field, what takes its value from an item (a tuple's or a dict's)."""
        if self.kind == "dict":
            return [operator.itemgetter(field.name) for field in self.fields]
        return [operator.itemgetter(k) for k in range(len(self.fields))]

    # -- JSON --------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        return {
            "item": self.kind,
            "fields": [f.to_json() for f in self.fields],
            "length": self.length,
            "rows_per_shard": self.rows_per_shard,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Layout:
        kind = data["item"]
        if kind not in ("array", "tuple", "dict"):
            raise ValueError(f"unknown item kind {kind!r}")
        fields = tuple(Field.from_json(f) for f in data["fields"])
        expected = (
            [ARRAY_FIELD] if kind == "array" else [f"f{j}" for j in range(len(fields))] if kind == "tuple" else None
        )
        names = [f.name for f in fields]
        if not fields or (expected is not None and names != expected):
            raise ValueError(f"items of kind {kind!r} cannot have the fields {names}")
        if kind == "dict" and any(_field_name_problem(name) for name in names):
            raise ValueError(f"the fields {names} are not all names of files in the directory")
        length, rows_per_shard = int(data["length"]), int(data["rows_per_shard"])
        if length < 1 or rows_per_shard < 1:
            raise ValueError(f"length {length} and rows_per_shard {rows_per_shard} must be at least 1")
        return cls(kind, fields, length, rows_per_shard)

    def in_order_of(self, other: Layout) -> Layout:
        """This layout with its dict fields in ``other``'s order, where both hold the same keys (else itself).

        A dict item's keys may come in any order: a run resumed with them in
        another order writes the same files, under the earlier run's layout.
        """
        if self.kind != "dict" or other.kind != "dict" or self.fields == other.fields:
            return self
        mine = {f.name: f for f in self.fields}
        if sorted(mine) != sorted(f.name for f in other.fields):
            return self
        return replace(self, fields=tuple(mine[f.name] for f in other.fields))

    def differences(self, other: Layout) -> list[str]:
        """What differs from ``other`` (an earlier run's layout), in words: ``"rows_per_shard: 100, was 50"``."""
        changes = []
        names, other_names = [f.name for f in self.fields], [f.name for f in other.fields]
        if self.kind != other.kind or names != other_names:
            changes.append(f"items: {_shown(self.kind, names)}, were {_shown(other.kind, other_names)}")
        else:
            for new, old in zip(self.fields, other.fields):
                name = "" if self.kind == "array" else f" of field {new.name!r}"
                if new.dtype != old.dtype:
                    changes.append(f"dtype{name}: {new.dtype}, was {old.dtype}")
                if new.row_shape != old.row_shape:
                    changes.append(f"row shape{name}: {new.row_shape}, was {old.row_shape}")
        if self.length != other.length:
            changes.append(f"length: {self.length}, was {other.length}")
        whole = self.rows_per_shard == self.length and other.rows_per_shard == other.length  # one shard each
        # (a larger rows_per_shard is the length: the same one given for another length may be cut to it, or was)
        cut = self.length != other.length and (
            self.rows_per_shard == min(other.rows_per_shard, self.length)
            or other.rows_per_shard == min(self.rows_per_shard, other.length)
        )
        if self.rows_per_shard != other.rows_per_shard and not whole and not cut:
            # (rows_per_shard=None sizes shards from bytes_per_shard: a number the caller may never have given)
            same = self.length == other.length  # (else nothing goes on with them)
            hint = f": rows_per_shard={other.rows_per_shard} goes on with them" if same else ""
            changes.append(f"rows_per_shard: {self.rows_per_shard}, was {other.rows_per_shard}{hint}")
        return changes


def read_batch(view: View, rows: range) -> Any:
    """Items ``rows`` of ``view`` collated into one batch, with one vectorized read (``_get_many``)."""
    return _collated(view._get_many(rows), rows)


def _collated(chunk: Any, rows: range) -> Any:
    """The chunk of items ``rows`` as one batch; items of different shapes are named by their index."""
    try:
        return chunk_to_batch(chunk)
    except MixedShapes as error:
        (a, b), (shape_a, shape_b) = error.positions, error.shapes
        raise ValueError(
            f"items {rows[a]} and {rows[b]} have different shapes, {shape_a} and {shape_b}: "
            "every item must have the same shape"
        ) from None
    except (ValueError, TypeError):  # a matrix fails to stack in numpy's words: named as a subclass of arrays
        if type(chunk) is list:  # (a masked array stacks: field_arrays refuses the batch)
            for i, item in zip(rows, chunk):
                kind = _kind_of(item)
                _refuse_array_subclasses(item.values() if kind == "dict" else item if kind == "tuple" else [item], i)
        raise


def _kind_of(item: Any) -> Kind:
    """The kind of one item, as :func:`_parts` names the kind of a batch of them."""
    if isinstance(item, Mapping):
        return "dict"
    if isinstance(item, (tuple, list)):
        return "tuple"
    return "array"


def _parts(batch: Any) -> tuple[Kind, list[str], list[Any]]:
    """What a batch of items is: its kind, its field names, one value per field."""
    if isinstance(batch, np.ndarray):
        return "array", [ARRAY_FIELD], [batch]
    if isinstance(batch, tuple) or (isinstance(batch, list) and _all_arrays(batch)):
        # Items that are lists collate into a list of arrays, written as a tuple (so are namedtuples); other values
        # (strings) collate into a list of values, refused below.
        return "tuple", [f"f{j}" for j in range(len(batch))], list(batch)
    if isinstance(batch, Mapping):
        for key in batch:
            problem = _field_name_problem(key)
            if problem:
                raise TypeError(f"dict keys name the files of their field, so they must be {problem}")
        return "dict", list(batch), list(batch.values())
    raise TypeError(
        f"items must be arrays or numbers, or tuples or dicts of them, but these collate into a "
        f"{type(batch).__name__}{_hint(batch)}"
    )


def _field_name_problem(key: Any) -> str:
    """What keeps ``key`` from naming a field's files (``""``: nothing)."""
    if not isinstance(key, str) or not _FIELD_NAME.fullmatch(key):
        return f"strings of ASCII letters, digits and '_.+=-' (not starting with one of '.+=-'), got {key!r}"
    if len(key) > MAX_FIELD_NAME:
        return f"at most {MAX_FIELD_NAME} characters long (a file name holds 255), got one of {len(key)}: {key[:20]}..."
    return ""


def _hint(values: Any) -> str:
    """How to make arrays of ``values`` (a list that items collated into), where they are strings or tensors."""
    first = values[0] if isinstance(values, list) and values else None
    if isinstance(first, (str, bytes)):
        return "; make strings numpy arrays of a fixed-width string dtype (np.str_, np.bytes_, np.array(s, 'U20'))"
    if is_tensor(first) or is_tensor(values):  # tensors listed (collate_fn=list), or a batch of them stacked
        return "; convert torch tensors with .numpy() (on the CPU)"
    return ""


def _refuse_array_subclasses(values: Iterable[Any], where: int | range) -> None:
    """``TypeError`` if one of ``values`` (of item ``where``, or items) is of a subclass of numpy arrays other than a
    memory map (a masked array, a matrix): a ``.npy`` file keeps values alone."""
    for value in values:
        if isinstance(value, np.ndarray) and type(value) is not np.ndarray and not isinstance(value, np.memmap):
            one = isinstance(where, int)
            error = TypeError(
                (f"item {where}: " if isinstance(where, int) else f"items {where.start} to {where[-1]}: ")
                + f"a {type(value).__module__}.{type(value).__qualname__}, a subclass of numpy arrays: a .npy "
                "file keeps its values alone, and what the subclass adds (a masked array's mask) would be lost; "
                "write np.asarray(value), or its parts as fields of a dict ({'data': np.ma.getdata(value), "
                "'mask': np.ma.getmaskarray(value)})"
            )
            error.failed_item = where if one else None  # type: ignore[attr-defined]  # read by write_npy's message
            raise error


def _all_arrays(values: list) -> bool:
    return bool(values) and all(isinstance(v, np.ndarray) for v in values)


def _field(name: str, value: Any) -> Field:
    if not isinstance(value, np.ndarray):
        raise TypeError(
            f"write_npy: field {name!r} of item 0 collates into a {type(value).__name__}, not an array: items "
            f"must be arrays or numbers, or tuples or dicts of them (not nested){_hint(value)}"
        )
    if value.dtype.fields is not None:
        raise TypeError(
            f"write_npy: field {name!r} of item 0 holds values of a structured dtype ({value.dtype}), which "
            "write_npy does not take: make each of its fields a key of a dict item, "
            "{key: item[key] for key in item.dtype.names}"
        )
    if value.dtype.hasobject or value.dtype.itemsize == 0:
        what = "Python objects" if value.dtype.hasobject else "values of size 0"
        raise TypeError(
            f"write_npy: field {name!r} of item 0 holds {what} (dtype {value.dtype}), which a .npy file cannot "
            "store as plain data: use numbers, booleans, fixed-width strings or datetimes"
        )
    return Field(name, value.dtype, tuple(value.shape[1:]))


def _shown(kind: str, names: list[str], one: bool = False) -> str:
    if kind == "array":
        return "an array" if one else "arrays"
    if kind == "tuple":
        return f"a tuple of {len(names)}" if one else f"tuples of {len(names)}"
    return f"a dict with keys {names}" if one else f"dicts with keys {names}"


def _holds(dtype: np.dtype, values: np.ndarray) -> bool:
    """Whether a field of ``dtype`` holds ``values`` as they are: a safe cast, numbers still numbers, no time wrapped.

    numpy calls safe a cast of numbers to strings, and of times to a finer unit, where those outside its range wrap.

    >>> _holds(np.dtype("f4"), np.array([3], "i1")), _holds(np.dtype("U5"), np.array(3, "i1"))
    (True, False)
    >>> _holds(np.dtype("M8[ns]"), np.array(["2020-01-01", "2500-01-01"], "M8[D]"))
    False
    """
    return (
        same_kind_of_value(values.dtype, dtype)
        and np.can_cast(values.dtype, dtype, "safe")
        and keeps_values(values, dtype)
    )


def _strings_or_times_differ(dtype: np.dtype, values: list) -> bool:
    """Whether some of ``values`` are not strings or times of ``dtype``'s kind (and unit, for times).

    >>> _strings_or_times_differ(np.dtype("U3"), ["ab", "abcd"]), _strings_or_times_differ(np.dtype("U3"), ["ab", 3])
    (False, True)
    """
    if dtype.kind in "US" and set(map(type, values)) == {np.str_ if dtype.kind == "U" else np.bytes_}:
        return False  # numpy's own strings
    for value in values:
        found = value.dtype if isinstance(value, (np.ndarray, np.generic)) else np.asarray(value).dtype
        if found.kind != dtype.kind or (found.kind in "mM" and found != dtype):
            return True
    return False


def _dtypes_round(dtypes: set[np.dtype]) -> bool:
    """Whether arrays of ``dtypes`` stacked together could change some value: some dtype does not cast safely to
    the one numpy stacks them in.

    >>> _dtypes_round({np.dtype("f8")}), _dtypes_round({np.dtype("i4"), np.dtype("f8")})
    (False, False)
    >>> _dtypes_round({np.dtype("i8"), np.dtype("f8")}), _dtypes_round({np.dtype("i8"), np.dtype("u8")})
    (True, True)
    """
    if len(dtypes) < 2:
        return False
    try:
        common = np.result_type(*dtypes)
    except TypeError:  # they do not stack at all: stacking says so
        return False
    return not all(_casts_exactly(dtype, common) for dtype in dtypes)


def _casts_exactly(source: np.dtype, dtype: np.dtype) -> bool:
    """Whether every value of ``source`` is held by ``dtype`` as it is (numpy calls int64 to float64 safe; it rounds).

    >>> _casts_exactly(np.dtype("i4"), np.dtype("f8")), _casts_exactly(np.dtype("i8"), np.dtype("f8"))
    (True, False)
    """
    if source.kind in "iub" and dtype.kind in "fc":
        bits = 8 * source.itemsize - (source.kind == "i")  # of magnitude
        return bits <= np.finfo(dtype).nmant + 1
    return bool(np.can_cast(source, dtype, "safe"))


_dtype = operator.attrgetter("dtype")


def _short_batch_hint(shape: tuple[int, ...], first: tuple[int, ...]) -> str:
    """What to do when rows of ``shape`` look like a short last batch after batches of rows of ``first``."""
    if len(shape) == len(first) >= 1 and shape[1:] == first[1:] and shape[0] < first[0]:
        return "; a short last batch? batch(..., drop_last=True) leaves it out (or write the samples unbatched)"
    return ""
