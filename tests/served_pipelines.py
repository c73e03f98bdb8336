"""Pipelines that the data-server tests serve from another process (python -m lazyseq.serve served_pipelines:NAME)."""

import numpy as np

import lazyseq


def assorted_item(i):
    """Nested structures of assorted dtypes: what a consumer gets must equal a local read."""
    return {
        "x": np.arange(6, dtype=np.float32).reshape(2, 3) + i,
        "y": (np.int64(i), np.full((2, 2), i, np.uint8), np.array([True, i % 2 == 0])),
        "labels": [f"item {i}", i, i / 3, complex(i, -1), None, b"\x00raw" * i],
        "when": np.array(["2026-01-01", "2026-11-23"], dtype="datetime64[D]") + np.timedelta64(i, "D"),
        "text": np.array(["ab", "c" * i]),
        "empty": np.zeros((0, 3), np.int16),
        "special": (float("nan"), float("inf"), -float("inf")),
        "big": 2**70 + i,
        "caption": (np.str_(""), np.bytes_(b""), np.str_("é" * i)),
        7: np.float16(i),
    }


def assorted():
    return lazyseq.smap(assorted_item, range(40))


def numbers():
    return lazyseq.view(np.arange(100, dtype=np.int64))


def counting():
    """A stream: 60 items, each the array [k]."""
    return (np.array([k]) for k in range(60))


def fail_at_3(x):
    if x == 3:
        raise ValueError("item 3 is bad")
    return x


def failing():
    return lazyseq.smap(fail_at_3, range(10))


def double(x):
    return 2 * x
