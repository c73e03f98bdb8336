"""Reading what worker processes send: by the consumer as it waits, or by a thread of its own while it is away.

Reading a worker's pipe, cutting the bytes into messages and unpickling them
costs a consumer that comes back from a training step (its caches cold)
about as much as the rest of a read. A consumer that only waits for results
(the workers set the pace) reads them best itself, as it waits: one wake-up
per result. One that is away between reads (a training step) is served best
by a thread that reads while it is away: it then finds its results decoded.
:class:`MessageReader` does both, and :class:`AwayTime` picks, from how long
the consumer stays away between two calls of :meth:`MessageReader.take`.
Either way, whoever reads holds one lock, so messages are read once and in
order; a worker whose process ended is reported after everything it sent.
Closing takes the lock too: a consumer reading in another thread is done with
the descriptors before they are closed, and reads nothing after.

Messages are framed as :mod:`multiprocessing.connection` frames them (a
4-byte big-endian length, or -1 then an 8-byte length), so a worker may write
several with one system call.
"""

from __future__ import annotations

import os
import select
import threading
from collections.abc import Callable, Iterable, Sequence
from time import perf_counter
from typing import Any

from . import messages
from .result_signal import ResultSignal

__all__ = ["EXITED", "AwayTime", "MessageReader", "Unreadable"]

LONGEST_MESSAGE = 1 << 48  # bytes: no result of a worker is longer (256 TiB); a longer length is not one
_SIZE, _LONG_SIZE = messages.FRAME_SIZE, messages.LONG_FRAME_SIZE  # a message's length (-1: a long one follows)
READ_BYTES = 1 << 16  # below malloc's mmap threshold: a larger read buffer costs more than it saves
EXITED = "exited"  # what ``take`` gives for a worker whose process ended
BACKGROUND_ABOVE = 0.001  # seconds the consumer stays away between reads (smoothed), from which the thread reads
FOREGROUND_BELOW = 0.0003  # ... and below which the consumer reads again itself
SMOOTHING = 0.25
LOCK_SECONDS = 0.05  # how often the thread, waiting for the consumer to finish reading, checks for close()


class _NotALength(ValueError):
    """Bytes where a message's length should be that are not one; ``frames``: the messages before them."""

    def __init__(self, message: str, frames: list) -> None:
        super().__init__(message)
        self.frames = frames


class Unreadable(Exception):
    """A worker sent bytes that are not a message (``__cause__`` says why)."""


class AwayTime:
    """Whether the consumer stays away long enough between reads for a thread to read while it is.

    >>> away = AwayTime()
    >>> for seconds in (0.005, 0.005, 0.005):  # a training step between reads
    ...     changed = away.returned(seconds)
    >>> away.background
    True
    >>> for seconds in (1e-5,) * 8:  # reads back to back
    ...     changed = away.returned(seconds)
    >>> away.background
    False
    """

    def __init__(self) -> None:
        self.background = False
        self._estimate = 0.0

    def returned(self, seconds: float) -> bool:
        """Note ``seconds`` spent away since the last read; whether that changes :attr:`background`."""
        self._estimate += SMOOTHING * (seconds - self._estimate)
        threshold = FOREGROUND_BELOW if self.background else BACKGROUND_ABOVE
        background = self._estimate >= threshold
        changed, self.background = background != self.background, background
        return changed


class _Watch:
    """A poll object over some descriptors, which forgets those that ``gone`` names before each wait."""

    def __init__(self, fds: Iterable[int]) -> None:
        self.fds = set(fds)
        self._poll = select.poll()
        for fd in self.fds:
            self._poll.register(fd, select.POLLIN)

    def wait(self, timeout: float | None, gone: set[int]) -> list[tuple[int, int]]:
        """The descriptors ready within ``timeout`` seconds (None: however long it takes)."""
        if gone:
            for fd in self.fds & gone:
                self._poll.unregister(fd)
                self.fds.discard(fd)
        return self._poll.poll(None if timeout is None else timeout * 1000)


