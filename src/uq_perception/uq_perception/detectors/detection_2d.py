"""Detections as the ROS ecosystem's standard 2D detection, ``vision_msgs/Detection2D``
(ROS-free: numbers in, plain Python values out).

``uq_perception.messages`` builds the messages from these values; the convention is stated
in docs/detector_contract.md ("vision_msgs output") and summarised here:

- ``id``: the track id as text (``''`` for an untracked detection, track id -1).
- ``bbox``: centre and size in pixels, ``theta`` 0 (the boxes are axis-aligned).
- ``results``: one hypothesis per known class, ``class_id`` the class name and ``score`` its
  probability (the same values as ``uq_msgs/Detection.class_probabilities``), most probable
  first (ties in class order), so ``results[0]`` is ``Detection.class_id``. After them come
  the reserved hypotheses, whose ``class_id`` starts with ``uq/`` and which are not classes:
  ``uq/calibrated_score`` (the calibrated score, left out when the model has no score
  reference), ``uq/track_score`` (the track's mean calibrated score over its views, left out
  when it has none) and ``uq/out_of_distribution`` (score 1.0 when flagged, else 0.0).
- Every hypothesis's pose is the box centre (``z`` 0, identity orientation) with the box's
  covariance: row-major 6x6 over ``x, y, z, rot x, rot y, rot z``; its first four diagonal
  entries hold the variances of ``center_x, center_y, width, height`` (``box_std ** 2``, in
  that order: slots x, y, z and rot x), every other entry 0. ``rot z`` is the box's
  ``theta``, which is exact (axis-aligned).

Values are rounded to float32 first, as ``uq_msgs/Detection`` carries them, so both outputs
of one frame hold the same numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: Prefix of the hypotheses that are not classes.
RESERVED_PREFIX = 'uq/'
CALIBRATED_SCORE_ID = RESERVED_PREFIX + 'calibrated_score'
TRACK_SCORE_ID = RESERVED_PREFIX + 'track_score'
OUT_OF_DISTRIBUTION_ID = RESERVED_PREFIX + 'out_of_distribution'
#: Indices in the row-major 6x6 pose covariance of the variances of ``center_x, center_y,
#: width, height``: the diagonal entries of x, y, z and rot x.
COVARIANCE_SLOTS = (0, 7, 14, 21)
COVARIANCE_SIZE = 36


@dataclass(frozen=True)
class Hypothesis:
    """One entry of ``Detection2D.results`` (an ``ObjectHypothesis``)."""

    class_id: str
    score: float


@dataclass(frozen=True)
class Detection2DFields:
    """The values of one ``vision_msgs/Detection2D`` (its header is the frame's)."""

    id: str
    center_x: float
    center_y: float
    size_x: float
    size_y: float
    #: Row-major 6x6 pose covariance, 36 values.
    covariance: tuple[float, ...]
    results: tuple[Hypothesis, ...]

    @property
    def class_results(self) -> tuple[Hypothesis, ...]:
        """The class hypotheses, without the reserved ``uq/`` ones."""
        return tuple(h for h in self.results if not h.class_id.startswith(RESERVED_PREFIX))


def detection_2d_fields(boxes: np.ndarray, box_std: np.ndarray, probabilities: np.ndarray,
                        class_names: list[str], track_ids: np.ndarray,
                        out_of_distribution: np.ndarray,
                        calibrated_scores: np.ndarray | None = None,
                        track_scores: np.ndarray | None = None
                        ) -> list[Detection2DFields]:
    """The ``Detection2D`` values of ``K`` detections, in their order.

    Parameters
    ----------
    boxes
        ``(K, 4)`` ``center_x, center_y, width, height`` in pixels.
    box_std
        ``(K, 4)`` standard deviations of the same coordinates in pixels (0: not estimated).
    probabilities
        ``(K, C)`` class probabilities, columns in ``class_names`` order.
    class_names
        The ``C`` class names.
    track_ids
        ``(K,)`` track ids, -1 for an untracked detection.
    out_of_distribution
        ``(K,)`` the GP's out-of-distribution flags.
    calibrated_scores
        ``(K,)`` calibrated scores in [0, 1], negative where absent; ``None`` when the
        model has no score reference. An absent score has no ``uq/calibrated_score``
        hypothesis.
    track_scores
        ``(K,)`` track scores (:mod:`uq_perception.track_evidence`) in [0, 1], negative
        where a detection's track has none; ``None`` when no evidence is kept. An absent
        score has no ``uq/track_score`` hypothesis.

    Raises
    ------
    ValueError
        When the arrays do not describe the same ``K`` detections and ``C`` classes.
    """
    boxes = np.asarray(boxes, np.float32)
    box_std = np.asarray(box_std, np.float32)
    probabilities = np.asarray(probabilities, np.float32)
    track_ids = np.asarray(track_ids)
    out_of_distribution = np.asarray(out_of_distribution, bool)
    count = len(boxes)
    if probabilities.ndim != 2 or probabilities.shape[1] != len(class_names):
        raise ValueError(f'probabilities of shape {probabilities.shape} for '
                         f'{len(class_names)} class names')
    shapes = {'boxes': (boxes.shape, (count, 4)), 'box_std': (box_std.shape, (count, 4)),
              'probabilities': (probabilities.shape[:1], (count,)),
              'track_ids': (track_ids.shape, (count,)),
              'out_of_distribution': (out_of_distribution.shape, (count,))}
    if calibrated_scores is not None:
        calibrated_scores = np.asarray(calibrated_scores, np.float32)
        shapes['calibrated_scores'] = (calibrated_scores.shape, (count,))
    if track_scores is not None:
        track_scores = np.asarray(track_scores, np.float32)
        shapes['track_scores'] = (track_scores.shape, (count,))
    wrong = [f'{name} {got}' for name, (got, want) in shapes.items() if got != want]
    if wrong:
        raise ValueError(f'arrays of {count} detections expected, got {", ".join(wrong)}')
    # float32 -> float64 is exact: the values equal the float32 fields of uq_msgs/Detection.
    variances = box_std.astype(np.float64) ** 2
    # Most probable first; a stable sort keeps tied classes in class order (argmax's choice).
    order = np.argsort(-probabilities, axis=1, kind='stable')
    scores = calibrated_scores.tolist() if calibrated_scores is not None else [-1.0] * count
    evidence = track_scores.tolist() if track_scores is not None else [-1.0] * count
    out = []
    for box, variance, ranks, row, track, ood, score, track_score in zip(
            boxes.tolist(), variances.tolist(), order.tolist(), probabilities.tolist(),
            track_ids.tolist(), out_of_distribution.tolist(), scores, evidence, strict=True):
        covariance = [0.0] * COVARIANCE_SIZE
        for slot, value in zip(COVARIANCE_SLOTS, variance, strict=True):
            covariance[slot] = value
        results = [Hypothesis(class_names[c], row[c]) for c in ranks]
        if score >= 0.0:
            results.append(Hypothesis(CALIBRATED_SCORE_ID, score))
        if track_score >= 0.0:
            results.append(Hypothesis(TRACK_SCORE_ID, track_score))
        results.append(Hypothesis(OUT_OF_DISTRIBUTION_ID, 1.0 if ood else 0.0))
        out.append(Detection2DFields(
            id='' if int(track) < 0 else str(int(track)), center_x=box[0], center_y=box[1],
            size_x=box[2], size_y=box[3], covariance=tuple(covariance),
            results=tuple(results)))
    return out
