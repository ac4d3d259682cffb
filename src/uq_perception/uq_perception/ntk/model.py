"""Weight-space NTK-GP for a linear last layer: a mixture of exact GP experts (ROS-free).

Model
-----
A network ends in a linear head ``logits = W phi(x) + b`` with ``W`` of shape ``(C, D)``.
Linearising the network around its trained weights and treating the head's parameters as
Gaussian, ``theta_c = [w_c; b_c] ~ N(theta_hat_c, I / delta)`` independently per class,
gives a Gaussian process over the logits whose kernel is the head's Neural Tangent Kernel

    k(x, x') = J(x) J(x')^T / delta = (phi^T phi' + 1) / delta * I_C,   J = I_C (x) [phi; 1]^T.

Classes decouple and share one kernel. With a Gaussian observation noise ``sigma^2`` the
posterior covariance of every class's parameters is ``A^{-1}`` with the (D+1)x(D+1)
precision ("information form")

    A = Phi~^T Phi~ / sigma^2 + delta I,      Phi~ = [Phi, 1]   (N x (D+1)),

and the predictive variance of each logit at a query ``phi~* = [phi*; 1]`` is

    sigma^2(x*) = phi~*^T A^{-1} phi~*
                = k** - k*^T (K + sigma^2 I)^{-1} k*      (Woodbury; function space).

The weight-space form costs O(N D^2) to fit, O(D^2) per query and keeps no training data;
:mod:`uq_perception.ntk.function_space` computes the function-space form with Jacobians.
The mean of the logits is the network's own output (the linearisation point), so the GP
contributes only the covariance.

Mixture of experts
------------------
Features are partitioned by hard gating into ``M`` experts: k-means centroids (inputs go
to the nearest centroid), or one expert per class of the head (inputs go to the head's
predicted class ``argmax(W phi + b)``, the same rule at fit, update and query time, so
an expert models exactly the region routed to it, including the network's mistakes),
or one expert per scale of a multi-scale head (inputs go to the scale whose bias slot
they set; :mod:`uq_perception.ntk.scale_gating`, which also gives each scale its own OOD
threshold and score reference).
Each expert ``m`` has its own ``A_m`` and hyperparameters ``(sigma_m^2, delta_m)`` (below).
``M = 1`` is the plain last-layer GP.

Hyperparameters
---------------
``(sigma_m^2, delta_m)`` maximise the closed-form log marginal likelihood of the Bayesian
linear regression ``Y = Phi~ Theta + E`` with targets the centred one-hot labels
``y_ic = [c == label_i] - 1/C`` (C outputs sharing the kernel, ``E ~ N(0, sigma^2)``,
``Theta ~ N(0, I / delta)``):

    log p(Y) = sum_c log N(y_c | 0, Phi~ Phi~^T / delta + sigma^2 I).

Each target row sums to zero, so in an orthonormal basis of the centred subspace one of
the C output coordinates is identically zero: the evidence counts ``C - 1`` outputs
(counting the zero one as an observation would reward ``sigma^2 -> 0``). The posterior
``A_m`` still conditions every class on all points, as in the model above; only the
evidence leaves out the coordinate that says nothing about the hyperparameters.

Why these targets: the evidence is closed form only for a Gaussian likelihood, and
regressing one-hot labels is the standard NTK/NNGP treatment of classification; the
network's own logits cannot serve as targets because they are exactly linear in ``phi~``
(zero residual would drive ``sigma^2`` to 0). Centring removes the constant ``1/C`` that
the bias would otherwise have to absorb. The predictive covariance depends on the targets
only through these two scalars, so the GP variance is in the units of the targets. The
outputs take it as the variance of the logits; for the class probabilities the probit
factor ``lambda`` rescales it (``lambda = pi/8`` takes it as is), fitted on validation data
by :meth:`LastLayerNTKGP.calibrate_probabilities` (Outputs, below). The evidence is
maximised with MacKay's fixed-point updates in the eigenbasis of the Gram matrix
(:func:`fit_marginal_likelihood`), from sufficient statistics only, so fits stream.

Sharing across experts (``NTKGPConfig.shared_noise``, default on): the experts share one
noise ``sigma^2`` and each has its own prior precision ``delta_m``, all maximising the sum
of the experts' evidences (:func:`fit_shared_noise`). Label noise is a property of the
data source, while the scale of the weights that explain the labels differs by region.
Separate noises fail in practice: k-means experts on a trained network's features are
often nearly single-class, their labels then are almost exactly linear in ``phi~``, the
evidence drives their ``sigma_m^2`` towards 0 and their variances (OOD scores included)
shrink by orders of magnitude against other experts' (on a synthetic 10-class mixture,
OOD AUROC of the GP variance fell from 0.997 to 0.90 with M = 16). With
``shared_noise=False`` every expert maximises its own evidence over both values; an
expert whose labels are all one class has constant targets, which the bias fits exactly
(the evidence grows without bound as ``sigma^2 -> 0``), so it keeps the pooled values.
Experts with fewer than ``D + 1`` points keep the values fitted on the pooled data of all
experts (with the shared ``sigma^2``).

Outputs
-------
The GP posterior of the logits is ``f ~ N(mu, sigma^2 I)``: the network's logits as mean,
the GP variance as the variance of every logit. With temperature ``T`` (``1`` unless
calibrated) the class probabilities are the probit (mean-field) approximation of
``E[softmax(f / T)]`` with a calibrated variance factor ``lambda``

    p = softmax(mu / sqrt(T^2 + lambda sigma^2)),

where ``lambda = pi/8`` takes the GP variance as it is and the fit on validation NLL
(:meth:`LastLayerNTKGP.calibrate_probabilities`) may shrink it, to 0 when the variance
does not improve the probabilities of known objects. ``lambda`` shapes these probabilities
only. The entropy decomposition is of the GP posterior itself, independent of ``lambda``:
with a fixed set of antithetic, moment-matched standard normal draws ``eps_s`` (seeded by
the config, hence deterministic), ``f_s = mu + sigma eps_s``, total
``H[mean_s softmax(f_s/T)]``, aleatoric ``mean_s H[softmax(f_s/T)]``, epistemic = their
difference (mutual information, non-negative by concavity of the entropy for any set of
draws; for small ``sigma`` it is ``sigma^2 (1 - sum_c p_c^2) / (2 T^2)``, the GP variance
weighted by how undecided the classes are).

The calibrated score (:mod:`uq_perception.ntk.calibrated_score`) places the GP variance
among known validation objects' when the state holds a reference (:meth:`calibrate_score`).
"""


