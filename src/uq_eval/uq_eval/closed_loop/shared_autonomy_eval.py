"""``uq eval shared-autonomy``: the grasp task in closed loop, four policies, same seeds.

The whole graph runs as separate processes over DDS on a private ROS domain
(:class:`uq_eval.closed_loop.loop.ClosedLoop`), in real time, started once for all trials.
For each policy the level is pinned through ``set_autonomy_override`` (teleoperation: 0;
full autonomy: 3, blind to uncertainty; gated and gated_help: released, the uncertainty
decides), then the suite's trials are played one after another (``reset_task``), the same
trials for every policy. The scripted operator always drives under teleoperation, never
under full autonomy, and under the gated policies supervises: it drives while the level it
sees is at most shared.

**gated_help** is gated plus the ask-for-help node and the scripted labeller, who answers
each help request with the simulator's ground truth after ``--labeller-delay`` seconds.
Each of its trials starts the ask-for-help node on a fresh label store (it asks as if for
the first time), and a trial whose answers taught the detector is followed by a detector
restart from the shipped GP: every trial, of any policy, starts from the same detector,
and a resumed run plays the same trials as an uninterrupted one.

Suites (trial ``k`` has seed ``--seed + k``):

- **easy**: the task as drawn (a torus look-alike in about 4 trials of 10);
- **hard**: a confident look-alike (a procedural shape chosen by the rule of
  :mod:`uq_eval.closed_loop.lookalike_selection`, in other trials than it was chosen in)
  nearer than the target; every third trial leaves the target out (the right outcome is
  no grasp: the operator holds until the time limit);
- **faults**: a plain trial in which, ``FAULT_AT_S`` after its start, the camera stops for
  2 s, the detector is killed and restarted, or a burst of torn frames arrives (in turn).
  The right outcome: no motion toward a stale goal, and the trial completed afterwards.

Every finished trial is appended to ``OUT/trials.jsonl`` at once; a rerun with the same
``--out`` plays only the trials missing there (gated_help trials only when they were
played with the same labeller delay). Writes ``OUT/shared_autonomy.json`` (per suite and
policy), ``OUT/summary.md`` (one table per suite, 95 % Wilson intervals),
``OUT/hard_trial.png`` (one hard trial: what each policy but teleoperation did) and, per
suite in which a gated policy grasped a wrong object, ``OUT/wrong_grasps_<suite>.png``
(those trials' level, scores and suspect gate over time).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, NoReturn

from uq_common.arguments import (
    domain_id,
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
)
from uq_eval.closed_loop.shared_autonomy_metrics import (
    HELP_POLICIES,
    OPERATOR_MODE,
    PINNED_LEVEL,
    POLICIES,
    score_trial,
    stale_motion,
    summarise,
    time_ratios,
    trial_samples,
)

WORKSPACE = Path(__file__).resolve().parents[4]
_DEADBAND = 0.02  # arbitration_node operator_deadband in config/shared_autonomy.yaml
SUITES = ('easy', 'hard', 'faults')
FAULTS = ('camera_stop', 'detector_restart', 'corrupt_frames')
FAULT_AT_S = 1.2  # seconds into the trial: every policy is on its way by then
CAMERA_STOP_S = 2.0
CORRUPT_FRAMES = 15  # 1.5 s of the sim's 10 Hz camera
# From the arbitration's first report of stale perception to the moment the gripper must
# be still: braking from full speed (max_speed / max_accel) and a scheduling allowance.
BRAKING_ALLOWANCE_S = 0.25 + 0.35
PERCEPTION_DEADLINE_S = 0.5  # arbitration_node perception_deadline_s
# The robot keeps a command for command_timeout_s (0.5 s), then brakes (0.25 s).
OPERATOR_QUIET_S = 0.5 + 0.25
# The time limit of a target-absent trial: the operator holds that long and nothing is
# grasped; long enough for the autonomy to reach any look-alike (about 3 s).
ABSENT_TIMEOUT_S = 10.0
FAULT_TIMEOUT_S = 60.0  # room for the detector's restart
# A node's start: the detector's restart took up to 43 s on a loaded machine.
NODE_UP_TIMEOUT_S = 120.0
HELP_NODE = 'ask_for_help_node'


def _one_line_errors(parser: argparse.ArgumentParser) -> None:
    """Bad arguments exit 2 with one line (no usage block)."""
    def error(message: str) -> NoReturn:
        parser.exit(2, f'{parser.prog}: error: {message}\n')
    parser.error = error  # type: ignore[method-assign]


def configure(parser: argparse.ArgumentParser) -> None:
    """Closed-loop evaluation of teleoperation, full autonomy, gated autonomy and gated
    autonomy with the ask-for-help loop."""
    _one_line_errors(parser)
    parser.add_argument('--suite', choices=(*SUITES, 'all'), default='easy',
                        help='which trials: easy, hard (confident look-alikes, target '
                             'absent), faults (camera, detector), or all three')
    parser.add_argument('--trials', type=positive_int, default=30,
                        help='trials per suite and policy')
    parser.add_argument('--quick', action='store_true',
                        help='3 trials per policy (one with a look-alike), for the tests')
    parser.add_argument('--seed', type=non_negative_int, default=0, help='first trial seed')
    parser.add_argument('--policies', nargs='+', default=list(POLICIES), choices=POLICIES)
    parser.add_argument('--labeller-delay', type=non_negative_float, default=None,
                        help='seconds the scripted labeller takes to answer a help request '
                             'under gated_help (default: answer_delay_s of the '
                             'scripted_labeller_node section of config/shared_autonomy.yaml)')
    parser.add_argument('--out', type=Path, default=WORKSPACE / 'out' / 'shared_autonomy')
    parser.add_argument('--trial-timeout', type=positive_float, default=45.0, help='seconds')
    parser.add_argument('--lookalikes', type=Path, default=None,
                        help='the confident look-alike selection (default: the shipped '
                             'config/confident_lookalikes.json)')
    parser.add_argument('--domain-id', type=domain_id, default=int(os.environ.get(
        'UQ_EVAL_DOMAIN_ID', '97')), help='ROS_DOMAIN_ID (kept private)')
    parser.set_defaults(run=run)


def trial_plan(suite: str, trials: int, seed: int, shapes: list[int] | None,
               quick: bool = False) -> list[dict]:
    """The trials of one suite, the same for every policy.

    Each is a dict: ``seed``, ``kind`` and the reset request's extra fields (``extra``),
    ``lookalike`` (True, False or None: drawn) and, in the faults suite, ``fault``.
    """
    if suite == 'easy':
        if quick:
            return [{'seed': seed, 'kind': 'plain', 'lookalike': False, 'extra': {}},
                    {'seed': seed + 1, 'kind': 'lookalike', 'lookalike': True, 'extra': {}},
                    {'seed': seed + 2, 'kind': 'plain', 'lookalike': False, 'extra': {}}]
        return [{'seed': seed + k, 'kind': 'drawn', 'lookalike': None, 'extra': {}}
                for k in range(trials)]
    if suite == 'hard':
        if not shapes:
            raise ValueError('the hard suite needs at least one confident look-alike shape')
        plan = []
        for k in range(trials):
            absent = k % 3 == 2
            # The look-alike trials cycle over the shapes, and so do the target-absent ones:
            # one cycle over every trial would tie shape k % 3 to the kind k % 3 with three.
            nth = k // 3 if absent else k - (k + 1) // 3
            extra: dict[str, Any] = {'lookalike_shape': shapes[nth % len(shapes)]}
            if absent:
                extra.update(target_absent=True, timeout_s=ABSENT_TIMEOUT_S)
            plan.append({'seed': seed + k, 'kind': 'target_absent' if absent
                         else 'confident_lookalike', 'lookalike': True, 'extra': extra})
        return plan
    if suite == 'faults':
        return [{'seed': seed + k, 'kind': FAULTS[k % len(FAULTS)], 'lookalike': False,
                 'fault': FAULTS[k % len(FAULTS)],
                 'extra': {'timeout_s': FAULT_TIMEOUT_S}} for k in range(trials)]
    raise ValueError(f'unknown suite {suite!r}; expected one of {SUITES}')


def _load_done(path: Path) -> dict[tuple[str, str, int], dict]:
    """The trials already in ``trials.jsonl`` (a torn last line, from a kill, is skipped)."""
    done: dict[tuple[str, str, int], dict] = {}
    if not path.exists():
        return done
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
            done[(row['suite'], row['policy'], int(row['seed']))] = row
        except (ValueError, KeyError, TypeError):
            continue
    return done


def _shapes(args: argparse.Namespace) -> list[int] | None:
    from uq_eval.closed_loop.lookalike_selection import (
        SELECTION_SEED_BASE,
        SHIPPED_SELECTION,
        load_selection,
    )
    if args.seed + args.trials > SELECTION_SEED_BASE:
        raise ValueError(f'hard trials must use other seeds than the look-alikes were chosen '
                         f'in (from {SELECTION_SEED_BASE}); --seed + --trials is '
                         f'{args.seed + args.trials}')
    return list(load_selection(args.lookalikes or SHIPPED_SELECTION)['passed'])


def labeller_delay(args: argparse.Namespace) -> float:
    """The scripted labeller's answer delay of this run: ``--labeller-delay``, else the
    loop's configuration."""
    if args.labeller_delay is not None:
        return args.labeller_delay
    import yaml

    from uq_eval.closed_loop.loop import CONFIG, LABELLER

    config = yaml.safe_load(CONFIG.read_text(encoding='utf-8'))
    return float(config[LABELLER[0]]['ros__parameters']['answer_delay_s'])


