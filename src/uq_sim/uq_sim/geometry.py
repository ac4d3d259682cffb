"""Small rigid-body and camera geometry helpers (ROS-free, MuJoCo-free).

Rotations are 3x3 matrices acting on column vectors; quaternions are ``(w, x, y, z)`` as
in MuJoCo's MJCF. Camera conventions follow MuJoCo: a camera looks along its local −z
axis with +y up and +x right.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np


def rot_x(angle: float) -> np.ndarray:
    """Rotation matrix about the x axis by ``angle`` radians."""
    c, s = math.cos(angle), math.sin(angle)
    return np.array([[1.0, 0.0, 0.0], [0.0, c, -s], [0.0, s, c]])


def rot_y(angle: float) -> np.ndarray:
    """Rotation matrix about the y axis by ``angle`` radians."""
    c, s = math.cos(angle), math.sin(angle)
    return np.array([[c, 0.0, s], [0.0, 1.0, 0.0], [-s, 0.0, c]])


def rot_z(angle: float) -> np.ndarray:
    """Rotation matrix about the z axis by ``angle`` radians."""
    c, s = math.cos(angle), math.sin(angle)
    return np.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]])


def mat_to_quat(mat: np.ndarray) -> np.ndarray:
    """Convert a rotation matrix to a unit quaternion ``(w, x, y, z)`` with ``w >= 0``.

    Parameters
    ----------
    mat : numpy.ndarray
        3x3 proper rotation matrix.

    Returns
    -------
    numpy.ndarray
        Quaternion of shape (4,).
    """
    m = np.asarray(mat, dtype=float)
    trace = m[0, 0] + m[1, 1] + m[2, 2]
    # Shepperd's method: branch on the largest diagonal term for numerical stability.
    if trace > 0.0:
        s = math.sqrt(trace + 1.0) * 2.0
        q = [0.25 * s, (m[2, 1] - m[1, 2]) / s, (m[0, 2] - m[2, 0]) / s, (m[1, 0] - m[0, 1]) / s]
    elif m[0, 0] > m[1, 1] and m[0, 0] > m[2, 2]:
        s = math.sqrt(1.0 + m[0, 0] - m[1, 1] - m[2, 2]) * 2.0
        q = [(m[2, 1] - m[1, 2]) / s, 0.25 * s, (m[0, 1] + m[1, 0]) / s, (m[0, 2] + m[2, 0]) / s]
    elif m[1, 1] > m[2, 2]:
        s = math.sqrt(1.0 + m[1, 1] - m[0, 0] - m[2, 2]) * 2.0
        q = [(m[0, 2] - m[2, 0]) / s, (m[0, 1] + m[1, 0]) / s, 0.25 * s, (m[1, 2] + m[2, 1]) / s]
    else:
        s = math.sqrt(1.0 + m[2, 2] - m[0, 0] - m[1, 1]) * 2.0
        q = [(m[1, 0] - m[0, 1]) / s, (m[0, 2] + m[2, 0]) / s, (m[1, 2] + m[2, 1]) / s, 0.25 * s]
    quat = np.array(q)
    quat /= np.linalg.norm(quat)
    return -quat if quat[0] < 0.0 else quat


def quat_to_mat(quat: np.ndarray) -> np.ndarray:
    """Convert a quaternion ``(w, x, y, z)`` (normalised here) to a rotation matrix."""
    w, x, y, z = np.asarray(quat, dtype=float) / np.linalg.norm(quat)
    return np.array([
        [1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
        [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
        [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)],
    ])


def look_at_axes(pos: np.ndarray, target: np.ndarray, roll: float = 0.0) -> np.ndarray:
    """Camera orientation looking from ``pos`` at ``target`` with z up in the world.

    Parameters
    ----------
    pos, target : numpy.ndarray
        Camera position and the point it looks at, world frame, metres.
    roll : float
        Rotation about the optical axis, radians (positive turns the image clockwise).

    Returns
    -------
    numpy.ndarray
        3x3 matrix whose columns are the camera's x (right), y (up), z (backward) axes in
        the world frame, i.e. the camera-to-world rotation in MuJoCo's convention.

    Raises
    ------
    ValueError
        If the camera looks straight up or down (the image's horizontal is undefined).
    """
    forward = np.asarray(target, float) - np.asarray(pos, float)
    forward /= np.linalg.norm(forward)
    right = np.cross(forward, [0.0, 0.0, 1.0])
    if np.linalg.norm(right) < 1e-6:
        raise ValueError('camera looks straight up or down; choose another target')
    right /= np.linalg.norm(right)
    back = -forward
    up = np.cross(back, right)
    c, s = math.cos(roll), math.sin(roll)
    right, up = c * right + s * up, -s * right + c * up
    return np.stack([right, up, back], axis=1)


class Intrinsics(NamedTuple):
    """Pinhole intrinsics in the OpenCV / ROS ``CameraInfo`` convention.

    Pixel centres lie at integer coordinates, so the optical axis of an image ``width``
    pixels wide passes through ``cx = (width - 1) / 2``.
    """

    fx: float
    fy: float
    cx: float
    cy: float
    width: int
    height: int

    @property
    def k(self) -> list[float]:
        """Row-major 3x3 camera matrix, as in ``sensor_msgs/CameraInfo.k``."""
        return [self.fx, 0.0, self.cx, 0.0, self.fy, self.cy, 0.0, 0.0, 1.0]

    @property
    def p(self) -> list[float]:
        """Row-major 3x4 projection matrix of a monocular camera (``CameraInfo.p``)."""
        return [self.fx, 0.0, self.cx, 0.0, 0.0, self.fy, self.cy, 0.0, 0.0, 0.0, 1.0, 0.0]


def intrinsics_from_fovy(fovy_deg: float, width: int, height: int) -> Intrinsics:
    """Intrinsics of a MuJoCo camera with vertical field of view ``fovy_deg``.

    MuJoCo renders square pixels with the vertical field of view fixed, so
    ``fy = (height / 2) / tan(fovy / 2)`` and ``fx = fy``.

    Raises
    ------
    ValueError
        If the field of view is not in (0, 180) degrees or the size is not positive.
    """
    if not 0.0 < fovy_deg < 180.0:
        raise ValueError(f'fovy must be in (0, 180) degrees, got {fovy_deg}')
    if width <= 0 or height <= 0:
        raise ValueError(f'image size must be positive, got {width}x{height}')
    f = 0.5 * height / math.tan(math.radians(fovy_deg) / 2.0)
    return Intrinsics(f, f, (width - 1) / 2.0, (height - 1) / 2.0, width, height)


def project_points(points: np.ndarray, cam_pos: np.ndarray, cam_axes: np.ndarray,
                   intr: Intrinsics) -> np.ndarray:
    """Project world points to pixel coordinates (OpenCV convention).

    Parameters
    ----------
    points : numpy.ndarray
        (N, 3) world points.
    cam_pos : numpy.ndarray
        Camera position (3,).
    cam_axes : numpy.ndarray
        Camera-to-world rotation, columns x right, y up, z backward (MuJoCo convention).
    intr : Intrinsics
        Camera intrinsics.

    Returns
    -------
    numpy.ndarray
        (N, 2) pixel coordinates ``(u, v)``; points behind the camera get NaN.
    """
    local = (np.asarray(points, float) - cam_pos) @ cam_axes
    depth = -local[:, 2]
    with np.errstate(divide='ignore', invalid='ignore'):
        u = intr.cx + intr.fx * local[:, 0] / depth
        v = intr.cy - intr.fy * local[:, 1] / depth
    uv = np.stack([u, v], axis=1)
    uv[depth <= 1e-9] = np.nan
    return uv


def ray_to_plane(u: float, v: float, cam_pos: np.ndarray, cam_axes: np.ndarray,
                 intr: Intrinsics, plane_z: float = 0.0) -> np.ndarray | None:
    """Intersect the viewing ray through pixel ``(u, v)`` with the plane ``z = plane_z``.

    Returns
    -------
    numpy.ndarray or None
        The world point (3,), or None when the ray does not hit the plane in front of
        the camera.
    """
    direction_cam = np.array([(u - intr.cx) / intr.fx, -(v - intr.cy) / intr.fy, -1.0])
    direction = cam_axes @ direction_cam
    if abs(direction[2]) < 1e-9:
        return None
    t = (plane_z - cam_pos[2]) / direction[2]
    if t <= 0.0:
        return None
    return np.asarray(cam_pos, float) + t * direction
