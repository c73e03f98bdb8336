"""SciPy's sparse matrices and arrays, told apart without importing SciPy.

Views hold rows that numpy reads, and :func:`~lazyseq.evaluate` gathers
dense arrays: a sparse matrix given or returned where rows are expected is
refused with a message that says what to do instead.
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["is_sparse", "stack_rows"]


def is_sparse(value: Any) -> bool:
    """Whether ``value`` is a SciPy sparse matrix or array (only where SciPy was imported: none exists before).

    >>> import numpy as np
    >>> is_sparse(np.eye(2))
    False
    >>> import scipy.sparse
    >>> is_sparse(scipy.sparse.csr_matrix(np.eye(2)))
    True
    """
    sparse = sys.modules.get("scipy.sparse")
    return sparse is not None and bool(sparse.issparse(value))


def stack_rows(parts: list) -> Any:
    """Sparse matrices (or arrays) of as many columns stacked into one, in the first one's format.

    >>> import numpy as np, scipy.sparse
    >>> stacked = stack_rows([scipy.sparse.csr_array(np.eye(2)), scipy.sparse.csr_array(np.ones((1, 2)))])
    >>> stacked.format, stacked.toarray().tolist()
    ('csr', [[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    """
    return sys.modules["scipy.sparse"].vstack(parts, format=parts[0].format)  # imported: the parts are its own
