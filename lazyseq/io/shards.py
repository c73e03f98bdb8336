"""A pipeline computed once, in parallel, into ``.npy`` shards that later runs memory-map: ``write_npy``.

The shards are written by the items of a view, :class:`ShardWrites`, each a
whole shard or a piece of one (where shards are too few to share among the
workers, see :mod:`.shard_pieces`), and giving its record; ``write_npy`` reads
that view through :func:`~lazyseq.prefetch`, so the shards are computed by the
loader's workers (threads, processes, or any backend ``method`` names), each
worker writing its files itself: only the small records travel back. What a shard holds
depends on the layout alone (see :mod:`.shard_layout`), so the output does not
depend on the workers; how a run records its progress and resumes is in
:mod:`.shard_directory`, how each file is written atomically in
:mod:`.shard_files`, and how the files reach the disk in :mod:`.shard_sync`.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
import warnings
from collections.abc import Collection, Iterator, Sequence
from typing import Any, NoReturn

import numpy as np

from ..arguments import flag, integer
from ..loading.buffering import Buffering
from ..loading.options import LoaderOptions, Method
from ..loading.prefetch import PrefetchView
from ..loading.thread_workers import worker_stopping
from ..progress import check_progress, progress_bar
from ..views import errors
from ..views.base import View
from ..views.errors import EvaluationError, LoaderFailure
from ..views.itemtypes import SequenceLike
from ..views.sources import as_view
from .npy import make_room_for_files, open_npy
from .shard_directory import ProgressLog, finish, forget_progress, intact_shards, prepare, writing_alone
from .shard_files import matches, npy_header, remove_temporaries, write_npy_files, write_npy_piece
from .shard_layout import FIRST_BLOCK_ROWS, Layout, ShardRecord, read_batch
from .shard_pieces import Piece, PieceWritten, finish_shard, plan
from .shard_sync import Syncer, sync_directory, sync_file
from .shard_writers import writing_for

__all__ = ["ShardWrites", "write_npy"]


class ShardWrites(View[Any]):
    """Item ``t`` does task ``t`` of ``tasks`` in ``directory``: a shard of ``layout``, or a piece of one.

    A whole shard (``count == 1``) is written, and its item is its
    :class:`~.shard_layout.ShardRecord`; a piece of one is written into the
    shard's temporary files that ``token`` names, and its item is a
    :class:`~.shard_pieces.PieceWritten`, which the caller collects (see
    :mod:`.shard_pieces`). A shard that ``trusted`` has a record of is only
    checked: kept if its files on disk have the recorded sizes and checksums
    (or if it is among the shards ``checked`` already), written again if not.
    With ``sync``, a whole shard's files are synced to disk before its record
    is given (else whoever reads the records syncs them, or nobody does).
    Once its loader closes (a run that failed, or was interrupted), shards
    being written by worker threads stop at their next block (a block takes
    ``BLOCK_SECONDS`` at most, after its first) and remove their temporary
    files.
    """

    kind = "write_npy"

    def __init__(
        self,
        items: View,
        layout: Layout,
        directory: str,
        trusted: dict[int, ShardRecord],
        *,
        sync: bool,
        checked: Collection[int] = (),
        tasks: Sequence[Piece] | None = None,
        token: str = "",
    ) -> None:
        self._items = items
        self._parents = (items,)
        self._layout = layout
        self._directory = directory
        self._trusted = trusted
        self._checked = checked
        self._sync = sync
        self._tasks = plan(layout, 0) if tasks is None else tasks
        self._token = token
        self._len = len(self._tasks)
        self._consumer = os.getpid()  # the run's process

    def _get(self, i: int) -> ShardRecord | PieceWritten:
        task = self._tasks[i]
        with writing_for(self._directory, self._consumer):  # (a worker process: none writes once its run is killed)
            if task.count == 1:
                return self._whole(task.shard)
            return self._piece(task)

    def _whole(self, shard: int) -> ShardRecord:
        layout, directory = self._layout, self._directory
        rows = layout.rows(shard)
        names = layout.file_names(shard)
        known = self._trusted.get(shard)
        if known is not None and layout.describes(known):
            if shard in self._checked or all(matches(directory, file) for file in known.files):
                if self._sync:  # an earlier run may have ended before syncing it
                    for file in known.files:
                        sync_file(os.path.join(directory, file.name))
                return known
        headers = [npy_header(field, len(rows)) for field in layout.fields]
        files = write_npy_files(directory, names, headers, self._blocks(rows), sync=self._sync)
        return ShardRecord(shard, len(rows), files)

    def _piece(self, piece: Piece) -> PieceWritten:
        layout = self._layout
        shard_rows = layout.rows(piece.shard)
        headers = [npy_header(field, len(shard_rows)) for field in layout.fields]
        before = piece.rows.start - shard_rows.start  # rows of the shard before the piece
        if piece.index == 0:
            starts, offsets = headers, [0] * len(headers)
        else:
            starts = [b""] * len(headers)
            offsets = [len(header) + before * field.row_bytes for header, field in zip(headers, layout.fields)]
        names = layout.file_names(piece.shard)
        blocks = self._blocks(piece.rows)
        states, sizes = write_npy_piece(self._directory, names, starts, offsets, blocks, self._token)
        return PieceWritten(piece, states, sizes)

    def _blocks(self, rows: range) -> Iterator[list[np.ndarray]]:
        """The shard's rows, in vectorized reads of ``BLOCK_BYTES`` and ``BLOCK_SECONDS`` at most."""
        layout, items = self._layout, self._items
        start, step = rows.start, min(FIRST_BLOCK_ROWS, layout.block_rows)
        while start < rows.stop:
            if worker_stopping():  # the loader is closing: the run failed, or was interrupted
                raise _Abandoned("write_npy stopped: another shard failed, or the run was interrupted")
            stop = min(start + step, rows.stop)
            began = time.perf_counter()
            block = layout.read(items, range(start, stop))
            step = layout.next_block_rows(stop - start, time.perf_counter() - began)
            yield block
            start = stop

    def _describe(self) -> str:
        layout = self._layout
        pieces = f", in {self._len} pieces" if self._len != layout.shard_count else ""
        return f"write_npy({self._directory!r}, {layout.shard_count} shards of {layout.rows_per_shard} rows{pieces})"


