"""The grasp task in closed loop across processes over DDS.

One loop for the module (domain 98): sim_robot_node, detector_node, arbitration_node,
reach_policy_node and scripted_operator_node as separate processes, driven by the
harness's observer node. The hard trial runs under two policies, each with its operator
mode and pinned level. The detector-kill test runs last and restarts the detector.
"""

from __future__ import annotations

import math
import os
import time

import pytest

from uq_eval.closed_loop.lookalike_selection import load_selection
from uq_eval.closed_loop.loop import ClosedLoop, LoopObserver, run_trial
from uq_eval.closed_loop.shared_autonomy_metrics import (
    OPERATOR_MODE,
    PINNED_LEVEL,
    score_trial,
    trial_samples,
)

DOMAIN = 98
DEADLINE_S, PERIOD_S = 0.5, 0.05  # config/shared_autonomy.yaml, arbitration_node
# Delivery and scheduling on a loaded 2-core machine, on top of deadline + one period.
SCHEDULING_ALLOWANCE_S = 0.35
CONFIDENT_SEED, LOOKALIKE_SEED = 0, 1
# Trial 14 of `uq eval shared-autonomy --suite hard` (docs/shared_autonomy.md): the first
# confident look-alike of config/confident_lookalikes.json and no target. Seen from this
# place its calibrated score is above the climb threshold, so the gate holds teleoperation.
HARD_SEED = 14
HARD_TIMEOUT_S = 10.0
FULL_AUTONOMY_TRIES = 3
DEADBAND = 0.02


@pytest.fixture(scope='module')
def loop(tmp_path_factory):
    old = os.environ.get('ROS_DOMAIN_ID')
    os.environ['ROS_DOMAIN_ID'] = str(DOMAIN)
    with ClosedLoop(tmp_path_factory.mktemp('closed_loop'), DOMAIN,
                    with_optional=False) as processes:
        observer = LoopObserver()
        try:
            assert observer.wait_until_ready(180.0), \
                f'loop did not come up; dead: {processes.dead()}'
            assert observer.set_level(-1)
            yield processes, observer
        finally:
            observer.close()
    if old is None:
        os.environ.pop('ROS_DOMAIN_ID', None)
    else:
        os.environ['ROS_DOMAIN_ID'] = old


def test_confident_scene_reaches_assistance_and_grasps_the_target(loop):
    _, observer = loop
    state, samples = run_trial(observer, CONFIDENT_SEED, False, timeout=45.0)
    row = score_trial(state, samples, DEADBAND)
    print(f'confident trial: {row["status"]} in {row["time_s"]:.1f} s, max level '
          f'{row["max_level"]}, operator share {row["operator_share"]:.2f}')
    assert row['success'], row
    assert row['max_level'] == 3
    assert row['operator_share'] < 0.9  # the autonomy drove part of the way


def test_lookalike_trial_grasps_the_target_and_hands_over_when_aiming_at_the_lookalike(loop):
    _, observer = loop
    first_event = len(observer.level_events)
    state, samples = run_trial(observer, LOOKALIKE_SEED, True, timeout=45.0)
    row = score_trial(state, samples, DEADBAND)
    running = trial_samples(samples, state)
    reasons = [reason for _, _, reason in observer.level_events[first_event:]]
    print(f'look-alike trial: {row["status"]} in {row["time_s"]:.1f} s, levels '
          f'{sorted({s.level for s in running})}, operator share {row["operator_share"]:.2f}')
    assert row['success'] and row['grasped'] == 'target', row
    # The level follows the track the autonomy reaches for. The reach policy takes the
    # target-class detection nearest the gripper, which is the look-alike in most runs: its
    # uncertainty then drops (or holds) the level and the operator drives. When the policy
    # takes the real target first, the level climbs on it and the autonomy drives, which is
    # right too; the grasp above is then the autonomy's, and the look-alike never drove it.
    handed_over = any('above down threshold' in r for r in reasons) or row['max_level'] < 3
    if handed_over:
        assert row['operator_share'] > 0.5, (row, reasons)
    else:
        assert all('calibrated_score' in r or 'perception stale' in r for r in reasons), reasons


