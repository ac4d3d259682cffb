"""A scripted human operator for the grasp task (ROS-free).

The operator knows where the true target is (ground truth from the simulator) and drives
the gripper there more slowly and less precisely than the autonomy:

- **speed** ``speed`` m/s, slowing down (``gain``) near the goal;
- **noise**: the heading wanders (a first-order random walk, ``heading_noise`` rad std,
  time constant ``noise_tau_s``), and the goal is seen with a fixed offset of
  ``aim_error`` metres std per trial, smaller than the grasp radius;
- **grasp**: within ``stop_radius`` of its goal it stops and closes the gripper
  (``linear.z = -grasp_speed``);
- **reaction delay**: the operator acts on the autonomy level seen ``reaction_delay_s``
  ago, so taking over after a level drop, or letting go after a climb, comes late;
- **mode**: ``teleoperation`` always drives; ``supervise`` drives while the (delayed)
  level is at most ``engage_below_level`` and keeps hands off above it (the autonomy
  works); ``hands_off`` never drives (full autonomy).

Bad input never becomes a command: a ``task_state`` that breaks :func:`parse_task_state`
is refused, a non-finite goal is refused by :meth:`ScriptedOperator.set_goal`, and a
non-finite gripper position gives a zero command.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

import numpy as np

from uq_common.json_text import parse_json_object

OPERATOR_MODES = ('teleoperation', 'supervise', 'hands_off')
# The sim's task_state is about 1 kB; far longer text is malformed or hostile.
MAX_TASK_STATE_CHARS = 65536


@dataclass(frozen=True)
class TaskGoal:
    """What the operator takes from one ``task_state``: the trial, whether it runs, the
    true target's table position (None when the trial has no target: the operator holds)
    and the trial's elapsed time."""

    trial: int
    running: bool
    target_xy: tuple[float, float] | None
    elapsed_s: float


def _finite_number(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) \
            or not math.isfinite(value):
        raise ValueError(f'{what} must be a finite number, got {value!r:.40}')
    return float(value)


def parse_task_state(text: str) -> TaskGoal:
    """The goal in a ``task_state`` JSON text (see ``uq_sim.grasp_task.TaskMonitor``).

    Raises
    ------
    ValueError
        Naming the first rule broken: too long, not a JSON object, ``trial`` not an integer
        >= 0, ``status`` not a string, ``target`` neither null (no target in the trial) nor
        the name of an entry of ``objects``, its ``x``/``y`` or ``elapsed_s`` (default 0)
        not finite numbers.
    """
    task = parse_json_object(text, 'task_state', MAX_TASK_STATE_CHARS)
    trial = task.get('trial')
    if isinstance(trial, bool) or not isinstance(trial, int) or trial < 0:
        raise ValueError(f'trial must be an integer >= 0, got {trial!r:.40}')
    status = task.get('status')
    if not isinstance(status, str):
        raise ValueError(f'status must be a string, got {status!r:.40}')
    objects, name = task.get('objects'), task.get('target')
    if not isinstance(objects, list):
        raise ValueError('objects must be a list')
    elapsed = _finite_number(task.get('elapsed_s', 0.0), 'elapsed_s')
    if name is None:  # a trial without a target: nothing to reach for
        return TaskGoal(trial, status == 'running', None, elapsed)
    target = next((o for o in objects if isinstance(o, dict) and o.get('name') == name), None)
    if not isinstance(name, str) or target is None:
        raise ValueError(f'target {name!r:.40} names none of the objects')
    xy = (_finite_number(target.get('x'), 'target x'), _finite_number(target.get('y'),
                                                                      'target y'))
    return TaskGoal(trial, status == 'running', xy, elapsed)