from __future__ import annotations

import copy
import logging
import math
import os
import threading
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from uq_perception.ntk.box_calibration import BoxCalibration
from uq_perception.ntk.calibrated_score import (
    DEFAULT_REFERENCE_LEVELS,
    ScoreReference,
    score_signal,
)
from uq_perception.ntk.calibration import (
    fit_ood_thresholds,
    fit_probit_calibration,
    fit_score_references,
)
from uq_perception.ntk.config import Gating, NTKGPConfig, UncertaintyOutput
from uq_perception.ntk.evidence import (
    SpectralEvidence,
    fit_expert_hyperparameters,
    log_marginal_likelihood,
)
from uq_perception.ntk.feature_transform import FeatureTransform
from uq_perception.ntk.gating import kmeans, nearest_centroid
from uq_perception.ntk.linalg import check_matrix, spd_inverse
from uq_perception.ntk.persistence import arrays_digest, load_model, save_model
from uq_perception.ntk.predictive import antithetic_normal_draws, summarise_gaussian_logits
from uq_perception.ntk.scale_gating import ScaleGating

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

# Rows handed to one BLAS call while streaming: large enough for full BLAS speed, small
# enough that the float64 copy of a chunk stays a few tens of MB.
_STREAM_ROWS = 16384
# Exact refactorisation after this many rank-1 updates bounds the drift of the
# Sherman-Morrison recursion (amortised O(D^3 / 256) = O(D^2) for D <= 256).
_REFACTOR_EVERY = 256


def expert_quadratic_forms(phi: np.ndarray, expert: np.ndarray, covariance: np.ndarray
                           ) -> np.ndarray:
    """``phi_b^T S_{e_b} phi_b`` for every row ``b``, with ``S = covariance``.

    Parameters
    ----------
    phi : np.ndarray
        ``(B, P)`` rows.
    expert : np.ndarray
        ``(B,)`` integer expert of each row, in ``[0, M)``.
    covariance : np.ndarray
        ``(M, P, P)`` one matrix per expert.

    Returns
    -------
    np.ndarray
        ``(B,)`` float64.

    Notes
    -----
    The rows are gathered once into expert order; each expert present multiplies its
    block of rows by its matrix into one shared buffer (one BLAS call, no Python work per
    row), and one row-wise dot product over the whole batch finishes every row. Each
    matrix is read once per batch. A single batched product over the experts padded to
    the largest block does the work of ``M`` times that block, several times the rows
    there are when experts are unevenly filled, and was slower (docs/benchmarks.md).
    """
    if covariance.shape[0] == 1:
        return np.einsum('ij,ij->i', phi @ covariance[0], phi)
    order = np.argsort(expert, kind='stable')
    counts = np.bincount(expert, minlength=covariance.shape[0])
    rows = phi[order]
    products = np.empty_like(rows)
    stops = np.cumsum(counts).tolist()
    for e in np.flatnonzero(counts).tolist():
        block = slice(stops[e] - int(counts[e]), stops[e])
        np.matmul(rows[block], covariance[e], out=products[block])
    variance = np.empty(len(phi))
    variance[order] = np.einsum('ij,ij->i', products, rows)
    return variance