def _replayed(row: dict, delay: float) -> bool:
    """Whether a trial of the journal counts for this run: a gated_help trial only when
    its labeller answered with this run's delay."""
    return row['policy'] not in HELP_POLICIES or row.get('labeller_delay_s') == delay


def run(args: argparse.Namespace) -> int:
    suites = list(SUITES) if args.suite == 'all' else [args.suite]
    if args.quick and suites != ['easy']:
        print('uq eval shared-autonomy: --quick plays the easy suite only', file=sys.stderr)
        return 2
    if args.labeller_delay is not None and not set(args.policies) & set(HELP_POLICIES):
        print(f'uq eval shared-autonomy: --labeller-delay needs a policy with the labeller '
              f'({", ".join(HELP_POLICIES)}) in --policies', file=sys.stderr)
        return 2
    try:
        shapes = _shapes(args) if 'hard' in suites else None
        plans = {suite: trial_plan(suite, args.trials, args.seed, shapes, args.quick)
                 for suite in suites}
    except ValueError as exc:
        print(f'uq eval shared-autonomy: {exc}', file=sys.stderr)
        return 2
    from uq_eval.closed_loop.loop import ClosedLoop, LoopObserver

    args.out.mkdir(parents=True, exist_ok=True)
    os.environ['ROS_DOMAIN_ID'] = str(args.domain_id)
    journal = args.out / 'trials.jsonl'
    delay = labeller_delay(args)
    done = {key: row for key, row in _load_done(journal).items() if _replayed(row, delay)}
    planned = [(suite, policy, trial) for suite in suites for policy in args.policies
               for trial in plans[suite]]
    todo = [(suite, policy, trial) for suite, policy, trial in planned
            if (suite, policy, trial['seed']) not in done]
    print(f'uq eval shared-autonomy: {len(planned) - len(todo)} of {len(planned)} trials '
          f'already in {journal}; {len(todo)} to play', flush=True)
    started = time.monotonic()
    if todo:
        # The ask-for-help node runs only under the help policies, started per trial.
        with ClosedLoop(args.out / 'logs', args.domain_id, with_optional=False) as loop:
            observer = LoopObserver()
            try:
                code = _play(loop, observer, todo, journal, done, len(planned) - len(todo),
                             len(planned), started, args.trial_timeout, delay)
            finally:
                observer.close()
            if code:
                return code
    results = {suite: {policy: [done[(suite, policy, t['seed'])] for t in plans[suite]]
                       for policy in args.policies} for suite in suites}
    for row in results.get('faults', {}).values():
        for trial in row:
            score_fault(trial)
    report = _report(results, args, delay)
    (args.out / 'shared_autonomy.json').write_text(json.dumps(report, indent=2))
    (args.out / 'summary.md').write_text(markdown(report))
    if 'hard' in results:
        plot_hard_trial(results['hard'], args.out / 'hard_trial.png')
    for suite, by_policy in results.items():
        path = args.out / f'wrong_grasps_{suite}.png'
        if not plot_wrong_grasps(suite, by_policy, path):
            path.unlink(missing_ok=True)  # from an earlier report of this directory
    print(markdown(report))
    return 0


