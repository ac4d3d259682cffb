"""Offline bag evaluation: what the perception, the arbiter and the ask-for-help policy
would have done on a recorded run, and how good the uncertainty was (ROS-free core).

:class:`BagEvaluator` takes a bag's events one at a time (:mod:`uq_eval.bags.reader`):

- each image goes through :class:`uq_perception.perception.UncertaintyPerception` (the
  detector node's pipeline, built as the node builds it), is turned into the
  ``DetectionArray`` the node would publish, and that message is fed to the arbiter core
  through the arbitration node's own adapter, and to the ask-for-help core;
- each ground-truth ``DetectionArray`` is matched to the frame with the same stamp; or
  ground truth comes from a COCO file (:mod:`uq_eval.bags.ground_truth`), looked up by
  each frame's stamp. Partial labels (the ask-for-help export) score only the labelled
  detections: no AP, which needs every object labelled.

Only per-detection numbers are kept (a few dozen bytes each), never images, so memory does
not grow with the bag beyond that. Time going back by more than
:data:`TIME_JUMP_TOLERANCE_S` (a looping bag) restarts the tracker and the arbiter, as a
restarted robot would, so no stale level is carried across the jump; a smaller step back is
an out-of-order stamp, reported as a problem and otherwise processed in log order.

A message that cannot be evaluated (an image that is not ``(H, W, 3)`` uint8 RGB, ground
truth with a non-finite box or a contradictory class) raises
:class:`InvalidMessage` before it changes anything; the replay skips
it, counts it by topic and reason in the problems, and goes on. Any other error ends the
replay: it is a bug or a broken process, not a bad message.
"""

from __future__ import annotations

import math
import queue
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from uq_eval.bags.ground_truth import MAX_BOX_PIXELS
from uq_perception.training.detection_metrics import match_detections

TIME_JUMP_TOLERANCE_S = 1.0
# Frames waiting for their ground truth (or ground truth for its frame); stamps further
# apart than this many messages never meet, so the buffers stay small.
_MATCH_BUFFER = 64
MAX_CROPS = 50
# Items (decoded frames, perception results) queued between the replay's threads.
_PIPELINE_DEPTH = 4
# Frames each side of one round of the replay benchmark times, at least (several passes
# on a short bag), and its rounds.
BENCH_MIN_FRAMES = 300
BENCH_ROUNDS = 3


class InvalidMessage(ValueError):
    """One message cannot be evaluated; the text says why, the same for every message with
    that problem, so that they are counted together."""


def load_shipped_perception(torch_threads: int = 1, score_threshold: float = 0.3,
                            max_detections: int = 20, tracking_iou: float = 0.3) -> Any:
    """The detector node's pipeline with the shipped model and the node's defaults."""
    import torch

    from uq_perception.detectors.centernet import load_detector
    from uq_perception.detectors.model_files import default_detector_path, default_gp_path
    from uq_perception.ntk import LastLayerNTKGP
    from uq_perception.perception import UncertaintyPerception
    from uq_perception.runtime.backends import create_backend
    from uq_perception.tracking import IoUTracker

    torch.set_num_threads(torch_threads)
    model = load_detector(default_detector_path())
    gp = LastLayerNTKGP.load(default_gp_path(), feature_dim=model.embedding_dim,
                             model_id=getattr(model, 'model_id', '') or None)
    backend = create_backend('pytorch-cpu', model)
    return UncertaintyPerception(backend, gp, score_threshold, max_detections,
                                 IoUTracker(tracking_iou))


@dataclass
class _Frame:
    stamp: float
    boxes: np.ndarray
    scores: np.ndarray
    probabilities: np.ndarray
    gp_variance: np.ndarray
    predicted: np.ndarray


@dataclass
class EvaluationData:
    """Everything the report needs, as plain lists (JSON-friendly)."""

    class_names: list[str] = field(default_factory=list)
    frames: list[dict] = field(default_factory=list)        # stamp, level, latency, ...
    detections: list[dict] = field(default_factory=list)    # per detection, uncertainty
    matched: list[dict] = field(default_factory=list)       # per detection matched to GT
    ap_inputs: dict[str, list] = field(default_factory=dict)  # class -> [(score, tp)]
    ground_truth_counts: dict[str, int] = field(default_factory=dict)
    transitions: list[dict] = field(default_factory=list)
    help_requests: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    ground_truth_frames: int = 0
    ground_truth_source: str = ''
    ground_truth_exhaustive: bool = True
    ground_truth_unmatched: int = 0
    node_latencies_ms: list[float] = field(default_factory=list)
    node_end_to_end_ms: list[float] = field(default_factory=list)
    node_levels: list[dict] = field(default_factory=list)


