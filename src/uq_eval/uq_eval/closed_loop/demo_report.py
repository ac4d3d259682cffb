"""Scoring, plots and the annotated GIF of a recorded demo run (ROS-free).

The demo records, per camera frame, the simulator's ground truth and the detector's
output. Each detection is matched to the ground-truth object it overlaps most (IoU >=
0.5), so every object's uncertainty can be followed over time and known objects can be
compared with unknown ones. Help requests are matched the same way to the object they are
about, which tells whether asking was justified (the object is unknown to the detector or
misclassified) and lets the scripted labeller answer with the true class.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from uq_perception.training.detection_metrics import box_iou


@dataclass
class RecordedFrame:
    """One frame: time, ground truth and detections (boxes are centre-size pixels)."""

    time_s: float
    truth_names: list[str]
    truth_known: list[bool]
    truth_boxes: np.ndarray
    det_boxes: np.ndarray
    det_variance: np.ndarray
    det_class: list[str]
    det_ood: np.ndarray
    latency_ms: float


@dataclass
class DemoSummary:
    """Aggregate figures of a demo run."""

    frames: int = 0
    detections: int = 0
    matched_known: int = 0
    matched_unknown: int = 0
    mean_sigma_known: float = float('nan')
    mean_sigma_unknown: float = float('nan')
    ood_rate_known: float = float('nan')
    ood_rate_unknown: float = float('nan')
    known_class_accuracy: float = float('nan')
    latency_p50_ms: float = float('nan')
    latency_p99_ms: float = float('nan')
    per_object: dict[str, list[tuple[float, float]]] = field(default_factory=dict)


def summarise(frames: list[RecordedFrame], iou_threshold: float = 0.5) -> DemoSummary:
    """Match detections to ground truth frame by frame and aggregate.

    ``per_object`` maps ``name`` to its ``(time_s, sigma)`` samples, where sigma is the
    GP standard deviation of the detection matched to that object.
    """
    summary = DemoSummary(frames=len(frames))
    sigma: dict[bool, list[float]] = {True: [], False: []}
    ood: dict[bool, list[bool]] = {True: [], False: []}
    correct: list[bool] = []
    latencies: list[float] = []
    for frame in frames:
        summary.detections += len(frame.det_boxes)
        latencies.append(frame.latency_ms)
        if not len(frame.truth_boxes) or not len(frame.det_boxes):
            continue
        iou = box_iou(frame.truth_boxes, frame.det_boxes)
        for t in range(len(frame.truth_boxes)):
            d = int(np.argmax(iou[t]))
            if iou[t, d] < iou_threshold:
                continue
            known = frame.truth_known[t]
            s = float(np.sqrt(frame.det_variance[d]))
            sigma[known].append(s)
            ood[known].append(bool(frame.det_ood[d]))
            if known:
                correct.append(frame.det_class[d] == frame.truth_names[t].split('_')[0])
            summary.per_object.setdefault(frame.truth_names[t], []).append((frame.time_s, s))
    summary.matched_known, summary.matched_unknown = len(sigma[True]), len(sigma[False])
    if sigma[True]:
        summary.mean_sigma_known = float(np.mean(sigma[True]))
        summary.ood_rate_known = float(np.mean(ood[True]))
        summary.known_class_accuracy = float(np.mean(correct))
    if sigma[False]:
        summary.mean_sigma_unknown = float(np.mean(sigma[False]))
        summary.ood_rate_unknown = float(np.mean(ood[False]))
    if latencies:
        summary.latency_p50_ms = float(np.percentile(latencies, 50))
        summary.latency_p99_ms = float(np.percentile(latencies, 99))
    return summary


LEVEL_NAMES = ('teleoperation', 'guided', 'shared', 'assistance')
# Banner colours (RGB) per level: red = the person drives alone ... green = autonomy.
LEVEL_COLOURS = ((200, 50, 50), (225, 130, 30), (200, 180, 20), (40, 160, 70))
HELP_COLOUR = (220, 40, 220)


def who_drives(level: int, blend_alpha: float, operator_speed: float, deadband: float) -> str:
    """Who moves the robot at one instant, as the arbitration node mixes the commands."""
    if level <= 1:
        return 'operator drives'
    if level == 2:
        return f'shared: {100 * blend_alpha:.0f} % autonomy'
    return 'operator overrides' if operator_speed > deadband else 'autonomy drives'


@dataclass
class LoopSnapshot:
    """The loop as the harness saw it when an overlay frame arrived."""

    t: float            # seconds since the trial started
    level: int
    blend_alpha: float
    operator_speed: float
    task_status: str
    elapsed_s: float


@dataclass
class HelpEvent:
    """One help request, the object it was about and its answer."""

    request_id: str
    t: float                       # seconds since the trial started, when it arrived
    image_t: float                 # the same clock, for the frame it was asked on
    box: tuple[float, float, float, float]
    detected_class: str
    candidates: list[str]
    reason: str
    true_object: str = ''          # ground-truth name (class_track) of the object; '' if none
    answer: str = ''
    answered_t: float | None = None
    accepted: bool = False
    message: str = ''

    @property
    def true_class(self) -> str:
        return self.true_object.rsplit('_', 1)[0] if self.true_object else ''


def match_object(box: tuple[float, float, float, float], truth_names: list[str],
                 truth_boxes: np.ndarray, iou_threshold: float = 0.3) -> str:
    """Name of the ground-truth object the box overlaps most ('' below the threshold)."""
    if not len(truth_boxes):
        return ''
    iou = box_iou(np.asarray([box], dtype=float), np.asarray(truth_boxes, dtype=float))[0]
    best = int(np.argmax(iou))
    return truth_names[best] if iou[best] >= iou_threshold else ''


def justified(event: HelpEvent, known_classes: set[str]) -> bool:
    """Asking was right: the object is unknown to the detector, or it was misclassified."""
    return bool(event.true_class) and (event.true_class not in known_classes
                                       or event.detected_class != event.true_class)


def score_help(events: list[HelpEvent], known_classes: set[str],
               first_seen: dict[str, float],
               levels: list[tuple[float, int]]) -> dict:
    """Help precision and latencies of the requests raised during the trial.

    ``first_seen`` maps an object to the first time the detector saw it; ``levels`` is
    the (time, level) timeline. Latencies: *ask* = first seen -> frame asked on;
    *answer* = request received -> answer accepted; *resume* = first accepted answer ->
    first time after it the autonomy acts again (level >= shared).
    """
    trial = [e for e in events if e.t >= 0.0]
    good = [e for e in trial if justified(e, known_classes)]
    answered = [(e, e.answered_t) for e in trial if e.accepted and e.answered_t is not None]
    ask = [e.image_t - first_seen[e.true_object] for e in trial
           if e.true_object in first_seen]
    answer = [t - e.t for e, t in answered]
    resume = None
    if answered:
        first_answer = min(t for _, t in answered)
        resume = next((t - first_answer for t, level in levels
                       if t >= first_answer and level >= 2), None)
    return {
        'requests': len(trial),
        'justified': len(good),
        'precision': len(good) / len(trial) if trial else float('nan'),
        'answered': len(answered),
        'ask_latency_s': float(np.mean(ask)) if ask else float('nan'),
        'answer_latency_s': float(np.mean(answer)) if answer else float('nan'),
        'resume_after_answer_s': float('nan') if resume is None else float(resume),
        'objects': sorted({e.true_object or '?' for e in trial}),
    }


def object_labels(frames: list[RecordedFrame], name: str,
                  iou_threshold: float = 0.5) -> list[tuple[float, str]]:
    """``(time, class)`` the detector gave the ground-truth object ``name`` frame by frame."""
    out = []
    for frame in frames:
        if name not in frame.truth_names or not len(frame.det_boxes):
            continue
        t = frame.truth_names.index(name)
        iou = box_iou(frame.truth_boxes[t:t + 1], frame.det_boxes)[0]
        d = int(np.argmax(iou))
        if iou[d] >= iou_threshold:
            out.append((frame.time_s, frame.det_class[d]))
    return out


def label_shares(labels: list[tuple[float, str]], start: float, end: float) -> dict[str, float]:
    """Share of the frames in ``[start, end)`` given each class."""
    names = [c for t, c in labels if start <= t < end]
    return {c: names.count(c) / len(names) for c in sorted(set(names))}


def open_requests(events: list[HelpEvent], t: float) -> list[HelpEvent]:
    """Requests received and not yet answered at time ``t``."""
    return [e for e in events if e.t <= t and not (e.accepted and e.answered_t is not None
                                                   and e.answered_t <= t)]


def annotate_frame(rgb: np.ndarray, snap: LoopSnapshot, pending: list[HelpEvent],
                   answered: list[HelpEvent], target_class: str, deadband: float,
                   scale: int = 2) -> np.ndarray:
    """The overlay frame with what the operator's screen adds: level, driver, help.

    Open requests are boxed in magenta on the image (their box, in image pixels) and
    listed under it; the latest answers are listed too.
    """
    import cv2

    h, w = rgb.shape[:2]
    image = cv2.resize(np.ascontiguousarray(rgb), (w * scale, h * scale),
                       interpolation=cv2.INTER_NEAREST)
    for e in pending:
        x, y, bw, bh = (scale * v for v in e.box)
        cv2.rectangle(image, (int(x - bw / 2) - 3, int(y - bh / 2) - 3),
                      (int(x + bw / 2) + 3, int(y + bh / 2) + 3), HELP_COLOUR, 2)
        cv2.putText(image, '?', (int(x + bw / 2) + 4, int(y - bh / 2) + 12),
                    cv2.FONT_HERSHEY_SIMPLEX, 0.6, HELP_COLOUR, 2, cv2.LINE_AA)
    banner = np.full((28, image.shape[1], 3), LEVEL_COLOURS[snap.level], np.uint8)
    text = (f'level {snap.level} {LEVEL_NAMES[snap.level].upper()} | '
            f'{who_drives(snap.level, snap.blend_alpha, snap.operator_speed, deadband)}')
    cv2.putText(banner, text, (8, 20), cv2.FONT_HERSHEY_SIMPLEX, 0.55, (255, 255, 255), 1,
                cv2.LINE_AA)
    lines = [(f't {snap.t:4.1f} s  task: grasp the {target_class}  [{snap.task_status}]',
              (230, 230, 230))]
    if pending:
        for e in pending[:2]:
            lines.append((f'HELP? "what is this?" (detector: {e.detected_class}) '
                          f'- waiting {snap.t - e.t:.1f} s', HELP_COLOUR))
    else:
        lines.append(('no open help request', (150, 150, 150)))
    for e in answered[-1:]:
        lines.append((f'answered "{e.answer}" ({e.message.split(";")[0][:40]})',
                      (90, 220, 90)))
    lines = lines[:4]  # a fixed panel height: every GIF frame has the same size
    panel = np.full((14 + 20 * 4, image.shape[1], 3), 30, np.uint8)
    for k, (line, colour) in enumerate(lines):
        cv2.putText(panel, line, (8, 20 + 20 * k), cv2.FONT_HERSHEY_SIMPLEX, 0.45, colour, 1,
                    cv2.LINE_AA)
    return np.concatenate([banner, image, panel], axis=0)


def plot_timeline(summary: DemoSummary, levels: list[tuple[float, int, float]],
                  events: list[HelpEvent], known_names: set[str], end_t: float,
                  title: str, path: Path) -> None:
    """Per-object uncertainty, level and operator share, help requests and answers."""
    import matplotlib

    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 1, figsize=(9, 7.5), sharex=True,
                             gridspec_kw={'height_ratios': [3, 2, 1.4]})
    ax = axes[0]
    for name, samples in sorted(summary.per_object.items()):
        t, s = np.array(samples).T
        known = name.rsplit('_', 1)[0] in known_names
        ax.plot(t, s, '-' if known else '--', marker='.', markersize=3,
                label=f'{name} ({"known" if known else "unknown"})')
    ax.set_ylabel('GP std sigma (logit)')
    ax.legend(fontsize=7, ncol=3)
    ax.grid(alpha=0.3)
    ax = axes[1]
    if levels:
        t, level, share = np.array(levels, dtype=float).T
        ax.step(t, level, where='post', color='black', label='level')
        ax.fill_between(t, 0, 3 * share, step='post', alpha=0.25, color='tab:red',
                        label='operator share (x3)')
    ax.set_yticks(range(4), [f'{k} {n}' for k, n in enumerate(LEVEL_NAMES)], fontsize=7)
    ax.set_ylim(-0.2, 3.3)
    ax.legend(fontsize=7, loc='upper left')
    ax.grid(alpha=0.3)
    ax = axes[2]
    for k, e in enumerate(events):
        end = e.answered_t if e.answered_t is not None else end_t
        ax.plot([e.t, end], [k, k], color='tab:purple', linewidth=4, solid_capstyle='butt')
        ax.plot([e.t], [k], 'o', color='tab:purple')
        if e.answered_t is not None:
            ax.plot([e.answered_t], [k], 's', color='tab:green')
        ax.text(end + 0.2, k, f'{e.true_object or "?"}: detector "{e.detected_class}" -> '
                f'"{e.answer or "no answer"}"', fontsize=7, va='center')
    ax.set_ylim(-1, max(1, len(events)))
    ax.set_yticks([])
    ax.set_ylabel('help requests\n(o asked, [] answered)', fontsize=8)
    ax.set_xlabel('time since the trial started (s)')
    for ax in axes:
        for e in events:
            ax.axvline(e.t, color='tab:purple', alpha=0.4, linestyle=':')
            if e.answered_t is not None:
                ax.axvline(e.answered_t, color='tab:green', alpha=0.4, linestyle=':')
    axes[0].set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_summary(summary: dict, out_dir: Path) -> dict[str, Path]:
    """``summary.json`` and ``summary.md`` of a demo run."""
    paths = {'json': out_dir / 'summary.json', 'table': out_dir / 'summary.md'}
    paths['json'].write_text(json.dumps(summary, indent=2) + '\n')
    task, help_, perception = summary['task'], summary['help'], summary['perception']

    def fmt(value: float | None, pattern: str) -> str:
        return '—' if value is None or value != value else pattern.format(value)

    def shares(classes: dict[str, float]) -> str:
        return ', '.join(f'{name} {share:.0%}' for name, share in
                         sorted(classes.items(), key=lambda kv: -kv[1])) or '—'

    rows = [
        ('task', f"grasp the {task['target_class']} (trial {task['seed']}, look-alike: "
                 f"{task['lookalike']})"),
        ('outcome', f"{task['status']} (grasped: {task['grasped'] or 'nothing'})"),
        ('time to grasp', fmt(task['time_s'], '{:.1f} s')),
        ('levels visited', ', '.join(str(k) for k in task['levels_visited'])),
        ('level changes', f"{task['level_changes']}"),
        ('operator share of control', fmt(task['operator_share'], '{:.2f}')),
        ('help requests (justified)', f"{help_['requests']} ({help_['justified']})"),
        ('help precision', fmt(help_['precision'], '{:.0%}')),
        ('asked about', ', '.join(help_['objects']) or '—'),
        ('answered by', f"{summary['labeller']} ({help_['answered']} answers)"),
        ('ask latency (first seen -> request)', fmt(help_['ask_latency_s'], '{:.1f} s')),
        ('answer latency (request -> answer accepted)',
         fmt(help_['answer_latency_s'], '{:.1f} s')),
        ('autonomy back (answer -> level >= shared)',
         fmt(help_['resume_after_answer_s'], '{:.1f} s')),
        *[(f"detector's classes for {r['object']}, before / after the answer",
           f"{shares(r['classes_before_answer'])} / {shares(r['classes_after_answer'])}")
          for r in summary['help_requests'] if r['accepted'] and r['object']],
        ('frames processed', f"{perception['frames']}"),
        ('mean sigma, known / unknown objects',
         f"{fmt(perception['mean_sigma_known'], '{:.3f}')} / "
         f"{fmt(perception['mean_sigma_unknown'], '{:.3f}')}"),
        ('detector latency p50 / p99 (image stamp -> detections)',
         f"{fmt(perception['latency_p50_ms'], '{:.0f}')} / "
         f"{fmt(perception['latency_p99_ms'], '{:.0f}')} ms"),
        ('wall time', f"{summary['wall_time_s']:.0f} s"),
    ]
    paths['table'].write_text('| figure | value |\n|---|---|\n' + ''.join(
        f'| {name} | {value} |\n' for name, value in rows))
    return paths
