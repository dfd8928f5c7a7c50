"""Measurement data: the synthetic sparse rows both sparse-iterator contenders read.

Importable as ``bench.peers.sparse_data`` and, when a peer runs as a script, as a sibling
module: the fastload contender and the MXNet peer then build byte-identical inputs.
"""

from __future__ import annotations

import numpy as np

__all__ = ["synthetic_csr"]


def synthetic_csr(rows: int, features: int, density: float, rng: np.random.Generator) -> tuple[object, np.ndarray]:
    """``rows`` CSR rows with ``features * density`` sorted random columns each, and 0/1 labels.

    Args:
        rows: Number of rows.
        features: Number of columns.
        density: Fraction of non-zeros per row (at least one).
        rng: The generator; its state advances, so later draws (a weight matrix) stay reproducible.

    Returns:
        ``(scipy.sparse.csr_matrix float32, labels float32 [rows])``.
    """
    import scipy.sparse as sp

    nnz_row = max(1, round(features * density))
    indptr = np.arange(rows + 1, dtype=np.int64) * nnz_row
    indices = np.sort(rng.integers(0, features, (rows, nnz_row)), axis=1).ravel()
    x = sp.csr_matrix((rng.random(rows * nnz_row, dtype=np.float32), indices, indptr), shape=(rows, features))
    x.sum_duplicates()
    y = rng.integers(0, 2, rows).astype(np.float32)
    return x, y