class MessageReader:
    """Reads the messages of worker ``k`` from ``pipes[k]`` and notices ``sentinels[k]``.

    :meth:`take` gives ``(k, message)`` pairs in the order they arrived (a
    message is :data:`EXITED` once the worker's process ended, or an
    :class:`Unreadable` error). The thread, named ``name``, starts the first
    time the consumer goes away (a loop that only reads never has one);
    :meth:`close` stops it. The pipes stay open (they belong to the caller).
    ``decode(k, raw)`` is what ``take`` gives for the bytes ``raw`` of a
    message from worker ``k`` (by default :func:`.messages.decode`): it runs
    in whichever thread reads, so that a consumer away between reads finds
    that work done too.
    """

    def __init__(
        self,
        pipes: Sequence[int],
        sentinels: Sequence[int],
        name: str,
        decode: Callable[[int, bytes], Any] = lambda k, raw: messages.decode(raw),
    ) -> None:
        self._decode = decode
        self._worker_of_pipe = {fd: k for k, fd in enumerate(pipes)}
        self._worker_of_sentinel = {fd: k for k, fd in enumerate(sentinels)}
        self._unread = [bytearray() for _ in pipes]  # bytes of messages not complete yet
        self._gone: set[int] = set()  # pipes closed and sentinels reported: watched no more
        self._inbox: list[tuple[int, Any]] = []
        self._lock = threading.RLock()  # held by whoever reads the pipes or takes the inbox (or closes)
        self._watch = _Watch([*pipes, *sentinels])  # the consumer's
        self._away = AwayTime()
        self._left = 0.0  # when take() last returned
        self._signal = ResultSignal()
        self._background = threading.Event()  # set while the thread is to read
        self._stopping = threading.Event()
        self._stopped = False
        self._signalled = False  # whether someone waits on the signal's pipe (see fds)
        self._wake_read, self._wake_write = os.pipe()
        os.set_blocking(self._wake_write, False)  # a full pipe wakes the thread all the same
        self._thread = threading.Thread(target=self._run, args=([*pipes, *sentinels],), name=name, daemon=True)

    def take(self, timeout: float) -> list[tuple[int, Any]]:
        """What arrived, waiting up to ``timeout`` seconds for something if nothing has; nothing once closed."""
        with self._lock:
            if self._stopped:  # closed, perhaps from another thread: its descriptors are not ours now
                return []
            if self._left and self._away.returned(perf_counter() - self._left):
                self._switch(self._away.background)
            if self._signalled:
                self._signal.clear()  # before reading: what the thread reads after this notifies again
            if not self._inbox:
                self._read_ready(self._watch, timeout)
            taken, self._inbox = self._inbox, []
        self._left = perf_counter()
        return taken

    def fds(self) -> list[int]:
        """Descriptors that become readable when something arrives (for a consumer that waits on others too)."""
        self._signalled = True
        return [*self._signal.fds(), *self._worker_of_pipe, *self._worker_of_sentinel]

    def close(self) -> None:
        """Stop the thread and wait for it (unless this is that thread, which touches no descriptor once stopped).

        Messages read and not taken are dropped (and with them what ``decode`` made of them: leased slots).
        """
        if self._stopped:
            return
        self._stopped = True  # what the consumer reads, without a call
        self._stopping.set()
        self._background.set()  # out of its wait
        self._wake()
        if self._thread.ident is not None and threading.current_thread() is not self._thread:
            self._thread.join()
        with self._lock:  # a consumer reading in another thread is done with the descriptors (within its timeout)
            os.close(self._wake_read)
            os.close(self._wake_write)
            self._signal.close()
            self._inbox = []

    def _switch(self, background: bool) -> None:
        if background:
            self._background.set()
            if self._thread.ident is None and not self._stopping.is_set():
                try:
                    self._thread.start()
                except RuntimeError:  # none starts as the program exits (Python 3.12 on), or none can: a daemon
                    self._background.clear()  # thread of the program's reading then reads the pipes itself
        else:
            self._background.clear()
            self._wake()  # out of its poll, into its wait

    def _wake(self) -> None:
        try:
            os.write(self._wake_write, b"w")
        except BlockingIOError:
            pass

    def _run(self, fds: list[int]) -> None:
        watch = _Watch([*fds, self._wake_read])
        lock, stopping, background = self._lock, self._stopping, self._background
        while True:
            background.wait()
            if stopping.is_set():
                return
            with lock:
                gone = set(self._gone)
            ready = watch.wait(None, gone)
            if stopping.is_set():
                return
            if any(fd == self._wake_read for fd, _ in ready):
                os.read(self._wake_read, 1 << 12)
                continue
            while not lock.acquire(timeout=LOCK_SECONDS):  # the consumer is reading: it may take what is there
                if stopping.is_set():
                    return
            try:
                found = self._read_ready(watch, 0)
            finally:
                lock.release()
            if found:
                self._signal.notify()

    def _read_ready(self, watch: _Watch, timeout: float) -> bool:
        """Read the pipes ready within ``timeout`` seconds into the inbox (the lock held); whether any were."""
        ready = watch.wait(timeout, self._gone)
        exited = []
        for fd, _ in ready:
            if self._stopped:  # closed meanwhile, perhaps by a finalizer run in this thread
                return False
            k = self._worker_of_pipe.get(fd)
            if k is not None:
                if not self._read(fd, k):
                    self._gone.add(fd)  # closed: its sentinel tells why
            elif fd in self._worker_of_sentinel:
                exited.append(self._worker_of_sentinel[fd])
                self._gone.add(fd)
        for k in exited:  # after what the same wait found in the pipes: a worker writes, then exits
            self._inbox.append((k, EXITED))
        return bool(ready)

    def _read(self, fd: int, k: int) -> bool:
        """Read what worker ``k`` sent and keep its complete messages; False once the pipe is closed."""
        try:
            chunk = os.read(fd, READ_BYTES)
        except OSError:
            return False
        if not chunk:
            return False
        pending, broken = self._unread[k], None
        if not pending and len(chunk) > 4 and _SIZE.unpack_from(chunk)[0] == len(chunk) - 4:
            frames = [chunk[4:]]  # the most common case: the read holds one message, nothing came before
        else:
            try:
                frames = self._split(chunk, pending)
            except _NotALength as error:  # the messages before it are read, and nothing more of this pipe can be
                pending.clear()
                frames, broken = error.frames, Unreadable(f"the messages of worker process {k} could not be read")
                broken.__cause__ = error
        decode = self._decode
        for raw in frames:
            try:
                message: Any = decode(k, raw)
            except Exception as error:
                message = Unreadable(f"a message from worker process {k} could not be read")
                message.__cause__ = error
            self._inbox.append((k, message))
        if broken is not None:
            self._inbox.append((k, broken))
            return False  # read no further: what follows cannot be told apart into messages
        return True

    @staticmethod
    def _split(chunk: bytes, pending: bytearray) -> list:
        """The complete messages in ``pending`` followed by ``chunk``; what is left of the last one stays in ``pending``.

        :class:`_NotALength` where a length is not one.
        """
        data: bytes | bytearray = chunk  # whole messages, nothing came before
        if pending:
            pending += chunk
            data = pending
        start, end = 0, len(data)
        frames: list[bytes | bytearray] = []
        while end - start >= 4:
            (size,) = _SIZE.unpack_from(data, start)
            header = 4
            if size == -1:
                if end - start < 12:
                    break
                (size,), header = _LONG_SIZE.unpack_from(data, start + 4), 12
                if size > LONGEST_MESSAGE:  # it would be waited for, and kept growing, for ever
                    raise _NotALength(f"a message's length reads {size} bytes", frames)
            elif size < 0:  # read as it is, it would move back, or nowhere (-4): for ever
                raise _NotALength(f"a message's length reads {size} bytes", frames)
            if end - start < header + size:
                break
            frames.append(data[start + header : start + header + size])
            start += header + size
        if data is pending:  # before anything can fail: a message is never read twice
            del pending[:start]
        elif start < end:
            pending += chunk[start:]
        return frames