def _start_node(loop: Any, name: str, module: str, extra_args: list[str]) -> str:
    """Start one node and wait until it is up; '' or the problem."""
    from uq_eval.closed_loop.loop import READY_LINES

    loop.extra_args[name] = extra_args
    loop.start(name, module)
    if loop.wait_for_output(name, READY_LINES[name], NODE_UP_TIMEOUT_S):
        return ''
    return f'{name} did not come up within {NODE_UP_TIMEOUT_S:.0f} s (log: ' \
           f'{loop.log_dir / (name + ".log")})'


def _start_help_node(loop: Any, store: Path) -> str:
    """Start the ask-for-help node on a fresh label store ``store``; '' or the problem."""
    from uq_eval.closed_loop.loop import OPTIONAL_NODES, help_node_args

    for path in (store, store.with_name(store.name + '-wal'),
                 store.with_name(store.name + '-shm')):
        path.unlink(missing_ok=True)
    store.parent.mkdir(parents=True, exist_ok=True)
    return _start_node(loop, HELP_NODE, dict(OPTIONAL_NODES)[HELP_NODE], help_node_args(store))


def _stored_labels(store: Path) -> list[tuple[float, str]]:
    """(commit time, label) of each answer in a label store."""
    from uq_autonomy.labels.store import LabelStore

    if not store.exists():
        return []
    with LabelStore(store, readonly=True) as labels:
        return [(record.time, record.label) for record in labels.labels()]


