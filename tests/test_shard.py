"""shard: every item in exactly one shard, shards balanced, clear errors."""

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

import lazyseq


@given(st.integers(0, 60), st.integers(1, 9), st.booleans())
def test_shards_cover_every_item_exactly_once(n, world_size, contiguous):
    items = list(range(n))
    shards = [list(lazyseq.shard(items, r, world_size, contiguous)) for r in range(world_size)]
    assert sorted(x for part in shards for x in part) == items
    assert max(map(len, shards)) - min(map(len, shards)) <= 1
    if contiguous:
        assert [x for part in shards for x in part] == items
    else:
        assert shards == [items[r::world_size] for r in range(world_size)]


def test_strided_shards_of_an_infinite_view_and_the_fluent_method():
    forever = lazyseq.cycle([0, 1, 2, 3])
    assert list(itertools.islice(forever.shard(1, 2, contiguous=False), 4)) == [1, 3, 1, 3]
    with pytest.raises(TypeError, match="a contiguous shard needs a length, but cycle view is infinite"):
        lazyseq.shard(forever, 0, 2)


def test_bad_ranks_and_world_sizes():
    with pytest.raises(ValueError, match="shard: rank must be between 0 and 1, got 2"):
        lazyseq.shard(range(4), 2, 2)
    with pytest.raises(ValueError, match="shard: world_size must be a positive integer, got 0"):
        lazyseq.shard(range(4), 0, 0)
