"""Validity of one perception frame for the shared-autonomy arbiter (ROS-free).

Every field of a ``uq_msgs/DetectionArray`` that the arbiter reads is checked by rule
(finite, in range, consistent sizes, stamps neither stale nor ahead of the clock) before it
may drive a level; :func:`assess_frame` returns the verdict and the driving uncertainty, and
the arbiter falls back to teleoperation on any problem it names.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from uq_autonomy.arbitration.config import (
    NEGATIVE_TOLERANCE,
    NO_CALIBRATED_SCORE,
    NO_TRACK_SCORE,
    ArbiterConfig,
    DrivingDetection,
    UncertaintySignal,
)


@dataclass(frozen=True, slots=True)
class UncertaintyValues:
    """The fields of one ``uq_msgs/Uncertainty`` the arbiter checks (a detection's or the
    frame-level summary)."""

    gp_variance: float = 0.0
    mutual_information: float = 0.0
    predictive_entropy: float = 0.0
    expected_entropy: float = 0.0
    max_probability: float = 0.0
    class_variance: tuple[float, ...] = ()
    calibrated_score: float = NO_CALIBRATED_SCORE


@dataclass(frozen=True, slots=True)
class DetectionSummary:
    """The fields of one ``uq_msgs/Detection`` the arbiter looks at and checks.

    The optional fields default to the values of a producer that does not estimate them
    (empty probabilities and class variances, score 1, zero entropies, no calibrated score),
    each of which is valid when the frame has no class names.
    """

    class_id: str
    class_index: int
    track_id: int
    center_x: float
    center_y: float
    width: float
    height: float
    gp_variance: float
    mutual_information: float
    class_probabilities: tuple[float, ...] = ()
    score: float = 1.0
    predictive_entropy: float = 0.0
    expected_entropy: float = 0.0
    max_probability: float = 0.0
    class_variance: tuple[float, ...] = ()
    calibrated_score: float = NO_CALIBRATED_SCORE
    track_score: float = NO_TRACK_SCORE
    track_views: int = 0
    track_labelled: bool = False

    @property
    def uncertainty(self) -> UncertaintyValues:
        """This detection's uncertainty fields."""
        return UncertaintyValues(self.gp_variance, self.mutual_information,
                                 self.predictive_entropy, self.expected_entropy,
                                 self.max_probability, self.class_variance,
                                 self.calibrated_score)

    def signal(self, which: UncertaintySignal) -> float:
        """The value of signal ``which``."""
        if which is UncertaintySignal.GP_VARIANCE:
            return self.gp_variance
        if which is UncertaintySignal.MUTUAL_INFORMATION:
            return self.mutual_information
        return self.calibrated_score


@dataclass(frozen=True, slots=True)
class Perception:
    """Verdict on one perception frame.

    ``usable`` false means the fail-safe applies and ``reason`` says why; otherwise
    ``uncertainty`` is the driving value and ``index`` the driving detection.
    ``target_missing`` marks a valid frame without the track the autonomy announced.
    """

    usable: bool
    uncertainty: float
    reason: str
    index: int = -1
    target_missing: bool = False


# Box coordinates and sizes beyond this many pixels belong to no camera (the largest
# image size the parameters accept is 100000 pixels a side).
MAX_BOX_PIXELS = 1e5
# Probabilities travel as float32 and are rounded by the producer; a sum further than this
# from 1 is not a distribution.
PROBABILITY_SUM_TOLERANCE = 1e-3


def _all_finite(values: Sequence[float]) -> bool:
    return all(math.isfinite(v) for v in values)