def _switch_policy(loop: Any, observer: Any, policy: str, before: str | None,
                   delay: float) -> str:
    """Operator mode, pinned level and labeller of ``policy``; '' or the problem."""
    from uq_eval.closed_loop.loop import LABELLER, labeller_args

    if before in HELP_POLICIES and policy not in HELP_POLICIES:
        loop.stop(LABELLER[0])
    loop.restart('scripted_operator_node', ['-p', f'mode:={OPERATOR_MODE[policy]}'])
    level = PINNED_LEVEL[policy]
    if not observer.set_level(-1 if level is None else level):
        return f'override for {policy} refused'
    if policy in HELP_POLICIES and before not in HELP_POLICIES:
        return _start_node(loop, *LABELLER, labeller_args(delay))
    return ''


def _forget_earned_level(observer: Any) -> bool:
    """Start the next trial at teleoperation, as a new task: a level pinned while the last
    trial's scene is still in view, then released, is not remembered through the reset's
    camera silence (the arbitration restores only a level the uncertainty earned), so the
    new scene's look-alike is not handed the last trial's assistance at once."""
    return observer.set_level(0) and observer.set_level(-1)


def _play(loop: Any, observer: Any, todo: list, journal: Path, done: dict, done_before: int,
          total: int, started: float, trial_timeout: float, delay: float) -> int:
    from uq_eval.closed_loop.loop import READY_LINES, run_trial

    if not observer.wait_until_ready(180.0):
        print(f'uq eval shared-autonomy: the loop did not come up (dead: {loop.dead()}); '
              f'logs in {loop.log_dir}', file=sys.stderr)
        return 1
    policy_now = None
    played = 0
    with journal.open('a') as out:
        for suite, policy, trial in todo:
            if policy != policy_now:
                problem = _switch_policy(loop, observer, policy, policy_now, delay)
                if problem:
                    print(f'uq eval shared-autonomy: {problem}', file=sys.stderr)
                    return 1
                policy_now = policy
            store = None
            if policy in HELP_POLICIES:
                store = loop.log_dir / 'labels' / f"{suite}_{trial['seed']}.sqlite3"
                problem = _start_help_node(loop, store)
                if problem:
                    print(f'uq eval shared-autonomy: {problem}', file=sys.stderr)
                    return 1
            if loop.dead():
                print(f'uq eval shared-autonomy: nodes died: {loop.dead()}', file=sys.stderr)
                return 1
            if PINNED_LEVEL[policy] is None and not _forget_earned_level(observer):
                print('uq eval shared-autonomy: override refused', file=sys.stderr)
                return 1
            fault = trial.get('fault')
            extra = {'timeout_s': trial_timeout, **trial['extra']}
            state, samples = run_trial(
                observer, trial['seed'], trial['lookalike'], extra['timeout_s'], extra,
                None if fault is None else (FAULT_AT_S, _injector(loop, observer, fault)))
            ended = time.time()  # the label store's clock
            row = score_trial(state, samples, _DEADBAND)
            row.update(suite=suite, policy=policy, kind=trial['kind'],
                       lookalike_shape=trial['extra'].get('lookalike_shape'))
            if store is not None:
                # Stopped first, so that no answer reaches the detector after the count.
                loop.stop(HELP_NODE)
                labels = _stored_labels(store)
                answered = [label for at, label in labels if at <= ended]
                row.update(labeller_delay_s=delay, help_answered=len(answered),
                           help_answers=answered)
                if labels:
                    # The detector learnt them: the next trial must start from the shipped GP.
                    loop.restart('detector_node', loop.extra_args.get('detector_node', []))
                    if not loop.wait_for_output('detector_node', READY_LINES['detector_node'],
                                                NODE_UP_TIMEOUT_S):
                        print(f'uq eval shared-autonomy: the detector did not come back after '
                              f'the labels of {suite} trial {trial["seed"]} (log: '
                              f'{loop.log_dir / "detector_node.log"})', file=sys.stderr)
                        return 1
            if fault is not None:
                row['fault'] = fault
                running = trial_samples(samples, state)
                onset = state.get('fault_onset')
                # The onset on the timeline's clock (seconds from its first sample).
                row['fault_onset'] = None if onset is None or not running \
                    else onset - running[0].t
                # The next trial should start with the detector back. Perception also counts
                # as stale while the autonomy has no target (after a wrong grasp, say), so
                # a loop that stays stale is noted, not fatal: the next reset goes on.
                if not observer.wait_until_ready(60.0):
                    print(f'uq eval shared-autonomy: perception not reported fresh within 60 s '
                          f'after the {fault} fault (dead: {loop.dead()}); going on',
                          flush=True)
            row['timeline'] = _compact(samples, state)
            score_fault(row)
            out.write(json.dumps(row) + '\n')
            out.flush()
            done[(suite, policy, trial['seed'])] = row
            played += 1
            rate_s = (time.monotonic() - started) / played
            remaining = len(todo) - played
            stale = f", stale motion {row['stale_motion_m'] * 1000:.0f} mm" \
                if 'stale_motion_m' in row else ''
            helped = f", {row['help_requests']} help requests ({row['help_answered']} " \
                f"answered: {', '.join(row['help_answers']) or '-'})" if store else ''
            print(f"[{done_before + played}/{total}, about {remaining * rate_s / 60:.0f} min left] "
                  f"{suite} {policy} seed {trial['seed']} ({trial['kind']}): {row['status']} "
                  f"(grasped {row['grasped']}) in {row['time_s']:.1f} s, operator share "
                  f"{row['operator_share']:.2f}, {row['level_changes']} level changes{stale}"
                  f"{helped}", flush=True)
    return 0


