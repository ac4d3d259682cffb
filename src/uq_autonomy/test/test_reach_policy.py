"""The reach policy core: back-projection onto the table and the steering command."""

import math

import numpy as np
import pytest

from uq_autonomy.reach_policy import PinholeCamera, ReachPolicy, ReachPolicyConfig, quat_to_matrix


def look_at_camera(position, target, f=290.0, cx=159.5, cy=119.5):
    """Optical frame (x right, y down, z forward) looking from ``position`` at ``target``."""
    position = np.asarray(position, float)
    forward = np.asarray(target, float) - position
    forward /= np.linalg.norm(forward)
    right = np.cross(forward, [0.0, 0.0, 1.0])
    right /= np.linalg.norm(right)
    down = np.cross(forward, right)
    return PinholeCamera(f, f, cx, cy, tuple(position), np.stack([right, down, forward], 1))


def project(camera, point):
    local = camera.rotation.T @ (np.asarray(point, float) - np.asarray(camera.position))
    return (camera.cx + camera.fx * local[0] / local[2],
            camera.cy + camera.fy * local[1] / local[2])


CAMERA = look_at_camera((0.0, -0.52, 0.46), (0.0, 0.06, 0.0))


@pytest.mark.parametrize('point', [(0.0, 0.06, 0.03), (-0.2, 0.1, 0.03), (0.15, -0.08, 0.03)])
def test_pixel_to_plane_inverts_projection(point):
    u, v = project(CAMERA, point)
    assert np.allclose(CAMERA.pixel_to_plane(u, v, 0.03), point, atol=1e-9)


def test_ray_above_horizon_misses_the_table():
    assert CAMERA.pixel_to_plane(159.5, -2000.0, 0.0) is None


def test_quaternion_matrix_matches_known_rotation_and_rejects_zero():
    s = math.sqrt(0.5)
    assert np.allclose(quat_to_matrix(0.0, 0.0, s, s), [[0, -1, 0], [1, 0, 0], [0, 0, 1]])
    with pytest.raises(ValueError, match='invalid quaternion'):
        quat_to_matrix(0.0, 0.0, 0.0, 0.0)


def test_policy_goes_to_nearest_target_class_detection_and_stops_there():
    policy = ReachPolicy(ReachPolicyConfig(target_class='ellipsoid', max_speed=0.2))
    near, far = (0.05, -0.05, 0.03), (-0.15, 0.12, 0.03)
    dets = [('ellipsoid', *project(CAMERA, far), 1),
            ('box', *project(CAMERA, (0.0, -0.2, 0.03)), 2),
            ('ellipsoid', *project(CAMERA, near), 3)]
    gripper = (0.0, -0.26)
    goal = policy.observe(dets, CAMERA, gripper)
    assert np.allclose(goal, near[:2]) and policy.target_track == 3
    vx, vy, vz = policy.command(gripper)
    assert vz == 0.0
    assert math.hypot(vx, vy) == pytest.approx(0.2)
    assert np.allclose(np.array([vx, vy]) / 0.2, (np.array(near[:2]) - gripper)
                       / np.linalg.norm(np.array(near[:2]) - gripper))
    assert policy.command(near[:2]) == (0.0, 0.0, -0.05)  # at the goal: grasp
    assert policy.observe([('box', 100.0, 100.0, 2), ('ellipsoid', math.nan, 3.0, 4)],
                          CAMERA, gripper) is None
    assert policy.target_track == -1 and policy.command(gripper) == (0.0, 0.0, 0.0)


def test_policy_keeps_reaching_for_its_track_whatever_class_it_gets_meanwhile():
    policy = ReachPolicy(ReachPolicyConfig(target_class='ellipsoid'))
    first, nearer = (0.05, -0.05, 0.03), (0.0, -0.2, 0.03)
    gripper = (0.0, -0.26)
    policy.observe([('ellipsoid', *project(CAMERA, first), 5)], CAMERA, gripper)
    assert policy.target_track == 5
    # A nearer target-class detection appears and track 5 is read as a torus for two
    # frames (release_after_frames 3): the policy stays on track 5.
    frame = [('ellipsoid', *project(CAMERA, nearer), 6), ('torus', *project(CAMERA, first), 5)]
    for _ in range(2):
        goal = policy.observe(frame, CAMERA, gripper)
        assert policy.target_track == 5 and np.allclose(goal, first[:2])
    policy.observe([('ellipsoid', *project(CAMERA, first), 5)], CAMERA, gripper)  # resets
    for _ in range(2):
        policy.observe(frame, CAMERA, gripper)
    assert policy.target_track == 5
    # The third misreading in a row lets it go: the nearest target-class detection wins.
    goal = policy.observe(frame, CAMERA, gripper)
    assert policy.target_track == 6 and np.allclose(goal, nearer[:2])
    # Track 6 gone: chosen afresh among the target-class detections (none here).
    assert policy.observe([('torus', *project(CAMERA, first), 5)], CAMERA, gripper) is None
    assert policy.target_track == -1


def test_untracked_detections_are_chosen_afresh_every_frame():
    policy = ReachPolicy(ReachPolicyConfig(target_class='ellipsoid'))
    a, b = (0.05, -0.05, 0.03), (0.0, -0.2, 0.03)
    gripper = (0.0, -0.26)
    policy.observe([('ellipsoid', *project(CAMERA, a), -1)], CAMERA, gripper)
    goal = policy.observe([('ellipsoid', *project(CAMERA, a), -1),
                           ('ellipsoid', *project(CAMERA, b), -1)], CAMERA, gripper)
    assert policy.target_track == -1 and np.allclose(goal, b[:2])
