"""Metrics, plots and the report (``report.md``, ``report.json``) of a bag evaluation.

Metrics with ground truth (detections matched to ground-truth boxes at IoU >= 0.5):

- ``map50``: mean over known classes of the COCO-style AP at IoU 0.5 (unknown objects
  are ignored: a detection on one is neither a hit nor a false positive);
- ``ece``: expected calibration error of the class probabilities of detections on known
  objects (15 bins);
- ``misclassification_auroc``: how well the predictive entropy ranks wrong classes
  above right ones, on known objects;
- ``ood_auroc``: how well the GP variance ranks detections on unknown objects above
  those on known ones;
- ``aurc``: area under the risk-coverage curve (error rate among the most confident
  fraction of known-object detections, averaged over coverages; lower is better).

Without ground truth: percentiles of latency, GP variance, mutual information and the
calibrated score (``calibrated_score``: the share of the model's known validation objects
with a lower GP variance, the unit of model-independent thresholds; left out, with a note,
when the model has no score reference and the detector publishes -1).

With partial labels (``ground_truth_exhaustive`` false: the ask-for-help export) every
figure but AP is computed over the labelled detections; AP needs every object of a frame
labelled and is left out.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from uq_perception.training.detection_metrics import average_precision
from uq_perception.training.metrics import auroc, ece, reliability_bins

LEVEL_NAMES = ('teleoperation', 'guided', 'shared', 'assistance')


def _finite_or_none(x: float) -> float | None:
    return float(x) if x is not None and math.isfinite(x) else None


def risk_coverage(confidence: np.ndarray, correct: np.ndarray) -> tuple[np.ndarray,
                                                                          np.ndarray, float]:
    """Coverage, risk (error rate of the most confident fraction) and the AURC."""
    order = np.argsort(-confidence, kind='stable')
    errors = np.cumsum(~correct[order])
    n = np.arange(1, len(order) + 1)
    risk = errors / n
    return n / len(order), risk, float(risk.mean())


def level_time(frames: list[dict]) -> dict[str, float]:
    """Seconds spent at each level: each frame's level holds until the next frame."""
    out = dict.fromkeys(LEVEL_NAMES, 0.0)
    if not frames:
        return out
    stamps = np.array([f['stamp'] for f in frames])
    gaps = np.diff(stamps)
    typical = float(np.median(gaps[gaps > 0])) if np.any(gaps > 0) else 0.0
    for f, gap in zip(frames, list(gaps) + [typical], strict=True):
        # A backwards or oversized gap (loop, jump) counts one typical frame period.
        dt = gap if 0.0 <= gap <= 10 * max(typical, 1e-9) else typical
        out[LEVEL_NAMES[f['level']]] += float(dt)
    return out


