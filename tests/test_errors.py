"""Failures while computing items: EvaluationError, the chain of views, seterr."""

import numpy as np
import pytest

import lazyseq


def normalize(x):
    if x >= 4021:
        raise ValueError(f"bad value {x}")
    return x


@pytest.fixture
def passthrough():
    previous = lazyseq.seterr("passthrough")
    yield
    lazyseq.seterr(previous)


def test_error_names_item_and_chain_of_views():
    data = lazyseq.smap(normalize, lazyseq.arange(5000))
    order = np.arange(5000)
    order[768] = 4021
    batches = lazyseq.batch(lazyseq.gather(data, order), 64)
    with pytest.raises(lazyseq.EvaluationError) as info:
        batches[12]
    assert str(info.value) == (
        "failed to compute batch[12] -> gather[768] -> smap(normalize)[4021]: ValueError: bad value 4021"
    )
    assert type(info.value.__cause__) is ValueError
    assert str(info.value.__cause__) == "bad value 4021"


def first_of(piece):
    return piece[0]


@pytest.mark.parametrize("nworkers, method", [(0, "thread"), (2, "thread"), (2, "process")])
def test_an_item_whose_code_reads_a_failing_view_names_one_chain_down_to_the_failure(nworkers, method):
    # It was wrapped twice: "failed to compute smap(first_of)[1]: EvaluationError: failed to compute slice[0] -> ...".
    pieces = lazyseq.split(lazyseq.smap(normalize, [1, 2, 4021, 4]), [2])  # items: views of the smap
    with lazyseq.prefetch(lazyseq.smap(first_of, pieces), nworkers=nworkers, method=method, inline_below=0) as ahead:
        with pytest.raises(lazyseq.EvaluationError) as info:
            ahead[1]
    assert str(info.value) == (
        "failed to compute prefetch[1] -> smap(first_of)[1] -> slice[0] -> smap(normalize)[2]: ValueError: "
        "bad value 4021"
    )
    if method == "thread":  # (from a worker process: the failure as it was restored there)
        assert type(info.value.__cause__) is ValueError


def exhausted_on_three(x):
    if x == 3:
        next(iter([]))  # a StopIteration, which Python makes a RuntimeError in the generator that iterates
    return x


def drains(x):  # a generator of the item's own code: its RuntimeError is the item's, with the chain of views
    return list(next(iter([])) for _ in range(x))


def test_a_stop_iteration_raised_by_an_item_names_the_item_when_iterating(tmp_path, passthrough):
    # "failed to compute an item: RuntimeError: generator raised StopIteration"; write_npy named a whole shard
    lazyseq.seterr("wrap")
    for view, chain in [
        (lazyseq.smap(exhausted_on_three, range(6)), "smap(exhausted_on_three)[3]"),
        (lazyseq.batch(lazyseq.smap(exhausted_on_three, range(6)), 2), "batch[1] -> smap(exhausted_on_three)[3]"),
    ]:
        with pytest.raises(lazyseq.EvaluationError) as info:
            list(view)
        assert str(info.value) == f"failed to compute {chain}: StopIteration: "
        assert type(info.value.__cause__) is StopIteration  # (was the RuntimeError Python wraps it in, iterating)
    with pytest.raises(lazyseq.EvaluationError) as info:
        lazyseq.write_npy(lazyseq.smap(exhausted_on_three, range(6)), tmp_path)
    assert str(info.value) == (
        f"write_npy: shard 0 of {tmp_path} failed at item 3 (smap(exhausted_on_three)[3]): StopIteration: "
    )

    with pytest.raises(lazyseq.EvaluationError) as info:
        list(lazyseq.smap(drains, range(1, 3)))
    assert str(info.value) == "failed to compute smap(drains)[0]: RuntimeError: generator raised StopIteration"
    lazyseq.seterr("passthrough")
    with pytest.raises(RuntimeError) as info:  # as it is, not a StopIteration that would end the caller's loop
        list(lazyseq.smap(exhausted_on_three, range(6)))
    assert info.value.__notes__ == ["while computing smap(exhausted_on_three)[3]"]


