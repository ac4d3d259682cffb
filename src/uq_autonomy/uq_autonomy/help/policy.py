"""Ask-for-help policy: when to ask a person what a tracked object is.

ROS-free core of the ask-for-help node (the node only adapts ``DetectionArray`` messages,
parameters and the ``HelpRequest``/``ProvideLabel`` plumbing to it). Deterministic: every
entry point takes the time explicitly (the image stamp, in seconds), so tests drive it with
hand-built detections and invented clocks.

Evidence is per track. A track earns a request when

* its epistemic signal (``calibrated_score`` by default, ``gp_variance`` or
  ``mutual_information``; a parameter) is above the signal's threshold in at least
  ``min_frames_above`` (N) of its last ``window_frames`` (M) observations, or
* it is flagged out-of-distribution in at least ``ood_min_frames`` of its last M
  observations (``ood_mode='trigger'``; ``'evidence'`` counts an OOD flag as a frame above
  the threshold instead, ``'ignore'`` disregards the flag).

No repeated questions:

* a track is asked about at most once, for as long as the policy remembers it (pending or
  answered alike); :meth:`HelpPolicy.cancel` is the only way to make it askable again;
* across track breaks, a track that earns a request is first matched against the objects
  already asked about or labelled: by cosine similarity of the mean of its recent
  embeddings to the object's embedding (``embedding_match_threshold``), or, when either side
  has no embedding, by IoU with the object's last box, same predicted class, seen within
  ``iou_match_max_age_s`` (the camera may move, so an old box says nothing). A match binds
  the track to that object instead of asking again;
* a budget of ``requests_per_minute`` and ``requests_per_hour`` over sliding windows, and at
  least ``cooldown_s`` between two requests. A track held back by the budget keeps its
  evidence and is asked about once the budget allows, if it still qualifies.

When several tracks qualify in one frame, the most uncertain is asked about first.

A question before the hand-over: when the arbitration holds the level at guided because the
autonomy's target track is suspect (``AutonomyState.suspect_hold``), :meth:`HelpPolicy.
ask_before_hand_over` marks the track, and its next frame raises a request at once ("is this
the ellipsoid?"), ahead of the evidence rule and of the budget, since the hand-over waits for
the answer. A track already asked about, or matched to an object asked about or labelled, is
not asked again.

Time going backwards by more than ``time_jump_tolerance_s`` (a bag looping, a simulator
reset) resets everything that is tied to the clock or to track ids (tracks, budget, cooldown,
the boxes of the IoU fallback), and the policy's clock restarts at the new stamp, so one
stamp from the future costs one reset rather than every frame until real time catches up
(the node also refuses frames stamped ahead of its clock); the embeddings and labels of
objects already asked about are kept, since they do not depend on time. Memory is bounded:
tracks unseen for ``track_timeout_s`` are forgotten, and at most ``max_tracks`` tracks and
``max_objects`` objects are kept (least recently seen first out).

Thresholds are calibrated from the detector's validation data with
:func:`calibrate_threshold`; see ``docs/ask_for_help.md``.
"""

from __future__ import annotations

import math
import uuid
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
from numpy.typing import ArrayLike, NDArray

from uq_autonomy.arbitration.config import NO_CALIBRATED_SCORE, UncertaintySignal, parse_enum
from uq_common.str_enum import StrEnum

MINUTE_S = 60.0
HOUR_S = 3600.0


class OodMode(StrEnum):
    """What an out-of-distribution flag on a detection does."""

    TRIGGER = 'trigger'  # flagged in >= ood_min_frames of the window: a request on its own
    EVIDENCE = 'evidence'  # a flagged frame counts as a frame above the signal threshold
    IGNORE = 'ignore'


class Trigger(StrEnum):
    """Why a request was raised."""

    UNCERTAINTY = 'uncertainty'
    OUT_OF_DISTRIBUTION = 'out_of_distribution'
    SUSPECT_TARGET = 'suspect_target'  # the autonomy's target is suspect; asked before hand-over


class Suppression(StrEnum):
    """Why a track that qualified was not asked about (keys of :attr:`HelpPolicy.counters`)."""

    SAME_OBJECT_EMBEDDING = 'same_object_embedding'
    SAME_OBJECT_IOU = 'same_object_iou'
    COOLDOWN = 'cooldown'
    BUDGET_MINUTE = 'budget_per_minute'
    BUDGET_HOUR = 'budget_per_hour'


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


def _is_number(x: object) -> bool:
    return isinstance(x, int | float | np.floating | np.integer) and not isinstance(x, bool)


@dataclass(frozen=True)
class Candidate:
    """A candidate label offered to the person, with the detector's probability."""

    label: str
    probability: float


