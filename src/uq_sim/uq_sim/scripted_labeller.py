"""A scripted labeller: answers help requests with the simulator's ground truth (ROS-free).

The simulator knows what every object is. :class:`ScriptedLabeller` keeps the recent
ground-truth frames by stamp, and for a help request finds the ground-truth object at the
request's stamp whose box overlaps the request's detection best. After ``answer_delay_s``
(a person takes a while to look) it gives that object's class name: a known class for a
known object the detector got wrong, the true shape name ('torus', 'cone', ...) for an
object outside the detector's classes, which the detector then learns as a new class.

A request whose stamp has no ground truth yet waits up to ``truth_timeout_s`` for it (the
two topics arrive independently); a request that matches no object (a false detection, or
a box below ``min_iou`` with every object) gets the ``no_match`` policy: ``ignore`` (no
answer) or ``label`` (answer ``no_match_label``, e.g. 'background').

A request is refused (``ValueError``) unless its id follows the label store's rule
(:func:`uq_common.class_labels.is_request_id`) and its box is finite with a positive size; at most
:data:`MAX_PENDING` requests wait at a time, and the ids remembered to spot re-deliveries
are the latest :data:`MAX_REMEMBERED_IDS`, so a flood of requests cannot exhaust memory.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

from uq_common.class_labels import is_request_id

Box = tuple[float, float, float, float]  # centre x, centre y, width, height (pixels)

NO_MATCH_POLICIES = ('ignore', 'label')
MAX_PENDING = 1000
MAX_REMEMBERED_IDS = 100_000


@dataclass(frozen=True)
class TruthObject:
    """One object in a ground-truth frame."""

    object_id: int
    class_name: str
    known: bool
    box: Box


@dataclass(frozen=True)
class LabellerConfig:
    """How the scripted labeller answers.

    Raises ``ValueError`` naming the parameter when a value is out of range.
    """

    answer_delay_s: float = 2.0
    min_iou: float = 0.3
    truth_timeout_s: float = 5.0
    no_match: str = 'ignore'
    no_match_label: str = 'background'
    truth_buffer: int = 300

    def __post_init__(self) -> None:
        if not (math.isfinite(self.answer_delay_s) and self.answer_delay_s >= 0.0):
            raise ValueError(f'answer_delay_s must be finite and >= 0, got {self.answer_delay_s}')
        if not 0.0 < self.min_iou <= 1.0:
            raise ValueError(f'min_iou must be in (0, 1], got {self.min_iou}')
        if not (math.isfinite(self.truth_timeout_s) and self.truth_timeout_s >= 0.0):
            raise ValueError(f'truth_timeout_s must be finite and >= 0, got '
                             f'{self.truth_timeout_s}')
        if self.no_match not in NO_MATCH_POLICIES:
            raise ValueError(f'no_match must be one of {NO_MATCH_POLICIES}, got '
                             f'{self.no_match!r}')
        if self.no_match == 'label' and not self.no_match_label.strip():
            raise ValueError('no_match_label must not be empty when no_match is label')
        if self.truth_buffer < 1:
            raise ValueError(f'truth_buffer must be >= 1, got {self.truth_buffer}')


@dataclass(frozen=True)
class LabelAnswer:
    """What the labeller does about one request.

    ``label`` is ``None`` when it answers nothing; ``why`` says what happened, for the log.
    """

    request_id: str
    label: str | None
    why: str
    object_id: int = -1
    iou: float = 0.0


def box_iou(a: Box, b: Box) -> float:
    """Intersection over union of two centre-size boxes (0 when either is empty)."""
    ax0, ay0, ax1, ay1 = a[0] - a[2] / 2, a[1] - a[3] / 2, a[0] + a[2] / 2, a[1] + a[3] / 2
    bx0, by0, bx1, by1 = b[0] - b[2] / 2, b[1] - b[3] / 2, b[0] + b[2] / 2, b[1] + b[3] / 2
    inter = max(0.0, min(ax1, bx1) - max(ax0, bx0)) * max(0.0, min(ay1, by1) - max(ay0, by0))
    union = a[2] * a[3] + b[2] * b[3] - inter
    return inter / union if union > 0.0 else 0.0


def best_match(box: Box, objects: Iterable[TruthObject]) -> tuple[TruthObject | None, float]:
    """The object whose box overlaps ``box`` most, and that IoU (``None``, 0 when none)."""
    best, best_iou = None, 0.0
    for obj in objects:
        iou = box_iou(box, obj.box)
        if iou > best_iou:
            best, best_iou = obj, iou
    return best, best_iou


@dataclass
class _Pending:
    request_id: str
    stamp_ns: int
    box: Box
    due: float       # labeller clock time at which the answer is given
    give_up: float   # ... and after which missing ground truth ends the wait


class ScriptedLabeller:
    """Ground-truth frames in, delayed answers out; time is the caller's clock, seconds."""

    def __init__(self, config: LabellerConfig | None = None) -> None:
        self.config = config or LabellerConfig()
        self._truth: OrderedDict[int, tuple[TruthObject, ...]] = OrderedDict()
        self._pending: dict[str, _Pending] = {}
        self._seen: OrderedDict[str, None] = OrderedDict()

    def add_ground_truth(self, stamp_ns: int, objects: Iterable[TruthObject]) -> None:
        """Keep one ground-truth frame (the oldest go beyond ``truth_buffer``)."""
        self._truth[stamp_ns] = tuple(objects)
        self._truth.move_to_end(stamp_ns)
        while len(self._truth) > self.config.truth_buffer:
            self._truth.popitem(last=False)

    def add_request(self, request_id: str, stamp_ns: int, box: Box, now: float) -> bool:
        """Queue a request; False when this id was seen before (a re-delivered request).

        Raises
        ------
        ValueError
            If the id breaks the label store's rule, the box is not finite or has no
            positive size, or :data:`MAX_PENDING` requests wait already; nothing is queued.
        """
        if not is_request_id(request_id):
            raise ValueError(f'request id {request_id!r:.60} is invalid: use 1-128 letters, '
                             "digits, '.', '_', ':' or '-', starting with a letter or digit")
        if not (all(math.isfinite(v) for v in box) and box[2] > 0.0 and box[3] > 0.0):
            raise ValueError(f'request {request_id}: box {box} must be finite with a '
                             'positive width and height')
        if request_id in self._seen:
            return False
        if len(self._pending) >= MAX_PENDING:
            raise ValueError(f'request {request_id}: {MAX_PENDING} requests wait already')
        self._seen[request_id] = None
        while len(self._seen) > MAX_REMEMBERED_IDS:
            self._seen.popitem(last=False)
        due = now + self.config.answer_delay_s
        self._pending[request_id] = _Pending(request_id, stamp_ns, box, due,
                                             due + self.config.truth_timeout_s)
        return True

    @property
    def pending(self) -> int:
        """Requests not answered yet."""
        return len(self._pending)

    def due(self, now: float) -> list[LabelAnswer]:
        """The answers whose delay has passed (each request is answered at most once)."""
        out = []
        for request_id, p in list(self._pending.items()):
            if now < p.due:
                continue
            objects = self._truth.get(p.stamp_ns)
            if objects is None and now < p.give_up:
                continue  # its ground-truth frame may still be on its way
            del self._pending[request_id]
            out.append(self._answer(p, objects))
        return out

    def _answer(self, p: _Pending, objects: tuple[TruthObject, ...] | None) -> LabelAnswer:
        if objects is None:
            why = f'no ground truth for stamp {p.stamp_ns} ns'
            obj, iou = None, 0.0
        else:
            obj, iou = best_match(p.box, objects)
            if obj is not None and iou >= self.config.min_iou:
                return LabelAnswer(p.request_id, obj.class_name,
                                   f'object {obj.object_id} ({obj.class_name}, '
                                   f'{"known" if obj.known else "unknown"}), IoU {iou:.2f}',
                                   obj.object_id, iou)
            why = (f'no ground-truth object overlaps the box by IoU >= {self.config.min_iou}'
                   f' (best {iou:.2f})')
        if self.config.no_match == 'label':
            return LabelAnswer(p.request_id, self.config.no_match_label, why,
                               -1 if obj is None else obj.object_id, iou)
        return LabelAnswer(p.request_id, None, why, -1 if obj is None else obj.object_id, iou)
