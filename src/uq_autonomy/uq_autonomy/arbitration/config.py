"""Configuration of the shared-autonomy arbiter: levels, uncertainty signals, thresholds.

ROS-free. :class:`ArbiterConfig` validates itself when built, so an arbiter never runs on
thresholds that cannot work (see ``uq_autonomy.arbitration.arbiter`` for what they mean).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum, IntEnum

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
    """Which epistemic uncertainty of a detection drives the level.

    ``calibrated_score`` (the default) is the fraction of the model's known validation
    objects whose GP variance is below the detection's, in [0, 1]: its thresholds mean the
    same for every model. ``gp_variance`` (logit^2) and ``mutual_information`` (nats) are
    in the units of one model's GP: thresholds in them hold for that model only.
    """

    CALIBRATED_SCORE = 'calibrated_score'
    GP_VARIANCE = 'gp_variance'
    MUTUAL_INFORMATION = 'mutual_information'


# ``Uncertainty.calibrated_score`` of a model without a score reference (outside [0, 1]).
NO_CALIBRATED_SCORE = -1.0
# Uncertainty.track_score of a detection without track evidence (untracked, or no score).
NO_TRACK_SCORE = -1.0
# ``DetectionArray.reference_variance_max`` / ``ood_threshold`` when the model has none.
NO_MODEL_FIGURE = -1.0
# Raw GP-variance thresholds more than this many times the loaded model's largest
# validation variance cannot fire for it (its unknown objects stay within a few times that).
RAW_THRESHOLD_REACH = 10.0


class DrivingDetection(StrEnum):
    """How the detection that drives the decision is chosen among those of a frame."""

    HIGHEST_UNCERTAINTY = 'highest_uncertainty'
    TARGET_CLASS = 'target_class'
    TRACK_ID = 'track_id'
    NEAREST_CENTER = 'nearest_center'
    # The track the autonomy announces it is reaching for (``autonomy/target_track_id``).
    AUTONOMY_TARGET = 'autonomy_target'


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


@dataclass(frozen=True, slots=True)
class SuspectConfig:
    """Parameters of the suspect gate (``suspect.*`` of ``config/arbitration.yaml``; the
    rule is in :mod:`uq_autonomy.arbitration.suspect`).

    Raises
    ------
    ValueError
        On an out-of-range value, naming it.
    """

    enabled: bool = True
    threshold: float = 0.91
    min_views: int = 3
    confirm_frames: int = 5
    confirm_view_change: float = 0.1
    hold_on_rival: bool = True

    def __post_init__(self) -> None:
        _require(isinstance(self.enabled, bool), f'suspect.enabled must be a bool, got '
                                                 f'{self.enabled!r}')
        _require(isinstance(self.hold_on_rival, bool), 'suspect.hold_on_rival must be a bool, '
                                                       f'got {self.hold_on_rival!r}')
        _require(math.isfinite(self.threshold) and 0.0 < self.threshold < 1.0,
                 f'suspect.threshold must lie in (0, 1) (a track score is a fraction), got '
                 f'{self.threshold}')
        _require(self.min_views >= 1, f'suspect.min_views must be >= 1, got {self.min_views}')
        _require(self.confirm_frames >= 1,
                 f'suspect.confirm_frames must be >= 1, got {self.confirm_frames}')
        _require(math.isfinite(self.confirm_view_change) and self.confirm_view_change >= 0.0,
                 'suspect.confirm_view_change must be finite and >= 0, got '
                 f'{self.confirm_view_change}')


@dataclass(frozen=True)
class ArbiterConfig:
    """Everything that tunes the arbiter; validated on construction.

    Parameters
    ----------
    uncertainty_signal : UncertaintySignal or str
        Signal that drives the level.
    calibrated_score_thresholds, gp_variance_thresholds, mutual_information_thresholds : Thresholds
        Thresholds per signal (unitless score in (0, 1), logit^2 and nats), so switching the
        signal at run time switches to thresholds in the right unit. The defaults: score
        thresholds of the simulation profile (``config/arbitration.yaml``); raw ones that
        suit the shipped model only (``docs/arbitration.md``).
    driving_detection : DrivingDetection or str
        How the driving detection is chosen in a frame; ``autonomy_target`` follows the
        track the autonomy announces
        (:meth:`uq_autonomy.arbitration.arbiter.Arbiter.autonomy_target`).
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
    resume_window_s : float
        Longest perception outage after which the level held before it may be restored
        without climbing again (``uq_autonomy.arbitration.arbiter``, "Restore after an
        outage"); 0: never,
        the climb always starts again from teleoperation.
    resume_confirm_s : float
        How long the returning perception must confirm the level held before the outage
        before it is restored.
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
    suspect : SuspectConfig
        The suspect gate: a driving track whose evidence over its views says unfamiliar
        keeps the level at guided (:mod:`uq_autonomy.arbitration.suspect`).

    Raises
    ------
    ValueError
        On any inconsistent or out-of-range value, naming it.
    """

    uncertainty_signal: UncertaintySignal = UncertaintySignal.CALIBRATED_SCORE
    calibrated_score_thresholds: Thresholds = field(
        default_factory=lambda: Thresholds(up=(0.95, 0.93, 0.91), down=(0.98, 0.95, 0.93)))
    gp_variance_thresholds: Thresholds = field(
        default_factory=lambda: Thresholds(up=(3.3e-4, 3.0e-4, 2.8e-4),
                                           down=(3.7e-4, 3.4e-4, 3.1e-4)))
    mutual_information_thresholds: Thresholds = field(
        default_factory=lambda: Thresholds(up=(0.3, 0.15, 0.05), down=(0.5, 0.3, 0.1)))
    driving_detection: DrivingDetection = DrivingDetection.HIGHEST_UNCERTAINTY
    target_class: str = ''
    target_track_id: int = -1
    image_width: int = 640
    image_height: int = 480
    min_dwell_s: float = 1.0
    perception_deadline_s: float = 0.5
    resume_window_s: float = 5.0
    resume_confirm_s: float = 0.2
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
    suspect: SuspectConfig = field(default_factory=SuspectConfig)

    def __post_init__(self) -> None:
        object.__setattr__(self, 'uncertainty_signal', parse_enum(
            UncertaintySignal, self.uncertainty_signal, 'uncertainty_signal'))
        object.__setattr__(self, 'driving_detection', parse_enum(
            DrivingDetection, self.driving_detection, 'driving_detection'))
        score = self.calibrated_score_thresholds
        # A score lies in [0, 1]: a down threshold at 1 or above could never end a level,
        # an up threshold at 0 could never start one.
        _require(score.down[0] < 1.0 and score.up[-1] > 0.0,
                 'calibrated_score thresholds must lie in (0, 1) (a score is a fraction in '
                 f'[0, 1]), got up={list(score.up)} down={list(score.down)}')
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
        for name in ('resume_window_s', 'resume_confirm_s'):
            value = getattr(self, name)
            _require(_finite(value) and value >= 0.0,
                     f'{name} must be finite and >= 0, got {value}')
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
        if self.uncertainty_signal is UncertaintySignal.GP_VARIANCE:
            return self.gp_variance_thresholds
        return self.calibrated_score_thresholds


@dataclass(frozen=True, slots=True)
class ModelRange:
    """What a ``uq_msgs/DetectionArray`` says about the model that produced it.

    Attributes
    ----------
    model_id : str
        The detector weights and GP artefact.
    reference_variance_max : float
        Largest GP variance (logit^2) of the known validation objects behind the
        calibrated score, the model's range of raw variance; :data:`NO_MODEL_FIGURE` when
        the model has no score reference (and so no calibrated score). 0, the value of a
        producer that leaves the field unset, counts as none too: no GP gives every
        validation object a variance of exactly 0.
    ood_threshold : float
        GP variance above which the detector flags a detection out of distribution;
        :data:`NO_MODEL_FIGURE` when it has none.
    """

    model_id: str = ''
    reference_variance_max: float = NO_MODEL_FIGURE
    ood_threshold: float = NO_MODEL_FIGURE

    @property
    def has_score_reference(self) -> bool:
        """Whether the model's detections carry a calibrated score."""
        return self.reference_variance_max > 0.0


def model_range_problem(model: ModelRange) -> str | None:
    """Why ``model``'s figures are not valid message values, or None: each is finite and
    either >= 0 or exactly :data:`NO_MODEL_FIGURE`."""
    for name in ('reference_variance_max', 'ood_threshold'):
        value = getattr(model, name)
        if not math.isfinite(value) or (value < 0.0 and value != NO_MODEL_FIGURE):
            return f'{name} {value} is neither >= 0 nor {NO_MODEL_FIGURE:g} (none)'
    return None


def signal_problem(signal: UncertaintySignal, raw_thresholds: str, down: Sequence[float],
                   model: ModelRange) -> str | None:
    """Why ``signal`` with these down thresholds cannot gate detections of ``model``, or None.

    Parameters
    ----------
    signal : UncertaintySignal
        The signal in force.
    raw_thresholds : str
        Name of the parameter holding the raw GP-variance thresholds, for the message.
    down : sequence of float
        The thresholds that end a level (or the one threshold that raises a request).
    model : ModelRange
        The loaded model's figures, from its latest ``DetectionArray``.

    Returns
    -------
    str or None
        One line naming the parameter and the model's range when

        * the signal is ``calibrated_score`` and the model has no score reference (every
          score is -1), or
        * the signal is ``gp_variance`` and the largest threshold is more than
          :data:`RAW_THRESHOLD_REACH` times the model's largest validation variance: such a
          threshold is written for another model and would never hand control back.
    """
    name = model.model_id or 'without a model id'
    if signal is UncertaintySignal.CALIBRATED_SCORE and not model.has_score_reference:
        return (f'uncertainty signal calibrated_score: model {name!r} has no score reference '
                f'(reference_variance_max {model.reference_variance_max:g}; its '
                'calibrated_score means nothing); add one with `python -m '
                'uq_perception.training.score_reference`, or use gp_variance with thresholds '
                'calibrated for this model')
    if signal is UncertaintySignal.GP_VARIANCE and model.has_score_reference:
        reach = RAW_THRESHOLD_REACH * model.reference_variance_max
        largest = max(down)
        if largest > reach:
            return (f'{raw_thresholds} {_listed(down)} cannot fire for model {name!r}: its '
                    f'known validation objects have GP variance 0 to '
                    f'{model.reference_variance_max:.3g} logit^2, and {largest:g} is above '
                    f'{RAW_THRESHOLD_REACH:g}x that; use calibrated_score or raw thresholds '
                    'calibrated for this model (docs/arbitration.md)')
    return None


def _listed(values: Sequence[float]) -> str:
    return '[' + ', '.join(f'{v:g}' for v in values) + ']'
