"""Shards written by several workers at once: each cut into pieces of rows, each piece a task of its own.

A worker writes whole shards, so a run with fewer shards to write than
workers to share them would leave workers idle: an expensive pipeline with a
small output is one shard, written by one worker. Such shards are cut into
pieces (:func:`plan`): each piece's rows are written at their place in the
shard's temporary files, which every piece of the shard opens by a name
shared within the run, piece 0 writing the ``.npy`` headers too (see
:func:`~.shard_files.write_npy_piece`). Each piece sums its own bytes; once
every piece of a shard is written, :func:`finish_shard` joins their checksums
(:func:`~.checksum.joined`) and gives the files their final names. Pieces
begin at multiples of ``PIECE_ROWS`` rows, hence of 8 bytes (a header's
length is a multiple of 64), where checksums join exactly: the files and
their records are those of one worker writing the whole shard.

>>> import numpy as np
>>> from lazyseq.io.shard_layout import Layout
>>> layout = Layout.of_items(np.zeros((1, 2)), length=100, rows_per_shard=100)
>>> [piece.rows for piece in plan(layout, workers=2)]
[range(0, 16), range(16, 32), range(32, 48), range(48, 64), range(64, 80), range(80, 96), range(96, 100)]
>>> [piece.rows for piece in plan(layout, workers=0)]
[range(0, 100)]
"""

from __future__ import annotations

import os
from collections.abc import Collection
from dataclasses import dataclass

from .checksum import joined
from .shard_files import temporary_name
from .shard_layout import Layout, ShardFile, ShardRecord

__all__ = ["PIECES_PER_WORKER", "PIECE_ROWS", "Piece", "PieceWritten", "finish_shard", "plan"]

PIECES_PER_WORKER = 4  # tasks per worker at least, where shards alone are fewer: each worker busy to the end
PIECE_ROWS = 8  # pieces begin at multiples of 8 rows: at multiples of 8 bytes, where checksums join


@dataclass(frozen=True)
class Piece:
    """Rows ``rows`` of shard ``shard``, piece ``index`` of its ``count`` (a whole shard: ``count == 1``)."""

    shard: int
    index: int
    count: int
    rows: range


@dataclass(frozen=True)
class PieceWritten:
    """A piece of a shard, written: each file's checksum state (``Sum64.state``) and bytes, in field order."""

    piece: Piece
    states: tuple[tuple[int, int, int], ...]
    sizes: tuple[int, ...]


def plan(layout: Layout, workers: int, kept: Collection[int] = ()) -> list[Piece]:
    """The tasks of a run: each shard whole, or in pieces where the shards to write are fewer than the workers need.

    ``workers`` share the tasks (0 or 1: every shard is whole); shards in
    ``kept`` are only checked, whole. With fewer than
    ``PIECES_PER_WORKER * workers`` shards to write, each is cut into as many
    pieces as give every worker that many tasks, of ``PIECE_ROWS`` rows or a
    multiple.
    """
    to_write = layout.shard_count - len(kept)
    wanted = PIECES_PER_WORKER * workers
    per_shard = -(-wanted // to_write) if workers > 1 and 0 < to_write < wanted else 1
    tasks = []
    for shard in range(layout.shard_count):
        rows = layout.rows(shard)
        if per_shard == 1 or shard in kept:
            tasks.append(Piece(shard, 0, 1, rows))
            continue
        size = -(-len(rows) // per_shard)
        size = -(-size // PIECE_ROWS) * PIECE_ROWS
        starts = range(rows.start, rows.stop, size)
        tasks += [
            Piece(shard, k, len(starts), range(start, min(start + size, rows.stop))) for k, start in enumerate(starts)
        ]
    return tasks


def finish_shard(directory: str, layout: Layout, pieces: list[PieceWritten], token: str) -> ShardRecord:
    """Give the files of a shard whose ``pieces`` are all written (in order) their final names; its record.

    The files are not synced here: see :mod:`.shard_sync`.
    """
    shard = pieces[0].piece.shard
    assert [p.piece.index for p in pieces] == list(range(pieces[0].piece.count)), "a shard's pieces, all, in order"
    files = []
    for j, name in enumerate(layout.file_names(shard)):
        path = os.path.join(directory, name)
        os.replace(temporary_name(path, token), path)
        files.append(ShardFile(name, sum(p.sizes[j] for p in pieces), joined(p.states[j] for p in pieces)))
    return ShardRecord(shard, len(layout.rows(shard)), tuple(files))
