"""The autonomy's reach policy: steer the gripper to the detected target (ROS-free).

Each camera frame gives detections (class, box centre in pixels, track id). The policy
back-projects box centres through the pinhole intrinsics (``camera_info``'s K) and the
camera pose (optical frame: x right, y down, z forward, as ROS ``*_optical_frame``) onto the
horizontal plane ``z = plane_height`` (the height of a typical object's centre above the
table). Without a target it chooses the target-class detection nearest the gripper: it
trusts the detector's class, which is exactly what a look-alike exploits. It then follows
that detection's track (:attr:`ReachPolicy.target_track`) while the track is in the frame
and has not been read as another class in ``release_after_frames`` frames in a row: a
class that flickers for a frame or two must not make the autonomy change its mind
mid-reach, but an object the detector has come to call something else (a look-alike once
taught) is let go. The arbitration node judges the uncertainty of the object the autonomy
reaches for (``driving_detection: autonomy_target``). Untracked detections (track id < 0)
are chosen afresh every frame.

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
    """Gains and limits of the reach policy (metres, seconds, m/s); a target track read as
    another class in ``release_after_frames`` frames in a row is let go."""

    target_class: str = 'ellipsoid'
    plane_height: float = 0.03
    gain: float = 2.0
    max_speed: float = 0.2
    stop_radius: float = 0.015
    grasp_speed: float = 0.05
    release_after_frames: int = 3


class ReachPolicy:
    """Chooses the target among detections and commands a planar velocity toward it."""

    def __init__(self, config: ReachPolicyConfig | None = None) -> None:
        self.config = config or ReachPolicyConfig()
        self.goal: np.ndarray | None = None
        self.target_track = -1  # the track reached for; -1 when none (or untracked)
        self._misread = 0  # frames in a row the target track was read as another class

    def _on_table(self, u: float, v: float, camera: PinholeCamera) -> np.ndarray | None:
        if not (math.isfinite(u) and math.isfinite(v)):
            return None
        point = camera.pixel_to_plane(u, v, self.config.plane_height)
        return None if point is None else point[:2]

    def observe(self, detections: Sequence[tuple[str, float, float, int]],
                camera: PinholeCamera, gripper_xy: Sequence[float]) -> np.ndarray | None:
        """Update the goal from one frame's ``(class_id, center_x, center_y, track_id)``
        detections.

        Returns the new goal (x, y), or None (and forgets the goal and the target track)
        when neither the target track nor a detection of the target class projects onto
        the table.
        """
        if self.target_track >= 0:
            for class_id, u, v, track_id in detections:
                if track_id != self.target_track:
                    continue
                point = self._on_table(u, v, camera)
                misread = 0 if class_id == self.config.target_class else self._misread + 1
                if point is not None and misread < self.config.release_after_frames:
                    self._misread = misread
                    self.goal = point
                    return point
                break
        self._misread = 0
        here = np.asarray(gripper_xy, float)[:2]
        best, best_track, best_distance = None, -1, math.inf
        for class_id, u, v, track_id in detections:
            point = self._on_table(u, v, camera) if class_id == self.config.target_class \
                else None
            if point is None:
                continue
            distance = float(np.linalg.norm(point - here))
            if distance < best_distance:
                best, best_track, best_distance = point, int(track_id), distance
        self.goal, self.target_track = best, best_track
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