@dataclass(frozen=True)
class TrackObservation:
    """One tracked detection of one frame, as the policy needs it.

    Parameters
    ----------
    track_id : int
        Tracker id; negative means untracked (such detections carry no evidence).
    class_index : int
        Index of the most probable known class (-1 when unknown).
    class_name : str
        Its name.
    gp_variance : float
        NTK-GP predictive variance (logit^2), the primary epistemic signal.
    mutual_information : float
        Epistemic part of the predictive entropy, nats.
    calibrated_score : float
        Fraction of the model's known validation objects whose GP variance is below this
        one, in [0, 1]; -1 when the model has no score reference.
    out_of_distribution : bool
        The detector's OOD flag.
    box : tuple of 4 floats
        ``(center_x, center_y, width, height)`` in pixels, as ``uq_msgs/Detection``.
    embedding : array-like or None
        The detection's feature vector (any length; compared by cosine similarity).
    candidates : tuple of Candidate
        Labels to offer the person, best first.
    score : float
        Objectness confidence.
    """

    track_id: int
    class_index: int = -1
    class_name: str = ''
    gp_variance: float = 0.0
    mutual_information: float = 0.0
    out_of_distribution: bool = False
    box: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0)
    embedding: ArrayLike | None = None
    candidates: tuple[Candidate, ...] = ()
    score: float = 1.0
    calibrated_score: float = NO_CALIBRATED_SCORE

    def signal(self, which: UncertaintySignal) -> float:
        """Value of the chosen epistemic signal."""
        if which == UncertaintySignal.MUTUAL_INFORMATION:
            return float(self.mutual_information)
        if which == UncertaintySignal.GP_VARIANCE:
            return float(self.gp_variance)
        return float(self.calibrated_score)


@dataclass(frozen=True)
class HelpPolicyConfig:
    """Everything that tunes the policy; validated on construction.

    Parameters
    ----------
    signal : UncertaintySignal or str
        ``'calibrated_score'``, ``'gp_variance'`` or ``'mutual_information'``.
    calibrated_score_threshold : float
        Threshold when the signal is the calibrated score (unitless, in [0, 1): the same
        for every model). The default, 0.96, asks about objects more uncertain than 96 %
        of the model's known validation objects.
    gp_variance_threshold : float
        Threshold when the signal is the GP variance (logit^2 of one model; the default
        suits the shipped model only).
    mutual_information_threshold : float
        Threshold when the signal is the mutual information (nats).
    window_frames : int
        M, the number of a track's most recent observations the evidence looks at.
    min_frames_above : int
        N <= M, observations above the threshold needed for a request.
    ood_mode : OodMode or str
        ``'trigger'``, ``'evidence'`` or ``'ignore'`` (module docstring).
    ood_min_frames : int
        OOD-flagged observations in the window that trigger a request (``'trigger'`` mode).
    embedding_match_threshold : float
        Cosine similarity in (0, 1] at or above which a track is the same object as one asked
        about or labelled before.
    iou_match_threshold : float
        IoU in (0, 1] for the fallback match when embeddings are missing.
    iou_match_max_age_s : float
        The fallback only matches objects seen this recently.
    requests_per_minute, requests_per_hour : int
        Budget over sliding windows of 60 s and 3600 s.
    cooldown_s : float
        Least time between two requests.
    track_timeout_s : float
        A track unseen this long is forgotten.
    max_tracks, max_objects : int
        Memory bounds: tracks followed, objects (asked about or labelled) remembered.
    time_jump_tolerance_s : float
        A stamp this much older than the newest seen resets the clock-bound state and
        restarts the clock at that stamp; smaller steps back (reordered messages) are
        absorbed.

    Raises
    ------
    ValueError
        On any out-of-range or inconsistent value, naming it.
    """

    signal: UncertaintySignal = UncertaintySignal.CALIBRATED_SCORE
    calibrated_score_threshold: float = 0.96
    gp_variance_threshold: float = 4e-4
    mutual_information_threshold: float = 0.1
    window_frames: int = 5
    min_frames_above: int = 4
    ood_mode: OodMode = OodMode.TRIGGER
    ood_min_frames: int = 3
    embedding_match_threshold: float = 0.9
    iou_match_threshold: float = 0.5
    iou_match_max_age_s: float = 5.0
    requests_per_minute: int = 3
    requests_per_hour: int = 30
    cooldown_s: float = 5.0
    track_timeout_s: float = 5.0
    max_tracks: int = 512
    max_objects: int = 4096
    time_jump_tolerance_s: float = 1.0

    def __post_init__(self) -> None:
        object.__setattr__(self, 'signal', parse_enum(UncertaintySignal, self.signal, 'signal'))
        object.__setattr__(self, 'ood_mode', parse_enum(OodMode, self.ood_mode, 'ood_mode'))
        for name in ('window_frames', 'min_frames_above', 'ood_min_frames',
                     'requests_per_minute', 'requests_per_hour', 'max_tracks', 'max_objects'):
            value = getattr(self, name)
            _require(isinstance(value, int | np.integer) and not isinstance(value, bool)
                     and bool(value >= 1), f'{name} must be an integer >= 1, got {value!r}')
        _require(_is_number(self.calibrated_score_threshold)
                 and 0.0 <= self.calibrated_score_threshold < 1.0,
                 'calibrated_score_threshold must be in [0, 1) (a score is at most 1, so a '
                 'threshold of 1 could never be exceeded), got '
                 f'{self.calibrated_score_threshold!r}')
        for name in ('gp_variance_threshold', 'mutual_information_threshold', 'cooldown_s',
                     'iou_match_max_age_s', 'time_jump_tolerance_s'):
            value = getattr(self, name)
            _require(_is_number(value) and math.isfinite(value) and value >= 0.0,
                     f'{name} must be a finite number >= 0, got {value!r}')
        _require(_is_number(self.track_timeout_s) and math.isfinite(self.track_timeout_s)
                 and self.track_timeout_s > 0.0,
                 f'track_timeout_s must be a finite number > 0, got {self.track_timeout_s!r}')
        for name in ('embedding_match_threshold', 'iou_match_threshold'):
            value = getattr(self, name)
            _require(_is_number(value) and 0.0 < value <= 1.0,
                     f'{name} must be in (0, 1], got {value!r}')
        _require(self.min_frames_above <= self.window_frames,
                 f'min_frames_above ({self.min_frames_above}) must not exceed window_frames '
                 f'({self.window_frames}): the evidence could never be met')
        _require(self.ood_mode != OodMode.TRIGGER or self.ood_min_frames <= self.window_frames,
                 f'ood_min_frames ({self.ood_min_frames}) must not exceed window_frames '
                 f'({self.window_frames}): the OOD trigger could never fire')
        _require(self.requests_per_hour >= self.requests_per_minute,
                 f'requests_per_hour ({self.requests_per_hour}) must be >= requests_per_minute '
                 f'({self.requests_per_minute})')

    @property
    def threshold(self) -> float:
        """Threshold of the selected signal."""
        if self.signal == UncertaintySignal.MUTUAL_INFORMATION:
            return float(self.mutual_information_threshold)
        if self.signal == UncertaintySignal.GP_VARIANCE:
            return float(self.gp_variance_threshold)
        return float(self.calibrated_score_threshold)


