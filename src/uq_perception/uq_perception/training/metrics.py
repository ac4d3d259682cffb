"""Calibration and uncertainty-quality metrics on plain numpy arrays (ROS-free).

All functions take class probabilities of shape ``(N, C)`` and integer labels of shape
``(N,)``, or scores and binary labels of shape ``(N,)``, and return Python floats. Inputs
are validated: wrong shapes, non-finite values and degenerate label sets raise
``ValueError`` rather than returning a misleading number.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

__all__ = [
    'accuracy',
    'aupr',
    'auroc',
    'brier',
    'ece',
    'nll',
    'reliability_bins',
]


def _probabilities_and_labels(
    probabilities: ArrayLike, labels: ArrayLike
) -> tuple[NDArray[np.float64], NDArray[np.int64]]:
    probs = np.asarray(probabilities, dtype=np.float64)
    labs = np.asarray(labels)
    if probs.ndim != 2 or probs.shape[0] == 0:
        raise ValueError(f'probabilities must have shape (N, C) with N > 0, got {probs.shape}')
    if labs.shape != (probs.shape[0],):
        raise ValueError(
            f'labels must have shape ({probs.shape[0]},) to match probabilities, got {labs.shape}')
    if not np.all(np.isfinite(probs)):
        raise ValueError('probabilities contain non-finite values')
    if not np.issubdtype(labs.dtype, np.integer):
        raise ValueError(f'labels must be integers, got dtype {labs.dtype}')
    if labs.min() < 0 or labs.max() >= probs.shape[1]:
        raise ValueError(f'labels must lie in [0, {probs.shape[1]}), got [{labs.min()}, '
                         f'{labs.max()}]')
    return probs, labs.astype(np.int64)


def _scores_and_targets(
    scores: ArrayLike, targets: ArrayLike
) -> tuple[NDArray[np.float64], NDArray[np.bool_]]:
    s = np.asarray(scores, dtype=np.float64)
    t = np.asarray(targets)
    if s.ndim != 1 or t.shape != s.shape:
        raise ValueError(f'scores and targets must be 1-D of equal length, got {s.shape} and '
                         f'{t.shape}')
    if not np.all(np.isfinite(s)):
        raise ValueError('scores contain non-finite values')
    if t.dtype != np.bool_:
        if not np.all((t == 0) | (t == 1)):
            raise ValueError('targets must be boolean or 0/1')
        t = t.astype(bool)
    n_pos = int(t.sum())
    if n_pos == 0 or n_pos == t.size:
        raise ValueError('targets must contain both positives and negatives')
    return s, t


def accuracy(probabilities: ArrayLike, labels: ArrayLike) -> float:
    """Fraction of samples whose most probable class is the label.

    Parameters
    ----------
    probabilities : array_like, shape (N, C)
        Predicted class probabilities (or any scores; only the argmax is used).
    labels : array_like of int, shape (N,)
        True class indices.

    Returns
    -------
    float
        Accuracy in [0, 1].
    """
    probs, labs = _probabilities_and_labels(probabilities, labels)
    return float(np.mean(np.argmax(probs, axis=1) == labs))


def nll(probabilities: ArrayLike, labels: ArrayLike, eps: float = 1e-12) -> float:
    """Mean negative log-likelihood of the true class.

    Parameters
    ----------
    probabilities : array_like, shape (N, C)
        Predicted class probabilities.
    labels : array_like of int, shape (N,)
        True class indices.
    eps : float
        Floor on the probability of the true class, so one confident mistake gives a large
        but finite penalty (``-log(eps)``) instead of infinity.

    Returns
    -------
    float
        Mean of ``-log(max(p[label], eps))``, in nats.
    """
    probs, labs = _probabilities_and_labels(probabilities, labels)
    p_true = probs[np.arange(labs.size), labs]
    return float(-np.mean(np.log(np.maximum(p_true, eps))))


def brier(probabilities: ArrayLike, labels: ArrayLike) -> float:
    """Multi-class Brier score: mean over samples of ``sum_c (p_c - y_c)^2``.

    Parameters
    ----------
    probabilities : array_like, shape (N, C)
        Predicted class probabilities.
    labels : array_like of int, shape (N,)
        True class indices.

    Returns
    -------
    float
        Brier score in [0, 2] (0 is perfect).
    """
    probs, labs = _probabilities_and_labels(probabilities, labels)
    onehot = np.zeros_like(probs)
    onehot[np.arange(labs.size), labs] = 1.0
    return float(np.mean(np.sum((probs - onehot) ** 2, axis=1)))


def reliability_bins(
    probabilities: ArrayLike, labels: ArrayLike, n_bins: int = 15
) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.int64]]:
    """Confidence histogram behind the ECE and the reliability diagram.

    Confidence is the top-class probability; bins are ``n_bins`` equal-width intervals
    ``(k/n_bins, (k+1)/n_bins]`` (the first also includes 0).

    Parameters
    ----------
    probabilities : array_like, shape (N, C)
        Predicted class probabilities.
    labels : array_like of int, shape (N,)
        True class indices.
    n_bins : int
        Number of equal-width confidence bins.

    Returns
    -------
    mean_confidence : ndarray, shape (n_bins,)
        Mean confidence per bin (NaN for empty bins).
    bin_accuracy : ndarray, shape (n_bins,)
        Accuracy per bin (NaN for empty bins).
    counts : ndarray of int, shape (n_bins,)
        Number of samples per bin.
    """
    if n_bins < 1:
        raise ValueError(f'n_bins must be >= 1, got {n_bins}')
    probs, labs = _probabilities_and_labels(probabilities, labels)
    confidence = probs.max(axis=1)
    correct = (probs.argmax(axis=1) == labs).astype(np.float64)
    # Right-closed bins on linspace edges (as in the usual ECE definition): a confidence of
    # exactly an edge value goes to the bin below it, 1.0 to the last bin. Comparing with
    # the edges rather than computing ceil(conf * n_bins) keeps e.g. 0.7 out of (0.7, 0.8].
    edges = np.linspace(0.0, 1.0, n_bins + 1)
    index = np.searchsorted(edges[1:-1], confidence, side='left').astype(np.int64)
    counts = np.bincount(index, minlength=n_bins).astype(np.int64)
    conf_sum = np.bincount(index, weights=confidence, minlength=n_bins)
    correct_sum = np.bincount(index, weights=correct, minlength=n_bins)
    with np.errstate(invalid='ignore', divide='ignore'):
        mean_confidence = np.where(counts > 0, conf_sum / counts, np.nan)
        bin_accuracy = np.where(counts > 0, correct_sum / counts, np.nan)
    return mean_confidence, bin_accuracy, counts


def ece(probabilities: ArrayLike, labels: ArrayLike, n_bins: int = 15) -> float:
    """Expected calibration error of the top-class confidence.

    ``ECE = sum_k (n_k / N) |acc_k - conf_k|`` over ``n_bins`` equal-width bins
    (see :func:`reliability_bins`).

    Parameters
    ----------
    probabilities : array_like, shape (N, C)
        Predicted class probabilities.
    labels : array_like of int, shape (N,)
        True class indices.
    n_bins : int
        Number of equal-width confidence bins (15 is the common choice).

    Returns
    -------
    float
        ECE in [0, 1].
    """
    mean_confidence, bin_accuracy, counts = reliability_bins(probabilities, labels, n_bins)
    filled = counts > 0
    gaps = np.abs(bin_accuracy[filled] - mean_confidence[filled])
    return float(np.sum(counts[filled] * gaps) / counts.sum())


def auroc(scores: ArrayLike, targets: ArrayLike) -> float:
    """Area under the ROC curve of ``scores`` for detecting ``targets``.

    Computed exactly as the Mann-Whitney statistic: the probability that a random positive
    scores higher than a random negative, ties counting one half.

    Parameters
    ----------
    scores : array_like, shape (N,)
        Higher means "more likely positive" (e.g. an uncertainty score).
    targets : array_like of bool or 0/1, shape (N,)
        True for positives (e.g. out-of-distribution inputs); both classes must occur.

    Returns
    -------
    float
        AUROC in [0, 1]; 0.5 is chance.
    """
    s, t = _scores_and_targets(scores, targets)
    # Mid-ranks make tied scores count one half, as the AUROC definition requires.
    order = np.argsort(s, kind='mergesort')
    sorted_scores = s[order]
    ranks = np.empty(s.size, dtype=np.float64)
    _, first, counts = np.unique(sorted_scores, return_index=True, return_counts=True)
    mid = first + (counts - 1) / 2.0 + 1.0
    ranks[order] = np.repeat(mid, counts)
    n_pos = float(t.sum())
    n_neg = float(t.size - t.sum())
    return float((ranks[t].sum() - n_pos * (n_pos + 1.0) / 2.0) / (n_pos * n_neg))


def aupr(scores: ArrayLike, targets: ArrayLike) -> float:
    """Area under the precision-recall curve (average precision) with positives = ``targets``.

    ``AP = sum_k (R_k - R_{k-1}) P_k`` over the distinct score thresholds in decreasing
    order, so tied scores enter together (no interpolation).

    Parameters
    ----------
    scores : array_like, shape (N,)
        Higher means "more likely positive".
    targets : array_like of bool or 0/1, shape (N,)
        True for positives; both classes must occur.

    Returns
    -------
    float
        Average precision in [0, 1]; chance level is the fraction of positives.
    """
    s, t = _scores_and_targets(scores, targets)
    order = np.argsort(-s, kind='mergesort')
    sorted_scores = s[order]
    tp = np.cumsum(t[order]).astype(np.float64)
    # Evaluate only at the last index of each run of equal scores: a threshold cannot
    # split tied samples.
    last_of_run = np.r_[np.nonzero(np.diff(sorted_scores))[0], s.size - 1]
    tp = tp[last_of_run]
    predicted = last_of_run + 1.0
    precision = tp / predicted
    recall = tp / tp[-1]
    recall_step = np.diff(np.r_[0.0, recall])
    return float(np.sum(recall_step * precision))