class BagEvaluator:
    """Feeds bag events through perception, arbitration and the help policy.

    Parameters
    ----------
    perception
        An :class:`~uq_perception.perception.UncertaintyPerception`.
    crops_dir
        Where help-request crops are written (PNG), or ``None`` for none.
    bag_name
        For messages.
    arbitration_values
        Arbitration node parameters overriding its defaults (e.g. calibrated thresholds
        read with :func:`uq_autonomy.arbitration.params.load_parameters_file`).
    ground_truth
        A :class:`~uq_eval.bags.ground_truth.CocoGroundTruth` to score frames against
        (instead of a ground-truth topic), or ``None``.
    """

    def __init__(self, perception: Any, crops_dir: Path | None = None,
                 bag_name: str = 'bag', arbitration_values: dict | None = None,
                 ground_truth: Any = None) -> None:
        self.perception = perception
        self.arbitration_values = dict(arbitration_values or {})
        self.crops_dir = crops_dir
        self.bag_name = bag_name
        self.ground_truth = ground_truth
        self.data = EvaluationData(class_names=list(perception.gp.class_names))
        if ground_truth is not None:
            self.data.ground_truth_source = str(ground_truth.path)
            self.data.ground_truth_exhaustive = bool(ground_truth.exhaustive)
        self._arbiter: Any = None
        self._help: Any = None
        self._last_stamp: float | None = None
        self._waiting_frames: OrderedDict[float, _Frame] = OrderedDict()
        self._waiting_truth: OrderedDict[float, Any] = OrderedDict()
        self._request_counter = 0
        self._out_of_order = 0
        self._image_log_times: OrderedDict[float, float] = OrderedDict()

    # --- cores ------------------------------------------------------------------------
    def _start_cores(self, now: float, width: int, height: int) -> None:
        from uq_autonomy.arbitration.arbiter import Arbiter
        from uq_autonomy.arbitration.params import config_from_values, default_values
        from uq_autonomy.help.policy import HelpPolicy

        values = {**default_values(), **self.arbitration_values}
        # The evaluated images' size, for driving_detection nearest_center.
        config = replace(config_from_values(values), image_width=width, image_height=height)
        self._arbiter = Arbiter(config, now)
        self._help = HelpPolicy(new_request_id=self._next_request_id)

    def _next_request_id(self) -> str:
        self._request_counter += 1
        return f'request-{self._request_counter:04d}'

    # --- events -----------------------------------------------------------------------
    def perceive(self, stamp: float, rgb: np.ndarray) -> tuple[Any, str | None]:
        """First stage of a frame stamped ``stamp`` seconds: the detector node's pipeline.

        Returns the perception result and, when the arbiter and the help policy must restart
        before :meth:`record` takes it, why ('' on the first frame). Frames go through
        :meth:`perceive` in order; :meth:`record` may run elsewhere (another process), in
        the same order, since it touches nothing this stage uses.

        Raises
        ------
        InvalidMessage
            When ``rgb`` is not an ``(H, W, 3)`` uint8 RGB image; nothing has changed then.
        """
        _require_rgb(rgb)
        last = self._last_stamp
        restart = None
        if last is None:
            restart = ''
        elif stamp < last - TIME_JUMP_TOLERANCE_S:
            restart = (f'time jumped back {last - stamp:.2f} s at stamp {stamp:.3f} '
                       '(looping bag): tracker, arbiter and help policy restarted')
        elif stamp < last:
            self._out_of_order += 1
        if restart is not None:
            if self.perception.tracker is not None:
                self.perception.tracker.reset()
            self._last_stamp = stamp
        else:
            self._last_stamp = max(stamp, self._last_stamp or stamp)
        return self.perception.process(rgb), restart

    def record(self, stamp: float, frame: Any, restart: str | None, rgb: np.ndarray,
               log_time: float | None = None, stamp_ns: int | None = None) -> None:
        """Second stage of a frame: the message the node would publish, the arbiter, the
        help policy and the scores. ``log_time`` is when the bag logged the image;
        ``stamp_ns``, the exact stamp, looks up its labels in a COCO ground truth."""
        if log_time is not None:
            self._image_log_times[stamp] = log_time
            while len(self._image_log_times) > _MATCH_BUFFER:
                self._image_log_times.popitem(last=False)
        from builtin_interfaces.msg import Time
        from std_msgs.msg import Header

        from uq_autonomy.arbitration_node import detection_summaries, model_range
        from uq_perception.messages import detection_array_message

        if restart is not None:
            if restart:
                self.data.notes.append(restart)
            self._start_cores(stamp, rgb.shape[1], rgb.shape[0])
        sec = int(math.floor(stamp))
        header = Header(stamp=Time(sec=sec, nanosec=int((stamp - sec) * 1e9)))
        message = detection_array_message(frame, header, 'pytorch-cpu', self.perception.gp.model_id)
        step = self._arbiter.observe(stamp, detection_summaries(message),
                                     len(message.class_names), model=model_range(message))
        if step.transition is not None:
            t = step.transition
            self.data.transitions.append({'stamp': stamp, 'from': t.from_level.label,
                                          'to': t.to_level.label, 'reason': t.reason})
        unc = frame.uncertainty
        predicted = unc.probabilities.argmax(axis=1) if len(frame) else np.zeros(0, int)
        calibrated = [d.uncertainty.calibrated_score for d in message.detections]
        self.data.frames.append({
            'stamp': stamp, 'level': int(step.state.level), 'level_name': step.state.level.label,
            'latency_ms': frame.inference_ms, 'forward_ms': frame.forward_ms,
            'detections': len(frame),
            'max_gp_variance': float(unc.gp_variance.max()) if len(frame) else 0.0})
        for i in range(len(frame)):
            self.data.detections.append({
                'stamp': stamp, 'track_id': int(frame.track_ids[i]),
                'class': frame.class_names[int(predicted[i])],
                'score': float(frame.detections.scores[i]),
                'gp_variance': float(unc.gp_variance[i]),
                'mutual_information': float(unc.mutual_information[i]),
                'predictive_entropy': float(unc.predictive_entropy[i]),
                'max_probability': float(unc.probabilities[i].max()),
                'calibrated_score': float(calibrated[i])})
        self._ask_for_help(stamp, frame, predicted, rgb, calibrated)
        scored = _Frame(
            stamp, frame.detections.boxes.astype(np.float64),
            frame.detections.scores.astype(np.float64), unc.probabilities.astype(np.float64),
            unc.gp_variance.astype(np.float64), predicted)
        if self.ground_truth is None:
            self._waiting_frames[stamp] = scored
            self._match_waiting()
        elif stamp_ns is not None:
            truth = self.ground_truth.take(stamp_ns)
            if truth is not None:
                self._score(scored, truth.boxes, truth.classes,
                            exhaustive=self.ground_truth.exhaustive)

    def _ask_for_help(self, stamp: float, frame: Any, predicted: np.ndarray,
                      rgb: np.ndarray, calibrated: list[float]) -> None:
        from uq_autonomy.help.crops import crop_region, cut, encode_png
        from uq_autonomy.help.policy import Candidate, TrackObservation

        unc = frame.uncertainty
        observations = []
        for i in range(len(frame)):
            order = np.argsort(-unc.probabilities[i])[:3]
            box = frame.detections.boxes[i]
            observations.append(TrackObservation(
                track_id=int(frame.track_ids[i]), class_index=int(predicted[i]),
                class_name=frame.class_names[int(predicted[i])],
                gp_variance=float(unc.gp_variance[i]),
                mutual_information=float(unc.mutual_information[i]),
                calibrated_score=float(calibrated[i]),
                out_of_distribution=bool(unc.out_of_distribution[i]),
                box=(float(box[0]), float(box[1]), float(box[2]), float(box[3])),
                embedding=frame.detections.embeddings[i],
                candidates=tuple(Candidate(frame.class_names[int(k)],
                                           float(unc.probabilities[i, k])) for k in order),
                score=float(frame.detections.scores[i])))
        for decision in self._help.observe(stamp, observations):
            request = {'request_id': decision.request_id, 'stamp': stamp,
                       'track_id': decision.track_id, 'trigger': str(decision.trigger),
                       'reason': decision.reason,
                       'candidates': [c.label for c in decision.candidates], 'crop': None}
            if self.crops_dir is not None and len(self.data.help_requests) < MAX_CROPS:
                region = crop_region(decision.observation.box, rgb.shape[1], rgb.shape[0])
                self.crops_dir.mkdir(parents=True, exist_ok=True)
                path = self.crops_dir / f'{decision.request_id}.png'
                path.write_bytes(encode_png(cut(rgb, region)))
                request['crop'] = f'{self.crops_dir.name}/{path.name}'
            self.data.help_requests.append(request)

    def on_ground_truth(self, stamp: float, boxes: np.ndarray, classes: list[str]) -> None:
        """Take one frame's ground truth, boxes as centre and size with their class names
        (the frame with the same stamp is scored).

        Raises
        ------
        InvalidMessage
            When a box is not 4 finite numbers within :data:`MAX_BOX_PIXELS` of the origin
            with a size >= 0, a class name is empty, or boxes and names differ in number;
            nothing has changed then.
        """
        boxes = _checked_ground_truth(boxes, classes)
        self._waiting_truth[stamp] = (boxes, classes)
        self._match_waiting()

    def _match_waiting(self) -> None:
        for stamp in [s for s in self._waiting_frames if s in self._waiting_truth]:
            boxes, classes = self._waiting_truth.pop(stamp)
            self._score(self._waiting_frames.pop(stamp), boxes, classes, exhaustive=True)
        for buffer in (self._waiting_frames, self._waiting_truth):
            while len(buffer) > _MATCH_BUFFER:
                buffer.popitem(last=False)

    def _score(self, frame: _Frame, gt_boxes: np.ndarray, gt_class: list[str],
               exhaustive: bool) -> None:
        """Score ``frame`` against its labelled objects (boxes as centre, size). Partial
        labels skip the AP inputs: an unlabelled object there may be real, so a detection
        matching no label is not known to be a false positive."""
        names = self.data.class_names
        self.data.ground_truth_frames += 1
        gt_known = np.array([c in names for c in gt_class], dtype=bool)
        # Class-aware matching for AP: unknown objects are ignored (neither to be found
        # nor a false positive when found: a closed-set detector cannot name them).
        for c in gt_class if exhaustive else ():
            if c in names:
                self.data.ground_truth_counts[c] = self.data.ground_truth_counts.get(c, 0) + 1
        for k, name in enumerate(names if exhaustive else ()):
            mine = frame.predicted == k
            if not mine.any():
                continue
            relevant = np.array([(c == name) or not known
                                 for c, known in zip(gt_class, gt_known, strict=True)], bool)
            idx = np.flatnonzero(relevant)
            matched, ignored = match_detections(frame.boxes[mine], frame.scores[mine],
                                                gt_boxes[idx], 0.5, ~gt_known[idx])
            rows = self.data.ap_inputs.setdefault(name, [])
            for score, m, ign in zip(frame.scores[mine], matched, ignored, strict=True):
                if not ign:
                    rows.append((float(score), bool(m >= 0)))
        # Class-agnostic matching for calibration and OOD: what object is this detection?
        matched, _ = match_detections(frame.boxes, frame.scores, gt_boxes, 0.5)
        for i, g in enumerate(matched):
            if g < 0:
                continue
            known = bool(gt_known[g])
            self.data.matched.append({
                'stamp': frame.stamp, 'known': known, 'gt_class': gt_class[g],
                'label': names.index(gt_class[g]) if known else -1,
                'predicted': int(frame.predicted[i]),
                'probabilities': [float(p) for p in frame.probabilities[i]],
                'gp_variance': float(frame.gp_variance[i])})

    def on_node_detections(self, stamp: float, log_time: float,
                           inference_time_ms: float) -> None:
        """A DetectionArray the running node published (from ``uq replay --record``): its
        own processing time, and the time from the image's to its receipt by the recorder."""
        self.data.node_latencies_ms.append(float(inference_time_ms))
        received = self._image_log_times.get(stamp)
        if received is not None:
            self.data.node_end_to_end_ms.append(1e3 * (log_time - received))

    def on_node_state(self, log_time: float, level: int, reason: str) -> None:
        """An AutonomyState the running arbitration node published."""
        self.data.node_levels.append({'log_time': log_time, 'level': int(level),
                                      'reason': str(reason)})

    @property
    def out_of_order(self) -> int:
        """Images :meth:`perceive` saw stamped earlier than a previous one."""
        return self._out_of_order

    def finish(self, out_of_order: int | None = None,
               skipped: dict[tuple[str, str], int] | None = None) -> EvaluationData:
        """Close the evaluation: notes on what could not be matched or was out of order
        (``out_of_order``: the count of :meth:`perceive`'s copy, when that ran elsewhere),
        and the messages skipped as invalid, counted by (topic, reason)."""
        if out_of_order is not None:
            self._out_of_order = out_of_order
        if self._out_of_order:
            self.data.problems.append(
                f'bag {self.bag_name}: {self._out_of_order} image(s) stamped earlier than a '
                'previous one (out-of-order stamps); they were processed in log order')
        for (topic, reason), count in (skipped or {}).items():
            self.data.problems.append(
                f'bag {self.bag_name}: {count} message(s) skipped on {topic}: {reason}')
        if self._waiting_truth and self.data.ground_truth_frames == 0:
            self.data.notes.append('ground truth present but no stamp matched an image stamp')
        if self.ground_truth is not None:
            self.data.notes.extend(self.ground_truth.notes)
            self.data.ground_truth_unmatched = self.ground_truth.unmatched()
            if self.data.ground_truth_unmatched:
                self.data.notes.append(
                    f'ground truth {self.ground_truth.path}: '
                    f'{self.data.ground_truth_unmatched} of {len(self.ground_truth.frames)} '
                    'labelled stamp(s) match no image of the bag (left out)')
        return self.data


