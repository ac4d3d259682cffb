"""Shared-autonomy arbiter: perception uncertainty to a level of autonomy and a command.

ROS-free core of the arbitration node (``arbitration_node.py`` only adapts messages,
parameters, QoS and timers to it). Everything here is deterministic: every entry point takes
the current time explicitly, in seconds of a monotonic clock, so tests drive it with
hand-built inputs and invented clocks.

Levels (``../shared/DESIGN.md`` section 6):

====  ==============  =========================================================================
 0    teleoperation   operator command only
 1    guided          operator command; the autonomy's proposal is shown, not applied
 2    shared          ``(1 - alpha) * u_operator + alpha * u_autonomy``, alpha from confidence
 3    assistance      autonomy's command; operator input above a dead-band overrides it
====  ==============  =========================================================================

Level changes follow the driving uncertainty ``u`` with hysteresis. At level ``L``:

* step down (immediately, several levels at once if need be) while ``u > down[L - 1]``;
* step up by one level when ``u < up[L]`` has held for ``min_dwell_s`` and the last level
  change is at least ``min_dwell_s`` old, so the level never rises by more than one per
  dwell period.

Fail-safe: when perception is unusable (no valid ``DetectionArray`` within the deadline, an
invalid one -- any bad field, stamp or size, see :func:`assess_frame` -- or none holding the
driving detection) the level is
teleoperation, whatever the signal or a manual override says. An operator command older than
its timeout counts as zero at levels 0-2; an autonomy command older than its timeout counts as
zero everywhere.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum, IntEnum

import numpy as np
from numpy.typing import ArrayLike, NDArray

from uq_common.str_enum import StrEnum

NUM_LEVELS = 4
TWIST_SIZE = 6  # linear x, y, z then angular x, y, z, as geometry_msgs/Twist

# Entropies and variances computed as differences of float32 numbers can come out a hair
# below zero; anything more negative than this is a broken producer, not rounding.
NEGATIVE_TOLERANCE = 1e-6


class Level(IntEnum):
    """Levels of autonomy, numbered as the ``uq_msgs/AutonomyState`` constants."""

    TELEOPERATION = 0
    GUIDED = 1
    SHARED = 2
    ASSISTANCE = 3

    @property
    def label(self) -> str:
        """Lower-case name, as in ``AutonomyState.level_name``."""
        return self.name.lower()


class UncertaintySignal(StrEnum):
    """Which epistemic uncertainty of a detection drives the level."""

    GP_VARIANCE = 'gp_variance'
    MUTUAL_INFORMATION = 'mutual_information'


class DrivingDetection(StrEnum):
    """How the detection that drives the decision is chosen among those of a frame."""

    HIGHEST_UNCERTAINTY = 'highest_uncertainty'
    TARGET_CLASS = 'target_class'
    TRACK_ID = 'track_id'
    NEAREST_CENTER = 'nearest_center'


def parse_enum(enum_type: type[Enum], value: object, what: str) -> Enum:
    """Convert ``value`` to a member of ``enum_type``.

    Raises
    ------
    ValueError
        Naming ``what`` and the accepted values when ``value`` is none of them.
    """
    if isinstance(value, enum_type):
        return value
    try:
        return enum_type(value)
    except ValueError:
        allowed = ', '.join(repr(m.value) for m in enum_type)
        raise ValueError(f'{what} must be one of {allowed}, got {value!r}') from None


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


def _finite(x: float) -> bool:
    return isinstance(x, int | float) and math.isfinite(x)


@dataclass(frozen=True)
class Thresholds:
    """Hysteresis thresholds of one uncertainty signal, in that signal's unit.

    Parameters
    ----------
    up : sequence of 3 floats
        ``up[i]``: uncertainty below it allows a step up from level ``i`` to ``i + 1``.
    down : sequence of 3 floats
        ``down[i]``: uncertainty above it forces a step down from level ``i + 1`` to ``i``.

    Raises
    ------
    ValueError
        Unless both have 3 finite non-negative values, each strictly decreasing (a higher
        level asks for a more certain percept) and ``down[i] > up[i]`` for every ``i`` (a
        non-empty hysteresis band per level, else the level would chatter).
    """

    up: tuple[float, ...]
    down: tuple[float, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, 'up', tuple(float(v) for v in self.up))
        object.__setattr__(self, 'down', tuple(float(v) for v in self.down))
        n = NUM_LEVELS - 1
        for name, values in (('up', self.up), ('down', self.down)):
            _require(len(values) == n, f'{name} thresholds need {n} values, got {len(values)}')
            _require(all(math.isfinite(v) and v >= 0.0 for v in values),
                     f'{name} thresholds must be finite and >= 0, got {list(values)}')
            _require(all(a > b for a, b in zip(values, values[1:], strict=False)),
                     f'{name} thresholds must strictly decrease with the level '
                     f'(a higher level needs a lower uncertainty), got {list(values)}')
        for i, (up, down) in enumerate(zip(self.up, self.down, strict=True)):
            _require(down > up,
                     f'hysteresis needs down[{i}] > up[{i}] (level {Level(i + 1).label}), '
                     f'got down={down:g} <= up={up:g}')


@dataclass(frozen=True)
class ArbiterConfig:
    """Everything that tunes the arbiter; validated on construction.

    Parameters
    ----------
    uncertainty_signal : UncertaintySignal or str
        Signal that drives the level.
    gp_variance_thresholds, mutual_information_thresholds : Thresholds
        Thresholds per signal (logit^2 and nats), so switching the signal at run time
        switches to thresholds in the right unit.
    driving_detection : DrivingDetection or str
        How the driving detection is chosen in a frame.
    target_class : str
        Class name for ``target_class`` selection.
    target_track_id : int
        Track id for ``track_id`` selection.
    image_width, image_height : int
        Image size in pixels, whose centre ``nearest_center`` selection measures from.
    min_dwell_s : float
        Minimum time between a level change and the next step up, and how long the
        step-up condition must hold.
    perception_deadline_s : float
        Longest gap between valid perception messages before the fail-safe.
    operator_timeout_s, autonomy_timeout_s : float
        Age after which the operator's or autonomy's command counts as zero.
    operator_deadband : float
        At assistance, an operator command with any component above this magnitude
        overrides the autonomy's command.
    blend_alpha_min, blend_alpha_max : float
        Range of the autonomy's weight at the shared level.
    max_detections : int
        A frame with more detections is invalid (bounds the work per message).
    max_frame_age_s, max_future_stamp_s : float
        A frame stamped more than ``max_frame_age_s`` before the clock, or more than
        ``max_future_stamp_s`` after it, is invalid (:func:`stamp_problem`).
    max_linear_speed, max_angular_speed : float
        Bounds on the norm of the linear (m/s) and angular (rad/s) parts of every command
        sent.
    max_linear_accel, max_angular_accel : float
        Bounds on how fast those parts may change between commands sent (m/s^2, rad/s^2),
        speeding up and slowing down alike.

    Raises
    ------
    ValueError
        On any inconsistent or out-of-range value, naming it.
    """

    uncertainty_signal: UncertaintySignal = UncertaintySignal.GP_VARIANCE
    gp_variance_thresholds: Thresholds = field(
        default_factory=lambda: Thresholds(up=(1.0, 0.5, 0.25), down=(2.0, 1.0, 0.5)))
    mutual_information_thresholds: Thresholds = field(
        default_factory=lambda: Thresholds(up=(0.3, 0.15, 0.05), down=(0.5, 0.3, 0.1)))
    driving_detection: DrivingDetection = DrivingDetection.HIGHEST_UNCERTAINTY
    target_class: str = ''
    target_track_id: int = -1
    image_width: int = 640
    image_height: int = 480
    min_dwell_s: float = 1.0
    perception_deadline_s: float = 0.5
    operator_timeout_s: float = 0.5
    autonomy_timeout_s: float = 0.5
    operator_deadband: float = 0.05
    blend_alpha_min: float = 0.2
    blend_alpha_max: float = 0.8
    max_detections: int = 1000
    max_frame_age_s: float = 1.0
    max_future_stamp_s: float = 0.25
    max_linear_speed: float = 1.0
    max_angular_speed: float = 1.5
    max_linear_accel: float = 2.0
    max_angular_accel: float = 4.0

    def __post_init__(self) -> None:
        object.__setattr__(self, 'uncertainty_signal', parse_enum(
            UncertaintySignal, self.uncertainty_signal, 'uncertainty_signal'))
        object.__setattr__(self, 'driving_detection', parse_enum(
            DrivingDetection, self.driving_detection, 'driving_detection'))
        if self.driving_detection is DrivingDetection.TARGET_CLASS:
            _require(bool(self.target_class),
                     "driving_detection 'target_class' needs a non-empty target_class")
        if self.driving_detection is DrivingDetection.TRACK_ID:
            _require(self.target_track_id >= 0,
                     "driving_detection 'track_id' needs target_track_id >= 0, "
                     f'got {self.target_track_id}')
        _require(self.image_width > 0 and self.image_height > 0,
                 f'image size must be positive, got {self.image_width}x{self.image_height}')
        _require(_finite(self.min_dwell_s) and self.min_dwell_s >= 0.0,
                 f'min_dwell_s must be finite and >= 0, got {self.min_dwell_s}')
        for name in ('perception_deadline_s', 'operator_timeout_s', 'autonomy_timeout_s'):
            value = getattr(self, name)
            _require(_finite(value) and value > 0.0, f'{name} must be finite and > 0, got {value}')
        _require(_finite(self.operator_deadband) and self.operator_deadband >= 0.0,
                 f'operator_deadband must be finite and >= 0, got {self.operator_deadband}')
        _require(_finite(self.blend_alpha_min) and _finite(self.blend_alpha_max)
                 and 0.0 <= self.blend_alpha_min <= self.blend_alpha_max <= 1.0,
                 'blend alpha needs 0 <= blend_alpha_min <= blend_alpha_max <= 1, got '
                 f'{self.blend_alpha_min} and {self.blend_alpha_max}')
        _require(isinstance(self.max_detections, int) and self.max_detections >= 1,
                 f'max_detections must be an integer >= 1, got {self.max_detections}')
        for name in ('max_frame_age_s', 'max_future_stamp_s', 'max_linear_speed',
                     'max_angular_speed', 'max_linear_accel', 'max_angular_accel'):
            value = getattr(self, name)
            _require(_finite(value) and value > 0.0, f'{name} must be finite and > 0, got {value}')

    @property
    def thresholds(self) -> Thresholds:
        """Thresholds of the signal in force."""
        if self.uncertainty_signal is UncertaintySignal.MUTUAL_INFORMATION:
            return self.mutual_information_thresholds
        return self.gp_variance_thresholds


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


@dataclass(frozen=True, slots=True)
class DetectionSummary:
    """The fields of one ``uq_msgs/Detection`` the arbiter looks at and checks.

    The optional fields default to the values of a producer that does not estimate them
    (empty probabilities and class variances, score 1, zero entropies), each of which is
    valid when the frame has no class names.
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

    @property
    def uncertainty(self) -> UncertaintyValues:
        """This detection's uncertainty fields."""
        return UncertaintyValues(self.gp_variance, self.mutual_information,
                                 self.predictive_entropy, self.expected_entropy,
                                 self.max_probability, self.class_variance)


