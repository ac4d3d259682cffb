"""Scoring the ask-for-help loop against the simulator's ground truth (ROS-free).

Inputs are what ``uq eval help`` records over one scenario: the ground-truth frames, the
detector's frames, the help requests and the stored labels. Everything is joined by image
stamp (the sim camera stamps the image and its ground truth alike, and the detector and the
ask-for-help node keep the image's stamp).

Definitions (docs/help_eval.md):

* a request is **about** the ground-truth object whose box overlaps the request's detection
  box most at the request's stamp, with IoU >= ``request_iou`` (none: unmatched);
* a request is **useful** when that object is unknown to the detector at that moment or the
  detector got its class wrong, i.e. the request's predicted class is not the true class
  (an object of a class the detector does not have is always misclassified; once it has
  learnt the class, a correct prediction makes a further request useless). Help precision is
  useful requests over all requests;
* a **novel object** is a ground-truth object outside the detector's classes
  (``known`` False) seen in at least ``min_visible_frames`` ground-truth frames; recall is the
  share of them asked about at least once; queries per novel object is the number of
  requests about novel objects over the novel objects asked about (1.0: each asked about
  exactly once);
* **after the answer** (stamps later than the label's commit time in the store): over the
  detector's frames in which the object is detected (a detection with IoU >= ``match_iou``,
  the best one), the share labelled with the object's true class, and the share with GP
  variance below the OOD threshold. Frames where it is present but not detected are counted
  apart (``missed_frames``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from uq_sim.scripted_labeller import Box, TruthObject, best_match, box_iou


@dataclass(frozen=True)
class DetectionRecord:
    """One detection of the detector, as recorded."""

    track_id: int
    class_name: str
    box: Box
    gp_variance: float
    out_of_distribution: bool = False


@dataclass(frozen=True)
class DetectionFrame:
    """The detector's output for one image."""

    stamp_ns: int
    class_names: tuple[str, ...]
    detections: tuple[DetectionRecord, ...]


@dataclass(frozen=True)
class RequestRecord:
    """One help request as published."""

    request_id: str
    stamp_ns: int
    box: Box
    predicted_class: str
    track_id: int
    gp_variance: float


@dataclass(frozen=True)
class AnswerRecord:
    """One stored label; ``time_ns`` is its commit time (the system clock, as the stamps)."""

    request_id: str
    label: str
    labeler: str
    time_ns: int


@dataclass
class RunRecording:
    """What was recorded over one scenario."""

    scenario: str
    truth: dict[int, tuple[TruthObject, ...]] = field(default_factory=dict)
    frames: list[DetectionFrame] = field(default_factory=list)
    requests: list[RequestRecord] = field(default_factory=list)
    answers: list[AnswerRecord] = field(default_factory=list)


def recording_to_json(run: RunRecording) -> dict:
    """A JSON-ready form of a recording (re-scored offline with :func:`recording_from_json`)."""
    return {'scenario': run.scenario,
            'truth': [[stamp, [[o.object_id, o.class_name, o.known, list(o.box)] for o in objs]]
                      for stamp, objs in sorted(run.truth.items())],
            'frames': [[f.stamp_ns, list(f.class_names),
                        [[d.track_id, d.class_name, list(d.box), d.gp_variance,
                          d.out_of_distribution] for d in f.detections]] for f in run.frames],
            'requests': [[r.request_id, r.stamp_ns, list(r.box), r.predicted_class, r.track_id,
                          r.gp_variance] for r in run.requests],
            'answers': [[a.request_id, a.label, a.labeler, a.time_ns] for a in run.answers]}


def recording_from_json(data: dict) -> RunRecording:
    """The recording written by :func:`recording_to_json`."""
    return RunRecording(
        data['scenario'],
        {int(stamp): tuple(TruthObject(int(i), c, bool(k), tuple(b)) for i, c, k, b in objs)
         for stamp, objs in data['truth']},
        [DetectionFrame(int(s), tuple(names), tuple(
            DetectionRecord(int(t), c, tuple(b), float(v), bool(o)) for t, c, b, v, o in dets))
         for s, names, dets in data['frames']],
        [RequestRecord(i, int(s), tuple(b), c, int(t), float(v))
         for i, s, b, c, t, v in data['requests']],
        [AnswerRecord(i, label, who, int(t)) for i, label, who, t in data['answers']])


def _ratio(num: float, den: float) -> float | None:
    return num / den if den else None


def matched_detection(obj: TruthObject, frame: DetectionFrame,
                      match_iou: float) -> DetectionRecord | None:
    """The detection that overlaps ``obj`` most in ``frame``, if by at least ``match_iou``."""
    best, best_iou = None, 0.0
    for det in frame.detections:
        iou = box_iou(det.box, obj.box)
        if iou > best_iou:
            best, best_iou = det, iou
    return best if best_iou >= match_iou else None