def _replayed_events(stream: Any, repeat: int) -> Iterator[tuple[Any, float]]:
    """(event, stamp) for ``repeat`` passes over the bag, each pass shifted in time so
    stamps keep increasing."""
    span = 0.0
    for rep in range(repeat):
        first = last = None
        for event in stream.events(with_node_outputs=True):
            stamp = event.stamp + rep * span
            first = stamp if first is None else first
            last = stamp
            if rep > 0:
                # A COCO file's labels belong to the bag's own stamps: the first pass.
                event = replace(event, stamp_ns=None)
            yield event, stamp
        if rep == 0 and first is not None:
            span = (last - first) + 1.0


class _Handoff:
    """A bounded queue from a reader thread that the consumer can abandon without leaving
    the reader blocked: ``put`` gives up once :meth:`cancel` is called."""

    _END = object()

    def __init__(self, depth: int) -> None:
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._cancelled = threading.Event()

    def cancel(self) -> None:
        self._cancelled.set()

    def put(self, item: Any) -> bool:
        while not self._cancelled.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def end(self) -> None:
        self.put(self._END)

    def items(self) -> Iterator[Any]:
        while True:
            item = self._queue.get()
            if item is self._END:
                return
            yield item


def _read_ahead(stream: Any, repeat: int, depth: int) -> tuple[_Handoff, threading.Thread]:
    """Read and decode the bag on a thread, ``depth`` events ahead."""
    decoded = _Handoff(depth)

    def read() -> None:
        try:
            for item in _replayed_events(stream, repeat):
                if not decoded.put(item):
                    return
        finally:
            decoded.end()

    thread = threading.Thread(target=read, name='bag-reader', daemon=True)
    thread.start()
    return decoded, thread