class _Abandoned(Exception):
    """Raised in a worker thread's shard once the run has failed elsewhere (nobody reads it)."""


def write_npy(
    seq: SequenceLike[Any],
    directory: str | os.PathLike[str],
    *,
    rows_per_shard: int | None = None,
    bytes_per_shard: int = 256 * 2**20,
    nworkers: int = 0,
    method: Method = "thread",
    resume: bool = True,
    overwrite: bool = False,
    sync: bool = True,
    progress: bool | None = None,
) -> View[Any]:
    """Compute every item of ``seq`` once and write them to ``directory`` as ``.npy`` shards; a view of them.

    Items are arrays (or numbers) of one dtype and row shape, or tuples or
    dicts of them. Each field gets its own set of plain ``.npy`` files, which
    ``np.load`` reads: ``data-00000.npy, data-00001.npy, ...`` for arrays,
    ``f0-...``, ``f1-...`` for tuples, one set per key for dicts. Shard ``k``
    holds items ``k * rows_per_shard`` onwards (``None``: as many rows as fit
    in ``bytes_per_shard`` bytes, all fields together), so the files are the
    same byte for byte whatever ``nworkers`` and ``method``. Each shard is
    computed in vectorized blocks of rows (one ``_get_many`` read per block,
    as a batch is) by ``nworkers`` threads or processes (see
    :func:`~lazyseq.prefetch`), which write the files themselves. Where the
    shards are fewer than four per worker (an expensive pipeline with a small
    output is one shard), each is written in pieces, several workers writing
    their rows at their places in its files (not with ``method="ray"``, whose
    workers may be on other machines: there a worker writes whole shards).
    The first item is also read in the calling process, to learn the layout
    (an empty ``seq`` is a ``ValueError``: it has no item to learn it from).

    ``manifest.json``, written last, lists the fields (dtype, row shape),
    the parameters, and each shard's rows and files with their sizes and
    checksums (two 64-bit sums of each file's words, see
    :mod:`lazyseq.io.checksum`); :func:`~lazyseq.open_npy` opens the
    directory through it, and the result is that view. Every file is
    written under a temporary name and renamed once complete, so a process
    killed at any point leaves complete files under final names. With
    ``sync=True`` (the default) the manifest lasts through a power loss, and
    so does everything it lists: it is written once every shard's files, and
    the directory, are synced to disk (by this process, in the background
    while the next shards are computed; with ``method="ray"``, by the worker
    that wrote them, before renaming them). ``sync=False`` syncs nothing, files or directory, and
    writes as fast as the page cache takes the data: a killed process loses
    nothing (the page cache survives it) and a resumed run still finds and
    redoes incomplete shards, but after a power loss (or a crash of the
    machine) the manifest may describe shards whose data never reached the
    disk.

    A run that stops (an exception, a kill, a power loss) leaves no
    manifest, but a progress log of the shards it finished. Calling
    ``write_npy`` again with the same arguments (``nworkers`` and ``method``
    may differ) keeps the recorded shards whose files still have their
    recorded size and checksum, redoes the others and removes temporary
    files; the result is the same as an uninterrupted run's. Over a complete
    directory whose files all check out, it writes nothing (the directory may
    be read-only) and returns the view. It assumes the
    items are the same as before: ``resume=False`` recomputes every shard.
    A directory written with other parameters (another layout, length or
    ``rows_per_shard``), or holding files named like shards that no manifest
    or progress log records, is a ``FileExistsError`` unless
    ``overwrite=True``, which removes them and writes everything anew. An
    exception in the pipeline is raised as an
    :class:`~lazyseq.EvaluationError` naming the shard and the item.
    ``progress`` shows a bar over the shards (see :mod:`lazyseq.progress`).

    >>> import os, shutil, tempfile
    >>> import numpy as np
    >>> import lazyseq
    >>> folder = tempfile.mkdtemp()
    >>> squares = lazyseq.smap(lambda x: x * x, np.arange(10.0))
    >>> written = lazyseq.write_npy(squares, folder, rows_per_shard=4, nworkers=2)
    >>> sorted(os.listdir(folder))
    ['data-00000.npy', 'data-00001.npy', 'data-00002.npy', 'manifest.json']
    >>> print(np.load(os.path.join(folder, "data-00002.npy")), written[3])
    [64. 81.] 9.0
    >>> shutil.rmtree(folder)
    """
    items = as_view(seq)
    length = items._need_length("write_npy")
    if length == 0:
        raise ValueError("write_npy: the sequence is empty, so there is nothing to write")
    options = LoaderOptions.check("write_npy", nworkers, method, inline_below=0)  # a shard is never cheap
    if rows_per_shard is not None:
        rows_per_shard = integer(rows_per_shard, "write_npy: rows_per_shard", low=1)
    bytes_per_shard = integer(bytes_per_shard, "write_npy: bytes_per_shard", low=1)
    resume = flag(resume, "write_npy: resume")
    overwrite = flag(overwrite, "write_npy: overwrite")
    sync = flag(sync, "write_npy: sync")
    check_progress(progress, "write_npy")  # before the directory is touched
    # bytes too, as os functions take them; absolute, as the workers see it (a Ray worker's own directory differs)
    if not isinstance(directory, (str, bytes, os.PathLike)):
        raise TypeError(f"write_npy: directory must be a path (a str or an os.PathLike), got {directory!r}")
    directory = os.fsdecode(directory)
    if not directory:  # an unset setting, perhaps: not the current directory
        raise ValueError("write_npy: the directory is an empty path; give '.' for the current directory")
    if not os.path.isabs(directory):  # joined, not normalized: "link/../out" goes where the system takes it
        directory = os.path.join(os.getcwd(), directory)
    try:
        first = read_batch(items, range(0, 1))
    except Exception as error:
        _raise_failure(error, 0, None, directory)
    layout = Layout.of_items(first, length, rows_per_shard, bytes_per_shard)
    # the view it returns maps every file: too many for this process is known before any is written
    make_room_for_files(layout.shard_count * len(layout.fields), "write_npy")
    parameters = {"rows_per_shard": rows_per_shard, "bytes_per_shard": bytes_per_shard}
    with writing_alone(directory):
        return _write(items, directory, layout, options, parameters, resume, overwrite, sync, progress)