def compute_metrics(data: Any) -> dict:
    """The report's numbers from :class:`uq_eval.bags.evaluation.EvaluationData`."""
    frames = data.frames
    latency = np.array([f['latency_ms'] for f in frames]) if frames else np.zeros(0)
    gpv = np.array([d['gp_variance'] for d in data.detections]) if data.detections else \
        np.zeros(0)
    mi = np.array([d['mutual_information'] for d in data.detections]) if data.detections \
        else np.zeros(0)
    # -1: the model has no score reference (uq_msgs/Uncertainty.calibrated_score).
    scores = np.array([d['calibrated_score'] for d in data.detections
                       if d.get('calibrated_score', -1.0) >= 0.0])
    metrics: dict[str, Any] = {
        'frames': len(frames), 'detections': len(data.detections),
        'latency_ms': _percentiles(latency),
        'gp_variance': _percentiles(gpv), 'mutual_information': _percentiles(mi),
        'calibrated_score': _percentiles(scores),
        'time_per_level_s': level_time(frames),
        'transitions': len(data.transitions),
        'help_requests': len(data.help_requests),
        'ground_truth_frames': data.ground_truth_frames,
    }
    if data.node_latencies_ms:
        metrics['node_latency_ms'] = _percentiles(np.array(data.node_latencies_ms))
        metrics['node_end_to_end_ms'] = _percentiles(np.array(data.node_end_to_end_ms))
    if data.node_levels:
        levels = [n['level'] for n in data.node_levels]
        metrics['node_autonomy_states'] = {name: levels.count(i)
                                           for i, name in enumerate(LEVEL_NAMES)}
    if data.ground_truth_source:
        metrics['ground_truth_source'] = data.ground_truth_source
        metrics['ground_truth_unmatched_stamps'] = data.ground_truth_unmatched
    if data.ground_truth_frames == 0:
        return metrics
    metrics['ground_truth_exhaustive'] = data.ground_truth_exhaustive
    if data.ground_truth_exhaustive:
        aps = {}
        for name, count in sorted(data.ground_truth_counts.items()):
            rows = data.ap_inputs.get(name, [])
            scores = np.array([r[0] for r in rows], dtype=np.float64)
            tp = np.array([r[1] for r in rows], dtype=bool)
            aps[name] = average_precision(scores, tp, count)
        metrics['ap50_per_class'] = aps
        metrics['map50'] = float(np.mean(list(aps.values()))) if aps else None
    known = [m for m in data.matched if m['known']]
    if known:
        probs = np.array([m['probabilities'] for m in known])
        labels = np.array([m['label'] for m in known])
        correct = probs.argmax(axis=1) == labels
        entropy = -np.sum(probs * np.log(np.clip(probs, 1e-12, 1.0)), axis=1)
        metrics['ece'] = float(ece(probs, labels))
        metrics['accuracy_matched'] = float(correct.mean())
        metrics['misclassification_auroc'] = _finite_or_none(
            auroc(entropy, ~correct)) if 0 < correct.sum() < len(correct) else None
        metrics['aurc'] = risk_coverage(probs.max(axis=1), correct)[2]
    matched_gpv = np.array([m['gp_variance'] for m in data.matched])
    unknown = np.array([not m['known'] for m in data.matched], dtype=bool)
    metrics['matched_known'] = int((~unknown).sum())
    metrics['matched_unknown'] = int(unknown.sum())
    metrics['ood_auroc'] = _finite_or_none(auroc(matched_gpv, unknown)) \
        if 0 < unknown.sum() < len(unknown) else None
    return metrics


def _percentiles(values: np.ndarray) -> dict:
    if values.size == 0:
        return {'count': 0}
    p50, p90, p99 = np.percentile(values, [50, 90, 99])
    return {'count': int(values.size), 'mean': float(values.mean()), 'p50': float(p50),
            'p90': float(p90), 'p99': float(p99), 'max': float(values.max())}