def test_error_chain_through_concatenate_and_collate():
    parts = lazyseq.concatenate([lazyseq.smap(normalize, range(4020, 4022)), [1, 2]])
    pairs = lazyseq.collate([parts, "abcd"])
    with pytest.raises(lazyseq.EvaluationError, match=r"collate\[1\] -> concatenate\[1\] -> smap\(normalize\)\[1\]"):
        pairs[1]


def test_error_during_iteration_is_wrapped():
    data = lazyseq.smap(normalize, range(4019, 4023))
    seen = []
    with pytest.raises(lazyseq.EvaluationError, match=r"smap\(normalize\)\[2\]"):
        for x in data:
            seen.append(x)
    assert seen == [4019, 4020]


def inverse_of_3_less(x):
    return 1 / (x - 3)


@pytest.mark.parametrize(
    ("wrap", "chain"),
    [
        (lambda v: lazyseq.unbatch(lazyseq.smap(np.array, v.batch(2)), 2), r"unbatch\[2\] -> smap\(array\)\[1\]"),
        (lambda v: lazyseq.debug(v, lambda i, x: None), r"debug\[3\] -> smap\(inverse_of_3_less\)\[3\]"),
        (lazyseq.monitor_throughput, r"monitor_throughput\[3\] -> smap\(inverse_of_3_less\)\[3\]"),
    ],
)
def test_an_error_while_iterating_names_the_item_being_read(wrap, chain):
    with pytest.raises(lazyseq.EvaluationError, match=f"^failed to compute {chain}"):
        list(wrap(lazyseq.smap(inverse_of_3_less, range(6))))


def test_loader_view_still_usable_after_error():
    data = lazyseq.smap(normalize, range(4019, 4023))
    with pytest.raises(lazyseq.EvaluationError):
        data[3]
    assert data[0] == 4019


def test_index_error_inside_function_is_not_mistaken_for_the_end():
    data = lazyseq.smap(lambda x: [][x], range(3))
    with pytest.raises(lazyseq.EvaluationError) as info:
        list(data)
    assert type(info.value.__cause__) is IndexError


def test_passthrough_raises_original_with_note(passthrough):
    data = lazyseq.batch(lazyseq.smap(normalize, range(4018, 4026)), 2)
    with pytest.raises(ValueError, match="bad value 4021") as info:
        data[1]
    assert info.value.__notes__ == ["while computing batch[1] -> smap(normalize)[3]"]


def test_seterr_returns_previous_and_rejects_unknown():
    assert lazyseq.seterr() == "wrap"
    assert lazyseq.seterr("passthrough") == "wrap"
    assert lazyseq.seterr("wrap") == "passthrough"
    with pytest.raises(ValueError, match="seterr: evaluation must be one of"):
        lazyseq.seterr("ignore")


def test_keyboard_interrupt_is_not_wrapped():
    def interrupt(x):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        lazyseq.smap(interrupt, [1])[0]


def test_index_errors_name_view_index_and_length():
    with pytest.raises(IndexError, match=r"^index 12 out of range for view batch\(10\) of length 10$"):
        lazyseq.batch(range(100), 10)[12]
    with pytest.raises(IndexError, match=r"^index -4 out of range for view smap\(abs\) of length 3$"):
        lazyseq.smap(abs, [1, 2, 3])[-4]


@pytest.mark.parametrize("key", [1.0, "1", None, (1,)])
def test_bad_key_types(key):
    with pytest.raises(TypeError, match="indices must be integers, slices or integer arrays"):
        lazyseq.view([1, 2])[key]


def test_float_index_array_rejected():
    with pytest.raises(TypeError, match="not an array of float64"):
        lazyseq.view([1, 2])[np.array([0.0])]


def test_failing_batch_collation_is_wrapped():
    ragged = lazyseq.view([np.zeros(2), np.zeros(3)])
    with pytest.raises(lazyseq.EvaluationError, match=r"^failed to compute batch\[0\]: ValueError"):
        lazyseq.batch(ragged, 2)[0]


# -- errors that name what went wrong, where ---------------------------------------------------------------------


