"""Scoring and plots of a recorded demo run (ROS-free).

The demo records, per camera frame, the simulator's ground truth and the detector's
output. Each detection is matched to the ground-truth object it overlaps most (IoU >=
0.5), so every object's uncertainty can be followed over time and known objects can be
compared with unknown ones.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from uq_perception.detection_metrics import box_iou


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


def write_report(summary: DemoSummary, out_dir: Path, known_names: set[str]) -> dict[str, Path]:
    """Write ``summary.json``, ``summary.md`` and ``uncertainty.png``; return their paths."""
    import matplotlib

    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    figures = {k: v for k, v in vars(summary).items() if k != 'per_object'}
    paths = {'json': out_dir / 'summary.json', 'table': out_dir / 'summary.md',
             'plot': out_dir / 'uncertainty.png'}
    paths['json'].write_text(json.dumps(figures, indent=2) + '\n')
    rows = [
        ('frames', f'{summary.frames}'),
        ('detections', f'{summary.detections}'),
        ('matched known / unknown objects (detections)',
         f'{summary.matched_known} / {summary.matched_unknown}'),
        ('mean sigma, known objects', f'{summary.mean_sigma_known:.3f}'),
        ('mean sigma, unknown objects', f'{summary.mean_sigma_unknown:.3f}'),
        ('flagged OOD, known / unknown', f'{summary.ood_rate_known:.1%} / '
                                         f'{summary.ood_rate_unknown:.1%}'),
        ('class accuracy on known objects', f'{summary.known_class_accuracy:.1%}'),
        ('latency p50 / p99 (ms, image stamp to detections received)',
         f'{summary.latency_p50_ms:.1f} / {summary.latency_p99_ms:.1f}'),
    ]
    paths['table'].write_text('| figure | value |\n|---|---|\n' + ''.join(
        f'| {name} | {value} |\n' for name, value in rows))
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for name, samples in sorted(summary.per_object.items()):
        t, s = np.array(samples).T
        known = name.split('_')[0] in known_names
        ax.plot(t, s, '-' if known else '--', marker='.', markersize=3,
                label=f'{name} ({"known" if known else "unknown"})')
    ax.set_xlabel('time (s)')
    ax.set_ylabel('GP standard deviation sigma (logit)')
    ax.set_title('Uncertainty of each object over the demo (dashed: unknown objects)')
    ax.legend(fontsize=7, ncol=2)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(paths['plot'], dpi=110)
    plt.close(fig)
    return paths
