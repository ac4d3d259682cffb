"""Object-detection metrics on numpy arrays (ROS-free): box IoU, greedy matching, AP.

COCO-style evaluation pieces: IoU of centre-size boxes, one-to-one matching of detections
to ground truth in order of decreasing score (with "ignore" ground truth, like COCO's crowd
regions), and 101-point interpolated average precision. Uncertainty and calibration
metrics (AUROC, AUPR, ECE, NLL, Brier) live in :mod:`uq_perception.training.metrics`.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    'average_precision',
    'box_iou',
    'match_detections',
]


def _as_1d(name: str, values: np.ndarray, dtype: type = np.float64) -> np.ndarray:
    array: np.ndarray = np.asarray(values, dtype=dtype)
    if array.ndim != 1:
        raise ValueError(f'{name} must be one-dimensional, got shape {array.shape}')
    if np.issubdtype(array.dtype, np.floating) and not np.all(np.isfinite(array)):
        raise ValueError(f'{name} contains non-finite values')
    return array


def _binary_labels(labels: np.ndarray, size: int) -> np.ndarray:
    array = np.asarray(labels)
    if array.shape != (size,):
        raise ValueError(f'labels must have shape ({size},), got {array.shape}')
    if array.dtype != np.bool_:
        if not np.all(np.isin(array, (0, 1))):
            raise ValueError('labels must be boolean or 0/1')
        array = array.astype(bool)
    return array


def _as_boxes(name: str, boxes: np.ndarray) -> np.ndarray:
    array = np.asarray(boxes, dtype=np.float64)
    if array.size == 0:
        # An empty list of boxes, whatever its shape, is zero boxes.
        return array.reshape(0, 4)
    if array.ndim != 2 or array.shape[1] != 4:
        raise ValueError(f'{name} must have shape (N, 4), got {array.shape}')
    if not np.all(np.isfinite(array)):
        raise ValueError(f'{name} contains non-finite values')
    if np.any(array[:, 2:] < 0):
        raise ValueError(f'{name} has negative width or height')
    return array


def box_iou(boxes_a: np.ndarray, boxes_b: np.ndarray) -> np.ndarray:
    """Pairwise intersection over union of centre-size boxes.

    Parameters
    ----------
    boxes_a : np.ndarray
        ``(N, 4)`` boxes ``center_x, center_y, width, height``.
    boxes_b : np.ndarray
        ``(M, 4)`` boxes in the same format.

    Returns
    -------
    np.ndarray
        ``(N, M)`` IoU in ``[0, 1]``; 0 where both boxes are empty.
    """
    a = _as_boxes('boxes_a', boxes_a)
    b = _as_boxes('boxes_b', boxes_b)
    a1, a2 = a[:, :2] - a[:, 2:] / 2, a[:, :2] + a[:, 2:] / 2
    b1, b2 = b[:, :2] - b[:, 2:] / 2, b[:, :2] + b[:, 2:] / 2
    top_left = np.maximum(a1[:, None, :], b1[None, :, :])
    bottom_right = np.minimum(a2[:, None, :], b2[None, :, :])
    wh = np.clip(bottom_right - top_left, 0.0, None)
    inter = wh[..., 0] * wh[..., 1]
    union = (a[:, 2] * a[:, 3])[:, None] + (b[:, 2] * b[:, 3])[None, :] - inter
    return np.divide(inter, union, out=np.zeros_like(inter), where=union > 0)


def match_detections(det_boxes: np.ndarray, det_scores: np.ndarray, gt_boxes: np.ndarray,
                     iou_threshold: float = 0.5,
                     gt_ignore: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Greedy one-to-one matching of detections to ground truth, highest score first.

    Each detection, in order of decreasing score, takes the still unmatched ground-truth
    box of highest IoU at or above ``iou_threshold``, preferring boxes that are not
    ignored (as COCO does). A detection matched to an ignored box is neither a true nor a
    false positive.

    Parameters
    ----------
    det_boxes : np.ndarray
        ``(K, 4)`` detected boxes, centre-size format.
    det_scores : np.ndarray
        ``(K,)`` detection scores.
    gt_boxes : np.ndarray
        ``(G, 4)`` ground-truth boxes, centre-size format.
    iou_threshold : float
        Minimum IoU for a match.
    gt_ignore : np.ndarray | None
        ``(G,)`` bool, ground truth that neither needs to be found nor penalises a
        detection that finds it.

    Returns
    -------
    matched_gt : np.ndarray
        ``(K,)`` int index of the matched ground truth, -1 where unmatched.
    det_ignored : np.ndarray
        ``(K,)`` bool, detections matched to ignored ground truth.
    """
    scores = _as_1d('det_scores', det_scores)
    iou = box_iou(det_boxes, gt_boxes)
    if iou.shape[0] != scores.shape[0]:
        raise ValueError(f'{iou.shape[0]} detection boxes but {scores.shape[0]} scores')
    num_gt = iou.shape[1]
    ignore = np.zeros(num_gt, dtype=bool) if gt_ignore is None else _binary_labels(
        gt_ignore, num_gt)
    matched_gt = np.full(scores.shape[0], -1, dtype=np.int64)
    det_ignored = np.zeros(scores.shape[0], dtype=bool)
    taken = np.zeros(num_gt, dtype=bool)
    for det in np.argsort(-scores, kind='stable'):
        best, best_iou = -1, iou_threshold
        # Two passes: a regular box wins over an ignored one whatever their IoUs.
        for allowed in (~ignore, ignore):
            candidates = np.flatnonzero(allowed & ~taken & (iou[det] >= best_iou))
            if candidates.size:
                best = int(candidates[np.argmax(iou[det, candidates])])
                break
        if best >= 0:
            taken[best] = True
            matched_gt[det] = best
            det_ignored[det] = bool(ignore[best])
    return matched_gt, det_ignored