def _require_rgb(pixels: Any) -> None:
    """Refuse (:class:`InvalidMessage`) anything but what the detector's pipeline takes: an
    ``(H, W, 3)`` uint8 RGB array with at least one pixel."""
    if not (isinstance(pixels, np.ndarray) and pixels.dtype == np.uint8 and pixels.ndim == 3
            and pixels.shape[2] == 3 and pixels.size > 0):
        found = (f'shape {pixels.shape}, {pixels.dtype}' if isinstance(pixels, np.ndarray)
                 else type(pixels).__name__)
        raise InvalidMessage(f'image must be an (H, W, 3) uint8 RGB array, got {found}')


def _checked_ground_truth(boxes: Any, classes: list[str]) -> np.ndarray:
    """``boxes`` as an ``(N, 4)`` float array once they and ``classes`` pass the rules of
    :meth:`BagEvaluator.on_ground_truth`; :class:`InvalidMessage` otherwise."""
    boxes = np.asarray(boxes, dtype=np.float64)
    if boxes.ndim != 2 or boxes.shape[1] != 4:
        raise InvalidMessage(f'ground-truth boxes must be (N, 4), got shape {boxes.shape}')
    if len(classes) != len(boxes):
        raise InvalidMessage(f'ground truth has {len(boxes)} box(es) but {len(classes)} '
                             'class name(s)')
    if not np.isfinite(boxes).all():
        raise InvalidMessage('a ground-truth box has a non-finite (NaN or inf) value')
    if (np.abs(boxes) > MAX_BOX_PIXELS).any():
        raise InvalidMessage(f'a ground-truth box lies beyond {MAX_BOX_PIXELS} pixels')
    if (boxes[:, 2:] < 0.0).any():
        raise InvalidMessage('a ground-truth box has a negative width or height')
    if not all(isinstance(name, str) and name for name in classes):
        raise InvalidMessage('a ground-truth detection has no class name (class_id)')
    return boxes


