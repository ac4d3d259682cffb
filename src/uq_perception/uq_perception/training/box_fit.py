"""Fitting and checking the box uncertainty on labelled data (ROS-free).

:mod:`uq_perception.box_uncertainty` turns a GP variance into published box standard
deviations on the robot; this module fits the calibration it reads
(:mod:`uq_perception.ntk.box_calibration`) on validation detections, and measures the
coverage of the result on test data.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from uq_perception.box_uncertainty import BOX_COORDINATES, HEAD_COORDINATES, box_std, cell_size
from uq_perception.ntk.box_calibration import BoxCalibration, fit_box_calibration

if TYPE_CHECKING:
    from uq_perception.detectors.centernet import CenterNetDetector
    from uq_perception.ntk import LastLayerNTKGP
    from uq_perception.training.detector_data import DetectionSplit

# Share of a Gaussian within +-1 and +-2 standard deviations: the ideal coverage.
IDEAL_COVERAGE = {1: 0.6827, 2: 0.9545}
# Fewest matched validation detections to fit a calibration on.
MIN_CALIBRATION_BOXES = 20


def head_residuals(predicted: np.ndarray, truth: np.ndarray,
                   cells: tuple[float, float]) -> np.ndarray:
    """``(N, 4)`` truth minus prediction in the head's parametrisation (cells, log size).

    Raises
    ------
    ValueError
        If the boxes are not ``(N, 4)`` finite with positive width and height.
    """
    p = np.asarray(predicted, dtype=np.float64)
    t = np.asarray(truth, dtype=np.float64)
    if p.shape != t.shape or p.ndim != 2 or p.shape[1] != 4:
        raise ValueError(f'predicted and truth boxes must both be (N, 4), got {p.shape} and '
                         f'{t.shape}')
    if not (np.isfinite(p).all() and np.isfinite(t).all()
            and (p[:, 2:] > 0).all() and (t[:, 2:] > 0).all()):
        raise ValueError('boxes must be finite with positive width and height')
    return np.column_stack([(t[:, 0] - p[:, 0]) / cells[0], (t[:, 1] - p[:, 1]) / cells[1],
                            np.log(t[:, 2] / p[:, 2]), np.log(t[:, 3] / p[:, 3])])


def coverage(predicted: np.ndarray, std: np.ndarray, truth: np.ndarray,
             multiples: Sequence[int] = (1, 2)) -> dict[str, Any]:
    """Share of true coordinates within ``+-k std`` of the prediction, per coordinate and all.

    Returns
    -------
    dict
        ``objects``; ``within_{k}_sigma``: ``{coordinate: share, 'all': share}``;
        ``ideal``; ``mean_std_px`` and ``rms_error_px`` per coordinate. Shares are ``None``
        without objects.
    """
    p, s, t = (np.asarray(a, dtype=np.float64).reshape(-1, 4) for a in (predicted, std, truth))
    if not p.shape == s.shape == t.shape:
        raise ValueError(f'predicted, std and truth must have the same (N, 4) shape, got '
                         f'{p.shape}, {s.shape}, {t.shape}')
    error = np.abs(t - p)
    n = p.shape[0]
    result: dict[str, Any] = {'objects': int(n)}
    for k in multiples:
        inside = error <= k * s
        shares = {name: float(inside[:, j].mean()) if n else None
                  for j, name in enumerate(BOX_COORDINATES)}
        shares['all'] = float(inside.mean()) if n else None
        result[f'within_{k}_sigma'] = shares
    result['ideal'] = {f'within_{k}_sigma': IDEAL_COVERAGE.get(k) for k in multiples}
    result['mean_std_px'] = {name: float(s[:, j].mean()) if n else None
                             for j, name in enumerate(BOX_COORDINATES)}
    result['rms_error_px'] = {name: float(np.sqrt((error[:, j] ** 2).mean())) if n else None
                              for j, name in enumerate(BOX_COORDINATES)}
    # Moments of error / std (1 and 0 for Gaussian errors with the stated std); undefined
    # where a std is 0 (not estimated).
    usable = n > 0 and bool((s > 0).all())
    z = error / np.where(s > 0, s, 1.0)
    squares = (z ** 2).mean(axis=0) if usable else np.zeros(4)
    result['normalised_mean_square'] = {
        name: float(squares[j]) if usable else None for j, name in enumerate(BOX_COORDINATES)}
    result['normalised_excess_kurtosis'] = {
        name: float((z[:, j] ** 4).mean() / squares[j] ** 2 - 3.0)
        if usable and squares[j] > 0 else None for j, name in enumerate(BOX_COORDINATES)}
    return result


def matched_boxes(model: CenterNetDetector, gp: LastLayerNTKGP, split: DetectionSplit,
                  score_threshold: float, max_detections: int, progress: bool = False
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Detections of ``split`` matched (IoU >= 0.5) to objects that are not ignored.

    Returns ``(predicted (N, 4), truth (N, 4), gp_variance (N,), labels (N,))``, boxes in
    the split's (the model's input) pixels, labels those of the matched objects (-1 for
    unknown objects).
    """
    from uq_perception.training.detection_metrics import match_detections
    from uq_perception.training.detection_scoring import IOU_THRESHOLD, predict_split

    detections = predict_split(model, split, score_threshold, max_detections,
                               progress=progress)
    predicted, truth, variance, labels = [], [], [], []
    for i, dets in enumerate(detections):
        if not len(dets):
            continue
        matched, ignored = match_detections(dets.boxes, dets.scores, split.boxes[i],
                                            IOU_THRESHOLD, split.hard(i))
        keep = np.flatnonzero((matched >= 0) & ~ignored)
        if keep.size == 0:
            continue
        predicted.append(dets.boxes[keep])
        truth.append(split.boxes[i][matched[keep]])
        variance.append(gp.gp_variance(dets.embeddings[keep]))
        labels.append(split.labels[i][matched[keep]])
    if not predicted:
        return np.zeros((0, 4)), np.zeros((0, 4)), np.zeros(0), np.zeros(0, dtype=np.int64)
    return (np.concatenate(predicted).astype(np.float64),
            np.concatenate(truth).astype(np.float64), np.concatenate(variance),
            np.concatenate(labels).astype(np.int64))


