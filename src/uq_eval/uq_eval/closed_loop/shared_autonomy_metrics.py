"""Scores of the closed-loop shared-autonomy evaluation (ROS-free).

Per trial, from the final task state and the sampled timeline:

- **success**: the gripper closed on the true target (``status == 'success'``); in a trial
  without a target, nothing was grasped before the time limit (the operator held);
- **wrong grasp**: the gripper closed on another object (``status == 'failure'``);
- **timeout**: a trial with a target in which nothing was grasped in time;
- **time**: the sim's elapsed time from the trial start to the grasp (successes only);
- **operator share**: the time-average of the operator's weight in the command sent to
  the robot: 1 at teleoperation and guided, ``1 - blend_alpha`` at shared, and at
  assistance 1 while the operator's command is above the dead-band (takeover), else 0;
- **level changes**: the number of level transitions while the trial ran;
- **help requests**: the ask-for-help node's requests while the trial ran (the harness adds
  how many of them the scripted labeller had answered by the trial's end);
- **suspect hold share**: the share of the trial's samples in which the arbitration held
  the level at guided because the driving track was suspect;
- **stale motion** (fault trials): the gripper's path, in metres, while perception was
  stale and the operator had given no command for the robot's command timeout and braking,
  from a braking allowance after the arbitration first reported stale perception until it
  was fresh again: motion that only a goal from before the fault can cause. A trial
  *moved toward a stale goal* when it exceeds ``STALE_MOTION_M``.

Every rate comes with its 95 % Wilson score interval.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

POLICIES = ('teleoperation', 'full_autonomy', 'gated', 'gated_help')
# Level pinned through set_autonomy_override for each policy; None leaves it to the signal.
PINNED_LEVEL = {'teleoperation': 0, 'full_autonomy': 3, 'gated': None, 'gated_help': None}
# The scripted operator's mode per policy: under full autonomy nobody supervises.
OPERATOR_MODE = {'teleoperation': 'teleoperation', 'full_autonomy': 'hands_off',
                 'gated': 'supervise', 'gated_help': 'supervise'}
# Policies that run the ask-for-help node with a scripted labeller answering it.
HELP_POLICIES = ('gated_help',)
# Gripper path (m) above which a fault trial counts as having moved toward a stale goal:
# well above the pose noise of a gripper at rest (zero) and the last command's coasting.
STALE_MOTION_M = 0.005
WILSON_Z = 1.959964  # two-sided 95 %


def wilson_interval(successes: int, trials: int, z: float = WILSON_Z) -> tuple[float, float]:
    """The Wilson score interval of a binomial rate; (nan, nan) without trials.

    Raises
    ------
    ValueError
        If the counts are negative or ``successes > trials``.
    """
    if trials < 0 or not 0 <= successes <= max(trials, 0):
        raise ValueError(f'need 0 <= successes <= trials, got {successes} of {trials}')
    if trials == 0:
        return math.nan, math.nan
    p = successes / trials
    denominator = 1.0 + z * z / trials
    centre = (p + z * z / (2 * trials)) / denominator
    half = z * math.sqrt(p * (1.0 - p) / trials + z * z / (4 * trials * trials)) / denominator
    return max(0.0, centre - half), min(1.0, centre + half)


def rate(count: int, trials: int) -> dict:
    """A count out of ``trials`` with its rate and 95 % Wilson interval."""
    low, high = wilson_interval(count, trials)
    return {'count': int(count), 'trials': int(trials),
            'rate': count / trials if trials else math.nan, 'low': low, 'high': high}


def stale_motion(samples: Sequence, onset: float, allowance_s: float, deadband: float,
                 deadline_s: float, operator_quiet_s: float) -> dict:
    """Gripper path while perception was stale after a fault (see the module docstring).

    The window opens ``allowance_s`` (braking and scheduling) after the first sample, at or
    after ``onset``, that reports stale perception (``onset + deadline_s`` when none does)
    and closes at the first sample after it whose perception is fresh; the path counts the
    steps between consecutive samples of that window before which the operator's command
    stayed within the dead-band for ``operator_quiet_s`` (the robot's command timeout and
    braking: motion on the operator's own last command is the operator's).
    ``stale_after_s``: from the onset to that first stale report.
    """
    first_stale = next((s.t for s in samples if s.t >= onset and s.stale), None)
    start = (onset + deadline_s if first_stale is None else first_stale) + allowance_s
    window = []
    for s in samples:
        if s.t < start:
            continue
        if not s.stale:
            break
        window.append(s)
    last_command = -math.inf
    quiet_since = {}
    for s in samples:
        if s.operator_speed > deadband:
            last_command = s.t
        quiet_since[id(s)] = last_command
    path = 0.0
    for a, b in zip(window, window[1:], strict=False):
        if a.t - quiet_since[id(a)] >= operator_quiet_s and all(map(math.isfinite, (
                a.gripper_x, a.gripper_y, b.gripper_x, b.gripper_y))):
            path += math.hypot(b.gripper_x - a.gripper_x, b.gripper_y - a.gripper_y)
    return {'stale_after_s': None if first_stale is None else first_stale - onset,
            'stale_window_s': (window[-1].t - window[0].t) if window else 0.0,
            'stale_motion_m': path}


def operator_weight(level: int, blend_alpha: float, operator_speed: float,
                    deadband: float) -> float:
    """The operator's share of the command at one instant (see the module docstring)."""
    if level <= 1:
        return 1.0
    if level == 2:
        return 1.0 - blend_alpha
    return 1.0 if operator_speed > deadband else 0.0


