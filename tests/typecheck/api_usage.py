"""What a type checker (and so an editor) infers from the public API: mypy checks this file.

Each ``assert_type`` states the type inferred for an expression; mypy fails
if it infers another. A ``# type: ignore[...]`` marks a call that must be
rejected: with ``warn_unused_ignores``, mypy fails if it is accepted. The
functions also run (tests/test_typing.py calls them), so every line is
real usage.
"""

from __future__ import annotations

import tempfile
from typing import Any, assert_type

import numpy as np

import lazyseq
from lazyseq import View


def length(word: str) -> int:
    return len(word)


def triple(a: int, b: str, c: float) -> tuple[int, str, float]:
    return a, b, c


def power(base: int, exponent: int) -> int:
    return base**exponent


def zeros() -> np.ndarray:
    return np.zeros(4)


def rows_of_an_array() -> None:
    rows = lazyseq.view(np.ones((3, 2)))
    assert_type(rows, View[np.ndarray])
    assert_type(rows[0], np.ndarray)
    assert_type(rows[-1], np.ndarray)
    assert_type(rows[np.int64(1)], np.ndarray)
    assert_type(rows[1:], View[np.ndarray])
    assert_type(rows[[2, 0]], View[np.ndarray])
    assert_type(rows[np.array([2, 0])], View[np.ndarray])
    for row in rows:
        assert_type(row, np.ndarray)
    assert_type(rows.batch(2), View[np.ndarray])
    assert_type(lazyseq.batch(np.arange(4), 2), View[np.ndarray])
    assert_type(lazyseq.gather(np.arange(4), [3, 1]), View[np.ndarray])
    assert_type(lazyseq.shuffle(np.arange(4), seed=0), View[np.ndarray])
    assert_type(lazyseq.concatenate([np.zeros((2, 3)), np.ones((1, 3))]), View[np.ndarray])


def items_of_a_list() -> None:
    words = lazyseq.view(["a", "bb", "ccc"])
    assert_type(words, View[str])
    assert_type(words[0], str)
    assert_type(words[::2], View[str])
    assert_type(list(words), list[str])
    assert_type(lazyseq.view(range(3)), View[int])
    numbers: View[float] = lazyseq.view([1, 2])  # a View[int] is a View[float]: views are read as sequences
    assert_type(numbers[0], float)


def mapped_items() -> None:
    words = lazyseq.view(["a", "bb", "ccc"])
    assert_type(lazyseq.smap(length, words), View[int])
    assert_type(lazyseq.smap(length, ["a", "bb"]), View[int])
    assert_type(words.smap(length), View[int])
    assert_type(words.map(length), View[int])
    assert_type(words.smap(lambda word: word.upper()), View[str])
    assert_type(words.smap(lambda word, times: word * times, [1, 2, 3]), View[str])
    assert_type(lazyseq.smap(lambda word, times: word * times, words, [1, 2, 3]), View[str])
    assert_type(lazyseq.smap(triple, [1], ["x"], [0.5]), View[tuple[int, str, float]])
    assert_type(lazyseq.starmap(power, [(2, 3)]), View[int])


def views_that_keep_their_items() -> None:
    words = lazyseq.view(["a", "bb", "ccc", "d"])
    assert_type(words.gather([1, 0]), View[str])
    assert_type(words.take([1, 0]), View[str])
    assert_type(lazyseq.gather(["a", "b"], [1]), View[str])
    assert_type(words.shuffle(seed=0), View[str])
    assert_type(lazyseq.shuffle(words, seed=0), View[str])
    assert_type(words.cycle(limit=6), View[str])
    assert_type(words.shard(0, 2), View[str])
    assert_type(words.add_cache(2), View[str])
    assert_type(lazyseq.concatenate([words, ["e"]]), View[str])
    assert_type(words.concatenate([1]), View[str | int])
    assert_type(words.interleave([1]), View[str | int])
    assert_type(lazyseq.switch([True, False], ["a", "b"], [0, 1]), View[str | int])
    assert_type(words.split(1), View[View[str]])  # one cut: two halves
    assert_type(words.split(1)[0][0], str)
    assert_type(words.collate([1, 2, 3, 4]), View[tuple[str, int]])
    assert_type(lazyseq.collate({"word": words, "size": [1, 2, 3, 4]}), View[dict[Any, Any]])
    assert_type(lazyseq.collate([words, [1, 2, 3, 4]]), View[tuple[Any, ...]])
    assert_type(lazyseq.arange(3), View[int])
    assert_type(lazyseq.repeat(0.5, 3), View[float])
    assert_type(lazyseq.uniter(iter("abc")), View[str])


