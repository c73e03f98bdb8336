"""How a batch of tensors reaches a device: the CUDA way (pinned slots, a copy stream, events) and the plain way.

:class:`~lazyseq.torch.device.DeviceFeeder` runs one loop for every device and
leaves the device-specific steps to a *transfer*:

- ``stage(slot, leaves)``: the host tensors to copy from. On CUDA, CPU tensors
  are first copied into the slot's pinned buffers (allocated once, from the
  first batch, reused); elsewhere the tensors themselves.
- ``stream``, ``new_event()``: where copies run and how their end is marked.
  On CUDA, a separate stream and CUDA events; elsewhere stand-ins that do
  nothing, so that the loop is the same.
- ``copy(host)``: the device tensors (``.to(device, non_blocking=...)``).
- ``dtype``: the dtype floating-point tensors arrive in (``None``: their own).
  Staging converts them as it copies them into the slot's buffers, so that a
  float64 batch for a float32 model crosses to the GPU at half the size.
- ``hand_over(leaves, event)``: make the consumer's stream wait for the copy
  and tell the allocator that the consumer's stream uses the tensors.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

__all__ = ["CudaTransfer", "Slot", "Transfer", "transfer_for"]


class _NoEvent:
    """An event that is always complete: for devices whose copies are synchronous."""

    __slots__ = ()

    def record(self, stream: Any = None) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True


class Slot:
    """One of the ``ahead + 1`` places a batch goes through: its host buffers and the event ending its last copy."""

    __slots__ = ("buffers", "event", "held")

    def __init__(self, event: Any) -> None:
        self.event = event
        self.buffers: list[Any] | None = None  # staging tensors, one per leaf (None for a leaf that is not staged)
        self.held: list[Any] = []  # host tensors a copy in flight reads from, kept alive until the event completes


class Transfer:
    """Tensors go to ``device`` with ``Tensor.to``; no staging, no stream, nothing to wait for."""

    staging = False
    holds_host = False  # whether copies may still read the host tensors after ``copy`` returns

    def __init__(self, device: torch.device, non_blocking: bool, dtype: torch.dtype | None = None) -> None:
        self.device = device
        self.non_blocking = non_blocking
        self.dtype = dtype
        self.stream: Any = None
        self.template: list[tuple[tuple, torch.dtype] | None] | None = None  # leaves of the first staged batch
        self.allocations = 0  # staging tensors allocated so far (once per slot and leaf, unless shapes change)

    def new_event(self) -> Any:
        return _NoEvent()

    def on_stream(self) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()

    def allocate(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        self.allocations += 1
        return torch.empty(shape, dtype=dtype)

    def needs_staging(self, tensor: torch.Tensor) -> bool:
        return False

    def dtype_for(self, tensor: torch.Tensor) -> torch.dtype:
        """The dtype ``tensor`` arrives in: ``dtype`` if it is floating-point and one is set, else its own."""
        if self.dtype is not None and tensor.is_floating_point():
            return self.dtype
        return tensor.dtype

    def _layout(self, tensor: torch.Tensor) -> tuple[tuple[int, ...], torch.dtype]:
        return tuple(tensor.shape), self.dtype_for(tensor)

    def stage(self, slot: Slot, leaves: list[Any]) -> list[Any]:
        """The host tensors to copy from; with staging, CPU tensors copied into the slot's buffers.

        The slot's previous copy must be complete (its event synchronized).
        """
        if not self.staging:
            return leaves
        if self.template is None:
            self.template = [self._layout(t) if self.needs_staging(t) else None for t in leaves]
        if slot.buffers is None:
            slot.buffers = [None if lay is None else self.allocate(*lay) for lay in self.template]
        buffers = slot.buffers
        if len(buffers) != len(leaves):  # another structure: other buffers, made as needed below
            buffers = slot.buffers = [None] * len(leaves)
        host = []
        for k, tensor in enumerate(leaves):
            if not self.needs_staging(tensor):
                host.append(tensor)
                continue
            buffer = buffers[k]
            if not _fits(buffer, tensor, self.dtype_for(tensor)):
                buffer = buffers[k] = self.allocate(*self._layout(tensor))
            target = buffer if buffer.shape == tensor.shape else buffer[: len(tensor)]
            target.copy_(tensor)  # converts to the buffer's dtype
            host.append(target)
        return host

    def copy(self, host: list[Any]) -> list[Any]:
        device, non_blocking, dtype_for = self.device, self.non_blocking, self.dtype_for
        return [
            t.to(device, dtype=dtype_for(t), non_blocking=non_blocking) if isinstance(t, torch.Tensor) else t
            for t in host
        ]

    def hand_over(self, leaves: list[Any], event: Any) -> None:
        pass


def _fits(buffer: torch.Tensor | None, tensor: torch.Tensor, dtype: torch.dtype) -> bool:
    """Whether ``tensor``, as ``dtype``, fits in ``buffer`` as it is, or in its first rows (a shorter last batch)."""
    if buffer is None or buffer.dtype != dtype or buffer.dim() != tensor.dim():
        return False
    if buffer.shape == tensor.shape:
        return True
    return tensor.dim() > 0 and buffer.shape[1:] == tensor.shape[1:] and len(tensor) <= len(buffer)


class CudaTransfer(Transfer):
    """Pinned staging slots, copies on a separate stream, events that the consumer's stream waits for."""

    holds_host = True

    def __init__(
        self, device: torch.device, non_blocking: bool, pin_memory: bool, dtype: torch.dtype | None = None
    ) -> None:
        super().__init__(device, non_blocking, dtype)
        self.staging = pin_memory
        self.stream = torch.cuda.Stream(device)

    def new_event(self) -> Any:
        return torch.cuda.Event()

    def on_stream(self) -> contextlib.AbstractContextManager[Any]:
        return torch.cuda.stream(self.stream)

    def allocate(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        self.allocations += 1
        return torch.empty(shape, dtype=dtype, pin_memory=True)

    def needs_staging(self, tensor: torch.Tensor) -> bool:
        # Pinned tensors (a DataLoader with pin_memory=True) are copied from directly.
        return isinstance(tensor, torch.Tensor) and tensor.device.type == "cpu" and not tensor.is_pinned()

    def hand_over(self, leaves: list[Any], event: Any) -> None:
        consumer = torch.cuda.current_stream(self.device)
        consumer.wait_event(event)
        for tensor in leaves:
            if isinstance(tensor, torch.Tensor) and tensor.device.type == "cuda":
                # made on the copy stream, used on the consumer's: the allocator must not reuse the
                # memory before the consumer's work on it is done
                tensor.record_stream(consumer)


def transfer_for(
    device: torch.device, pin_memory: bool | None, non_blocking: bool, dtype: torch.dtype | None = None
) -> Transfer:
    """The transfer for ``device``; ``pin_memory=None`` means pinned staging on CUDA only."""
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise TypeError(
            f"to_device: dtype must be a floating-point torch dtype (torch.float32, ...) or None, got {dtype!r}"
        )
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError(f"to_device: device {device} asked for, but CUDA is not available to torch")
        return CudaTransfer(device, non_blocking, pin_memory is not False, dtype)
    if pin_memory:
        raise ValueError(f"to_device: pin_memory=True needs a CUDA device, got {device}")
    return Transfer(device, non_blocking, dtype)
