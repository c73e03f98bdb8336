"""Walking nested results: which containers are opened, and what each is rebuilt as.

A batch or a model's output is often a structure: ``(x, y)``, a dict of
arrays, a namedtuple holding a list. The loaders, :func:`~lazyseq.evaluate`
and ``lazyseq.torch`` walk one through this module, by one rule:

================================================  ===========================================
container (walked)                                rebuilt as
================================================  ===========================================
``tuple``                                         ``tuple``
a namedtuple                                      its own type: ``type(t)(*fields)``
any other ``tuple`` subclass (``torch.Size``)     ``tuple``
``list`` and its subclasses                       ``list``
``collections.OrderedDict`` and its subclasses    ``OrderedDict``, same keys in the same order
``dict``, its subclasses, any other ``Mapping``   ``dict``, same keys in the same order
================================================  ===========================================

Only a namedtuple and an ``OrderedDict`` keep their type: a namedtuple's
fields and an ``OrderedDict``'s order are part of what it means, and both are
rebuilt from their parts alone. Other subclasses (a ``defaultdict``, a
``Counter``, a list with extra methods) cannot be rebuilt in general without
knowing their constructor, so they become the plain container.

Everything else is not walked: a *leaf*, if the ``is_leaf`` test accepts it
(by default :func:`is_plain_array`), or a *value* kept as it is. Strings,
bytes, numbers, ``None``, sets and arrays of Python objects are values unless
a caller's test says otherwise; a string is never walked into its characters.

:func:`flatten` splits a structure into its leaves and a *skeleton*: nested
tuples, small and picklable, which is how the loaders send results between
processes. Nodes: ``("a", k)`` the k-th leaf; ``("v", value)`` a value;
``("t", children)`` a tuple; ``("l", children)`` a list; ``("n", type,
children)`` a namedtuple; ``("d", keys, children)`` a dict;
``("o", keys, children)`` an ``OrderedDict``. A container's children are its
last entry.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

__all__ = [
    "describe",
    "flatten",
    "in_order_of",
    "is_plain_array",
    "leaf_paths",
    "map_leaves",
    "rebuild",
    "skeleton_key",
]

_ndarray = np.ndarray  # one global lookup instead of two, on the hot path of flatten


def is_plain_array(x: Any) -> bool:
    """Whether ``x`` is a numpy array of plain data (any dtype but ``object``): the default leaf.

    An array of Python objects holds references, not data: copied as bytes
    into shared memory, they would mean nothing in another process, so it is
    a value. So is an instance of a subclass of ``ndarray`` other than a
    memory map (a masked array, a matrix): its bytes alone would lose what
    the subclass adds (a mask), silently.

    >>> import numpy as np
    >>> is_plain_array(np.zeros(3)), is_plain_array(np.array(["a"])), is_plain_array(np.array([None]))
    (True, True, False)
    >>> is_plain_array(np.ma.masked_array([1.0, 2.0], mask=[False, True])), is_plain_array([1.0, 2.0])
    (False, False)
    """
    kind = type(x)
    return (kind is np.ndarray or kind is np.memmap) and not x.dtype.hasobject


def flatten(tree: Any, leaves: list, is_leaf: Callable[[Any], bool] | None = None) -> tuple:
    """The skeleton of ``tree``; its leaves are appended to ``leaves``, in order.

    Containers are walked (see the module's rule), whatever ``is_leaf`` says;
    of everything else, what ``is_leaf`` accepts (by default
    :func:`is_plain_array`) is a leaf and the rest are values, kept in the
    skeleton. :func:`rebuild` puts it back together.

    >>> import numpy as np
    >>> leaves = []
    >>> flatten({"x": np.zeros(2), "ids": [np.arange(3), "train"]}, leaves)
    ('d', ('x', 'ids'), [('a', 0), ('l', [('a', 1), ('v', 'train')])])
    >>> leaves
    [array([0., 0.]), array([0, 1, 2])]
    """
    kind = type(tree)
    if kind is _ndarray and is_leaf is None:
        if tree.dtype.hasobject:
            return ("v", tree)
        leaves.append(tree)
        return ("a", len(leaves) - 1)
    if kind is tuple:
        return ("t", _children(tree, leaves, is_leaf))
    if kind is list:
        return ("l", _children(tree, leaves, is_leaf))
    if kind is dict:
        return ("d", tuple(tree), _children(tree.values(), leaves, is_leaf))
    if isinstance(tree, tuple):
        children = _children(tree, leaves, is_leaf)
        return ("n", kind, children) if hasattr(tree, "_fields") else ("t", children)
    if isinstance(tree, list):
        return ("l", _children(tree, leaves, is_leaf))
    if isinstance(tree, Mapping):
        keys = tuple(tree)
        tag = "o" if isinstance(tree, OrderedDict) else "d"
        return (tag, keys, _children([tree[key] for key in keys], leaves, is_leaf))
    if (is_leaf or is_plain_array)(tree):
        leaves.append(tree)
        return ("a", len(leaves) - 1)
    return ("v", tree)


def _children(items: Any, leaves: list, is_leaf: Callable[[Any], bool] | None) -> list:
    # Flattened once per batch by the loaders: a plain array is taken here without a call, which makes
    # a tuple of arrays about twice as fast to flatten as one call per child would.
    nodes = []
    for x in items:
        if type(x) is _ndarray and is_leaf is None and not x.dtype.hasobject:
            leaves.append(x)
            nodes.append(("a", len(leaves) - 1))
        else:
            nodes.append(flatten(x, leaves, is_leaf))
    return nodes


def rebuild(skeleton: tuple, leaves: list) -> Any:
    """The structure that ``skeleton`` describes, with ``leaves[k]`` as its k-th leaf.

    >>> rebuild(("t", [("a", 1), ("l", [("a", 0), ("v", None)])]), ["first", "second"])
    ('second', ['first', None])
    """
    tag = skeleton[0]
    if tag == "a":
        return leaves[skeleton[1]]
    if tag == "t":
        return tuple([rebuild(node, leaves) for node in skeleton[1]])
    if tag == "v":
        return skeleton[1]
    if tag == "l":
        return [rebuild(node, leaves) for node in skeleton[1]]
    if tag == "d":
        return dict(zip(skeleton[1], [rebuild(node, leaves) for node in skeleton[2]]))
    if tag == "o":
        return OrderedDict(zip(skeleton[1], [rebuild(node, leaves) for node in skeleton[2]]))
    return skeleton[1](*[rebuild(node, leaves) for node in skeleton[2]])  # a namedtuple


def map_leaves(fn: Callable[[Any], Any], tree: Any, is_leaf: Callable[[Any], bool] | None = None) -> Any:
    """``tree`` with every leaf ``x`` replaced by ``fn(x)``, containers rebuilt by the module's rule.

    Leaves are what ``is_leaf`` accepts (by default :func:`is_plain_array`);
    values, neither containers nor leaves, are kept as they are.

    >>> import numpy as np
    >>> map_leaves(lambda a: a.sum().item(), {"x": np.ones(3), "pair": (np.arange(4), "tag")})
    {'x': 3.0, 'pair': (6, 'tag')}
    """
    leaves: list = []
    skeleton = flatten(tree, leaves, is_leaf)
    return rebuild(skeleton, [fn(x) for x in leaves])


def skeleton_key(skeleton: tuple, leaf_keys: list) -> tuple:
    """A comparable form of ``skeleton``, with ``leaf_keys[k]`` standing for its k-th leaf.

    Two structures have equal keys when their containers are of the same
    kinds (and namedtuple types, and keys), their leaves' keys are equal and
    their values are of the same types.

    >>> import numpy as np
    >>> leaves = []
    >>> skeleton = flatten({"x": np.zeros((4, 2)), "n": 3}, leaves)
    >>> skeleton_key(skeleton, [a.shape for a in leaves])
    ('d', ('x', 'n'), (4, 2), (<class 'int'>,))
    """
    tag = skeleton[0]
    if tag == "a":
        return leaf_keys[skeleton[1]]
    if tag == "v":
        return (type(skeleton[1]),)
    return (*skeleton[:-1], *(skeleton_key(node, leaf_keys) for node in skeleton[-1]))


def describe(skeleton: tuple, leaf_texts: list[str]) -> str:
    """``skeleton`` as a reader sees it, with ``leaf_texts[k]`` for its k-th leaf and type names for values.

    >>> import numpy as np
    >>> from collections import namedtuple
    >>> Pair = namedtuple("Pair", "x y")
    >>> leaves = []
    >>> skeleton = flatten([Pair(np.zeros(2), 1.5), {"w": np.ones(3)}], leaves)
    >>> describe(skeleton, [f"{a.dtype} {a.shape}" for a in leaves])
    "[Pair(x=float64 (2,), y=float), {'w': float64 (3,)}]"
    """
    tag = skeleton[0]
    if tag == "a":
        return leaf_texts[skeleton[1]]
    if tag == "v":
        return type(skeleton[1]).__name__
    parts = [describe(node, leaf_texts) for node in skeleton[-1]]
    if tag in ("d", "o"):
        inner = "{" + ", ".join(f"{key!r}: {part}" for key, part in zip(skeleton[1], parts)) + "}"
        return inner if tag == "d" else f"OrderedDict({inner})"
    if tag == "n":
        return f"{skeleton[1].__name__}({', '.join(f'{f}={p}' for f, p in zip(skeleton[1]._fields, parts))})"
    if tag == "l":
        return f"[{', '.join(parts)}]"
    return f"({parts[0]},)" if len(parts) == 1 else f"({', '.join(parts)})"


def leaf_paths(skeleton: tuple) -> list[str]:
    """Where each leaf of ``skeleton`` sits, written as the indexing that reaches it (``''`` for a lone leaf).

    >>> import numpy as np
    >>> from collections import namedtuple
    >>> Pair = namedtuple("Pair", "x y")
    >>> leaf_paths(flatten({"x": np.zeros(2), "ids": [Pair(np.ones(1), "a"), np.arange(3)]}, []))
    ["['x']", "['ids'][0].x", "['ids'][1]"]
    >>> leaf_paths(flatten(np.zeros(2), []))
    ['']
    """
    paths: dict[int, str] = {}

    def walk(node: tuple, path: str) -> None:
        tag = node[0]
        if tag == "a":
            paths[node[1]] = path
        elif tag in ("d", "o"):
            for key, child in zip(node[1], node[2]):
                walk(child, f"{path}[{key!r}]")
        elif tag == "n":
            for field, child in zip(node[1]._fields, node[2]):
                walk(child, f"{path}.{field}")
        elif tag in ("t", "l"):
            for position, child in enumerate(node[1]):
                walk(child, f"{path}[{position}]")

    walk(skeleton, "")
    return [paths[k] for k in sorted(paths)]


def in_order_of(skeleton: tuple, tree: Any) -> Any:
    """``tree`` with its dicts' keys in the order ``skeleton`` (of a first such tree, see :func:`flatten`) has them.

    Dicts with other keys, and anything else that does not match, are left as they are.

    >>> first = flatten({"x": 1, "y": (2, {"a": 3, "b": 4})}, [])
    >>> in_order_of(first, {"y": (5, {"b": 6, "a": 7}), "x": 8})
    {'x': 8, 'y': (5, {'a': 7, 'b': 6})}
    """
    tag = skeleton[0]
    if tag == "d" and isinstance(tree, Mapping) and set(tree) == set(skeleton[1]):
        return {key: in_order_of(child, tree[key]) for key, child in zip(skeleton[1], skeleton[2])}
    if tag in ("t", "l", "n") and isinstance(tree, (tuple, list)) and len(tree) == len(skeleton[-1]):
        parts = [in_order_of(child, part) for child, part in zip(skeleton[-1], tree)]
        if isinstance(tree, list):
            return parts
        return type(tree)(*parts) if hasattr(tree, "_fields") else tuple(parts)
    return tree
