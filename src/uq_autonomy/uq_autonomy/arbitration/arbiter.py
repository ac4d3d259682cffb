"""Shared-autonomy arbiter: perception uncertainty to a level of autonomy and a command.

ROS-free core of the arbitration node (``arbitration_node.py`` only adapts messages,
parameters, QoS and timers to it). Everything here is deterministic: every entry point takes
the current time explicitly, in seconds of a monotonic clock, so tests drive it with
hand-built inputs and invented clocks.

Levels (``docs/arbitration.md``):

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

Restore after an outage: when perception becomes unusable at level ``L > 0`` (no override
in force), ``L`` is remembered. When usable perception from the same model
(``DetectionArray.model_id``) returns and every decision for ``resume_confirm_s`` from then
on finds ``u < up[L - 1]`` (the condition that let the level reach ``L``, stricter than
every lower level's), the level returns to ``L`` at once instead of climbing one level per
dwell, provided this happens within ``resume_window_s`` of the last usable frame before
the outage: a detector restarted after a crash gets back the trust its percept had earned,
once its own frames show the same certainty. A decision that finds otherwise, the end of
the window, another model, an override or a reset forget ``L``, and the climb is the normal
one. The fail-safe itself is
unchanged: no perception is still teleoperation, and down steps are still immediate.

Suspect targets: while the driving detection's track is suspect (its evidence over its
views says unfamiliar, :mod:`uq_autonomy.arbitration.suspect`), the level is at most
guided: a higher level steps down to guided at once, and no climb goes past it, whatever
the frame's own score, until the track is confirmed familiar or labelled as the target.
The same cap holds while another object in view also passes for ``target_class`` (a
rival, :meth:`~uq_autonomy.arbitration.suspect.SuspectGate.find_rival`).
``suspect_hold`` reports the cap when it holds back a level the signal alone would give.
A manual override outranks the cap (the operator chose the level). A perception outage
forgets the suspect tracks.

Fail-safe: when perception is unusable (no valid ``DetectionArray`` within the deadline, an
invalid one -- any bad field, stamp or size, see :func:`assess_frame` -- none holding the
driving detection, or a signal the loaded model cannot give, see :func:`signal_problem`) the
level is teleoperation, whatever the signal or a manual override says. An operator command
older than its timeout counts as zero at levels 0-2; an autonomy command older than its
timeout counts as zero everywhere.
"""


from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from uq_autonomy.arbitration.config import (
    NUM_LEVELS,
    TWIST_SIZE,
    ArbiterConfig,
    Level,
    ModelRange,
    UncertaintySignal,
    model_range_problem,
    signal_problem,
)
from uq_autonomy.arbitration.frame_validity import (
    DetectionSummary,
    Perception,
    UncertaintyValues,
    assess_frame,
)
from uq_autonomy.arbitration.suspect import NOT_SUSPECT, DrivingTrack, SuspectGate


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
    suspect_hold: bool = False
    suspect_track_id: int = -1
    track_score: float = math.nan


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


@dataclass(frozen=True, slots=True)
class _Outage:
    """What perception had earned when it was lost, for the restore after an outage."""

    level: Level
    model_id: str | None
    last_usable: float


@dataclass(frozen=True, slots=True)
class _Frame:
    """The parts of the latest judged frame needed to judge it again."""

    detections: Sequence[DetectionSummary]
    num_classes: int
    uncertainty: UncertaintyValues | None
    model: ModelRange | None


