"""GP marginal likelihood (evidence) of the last-layer model and its maximisation."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class SpectralEvidence:
    """Sufficient statistics of a GP marginal likelihood in the eigenbasis of its Gram.

    For ``m`` outputs that share a kernel ``k = K0 / delta`` over ``n`` points, with
    ``K0 = U diag(lambda) U^T``, the log evidence depends on the targets only through
    ``t_j = sum_c (u_j^T y_c)^2`` and the residual ``R = ||Y||^2 - sum_j t_j`` outside the
    span of the positive eigenvalues. The nonzero eigenvalues of ``Phi Phi^T`` and
    ``Phi^T Phi`` coincide, so either Gram can build it (:meth:`from_gram`,
    :meth:`from_kernel`).

    Attributes
    ----------
    eigenvalues : np.ndarray
        ``(r,)`` positive eigenvalues of the unscaled Gram.
    projections : np.ndarray
        ``(r,)`` ``t_j``.
    residual : float
        ``R >= 0``.
    num_points : int
        ``n``, observations per output.
    num_outputs : int
        ``m``, independent outputs sharing the kernel.
    """

    eigenvalues: np.ndarray
    projections: np.ndarray
    residual: float
    num_points: int
    num_outputs: int

    @classmethod
    def from_gram(cls, gram: np.ndarray, cross: np.ndarray, target_sq: float,
                  num_points: int, num_outputs: int) -> SpectralEvidence:
        """Build from the primal Gram ``G = Phi^T Phi`` (P x P) and ``Phi^T Y`` (P x C).

        Uses ``u_j^T y_c = v_j^T Phi^T y_c / sqrt(lambda_j)`` for the eigenpairs
        ``(lambda_j, v_j)`` of ``G``. ``num_outputs`` may be smaller than the columns of
        ``Y`` when the targets span fewer dimensions (centred targets: ``C - 1``).
        """
        lam, vec = _eigh(gram)
        keep = lam > _eigen_tolerance(lam, gram.shape[0])
        lam = lam[keep]
        proj = vec[:, keep].T @ cross
        t = (proj * proj).sum(axis=1) / lam
        residual = max(float(target_sq) - float(t.sum()), 0.0)
        return cls(lam, t, residual, int(num_points), int(num_outputs))

    @classmethod
    def from_kernel(cls, kernel: np.ndarray, targets: np.ndarray,
                    num_outputs: int | None = None) -> SpectralEvidence:
        """Build from the dual Gram ``K0`` (n x n) and the targets ``Y`` (n x m)."""
        lam, vec = _eigh(kernel)
        keep = lam > _eigen_tolerance(lam, kernel.shape[0])
        proj = vec[:, keep].T @ targets
        t = (proj * proj).sum(axis=1)
        residual = max(float((targets * targets).sum()) - float(t.sum()), 0.0)
        outputs = targets.shape[1] if num_outputs is None else num_outputs
        return cls(lam[keep], t, residual, int(kernel.shape[0]), int(outputs))


def _eigh(matrix: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    # torch's LAPACK (MKL) rather than numpy's: several times faster on small matrices and
    # far less sensitive to a CPU shared with other processes.
    import torch  # here: fitting needs it, a query of a loaded GP does not

    lam, vec = torch.linalg.eigh(torch.from_numpy(np.ascontiguousarray(matrix, np.float64)))
    return lam.numpy(), vec.numpy()


def _eigen_tolerance(eigenvalues: np.ndarray, size: int) -> float:
    # Eigenvalues of a PSD Gram are computed with absolute error ~ size * eps * lambda_max;
    # anything below is numerically zero and belongs to the null space.
    top = float(eigenvalues[-1]) if eigenvalues.size else 0.0
    return max(top, 0.0) * size * np.finfo(np.float64).eps * 10.0


def log_marginal_likelihood(blocks: Sequence[SpectralEvidence], sigma2: float,
                            delta: float) -> float:
    """Closed-form GP log evidence summed over independent blocks.

    Per block, with ``d_j = lambda_j / delta + sigma^2``,

        log p = -1/2 [ sum_j (t_j / d_j + m log d_j) + R / sigma^2
                      + m (n - r) log sigma^2 + m n log(2 pi) ].
    """
    total = 0.0
    for b in blocks:
        d = b.eigenvalues / delta + sigma2
        rest = b.num_points - b.eigenvalues.size
        total -= 0.5 * (float((b.projections / d).sum())
                        + b.num_outputs * float(np.log(d).sum())
                        + b.residual / sigma2
                        + b.num_outputs * rest * math.log(sigma2)
                        + b.num_outputs * b.num_points * math.log(2.0 * math.pi))
    return total


def fit_marginal_likelihood(blocks: Sequence[SpectralEvidence],
                            init: tuple[float, float] | None = None) -> tuple[float, float]:
    """Maximise :func:`log_marginal_likelihood` over ``(sigma^2, delta)``.

    The single-group case of :func:`fit_shared_noise`.

    Returns
    -------
    tuple[float, float]
        ``(sigma2, delta)``.
    """
    sigma2, deltas = fit_shared_noise([blocks], init)
    return sigma2, float(deltas[0])


def fit_shared_noise(groups: Sequence[Sequence[SpectralEvidence]],
                     init: tuple[float, float] | None = None,
                     max_iterations: int = 5000) -> tuple[float, np.ndarray]:
    """Maximise ``sum_g log p(Y_g | sigma^2, delta_g)``: one noise, one precision per group.

    MacKay's fixed point (Bishop, PRML section 3.5.2) in the eigenbasis: per group, with
    ``gamma_g = sum m lambda_j / (lambda_j + delta_g sigma^2)`` (effective number of
    parameters), ``||mu_g||^2 = sum lambda_j t_j / (delta_g d_j)^2`` (squared posterior
    mean of the weights) and ``E_g = R + sum t_j (sigma^2 / d_j)^2`` (squared residual),

        delta_g <- gamma_g / ||mu_g||^2,
        sigma^2 <- sum_g E_g / sum_g (sum m n - gamma_g),

    which are the stationarity conditions of the summed evidence. Values are kept inside a
    wide box around the data's natural scales, so degenerate data (perfect fit, no signal)
    ends at a finite corner instead of 0 or infinity.

    Returns
    -------
    tuple[float, np.ndarray]
        ``(sigma2, deltas)`` with one ``delta`` per group.
    """
    groups = [[b for b in g if b.num_points > 0] for g in groups]
    every = [b for g in groups for b in g]
    if not every or any(not g for g in groups):
        raise ValueError('marginal likelihood needs at least one observation per group')
    count = sum(b.num_outputs * b.num_points for b in every)
    target_scale = sum(float(b.projections.sum()) + b.residual for b in every) / count
    target_scale = target_scale if target_scale > 0 else 1.0
    gram_scale = sum(float(b.eigenvalues.sum()) * b.num_outputs for b in every) / count
    gram_scale = gram_scale if gram_scale > 0 else 1.0
    s2_lo, s2_hi = target_scale * 1e-12, target_scale * 1e6
    d_nat = gram_scale / target_scale
    d_lo, d_hi = d_nat * 1e-10, d_nat * 1e10
    sigma2, delta0 = init if init is not None else (target_scale, d_nat)
    sigma2 = min(max(sigma2, s2_lo), s2_hi)
    deltas = np.full(len(groups), min(max(delta0, d_lo), d_hi))
    for _ in range(max_iterations):
        resid = dof = 0.0
        new_deltas = np.empty_like(deltas)
        for i, group in enumerate(groups):
            delta = deltas[i]
            gamma = weight_sq = 0.0
            for b in group:
                lam, t = b.eigenvalues, b.projections
                d = lam / delta + sigma2
                g = b.num_outputs * float((lam / (lam + delta * sigma2)).sum())
                gamma += g
                dof += b.num_outputs * b.num_points - g
                weight_sq += float((lam * t / (delta * d) ** 2).sum())
                resid += b.residual + float((t * (sigma2 / d) ** 2).sum())
            new_deltas[i] = gamma / weight_sq if weight_sq > 0 else d_hi
        new_sigma2 = min(max(resid / max(dof, 1e-300), s2_lo), s2_hi)
        new_deltas = np.clip(new_deltas, d_lo, d_hi)
        step = max(abs(math.log(new_sigma2 / sigma2)),
                   float(np.abs(np.log(new_deltas / deltas)).max()))
        sigma2, deltas = new_sigma2, new_deltas
        if step < 1e-11:
            break
    return sigma2, deltas


def fit_expert_hyperparameters(experts: Sequence[SpectralEvidence], pooled: SpectralEvidence,
                               points: Sequence[int], labels_seen: Sequence[int],
                               min_points: int | Sequence[int], shared_noise: bool
                               ) -> tuple[np.ndarray, np.ndarray, tuple[float, float]]:
    """Per-expert ``(sigma_m^2, delta_m)`` by marginal likelihood; see :class:`NTKGPConfig`.

    ``pooled`` (all experts' data as one GP) gives the fallback values. ``min_points`` is
    one count for every expert or one per expert. With
    ``shared_noise`` the experts with at least ``min_points`` of their ``points`` share
    one ``sigma^2``
    and each has its own ``delta_m`` (:func:`fit_shared_noise`); otherwise each such expert
    that has seen at least two labels maximises its own evidence over both. The others
    keep the pooled values (the shared ``sigma^2`` when there is one).

    Returns
    -------
    tuple
        ``(sigma2 (M,), delta (M,), pooled (sigma2, delta))``.
    """
    least = [min_points] * len(experts) if isinstance(min_points, int) else list(min_points)
    base = fit_marginal_likelihood([pooled])
    sigma2 = np.full(len(experts), base[0])
    delta = np.full(len(experts), base[1])
    if shared_noise:
        chosen = [e for e in range(len(experts)) if points[e] >= least[e]]
        if chosen:
            shared, deltas = fit_shared_noise([[experts[e]] for e in chosen], init=base)
            sigma2[:] = shared
            delta[chosen] = deltas
        return sigma2, delta, base
    for e, block in enumerate(experts):
        if points[e] >= least[e] and labels_seen[e] >= 2:
            sigma2[e], delta[e] = fit_marginal_likelihood([block], init=base)
    return sigma2, delta, base


# --------------------------------------------------------------------------- linear algebra


def golden_section_minimum(func: Any, lo: float, hi: float, iterations: int = 40) -> float:
    """Minimiser of a unimodal ``func`` on ``[lo, hi]`` by golden-section search."""
    ratio = (math.sqrt(5.0) - 1.0) / 2.0
    a, b = lo, hi
    x1, x2 = b - ratio * (b - a), a + ratio * (b - a)
    f1, f2 = func(x1), func(x2)
    for _ in range(iterations):
        if f1 <= f2:
            b, x2, f2 = x2, x1, f1
            x1 = b - ratio * (b - a)
            f1 = func(x1)
        else:
            a, x1, f1 = x1, x2, f2
            x2 = a + ratio * (b - a)
            f2 = func(x2)
    return 0.5 * (a + b)