class LastLayerNTKGP:
    """Weight-space (information form) NTK-GP for a linear last layer logits = W phi + b.

    Parameters
    ----------
    weight : np.ndarray
        ``(C, D)`` head weight ``W``, ``C >= 2``.
    bias : np.ndarray
        ``(C,)`` head bias ``b``.
    config : NTKGPConfig
        Gating, probit and calibration settings.
    class_names : Sequence[str], optional
        Names of the ``C`` classes (default ``class_0 ...``).
    model_id : str
        Identity of the network the head belongs to; checked by :meth:`load`.

    Notes
    -----
    Per expert the state is the sufficient statistics ``G_m = Phi~_m^T Phi~_m``, the class
    sums ``H_m = Phi~_m^T onehot(labels)``, ``(sigma_m^2, delta_m)`` and the cached
    ``A_m^{-1}``; no training rows are kept. Methods are serialised by a lock so a
    detector may query while labels arrive on another thread.

    Classes taught online (:meth:`update` with ``label == num_classes``) get a Bayesian
    linear model for their weights with prior mean ``w0 = [mean_c w_c; mean_c b_c -
    margin]`` (the new logit starts ``margin`` below the mean logit everywhere), the
    expert's covariance ``A_m^{-1}``, and targets ``max_c f_c(x) + margin`` (max over the
    head's classes) at its labelled features; every other feature is an observation at
    the prior mean (residual zero).
    The posterior mean is ``w0 + A_m^{-1} r_m / sigma_m^2`` with
    ``r_m = sum phi~ (target - w0^T phi~)`` over the expert's labelled features of the class.
    """

    def __init__(self, weight: np.ndarray, bias: np.ndarray, config: NTKGPConfig = NTKGPConfig(),
                 class_names: Sequence[str] | None = None, model_id: str = '') -> None:
        w = check_matrix(weight, 'weight').astype(np.float64)
        b = np.asarray(bias, dtype=np.float64)
        if w.shape[0] < 2:
            raise ValueError(f'the head needs at least 2 classes, got weight shape {w.shape}')
        if b.shape != (w.shape[0],) or not np.isfinite(b).all():
            raise ValueError(f'bias must be finite with shape ({w.shape[0]},), got {b.shape}')
        names = [f'class_{i}' for i in range(w.shape[0])] if class_names is None \
            else [str(n) for n in class_names]
        if len(names) != w.shape[0] or len(set(names)) != len(names):
            raise ValueError(f'class_names must be {w.shape[0]} unique names, got {names!r}')
        if config.gating is Gating.CLASS and config.num_experts not in (1, w.shape[0]):
            raise ValueError(f'class gating uses one expert per class ({w.shape[0]}); '
                             f'num_experts={config.num_experts} disagrees')
        self.config = config
        self.model_id = str(model_id)
        self.class_names = names
        self.ood_threshold: float | None = None
        self.probit_lambda = float(config.probit_lambda)
        self.temperature = 1.0
        # Variance of a box head's outputs from the shared kernel term (box_calibration.py);
        # None (states written before it existed) means box uncertainty is not estimated.
        self.box_calibration: BoxCalibration | None = None
        # Validation variances behind the calibrated score (calibrated_score.py); None (states
        # written before it existed) means no score.
        self.score_reference: ScoreReference | None = None
        # Kernel features of a detector the product did not train (feature_transform.py);
        # None: the features as the detector gives them. Set before fit().
        self.feature_transform: FeatureTransform | None = None
        # The scales of a multi-scale head and their calibration (scale_gating.py); needed by
        # Gating.SCALE, None otherwise. Set before fit().
        self.scale_gating: ScaleGating | None = None
        # Identifiers of the labels applied by update(), persisted with the state, so that a
        # label delivered twice (a retry after a lost answer) is applied once.
        self.applied_updates: list[str] = []
        self._weight = np.ascontiguousarray(w)
        self._bias = b.copy()
        self._lock = threading.RLock()
        m = w.shape[0] if config.gating is Gating.CLASS else config.num_experts
        p = w.shape[1] + 1
        self._centroids = np.zeros((m, p - 1))
        self._gram = np.zeros((m, p, p))
        self._class_sums = np.zeros((m, p, w.shape[0]))
        self._extra_residual = np.zeros((m, 0, p))
        self._sigma2 = np.full(m, np.nan)
        self._delta = np.full(m, np.nan)
        self._covariance = np.zeros((m, p, p))
        self._extra_weight = np.zeros((m, 0, p))
        self._updates = np.zeros(m, dtype=np.int64)
        self._fitted = False
        self._draws: dict[int, np.ndarray] = {}
        self._refresh_gating_cache()

    # ------------------------------------------------------------------ properties

    @property
    def feature_dim(self) -> int:
        """``D``, the dimension of ``phi``."""
        return int(self._weight.shape[1])

    @property
    def num_classes(self) -> int:
        """Number of classes, including classes taught online."""
        return len(self.class_names)

    @property
    def num_base_classes(self) -> int:
        """Number of classes of the network's head."""
        return int(self._weight.shape[0])

    @property
    def num_experts(self) -> int:
        """``M``."""
        return int(self._gram.shape[0])

    @property
    def fitted(self) -> bool:
        """Whether :meth:`fit` (or :meth:`load`) has produced a posterior."""
        return self._fitted

    @property
    def sigma2(self) -> np.ndarray:
        """``(M,)`` noise variances per expert (copy)."""
        return self._sigma2.copy()

    @property
    def delta(self) -> np.ndarray:
        """``(M,)`` prior precisions per expert (copy)."""
        return self._delta.copy()

    @property
    def centroids(self) -> np.ndarray:
        """``(M, D)`` gating centroids (class means of the features for class gating)."""
        return self._centroids.copy()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        del state['_lock']
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        # Pickles of states from before the feature transform existed have none.
        state.setdefault('feature_transform', None)
        state.setdefault('scale_gating', None)
        self.__dict__.update(state)
        self._lock = threading.RLock()

    # ------------------------------------------------------------------ fitting

    def set_hyperparameters(self, sigma2: float | np.ndarray, delta: float | np.ndarray) -> None:
        """Fix ``(sigma^2, delta)`` (scalars or one per expert) instead of fitting them."""
        with self._lock:
            s2 = np.broadcast_to(np.asarray(sigma2, dtype=np.float64), (self.num_experts,))
            dl = np.broadcast_to(np.asarray(delta, dtype=np.float64), (self.num_experts,))
            for name, v in (('sigma2', s2), ('delta', dl)):
                if not (np.isfinite(v).all() and (v > 0).all()):
                    raise ValueError(f'{name} must be finite and > 0, got {v}')
            self._sigma2, self._delta = s2.copy(), dl.copy()
            if self._fitted:
                self._refactor(range(self.num_experts))

    def fit(self, features: np.ndarray | Iterable[tuple[np.ndarray, np.ndarray | None]],
            labels: np.ndarray | None = None, *, keep_gating: bool = False,
            keep_hyperparameters: bool = False) -> LastLayerNTKGP:
        """Fit gating, per-expert precisions and per-expert hyperparameters.

        Parameters
        ----------
        features : np.ndarray or iterable
            ``(N, D)`` array, or an iterable of ``(features_chunk, labels_chunk)`` pairs
            streamed once (``labels_chunk`` may be None). Chunks are promoted to float64
            and their Gram matrices accumulated with BLAS, so memory is O(chunk + M D^2).
        labels : np.ndarray, optional
            ``(N,)`` integer labels for an array input. Missing labels are replaced by the
            head's predicted class (the targets of the marginal likelihood then follow the
            network's own predictions).
        keep_gating : bool
            Reuse the current centroids instead of running k-means.
        keep_hyperparameters : bool
            Reuse the current ``(sigma^2, delta)`` (from a fit or
            :meth:`set_hyperparameters`) instead of maximising the evidence. With both
            flags set, a fit on the enlarged data reproduces a sequence of :meth:`update`.

        Notes
        -----
        k-means runs on ``kmeans_samples`` rows: a uniform random subsample of an array,
        or the first rows of a stream (a stream is read once; shuffle it if it is sorted).
        Hyperparameters per expert follow ``config.shared_noise`` (module docstring).
        """
        with self._lock:
            if keep_hyperparameters and not np.isfinite(self._sigma2).all():
                raise ValueError('keep_hyperparameters=True needs hyperparameters: fit first '
                                 'or call set_hyperparameters')
            if keep_gating and not self._fitted and self._needs_kmeans():
                raise ValueError('keep_gating=True needs fitted centroids')
            self._check_scale_gating()
            # A failed fit (bad chunk midway) must leave the previous posterior intact.
            backup = copy.deepcopy(self.__getstate__())
            try:
                chunks = self._iter_chunks(features, labels)
                if self._needs_kmeans() and not keep_gating:
                    chunks = self._fit_kmeans(features, labels, chunks)
                self._accumulate(chunks)
                if not keep_hyperparameters:
                    self._fit_hyperparameters()
                self._refactor(range(self.num_experts))
            except BaseException:
                self.__dict__.update(backup)
                raise
            self._updates[:] = 0
            self._fitted = True
            # The box calibration and the score reference describe this posterior's
            # variances; a new one voids them.
            self.box_calibration = None
            self.score_reference = None
            if self.scale_gating is not None:
                self.scale_gating = self.scale_gating.without_references()
            return self

    def _check_scale_gating(self) -> None:
        scales = self.scale_gating
        if self.config.gating is not Gating.SCALE:
            if scales is not None:
                raise ValueError(f'scale_gating is set but the gating is '
                                 f'{self.config.gating.value}')
            return
        if scales is None:
            raise ValueError('scale gating needs the scales: set scale_gating before fit()')
        if scales.num_scales != self.num_experts or scales.feature_dim > self.feature_dim:
            raise ValueError(f'scale_gating has {scales.num_scales} scales reaching column '
                             f'{scales.feature_dim - 1}; the GP has {self.num_experts} experts '
                             f'and {self.feature_dim} features')

    def _experts_of(self, kernel_x: np.ndarray, base_logits: np.ndarray) -> np.ndarray:
        """``(N,)`` expert of each row, from its kernel features and the head's logits."""
        if self.config.gating is Gating.CLASS:
            return np.argmax(base_logits[:, :self.num_base_classes], axis=1)
        if self.config.gating is Gating.SCALE:
            # The transform leaves the bias slots as they are.
            return self.scale_gating.scale_of(kernel_x)  # type: ignore[union-attr]
        if self.num_experts == 1:
            return np.zeros(len(kernel_x), dtype=np.int64)
        return nearest_centroid(kernel_x, self._centroids, self._centroid_sq)

    def _needs_kmeans(self) -> bool:
        return self.config.gating is Gating.KMEANS and self.num_experts > 1

    def _iter_chunks(self, features: Any, labels: Any
                     ) -> Iterator[tuple[np.ndarray, np.ndarray | None]]:
        if isinstance(features, np.ndarray) or (
                hasattr(features, '__array__') and not isinstance(features, Iterator)):
            x = np.asarray(features)
            if labels is not None:
                y = np.asarray(labels)
                if y.shape != (x.shape[0] if x.ndim else -1,):
                    raise ValueError(f'labels must have shape ({len(x)},), got {y.shape}')
            else:
                y = None
            check_matrix(x[:0], 'features', self.feature_dim)
            for start in range(0, x.shape[0], _STREAM_ROWS):
                stop = start + _STREAM_ROWS
                yield x[start:stop], None if y is None else y[start:stop]
            return
        if labels is not None:
            raise ValueError('labels must be given inside the chunks when features stream')
        for item in features:
            if not (isinstance(item, tuple) and len(item) == 2):
                raise ValueError('a feature stream must yield (features, labels) pairs')
            yield item

    def _fit_kmeans(self, features: Any, labels: Any,
                    chunks: Iterator[tuple[np.ndarray, np.ndarray | None]]
                    ) -> Iterator[tuple[np.ndarray, np.ndarray | None]]:
        limit = self.config.kmeans_samples
        if isinstance(features, np.ndarray):
            x = features
            if x.shape[0] > limit:
                rng = np.random.default_rng(self.config.seed)
                x = x[np.sort(rng.choice(x.shape[0], limit, replace=False))]
            sample = self._kernel_features(check_matrix(x, 'features', self.feature_dim))
            self._centroids = kmeans(sample, self.num_experts,
                                     iterations=self.config.kmeans_iterations,
                                     seed=self.config.seed)
            self._refresh_gating_cache()
            return chunks
        buffered: list[tuple[np.ndarray, np.ndarray | None]] = []
        rows = 0
        for chunk in chunks:
            buffered.append(chunk)
            rows += len(chunk[0])
            if rows >= limit:
                break
        parts = [check_matrix(c[0], 'features', self.feature_dim) for c in buffered]
        if not parts:
            raise ValueError('cannot fit on an empty feature stream')
        sample = self._kernel_features(np.concatenate(parts)[:limit])
        self._centroids = kmeans(sample, self.num_experts,
                                 iterations=self.config.kmeans_iterations,
                                 seed=self.config.seed)
        self._refresh_gating_cache()

        def chained() -> Iterator[tuple[np.ndarray, np.ndarray | None]]:
            yield from buffered
            yield from chunks
        return chained()

    def _accumulate(self, chunks: Iterable[tuple[np.ndarray, np.ndarray | None]]) -> None:
        import torch  # here: fitting needs it, a query of a loaded GP does not

        m, p, c = self.num_experts, self.feature_dim + 1, self.num_classes
        d = p - 1
        gram = torch.zeros(m, p, p, dtype=torch.float64)
        sums = torch.zeros(m, c, p, dtype=torch.float64)
        extra = np.zeros((m, c - self.num_base_classes, p))
        weight_t = torch.from_numpy(self._weight.T.copy())
        bias_t = torch.from_numpy(self._bias)
        centroids_t = torch.from_numpy(self._centroids)
        centroid_sq = (centroids_t * centroids_t).sum(1)
        total = 0
        for raw_x, raw_y in chunks:
            x_np = np.asarray(raw_x)
            if x_np.shape[0] == 0:
                continue
            x_np = check_matrix(x_np, 'features', d)
            raw = torch.from_numpy(np.ascontiguousarray(x_np, dtype=np.float64))
            base_logits = raw @ weight_t + bias_t
            x_np = self._kernel_features(x_np)
            x = torch.from_numpy(np.ascontiguousarray(x_np, dtype=np.float64))
            n = x.shape[0]
            if raw_y is None:
                y = base_logits.argmax(1)
            else:
                y_np = np.asarray(raw_y)
                if y_np.shape != (n,) or not np.issubdtype(y_np.dtype, np.integer):
                    raise ValueError(f'labels must be an integer array of shape ({n},), got '
                                     f'{y_np.dtype} {y_np.shape}')
                if n and (y_np.min() < 0 or y_np.max() >= c):
                    raise ValueError(f'labels must lie in [0, {c}), got range '
                                     f'[{y_np.min()}, {y_np.max()}]')
                y = torch.from_numpy(y_np.astype(np.int64))
            if self.config.gating is Gating.CLASS:
                expert = base_logits.argmax(1)
            elif self.config.gating is Gating.SCALE:
                expert = torch.from_numpy(self._experts_of(x_np, base_logits.numpy()))
            elif m == 1:
                expert = torch.zeros(n, dtype=torch.int64)
            else:
                expert = (centroid_sq - 2.0 * (x @ centroids_t.T)).argmin(1)
            order = torch.argsort(expert, stable=True) if m > 1 else None
            xs = x[order] if order is not None else x
            ys = y[order] if order is not None else y
            counts = torch.bincount(expert, minlength=m).tolist()
            start = 0
            for e, count in enumerate(counts):
                if count == 0:
                    continue
                xm, ym = xs[start:start + count], ys[start:start + count]
                start += count
                gram[e, :d, :d] += xm.T @ xm
                col = xm.sum(0)
                gram[e, :d, d] += col
                gram[e, d, :d] += col
                gram[e, d, d] += count
                sums[e, :, :d].index_add_(0, ym, xm)
                sums[e, :, d] += torch.bincount(ym, minlength=c).to(torch.float64)
            if extra.shape[1]:
                new = (y >= self.num_base_classes).numpy()
                for i in np.flatnonzero(new):
                    phi = np.append(x_np[i].astype(np.float64), 1.0)
                    k = int(y[i]) - self.num_base_classes
                    extra[int(expert[i]), k] += phi * self._new_class_residual(
                        phi, base_logits[i].numpy())
            total += n
        if total == 0:
            raise ValueError('cannot fit on zero feature rows')
        self._gram = gram.numpy()
        self._class_sums = sums.transpose(1, 2).numpy().copy()
        self._extra_residual = extra
        if self.config.gating is Gating.CLASS:
            self._update_class_centroids()

    def _update_class_centroids(self) -> None:
        d = self.feature_dim
        count = self._gram[:, d, d]
        self._centroids = np.where(count[:, None] > 0,
                                   self._gram[:, :d, d] / np.maximum(count, 1.0)[:, None], 0.0)
        self._refresh_gating_cache()

    def _refresh_gating_cache(self) -> None:
        self._centroid_sq = (self._centroids * self._centroids).sum(1)

    def _evidence(self, gram: np.ndarray, class_sums: np.ndarray) -> SpectralEvidence:
        n = float(gram[-1, -1])
        c = self.num_classes
        # Centred one-hot targets: Phi~^T Y = H - (Phi~^T 1) 1^T / C, and each row of Y has
        # squared norm (1 - 1/C)^2 + (C - 1)/C^2 = 1 - 1/C.
        cross = class_sums - gram[:, -1:] / c
        return SpectralEvidence.from_gram(gram, cross, n * (1.0 - 1.0 / c), int(round(n)),
                                          c - 1)

    def _fit_hyperparameters(self) -> None:
        scales = self.scale_gating
        self._sigma2, self._delta, _ = fit_expert_hyperparameters(
            [self._evidence(g, h) for g, h in zip(self._gram, self._class_sums, strict=True)],
            self._evidence(self._gram.sum(0), self._class_sums.sum(0)),
            [int(round(g[-1, -1])) for g in self._gram],
            [int(np.count_nonzero(h[-1] > 0)) for h in self._class_sums],
            scales.min_training_points() if scales is not None else self.feature_dim + 1,
            self.config.shared_noise)

    def log_marginal_likelihood(self, expert: int = 0, sigma2: float | None = None,
                                delta: float | None = None) -> float:
        """Closed-form log evidence of one expert (at its fitted values by default)."""
        with self._lock:
            if not 0 <= expert < self.num_experts:
                raise ValueError(f'expert must lie in [0, {self.num_experts}), got {expert}')
            block = self._evidence(self._gram[expert], self._class_sums[expert])
            return log_marginal_likelihood(
                [block], float(self._sigma2[expert] if sigma2 is None else sigma2),
                float(self._delta[expert] if delta is None else delta))

    def _refactor(self, experts: Iterable[int]) -> None:
        p = self.feature_dim + 1
        for e in experts:
            precision = self._gram[e] / self._sigma2[e] + self._delta[e] * np.eye(p)
            self._covariance[e] = spd_inverse(precision, f'GP precision of expert {e}')
            self._updates[e] = 0
            self._refresh_extra_weight(e)

    def _kernel_features(self, x: np.ndarray) -> np.ndarray:
        """The features the kernel sees: ``x`` itself, or its transform."""
        return x if self.feature_transform is None else self.feature_transform(x)

    def _prior_new_class_weight(self) -> np.ndarray:
        # A taught class's logit starts ``margin`` below the mean logit. Without a transform
        # that prior mean is linear in phi~ (these weights); with one it is not, so the
        # weights start at zero and _query adds the prior mean from the logits themselves.
        if self.feature_transform is not None:
            return np.zeros(self.feature_dim + 1)
        return np.append(self._weight.mean(0),
                         self._bias.mean() - self.config.new_class_margin)

    def _new_class_prior_mean(self, base_logits: np.ndarray) -> np.ndarray:
        """The prior mean of a taught class's logit that its weights do not carry."""
        if self.feature_transform is None:
            return np.zeros(base_logits.shape[:-1])
        return base_logits.mean(axis=-1) - self.config.new_class_margin

    def _new_class_residual(self, phi: np.ndarray, base_logits: np.ndarray) -> float:
        target = float(base_logits.max()) + self.config.new_class_margin
        prior = float(self._prior_new_class_weight() @ phi) + float(
            self._new_class_prior_mean(base_logits[:self.num_base_classes]))
        return target - prior

    def _refresh_extra_weight(self, e: int) -> None:
        if self._extra_residual.shape[1]:
            self._extra_weight[e] = self._prior_new_class_weight() + (
                self._extra_residual[e] @ self._covariance[e]) / self._sigma2[e]

    # ------------------------------------------------------------------ query

    def _require_fitted(self) -> None:
        if not self._fitted:
            raise ValueError('the NTK-GP is not fitted: call fit() or load() first')

    def _query_mean(self, features: Any, logits: Any = None,
                    expert: np.ndarray | None = None
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Return ``(logits (B, C), phi~ with its bias column (B, D+1), expert_id (B,))``;
        ``expert`` given: each row's expert as it was routed elsewhere."""
        self._require_fitted()
        x = check_matrix(features, 'features', self.feature_dim)
        b, d = x.shape
        c_base, c_all = self.num_base_classes, self.num_classes
        if logits is None:
            base = x @ self._weight.T + self._bias
        else:
            given = check_matrix(logits, 'logits')
            if given.shape[0] != b or given.shape[1] not in (c_base, c_all):
                raise ValueError(f'logits must have shape ({b}, {c_base}) or ({b}, {c_all}), '
                                 f'got {given.shape}')
            base = given.astype(np.float64)
        x = self._kernel_features(x)
        phi = np.empty((b, d + 1))
        phi[:, :d] = x
        phi[:, d] = 1.0
        if expert is None:
            expert = self._experts_of(x, base)
        full = base
        if base.shape[1] < c_all:
            extra = np.einsum('bp,bkp->bk', phi, self._extra_weight[expert]) \
                + self._new_class_prior_mean(base[:, :c_base])[:, None]
            full = np.concatenate([base, extra], axis=1)
        return full, phi, expert

    def _query(self, features: Any, logits: Any = None
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Return ``(logits (B, C), gp_variance (B,), expert_id (B,))``."""
        full, phi, expert = self._query_mean(features, logits)
        variance = expert_quadratic_forms(phi, expert, self._covariance)
        # A^{-1} is PSD, so negatives can only be round-off.
        np.maximum(variance, 0.0, out=variance)
        return full, variance, expert

    def gp_variance(self, features: np.ndarray) -> np.ndarray:
        """``(B,)`` GP variance ``phi~^T A_m^{-1} phi~`` of each row's expert."""
        with self._lock:
            return self._query(features)[1]

    def predict(self, features: np.ndarray, logits: np.ndarray | None = None,
                gp_output: tuple[np.ndarray, np.ndarray] | None = None) -> UncertaintyOutput:
        """Predictive summary of a batch of features.

        Parameters
        ----------
        features : np.ndarray
            ``(B, D)`` features ``phi`` (B may be 0).
        logits : np.ndarray, optional
            ``(B, C_base)`` or ``(B, C)`` network logits; default ``W phi + b``. Logits of
            classes taught online are appended from their Bayesian linear model.
        gp_output : tuple[np.ndarray, np.ndarray], optional
            ``(B,)`` GP variance and ``(B,)`` expert of each row, already computed from this
            GP's matrices (the CUDA graph's in-graph query, :func:`gp_variance_torch`): the
            variance is not computed again here, only the mean and the summaries.

        Raises
        ------
        ValueError
            Wrong shapes, non-finite values, an expert out of range, or an unfitted model.
        """
        with self._lock:
            if gp_output is None:
                mean, variance, expert = self._query(features, logits)
            else:
                variance, expert = self._checked_gp_output(gp_output, len(features))
                mean = self._query_mean(features, logits, expert)[0]
            c = mean.shape[1]
            draws = self._draws.get(c)
            if draws is None:
                draws = antithetic_normal_draws(self.config.entropy_samples, c,
                                                self.config.seed)
                self._draws[c] = draws
            probs, total, expected, mutual = summarise_gaussian_logits(
                mean, variance[:, None], draws, self.probit_lambda, self.temperature)
            class_variance = np.repeat(variance[:, None], c, axis=1)
            threshold = self.ood_threshold
            ood = variance > threshold if threshold is not None \
                else np.zeros(len(variance), dtype=bool)
            reference = self.score_reference
            score = None if reference is None else reference.score(score_signal(
                reference.signal, mean, variance, total, mutual, probs))
            scales = self.scale_gating
            if scales is not None:
                for s in range(scales.num_scales):
                    rows = expert == s
                    own_threshold, own_reference = scales.ood_thresholds[s], scales.references[s]
                    if own_threshold is not None:
                        ood[rows] = variance[rows] > own_threshold
                    if own_reference is not None and score is not None and rows.any():
                        score[rows] = own_reference.score(score_signal(
                            own_reference.signal, mean[rows], variance[rows], total[rows],
                            mutual[rows], probs[rows]))
            return UncertaintyOutput(mean, variance, class_variance, probs, total, expected,
                                     mutual, ood, expert.astype(np.int64), score)

    def _checked_gp_output(self, gp_output: tuple[np.ndarray, np.ndarray], rows: int
                           ) -> tuple[np.ndarray, np.ndarray]:
        variance = np.asarray(gp_output[0], dtype=np.float64)
        expert = np.asarray(gp_output[1])
        if variance.shape != (rows,) or expert.shape != (rows,):
            raise ValueError(f'gp_output must hold ({rows},) variances and experts, got '
                             f'{variance.shape} and {expert.shape}')
        if not (np.isfinite(variance).all() and (variance >= 0.0).all()):
            raise ValueError('gp_output variances must be finite and >= 0')
        if expert.dtype.kind not in 'iu' or (rows and not (
                0 <= expert.min() and expert.max() < self.num_experts)):
            raise ValueError(f'gp_output experts must be integers in [0, {self.num_experts})')
        return variance, expert.astype(np.int64)

    # ------------------------------------------------------------------ calibration

    def calibrate_ood(self, features: np.ndarray) -> float:
        """Set the OOD threshold to the ``ood_quantile`` of in-distribution GP variances.

        Inputs whose GP variance exceeds the threshold are flagged; by construction a
        fraction ``1 - ood_quantile`` of the calibration set is. With scale gating each
        scale with at least :data:`~uq_perception.ntk.scale_gating.MIN_SCALE_VALIDATION`
        rows also gets its own threshold
        (:func:`~uq_perception.ntk.calibration.fit_ood_thresholds`); the one returned is of
        all rows.
        """
        with self._lock:
            _, variance, expert = self._query(features)
            self.ood_threshold, self.scale_gating = fit_ood_thresholds(
                variance, expert, self.config.ood_quantile, self.scale_gating)
            return self.ood_threshold

    def calibrate_score(self, features: np.ndarray, split: str,
                        levels: int = DEFAULT_REFERENCE_LEVELS, signal: str = 'gp_variance',
                        logits: np.ndarray | None = None) -> ScoreReference:
        """Set the reference of the calibrated score from known validation objects.

        Parameters
        ----------
        features : np.ndarray
            ``(N, D)`` features of known objects the GP was not fitted on (the same ones
            as :meth:`calibrate_ood`'s, so the OOD threshold scores ``ood_quantile``).
        split : str
            Name of the data, stored as the reference's provenance.
        levels : int
            Number of stored quantiles.
        signal : str
            What the score ranks (:data:`~uq_perception.ntk.calibrated_score.SCORE_SIGNALS`):
            the GP variance, or a summary of the whole predictive ``N(logits, variance)``.
        logits : np.ndarray, optional
            The objects' network logits (default ``W phi + b``), for a predictive signal.

        With scale gating each scale with at least
        :data:`~uq_perception.ntk.scale_gating.MIN_SCALE_VALIDATION` rows also gets its own
        reference (:func:`~uq_perception.ntk.calibration.fit_score_references`); the one
        returned is of all rows.
        """
        with self._lock:
            self.score_reference, self.scale_gating = fit_score_references(
                self.predict(features, logits), split, self.model_id, levels, signal,
                self.scale_gating)
            return self.score_reference

    def calibrate_probabilities(self, features: np.ndarray, labels: np.ndarray,
                                logits: np.ndarray | None = None) -> tuple[float, float]:
        """Fit ``lambda`` and the temperature ``T`` by minimising validation NLL
        (:func:`~uq_perception.ntk.calibration.fit_probit_calibration`, from the current
        values).

        Returns
        -------
        tuple[float, float]
            ``(probit_lambda, temperature)``, also stored on the instance.
        """
        with self._lock:
            mean, variance, _ = self._query(features, logits)
            self.probit_lambda, self.temperature = fit_probit_calibration(
                mean, variance, labels, self.probit_lambda, self.temperature)
            return self.probit_lambda, self.temperature

    # ------------------------------------------------------------------ online learning

    def update(self, feature: np.ndarray, label: int, class_name: str | None = None,
               update_id: str | None = None, weight: float = 1.0) -> bool:
        """Add one labelled feature to its expert in O(D^2) (Sherman-Morrison).

        ``A^{-1} <- A^{-1} - u u^T / (sigma^2 + phi~^T u)``, ``u = A^{-1} phi~``; the Gram and
        class sums are updated too, so a later :meth:`fit` with ``keep_gating`` and
        ``keep_hyperparameters`` on the enlarged data gives the same posterior. Every
        256 updates of an expert its inverse is recomputed exactly to bound round-off.

        ``label == num_classes`` teaches a new class (named ``class_name``) with the
        Bayesian linear model described in the class docstring. The feature goes to the
        expert its gating selects (for class gating, the head's predicted base class).

        ``weight`` is the observation's precision relative to a training point: the update
        equals adding the feature ``weight`` times (the noise becomes ``sigma^2 / weight``),
        so a refit on the data with that multiplicity still gives the same posterior.

        Returns ``False``, changing nothing, when ``update_id`` names an update already
        applied (it is kept in :attr:`applied_updates` and saved with the state).
        """
        with self._lock:
            self._require_fitted()
            if update_id is not None and update_id in self.applied_updates:
                return False
            if not (math.isfinite(weight) and weight > 0):
                raise ValueError(f'weight must be finite and > 0, got {weight!r}')
            x = np.asarray(feature)
            if x.ndim == 2 and x.shape[0] == 1:
                x = x[0]
            if x.ndim != 1:
                raise ValueError(f'feature must have shape ({self.feature_dim},), got {x.shape}')
            x = check_matrix(x[None], 'feature', self.feature_dim)[0].astype(np.float64)
            if isinstance(label, bool) or not isinstance(label, (int, np.integer)):
                raise ValueError(f'label must be an integer, got {label!r}')
            label = int(label)
            if not 0 <= label <= self.num_classes:
                raise ValueError(f'label must lie in [0, {self.num_classes}] '
                                 f'({self.num_classes} teaches a new class), got {label}')
            if label == self.num_classes:
                self._add_class(class_name)
            elif class_name is not None and class_name != self.class_names[label]:
                raise ValueError(f'label {label} is {self.class_names[label]!r}, '
                                 f'not {class_name!r}')
            base_logits = x @ self._weight.T + self._bias
            x = self._kernel_features(x[None])[0]
            phi = np.append(x, 1.0)
            e = int(self._experts_of(x[None], base_logits[None])[0])
            cov = self._covariance[e]
            u = cov @ phi
            cov -= np.outer(u, u) / (self._sigma2[e] / weight + phi @ u)
            self._gram[e] += weight * np.outer(phi, phi)
            self._class_sums[e, :, label] += weight * phi
            if label >= self.num_base_classes:
                self._extra_residual[e, label - self.num_base_classes] += \
                    weight * phi * self._new_class_residual(phi, base_logits)
            self._updates[e] += 1
            if self._updates[e] >= _REFACTOR_EVERY:
                self._refactor([e])
            else:
                self._refresh_extra_weight(e)
            if self.config.gating is Gating.CLASS:
                self._update_class_centroids()
            if update_id is not None:
                self.applied_updates.append(update_id)
            return True

    def _add_class(self, class_name: str | None) -> None:
        name = f'class_{self.num_classes}' if class_name is None else str(class_name)
        if name in self.class_names:
            raise ValueError(f'class name {name!r} already exists')
        m, p = self.num_experts, self.feature_dim + 1
        self.class_names.append(name)
        self._class_sums = np.concatenate([self._class_sums, np.zeros((m, p, 1))], axis=2)
        self._extra_residual = np.concatenate([self._extra_residual, np.zeros((m, 1, p))], 1)
        self._extra_weight = np.concatenate(
            [self._extra_weight, np.broadcast_to(self._prior_new_class_weight(), (m, 1, p))], 1)
        logger.info('taught new class %r (index %d)', name, self.num_classes - 1)

    # ------------------------------------------------------------------ export

    def query_digest(self) -> str:
        """SHA-256 of everything the variance query reads (covariances, gating, feature
        transform): two GPs with the same digest give the same variance for every input."""
        with self._lock:
            self._require_fitted()
            arrays = {'covariance': self._covariance, 'centroids': self._centroids,
                      'gating': np.frombuffer(self.config.gating.value.encode(), np.uint8)}
            if self.feature_transform is not None:
                arrays['feature_transform'] = np.frombuffer(
                    repr(self.feature_transform.to_meta()).encode(), np.uint8)
                arrays['feature_transform_means'] = self.feature_transform.means_array()
            return arrays_digest(arrays)

    def gp_tensors(self, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
        """``centroids (M, D)`` and ``precision_inverse (M, D+1, D+1)`` tensors of ``dtype``
        (default float32)."""
        with self._lock:
            self._require_fitted()
            if self.config.gating is Gating.SCALE:
                raise ValueError('the in-graph GP query does not gate by scale: query this GP '
                                 'on the host (the CUDA graph runs the shipped CenterNet, '
                                 'whose GP has one scale)')
            if self.feature_transform is not None:
                raise ValueError('the in-graph GP query does not apply a feature transform: '
                                 'query this GP on the host (the CUDA graph runs the shipped '
                                 'CenterNet, whose GP has none)')
            import torch  # here: only the in-graph query uses it

            dtype = torch.float32 if dtype is None else dtype
            return {'centroids': torch.tensor(self._centroids, dtype=dtype),
                    'precision_inverse': torch.tensor(self._covariance, dtype=dtype)}

    # ------------------------------------------------------------------ persistence

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the state atomically (temporary file + rename) as an ``.npz`` archive
        (:func:`~uq_perception.ntk.persistence.save_model`)."""
        with self._lock:
            self._require_fitted()
            save_model(self, path)

    @classmethod
    def load(cls, path: str | os.PathLike[str], *, feature_dim: int | None = None,
             class_names: Sequence[str] | None = None,
             model_id: str | None = None) -> LastLayerNTKGP:
        """Read a state written by :meth:`save` and check it against the expected
        ``feature_dim``, ``class_names`` and ``model_id`` given
        (:func:`~uq_perception.ntk.persistence.load_model`: parameters and errors); say
        what a file written before box uncertainty or the calibrated score lacks."""
        model = load_model(cls, path, feature_dim=feature_dim, class_names=class_names,
                           model_id=model_id)
        if model.box_calibration is None:
            logger.info('%s has no box calibration (written before box uncertainty existed): '
                        'box_std is 0; refit the GP with `uq train --gp-only` to estimate it',
                        path)
        if model.score_reference is None:
            logger.info('%s has no score reference (written before the calibrated score '
                        'existed): calibrated_score is -1; add one with `python -m '
                        'uq_perception.training.score_reference`', path)
        return model

    def _state_arrays(self) -> dict[str, np.ndarray]:
        """The head and the posterior's sufficient statistics and hyperparameters, by their
        names in a state file."""
        return {'weight': self._weight, 'bias': self._bias, 'centroids': self._centroids,
                'gram': self._gram, 'class_sums': self._class_sums,
                'extra_residual': self._extra_residual, 'sigma2': self._sigma2,
                'delta': self._delta}

    def _restore_state_arrays(self, arrays: dict[str, np.ndarray]) -> None:
        """Rebuild the posterior from the statistics of :meth:`_state_arrays` (their shapes
        checked by the reader; the head went to the constructor), once the rest of the
        state (feature transform, scale gating) is set: the taught classes' weights and the
        gating depend on it."""
        m, extra, p = arrays['extra_residual'].shape
        self._centroids = arrays['centroids'].astype(np.float64)
        self._gram = arrays['gram'].astype(np.float64)
        self._class_sums = arrays['class_sums'].astype(np.float64)
        self._extra_residual = arrays['extra_residual'].astype(np.float64)
        self._extra_weight = np.zeros((m, extra, p))
        self._sigma2 = arrays['sigma2'].astype(np.float64)
        self._delta = arrays['delta'].astype(np.float64)
        self._covariance = np.zeros((m, p, p))
        self._updates = np.zeros(m, dtype=np.int64)
        self._check_scale_gating()
        self._refresh_gating_cache()
        self._refactor(range(m))
        self._fitted = True
