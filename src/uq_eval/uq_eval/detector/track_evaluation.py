"""Evidence over a track on simulated approach sequences (``uq eval tracks``).

The detector node publishes, per detection, the calibrated score of one frame and its
track's evidence: the mean calibrated score over the track's distinct views
(:mod:`uq_perception.track_evidence`). This evaluation measures how much better the
evidence separates unknown objects from known ones than one frame does.

**Scenes.** Four kinds take turns, each holding known objects and unknown ones:

- ``confident_lookalike``: a grasp-task trial (:func:`uq_sim.grasp_task.make_trial`) with a
  confident look-alike in the look-alike's place, the procedural shapes of
  ``config/confident_lookalikes.json`` in turn (shapes the shipped detector reads as the
  target class);
- ``torus_lookalike``: a grasp-task trial with the simulator's own look-alike, the torus;
- ``procedural_unknown``: a scene of ``uq eval detector --procedural-unknowns``, one random
  convex hull, superquadric or union of primitives among 1-4 known objects;
- ``fixed_unknowns``: a scene of the ``test_unknown`` split, 1-2 of the simulator's fixed
  unknown shapes (torus, cone, tetrahedron, dumbbell, star) among 1-4 known objects.

Scene ``i`` of ``--seed S`` is drawn from seed ``TRACK_SEED_BASE + S * MAX_SCENES + i``,
above every trial the look-alikes were selected in
(:mod:`uq_eval.closed_loop.lookalike_selection`), so no view here is one the selection saw.

**Approach.** Each scene is rendered ``K`` times (frames :data:`FRAME_PERIOD_S` apart): the
camera closes :data:`APPROACH` of its distance to the point it looks at and turns
:data:`SWING_RAD` about the vertical through that point (to a side drawn per scene), and in
the grasp-task trials the gripper moves towards the look-alike as in the look-alike
selection (up to :data:`REACH_END` of its way). Every frame goes through the detector
node's pipeline (:class:`uq_perception.perception.UncertaintyPerception`: the detector at
the node's operating point, duplicate suppression, the GP, the IoU tracker and
:class:`~uq_perception.track_evidence.TrackEvidence` with the node's default settings), a
fresh tracker and evidence per scene.

**Ground truth.** A detection is matched one to one (highest score first) to the rendered
objects' boxes, from the segmentation, at IoU >= :data:`MATCH_IOU`; it is *unknown* when its
object is. Unmatched detections (clutter, the gripper, duplicates) are left out of the
AUROCs but stay in their tracks' evidence, as on the robot. A track (one track id) is
unknown when most of its matched detections are; a track without a matched detection is
left out. A track whose evidence a later track took over (the evidence's re-formed
tracks) is counted once, as the later one.

**Report.** Known-vs-unknown AUROC of the calibrated score per detection; per track of the
track score at the track's last frame (what the node published last), and for comparison
of the mean, the maximum and the first of the track's calibrated scores; 95 % intervals by
resampling scenes; counts; and the quantiles of the track score on known tracks, from
which the arbitration sets its suspect threshold, with the share of unknown tracks above
each.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import sys
import time
from collections.abc import Callable, Iterator, Sequence, Set
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from uq_common.arguments import non_negative_int, positive_int
from uq_eval.closed_loop.lookalike_selection import (
    MAX_CANDIDATES,
    REACH_FRACTIONS,
    SELECTION_SEED_BASE,
    SELECTION_VIEWS,
)

if TYPE_CHECKING:
    from uq_perception.perception import UncertaintyPerception
    from uq_perception.track_evidence import TrackEvidence
    from uq_perception.tracking import IoUTracker
    from uq_sim.scene import CameraSpec, Frame, SceneRenderer, SceneSpec

SCENE_KINDS = ('confident_lookalike', 'torus_lookalike', 'procedural_unknown',
               'fixed_unknowns')
DEFAULT_SCENES = 120  # about two minutes of a busy 2-core CPU for the shipped model
MAX_SCENES = 100_000
DEFAULT_FRAMES = 8
MAX_FRAMES = 64
# Two frames per second: a robot closing in over a few seconds, within the evidence's memory.
FRAME_PERIOD_S = 0.5
# Objects grow up to 1 / (1 - APPROACH) = 1.4 times and stay whole in view; nearer, the
# views leave the scales the detector was trained on further behind, which would measure
# the detector's scale range more than the pooling of views.
APPROACH = 0.3
# About 14 degrees: the last views show another side of each object than the first.
SWING_RAD = 0.25
# The gripper's way to the look-alike by the last frame, the look-alike selection's.
REACH_END = REACH_FRACTIONS[-1]
MATCH_IOU = 0.5
QUANTILES = (0.9, 0.95, 0.99)
BOOTSTRAP_SAMPLES = 1000
IMAGE_SIZE = (320, 240)  # (width, height) of the robot camera's images

# The first trial above the look-alike selection's views.
TRACK_SEED_BASE = SELECTION_SEED_BASE + SELECTION_VIEWS * MAX_CANDIDATES


def scene_seed(seed: int, index: int) -> int:
    """The trial seed of scene ``index`` of run ``seed``."""
    return TRACK_SEED_BASE + seed * MAX_SCENES + index


def max_run_seed() -> int:
    """The largest ``--seed`` whose scenes stay within the simulator's seed range."""
    from uq_sim.grasp_task import MAX_SEED

    return (MAX_SEED - TRACK_SEED_BASE) // MAX_SCENES - 1


