"""The data server's wire: messages, headers and frames, as each side writes and checks them.

Servers listen on 127.0.0.1 only; every server, consumer and process a test starts is stopped by it.
"""

import math
import struct

import numpy as np
import pytest
import served_pipelines
from loader_helpers import same

zmq = pytest.importorskip("zmq")

from lazyseq.serving import wire  # noqa: E402


def test_wire_round_trip_keeps_values_and_types():
    for i in (0, 5):
        item = served_pipelines.assorted_item(i)
        tree, buffers = wire.encode(item)
        frames = [wire.dumps(tree), *(memoryview(b).cast("B") for b in buffers)]
        same(wire.decode(wire.loads(frames[0]), frames[1:]), item)


def test_wire_sends_a_str_subclass_as_its_text_not_as_what_str_gives():
    import enum

    class Color(str, enum.Enum):  # noqa: UP042  # what code written before StrEnum does
        RED = "red"

    class Tagged(str):
        def __str__(self):
            return "tagged"

    tree, buffers = wire.encode([Color.RED, {"c": Color.RED}, Tagged("abc")])
    assert wire.decode(wire.loads(wire.dumps(tree)), buffers) == ["red", {"c": "red"}, "abc"]


NUMPY_HAS_STRING_DTYPE = hasattr(getattr(np, "dtypes", None), "StringDType")


@pytest.mark.parametrize(
    "item, message",
    [
        (np.array([1, None]), "the item is an array of Python objects (dtype object): only arrays of plain data"),
        ((1, {"a": [{2, 3}]}), "the item[1]['a'][0] is a builtins.set, which cannot be sent"),
        (np.zeros(2, dtype=[("a", "f4")]), "the item has a structured dtype ([('a', '<f4')])"),
        ([served_pipelines], "the item[0] is a builtins.module, which cannot be sent"),
        (
            np.ma.masked_array([1, 2], [0, 1]),
            f"the item is a {np.ma.MaskedArray.__module__}.MaskedArray: only plain numpy arrays are sent",
        ),
        ({"n": 2**5000}, "the item['n'] is an int of 5001 bits: larger than 4096 bits cannot be sent"),
        pytest.param(
            np.array(["ab", "c"], dtype=np.dtypes.StringDType()) if NUMPY_HAS_STRING_DTYPE else None,
            "the item is an array of variable-width strings (dtype StringDType()): their bytes are not in the array's "
            "buffer; convert it to a fixed-width str dtype",
            marks=pytest.mark.skipif(not NUMPY_HAS_STRING_DTYPE, reason="numpy's StringDType came with numpy 2"),
        ),
    ],
)
def test_wire_refuses_what_needs_code_to_rebuild(item, message):
    with pytest.raises(TypeError) as caught:
        wire.encode(item)
    assert str(caught.value).startswith(message)


def test_an_array_like_that_cannot_be_sent_is_told_how_to_become_one():
    class Column:  # what makes an array (a torch tensor, a pandas Series)
        def __array__(self, dtype=None, copy=None):
            return np.zeros(2)

    with pytest.raises(TypeError) as caught:
        wire.encode((1, Column()))
    assert str(caught.value).endswith(
        "which cannot be sent: items may hold numpy arrays, numbers, strings, bytes and None, in tuples, lists and "
        "dicts; make it one in the pipeline (.numpy(), np.asarray)"
    )


