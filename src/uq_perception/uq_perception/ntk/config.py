"""Configuration, constants and the per-input output of the NTK-GP engine."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from enum import Enum

import numpy as np

# The on-disk format name predates the split of the engine into this subpackage; it
# stays so that existing state files (the shipped GP included) keep loading.
FORMAT_NAME = 'uq_perception.ntk_gp'
# Version 3 adds the feature transform and score signals other than the variance. A state
# that uses neither is still written as version 2, which readers that predate them load
# unchanged; one that uses them is version 3, which those readers refuse instead of
# querying it without its transform. Version 4 adds scale gating (one expert, threshold and
# score reference per scale); only a state that uses it is written as version 4.
SCALE_FORMAT_VERSION = 4
FORMAT_VERSION = 3
PLAIN_FORMAT_VERSION = 2
READABLE_FORMAT_VERSIONS = (PLAIN_FORMAT_VERSION, FORMAT_VERSION, SCALE_FORMAT_VERSION)
MAX_FEATURE_MAGNITUDE = 1e100
# Cholesky pivots spanning more than this (squared) ratio are treated as near-singular.
MAX_CONDITION = 1e12
# Upper bounds of NTKGPConfig's counts. Entropy draws cost every prediction
# O(samples x detections x classes) time and memory (32 is the default; 1024 draws of 70
# classes for 20 detections take 11 MB per frame). k-means holds its sample in memory as
# float64 (2^20 rows of 128 features: 1 GiB); iterations bound a fit's time.
MAX_ENTROPY_SAMPLES = 1024
MAX_KMEANS_SAMPLES = 2 ** 20
MAX_KMEANS_ITERATIONS = 10_000


class Gating(str, Enum):
    """Hard gating of inputs to GP experts."""

    KMEANS = 'kmeans'
    CLASS = 'class'
    # One expert per scale of a multi-scale head (scale_gating.py).
    SCALE = 'scale'


@dataclass(frozen=True)
class NTKGPConfig:
    """Configuration of :class:`LastLayerNTKGP` (and of the function-space form).

    Every field is checked on construction (types included, so a state file's metadata
    is validated by the same rule), raising ``ValueError`` that names the field.

    Attributes
    ----------
    num_experts : int
        ``M`` for k-means gating. Class gating has one expert per class of the head; there
        it must be left at 1 or equal the number of classes. Scale gating has one expert
        per scale; there it equals the number of scales.
    gating : Gating
        Hard gating mode.
    probit_lambda : float
        ``lambda`` in ``p = softmax(mu / sqrt(T^2 + lambda sigma^2))``; ``pi/8`` is the
        probit approximation with the GP variance taken as logit variance. It shapes the
        class probabilities only: the entropy decomposition (mutual information) is of
        the GP posterior ``N(mu, sigma^2)`` itself.
    ood_quantile : float
        In-distribution quantile of the GP variance used by ``calibrate_ood``.
    seed : int
        Seeds the k-means initialisation, subsampling and the fixed entropy draws
        (``>= 0``).
    entropy_samples : int
        Number of fixed draws for the entropy decomposition (even: antithetic pairs), at
        most :data:`MAX_ENTROPY_SAMPLES`.
    kmeans_samples : int
        Rows used to fit k-means (a uniform subsample of an array; the first rows of a
        stream), at most :data:`MAX_KMEANS_SAMPLES`.
    kmeans_iterations : int
        Maximum Lloyd iterations, at most :data:`MAX_KMEANS_ITERATIONS`.
    new_class_margin : float
        Logit margin (finite, ``>= 0``) of a newly taught class over the best known class
        at its labelled features; also how far below the mean logit the new class starts
        elsewhere.
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
        check_integer('num_experts', self.num_experts, 1)
        check_integer('seed', self.seed, 0)
        check_integer('entropy_samples', self.entropy_samples, 2, MAX_ENTROPY_SAMPLES)
        if self.entropy_samples % 2:
            raise ValueError(f'entropy_samples must be even (antithetic pairs), got '
                             f'{self.entropy_samples}')
        check_integer('kmeans_samples', self.kmeans_samples, 1, MAX_KMEANS_SAMPLES)
        check_integer('kmeans_iterations', self.kmeans_iterations, 1, MAX_KMEANS_ITERATIONS)
        check_real('probit_lambda', self.probit_lambda, 0.0)
        check_real('new_class_margin', self.new_class_margin, 0.0)
        check_real('ood_quantile', self.ood_quantile)
        if not 0.0 < self.ood_quantile < 1.0:
            raise ValueError(f'ood_quantile must lie in (0, 1), got {self.ood_quantile}')
        if not isinstance(self.shared_noise, bool):
            raise ValueError(f'shared_noise must be true or false, got {self.shared_noise!r}')


def check_integer(name: str, value: object, minimum: int, maximum: int | None = None) -> None:
    """Raise ``ValueError`` naming ``name`` unless ``value`` is an integer (not a bool, not
    a float) in ``[minimum, maximum]``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f'{name} must be an integer, got {value!r}')
    value = int(value)
    if value < minimum or (maximum is not None and value > maximum):
        bound = f'>= {minimum}' if maximum is None else f'in [{minimum}, {maximum}]'
        raise ValueError(f'{name} must be {bound}, got {value}')


def check_real(name: str, value: object, minimum: float | None = None, *,
               positive: bool = False) -> None:
    """Raise ``ValueError`` naming ``name`` unless ``value`` is a finite real number (not a
    bool), ``>= minimum`` when given, ``> 0`` when ``positive``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f'{name} must be a number, got {value!r}')
    try:
        value = float(value)
    except OverflowError:  # an int too large for a float
        value = math.inf
    if not math.isfinite(value):
        raise ValueError(f'{name} must be finite, got {value}')
    if minimum is not None and value < minimum:
        raise ValueError(f'{name} must be >= {minimum}, got {value}')
    if positive and not value > 0:
        raise ValueError(f'{name} must be > 0, got {value}')


@dataclass(frozen=True)
class UncertaintyOutput:
    """Per-input predictive summary; every field has one row per input.

    ``calibrated_score`` is ``None`` when the GP holds no score reference
    (:mod:`uq_perception.ntk.calibrated_score`); messages then carry
    :data:`~uq_perception.ntk.calibrated_score.NO_CALIBRATED_SCORE`.
    """

    logits: np.ndarray
    gp_variance: np.ndarray
    class_variance: np.ndarray
    probabilities: np.ndarray
    predictive_entropy: np.ndarray
    expected_entropy: np.ndarray
    mutual_information: np.ndarray
    out_of_distribution: np.ndarray
    expert_id: np.ndarray
    calibrated_score: np.ndarray | None = None