def _ground_truth_arguments(msg: Any) -> tuple[np.ndarray, list[str]]:
    """Boxes (centre, size) and class names of a ground-truth DetectionArray.

    Raises
    ------
    InvalidMessage
        When a detection's ``class_index`` is neither -1 (a class the detector does not
        know) nor the index of its ``class_id`` in the message's ``class_names``: the
        message contradicts itself about what it labels.
    """
    names = msg.class_names
    for detection in msg.detections:
        index = int(detection.class_index)
        if index != -1 and not (0 <= index < len(names) and names[index] == detection.class_id):
            raise InvalidMessage("a ground-truth detection's class_index is neither -1 nor "
                                 'the index of its class_id in class_names')
    boxes = np.array([[d.center_x, d.center_y, d.width, d.height] for d in msg.detections],
                     dtype=np.float64).reshape(-1, 4)
    return boxes, [str(d.class_id) for d in msg.detections]


def _plain_arguments(event: Any, stamp: float) -> tuple[str, tuple] | None:
    """The evaluator method and arguments for a non-image event, as plain values.

    Raises
    ------
    InvalidMessage
        For ground truth that contradicts itself (:func:`_ground_truth_arguments`).
    """
    msg = event.message
    if event.kind == 'ground_truth':
        return 'on_ground_truth', (stamp, *_ground_truth_arguments(msg))
    if event.kind == 'detections':
        return 'on_node_detections', (stamp, event.log_time, float(msg.inference_time_ms))
    if event.kind == 'autonomy_state':
        return 'on_node_state', (event.log_time, int(msg.level), str(msg.reason))
    return None


