import numpy as np
import pytest

from lazyseq.io.shard_layout import Layout
from lazyseq.io.shard_pieces import PIECE_ROWS, plan


def layout(length, rows_per_shard):
    return Layout.of_items(np.zeros((1, 3), np.float32), length=length, rows_per_shard=rows_per_shard)


@pytest.mark.parametrize(("length", "rows_per_shard", "workers"), [(1000, 1000, 2), (57, 10, 2), (999, 300, 3)])
def test_pieces_cover_each_shard_in_order_from_multiples_of_eight_rows(length, rows_per_shard, workers):
    shards = layout(length, rows_per_shard)
    tasks = plan(shards, workers)
    assert len(tasks) >= 4 * workers or all(len(task.rows) <= PIECE_ROWS for task in tasks)
    for shard in range(shards.shard_count):
        pieces = [task for task in tasks if task.shard == shard]
        assert [p.index for p in pieces] == list(range(len(pieces))) and {p.count for p in pieces} == {len(pieces)}
        assert [row for p in pieces for row in p.rows] == list(shards.rows(shard))
        assert all((p.rows.start - shards.rows(shard).start) % PIECE_ROWS == 0 for p in pieces)
    assert [task.shard for task in tasks] == sorted(task.shard for task in tasks)


def test_shards_stay_whole_without_workers_to_share_them_or_when_they_are_enough():
    assert [t.rows for t in plan(layout(100, 10), 0)] == [range(k, k + 10) for k in range(0, 100, 10)]
    assert [t.rows for t in plan(layout(1000, 1000), 1)] == [range(0, 1000)]
    assert [t.count for t in plan(layout(100, 10), 2)] == [1] * 10  # 10 shards: more than 4 tasks per worker


def test_shards_to_check_stay_whole_and_the_others_share_the_workers():
    tasks = plan(layout(40, 10), 2, kept={0, 1, 2})  # one shard to write: 8 tasks for 2 workers, of 8 rows at least
    assert [(t.shard, t.rows) for t in tasks] == [
        (0, range(0, 10)),
        (1, range(10, 20)),
        (2, range(20, 30)),
        (3, range(30, 38)),
        (3, range(38, 40)),
    ]
