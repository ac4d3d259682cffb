"""``uq eval shared-autonomy``: the grasp task in closed loop, three policies, same seeds.

The whole graph runs as separate processes over DDS on a private ROS domain
(:class:`uq_eval.closed_loop.loop.ClosedLoop`), in real time, started once for all trials.
For each policy the level is pinned through ``set_autonomy_override`` (teleoperation: 0;
full autonomy: 3, blind to uncertainty; gated: released, the uncertainty decides), then
trials ``seed .. seed + N - 1`` are played one after another (``reset_task``). The
scripted operator always drives under teleoperation, never under full autonomy, and
under gated autonomy supervises: it drives while the level it sees is at most shared.

Writes ``OUT/shared_autonomy.json`` (per trial and per policy), ``OUT/summary.md`` (the
policy table) and ``OUT/timeline.png`` (one gated look-alike trial: uncertainty, level,
who drives, help requests).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

from uq_common.arguments import domain_id, non_negative_int, positive_float, positive_int
from uq_eval.closed_loop.shared_autonomy_metrics import (
    OPERATOR_MODE,
    PINNED_LEVEL,
    POLICIES,
    paired_time_ratio,
    score_trial,
    summarise,
    trial_samples,
)

WORKSPACE = Path(__file__).resolve().parents[4]
_DEADBAND = 0.02  # arbitration_node operator_deadband in config/shared_autonomy.yaml


def configure(parser: argparse.ArgumentParser) -> None:
    """Closed-loop evaluation of teleoperation, full autonomy and gated autonomy."""
    parser.add_argument('--trials', type=positive_int, default=30, help='trials per policy')
    parser.add_argument('--quick', action='store_true',
                        help='3 trials per policy (one with a look-alike), for the tests')
    parser.add_argument('--seed', type=non_negative_int, default=0, help='first trial seed')
    parser.add_argument('--policies', nargs='+', default=list(POLICIES), choices=POLICIES)
    parser.add_argument('--out', type=Path, default=WORKSPACE / 'out' / 'shared_autonomy')
    parser.add_argument('--trial-timeout', type=positive_float, default=45.0, help='seconds')
    parser.add_argument('--domain-id', type=domain_id, default=int(os.environ.get(
        'UQ_EVAL_DOMAIN_ID', '97')), help='ROS_DOMAIN_ID (kept private)')
    parser.set_defaults(run=run)


def _trial_plan(args: argparse.Namespace) -> list[tuple[int, bool | None]]:
    if args.quick:
        return [(args.seed, False), (args.seed + 1, True), (args.seed + 2, False)]
    return [(args.seed + k, None) for k in range(args.trials)]


def run(args: argparse.Namespace) -> int:
    if args.trials < 1:
        print('uq eval shared-autonomy: --trials must be >= 1', file=sys.stderr)
        return 2
    from uq_eval.closed_loop.loop import ClosedLoop, LoopObserver, run_trial

    args.out.mkdir(parents=True, exist_ok=True)
    os.environ['ROS_DOMAIN_ID'] = str(args.domain_id)
    plan = _trial_plan(args)
    started = time.monotonic()
    results: dict[str, list[dict]] = {}
    timelines: dict[str, dict] = {}
    with ClosedLoop(args.out / 'logs', args.domain_id) as loop:
        observer = LoopObserver()
        try:
            if not observer.wait_until_ready(180.0):
                print(f'uq eval shared-autonomy: the loop did not come up (dead: '
                      f'{loop.dead()}); logs in {args.out / "logs"}', file=sys.stderr)
                return 1
            for policy in args.policies:
                loop.restart('scripted_operator_node', ['-p', f'mode:={OPERATOR_MODE[policy]}'])
                level = PINNED_LEVEL[policy]
                if not observer.set_level(-1 if level is None else level):
                    print(f'uq eval shared-autonomy: override for {policy} refused',
                          file=sys.stderr)
                    return 1
                rows = []
                for seed, lookalike in plan:
                    if loop.dead():
                        print(f'uq eval shared-autonomy: nodes died: {loop.dead()}',
                              file=sys.stderr)
                        return 1
                    state, samples = run_trial(observer, seed, lookalike, args.trial_timeout)
                    row = score_trial(state, samples, _DEADBAND)
                    row['timeline'] = _compact(samples, state)
                    rows.append(row)
                    print(f'[{policy}] trial {seed} look-alike={row["lookalike"]}: '
                          f'{row["status"]} in {row["time_s"]:.1f} s, operator share '
                          f'{row["operator_share"]:.2f}, {row["level_changes"]} level changes',
                          flush=True)
                    # Plot the first gated look-alike trial (else the first gated trial).
                    if policy == 'gated' and ('gated' not in timelines or (
                            row['lookalike'] and not timelines['gated']['lookalike'])):
                        timelines['gated'] = {'lookalike': row['lookalike'], 'seed': seed,
                                              'samples': samples, 'state': state}
                results[policy] = rows
        finally:
            observer.close()
    report = _report(results, time.monotonic() - started, args)
    (args.out / 'shared_autonomy.json').write_text(json.dumps(report, indent=2))
    (args.out / 'summary.md').write_text(_markdown(report))
    if 'gated' in timelines:
        _plot_timeline(timelines['gated'], args.out / 'timeline.png')
    print(_markdown(report))
    return 0


def _compact(samples: list, state: dict) -> dict:
    """The trial's samples as columns (seconds from the first running sample)."""
    running = trial_samples(samples, state)
    t0 = running[0].t if running else 0.0
    return {'t': [round(s.t - t0, 3) for s in running],
            'level': [s.level for s in running],
            'uncertainty': [None if math.isnan(s.uncertainty) else float(f'{s.uncertainty:.4g}')
                            for s in running],
            'operator_speed': [round(s.operator_speed, 3) for s in running],
            'autonomy_speed': [round(s.autonomy_speed, 3) for s in running]}