# --------------------------------------------------------------------------- scenes


@dataclass(frozen=True)
class ApproachScene:
    """One scene to approach: its kind and MuJoCo scene; ``reach`` the gripper's start
    and goal in the table plane (grasp-task trials) or None (it stays put); ``swing`` the
    side the camera turns to, +1 or -1."""

    kind: str
    spec: SceneSpec
    reach: tuple[tuple[float, float], tuple[float, float]] | None
    swing: int


def make_scene(renderer: SceneRenderer, index: int, seed: int,
               lookalike_shapes: Sequence[int]) -> ApproachScene:
    """Scene ``index`` of run ``seed`` (module docstring); the kinds take turns and each
    kind's scenes walk through its shapes or families."""
    from uq_sim.dataset import render_example
    from uq_sim.grasp_task import GRIPPER_HOME, make_trial
    from uq_sim.procedural_scenes import render_procedural_example

    kind = SCENE_KINDS[index % len(SCENE_KINDS)]
    turn = index // len(SCENE_KINDS)
    trial_seed = scene_seed(seed, index)
    swing = 1 if np.random.default_rng([trial_seed, 5]).random() < 0.5 else -1
    if kind in ('confident_lookalike', 'torus_lookalike'):
        shape = lookalike_shapes[turn % len(lookalike_shapes)] \
            if kind == 'confident_lookalike' else None
        trial = make_trial(trial_seed, lookalike=True, lookalike_shape=shape)
        lookalike = trial.lookalike_object
        assert lookalike is not None  # a look-alike trial holds one
        return ApproachScene(kind, trial.scene_spec(), (GRIPPER_HOME, lookalike.xy), swing)
    # Both draw scenes until the unknown object is fully in view; the accepted scene is
    # the one left loaded.
    if kind == 'procedural_unknown':
        render_procedural_example(renderer, trial_seed, turn)
    else:
        render_example(renderer, trial_seed, turn, 'test_unknown')
    return ApproachScene(kind, renderer.spec, None, swing)


def approached_camera(camera: CameraSpec, progress: float, swing: int) -> CameraSpec:
    """The camera ``progress`` (0..1) of the way along the approach: :data:`APPROACH` of
    its distance to its aim point closed and :data:`SWING_RAD` turned, both in proportion."""
    target = np.asarray(camera.target, dtype=float)
    offset = (np.asarray(camera.pos, dtype=float) - target) * (1.0 - APPROACH * progress)
    angle = swing * SWING_RAD * progress
    c, s = math.cos(angle), math.sin(angle)
    turned = np.array([c * offset[0] - s * offset[1], s * offset[0] + c * offset[1],
                       offset[2]])
    return replace(camera, pos=tuple(float(v) for v in target + turned))