def calibrate_box_uncertainty(model: CenterNetDetector, gp: LastLayerNTKGP,
                              val: DetectionSplit, score_threshold: float,
                              max_detections: int, progress: bool = False
                              ) -> BoxCalibration | None:
    """Fit the box calibration on the validation split's matched detections and attach it
    to ``gp`` (saved with it).

    ``None`` (and ``gp`` left without one: box_std 0) when the detector matches fewer than
    :data:`MIN_CALIBRATION_BOXES` validation objects, too few to fit two values per
    coordinate (an untrained or smoke-test model).
    """
    predicted, truth, variance, _ = matched_boxes(model, gp, val, score_threshold,
                                                  max_detections, progress)
    gp.box_calibration = None
    if len(predicted) < MIN_CALIBRATION_BOXES:
        return None
    cells = cell_size(model.input_size, model.input_size)
    calibration = fit_box_calibration(head_residuals(predicted, truth, cells), variance,
                                      HEAD_COORDINATES)
    gp.box_calibration = calibration
    return calibration


def evaluate_box_uncertainty(model: CenterNetDetector, gp: LastLayerNTKGP,
                             test: DetectionSplit, test_unknown: DetectionSplit | None,
                             score_threshold: float, max_detections: int,
                             progress: bool = False) -> dict[str, Any]:
    """Coverage of the published box standard deviations (see :func:`coverage`).

    On the known objects of ``test`` (the calibration's target), and on the unknown objects
    of ``test_unknown`` when given: whether the standard deviation grows with the larger box
    errors on objects unlike the training data. Without a calibration in ``gp`` the report
    says so instead of scoring zeros.
    """
    if gp.box_calibration is None:
        return {'calibrated': False,
                'reason': 'the GP state has no box calibration (written before box_std '
                          'existed); refit it with `uq train --gp-only`'}
    cells = cell_size(model.input_size, model.input_size)
    report: dict[str, Any] = {'calibrated': True, 'calibration': gp.box_calibration.to_meta()}
    for key, split, unknown in (('test', test, False), ('test_unknown', test_unknown, True)):
        if split is None:
            continue
        predicted, truth, variance, labels = matched_boxes(
            model, gp, split, score_threshold, max_detections, progress)
        wanted = labels < 0 if unknown else labels >= 0
        std = box_std(predicted[wanted], variance[wanted], gp.box_calibration, cells)
        report[key if not unknown else 'test_unknown_objects'] = coverage(
            predicted[wanted], std, truth[wanted])
    return report