@pytest.mark.parametrize(
    "tree, buffers, message",
    [
        ({"a": [0, "<f8", [2]]}, [b"x" * 8], "buffer 0 holds 8 bytes, an array float64 (2,) needs 16"),
        ({"a": [0, "|O", [1]]}, [b"x" * 8], "dtype '|O' is not allowed: only plain data travels"),
        ({"a": [0, "no such", [1]]}, [b"x"], "not a dtype: 'no such'"),
        ({"a": [1, "<f8", [1]]}, [b"x" * 8], "buffer 1 does not exist: the message has 1"),
        ({"t": [{"b": 0}, {"b": 0}]}, [b"x"], "buffer 0 is used twice"),
        ({"l": []}, [b"x"], "1 buffer(s) of the message are not part of the item"),
        ({"zz": 1}, [], "unknown kind of node 'zz'"),
        ({"a": 1, "b": 2}, [], "not a node of an item: {'a': 1, 'b': 2}"),
        ({"a": [0, "<f8", [-1]]}, [b""], "not an array shape: [-1]"),
        ({"d": [[{"l": []}, 1]]}, [], "a dict key cannot be a list"),
        ({"f": "1e999"}, [], "not a special float: '1e999'"),
        ({"c": [10**400, 0]}, [], "a complex number has parts too large: [1" + "0" * 55 + "..."),
        ({"s": [0, "|S,|,1"]}, [b"x"], "not a dtype: '|S,|,1'"),  # numpy's SyntaxError, reading it as Python
        ({"a": [0, "U0", [2**28]]}, [b""], "dtype 'U0' is not allowed: strings of no characters"),  # not 1 GiB
        (
            {"a": [0, "V0", [2**62, 4]]},
            [b""],
            "not an array shape: [4611686018427387904, 4]",
        ),
        (  # many arrays, each within the limit: the item's values count together
            {"l": [{"a": [k, "V0", [2**23]]} for k in range(3)]},
            [b""] * 3,
            f"{3 * 2**23} values of no bytes (|V0) in arrays of one item: more than 16777216 (each copy of them would "
            "take each in turn)",
        ),
        (  # no memory, but a copy (a batch stacked) would go through each value in turn: for ever
            {"a": [0, "V0", [2**62]]},
            [b""],
            f"{2**62} values of no bytes (|V0) in arrays of one item: more than 16777216 (each copy of them would "
            "take each in turn)",
        ),
        ({"s": [0, "<U1"]}, [b"\xff\xff\xff\xff"], "buffer 0 holds characters beyond Unicode's last (0x10FFFF)"),
        ({"a": [0, "|V0", [0, 2**70]]}, [b""], f"not an array shape: [0, {2**70}]"),  # no elements, too long a side
    ],
)
def test_wire_rejects_malformed_items(tree, buffers, message):
    with pytest.raises(wire.ProtocolError) as caught:
        wire.decode(tree, buffers)
    assert str(caught.value) == message


def test_wire_keeps_the_sign_and_payload_of_a_nan():
    # A NaN went as the text 'nan': one with its sign bit set arrived without it.
    odd = struct.unpack(">d", bytes.fromhex("7ff8000000000123"))[0]
    sent = [-math.nan, math.nan, odd, complex(-math.nan, 1), float("-inf")]
    tree, buffers = wire.encode(sent)
    back = wire.decode(wire.loads(wire.dumps(tree)), buffers)
    bits = [struct.pack(">d", x).hex() for x in [*back[:3], back[3].real, back[4]]]
    assert bits == ["fff8000000000000", "7ff8000000000000", "7ff8000000000123", "fff8000000000000", "fff0000000000000"]
    for garbled in ("nan:3ff0000000000000", "nan:fff8", "nan:FFF8000000000000", 1.5):  # a NaN's bits, of a NaN only
        with pytest.raises(wire.ProtocolError, match="^not a special float: "):
            wire.decode({"f": garbled}, [])


def test_wire_keeps_complex_numbers_with_nan_and_inf():
    tree, buffers = wire.encode([complex(float("nan"), 1), complex(0, float("-inf"))])
    nan, inf = wire.decode(wire.loads(wire.dumps(tree)), buffers)
    assert nan.real != nan.real and nan.imag == 1 and inf == complex(0, float("-inf"))


def test_wire_carries_what_it_sends_at_its_limits():
    # Sent, then refused by the consumer: arrays of 33 to 64 dimensions, a complex number at the deepest level.
    deepest = 1 + 2j
    for _ in range(wire.MAX_DEPTH):
        deepest = [deepest]
    for item in (np.zeros((1,) * NUMPY_MAX_DIMENSIONS), deepest):
        tree, buffers = wire.encode(item)
        same(wire.decode(wire.loads(wire.dumps(tree)), buffers), item)


def test_wire_refuses_arrays_of_more_dimensions_than_numpy_makes():
    # Before numpy 2 (32 dimensions at most), a header of 33 to 64 raised numpy's ValueError, not ProtocolError.
    shape = [1] * (NUMPY_MAX_DIMENSIONS + 1)
    with pytest.raises(wire.ProtocolError) as caught:
        wire.decode({"a": [0, "<f8", shape]}, [b"x" * 8])
    assert str(caught.value).startswith("not an array shape: [1, 1, 1")


def numpy_max_dimensions() -> int:
    for dimensions in (64, 32):  # numpy 2, numpy 1
        try:
            np.empty((1,) * dimensions)
        except ValueError:
            continue
        return dimensions
    raise AssertionError("numpy makes arrays of fewer than 32 dimensions")


NUMPY_MAX_DIMENSIONS = numpy_max_dimensions()


def test_wire_rejects_deep_nesting_and_bad_json():
    deep = 0
    for _ in range(wire.MAX_DEPTH + 2):
        deep = {"t": [deep]}
    with pytest.raises(wire.ProtocolError, match="nested more than 64 levels"):
        wire.decode(deep, [])
    with pytest.raises(wire.ProtocolError, match="a header is not valid JSON"):
        wire.loads(b"\xff{")
    with pytest.raises(wire.ProtocolError, match="Exceeds the limit"):  # a ValueError of json, not a crash
        wire.loads(b"1" * 5000)
