"""Configuration of the shared-autonomy arbiter: levels, uncertainty signals, thresholds.

ROS-free. :class:`ArbiterConfig` validates itself when built, so an arbiter never runs on
thresholds that cannot work (see ``uq_autonomy.arbiter`` for what they mean).
"""

from __future__ import annotations

import math
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