def test_a_confident_lookalike_fools_full_autonomy_and_not_the_gate(loop):
    """No target on the table: full autonomy grasps the look-alike, the gated policy holds.

    The autonomy's grasp races its own arm: once the gripper hides the look-alike, the
    reach policy loses its goal and stops short of a grasp. On a loaded machine the late
    frames make it overshoot and lose that race now and then, so full autonomy gets up to
    ``FULL_AUTONOMY_TRIES`` tries; the gated policy one.
    """
    processes, observer = loop
    # Shape 238, one of the selected confident look-alikes, is the one this trial was
    # checked with: full autonomy grasps it and the gate holds.
    shape = 238
    assert shape in load_selection()['passed']
    extra = {'lookalike_shape': shape, 'timeout_s': HARD_TIMEOUT_S, 'target_absent': True}
    rows: dict[str, list[dict]] = {'full_autonomy': [], 'gated': []}
    try:
        for policy, tries in (('full_autonomy', FULL_AUTONOMY_TRIES), ('gated', 1)):
            processes.restart('scripted_operator_node',
                              ['-p', f'mode:={OPERATOR_MODE[policy]}'])
            level = PINNED_LEVEL[policy]
            assert observer.set_level(-1 if level is None else level)
            for _ in range(tries):
                state, samples = run_trial(observer, HARD_SEED, True, HARD_TIMEOUT_S, extra)
                rows[policy].append(score_trial(state, samples, DEADBAND))
                if rows[policy][-1]['grasped'] == 'lookalike':
                    break
    finally:
        processes.restart('scripted_operator_node', [])
        assert observer.set_level(-1)
    print('hard trial: ' + '; '.join(f"{p}: " + ', '.join(
        f"{r['status']} ({r['grasped']}) in {r['time_s']:.1f} s, max level {r['max_level']}"
        for r in tries) for p, tries in rows.items()))
    assert rows['full_autonomy'][-1]['grasped'] == 'lookalike', rows['full_autonomy']
    # The right outcome without a target: nothing grasped, the operator held.
    gated = rows['gated'][0]
    assert gated['grasped'] is None and gated['success'], gated


def test_detector_killed_mid_task_falls_back_to_teleoperation_and_robot_stops(loop):
    processes, observer = loop
    processes.restart('scripted_operator_node', ['-p', 'mode:=hands_off'])  # zero operator
    observer.take_samples()
    with observer._lock:
        observer.recording = True
    request_id = 424242
    observer.start_trial(CONFIDENT_SEED, False, request_id)
    moving = observer.wait_for(lambda: observer.task.get('request_id') == request_id
                               and observer.level == 3 and observer.speeds['cmd'] > 0.05, 60.0)
    assert moving, 'the autonomy never drove at assistance'
    killed_at = time.monotonic()
    processes.kill('detector_node')
    assert observer.wait_for(lambda: observer.level == 0, 10.0)
    drop = next(t for t, level, _ in observer.level_events if t >= killed_at and level == 0)
    reaction = drop - killed_at
    time.sleep(3.0)
    with observer._lock:
        observer.recording = False
    samples = observer.take_samples()
    bound = DEADLINE_S + PERIOD_S
    settle = killed_at + bound + SCHEDULING_ALLOWANCE_S + 0.3  # + braking at max_accel

    def position_at(t: float) -> tuple[float, float]:
        return next((s.gripper_x, s.gripper_y) for s in samples if s.t >= t)

    at_kill, at_settle = position_at(killed_at), position_at(settle)
    at_end = (samples[-1].gripper_x, samples[-1].gripper_y)
    travel_after_kill = math.dist(at_kill, at_end)
    drift_after_settle = math.dist(at_settle, at_end)
    print(f'detector killed: level 0 after {reaction:.3f} s (bound {bound:.2f} s + '
          f'{SCHEDULING_ALLOWANCE_S} s scheduling); gripper moved {1e3 * travel_after_kill:.1f} '
          f'mm after the kill, {1e3 * drift_after_settle:.2f} mm after {settle - killed_at:.2f} s')
    assert reaction <= bound + SCHEDULING_ALLOWANCE_S
    assert drift_after_settle < 1e-3
    # 0.25 m/s for the reaction bound, then braking at 1 m/s^2.
    assert travel_after_kill <= 0.25 * (bound + SCHEDULING_ALLOWANCE_S) + 0.25 ** 2 / 2
    processes.start('detector_node', 'uq_perception.detector_node')
    processes.restart('scripted_operator_node', [])