def approach_frames(renderer: SceneRenderer, scene: ApproachScene, frames: int
                    ) -> Iterator[Frame]:
    """The ``frames`` renders of ``scene`` along its approach."""
    for k in range(frames):
        progress = k / (frames - 1) if frames > 1 else 0.0
        renderer.load(replace(scene.spec, camera=approached_camera(scene.spec.camera,
                                                                   progress, scene.swing)))
        if scene.reach is not None:
            home, goal = (np.asarray(p, dtype=float) for p in scene.reach)
            x, y = home + REACH_END * progress * (goal - home)
            renderer.set_gripper_pose((x, y, 0.12), math.pi / 2)
        yield renderer.render()


# --------------------------------------------------------------------------- records


@dataclass(frozen=True)
class DetectionRecord:
    """One published detection: its scene (index and kind), frame, track id, calibrated
    score and its track's evidence as published (``track_score``, ``views``); ``unknown``
    whether its matched object is unknown, None when it matches no object."""

    scene: int
    kind: str
    frame: int
    track_id: int
    calibrated: float
    track_score: float
    views: int
    unknown: bool | None
    matched_object: str | None = None


@dataclass(frozen=True)
class TrackSummary:
    """One scored track (module docstring): ``track_score`` the evidence at its last frame,
    ``mean``, ``max`` and ``first`` of its frames' calibrated scores."""

    scene: int
    kind: str
    track_id: int
    unknown: bool
    frames: int
    views: int
    matched: int
    objects: int
    track_score: float
    mean: float
    max: float
    first: float


def _valid(score: float) -> bool:
    return math.isfinite(score) and 0.0 <= score <= 1.0


def summarize_tracks(records: Sequence[DetectionRecord],
                     superseded: Set[tuple[int, int]] = frozenset()
                     ) -> tuple[list[TrackSummary], dict[str, int]]:
    """The scored tracks of ``records`` (in frame order) and what was left out.

    ``superseded`` holds the ``(scene, track id)`` of tracks whose evidence a later track
    took over. The counts: ``superseded``, ``unmatched`` (no matched detection or no
    calibrated score), ``mixed`` (scored tracks whose matched detections cover more than
    one object).
    """
    by_track: dict[tuple[int, int], list[DetectionRecord]] = {}
    for record in records:
        by_track.setdefault((record.scene, record.track_id), []).append(record)
    tracks, left = [], {'superseded': 0, 'unmatched': 0, 'mixed': 0}
    for key, rows in by_track.items():
        if key in superseded:
            left['superseded'] += 1
            continue
        matched = [r for r in rows if r.unknown is not None]
        scores = [r.calibrated for r in rows if _valid(r.calibrated)]
        if not matched or not scores:
            left['unmatched'] += 1
            continue
        objects = len({r.matched_object for r in matched})
        left['mixed'] += objects > 1
        last = rows[-1]
        tracks.append(TrackSummary(
            scene=key[0], kind=last.kind, track_id=key[1],
            unknown=2 * sum(bool(r.unknown) for r in matched) > len(matched), frames=len(rows),
            views=last.views, matched=len(matched), objects=objects,
            track_score=last.track_score, mean=float(np.mean(scores)),
            max=float(np.max(scores)), first=scores[0]))
    return tracks, left


TRACK_SCORES = ('track_score', 'mean', 'max', 'first')


def _auroc(scores: np.ndarray, unknown: np.ndarray) -> float | None:
    from uq_perception.training.metrics import auroc

    if unknown.size == 0 or unknown.all() or not unknown.any():
        return None
    return float(auroc(scores, unknown))


@dataclass(frozen=True)
class _Table:
    """Scores, labels, scene and scene kind of each row (a detection or a track)."""

    scores: dict[str, np.ndarray]
    unknown: np.ndarray
    scene: np.ndarray
    kind: np.ndarray


