"""Function-space NTK-GP over any subset of a torch model's parameters (ROS-free).

Linearising ``f(x; theta) in R^C`` around the trained ``theta_hat`` over a chosen subset of
parameters, with prior ``theta - theta_hat ~ N(0, I / delta)`` on that subset, gives the
GP with kernel ``k(x, x') = J(x) J(x')^T / delta`` (``C x C`` blocks), ``J = df/dtheta``
computed per input with :mod:`torch.func`. Each expert ``m`` conditions on its ``N_m``
training points, all ``C`` logits observed with noise ``sigma_m^2``:

    Sigma_m(x*) = k(x*, x*) - k(x*, X_m) (K_m + sigma_m^2 I)^{-1} k(X_m, x*)
    (K_m: N_m C x N_m C).

For the last linear layer the kernel is ``(phi^T phi' + 1) / delta * I_C`` and this equals
the weight-space form of :class:`uq_perception.ntk.LastLayerNTKGP` exactly (Woodbury);
for other subsets the classes couple and the full ``C x C`` covariance is returned.

Gating and hyperparameters follow the weight-space engine: k-means on the input of the
model's last ``nn.Linear`` (or a given feature function) or the predicted class; ``(sigma^2,
delta)`` maximise the closed-form evidence of the centred one-hot targets, observed in an
orthonormal basis ``Q`` of the centred subspace (``C - 1`` coordinates per point, kernel
``Q^T k Q``), per expert by the same policy as the weight-space engine
(:func:`uq_perception.ntk.fit_expert_hyperparameters`, ``P / C`` parameters per class
standing for ``D + 1``). The cost is
O((N_m C)^3) per expert and the training Jacobians are kept, so expert size is capped
(``max_system_size`` rows ``N_m C``; larger experts are subsampled uniformly, with a
warning); use the weight-space engine for large data.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from enum import Enum

import numpy as np
import torch
from torch import nn
from torch.func import functional_call, jacrev, vmap

from uq_perception.ntk.config import Gating, NTKGPConfig, UncertaintyOutput
from uq_perception.ntk.evidence import SpectralEvidence, fit_expert_hyperparameters
from uq_perception.ntk.gating import kmeans
from uq_perception.ntk.linalg import spd_cholesky
from uq_perception.ntk.predictive import antithetic_normal_draws, summarise_gaussian_logits

logger = logging.getLogger(__name__)

_BATCH = 64
_DEFAULT_CONFIG = NTKGPConfig()


class ParameterSubset(str, Enum):
    """Named parameter subsets for the Jacobian."""

    LAST_LAYER = 'last_layer'
    ALL = 'all'


def _last_linear(model: nn.Module) -> tuple[str, nn.Linear]:
    found = [(name, mod) for name, mod in model.named_modules() if isinstance(mod, nn.Linear)]
    if not found:
        raise ValueError('the model has no nn.Linear layer; name the parameters and give a '
                         'gating feature function')
    return found[-1]


def centred_basis(num_classes: int) -> np.ndarray:
    """``(C, C-1)`` orthonormal basis ``Q`` of the subspace orthogonal to ``1``."""
    full = np.linalg.qr(np.eye(num_classes) - 1.0 / num_classes)[0]
    return full[:, :num_classes - 1]


def _evidence(jac: np.ndarray, targets: np.ndarray) -> SpectralEvidence:
    """Evidence statistics of targets ``(n,)`` with Jacobian rows ``(n, P)``.

    The Gram's nonzero eigenvalues are those of the smaller of ``J^T J`` and ``J J^T``.
    """
    n, p = jac.shape
    if p < n:
        return SpectralEvidence.from_gram(jac.T @ jac, (jac.T @ targets)[:, None],
                                          float(targets @ targets), n, 1)
    return SpectralEvidence.from_kernel(jac @ jac.T, targets[:, None])


class FunctionSpaceNTKGP:
    """Exact function-space NTK-GP experts with Jacobians over a parameter subset.

    Parameters
    ----------
    model : nn.Module
        Maps a batch of inputs to ``(B, C)`` logits; must be in eval mode (per-sample
        Jacobians need batch-independent outputs). It is not modified.
    parameters : ParameterSubset or Sequence[str]
        ``LAST_LAYER`` (default: weight and bias of the last ``nn.Linear``), ``ALL``, or
        parameter names of ``model.named_parameters()``.
    config : NTKGPConfig
        Gating, probit and seed settings shared with the weight-space engine.
    max_system_size : int
        Cap on ``N_m C``, the size of an expert's linear system.
    gating_features : callable, optional
        ``inputs -> (B, D)`` features for k-means gating; default the input of the last
        ``nn.Linear``.
    """

    def __init__(self, model: nn.Module,
                 parameters: ParameterSubset | Sequence[str] = ParameterSubset.LAST_LAYER,
                 config: NTKGPConfig = _DEFAULT_CONFIG, *, max_system_size: int = 4000,
                 gating_features: Callable[[torch.Tensor], torch.Tensor] | None = None
                 ) -> None:
        if model.training:
            raise ValueError('the model must be in eval mode (call model.eval())')
        if max_system_size < 1:
            raise ValueError(f'max_system_size must be positive, got {max_system_size}')
        if config.gating is Gating.SCALE:
            raise ValueError('the function-space form has no scale gating: use '
                             'LastLayerNTKGP for a multi-scale head')
        named = dict(model.named_parameters())
        if isinstance(parameters, str):
            subset = ParameterSubset(parameters)
            if subset is ParameterSubset.ALL:
                names = list(named)
            else:
                prefix = _last_linear(model)[0]
                names = [n for n in named
                         if (n.rsplit('.', 1)[0] if '.' in n else '') == prefix]
        else:
            names = list(parameters)
            unknown = [n for n in names if n not in named]
            if unknown or not names:
                raise ValueError(f'unknown or empty parameter names {unknown or names}')
        self.model = model
        self.config = config
        self.parameter_names = names
        self.max_system_size = int(max_system_size)
        self._params = {n: named[n].detach() for n in names}
        self._frozen = {n: t.detach() for n, t in named.items() if n not in self._params}
        self._frozen.update({n: b.detach() for n, b in model.named_buffers()})
        self._gating_features = gating_features
        self.num_parameters = sum(p.numel() for p in self._params.values())
        self._experts: list[dict[str, np.ndarray]] = []
        self._centroids = np.zeros((0, 0))
        self.sigma2 = np.zeros(0)
        self.delta = np.zeros(0)
        self.ood_threshold: float | None = None
        self.probit_lambda = float(config.probit_lambda)
        self.temperature = 1.0

    # ------------------------------------------------------------------ network pieces

    def _forward(self, inputs: torch.Tensor) -> tuple[np.ndarray, np.ndarray | None]:
        """Logits ``(B, C)`` and gating features ``(B, D)`` (None when not needed)."""
        need = self.config.gating is Gating.KMEANS and self.config.num_experts > 1
        captured: list[torch.Tensor] = []
        handle = None
        if need and self._gating_features is None:
            layer = _last_linear(self.model)[1]
            handle = layer.register_forward_hook(
                lambda _m, args, _out: captured.append(args[0].detach()))
        try:
            with torch.no_grad():
                logits = torch.cat([self.model(inputs[i:i + _BATCH])
                                    for i in range(0, len(inputs), _BATCH)])
                if need and self._gating_features is not None:
                    captured.append(self._gating_features(inputs))
        finally:
            if handle is not None:
                handle.remove()
        feats = torch.cat(captured).double().numpy() if need else None
        return logits.double().numpy(), feats

    def jacobian(self, inputs: torch.Tensor) -> np.ndarray:
        """``(B, C, P)`` float64 Jacobians of the logits w.r.t. the parameter subset."""
        def single(params: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
            out = functional_call(self.model, {**self._frozen, **params}, (x.unsqueeze(0),))
            return out.squeeze(0)

        per_sample = vmap(jacrev(single), in_dims=(None, 0))
        parts = []
        for i in range(0, len(inputs), _BATCH):
            jac = per_sample(self._params, inputs[i:i + _BATCH])
            b, c = next(iter(jac.values())).shape[:2]
            parts.append(torch.cat([jac[n].reshape(b, c, -1) for n in self.parameter_names],
                                   dim=2).double())
        return torch.cat(parts).numpy()

    # ------------------------------------------------------------------ fitting

    def fit(self, inputs: torch.Tensor, labels: np.ndarray | None = None, *,
            hyperparameters: tuple[float, float] | None = None) -> FunctionSpaceNTKGP:
        """Gate, cap and condition the experts; fit ``(sigma^2, delta)`` unless given.

        Parameters
        ----------
        inputs : torch.Tensor
            ``(N, ...)`` model inputs.
        labels : np.ndarray, optional
            ``(N,)`` integer labels (default: the model's predicted classes).
        hyperparameters : tuple[float, float], optional
            Fixed ``(sigma2, delta)`` shared by all experts.
        """
        logits, feats = self._forward(inputs)
        n, c = logits.shape
        y = logits.argmax(1) if labels is None else np.asarray(labels)
        if y.shape != (n,) or not np.issubdtype(y.dtype, np.integer) or y.min() < 0 \
                or y.max() >= c:
            raise ValueError(f'labels must be {n} integers in [0, {c})')
        if self.config.gating is Gating.CLASS:
            experts, m = logits.argmax(1), c
            self._centroids = np.zeros((c, 0))
        elif self.config.num_experts == 1:
            experts, m = np.zeros(n, dtype=np.int64), 1
        else:
            assert feats is not None
            m = self.config.num_experts
            sample = feats
            if n > self.config.kmeans_samples:
                rng = np.random.default_rng(self.config.seed)
                sample = feats[np.sort(rng.choice(n, self.config.kmeans_samples, False))]
            self._centroids = kmeans(sample, m, iterations=self.config.kmeans_iterations,
                                     seed=self.config.seed)
            experts = _nearest(feats, self._centroids)
        cap = max(self.max_system_size // c, 1)
        rng = np.random.default_rng(self.config.seed)
        q = centred_basis(c)
        targets = np.eye(c)[y] - 1.0 / c
        self._experts = []
        for e in range(m):
            rows = np.flatnonzero(experts == e)
            if rows.size > cap:
                logger.warning('expert %d has %d points; capped to %d (N_m C <= %d)',
                               e, rows.size, cap, self.max_system_size)
                rows = np.sort(rng.choice(rows, cap, replace=False))
            jac = self.jacobian(inputs[torch.from_numpy(rows)]) if rows.size else \
                np.zeros((0, c, self.num_parameters))
            self._experts.append({'jac': jac, 'targets': targets[rows], 'labels': y[rows]})
        self._fit_hyperparameters(q, hyperparameters)
        for e, expert in enumerate(self._experts):
            jac = expert['jac'].reshape(-1, self.num_parameters)
            system = jac @ jac.T / self.delta[e] + self.sigma2[e] * np.eye(len(jac))
            # Kept as a Cholesky factor: queries solve with it (k*^T (K + s^2 I)^-1 k* =
            # |L^-1 k*|^2); an explicit inverse loses the variance to cancellation when the
            # system is ill-conditioned.
            expert['cholesky'] = spd_cholesky(system, f'function-space system of expert {e}') \
                if len(jac) else np.zeros((0, 0))
        return self

    def _fit_hyperparameters(self, q: np.ndarray,
                             fixed: tuple[float, float] | None) -> None:
        m = len(self._experts)
        if fixed is not None:
            if not all(math.isfinite(v) and v > 0 for v in fixed):
                raise ValueError(f'hyperparameters must be finite and > 0, got {fixed}')
            self.sigma2, self.delta = np.full(m, fixed[0]), np.full(m, fixed[1])
            return
        # Observed coordinates: Q^T y per point, Jacobian rows Q^T J.
        projected = []
        for expert in self._experts:
            jac = np.einsum('ck,ncp->nkp', q, expert['jac']).reshape(-1, self.num_parameters)
            projected.append((jac, (expert['targets'] @ q).reshape(-1)))
        blocks = [_evidence(j, t) if len(t) else
                  SpectralEvidence(np.zeros(0), np.zeros(0), 0.0, 0, 1) for j, t in projected]
        pooled = _evidence(np.concatenate([j for j, _ in projected]),
                           np.concatenate([t for _, t in projected]))
        self.sigma2, self.delta, _ = fit_expert_hyperparameters(
            blocks, pooled, [len(e['labels']) for e in self._experts],
            [np.unique(e['labels']).size for e in self._experts],
            self.num_parameters // q.shape[0], self.config.shared_noise)

    # ------------------------------------------------------------------ query

    def predict_covariance(self, inputs: torch.Tensor
                           ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(logits (B, C), covariance (B, C, C), expert_id (B,))`` for a batch."""
        if not self._experts:
            raise ValueError('the function-space NTK-GP is not fitted: call fit() first')
        logits, feats = self._forward(inputs)
        if self.config.gating is Gating.CLASS:
            experts = logits.argmax(1)
        elif len(self._experts) == 1:
            experts = np.zeros(len(logits), dtype=np.int64)
        else:
            assert feats is not None
            experts = _nearest(feats, self._centroids)
        jac = self.jacobian(inputs)
        cov = np.empty((len(logits), logits.shape[1], logits.shape[1]))
        for e in np.unique(experts):
            rows = np.flatnonzero(experts == e)
            expert = self._experts[e]
            prior = np.einsum('bcp,bdp->bcd', jac[rows], jac[rows]) / self.delta[e]
            train = expert['jac'].reshape(-1, self.num_parameters)
            if len(train):
                cross = jac[rows] @ train.T / self.delta[e]
                b, c = cross.shape[:2]
                solved = torch.linalg.solve_triangular(
                    torch.from_numpy(expert['cholesky']),
                    torch.from_numpy(np.ascontiguousarray(cross.reshape(b * c, -1).T)),
                    upper=False).numpy().T.reshape(b, c, -1)
                prior -= np.einsum('bcn,bdn->bcd', solved, solved)
            cov[rows] = 0.5 * (prior + prior.transpose(0, 2, 1))
        return logits, cov, experts

    def predict(self, inputs: torch.Tensor) -> UncertaintyOutput:
        """Predictive summary (same fields and conventions as the weight-space engine).

        ``class_variance`` is the diagonal of the class covariance (clipped at 0),
        ``gp_variance`` its mean over classes; the entropy draws use the full covariance.
        """
        logits, cov, experts = self.predict_covariance(inputs)
        c = logits.shape[1]
        class_variance = np.maximum(np.diagonal(cov, axis1=1, axis2=2), 0.0).copy()
        gp_variance = class_variance.mean(axis=1)
        draws = antithetic_normal_draws(self.config.entropy_samples, c, self.config.seed)
        probs, total, expected, mutual = summarise_gaussian_logits(
            logits, class_variance, draws, self.probit_lambda, self.temperature,
            covariance=cov)
        threshold = self.ood_threshold
        ood = gp_variance > threshold if threshold is not None \
            else np.zeros(len(gp_variance), dtype=bool)
        return UncertaintyOutput(logits, gp_variance, class_variance, probs, total, expected,
                                 mutual, ood, experts.astype(np.int64))

    def calibrate_ood(self, inputs: torch.Tensor) -> float:
        """Set the OOD threshold to the ``ood_quantile`` of in-distribution GP variances."""
        variance = self.predict(inputs).gp_variance
        self.ood_threshold = float(np.quantile(variance, self.config.ood_quantile))
        return self.ood_threshold


def _nearest(x: np.ndarray, centroids: np.ndarray) -> np.ndarray:
    return np.argmin((centroids * centroids).sum(1) - 2.0 * x @ centroids.T, axis=1)