@dataclass(frozen=True)
class HelpDecision:
    """A request to raise: the node turns it into a ``HelpRequest``.

    ``stamp`` is the stamp of the frame passed to :meth:`HelpPolicy.observe` (the image to
    crop), even when a slightly reordered frame made the policy's clock hold still.
    """

    request_id: str
    track_id: int
    stamp: float
    trigger: Trigger
    reason: str
    observation: TrackObservation
    candidates: tuple[Candidate, ...]
    signal: UncertaintySignal
    signal_value: float  # mean of the signal over the window's frames above the threshold
    threshold: float
    frames_above: int
    ood_frames: int
    window: int
    embedding: NDArray[np.float32] | None  # mean unit embedding of the track's window


class _ObjectStatus(StrEnum):
    PENDING = 'pending'
    ANSWERED = 'answered'


@dataclass
class _KnownObject:
    key: str
    status: _ObjectStatus
    label: str | None = None
    embedding: NDArray[np.float64] | None = None  # unit norm
    class_index: int = -1
    box: tuple[float, float, float, float] | None = None
    last_seen: float | None = None
    issued_at: float | None = None  # stamp of the request raised about it, if any


@dataclass
class _Track:
    track_id: int
    window: int
    last_seen: float
    above: deque[bool] = field(init=False)
    ood: deque[bool] = field(init=False)
    values: deque[float] = field(init=False)
    embeddings: deque[NDArray[np.float64] | None] = field(init=False)
    last: TrackObservation | None = None
    object_key: str | None = None  # set once asked about, or matched to a known object

    def __post_init__(self) -> None:
        self.resize(self.window)

    def resize(self, window: int) -> None:
        old = (getattr(self, 'above', ()), getattr(self, 'ood', ()),
               getattr(self, 'values', ()), getattr(self, 'embeddings', ()))
        self.window = window
        self.above = deque(old[0], maxlen=window)
        self.ood = deque(old[1], maxlen=window)
        self.values = deque(old[2], maxlen=window)
        self.embeddings = deque(old[3], maxlen=window)

    def mean_embedding(self) -> NDArray[np.float64] | None:
        vectors = [e for e in self.embeddings if e is not None]
        if not vectors:
            return None
        dim = vectors[-1].shape[0]
        vectors = [v for v in vectors if v.shape[0] == dim]
        return _unit(np.mean(vectors, axis=0))


