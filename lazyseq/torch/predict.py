"""A torch model over a view, in batches: ``predict``, built on :func:`lazyseq.evaluate` and :func:`to_device`."""

from __future__ import annotations

import inspect
import re
from collections import deque
from collections.abc import Mapping
from typing import Any

import torch

from ..evaluate import evaluate
from ..loading.options import Method
from ..nested import flatten
from ..views.itemtypes import SequenceLike
from .device import as_device, to_device

__all__ = ["predict"]


class _Handed:
    """An iterator over the batches put into it, one at a time: the source of a feeder driven from outside."""

    def __init__(self) -> None:
        self.waiting: deque = deque()

    def __iter__(self) -> _Handed:
        return self

    def __next__(self) -> Any:
        if not self.waiting:
            raise StopIteration
        return self.waiting.popleft()


def predict(
    model: torch.nn.Module,
    data: SequenceLike[Any],
    batch_size: int = 64,
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = None,
    nworkers: int = 0,
    method: Method = "thread",
    out: Any = None,
    progress: bool | None = None,
) -> Any:
    """``model`` applied to ``data`` in batches, in eval mode and without gradients; numpy results.

    Each batch of ``data`` is moved to ``device`` (see :func:`to_device`;
    ``dtype=torch.float32`` converts float64 data for a float32 model) and
    given to the model: an array as its one argument, a tuple or list
    as positional arguments, a dict as keyword arguments; so pass the
    model's inputs, not ``(inputs, labels)`` pairs. What the model returns
    (a tensor, or a tuple or dict of them, one row per item) is gathered by
    :func:`lazyseq.evaluate`, which also takes ``nworkers``, ``method``,
    ``out`` and ``progress``. The training flag of the model and of each of its modules is restored after.

    >>> import numpy as np
    >>> import torch
    >>> from lazyseq.torch import predict
    >>> layer = torch.nn.Linear(2, 1, dtype=torch.float64)
    >>> with torch.no_grad():
    ...     _ = layer.weight.fill_(1.0), layer.bias.fill_(0.5)
    >>> predict(layer, np.arange(10.0).reshape(5, 2), batch_size=2)
    array([[ 1.5],
           [ 5.5],
           [ 9.5],
           [13.5],
           [17.5]])
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(
            f"predict: model must be a torch.nn.Module, not {type(model).__name__}: lazyseq.evaluate(fn, data) "
            "applies any function to batches"
        )
    device = as_device(device, "predict")
    handed = _Handed()
    feeder = to_device(handed, device, ahead=0, dtype=dtype)

    def run(batch: Any) -> Any:
        handed.waiting.append(batch)
        inputs = next(feeder)
        try:
            return call(inputs)
        except (RuntimeError, ValueError) as error:  # (an RNN raises ValueError)
            hint = None if dtype is not None else _dtype_hint(model, inputs, str(error))
            if hint:
                error.add_note(hint)
            raise

    def call(inputs: Any) -> Any:
        if isinstance(inputs, Mapping):
            return model(**inputs)
        if isinstance(inputs, (tuple, list)):
            try:
                return model(*inputs)
            except TypeError as error:
                if not _takes(model, len(inputs)):  # (not a TypeError of its own code)
                    error.add_note(
                        f"predict gives the model the {len(inputs)} fields of a batch of tuples as "
                        f"{len(inputs)} arguments; for (inputs, labels) items, predict on the inputs alone"
                    )
                raise
        return model(inputs)

    was_training = model.training
    modes = [(module, module.training) for module in model.modules()]  # a frozen part may be in eval mode already
    model.eval()
    try:
        with torch.no_grad():
            return evaluate(
                run,
                data,
                batch_size,
                out=out,
                nworkers=nworkers,
                method=method,
                progress=progress,
                description="predict",
            )
    finally:
        feeder.close()
        model.train(was_training)  # through train(): what a model's own train() keeps in step with the mode too
        for module, training in modes:  # parents before children: a part that was in another mode gets it back
            if module.training != training:
                module.train(training)


# torch's words for tensors of two dtypes: "must have the same dtype", "expected scalar type Float but found
# Double", "Input type (double) and bias type (float) should be the same"
_ABOUT_DTYPES = re.compile(r"dtype|scalar type|\btype \(")


def _dtype_hint(model: torch.nn.Module, inputs: Any, message: str) -> str | None:
    """What to do where ``message`` (torch's) is about dtypes, and the model's floating-point parameters and the
    data's tensors differ in theirs; else None."""
    parameter = next((p for p in model.parameters() if p.is_floating_point()), None)
    leaves: list = []
    flatten(inputs, leaves, is_leaf=lambda x: isinstance(x, torch.Tensor) and x.is_floating_point())
    data = leaves[0] if leaves else None
    if parameter is None or data is None or parameter.dtype == data.dtype:
        return None
    if not _ABOUT_DTYPES.search(message) or "indices" in message:  # another error: out of memory, the model's
        return None  # own, or floats where indices go (an Embedding's): dtype= would not help
    return (
        f"predict: the data are {data.dtype} and the model's parameters {parameter.dtype}: "
        f"dtype={parameter.dtype} converts the data on the way"
    )


def _takes(model: torch.nn.Module, count: int) -> bool:
    """Whether ``model`` takes ``count`` positional arguments (True where its signature cannot tell)."""
    try:
        inspect.signature(model.forward).bind(*range(count))
    except TypeError:
        return False
    except ValueError:  # no signature to read
        return True
    return True
