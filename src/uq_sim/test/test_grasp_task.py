"""Grasp-task trials, the dwell grasp and the scripted operator (ROS-free)."""

import json

import numpy as np
import pytest

from uq_sim.grasp_task import (
    GRIPPER_HOME,
    TARGET_CLASS,
    ResetRequest,
    TaskMonitor,
    make_trial,
    parse_reset_request,
)
from uq_sim.robot import VelocityGripper
from uq_sim.scripted_operator import OperatorConfig, ScriptedOperator


def test_trials_are_deterministic_and_well_formed():
    assert make_trial(3) == make_trial(3)
    home = np.array(GRIPPER_HOME)
    kinds = set()
    for seed in range(40):
        trial = make_trial(seed)
        kinds.add(trial.lookalike)
        assert trial.target.class_name == TARGET_CLASS
        xy = np.array([o.xy for o in trial.objects])
        gaps = np.linalg.norm(xy[:, None] - xy[None], axis=-1) + np.eye(len(xy))
        assert gaps.min() >= 0.12
        if trial.lookalike:
            look = next(o for o in trial.objects if o.lookalike)
            assert not look.known
            assert np.linalg.norm(np.array(look.xy) - home) < np.linalg.norm(xy[0] - home)
    assert kinds == {True, False}
    assert make_trial(5, lookalike=True).lookalike and not make_trial(5, lookalike=False).lookalike


def test_dwell_over_target_is_success_and_over_other_object_is_failure():
    trial = make_trial(1, lookalike=True)
    target = np.array(trial.target.xy)
    m = TaskMonitor(trial, start_time=0.0)
    assert m.update(target, speed=0.1, grasping=True, now=1.0) == 'running'  # moving
    assert m.update(target, speed=0.0, grasping=False, now=1.1) == 'running'  # no command
    assert m.update(target, speed=0.0, grasping=False, now=1.8) == 'running'
    assert m.update(target, speed=0.0, grasping=True, now=1.9) == 'running'
    assert m.update(target, speed=0.0, grasping=True, now=2.4) == 'success'
    assert m.grasped == 'target'
    other = next(o for o in trial.objects if o.lookalike)
    m = TaskMonitor(trial, start_time=0.0)
    m.update(np.array(other.xy), 0.0, True, 1.0)
    assert m.update(np.array(other.xy), 0.0, True, 1.5) == 'failure'
    state = json.loads(m.to_json(2.0, np.zeros(3)))
    assert state['status'] == 'failure' and state['grasped'] == 'lookalike'
    assert state['elapsed_s'] == pytest.approx(1.5)


def test_timeout():
    m = TaskMonitor(make_trial(0), start_time=0.0, timeout_s=5.0)
    assert m.update(np.array([0.3, -0.29]), 0.0, True, 5.1) == 'timeout'


def test_teleoperating_operator_reaches_and_grasps_the_target():
    trial = make_trial(2, lookalike=True)
    op = ScriptedOperator(OperatorConfig(mode='teleoperation'), seed=2)
    op.set_goal(trial.target.xy, trial.seed)
    g = VelocityGripper(GRIPPER_HOME)
    m = TaskMonitor(trial, start_time=0.0)
    t, dt = 0.0, 0.01
    while m.status == 'running':
        t += dt
        if round(t / dt) % 5 == 0:
            vx, vy, vz = op.command(tuple(g.position[:2]), t)
            g.command(vx, vy, t, vz)
        g.step(dt, t)
        m.update(g.position[:2], float(np.linalg.norm(g.velocity)), g.grasp_commanded(t), t)
    assert m.status == 'success'
    distance = np.linalg.norm(np.array(trial.target.xy) - np.array(GRIPPER_HOME))
    assert t > distance / 0.07  # never faster than its speed


def test_supervising_operator_reacts_late_and_hands_off_keeps_still():
    op = ScriptedOperator(OperatorConfig(mode='supervise', reaction_delay_s=0.8), seed=0)
    op.set_goal((0.1, 0.1), 0)
    op.observe_level(3, 0.0)
    assert not op.engaged(1.0)
    op.observe_level(0, 2.0)
    assert not op.engaged(2.5)   # not yet reacted
    assert op.engaged(2.9)
    assert np.linalg.norm(op.command((0.0, 0.0), 2.9)) > 0.0
    hands_off = ScriptedOperator(OperatorConfig(mode='hands_off'))
    hands_off.set_goal((0.1, 0.1), 0)
    assert hands_off.command((0.0, 0.0), 1.0) == (0.0, 0.0, 0.0)
    with pytest.raises(ValueError, match='mode must be one of'):
        OperatorConfig(mode='sleepy')