def score_run(run: RunRecording, ood_threshold: float, *, request_iou: float = 0.3,
              match_iou: float = 0.5, min_visible_frames: int = 5) -> dict:
    """Help precision, recall, queries per novel object and post-answer figures of one run."""
    objects: dict[int, TruthObject] = {}
    visible: dict[int, int] = {}
    for truth in run.truth.values():
        for obj in truth:
            objects.setdefault(obj.object_id, obj)
            visible[obj.object_id] = visible.get(obj.object_id, 0) + 1
    novel = sorted(i for i, o in objects.items()
                   if not o.known and visible[i] >= min_visible_frames)

    requests: list[dict[str, Any]] = []
    for r in run.requests:
        at_stamp = run.truth.get(r.stamp_ns)
        match, iou = best_match(r.box, at_stamp or ())
        if match is None or iou < request_iou:
            kind = 'unmatched' if at_stamp is not None else 'no_ground_truth'
            requests.append({'request_id': r.request_id, 'object_id': None, 'kind': kind,
                             'useful': False, 'predicted': r.predicted_class,
                             'iou': round(iou, 3), 'stamp_ns': r.stamp_ns})
            continue
        if not match.known:
            kind = 'unknown_object'
        elif r.predicted_class != match.class_name:
            kind = 'misclassified_known'
        else:
            kind = 'correct_known'
        useful = r.predicted_class != match.class_name
        requests.append({'request_id': r.request_id, 'object_id': match.object_id,
                         'true_class': match.class_name, 'predicted': r.predicted_class,
                         'kind': kind, 'useful': useful, 'iou': round(iou, 3),
                         'stamp_ns': r.stamp_ns, 'gp_variance': r.gp_variance})
    by_id = {q['request_id']: q for q in requests}
    on_novel = [q for q in requests if q['object_id'] in novel]
    asked = sorted({q['object_id'] for q in on_novel})

    frames = sorted(run.frames, key=lambda f: f.stamp_ns)
    answered: dict[int, AnswerRecord] = {}
    for a in sorted(run.answers, key=lambda a: a.time_ns):
        q = by_id.get(a.request_id)
        if q is not None and q['object_id'] is not None:
            answered.setdefault(q['object_id'], a)  # the first answer teaches the object
    per_object: dict[str, dict[str, Any]] = {}
    for object_id, answer in sorted(answered.items()):
        obj = objects[object_id]
        correct = low_variance = detected = missed = 0
        for frame in frames:
            if frame.stamp_ns <= answer.time_ns:
                continue
            present = {o.object_id: o for o in run.truth.get(frame.stamp_ns, ())}
            if object_id not in present:
                continue
            det = matched_detection(present[object_id], frame, match_iou)
            if det is None:
                missed += 1
                continue
            detected += 1
            correct += det.class_name == obj.class_name
            low_variance += det.gp_variance < ood_threshold
        per_object[str(object_id)] = {
            'class': obj.class_name, 'novel': object_id in novel, 'label': answer.label,
            'request_id': answer.request_id, 'answer_time_ns': answer.time_ns,
            'frames_after_answer': detected, 'missed_frames': missed,
            'accuracy': _ratio(correct, detected),
            'low_variance_share': _ratio(low_variance, detected),
            'correct': correct, 'low_variance': low_variance}
    novel_after = [v for k, v in per_object.items() if int(k) in novel]
    frames_after = sum(v['frames_after_answer'] for v in novel_after)
    return {
        'scenario': run.scenario,
        'frames': len(frames), 'ground_truth_frames': len(run.truth),
        'requests': len(requests),
        'useful_requests': sum(q['useful'] for q in requests),
        'request_kinds': {k: sum(q['kind'] == k for q in requests) for k in (
            'unknown_object', 'misclassified_known', 'correct_known', 'unmatched',
            'no_ground_truth')},
        'help_precision': _ratio(sum(q['useful'] for q in requests), len(requests)),
        'novel_objects': len(novel),
        'novel_object_classes': {str(i): objects[i].class_name for i in novel},
        'novel_objects_asked': len(asked),
        'requests_on_novel_objects': len(on_novel),
        'recall': _ratio(len(asked), len(novel)),
        'queries_per_novel_object': _ratio(len(on_novel), len(asked)),
        'answers': len(run.answers),
        'novel_objects_answered': len(novel_after),
        'post_answer_frames': frames_after,
        'post_answer_missed_frames': sum(v['missed_frames'] for v in novel_after),
        'post_answer_accuracy': _ratio(sum(v['correct'] for v in novel_after), frames_after),
        'post_answer_low_variance_share': _ratio(
            sum(v['low_variance'] for v in novel_after), frames_after),
        'ood_threshold': ood_threshold,
        'per_request': requests,
        'per_answered_object': per_object,
    }


_POOLED = ('requests', 'useful_requests', 'novel_objects', 'novel_objects_asked',
           'requests_on_novel_objects', 'answers', 'novel_objects_answered',
           'post_answer_frames', 'post_answer_missed_frames')


def summarise(runs: Sequence[dict]) -> dict:
    """Pooled figures over scenarios (counts summed, ratios of the sums)."""
    total = {k: sum(r[k] for r in runs) for k in _POOLED}
    correct = sum(v['correct'] for r in runs for v in r['per_answered_object'].values()
                  if v['novel'])
    low = sum(v['low_variance'] for r in runs for v in r['per_answered_object'].values()
              if v['novel'])
    total.update(
        help_precision=_ratio(total['useful_requests'], total['requests']),
        recall=_ratio(total['novel_objects_asked'], total['novel_objects']),
        queries_per_novel_object=_ratio(total['requests_on_novel_objects'],
                                        total['novel_objects_asked']),
        post_answer_accuracy=_ratio(correct, total['post_answer_frames']),
        post_answer_low_variance_share=_ratio(low, total['post_answer_frames']))
    return total


TARGETS = {'help_precision': ('>=', 0.95), 'queries_per_novel_object': ('<=', 1.2),
           'recall': ('>=', 0.9), 'post_answer_accuracy': ('>=', 0.9)}


def check_targets(summary: dict) -> dict[str, bool | None]:
    """Whether each target is met (``None`` when the figure could not be measured)."""
    out: dict[str, bool | None] = {}
    for name, (op, bound) in TARGETS.items():
        value = summary.get(name)
        if value is None or not math.isfinite(value):
            out[name] = None
        else:
            out[name] = value >= bound if op == '>=' else value <= bound
    return out
