"""Uncertainty evidence over a track's life (ROS-free).

The calibrated score decides one frame at a time, yet a robot approaching an object sees it
many times, from several places. Each view is a new measurement of the same object, so the
views are pooled: the track score is the **mean** calibrated score over the track's distinct
views. The mean, not the maximum: a known object looks strange from some view too, so the
largest score over many views rises for familiar objects as well and separates them from
unknown ones worse than one frame does, while the mean averages such views out
(docs/detector_contract.md, "Evidence over a track").

- **Distinct views.** A frame is a new view of its track only when its box moved or changed
  size by at least ``view_change`` since the last counted view (:func:`box_change`); a robot
  standing still adds nothing, so its many identical frames cannot outvote the other views.
  The first frame of a track always counts. The mean runs over the ``max_views`` most recent
  counted views, so an object the robot keeps in view follows its current appearance.
- **Frames without a score** (not finite or outside [0, 1]: the message's -1 when the model
  has no score reference) are not counted. A track without a counted view has the score
  :data:`NO_TRACK_SCORE`, -1, the convention of the calibrated score.
- **Broken tracks.** The IoU tracker gives an object a new id when it misses it for a few
  frames or its box jumps; the object is the same and so is its evidence. A track that
  disappears is remembered for ``memory_s`` seconds (of the frames' stamps, so a replayed
  bag behaves as it did live); a new track whose first box overlaps a remembered track's last
  box by ``reform_iou``, of the same class and with an embedding at cosine similarity
  ``reform_cosine`` or more, takes over that evidence (best match first; each remembered
  track goes to at most one new one).
- **Labels.** Once a person has labelled an object (``teach_object``), its earlier views
  were scored by a GP that did not know it: :meth:`TrackEvidence.label` clears the evidence
  of the track whose last embedding is closest to the labelled one and marks it labelled,
  and its later views rebuild the mean.

Memory is bounded by ``max_tracks`` tracks of at most ``max_views`` scores each; a frame
costs O(max_views) per detection and O(1) per track held, plus the comparison of each new
track with the remembered ones.
"""

from __future__ import annotations

import math
import numbers
import threading
from collections import OrderedDict, deque
from dataclasses import dataclass

import numpy as np

#: The track score of a track without a counted view: outside [0, 1], as the calibrated
#: score's value without a score reference.
NO_TRACK_SCORE = -1.0


@dataclass(frozen=True)
class TrackEvidenceConfig:
    """Settings of :class:`TrackEvidence` (see the module docstring).

    Attributes
    ----------
    view_change
        Smallest :func:`box_change` from the last counted view that makes a frame a new
        view, >= 0 (0.1: a tenth of the box's diagonal, or about 10 % of its area; 0: every
        frame is a view, for a fixed camera whose objects change in look, not in box).
    max_views
        Most recent counted views the mean runs over, >= 1.
    memory_s
        Seconds a track that disappeared is remembered for a new track to take over, >= 0.
    reform_iou
        Smallest IoU, in (0, 1], between a new track's first box and a remembered track's
        last box for the new one to take over its evidence.
    reform_cosine
        Smallest cosine similarity, in (0, 1], of their embeddings for the same; also the
        similarity a labelled embedding needs to a track's (:meth:`TrackEvidence.label`).
    max_tracks
        Most tracks held, live and remembered, >= 1; the least recently seen go first.

    Raises
    ------
    ValueError
        Naming the first setting that is not a number of its type in its range.
    """

    view_change: float = 0.1
    max_views: int = 64
    memory_s: float = 3.0
    reform_iou: float = 0.3
    reform_cosine: float = 0.8
    max_tracks: int = 256

    def __post_init__(self) -> None:
        for name, interval, inside in (
                ('view_change', '>= 0', lambda v: v >= 0.0),
                ('memory_s', '>= 0', lambda v: v >= 0.0),
                ('reform_iou', 'in (0, 1]', lambda v: 0.0 < v <= 1.0),
                ('reform_cosine', 'in (0, 1]', lambda v: 0.0 < v <= 1.0)):
            value = getattr(self, name)
            if not (isinstance(value, numbers.Real) and not isinstance(value, bool)
                    and math.isfinite(value) and inside(value)):
                raise ValueError(f'{name} must be a finite number {interval}, got {value!r}')
        for name in ('max_views', 'max_tracks'):
            value = getattr(self, name)
            if not (isinstance(value, numbers.Integral) and not isinstance(value, bool)
                    and int(value) >= 1):
                raise ValueError(f'{name} must be an integer >= 1, got {value!r}')