def test_a_valid_reset_request_is_parsed_with_its_defaults():
    assert parse_reset_request('{"seed": 4}') == ResetRequest(4, None, -1)
    assert parse_reset_request('{"seed": 2147483647, "lookalike": false, "request_id": 9}') \
        == ResetRequest(2**31 - 1, False, 9)


@pytest.mark.parametrize('text, match', [
    ('{"seed": Infinity}', 'not a number JSON allows'),
    ('{"seed": NaN}', 'not a number JSON allows'), ('{"seed": 1.7}', 'seed'),
    ('{"seed": true}', 'seed'), ('{"seed": "3"}', 'seed'), ('{"seed": -1}', 'seed'),
    ('{"seed": 2147483648}', 'seed'), ('{}', 'seed'),
    ('{"seed": 1, "lookalike": 1}', 'lookalike'), ('{"seed": 1, "lookalike": 1.0}', 'lookalike'),
    ('{"seed": 1, "request_id": 1e3}', 'request_id'),
    ('{"seed": 1, "request_id": 9223372036854775808}', 'request_id'),
    ('{"seed": 1, "lookalike_shape": -1}', 'lookalike_shape'),
    ('{"seed": 1, "lookalike_shape": 2.0}', 'lookalike_shape'),
    ('{"seed": 1, "lookalike_shape": 3, "lookalike": false}', 'lookalike is false'),
    ('{"seed": 1, "target_absent": 1}', 'target_absent'),
    ('{"seed": 1, "target_absent": true}', 'needs a look-alike'),
    ('{"seed": 1, "timeout_s": 0.5}', 'timeout_s'), ('{"seed": 1, "timeout_s": "9"}', 'timeout_s'),
    ('[' * 1000, 'nested too deeply'), ('[1, 2]', 'JSON object'), ('seed=1', 'not JSON'),
    ('{"seed": 1, "pad": "' + 'x' * 2000 + '"}', 'characters long'),
])
def test_a_malformed_reset_request_is_refused_by_rule(text, match):
    with pytest.raises(ValueError, match=match):
        parse_reset_request(text)


def test_the_extended_reset_request_is_parsed():
    assert parse_reset_request('{"seed": 4, "lookalike_shape": 7, "target_absent": true, '
                               '"timeout_s": 10}') == ResetRequest(4, None, -1, 7, True, 10.0)


def test_a_procedural_lookalike_keeps_its_shape_across_trials_and_the_layout_of_its_seed():
    from uq_sim.procedural_scenes import procedural_family

    plain = make_trial(5, lookalike=True)
    shaped = make_trial(5, lookalike_shape=4)
    assert [o.xy for o in shaped.objects] == [o.xy for o in plain.objects]
    lookalike = shaped.lookalike_object
    assert lookalike.class_name == procedural_family(4) and lookalike.shape_index == 4
    # Shape 4 is one object: the same geoms and pose in every trial, only placed anew.
    a = next(o for o in shaped.scene_spec().objects if o.name == 'lookalike')
    b = next(o for o in make_trial(9, lookalike_shape=4).scene_spec().objects
             if o.name == 'lookalike')
    assert len(a.geoms) == len(b.geoms) and a.appearance == b.appearance and a.xy != b.xy
    assert np.array_equal(a.rot, b.rot)
    for ga, gb in zip(a.geoms, b.geoms, strict=True):
        assert ga.type == gb.type and np.allclose(ga.size, gb.size)
        assert ga.mesh is None or np.array_equal(ga.mesh.vertices, gb.mesh.vertices)
    with pytest.raises(ValueError, match='needs a look-alike'):
        make_trial(5, lookalike=False, lookalike_shape=4)


def test_a_target_absent_trial_has_every_other_object_and_no_target():
    present = make_trial(8, lookalike_shape=2)
    absent = make_trial(8, lookalike_shape=2, target_absent=True)
    assert absent.target is None and not absent.target_present
    assert absent.objects == present.objects[1:]
    state = json.loads(TaskMonitor(absent, start_time=0.0).to_json(0.5, np.zeros(3)))
    assert state['target'] is None and state['target_present'] is False
    with pytest.raises(ValueError, match='holds a look-alike'):
        make_trial(8, lookalike=False, target_absent=True)


def test_the_operator_holds_in_a_trial_without_a_target():
    from uq_sim.scripted_operator import parse_task_state

    trial = make_trial(8, lookalike_shape=2, target_absent=True)
    goal = parse_task_state(TaskMonitor(trial, start_time=0.0).to_json(1.0, np.zeros(3)))
    assert goal.target_xy is None and goal.running
    with pytest.raises(ValueError, match='names none of the objects'):
        parse_task_state('{"trial": 1, "status": "running", "target": "ghost", "objects": []}')