def _unit(vector: ArrayLike | None) -> NDArray[np.float64] | None:
    """Unit-norm float64 copy of ``vector``; None when absent, empty, non-finite or zero."""
    if vector is None:
        return None
    v = np.asarray(vector, dtype=np.float64).reshape(-1)
    if v.size == 0 or not np.all(np.isfinite(v)):
        return None
    norm = float(np.linalg.norm(v))
    if norm <= 1e-12:
        return None
    return v / norm


def box_iou(a: Sequence[float], b: Sequence[float]) -> float:
    """IoU of two ``(center_x, center_y, width, height)`` boxes."""
    ax0, ay0, ax1, ay1 = a[0] - a[2] / 2, a[1] - a[3] / 2, a[0] + a[2] / 2, a[1] + a[3] / 2
    bx0, by0, bx1, by1 = b[0] - b[2] / 2, b[1] - b[3] / 2, b[0] + b[2] / 2, b[1] + b[3] / 2
    iw = min(ax1, bx1) - max(ax0, bx0)
    ih = min(ay1, by1) - max(ay0, by0)
    if iw <= 0.0 or ih <= 0.0:
        return 0.0
    inter = iw * ih
    union = a[2] * a[3] + b[2] * b[3] - inter
    return float(inter / union) if union > 0.0 else 0.0


def _fmt(x: float) -> str:
    return f'{x:.3g}'


