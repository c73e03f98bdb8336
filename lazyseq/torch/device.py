"""Batches moved to a device ahead of time: ``to_device``.

One loop for every device (see :mod:`lazyseq.torch.transfer` for what differs):
when the consumer asks for batch ``k``, batches up to ``k + ahead`` have been
pulled from the source and sent on their way, each through one of ``ahead + 1``
slots used in turn. A slot is refilled only after the copy out of it has
completed (its event), which on CUDA is what makes reusing its pinned buffers
safe; elsewhere the events are stand-ins that are always complete.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, TypeGuard

import torch

from ..arguments import integer
from ..nested import flatten, rebuild
from ..views.base import View
from .tensors import _becomes_tensor, _tensor
from .transfer import Slot, Transfer, transfer_for

__all__ = ["DeviceFeeder", "as_device", "to_device"]


class _Failure:
    """An exception the source raised, delivered in its place in the order of batches."""

    __slots__ = ("error",)

    def __init__(self, error: Exception) -> None:
        self.error = error


_NOTHING = object()


def _read_by_position(batches: Iterable[Any]) -> TypeGuard[View[Any]]:
    """Whether ``batches`` is a view of known length that its own iterator reads by position too (not a loader's,
    which has a state and rules of its own, nor one that streams, as ``unbatch`` reads each batch once)."""
    if not isinstance(batches, View) or batches._len is None:
        return False
    kind = type(batches)
    return kind.__iter__ is View.__iter__ and kind._iter is View._iter


class _ByPosition(Iterator[Any]):
    """The items of a view read by position: a read interrupted (Ctrl-C) is made again by the next one, where the
    view's own iterator, a generator, would be over; an item that fails raises in its turn, and the next read goes
    on past it."""

    def __init__(self, view: View[Any]) -> None:
        self._view, self._next, self._len = view, 0, len(view)

    def __next__(self) -> Any:
        if self._next >= self._len:
            raise StopIteration
        position = self._next
        try:
            item = self._view[position]
        except Exception:
            self._next = position + 1
            raise
        self._next = position + 1
        return item


class DeviceFeeder(Iterator[Any]):
    """An iterator over ``batches`` as tensors on ``device``, each sent there ``ahead`` batches early.

    What :func:`~lazyseq.torch.to_device` returns, where its arguments are
    described (``transfer``: how batches are copied, made from
    ``pin_memory``, ``non_blocking`` and ``dtype`` when not given). A
    context manager; ``close()`` (idempotent) drops the batches sent ahead
    and the staging buffers, and ends the iteration. A ``KeyboardInterrupt``
    leaves it open: the next read goes on, with the batches sent ahead.

    >>> import numpy as np, lazyseq
    >>> from lazyseq.torch import to_device
    >>> with to_device(lazyseq.view(np.ones((6, 2))).batch(4), "cpu") as feeder:
    ...     [tuple(batch.shape) for batch in feeder]
    [(4, 2), (2, 2)]
    """

    def __init__(
        self,
        batches: Iterable[Any],
        device: str | torch.device,
        ahead: int = 2,
        pin_memory: bool | None = None,
        non_blocking: bool = True,
        transfer: Transfer | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        ahead = integer(ahead, "to_device: ahead", low=0)
        if isinstance(batches, Mapping):  # its keys would be taken for the batches
            raise TypeError(
                f"to_device: batches must be an iterable of batches, got one {type(batches).__name__} (a batch?): "
                "give [batch] for one batch"
            )
        self.device = as_device(device, "to_device")
        self.ahead = ahead
        if transfer is None:
            transfer = transfer_for(self.device, pin_memory, non_blocking, dtype)
        self._transfer = transfer
        if not hasattr(type(batches), "__iter__") and not hasattr(type(batches), "__getitem__"):
            raise TypeError(
                f"to_device: batches must be an iterable of batches (a view, a loader, a list), "
                f"not {type(batches).__name__}"
            )
        self._source = _ByPosition(batches) if _read_by_position(batches) else iter(batches)
        self._owns_source = self._source is not batches  # an iterator made here is closed here, not the caller's
        self._slots = [Slot(self._transfer.new_event()) for _ in range(ahead + 1)]
        self._sent: deque = deque()  # (slot, skeleton, device leaves) or _Failure, in the source's order
        self._pulled = 0  # batches taken from the source (failures included)
        self._delivered = 0
        self._exhausted = False
        self._interrupted: Any = _NOTHING  # a batch taken from the source as an interrupt came, not sent yet
        self.closed = False

    def __next__(self) -> Any:
        if self.closed:
            raise StopIteration
        sent = self._sent
        try:
            while len(sent) <= self.ahead and not self._exhausted:
                self._pull()
        except KeyboardInterrupt:  # open still: the next read goes on (a loader's iterator reads that item next)
            raise
        except BaseException:
            self.close()
            raise
        if not sent:
            self.close()
            raise StopIteration
        entry = sent.popleft()
        self._delivered += 1
        if type(entry) is _Failure:
            raise entry.error
        slot, skeleton, leaves = entry
        self._transfer.hand_over(leaves, slot.event)
        return rebuild(skeleton, leaves)

    def _pull(self) -> None:
        """Take the next batch from the source and start its copy to the device."""
        batch, self._interrupted = self._interrupted, _NOTHING
        if batch is _NOTHING:
            try:
                batch = next(self._source)
            except StopIteration:
                self._exhausted = True
                return
            except Exception as error:  # raised in its turn, after the batches before it
                self._sent.append(_Failure(error))
                self._pulled += 1
                return
            self._pulled += 1
        try:
            self._send(batch, self._slots[(self._pulled - 1) % len(self._slots)])
        except KeyboardInterrupt:
            self._interrupted = batch  # sent by the next read, not lost
            raise

    def _send(self, batch: Any, slot: Slot) -> None:
        """Start the copy of ``batch`` to the device through ``slot``."""
        leaves: list = []
        skeleton = flatten(batch, leaves, is_leaf=_becomes_tensor)
        # numpy arrays become tensors that share their memory, as with to_tensors
        leaves = [x if isinstance(x, torch.Tensor) else _tensor(x) for x in leaves]
        transfer = self._transfer
        slot.event.synchronize()  # the last copy out of this slot is complete: its buffers can be reused
        slot.held = []
        host = transfer.stage(slot, leaves)
        with transfer.on_stream():
            moved = transfer.copy(host)
            slot.event.record(transfer.stream)
        if transfer.holds_host:
            slot.held = host
        self._sent.append((slot, skeleton, moved))

    def close(self) -> None:
        """Drop the batches sent ahead and the staging buffers; iteration ends. Idempotent."""
        if self.closed:
            return
        self.closed = True
        self._sent.clear()
        self._interrupted = _NOTHING
        for slot in self._slots:
            slot.event.synchronize()  # no copy may still read a buffer dropped here
            slot.buffers, slot.held = None, []
        if self._owns_source and hasattr(self._source, "close"):
            self._source.close()
        self._source = iter(())

    def __iter__(self) -> DeviceFeeder:
        return self

    def __enter__(self) -> DeviceFeeder:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def state_dict(self) -> dict[str, Any]:
        """Where to resume: the state of the iterator the batches come from, as of the batches delivered.

        The batches sent ahead and not delivered are read again by a run
        resumed from it. The batches must come from an iterator that has a
        state (an iteration over a :func:`~lazyseq.prefetch` view).

        >>> import numpy as np, lazyseq
        >>> from lazyseq.torch import to_device
        >>> batches = lazyseq.prefetch(lazyseq.view(np.arange(10.0)).batch(2), nworkers=0)
        >>> with to_device(iter(batches), "cpu", ahead=2) as feeder:
        ...     first = next(feeder)  # two more were taken ahead
        ...     state = feeder.state_dict()
        >>> state["position"]
        1
        >>> with to_device(iter(batches), "cpu") as resumed:
        ...     resumed.load_state_dict(state)
        ...     [batch.tolist() for batch in resumed][0]
        [2.0, 3.0]
        """
        state = dict(self._source_state("state_dict")())
        state["position"] -= self._pulled - self._delivered
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from ``state`` (from :meth:`state_dict`), before the first batch is read."""
        if self._pulled:
            raise ValueError("to_device: load_state_dict must come before the first batch is read")
        self._source_state("load_state_dict")(state)

    def _source_state(self, name: str) -> Any:
        method = getattr(self._source, name, None)
        if method is None:
            raise TypeError(
                f"to_device: the batches come from a {type(self._source).__name__}, which has no {name}(); give "
                "to_device an iteration over a lazyseq.prefetch view to resume where it stopped"
            )
        return method

    @property
    def pulled(self) -> int:
        """How many batches have been taken from the source so far."""
        return self._pulled

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"{self._delivered} delivered, {len(self._sent)} ahead"
        return f"to_device({self.device}, ahead={self.ahead})  [{state}]"


