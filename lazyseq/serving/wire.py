"""What travels between a data server and its consumers: JSON headers and raw array buffers, never pickle.

A message is a list of frames: the protocol tag, the message kind, a JSON
header, then zero or more raw buffers. An item is sent as a *tree* in the
header plus one buffer per array (or ``bytes`` value):

==========================  ======================================================
value                       in the tree
==========================  ======================================================
``str``, ``int``, ``float``,  the JSON value itself
``bool``, ``None``
``complex``                 ``{"c": [real, imag]}``
``tuple`` (namedtuples too) ``{"t": [children]}``
``list``                    ``{"l": [children]}``
``dict``, any ``Mapping``   ``{"d": [[key, value], ...]}`` (keys are trees too)
numpy array                 ``{"a": [k, dtype, shape]}``: buffer ``k``
numpy scalar                ``{"s": [k, dtype]}``: buffer ``k``, one element
``bytes``                   ``{"b": k}``: buffer ``k``
==========================  ======================================================

Anything else (an array of Python objects, a set, an instance of a class)
is refused by :func:`encode` with a ``TypeError`` naming what and where, so
nothing that needs code to rebuild ever crosses the socket. :func:`decode`
checks every part of what it is given (types, dtype, sizes, nesting) and
raises :class:`ProtocolError` for anything malformed; it runs no code of the
sender's choosing. A namedtuple arrives as a plain tuple and an
``OrderedDict`` as a dict (rebuilding their types would mean importing code
named by the sender).

>>> import numpy as np
>>> header, buffers = encode({"x": np.arange(3.0), "label": 7, "ids": ("a", b"zz")})
>>> header
{'d': [['x', {'a': [0, '<f8', [3]]}], ['label', 7], ['ids', {'t': ['a', {'b': 1}]}]]}
>>> decode(header, buffers)
{'x': array([0., 1., 2.]), 'label': 7, 'ids': ('a', b'zz')}
"""

from __future__ import annotations

import json
import math
import re
import struct
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = [
    "CUT",
    "MAX_DEPTH",
    "MAX_POSITIONS",
    "TAG",
    "ProtocolError",
    "decode",
    "decode_spec",
    "dumps",
    "encode",
    "encode_spec",
    "loads",
]

TAG = b"lazyseq/4"  # the first frame of every message: which protocol, which version


def another_version(tag: bytes) -> bool:
    """Whether ``tag`` is the tag of another version of this protocol (a client or server of another lazyseq).

    >>> another_version(b"lazyseq/1"), another_version(TAG), another_version(CUT), another_version(b"fuel")
    (True, False, False, False)
    """
    return tag != TAG and tag.startswith(b"lazyseq/") and len(tag) <= 16 and tag[8:].isdigit()


# The last frame of a message that a consumer stopped sending part-way (a Ctrl-C between two frames): dropped whole.
CUT = b"lazyseq/cut"
MAX_DEPTH = 64  # nesting deeper than this is refused, on both sides
# numpy's own limit on an array's dimensions: a header announcing more is refused, not left to numpy's ValueError
MAX_DIMENSIONS = 64 if np.lib.NumpyVersion(np.__version__) >= "2.0.0" else 32
MAX_INT_BITS = 4096  # larger ints are refused (JSON parsers stop at about 4,300 digits)
MAX_COUNT = 256  # items one 'get' may ask for, one answer each
MAX_STEP = 2**63 - 1  # how far apart the reads of a consumer that reads at a step may be (an int64, as an index)
REQUEST_INT_DIGITS = 19  # the longest integer of a request (a request's or an item's number: any int64)
# items one 'get' may ask for as one chunk, one answer for all (positions of 19 digits fit in a request's 64 KiB)
MAX_POSITIONS = 2048
MAX_TIMEOUT = 86400.0  # seconds: the longest silence a consumer may ask the server to wait out (its hello's timeout)
_MAX_DTYPE_CHARS = 32
_MAX_ELEMENTS = 2**63 - 1  # numpy counts an array's elements in a signed 64-bit integer
# values of no bytes ("V0") hold no memory, but numpy copies (stacks) them one by one: 2**62 of them, for ever
MAX_EMPTY_ELEMENTS = 2**24


class ProtocolError(ValueError):
    """A message that does not follow the protocol: malformed, truncated, or not what was expected."""


