"""Held-out procedural unknown objects for ``uq eval detector --procedural-unknowns N``.

Renders ``N`` tabletop scenes, each with one procedurally generated unknown object
(:mod:`uq_sim.procedural_objects`: random convex hulls, superquadrics and unions of
primitives, families taking turns) among 1-4 known objects, and scores them as the fixed
``test_unknown`` split is scored (``detector_eval.evaluate_uncertainty``): detections above
the operating threshold are matched to objects at IoU >= 0.5, occluded, truncated and tiny
objects are ignored, and the OOD AUROC compares the matched detections of unknown objects
with those of the known objects of the same images. A procedural object that no detection
matches is a *miss*: it counts against the recall and in ``missed``, and it is not part of
the AUROC, which scores detections only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from uq_eval.gp.fitting import ObjectFeatures
    from uq_perception.detectors.contract import DetectorContract
    from uq_perception.ntk import LastLayerNTKGP
    from uq_perception.training.detector_data import DetectionSplit

from uq_perception.training.detection_scoring import (
    AP_MAX_DETECTIONS,
    AP_SCORE_THRESHOLD,
    OPERATING_MAX_DETECTIONS,
    OPERATING_THRESHOLD,
    detect_split,
    rounded,
)


def check_procedural_classes(class_names: Sequence[str]) -> None:
    """Procedural scenes hold the simulator's known classes; a detector of others is
    refused.

    Raises
    ------
    ValueError
        Naming both lists.
    """
    from uq_sim.objects import KNOWN_CLASSES

    if list(class_names) != list(KNOWN_CLASSES):
        raise ValueError(f'procedural scenes hold the simulator\'s known classes '
                         f'{list(KNOWN_CLASSES)}; the model has {list(class_names)}')


def render_procedural_split(count: int, seed: int, input_size: tuple[int, int],
                            class_names: Sequence[str], progress: bool = False
                            ) -> DetectionSplit:
    """``count`` procedural scenes rendered at the detector's ``(height, width)``.

    Raises
    ------
    ValueError
        If ``count`` is out of range, ``seed`` is negative, or ``class_names`` are not the
        simulator's known classes.
    """
    from tqdm import tqdm

    from uq_perception.training.detector_data import DetectionSplit
    from uq_sim.objects import KNOWN_CLASSES, PROCEDURAL_CLASSES, category_id
    from uq_sim.procedural_scenes import MAX_PROCEDURAL_OBJECTS, render_procedural_example
    from uq_sim.scene import SceneRenderer

    if not 1 <= count <= MAX_PROCEDURAL_OBJECTS:
        raise ValueError(f'the number of procedural objects must be 1..{MAX_PROCEDURAL_OBJECTS}'
                         f', got {count}')
    if seed < 0:
        raise ValueError(f'the procedural seed must be >= 0, got {seed}')
    check_procedural_classes(class_names)
    height, width = input_size
    images = np.empty((count, height, width, 3), dtype=np.uint8)
    boxes, labels, categories, flags = [], [], [], []
    with SceneRenderer(width, height) as renderer:
        for index in tqdm(range(count), desc='render procedural unknowns', unit='scene',
                          disable=not progress):
            images[index], annotations = render_procedural_example(renderer, seed, index)
            xywh = np.array([a.bbox for a in annotations], dtype=np.float32).reshape(-1, 4)
            boxes.append(np.concatenate([xywh[:, :2] + xywh[:, 2:] / 2, xywh[:, 2:]], axis=1))
            labels.append(np.array([KNOWN_CLASSES.index(a.class_name) if a.known else -1
                                    for a in annotations], dtype=np.int64))
            categories.append(np.array([a.category_id for a in annotations], dtype=np.int64))
            flags.append(np.array([(a.occluded, a.truncated) for a in annotations],
                                  dtype=bool).reshape(-1, 2))
    return DetectionSplit(
        name=f'procedural_unknowns_seed{seed}', images=images,
        image_ids=np.arange(count, dtype=np.int64), boxes=boxes, labels=labels,
        category_ids=categories, occluded=[f[:, 0] for f in flags],
        truncated=[f[:, 1] for f in flags],
        auxiliary=[np.zeros(len(f), dtype=bool) for f in flags],
        class_names=list(KNOWN_CLASSES),
        category_names={category_id(n): n for n in KNOWN_CLASSES + PROCEDURAL_CLASSES})


def evaluate_procedural_unknowns(detector: DetectorContract, gp: LastLayerNTKGP, count: int,
                                 seed: int, image_size: tuple[int, int],
                                 score_threshold: float = OPERATING_THRESHOLD,
                                 max_detections: int = OPERATING_MAX_DETECTIONS,
                                 progress: bool = False,
                                 reference: ObjectFeatures | None = None) -> dict[str, Any]:
    """Recall, misses, detection counts and known-vs-unknown AUROCs on ``count``
    procedural objects rendered at ``image_size`` ``(height, width)``; with the
    ``reference`` known objects of the post-hoc scores, every score of ``uq gp fit`` on the
    same detections (``ood_scores``).

    Raises
    ------
    ValueError
        As :func:`render_procedural_split`.
    """
    from uq_eval.detector.scoring import (
        UNCERTAINTY_SIGNALS,
        append_uncertainty_signals,
        detected_objects,
        matched_objects,
        ood_score_table,
        safe_auroc,
    )
    from uq_sim.objects import PROCEDURAL_CLASSES

    split = render_procedural_split(count, seed, image_size, detector.class_names,
                                    progress=progress)
    dets = detect_split(detector, split, score_threshold, max_detections, progress)
    found: dict[str, list[bool]] = {name: [] for name in PROCEDURAL_CLASSES}
    ignored = 0
    signals: dict[str, list[float]] = {name: [] for name in UNCERTAINTY_SIGNALS}
    is_unknown: list[bool] = []
    family: list[str] = []
    embeddings: list[np.ndarray] = []
    logits: list[np.ndarray] = []
    matched_label: list[int] = []
    for i, det_index, obj_index in matched_objects(split, dets):
        unknown, hard = split.labels[i] < 0, split.hard(i)
        hit = np.zeros(len(hard), dtype=bool)
        hit[obj_index] = True
        for k in np.flatnonzero(unknown):
            if hard[k]:
                ignored += 1
            else:
                found[split.category_names[int(split.category_ids[i][k])]].append(bool(hit[k]))
        if det_index.size == 0:
            continue
        append_uncertainty_signals(signals, gp, dets[i].embeddings[det_index],
                                   dets[i].logits[det_index])
        is_unknown += unknown[obj_index].tolist()
        family += [split.category_names[int(c)] for c in split.category_ids[i][obj_index]]
        embeddings.append(dets[i].embeddings[det_index])
        logits.append(dets[i].logits[det_index])
        matched_label += split.labels[i][obj_index].tolist()
    labels = np.array(is_unknown, dtype=bool)
    scored = [hit for hits in found.values() for hit in hits]
    gp_variance, family_array = np.array(signals['gp_variance']), np.array(family)
    result: dict[str, Any] = {
        'objects': count,
        'seed': seed,
        'score_threshold': score_threshold,
        # Procedural objects that are neither occluded nor truncated but too small to judge.
        'ignored': ignored,
        'unknown_recall': rounded(float(np.mean(scored))) if scored else None,
        'unknown_recall_per_family': {name: rounded(float(np.mean(hits))) if hits else None
                                      for name, hits in found.items()},
        'missed': int(len(scored) - sum(scored)),
        'missed_per_family': {name: len(hits) - sum(hits) for name, hits in found.items()},
        'ood_matched_known': int((~labels).sum()),
        'ood_matched_unknown': int(labels.sum()),
        'auroc_unknown': {name: safe_auroc(np.array(v), labels) for name, v in signals.items()},
        'auroc_unknown_gp_variance_per_family': {
            name: safe_auroc(gp_variance[~labels | (family_array == name)],
                              labels[~labels | (family_array == name)])
            for name in PROCEDURAL_CLASSES},
        'detected_objects': detected_objects(
            split, detect_split(detector, split, AP_SCORE_THRESHOLD, AP_MAX_DETECTIONS,
                                progress), dets),
    }
    if reference is not None and labels.any() and (~labels).any():
        result['ood_scores'] = ood_score_table(
            gp, detector.class_activation, reference, np.concatenate(embeddings),
            np.concatenate(logits), np.array(matched_label, dtype=np.int64))
    if gp.ood_threshold is not None and labels.size:
        flagged = gp_variance > gp.ood_threshold
        result['ood_flag_rate_known'] = rounded(float(flagged[~labels].mean())) \
            if (~labels).any() else None
        result['ood_flag_rate_unknown'] = rounded(float(flagged[labels].mean())) \
            if labels.any() else None
        # End to end: procedural objects both detected and flagged, out of all scored ones
        # (a miss counts as not flagged).
        result['flagged_of_all_unknown'] = rounded(float(flagged[labels].sum()) / len(scored)) \
            if scored else None
    return result


def procedural_count_argument(text: str) -> int:
    """argparse type of ``--procedural-unknowns``: an integer in 1..MAX_PROCEDURAL_OBJECTS."""
    import argparse

    from uq_sim.procedural_scenes import MAX_PROCEDURAL_OBJECTS

    try:
        count = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f'expected a whole number, got {text!r}') from None
    if not 1 <= count <= MAX_PROCEDURAL_OBJECTS:
        raise argparse.ArgumentTypeError(
            f'the number of procedural objects must be 1..{MAX_PROCEDURAL_OBJECTS} (one scene '
            f'each), got {count}')
    return count


def procedural_seed_argument(text: str) -> int:
    """argparse type of ``--procedural-seed``: an integer >= 0."""
    import argparse

    try:
        seed = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f'expected a whole number, got {text!r}') from None
    if seed < 0:
        raise argparse.ArgumentTypeError(f'the seed must be >= 0, got {seed}')
    return seed


def ood_summary(report: dict[str, Any]) -> str:
    """One line comparing the GP-variance OOD AUROC of the fixed and procedural unknowns."""
    fixed, procedural = report['uncertainty'], report['procedural_unknowns']
    scored = procedural['objects'] - procedural['ignored']
    return (f"GP-variance OOD AUROC: fixed unknown set {fixed['auroc_unknown']['gp_variance']} "
            f"({fixed['ood_matched_unknown']} unknown vs {fixed['ood_matched_known']} known "
            f"detections); procedural unknowns {procedural['auroc_unknown']['gp_variance']} "
            f"({procedural['ood_matched_unknown']} vs {procedural['ood_matched_known']}, "
            f"seed {procedural['seed']}); procedural objects missed: {procedural['missed']} "
            f"of {scored}")
