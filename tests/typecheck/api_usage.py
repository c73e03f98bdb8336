"""What a type checker (and so an editor) infers from the public API: mypy checks this file.

Each ``assert_type`` states the type inferred for an expression; mypy fails
if it infers another. A ``# type: ignore[...]`` marks a call that must be
rejected: with ``warn_unused_ignores``, mypy fails if it is accepted. The
functions also run (tests/test_typing.py calls them), so every line is
real usage.
"""

from __future__ import annotations

import tempfile
from importlib.util import find_spec
from typing import Any, assert_type

import numpy as np

import lazyseq
from lazyseq import View
from lazyseq.sklearn import fit, predict, score


def length(word: str) -> int:
    return len(word)


def triple(a: int, b: str, c: float) -> tuple[int, str, float]:
    return a, b, c


def power(base: int, exponent: int) -> int:
    return base**exponent


def zeros() -> np.ndarray:
    return np.zeros(4)


class RunningSum:
    """An estimator of the user's own, that learns one batch at a time."""

    def __init__(self) -> None:
        self.total = 0.0

    def partial_fit(self, X: np.ndarray, y: object = None) -> RunningSum:
        self.total += float(X.sum())
        return self


def rows_of_an_array() -> None:
    rows = lazyseq.view(np.ones((3, 2)))
    assert_type(rows, View[np.ndarray])
    assert_type(rows[0], np.ndarray)
    assert_type(rows[-1], np.ndarray)
    assert_type(rows[np.int64(1)], np.ndarray)
    assert_type(rows[1:], View[np.ndarray])
    assert_type(rows[[2, 0]], View[np.ndarray])
    assert_type(rows[np.array([2, 0])], View[np.ndarray])
    assert_type(rows[[np.int64(2), np.int64(0)]], View[np.ndarray])  # numpy integers, as np.argsort gives
    for row in rows:
        assert_type(row, np.ndarray)
    assert_type(rows.batch(2), View[np.ndarray])
    assert_type(lazyseq.batch(np.arange(4), 2), View[np.ndarray])
    # The items of a 1-D array are numpy scalars, yet typed np.ndarray as every array's rows are: numpy types most
    # arrays (np.random.rand, np.load, np.array...) without their number of dimensions, so none is told apart.
    assert_type(lazyseq.gather(np.ones((4, 2)), [3, 1]), View[np.ndarray])
    assert_type(lazyseq.shuffle(np.ones((4, 2)), seed=0), View[np.ndarray])
    assert_type(lazyseq.concatenate([np.zeros((2, 3)), np.ones((1, 3))]), View[np.ndarray])
    assert_type(lazyseq.concatenate([rows, np.zeros((1, 2))]), View[np.ndarray])  # views and arrays mixed
    assert_type(lazyseq.concatenate([[1, 2], ["a", "b"]]), View[Any])  # lists of several item types
    assert_type(lazyseq.concatenate([np.zeros((1, 2)), rows.shuffle(seed=0), [np.ones(2)]]), View[np.ndarray])


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
    assert_type(words.smap(lambda word, times, mark: word * times + mark, [1, 2, 3], "!?."), View[str])
    assert_type(lazyseq.starmap(power, [(2, 3)]), View[int])
    assert_type(words.collate([1, 2, 3]).starmap(lambda word, times: word * times), View[str])
    assert_type(lazyseq.starmap(power, [[2, 3]]), View[int])  # items that are lists: their fields are not checked


def views_that_keep_their_items() -> None:
    words = lazyseq.view(["a", "bb", "ccc", "d"])
    assert_type(words.gather([1, 0]), View[str])
    assert_type(words.gather([np.int64(1), np.int64(0)]), View[str])
    keep: list[bool] = [len(word) > 1 for word in words]
    assert_type(words[keep], View[str])  # a mask
    assert_type(words[[np.True_, np.False_, np.True_, np.False_]], View[str])
    assert_type(words.take([1, 0]), View[str])
    assert_type(lazyseq.gather(["a", "b"], [1]), View[str])
    assert_type(words.shuffle(seed=0), View[str])
    assert_type(lazyseq.shuffle(words, seed=0), View[str])
    seed = np.int64(7)  # as read back from a checkpoint
    assert_type(words.shuffle(seed=seed, epoch=np.int64(1)), View[str])
    assert_type(lazyseq.rng(seed, 0, np.int64(2)), np.random.Generator)
    assert_type(words.cycle(limit=6), View[str])
    assert_type(words.shard(0, 2), View[str])
    assert_type(words.add_cache(2), View[str])
    assert_type(lazyseq.concatenate([words, ["e"]]), View[str])
    assert_type(words.concatenate([1]), View[str | int])
    assert_type(words.interleave([1]), View[str | int])
    assert_type(lazyseq.switch([True, False], ["a", "b"], [0, 1]), View[str | int])
    assert_type(lazyseq.switch([np.True_, np.False_], ["a", "b"], [0, 1]), View[str | int])
    assert_type(lazyseq.case([np.int64(1), 0], ["a", "b"], ["c", "d"]), View[str])
    assert_type(words.split(1), View[View[str]])  # one cut: two halves
    assert_type(words.split(1)[0][0], str)
    assert_type(words.split(np.array([1, 3])), View[View[str]])  # cuts as an array
    assert_type(words.split([np.int64(2)]), View[View[str]])
    assert_type(words.collate([1, 2, 3, 4]), View[tuple[str, int]])
    assert_type(lazyseq.collate({"word": words, "size": [1, 2, 3, 4]}), View[dict[Any, Any]])
    assert_type(lazyseq.collate([words, [1, 2, 3, 4]]), View[Any])  # fields of unknown types and number
    assert_type(lazyseq.collate([words, [1, 2, 3, 4]]).starmap(lambda word, size: word * size), View[Any])
    assert_type(words.collate([1, 2, 3, 4], [0.5] * 4), View[tuple[str, int, float]])
    assert_type(lazyseq.arange(3), View[int])
    assert_type(lazyseq.arange(np.int64(3)), View[int])
    assert_type(lazyseq.repeat(0.5, 3), View[float])
    assert_type(lazyseq.repeat(0.5, np.int64(3)), View[float])
    assert_type(lazyseq.uniter(iter("abc")), View[str])


