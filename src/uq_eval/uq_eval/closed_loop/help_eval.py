"""``uq eval help``: the ask-for-help loop in simulation, scored against the ground truth.

For each scenario, on a private ROS domain and as separate processes over DDS, as the
product runs them: ``detector_node`` (config/detector.yaml, learnt classes in memory only,
so every scenario starts from the shipped model), ``ask_for_help_node``
(config/ask_for_help.yaml, a fresh label store, no web page), ``scripted_labeller_node``
(answers with the ground-truth class after ``--answer-delay`` seconds) and, once those are
up, ``sim_camera_node`` playing the scenario once (no loop). This process records
``detections``, ``ground_truth`` and ``help_request``; the labels are read from the label
store afterwards (with their commit times). :mod:`uq_eval.closed_loop.help_metrics` scores them.

Writes ``OUT/help_eval.json`` (per scenario, pooled, targets), ``OUT/timeline.png`` (per
object GP variance over scenario time, requests and answers marked) and ``OUT/logs/``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from uq_common.arguments import domain_id, non_negative_float, positive_float
from uq_common.spin_thread import SpinThread
from uq_eval.closed_loop.help_metrics import (
    AnswerRecord,
    DetectionFrame,
    DetectionRecord,
    RequestRecord,
    RunRecording,
    check_targets,
    recording_to_json,
    score_run,
    summarise,
)

WORKSPACE = Path(__file__).resolve().parents[4]
CONFIG = WORKSPACE / 'config'
SCENARIOS = ('novel_arrivals', 'novel_pair', 'tabletop_demo')
QUICK_SCENARIO, QUICK_DURATION_S = 'novel_pair', 12.0


def configure(parser: argparse.ArgumentParser) -> None:
    """Ask-for-help loop in simulation: help precision, recall, queries, post-answer accuracy."""
    parser.add_argument('--scenarios', nargs='+', default=list(SCENARIOS),
                        help=f'scripted scenarios with unknown objects (default: {SCENARIOS})')
    parser.add_argument('--duration', type=positive_float, default=None,
                        help='seconds of each scenario to play (default: the whole scenario)')
    parser.add_argument('--answer-delay', type=non_negative_float, default=2.0,
                        help='seconds the scripted labeller takes to answer')
    parser.add_argument('--rate', type=positive_float, default=5.0, help='camera frames per second')
    parser.add_argument('--out', type=Path, default=WORKSPACE / 'out' / 'help_eval')
    parser.add_argument('--quick', action='store_true',
                        help=f'{QUICK_DURATION_S:.0f} s of {QUICK_SCENARIO} only (for the tests)')
    parser.add_argument('--startup-timeout', type=positive_float, default=180.0,
                        help='seconds the nodes may take to come up')
    parser.add_argument('--domain-id', type=domain_id, default=int(os.environ.get(
        'UQ_EVAL_DOMAIN_ID', '96')), help='ROS_DOMAIN_ID (kept private)')
    parser.set_defaults(run=run)


class NodeProcess:
    """One node executable, its output in a log file."""

    def __init__(self, name: str, module: str, args: list[str], log: Path,
                 env: dict[str, str]) -> None:
        self.name, self.log = name, log
        self._file = log.open('w')
        self.proc = subprocess.Popen([sys.executable, '-m', module, '--ros-args', *args],
                                     env=env, stdout=self._file, stderr=subprocess.STDOUT,
                                     cwd=WORKSPACE)

    def output(self) -> str:
        return self.log.read_text(errors='replace')

    def wait_for(self, needle: str, deadline: float) -> bool:
        while time.monotonic() < deadline:
            if needle in self.output():
                return True
            if self.proc.poll() is not None:
                return False
            time.sleep(0.2)
        return False

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            code = self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait(timeout=10)
        self._file.close()
        return code


class Recorder:
    """The harness's node: records detections, ground truth and help requests."""

    def __init__(self, domain_id: int) -> None:
        import rclpy
        from rclpy.executors import SingleThreadedExecutor
        from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy
        from rclpy.signals import SignalHandlerOptions

        from uq_msgs.msg import DetectionArray, HelpRequest

        self.context = rclpy.Context()
        rclpy.init(context=self.context, domain_id=domain_id,
                   signal_handler_options=SignalHandlerOptions.NO)
        self.node = rclpy.create_node('help_eval_recorder', context=self.context)
        self._lock = threading.Lock()
        self.run = RunRecording('')
        reliable = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=200,
                              reliability=ReliabilityPolicy.RELIABLE)
        latched = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=100,
                             reliability=ReliabilityPolicy.RELIABLE,
                             durability=DurabilityPolicy.TRANSIENT_LOCAL)
        self.node.create_subscription(DetectionArray, 'detections', self._on_detections,
                                      reliable)
        self.node.create_subscription(DetectionArray, 'ground_truth', self._on_truth, reliable)
        self.node.create_subscription(HelpRequest, 'help_request', self._on_request, latched)
        self._executor = SingleThreadedExecutor(context=self.context)
        self._executor.add_node(self.node)
        self._spinner = SpinThread(self._executor, name='help_observer')

    def reset(self, scenario: str) -> None:
        with self._lock:
            self.run = RunRecording(scenario)

    @staticmethod
    def _ns(stamp: Any) -> int:
        return stamp.sec * 1_000_000_000 + stamp.nanosec

    def _on_detections(self, msg: Any) -> None:
        frame = DetectionFrame(self._ns(msg.header.stamp), tuple(msg.class_names), tuple(
            DetectionRecord(d.track_id, d.class_id, (d.center_x, d.center_y, d.width,
                                                     d.height),
                            float(d.uncertainty.gp_variance),
                            bool(d.uncertainty.out_of_distribution))
            for d in msg.detections))
        with self._lock:
            self.run.frames.append(frame)

    def _on_truth(self, msg: Any) -> None:
        from uq_sim.scripted_labeller_node import truth_objects

        with self._lock:
            self.run.truth[self._ns(msg.header.stamp)] = tuple(truth_objects(msg))

    def _on_request(self, msg: Any) -> None:
        d = msg.detection
        with self._lock:
            self.run.requests.append(RequestRecord(
                msg.request_id, self._ns(msg.header.stamp),
                (d.center_x, d.center_y, d.width, d.height), d.class_id, d.track_id,
                float(d.uncertainty.gp_variance)))

    def truth_span_s(self) -> float:
        with self._lock:
            stamps = list(self.run.truth)
        return (max(stamps) - min(stamps)) * 1e-9 if stamps else 0.0

    def close(self) -> None:
        self._spinner.stop()
        self._executor.shutdown()
        self.node.destroy_node()
        self.context.try_shutdown()