@dataclass(frozen=True, slots=True)
class Perception:
    """Verdict on one perception frame.

    ``usable`` false means the fail-safe applies and ``reason`` says why; otherwise
    ``uncertainty`` is the driving value and ``index`` the driving detection.
    """

    usable: bool
    uncertainty: float
    reason: str
    index: int = -1


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
    one finite value >= 0 per class, or none.
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


def limit_command(command: NDArray[np.float64], previous: NDArray[np.float64], dt: float,
                  config: ArbiterConfig) -> NDArray[np.float64]:
    """Clamp a command to the speed limits, then its change since ``previous`` (sent
    ``dt`` seconds earlier) to the acceleration limits.

    Linear (first 3) and angular (last 3) parts are limited by their norm, so the direction
    is kept. Non-finite components are replaced by zero first (the arbiter never produces
    them; this is the last line of defence before the robot).
    """
    out = np.where(np.isfinite(command), command, 0.0).astype(np.float64)
    dt = max(0.0, dt) if math.isfinite(dt) else 0.0
    for part, speed, accel in ((slice(0, 3), config.max_linear_speed, config.max_linear_accel),
                               (slice(3, 6), config.max_angular_speed,
                                config.max_angular_accel)):
        v = out[part]
        # Scale by the largest component first: the norm of (1.8e308, 0, 0) overflows.
        largest = float(np.max(np.abs(v)))
        if largest > 0.0:
            unit = v / largest
            norm = largest * float(np.linalg.norm(unit))
            if norm > speed:
                v = unit * (speed / float(np.linalg.norm(unit)))
        change = v - previous[part]
        step = float(np.linalg.norm(change))
        if step > accel * dt:
            v = previous[part] + change * (accel * dt / step)
        norm = float(np.linalg.norm(v))
        if norm > speed:  # the speed limit wins when it was lowered below the last command
            v = v * (speed / norm)
        out[part] = v
    return out


