"""The perception pipeline: detector backend + NTK-GP uncertainty + tracking (ROS-free).

One call per camera frame: the backend detects, the GP attaches to each detection's
embedding and logits (and, through its box calibration, a standard deviation to each box
coordinate), the tracker assigns ids, and each track's evidence pools its calibrated scores
over the object's views (:mod:`uq_perception.track_evidence`). Where the backend computed
each detection's GP variance with the network (the CUDA graph), the GP reads it instead of
querying again.
Each stage's time is kept in the frame's result, from cheap monotonic clock reads. The
detector node adapts this to ROS; the benchmarks and evaluators use it directly, so what is
measured is what the node runs.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from uq_perception.box_uncertainty import box_std, cell_size
from uq_perception.detectors.contract import Detections, DetectorContract
from uq_perception.duplicate_suppression import DuplicateSuppression
from uq_perception.ntk import LastLayerNTKGP, UncertaintyOutput
from uq_perception.track_evidence import TrackEvidence, TrackScores
from uq_perception.tracking import IoUTracker


@dataclass(frozen=True)
class FrameResult:
    """Everything known about one frame's detections (arrays aligned on detections).

    Attributes
    ----------
    detections
        Boxes (pixels), objectness, embeddings and logits.
    uncertainty
        The NTK-GP outputs per detection.
    track_ids
        ``(K,)`` persistent object ids.
    class_names
        The GP's classes (it may have learnt classes the network head lacks).
    inference_ms
        Wall time of detection, uncertainty and tracking for this frame.
    forward_ms
        The part of it in the backend's call (preprocess, network forward, decode): what
        the detector costs without uncertainty, the reference for the node's overhead.
    box_std
        ``(K, 4)`` float32 standard deviation of ``center_x, center_y, width, height`` in
        pixels (``uq_perception.box_uncertainty``); zeros when the GP state has no box
        calibration.
    reference_variance_max
        The model's range of raw GP variance: the largest variance of the known validation
        objects behind ``uncertainty.calibrated_score``; ``None`` without a score reference.
    ood_threshold
        The GP variance above which a detection is flagged out of distribution; ``None``
        when the GP has none.
    resize_ms
        The part of ``forward_ms`` spent resizing and normalising the image on the host
        (NaN where the backend does not time it apart).
    gp_ms
        The GP's summaries and the box standard deviations.
    tracking_ms
        Duplicate suppression, tracking and the tracks' evidence.
    track_scores
        Each detection's track evidence (mean calibrated score over its track's views);
        ``None`` when the pipeline keeps none.
    """

    detections: Detections
    uncertainty: UncertaintyOutput
    track_ids: np.ndarray
    class_names: list[str]
    inference_ms: float
    forward_ms: float
    box_std: np.ndarray
    reference_variance_max: float | None = None
    ood_threshold: float | None = None
    resize_ms: float = math.nan
    gp_ms: float = math.nan
    tracking_ms: float = math.nan
    track_scores: TrackScores | None = None

    def __len__(self) -> int:
        return len(self.detections)

    def most_uncertain(self) -> int | None:
        """Index of the detection with the largest GP variance (None when empty)."""
        if len(self) == 0:
            return None
        return int(np.argmax(self.uncertainty.gp_variance))


# The node's defaults (config/detector.yaml), so evaluators run what the node runs.
_DEFAULT_DUPLICATES = DuplicateSuppression()


class UncertaintyPerception:
    """Detect, attach NTK-GP uncertainty, track.

    Parameters
    ----------
    backend
        Runs the detector network: any detector of the contract (the shipped model's
        backends, an ONNX detector).
    gp
        The NTK-GP fitted on the detector's features ``phi`` (same feature dimension).
    score_threshold, max_detections
        Objectness cut and cap per frame.
    tracker
        Track-id assignment; ``None`` gives every detection id -1.
    duplicates
        Class-agnostic suppression of duplicate boxes of one object, applied to the
        detector's output before anything else sees it; ``None`` keeps every detection.
    evidence
        Pools each track's calibrated scores over its views (needs ``tracker`` and a stamp
        per frame); ``None``: no track evidence.
    """

    def __init__(self, backend: DetectorContract, gp: LastLayerNTKGP,
                 score_threshold: float = 0.3, max_detections: int = 20,
                 tracker: IoUTracker | None = None,
                 duplicates: DuplicateSuppression | None = _DEFAULT_DUPLICATES,
                 evidence: TrackEvidence | None = None) -> None:
        if backend.feature_dim != gp.feature_dim:
            raise ValueError(
                f'detector feature dimension {backend.feature_dim} does not match '
                f'the GP feature dimension {gp.feature_dim}: the GP was fitted for another '
                'model')
        self.backend = backend
        self.gp = gp
        self.score_threshold = score_threshold
        self.max_detections = max_detections
        self.tracker = tracker
        self.duplicates = duplicates
        self.evidence = evidence

    def process(self, image_rgb: np.ndarray, stamp: float | None = None) -> FrameResult:
        """Run the pipeline on one ``(H, W, 3)`` uint8 RGB image taken at ``stamp``
        (seconds, the image's stamp: the track evidence's clock).

        Raises
        ------
        ValueError
            When the pipeline keeps track evidence and ``stamp`` is missing, or an input is
            invalid.
        """
        if self.evidence is not None and stamp is None:
            raise ValueError('track evidence needs the stamp of each frame')
        start = time.perf_counter()
        detections = self.backend.infer(image_rgb, self.score_threshold, self.max_detections)
        forward_end = time.perf_counter()
        gp_output = self.backend.device_gp_output()
        if self.duplicates is not None and len(detections) > 1:
            keep = self.duplicates.keep(detections.boxes, detections.scores)
            if not keep.all():
                detections = Detections(detections.boxes[keep], detections.scores[keep],
                                        detections.embeddings[keep], detections.logits[keep])
                if gp_output is not None:
                    gp_output = (gp_output[0][keep], gp_output[1][keep])
        gp_start = time.perf_counter()
        # The GP's head can have grown classes through online labels; its logits are the
        # ones that match its class list.
        uncertainty = self.gp.predict(detections.embeddings, gp_output=gp_output)
        stds = box_std(detections.boxes, uncertainty.gp_variance, self.gp.box_calibration,
                       cell_size(self.backend.input_size, image_rgb.shape[:2]))
        gp_end = time.perf_counter()
        if self.tracker is not None:
            track_ids = self.tracker.update(detections.boxes)
        else:
            track_ids = np.full(len(detections), -1, dtype=np.int64)
        track_scores = None
        if self.evidence is not None and stamp is not None:
            calibrated = uncertainty.calibrated_score
            track_scores = self.evidence.update(
                stamp, track_ids, uncertainty.probabilities.argmax(axis=1), detections.boxes,
                np.full(len(detections), -1.0) if calibrated is None else calibrated,
                detections.embeddings)
        reference = self.gp.score_reference
        end = time.perf_counter()
        return FrameResult(detections, uncertainty, track_ids, list(self.gp.class_names),
                           (end - start) * 1e3, (forward_end - start) * 1e3,
                           stds, None if reference is None else reference.maximum,
                           self.gp.ood_threshold, self.backend.preprocess_ms,
                           (gp_end - gp_start) * 1e3,
                           (gp_start - forward_end + end - gp_end) * 1e3, track_scores)
