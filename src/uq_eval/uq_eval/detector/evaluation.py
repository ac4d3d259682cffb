"""Evaluation of a contract detector and its NTK-GP on simulator splits (ROS-free;
``uq eval detector``).

The detector is any model of the detector contract, opened as ``uq gp fit`` and the
detector node open it (:func:`uq_eval.gp.fit_command.open_detector`): the shipped CenterNet
(``.pt``, on ``pytorch-cpu``) or an ONNX file through the ONNX adapter (``.onnx``, with the
adapter's settings, e.g. ``--layout yolo``). Every image is run through
:meth:`~uq_perception.detectors.contract.DetectorContract.infer` one frame at a time, as on
the robot: images are read at their own size (a split whose images differ in size is
resized to the network's input) and the detector resizes them itself.

Metrics, all on held-out splits:

- **AP@0.5** per known class and their mean (``test``): COCO-style, detections ranked by
  ``score * p(class)`` for their most probable class (the GP's predictive probabilities
  for a softmax head, the detector's own sigmoid for a sigmoid head), greedy matching at
  IoU >= 0.5, 101-point interpolation. Occluded, truncated and tiny objects (the flags of
  the simulator's annotations) are "ignore" regions as COCO's crowd boxes: finding them is
  neither rewarded nor penalised. ``ap50_all_objects`` counts them as regular objects.
- **Objectness recall on unknown objects** (``test_unknown``): the fraction of (not
  ignored) unknown objects matched at IoU >= 0.5 by a detection above the operating score
  threshold, class-agnostic; and ``detected_objects``: how many known and unknown objects
  any detection finds at all (score >= the AP threshold) and at the node's threshold.
- **Known-vs-unknown AUROC** of the GP variance (and, for comparison, of the mutual
  information, the predictive entropy and one minus the max softmax probability of the
  network) over the detections matched to not-ignored known and unknown objects of
  ``test_unknown``; the GP variance's and the mutual information's also at the top of the
  report (``ood_auroc_gp_variance``, ``ood_auroc_mutual_information``, with the procedural
  unknowns when they are evaluated) and on stderr. Beside them, with a ``val`` split,
  ``ood_scores``: AUROC and FPR95 of every score ``uq gp fit`` reports (the GP's
  predictive signals, its calibrated score, the fused score and the post-hoc baselines
  MSP, max logit, energy, Mahalanobis and KNN, fitted on the validation split's known
  objects), on the same detections.
- **Misclassification AUROC** (``test``): detections matched to known objects, positives
  those whose most probable class is wrong; scored by GP variance and predictive entropy.
- Calibration of the matched known detections (accuracy, ECE, NLL, Brier).
- **Box-coordinate coverage** (``test``, the shipped CenterNet only: its box head gives
  ``box_std``): the share of true box coordinates within +-1 and +-2 of the published
  ``box_std`` of the matched detections, per coordinate and overall
  (``uq_perception.training.box_fit``); the same on the unknown objects of
  ``test_unknown``.
- **Latency** of the per-frame path (``infer`` and the GP query) after warm-up (p50/p99
  ms); for the shipped CenterNet also of its forward pass at batch 1 and of ``detect`` +
  GP query.
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
    from uq_eval.gp.fitting import ObjectFeatures
    from uq_perception.detectors.centernet import CenterNetDetector
    from uq_perception.detectors.contract import DetectorContract
    from uq_perception.ntk import LastLayerNTKGP
    from uq_perception.training.detector_data import DetectionSplit

from uq_common.arguments import positive_int
from uq_eval.detector.scoring import (
    UNCERTAINTY_SIGNALS,
    append_uncertainty_signals,
    detected_objects,
    matched_objects,
    ood_score_table,
    print_json_report,
    safe_auroc,
    value_spread,
)
from uq_perception.training.detection_scoring import (
    AP_MAX_DETECTIONS,
    AP_SCORE_THRESHOLD,
    OPERATING_MAX_DETECTIONS,
    OPERATING_THRESHOLD,
    detect_split,
    detection_report,
    rounded,
)


def evaluate_uncertainty(detector: DetectorContract, gp: LastLayerNTKGP,
                         test: DetectionSplit, test_unknown: DetectionSplit,
                         score_threshold: float = OPERATING_THRESHOLD,
                         max_detections: int = OPERATING_MAX_DETECTIONS,
                         progress: bool = False,
                         reference: ObjectFeatures | None = None) -> dict[str, Any]:
    """Unknown-object recall and detection counts, OOD and misclassification AUROCs,
    calibration; with the ``reference`` known objects of the post-hoc scores, the GP beside
    every one of them on the same detections (:func:`ood_score_table`)."""
    from uq_perception.training import metrics

    result: dict[str, Any] = {'score_threshold': score_threshold}

    # --- unknown objects: objectness recall and known-vs-unknown separation
    dets = detect_split(detector, test_unknown, score_threshold, max_detections, progress)
    found: dict[int, list[bool]] = {}
    known_found: list[bool] = []
    signals: dict[str, list[float]] = {name: [] for name in UNCERTAINTY_SIGNALS}
    is_unknown: list[bool] = []
    matched_category: list[int] = []
    matched_label: list[int] = []
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
        matched_label += test_unknown.labels[i][obj_index].tolist()
    all_unknown = [h for hits in found.values() for h in hits]
    labels = np.array(is_unknown, dtype=bool)
    result['unknown_recall'] = rounded(float(np.mean(all_unknown))) if all_unknown else None
    result['unknown_recall_per_class'] = {
        test_unknown.category_names[c]: rounded(float(np.mean(h))) for c, h in sorted(
            found.items())}
    result['unknown_objects'] = len(all_unknown)
    result['known_recall_test_unknown'] = rounded(float(np.mean(known_found))) \
        if known_found else None
    result['detected_objects'] = detected_objects(
        test_unknown, detect_split(detector, test_unknown, AP_SCORE_THRESHOLD,
                                   AP_MAX_DETECTIONS, progress), dets)
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
    if reference is not None and labels.any() and (~labels).any():
        result['ood_scores'] = ood_score_table(
            gp, detector.class_activation, reference, np.concatenate(embeddings),
            np.concatenate(logits), np.array(matched_label, dtype=np.int64))
    if gp.ood_threshold is not None and labels.size:
        flagged = np.array(signals['gp_variance']) > gp.ood_threshold
        result['ood_flag_rate_known'] = rounded(float(flagged[~labels].mean())) \
            if (~labels).any() else None
        result['ood_flag_rate_unknown'] = rounded(float(flagged[labels].mean())) \
            if labels.any() else None

    # --- known objects of the test split: misclassification and calibration
    dets = detect_split(detector, test, score_threshold, max_detections, progress)
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


def known_reference(detector: DetectorContract, split: DetectionSplit,
                    progress: bool = False) -> ObjectFeatures | None:
    """The post-hoc scores' reference: the features, logits and classes of the detections
    matched to the split's known objects, at the node's operating point; None when fewer
    than two are matched (an untrained model)."""
    from uq_eval.gp.fitting import ObjectFeatures

    dets = detect_split(detector, split, OPERATING_THRESHOLD, OPERATING_MAX_DETECTIONS,
                        progress)
    features, logits, labels = [], [], []
    for i, det_index, obj_index in matched_objects(split, dets):
        known = split.labels[i][obj_index] >= 0
        features.append(dets[i].embeddings[det_index[known]])
        logits.append(dets[i].logits[det_index[known]])
        labels.append(split.labels[i][obj_index[known]])
    if sum(len(f) for f in features) < 2:
        return None
    return ObjectFeatures(np.concatenate(features), np.concatenate(logits),
                          np.concatenate(labels))


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


def measure_backend_latency(backend: DetectorContract, gp: LastLayerNTKGP | None = None,
                            runs: int = 200, warmup: int = 20, seed: int = 0
                            ) -> dict[str, Any]:
    """The node's per-frame path on ``backend``: ``infer`` (upload, network, one download,
    decode), then the GP query on the host, in ms. Each ``infer`` is followed by a device
    synchronisation, so queued GPU work is inside the timer."""
    height, width = backend.input_size
    rng = np.random.default_rng(seed)
    image = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
    infer, full = [], []
    for n in range(warmup + runs):
        t0 = time.perf_counter()
        dets = backend.infer(image, OPERATING_THRESHOLD, OPERATING_MAX_DETECTIONS)
        backend.synchronize()
        t1 = time.perf_counter()
        if gp is not None and len(dets):
            gp.predict(dets.embeddings, dets.logits)
        t2 = time.perf_counter()
        if n >= warmup:
            infer.append((t1 - t0) * 1e3)
            full.append((t2 - t0) * 1e3)
    return {
        'backend': backend.backend_name, 'device': backend.device_name, 'runs': runs,
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


def read_split(directory: Path, class_names: Sequence[str],
               fallback_size: tuple[int, int]) -> DetectionSplit:
    """A split of ``uq sim dataset`` at its images' own size (the detector resizes them, as
    on the robot), or at ``fallback_size`` when its images differ in size.

    Raises
    ------
    ValueError
        If the annotations or an image are missing or malformed, or the split's known
        classes are not ``class_names``.
    """
    from uq_perception.training.coco_data import read_coco
    from uq_perception.training.detector_data import split_from_coco

    annotations = directory / 'annotations.json'
    if not annotations.is_file():
        raise ValueError(f'no annotations.json in {directory}; generate data with '
                         f'`uq sim dataset --out DIR`')
    dataset = read_coco(annotations)
    sizes = {(image.height, image.width) for image in dataset.images}
    size = sizes.pop() if len(sizes) == 1 else fallback_size
    return split_from_coco(dataset, directory.name, size, class_names)


def evaluate(detector: DetectorContract, gp: LastLayerNTKGP, data: Path,
             model_info: dict[str, Any], gp_path: Path,
             latency_backend: DetectorContract | None = None, latency_runs: int = 200,
             progress: bool = True, procedural_unknowns: int = 0,
             procedural_seed: int = 0) -> dict[str, Any]:
    """All metrics of ``detector`` and its GP on ``data/test`` and ``data/test_unknown``,
    and on ``procedural_unknowns`` generated unknown objects when that is > 0; the
    per-frame latency on ``latency_backend`` (default: ``detector``).

    Raises
    ------
    ValueError
        As :func:`read_split`, or procedural unknowns for a detector of other classes than
        the simulator's.
    """
    from uq_perception.runtime.backends import InferenceBackend
    from uq_perception.training.box_fit import evaluate_box_uncertainty

    # The shipped CenterNet's own network: its box head and its batch-1 forward pass.
    network = detector.model if isinstance(detector, InferenceBackend) else None
    names = detector.class_names
    test = read_split(data / 'test', names, detector.input_size)
    test_unknown = read_split(data / 'test_unknown', names, detector.input_size)
    report: dict[str, Any] = {
        'model_id': detector.model_id,
        'model': model_info['path'],
        'detector': {key: model_info[key] for key in (
            'format', 'sha256', 'classes', 'feature_dim', 'input_size', 'backend', 'adapter')},
        'gp': str(gp_path),
        'data': str(data),
        'gp_gating': gp.config.gating.value,
        'gp_experts': gp.num_experts,
        'detection_test': detection_report(
            test, detect_split(detector, test, AP_SCORE_THRESHOLD, AP_MAX_DETECTIONS,
                               progress),
            # The node publishes the GP's class probabilities for a softmax head; a sigmoid
            # head's detections are ranked by its own class scores, as its AP is defined.
            gp if detector.class_activation == 'softmax' else None,
            detector.class_activation),
    }
    # The feature-space baselines are fitted on held-out known objects: the validation
    # split's, where the dataset has one (the GP's score reference comes from it too).
    reference = None
    if (data / 'val').is_dir():
        reference = known_reference(detector, read_split(data / 'val', names,
                                                         detector.input_size), progress)
    report['uncertainty'] = evaluate_uncertainty(detector, gp, test, test_unknown,
                                                 progress=progress, reference=reference)
    report['ood_auroc_mutual_information'] = {
        'fixed_unknown_set': report['uncertainty']['auroc_unknown']['mutual_information']}
    if procedural_unknowns > 0:
        from uq_eval.detector.procedural_unknowns import evaluate_procedural_unknowns

        # Rendered by the camera of the dataset's scenes, so the detector sees the same
        # field of view as on the fixed unknown set.
        report['procedural_unknowns'] = evaluate_procedural_unknowns(
            detector, gp, procedural_unknowns, procedural_seed, test.images.shape[1:3],
            progress=progress, reference=reference)
        report['ood_auroc_gp_variance'] = {
            'fixed_unknown_set': report['uncertainty']['auroc_unknown']['gp_variance'],
            'procedural_unknowns': report['procedural_unknowns']['auroc_unknown']['gp_variance'],
        }
        report['ood_auroc_mutual_information']['procedural_unknowns'] = \
            report['procedural_unknowns']['auroc_unknown']['mutual_information']
    if network is not None:
        report['box_uncertainty'] = evaluate_box_uncertainty(
            network, gp, test, test_unknown, OPERATING_THRESHOLD, OPERATING_MAX_DETECTIONS,
            progress=progress)
        report['latency_ms'] = measure_latency(network, gp, runs=latency_runs)
    else:
        report['box_uncertainty'] = {
            'calibrated': False,
            'reason': 'box_std comes from the shipped detector\'s box head; this detector '
                      'publishes none'}
    report['backend_latency_ms'] = measure_backend_latency(latency_backend or detector, gp,
                                                           runs=latency_runs)
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
    """Evaluate a detector (.pt or .onnx) and its NTK-GP on simulator test splits (prints
    JSON)."""
    from uq_eval.gp.fit_command import add_detector_arguments

    parser.add_argument('--data', type=Path, required=True,
                        help='dataset directory with test/ and test_unknown/ (and val/ for '
                             'the post-hoc scores\' reference)')
    add_detector_arguments(parser, default_model=Path('models/detector.pt'))
    parser.add_argument('--gp', type=Path, default=Path('models/detector_gp.npz'))
    parser.add_argument('--out', type=Path, default=None, help='also write the JSON here')
    parser.add_argument('--latency-runs', type=positive_int, default=200)
    parser.add_argument('--no-progress', action='store_true', help='hide progress bars')
    parser.add_argument('--backend', default=None,
                        choices=['pytorch-cpu', 'pytorch-cuda', 'tensorrt'],
                        help='backend of the shipped detector\'s per-frame latency '
                             '(backend_latency_ms; device-synchronised; default pytorch-cpu); '
                             'an ONNX model runs on ONNX Runtime with --provider')
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


def _open(args: argparse.Namespace) -> tuple[DetectorContract, DetectorContract,
                                              LastLayerNTKGP, dict[str, Any]]:
    """The detector, the detector its latency is measured on, its GP and its description.

    Raises
    ------
    ValueError
        On a bad model, adapter setting, GP artefact (another model's, or missing), a
        backend named for an ONNX model, or procedural unknowns for other classes than the
        simulator's.
    """
    from uq_eval.detector.procedural_unknowns import check_procedural_classes
    from uq_eval.gp.fit_command import open_detector
    from uq_perception.detectors.centernet import load_detector
    from uq_perception.ntk import LastLayerNTKGP
    from uq_perception.runtime.backends import create_backend

    detector, info = open_detector(args)
    if info['format'] == 'onnx' and (args.backend is not None or args.engine is not None):
        raise ValueError('--backend and --engine choose the shipped detector\'s backend; an '
                         'ONNX model runs on ONNX Runtime (choose its device with --provider)')
    if args.procedural_unknowns:
        check_procedural_classes(detector.class_names)
    if not args.gp.is_file():
        raise ValueError(f'GP artefact not found: {args.gp}')
    gp = LastLayerNTKGP.load(args.gp, feature_dim=detector.feature_dim,
                             class_names=detector.class_names, model_id=detector.model_id)
    # The shipped model's own copy of the network on the latency backend (a GPU backend
    # moves it), created before the metrics run so an unavailable backend fails first.
    runner = detector if info['format'] == 'onnx' else create_backend(
        args.backend or 'pytorch-cpu', load_detector(args.model), engine_path=args.engine)
    return detector, runner, gp, info


def _run(args: argparse.Namespace) -> int:
    from uq_eval.detector.procedural_unknowns import ood_summary
    from uq_eval.gp.fit_command import _one_line
    from uq_perception.runtime.backends import BackendUnavailableError
    from uq_perception.runtime.onnx_runtime import OnnxRuntimeUnavailableError

    try:
        detector, runner, gp, info = _open(args)
        report = evaluate(detector, gp, args.data, info, args.gp, latency_backend=runner,
                          latency_runs=args.latency_runs, progress=not args.no_progress,
                          procedural_unknowns=args.procedural_unknowns,
                          procedural_seed=args.procedural_seed)
    except (ValueError, OSError, BackendUnavailableError, OnnxRuntimeUnavailableError) as exc:
        print(f'uq eval detector: {_one_line(exc)}', file=sys.stderr)
        return 2
    print(epistemic_summary(report), file=sys.stderr)
    if 'procedural_unknowns' in report:
        print(ood_summary(report), file=sys.stderr)
    print_json_report(report, args.out)
    return 0