def _uncertainty_problem(where: str, u: UncertaintyValues, num_classes: int) -> str | None:
    """Why ``u`` is not a valid uncertainty for a frame with ``num_classes`` classes, or None.

    Variances and entropies are finite and >= 0 (up to rounding); entropies (and the mutual
    information, a difference of them) are at most ``ln(num_classes)``; the expected entropy
    is at most the predictive one; ``max_probability`` is in [0, 1]; ``class_variance`` has
    one finite value >= 0 per class, or none; ``calibrated_score`` is in [0, 1], or exactly
    -1 (the model has no score reference).
    """
    scalars = (('gp_variance', u.gp_variance), ('mutual_information', u.mutual_information),
               ('predictive_entropy', u.predictive_entropy),
               ('expected_entropy', u.expected_entropy),
               ('max_probability', u.max_probability))
    for name, value in scalars:
        if not math.isfinite(value):
            return f'non-finite {name} ({value}) in {where}'
        if value < -NEGATIVE_TOLERANCE:
            return f'negative {name} ({value:.3g}) in {where}'
    if u.max_probability > 1.0 + NEGATIVE_TOLERANCE:
        return f'max_probability {u.max_probability:.6g} above 1 in {where}'
    score = u.calibrated_score
    if not (math.isfinite(score) and (0.0 <= score <= 1.0 or score == NO_CALIBRATED_SCORE)):
        return (f'calibrated_score {score:.6g} neither in [0, 1] nor '
                f'{NO_CALIBRATED_SCORE:g} (none) in {where}')
    if num_classes > 0:
        # Entropies of a distribution over C classes lie in [0, ln C] (ln 2 for C = 1, so a
        # one-class producer that reports a binary entropy is not refused).
        limit = math.log(max(num_classes, 2)) + 1e-3
        for name, value in scalars[1:4]:
            if value > limit:
                return (f'{name} {value:.6g} above ln({num_classes}) = {limit - 1e-3:.4g} '
                        f'in {where}')
    if u.expected_entropy > u.predictive_entropy + 1e-3:
        return (f'expected_entropy {u.expected_entropy:.6g} above predictive_entropy '
                f'{u.predictive_entropy:.6g} in {where}')
    if u.class_variance:
        if len(u.class_variance) != num_classes:
            return (f'{len(u.class_variance)} class variances for {num_classes} classes '
                    f'in {where}')
        if not _all_finite(u.class_variance):
            return f'non-finite class_variance in {where}'
        if min(u.class_variance) < -NEGATIVE_TOLERANCE:
            return f'negative class_variance in {where}'
    return None


def detection_problem(i: int, d: DetectionSummary, num_classes: int) -> str | None:
    """Why detection ``i`` of a frame with ``num_classes`` class names is invalid, or None.

    The full rule is in ``docs/arbitration.md`` ("Frame validity").
    """
    where = f'detection {i}'
    box = (d.center_x, d.center_y, d.width, d.height)
    if not _all_finite(box):
        return f'non-finite box in {where}'
    if d.width <= 0.0 or d.height <= 0.0:
        return f'non-positive box size {d.width:g}x{d.height:g} in {where}'
    if max(abs(v) for v in box) > MAX_BOX_PIXELS:
        return f'box beyond {MAX_BOX_PIXELS:g} pixels in {where}'
    if not math.isfinite(d.score) or not 0.0 <= d.score <= 1.0:
        return f'score {d.score} outside [0, 1] in {where}'
    if not -1 <= d.class_index < num_classes:
        return (f'class_index {d.class_index} outside [-1, {num_classes}) '
                f'({num_classes} class names) in {where}')
    probs = d.class_probabilities
    if len(probs) != num_classes:
        return f'{len(probs)} class probabilities for {num_classes} classes in {where}'
    track = d.track_score
    if not (math.isfinite(track) and (0.0 <= track <= 1.0 or track == NO_TRACK_SCORE)):
        return f'track_score {track:.6g} neither in [0, 1] nor {NO_TRACK_SCORE:g} (none) in {where}'
    if d.track_views < 0:
        return f'negative track_views ({d.track_views}) in {where}'
    if probs:
        if not _all_finite(probs):
            return f'non-finite class probability in {where}'
        if min(probs) < 0.0 or max(probs) > 1.0:
            return f'class probability outside [0, 1] in {where}'
        total = math.fsum(probs)
        if abs(total - 1.0) > PROBABILITY_SUM_TOLERANCE:
            return f'class probabilities sum to {total:.6g}, not 1, in {where}'
    return _uncertainty_problem(where, d.uncertainty, num_classes)


def too_many_detections(count: int, config: ArbiterConfig) -> str:
    """Reason given for a frame with ``count`` > ``config.max_detections`` detections."""
    return (f'invalid DetectionArray: {count} detections, more than max_detections '
            f'{config.max_detections}')


def stamp_problem(stamp_s: float, clock_s: float, config: ArbiterConfig) -> str | None:
    """Why a frame stamped ``stamp_s`` is unacceptable at ``clock_s`` (same clock), or None.

    Too old (``clock_s - stamp_s > max_frame_age_s``: a zero stamp, a stalled pipeline, a
    replayed frame) or from the future (``stamp_s - clock_s > max_future_stamp_s``: a
    producer whose clock runs ahead, or a wrong time source).
    """
    age = clock_s - stamp_s
    if not math.isfinite(age):
        return f'invalid DetectionArray: stamp {stamp_s} not comparable with the clock'
    if age > config.max_frame_age_s:
        return (f'invalid DetectionArray: stamp {age:.3f} s old, more than max_frame_age_s '
                f'{config.max_frame_age_s:g}')
    return future_stamp_problem(stamp_s, clock_s, config.max_future_stamp_s)


