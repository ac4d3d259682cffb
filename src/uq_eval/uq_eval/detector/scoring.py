"""Scoring shared by the detector evaluations (``uq eval detector``, ``uq eval detector-gp``,
procedural unknowns): detections matched to annotated objects, how many objects are
detected, uncertainty signals per detection, AUROCs that are undefined for one-class
labels, the table of every score beside the GP, and the JSON report."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from uq_eval.gp.fitting import ObjectFeatures
    from uq_perception.detectors.contract import Detections
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


def detected_objects(split: DetectionSplit, loose: Sequence[Detections],
                     operating: Sequence[Detections]) -> dict[str, int]:
    """Not-ignored known and unknown objects of ``split``, and how many of each a detection
    matches (IoU >= 0.5): at all (``loose``: detections down to the AP threshold) and at
    the node's operating point (``operating``)."""
    counts = {f'{kind}{what}': 0 for kind in ('known', 'unknown')
              for what in ('', '_detected', '_detected_at_operating_threshold')}
    for i in range(len(split)):
        counted, unknown = ~split.hard(i), split.labels[i] < 0
        counts['known'] += int((counted & ~unknown).sum())
        counts['unknown'] += int((counted & unknown).sum())
    for what, detections in (('_detected', loose),
                             ('_detected_at_operating_threshold', operating)):
        for i, _, obj_index in matched_objects(split, detections):
            unknown = split.labels[i][obj_index] < 0
            counts[f'known{what}'] += int((~unknown).sum())
            counts[f'unknown{what}'] += int(unknown.sum())
    return counts


def ood_score_table(gp: LastLayerNTKGP, activation: str, reference: ObjectFeatures,
                    embeddings: np.ndarray, logits: np.ndarray, labels: np.ndarray
                    ) -> list[dict[str, Any]]:
    """AUROC and FPR95, unknown (``labels`` < 0) against known detections, of every score
    ``uq gp fit`` reports (:func:`uq_eval.gp.fitting.ood_score_rows`), the feature-space
    baselines fitted on the ``reference`` known objects."""
    from uq_eval.gp.fitting import ObjectFeatures, ood_score_rows

    unknown = labels < 0
    return ood_score_rows(gp, activation, reference.features, reference.labels,
                          ObjectFeatures(embeddings[~unknown], logits[~unknown],
                                         labels[~unknown]),
                          ObjectFeatures(embeddings[unknown], logits[unknown], labels[unknown]))


def print_json_report(report: dict[str, Any], out: Path | None) -> None:
    """Print the report as JSON on stdout and, given ``out``, write the same text there."""
    text = json.dumps(report, indent=1)
    print(text)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + '\n')
