"""lazyseq: lazy random-access views and background loading for machine-learning data pipelines.

>>> import numpy as np
>>> import lazyseq
>>> x = lazyseq.view(np.arange(12.0).reshape(6, 2))
>>> batches = x.smap(lambda row: row * 10).shuffle(seed=0).batch(4)
>>> len(batches), batches[0].shape
(2, (4, 2))
"""

from .evaluate import evaluate
from .io.npy import open_npy
from .io.shards import write_npy
from .loading.buffers import load_buffers
from .loading.failures import LoaderClosed, LoaderError, NoSharedMemory, RemoteError, WorkerDied
from .loading.prefetch import prefetch
from .loading.serializable import SerializableFunc
from .rng import rng
from .serving.client import connect
from .serving.connection import ConnectionClosed
from .serving.failures import ServerLost
from .serving.server import serve
from .views.arange import arange
from .views.base import View
from .views.batching import batch, unbatch
from .views.cache import add_cache
from .views.chunks import default_collate
from .views.collate import collate
from .views.concatenate import concatenate
from .views.errors import EvaluationError, seterr
from .views.gather import gather, take
from .views.instrument import debug, monitor_throughput
from .views.interleave import interleave
from .views.mapping import smap, starmap
from .views.repetition import cycle, repeat
from .views.selection import case, switch
from .views.shard import shard
from .views.shuffle import shuffle
from .views.sources import view
from .views.split import split
from .views.uniter import uniter

__version__ = "0.1.0"

__all__ = [
    "ConnectionClosed",
    "EvaluationError",
    "LoaderClosed",
    "LoaderError",
    "NoSharedMemory",
    "RemoteError",
    "SerializableFunc",
    "ServerLost",
    "View",
    "WorkerDied",
    "add_cache",
    "arange",
    "batch",
    "case",
    "collate",
    "concatenate",
    "connect",
    "cycle",
    "debug",
    "default_collate",
    "evaluate",
    "gather",
    "interleave",
    "load_buffers",
    "monitor_throughput",
    "open_npy",
    "prefetch",
    "repeat",
    "rng",
    "serve",
    "seterr",
    "shard",
    "shuffle",
    "smap",
    "split",
    "starmap",
    "switch",
    "take",
    "unbatch",
    "uniter",
    "view",
    "write_npy",
]