_JSON = json.JSONEncoder(separators=(",", ":"), allow_nan=False)  # one for all: json.dumps makes one per call
_JSON_DECODER = json.JSONDecoder()  # given text: json.loads of bytes first guesses their encoding


def heartbeat_interval(timeout: float) -> float:
    """How often a consumer whose ``timeout`` this is pings its server: a quarter of it, a second at most."""
    return min(timeout / 4, 1.0)


def dumps(header: Any) -> bytes:
    """A header as the bytes of its frame."""
    return _JSON.encode(header).encode()


def loads(frame: bytes | memoryview, *, request: bool = False) -> Any:
    """A header from the bytes of its frame; :class:`ProtocolError` if it is not JSON.

    A consumer's ``request`` holds no item: numbers in it are request and item
    numbers, and one longer than any of them is refused.

    >>> loads(b'{"req": 12345678901234567890123}', request=True)
    Traceback (most recent call last):
    ...
    lazyseq.serving.wire.ProtocolError: a header is not valid JSON (an integer of 23 digits: longer than any count)
    """
    # (numbers checked one by one only where the frame has a run of digits that long: the C parser does the rest)
    checked = request and bytes(frame).translate(_DIGITS_AS_ZERO).find(_LONG_RUN) >= 0
    try:
        return (_REQUEST_DECODER if checked else _JSON_DECODER).decode(str(frame, "utf-8"))
    except (ValueError, RecursionError) as error:  # not JSON, not UTF-8, an int too long to convert...
        raise ProtocolError(f"a header is not valid JSON ({error})") from None


_DIGITS_AS_ZERO = bytes(ord("0") if chr(b).isdigit() and b < 128 else ord(" ") for b in range(256))
_LONG_RUN = b"0" * (REQUEST_INT_DIGITS + 1)


def _request_int(text: str) -> int:
    if len(text.lstrip("-")) > REQUEST_INT_DIGITS:
        raise ValueError(f"an integer of {len(text.lstrip('-'))} digits: longer than any count")
    return int(text)


_REQUEST_DECODER = json.JSONDecoder(parse_int=_request_int)


# -- encoding (the server) -------------------------------------------------------------------


def encode(value: Any) -> tuple[Any, list]:
    """The tree of ``value`` and the buffers it refers to; ``TypeError`` for anything not allowed.

    Arrays are sent from their own memory where they are contiguous (no copy).
    """
    buffers = _Buffers()
    return _encode(value, buffers, "the item", 0), buffers


class _Buffers(list):
    """The buffers of an item's arrays; and how many values of no bytes they hold."""

    empty_values = 0


