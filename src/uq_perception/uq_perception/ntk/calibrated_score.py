"""The calibrated score: a GP variance placed among known validation objects' (ROS-free).

A raw GP variance is in the units of one model's GP (logit^2 of its kernel and fitted
hyperparameters), so a threshold written for one model means nothing for another. The
calibrated score of a detection is the fraction of known validation objects whose GP
variance is below the detection's: 0.5 is a typical known object, 0.95 the boundary of the
5 % most uncertain known objects, 1 beyond every one of them, whatever the model.

The GP artefact stores the reference: the validation variances at evenly spaced quantile
levels ``0, 1/(K-1), ..., 1`` (linear interpolation between order statistics), with their
provenance (split, number of objects, model id). A score is the empirical distribution
function interpolated linearly in log-variance between those quantiles (variances spread
over orders of magnitude; their logarithm is where interpolation is even), 0 below the
smallest and 1 above the largest.

The signal behind the score is the GP variance unless the artefact names another (field
``signal``, :data:`SCORE_SIGNALS`): a summary of the GP's whole predictive ``N(logits, GP
variance)`` that ``uq gp fit`` chose because it separated the unknown objects it was given
better, on a detector whose features the variance alone reads poorly. Every signal is
non-negative, so the reference and the score are the same for each.

The reference is fixed when the artefact is written. Labels learnt online lower the GP
variance near what they teach, so a detection's score falls with them: a taught object
ends up scored like the known objects. A new fit of the GP (a new posterior) discards the
reference, which :meth:`LastLayerNTKGP.calibrate_score` computes again from validation data
(:mod:`uq_perception.training.score_reference` does it for an artefact on disk).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

# The message value of the score when the model has no reference (files written before it
# existed): outside [0, 1], so no threshold in score units can mistake it for a score.
NO_CALIBRATED_SCORE = -1.0
# Quantile levels stored by default: steps of 1 %, a 4 KB list in the artefact's metadata.
DEFAULT_REFERENCE_LEVELS = 101
MAX_REFERENCE_LEVELS = 10001
_MAX_TEXT = 200
#: Signals a score reference may rank, all of the GP's predictive ``N(logits, variance)``:
#: its variance; its predictive entropy ``H[E p]``; its mutual information (the epistemic
#: part of that entropy); ``1 - max E p``, one minus the predictive max probability; and one
#: minus the detector's confidence at the lower two-sigma quantile of its top logit, with
#: the detector's sigmoid or softmax (``predictive_lcb_*``): low where the logits say
#: unsure, lower still where the GP does; and the energy ``-logsumexp`` of the logits at
#: their lower two-sigma quantile, through a sigmoid to keep it in [0, 1]
#: (``predictive_lcb_energy``; the last-layer kernel gives every class the same variance,
#: so it ranks as the energy plus two standard deviations).
SCORE_SIGNALS = ('gp_variance', 'predictive_entropy', 'mutual_information',
                 'predictive_msp', 'predictive_lcb_sigmoid', 'predictive_lcb_softmax',
                 'predictive_lcb_energy')
#: Standard deviations below the mean of the logits at which ``predictive_lcb_*`` reads
#: the confidence or the energy (their 2.3 % quantile under the GP predictive).
LCB_SIGMAS = 2.0
# Least spread of the reference's variances, relative to the largest, that ranks detections.
MIN_RELATIVE_SPREAD = 1e-6
# Variances are floored here before the logarithm (an exact 0 has none).
_TINY_VARIANCE = 1e-300


@dataclass(frozen=True)
class ScoreReference:
    """GP variances of known validation objects at evenly spaced quantile levels.

    Attributes
    ----------
    variance_quantiles : tuple[float, ...]
        ``K >= 2`` non-decreasing, finite, non-negative variances at levels
        ``k / (K - 1)``; the first is the smallest validation variance, the last the
        largest.
    split : str
        Which data the variances come from (for example ``val``).
    count : int
        Number of validation objects.
    model_id : str
        The model (detector weights and GP) whose variances these are.
    signal : str
        What the quantiles are of (:data:`SCORE_SIGNALS`; the GP variance unless named).
    variance_maximum : float, optional
        The largest GP variance of the objects, for another signal than the variance (the
        model's range of raw variance, which raw thresholds are checked against).
    """

    variance_quantiles: tuple[float, ...]
    split: str
    count: int
    model_id: str
    signal: str = 'gp_variance'
    variance_maximum: float | None = None

    def __post_init__(self) -> None:
        q = self.variance_quantiles
        if not isinstance(q, tuple) or not 2 <= len(q) <= MAX_REFERENCE_LEVELS:
            raise ValueError(f'variance_quantiles must be a tuple of 2 to '
                             f'{MAX_REFERENCE_LEVELS} numbers, got {type(q).__name__} of '
                             f'{len(q) if hasattr(q, "__len__") else "no"} items')
        for value in q:
            if isinstance(value, bool) or not isinstance(value, numbers.Real) \
                    or not math.isfinite(value) or value < 0:
                raise ValueError(f'variance_quantiles must be finite numbers >= 0, got '
                                 f'{value!r:.40}')
        if any(b < a for a, b in zip(q[:-1], q[1:], strict=True)):
            raise ValueError('variance_quantiles must be non-decreasing')
        for name in ('split', 'model_id'):
            text = getattr(self, name)
            if not isinstance(text, str) or len(text) > _MAX_TEXT or not text.isprintable():
                raise ValueError(f'{name} must be a printable string of at most {_MAX_TEXT} '
                                 f'characters, got {text!r:.80}')
        if not self.split:
            raise ValueError('split must name the data of the reference')
        if self.signal not in SCORE_SIGNALS:
            raise ValueError(f'signal must be one of {", ".join(SCORE_SIGNALS)}, got '
                             f'{self.signal!r:.40}')
        if (self.signal == 'gp_variance') != (self.variance_maximum is None):
            raise ValueError('variance_maximum is given exactly when the signal is not the '
                             'GP variance')
        maximum = self.variance_maximum
        if maximum is not None and (isinstance(maximum, bool)
                                    or not isinstance(maximum, numbers.Real)
                                    or not math.isfinite(maximum) or maximum < 0):
            raise ValueError(f'variance_maximum must be a finite number >= 0, got '
                             f'{maximum!r:.40}')
        if isinstance(self.count, bool) or not isinstance(self.count, numbers.Integral) \
                or self.count < 1:
            raise ValueError(f'count must be an integer >= 1, got {self.count!r:.40}')

    @classmethod
    def from_variances(cls, variances: np.ndarray, split: str, model_id: str,
                       levels: int = DEFAULT_REFERENCE_LEVELS,
                       signal: str = 'gp_variance',
                       variance_maximum: float | None = None) -> ScoreReference:
        """The reference of ``variances``: the ``signal`` (by default the GP variance) of
        known validation objects.

        Raises
        ------
        ValueError
            If ``variances`` is empty, not one-dimensional, has non-finite or negative
            values, or ``levels`` is outside ``[2, MAX_REFERENCE_LEVELS]``.
        """
        v = np.asarray(variances, dtype=np.float64)
        if v.ndim != 1 or v.size == 0:
            raise ValueError(f'variances must be a non-empty 1-D array, got shape {v.shape}')
        if not np.isfinite(v).all() or (v < 0).any():
            raise ValueError('variances must be finite and >= 0')
        if isinstance(levels, bool) or not isinstance(levels, numbers.Integral) \
                or not 2 <= levels <= MAX_REFERENCE_LEVELS:
            raise ValueError(f'levels must be an integer in [2, {MAX_REFERENCE_LEVELS}], '
                             f'got {levels!r}')
        quantiles = np.quantile(v, np.linspace(0.0, 1.0, int(levels)))
        # Monotone by construction; max.accumulate removes interpolation round-off.
        quantiles = np.maximum.accumulate(quantiles)
        return cls(tuple(float(x) for x in quantiles), str(split), int(v.size), str(model_id),
                   signal, variance_maximum)

    @property
    def maximum(self) -> float:
        """The largest GP variance of the validation objects (for the variance signal, the
        score is 1 above it)."""
        if self.variance_maximum is not None:
            return self.variance_maximum
        return self.variance_quantiles[-1]

    def spread_problem(self) -> str | None:
        """Why the reference cannot rank detections, or None: validation variances that
        are all the same (a degenerate GP fit) leave scores and OOD flags to round-off."""
        lowest, highest = self.variance_quantiles[0], self.variance_quantiles[-1]
        if highest - lowest > MIN_RELATIVE_SPREAD * highest > 0.0:
            return None
        return (f'the {self.signal} values of the {self.count} {self.split} objects behind the '
                f'calibrated score are all {highest:.3g} (to 1 part in '
                f'{1 / MIN_RELATIVE_SPREAD:.0e}): scores and OOD flags cannot rank detections; '
                'refit the GP on more data')

    @cached_property
    def _interpolation_table(self) -> tuple[np.ndarray, np.ndarray]:
        # Log quantiles and their levels, built once: score() runs on every camera frame.
        xp = np.log(np.maximum(np.asarray(self.variance_quantiles), _TINY_VARIANCE))
        return xp, np.linspace(0.0, 1.0, len(xp))

    def score(self, variance: np.ndarray) -> np.ndarray:
        """``(B,)`` calibrated scores in ``[0, 1]`` of ``(B,)`` GP variances.

        Between stored quantiles the score is interpolated linearly in log-variance; at a
        run of equal quantiles (tied validation variances) it is the lowest level of the
        run, the fraction strictly below. Raises ``ValueError`` for non-finite or negative
        variances.
        """
        v = np.asarray(variance, dtype=np.float64)
        if not np.isfinite(v).all() or (v < 0).any():
            raise ValueError('variances must be finite and >= 0')
        xp, levels = self._interpolation_table
        x = np.log(np.maximum(v, _TINY_VARIANCE))
        # hi: first quantile above x; lo: first quantile at or above x. Strictly between
        # quantiles lo == hi and the score interpolates on the segment (hi - 1, hi).
        lo = np.searchsorted(xp, x, side='left')
        hi = np.searchsorted(xp, x, side='right')
        left = np.clip(hi - 1, 0, len(xp) - 2)
        span = xp[left + 1] - xp[left]
        fraction = np.divide(x - xp[left], span, out=np.zeros_like(x), where=span > 0)
        interpolated = levels[left] + np.clip(fraction, 0.0, 1.0) * (levels[left + 1]
                                                                      - levels[left])
        on_quantile = lo < hi
        out = np.where(on_quantile, levels[np.minimum(lo, len(xp) - 1)], interpolated)
        out[hi == 0] = 0.0
        out[lo == len(xp)] = 1.0
        return out

    def to_meta(self) -> dict[str, Any]:
        """JSON-ready form for the GP state's metadata."""
        meta = {'variance_quantiles': list(self.variance_quantiles), 'split': self.split,
                'count': self.count, 'model_id': self.model_id}
        # Only a signal other than the variance is written: a reader that predates the field
        # refuses such a file (its field check is exact) instead of misreading it, and still
        # reads the files of the default.
        if self.signal != 'gp_variance':
            meta.update(signal=self.signal, variance_maximum=self.variance_maximum)
        return meta

    @classmethod
    def from_meta(cls, meta: Any) -> ScoreReference:
        """Inverse of :meth:`to_meta`; every field checked (``ValueError`` names it)."""
        if not isinstance(meta, dict):
            raise ValueError(f'score_reference must be a JSON object, got {meta!r:.80}')
        expected = {'variance_quantiles', 'split', 'count', 'model_id'}
        if not expected <= set(meta) <= expected | {'signal', 'variance_maximum'}:
            raise ValueError(f'score_reference must have exactly the fields '
                             f'{sorted(expected)}, got {sorted(map(str, meta))}')
        quantiles = meta['variance_quantiles']
        if not isinstance(quantiles, list):
            raise ValueError(f'score_reference.variance_quantiles must be a list, got '
                             f'{quantiles!r:.80}')
        try:
            return cls(tuple(quantiles), meta['split'], meta['count'], meta['model_id'],
                       meta.get('signal', 'gp_variance'), meta.get('variance_maximum'))
        except ValueError as exc:
            raise ValueError(f'score_reference: {exc}') from None


def score_signal(signal: str, logits: np.ndarray, variance: np.ndarray, entropy: np.ndarray,
                 mutual: np.ndarray, probabilities: np.ndarray) -> np.ndarray:
    """The values of ``signal`` (``SCORE_SIGNALS``) from one query's predictive summary;
    ``logits`` are the predictive's mean."""
    if signal == 'gp_variance':
        return variance
    if signal == 'predictive_entropy':
        return np.maximum(entropy, 0.0)
    if signal == 'mutual_information':
        return np.maximum(mutual, 0.0)
    if signal == 'predictive_msp':
        return 1.0 - probabilities.max(axis=1, initial=0.0)
    if signal == 'predictive_lcb_energy':
        if not len(logits):
            return np.zeros(0)
        f = np.asarray(logits, np.float64)
        top = f.max(axis=1)
        log_sum_exp = top + np.log(np.exp(f - top[:, None]).sum(axis=1))
        # logsumexp(f - k sd) with one sd for every class: the energy's negative, lowered by
        # k sd; through a sigmoid so that, like every signal, it is non-negative.
        lowered = log_sum_exp - LCB_SIGMAS * np.sqrt(np.maximum(variance, 0.0))
        return 1.0 / (1.0 + np.exp(np.clip(lowered, -700, 700)))
    if signal in ('predictive_lcb_sigmoid', 'predictive_lcb_softmax'):
        if not len(logits):
            return np.zeros(0)
        f = np.asarray(logits, np.float64)
        top = f.argmax(axis=1)
        rows = np.arange(len(f))
        lowered = f[rows, top] - LCB_SIGMAS * np.sqrt(np.maximum(variance, 0.0))
        if signal == 'predictive_lcb_sigmoid':
            confidence = 0.5 * (1.0 + np.tanh(0.5 * lowered))
        else:
            others = f.copy()
            others[rows, top] = -np.inf
            rest = others.max(axis=1, keepdims=True)
            # softmax probability of the top class with its logit lowered, computed stably
            log_rest = (rest[:, 0] + np.log(np.exp(others - rest).sum(axis=1))
                        if f.shape[1] > 1 else np.full(len(f), -np.inf))
            confidence = 1.0 / (1.0 + np.exp(np.clip(log_rest - lowered, -700, 700)))
        return 1.0 - confidence
    raise ValueError(f'unknown score signal {signal!r}')