def _driving_track(d: DetectionSummary) -> DrivingTrack:
    """What the suspect gate reads of a detection."""
    return DrivingTrack(d.track_id, d.class_id, d.center_x, d.center_y, d.width, d.height,
                        d.calibrated_score, d.track_score, d.track_views, d.track_labelled)


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
        self._frame: _Frame | None = None
        self._perception = Perception(False, math.nan, 'no DetectionArray received yet')
        self._signal_problem: str | None = None
        self._autonomy_target: int | None = None
        self._autonomy_target_time = -math.inf
        self._perception_time: float | None = None
        self._last_usable: float | None = None
        self._outage: _Outage | None = None
        self._restore_since: float | None = None
        self._stale = True
        self._operator: NDArray[np.float64] | None = None
        self._operator_time = -math.inf
        self._autonomy: NDArray[np.float64] | None = None
        self._autonomy_time = -math.inf
        self._override: Level | None = None
        self._override_expires: float | None = None
        self._sent = np.zeros(TWIST_SIZE)
        self._sent_time: float | None = None
        self._gate = SuspectGate()
        self._suspect = NOT_SUSPECT
        self._suspect_hold = False
        self._capped = False  # the suspect gate holds the level at guided
        self._track_score = math.nan

    @property
    def config(self) -> ArbiterConfig:
        """Configuration in force."""
        return self._config

    @property
    def level(self) -> Level:
        """Level in force after the latest decision."""
        return self._level

    @property
    def signal_problem(self) -> str | None:
        """Why the signal and thresholds in force cannot gate the loaded model's detections
        (:func:`signal_problem`), as found on the latest frame; None when they can."""
        return self._signal_problem

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
            judged = self._judge(self._frame, now)
            # The frame was judged once; a target it lacks under the new selection leaves
            # it without a verdict of its own, like a frame that never came.
            self._perception = judged if not judged.target_missing else Perception(
                False, math.nan, judged.reason)
        return self.step(now)

    def _judge(self, frame: _Frame, now: float) -> Perception:
        """Verdict on ``frame`` under the configuration, its model and the autonomy's
        announced target in force at ``now``."""
        cfg = self._config
        self._signal_problem = None
        if frame.model is not None:
            problem = model_range_problem(frame.model)
            if problem is not None:
                return Perception(False, math.nan, f'invalid DetectionArray: {problem}')
            signal = cfg.uncertainty_signal
            self._signal_problem = signal_problem(signal, f'thresholds.{signal.value}.down',
                                                  cfg.thresholds.down, frame.model)
            if self._signal_problem is not None:
                return Perception(False, math.nan, f'refused: {self._signal_problem}')
        fresh = now - self._autonomy_target_time <= cfg.autonomy_timeout_s
        return assess_frame(frame.detections, frame.num_classes, cfg, frame.uncertainty,
                            self._autonomy_target if fresh else None)

    def autonomy_target(self, now: float, track_id: int) -> None:
        """Record the track the autonomy is reaching for (negative: none), for
        ``driving_detection`` ``autonomy_target``.

        The next frame is judged on it; an announcement older than ``autonomy_timeout_s``
        counts as none.
        """
        self._autonomy_target = int(track_id)
        self._autonomy_target_time = self._clock(now)

    def observe(self, now: float, detections: Sequence[DetectionSummary],
                num_classes: int, frame_uncertainty: UncertaintyValues | None = None,
                model: ModelRange | None = None) -> Step:
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
        model : ModelRange, optional
            What the frame says about its model; with it, a signal the model cannot give
            is refused (:func:`signal_problem`, reported by :attr:`signal_problem`).

        Notes
        -----
        Under ``driving_detection`` ``autonomy_target`` a valid frame without the announced
        track counts as no new perception: the previous verdict stands until
        ``perception_deadline_s`` after the last frame that had it. The announcement and
        the frame come on separate topics, so the frame at hand may predate a newly chosen
        target; a target missing for longer is the fail-safe's.
        """
        now = self._clock(now)
        frame = _Frame(detections, num_classes, frame_uncertainty, model)
        judged = self._judge(frame, now)
        if judged.target_missing:
            if not self._perception.usable:
                self._perception = judged
            return self.step(now)
        self._frame = frame
        self._perception = judged
        self._perception_time = now
        self._suspect, self._track_score = NOT_SUSPECT, math.nan
        if judged.usable:
            self._last_usable = now
            if 0 <= judged.index < len(detections):
                self._judge_track(detections, judged.index)
        return self.step(now)

    def _judge_track(self, detections: Sequence[DetectionSummary], index: int) -> None:
        driving = _driving_track(detections[index])
        self._track_score = driving.track_score
        config, target_class = self._config.suspect, self._config.target_class
        if config.enabled and config.hold_on_rival and target_class:
            self._gate.count_readings(detections, target_class)
            candidates = (_driving_track(d) for d in detections if d.class_id == target_class)
            rival = self._gate.find_rival(driving, candidates, config, target_class)
        else:
            rival = None
        self._suspect = self._gate.judge(driving, config, target_class, rival)

    def observe_invalid(self, now: float, reason: str) -> Step:
        """Take a frame found invalid before it was converted (too large, badly stamped,
        undecodable): it counts as no valid perception, and ``reason`` is reported."""
        now = self._clock(now)
        self._frame = None
        self._perception = Perception(False, math.nan, reason)
        self._perception_time = now
        self._suspect, self._track_score = NOT_SUSPECT, math.nan
        return self.step(now)

    def reset(self, now: float, reason: str) -> Step:
        """Forget perception and fall to teleoperation, e.g. when the ROS clock jumps back
        (a bag replayed in a loop): frames and dwell timers from before the jump mean
        nothing after it. Commands and an active override are kept."""
        now = self._clock(now)
        self._frame = None
        self._perception = Perception(False, math.nan, reason)
        self._perception_time = None
        self._last_usable = None
        self._up_since = None
        self._outage = None
        self._gate.reset()
        self._suspect, self._track_score = NOT_SUSPECT, math.nan
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
        # The operator took the level over: what perception had earned before an outage is
        # no longer the level to come back to, whether or not perception is usable now.
        self._outage = self._restore_since = None
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

    def _model_id(self) -> str | None:
        frame = self._frame
        return frame.model.model_id if frame is not None and frame.model is not None else None

    def _remember_outage(self) -> None:
        """At the first decision without usable perception: remember the level it had earned."""
        if self._stale or self._override is not None or self._last_usable is None:
            return
        if self._level > Level.TELEOPERATION and self._config.resume_window_s > 0.0:
            self._outage = _Outage(self._level, self._model_id(), self._last_usable)

    def _restored_level(self, now: float) -> tuple[Level, str] | None:
        """The level held before an outage, once the returning perception has confirmed it
        for ``resume_confirm_s``; None while it has not (or never will: then forgotten)."""
        outage, cfg = self._outage, self._config
        if outage is None:
            return None
        u = self._perception.uncertainty
        up = cfg.thresholds.up[outage.level - 1]
        if (self._level >= outage.level or self._model_id() != outage.model_id
                or now - outage.last_usable > cfg.resume_window_s or not u < up):
            self._outage, self._restore_since = None, None
            return None
        if self._restore_since is None:
            self._restore_since = now
        if now - self._restore_since < cfg.resume_confirm_s:
            return None
        self._outage, self._restore_since = None, None
        return outage.level, (f'{cfg.uncertainty_signal.value} {u:.4g} below up threshold '
                              f'{up:.4g} of {outage.level.label} for '
                              f'{cfg.resume_confirm_s:g} s after a perception outage: '
                              'level before the outage restored')

    def _signal_target(self, now: float) -> tuple[Level, str]:
        """The level the signal gives, capped at guided while the driving track is
        suspect; sets ``suspect_hold`` when the cap holds back a higher level."""
        restored = self._restored_level(now)
        target, reason = restored if restored is not None else self._climb_target(now)
        self._suspect_hold = self._capped = self._suspect.suspect and target > Level.GUIDED
        if self._capped:
            return Level.GUIDED, self._suspect.reason
        return target, reason

    def _climb_target(self, now: float) -> tuple[Level, str]:
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
        before = (self._level, self._reason, self._stale, self._override is not None,
                  self._suspect_hold)
        self._suspect_hold = self._capped = False
        if self._override_expires is not None and now >= self._override_expires:
            self._override = None
            self._override_expires = None
            note = 'manual override expired'
        usable, why = self._perception_verdict(now)
        if not usable:
            # A detector restarted during the outage numbers its tracks anew, so a suspect
            # id would pass to another object; a suspect object that comes back is marked
            # again by the evidence its detector kept.
            self._gate.reset()
            self._remember_outage()
            self._up_since = self._restore_since = None
            target, reason = Level.TELEOPERATION, why
        elif self._override is not None:
            self._up_since = None
            self._outage = self._restore_since = None
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
        elif not usable or self._override is not None or self._capped:
            self._reason = reason  # why the level is held
        elif note is not None:
            self._reason = note
        self._stale = not usable
        after = (self._level, self._reason, self._stale, self._override is not None,
                 self._suspect_hold)
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
            override_expires=self._override_expires, suspect_hold=self._suspect_hold,
            suspect_track_id=self._suspect.track_id,
            track_score=self._track_score if not self._stale else math.nan)

    def _command(self, now: float) -> NDArray[np.float64]:
        cfg = self._config
        operator = self._operator if now - self._operator_time <= cfg.operator_timeout_s else None
        autonomy = self._autonomy if now - self._autonomy_time <= cfg.autonomy_timeout_s else None
        alpha = blend_alpha(self._perception.uncertainty, cfg)
        return command_for_level(self._level, operator, autonomy, alpha, cfg.operator_deadband)
