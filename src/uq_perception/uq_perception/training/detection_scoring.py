"""Detection scoring on simulator splits (ROS-free): predictions at the operating and AP
thresholds, COCO-style AP@0.5 per class. Training uses it to check a model on its
validation split; ``uq eval detector`` (``uq_eval.detector.evaluation``) reports it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from uq_perception.detectors.centernet import CenterNetDetector, Detections
    from uq_perception.detectors.contract import DetectorContract
    from uq_perception.ntk import LastLayerNTKGP
    from uq_perception.training.detector_data import DetectionSplit

IOU_THRESHOLD = 0.5
# AP needs the whole precision-recall curve, so it is computed from low-score detections.
AP_SCORE_THRESHOLD = 0.05
AP_MAX_DETECTIONS = 50
OPERATING_THRESHOLD = 0.3
OPERATING_MAX_DETECTIONS = 20


def predict_split(model: CenterNetDetector, split: DetectionSplit, score_threshold: float,
                  max_detections: int, batch_size: int = 16, progress: bool = False
                  ) -> list[Detections]:
    """Run the detector over every image of a split (batched)."""
    import torch
    from tqdm import tqdm

    from uq_perception.training.detector_data import images_to_tensor

    was_training = model.training
    model.eval()
    result: list[Detections] = []
    try:
        with torch.no_grad():
            for start in tqdm(range(0, len(split), batch_size), desc=f'detect {split.name}',
                              unit='batch', disable=not progress):
                images = images_to_tensor(split.images[start:start + batch_size])
                result += model.decode(model(images), score_threshold, max_detections)
    finally:
        model.train(was_training)
    return result


def detect_split(detector: DetectorContract, split: DetectionSplit, score_threshold: float,
                 max_detections: int, progress: bool = False) -> list[Detections]:
    """Run a contract detector over every image of a split, one frame at a time as on the
    robot (:meth:`~uq_perception.detectors.contract.DetectorContract.infer`: the detector
    resizes each image itself; boxes come back in the split's pixels)."""
    from tqdm import tqdm

    return [detector.infer(image, score_threshold, max_detections)
            for image in tqdm(split.images, desc=f'detect {split.name}', unit='image',
                              disable=not progress)]


def _class_probabilities(dets: Detections, gp: LastLayerNTKGP | None,
                         activation: str = 'softmax') -> np.ndarray:
    if gp is not None:
        return gp.predict(dets.embeddings, dets.logits).probabilities
    if activation == 'sigmoid':
        return 0.5 * (1.0 + np.tanh(0.5 * np.asarray(dets.logits, np.float64)))
    z = dets.logits - dets.logits.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def average_precision_per_class(split: DetectionSplit, detections: Sequence[Detections],
                                gp: LastLayerNTKGP | None = None,
                                ignore_hard: bool = True,
                                activation: str = 'softmax') -> dict[str, float]:
    """AP@0.5 of every known class over a split (see the module docstring); without ``gp``
    the class probabilities are the logits' ``activation`` (``softmax`` or ``sigmoid``)."""
    from uq_perception.training.detection_metrics import average_precision, match_detections

    num_classes = len(split.class_names)
    scores: list[list[float]] = [[] for _ in range(num_classes)]
    hits: list[list[bool]] = [[] for _ in range(num_classes)]
    num_gt = np.zeros(num_classes, dtype=np.int64)
    for i, dets in enumerate(detections):
        probs = _class_probabilities(dets, gp, activation) if len(dets) else np.zeros(
            (0, num_classes))
        predicted = probs.argmax(axis=1)
        confidence = dets.scores * probs.max(axis=1) if len(dets) else np.zeros(0)
        hard = split.hard(i) if ignore_hard else np.zeros(len(split.boxes[i]), dtype=bool)
        for c in range(num_classes):
            gt = split.labels[i] == c
            num_gt[c] += int((gt & ~hard).sum())
            mine = predicted == c
            if not mine.any():
                continue
            matched, ignored = match_detections(dets.boxes[mine], confidence[mine],
                                                split.boxes[i][gt], IOU_THRESHOLD, hard[gt])
            keep = ~ignored
            scores[c] += confidence[mine][keep].tolist()
            hits[c] += (matched[keep] >= 0).tolist()
    return {name: average_precision(np.array(scores[c]), np.array(hits[c], dtype=bool),
                                    int(num_gt[c]))
            for c, name in enumerate(split.class_names)}


def evaluate_detection(model: CenterNetDetector, split: DetectionSplit,
                       gp: LastLayerNTKGP | None = None, progress: bool = False
                       ) -> dict[str, Any]:
    """AP@0.5 per class and mean, with and without ignoring hard objects."""
    detections = predict_split(model, split, AP_SCORE_THRESHOLD, AP_MAX_DETECTIONS,
                               progress=progress)
    return detection_report(split, detections, gp)


def detection_report(split: DetectionSplit, detections: Sequence[Detections],
                     gp: LastLayerNTKGP | None = None, activation: str = 'softmax'
                     ) -> dict[str, Any]:
    """:func:`evaluate_detection`'s report of detections already made (at
    :data:`AP_SCORE_THRESHOLD`, at most :data:`AP_MAX_DETECTIONS` per image)."""
    per_class = average_precision_per_class(split, detections, gp, ignore_hard=True,
                                            activation=activation)
    all_objects = average_precision_per_class(split, detections, gp, ignore_hard=False,
                                              activation=activation)
    return {
        'ap50_mean': nanmean_or_none(per_class.values()),
        'ap50_per_class': {k: rounded(v) for k, v in per_class.items()},
        'ap50_all_objects_mean': nanmean_or_none(all_objects.values()),
        'images': len(split),
        'objects': split.num_objects,
        'ignored_objects': int(sum(split.hard(i).sum() for i in range(len(split)))),
    }


def nanmean_or_none(values: Any) -> float | None:
    """Mean of the finite values, rounded for a report; ``None`` when all are NaN."""
    array = np.array(list(values), dtype=np.float64)
    return None if np.all(np.isnan(array)) else rounded(float(np.nanmean(array)))


def rounded(value: float | None, digits: int = 4) -> float | None:
    """``value`` rounded for a report; ``None`` for a missing or non-finite value."""
    return None if value is None or not np.isfinite(value) else round(float(value), digits)