class HelpPolicy:
    """Per-track evidence, de-duplication and budget; see the module docstring.

    Parameters
    ----------
    config : HelpPolicyConfig
        Validated configuration (:meth:`reconfigure` swaps it at run time).
    new_request_id : callable, optional
        Returns a fresh request id (default: 32 hex digits of a random UUID). Ids must be
        unique across restarts, since the label store keys answers by them.
    """

    def __init__(self, config: HelpPolicyConfig | None = None,
                 new_request_id: Callable[[], str] | None = None) -> None:
        self._config = config if config is not None else HelpPolicyConfig()
        self._new_request_id = new_request_id or (lambda: uuid.uuid4().hex)
        self._tracks: OrderedDict[int, _Track] = OrderedDict()  # least recently seen first
        self._objects: OrderedDict[str, _KnownObject] = OrderedDict()  # least recent first
        self._asked_tracks: OrderedDict[int, str] = OrderedDict()  # track id -> object key
        self._issued: deque[float] = deque()  # stamps of requests in the last hour
        self._hand_over: OrderedDict[int, None] = OrderedDict()  # tracks to ask about now
        self._last_stamp: float | None = None
        self._known_counter = 0
        self.counters: Counter[str] = Counter()

    # -- configuration -------------------------------------------------------------------

    @property
    def config(self) -> HelpPolicyConfig:
        """The configuration in force."""
        return self._config

    def reconfigure(self, config: HelpPolicyConfig) -> None:
        """Swap the configuration, keeping tracks (windows resized), objects and budget."""
        if not isinstance(config, HelpPolicyConfig):
            raise TypeError(f'config must be a HelpPolicyConfig, got {type(config).__name__}')
        self._config = config
        for track in self._tracks.values():
            if track.window != config.window_frames:
                track.resize(config.window_frames)
        self._trim(self._tracks, config.max_tracks)
        self._trim(self._objects, config.max_objects)
        self._trim(self._asked_tracks, config.max_objects)

    # -- main entry point ----------------------------------------------------------------

    def observe(self, stamp: float,
                detections: Sequence[TrackObservation]) -> list[HelpDecision]:
        """Feed one frame's tracked detections; returns the requests to raise now.

        Parameters
        ----------
        stamp : float
            The frame's (image) time in seconds.
        detections : sequence of TrackObservation
            Detections of that frame. Untracked ones (negative ``track_id``), repeated track
            ids and non-finite signals are skipped and counted in :attr:`counters`.

        Raises
        ------
        ValueError
            When ``stamp`` is not a finite number.
        """
        _require(_is_number(stamp) and math.isfinite(stamp),
                 f'stamp must be a finite number of seconds, got {stamp!r}')
        stamp = float(stamp)
        cfg = self._config
        if self._last_stamp is not None and stamp < self._last_stamp - cfg.time_jump_tolerance_s:
            self._reset_clock()
            self.counters['time_reset'] += 1
        now = stamp if self._last_stamp is None else max(stamp, self._last_stamp)
        self._last_stamp = now
        self._forget(now)

        qualified: list[tuple[float, _Track, TrackObservation, Trigger]] = []
        hand_over: list[tuple[_Track, TrackObservation]] = []
        seen: set[int] = set()
        threshold = cfg.threshold
        for det in detections:
            track_id = int(det.track_id)
            if track_id < 0:
                self.counters['untracked'] += 1
                continue
            if track_id in seen:
                self.counters['repeated_track_in_frame'] += 1
                continue
            value = det.signal(cfg.signal)
            if not math.isfinite(value):
                self.counters['non_finite_signal'] += 1
                continue
            seen.add(track_id)
            track = self._track(track_id, now)
            ood = bool(det.out_of_distribution) and cfg.ood_mode != OodMode.IGNORE
            track.above.append(value > threshold or (ood and cfg.ood_mode == OodMode.EVIDENCE))
            track.ood.append(ood)
            track.values.append(value)
            track.embeddings.append(_unit(det.embedding))
            track.last = det
            asked_before_hand_over = track_id in self._hand_over
            self._hand_over.pop(track_id, None)
            if track.object_key is not None:
                self._refresh_object(track.object_key, det, now)
                continue
            if asked_before_hand_over:
                hand_over.append((track, det))
                continue
            trigger = self._trigger(track)
            if trigger is not None:
                qualified.append((value, track, det, trigger))

        decisions: list[HelpDecision] = []
        for track, det in hand_over:
            match = self._match_object(track, det, now)
            if match is not None:
                key, how = match
                self._bind(track, key, det, now)
                self.counters[how] += 1
                continue
            decisions.append(self._raise(track, det, Trigger.SUSPECT_TARGET, now, stamp))
        # The most uncertain first: if the budget allows only one, it goes to the worst case.
        for _value, track, det, trigger in sorted(qualified, key=lambda q: -q[0]):
            match = self._match_object(track, det, now)
            if match is not None:
                key, how = match
                self._bind(track, key, det, now)
                self.counters[how] += 1
                continue
            blocked = self._budget_block(now)
            if blocked is not None:
                self.counters[blocked] += 1
                continue
            decisions.append(self._raise(track, det, trigger, now, stamp))
        return decisions

    def ask_before_hand_over(self, track_id: int) -> None:
        """Ask about ``track_id`` on its next frame: the arbitration holds the hand-over to
        the autonomy because this target track is suspect (see the module docstring)."""
        track_id = int(track_id)
        if track_id < 0:
            return
        self._hand_over[track_id] = None
        self._hand_over.move_to_end(track_id)
        self._trim(self._hand_over, self._config.max_tracks)

    # -- answers and bookkeeping from the node -------------------------------------------

    def mark_answered(self, request_id: str, label: str,
                      embedding: ArrayLike | None = None) -> bool:
        """Record the person's answer; the object then counts as labelled.

        Returns False when the request is unknown (never raised, cancelled or forgotten).
        """
        obj = self._objects.get(request_id)
        if obj is None:
            return False
        obj.status = _ObjectStatus.ANSWERED
        obj.label = label
        unit = _unit(embedding)
        if unit is not None and obj.embedding is None:
            obj.embedding = unit
        self._objects.move_to_end(request_id)
        return True

    def cancel(self, request_id: str, refund_budget: bool = True) -> bool:
        """Forget a request that could not be delivered (e.g. no image for its crop).

        Its tracks become askable again; with ``refund_budget`` its slot in the budget and
        cooldown is given back. Returns False when the request is unknown.
        """
        obj = self._objects.pop(request_id, None)
        if obj is None:
            return False
        for track in self._tracks.values():
            if track.object_key == request_id:
                track.object_key = None
        for track_id in [t for t, k in self._asked_tracks.items() if k == request_id]:
            del self._asked_tracks[track_id]
        if refund_budget and obj.issued_at is not None and obj.issued_at in self._issued:
            self._issued.remove(obj.issued_at)
        return True

    def remember(self, key: str, *, label: str | None = None,
                 embedding: ArrayLike | None = None, class_index: int = -1) -> None:
        """Add an object asked about (``label=None``: pending) or labelled before.

        Used at start-up to seed the policy from the label store, so that objects answered
        in an earlier run are not asked about again.
        """
        status = _ObjectStatus.PENDING if label is None else _ObjectStatus.ANSWERED
        self._objects[key] = _KnownObject(key=key, status=status, label=label,
                                          embedding=_unit(embedding),
                                          class_index=int(class_index))
        self._objects.move_to_end(key)
        self._trim(self._objects, self._config.max_objects)

    def pending(self) -> list[str]:
        """Ids of requests raised (or remembered) and not answered yet."""
        return [k for k, o in self._objects.items() if o.status == _ObjectStatus.PENDING]

    def label_of(self, key: str) -> str | None:
        """The label recorded for a request or remembered object, if any."""
        obj = self._objects.get(key)
        return obj.label if obj is not None else None

    @property
    def num_tracks(self) -> int:
        """Tracks currently followed."""
        return len(self._tracks)

    @property
    def num_objects(self) -> int:
        """Objects remembered (asked about or labelled)."""
        return len(self._objects)

    def requests_in_window(self, now: float, window_s: float) -> int:
        """Requests raised within ``window_s`` seconds up to ``now`` (budget accounting)."""
        return sum(1 for t in self._issued if now - t < window_s)

    # -- internals -----------------------------------------------------------------------

    @staticmethod
    def _trim(mapping: OrderedDict, size: int) -> None:
        while len(mapping) > size:
            mapping.popitem(last=False)

    def _reset_clock(self) -> None:
        # The newest stamp goes too: kept, a stamp from the far future would make every
        # later frame look like a jump back and reset again.
        self._last_stamp = None
        self._tracks.clear()
        self._asked_tracks.clear()  # a tracker restarted with the clock reuses its ids
        self._hand_over.clear()
        self._issued.clear()
        for obj in self._objects.values():
            obj.box = None
            obj.last_seen = None

    def _forget(self, now: float) -> None:
        timeout = self._config.track_timeout_s
        while self._tracks:
            track = next(iter(self._tracks.values()))
            if now - track.last_seen <= timeout:
                break
            self._tracks.popitem(last=False)
        while self._issued and now - self._issued[0] >= HOUR_S:
            self._issued.popleft()

    def _track(self, track_id: int, now: float) -> _Track:
        track = self._tracks.get(track_id)
        if track is None:
            track = _Track(track_id, self._config.window_frames, now)
            key = self._asked_tracks.get(track_id)
            if key is not None:
                track.object_key = key
            self._tracks[track_id] = track
            self._trim(self._tracks, self._config.max_tracks)
        else:
            self._tracks.move_to_end(track_id)
        track.last_seen = now
        return track

    def _trigger(self, track: _Track) -> Trigger | None:
        cfg = self._config
        if sum(track.above) >= cfg.min_frames_above:
            return Trigger.UNCERTAINTY
        if cfg.ood_mode == OodMode.TRIGGER and sum(track.ood) >= cfg.ood_min_frames:
            return Trigger.OUT_OF_DISTRIBUTION
        return None

    def _match_object(self, track: _Track, det: TrackObservation,
                      now: float) -> tuple[str, str] | None:
        cfg = self._config
        embedding = track.mean_embedding()
        best_key, best_sim = None, -math.inf
        iou_key, best_iou = None, 0.0
        for key, obj in self._objects.items():
            if embedding is not None and obj.embedding is not None:
                if obj.embedding.shape == embedding.shape:
                    sim = float(obj.embedding @ embedding)
                    if sim >= cfg.embedding_match_threshold and sim > best_sim:
                        best_key, best_sim = key, sim
                continue
            if (obj.box is not None and obj.last_seen is not None
                    and now - obj.last_seen <= cfg.iou_match_max_age_s
                    and obj.class_index == int(det.class_index)):
                iou = box_iou(obj.box, det.box)
                if iou >= cfg.iou_match_threshold and iou > best_iou:
                    iou_key, best_iou = key, iou
        if best_key is not None:
            return best_key, Suppression.SAME_OBJECT_EMBEDDING.value
        if iou_key is not None:
            return iou_key, Suppression.SAME_OBJECT_IOU.value
        return None

    def _bind(self, track: _Track, key: str, det: TrackObservation, now: float) -> None:
        track.object_key = key
        self._asked_tracks[track.track_id] = key
        self._asked_tracks.move_to_end(track.track_id)
        self._trim(self._asked_tracks, self._config.max_objects)
        self._refresh_object(key, det, now)

    def _refresh_object(self, key: str, det: TrackObservation, now: float) -> None:
        obj = self._objects.get(key)
        if obj is None:
            return
        obj.box = tuple(float(v) for v in det.box)  # type: ignore[assignment]
        obj.class_index = int(det.class_index)
        obj.last_seen = now
        self._objects.move_to_end(key)

    def _budget_block(self, now: float) -> str | None:
        cfg = self._config
        if self._issued and now - self._issued[-1] < cfg.cooldown_s:
            return Suppression.COOLDOWN.value
        if self.requests_in_window(now, MINUTE_S) >= cfg.requests_per_minute:
            return Suppression.BUDGET_MINUTE.value
        if self.requests_in_window(now, HOUR_S) >= cfg.requests_per_hour:
            return Suppression.BUDGET_HOUR.value
        return None

    def _raise(self, track: _Track, det: TrackObservation, trigger: Trigger,
               now: float, frame_stamp: float) -> HelpDecision:
        cfg = self._config
        request_id = str(self._new_request_id())
        if request_id in self._objects:
            raise RuntimeError(f'request id {request_id!r} was issued twice')
        embedding = track.mean_embedding()
        obj = _KnownObject(key=request_id, status=_ObjectStatus.PENDING, embedding=embedding,
                           issued_at=now)
        self._objects[request_id] = obj
        self._trim(self._objects, cfg.max_objects)
        self._bind(track, request_id, det, now)
        self._issued.append(now)
        self.counters['requests'] += 1

        above = [v for v, a in zip(track.values, track.above, strict=True) if a]
        frames_above, ood_frames = sum(track.above), sum(track.ood)
        mean_above = float(np.mean(above)) if above else float(track.values[-1])
        reason = self._reason(trigger, mean_above, frames_above, ood_frames, len(track.values),
                              det)
        return HelpDecision(
            request_id=request_id, track_id=track.track_id, stamp=frame_stamp, trigger=trigger,
            reason=reason, observation=det, candidates=tuple(det.candidates),
            signal=cfg.signal, signal_value=mean_above, threshold=cfg.threshold,
            frames_above=frames_above, ood_frames=ood_frames, window=len(track.values),
            embedding=None if embedding is None else embedding.astype(np.float32))

    def _reason(self, trigger: Trigger, value: float, frames_above: int, ood_frames: int,
                frames: int, det: TrackObservation) -> str:
        cfg = self._config
        if cfg.signal == UncertaintySignal.MUTUAL_INFORMATION:
            signal_text = f'mutual information {_fmt(value)} nats above {_fmt(cfg.threshold)}'
        elif cfg.signal == UncertaintySignal.GP_VARIANCE:
            signal_text = f'GP variance {_fmt(value)} above {_fmt(cfg.threshold)}'
        else:
            signal_text = (f'calibrated score {value:.3f} above {cfg.threshold:.3f} (more '
                           f'uncertain than {100 * value:.1f} % of the known objects)')
        if trigger == Trigger.SUSPECT_TARGET:
            name = det.class_name or 'target'
            text = (f'Is this the {name}? Suspect target before hand-over: it looked '
                    'unfamiliar over its views, and the robot waits for your answer before it '
                    f'takes over ({cfg.signal.value.replace("_", " ")} now '
                    f'{_fmt(det.signal(cfg.signal))})')
        elif trigger == Trigger.UNCERTAINTY:
            text = (f"I don't know what this object is: {signal_text} "
                    f'in {frames_above} of the last {frames} frames')
            if ood_frames:
                text += f' (flagged out-of-distribution in {ood_frames})'
        else:
            current = det.signal(cfg.signal)
            unit = ' nats' if cfg.signal == UncertaintySignal.MUTUAL_INFORMATION else ''
            text = ("I don't know what this object is: it looks unlike anything I was trained "
                    f'on (out-of-distribution in {ood_frames} of the last {frames} frames, '
                    f'{cfg.signal.value.replace("_", " ")} now {_fmt(current)}{unit})')
        if det.candidates:
            best = det.candidates[0]
            text += f"; my best guess is '{best.label}' (p={best.probability:.2f})"
        return text