def _report(results: dict[str, list[dict]], wall_s: float, args: argparse.Namespace) -> dict:
    policies = {policy: summarise(rows) for policy, rows in results.items()}
    targets: dict[str, Any] = {}
    report: dict[str, Any] = {
        'command': 'uq eval shared-autonomy ' + ('--quick' if args.quick
                                                 else f'--trials {args.trials}'),
        'wall_time_s': wall_s, 'policies': policies, 'trials': results, 'targets': targets}
    if 'gated' in results:
        targets['gated_success_rate'] = policies['gated']['success_rate']
        if 'teleoperation' in results:
            targets['gated_over_teleoperation'] = paired_time_ratio(
                results['gated'], results['teleoperation'])
        if 'full_autonomy' in results:
            targets['gated_over_full_autonomy'] = paired_time_ratio(
                results['gated'], results['full_autonomy'])
            targets['full_autonomy_lookalike_success_rate'] = (
                policies['full_autonomy']['lookalike_success_rate'])
    return report


def _fmt(value: float, pattern: str) -> str:
    return '—' if value is None or (isinstance(value, float) and math.isnan(value)) \
        else pattern.format(value)


def _markdown(report: dict) -> str:
    lines = [f"`{report['command']}` ({report['wall_time_s']:.0f} s wall time)", '',
             '| policy | trials | success | success on look-alike trials | mean time to '
             'grasp (s) | operator share | level changes / trial |',
             '|---|---|---|---|---|---|---|']
    for policy, s in report['policies'].items():
        lines.append(
            f"| {policy} | {s['trials']} | {_fmt(100 * s['success_rate'], '{:.1f} %')} | "
            f"{_fmt(100 * s['lookalike_success_rate'], '{:.0f} %')} "
            f"({s['lookalike_trials']}) | {_fmt(s['mean_time_s'], '{:.1f}')} | "
            f"{_fmt(s['operator_share'], '{:.2f}')} | "
            f"{_fmt(s['level_changes_per_trial'], '{:.1f}')} |")
    t = report['targets']
    for key, label in (('gated_over_teleoperation', 'gated / teleoperation'),
                       ('gated_over_full_autonomy', 'gated / full autonomy')):
        if key in t:
            lines.append(f"\nMean time {label} on the {t[key]['pairs']} trials both "
                         f"completed: {_fmt(t[key]['ratio'], '{:.2f}')}")
    return '\n'.join(lines) + '\n'


def _plot_timeline(timeline: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    samples = trial_samples(timeline['samples'], timeline['state'])
    if not samples:
        return
    t0 = samples[0].t
    t = [s.t - t0 for s in samples]
    fig, axes = plt.subplots(4, 1, figsize=(8, 7), sharex=True)
    axes[0].plot(t, [s.uncertainty for s in samples], color='tab:red')
    axes[0].set_ylabel('calibrated score\n(autonomy target)')
    axes[1].step(t, [s.level for s in samples], where='post')
    axes[1].set_ylabel('level')
    axes[1].set_yticks([0, 1, 2, 3])
    from uq_eval.closed_loop.shared_autonomy_metrics import operator_weight
    axes[2].fill_between(t, [operator_weight(s.level, s.blend_alpha, s.operator_speed,
                                             _DEADBAND) for s in samples],
                         step='post', alpha=0.5, label='operator')
    axes[2].set_ylabel('operator share')
    axes[2].set_ylim(0, 1.05)
    axes[3].step(t, [s.help_requests - samples[0].help_requests for s in samples],
                 where='post', color='tab:purple')
    axes[3].set_ylabel('help requests')
    axes[3].set_xlabel('time since trial start (s)')
    state = timeline['state']
    fig.suptitle(f"gated trial {timeline['seed']} (look-alike: {timeline['lookalike']}): "
                 f"{state.get('status')} in {state.get('elapsed_s', math.nan):.1f} s")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(prog='uq eval shared-autonomy',
                                     description=__doc__.split('\n\n')[0])
    configure(parser)
    args = parser.parse_args()
    return args.run(args)


if __name__ == '__main__':
    sys.exit(main())
