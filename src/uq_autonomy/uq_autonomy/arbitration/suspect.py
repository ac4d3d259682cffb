"""Suspect targets (ROS-free): a track whose evidence over its views says unfamiliar keeps
the level at guided until it is confirmed familiar or a person labels it.

One frame does not tell a confident look-alike from the target: the look-alike looks
strange from some views and familiar from others, and a level that follows the current
frame climbs in a familiar moment. The detector therefore publishes, per detection, its
track's evidence (``Uncertainty.track_score``: the mean calibrated score over the track's
distinct views, ``uq_perception/track_evidence.py``). The gate here reads it for the driving
detection:

* the track becomes **suspect** when its ``track_score`` is at or above ``threshold`` over at
  least ``min_views`` distinct views (a mean over one or two views is one frame's noise);
* a suspect track stays suspect, whatever its later scores, until it is **confirmed**:
  ``confirm_frames`` frames in a row whose calibrated score is below ``threshold``, each
  from a view that differs from the previous confirming one by at least
  ``confirm_view_change`` (relative box displacement or size change), so a robot standing
  still in front of a familiar-looking side cannot confirm it;
* or until it is **labelled as the target**: the detector marks a detection
  ``track_labelled`` when a person labelled its object with the class the detection now has;
  with ``target_class`` set, only that class lifts the cap. A label naming another class
  says the object is not the target: the track stays capped for good, however familiar the
  detector now finds it (it has just learnt it), while the autonomy retargets.

**Rivals.** With ``target_class`` set (the task names one object) and ``hold_on_rival``,
the driving track is also held while another object passes for the target: a detection
of ``target_class`` elsewhere in the frame (overlapping the driving box by at most
:data:`RIVAL_MAX_IOU`) whose track has read as ``target_class`` in at least ``min_views``
frames and in most of the frames it was seen (an object misread for a moment, e.g. while
the gripper hides part of it, is no rival), and whose track score is below ``threshold``
(not suspect itself). Two objects the detector reads, familiarly, as the one target say
that one of them is not what it seems, and the evidence does not say which: a confident
look-alike scores like the target. The hold lasts while the rival is in view, or until a
person labels the driving track as the target (or as another class, which caps it for
good as above).

While the driving track is suspect or has a rival the level is at most guided (the
operator drives; the autonomy's proposal is shown). The threshold is fixed on known
objects: a high quantile of the track scores of known tracks (``uq eval tracks``), not the
maximum over views, which known objects also reach from some view.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from uq_autonomy.arbitration.config import NO_TRACK_SCORE, SuspectConfig

# Tracks remembered at once: a frame holds at most a few hundred detections and only the
# driving one is judged, so this bounds the memory of a long run, not a frame's work.
MAX_TRACKS = 1024
# A detection of the target class overlapping the driving box more than this is the same
# object seen twice (a split box), not a second object passing for the target.
RIVAL_MAX_IOU = 0.3


@dataclass(frozen=True, slots=True)
class DrivingTrack:
    """What the gate reads of the driving detection."""

    track_id: int
    class_id: str
    center_x: float
    center_y: float
    width: float
    height: float
    calibrated_score: float
    track_score: float = NO_TRACK_SCORE
    track_views: int = 0
    track_labelled: bool = False


class ClassReading(Protocol):
    """What the rival rule counts of every detection of a frame."""

    @property
    def track_id(self) -> int: ...

    @property
    def class_id(self) -> str: ...


@dataclass(frozen=True, slots=True)
class SuspectVerdict:
    """The gate's verdict on the driving track: ``suspect`` caps the level at guided."""

    suspect: bool
    track_id: int
    reason: str


NOT_SUSPECT = SuspectVerdict(False, -1, '')


def view_change(a: tuple[float, float, float, float], b: tuple[float, float, float, float]
                ) -> float:
    """How much two boxes ``(cx, cy, w, h)`` differ as views of one object: the centre's
    displacement over the mean box diagonal, or the absolute log of the area ratio,
    whichever is larger."""
    diagonal = 0.5 * (math.hypot(a[2], a[3]) + math.hypot(b[2], b[3]))
    moved = math.hypot(a[0] - b[0], a[1] - b[1]) / diagonal if diagonal > 0.0 else math.inf
    area_a, area_b = a[2] * a[3], b[2] * b[3]
    resized = abs(math.log(area_a / area_b)) if area_a > 0.0 and area_b > 0.0 else math.inf
    return max(moved, resized)


def box_iou(a: DrivingTrack, b: DrivingTrack) -> float:
    """Intersection over union of two detections' boxes (0 for empty or invalid boxes)."""
    left = max(a.center_x - a.width / 2, b.center_x - b.width / 2)
    right = min(a.center_x + a.width / 2, b.center_x + b.width / 2)
    top = max(a.center_y - a.height / 2, b.center_y - b.height / 2)
    bottom = min(a.center_y + a.height / 2, b.center_y + b.height / 2)
    inter = max(0.0, right - left) * max(0.0, bottom - top)
    union = a.width * a.height + b.width * b.height - inter
    # An area that overflows (or is NaN: the frame check refuses such boxes first) overlaps
    # nothing; every finite union holds the intersection, so the ratio is in [0, 1].
    return inter / union if 0.0 < union < math.inf else 0.0