@dataclass(frozen=True)
class TrackScores:
    """The evidence of one frame's detections, aligned with them.

    Attributes
    ----------
    score
        ``(K,)`` float64 mean calibrated score over the track's counted views, in [0, 1];
        :data:`NO_TRACK_SCORE` for an untracked detection or a track without counted view.
    views
        ``(K,)`` int64 views counted since the evidence (re)started (the mean uses the
        ``max_views`` most recent); 0 where none.
    labelled
        ``(K,)`` bool, whether a person labelled the object since its evidence restarted.
    labels
        The name each labelled object was given; empty where none.
    """

    score: np.ndarray
    views: np.ndarray
    labelled: np.ndarray
    labels: tuple[str, ...] = ()


@dataclass(frozen=True)
class TrackState:
    """What :class:`TrackEvidence` holds of one track (:meth:`TrackEvidence.state`).

    Attributes
    ----------
    track_id
        The id the track has now (after any take-over).
    score, views, labelled
        As in :class:`TrackScores`.
    label
        The name a person gave the object; empty when not labelled.
    class_index
        The class of its last detection.
    last_seen
        Stamp (seconds) of its last detection.
    """

    track_id: int
    score: float
    views: int
    labelled: bool
    label: str
    class_index: int
    last_seen: float


Box = tuple[float, float, float, float]


def box_change(box: Box, reference: Box) -> float:
    """How far ``box`` is from ``reference`` as a view: the larger of the centre
    displacement over the reference's diagonal and ``|log|`` of the ratio of their areas.

    Both are ``center_x, center_y, width, height``. A degenerate reference (zero diagonal
    or area) gives 0 when the other box equals it and infinity when it differs.
    """
    cx, cy, w, h = box
    rx, ry, rw, rh = reference
    shift = math.hypot(cx - rx, cy - ry)
    diagonal = math.hypot(rw, rh)
    moved = shift / diagonal if diagonal > 0.0 else (math.inf if shift > 0.0 else 0.0)
    area, reference_area = w * h, rw * rh
    if area > 0.0 and reference_area > 0.0:
        resized = abs(math.log(area / reference_area))
    else:
        resized = 0.0 if area == reference_area else math.inf
    return max(moved, resized)


def _iou(a: Box, b: Box) -> float:
    ax, ay, aw, ah = a
    bx, by, bw, bh = b
    width = min(ax + aw / 2, bx + bw / 2) - max(ax - aw / 2, bx - bw / 2)
    height = min(ay + ah / 2, by + bh / 2) - max(ay - ah / 2, by - bh / 2)
    if width <= 0.0 or height <= 0.0:
        return 0.0
    inter = width * height
    return inter / (aw * ah + bw * bh - inter)


def _unit(vector: np.ndarray) -> np.ndarray | None:
    """``vector`` scaled to length 1; None when it has no direction (empty or zero)."""
    norm = float(np.linalg.norm(vector)) if vector.size else 0.0
    return vector / norm if norm > 0.0 else None


def _cosine(a: np.ndarray | None, b: np.ndarray | None) -> float:
    """Cosine similarity of two unit vectors; -inf when either is missing or their
    dimensions differ (embeddings of another model cannot be compared)."""
    if a is None or b is None or a.shape != b.shape:
        return -math.inf
    return float(a @ b)


@dataclass
class _Track:
    class_index: int
    box: Box
    embedding: np.ndarray | None
    last_seen: float
    scores: deque[float]
    views: int = 0
    view_box: Box | None = None
    labelled: bool = False
    label: str = ''
    score: float = NO_TRACK_SCORE

    def count(self, box: Box, score: float, view_change: float) -> None:
        """Count ``score`` when ``box`` is a new view (the first always is)."""
        if self.view_box is not None and box_change(box, self.view_box) < view_change:
            return
        self.scores.append(score)
        self.views += 1
        self.view_box = box
        # The window is at most max_views long: summing it is the O(views) of a frame, and
        # exact where a running sum would drift.
        self.score = math.fsum(self.scores) / len(self.scores)

    def restart(self) -> None:
        self.scores.clear()
        self.views, self.view_box, self.score = 0, None, NO_TRACK_SCORE