def _stored_answers(store_path: Path) -> list[AnswerRecord]:
    from uq_autonomy.labels.store import LabelStore

    if not store_path.exists():
        return []
    with LabelStore(store_path, readonly=True) as store:
        return [AnswerRecord(r.request_id, r.label, r.labeler, int(round(r.time * 1e9)))
                for r in store.labels()]


def run_scenario(recorder: Recorder, scenario: str, duration: float, args: argparse.Namespace,
                 workdir: Path) -> tuple[RunRecording, str]:
    """Play one scenario through the loop; returns the recording and a problem ('' if none)."""
    workdir.mkdir(parents=True, exist_ok=True)
    store = workdir / 'labels.sqlite3'
    store.unlink(missing_ok=True)
    env = os.environ | {'ROS_DOMAIN_ID': str(args.domain_id), 'PYTHONUNBUFFERED': '1'}
    recorder.reset(scenario)
    nodes = [
        NodeProcess('detector_node', 'uq_perception.detector_node',
                    ['--params-file', str(CONFIG / 'detector.yaml'), '-p', 'autostart:=true',
                     '-p', 'persist_learnt_state:=false'],
                    workdir / 'detector_node.log', env),
        NodeProcess('ask_for_help_node', 'uq_autonomy.ask_for_help_node',
                    ['--params-file', str(CONFIG / 'ask_for_help.yaml'),
                     '-p', f'label_store_url:={store}', '-p', 'web_enabled:=false'],
                    workdir / 'ask_for_help_node.log', env),
        NodeProcess('scripted_labeller_node', 'uq_sim.scripted_labeller_node',
                    ['--params-file', str(CONFIG / 'scripted_labeller.yaml'),
                     '-p', f'answer_delay_s:={args.answer_delay}'],
                    workdir / 'scripted_labeller_node.log', env),
    ]
    ready = {'detector_node': 'active: processing images',
             'ask_for_help_node': 'asking for help',
             'scripted_labeller_node': 'answering help requests'}
    problem = ''
    try:
        deadline = time.monotonic() + args.startup_timeout
        for node in nodes:
            if not node.wait_for(ready[node.name], deadline):
                return recorder.run, f'{node.name} did not come up (log: {node.log})'
        camera = NodeProcess('sim_camera_node', 'uq_sim.sim_camera_node',
                             ['--params-file', str(CONFIG / 'sim_camera.yaml'),
                              '-p', f'scenario:={scenario}', '-p', 'loop:=false',
                              '-p', f'rate_hz:={args.rate}'],
                             workdir / 'sim_camera_node.log', env)
        nodes.append(camera)
        # Real time: the scenario plays for `duration` seconds of camera stamps.
        deadline = time.monotonic() + args.startup_timeout + 3.0 * duration
        while recorder.truth_span_s() < duration and time.monotonic() < deadline:
            dead = [n.name for n in nodes if n.proc.poll() is not None]
            if dead:
                problem = f'{", ".join(dead)} exited early (logs in {workdir})'
                break
            time.sleep(0.2)
        else:
            if recorder.truth_span_s() < duration:
                problem = (f'only {recorder.truth_span_s():.1f} s of {scenario} played '
                           f'before the time limit')
    finally:
        codes = {n.name: n.stop() for n in reversed(nodes)}
    bad = {k: c for k, c in codes.items() if c not in (0, -signal.SIGINT)}
    if bad and not problem:
        problem = f'nodes exited with {bad} (logs in {workdir})'
    run = recorder.run
    run.answers = _stored_answers(store)
    return run, problem


