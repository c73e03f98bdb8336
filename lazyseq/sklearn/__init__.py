"""scikit-learn on lazy views: incremental training, chunked prediction and scoring (``lazyseq[sklearn]``).

``fit`` calls ``partial_fit`` batch after batch, from a view, a sequence or a
loader; ``predict`` and ``score`` run an estimator over data far larger than
memory, one chunk at a time, with :func:`lazyseq.evaluate`. scikit-learn is
imported only when one of them needs it, and ``import lazyseq`` does not
import this package.
"""

from .fitting import fit
from .scoring import predict, score

__all__ = ["fit", "predict", "score"]