def _write(
    items: View,
    directory: str,
    layout: Layout,
    options: LoaderOptions,
    parameters: dict[str, Any],
    resume: bool,
    overwrite: bool,
    sync: bool,
    progress: Any,
) -> View:
    """What :func:`write_npy` does once its arguments are checked, while no other run writes into ``directory``."""
    checked = None  # of a complete directory, the shards whose files check out (the others are redone)
    if resume and not overwrite and os.path.isdir(directory):
        checked = intact_shards(directory, layout, options.nworkers)
        if checked is not None and len(checked) == layout.shard_count:  # nothing to redo: the directory stays as it is
            forget_progress(directory)  # left by a run stopped between writing the manifest and removing it
            with contextlib.suppress(OSError):  # a read-only directory: complete, it is read as it is
                remove_temporaries(directory)  # what a run killed mid-file left
            if sync:  # it may have been written with sync=False
                for shard in range(layout.shard_count):
                    for name in layout.file_names(shard):
                        sync_file(os.path.join(directory, name))
                sync_directory(directory)
            return open_npy(directory)
    trusted, layout = prepare(directory, layout, parameters, resume, overwrite, sync)
    if checked is not None:  # read once: the files of the other shards are known not to check out
        trusted = {shard: record for shard, record in trusted.items() if shard in checked}
    # A Ray worker may run on another machine, whose cache a sync by name from here would not reach: it syncs
    # the files it writes itself. Other shards are synced by this process, off the path of the computation.
    writers_sync = sync and options.method == "ray" and options.nworkers > 0
    # Pieces of a shard are written at their places in its files, by the workers of one machine (Ray's may not be).
    sharing = options.nworkers if options.method != "ray" and hasattr(os, "pwrite") else 0
    tasks = plan(layout, sharing, kept=trusted)
    if options.method == "ray" and 1 <= len(tasks) < options.nworkers:
        warnings.warn(
            f"write_npy: {len(tasks)} shard{'s' if len(tasks) > 1 else ''} to write for {options.nworkers} Ray "
            f"workers, each of which writes whole shards: {options.nworkers - len(tasks)} will have nothing to do; "
            "a smaller rows_per_shard (or bytes_per_shard) gives each one a shard",
            stacklevel=3,
        )
    token = os.urandom(4).hex()  # the temporary files of the shards written in pieces
    writes = ShardWrites(
        items, layout, directory, trusted, sync=writers_sync, checked=checked or (), tasks=tasks, token=token
    )
    ahead = Buffering.resolve(None, options, default=2 * max(1, options.nworkers))  # Ray: three runs per worker
    name = "shard" if len(tasks) == layout.shard_count else "piece"  # what a worker's task is, in messages
    loader: PrefetchView[Any] = PrefetchView(writes, options, ahead, shm_size=0, task_name=name)
    records = []
    try:
        with (
            ProgressLog(directory) as log,
            Syncer(directory) as syncer,
            progress_bar(layout.shard_count, "write_npy", progress, "shard") as bar,
        ):
            results = iter(loader)
            pieces: list[PieceWritten] = []  # of the shard being written in pieces
            for task in tasks:
                try:
                    result = next(results)
                except Exception as error:
                    _raise_failure(error, task.shard, task.rows, directory, tasks)
                if isinstance(result, PieceWritten):
                    pieces.append(result)
                    if len(pieces) < task.count:
                        continue
                    try:
                        record = finish_shard(directory, layout, pieces, token)
                    except OSError as error:
                        error.add_note(f"while writing shard {task.shard} of {directory}")
                        raise
                    pieces = []
                else:
                    record = result
                shard = record.shard
                if record != trusted.get(shard):
                    log.append(record)
                if sync and not writers_sync:
                    syncer.add(file.name for file in record.files)
                records.append(record)
                bar.update()
            syncer.wait()
    except BaseException:  # the shards still in progress are of no use: stop them, and leave no temporary file
        try:
            loader.close()  # its worker threads stop at their next block
        finally:  # a Ctrl-C while the workers stop is raised once they are stopped (see loading.closing)
            remove_temporaries(directory)
        raise
    loader.close()
    finish(directory, layout, parameters, records, sync)
    return open_npy(directory)