def batches() -> None:
    words = lazyseq.view(["a", "bb", "ccc"])
    assert_type(lazyseq.view([1.0, 2.0]).batch(2), View[np.ndarray])
    assert_type(words.batch(2, collate_fn=list), View[list[str]])
    assert_type(lazyseq.batch(lazyseq.view(np.zeros((4, 2))), 2, collate_fn=list), View[list[np.ndarray]])
    assert_type(lazyseq.batch(words, 2, False, None, list), View[list[str]])  # every argument by position
    assert_type(words.batch(np.int64(2), collate_fn=list), View[list[str]])
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
    trained = fit(RunningSum(), lazyseq.view(np.ones((4, 2))).batch(2), progress=False)
    assert_type(trained, RunningSum)  # the estimator given, trained
    if find_spec("zmq") is not None:  # serving is optional (lazyseq[server])
        with lazyseq.serve(words, "tcp://127.0.0.1:0", nworkers=1, start_hook=no_argument) as server:  # as prefetch
            # A view here, as a view is served (a stream otherwise): only the server knows, so connect gives Any.
            with lazyseq.connect(server.address) as remote:
                assert_type(remote, Any)
                assert len(remote) == 3 and remote[-1] == "ccc" and list(remote[1:]) == ["bb", "ccc"]
                assert list(lazyseq.shard(remote, 0, 2)) == ["a", "bb"]
                assert remote.batch(2, collate_fn=list)[1] == ["ccc"]
    if find_spec("torch") is not None:  # torch is optional
        from lazyseq.torch import as_dataset

        dataset = as_dataset(words)
        assert_type(dataset[0], str)
        assert_type(dataset[[0, 2]], Any)  # a batch, stacked
        assert_type(as_dataset(np.ones((3, 2)))[0], np.ndarray)


def scores() -> None:
    if find_spec("sklearn") is None:  # scikit-learn is optional
        return
    from sklearn.dummy import DummyClassifier

    x, y = np.zeros((4, 2)), np.array([0, 1, 1, 1])
    model = DummyClassifier().fit(x, y)
    data = lazyseq.collate([x, y])
    assert_type(score(model, data, progress=False), float)  # estimator.score's
    assert_type(score(model, data, metric=confusion, progress=False), np.ndarray)  # what the metric returns
    assert_type(predict(model, x, progress=False), Any)  # an array, or a sparse matrix for a vectorizer


def confusion(y_true: Any, y_pred: Any) -> np.ndarray:
    return np.array([[(y_true == a).sum() * (y_pred == b).sum() for b in (0, 1)] for a in (0, 1)])


def no_argument() -> None:
    """A start hook that takes no argument: called without the worker's index."""


def shards() -> None:
    with tempfile.TemporaryDirectory() as folder:
        written = lazyseq.write_npy([1.0, 2.0], folder, sync=False)
        assert_type(written, View[Any])
        opened = lazyseq.open_npy(folder)
        assert_type(opened, View[Any])  # what was written: rows, numpy scalars (here), tuples or dicts
        assert opened[1] == 2.0
        del opened  # its memory maps, before the folder goes


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
    lazyseq.smap(triple, [1], [0.5], ["x"])  # type: ignore[arg-type]  # three sequences, in the wrong order
    lazyseq.starmap(power, [("2", "3")])  # type: ignore[arg-type]  # (str, str) items for power(int, int)
    lazyseq.starmap(power, [2, 3])  # type: ignore[list-item]  # items that are not tuples
    words[(0, 1)]  # type: ignore[call-overload]  # a tuple is no key (a list is)
    words.gather([0.5])  # type: ignore[list-item]  # positions are integers
    lazyseq.rng(np.arange(3))  # type: ignore[arg-type]  # an array is not an integer
