"""Guarded linear algebra and input checks of the NTK-GP engine."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from uq_perception.ntk.config import MAX_CONDITION, MAX_FEATURE_MAGNITUDE

logger = logging.getLogger(__name__)


def spd_cholesky(matrix: np.ndarray, what: str, max_condition: float = MAX_CONDITION
                 ) -> np.ndarray:
    """Lower Cholesky factor ``L`` (``L L^T = matrix``) of a symmetric positive
    (semi)definite matrix.

    The condition number is estimated from the pivots, ``(max L_ii / min L_ii)^2`` (a lower
    bound of the true one). If the factorisation fails or the estimate exceeds
    ``max_condition``, a jitter ``epsilon I`` (starting at ``mean(diag) / max_condition``,
    growing tenfold) is added and a warning is logged: the result then factors a slightly
    more regularised matrix, which keeps every variance finite.

    Raises
    ------
    ValueError
        If the matrix has non-finite entries or stays indefinite under the largest jitter.
    """
    sym = 0.5 * (matrix + matrix.T)
    if not np.all(np.isfinite(sym)):
        raise ValueError(f'{what} has non-finite entries')
    size = sym.shape[0]
    scale = float(np.mean(np.abs(np.diag(sym)))) or 1.0
    eye = np.eye(size)
    jitter = 0.0
    for _ in range(16):
        try:
            factor = np.linalg.cholesky(sym + jitter * eye if jitter else sym)
        except np.linalg.LinAlgError:
            factor = None
        if factor is not None:
            pivots = np.diagonal(factor)
            condition = float((pivots.max() / pivots.min()) ** 2)
            if condition <= max_condition:
                break
        jitter = scale / max_condition if jitter == 0.0 else jitter * 10.0
    else:
        raise ValueError(f'{what} is not positive definite even with jitter {jitter:.3g}')
    if jitter > 0.0:
        logger.warning('%s is near-singular; added jitter %.3g (relative %.1e) to keep the '
                       'GP variances finite', what, jitter, jitter / scale)
    return factor


def spd_inverse(matrix: np.ndarray, what: str, max_condition: float = MAX_CONDITION
                ) -> np.ndarray:
    """Inverse ``L^{-T} L^{-1}`` of a symmetric positive (semi)definite matrix through its
    Cholesky factor (:func:`spd_cholesky`, with its conditioning guard)."""
    inverse_factor = np.linalg.inv(spd_cholesky(matrix, what, max_condition))
    inverse = inverse_factor.T @ inverse_factor
    return 0.5 * (inverse + inverse.T)


def check_matrix(array: Any, name: str, columns: int | None = None) -> np.ndarray:
    x = np.asarray(array)
    if x.dtype == object or not (np.issubdtype(x.dtype, np.floating)
                                 or np.issubdtype(x.dtype, np.integer)):
        raise ValueError(f'{name} must be a numeric array, got dtype {x.dtype}')
    if x.ndim != 2:
        raise ValueError(f'{name} must be 2-D (rows, {columns or "columns"}), '
                         f'got shape {x.shape}')
    if columns is not None and x.shape[1] != columns:
        raise ValueError(f'{name} must have {columns} columns, got shape {x.shape}')
    if not np.isfinite(x).all():
        bad = np.flatnonzero(~np.isfinite(x).all(axis=1))
        raise ValueError(f'{name} contain non-finite values (NaN or Inf) in rows '
                         f'{bad[:10].tolist()}{"..." if bad.size > 10 else ""}')
    # Quadratic forms of the GP square the features: beyond this magnitude they overflow
    # float64 and the variance would be infinite, so such inputs are rejected up front.
    if x.size and float(np.abs(x).max()) > MAX_FEATURE_MAGNITUDE:
        raise ValueError(f'{name} contain values of magnitude above '
                         f'{MAX_FEATURE_MAGNITUDE:g}; the GP variance would overflow')
    return x