def _encode(value: Any, buffers: _Buffers, where: str, depth: int) -> Any:
    if depth > MAX_DEPTH:
        raise TypeError(f"{where} is nested more than {MAX_DEPTH} levels deep")
    kind = type(value)
    if kind is int or (kind is not bool and isinstance(value, int)):
        if value.bit_length() > MAX_INT_BITS:
            raise TypeError(
                f"{where} is an int of {value.bit_length()} bits: larger than {MAX_INT_BITS} bits cannot be sent"
            )
        return int(value)  # a subclass (an IntEnum...) is sent as the plain value
    if kind is str or kind is bool or value is None:
        return value
    if kind is float:
        return value if math.isfinite(value) else {"f": _special_float(value)}  # JSON has no nan or inf
    if isinstance(value, np.ndarray):
        if type(value) is not np.ndarray and not isinstance(value, np.memmap):  # a masked array, a matrix...
            raise TypeError(
                f"{where} is a {type(value).__module__}.{type(value).__qualname__}: only plain numpy arrays are sent "
                "(what the subclass adds, a mask for one, would be lost); convert it with np.asarray or send its parts"
            )
        if value.dtype.kind == "T":  # numpy's StringDType: strings of any length, stored outside the array
            raise TypeError(
                f"{where} is an array of variable-width strings (dtype {value.dtype}): their bytes are not in the "
                "array's buffer; convert it to a fixed-width str dtype (np.array(value.tolist()), or "
                "value.astype('U20') for strings of 20 characters at most), or to a list"
            )
        if value.dtype.hasobject:
            raise TypeError(
                f"{where} is an array of Python objects (dtype {value.dtype}): only arrays of plain data can be "
                "sent; convert it to a numeric, bytes or str dtype, or to a list"
            )
        if not value.dtype.itemsize:  # (what a consumer would refuse)
            buffers.empty_values += value.size
            if buffers.empty_values > MAX_EMPTY_ELEMENTS:
                raise TypeError(f"{where} makes {_too_many_empty(buffers.empty_values, value.dtype)}")
        buffers.append(_raw_bytes(value))
        return {"a": [len(buffers) - 1, _dtype_name(value.dtype, where), list(value.shape)]}
    if isinstance(value, np.generic):
        if value.dtype.hasobject:
            raise TypeError(f"{where} is a numpy object scalar: only plain data can be sent")
        scalar = np.asarray(value)  # its dtype, not the scalar's: an empty np.str_ is one "<U1", not "<U0"
        buffers.append(_raw_bytes(scalar))
        return {"s": [len(buffers) - 1, _dtype_name(scalar.dtype, where)]}
    if isinstance(value, tuple):
        return {"t": [_encode(v, buffers, f"{where}[{k}]", depth + 1) for k, v in enumerate(value)]}
    if isinstance(value, list):
        return {"l": [_encode(v, buffers, f"{where}[{k}]", depth + 1) for k, v in enumerate(value)]}
    if isinstance(value, Mapping):
        return {
            "d": [
                [_encode(k, buffers, f"a key of {where}", depth + 1), _encode(v, buffers, f"{where}[{k!r}]", depth + 1)]
                for k, v in value.items()
            ]
        }
    if isinstance(value, bytes):
        buffers.append(value)
        return {"b": len(buffers) - 1}
    if isinstance(value, complex):
        return {"c": [_encode(value.real, buffers, where, depth), _encode(value.imag, buffers, where, depth)]}
    if isinstance(value, float):
        return _encode(float(value), buffers, where, depth)
    if isinstance(value, str):
        return str.__str__(value)  # its text: an enum's str() would be its name
    convert = "; make it one in the pipeline (.numpy(), np.asarray)" if hasattr(value, "__array__") else ""
    raise TypeError(
        f"{where} is a {kind.__module__}.{kind.__qualname__}, which cannot be sent: items may hold numpy arrays, "
        f"numbers, strings, bytes and None, in tuples, lists and dicts{convert}"
    )


def _raw_bytes(array: np.ndarray) -> np.ndarray:
    """The bytes of ``array`` as a flat ``uint8`` array, without a copy where it is contiguous.

    (Some dtypes, ``datetime64`` among them, cannot be exported as a buffer as they are.)
    """
    return np.ascontiguousarray(array).reshape(-1).view(np.uint8)


def _dtype_name(dtype: np.dtype, where: str) -> str:
    if dtype.fields is not None or dtype.subdtype is not None:
        raise TypeError(f"{where} has a structured dtype ({dtype}): send its fields as separate arrays")
    return dtype.str


# -- decoding (the consumer) -------------------------------------------------------------------


def decode(tree: Any, buffers: Sequence) -> Any:
    """The value that ``tree`` and ``buffers`` describe; :class:`ProtocolError` if they do not fit together.

    Arrays are built over the received buffers without a copy (read-only where
    the buffer is).
    """
    used = _Used([False] * len(buffers))
    try:
        value = _decode(tree, buffers, used, 0)
    except (ValueError, TypeError, OverflowError, SystemError) as error:  # but ProtocolError: a check missed
        if isinstance(error, ProtocolError):
            raise
        raise ProtocolError(f"the item cannot be read: {type(error).__name__}: {error}") from None
    if not all(used):
        raise ProtocolError(f"{used.count(False)} buffer(s) of the message are not part of the item")
    return value


