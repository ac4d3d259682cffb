"""The conditioning guard of the NTK-GP's Cholesky factorisation.

The matrices here factor without error, so the jitter must come from the condition-number
estimate, not from a failed factorisation.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from uq_perception.ntk.linalg import spd_cholesky, spd_inverse

MAX_CONDITION = 1e12


def _pivot_condition(factor: np.ndarray) -> float:
    pivots = np.diag(factor)
    return float((pivots.max() / pivots.min()) ** 2)


@pytest.fixture
def ill_conditioned() -> np.ndarray:
    # Positive definite, condition number 1e14: Cholesky succeeds, pivots 1 and 1e-7.
    matrix = np.diag([1.0, 1e-14])
    factor, info = torch.linalg.cholesky_ex(torch.from_numpy(matrix))
    assert int(info) == 0 and _pivot_condition(factor.numpy()) == pytest.approx(1e14)
    return matrix


def test_a_factorable_but_ill_conditioned_matrix_gets_jitter(ill_conditioned, caplog):
    with caplog.at_level(logging.WARNING, logger='uq_perception.ntk'):
        factor = spd_cholesky(ill_conditioned, 'test matrix', MAX_CONDITION)
    assert 'test matrix is near-singular; added jitter' in caplog.text
    assert _pivot_condition(factor) <= MAX_CONDITION
    # What was factored is the matrix plus a small jitter on the diagonal, nothing else.
    added = factor @ factor.T - ill_conditioned
    jitter = added[0, 0]
    assert 0.0 < jitter <= 1e-10
    np.testing.assert_allclose(added, jitter * np.eye(2), rtol=1e-6, atol=1e-20)
    assert np.linalg.cond(factor @ factor.T) <= MAX_CONDITION


def test_the_inverse_of_an_ill_conditioned_matrix_stays_bounded(ill_conditioned):
    inverse = spd_inverse(ill_conditioned, 'test matrix', MAX_CONDITION)
    # Without the guard the second diagonal entry would be 1e14.
    assert np.isfinite(inverse).all() and inverse[1, 1] <= MAX_CONDITION


def test_a_well_conditioned_matrix_is_factored_exactly(caplog):
    rng = np.random.default_rng(0)
    a = rng.normal(size=(6, 6))
    matrix = a @ a.T + 6.0 * np.eye(6)
    with caplog.at_level(logging.WARNING, logger='uq_perception.ntk'):
        factor = spd_cholesky(matrix, 'test matrix', MAX_CONDITION)
    assert caplog.text == ''
    np.testing.assert_allclose(factor @ factor.T, matrix, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(factor, np.tril(factor))
