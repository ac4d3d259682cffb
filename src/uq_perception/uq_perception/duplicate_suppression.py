"""Class-agnostic suppression of duplicate detections of one object (ROS-free).

The CenterNet decode keeps every local maximum of the objectness heatmap, so one object
can yield more than one box: a weak secondary peak on a part of it (a mug's handle), or a
second box of nearly the same extent. Each duplicate is a detection of nothing the scene
holds apart; an unfamiliar part of a known object even looks novel, and would make the
ask-for-help node ask a person about it.

Two rules, applied greedily from the strongest detection down, each comparing a weaker
detection with a stronger one that is itself kept:

* **same object**: the two boxes overlap with IoU >= ``same_object_iou``, whatever their
  scores (classic non-maximum suppression, across classes);
* **weak part**: at least ``containment`` of the weaker box's area lies inside the
  stronger box, *and* the weaker score is at most ``score_ratio`` times the stronger one.

Classes are not used: a part of a known object is often classified as something else.
The score condition is what keeps a second, real object whose box lies inside a larger
one (a small object in front of a big one): the detector sees it as an object in its own
right, with an objectness near that of the larger one, while a part fires a weak peak.
Side-by-side or touching objects overlap little and are never suppressed.
The defaults were chosen on the simulator's validation split (docs/help_eval.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class DuplicateSuppression:
    """Thresholds of the two duplicate rules (see the module docstring).

    Attributes
    ----------
    same_object_iou
        IoU in ``(0, 1]`` at or above which the weaker of two boxes is a duplicate.
    containment
        Share in ``(0, 1]`` of the weaker box's area inside the stronger box at or above
        which the weaker box may be a part of the same object.
    score_ratio
        Largest ratio in ``[0, 1)`` of the weaker to the stronger score for the part rule;
        0 turns that rule off (objectness is positive above any useful threshold).

    Raises
    ------
    ValueError
        If a threshold is not a finite number in its range.
    """

    same_object_iou: float = 0.7
    containment: float = 0.7
    score_ratio: float = 0.6

    def __post_init__(self) -> None:
        for name, interval, inside in (
                ('same_object_iou', '(0, 1]', lambda v: 0.0 < v <= 1.0),
                ('containment', '(0, 1]', lambda v: 0.0 < v <= 1.0),
                ('score_ratio', '[0, 1)', lambda v: 0.0 <= v < 1.0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) \
                    or not math.isfinite(value) or not inside(value):
                raise ValueError(f'{name} must be a finite number in {interval}, got {value!r}')

    def keep(self, boxes: np.ndarray, scores: np.ndarray) -> np.ndarray:
        """Which detections are not duplicates of a stronger kept detection.

        Parameters
        ----------
        boxes : np.ndarray
            ``(K, 4)`` ``center_x, center_y, width, height`` in pixels.
        scores : np.ndarray
            ``(K,)`` detection scores; order does not matter (ties keep the earlier one).

        Returns
        -------
        np.ndarray
            ``(K,)`` bool, True for the detections to keep. A box with a non-finite
            coordinate or score, or an empty box, neither suppresses nor is suppressed:
            the pipeline's own checks report it.

        Raises
        ------
        ValueError
            If the shapes do not match ``(K, 4)`` and ``(K,)``.
        """
        boxes = np.asarray(boxes, dtype=np.float64)
        scores = np.asarray(scores, dtype=np.float64)
        if boxes.ndim != 2 or boxes.shape[1] != 4:
            raise ValueError(f'boxes must have shape (K, 4), got {boxes.shape}')
        if scores.shape != (boxes.shape[0],):
            raise ValueError(f'scores must have shape ({boxes.shape[0]},), got {scores.shape}')
        count = boxes.shape[0]
        keep = np.ones(count, dtype=bool)
        if count < 2:
            return keep
        area = boxes[:, 2] * boxes[:, 3]
        usable = np.isfinite(boxes).all(axis=1) & np.isfinite(scores) & (area > 0.0)
        low = boxes[:, :2] - boxes[:, 2:] / 2.0
        high = boxes[:, :2] + boxes[:, 2:] / 2.0
        # Pairwise intersections at once; the greedy pass below is then plain indexing
        # over at most a few dozen detections.
        with np.errstate(invalid='ignore'):
            extent = np.clip(np.minimum(high[:, None, :], high[None, :, :])
                             - np.maximum(low[:, None, :], low[None, :, :]), 0.0, None)
            inter = extent[..., 0] * extent[..., 1]
            iou = inter / (area[:, None] + area[None, :] - inter)
            # inside[i, j]: share of box j's area inside box i.
            inside = inter / area[None, :]
        order = [int(i) for i in np.argsort(-np.where(usable, scores, -np.inf), kind='stable')
                 if usable[i]]
        kept: list[int] = []
        for j in order:
            for i in kept:
                if iou[i, j] >= self.same_object_iou or (
                        inside[i, j] >= self.containment
                        and scores[j] <= self.score_ratio * scores[i]):
                    keep[j] = False
                    break
            else:
                kept.append(j)
        return keep
