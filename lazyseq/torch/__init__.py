"""PyTorch integration (``pip install lazyseq[torch]``): datasets, tensors without copies, batches fed to a device.

``import lazyseq`` never imports torch; ``import lazyseq.torch`` does.

- :func:`as_dataset` / :func:`from_dataset`: a view as a map-style torch
  ``Dataset`` whose batches are read in one vectorized call (with
  :func:`collate` as the ``DataLoader``'s ``collate_fn``), and a torch
  ``Dataset`` as a view.
- :func:`to_tensors`: numpy batches as tensors sharing their memory.
- :func:`to_device`: batches sent to a device ahead of time (pinned slots and a
  copy stream on CUDA).
- :func:`predict`: a model over a view in batches, with :func:`lazyseq.evaluate`.

>>> import numpy as np
>>> import lazyseq
>>> from lazyseq.torch import to_device
>>> samples = lazyseq.collate([np.arange(12.0).reshape(6, 2), np.arange(6) % 2])
>>> for x, y in to_device(samples.shuffle(seed=0).batch(3), "cpu"):
...     print(tuple(x.shape), x.dtype, y.dtype)
(3, 2) torch.float64 torch.int64
(3, 2) torch.float64 torch.int64
"""

from .dataset import LazyBatch, ViewDataset, as_dataset, collate, from_dataset
from .device import DeviceFeeder, to_device
from .predict import predict
from .tensors import to_tensors

__all__ = [
    "DeviceFeeder",
    "LazyBatch",
    "ViewDataset",
    "as_dataset",
    "collate",
    "from_dataset",
    "predict",
    "to_device",
    "to_tensors",
]
