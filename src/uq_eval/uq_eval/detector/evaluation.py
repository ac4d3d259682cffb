"""Evaluation of the detector and its NTK-GP on simulator splits (ROS-free; ``uq eval detector``).

Metrics, all on held-out splits at the model's input size:

- **AP@0.5** per known class and their mean (``test``): COCO-style, detections ranked by
  ``objectness * p(class)`` for their most probable class, greedy matching at IoU >= 0.5,
  101-point interpolation. Occluded, truncated and tiny objects (the flags of the
  simulator's annotations) are "ignore" regions as COCO's crowd boxes: finding them is
  neither rewarded nor penalised. ``ap50_all_objects`` counts them as regular objects.
- **Objectness recall on unknown objects** (``test_unknown``): the fraction of (not
  ignored) unknown objects matched at IoU >= 0.5 by a detection above the operating score
  threshold, class-agnostic.
- **Known-vs-unknown AUROC** of the GP variance (and, for comparison, of the mutual
  information, the predictive entropy and one minus the max softmax probability of the
  network) over the detections matched to not-ignored known and unknown objects of
  ``test_unknown``; the GP variance's and the mutual information's also at the top of the
  report (``ood_auroc_gp_variance``, ``ood_auroc_mutual_information``, with the procedural
  unknowns when they are evaluated) and on stderr.
- **Misclassification AUROC** (``test``): detections matched to known objects, positives
  those whose most probable class is wrong; scored by GP variance and predictive entropy.
- Calibration of the matched known detections (accuracy, ECE, NLL, Brier).
- **Box-coordinate coverage** (``test``): the share of true box coordinates within +-1 and
  +-2 of the published ``box_std`` of the matched detections, per coordinate and overall
  (``uq_perception.training.box_fit``); the same on the unknown objects of
  ``test_unknown``.
- **Latency** of the forward pass at batch 1 after warm-up (p50/p99 ms), and of the
  whole ``detect`` + GP query.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from uq_perception.detectors.centernet import CenterNetDetector
    from uq_perception.ntk import LastLayerNTKGP
    from uq_perception.runtime.backends import InferenceBackend
    from uq_perception.training.detector_data import DetectionSplit
    from uq_perception.training.ood_baselines import FeatureBank

from uq_common.arguments import positive_int
from uq_eval.detector.scoring import (
    UNCERTAINTY_SIGNALS,
    append_uncertainty_signals,
    matched_objects,
    print_json_report,
    safe_auroc,
    value_spread,
)
from uq_perception.training.detection_scoring import (
    OPERATING_MAX_DETECTIONS,
    OPERATING_THRESHOLD,
    evaluate_detection,
    predict_split,
    rounded,
)


def evaluate_uncertainty(model: CenterNetDetector, gp: LastLayerNTKGP,
                         test: DetectionSplit, test_unknown: DetectionSplit,
                         score_threshold: float = OPERATING_THRESHOLD,
                         max_detections: int = OPERATING_MAX_DETECTIONS,
                         progress: bool = False,
                         bank: FeatureBank | None = None) -> dict[str, Any]:
    """Unknown-object recall, OOD and misclassification AUROCs, calibration; with a
    feature ``bank`` of known objects, the GP beside every post-hoc OOD score
    (:mod:`uq_perception.training.ood_baselines`) on the same detections."""
    from uq_perception.training import metrics

    result: dict[str, Any] = {'score_threshold': score_threshold}

    # --- unknown objects: objectness recall and known-vs-unknown separation
    dets = predict_split(model, test_unknown, score_threshold, max_detections,
                         progress=progress)
    found: dict[int, list[bool]] = {}
    known_found: list[bool] = []
    signals: dict[str, list[float]] = {name: [] for name in UNCERTAINTY_SIGNALS}
    is_unknown: list[bool] = []
    matched_category: list[int] = []
    norms: list[float] = []
    embeddings: list[np.ndarray] = []
    logits: list[np.ndarray] = []
    for i, det_index, obj_index in matched_objects(test_unknown, dets):
        hard = test_unknown.hard(i)
        unknown = test_unknown.labels[i] < 0
        hit = np.zeros(len(hard), dtype=bool)
        hit[obj_index] = True
        for k in np.flatnonzero(~hard):
            if unknown[k]:
                found.setdefault(int(test_unknown.category_ids[i][k]), []).append(bool(hit[k]))
            else:
                known_found.append(bool(hit[k]))
        if det_index.size == 0:
            continue
        append_uncertainty_signals(signals, gp, dets[i].embeddings[det_index],
                                   dets[i].logits[det_index])
        norms += np.linalg.norm(dets[i].embeddings[det_index], axis=1).tolist()
        embeddings.append(dets[i].embeddings[det_index])
        logits.append(dets[i].logits[det_index])
        is_unknown += unknown[obj_index].tolist()
        matched_category += test_unknown.category_ids[i][obj_index].tolist()
    all_unknown = [h for hits in found.values() for h in hits]
    labels = np.array(is_unknown, dtype=bool)
    result['unknown_recall'] = rounded(float(np.mean(all_unknown))) if all_unknown else None
    result['unknown_recall_per_class'] = {
        test_unknown.category_names[c]: rounded(float(np.mean(h))) for c, h in sorted(
            found.items())}
    result['unknown_objects'] = len(all_unknown)
    result['known_recall_test_unknown'] = rounded(float(np.mean(known_found))) \
        if known_found else None
    result['ood_matched_known'] = int((~labels).sum())
    result['ood_matched_unknown'] = int(labels.sum())
    result['auroc_unknown'] = {name: safe_auroc(np.array(v), labels)
                               for name, v in signals.items()}
    # A norm-aware feature map (uq_perception.ntk.feature_map) rescales each embedding by a
    # power of its norm; where every norm is the same it is one constant factor, which the
    # GP's prior precision absorbs, and changes no ranking.
    result['embedding_norm'] = {
        group: value_spread(np.array(norms)[mask]) for group, mask in (
            ('known', ~labels), ('unknown', labels))}
    # Which unknown shapes the GP variance separates from the known objects, and which not.
    gp_variance, category = np.array(signals['gp_variance']), np.array(matched_category)
    result['auroc_unknown_gp_variance_per_class'] = {
        test_unknown.category_names[int(c)]: safe_auroc(
            gp_variance[~labels | (category == c)], labels[~labels | (category == c)])
        for c in np.unique(category[labels])}
    if bank is not None and labels.any() and (~labels).any():
        result['ood_scores'] = ood_score_table(gp, bank, np.concatenate(embeddings),
                                               np.concatenate(logits), labels)
    if gp.ood_threshold is not None and labels.size:
        flagged = np.array(signals['gp_variance']) > gp.ood_threshold
        result['ood_flag_rate_known'] = rounded(float(flagged[~labels].mean())) \
            if (~labels).any() else None
        result['ood_flag_rate_unknown'] = rounded(float(flagged[labels].mean())) \
            if labels.any() else None

    # --- known objects of the test split: misclassification and calibration
    dets = predict_split(model, test, score_threshold, max_detections, progress=progress)
    variance, entropy, probs, truth = [], [], [], []
    for i, det_index, obj_index in matched_objects(test, dets):
        known = test.labels[i][obj_index] >= 0
        if not known.any():
            continue
        sel = det_index[known]
        out = gp.predict(dets[i].embeddings[sel], dets[i].logits[sel])
        variance += out.gp_variance.tolist()
        entropy += out.predictive_entropy.tolist()
        probs.append(out.probabilities)
        truth += test.labels[i][obj_index[known]].tolist()
    if probs:
        p = np.concatenate(probs)
        y = np.array(truth, dtype=np.int64)
        wrong = p.argmax(axis=1) != y
        result['matched_known'] = int(y.size)
        result['misclassified'] = int(wrong.sum())
        result['accuracy'] = rounded(metrics.accuracy(p, y))
        result['ece'] = rounded(metrics.ece(p, y))
        result['nll'] = rounded(metrics.nll(p, y))
        result['brier'] = rounded(metrics.brier(p, y))
        result['auroc_misclassification'] = {
            'gp_variance': safe_auroc(np.array(variance), wrong),
            'predictive_entropy': safe_auroc(np.array(entropy), wrong),
        }
    return result


def known_feature_bank(model: CenterNetDetector, split: DetectionSplit,
                       progress: bool = False) -> FeatureBank | None:
    """The feature-space baselines' reference: the embeddings of the detections matched to
    the split's known objects, at the node's operating point; None when fewer than two are
    matched (an untrained model)."""
    from uq_perception.training.ood_baselines import FeatureBank

    dets = predict_split(model, split, OPERATING_THRESHOLD, OPERATING_MAX_DETECTIONS,
                         progress=progress)
    features, labels = [], []
    for i, det_index, obj_index in matched_objects(split, dets):
        known = split.labels[i][obj_index] >= 0
        features.append(dets[i].embeddings[det_index[known]])
        labels.append(split.labels[i][obj_index[known]])
    if sum(len(f) for f in features) < 2:
        return None
    return FeatureBank.fitted(np.concatenate(features), np.concatenate(labels))


def ood_score_table(gp: LastLayerNTKGP, bank: FeatureBank, embeddings: np.ndarray,
                    logits: np.ndarray, unknown: np.ndarray) -> list[dict[str, Any]]:
    """AUROC and FPR95, unknown against known detections, of the GP variance, the
    calibrated score and every post-hoc baseline (softmax: the CenterNet's classes)."""
    from uq_perception.training.ood_baselines import baseline_scores, score_table

    out = gp.predict(embeddings, logits)
    scores = {'gp_variance': out.gp_variance}
    if out.calibrated_score is not None:
        scores['calibrated_score'] = out.calibrated_score
    scores.update(baseline_scores(logits, embeddings, bank, 'softmax'))
    return score_table({k: v[~unknown] for k, v in scores.items()},
                       {k: v[unknown] for k, v in scores.items()})


def measure_latency(model: CenterNetDetector, gp: LastLayerNTKGP | None = None,
                    runs: int = 200, warmup: int = 20, threads: Sequence[int] = (1, 2),
                    seed: int = 0) -> dict[str, Any]:
    """Forward-pass latency (batch 1) and ``detect`` + GP query latency, in ms.

    Measured once per torch thread count in ``threads``: on a machine that other jobs
    share, two threads can be far slower than one (a descheduled thread stalls every
    parallel op), so both are reported together with the load average.
    """
    import torch

    height, width = model.input_size
    rng = np.random.default_rng(seed)
    image = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
    tensor = model.preprocess(image)
    model.eval()
    previous = torch.get_num_threads()
    result: dict[str, Any] = {'runs': runs, 'batch': 1, 'input': f'{width}x{height}',
                              'load_average_1min_before': rounded(os.getloadavg()[0], 2)}
    try:
        for count in threads:
            torch.set_num_threads(int(count))
            forward, full = [], []
            with torch.no_grad():
                for n in range(warmup + runs):
                    t0 = time.perf_counter()
                    model(tensor)
                    t1 = time.perf_counter()
                    dets = model.detect(image)
                    if gp is not None and len(dets):
                        gp.predict(dets.embeddings, dets.logits)
                    t2 = time.perf_counter()
                    if n >= warmup:
                        forward.append((t1 - t0) * 1e3)
                        full.append((t2 - t1) * 1e3)
            result[f'threads_{count}'] = {
                'forward_p50': rounded(float(np.percentile(forward, 50)), 2),
                'forward_p99': rounded(float(np.percentile(forward, 99)), 2),
                'detect_with_gp_p50': rounded(float(np.percentile(full, 50)), 2),
                'detect_with_gp_p99': rounded(float(np.percentile(full, 99)), 2),
            }
    finally:
        torch.set_num_threads(previous)
    result['load_average_1min_after'] = rounded(os.getloadavg()[0], 2)
    result['cpu'] = _cpu_name()
    result['cpu_count'] = os.cpu_count()
    return result


def measure_backend_latency(backend: InferenceBackend, gp: LastLayerNTKGP | None = None,
                            runs: int = 200, warmup: int = 20, seed: int = 0
                            ) -> dict[str, Any]:
    """The node's per-frame path on ``backend``: ``infer`` (upload, network, one download,
    decode), then the GP query on the host, in ms. Each ``infer`` is followed by a device
    synchronisation, so queued GPU work is inside the timer."""
    height, width = backend.model.input_size
    rng = np.random.default_rng(seed)
    image = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
    infer, full = [], []
    for n in range(warmup + runs):
        t0 = time.perf_counter()
        dets = backend.infer(image, 0.3, 20)
        backend.synchronize()
        t1 = time.perf_counter()
        if gp is not None and len(dets):
            gp.predict(dets.embeddings, dets.logits)
        t2 = time.perf_counter()
        if n >= warmup:
            infer.append((t1 - t0) * 1e3)
            full.append((t2 - t0) * 1e3)
    return {
        'backend': backend.kind.value, 'device': backend.device_name, 'runs': runs,
        'input': f'{width}x{height}',
        'infer_p50': rounded(float(np.percentile(infer, 50)), 2),
        'infer_p99': rounded(float(np.percentile(infer, 99)), 2),
        'infer_with_gp_p50': rounded(float(np.percentile(full, 50)), 2),
        'infer_with_gp_p99': rounded(float(np.percentile(full, 99)), 2),
    }


def _cpu_name() -> str:
    try:
        for line in Path('/proc/cpuinfo').read_text().splitlines():
            if line.startswith('model name'):
                return line.split(':', 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or 'unknown'


def evaluate(model_path: Path, gp_path: Path, data: Path, latency_runs: int = 200,
             threads: int = 1, progress: bool = True, backend: str = 'pytorch-cpu',
             engine: str | None = None, procedural_unknowns: int = 0,
             procedural_seed: int = 0) -> dict[str, Any]:
    """All metrics of a saved detector and GP on ``data/test`` and ``data/test_unknown``,
    and on ``procedural_unknowns`` generated unknown objects when that is > 0."""
    import torch

    from uq_perception.detectors.centernet import load_detector
    from uq_perception.ntk import LastLayerNTKGP
    from uq_perception.runtime.backends import create_backend
    from uq_perception.training.box_fit import evaluate_box_uncertainty
    from uq_perception.training.detector_data import load_split

    torch.set_num_threads(threads)
    model = load_detector(model_path)
    # Its own copy of the network (a GPU backend moves it), created first so an
    # unavailable backend fails before the accuracy metrics run.
    runner = create_backend(backend, load_detector(model_path), engine_path=engine)
    gp = LastLayerNTKGP.load(gp_path, feature_dim=model.embedding_dim,
                             class_names=model.class_names, model_id=model.model_id)
    size = model.input_size
    test = load_split(data / 'test', size, class_names=model.class_names)
    test_unknown = load_split(data / 'test_unknown', size, class_names=model.class_names)
    report: dict[str, Any] = {
        'model_id': model.model_id,
        'model': str(model_path),
        'gp': str(gp_path),
        'data': str(data),
        'gp_gating': gp.config.gating.value,
        'gp_experts': gp.num_experts,
        'detection_test': evaluate_detection(model, test, gp, progress=progress),
    }
    # The feature-space baselines are fitted on held-out known objects: the validation
    # split's, where the dataset has one (the GP's score reference comes from it too).
    bank = None
    if (data / 'val').is_dir():
        bank = known_feature_bank(model, load_split(data / 'val', size,
                                                    class_names=model.class_names), progress)
    report['uncertainty'] = evaluate_uncertainty(model, gp, test, test_unknown,
                                                 progress=progress, bank=bank)
    report['ood_auroc_mutual_information'] = {
        'fixed_unknown_set': report['uncertainty']['auroc_unknown']['mutual_information']}
    if procedural_unknowns > 0:
        from uq_eval.detector.procedural_unknowns import evaluate_procedural_unknowns

        report['procedural_unknowns'] = evaluate_procedural_unknowns(
            model, gp, procedural_unknowns, procedural_seed, progress=progress)
        report['ood_auroc_gp_variance'] = {
            'fixed_unknown_set': report['uncertainty']['auroc_unknown']['gp_variance'],
            'procedural_unknowns': report['procedural_unknowns']['auroc_unknown']['gp_variance'],
        }
        report['ood_auroc_mutual_information']['procedural_unknowns'] = \
            report['procedural_unknowns']['auroc_unknown']['mutual_information']
    report['box_uncertainty'] = evaluate_box_uncertainty(
        model, gp, test, test_unknown, OPERATING_THRESHOLD, OPERATING_MAX_DETECTIONS,
        progress=progress)
    report['latency_ms'] = measure_latency(model, gp, runs=latency_runs)
    report['backend_latency_ms'] = measure_backend_latency(runner, gp, runs=latency_runs)
    report['date'] = time.strftime('%Y-%m-%d %H:%M:%S %Z')
    return report


def epistemic_summary(report: dict[str, Any]) -> str:
    """One line: the known-vs-unknown AUROC of the GP variance and of the mutual
    information on the fixed unknown set."""
    unc = report['uncertainty']
    return (f"known-vs-unknown AUROC on the fixed unknown set ({unc['ood_matched_unknown']} "
            f"unknown vs {unc['ood_matched_known']} known detections): GP variance "
            f"{unc['auroc_unknown']['gp_variance']}, mutual information "
            f"{unc['auroc_unknown']['mutual_information']}")


def configure(parser: argparse.ArgumentParser) -> None:
    """Evaluate the detector and its NTK-GP on simulator test splits (prints JSON)."""
    parser.add_argument('--data', type=Path, required=True,
                        help='dataset directory with test/ and test_unknown/')
    parser.add_argument('--model', type=Path, default=Path('models/detector.pt'))
    parser.add_argument('--gp', type=Path, default=Path('models/detector_gp.npz'))
    parser.add_argument('--out', type=Path, default=None, help='also write the JSON here')
    parser.add_argument('--latency-runs', type=positive_int, default=200)
    parser.add_argument('--threads', type=positive_int, default=1,
                        help='torch CPU threads for the accuracy metrics (latency is '
                             'measured with 1 and 2 threads)')
    parser.add_argument('--no-progress', action='store_true', help='hide progress bars')
    parser.add_argument('--backend', default='pytorch-cpu',
                        choices=['pytorch-cpu', 'pytorch-cuda', 'tensorrt'],
                        help='backend of the per-frame latency (backend_latency_ms; '
                             'device-synchronised)')
    parser.add_argument('--engine', default=None,
                        help='TensorRT engine from `uq build-engine` (backend tensorrt)')
    from uq_eval.detector.procedural_unknowns import (
        procedural_count_argument,
        procedural_seed_argument,
    )

    parser.add_argument('--procedural-unknowns', type=procedural_count_argument, default=0,
                        metavar='N', help='also render N scenes with one procedurally '
                        'generated unknown object each (never used in training) and report '
                        'their OOD AUROC next to the fixed unknown set (docs/simulation.md); '
                        '0: skipped')
    parser.add_argument('--procedural-seed', type=procedural_seed_argument, default=0,
                        metavar='SEED', help='seed of the procedural objects')
    parser.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    from uq_eval.detector.procedural_unknowns import ood_summary
    from uq_perception.runtime.backends import BackendUnavailableError

    try:
        report = evaluate(args.model, args.gp, args.data, latency_runs=args.latency_runs,
                          threads=args.threads, progress=not args.no_progress,
                          backend=args.backend, engine=args.engine,
                          procedural_unknowns=args.procedural_unknowns,
                          procedural_seed=args.procedural_seed)
    except BackendUnavailableError as exc:
        print(f'uq eval detector: {exc}', file=sys.stderr)
        return 2
    print(epistemic_summary(report), file=sys.stderr)
    if 'procedural_unknowns' in report:
        print(ood_summary(report), file=sys.stderr)
    print_json_report(report, args.out)
    return 0
