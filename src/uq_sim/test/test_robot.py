"""The velocity-controlled gripper core: integration, clamps, bad and stale commands."""

import math

import numpy as np
import pytest

from uq_sim.robot import GripperLimits, VelocityGripper

LIMITS = GripperLimits(max_speed=0.2, max_accel=1.0, command_timeout_s=0.5,
                       workspace=(-0.3, 0.3, -0.3, 0.3))


def run(gripper, seconds, t0=0.0, dt=0.01, command=None):
    t = t0
    for _ in range(round(seconds / dt)):
        t += dt
        if command is not None:
            gripper.command(*command, t)
        gripper.step(dt, t)
    return t


def test_constant_command_moves_at_commanded_speed_after_ramp():
    g = VelocityGripper((0.0, 0.0), LIMITS)
    run(g, 1.0, command=(0.1, 0.0))
    # Ramp 0.1 s at 1 m/s² covers 0.005 m; the remaining 0.9 s at 0.1 m/s cover 0.09 m.
    assert g.position[0] == pytest.approx(0.095, abs=2e-3)
    assert g.position[1] == pytest.approx(0.0)
    assert np.allclose(g.velocity, [0.1, 0.0])


def test_speed_and_acceleration_are_clamped():
    g = VelocityGripper((0.0, 0.0), LIMITS)
    g.command(5.0, 5.0, 0.0)
    g.step(0.01, 0.01)
    assert np.linalg.norm(g.velocity) == pytest.approx(0.01)  # max_accel * dt
    run(g, 1.0, t0=0.01, command=(5.0, 5.0))
    assert np.linalg.norm(g.velocity) == pytest.approx(0.2)
    assert g.velocity[0] == pytest.approx(g.velocity[1])  # direction kept


def test_huge_finite_command_is_clamped_not_lost():
    g = VelocityGripper((0.0, 0.0), LIMITS)
    run(g, 1.0, command=(1e300, -1e300))
    v = g.velocity
    assert np.linalg.norm(v) == pytest.approx(0.2)
    assert v[0] > 0 > v[1]


@pytest.mark.parametrize('bad', [(math.nan, 0.0), (0.0, math.inf), (-math.inf, math.nan)])
def test_non_finite_command_is_rejected_and_never_integrated(bad):
    g = VelocityGripper((0.0, 0.0), LIMITS)
    g.command(0.1, 0.0, 0.0)
    with pytest.raises(ValueError, match='non-finite velocity command'):
        g.command(*bad, 0.05)
    assert g.rejected_commands == 1
    g.step(0.05, 0.05)
    assert np.all(np.isfinite(g.position))
    assert g.velocity[0] > 0.0  # the previous command is still in force


def test_stale_command_counts_as_zero_and_the_gripper_brakes():
    g = VelocityGripper((0.0, 0.0), LIMITS)
    t = run(g, 0.5, command=(0.2, 0.0))
    assert np.linalg.norm(g.active_command(t + 0.4)) > 0.0
    assert np.linalg.norm(g.active_command(t + 0.6)) == 0.0
    t = run(g, 1.0, t0=t)  # no new commands: stale after 0.5 s, then 0.2 s of braking
    stopped_at = g.position.copy()
    assert np.allclose(g.velocity, 0.0)
    run(g, 1.0, t0=t)
    assert np.allclose(g.position, stopped_at)


def test_workspace_bounds_hold():
    g = VelocityGripper((0.25, 0.0), LIMITS)
    run(g, 2.0, command=(0.2, 0.0))
    assert g.position[0] == pytest.approx(0.3)
    assert g.velocity[0] == 0.0


def test_grasp_command_is_a_downward_linear_z_and_goes_stale():
    g = VelocityGripper((0.0, 0.0), LIMITS)
    g.command(0.0, 0.0, 1.0, vz=-0.01)
    assert not g.grasp_commanded(1.0)
    g.command(0.0, 0.0, 1.0, vz=-0.05)
    assert g.grasp_commanded(1.2)
    assert not g.grasp_commanded(1.6)
    assert g.position[2] == LIMITS.hover_height


def test_invalid_limits_and_steps_are_refused():
    with pytest.raises(ValueError, match='max_speed must be finite'):
        GripperLimits(max_speed=math.nan)
    with pytest.raises(ValueError, match='workspace must be finite'):
        GripperLimits(workspace=(0.1, -0.1, 0.0, 1.0))
    with pytest.raises(ValueError, match='dt must be finite'):
        VelocityGripper((0.0, 0.0)).step(0.0, 1.0)