def _raise_failure(
    error: Exception, shard: int, rows: range | None, directory: str, tasks: Sequence[Piece] = ()
) -> NoReturn:
    """Raise ``error``, from computing shard ``shard`` (items ``rows``), saying which shard and which item failed.

    A worker that died names the ``tasks`` it held: the pieces of shards are told apart by a note.
    """
    if isinstance(error, LoaderFailure) or errors.seterr() == "passthrough":
        error.add_note(f"while writing shard {shard} of {directory}")
        for task in getattr(error, "tasks", ()):
            piece = tasks[task] if isinstance(task, int) and 0 <= task < len(tasks) else None
            if piece is not None and piece.count > 1:
                error.add_note(
                    f"piece {task} is rows {piece.rows.start} to {piece.rows[-1]} of shard {piece.shard} "
                    f"(its piece {piece.index + 1} of {piece.count})"
                )
        raise error
    cause = error.__cause__ if isinstance(error, EvaluationError) and error.__cause__ is not None else error
    chain = _chain_in_items(cause)
    if isinstance(cause, OSError) and not chain:  # not an item's: writing the files failed (a full disk...)
        cause.add_note(f"while writing shard {shard} of {directory}")
        raise cause
    item = re.search(r"\[(\d+)\]$", chain.split(" -> ")[0]) if chain else None
    failed_item = getattr(cause, "failed_item", None)  # an item unlike item 0 (see Layout.read)
    raised = errors.item_failure(cause)
    message = errors.message_of(raised)
    if item is not None:
        where = f"item {item.group(1)} ({chain})"
    elif failed_item is not None:
        where = f"item {failed_item}"
        message = message.removeprefix(f"{where}: ")
    elif rows is not None:
        where = f"items {rows.start} to {rows[-1]}"
    else:
        where = "item 0"
    # A RemoteError stands for another type, whose name its message begins with.
    what = message if hasattr(raised, "type_name") else f"{type(raised).__name__}: {message}"
    raise EvaluationError(f"write_npy: shard {shard} of {directory} failed at {where}: {what}") from cause


def _chain_in_items(error: BaseException) -> str:
    """The part of an error's chain of views within the items written: ``gather[12] -> smap(f)[3]``."""
    chain = errors.chain_of(error)
    steps = chain.split(" -> ") if chain else []
    marker = f"{ShardWrites.kind}["
    starts = [k for k, step in enumerate(steps) if step.startswith(marker)]
    return " -> ".join(steps[starts[-1] + 1 :] if starts else steps)