def _table(rows: Sequence[DetectionRecord] | Sequence[TrackSummary],
           scores: dict[str, list[float]]) -> _Table:
    return _Table({name: np.array(values, dtype=float) for name, values in scores.items()},
                  np.array([r.unknown for r in rows], dtype=bool),
                  np.array([r.scene for r in rows], dtype=np.int64),
                  np.array([r.kind for r in rows], dtype=object))


def matched_detections(records: Sequence[DetectionRecord]) -> list[DetectionRecord]:
    """The detections the AUROCs score: matched to an object, with a calibrated score."""
    return [r for r in records if r.unknown is not None and _valid(r.calibrated)]


def detection_table(rows: Sequence[DetectionRecord]) -> _Table:
    """The calibrated scores (``calibrated``) of :func:`matched_detections` rows."""
    return _table(rows, {'calibrated': [r.calibrated for r in rows]})


def track_table(tracks: Sequence[TrackSummary]) -> _Table:
    """Every :data:`TRACK_SCORES` score of the scored tracks."""
    return _table(tracks, {name: [getattr(t, name) for t in tracks] for name in TRACK_SCORES})


def aurocs(table: _Table) -> dict[str, float | None]:
    """Known-vs-unknown AUROC of each of the table's scores (None with one class only)."""
    return {name: _auroc(scores, table.unknown) for name, scores in table.scores.items()}


def bootstrap_intervals(tables: Sequence[_Table], scenes: int, samples: int, seed: int
                        ) -> list[dict[str, list[float] | None]]:
    """95 % percentile intervals of every AUROC of each table, scenes drawn with
    replacement (the same draws for all tables); None where fewer than half the draws
    hold both classes."""
    from uq_perception.training.metrics import auroc

    rng = np.random.default_rng(seed)
    members = [[np.flatnonzero(t.scene == s) for s in range(scenes)] for t in tables]
    draws: list[dict[str, list[float]]] = [{n: [] for n in t.scores} for t in tables]
    for _ in range(samples):
        chosen = rng.integers(0, scenes, scenes)
        for table, rows, out in zip(tables, members, draws, strict=True):
            index = np.concatenate([rows[s] for s in chosen])
            unknown = table.unknown[index]
            if unknown.all() or not unknown.any():
                continue
            for name, scores in table.scores.items():
                out[name].append(float(auroc(scores[index], unknown)))
    return [{name: [round(float(np.percentile(v, 2.5)), 4),
                    round(float(np.percentile(v, 97.5)), 4)] if len(v) * 2 >= samples
             else None for name, v in out.items()} for out in draws]


def known_quantiles(table: _Table, score: str) -> list[dict[str, float | None]]:
    """Per :data:`QUANTILES` level: the quantile of ``score`` over the known rows and the
    share of unknown rows above it (None without known, or unknown, rows)."""
    known, unknown = table.scores[score][~table.unknown], table.scores[score][table.unknown]
    out = []
    for level in QUANTILES:
        value = float(np.quantile(known, level)) if known.size else None
        out.append({'level': level, 'known_quantile': _rounded(value),
                    'unknown_above': None if value is None or not unknown.size
                    else round(float((unknown > value).mean()), 4)})
    return out


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def _spread(values: Sequence[int]) -> dict[str, float] | None:
    if not values:
        return None
    return {'mean': round(float(np.mean(values)), 2), 'median': float(np.median(values)),
            'min': int(np.min(values)), 'max': int(np.max(values))}


