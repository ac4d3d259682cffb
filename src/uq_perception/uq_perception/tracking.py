"""Greedy IoU tracking of detections across frames (ROS-free).

Track identities let the arbitration and ask-for-help logic follow one object over time.
Matching is greedy by IoU (highest first), which is adequate at camera rate where objects
move little between frames; unmatched detections start new tracks and tracks unseen for
``max_missed`` frames are dropped.
"""

from __future__ import annotations

import math

import numpy as np


class IoUTracker:
    """Assigns persistent integer track ids to boxes, frame by frame.

    Parameters
    ----------
    iou_threshold : float
        Minimum IoU between a track's last box and a detection to continue the track.
    max_missed : int
        Frames a track survives without a matching detection.

    The tracker works on plain Python floats: with the handful of boxes of a camera frame,
    NumPy's per-call cost exceeds the arithmetic (docs/performance.md).
    """

    def __init__(self, iou_threshold: float = 0.3, max_missed: int = 5) -> None:
        if not 0.0 < iou_threshold <= 1.0:
            raise ValueError(f'iou_threshold must be in (0, 1], got {iou_threshold}')
        if max_missed < 0:
            raise ValueError(f'max_missed must be >= 0, got {max_missed}')
        self.iou_threshold = iou_threshold
        self.max_missed = max_missed
        # Per track: its last box as corners and area, its id and frames missed since.
        self._tracks: list[tuple[tuple[float, float, float, float, float], int, int]] = []
        self._next_id = 0

    def reset(self) -> None:
        """Forget every track (ids keep increasing so they are never reused)."""
        self._tracks = []

    def update(self, boxes: np.ndarray) -> np.ndarray:
        """Match this frame's ``(K, 4)`` boxes to tracks; returns ``(K,)`` track ids.

        Boxes are ``center_x, center_y, width, height``.
        """
        corners = []
        for cx, cy, w, h in np.asarray(boxes, dtype=np.float64).reshape(-1, 4).tolist():
            if not (math.isfinite(cx) and math.isfinite(cy) and math.isfinite(w)
                    and math.isfinite(h)) or w < 0 or h < 0:
                raise ValueError('boxes must be finite with non-negative width and height')
            corners.append((cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2, w * h))
        # Pairs at or above the threshold, matched greedily, highest IoU first (ties in
        # track, then detection order).
        pairs = []
        for t, ((tx1, ty1, tx2, ty2, track_area), _, _) in enumerate(self._tracks):
            for d, (x1, y1, x2, y2, area) in enumerate(corners):
                width, height = min(tx2, x2) - max(tx1, x1), min(ty2, y2) - max(ty1, y1)
                if width <= 0.0 or height <= 0.0:
                    continue
                inter = width * height
                iou = inter / (track_area + area - inter)
                if iou >= self.iou_threshold:
                    pairs.append((-iou, t, d))
        pairs.sort()
        ids = [-1] * len(corners)
        matched = [False] * len(self._tracks)
        for _, t, d in pairs:
            if not matched[t] and ids[d] < 0:
                ids[d] = self._tracks[t][1]
                matched[t] = True
        for d, track_id in enumerate(ids):
            if track_id < 0:
                ids[d] = self._next_id
                self._next_id += 1
        kept = [(box, track_id, missed + 1)
                for (box, track_id, missed), done in zip(self._tracks, matched, strict=True)
                if not done and missed < self.max_missed]
        self._tracks = [(box, track_id, 0)
                        for box, track_id in zip(corners, ids, strict=True)] + kept
        return np.array(ids, dtype=np.int64)
