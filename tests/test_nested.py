"""lazyseq.nested: one rule for walking nested results, the same through every entry point that walks them."""

import pickle
from collections import Counter, OrderedDict, namedtuple
from collections.abc import Mapping

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import lazyseq
from lazyseq.loading import structure
from lazyseq.nested import describe, flatten, is_plain_array, map_leaves, rebuild, skeleton_key

Pair = namedtuple("Pair", "x y")


class Frozen(Mapping):
    """A read-only mapping that is not a dict: walked, and rebuilt as a dict."""

    def __init__(self, **items):
        self._items = dict(items)

    def __getitem__(self, key):
        return self._items[key]

    def __iter__(self):
        return iter(self._items)

    def __len__(self):
        return len(self._items)


class Tags(list):
    """A list subclass: walked, and rebuilt as a plain list."""


class Span(tuple):
    """A tuple subclass that is not a namedtuple: walked, and rebuilt as a plain tuple."""


# -- the rule, on the skeleton ------------------------------------------------------------------


def test_every_kind_of_container_and_value_in_one_skeleton():
    a, b, c, d = np.arange(3), np.zeros((2, 2)), np.ones(1, np.float32), np.arange(2, dtype=np.uint8)
    objects = np.array([None, "x"], dtype=object)
    tree = OrderedDict(
        z=Pair(a, [b, "label", b"raw"]),
        m=Frozen(k=c, n=3),
        t=Span((d, None)),
        l=Tags([objects, [[a]]]),
    )
    leaves = []
    skeleton = flatten(tree, leaves)
    assert skeleton == (
        "o",
        ("z", "m", "t", "l"),
        [
            ("n", Pair, [("a", 0), ("l", [("a", 1), ("v", "label"), ("v", b"raw")])]),
            ("d", ("k", "n"), [("a", 2), ("v", 3)]),
            ("t", [("a", 3), ("v", None)]),
            ("l", [("v", objects), ("l", [("l", [("a", 4)])])]),
        ],
    )
    assert [x is y for x, y in zip(leaves, [a, b, c, d, a])] == [True] * 5

    back = rebuild(skeleton, leaves)
    assert type(back) is OrderedDict and list(back) == ["z", "m", "t", "l"]
    assert type(back["z"]) is Pair and back["z"].x is a and back["z"].y[1:] == ["label", b"raw"]
    assert type(back["m"]) is dict and back["m"] == {"k": c, "n": 3}
    assert type(back["t"]) is tuple and back["t"][0] is d and back["t"][1] is None
    assert type(back["l"]) is list and back["l"][0] is objects and back["l"][1][0][0] is a


def test_strings_bytes_and_scalars_are_values_never_walked():
    for value in ("abc", b"abc", "", 3, 2.5, None, np.float64(1.0), {1, 2}, np.array([object()])):
        leaves = []
        assert flatten(value, leaves) == ("v", value)
        assert leaves == []
    assert flatten(("ab", ["c"]), []) == ("t", [("v", "ab"), ("l", [("v", "c")])])


def test_a_plain_array_of_any_dtype_but_object_is_the_default_leaf():
    kinds = [np.zeros(2), np.array(["a"]), np.array([1], "M8[D]"), np.array([{}])]
    assert [is_plain_array(x) for x in kinds] == [True, True, True, False]

    class Marked(np.ndarray):
        pass

    mapped = np.zeros(2).view(np.memmap)
    assert flatten([mapped], leaves := []) == ("l", [("a", 0)]) and leaves[0] is mapped  # a memory map is data
    for whole in (np.zeros(2).view(Marked), np.ma.masked_array([1.0, 2.0], mask=[False, True])):
        # Its bytes alone would lose what the subclass adds: a value, kept as it is.
        assert flatten([whole], leaves := []) == ("l", [("v", whole)]) and leaves == []


def test_dict_subclasses_become_dicts_and_ordered_dict_subclasses_ordered_dicts():
    class Ordered(OrderedDict):
        pass

    counts = Counter(a=np.arange(2), b=np.arange(3))
    assert flatten(counts, []) == ("d", ("a", "b"), [("a", 0), ("a", 1)])
    assert flatten(Ordered(a=np.arange(2)), []) == ("o", ("a",), [("a", 0)])
    assert type(map_leaves(len, counts)) is dict and map_leaves(len, counts) == {"a": 2, "b": 3}
    assert type(map_leaves(len, Ordered(a=np.arange(2)))) is OrderedDict