@dataclass(frozen=True)
class OperatorConfig:
    """Behaviour of the scripted operator (m/s, seconds, radians, metres)."""

    mode: str = 'supervise'
    speed: float = 0.07
    gain: float = 1.5
    stop_radius: float = 0.015
    reaction_delay_s: float = 0.8
    heading_noise: float = 0.25
    noise_tau_s: float = 0.5
    aim_error: float = 0.006
    engage_below_level: int = 2
    grasp_speed: float = 0.05

    def __post_init__(self) -> None:
        if self.mode not in OPERATOR_MODES:
            raise ValueError(f'mode must be one of {OPERATOR_MODES}, got {self.mode!r}')
        for name in ('speed', 'gain', 'noise_tau_s'):
            if not getattr(self, name) > 0.0:
                raise ValueError(f'{name} must be > 0, got {getattr(self, name)}')
        for name in ('stop_radius', 'reaction_delay_s', 'heading_noise', 'aim_error'):
            if not getattr(self, name) >= 0.0:
                raise ValueError(f'{name} must be >= 0, got {getattr(self, name)}')


class ScriptedOperator:
    """Turns the true goal, the gripper position and the seen level into a command."""

    def __init__(self, config: OperatorConfig | None = None, seed: int = 0) -> None:
        self.config = config or OperatorConfig()
        self._rng = np.random.default_rng(seed)
        self._goal: np.ndarray | None = None
        self._heading_error = 0.0
        self._last_time: float | None = None
        self._level_times: list[float] = []
        self._levels: list[int] = []

    def set_goal(self, xy: tuple[float, float], trial_seed: int) -> None:
        """The true target's position; the aim error is drawn once per trial.

        Raises
        ------
        ValueError
            If ``xy`` is not finite or ``trial_seed`` is negative; the goal is unchanged.
        """
        if not all(math.isfinite(v) for v in xy) or trial_seed < 0:
            raise ValueError(f'goal {xy} of trial {trial_seed} refused: the position must be '
                             'finite and the trial >= 0')
        aim = np.random.default_rng([trial_seed, 99]).normal(0.0, self.config.aim_error, 2)
        self._goal = np.asarray(xy, float) + aim

    def clear_goal(self) -> None:
        """No task in progress: the operator stops."""
        self._goal = None

    def observe_level(self, level: int, now: float) -> None:
        """Record the autonomy level shown to the operator at ``now``."""
        if self._levels and level == self._levels[-1]:
            return
        self._level_times.append(now)
        self._levels.append(int(level))

    def perceived_level(self, now: float) -> int:
        """The level the operator has reacted to by ``now`` (0 before any is seen)."""
        k = bisect.bisect_right(self._level_times, now - self.config.reaction_delay_s)
        return self._levels[k - 1] if k > 0 else 0

    def engaged(self, now: float) -> bool:
        """Whether the operator is driving at ``now``."""
        mode = self.config.mode
        if mode == 'hands_off' or self._goal is None:
            return False
        return (mode == 'teleoperation'
                or self.perceived_level(now) <= self.config.engage_below_level)

    def command(self, gripper_xy: tuple[float, float], now: float) -> tuple[float, float, float]:
        """``(vx, vy, vz)`` at ``now``: zero while not engaged or when ``gripper_xy`` is not
        finite; at the goal, grasp."""
        dt = 0.0 if self._last_time is None else max(0.0, now - self._last_time)
        self._last_time = now
        tau = self.config.noise_tau_s
        decay = math.exp(-dt / tau)
        self._heading_error = (decay * self._heading_error + self.config.heading_noise
                               * math.sqrt(1.0 - decay * decay) * float(self._rng.normal()))
        if not self.engaged(now) or not all(math.isfinite(v) for v in gripper_xy[:2]):
            return 0.0, 0.0, 0.0
        delta = self._goal - np.asarray(gripper_xy, float)[:2]
        distance = float(np.linalg.norm(delta))
        if distance <= self.config.stop_radius:
            return 0.0, 0.0, -self.config.grasp_speed
        speed = min(self.config.speed, self.config.gain * distance)
        # Heading noise fades near the goal: a person homes in by eye.
        angle = math.atan2(delta[1], delta[0]) + self._heading_error * min(1.0, distance / 0.05)
        return speed * math.cos(angle), speed * math.sin(angle), 0.0
