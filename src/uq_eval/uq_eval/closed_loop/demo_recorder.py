"""The demo's recorder: what the closed loop shows and says.

Thin ROS adapter on the closed-loop harness's node (:class:`uq_eval.closed_loop.loop.
LoopObserver`): it adds subscriptions to the ground truth, the detections, the detector's
overlay and the ask-for-help node's ``help_request``, and snapshots the loop (level,
blend, operator speed, task) as each overlay frame arrives. The answers are read
afterwards from the ask-for-help node's label store, where each accepted one is recorded
with its time (:meth:`DemoRecorder.read_answers`). Scoring and drawing are in the ROS-free
:mod:`uq_eval.closed_loop.demo_report`.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
from rclpy.qos import (
    DurabilityPolicy,
    HistoryPolicy,
    QoSProfile,
    ReliabilityPolicy,
    qos_profile_sensor_data,
)
from sensor_msgs.msg import Image

from uq_common.image_codec import image_to_rgb
from uq_eval.closed_loop.demo_report import HelpEvent, LoopSnapshot, RecordedFrame, match_object
from uq_msgs.msg import DetectionArray, HelpRequest

GIF_FPS = 5.0
_RELIABLE = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=200,
                       reliability=ReliabilityPolicy.RELIABLE,
                       durability=DurabilityPolicy.VOLATILE)
# As the ask-for-help node publishes them: a late subscriber still gets the open requests.
_REQUESTS = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=100,
                       reliability=ReliabilityPolicy.RELIABLE,
                       durability=DurabilityPolicy.TRANSIENT_LOCAL)


def _stamp_s(msg) -> float:
    return msg.header.stamp.sec + msg.header.stamp.nanosec * 1e-9


def _boxes(msg: DetectionArray) -> np.ndarray:
    return np.array([[d.center_x, d.center_y, d.width, d.height] for d in msg.detections],
                    dtype=float).reshape(-1, 4)


def _names(truth: DetectionArray) -> list[str]:
    return [f'{d.class_id}_{d.track_id}' for d in truth.detections]


class DemoRecorder:
    """Records the demo on ``observer``'s node."""

    def __init__(self, observer) -> None:
        self._observer = observer
        self._lock = threading.Lock()
        # The ROS clock (system time) stamps images; the harness measures on the steady
        # clock. Both run on this machine: one offset converts stamps.
        self._stamp_to_mono = time.monotonic() - time.time()
        self.origin = time.monotonic()
        self.truth: dict[float, DetectionArray] = {}
        self.detections: dict[float, tuple[DetectionArray, float]] = {}
        self.overlays: list[tuple[float, np.ndarray, LoopSnapshot]] = []
        self.help_events: list[HelpEvent] = []
        node = observer.node
        node.create_subscription(DetectionArray, 'ground_truth',
                                 lambda m: self._store(self.truth, m), _RELIABLE)
        node.create_subscription(DetectionArray, 'detections', self._on_detections, _RELIABLE)
        node.create_subscription(Image, 'overlay', self._on_overlay, qos_profile_sensor_data)
        node.create_subscription(HelpRequest, 'help_request', self._on_help, _REQUESTS)

    def stamp_time(self, stamp: float) -> float:
        """An image stamp as seconds since ``origin`` (the harness's steady clock)."""
        return stamp + self._stamp_to_mono - self.origin

    def now(self) -> float:
        return time.monotonic() - self.origin

    def rebase(self, shift: float | None = None) -> None:
        """Move time zero ``shift`` seconds later (default: to now); earlier records go
        negative."""
        with self._lock:
            shift = time.monotonic() - self.origin if shift is None else shift
            self.origin += shift
            for e in self.help_events:
                e.t, e.image_t = e.t - shift, e.image_t - shift
                if e.answered_t is not None:
                    e.answered_t -= shift
            self.overlays = [(t - shift, rgb, snap) for t, rgb, snap in self.overlays]
            for _, _, snap in self.overlays:
                snap.t -= shift

    def _store(self, table: dict, msg: DetectionArray) -> None:
        with self._lock:
            table[_stamp_s(msg)] = msg

    def _on_detections(self, msg: DetectionArray) -> None:
        latency_ms = 1e3 * (self.now() - self.stamp_time(_stamp_s(msg)))
        with self._lock:
            self.detections[_stamp_s(msg)] = (msg, latency_ms)

    def _snapshot(self) -> LoopSnapshot:
        o = self._observer
        with o._lock:
            return LoopSnapshot(self.now(), o.level, o.alpha, o.speeds['operator'],
                                str(o.task.get('status', '')),
                                float(o.task.get('elapsed_s', -1.0)))

    def _on_overlay(self, msg: Image) -> None:
        t = self.stamp_time(_stamp_s(msg))
        with self._lock:
            if self.overlays and t - self.overlays[-1][0] < 1.0 / GIF_FPS:
                return
        rgb = image_to_rgb(msg.height, msg.width, msg.encoding, msg.step, msg.data)
        snapshot = self._snapshot()
        with self._lock:
            self.overlays.append((t, rgb, snapshot))

    def _on_help(self, msg: HelpRequest) -> None:
        d = msg.detection
        box = (d.center_x, d.center_y, d.width, d.height)
        stamp = _stamp_s(msg)
        with self._lock:
            truth = self.truth.get(stamp)
            if truth is None and self.truth:  # its frame's ground truth not (yet) here
                truth = self.truth[min(self.truth, key=lambda s: abs(s - stamp))]
        event = HelpEvent(msg.request_id, self.now(), self.stamp_time(stamp), box,
                          d.class_id, list(msg.candidate_labels), msg.reason)
        if truth is not None:
            event.true_object = match_object(box, _names(truth), _boxes(truth))
        with self._lock:
            self.help_events.append(event)

    def read_answers(self, store_path: Path) -> None:
        """Fill in each request's answer from the label store (after the run)."""
        from uq_autonomy.labels.store import LabelStore

        if not store_path.exists():
            return
        store = LabelStore(store_path, readonly=True)
        try:
            records = {r.request_id: r for r in store.labels()}
        finally:
            store.close()
        wall_to_mono = time.monotonic() - time.time()
        with self._lock:
            for event in self.help_events:
                record = records.get(event.request_id)
                if record is not None:
                    event.answer, event.accepted = record.label, True
                    event.message = f'stored, labeller {record.labeler!r}'
                    event.answered_t = record.time + wall_to_mono - self.origin

    def frames(self, start_t: float) -> list[RecordedFrame]:
        """Frames seen by both the ground truth and the detector from ``start_t`` on."""
        with self._lock:
            common = sorted(s for s in set(self.truth) & set(self.detections)
                            if self.stamp_time(s) >= start_t)
            pairs = [(s, self.truth[s], *self.detections[s]) for s in common]
        out = []
        for stamp, truth, det, latency_ms in pairs:
            out.append(RecordedFrame(
                time_s=self.stamp_time(stamp), truth_names=_names(truth),
                truth_known=[d.class_index >= 0 for d in truth.detections],
                truth_boxes=_boxes(truth), det_boxes=_boxes(det),
                det_variance=np.array([d.uncertainty.gp_variance for d in det.detections]),
                det_class=[d.class_id for d in det.detections],
                det_ood=np.array([d.uncertainty.out_of_distribution for d in det.detections]),
                latency_ms=latency_ms))
        return out