def score_fault(row: dict) -> None:
    """Add a fault trial's stale motion (from its timeline) to its row."""
    if 'fault' not in row:
        return
    if row.get('fault_onset') is None:
        row.update(stale_after_s=None, stale_window_s=0.0, stale_motion_m=0.0)
        return
    timeline = row['timeline']
    samples = [SimpleNamespace(t=t, stale=stale, operator_speed=speed,
                               gripper_x=math.nan if g[0] is None else g[0],
                               gripper_y=math.nan if g[1] is None else g[1])
               for t, stale, speed, g in zip(timeline['t'], timeline['stale'],
                                             timeline['operator_speed'], timeline['gripper'],
                                             strict=True)]
    row.update(stale_motion(samples, row['fault_onset'], BRAKING_ALLOWANCE_S, _DEADBAND,
                            PERCEPTION_DEADLINE_S, OPERATOR_QUIET_S))


def _injector(loop: Any, observer: Any, fault: str):
    def inject() -> None:
        if fault == 'camera_stop':
            observer.camera_fault({'camera_stop_s': CAMERA_STOP_S})
        elif fault == 'corrupt_frames':
            observer.camera_fault({'corrupt_frames': CORRUPT_FRAMES})
        else:
            loop.kill('detector_node')
            loop.start('detector_node', dict(loop.nodes)['detector_node'])
    return inject