def test_a_custom_leaf_test_sees_only_what_is_not_a_container():
    seen = []

    def is_int(x):
        seen.append(x)
        return isinstance(x, int)

    leaves = []
    assert flatten({"a": (1, "s"), "b": [2.5]}, leaves, is_leaf=is_int) == (
        "d",
        ("a", "b"),
        [("t", [("a", 0), ("v", "s")]), ("l", [("v", 2.5)])],
    )
    assert leaves == [1] and seen == [1, "s", 2.5]


def test_map_leaves_keeps_the_structure_and_the_values():
    tree = {"p": Pair(np.arange(3), "tag"), "o": OrderedDict(b=np.ones(2), a=[np.zeros(1)]), "f": Frozen(x=np.eye(2))}
    summed = map_leaves(np.sum, tree)
    assert summed == {"p": Pair(3, "tag"), "o": OrderedDict(b=2.0, a=[0.0]), "f": {"x": 2.0}}
    assert type(summed["p"]) is Pair and type(summed["o"]) is OrderedDict and type(summed["f"]) is dict
    assert map_leaves(np.sum, np.arange(4)) == 6


def test_skeleton_key_and_describe_tell_containers_apart():
    def key(tree):
        leaves = []
        return skeleton_key(flatten(tree, leaves), [a.shape for a in leaves])

    x = np.zeros((2, 3))
    assert key({"a": x}) == ("d", ("a",), (2, 3))
    assert key(OrderedDict(a=x)) == ("o", ("a",), (2, 3))
    assert key(Pair(x, 1)) == ("n", Pair, (2, 3), (int,))
    assert key((x, 1)) == ("t", (2, 3), (int,))
    assert key((x,)) != key([x]) and key((x,)) != key(Span((x, x)))
    assert key(Frozen(a=x)) == key({"a": x})

    leaves = []
    skeleton = flatten([OrderedDict(a=x), Pair(x, "s"), (x,), Frozen(k=x)], leaves)
    assert describe(skeleton, [str(a.shape) for a in leaves]) == (
        "[OrderedDict({'a': (2, 3)}), Pair(x=(2, 3), y=str), ((2, 3),), {'k': (2, 3)}]"
    )


# trees of ints in every kind of container: rebuilt with equal contents and, where the rule keeps it, the same type
_trees = st.recursive(
    st.integers() | st.text(max_size=3),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.lists(inner, max_size=3).map(tuple)
        | st.tuples(inner, inner).map(lambda t: Pair(*t))
        | st.dictionaries(st.text(max_size=2), inner, max_size=3)
        | st.dictionaries(st.text(max_size=2), inner, max_size=3).map(OrderedDict)
    ),
    max_leaves=12,
)


@given(_trees)
def test_flatten_then_rebuild_gives_the_tree_back(tree):
    leaves = []
    skeleton = flatten(tree, leaves, is_leaf=lambda x: isinstance(x, int))
    assert all(isinstance(x, int) for x in leaves)
    back = rebuild(pickle.loads(pickle.dumps(skeleton)), leaves)
    assert back == tree and _types(back) == _types(tree)


def _types(tree):
    if isinstance(tree, dict):
        return (type(tree), [(k, _types(v)) for k, v in tree.items()])
    if isinstance(tree, (list, tuple)):
        return (type(tree), [_types(x) for x in tree])
    return type(tree)


# -- the loaders' structure ----------------------------------------------------------------------


def test_loading_structure_round_trip_through_pickle_keeps_the_rule():
    a, b = np.arange(4.0), np.arange(3)
    batch = OrderedDict(x=a, rest=Tags([Pair(b, "s"), Frozen(k=b)]), o=np.array([None]))
    arrays = []
    skeleton = structure.flatten(batch, arrays)
    assert [x is y for x, y in zip(arrays, [a, b, b])] == [True, True, True]
    copies = [x.copy() for x in arrays]  # as the loaders do: the arrays travel apart from the skeleton
    back = structure.rebuild(pickle.loads(pickle.dumps(skeleton)), copies)
    assert type(back) is OrderedDict and list(back) == ["x", "rest", "o"]
    np.testing.assert_array_equal(back["x"], a)
    assert type(back["rest"]) is list and type(back["rest"][0]) is Pair and type(back["rest"][1]) is dict
    np.testing.assert_array_equal(back["rest"][1]["k"], b)
    assert back["rest"][0].y == "s" and back["o"].dtype == object and back["o"][0] is None
    assert structure.signature(skeleton, structure.layout_of(arrays)[0]) == (
        "OrderedDict({'x': float64 (4,), 'rest': [Pair(x=int64 (3,), y=str), {'k': int64 (3,)}], 'o': ndarray})"
    )