def assess_frame(detections: Sequence[DetectionSummary], num_classes: int,
                 config: ArbiterConfig,
                 frame_uncertainty: UncertaintyValues | None = None) -> Perception:
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

    Returns
    -------
    Perception
        Unusable for an empty frame, one with more than ``config.max_detections``
        detections (checked before anything else, so the excess costs nothing), any invalid
        field of any detection or of the frame-level uncertainty (see
        :func:`detection_problem`; one broken value makes the whole frame suspect, driving
        signal or not), or when no detection matches the target; else the driving value.
        Ties between candidates go to the higher uncertainty, the cautious choice.
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
    values: list[float] = []
    for i, d in enumerate(detections):
        problem = detection_problem(i, d, num_classes)
        if problem is not None:
            return Perception(False, math.nan, f'invalid DetectionArray: {problem}')
        u = float(d.gp_variance if signal is UncertaintySignal.GP_VARIANCE
                  else d.mutual_information)
        values.append(max(u, 0.0))

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
    elif mode is DrivingDetection.NEAREST_CENTER:
        cx, cy = 0.5 * config.image_width, 0.5 * config.image_height
        dist = [(d.center_x - cx) ** 2 + (d.center_y - cy) ** 2 for d in detections]
        nearest = min(dist)
        candidates = [i for i, r in enumerate(dist) if r == nearest]
    else:
        candidates = range(len(detections))
    best = max(candidates, key=values.__getitem__)
    return Perception(True, values[best], f'detection {best}', best)