def _decode(node: Any, buffers: Sequence, used: _Used, depth: int) -> Any:
    if depth > MAX_DEPTH:
        raise ProtocolError(f"the item is nested more than {MAX_DEPTH} levels deep")
    kind = type(node)
    if kind is str or kind is int or kind is float or kind is bool or node is None:
        return node
    if kind is not dict or len(node) != 1:
        raise ProtocolError(f"not a node of an item: {_short(node)}")
    ((tag, body),) = node.items()
    if tag == "t":
        return tuple(_decode(child, buffers, used, depth + 1) for child in _list(body, tag))
    if tag == "l":
        return [_decode(child, buffers, used, depth + 1) for child in _list(body, tag)]
    if tag == "d":
        pairs = _list(body, tag)
        result = {}
        for pair in pairs:
            if type(pair) is not list or len(pair) != 2:
                raise ProtocolError(f"a dict entry is not a [key, value] pair: {_short(pair)}")
            key = _decode(pair[0], buffers, used, depth + 1)
            try:
                result[key] = _decode(pair[1], buffers, used, depth + 1)
            except TypeError:  # an unhashable key (a list)
                raise ProtocolError(f"a dict key cannot be a {type(key).__name__}") from None
        return result
    if tag == "a":
        k, dtype, shape = _fields(body, tag, 3)
        return _array(buffers, used, k, dtype, shape)
    if tag == "s":
        k, dtype = _fields(body, tag, 2)
        return _array(buffers, used, k, dtype, [1])[0]
    if tag == "b":
        return bytes(_buffer(buffers, used, body))
    if tag == "c":
        parts = [_decode(part, buffers, used, depth) for part in _fields(body, tag, 2)]  # numbers: no deeper
        if not all(type(part) in (int, float) for part in parts):
            raise ProtocolError(f"a complex number has parts that are not numbers: {_short(body)}")
        try:
            return complex(*parts)
        except OverflowError:  # an int too large for a float
            raise ProtocolError(f"a complex number has parts too large: {_short(body)}") from None
    if tag == "f":
        if body in ("nan", "inf", "-inf"):
            return float(body)
        if type(body) is str and _NAN_BITS.fullmatch(body):
            value = _FLOAT.unpack(int(body[4:], 16).to_bytes(8, "big"))[0]
            if math.isnan(value):
                return value
        raise ProtocolError(f"not a special float: {_short(body)}")
    raise ProtocolError(f"unknown kind of node {tag!r}")


_FLOAT = struct.Struct(">d")
_NAN_BITS = re.compile(r"nan:[0-9a-f]{16}")
_PLAIN_NAN = _FLOAT.pack(math.nan)


def _special_float(value: float) -> str:
    """An infinity or a NaN as text: ``"nan"``, or a NaN of another sign or payload as its bits (``"nan:fff8..."``).

    >>> _special_float(float("-inf")), _special_float(-math.nan)
    ('-inf', 'nan:fff8000000000000')
    """
    if value == value or _FLOAT.pack(value) == _PLAIN_NAN:
        return repr(value)
    return "nan:" + _FLOAT.pack(value).hex()


def _list(body: Any, tag: str) -> list:
    if type(body) is not list:
        raise ProtocolError(f"node {tag!r} does not hold a list: {_short(body)}")
    return body


def _fields(body: Any, tag: str, count: int) -> list:
    if type(body) is not list or len(body) != count:
        raise ProtocolError(f"node {tag!r} does not hold {count} fields: {_short(body)}")
    return body


def _buffer(buffers: Sequence, used: _Used, k: Any) -> Any:
    if type(k) is not int or not 0 <= k < len(buffers):
        raise ProtocolError(f"buffer {_short(k)} does not exist: the message has {len(buffers)}")
    if used[k]:
        raise ProtocolError(f"buffer {k} is used twice")
    used[k] = True
    return buffers[k]


def _array(buffers: Sequence, used: _Used, k: Any, dtype_name: Any, shape: Any) -> np.ndarray:
    dtype = _plain_dtype(dtype_name)
    count = _element_count(shape)
    buffer = memoryview(_buffer(buffers, used, k))
    if buffer.nbytes != count * dtype.itemsize:
        raise ProtocolError(
            f"buffer {k} holds {buffer.nbytes} bytes, an array {dtype} {tuple(shape)} needs {count * dtype.itemsize}"
        )
    if not dtype.itemsize:  # np.frombuffer refuses values of no bytes ("V0"): there is nothing to read
        used.empty_values += count
        if used.empty_values > MAX_EMPTY_ELEMENTS:
            raise ProtocolError(_too_many_empty(used.empty_values, dtype))
        return np.empty(shape, dtype)
    try:
        array = np.frombuffer(buffer, dtype).reshape(shape)
    except (TypeError, ValueError) as error:  # numpy refuses something the checks above let through
        raise ProtocolError(f"buffer {k} cannot be read as an array {dtype} {tuple(shape)}: {error}") from None
    if dtype.kind == "U" and count and np.frombuffer(buffer, dtype.byteorder.replace("|", "=") + "u4").max() > 0x10FFFF:
        raise ProtocolError(f"buffer {k} holds characters beyond Unicode's last (0x10FFFF)")  # numpy cannot read them
    return array


