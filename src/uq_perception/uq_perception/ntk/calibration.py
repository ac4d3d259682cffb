"""Calibration of a fitted NTK-GP on known validation objects (ROS-free).

Three settings are fitted on objects the GP was not fitted on, from the GP's own query of
them (:class:`~uq_perception.ntk.model.LastLayerNTKGP`'s ``calibrate_*`` methods query and
store what the functions here return):

- the OOD threshold, the ``ood_quantile`` of their GP variances (:func:`fit_ood_thresholds`);
- the reference of the calibrated score, quantiles of the signal it ranks
  (:func:`fit_score_references`, :mod:`uq_perception.ntk.calibrated_score`);
- the probit factor ``lambda`` and the temperature ``T`` of the class probabilities
  ``softmax(mu / sqrt(T^2 + lambda sigma^2))``, by validation NLL
  (:func:`fit_probit_calibration`).

With scale gating every scale with at least :data:`MIN_SCALE_VALIDATION` objects also gets
its own threshold and reference (:mod:`uq_perception.ntk.scale_gating`); the ones of all
objects are returned beside them.
"""

from __future__ import annotations

import math

import numpy as np

from uq_perception.ntk.calibrated_score import ScoreReference, score_signal
from uq_perception.ntk.config import UncertaintyOutput
from uq_perception.ntk.evidence import golden_section_minimum
from uq_perception.ntk.scale_gating import MIN_SCALE_VALIDATION, ScaleGating


def fit_ood_thresholds(variance: np.ndarray, expert: np.ndarray, quantile: float,
                       scales: ScaleGating | None) -> tuple[float, ScaleGating | None]:
    """The ``quantile`` of the ``(N,)`` GP variances, and ``scales`` with each scale's own.

    By construction a fraction ``1 - quantile`` of the objects is above the threshold.
    ``expert`` is each object's expert (its scale under scale gating).
    """
    if variance.size == 0:
        raise ValueError('calibrate_ood needs at least one feature row')
    threshold = float(np.quantile(variance, quantile))
    if scales is None:
        return threshold, None
    counts = np.bincount(expert, minlength=scales.num_scales)
    return threshold, scales.with_thresholds(
        [float(np.quantile(variance[expert == s], quantile))
         if counts[s] >= MIN_SCALE_VALIDATION else None
         for s in range(scales.num_scales)], counts.tolist())


def fit_score_references(out: UncertaintyOutput, split: str, model_id: str, levels: int,
                         signal: str, scales: ScaleGating | None
                         ) -> tuple[ScoreReference, ScaleGating | None]:
    """The score reference of the objects' ``signal`` from their predictive summary ``out``,
    and ``scales`` with each scale's own (its provenance ``<split> scale <s>``)."""
    values = score_signal(signal, out.logits, out.gp_variance, out.predictive_entropy,
                          out.mutual_information, out.probabilities)

    def reference(rows: np.ndarray | slice, provenance: str) -> ScoreReference:
        # Another signal than the variance keeps the model's range of raw variance beside it.
        return ScoreReference.from_variances(
            values[rows], provenance, model_id, levels, signal,
            None if signal == 'gp_variance' else float(np.max(out.gp_variance[rows])))

    overall = reference(slice(None), split)
    if scales is None:
        return overall, None
    counts = np.bincount(out.expert_id, minlength=scales.num_scales)
    return overall, scales.with_references(
        [reference(out.expert_id == s, f'{split} scale {s}')
         if counts[s] >= MIN_SCALE_VALIDATION else None
         for s in range(scales.num_scales)], counts.tolist())


def fit_probit_calibration(mean: np.ndarray, variance: np.ndarray, labels: np.ndarray,
                           probit_lambda: float, temperature: float) -> tuple[float, float]:
    """``(lambda, T)`` minimising the NLL of ``labels`` under
    ``softmax(mean / sqrt(T^2 + lambda variance))``.

    Alternating golden-section searches over ``log T`` in ``[-4, 4]`` and ``log lambda`` in
    ``[-12, 8]`` (plus ``lambda = 0``), three rounds from ``(probit_lambda, temperature)``.

    Parameters
    ----------
    mean : np.ndarray
        ``(N, C)`` logits of the GP posterior.
    variance : np.ndarray
        ``(N,)`` GP variances.
    labels : np.ndarray
        ``(N,)`` integer classes in ``[0, C)``, ``N >= 1``.
    """
    y = np.asarray(labels)
    if y.shape != (mean.shape[0],) or not np.issubdtype(y.dtype, np.integer) \
            or y.size == 0 or y.min() < 0 or y.max() >= mean.shape[1]:
        raise ValueError(f'labels must be {mean.shape[0]} integers in '
                         f'[0, {mean.shape[1]})')
    rows = np.arange(y.size)

    def nll(lam: float, temp: float) -> float:
        z = mean / np.sqrt(temp * temp + lam * variance)[:, None]
        z = z - z.max(axis=1, keepdims=True)
        log_norm = np.log(np.exp(z).sum(axis=1))
        return float((log_norm - z[rows, y]).mean())

    lam, temp = max(probit_lambda, 1e-6), temperature
    for _ in range(3):
        temp = math.exp(golden_section_minimum(
            lambda u, la=lam: nll(la, math.exp(u)), -4.0, 4.0))
        lam = math.exp(golden_section_minimum(
            lambda u, t=temp: nll(math.exp(u), t), -12.0, 8.0))
        if nll(0.0, temp) <= nll(lam, temp):
            lam = 0.0
    return lam, temp