def _record_in_child(evaluator: BagEvaluator, conn: Any) -> None:
    """The recording process: run each (method, arguments, topic) received, in order,
    skipping and counting the messages the evaluator finds invalid, then send back
    ``finish()``'s data, or the first other error."""
    skipped: Counter[tuple[str, str]] = Counter()
    try:
        while True:
            name, args, topic = conn.recv()
            if name == 'finish':
                out_of_order, skipped_before = args
                conn.send(('data', evaluator.finish(out_of_order,
                                                    Counter(skipped_before) + skipped)))
                return
            try:
                getattr(evaluator, name)(*args)
            except InvalidMessage as exc:
                skipped[topic, str(exc)] += 1
    except (EOFError, KeyboardInterrupt):
        return  # the replay was abandoned; it reports why
    except Exception as exc:  # handed to the replay, which raises it
        try:
            conn.send(('error', exc))
        except OSError:
            return  # the replay is gone
        except Exception:  # an exception that does not pickle
            conn.send(('error', RuntimeError(f'{type(exc).__name__}: {exc}')))


def run_evaluation(stream: Any, evaluator: BagEvaluator, progress: bool = True,
                   repeat: int = 1) -> EvaluationData:
    """Feed every event of ``stream`` (a :class:`~uq_eval.bags.reader.BagStream`) to
    ``evaluator``, ``repeat`` times (each pass shifted in time so stamps keep increasing).

    Only the perception pipeline sets the pace. A thread reads and decodes the bag ahead;
    this thread runs :meth:`BagEvaluator.perceive`; a forked copy of ``evaluator`` in a
    second process runs everything after it (:meth:`BagEvaluator.record`, the ground truth,
    the nodes' outputs), in log order. A process, not a thread: that work is Python and
    would hold the GIL the forward pass needs between its operations (in a thread it slowed
    the forward pass by as much as the work itself). The reader's queue holds at most
    :data:`_PIPELINE_DEPTH` frames and the pipe to the recorder a few, so memory stays
    bounded.
    """
    import multiprocessing

    from tqdm import tqdm

    # Forked before any thread of this call starts; the recorder uses neither torch nor
    # the backend, whose state it inherits.
    context = multiprocessing.get_context('fork')
    conn, child_conn = context.Pipe()
    recorder = context.Process(target=_record_in_child, args=(evaluator, child_conn),
                               name='bag-recorder', daemon=True)
    recorder.start()
    child_conn.close()
    decoded, reader = _read_ahead(stream, repeat, _PIPELINE_DEPTH)
    total = stream.image_message_count() * repeat
    # Messages this thread finds invalid, by (topic, reason); the recorder adds its own.
    skipped: Counter[tuple[str, str]] = Counter()
    try:
        try:
            with tqdm(total=total or None, desc=f'evaluating {stream.path.name}',
                      unit='frame', disable=not progress, mininterval=0.5) as bar:
                for event, stamp in decoded.items():
                    if conn.poll():
                        break  # the recorder failed; its error is read below
                    call: tuple[str, tuple] | None = None
                    try:
                        if event.kind == 'image':
                            frame, restart = evaluator.perceive(stamp, event.rgb)
                            call = ('record', (stamp, frame, restart, event.rgb,
                                               event.log_time, event.stamp_ns))
                        else:
                            call = _plain_arguments(event, stamp)
                    except InvalidMessage as exc:
                        skipped[event.topic, str(exc)] += 1
                    if call is not None:
                        conn.send((*call, event.topic))
                    if event.kind == 'image':
                        bar.update(1)
                else:
                    conn.send(('finish', (evaluator.out_of_order, dict(skipped)), ''))
        except BrokenPipeError:
            pass  # the recorder ended early: its error, if it sent one, is read below
        try:
            kind, payload = conn.recv()
        except EOFError:
            kind, payload = 'error', RuntimeError(
                f'bag {stream.path}: the recording process ended unexpectedly (exit code '
                f'{recorder.exitcode})')
    finally:
        decoded.cancel()
        reader.join()
        conn.close()
        recorder.join(timeout=10.0)
        if recorder.is_alive():
            recorder.kill()
            recorder.join()
    if kind == 'error':
        raise payload
    data = payload
    data.problems[:0] = stream.problems
    return data