def metrics(records: Sequence[DetectionRecord], superseded: Set[tuple[int, int]],
            scenes: int, frames: int, bootstrap: int = BOOTSTRAP_SAMPLES, seed: int = 0
            ) -> dict[str, Any]:
    """Every figure of the report from the published detections of ``scenes`` scenes of
    ``frames`` frames."""
    tracks, left = summarize_tracks(records, superseded)
    matched = matched_detections(records)
    detections, per_track = detection_table(matched), track_table(tracks)
    det_interval, track_interval = bootstrap_intervals([detections, per_track], scenes,
                                                       bootstrap, seed)
    det_auroc, track_auroc = aurocs(detections), aurocs(per_track)
    kinds = list(dict.fromkeys(r.kind for r in records))  # in the order the scenes came
    per_kind = {}
    for kind in kinds:
        det_rows, track_rows = detections.kind == kind, per_track.kind == kind
        # Each kind's unknown objects against every known one: the known objects do not
        # depend on which unknown shares their table.
        det_keep = ~detections.unknown | det_rows
        track_keep = ~per_track.unknown | track_rows
        per_kind[kind] = {
            'scenes': len({r.scene for r in records if r.kind == kind}),
            'unknown_tracks': int((per_track.unknown & track_rows).sum()),
            'unknown_detections': int((detections.unknown & det_rows).sum()),
            'auroc_per_detection': _rounded(_auroc(detections.scores['calibrated'][det_keep],
                                                   detections.unknown[det_keep])),
            'auroc_per_track': _rounded(_auroc(per_track.scores['track_score'][track_keep],
                                               per_track.unknown[track_keep])),
        }
    frame_index = np.array([r.frame for r in matched], dtype=np.int64)
    return {
        'auroc_per_detection': {
            'calibrated_score': _rounded(det_auroc['calibrated']),
            'interval95': det_interval['calibrated']},
        'auroc_per_track': {name: {'auroc': _rounded(track_auroc[name]),
                                   'interval95': track_interval[name]}
                            for name in TRACK_SCORES},
        'known_track_quantiles': known_quantiles(per_track, 'track_score'),
        'known_detection_quantiles': known_quantiles(detections, 'calibrated'),
        'per_kind': per_kind,
        # How the separation of one frame changes as the camera closes in.
        'auroc_per_detection_by_frame': [
            _rounded(_auroc(detections.scores['calibrated'][frame_index == k],
                            detections.unknown[frame_index == k])) for k in range(frames)],
        'counts': {
            'scenes': scenes,
            'frames': scenes * frames,
            'detections': len(records),
            'matched_known_detections': int((~detections.unknown).sum()),
            'matched_unknown_detections': int(detections.unknown.sum()),
            'unmatched_detections': sum(r.unknown is None for r in records),
            'tracks': len({(r.scene, r.track_id) for r in records}),
            'scored_known_tracks': int((~per_track.unknown).sum()),
            'scored_unknown_tracks': int(per_track.unknown.sum()),
            'superseded_tracks': left['superseded'],
            'unmatched_tracks': left['unmatched'],
            'mixed_tracks': left['mixed'],
            'views_per_track': _spread([t.views for t in tracks]),
            'frames_per_track': _spread([t.frames for t in tracks]),
        },
    }


# --------------------------------------------------------------------------- the run


def node_perception(detector: Any, gp: Any) -> UncertaintyPerception:
    """The detector node's pipeline around ``detector`` and ``gp`` at the node's default
    parameters (config/detector.yaml): the operating point, duplicate suppression, the IoU
    tracker and the track evidence."""
    from uq_perception.perception import UncertaintyPerception
    from uq_perception.track_evidence import TrackEvidence
    from uq_perception.tracking import IoUTracker
    from uq_perception.training.detection_scoring import (
        OPERATING_MAX_DETECTIONS,
        OPERATING_THRESHOLD,
    )

    return UncertaintyPerception(detector, gp, OPERATING_THRESHOLD, OPERATING_MAX_DETECTIONS,
                                 IoUTracker(), evidence=TrackEvidence())


def _taken_over(perception: UncertaintyPerception, held: dict[int, Any],
                present: set[int], stamp: float) -> set[int]:
    """The held tracks whose evidence a new track of this frame took over: gone from the
    evidence though not yet past its memory."""
    _, evidence = _tracks_of(perception)
    memory = evidence.config.memory_s
    return {track_id for track_id, state in held.items()
            if track_id not in present and stamp - state.last_seen <= memory
            and evidence.state(track_id) is None}


def _tracks_of(perception: UncertaintyPerception) -> tuple[IoUTracker, TrackEvidence]:
    """The pipeline's tracker and track evidence: this evaluation measures nothing else."""
    if perception.evidence is None or perception.tracker is None:
        raise ValueError('the pipeline keeps no tracks or no track evidence')
    return perception.tracker, perception.evidence