def blend_alpha(uncertainty: float, config: ArbiterConfig) -> float:
    """Weight of the autonomy's command at the shared level.

    Confidence falls linearly from 1 at zero uncertainty to 0 at ``down[1]``, the value that
    ends the shared level; alpha maps it onto ``[blend_alpha_min, blend_alpha_max]``.
    Non-finite uncertainty gives ``blend_alpha_min``.
    """
    if not math.isfinite(uncertainty):
        return config.blend_alpha_min
    confidence = min(1.0, max(0.0, 1.0 - uncertainty / config.thresholds.down[1]))
    return config.blend_alpha_min + (config.blend_alpha_max - config.blend_alpha_min) * confidence


def command_for_level(level: Level, operator: NDArray[np.float64] | None,
                      autonomy: NDArray[np.float64] | None, alpha: float,
                      deadband: float) -> NDArray[np.float64]:
    """The command each level sends to the robot.

    Parameters
    ----------
    level : Level
        Level in force.
    operator, autonomy : ndarray of shape (6,) or None
        Latest commands; None when missing or older than their timeout.
    alpha : float
        Autonomy weight at the shared level.
    deadband : float
        Operator override dead-band at assistance (per component magnitude).

    Returns
    -------
    ndarray of shape (6,)
        Zero wherever the needed input is missing: an absent operator stops the robot at
        levels 0-2 (never a blend of autonomy alone), an absent autonomy command at level 3.
    """
    zero = np.zeros(TWIST_SIZE)
    if level is Level.ASSISTANCE:
        if operator is not None and float(np.max(np.abs(operator))) > deadband:
            return operator.copy()
        return autonomy.copy() if autonomy is not None else zero
    if operator is None:
        return zero
    if level is Level.SHARED:
        auto = autonomy if autonomy is not None else zero
        return (1.0 - alpha) * operator + alpha * auto
    return operator.copy()


