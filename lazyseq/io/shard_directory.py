"""What a directory written by ``write_npy`` holds between runs, and how a new run starts from it.

Two files describe the shards, and at most one of them exists once a run has
started (a power loss right after a run can bring back the progress log it
removed: the manifest then wins):

- ``manifest.json``, written last (atomically), once every shard is on disk
  (with ``sync=False``, once every shard is written: see ``write_npy``):
  the layout (item kind, fields with dtype and row shape, length, rows per
  shard), the parameters of the call, and one record per shard (rows, and per
  file its size and checksum). Its presence means the directory is complete.
- ``progress.jsonl`` while a run is under way: its first line is the layout
  and parameters (written atomically, with the records carried over from the
  run before), then one line is appended per shard once that shard's files
  have their final names (they may not be on disk yet: a power loss can
  leave a recorded file short, or empty). A run killed mid-line leaves a last
  line cut short, which the next run ignores (that shard is redone).

A record is never trusted blindly: a new run checks each recorded file's size
and checksum against the file on disk, and redoes the shard where they
disagree. A shard file without a record (killed between its rename and its
line) is redone too.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import IO, Any

from .parent_locks import parents_only
from .shard_files import matches, remove_temporaries, replace_atomically
from .shard_layout import MANIFEST, PROGRESS, SHARD_FILE_NAME, Layout, ShardRecord
from .shard_sync import sync_directory
from .shard_writers import no_stale_writers

__all__ = [
    "MANIFEST",
    "PROGRESS",
    "ProgressLog",
    "Written",
    "finish",
    "forget_progress",
    "intact_shards",
    "prepare",
    "read_manifest",
    "writing_alone",
]

FORMAT = "lazyseq.write_npy"
VERSION = 2
LOCK_ATTEMPTS = 10  # 10 ms apart: an open_npy looking at the lock holds it for a moment
READABLE_VERSIONS = (1, 2)  # version 1 recorded CRC-32s instead of the checksums of .checksum


@dataclass(frozen=True)
class Written:
    """What an earlier run left: its layout and parameters, and the shards it recorded."""

    layout: Layout
    parameters: dict[str, Any]
    records: dict[int, ShardRecord]
    complete: bool  # a manifest (every shard written), not a progress log


def read_manifest(directory: str) -> Written:
    """The manifest of a complete directory; errors name the file and say what is wrong."""
    path = os.path.join(directory, MANIFEST)
    if not os.path.exists(path):
        if os.path.exists(os.path.join(directory, PROGRESS)):
            if _being_written(directory):
                raise FileNotFoundError(
                    f"{directory} is being written by a write_npy run that has not finished (no {MANIFEST} yet): "
                    "open it once that run has ended"
                )
            raise FileNotFoundError(
                f"{directory} holds shards of a write_npy run that did not finish (no {MANIFEST}, only "
                f"{PROGRESS}): call write_npy again with the same arguments to finish it"
            )
        shards = _shard_files(directory)
        if shards:  # of a run whose manifest and progress log were removed (or another program's, named alike)
            fields = sorted({name.rsplit("-", 1)[0] for name in shards})
            patterns = [repr(os.path.join(directory, f"{field}-*.npy")) for field in fields]
            reading = (
                f"open them with a glob pattern ({patterns[0]})"
                if len(fields) == 1
                else f"open each field's files with a glob pattern ({', '.join(patterns)}) and lazyseq.collate them"
            )
            raise FileNotFoundError(
                f"{directory} has no {MANIFEST}, but holds {len(shards)} files named like write_npy's shards "
                f"(fields {', '.join(fields)}): without the manifest they cannot be checked; write them again "
                f"(write_npy with overwrite=True), or {reading}"
            )
        raise FileNotFoundError(
            f"{directory} has no {MANIFEST}: it was not written by write_npy (open its files with a glob "
            f"pattern such as {os.path.join(directory, '*.npy')!r})"
        )
    try:
        with open(path, encoding="utf-8") as file:
            data = json.load(file)
        return _written(data, data["shards"], complete=True)
    except (ValueError, KeyError, TypeError, OverflowError, RecursionError, IsADirectoryError) as error:
        raise ValueError(f"{path} is not a write_npy manifest: {type(error).__name__}: {error}") from None


def _shard_files(directory: str) -> list[str]:
    """The names of the files in ``directory`` named as write_npy names its shards, sorted."""
    return sorted(name for name in os.listdir(directory) if SHARD_FILE_NAME.fullmatch(name))


def _lock_soon(fd: int, fcntl: Any) -> None:
    """Take the directory's lock, ``BlockingIOError`` if a run holds it: an ``open_npy`` that looks at it holds it a
    moment (see :func:`_being_written`), a run for as long as it writes."""
    for attempt in range(LOCK_ATTEMPTS):
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if attempt == LOCK_ATTEMPTS - 1:
                raise
            time.sleep(0.01)


def _being_written(directory: str) -> bool:
    """Whether a run holds the lock of ``directory`` (see :func:`writing_alone`): it is writing there now."""
    try:
        import fcntl

        fd = os.open(directory, os.O_RDONLY)
    except (ImportError, OSError):
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:  # a file system without locks
        return False
    finally:
        os.close(fd)  # and the lock taken with it
    return False


@contextlib.contextmanager
def writing_alone(directory: str) -> Iterator[None]:
    """``directory`` made if missing, and locked while a run writes into it: ``BlockingIOError`` if another is.

    The lock is the directory's own (``flock``, POSIX), so nothing is left in
    it, and it goes with the process that holds it, however that ends.
    """
    _make_directory(directory)
    try:
        import fcntl
    except ImportError:  # Windows: runs are not told apart
        yield
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        try:
            _lock_soon(fd, fcntl)
        except BlockingIOError:
            raise BlockingIOError(
                f"write_npy: another run is writing into {directory}; wait until it ends (a run that was killed "
                "lets go at once), or write elsewhere"
            ) from None
        except OSError:  # a file system without locks (some network ones): runs are not told apart there
            pass
        _locks.add(fd)
        try:
            no_stale_writers(directory)  # (the workers of a run killed, still there)
            yield
        finally:
            _locks.discard(fd)
    finally:
        os.close(fd)


# the descriptors of the directories locked by this process (a worker process forked meanwhile: its parent's, to end
# with its run)
_locks: set[int] = parents_only(set())


def _make_directory(directory: str) -> None:
    """``directory`` and its parents made where missing; an ``OSError`` of the same type naming it otherwise."""
    if os.path.exists(directory) and not os.path.isdir(directory):
        raise FileExistsError(f"write_npy: {directory} is a file; write_npy writes into a directory")
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as error:
        raise type(error)(f"write_npy: cannot make the directory {directory}: {error.strerror or error}") from error


def intact_shards(directory: str, layout: Layout, threads: int) -> set[int] | None:
    """The shards of ``directory`` whose files have their recorded size and checksum (read by up to ``threads``
    threads), if a manifest of ``layout`` says the directory is complete; else ``None``.

    Nothing is written: a call over a complete directory whose shards all
    check out leaves it as it was, and works on a read-only one.
    """
    if not os.path.exists(os.path.join(directory, MANIFEST)):
        return None
    try:
        written = read_manifest(directory)
    except (FileNotFoundError, ValueError):  # prepare() says what is wrong
        return None
    if layout.in_order_of(written.layout).differences(written.layout):
        return None
    records = [record for record in written.records.values() if written.layout.describes(record)]
    files = [(record.shard, file) for record in records for file in record.files]
    check = functools.partial(matches, directory)
    if threads > 1 and len(files) > 1:
        with ThreadPoolExecutor(min(threads, len(files)), thread_name_prefix="lazyseq-write_npy-check") as pool:
            found = list(pool.map(check, [file for _, file in files]))
    else:
        found = [check(file) for _, file in files]
    damaged = {shard for (shard, _), ok in zip(files, found) if not ok}
    return {record.shard for record in records} - damaged


def prepare(
    directory: str, layout: Layout, parameters: dict[str, Any], resume: bool, overwrite: bool, sync: bool
) -> tuple[dict[int, ShardRecord], Layout]:
    """Ready ``directory`` for a run of ``layout``: the records of an earlier run to check and keep, and the layout
    to write (an earlier run's, where it differs from ``layout`` only in the order of a dict's keys).

    Refuses (``FileExistsError``) a directory holding shards of other
    parameters, or shard files it has no record of, unless ``overwrite``,
    which removes them. On return no manifest claims the directory complete
    (``sync``: even after a power loss), no temporary file is left, and the
    progress log holds ``layout``.
    """
    _make_directory(directory)
    previous = None if overwrite else _read_state(directory)
    if previous is None and not overwrite:
        strays = _shard_files(directory)
        if strays:
            shown = ", ".join(strays[:3]) + (", ..." if len(strays) > 3 else "")
            raise FileExistsError(
                f"write_npy: {directory} holds files named like shards ({shown}) but no {MANIFEST}: pass "
                "overwrite=True to replace them, or choose another directory"
            )
    if previous is not None:
        layout = layout.in_order_of(previous.layout)
        changes = layout.differences(previous.layout)
        if changes:
            raise FileExistsError(
                f"write_npy: {directory} holds shards written with other parameters ({'; '.join(changes)}): "
                "pass overwrite=True to replace them, or choose another directory"
            )
    if overwrite:
        for name in os.listdir(directory):
            if SHARD_FILE_NAME.fullmatch(name) or name in (MANIFEST, PROGRESS):
                os.remove(os.path.join(directory, name))
    trusted = previous.records if previous is not None and resume else {}
    remove_temporaries(directory)
    lines = [_header(layout, parameters)] + [record.to_json() for _, record in sorted(trusted.items())]
    replace_atomically(os.path.join(directory, PROGRESS), "".join(_line(x) for x in lines).encode(), sync=sync)
    manifest = os.path.join(directory, MANIFEST)
    if os.path.exists(manifest):
        os.remove(manifest)
        if sync:
            sync_directory(directory)
    return trusted, layout


class ProgressLog:
    """Appends a line per finished shard to the progress log (flushed: it survives the process)."""

    def __init__(self, directory: str) -> None:
        self._file: IO[str] = open(os.path.join(directory, PROGRESS), "a", encoding="utf-8")

    def append(self, record: ShardRecord) -> None:
        self._file.write(_line(record.to_json()))
        self._file.flush()

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> ProgressLog:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def finish(
    directory: str, layout: Layout, parameters: dict[str, Any], records: Iterable[ShardRecord], sync: bool
) -> None:
    """Write the manifest (atomically, last of all) and remove the progress log.

    Every shard is written by now (``sync``: and its files synced to disk): a
    temporary file left is a worker's that died mid-shard (a Ray node lost,
    its shard written again elsewhere).
    """
    remove_temporaries(directory)
    if sync:
        sync_directory(directory)  # every shard's rename lasts before the manifest's does
    header = json.dumps({**_header(layout, parameters), "shards": []}, indent=1)
    shards = ",\n".join(f"  {json.dumps(record.to_json())}" for record in records)  # one line per shard
    text = header.replace('"shards": []', f'"shards": [\n{shards}\n ]')
    replace_atomically(os.path.join(directory, MANIFEST), (text + "\n").encode(), sync=sync)
    forget_progress(directory)  # not synced: a progress log back after a power loss is ignored


def forget_progress(directory: str) -> None:
    """Remove the progress log of a directory that has its manifest, if it is there and may be removed."""
    try:
        os.remove(os.path.join(directory, PROGRESS))
    except OSError:  # gone already, or a directory that may only be read (harmless: the manifest comes first)
        pass


def _read_state(directory: str) -> Written | None:
    """What an earlier run left in ``directory``: the manifest, else the progress log, else ``None``."""
    manifest = os.path.join(directory, MANIFEST)
    if os.path.exists(manifest):
        try:
            return read_manifest(directory)
        except ValueError as error:
            raise ValueError(f"write_npy: {error}; pass overwrite=True to replace the directory's shards") from None
    try:
        with open(os.path.join(directory, PROGRESS), encoding="utf-8") as file:
            lines = file.read().split("\n")
    except FileNotFoundError:
        return None
    records = []
    for line in lines[1:]:
        try:
            records.append(json.loads(line))
        except ValueError:  # the line a killed run was writing
            continue
    name = os.path.join(directory, PROGRESS)
    redo = "pass overwrite=True to write the directory anew"
    try:  # the header is written atomically: whole, unless the machine crashed before it reached the disk
        header = json.loads(lines[0])
    except ValueError as error:
        raise ValueError(
            f"write_npy: {name} cannot be read ({error}): the machine crashed while a run with sync=False was "
            f"writing it, or it was edited; {redo}"
        ) from None
    try:
        if not isinstance(header, dict):
            raise TypeError(f"its first line is a {type(header).__name__}, not an object")
        return _written(header, records, complete=False)
    except (KeyError, TypeError, ValueError) as error:
        raise ValueError(f"write_npy: {name} is not a write_npy progress log: {error}; {redo}") from None


def _written(header: dict[str, Any], records: list[dict[str, Any]], complete: bool) -> Written:
    if header.get("format") != FORMAT:
        raise ValueError(f"its format is {header.get('format')!r}, not {FORMAT!r}")
    if header.get("version") not in READABLE_VERSIONS:
        readable = " and ".join(str(v) for v in READABLE_VERSIONS)
        raise ValueError(
            f"it is version {header.get('version')!r} of the format; this lazyseq reads versions {readable}"
        )
    shards = {}
    for data in records:
        try:
            record = ShardRecord.from_json(data)
        except (KeyError, TypeError, ValueError):
            if complete:
                raise
            continue  # a progress line garbled by a crash: that shard is redone
        shards[record.shard] = record
    return Written(Layout.from_json(header), dict(header.get("parameters", {})), shards, complete)


def _header(layout: Layout, parameters: dict[str, Any]) -> dict[str, Any]:
    return {"format": FORMAT, "version": VERSION, **layout.to_json(), "parameters": parameters}


def _line(data: dict[str, Any]) -> str:
    return json.dumps(data, separators=(",", ":")) + "\n"