def run_scene(perception: UncertaintyPerception, renderer: SceneRenderer,
              scene: ApproachScene, index: int, frames: int
              ) -> tuple[list[DetectionRecord], set[int]]:
    """The published detections of one approach, matched to the objects, and the ids of
    the tracks whose evidence a later track took over."""
    from uq_perception.track_evidence import TrackEvidence
    from uq_perception.tracking import IoUTracker
    from uq_perception.training.detection_metrics import match_detections

    # A new scene is a new stream: no track or evidence carries over from the last one.
    tracker, evidence = _tracks_of(perception)
    perception.tracker = IoUTracker(tracker.iou_threshold, tracker.max_missed)
    perception.evidence = TrackEvidence(evidence.config)
    records: list[DetectionRecord] = []
    seen: set[int] = set()
    superseded: set[int] = set()
    for k, frame in enumerate(approach_frames(renderer, scene, frames)):
        stamp = k * FRAME_PERIOD_S
        held = {t: s for t in seen if (s := perception.evidence.state(t)) is not None}
        result = perception.process(frame.rgb, stamp=stamp)
        ids = [int(t) for t in result.track_ids]
        superseded |= _taken_over(perception, held, set(ids), stamp)
        seen.update(ids)
        boxes = np.asarray(result.detections.boxes, dtype=float).reshape(-1, 4)
        truth = np.array([a.bbox for a in frame.annotations], dtype=float).reshape(-1, 4)
        truth[:, :2] += truth[:, 2:] / 2
        matched, _ = match_detections(boxes, np.asarray(result.detections.scores), truth,
                                      MATCH_IOU)
        calibrated = result.uncertainty.calibrated_score
        scores = result.track_scores
        # The GP's score reference is checked at load and the pipeline keeps evidence.
        assert calibrated is not None and scores is not None
        for d, track_id in enumerate(ids):
            obj = frame.annotations[matched[d]] if matched[d] >= 0 else None
            records.append(DetectionRecord(
                index, scene.kind, k, track_id, float(calibrated[d]),
                float(scores.score[d]), int(scores.views[d]),
                None if obj is None else not obj.known, None if obj is None else obj.name))
    return records, superseded


def evaluate_tracks(perception: UncertaintyPerception, scenes: int, frames: int, seed: int,
                    progress: Callable[[str], None] | None = None,
                    bootstrap: int = BOOTSTRAP_SAMPLES) -> dict[str, Any]:
    """Approach ``scenes`` scenes of ``frames`` frames each; the metrics (:func:`metrics`)
    with the run's settings."""
    from uq_eval.closed_loop.lookalike_selection import load_selection
    from uq_sim.scene import SceneRenderer

    shapes = load_selection()['passed']
    records: list[DetectionRecord] = []
    superseded: set[tuple[int, int]] = set()
    start = last_report = time.monotonic()
    with SceneRenderer(*IMAGE_SIZE) as renderer:
        for index in range(scenes):
            scene = make_scene(renderer, index, seed, shapes)
            rows, taken = run_scene(perception, renderer, scene, index, frames)
            records += rows
            superseded |= {(index, t) for t in taken}
            now = time.monotonic()
            if progress is not None and (now - last_report >= 30.0 or index + 1 == scenes):
                last_report = now
                elapsed = now - start
                left = elapsed / (index + 1) * (scenes - index - 1)
                progress(f'{index + 1}/{scenes} scenes, {elapsed / 60:.1f} min, about '
                         f'{left / 60:.1f} min left')
    report = metrics(records, superseded, scenes, frames, bootstrap, seed)
    report['settings'] = {
        'scenes': scenes, 'frames': frames, 'seed': seed,
        'scene_seeds': [scene_seed(seed, 0), scene_seed(seed, scenes - 1)],
        'scene_kinds': list(SCENE_KINDS), 'confident_lookalike_shapes': shapes,
        'frame_period_s': FRAME_PERIOD_S, 'approach': APPROACH, 'swing_rad': SWING_RAD,
        'reach_end': REACH_END, 'match_iou': MATCH_IOU, 'bootstrap_samples': bootstrap,
        'score_threshold': perception.score_threshold,
        'max_detections': perception.max_detections,
        'tracking_iou': _tracks_of(perception)[0].iou_threshold,
        'track_evidence': asdict(_tracks_of(perception)[1].config),
    }
    report['wall_s'] = round(time.monotonic() - start, 1)
    return report