def test_index_error_on_a_slice_names_the_slice_view():
    train = lazyseq.view(np.zeros((10_000, 3)))[:8000]
    with pytest.raises(IndexError) as info:
        train[8000]
    assert str(info.value) == "index 8000 out of range for view slice(0, 8000, 1) of length 8000"
    with pytest.raises(IndexError) as info:
        train[[0, -8001]]
    assert str(info.value) == "index -8001 out of range for view slice(0, 8000, 1) of length 8000"


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: lazyseq.batch(range(10), 2.5), "batch: k must be a positive integer, got 2.5"),
        (lambda: lazyseq.view(range(10)).batch("8"), "batch: k must be a positive integer, got '8'"),
        (lambda: lazyseq.cycle([1], 2.0), "cycle: limit must be a non-negative integer or None, got 2.0"),
        (lambda: lazyseq.repeat(1, 2.0), "repeat: times must be a non-negative integer or None, got 2.0"),
        (lambda: lazyseq.add_cache([1], 1.5), "add_cache: cache_size must be a positive integer, got 1.5"),
        (lambda: lazyseq.shard([1], 0.0, 2), "shard: rank must be an integer, got 0.0"),
        (lambda: lazyseq.shuffle([1], seed=0.5), "shuffle: seed must be a non-negative integer, got 0.5"),
        (lambda: lazyseq.uniter([1], size=1.0), "uniter: size must be a non-negative integer or None, got 1.0"),
        (lambda: lazyseq.prefetch([1], nworkers=1.0), "prefetch: nworkers must be an integer, got 1.0"),
        (
            lambda: lazyseq.split(range(4), 2.5),
            "split: edges must be a number of cuts, a list of positions or a list of (start, stop) pairs, got 2.5",
        ),
        (lambda: lazyseq.split(range(4), [1.5]), "split: an edge must be an integer, got 1.5"),
    ],
)
def test_non_integer_sizes_name_the_function_and_argument(make, message):
    with pytest.raises(TypeError) as info:
        make()
    assert str(info.value) == message


def test_concatenate_of_arrays_with_different_rows_is_a_list_of_them_and_a_batch_says_where_they_differ():
    joined = lazyseq.concatenate([np.zeros((3, 4)), np.zeros((2, 4)), np.zeros((3, 5))])  # as lists concatenate
    assert [row.shape for row in joined] == [(4,)] * 5 + [(5,)] * 3
    assert joined.batch(4)[0].shape == (4, 4)  # batches of rows alike stack
    with pytest.raises(lazyseq.EvaluationError) as info:
        joined.batch(8)[0]
    assert str(info.value) == (
        "failed to compute batch[0]: ValueError: cannot stack items of different shapes into one array: "
        "item 0 (concatenate[0] -> part 0: array[0]) has shape (4,), item 5 (concatenate[5] -> part 2: array[0]) "
        "has shape (5,); batch(..., collate_fn=list) gives such items as a list"
    )
    assert [row.shape for row in joined.batch(8, collate_fn=list)[0]] == [(4,)] * 5 + [(5,)] * 3
    pairs = [lazyseq.collate([np.zeros((2, 4)), np.arange(2)]), lazyseq.collate([np.zeros((2, 5)), np.arange(2)])]
    with pytest.raises(lazyseq.EvaluationError, match=r"item 2 \(concatenate\[2\] -> part 1: collate\[0\]\) has"):
        lazyseq.concatenate(pairs).batch(4)[0]
    # parts of scalars and of rows, of tuples of one and of two fields: items as a list's
    assert [np.shape(x) for x in lazyseq.concatenate([np.zeros(2), np.zeros((1, 2))])] == [(), (), (2,)]
    ragged = lazyseq.concatenate([lazyseq.collate([np.arange(2), np.arange(2)]), lazyseq.collate([np.arange(2)])])
    assert list(ragged) == [(0, 0), (1, 1), (0,), (1,)]
    # dtypes may differ (numpy promotes)
    assert lazyseq.concatenate([np.zeros((2, 4)), np.ones((2, 4), np.int32)]).batch(4)[0].dtype == np.float64
    assert len(lazyseq.concatenate([np.zeros((2, 4)), lazyseq.smap(np.ones, [5, 5])])) == 4


