"""Norm-aware feature maps for the NTK-GP kernel (ROS-free).

The last-layer kernel ``(phi^T phi' + 1) / delta`` makes the predictive variance grow with
the feature norm. Trained classifiers often map unfamiliar inputs to *small* embeddings,
where that variance is small too: on MNIST, FashionMNIST / KMNIST / notMNIST images had
feature norms of 10-18 against 29 for digits (docs/benchmarks.md). The family here rescales
each feature by a power of its norm,

    phi' = s * phi / ||phi||^alpha / r,      r = mean over training ||phi||^(1 - alpha),

so ``alpha = 0`` is the raw kernel (rescaled), ``alpha = 1`` the cosine kernel and ``alpha >
1`` gives small-norm inputs large features; ``s`` is the typical norm of ``phi'`` on the
training data, i.e. its scale against the bias feature 1 the engine appends. ``alpha`` and
``s`` are kernel hyperparameters: :func:`select_feature_map` chooses them, together with the
number of experts, by the GP's log marginal likelihood on the training features only.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from uq_perception.ntk.linalg import check_matrix

# Norms below this count as this: the map must stay finite at the origin.
_MIN_NORM = 1e-12


@dataclass(frozen=True)
class NormFeatureMap:
    """``phi -> s * phi / ||phi||^alpha / reference`` (see the module docstring)."""

    alpha: float = 0.0
    scale: float = 1.0
    reference: float = 1.0

    def __post_init__(self) -> None:
        for name in ('alpha', 'scale', 'reference'):
            value = getattr(self, name)
            if not math.isfinite(value):
                raise ValueError(f'{name} must be finite, got {value}')
        if self.scale <= 0 or self.reference <= 0:
            raise ValueError(f'scale and reference must be > 0, got {self.scale}, '
                             f'{self.reference}')

    @classmethod
    def fitted(cls, train_features: np.ndarray, alpha: float, scale: float) -> NormFeatureMap:
        """The map with its reference norm taken from ``train_features``."""
        x = check_matrix(train_features, 'train_features').astype(np.float64)
        norms = np.maximum(np.linalg.norm(x, axis=1), _MIN_NORM)
        return cls(alpha, scale, float(np.mean(norms ** (1.0 - alpha))))

    def __call__(self, features: np.ndarray) -> np.ndarray:
        x = np.asarray(features, dtype=np.float64)
        norms = np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), _MIN_NORM)
        return self.scale * x / norms ** self.alpha / self.reference


@dataclass(frozen=True)
class MapCandidate:
    """One point of the selection grid and its evidence."""

    alpha: float
    scale: float
    num_experts: int
    log_evidence: float


def select_feature_map(train_features: np.ndarray,
                       fit: Callable[[np.ndarray, int], float],
                       alphas: Sequence[float], scales: Sequence[float],
                       expert_counts: Sequence[int]
                       ) -> tuple[NormFeatureMap, int, list[MapCandidate]]:
    """The ``(alpha, scale, number of experts)`` whose GP has the largest log evidence.

    ``fit(mapped_train_features, num_experts)`` fits the GP on the mapped training features
    and returns its total log marginal likelihood (per point or total, the same for every
    candidate). Only training data enters: the choice never sees held-out or unknown
    inputs. Ties keep the earlier candidate (list the simpler ones first).
    """
    candidates = []
    best: tuple[float, NormFeatureMap, int] | None = None
    for alpha in alphas:
        for scale in scales:
            fmap = NormFeatureMap.fitted(train_features, alpha, scale)
            mapped = fmap(train_features)
            for m in expert_counts:
                evidence = float(fit(mapped, m))
                candidates.append(MapCandidate(alpha, scale, m, evidence))
                if best is None or evidence > best[0]:
                    best = (evidence, fmap, m)
    if best is None:
        raise ValueError('the selection grid is empty')
    return best[1], best[2], candidates