@dataclass(frozen=True)
class ThresholdCalibration:
    """Outcome of :func:`calibrate_threshold`.

    ``false_request_rate`` is the share of known-object tracks that would earn a request at
    ``threshold`` (at most the target), ``recall`` the share of unknown-object tracks that
    would (None without unknown tracks). Tracks shorter than ``min_frames_above`` can never
    earn a request and are left out of both shares (``skipped_short``).
    """

    threshold: float
    target_false_request_rate: float
    false_request_rate: float
    recall: float | None
    known_tracks: int
    unknown_tracks: int
    skipped_short: int
    min_frames_above: int
    window_frames: int


def track_trigger_score(values: ArrayLike, min_frames_above: int, window_frames: int) -> float:
    """Largest threshold at which a track with these per-frame signal values earns a request.

    The policy asks when the value is above the threshold in at least N of the last M frames
    (also while fewer than M frames are seen). That holds for some frame iff the threshold is
    below the N-th largest value of some window, so the score is the maximum over windows
    ending at each frame of the N-th largest value in it; ``-inf`` when the track has fewer
    than N frames.

    Raises
    ------
    ValueError
        On non-finite values or ``not 1 <= min_frames_above <= window_frames``.
    """
    _require(1 <= min_frames_above <= window_frames,
             f'need 1 <= min_frames_above <= window_frames, got {min_frames_above} and '
             f'{window_frames}')
    v = np.asarray(values, dtype=np.float64).reshape(-1)
    _require(bool(np.all(np.isfinite(v))), 'track values must be finite')
    if v.size < min_frames_above:
        return -math.inf
    best = -math.inf
    for end in range(min_frames_above, v.size + 1):
        window = v[max(0, end - window_frames):end]
        best = max(best, float(np.partition(window, -min_frames_above)[-min_frames_above]))
    return best