def trial_samples(samples: Sequence, state: dict) -> list:
    """The samples taken while the trial ran (after the reset pause, before the end)."""
    return [s for s in samples if s.trial == state.get('trial') and s.status == 'running'
            and s.elapsed > 0.0]


def score_trial(state: dict, samples: Sequence, deadband: float) -> dict:
    """One trial's row of the report."""
    running = trial_samples(samples, state)
    weights = [operator_weight(s.level, s.blend_alpha, s.operator_speed, deadband)
               for s in running]
    levels = [s.level for s in running]
    target_present = state.get('target_present', True) is not False
    status = state.get('status')
    held = not target_present and status == 'timeout' and state.get('grasped') is None
    return {
        'seed': state.get('trial'),
        'lookalike': bool(state.get('lookalike')),
        'target_present': target_present,
        'status': status,
        'grasped': state.get('grasped'),
        'success': status == 'success' if target_present else held,
        'wrong_grasp': status == 'failure',
        'timeout': target_present and status in ('timeout', 'harness_timeout'),
        'time_s': float(state.get('elapsed_s', math.nan)),
        'operator_share': float(np.mean(weights)) if weights else math.nan,
        'level_changes': int(sum(a != b for a, b in zip(levels, levels[1:], strict=False))),
        'max_level': max(levels) if levels else 0,
        'help_requests': (running[-1].help_requests - running[0].help_requests) if running else 0,
        'suspect_hold_share': (float(np.mean([s.suspect_hold for s in running]))
                               if running else math.nan),
    }


def _mean(values: list[float]) -> float:
    values = [v for v in values if math.isfinite(v)]
    return float(np.mean(values)) if values else math.nan


def summarise(rows: Sequence[dict]) -> dict:
    """Per-policy figures over its trials."""
    success = [r for r in rows if r['success']]
    look = [r for r in rows if r['lookalike']]
    grasps = [r for r in success if r.get('target_present', True)]
    summary: dict[str, Any] = {
        'trials': len(rows),
        'success': rate(len(success), len(rows)),
        'wrong_grasps': rate(sum(bool(r.get('wrong_grasp')) for r in rows), len(rows)),
        'timeouts': rate(sum(bool(r.get('timeout')) for r in rows), len(rows)),
        'success_rate': len(success) / len(rows) if rows else math.nan,
        'lookalike_trials': len(look),
        'lookalike_success_rate': (sum(r['success'] for r in look) / len(look)
                                   if look else math.nan),
        'mean_time_s': _mean([r['time_s'] for r in grasps]),
        'operator_share': _mean([r['operator_share'] for r in rows]),
        'level_changes_per_trial': _mean([float(r['level_changes']) for r in rows]),
        'help_requests_per_trial': _mean([float(r.get('help_requests', 0)) for r in rows]),
        'help_answered_per_trial': _mean([float(r.get('help_answered', 0)) for r in rows]),
        'suspect_hold_share': _mean([r.get('suspect_hold_share', math.nan) for r in rows]),
        'failures': {s: sum(r['status'] == s for r in rows)
                     for s in sorted({r['status'] for r in rows if not r['success']})},
    }
    for kind in sorted({r['kind'] for r in rows if 'kind' in r}):
        mine = [r for r in rows if r.get('kind') == kind]
        summary.setdefault('per_kind', {})[kind] = {
            'success': rate(sum(r['success'] for r in mine), len(mine)),
            'wrong_grasps': rate(sum(bool(r.get('wrong_grasp')) for r in mine), len(mine))}
    faulted = [r for r in rows if 'stale_motion_m' in r]
    if faulted:
        summary['moved_toward_stale_goal'] = rate(
            sum(r['stale_motion_m'] > STALE_MOTION_M for r in faulted), len(faulted))
        summary['max_stale_motion_m'] = max(r['stale_motion_m'] for r in faulted)
        reported = [r['stale_after_s'] for r in faulted if r.get('stale_after_s') is not None]
        summary['stale_reported_after_s'] = {
            'trials': len(reported), 'median': float(np.median(reported)) if reported
            else math.nan, 'max': max(reported) if reported else math.nan}
        summary['faults_not_injected'] = sum(r.get('fault_onset') is None for r in faulted)
    return summary


def paired_time_ratio(rows_a: Sequence[dict], rows_b: Sequence[dict]) -> dict:
    """Mean time of A over mean time of B on the seeds both completed by a grasp."""
    b = {r['seed']: r for r in rows_b if r['success'] and r.get('target_present', True)}
    pairs = [(r['time_s'], b[r['seed']]['time_s']) for r in rows_a
             if r['success'] and r.get('target_present', True) and r['seed'] in b]
    if not pairs:
        return {'pairs': 0, 'ratio': math.nan}
    ta, tb = np.mean([p[0] for p in pairs]), np.mean([p[1] for p in pairs])
    return {'pairs': len(pairs), 'mean_a_s': float(ta), 'mean_b_s': float(tb),
            'ratio': float(ta / tb)}


def time_ratios(by_policy: Mapping[str, Sequence[dict]]) -> dict[str, dict]:
    """Paired time ratios of each policy that the uncertainty drives over every policy
    before it in :data:`POLICIES` (``gated_help_over_gated``, ...), of those played."""
    ratios = {}
    for i, policy in enumerate(POLICIES):
        if PINNED_LEVEL[policy] is not None or policy not in by_policy:
            continue
        for other in POLICIES[:i]:
            if other in by_policy:
                ratios[f'{policy}_over_{other}'] = paired_time_ratio(by_policy[policy],
                                                                     by_policy[other])
    return ratios