def _interval(value: list[float] | None) -> str:
    return '-' if value is None else f'{value[0]:.3f}-{value[1]:.3f}'


def _number(value: float | None) -> str:
    return '-' if value is None else f'{value:.3f}'


def markdown_summary(report: dict[str, Any]) -> str:
    """The report's figures as a markdown table and lists."""
    counts, det = report['counts'], report['auroc_per_detection']
    labels = {'track_score': 'per track: track score (mean over views, last frame)',
              'mean': 'per track: mean over frames', 'max': 'per track: max over frames',
              'first': 'per track: first view'}
    lines = [f"# Evidence over a track: {Path(report['model']).name}", '',
             f"`{report['command']}`, {report['date']}, load average "
             f"{report['load_average'][0]} before, {report['load_average'][1]} after, "
             f"{report['wall_s'] / 60:.1f} min.", '',
             '| known vs unknown | AUROC | 95 % interval (scenes resampled) |',
             '|---|---|---|',
             f"| per detection: calibrated score | {_number(det['calibrated_score'])} | "
             f"{_interval(det['interval95'])} |"]
    for name, label in labels.items():
        row = report['auroc_per_track'][name]
        lines.append(f"| {label} | {_number(row['auroc'])} | {_interval(row['interval95'])} |")
    views = counts['views_per_track'] or {}
    lines += ['', f"{counts['scenes']} scenes, {counts['frames']} frames, "
              f"{counts['detections']} detections ({counts['matched_known_detections']} known, "
              f"{counts['matched_unknown_detections']} unknown, "
              f"{counts['unmatched_detections']} unmatched), {counts['tracks']} tracks "
              f"({counts['scored_known_tracks']} known, {counts['scored_unknown_tracks']} "
              f"unknown scored; {counts['superseded_tracks']} taken over, "
              f"{counts['unmatched_tracks']} unmatched, {counts['mixed_tracks']} over more "
              f"than one object); views per track: mean {views.get('mean')}, median "
              f"{views.get('median')}, {views.get('min')}-{views.get('max')}.", '',
              '| level | track score on known tracks | unknown tracks above | '
              'calibrated score on known detections | unknown detections above |',
              '|---|---|---|---|---|']
    for track, detection in zip(report['known_track_quantiles'],
                                report['known_detection_quantiles'], strict=True):
        lines.append(f"| {track['level']} | {_number(track['known_quantile'])} | "
                     f"{_number(track['unknown_above'])} | "
                     f"{_number(detection['known_quantile'])} | "
                     f"{_number(detection['unknown_above'])} |")
    lines += ['', '| scene kind | scenes | unknown tracks | AUROC per detection | '
              'AUROC per track |', '|---|---|---|---|---|']
    for kind, row in report['per_kind'].items():
        lines.append(f"| {kind} | {row['scenes']} | {row['unknown_tracks']} | "
                     f"{_number(row['auroc_per_detection'])} | "
                     f"{_number(row['auroc_per_track'])} |")
    by_frame = ', '.join(_number(v) for v in report['auroc_per_detection_by_frame'])
    lines += ['', f'AUROC per detection by frame of the approach: {by_frame}.', '']
    return '\n'.join(lines)


def _scene_count(text: str) -> int:
    count = positive_int(text)
    if count > MAX_SCENES:
        raise argparse.ArgumentTypeError(f'at most {MAX_SCENES} scenes, got {count}')
    return count


def _frame_count(text: str) -> int:
    count = positive_int(text)
    if not 2 <= count <= MAX_FRAMES:
        raise argparse.ArgumentTypeError(f'the frames must be 2..{MAX_FRAMES}, got {count}')
    return count


