"""How views show: a tree of the pipeline, lengths, and what the items are when known without reading one."""

import numpy as np

import lazyseq


def pipeline():
    x = lazyseq.view(np.zeros((100, 248)))
    y = lazyseq.view(np.arange(100))
    return lazyseq.collate([x, y]).shuffle(seed=0).batch(64)


def test_repr_shows_the_pipeline_and_the_items():
    assert repr(pipeline()) == "\n".join(
        [
            "batch(64)  [len 2, items (float64 (64, 248), int64 (64,)), the last of 36]",
            "└─ shuffle(seed=0, epoch=0)  [len 100]",
            "   └─ collate  [len 100]",
            "      ├─ array float64 (100, 248)  [len 100]",
            "      └─ array int64 (100,)  [len 100]",
        ]
    )


def test_items_of_selections_of_arrays_are_known_without_reading():
    x = lazyseq.view(np.zeros((10, 3), dtype=np.float32))
    both = lazyseq.concatenate([x, x])
    assert repr(both[::3]).splitlines()[0] == "slice(0, 20, 3)  [len 7, items float32 (3,)]"
    assert repr(both.cycle()).splitlines()[0] == "cycle  [infinite, items float32 (3,)]"
    assert repr(lazyseq.view(np.arange(4))[[0, 1]]).splitlines()[0] == "gather  [len 2, items int64]"


calls = []


def spy(row):
    calls.append(row)
    return row


def test_computed_and_mixed_items_are_not_read_to_be_shown():
    assert repr(lazyseq.view(np.zeros((5, 2))).smap(spy)).splitlines()[0] == "smap(spy)  [len 5]"
    assert calls == []
    mixed = lazyseq.collate([np.zeros((4, 2)), ["a", "b", "c", "d"]])
    assert repr(mixed).splitlines()[0] == "collate  [len 4, items (float64 (2,), ?)]"
    assert repr(lazyseq.concatenate([np.zeros((2, 2)), np.zeros((2, 2), dtype=np.int32)])).splitlines()[0] == (
        "concatenate(2 parts)  [len 4]"
    )
    custom = lazyseq.batch(np.zeros((4, 2)), 2, collate_fn=list)
    assert repr(custom).splitlines()[0] == "batch(2, collate_fn=list)  [len 2]"


def test_html_for_notebooks_is_the_same_tree_escaped():
    html = lazyseq.view(["<b>"]).smap(lambda s: s)._repr_html_()
    assert html == (
        '<pre style="line-height: 1.3"><b>smap(test_html_for_notebooks_is_the_same_tree_escaped.'
        "&lt;locals&gt;.&lt;lambda&gt;)  [len 1]</b>\n└─ list  [len 1]</pre>"
    )
    assert (
        pipeline()
        ._repr_html_()
        .startswith(
            '<pre style="line-height: 1.3"><b>batch(64)  [len 2, items (float64 (64, 248), int64 (64,)), the last of 36]</b>\n'
        )
    )


def test_a_value_whose_repr_fails_or_is_huge_still_shows():
    class Unshowable:
        def __repr__(self):
            raise RuntimeError("no repr")

    shown = lazyseq.repeat(Unshowable(), 3).batch(2, collate_fn=list)
    assert "repeat(<Unshowable instance at 0x" in repr(shown)  # the view is shown, not the error
    assert "repeat(&lt;Unshowable instance at 0x" in shown._repr_html_()
    assert repr(lazyseq.repeat([1] * 3_000_000, 2)).startswith("repeat([1, 1, 1, 1, 1, 1, ...])")