@dataclass(slots=True)
class _Track:
    suspect: bool = False
    cleared: bool = False  # confirmed familiar or labelled as the target: never suspect again
    not_target: str = ''  # the class a person named, when it is not the target
    confirmations: int = 0
    last_confirming_box: tuple[float, float, float, float] | None = None


class SuspectGate:
    """Per-track suspect state; see the module docstring. Not thread-safe."""

    def __init__(self) -> None:
        self._tracks: OrderedDict[int, _Track] = OrderedDict()  # least recently judged first
        # Per track: frames seen and frames read as the target class (least recent first).
        self._readings: OrderedDict[int, list[int]] = OrderedDict()

    def reset(self) -> None:
        """Forget every track (perception reset: track ids may be reused)."""
        self._tracks.clear()
        self._readings.clear()

    def count_readings(self, detections: Iterable[ClassReading], target_class: str) -> None:
        """Count, per track, a frame's detections read as ``target_class`` or not (for
        :meth:`find_rival`; call once per frame with all its detections)."""
        if not target_class:
            return
        for det in detections:
            if det.track_id < 0:
                continue
            counts = self._readings.get(det.track_id)
            if counts is None:
                counts = self._readings[det.track_id] = [0, 0]
                while len(self._readings) > MAX_TRACKS:
                    self._readings.popitem(last=False)
            self._readings.move_to_end(det.track_id)
            counts[0] += 1
            counts[1] += det.class_id == target_class

    def find_rival(self, driving: DrivingTrack, others: Iterable[DrivingTrack],
                   config: SuspectConfig, target_class: str) -> DrivingTrack | None:
        """The first of ``others`` that passes for the target as well as ``driving`` does
        (module docstring, "Rivals"), or None; always None unless the rule is on, the task
        names ``target_class`` and the driving detection reads as it."""
        if not (config.enabled and config.hold_on_rival and target_class
                and driving.class_id == target_class):
            return None
        for other in others:
            if (other.track_id != driving.track_id and other.class_id == target_class
                    and self._reads_as_target(other.track_id, config.min_views)
                    and math.isfinite(other.track_score)
                    and 0.0 <= other.track_score < config.threshold
                    and box_iou(driving, other) <= RIVAL_MAX_IOU):
                return other
        return None

    def _reads_as_target(self, track_id: int, min_frames: int) -> bool:
        seen, as_target = self._readings.get(track_id, (0, 0))
        return as_target >= min_frames and 2 * as_target > seen

    def judge(self, det: DrivingTrack, config: SuspectConfig, target_class: str = '',
              rival: DrivingTrack | None = None) -> SuspectVerdict:
        """Update the driving track's state with this frame's detection and judge it;
        ``rival`` is this frame's rival of it (:meth:`find_rival`), if any."""
        if not config.enabled or det.track_id < 0:
            return NOT_SUSPECT
        track = self._tracks.get(det.track_id)
        if track is None:
            track = self._tracks[det.track_id] = _Track()
            while len(self._tracks) > MAX_TRACKS:
                self._tracks.popitem(last=False)
        self._tracks.move_to_end(det.track_id)
        if det.track_labelled:
            if not target_class or det.class_id == target_class:
                track.suspect, track.cleared, track.not_target = False, True, ''
                return NOT_SUSPECT
            track.not_target = det.class_id
        if track.not_target:
            return SuspectVerdict(True, det.track_id, (
                f'not the target: track {det.track_id} was labelled {track.not_target!r}, '
                f'not {target_class!r}; held at guided'))
        if rival is not None:
            return SuspectVerdict(True, det.track_id, (
                f'ambiguous target: track {det.track_id} and track {rival.track_id} (track '
                f'score {rival.track_score:.3f}) both pass for {target_class!r}; held at '
                f'guided while both are in view or until a label'))
        score = det.track_score
        has_evidence = math.isfinite(score) and score >= 0.0
        if not track.suspect:
            if (not has_evidence or track.cleared or det.track_views < config.min_views
                    or score < config.threshold):
                return NOT_SUSPECT
            track.suspect, track.confirmations, track.last_confirming_box = True, 0, None
        if self._confirms(track, det, config):
            track.suspect, track.cleared = False, True
            return NOT_SUSPECT
        return SuspectVerdict(True, det.track_id, (
            f'suspect target: track {det.track_id} scored {score:.3f} over '
            f'{det.track_views} views (suspect at {config.threshold:.3f}); held at guided '
            f'until {config.confirm_frames} familiar views in a row or a label'))

    @staticmethod
    def _confirms(track: _Track, det: DrivingTrack, config: SuspectConfig) -> bool:
        """Count this frame toward confirmation; True once the track is confirmed."""
        familiar = (math.isfinite(det.calibrated_score)
                    and 0.0 <= det.calibrated_score < config.threshold)
        if not familiar:
            track.confirmations, track.last_confirming_box = 0, None
            return False
        box = (det.center_x, det.center_y, det.width, det.height)
        last = track.last_confirming_box
        if last is None or view_change(box, last) >= config.confirm_view_change:
            track.confirmations += 1
            track.last_confirming_box = box
        return track.confirmations >= config.confirm_frames