def as_device(device: Any, caller: str) -> torch.device:
    """``device`` as a ``torch.device``, for ``caller``; errors name the argument (torch's own list every
    constructor it has).

    >>> as_device("cpu", "to_device")
    device(type='cpu')
    >>> as_device(None, "predict")
    Traceback (most recent call last):
    ...
    TypeError: predict: device must be a torch.device, its name ('cpu', 'cuda:0') or an accelerator's index, not None
    """
    if isinstance(device, torch.device):
        return device
    if not isinstance(device, str):
        try:
            device = integer(device, f"{caller}: device", low=0)
        except TypeError:
            raise TypeError(
                f"{caller}: device must be a torch.device, its name ('cpu', 'cuda:0') or an accelerator's index, "
                f"not {device!r}"
            ) from None
    try:
        return torch.device(device)
    except RuntimeError as error:  # an unknown name; an index where no accelerator is
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise RuntimeError(f"{caller}: device {device!r}: {reason}") from None


def to_device(
    batches: Iterable[Any],
    device: str | torch.device,
    *,
    ahead: int = 2,
    pin_memory: bool | None = None,
    non_blocking: bool = True,
    dtype: torch.dtype | None = None,
) -> DeviceFeeder:
    """An iterator over ``batches`` as tensors on ``device``, each one sent there ``ahead`` batches in advance.

    A batch is an array or tensor, or tuples, lists, namedtuples and
    mappings of them (rebuilt by the rule of :mod:`lazyseq.nested`, as
    :func:`~lazyseq.torch.to_tensors` does); numpy arrays become tensors
    first (sharing memory), tensors already on ``device`` are not copied,
    other values (and arrays torch has no tensor for) pass through.
    ``dtype`` converts the floating-point tensors (``dtype=torch.float32``
    feeds float64 data to a float32 model); integer, boolean and complex
    ones keep their dtype. When
    you hold batch ``k``, batches up to ``k + ahead`` have been taken from
    ``batches``. An exception from ``batches`` is raised, unchanged, in its
    turn.

    On CUDA each batch is copied into one of ``ahead + 1`` pinned host slots
    (allocated at the first batch, reused in turn; a batch of another shape
    or dtype gets buffers of its own in its slot, a shorter last batch uses
    the first rows), then to the GPU on a separate stream, overlapping your
    computation; your stream waits for that copy before you use the batch.
    ``pin_memory=False`` skips the pinned slots; ``non_blocking=False``
    makes each copy to the GPU finish before the next batch is taken (for
    debugging: the overlap is lost). On the CPU the same loop
    runs without pinning or streams: tensors share the arrays' memory, and
    there is no copy to overlap, so ``ahead=0`` costs least there (batches
    held ahead keep a process loader's shared slots in use).

    Use it as a context manager (or call ``close()``) to release the batches
    sent ahead when you stop early; it never closes ``batches`` itself (a
    loader you pass stays yours to close).

    >>> import numpy as np
    >>> from lazyseq.torch import to_device
    >>> batches = [(np.full((2, 3), k, dtype=np.float32), np.array([k, k])) for k in range(4)]
    >>> with to_device(batches, "cpu", ahead=1) as on_device:
    ...     for x, y in on_device:
    ...         print(x.sum().item(), y.tolist(), on_device.pulled)
    0.0 [0, 0] 2
    6.0 [1, 1] 3
    12.0 [2, 2] 4
    18.0 [3, 3] 4
    >>> import torch
    >>> x, y = next(to_device([(np.zeros((2, 3)), np.array([0, 1]))], "cpu", dtype=torch.float32))
    >>> x.dtype, y.dtype
    (torch.float32, torch.int64)
    """
    return DeviceFeeder(batches, device, ahead, pin_memory, non_blocking, dtype=dtype)