class _Used(list):
    """Which buffers an item's arrays took so far (a bool each); and how many values of no bytes they hold."""

    empty_values = 0


def _too_many_empty(count: int, dtype: np.dtype) -> str:
    return (
        f"{count} values of no bytes ({dtype}) in arrays of one item: more than {MAX_EMPTY_ELEMENTS} (each copy of "
        "them would take each in turn)"
    )


def _plain_dtype(name: Any) -> np.dtype:
    dtype = _plain_dtypes.get(name) if type(name) is str else None  # (one per array of every item read: kept)
    if dtype is not None:
        return dtype
    dtype = _checked_plain_dtype(name)
    if len(_plain_dtypes) >= _KEPT_DTYPES:
        _plain_dtypes.clear()
    _plain_dtypes[name] = dtype
    return dtype


_plain_dtypes: dict[str, np.dtype] = {}  # the names read so far, each checked once
_KEPT_DTYPES = 256


def _checked_plain_dtype(name: Any) -> np.dtype:
    if type(name) is not str or len(name) > _MAX_DTYPE_CHARS:
        raise ProtocolError(f"not a dtype: {_short(name)}")
    try:
        dtype = np.dtype(name)
    except (TypeError, ValueError, SyntaxError):  # numpy reads some names as Python literals
        raise ProtocolError(f"not a dtype: {name!r}") from None
    if dtype.hasobject or dtype.fields is not None or dtype.subdtype is not None:
        raise ProtocolError(f"dtype {name!r} is not allowed: only plain data travels")
    if not dtype.itemsize and dtype.kind in "SU":  # no array has it: numpy makes strings of one character instead
        raise ProtocolError(f"dtype {name!r} is not allowed: strings of no characters")
    return dtype


def _element_count(shape: Any) -> int:
    """The number of elements of an array of ``shape``; a ``ProtocolError`` unless numpy can make one (values of no
    bytes, "V0", may announce any)."""
    if (
        type(shape) is not list
        or len(shape) > MAX_DIMENSIONS
        or not all(type(n) is int and 0 <= n <= _MAX_ELEMENTS for n in shape)
        or (count := math.prod(shape)) > _MAX_ELEMENTS
    ):
        raise ProtocolError(f"not an array shape: {_short(shape)}")
    return count


# -- what the items of a served view are -----------------------------------------------------


def encode_spec(spec: tuple | None) -> Any:
    """A view's ``_item_spec()`` as JSON, where it holds only what travels (plain dtypes); else None.

    >>> import numpy as np
    >>> encode_spec(("tuple", (("array", np.dtype(">f8"), (2,)), None)))
    ['tuple', [['array', '>f8', [2]], None]]
    >>> decode_spec(_)[1][0][1]
    dtype('>f8')
    """
    if spec is None:
        return None
    if spec[0] == "array":
        _, dtype, shape = spec
        if dtype.hasobject or dtype.fields is not None or dtype.subdtype is not None or dtype.kind == "T":
            return None
        return ["array", dtype.str, list(shape)]
    fields = [encode_spec(s) for s in spec[1]]
    if spec[0] == "dict":
        keys = list(spec[2])
        return ["dict", fields, keys] if all(type(key) is str for key in keys) else None
    return ["tuple", fields]


def decode_spec(node: Any, depth: int = 0) -> tuple | None:
    """The spec that :func:`encode_spec` made; :class:`ProtocolError` if ``node`` is not one."""
    if node is None:
        return None
    if depth > MAX_DEPTH:
        raise ProtocolError(f"the items' description is nested more than {MAX_DEPTH} levels deep")
    if type(node) is list and len(node) == 3 and node[0] == "array":
        _element_count(node[2])
        return ("array", _plain_dtype(node[1]), tuple(node[2]))
    if type(node) is list and len(node) == 2 and node[0] == "tuple" and type(node[1]) is list:
        return ("tuple", tuple(decode_spec(s, depth + 1) for s in node[1]))
    if type(node) is list and len(node) == 3 and node[0] == "dict" and type(node[1]) is list and type(node[2]) is list:
        keys = node[2]
        if all(type(key) is str for key in keys) and len(keys) == len(node[1]) == len(set(keys)):
            return ("dict", tuple(decode_spec(s, depth + 1) for s in node[1]), tuple(keys))
    raise ProtocolError(f"not a description of items: {_short(node)}")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