def write_plots(data: Any, out_dir: Path) -> dict[str, str]:
    """Write the PNG plots that the data supports; returns name -> file name."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    written: dict[str, str] = {}

    def save(fig: Any, name: str) -> None:
        fig.tight_layout()
        fig.savefig(out_dir / f'{name}.png', dpi=110)
        plt.close(fig)
        written[name] = f'{name}.png'

    if data.frames:
        written.update(_timeline_plot(data, out_dir, plt))
        fig, ax = plt.subplots(figsize=(5, 3.2))
        latencies = [f['latency_ms'] for f in data.frames]
        ax.hist(latencies, bins=30, alpha=0.7, label='offline pipeline')
        if data.node_end_to_end_ms:
            ax.hist(data.node_end_to_end_ms, bins=30, alpha=0.7,
                    label='node end to end (replay)')
        ax.set_xlabel('latency per frame, ms')
        ax.set_ylabel('frames')
        ax.legend()
        save(fig, 'latency_histogram')
    known = [m for m in data.matched if m['known']]
    if known:
        probs = np.array([m['probabilities'] for m in known])
        labels = np.array([m['label'] for m in known])
        confidence, accuracy, counts = reliability_bins(probs, labels, 10)
        fig, ax = plt.subplots(figsize=(4, 4))
        centres = (np.arange(10) + 0.5) / 10
        ax.bar(centres, np.where(counts > 0, accuracy, 0.0), width=0.1, edgecolor='k',
               alpha=0.7, label='accuracy')
        ax.plot([0, 1], [0, 1], 'k--', lw=1, label='perfect calibration')
        ax.set_xlabel('confidence (max class probability)')
        ax.set_ylabel('accuracy')
        ax.set_title(f'reliability (ECE {ece(probs, labels):.3f})')
        ax.legend(loc='upper left')
        save(fig, 'reliability_diagram')
        correct = probs.argmax(axis=1) == labels
        coverage, risk, aurc = risk_coverage(probs.max(axis=1), correct)
        fig, ax = plt.subplots(figsize=(4.5, 3.2))
        ax.plot(coverage, risk)
        ax.set_xlabel('coverage')
        ax.set_ylabel('risk (error rate)')
        ax.set_title(f'risk-coverage (AURC {aurc:.3f})')
        save(fig, 'risk_coverage')
    unknown = np.array([not m['known'] for m in data.matched], dtype=bool)
    if 0 < unknown.sum() < len(unknown):
        scores = np.array([m['gp_variance'] for m in data.matched])
        thresholds = np.unique(scores)[::-1]
        tpr = [(scores[unknown] >= t).mean() for t in thresholds]
        fpr = [(scores[~unknown] >= t).mean() for t in thresholds]
        fig, ax = plt.subplots(figsize=(4, 4))
        ax.plot([0] + fpr, [0] + tpr)
        ax.plot([0, 1], [0, 1], 'k--', lw=1)
        ax.set_xlabel('false positive rate (known objects)')
        ax.set_ylabel('true positive rate (unknown objects)')
        ax.set_title(f'OOD ROC of GP variance (AUROC {auroc(scores, unknown):.3f})')
        save(fig, 'ood_roc')
    return written


def _timeline_plot(data: Any, out_dir: Path, plt: Any) -> dict[str, str]:
    t0 = data.frames[0]['stamp']
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 4.8), sharex=True,
                                      gridspec_kw={'height_ratios': [3, 1.3]})
    tracks: dict[int, tuple[list, list]] = {}
    for d in data.detections:
        if d['track_id'] >= 0:
            xs, ys = tracks.setdefault(d['track_id'], ([], []))
            xs.append(d['stamp'] - t0)
            ys.append(d['gp_variance'])
    longest = sorted(tracks.items(), key=lambda kv: -len(kv[1][0]))[:12]
    for track_id, (xs, ys) in sorted(longest):
        top.plot(xs, ys, '.-', ms=3, lw=1, label=f'track {track_id}')
    top.set_yscale('log')
    top.set_ylabel('GP variance, logit²')
    top.set_title('per-track uncertainty, autonomy level and help requests')
    if longest:
        top.legend(fontsize=6, ncol=4, loc='upper left')
    xs = [f['stamp'] - t0 for f in data.frames]
    bottom.step(xs, [f['level'] for f in data.frames], where='post', color='k')
    for request in data.help_requests:
        bottom.axvline(request['stamp'] - t0, color='tab:red', lw=1, ls=':')
    bottom.set_yticks(range(4), [n[:6] for n in LEVEL_NAMES], fontsize=7)
    bottom.set_ylim(-0.4, 3.4)
    bottom.set_xlabel('time since first frame, s (dotted: help requests)')
    fig.tight_layout()
    fig.savefig(out_dir / 'uncertainty_timeline.png', dpi=110)
    plt.close(fig)
    return {'uncertainty_timeline': 'uncertainty_timeline.png'}


def _fmt(x: Any, digits: int = 3) -> str:
    return 'n/a' if x is None else f'{x:.{digits}f}'


def _score_line(metrics: dict) -> str:
    score = metrics.get('calibrated_score', {'count': 0})
    if score['count'] == 0:
        if metrics['detections']:
            return ('- calibrated score: n/a (the model has no score reference; add one with '
                    '`python -m uq_perception.training.score_reference`)')
        return '- calibrated score: n/a (no detection)'
    return (f"- calibrated score (share of known validation objects with lower GP variance): "
            f"p50 {_fmt(score['p50'])}, p90 {_fmt(score['p90'])}, p99 {_fmt(score['p99'])}")


def write_report(bag: Path, data: Any, metrics: dict, plots: dict[str, str], out_dir: Path,
                 extra: dict | None = None) -> tuple[Path, Path]:
    """Write ``report.json`` and ``report.md`` into ``out_dir``."""
    report = {'bag': str(bag), 'metrics': metrics, 'plots': plots,
              'transitions': data.transitions, 'help_requests': data.help_requests,
              'level_timeline': [{'stamp': f['stamp'], 'level': f['level_name']}
                                 for f in data.frames],
              'notes': data.notes, 'problems': data.problems, **(extra or {})}
    json_path = out_dir / 'report.json'
    json_path.write_text(json.dumps(report, indent=2))
    lines = [f'# Bag evaluation: `{bag}`', '']
    if data.problems:
        lines += ['## Problems', ''] + [f'- {p}' for p in data.problems] + ['']
    lat = metrics['latency_ms']
    lines += ['## Summary', '',
              f"- frames: {metrics['frames']}, detections: {metrics['detections']}",
              f"- pipeline latency per frame: p50 {_fmt(lat.get('p50'), 1)} ms, "
              f"p99 {_fmt(lat.get('p99'), 1)} ms",
              f"- GP variance (logit²): p50 {_fmt(metrics['gp_variance'].get('p50'), 4)}, "
              f"p99 {_fmt(metrics['gp_variance'].get('p99'), 4)}",
              _score_line(metrics),
              f"- level transitions: {metrics['transitions']}, help requests: "
              f"{metrics['help_requests']}"]
    if 'node_latency_ms' in metrics:
        nl = metrics['node_latency_ms']
        lines.append(f"- node latency (recorded DetectionArray.inference_time_ms): p50 "
                     f"{_fmt(nl.get('p50'), 1)} ms, p99 {_fmt(nl.get('p99'), 1)} ms")
        ne = metrics['node_end_to_end_ms']
        lines.append(f"- node end to end (image received to DetectionArray received, "
                     f"recorder clock): p50 {_fmt(ne.get('p50'), 1)} ms, p99 "
                     f"{_fmt(ne.get('p99'), 1)} ms over {ne['count']} frames")
    lines += ['', '## Time per level', '', '| level | seconds |', '|---|---|']
    lines += [f'| {k} | {v:.1f} |' for k, v in metrics['time_per_level_s'].items()]
    lines += ['', '## Accuracy and uncertainty quality', '']
    source = metrics.get('ground_truth_source')
    if source:
        lines.append(f"Ground truth: `{source}` ({metrics['ground_truth_unmatched_stamps']} "
                     'labelled stamp(s) not in the bag).')
        lines.append('')
    if metrics['ground_truth_frames'] == 0:
        lines.append('No ground truth for this bag: accuracy, calibration and OOD metrics '
                     'need labels (a `ground_truth` DetectionArray topic, as `uq sim record` '
                     'writes, --ground-truth TOPIC, or --ground-truth FILE.json with COCO '
                     'labels stamped by frame).')
    else:
        partial = not metrics['ground_truth_exhaustive']
        ap_line = ('- AP: not computed. These labels are partial (only the objects the robot '
                   'asked about), and AP needs exhaustive labels (every object of a frame); '
                   'the figures below cover the labelled detections only'
                   if partial else
                   f"- mAP@0.5 (known classes): {_fmt(metrics.get('map50'))}")
        lines += [f"- frames with ground truth: {metrics['ground_truth_frames']}"
                  + (' (partial labels)' if partial else ''),
                  ap_line,
                  f"- ECE: {_fmt(metrics.get('ece'))}",
                  f"- misclassification AUROC (entropy): "
                  f"{_fmt(metrics.get('misclassification_auroc'))}",
                  f"- AURC: {_fmt(metrics.get('aurc'))}",
                  f"- OOD AUROC (GP variance, {metrics['matched_unknown']} unknown vs "
                  f"{metrics['matched_known']} known detections): "
                  f"{_fmt(metrics.get('ood_auroc'))}"]
    if data.transitions:
        lines += ['', '## Level transitions', '', '| stamp | from | to | reason |',
                  '|---|---|---|---|']
        lines += [f"| {t['stamp']:.2f} | {t['from']} | {t['to']} | {t['reason']} |"
                  for t in data.transitions]
    if data.help_requests:
        lines += ['', '## Help requests', '']
        for r in data.help_requests:
            crop = f" ![crop]({r['crop']})" if r['crop'] else ''
            lines.append(f"- {r['request_id']} at {r['stamp']:.2f}, track {r['track_id']}: "
                         f"{r['reason']}; candidates {', '.join(r['candidates'])}{crop}")
    if extra and 'bench' in extra:
        lines += ['', '## Benchmark', '', '```', json.dumps(extra['bench'], indent=2), '```']
    if data.notes:
        lines += ['', '## Notes', ''] + [f'- {n}' for n in data.notes]
    lines += ['', '## Plots', ''] + [f'![{k}]({v})' for k, v in plots.items()]
    md_path = out_dir / 'report.md'
    md_path.write_text('\n'.join(lines) + '\n')
    return md_path, json_path