def average_precision(scores: np.ndarray, is_true_positive: np.ndarray, num_ground_truth: int,
                      recall_points: int = 101) -> float:
    """COCO-style interpolated average precision of one class.

    Detections are ranked by score; precision is made monotone (the maximum precision at
    any higher recall) and averaged over ``recall_points`` equally spaced recall levels
    from 0 to 1, counting 0 at levels that are never reached.

    Parameters
    ----------
    scores : np.ndarray
        ``(K,)`` scores of all counted detections of the class over the data set
        (detections matched to ignored ground truth left out).
    is_true_positive : np.ndarray
        ``(K,)`` bool, whether each detection matched a ground-truth object.
    num_ground_truth : int
        Number of (non-ignored) ground-truth objects of the class.
    recall_points : int
        Number of recall levels (COCO uses 101).

    Returns
    -------
    float
        AP in ``[0, 1]``; NaN when there is no ground truth.
    """
    score = _as_1d('scores', scores)
    tp = _binary_labels(is_true_positive, score.shape[0])
    if num_ground_truth < 0:
        raise ValueError(f'num_ground_truth must be >= 0, got {num_ground_truth}')
    if tp.sum() > num_ground_truth:
        raise ValueError(f'{int(tp.sum())} true positives exceed {num_ground_truth} objects')
    if recall_points < 2:
        raise ValueError(f'recall_points must be >= 2, got {recall_points}')
    if num_ground_truth == 0:
        return float('nan')
    if score.size == 0:
        return 0.0
    order = np.argsort(-score, kind='stable')
    tp_cum = np.cumsum(tp[order])
    fp_cum = np.cumsum(~tp[order])
    recall = tp_cum / num_ground_truth
    precision = tp_cum / np.maximum(tp_cum + fp_cum, 1)
    envelope = np.maximum.accumulate(precision[::-1])[::-1]
    levels = np.linspace(0.0, 1.0, recall_points)
    # For each level, the first rank whose recall reaches it; beyond the last rank -> 0.
    first = np.searchsorted(recall, levels, side='left')
    sampled = np.where(first < recall.size, envelope[np.minimum(first, recall.size - 1)], 0.0)
    return float(sampled.mean())
