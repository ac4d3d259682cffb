"""Configuration, constants and the per-input output of the NTK-GP engine."""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

import numpy as np

# The on-disk format name predates the split of the engine into this subpackage; it
# stays so that existing state files (the shipped GP included) keep loading.
FORMAT_NAME = 'uq_perception.ntk_gp'
FORMAT_VERSION = 2
MAX_FEATURE_MAGNITUDE = 1e100
# Cholesky pivots spanning more than this (squared) ratio are treated as near-singular.
MAX_CONDITION = 1e12


class Gating(str, Enum):
    """Hard gating of inputs to GP experts."""

    KMEANS = 'kmeans'
    CLASS = 'class'


@dataclass(frozen=True)
class NTKGPConfig:
    """Configuration of :class:`LastLayerNTKGP` (and of the function-space form).

    Attributes
    ----------
    num_experts : int
        ``M`` for k-means gating. Class gating has one expert per class of the head; there
        it must be left at 1 or equal the number of classes.
    gating : Gating
        Hard gating mode.
    probit_lambda : float
        ``lambda`` in ``p = softmax(mu / sqrt(T^2 + lambda sigma^2))``; ``pi/8`` is the
        probit approximation with the GP variance taken as logit variance.
    ood_quantile : float
        In-distribution quantile of the GP variance used by ``calibrate_ood``.
    seed : int
        Seeds the k-means initialisation, subsampling and the fixed entropy draws.
    entropy_samples : int
        Number of fixed draws for the entropy decomposition (even: antithetic pairs).
    kmeans_samples : int
        Rows used to fit k-means (a uniform subsample of an array; the first rows of a
        stream).
    kmeans_iterations : int
        Maximum Lloyd iterations.
    new_class_margin : float
        Logit margin of a newly taught class over the best known class at its labelled
        features; also how far below the mean logit the new class starts elsewhere.
    shared_noise : bool
        True: all experts share one noise ``sigma^2`` and each has its own ``delta_m``,
        jointly maximising the sum of the experts' evidences. False: each expert
        maximises its own evidence over both.
    """

    num_experts: int = 1
    gating: Gating = Gating.KMEANS
    probit_lambda: float = math.pi / 8
    ood_quantile: float = 0.95
    seed: int = 0
    entropy_samples: int = 32
    kmeans_samples: int = 65536
    kmeans_iterations: int = 50
    new_class_margin: float = 2.0
    shared_noise: bool = True

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, 'gating', Gating(self.gating))
        except ValueError:
            raise ValueError(f'gating must be one of {[g.value for g in Gating]}, '
                             f'got {self.gating!r}') from None
        if int(self.num_experts) != self.num_experts or self.num_experts < 1:
            raise ValueError(f'num_experts must be a positive integer, got {self.num_experts}')
        if not (math.isfinite(self.probit_lambda) and self.probit_lambda >= 0):
            raise ValueError(f'probit_lambda must be finite and >= 0, got {self.probit_lambda}')
        if not 0.0 < self.ood_quantile < 1.0:
            raise ValueError(f'ood_quantile must lie in (0, 1), got {self.ood_quantile}')
        if self.entropy_samples < 2 or self.entropy_samples % 2:
            raise ValueError(
                f'entropy_samples must be even and >= 2, got {self.entropy_samples}')
        if self.kmeans_samples < 1 or self.kmeans_iterations < 1:
            raise ValueError('kmeans_samples and kmeans_iterations must be positive')
        if not math.isfinite(self.new_class_margin):
            raise ValueError(f'new_class_margin must be finite, got {self.new_class_margin}')


@dataclass(frozen=True)
class UncertaintyOutput:
    """Per-input predictive summary; every field has one row per input."""

    logits: np.ndarray
    gp_variance: np.ndarray
    class_variance: np.ndarray
    probabilities: np.ndarray
    predictive_entropy: np.ndarray
    expected_entropy: np.ndarray
    mutual_information: np.ndarray
    out_of_distribution: np.ndarray
    expert_id: np.ndarray