def test_batch_of_items_of_different_shapes_says_where_they_come_from():
    parts = lazyseq.concatenate([lazyseq.smap(np.zeros, [4, 4, 4]), lazyseq.smap(np.ones, [5, 5])])
    with pytest.raises(lazyseq.EvaluationError) as info:
        parts.batch(4)[0]
    assert str(info.value) == (
        "failed to compute batch[0]: ValueError: cannot stack items of different shapes into one array: "
        "item 0 (concatenate[0] -> part 0: smap(zeros)[0] -> sequence[0]) has shape (4,), "
        "item 3 (concatenate[3] -> part 1: smap(ones)[0] -> sequence[0]) has shape (5,); "
        "batch(..., collate_fn=list) gives such items as a list"
    )
    assert [len(x) for x in parts.batch(4, collate_fn=list)[0]] == [4, 4, 4, 5]
    with pytest.raises(ValueError) as info:
        lazyseq.default_collate([np.zeros(2), np.zeros(2), np.zeros(3)])
    assert str(info.value) == (
        "cannot stack items of different shapes into one array: item 0 has shape (2,), item 2 has shape (3,)"
    )


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [  # each was a bare "'int' object is not iterable", an unpacking error or numpy's own message
        (lambda: lazyseq.gather(np.arange(5), 3), TypeError, "gather: indexes must be a sequence of integers"),
        (lambda: lazyseq.concatenate(5), TypeError, "concatenate: sequences must be a list of sequences, got 5"),
        (lambda: lazyseq.collate(5), TypeError, "collate: sequences must be a list or a dict of sequences, got 5"),
        (lambda: lazyseq.open_npy(None), TypeError, "open_npy: paths must be a directory, a file, a glob pattern"),
        (lambda: lazyseq.split(np.arange(5), [(1, 2, 3)]), ValueError, "split: spans must all be (start, stop) pairs"),
        (lambda: lazyseq.rng(None), TypeError, "rng: seed must be a non-negative integer, got None"),
        (lambda: lazyseq.rng(0, "a"), TypeError, "rng: a key must be a non-negative integer, got 'a'"),
        (lambda: lazyseq.arange(0, 10, 0), ValueError, "arange: step must not be zero"),
        (lazyseq.View, TypeError, "View is the base class of lazyseq's views, not one itself: make a view with"),
        (lambda: lazyseq.evaluate(abs, np.arange(4), batch_size=0), ValueError, "evaluate: batch_size must be a"),
        (lambda: lazyseq.evaluate(abs, np.arange(4), method="bogus"), ValueError, "evaluate: method must be"),
        (lambda: lazyseq.evaluate(abs, np.arange(4), progress="x"), TypeError, "evaluate: progress must be True,"),
        (lambda: lazyseq.batch(np.arange(5), 2, drop_last="yes"), TypeError, "batch: drop_last must be True or"),
    ],
)
def test_misused_functions_name_themselves_and_the_argument(call, error, message):
    with pytest.raises(error) as caught:
        call()
    assert type(caught.value) is error and str(caught.value).startswith(message)


def test_a_sequence_given_where_a_function_goes_says_which_comes_first():
    # smap(data, f) said "object of type 'type' has no len()"; load_buffers(view) named the view's class alone
    data = np.arange(4)
    cases = [
        (
            lambda: lazyseq.smap(data, str),
            "smap: f must be callable, got ndarray; the function comes first: smap(f, sequence), or view.smap(f)",
        ),
        (
            lambda: lazyseq.starmap([(1, 2)], max),
            "starmap: f must be callable, got list; the function comes first: starmap(f, sequence), or view.starmap(f)",
        ),
        (
            lambda: lazyseq.view(data).smap(data),
            "smap: f must be callable, got ndarray; the function comes first: smap(f, sequence), or view.smap(f)",
        ),
        (
            lambda: lazyseq.evaluate(lazyseq.view(data), len),
            "evaluate: fn must be callable, got a view; the function comes first: evaluate(fn, sequence)",
        ),
        (
            lambda: lazyseq.load_buffers(lazyseq.view(data)),
            "load_buffers: func must be callable, got a view; load_buffers calls a function that returns a "
            "batch; prefetch loads a sequence",
        ),
        (lambda: lazyseq.smap(3, data), "smap: f must be callable, got int"),
        (lambda: lazyseq.smap("upper", data), "smap: f must be callable, got str"),
    ]
    for call, message in cases:
        with pytest.raises(TypeError) as caught:
            call()
        assert str(caught.value) == message
