"""Variance of box-regression outputs from the NTK-GP's shared kernel term (ROS-free).

A box head ``r = V psi(x) + c`` (per coordinate ``j``) linearised in its last layer is a GP
whose kernel is the head's NTK, exactly as for the class head (``uq_perception.ntk.model``).
If the box coordinates share the class GP's kernel up to an output scale ``s_j`` (one
amplitude per output, the usual multi-output GP with a separable kernel), the predictive
variance of coordinate ``j`` at a detection is

    var_j(x) = a_j + s_j * v(x),       v(x) = k** - k*^T (K + sigma^2 I)^{-1} k*,

the same scalar ``v`` the class uncertainty publishes (``gp_variance``: no extra query),
plus the coordinate's observation noise ``a_j`` (the box head's error where data is dense:
annotation and rendering jitter, occlusion). ``a_j`` and ``s_j`` are fitted by maximum
likelihood on validation residuals of the head's own outputs, so each normalised residual
``r_j / sqrt(var_j)`` has unit mean square on the validation set.

The maximum likelihood over ``(a_j, s_j) >= 0`` is a one-dimensional search: with
``var = tau * ((1 - rho) + rho * v / mean(v))`` the best ``tau`` for a given mixing
``rho`` in ``[0, 1]`` is ``mean(r^2 / g_rho)`` in closed form, and ``rho`` is chosen on a
fixed grid (deterministic, no optimiser tolerance to tune) that is logarithmic in the noise
share ``1 - rho``, so a small noise is resolved as finely as a large one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

# Mixing values of the one-dimensional likelihood search (module docstring): noise shares
# 1 - rho from 1e-6 to 1 in steps of 2.5 %, and no noise at all.
_MIXING_GRID = np.concatenate([[0.0], 1.0 - np.logspace(-6.0, 0.0, 561)[::-1][1:], [1.0]])


@dataclass(frozen=True)
class BoxCalibration:
    """Per-coordinate noise ``a_j`` and GP-variance scale ``s_j`` of a box head's outputs.

    Attributes
    ----------
    coordinates : tuple[str, ...]
        Names of the head's outputs, in order (the box parametrisation they are in).
    noise : tuple[float, ...]
        ``a_j >= 0``, variance in head units that does not depend on the input.
    scale : tuple[float, ...]
        ``s_j >= 0``, head-unit variance per unit of GP variance.
    samples : int
        Number of validation residuals the values were fitted on.
    """

    coordinates: tuple[str, ...]
    noise: tuple[float, ...]
    scale: tuple[float, ...]
    samples: int

    def __post_init__(self) -> None:
        n = len(self.coordinates)
        if n < 1 or len(self.noise) != n or len(self.scale) != n:
            raise ValueError(f'box calibration needs one noise and one scale per coordinate '
                             f'{self.coordinates!r}, got {len(self.noise)} and '
                             f'{len(self.scale)}')
        for name in ('noise', 'scale'):
            values = getattr(self, name)
            if not all(math.isfinite(v) and v >= 0 for v in values):
                raise ValueError(f'box calibration {name} must be finite and >= 0, got {values}')
        if not all(a + s > 0 for a, s in zip(self.noise, self.scale, strict=True)):
            raise ValueError(f'box calibration has a coordinate with zero noise and zero '
                             f'scale: noise {self.noise}, scale {self.scale}')

    def head_variance(self, gp_variance: np.ndarray) -> np.ndarray:
        """``(B, J)`` variance of the head's outputs at ``(B,)`` GP variances ``v``.

        Negative ``v`` (round-off of a near-zero variance) counts as 0; a non-finite one is
        an error, so the result is always finite and positive.
        """
        v = np.asarray(gp_variance, dtype=np.float64)
        if v.ndim != 1 or not np.isfinite(v).all():
            raise ValueError(f'gp_variance must be a finite 1-D array, got shape {v.shape}')
        v = np.maximum(v, 0.0)
        return np.asarray(self.noise)[None, :] + np.outer(v, np.asarray(self.scale))

    def to_meta(self) -> dict[str, Any]:
        """A JSON-serialisable dict (the GP state file's metadata holds it)."""
        return {'coordinates': list(self.coordinates), 'noise': list(self.noise),
                'scale': list(self.scale), 'samples': self.samples}

    @classmethod
    def from_meta(cls, meta: dict[str, Any]) -> BoxCalibration:
        """Inverse of :meth:`to_meta`; raises ``ValueError`` naming what is wrong."""
        try:
            return cls(tuple(str(c) for c in meta['coordinates']),
                       tuple(float(v) for v in meta['noise']),
                       tuple(float(v) for v in meta['scale']), int(meta['samples']))
        except (KeyError, TypeError) as exc:
            raise ValueError(f'box calibration is malformed ({exc!r})') from exc


def fit_box_calibration(residuals: np.ndarray, gp_variance: np.ndarray,
                        coordinates: Sequence[str]) -> BoxCalibration:
    """Maximum-likelihood ``(a_j, s_j)`` of ``residuals ~ N(0, a_j + s_j v)`` per coordinate.

    Parameters
    ----------
    residuals : np.ndarray
        ``(N, J)`` truth minus prediction of the head's outputs on validation data.
    gp_variance : np.ndarray
        ``(N,)`` GP variance ``v`` of the same detections.
    coordinates : Sequence[str]
        ``J`` names of the outputs.

    Raises
    ------
    ValueError
        Shapes disagree, values are not finite, fewer than 2 residuals, or a coordinate's
        residuals are all zero (nothing to calibrate on).
    """
    r = np.asarray(residuals, dtype=np.float64)
    v = np.maximum(np.asarray(gp_variance, dtype=np.float64), 0.0)
    names = tuple(str(c) for c in coordinates)
    if r.ndim != 2 or r.shape[1] != len(names) or v.shape != (r.shape[0],):
        raise ValueError(f'residuals must be (N, {len(names)}) and gp_variance (N,), got '
                         f'{r.shape} and {v.shape}')
    if r.shape[0] < 2:
        raise ValueError(f'need at least 2 validation residuals, got {r.shape[0]}')
    if not (np.isfinite(r).all() and np.isfinite(v).all()):
        raise ValueError('residuals and gp_variance must be finite')
    mean_v = float(v.mean())
    # Without spread in v the scale is not identifiable: all of it is noise.
    mixing = _MIXING_GRID if mean_v > 0 and float(v.std()) > 0 else _MIXING_GRID[:1]
    relative = v / mean_v if mean_v > 0 else np.zeros_like(v)
    if relative.min() == 0.0:
        # A zero-variance point would get zero total variance at rho = 1.
        mixing = mixing[mixing < 1.0]
    shape = (1.0 - mixing)[:, None] + mixing[:, None] * relative[None, :]  # (G, N)
    noise, scale = [], []
    for j, name in enumerate(names):
        squared = r[:, j] ** 2
        if not squared.any():
            raise ValueError(f'the {name} residuals are all zero: nothing to calibrate on')
        tau = (squared[None, :] / shape).mean(axis=1)
        # Negative log likelihood up to constants: sum log(tau g) + N (r^2 / (tau g) = N).
        nll = np.log(tau) + np.log(shape).mean(axis=1)
        best = int(np.argmin(nll))
        noise.append(float(tau[best] * (1.0 - mixing[best])))
        scale.append(float(tau[best] * mixing[best] / mean_v) if mean_v > 0 else 0.0)
    return BoxCalibration(names, tuple(noise), tuple(scale), int(r.shape[0]))
