"""Scoring shared by the detector evaluations (``uq eval detector``, ``uq eval detector-gp``,
procedural unknowns): detections matched to annotated objects, uncertainty signals per
detection, AUROCs that are undefined for one-class labels, and the JSON report."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from uq_perception.detectors.centernet import Detections
    from uq_perception.ntk import LastLayerNTKGP
    from uq_perception.training.detector_data import DetectionSplit

from uq_perception.training.detection_scoring import IOU_THRESHOLD, rounded


def matched_objects(split: DetectionSplit, detections: Sequence[Detections]
                     ) -> list[tuple[int, np.ndarray, np.ndarray]]:
    """Per image: (image index, detection indices, matched object indices), not-ignored only."""
    from uq_perception.training.detection_metrics import match_detections

    out = []
    for i, dets in enumerate(detections):
        hard = split.hard(i)
        matched, ignored = match_detections(dets.boxes, dets.scores, split.boxes[i],
                                            IOU_THRESHOLD, hard)
        keep = (matched >= 0) & ~ignored
        out.append((i, np.flatnonzero(keep), matched[keep]))
    return out


def value_spread(values: np.ndarray) -> dict[str, float | None] | None:
    if values.size == 0:
        return None
    return {'mean': rounded(float(values.mean())), 'std': rounded(float(values.std())),
            'min': rounded(float(values.min())), 'max': rounded(float(values.max()))}


def safe_auroc(scores: np.ndarray, labels: np.ndarray) -> float | None:
    from uq_perception.training.metrics import auroc

    if labels.size == 0 or labels.all() or not labels.any():
        return None
    return rounded(auroc(scores, labels))


UNCERTAINTY_SIGNALS = ('gp_variance', 'mutual_information', 'predictive_entropy',
                       'max_softmax')


def append_uncertainty_signals(signals: dict[str, list[float]], gp: LastLayerNTKGP,
                               embeddings: np.ndarray, logits: np.ndarray) -> None:
    """Append each detection's score under every :data:`UNCERTAINTY_SIGNALS` name (higher:
    more uncertain; max-softmax as one minus the top probability)."""
    out = gp.predict(embeddings, logits)
    signals['gp_variance'] += out.gp_variance.tolist()
    signals['mutual_information'] += out.mutual_information.tolist()
    signals['predictive_entropy'] += out.predictive_entropy.tolist()
    z = np.exp(logits - logits.max(axis=1, keepdims=True))
    signals['max_softmax'] += (1.0 - z.max(axis=1) / z.sum(axis=1)).tolist()


def print_json_report(report: dict[str, Any], out: Path | None) -> None:
    """Print the report as JSON on stdout and, given ``out``, write the same text there."""
    text = json.dumps(report, indent=1)
    print(text)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + '\n')