def _tracks_of(data: ArrayLike | Sequence[ArrayLike]) -> list[NDArray[np.float64]]:
    if isinstance(data, np.ndarray) and data.ndim == 1:
        return [data[i:i + 1].astype(np.float64) for i in range(data.size)]
    return [np.asarray(t, dtype=np.float64).reshape(-1) for t in data]  # type: ignore[union-attr]


def calibrate_threshold(known: ArrayLike | Sequence[ArrayLike], target_false_request_rate: float,
                        *, min_frames_above: int = 1, window_frames: int = 1,
                        unknown: ArrayLike | Sequence[ArrayLike] | None = None
                        ) -> ThresholdCalibration:
    """Pick the signal threshold for a target rate of requests on known objects.

    Parameters
    ----------
    known : 1-D array, or sequence of 1-D arrays
        The detector's epistemic signal on correctly detected *known* objects of the
        validation split: a 1-D array is taken as independent single detections (per-frame
        calibration, N = M = 1); a sequence of arrays as tracks, one array per track in frame
        order.
    target_false_request_rate : float
        Largest acceptable share of known tracks earning a request, in [0, 1).
    min_frames_above, window_frames : int
        N and M of the policy in use.
    unknown : same as ``known``, optional
        Tracks of unknown (novel) objects, to report the recall the threshold gives.

    Returns
    -------
    ThresholdCalibration
        The smallest threshold (an attained score, so the policy's strict ``>`` leaves that
        track out) whose false-request share on ``known`` is at most the target; a lower
        threshold asks more often, so this one maximises recall under the constraint.

    Raises
    ------
    ValueError
        When the rate is outside [0, 1), no known track has N frames, or values are not
        finite.
    """
    _require(_is_number(target_false_request_rate) and 0.0 <= target_false_request_rate < 1.0,
             f'target_false_request_rate must be in [0, 1), got {target_false_request_rate!r}')
    known_tracks = _tracks_of(known)
    scores = np.array([track_trigger_score(t, min_frames_above, window_frames)
                       for t in known_tracks], dtype=np.float64)
    usable = scores[np.isfinite(scores)]
    _require(usable.size > 0, f'no known track has at least min_frames_above='
                              f'{min_frames_above} frames; cannot calibrate')
    ordered = np.sort(usable)[::-1]
    allowed = int(math.floor(target_false_request_rate * usable.size + 1e-9))
    threshold = float(ordered[allowed]) if allowed < usable.size else float(ordered[-1])
    false_rate = float(np.mean(usable > threshold))
    recall = None
    n_unknown = 0
    if unknown is not None:
        unknown_scores = np.array([track_trigger_score(t, min_frames_above, window_frames)
                                   for t in _tracks_of(unknown)], dtype=np.float64)
        unknown_usable = unknown_scores[np.isfinite(unknown_scores)]
        n_unknown = int(unknown_usable.size)
        recall = float(np.mean(unknown_usable > threshold)) if n_unknown else None
    return ThresholdCalibration(
        threshold=threshold, target_false_request_rate=float(target_false_request_rate),
        false_request_rate=false_rate, recall=recall, known_tracks=int(usable.size),
        unknown_tracks=n_unknown, skipped_short=int(scores.size - usable.size),
        min_frames_above=min_frames_above, window_frames=window_frames)


def with_threshold(config: HelpPolicyConfig, threshold: float) -> HelpPolicyConfig:
    """Copy of ``config`` with the threshold of its selected signal replaced."""
    if config.signal == UncertaintySignal.MUTUAL_INFORMATION:
        return replace(config, mutual_information_threshold=threshold)
    if config.signal == UncertaintySignal.GP_VARIANCE:
        return replace(config, gp_variance_threshold=threshold)
    return replace(config, calibrated_score_threshold=threshold)
