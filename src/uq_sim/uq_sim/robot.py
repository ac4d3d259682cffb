"""A velocity-controlled gripper for the tabletop world (ROS-free).

The gripper's tool point moves in the horizontal plane at a fixed hover height above the
table, commanded by a planar velocity (``cmd_vel``: ``linear.x``, ``linear.y`` in m/s, world
frame). :class:`VelocityGripper` integrates the latest command at the physics rate under
documented limits:

- **speed**: the commanded planar velocity is scaled down to at most ``max_speed`` (the
  direction is kept), so a huge command moves the gripper at full speed, never further;
- **acceleration**: the velocity changes by at most ``max_accel * dt`` per step, so a step
  command ramps up and a stop ramps down;
- **non-finite commands** (NaN, inf in any component) are rejected with a ``ValueError``
  and never stored: the previous command stays in force and ages as usual;
- **stale commands**: a command older than ``command_timeout_s`` counts as zero (the
  gripper brakes at ``max_accel``), so a dead publisher cannot leave the robot moving;
- **workspace**: the tool point stays inside ``workspace`` (x and y bounds); the velocity
  component pushing out of it is zeroed at the border.
- **grasp**: the tool point keeps its hover height; a downward ``linear.z`` below
  ``-grasp_command`` m/s is the command to close the gripper (descend and grasp) where it
  is. It ages like the planar command (stale means "do not grasp").

Time is passed in by the caller (seconds, any monotonic origin), so the same core runs on
the wall clock, on simulated time, and in tests with hand-picked times.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class GripperLimits:
    """Limits of the velocity-controlled gripper.

    Attributes
    ----------
    max_speed : float
        Planar speed limit, m/s.
    max_accel : float
        Planar acceleration limit, m/s².
    command_timeout_s : float
        A command older than this counts as zero, seconds.
    workspace : tuple of float
        ``(x_min, x_max, y_min, y_max)`` of the tool point, metres (table frame).
    hover_height : float
        Height of the tool point above the table while moving, metres.
    """

    max_speed: float = 0.25
    max_accel: float = 1.0
    command_timeout_s: float = 0.5
    workspace: tuple[float, float, float, float] = (-0.32, 0.32, -0.3, 0.25)
    hover_height: float = 0.12
    grasp_command: float = 0.02

    def __post_init__(self) -> None:
        for name in ('max_speed', 'max_accel', 'command_timeout_s', 'hover_height',
                     'grasp_command'):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0.0):
                raise ValueError(f'{name} must be finite and > 0, got {value}')
        x0, x1, y0, y1 = self.workspace
        if not all(math.isfinite(v) for v in self.workspace) or x0 >= x1 or y0 >= y1:
            raise ValueError(f'workspace must be finite (x_min < x_max, y_min < y_max), '
                             f'got {self.workspace}')


class VelocityGripper:
    """Integrates planar velocity commands into the gripper's tool-point position.

    Parameters
    ----------
    start : (float, float)
        Initial tool-point position (x, y), clipped into the workspace.
    limits : GripperLimits
        Speed, acceleration, timeout and workspace limits.
    """

    def __init__(self, start: tuple[float, float], limits: GripperLimits | None = None) -> None:
        self.limits = limits or GripperLimits()
        self._pos = self._clip(np.asarray(start, float))
        self._vel = np.zeros(2)
        self._command = np.zeros(2)
        self._command_time: float | None = None
        self._grasp = False
        self.rejected_commands = 0

    @property
    def position(self) -> np.ndarray:
        """Tool point ``(x, y, z)`` in the table frame, metres."""
        return np.array([self._pos[0], self._pos[1], self.limits.hover_height])

    @property
    def velocity(self) -> np.ndarray:
        """Current planar velocity ``(vx, vy)``, m/s."""
        return self._vel.copy()

    def command(self, vx: float, vy: float, now: float, vz: float = 0.0) -> None:
        """Store a velocity command received at time ``now`` (``vz``: grasp, see above).

        Raises
        ------
        ValueError
            If a component or the time is not finite; the command is not stored.
        """
        if not all(math.isfinite(v) for v in (vx, vy, vz, now)):
            self.rejected_commands += 1
            raise ValueError(f'non-finite velocity command ({vx}, {vy}, {vz}) at t={now} '
                             'rejected')
        self._command = self._limit_speed(np.array([vx, vy], float))
        self._grasp = vz < -self.limits.grasp_command
        self._command_time = now

    def active_command(self, now: float) -> np.ndarray:
        """The command in force at ``now``: the latest one, or zero once it is stale."""
        if self._stale(now):
            return np.zeros(2)
        return self._command.copy()

    def grasp_commanded(self, now: float) -> bool:
        """Whether a fresh command asks to close the gripper."""
        return self._grasp and not self._stale(now)

    def _stale(self, now: float) -> bool:
        return (self._command_time is None
                or now - self._command_time > self.limits.command_timeout_s)

    def step(self, dt: float, now: float) -> np.ndarray:
        """Advance ``dt`` seconds ending at ``now``; returns the new position.

        Raises
        ------
        ValueError
            If ``dt`` is not finite and positive.
        """
        if not (math.isfinite(dt) and dt > 0.0):
            raise ValueError(f'dt must be finite and > 0, got {dt}')
        target = self.active_command(now)
        change = target - self._vel
        max_change = self.limits.max_accel * dt
        norm = float(np.linalg.norm(change))
        if norm > max_change:
            change *= max_change / norm
        self._vel = self._limit_speed(self._vel + change)
        moved = self._clip(self._pos + self._vel * dt)
        # Zero the velocity components the workspace border stopped.
        x0, x1, y0, y1 = self.limits.workspace
        for axis, (low, high) in enumerate(((x0, x1), (y0, y1))):
            if (moved[axis] <= low and self._vel[axis] < 0) or (
                    moved[axis] >= high and self._vel[axis] > 0):
                self._vel[axis] = 0.0
        self._pos = moved
        return self.position

    def reset(self, start: tuple[float, float]) -> None:
        """Put the gripper at ``start`` at rest and forget the command."""
        self._pos = self._clip(np.asarray(start, float))
        self._vel = np.zeros(2)
        self._command = np.zeros(2)
        self._command_time = None
        self._grasp = False

    def _limit_speed(self, v: np.ndarray) -> np.ndarray:
        # Normalise by the largest component first: the norm of a huge finite command
        # (1e300) would overflow to inf and lose its direction.
        scale = float(np.max(np.abs(v)))
        if scale == 0.0:
            return v
        unit = v / scale
        speed = scale * float(np.linalg.norm(unit))
        if speed > self.limits.max_speed:
            return unit * (self.limits.max_speed / float(np.linalg.norm(unit)))
        return v

    def _clip(self, p: np.ndarray) -> np.ndarray:
        x0, x1, y0, y1 = self.limits.workspace
        return np.array([min(max(p[0], x0), x1), min(max(p[1], y0), y1)])
