"""The autonomy's reach policy: steer the gripper to the detected target (ROS-free).

Each camera frame gives detections (class, box centre in pixels). The policy takes the
detections of the target class, back-projects each box centre through the pinhole
intrinsics (``camera_info``'s K) and the camera pose (optical frame: x right, y down, z
forward, as ROS ``*_optical_frame``) onto the horizontal plane ``z = plane_height`` (the
height of a typical object's centre above the table), and chooses the one nearest the
gripper: it trusts the detector's class, which is exactly what a look-alike exploits.

The command is a planar velocity toward that point, proportional to the distance
(``gain``) and capped at ``max_speed``; within ``stop_radius`` (box centres jitter by some
millimetres from frame to frame, so chasing them would never settle) the planar part is
zero and ``linear.z`` is ``-grasp_speed``: the command to close the gripper (see
``uq_sim.robot``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


def quat_to_matrix(x: float, y: float, z: float, w: float) -> np.ndarray:
    """Rotation matrix of a unit quaternion (normalised here).

    Raises
    ------
    ValueError
        If the quaternion is zero or not finite.
    """
    q = np.array([w, x, y, z], float)
    n = float(np.linalg.norm(q))
    if not math.isfinite(n) or n < 1e-12:
        raise ValueError(f'invalid quaternion ({x}, {y}, {z}, {w})')
    w, x, y, z = q / n
    return np.array([
        [1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)],
        [2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)],
        [2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)]])


@dataclass(frozen=True)
class PinholeCamera:
    """Intrinsics (``fx, fy, cx, cy``) and pose (optical frame to world) of the camera."""

    fx: float
    fy: float
    cx: float
    cy: float
    position: tuple[float, float, float]
    rotation: np.ndarray  # (3, 3) optical-frame axes as columns, in world coordinates

    def pixel_to_plane(self, u: float, v: float, plane_z: float) -> np.ndarray | None:
        """World point where the ray through pixel ``(u, v)`` meets ``z = plane_z``.

        None when the ray is parallel to the plane or meets it behind the camera.
        """
        ray = self.rotation @ np.array([(u - self.cx) / self.fx, (v - self.cy) / self.fy, 1.0])
        if abs(ray[2]) < 1e-9:
            return None
        t = (plane_z - self.position[2]) / ray[2]
        if not math.isfinite(t) or t <= 0.0:
            return None
        return np.asarray(self.position, float) + t * ray


@dataclass(frozen=True)
class ReachPolicyConfig:
    """Gains and limits of the reach policy (metres, seconds, m/s)."""

    target_class: str = 'ellipsoid'
    plane_height: float = 0.03
    gain: float = 2.0
    max_speed: float = 0.2
    stop_radius: float = 0.015
    grasp_speed: float = 0.05


class ReachPolicy:
    """Chooses the target among detections and commands a planar velocity toward it."""

    def __init__(self, config: ReachPolicyConfig | None = None) -> None:
        self.config = config or ReachPolicyConfig()
        self.goal: np.ndarray | None = None

    def observe(self, detections: Sequence[tuple[str, float, float]], camera: PinholeCamera,
                gripper_xy: Sequence[float]) -> np.ndarray | None:
        """Update the goal from one frame's ``(class_id, center_x, center_y)`` detections.

        Returns the new goal (x, y), or None (and forgets the goal) when no detection of
        the target class projects onto the table.
        """
        here = np.asarray(gripper_xy, float)[:2]
        best, best_distance = None, math.inf
        for class_id, u, v in detections:
            if class_id != self.config.target_class or not (math.isfinite(u) and math.isfinite(v)):
                continue
            point = camera.pixel_to_plane(u, v, self.config.plane_height)
            if point is None:
                continue
            distance = float(np.linalg.norm(point[:2] - here))
            if distance < best_distance:
                best, best_distance = point[:2], distance
        self.goal = best
        return best

    def command(self, gripper_xy: Sequence[float]) -> tuple[float, float, float]:
        """``(vx, vy, vz)``: toward the goal; at the goal, grasp; without one, zero."""
        if self.goal is None:
            return 0.0, 0.0, 0.0
        delta = self.goal - np.asarray(gripper_xy, float)[:2]
        distance = float(np.linalg.norm(delta))
        if distance <= self.config.stop_radius:
            return 0.0, 0.0, -self.config.grasp_speed
        speed = min(self.config.max_speed, self.config.gain * distance)
        vx, vy = delta * (speed / distance)
        return float(vx), float(vy), 0.0