def time_forward_passes(stream: Any, perception: Any) -> tuple[int, float]:
    """Bare backend calls on the bag's frames: (frames, seconds in the calls alone)."""
    frames, seconds = 0, 0.0
    for event in stream.events():
        if event.kind != 'image':
            continue
        start = time.perf_counter()
        perception.backend.infer(event.rgb, perception.score_threshold,
                                 perception.max_detections)
        seconds += time.perf_counter() - start
        frames += 1
    return frames, seconds


def bench_replay_against_forward(stream: Any, new_evaluator: Any,
                                 min_frames: int = BENCH_MIN_FRAMES,
                                 rounds: int = BENCH_ROUNDS) -> dict[str, Any]:
    """Offline replay rate against the bare forward pass's, on the same frames.

    ``rounds`` rounds each time bare forward passes over the bag's images, then a replay
    (:func:`run_evaluation` with a fresh ``new_evaluator()``, no crops), both over as many
    passes of the bag as reach ``min_frames`` frames, so that a machine whose speed drifts
    (frequency, other jobs) weighs on both sides alike and the replay's start (opening the
    bag, filling its queues) is spread over many frames. Run it after a first evaluation,
    which pays the one-off costs (allocator, first calls) that neither side should carry.
    """
    passes = max(1, math.ceil(min_frames / max(1, stream.image_message_count())))
    replay_frames = forward_frames = 0
    replay_s = forward_s = 0.0
    for _ in range(rounds):
        evaluator = new_evaluator()
        for _ in range(passes):
            frames, seconds = time_forward_passes(stream, evaluator.perception)
            forward_frames, forward_s = forward_frames + frames, forward_s + seconds
        start = time.perf_counter()
        data = run_evaluation(stream, evaluator, progress=False, repeat=passes)
        replay_s += time.perf_counter() - start
        replay_frames += len(data.frames)
    replay_rate = replay_frames / replay_s if replay_s > 0 else float('nan')
    forward_rate = forward_frames / forward_s if forward_s > 0 else float('nan')
    return {'bag_frames': stream.image_message_count(), 'passes_per_round': passes,
            'rounds': rounds, 'frames': replay_frames,
            'replay_frames_per_s': replay_rate, 'bare_forward_frames_per_s': forward_rate,
            'replay_over_forward': replay_rate / forward_rate}