def ood_threshold() -> float:
    """The shipped GP's OOD threshold (its variance quantile over the training data)."""
    from uq_perception.detectors.model_files import default_gp_path
    from uq_perception.ntk import LastLayerNTKGP

    threshold = LastLayerNTKGP.load(default_gp_path()).ood_threshold
    if threshold is None:
        raise ValueError(f'{default_gp_path()} has no OOD threshold')
    return float(threshold)


def _help_threshold() -> float | None:
    """The ask-for-help node's GP-variance threshold, when GP variance is its signal (the
    default, the calibrated score, has no line on a variance axis)."""
    import yaml

    data = yaml.safe_load((CONFIG / 'ask_for_help.yaml').read_text(encoding='utf-8'))
    params = data.get('ask_for_help_node', {}).get('ros__parameters', {})
    value = params.get('gp_variance_threshold')
    if params.get('signal') != 'gp_variance' or value is None:
        return None
    return float(value)


def plot_timeline(runs: list[RunRecording], scores: list[dict], threshold: float,
                  path: Path) -> None:
    """Per scenario: each object's GP variance over time, requests and answers marked."""
    import matplotlib

    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    from uq_eval.closed_loop.help_metrics import matched_detection

    help_threshold = _help_threshold()
    fig, axes = plt.subplots(len(runs), 1, figsize=(11, 3.6 * len(runs)), squeeze=False)
    for ax, run, score in zip(axes[:, 0], runs, scores, strict=True):
        if not run.truth:
            ax.set_title(f'{run.scenario}: nothing recorded')
            continue
        t0 = min(run.truth)
        names = {o.object_id: f'{o.class_name}{"" if o.known else " (unknown)"}'
                 for truth in run.truth.values() for o in truth}
        series: dict[int, list[tuple[float, float]]] = {}
        for frame in sorted(run.frames, key=lambda f: f.stamp_ns):
            for obj in run.truth.get(frame.stamp_ns, ()):
                det = matched_detection(obj, frame, 0.5)
                if det is not None and det.gp_variance > 0:
                    series.setdefault(obj.object_id, []).append(
                        ((frame.stamp_ns - t0) * 1e-9, det.gp_variance))
        colours = {}
        for object_id, points in sorted(series.items()):
            xs, ys = zip(*points, strict=True)
            line, = ax.plot(xs, ys, '.-', ms=3, lw=0.8, label=names[object_id])
            colours[object_id] = line.get_color()
        ax.axhline(threshold, color='k', ls='--', lw=0.8, label=f'OOD threshold {threshold:.2g}')
        if help_threshold is not None:
            ax.axhline(help_threshold, color='grey', ls=':', lw=0.8,
                       label=f'help threshold {help_threshold:.2g}')
        for q in score['per_request']:
            x = (q['stamp_ns'] - t0) * 1e-9
            # A request on no object (a false or partial detection) is black and dotted.
            ax.axvline(x, color=colours.get(q['object_id'], 'k'),
                       ls='-' if q['object_id'] is not None else ':', lw=1.5, alpha=0.7)
            ax.annotate('?' if q['useful'] else '?!', (x, 1.0), xycoords=('data', 'axes fraction'),
                        ha='center', va='bottom', fontsize=10)
        for object_id, v in score['per_answered_object'].items():
            x = (v['answer_time_ns'] - t0) * 1e-9
            ax.axvline(x, color=colours.get(int(object_id), 'g'), ls='-.', lw=1.2)
            ax.annotate(f"'{v['label']}'", (x, 0.02), xycoords=('data', 'axes fraction'),
                        rotation=90, fontsize=8, va='bottom')
        ax.set_yscale('log')
        ax.set_xlabel('time since the first ground-truth frame (s)')
        ax.set_ylabel('GP variance (logit²)')
        ax.set_title(f'{run.scenario}: requests (solid; ?! not useful) and answers (dash-dot)',
                     pad=14)
        ax.legend(fontsize=7, loc='upper left', ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _rounded(value: Any) -> Any:
    if isinstance(value, float):
        return round(value, 4) if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    return value


def run(args: argparse.Namespace) -> int:
    from uq_sim.scenario import SCENARIO_NAMES, get_scenario

    if args.quick:
        args.scenarios, args.duration = [QUICK_SCENARIO], args.duration or QUICK_DURATION_S
    unknown = [s for s in args.scenarios if s not in SCENARIO_NAMES]
    if unknown:
        print(f'uq eval help: unknown scenarios {unknown}; expected some of {SCENARIO_NAMES}',
              file=sys.stderr)
        return 2
    if args.duration is not None and not (math.isfinite(args.duration) and args.duration > 0):
        print('uq eval help: --duration must be > 0', file=sys.stderr)
        return 2
    if not (math.isfinite(args.answer_delay) and args.answer_delay >= 0):
        print('uq eval help: --answer-delay must be >= 0', file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    threshold = ood_threshold()
    recorder = Recorder(args.domain_id)
    runs, scores, problems = [], [], {}
    started = time.monotonic()
    try:
        for scenario in args.scenarios:
            full = get_scenario(scenario).duration
            duration = min(args.duration, full) if args.duration else full
            print(f'uq eval help: {scenario}, {duration:.0f} s ...', flush=True)
            recording, problem = run_scenario(recorder, scenario, duration, args,
                                              args.out / 'logs' / scenario)
            if problem:
                problems[scenario] = problem
                print(f'uq eval help: {scenario}: {problem}', file=sys.stderr)
            runs.append(recording)
            (args.out / 'recordings').mkdir(exist_ok=True)
            (args.out / 'recordings' / f'{scenario}.json').write_text(
                json.dumps(recording_to_json(recording)))
            scores.append(score_run(recording, threshold))
    finally:
        recorder.close()
    summary = summarise(scores)
    targets = check_targets(summary)
    report = {'command': 'uq eval help ' + ' '.join(sys.argv[3:]) if len(sys.argv) > 3
              else 'uq eval help',
              'scenarios': args.scenarios, 'duration_s': args.duration,
              'answer_delay_s': args.answer_delay, 'rate_hz': args.rate,
              'ood_threshold': threshold, 'help_gp_variance_threshold': _help_threshold(),
              'wall_s': round(time.monotonic() - started, 1),
              'summary': summary, 'targets': targets, 'problems': problems,
              'runs': scores}
    (args.out / 'help_eval.json').write_text(json.dumps(_rounded(report), indent=1))
    plot_timeline(runs, scores, threshold, args.out / 'timeline.png')
    for name in ('help_precision', 'queries_per_novel_object', 'recall',
                 'post_answer_accuracy', 'post_answer_low_variance_share'):
        value = summary[name]
        mark = {True: 'met', False: 'MISSED', None: ''}[targets.get(name)]
        print(f'{name:32s} {"n/a" if value is None else f"{value:.3f}"} {mark}')
    print(f'requests {summary["requests"]}, novel objects {summary["novel_objects"]} '
          f'(asked {summary["novel_objects_asked"]}), post-answer frames '
          f'{summary["post_answer_frames"]}; {args.out / "help_eval.json"}, '
          f'{args.out / "timeline.png"}')
    return 1 if problems else 0