def _compact(samples: list, state: dict) -> dict:
    """The trial's samples as columns (seconds from the first running sample)."""
    running = trial_samples(samples, state)
    t0 = running[0].t if running else 0.0

    def finite(value: float, digits: str = '{:.4g}') -> float | None:
        return None if not math.isfinite(value) else float(digits.format(value))
    return {'t': [round(s.t - t0, 3) for s in running],
            'level': [s.level for s in running],
            'uncertainty': [finite(s.uncertainty) for s in running],
            'blend_alpha': [round(s.blend_alpha, 3) for s in running],
            'stale': [bool(s.stale) for s in running],
            'operator_speed': [round(s.operator_speed, 3) for s in running],
            'autonomy_speed': [round(s.autonomy_speed, 3) for s in running],
            'gripper': [[finite(s.gripper_x), finite(s.gripper_y)] for s in running],
            'suspect_hold': [bool(s.suspect_hold) for s in running],
            # None where the driving detection has no track score (-1) or there is none.
            'track_score': [finite(s.track_score) if s.track_score >= 0 else None
                            for s in running],
            'help_requests': [s.help_requests - running[0].help_requests for s in running],
            'objects': [{k: o.get(k) for k in ('name', 'class', 'x', 'y')}
                        for o in state.get('objects', []) if isinstance(o, dict)]}


def _report(results: dict[str, dict[str, list[dict]]], args: argparse.Namespace,
            delay: float) -> dict:
    suites = {suite: {'policies': {policy: summarise(rows) for policy, rows in by_policy.items()},
                      'time_ratios': time_ratios(by_policy)}
              for suite, by_policy in results.items()}
    command = 'uq eval shared-autonomy ' + (
        '--quick' if args.quick else f'--suite {args.suite} --trials {args.trials}')
    if args.seed:
        command += f' --seed {args.seed}'
    if list(args.policies) != list(POLICIES):
        command += ' --policies ' + ' '.join(args.policies)
    if args.labeller_delay is not None:
        command += f' --labeller-delay {args.labeller_delay:g}'
    trials = {suite: {policy: [{k: v for k, v in row.items() if k != 'timeline'}
                               for row in rows] for policy, rows in by_policy.items()}
              for suite, by_policy in results.items()}
    report: dict[str, Any] = {'command': command, 'suites': suites, 'trials': trials}
    if set(args.policies) & set(HELP_POLICIES):
        report['labeller_delay_s'] = delay
    return report


def _fmt(value: Any, pattern: str) -> str:
    return '—' if value is None or (isinstance(value, float) and math.isnan(value)) \
        else pattern.format(value)


def _rate_cell(r: dict) -> str:
    if not r['trials']:
        return '—'
    return (f"{r['count']}/{r['trials']} ({100 * r['rate']:.0f} %, "
            f"{100 * r['low']:.0f}–{100 * r['high']:.0f})")


