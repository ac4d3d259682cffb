"""``uq demo`` (``make demo``): the whole system in closed loop over real DDS.

Starts, as separate processes on a private ROS domain (:class:`uq_eval.closed_loop.loop.
ClosedLoop`): the simulated robot with its camera (``sim_robot_node``), the detector, the
arbitration node, the autonomy (``reach_policy_node``), the scripted operator, the
ask-for-help node and the scripted labeller node (the person who answers). Plays one
grasp trial with a look-alike (a torus the detector takes for the target ellipsoid): the
uncertainty drops the level, the operator drives, the ask-for-help node asks about the
object, the person's answer teaches the detector, and the autonomy takes over again.
Writes to ``out/demo/``:

- ``overlay.gif``: the detector's overlay with the level, who drives and the open help
  requests (boxed in magenta), as an operator would see them;
- ``timeline.png``: per-object uncertainty, level and operator share, requests and answers;
- ``summary.md`` / ``summary.json``: task outcome and time, help precision and latency,
  the detector's figures; ``logs/``: one log per node.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import sys
import time
from pathlib import Path

from uq_common.arguments import domain_id, non_negative_float, non_negative_int, positive_float
from uq_eval.closed_loop.loop import LABELLER, help_node_args, labeller_args

WORKSPACE = Path(__file__).resolve().parents[4]
DEADBAND = 0.02  # arbitration_node operator_deadband, config/shared_autonomy.yaml
READY_TIMEOUT_S = 120.0


def configure(parser: argparse.ArgumentParser) -> None:
    """Run the main demo: the closed loop with ask-for-help, results in out/demo/."""
    parser.add_argument('--out', type=Path, default=WORKSPACE / 'out' / 'demo',
                        help='output directory (its previous demo outputs are replaced)')
    parser.add_argument('--model', type=Path, default=WORKSPACE / 'models' / 'detector.pt',
                        help='detector weights')
    parser.add_argument('--gp', type=Path, default=WORKSPACE / 'models' / 'detector_gp.npz',
                        help='the detector\'s NTK-GP artefact')
    parser.add_argument('--seed', type=non_negative_int, default=1,
                        help='grasp-task trial played (always with a look-alike)')
    parser.add_argument('--trial-timeout', type=positive_float, default=45.0,
                        help='seconds before the trial counts as a timeout')
    parser.add_argument('--answer-delay', type=non_negative_float, default=1.0,
                        help='seconds the scripted labeller (the person) takes to answer '
                        'a help request')
    parser.add_argument('--no-gif', action='store_true', help='skip the annotated GIF')
    parser.add_argument('--domain-id', type=domain_id, default=int(os.environ.get(
        'UQ_DEMO_DOMAIN_ID', '64')), help='ROS_DOMAIN_ID of the demo (kept private)')
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    for path, what in ((args.model, 'detector weights'), (args.gp, 'GP artefact')):
        if not path.is_file():
            print(f'uq demo: {what} not found at {path}; see models/MODEL_CARD.md to '
                  'reproduce them', file=sys.stderr)
            return 2
    if args.trial_timeout <= 0 or args.answer_delay < 0:
        print('uq demo: --trial-timeout must be > 0 and --answer-delay >= 0', file=sys.stderr)
        return 2
    from uq_eval.closed_loop.demo_recorder import DemoRecorder
    from uq_eval.closed_loop.loop import ClosedLoop, LoopObserver, run_trial

    started = time.monotonic()
    args.out.mkdir(parents=True, exist_ok=True)
    for stale in ('logs', 'labels.sqlite3', 'labels.sqlite3-wal', 'labels.sqlite3-shm',
                  'overlay.gif', 'timeline.png', 'summary.md',
                  'summary.json', 'uncertainty.png'):
        path = args.out / stale
        shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
    os.environ['ROS_DOMAIN_ID'] = str(args.domain_id)
    store = args.out / 'labels.sqlite3'
    extra = {
        # The scripted labeller answers with the ground truth, so its label may decide
        # nearly all of the posterior at the object (label_trust; the default 0.99 is for a
        # fallible person): with 0.9 the detector went on calling the torus 'ellipsoid'
        # in most frames after the answer (docs/demo.md).
        'detector_node': ['-p', f'model_path:={args.model}', '-p', f'gp_path:={args.gp}',
                          '-p', 'label_trust:=0.999'],
        # The warm-up scene (while the detector loads) has no look-alike, so nothing
        # there is worth a question; the demo trial is then started with a reset.
        'sim_robot_node': ['-p', f'seed:={args.seed + 1000}', '-p', "lookalike:='no'",
                           '-p', f'timeout_s:={args.trial_timeout}'],
        # A fresh label store per run: the detector learns the torus during the demo.
        'ask_for_help_node': help_node_args(store),
        'scripted_labeller_node': labeller_args(args.answer_delay),
    }
    print(f'[demo] starting the closed loop on ROS domain {args.domain_id}; logs in '
          f'{args.out / "logs"}', flush=True)
    with ClosedLoop(args.out / 'logs', args.domain_id, extra_args=extra) as loop:
        if 'ask_for_help_node' not in loop.processes:
            print('uq demo: ask_for_help_node (uq_autonomy) is not installed', file=sys.stderr)
            return 1
        loop.start(*LABELLER)
        observer = LoopObserver()
        recorder = DemoRecorder(observer)
        try:
            if not observer.wait_for(lambda: bool(loop.dead()) or (
                    bool(observer.task) and bool(observer.level_events)
                    and not observer.stale), READY_TIMEOUT_S) or loop.dead():
                print(f'uq demo: the loop did not come up (dead: {loop.dead()}); see '
                      f'{args.out / "logs"}', file=sys.stderr)
                return 1
            print(f'[demo] loop up after {time.monotonic() - started:.0f} s; playing trial '
                  f'{args.seed} (look-alike)', flush=True)
            recorder.rebase()
            trial_started = time.monotonic()
            state, samples = run_trial(observer, args.seed, True, args.trial_timeout)
            # Requests raised near the end still get their answer (and are scored with it).
            last = max((e.t for e in recorder.help_events), default=-math.inf)
            time.sleep(max(0.0, min(last + args.answer_delay + 2.0 - recorder.now(), 10.0)))
            if loop.dead():
                print(f'uq demo: nodes died: {loop.dead()}', file=sys.stderr)
                return 1
        finally:
            observer.close()
    recorder.read_answers(store)
    paths = _report(args, recorder, state, samples, trial_started,
                    time.monotonic() - started)
    print('[demo] results:')
    for name, path in paths.items():
        print(f'  {name:<8} {path}')
    print((args.out / 'summary.md').read_text())
    return 0


def _report(args, recorder, state: dict, samples: list, trial_started: float,
            wall_s: float) -> dict[str, Path]:
    from uq_eval.closed_loop.demo_report import (
        annotate_frame,
        label_shares,
        object_labels,
        open_requests,
        plot_timeline,
        score_help,
        summarise,
        write_summary,
    )
    from uq_eval.closed_loop.shared_autonomy_metrics import (
        operator_weight,
        score_trial,
        trial_samples,
    )
    from uq_sim.objects import KNOWN_CLASSES

    known = set(KNOWN_CLASSES)
    row = score_trial(state, samples, DEADBAND)
    running = trial_samples(samples, state)
    # Time zero: the trial's first running sample (the sim pauses after the reset).
    t0 = running[0].t if running else trial_started
    recorder.rebase(t0 - trial_started)
    end_t = running[-1].t - t0 if running else recorder.now()
    levels = [(s.t - t0, s.level,
               operator_weight(s.level, s.blend_alpha, s.operator_speed, DEADBAND))
              for s in samples if s.t >= t0]
    frames = recorder.frames(start_t=0.0)
    perception = summarise(frames)
    first_seen = {name: min(t for t, _ in points)
                  for name, points in perception.per_object.items()}
    events = sorted(recorder.help_events, key=lambda e: e.t)
    help_figures = score_help(events, known, first_seen, [(t, lv) for t, lv, _ in levels])
    requests = []
    for e in events:
        labels = object_labels(frames, e.true_object) if e.true_object else []
        after = e.answered_t if e.answered_t is not None else math.inf
        requests.append({
            'request_id': e.request_id, 't_s': e.t, 'object': e.true_object,
            'true_class': e.true_class, 'detected_class': e.detected_class,
            'reason': e.reason, 'answer': e.answer, 'accepted': e.accepted,
            'answered_t_s': e.answered_t,
            'ask_latency_s': e.image_t - first_seen[e.true_object]
            if e.true_object in first_seen else None,
            # What the detector called the object before and after it learnt the answer.
            'classes_before_answer': label_shares(labels, -math.inf, after),
            'classes_after_answer': label_shares(labels, after, math.inf)})
    target = state.get('target_class', 'ellipsoid')
    summary = {
        'command': 'uq demo',
        'wall_time_s': wall_s,
        'labeller': f'{LABELLER[0]} (ground truth, after {args.answer_delay:g} s)',
        'task': {
            'seed': args.seed, 'lookalike': bool(state.get('lookalike', True)),
            'target_class': target, 'status': row['status'], 'success': row['success'],
            'grasped': row['grasped'] or '', 'time_s': row['time_s'],
            'levels_visited': sorted({s.level for s in running}),
            'level_changes': row['level_changes'], 'operator_share': row['operator_share'],
        },
        'help': help_figures,
        'help_requests': requests,
        'perception': {k: v for k, v in vars(perception).items() if k != 'per_object'},
    }
    summary = _finite(summary)
    paths = write_summary(summary, args.out)
    paths['plot'] = args.out / 'timeline.png'
    outcome = f"{row['status']}" + (f" in {row['time_s']:.1f} s" if row['success'] else '')
    plot_timeline(perception, levels, [e for e in events if e.t >= 0.0], known, end_t,
                  f'trial {args.seed}: grasp the {target} next to a look-alike — {outcome}; '
                  f"{help_figures['requests']} help request(s)", paths['plot'])
    if not args.no_gif:
        import imageio.v3 as iio

        gif_frames = []
        for t, rgb, snap in recorder.overlays:
            if t < -0.5 or t > end_t + 1.0:
                continue
            answered = [e for e in events if e.answered_t is not None and e.answered_t <= t]
            gif_frames.append(annotate_frame(rgb, snap, open_requests(events, t), answered,
                                             target, DEADBAND))
        if gif_frames:
            paths['gif'] = args.out / 'overlay.gif'
            iio.imwrite(paths['gif'], gif_frames, duration=int(1000 / 5.0), loop=0)
    return paths


def _finite(value):
    """JSON-safe copy: NaN and inf become null."""
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def main() -> int:
    parser = argparse.ArgumentParser(prog='uq demo', description=__doc__.split('\n\n')[0])
    configure(parser)
    args = parser.parse_args()
    return args.run(args)


if __name__ == '__main__':
    sys.exit(main())
