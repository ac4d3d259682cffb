"""Scores of the closed-loop shared-autonomy evaluation (ROS-free).

Per trial, from the final task state and the sampled timeline:

- **success**: the gripper closed on the true target (``status == 'success'``);
- **time**: the sim's elapsed time from the trial start to the grasp (successes only);
- **operator share**: the time-average of the operator's weight in the command sent to
  the robot: 1 at teleoperation and guided, ``1 - blend_alpha`` at shared, and at
  assistance 1 while the operator's command is above the dead-band (takeover), else 0;
- **level changes**: the number of level transitions while the trial ran.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

POLICIES = ('teleoperation', 'full_autonomy', 'gated')
# Level pinned through set_autonomy_override for each policy; None leaves it to the signal.
PINNED_LEVEL = {'teleoperation': 0, 'full_autonomy': 3, 'gated': None}
# The scripted operator's mode per policy: under full autonomy nobody supervises.
OPERATOR_MODE = {'teleoperation': 'teleoperation', 'full_autonomy': 'hands_off',
                 'gated': 'supervise'}


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
    return {
        'seed': state.get('trial'),
        'lookalike': bool(state.get('lookalike')),
        'status': state.get('status'),
        'grasped': state.get('grasped'),
        'success': state.get('status') == 'success',
        'time_s': float(state.get('elapsed_s', math.nan)),
        'operator_share': float(np.mean(weights)) if weights else math.nan,
        'level_changes': int(sum(a != b for a, b in zip(levels, levels[1:], strict=False))),
        'max_level': max(levels) if levels else 0,
        'help_requests': (running[-1].help_requests - running[0].help_requests) if running else 0,
    }


def summarise(rows: Sequence[dict]) -> dict:
    """Per-policy figures over its trials."""
    success = [r for r in rows if r['success']]
    look = [r for r in rows if r['lookalike']]

    def mean(values: list[float]) -> float:
        values = [v for v in values if math.isfinite(v)]
        return float(np.mean(values)) if values else math.nan

    return {
        'trials': len(rows),
        'success_rate': len(success) / len(rows) if rows else math.nan,
        'lookalike_trials': len(look),
        'lookalike_success_rate': (sum(r['success'] for r in look) / len(look)
                                   if look else math.nan),
        'mean_time_s': mean([r['time_s'] for r in success]),
        'operator_share': mean([r['operator_share'] for r in rows]),
        'level_changes_per_trial': mean([float(r['level_changes']) for r in rows]),
        'failures': {s: sum(r['status'] == s for r in rows)
                     for s in sorted({r['status'] for r in rows if not r['success']})},
    }


def paired_time_ratio(rows_a: Sequence[dict], rows_b: Sequence[dict]) -> dict:
    """Mean time of A over mean time of B on the seeds both completed."""
    b = {r['seed']: r for r in rows_b if r['success']}
    pairs = [(r['time_s'], b[r['seed']]['time_s']) for r in rows_a
             if r['success'] and r['seed'] in b]
    if not pairs:
        return {'pairs': 0, 'ratio': math.nan}
    ta, tb = np.mean([p[0] for p in pairs]), np.mean([p[1] for p in pairs])
    return {'pairs': len(pairs), 'mean_a_s': float(ta), 'mean_b_s': float(tb),
            'ratio': float(ta / tb)}