def markdown(report: dict) -> str:
    """One table per suite: rates as count/trials (percent, 95 % Wilson interval)."""
    lines = [f"`{report['command']}`"]
    for suite, body in report['suites'].items():
        faults = suite == 'faults'
        lines += ['', f'**{suite}**', '',
                  '| policy | success | wrong grasps | timeouts | time to grasp (s) | '
                  'operator share | level changes / trial | help requests (answered) / trial |'
                  + (' moved toward a stale goal |' if faults else ''),
                  '|---|---|---|---|---|---|---|---|' + ('---|' if faults else '')]
        for policy, s in body['policies'].items():
            lines.append(
                f"| {policy} | {_rate_cell(s['success'])} | {_rate_cell(s['wrong_grasps'])} | "
                f"{_rate_cell(s['timeouts'])} | {_fmt(s['mean_time_s'], '{:.1f}')} | "
                f"{_fmt(s['operator_share'], '{:.2f}')} | "
                f"{_fmt(s['level_changes_per_trial'], '{:.1f}')} | "
                f"{_fmt(s['help_requests_per_trial'], '{:.1f}')} "
                f"({_fmt(s['help_answered_per_trial'], '{:.1f}')}) |"
                + (f" {_rate_cell(s['moved_toward_stale_goal'])} |" if faults else ''))
        held = {policy: s['suspect_hold_share'] for policy, s in body['policies'].items()
                if s['suspect_hold_share'] > 0}
        if held:
            lines.append('\nShare of the time the suspect gate held the level at guided: '
                         + ', '.join(f'{policy} {100 * share:.0f} %'
                                     for policy, share in held.items()))
        for key, ratio in body['time_ratios'].items():
            label = key.replace('_over_', ' / ').replace('_', ' ')
            lines.append(f"\nMean time to grasp, {label}, on the {ratio['pairs']} trials "
                         f"both completed by a grasp: {_fmt(ratio['ratio'], '{:.2f}')}")
        kinds = {policy: s.get('per_kind', {}) for policy, s in body['policies'].items()}
        if suite == 'hard' and any(kinds.values()):
            lines.append('')
            for policy, per_kind in kinds.items():
                parts = [f"{kind}: success {_rate_cell(k['success'])}, wrong grasps "
                         f"{_rate_cell(k['wrong_grasps'])}" for kind, k in per_kind.items()]
                lines.append(f"- {policy}: " + '; '.join(parts))
    return '\n'.join(lines) + '\n'


GATED_POLICIES = tuple(p for p in POLICIES if PINNED_LEVEL[p] is None)
# Line style per policy in the plots.
STYLES = {'full_autonomy': '--', 'gated': '-', 'gated_help': ':'}


def _hard_example(by_policy: dict[str, list[dict]]) -> dict[str, dict] | None:
    """One confident look-alike trial, by policy (teleoperation left out): the first that a
    gated policy completed and full autonomy got wrong, else the first one played."""
    played = {policy: {r['seed']: r for r in rows if r.get('kind') == 'confident_lookalike'}
              for policy, rows in by_policy.items() if policy in STYLES}
    seeds = sorted({seed for rows in played.values() for seed in rows})
    full = played.get('full_autonomy', {})

    def gate_paid(seed: int) -> bool:
        return seed in full and bool(full[seed].get('wrong_grasp')) and any(
            played.get(p, {}).get(seed, {}).get('success') for p in GATED_POLICIES)
    seed = next((seed for seed in seeds if gate_paid(seed)), seeds[0] if seeds else None)
    if seed is None:
        return None
    return {policy: rows[seed] for policy, rows in played.items() if seed in rows}