# -- evaluate ----------------------------------------------------------------------------------


def rows(n=10):
    return lazyseq.collate([lazyseq.view(np.arange(n * 2.0).reshape(n, 2)), lazyseq.view(np.arange(n))])


def test_evaluate_keeps_an_ordered_dict_and_makes_other_mappings_dicts():
    result = lazyseq.evaluate(lambda b: OrderedDict(y=b[1], x=b[0]), rows(), batch_size=4)
    assert type(result) is OrderedDict and list(result) == ["y", "x"]
    np.testing.assert_array_equal(result["y"], np.arange(10))
    np.testing.assert_array_equal(result["x"], np.arange(20.0).reshape(10, 2))

    result = lazyseq.evaluate(lambda b: Frozen(y=b[1], pair=Span((b[1] * 2, Tags([b[1] + 1])))), rows(), batch_size=4)
    assert type(result) is dict and type(result["pair"]) is tuple and type(result["pair"][1]) is list
    np.testing.assert_array_equal(result["pair"][0], np.arange(0, 20, 2))
    np.testing.assert_array_equal(result["pair"][1][0], np.arange(1, 11))

    out = np.zeros(10, np.int64)
    lazyseq.evaluate(lambda b: OrderedDict(y=b[1]), rows(), batch_size=4, out=Frozen(y=out))
    np.testing.assert_array_equal(out, np.arange(10))


def test_evaluate_concatenates_arrays_of_objects_and_refuses_strings():
    words = lazyseq.evaluate(lambda b: np.array([f"w{i}" for i in b[1]], dtype=object), rows(5), batch_size=2)
    assert words.dtype == object and words.tolist() == ["w0", "w1", "w2", "w3", "w4"]
    with pytest.raises(TypeError, match="evaluate: fn returned a str for batch 0: it must return arrays"):
        lazyseq.evaluate(lambda b: (b[1], ["label"]), rows(), batch_size=4)


def test_evaluate_says_which_container_changed():
    def switch(b):
        return OrderedDict(y=b[1]) if b[1][0] == 0 else {"y": b[1]}

    with pytest.raises(
        ValueError,
        match=r"evaluate: fn returned \{'y': rows of shape \(\)\} for batch 1, "
        r"but OrderedDict\(\{'y': rows of shape \(\)\}\) before",
    ):
        lazyseq.evaluate(switch, rows(), batch_size=4)


# -- lazyseq.torch -------------------------------------------------------------------------------


def test_to_tensors_and_to_device_follow_the_same_rule():
    torch = pytest.importorskip("torch")
    from lazyseq.torch import to_device, to_tensors

    x, y = np.arange(6.0).reshape(3, 2), np.arange(3)
    objects, words = np.array([None, 1], dtype=object), np.array(["a", "b"])
    batch = OrderedDict(
        x=x,
        pair=Pair(y, "s"),
        more=Frozen(k=Span((y,)), l=Tags([x])),
        objects=objects,
        words=words,
        size=torch.Size([2]),
    )
    for convert in (to_tensors, lambda batch: next(to_device([batch], "cpu", ahead=0))):
        got = convert(batch)
        assert type(got) is OrderedDict and list(got) == ["x", "pair", "more", "objects", "words", "size"]
        assert type(got["x"]) is torch.Tensor and np.shares_memory(got["x"].numpy(), x)
        assert type(got["pair"]) is Pair and got["pair"].x.tolist() == [0, 1, 2] and got["pair"].y == "s"
        assert type(got["more"]) is dict and type(got["more"]["k"]) is tuple and type(got["more"]["l"]) is list
        assert got["more"]["k"][0].tolist() == [0, 1, 2] and got["more"]["l"][0].tolist() == x.tolist()
        assert got["objects"] is objects and got["words"] is words  # no tensor type for them: kept
        assert type(got["size"]) is tuple and got["size"] == (2,)  # a tuple subclass, walked