def future_stamp_problem(stamp_s: float, clock_s: float, max_future_stamp_s: float) -> str | None:
    """Why a frame stamped ``stamp_s`` is too far ahead of ``clock_s`` (same clock), or None.

    The future half of :func:`stamp_problem`, for nodes that accept old frames (a bag
    replayed on the wall clock) but must not let one stamp from the future move their own
    notion of time ahead.
    """
    ahead = stamp_s - clock_s
    if not math.isfinite(ahead):
        return f'invalid DetectionArray: stamp {stamp_s} not comparable with the clock'
    if ahead > max_future_stamp_s:
        return (f'invalid DetectionArray: stamp {ahead:.3f} s ahead of the clock, more than '
                f'max_future_stamp_s {max_future_stamp_s:g}')
    return None


def assess_frame(detections: Sequence[DetectionSummary], num_classes: int,
                 config: ArbiterConfig,
                 frame_uncertainty: UncertaintyValues | None = None,
                 autonomy_target: int | None = None) -> Perception:
    """Check a whole frame and pick its driving uncertainty.

    Parameters
    ----------
    detections : sequence of DetectionSummary
        The frame's detections, in message order.
    num_classes : int
        ``len(DetectionArray.class_names)``.
    config : ArbiterConfig
        Selects the signal and the driving detection; bounds the number of detections.
    frame_uncertainty : UncertaintyValues, optional
        The frame-level ``DetectionArray.uncertainty``, checked by the same rule.
    autonomy_target : int, optional
        The track id the autonomy is reaching for, for ``driving_detection``
        ``autonomy_target``; None (or negative) when it announces none.

    Returns
    -------
    Perception
        Unusable for an empty frame, one with more than ``config.max_detections``
        detections (checked before anything else, so the excess costs nothing), any invalid
        field of any detection or of the frame-level uncertainty (see
        :func:`detection_problem`; one broken value makes the whole frame suspect, driving
        signal or not), when no detection matches the target, or when the signal is the
        calibrated score and a candidate has none (-1); else the driving value. Ties
        between candidates go to the higher uncertainty, the cautious choice.
    """
    if not detections:
        return Perception(False, math.nan, 'empty DetectionArray: no detection to judge')
    if len(detections) > config.max_detections:
        return Perception(False, math.nan, too_many_detections(len(detections), config))
    if frame_uncertainty is not None:
        problem = _uncertainty_problem('the frame-level uncertainty', frame_uncertainty,
                                       num_classes)
        if problem is not None:
            return Perception(False, math.nan, f'invalid DetectionArray: {problem}')
    signal = config.uncertainty_signal
    for i, d in enumerate(detections):
        problem = detection_problem(i, d, num_classes)
        if problem is not None:
            return Perception(False, math.nan, f'invalid DetectionArray: {problem}')

    mode = config.driving_detection
    candidates: Sequence[int]
    if mode is DrivingDetection.TARGET_CLASS:
        candidates = [i for i, d in enumerate(detections) if d.class_id == config.target_class]
        if not candidates:
            return Perception(False, math.nan,
                              f'target class {config.target_class!r} not detected')
    elif mode is DrivingDetection.TRACK_ID:
        candidates = [i for i, d in enumerate(detections) if d.track_id == config.target_track_id]
        if not candidates:
            return Perception(False, math.nan,
                              f'target track {config.target_track_id} not detected')
    elif mode is DrivingDetection.AUTONOMY_TARGET:
        if autonomy_target is None or autonomy_target < 0:
            return Perception(False, math.nan, 'the autonomy announces no target track')
        candidates = [i for i, d in enumerate(detections) if d.track_id == autonomy_target]
        if not candidates:
            return Perception(False, math.nan,
                              f"the autonomy's target track {autonomy_target} not detected",
                              target_missing=True)
    elif mode is DrivingDetection.NEAREST_CENTER:
        cx, cy = 0.5 * config.image_width, 0.5 * config.image_height
        dist = [(d.center_x - cx) ** 2 + (d.center_y - cy) ** 2 for d in detections]
        nearest = min(dist)
        candidates = [i for i, r in enumerate(dist) if r == nearest]
    else:
        candidates = range(len(detections))
    if signal is UncertaintySignal.CALIBRATED_SCORE:
        # A candidate without a score could be the most uncertain: none is judged.
        for i in candidates:
            if detections[i].calibrated_score < 0.0:
                return Perception(False, math.nan,
                                  f'detection {i} has no calibrated_score (-1: the model '
                                  'has no score reference)')
    values = {i: max(float(detections[i].signal(signal)), 0.0) for i in candidates}
    best = max(candidates, key=values.__getitem__)
    return Perception(True, values[best], f'detection {best}', best)
