"""Every public function documents itself with a runnable example (pytest runs them with --doctest-modules)."""

import inspect

import pytest

import lazyseq


@pytest.mark.parametrize("name", [n for n in lazyseq.__all__ if n != "View"])
def test_public_function_has_an_example(name):
    obj = getattr(lazyseq, name)
    doc = inspect.getdoc(obj) or ""
    assert ">>> " in doc, f"lazyseq.{name} has no docstring example"


def test_fluent_methods_mirror_the_functions():
    v = lazyseq.view(list(range(6)))
    assert list(v.smap(str)) == list(lazyseq.smap(str, range(6)))
    assert list(v.gather([1, 0])) == [1, 0] == list(v.take([1, 0]))
    assert list(v.concatenate([6])) == list(range(7))
    assert v.collate("abcdef")[1] == (1, "b")
    assert list(v.interleave("ab"))[:4] == [0, "a", 1, "b"]
    assert v.batch(4, collate_fn=list)[1] == [4, 5]
    assert list(v.batch(2).unbatch(2)) == list(range(6))
    assert [list(p) for p in v.split(1)] == [[0, 1, 2], [3, 4, 5]]
    assert v.cycle()[7] == 1
    assert sorted(v.shuffle(seed=1)) == list(range(6))
    assert v.add_cache(2)[3] == 3
    assert list(lazyseq.view([(1, 2)]).starmap(max)) == [2]