def plot_hard_trial(by_policy: dict[str, list[dict]], path: Path) -> bool:
    """Plot one hard trial (see :func:`_hard_example`); False when there is none."""
    example = _hard_example(by_policy)
    if example is None:
        return False
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 1, figsize=(8, 7), sharex=True)
    first = next(iter(example.values()))
    objects = {o['name']: o for o in first['timeline']['objects']}

    def distance_to(row: dict, name: str) -> list[float]:
        o = objects[name]
        return [math.nan if None in g else math.hypot(g[0] - o['x'], g[1] - o['y'])
                for g in row['timeline']['gripper']]
    for policy, row in example.items():
        t = row['timeline']['t']
        for name, colour in (('target', 'tab:green'), ('lookalike', 'tab:red')):
            if name in objects:
                axes[0].plot(t, distance_to(row, name), STYLES[policy], color=colour,
                             label=f'{policy}: to the {name}')
        if policy in GATED_POLICIES:
            axes[1].plot(t, [math.nan if u is None else u
                             for u in row['timeline']['uncertainty']],
                         STYLES[policy], color='tab:red', label=policy)
        axes[2].step(t, row['timeline']['level'], STYLES[policy], where='post',
                     label=f'{policy} level')
    axes[0].set_ylabel('gripper distance (m)')
    axes[0].legend(fontsize=7)
    axes[1].set_ylabel('calibrated score\n(autonomy target)')
    axes[1].legend(fontsize=7)
    axes[2].set_ylabel('level')
    axes[2].set_yticks([0, 1, 2, 3])
    axes[2].legend(fontsize=7)
    axes[2].set_xlabel('time since trial start (s)')
    fig.suptitle(f"hard trial {first['seed']} (look-alike shape {first['lookalike_shape']}): "
                 + ', '.join(f"{policy} {row['status']} ({row['grasped']})"
                             for policy, row in example.items()), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def plot_wrong_grasps(suite: str, by_policy: dict[str, list[dict]], path: Path) -> bool:
    """The trials of one suite in which a gated policy grasped a wrong object: one row per
    seed, one column per gated policy (its run of that seed, whatever its outcome), each
    with the level, the calibrated score and track score of the driving detection, the
    suspect gate's holds (shaded) and the help requests (dotted); False when there is none."""
    columns = [p for p in GATED_POLICIES if p in by_policy]
    runs = {p: {r['seed']: r for r in by_policy[p]} for p in columns}
    seeds = sorted({seed for p in columns for seed, r in runs[p].items()
                    if r.get('wrong_grasp')})
    if not seeds:
        return False
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(seeds), len(columns), figsize=(6 * len(columns),
                                                                2.4 * len(seeds)),
                             squeeze=False)
    legend = True  # on the first drawn cell
    for row_axes, seed in zip(axes, seeds, strict=True):
        for ax, policy in zip(row_axes, columns, strict=True):
            row = runs[policy].get(seed)
            if row is None:
                ax.set_axis_off()
                continue
            timeline = row['timeline']
            t = timeline['t']
            ax.step(t, timeline['level'], where='post', color='k', label='level')
            ax.set_ylim(-0.2, 3.2)
            ax.set_yticks([0, 1, 2, 3])
            ax.set_ylabel('level')
            # Older journals have no suspect or track-score columns.
            held = timeline.get('suspect_hold', [])
            for a, b, hold in zip(t, t[1:], held, strict=False):
                if hold:
                    ax.axvspan(a, b, color='tab:orange', alpha=0.25, lw=0)
            requests = timeline.get('help_requests', [])
            for a, before, after in zip(t[1:], requests, requests[1:], strict=False):
                if after > before:
                    ax.axvline(a, color='tab:purple', ls=':', lw=1.2)
            scores = ax.twinx()
            scores.plot(t, [math.nan if u is None else u for u in timeline['uncertainty']],
                        color='tab:red', lw=1, label='calibrated score')
            scores.plot(t, [math.nan if u is None else u
                            for u in timeline.get('track_score', [None] * len(t))],
                        color='tab:blue', lw=1, label='track score')
            scores.set_ylim(0, 1.02)
            scores.set_ylabel('score')
            ax.set_title(f"{policy}, trial {seed} ({row.get('kind')}, shape "
                         f"{row.get('lookalike_shape')}): {row['status']} "
                         f"({row['grasped']}), {row.get('help_requests', 0)} help requests",
                         fontsize=8)
            if legend:
                ax.legend(loc='upper left', fontsize=7)
                scores.legend(loc='upper right', fontsize=7)
                legend = False
    for ax in axes[-1]:
        ax.set_xlabel('time since trial start (s); shaded: suspect hold, dotted: help request')
    fig.suptitle(f'{suite}: trials in which a gated policy grasped a wrong object', fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return True


def main() -> int:
    parser = argparse.ArgumentParser(prog='uq eval shared-autonomy',
                                     description=__doc__.split('\n\n')[0])
    configure(parser)
    args = parser.parse_args()
    return args.run(args)


if __name__ == '__main__':
    sys.exit(main())
