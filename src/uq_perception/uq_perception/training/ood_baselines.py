"""The standard post-hoc out-of-distribution scores of a detector, beside the GP (ROS-free).

Every uncertainty report puts the GP beside what a user could compute from the same
detections without it, so the report shows what the GP adds on their model:

- **MSP**: ``1 - max_c p_c``, with the detector's own activation (softmax or sigmoid);
- **max logit**: ``-max_c f_c``;
- **energy**: ``-logsumexp_c f_c``;
- **Mahalanobis**: ``min_c (phi - mu_c)^T S^-1 (phi - mu_c)`` with class means ``mu_c`` and
  one covariance ``S`` shared by the classes (tied), fitted on the known training objects;
- **KNN**: the distance from ``phi / ||phi||`` to its k-th nearest known training feature,
  also normalised (k = 50, or fewer training objects).

Every score is "higher means more likely unknown". Each is judged by the AUROC of known
against unknown objects and by the FPR at 95 % TPR: the share of unknown objects that pass
as known at the threshold that keeps 95 % of the known ones.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from uq_perception.training.metrics import auroc

#: Neighbours of the KNN score (Sun et al. 2022 use k = 50 on ImageNet-scale banks).
DEFAULT_KNN_K = 50
#: Ridge added to the tied covariance, relative to its mean eigenvalue: features of a
#: detector often live in fewer dimensions than they have (switched-off channels).
COVARIANCE_RIDGE = 1e-6
#: Scores in the order of every report.
BASELINES = ('msp', 'max_logit', 'energy', 'mahalanobis', 'knn')
_MIN_NORM = 1e-12


def _logsumexp(logits: np.ndarray) -> np.ndarray:
    top = logits.max(axis=1, keepdims=True)
    return (top + np.log(np.exp(logits - top).sum(axis=1, keepdims=True)))[:, 0]


def msp_score(logits: np.ndarray, activation: str) -> np.ndarray:
    """``1 - max_c p_c``, ``p = softmax(f)`` or ``sigmoid(f)`` as the detector scores."""
    from uq_perception.detectors.onnx_feature_tap import ScoreActivation, activate

    if activation not in ('softmax', 'sigmoid'):
        raise ValueError(f'activation must be softmax or sigmoid, got {activation!r}')
    return 1.0 - activate(np.asarray(logits, np.float64), ScoreActivation(activation)).max(axis=1)


def max_logit_score(logits: np.ndarray) -> np.ndarray:
    return -np.asarray(logits, np.float64).max(axis=1)


def energy_score(logits: np.ndarray) -> np.ndarray:
    return -_logsumexp(np.asarray(logits, np.float64))


@dataclass(frozen=True)
class FeatureBank:
    """What the feature-space scores need from the known training objects."""

    class_means: np.ndarray      # (K, D) means of the classes present
    tied_precision: np.ndarray   # (D, D) inverse of the shared covariance (with ridge)
    normalised: np.ndarray       # (N, D) training features on the unit sphere
    k: int

    @classmethod
    def fitted(cls, features: np.ndarray, labels: np.ndarray,
               k: int = DEFAULT_KNN_K) -> FeatureBank:
        """Fit on known training objects' ``phi`` and class indices.

        Raises
        ------
        ValueError
            With fewer than two objects, or features that are not finite.
        """
        x = np.asarray(features, np.float64)
        y = np.asarray(labels)
        if x.ndim != 2 or x.shape[0] < 2 or y.shape != (x.shape[0],):
            raise ValueError(f'need at least 2 training objects with labels, got features '
                             f'{x.shape} and labels {y.shape}')
        if not np.isfinite(x).all():
            raise ValueError('training features must be finite')
        classes = np.unique(y)
        means = np.stack([x[y == c].mean(axis=0) for c in classes])
        centred = x - means[np.searchsorted(classes, y)]
        covariance = centred.T @ centred / x.shape[0]
        ridge = COVARIANCE_RIDGE * max(float(np.trace(covariance)) / x.shape[1], _MIN_NORM)
        precision = np.linalg.pinv(covariance + ridge * np.eye(x.shape[1]), hermitian=True)
        return cls(means, precision, _unit(x), int(min(max(k, 1), x.shape[0])))

    def mahalanobis(self, features: np.ndarray) -> np.ndarray:
        """Squared Mahalanobis distance to the nearest class mean."""
        x = np.asarray(features, np.float64)
        if not len(x):
            return np.zeros(0)
        diff = x[:, None, :] - self.class_means[None]
        return np.einsum('nkd,de,nke->nk', diff, self.tied_precision, diff).min(axis=1)

    def knn(self, features: np.ndarray) -> np.ndarray:
        """Euclidean distance of the normalised feature to its k-th nearest training one."""
        x = _unit(np.asarray(features, np.float64))
        if not len(x):
            return np.zeros(0)
        # |a - b|^2 = 2 - 2 a.b on the unit sphere.
        similarity = x @ self.normalised.T
        kth = np.partition(-similarity, self.k - 1, axis=1)[:, self.k - 1]
        return np.sqrt(np.maximum(2.0 + 2.0 * kth, 0.0))


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), _MIN_NORM)


def baseline_scores(logits: np.ndarray, features: np.ndarray, bank: FeatureBank,
                    activation: str) -> dict[str, np.ndarray]:
    """Every post-hoc score of :data:`BASELINES` for the same detections."""
    return {'msp': msp_score(logits, activation), 'max_logit': max_logit_score(logits),
            'energy': energy_score(logits), 'mahalanobis': bank.mahalanobis(features),
            'knn': bank.knn(features)}


def fpr_at_95_tpr(known: np.ndarray, unknown: np.ndarray) -> float:
    """Share of unknown objects scored at or below the 95 % quantile of the known ones'
    scores (the threshold that keeps 95 % of the known objects as known)."""
    known, unknown = np.asarray(known, np.float64), np.asarray(unknown, np.float64)
    if not known.size or not unknown.size:
        raise ValueError('both known and unknown scores are needed')
    threshold = np.quantile(known, 0.95)
    return float(np.mean(unknown <= threshold))


def score_table(known: Mapping[str, np.ndarray], unknown: Mapping[str, np.ndarray]
                ) -> list[dict[str, Any]]:
    """AUROC and FPR95 of each score, in the order given: one row per score."""
    rows: list[dict[str, Any]] = []
    for name, known_scores in known.items():
        unknown_scores = unknown[name]
        if not len(known_scores) or not len(unknown_scores):
            rows.append({'score': name, 'auroc': None, 'fpr95': None})
            continue
        targets = np.r_[np.zeros(len(known_scores), bool), np.ones(len(unknown_scores), bool)]
        rows.append({'score': name,
                     'auroc': round(auroc(np.r_[known_scores, unknown_scores], targets), 4),
                     'fpr95': round(fpr_at_95_tpr(known_scores, unknown_scores), 4)})
    return rows


def format_table(rows: list[dict[str, Any]]) -> str:
    """The rows as aligned text, one score a line, for a command's output."""
    width = max(len(r['score']) for r in rows)
    lines = [f'  {"score".ljust(width)}  AUROC   FPR95']
    for r in rows:
        auc = '   -  ' if r['auroc'] is None else f'{r["auroc"]:.4f}'
        fpr = '  -' if r['fpr95'] is None else f'{r["fpr95"]:.3f}'
        lines.append(f'  {r["score"].ljust(width)}  {auc}  {fpr}')
    return '\n'.join(lines)