class TrackEvidence:
    """Per track id, the evidence over the track's life (module docstring).

    Frames go in through :meth:`update`, labels through :meth:`label`; both may be called
    from different threads (a node's image thread and its service thread).

    Parameters
    ----------
    config
        The settings; defaults when omitted.

    Raises
    ------
    ValueError
        When ``config`` is not a :class:`TrackEvidenceConfig`.
    """

    def __init__(self, config: TrackEvidenceConfig | None = None) -> None:
        config = TrackEvidenceConfig() if config is None else config
        if not isinstance(config, TrackEvidenceConfig):
            raise ValueError(f'config must be a TrackEvidenceConfig, got {config!r}')
        self._config = config
        # Least recently seen first, so the tracks dropped past max_tracks are the oldest.
        self._tracks: OrderedDict[int, _Track] = OrderedDict()
        self._stamp = -math.inf
        self._lock = threading.Lock()

    @property
    def config(self) -> TrackEvidenceConfig:
        """The settings in force; setting new ones keeps the evidence, cut to the new
        ``max_views`` and ``max_tracks``."""
        return self._config

    @config.setter
    def config(self, config: TrackEvidenceConfig) -> None:
        if not isinstance(config, TrackEvidenceConfig):
            raise ValueError(f'config must be a TrackEvidenceConfig, got {config!r}')
        with self._lock:
            if config.max_views != self._config.max_views:
                for track in self._tracks.values():
                    track.scores = deque(track.scores, maxlen=config.max_views)
                    if track.scores:
                        track.score = math.fsum(track.scores) / len(track.scores)
            self._config = config
            self._drop_oldest()

    def __len__(self) -> int:
        """Tracks held, live and remembered."""
        return len(self._tracks)

    def update(self, stamp: float, track_ids: np.ndarray, class_indices: np.ndarray,
               boxes: np.ndarray, scores: np.ndarray,
               embeddings: np.ndarray | None = None) -> TrackScores:
        """Add one frame's ``K`` detections; returns their tracks' evidence.

        Parameters
        ----------
        stamp
            The frame's time, seconds (the image's stamp). A stamp earlier than the
            previous frame's (a bag played again, a simulator reset) forgets every track:
            the views before the jump may be of another scene.
        track_ids
            ``(K,)`` track ids, unique within the frame; -1 (any negative id) for an
            untracked detection, which gets no evidence.
        class_indices
            ``(K,)`` class of each detection.
        boxes
            ``(K, 4)`` ``center_x, center_y, width, height``, pixels.
        scores
            ``(K,)`` calibrated scores; values that are not finite or lie outside [0, 1]
            (-1: no score reference) are not counted.
        embeddings
            ``(K, D)`` feature vectors, compared by cosine similarity to re-form tracks and
            to find a labelled object; ``None`` (or ``D`` 0) when there are none, which
            leaves every new track with fresh evidence.

        Raises
        ------
        ValueError
            When the arrays do not describe ``K`` detections, a box or an embedding is not
            finite, a box has a negative size, a track id repeats, or the stamp is not
            finite. Nothing is changed then.
        """
        stamp = float(stamp)
        if not math.isfinite(stamp):
            raise ValueError(f'stamp must be finite, got {stamp}')
        ids = np.asarray(track_ids).reshape(-1)
        count = len(ids)
        classes = np.asarray(class_indices).reshape(-1)
        if count == 0:
            # An empty list has no integer type to check.
            ids, classes = ids.astype(np.int64), classes.astype(np.int64)
        box_rows = np.asarray(boxes, dtype=np.float64)
        score_values = np.asarray(scores, dtype=np.float64).reshape(-1)
        vectors = (np.zeros((count, 0)) if embeddings is None
                   else np.asarray(embeddings, dtype=np.float64))
        if (ids.dtype.kind not in 'iu' or classes.dtype.kind not in 'iu'
                or classes.shape != (count,) or box_rows.shape != (count, 4)
                or score_values.shape != (count,) or vectors.ndim != 2
                or len(vectors) != count):
            raise ValueError(
                f'integer track ids and class indices, (K, 4) boxes, (K,) scores and (K, D) '
                f'embeddings of the same K detections expected, got {ids.shape} ids '
                f'({ids.dtype}), {classes.shape} classes ({classes.dtype}), boxes '
                f'{box_rows.shape}, scores {score_values.shape}, embeddings {vectors.shape}')
        if not np.isfinite(box_rows).all() or (box_rows[:, 2:] < 0.0).any():
            raise ValueError('boxes must be finite with non-negative width and height')
        if not np.isfinite(vectors).all():
            raise ValueError('embeddings must be finite')
        tracked = ids >= 0
        if len(np.unique(ids[tracked])) != int(tracked.sum()):
            raise ValueError('track ids of one frame must be unique')
        with self._lock:
            return self._update(stamp, ids.tolist(), classes.tolist(), box_rows.tolist(),
                                score_values.tolist(), vectors)

    def _update(self, stamp: float, ids: list[int], classes: list[int],
                boxes: list[list[float]], scores: list[float],
                vectors: np.ndarray) -> TrackScores:
        config = self._config
        if stamp < self._stamp:
            self._tracks.clear()
        self._stamp = stamp
        present = {track_id for track_id in ids if track_id >= 0}
        for track_id in [t for t, track in self._tracks.items()
                         if t not in present and stamp - track.last_seen > config.memory_s]:
            del self._tracks[track_id]
        # Normalised at once: one NumPy call per frame, not one per detection. Each row is
        # copied, so a track keeps its own vector and not the whole frame's array alive.
        norms = np.linalg.norm(vectors, axis=1) if vectors.shape[1] else np.zeros(len(ids))
        safe = np.where(norms > 0.0, norms, 1.0)
        units = [row.copy() if norm > 0.0 else None
                 for row, norm in zip(vectors / safe[:, None], norms.tolist(), strict=True)]
        rows: list[tuple[int, int, Box]] = [
            (d, track_id, (boxes[d][0], boxes[d][1], boxes[d][2], boxes[d][3]))
            for d, track_id in enumerate(ids) if track_id >= 0]
        self._take_over([row for row in rows if row[1] not in self._tracks], classes, units,
                        present, stamp)
        out_score = np.full(len(ids), NO_TRACK_SCORE)
        out_views = np.zeros(len(ids), dtype=np.int64)
        out_labelled = np.zeros(len(ids), dtype=bool)
        out_labels = [''] * len(ids)
        for d, track_id, box in rows:
            track = self._tracks[track_id]
            track.class_index, track.box, track.last_seen = classes[d], box, stamp
            if units[d] is not None:
                track.embedding = units[d]
            score = scores[d]
            if math.isfinite(score) and 0.0 <= score <= 1.0:
                track.count(box, score, config.view_change)
            self._tracks.move_to_end(track_id)
            out_score[d], out_views[d], out_labelled[d] = track.score, track.views, \
                track.labelled
            out_labels[d] = track.label
        self._drop_oldest()
        return TrackScores(out_score, out_views, out_labelled, tuple(out_labels))

    def _take_over(self, new: list[tuple[int, int, Box]], classes: list[int],
                   units: list[np.ndarray | None], present: set[int], stamp: float) -> None:
        """Give each new track the evidence of the remembered track it re-forms, or fresh
        evidence."""
        config = self._config
        remembered = [(t, track) for t, track in self._tracks.items() if t not in present]
        pairs = []
        for d, _, box in new:
            for r, (_, track) in enumerate(remembered):
                if track.class_index != classes[d]:
                    continue
                iou = _iou(box, track.box)
                cosine = _cosine(units[d], track.embedding)
                if iou >= config.reform_iou and cosine >= config.reform_cosine:
                    # The embedding says most about identity, the overlap breaks its ties.
                    pairs.append((-cosine, -iou, r, d))
        pairs.sort()
        heirs: dict[int, int] = {}
        taken: set[int] = set()
        for _, _, r, d in pairs:
            if d not in heirs and r not in taken:
                heirs[d] = r
                taken.add(r)
        for d, track_id, box in new:
            if d in heirs:
                old_id, track = remembered[heirs[d]]
                del self._tracks[old_id]
            else:
                track = _Track(classes[d], box, units[d], stamp,
                               deque(maxlen=config.max_views))
            self._tracks[track_id] = track

    def _drop_oldest(self) -> None:
        while len(self._tracks) > self._config.max_tracks:
            self._tracks.popitem(last=False)

    def label(self, embedding: np.ndarray, label_name: str) -> int | None:
        """A person labelled the object of ``embedding``: the held track (live or
        remembered) whose last embedding is closest to it, at cosine similarity
        ``reform_cosine`` or more, has its evidence cleared and is marked labelled with
        ``label_name``; its next views rebuild the mean.

        Returns
        -------
        int or None
            The track's id; None when no track is close enough (or ``embedding`` is empty
            or zero).

        Raises
        ------
        ValueError
            When ``embedding`` is not a finite vector or ``label_name`` not a string.
        """
        vector = np.asarray(embedding, dtype=np.float64)
        if vector.ndim != 1 or not np.isfinite(vector).all():
            raise ValueError(f'embedding must be a finite vector, got shape {vector.shape}')
        if not isinstance(label_name, str):
            raise ValueError(f'label_name must be a string, got {label_name!r}')
        unit = _unit(vector)
        with self._lock:
            # Ties go to the most recently seen track (the held tracks are in that order).
            best, best_cosine = None, self._config.reform_cosine
            for track_id, track in self._tracks.items():
                cosine = _cosine(unit, track.embedding)
                if cosine >= best_cosine:
                    best, best_cosine = track_id, cosine
            if best is None:
                return None
            track = self._tracks[best]
            track.restart()
            track.labelled, track.label = True, label_name
            return best

    def state(self, track_id: int) -> TrackState | None:
        """What is held of track ``track_id``; None when it is not held."""
        with self._lock:
            track = self._tracks.get(int(track_id))
            if track is None:
                return None
            return TrackState(int(track_id), track.score, track.views, track.labelled,
                              track.label, track.class_index, track.last_seen)
