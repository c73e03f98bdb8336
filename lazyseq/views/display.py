"""How views show in a terminal and in Jupyter: what their items are, when that is known without reading one."""

from __future__ import annotations

import html

__all__ = ["batched_spec", "describe_spec", "html_tree"]


def describe_spec(spec: tuple | None) -> str:
    """``float64 (64, 248)`` for an array, ``(float64 (248,), int64)`` for a tuple, ``?`` when unknown."""
    if spec is None:
        return "?"
    if spec[0] == "array":
        _, dtype, shape = spec
        return f"{dtype} {shape}" if shape else str(dtype)
    if spec[0] == "dict":
        return "{" + ", ".join(f"{key!r}: {describe_spec(s)}" for key, s in zip(spec[2], spec[1])) + "}"
    return "(" + ", ".join(describe_spec(s) for s in spec[1]) + ")"


def batched_spec(spec: tuple | None, k: int) -> tuple | None:
    """What the default collation of ``k`` items like ``spec`` gives: arrays gain a first axis of ``k``."""
    if spec is None:
        return None
    if spec[0] == "array":
        return ("array", spec[1], (k, *spec[2]))
    return (spec[0], tuple(batched_spec(s, k) for s in spec[1]), *spec[2:])  # a dict's keys too


def unbatched_spec(spec: tuple | None) -> tuple | None:
    """What each item of a batch like ``spec`` is: arrays lose their first axis (None where that is not known).

    >>> import numpy as np
    >>> unbatched_spec(("tuple", (("array", np.dtype("<U3"), (4,)), ("array", np.dtype("f8"), (4, 2)))))
    ('tuple', (('array', dtype('<U3'), ()), ('array', dtype('float64'), (2,))))
    """
    if spec is None:
        return None
    if spec[0] == "array":
        return ("array", spec[1], spec[2][1:]) if spec[2] else None
    return (spec[0], tuple(unbatched_spec(s) for s in spec[1]), *spec[2:])


def html_tree(lines: list[str]) -> str:
    """A view's repr lines as HTML: preformatted, the first line in bold."""
    top, rest = html.escape(lines[0]), [html.escape(line) for line in lines[1:]]
    body = "\n".join([f"<b>{top}</b>", *rest])
    return f'<pre style="line-height: 1.3">{body}</pre>'
