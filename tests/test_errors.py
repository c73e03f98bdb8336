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