@dataclass(frozen=True, slots=True)
class Transition:
    """One level change."""

    time: float
    from_level: Level
    to_level: Level
    reason: str


@dataclass(frozen=True, slots=True)
class ArbiterState:
    """What ``uq_msgs/AutonomyState`` reports (times on the arbiter's clock)."""

    level: Level
    previous_level: Level
    uncertainty: float
    uncertainty_signal: UncertaintySignal
    up_thresholds: tuple[float, ...]
    down_thresholds: tuple[float, ...]
    blend_alpha: float
    reason: str
    perception_stale: bool
    override_active: bool
    override_expires: float | None


@dataclass(frozen=True, slots=True)
class Step:
    """Result of one decision.

    ``changed`` is true when anything ``AutonomyState`` reports besides the uncertainty
    changed (level, reason, staleness, override), i.e. when the state should be republished.
    """

    state: ArbiterState
    command: NDArray[np.float64]
    transition: Transition | None
    changed: bool


def _as_twist(command: ArrayLike) -> NDArray[np.float64] | None:
    vec = np.asarray(command, dtype=np.float64).reshape(-1)
    if vec.shape != (TWIST_SIZE,) or not np.all(np.isfinite(vec)):
        return None
    return vec


class Arbiter:
    """Level-of-autonomy state machine with hysteresis, dwell, fail-safe and override.

    Not thread-safe: the caller serialises calls. Times are seconds on any monotonic clock
    and must not decrease (a smaller time is treated as the latest one seen).

    Parameters
    ----------
    config : ArbiterConfig
        Initial configuration.
    now : float
        Start time; the arbiter starts at teleoperation waiting for perception.
    """

    def __init__(self, config: ArbiterConfig, now: float) -> None:
        self._config = config
        self._now = now
        self._level = Level.TELEOPERATION
        self._previous = Level.TELEOPERATION
        self._last_change = now
        self._up_since: float | None = None
        self._reason = 'start-up: waiting for perception'
        self._frame: tuple[Sequence[DetectionSummary], int,
                           UncertaintyValues | None] | None = None
        self._perception = Perception(False, math.nan, 'no DetectionArray received yet')
        self._perception_time: float | None = None
        self._stale = True
        self._operator: NDArray[np.float64] | None = None
        self._operator_time = -math.inf
        self._autonomy: NDArray[np.float64] | None = None
        self._autonomy_time = -math.inf
        self._override: Level | None = None
        self._override_expires: float | None = None
        self._sent = np.zeros(TWIST_SIZE)
        self._sent_time: float | None = None

    @property
    def config(self) -> ArbiterConfig:
        """Configuration in force."""
        return self._config

    @property
    def level(self) -> Level:
        """Level in force after the latest decision."""
        return self._level

    def _clock(self, now: float) -> float:
        self._now = max(self._now, now)
        return self._now

    def set_config(self, config: ArbiterConfig, now: float) -> Step:
        """Switch configuration and decide again at once.

        The latest frame is re-assessed under the new signal and selection (its receipt time
        is kept, so the deadline still counts from it); the step-up timer restarts.
        """
        now = self._clock(now)
        self._config = config
        self._up_since = None
        if self._frame is not None:
            detections, num_classes, frame_uncertainty = self._frame
            self._perception = assess_frame(detections, num_classes, config, frame_uncertainty)
        return self.step(now)

    def observe(self, now: float, detections: Sequence[DetectionSummary],
                num_classes: int, frame_uncertainty: UncertaintyValues | None = None) -> Step:
        """Take a perception frame received at ``now`` and decide.

        Parameters
        ----------
        now : float
            Receipt time.
        detections : sequence of DetectionSummary
            The frame's detections.
        num_classes : int
            Number of class names in the frame (0 when the producer sends none).
        frame_uncertainty : UncertaintyValues, optional
            The frame-level uncertainty summary, checked too.
        """
        now = self._clock(now)
        self._frame = (detections, num_classes, frame_uncertainty)
        self._perception = assess_frame(detections, num_classes, self._config, frame_uncertainty)
        self._perception_time = now
        return self.step(now)

    def observe_invalid(self, now: float, reason: str) -> Step:
        """Take a frame found invalid before it was converted (too large, badly stamped,
        undecodable): it counts as no valid perception, and ``reason`` is reported."""
        now = self._clock(now)
        self._frame = None
        self._perception = Perception(False, math.nan, reason)
        self._perception_time = now
        return self.step(now)

    def reset(self, now: float, reason: str) -> Step:
        """Forget perception and fall to teleoperation, e.g. when the ROS clock jumps back
        (a bag replayed in a loop): frames and dwell timers from before the jump mean
        nothing after it. Commands and an active override are kept."""
        now = self._clock(now)
        self._frame = None
        self._perception = Perception(False, math.nan, reason)
        self._perception_time = None
        self._up_since = None
        return self.step(now)

    def command_to_send(self, now: float, command: ArrayLike) -> NDArray[np.float64]:
        """Apply the speed and acceleration limits to a command about to be sent to the
        robot, and remember it as the last one sent. Every published command goes through
        here (:func:`limit_command`)."""
        now = self._clock(now)
        dt = now - self._sent_time if self._sent_time is not None else 0.0
        vec = np.asarray(command, dtype=np.float64).reshape(TWIST_SIZE)
        self._sent = limit_command(vec, self._sent, dt, self._config)
        self._sent_time = now
        return self._sent.copy()

    def operator_command(self, now: float, command: ArrayLike) -> bool:
        """Record the operator's command (6 values); False, and ignored, if malformed."""
        vec = _as_twist(command)
        if vec is None:
            return False
        self._operator, self._operator_time = vec, self._clock(now)
        return True

    def autonomy_command(self, now: float, command: ArrayLike) -> bool:
        """Record the autonomy's command (6 values); False, and ignored, if malformed."""
        vec = _as_twist(command)
        if vec is None:
            return False
        self._autonomy, self._autonomy_time = vec, self._clock(now)
        return True

    def set_override(self, now: float, level: int, duration_s: float) -> tuple[bool, str, Step]:
        """Force a level for a while, or release the override.

        Parameters
        ----------
        now : float
            Request time.
        level : int
            0-3 forces that level (at once, without dwell); -1 releases.
        duration_s : float
            Length of the override; 0 keeps it until released.

        Returns
        -------
        success : bool
        message : str
            Outcome, or why the request was refused.
        step : Step
            The decision right after the request.

        Notes
        -----
        The fail-safe outranks an override: while perception is unusable the level stays
        teleoperation and the override waits (it still expires on time).
        """
        now = self._clock(now)
        if level == -1:
            was_active = self._override is not None
            self._override = None
            self._override_expires = None
            step = self.step(now, note='manual override released')
            return True, ('override released' if was_active else 'no override was active'), step
        if not 0 <= level < NUM_LEVELS:
            return False, f'level must be -1 (release) or 0..{NUM_LEVELS - 1}, got {level}', \
                self.step(now)
        if not math.isfinite(duration_s) or duration_s < 0.0:
            return False, f'duration must be finite and >= 0 s, got {duration_s}', self.step(now)
        self._override = Level(level)
        self._override_expires = now + duration_s if duration_s > 0.0 else None
        step = self.step(now)
        until = f'for {duration_s:g} s' if duration_s > 0.0 else 'until released'
        message = f'override to {Level(level).label} {until}'
        if step.state.perception_stale:
            message += f'; held at teleoperation while perception is unusable ({step.state.reason})'
        return True, message, step

    def _perception_verdict(self, now: float) -> tuple[bool, str]:
        if not self._perception.usable or self._perception_time is None:
            return False, self._perception.reason
        if now - self._perception_time > self._config.perception_deadline_s:
            return False, ('perception stale: no valid DetectionArray within '
                           f'{self._config.perception_deadline_s:g} s')
        return True, ''

    def _signal_target(self, now: float) -> tuple[Level, str]:
        cfg = self._config
        th = cfg.thresholds
        u = self._perception.uncertainty
        name = cfg.uncertainty_signal.value
        level = int(self._level)
        if level > 0 and u > th.down[level - 1]:
            self._up_since = None
            target = level
            while target > 0 and u > th.down[target - 1]:
                target -= 1
            return Level(target), (f'{name} {u:.4g} above down threshold {th.down[target]:.4g} '
                                   f'of {Level(target + 1).label}')
        if level < NUM_LEVELS - 1 and u < th.up[level]:
            if self._up_since is None:
                self._up_since = now
            dwell = cfg.min_dwell_s
            if now - self._up_since >= dwell and now - self._last_change >= dwell:
                return Level(level + 1), (f'{name} {u:.4g} below up threshold {th.up[level]:.4g} '
                                          f'for {dwell:g} s')
            return self._level, self._reason
        self._up_since = None
        return self._level, self._reason

    def step(self, now: float, note: str | None = None) -> Step:
        """Decide at ``now``: apply override expiry, fail-safe and hysteresis; give the command.

        Parameters
        ----------
        now : float
            Decision time.
        note : str, optional
            Reason to report if the level does not change (used for override release).
        """
        now = self._clock(now)
        before = (self._level, self._reason, self._stale, self._override is not None)
        if self._override_expires is not None and now >= self._override_expires:
            self._override = None
            self._override_expires = None
            note = 'manual override expired'
        usable, why = self._perception_verdict(now)
        if not usable:
            self._up_since = None
            target, reason = Level.TELEOPERATION, why
        elif self._override is not None:
            self._up_since = None
            target, reason = self._override, f'manual override to {self._override.label}'
        else:
            if self._stale:
                note = note or 'perception usable'
            target, reason = self._signal_target(now)
        transition = None
        if target != self._level:
            transition = Transition(now, self._level, target, reason)
            self._previous, self._level = self._level, target
            self._last_change = now
            self._up_since = None
            self._reason = reason
        elif not usable or self._override is not None:
            self._reason = reason  # why the level is held
        elif note is not None:
            self._reason = note
        self._stale = not usable
        after = (self._level, self._reason, self._stale, self._override is not None)
        return Step(self._state(), self._command(now), transition, after != before)

    def _state(self) -> ArbiterState:
        cfg = self._config
        u = self._perception.uncertainty if not self._stale else math.nan
        return ArbiterState(
            level=self._level, previous_level=self._previous, uncertainty=u,
            uncertainty_signal=cfg.uncertainty_signal, up_thresholds=cfg.thresholds.up,
            down_thresholds=cfg.thresholds.down, blend_alpha=blend_alpha(u, cfg),
            reason=self._reason, perception_stale=self._stale,
            override_active=self._override is not None,
            override_expires=self._override_expires)

    def _command(self, now: float) -> NDArray[np.float64]:
        cfg = self._config
        operator = self._operator if now - self._operator_time <= cfg.operator_timeout_s else None
        autonomy = self._autonomy if now - self._autonomy_time <= cfg.autonomy_timeout_s else None
        alpha = blend_alpha(self._perception.uncertainty, cfg)
        return command_for_level(self._level, operator, autonomy, alpha, cfg.operator_deadband)