def _run_seed(text: str) -> int:
    seed = non_negative_int(text)
    if seed > max_run_seed():
        raise argparse.ArgumentTypeError(f'the seed must be at most {max_run_seed()}, '
                                         f'got {seed}')
    return seed


def configure(parser: argparse.ArgumentParser) -> None:
    """Known-vs-unknown AUROC per detection and per track on simulated approaches.

    The calibrated score of each detection against the track score of each track (the
    node's evidence over a track); writes JSON and markdown to --out.
    """
    from uq_eval.gp.fit_command import add_detector_arguments
    from uq_perception.detectors.model_files import default_detector_path, default_gp_path

    add_detector_arguments(parser, default_model=default_detector_path())
    parser.add_argument('--gp', type=Path, default=default_gp_path(),
                        help='the GP artefact fitted for --model (with a score reference)')
    parser.add_argument('--scenes', type=_scene_count, default=DEFAULT_SCENES,
                        help='scenes approached, the kinds in turn (the default takes a few '
                             'minutes on a 2-core CPU)')
    parser.add_argument('--frames', type=_frame_count, default=DEFAULT_FRAMES,
                        help=f'frames per approach, 2..{MAX_FRAMES}')
    parser.add_argument('--seed', type=_run_seed, default=0,
                        help=f'run seed: scene i is trial {TRACK_SEED_BASE} + seed * '
                             f'{MAX_SCENES} + i, above the look-alike selection\'s trials; '
                             'also seeds the bootstrap')
    parser.add_argument('--out', type=Path, default=Path('out/tracks'),
                        help='folder of the report: <model name>.json and <model name>.md')
    parser.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    from uq_eval.detector.procedural_unknowns import check_procedural_classes
    from uq_eval.gp.fit_command import _one_line, open_detector
    from uq_perception.ntk import LastLayerNTKGP
    from uq_perception.runtime.onnx_runtime import OnnxRuntimeUnavailableError

    def say(text: str) -> None:
        print(f'uq eval tracks: {text}', file=sys.stderr, flush=True)

    load_before = os.getloadavg()[0]
    try:
        detector, info = open_detector(args)
        check_procedural_classes(detector.class_names)
        if not args.gp.is_file():
            raise ValueError(f'GP artefact not found: {args.gp}')
        gp = LastLayerNTKGP.load(args.gp, feature_dim=detector.feature_dim,
                                 class_names=detector.class_names, model_id=detector.model_id)
        if gp.score_reference is None:
            raise ValueError(f'{args.gp} holds no score reference: without it the node '
                             'publishes no calibrated score (fit the GP with `uq gp fit`)')
        report: dict[str, Any] = {
            # The command line as typed where it is `uq eval tracks ...` (not when called
            # in-process, whose arguments sys.argv does not hold).
            'command': 'uq ' + shlex.join(sys.argv[1:])
            if sys.argv[1:3] == ['eval', 'tracks'] else 'uq eval tracks',
            'date': time.strftime('%Y-%m-%d %H:%M:%S %Z'),
            'model': info['path'], 'model_id': detector.model_id, 'gp': str(args.gp),
            'backend': info['backend'],
        }
        say(f'{args.scenes} scenes of {args.frames} frames with {info["path"]}')
        report.update(evaluate_tracks(node_perception(detector, gp), args.scenes,
                                      args.frames, args.seed, progress=say))
    except (ValueError, OSError, OnnxRuntimeUnavailableError) as exc:
        print(f'uq eval tracks: {_one_line(exc)}', file=sys.stderr)
        return 2
    report['load_average'] = [round(load_before, 2), round(os.getloadavg()[0], 2)]
    # Key order of the file: what was run first, the figures after.
    report = {key: report.pop(key) for key in ('command', 'date', 'model', 'model_id', 'gp',
                                                'backend', 'load_average', 'wall_s',
                                                'settings')} | report
    args.out.mkdir(parents=True, exist_ok=True)
    name = Path(info['path']).stem
    (args.out / f'{name}.json').write_text(json.dumps(report, indent=1) + '\n')
    summary = markdown_summary(report)
    (args.out / f'{name}.md').write_text(summary)
    print(summary)
    return 0