def batches() -> None:
    words = lazyseq.view(["a", "bb", "ccc"])
    assert_type(lazyseq.view([1.0, 2.0]).batch(2), View[np.ndarray])
    assert_type(words.batch(2, collate_fn=list), View[list[str]])
    assert_type(words.batch(2, collate_fn=", ".join), View[str])
    assert_type(words.batch(2), View[Any])  # stacked by the default collate: depends on the items
    assert_type(words.batch(2, collate_fn=list).unbatch(2, 1), View[str])
    unknown: View[Any] = words
    assert_type(unknown.batch(2), View[Any])


def loaders() -> None:
    words = lazyseq.view(["a", "bb", "ccc"])
    with lazyseq.prefetch(words.smap(length), nworkers=1, method="thread") as ahead:
        assert_type(ahead[0], int)
        for count in ahead:
            assert_type(count, int)
    with lazyseq.load_buffers(zeros, max_cached=2, nworkers=1) as loader:
        assert_type(next(loader), np.ndarray)
    with lazyseq.prefetch(words, nworkers=1, max_buffered=None) as default_ahead:  # None: the method's default
        assert_type(default_ahead[0], str)
    with lazyseq.load_buffers(zeros, max_cached=None, nworkers=1) as default_cached:
        assert_type(next(default_cached), np.ndarray)
    assert_type(lazyseq.evaluate(np.asarray, [1.0, 2.0], nworkers=1, max_buffered=None), Any)
    with lazyseq.prefetch(words, nworkers=1, start_hook=no_argument) as hooked:  # a hook without the index
        assert_type(hooked[0], str)
    with lazyseq.load_buffers(zeros, nworkers=1, start_hook=no_argument) as hooked_buffers:
        assert_type(next(hooked_buffers), np.ndarray)
    with lazyseq.prefetch(np.ones((4, 2)), nworkers=1) as rows_ahead:  # an array: rows, as view() gives
        assert_type(rows_ahead[0], np.ndarray)
    assert_type(lazyseq.interleave(np.ones((2, 2)), np.zeros((3, 2)))[0], np.ndarray)
    monitored = lazyseq.monitor_throughput(words)
    assert_type(monitored[0], str)
    assert_type(lazyseq.debug(np.ones((3, 2)), print, max_calls=0)[0], np.ndarray)


def no_argument() -> None:
    """A start hook that takes no argument: called without the worker's index."""


def shards() -> None:
    with tempfile.TemporaryDirectory() as folder:
        written = lazyseq.write_npy([1.0, 2.0], folder, sync=False)
        assert_type(written, View[Any])


def rejected() -> None:
    """Calls a type checker refuses (never run)."""
    words = lazyseq.view(["a", "bb"])
    rows = lazyseq.view(np.ones((3, 2)))
    rows.smap(length)  # type: ignore[arg-type]  # rows are arrays, not str
    lazyseq.smap(length, [1, 2])  # type: ignore[arg-type]
    lazyseq.smap(length)  # type: ignore[call-overload]  # no sequence
    lazyseq.view([1, 2]).unbatch(2)  # type: ignore[misc]  # ints are not batches
    lazyseq.prefetch(words, nworkers=1, method="processes")  # type: ignore[call-overload]  # "thread", "process", "ray"
    lazyseq.load_buffers(lambda: 0, start_method="fork-server")  # type: ignore[arg-type]
    lazyseq.evaluate(len, words, method="threads")  # type: ignore[arg-type]
    lazyseq.prefetch(words, nworkers=1, max_buffered="auto")  # type: ignore[call-overload]  # a number, or None
    lazyseq.write_npy(words, "out", sync="no")  # type: ignore[arg-type]  # sync is a bool
    lazyseq.view(5)  # type: ignore[call-overload]  # not a sequence
