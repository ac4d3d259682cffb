"""Evidence over a track (uq_perception.track_evidence, no ROS): the mean calibrated score over
a track's distinct views, kept when the track breaks and re-forms, restarted by a label."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from uq_perception.track_evidence import (
    NO_TRACK_SCORE,
    TrackEvidence,
    TrackEvidenceConfig,
    box_change,
)

BOX = (100.0, 80.0, 40.0, 30.0)
EMBEDDING = np.array([1.0, 0.5, -0.25, 2.0])
scores = st.floats(0.0, 1.0, allow_nan=False)


def _moved(step: int, box: tuple = BOX) -> tuple:
    """``box`` moved right by ``step`` half-diagonals: a new view at every step."""
    cx, cy, w, h = box
    return (cx + step * 0.5 * math.hypot(w, h), cy, w, h)


def _frame(evidence: TrackEvidence, stamp: float, track_id: int, score: float,
           box: tuple = BOX, class_index: int = 1, embedding: np.ndarray = EMBEDDING):
    """One frame of one detection; returns its ``(score, views, labelled)``."""
    out = evidence.update(stamp, np.array([track_id]), np.array([class_index]),
                          np.array([box], np.float64), np.array([score]),
                          np.array([embedding], np.float64))
    return float(out.score[0]), int(out.views[0]), bool(out.labelled[0])


def _empty(evidence: TrackEvidence, stamp: float) -> None:
    evidence.update(stamp, np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros((0, 4)),
                    np.zeros(0), np.zeros((0, len(EMBEDDING))))


# --- the mean over distinct views --------------------------------------------------------

@given(st.lists(scores, min_size=1, max_size=40))
def test_track_score_is_the_mean_over_the_counted_views(values):
    evidence = TrackEvidence()
    for step, score in enumerate(values):
        out = _frame(evidence, 0.1 * step, 7, score, _moved(step))
    assert out[1] == len(values)
    assert out[0] == pytest.approx(math.fsum(values) / len(values), abs=1e-12)


def test_track_score_is_not_the_last_frame():
    evidence = TrackEvidence()
    for step, score in enumerate([0.1, 0.9, 0.2]):
        out = _frame(evidence, step, 7, score, _moved(step))
    assert out == (pytest.approx(0.4), 3, False)


@given(scores, st.lists(st.tuples(scores, st.floats(-1.0, 1.0), st.floats(-1.0, 1.0)),
                        min_size=1, max_size=30))
def test_a_view_repeated_or_barely_moved_counts_once(first, repeats):
    """Frames within ``view_change`` of the first view add nothing, whatever their score."""
    evidence = TrackEvidence()
    _frame(evidence, 0.0, 3, first)
    # Each shift is below half of view_change times the diagonal, so never a new view.
    limit = 0.5 * 0.1 * math.hypot(BOX[2], BOX[3]) / math.sqrt(2)
    for step, (score, dx, dy) in enumerate(repeats, start=1):
        out = _frame(evidence, 0.1 * step, 3, score,
                     (BOX[0] + dx * limit, BOX[1] + dy * limit, BOX[2], BOX[3]))
        assert out == (first, 1, False)


def test_a_resized_box_is_a_new_view():
    evidence = TrackEvidence()
    _frame(evidence, 0.0, 3, 0.2)
    # The area grows by exp(0.12) (a robot moving closer), the centre stays.
    grown = (BOX[0], BOX[1], BOX[2] * math.exp(0.06), BOX[3] * math.exp(0.06))
    assert _frame(evidence, 0.1, 3, 0.6, grown) == (pytest.approx(0.4), 2, False)


def test_the_mean_runs_over_the_most_recent_max_views():
    evidence = TrackEvidence(TrackEvidenceConfig(max_views=3))
    values = [0.9, 0.9, 0.1, 0.2, 0.3]
    for step, score in enumerate(values):
        out = _frame(evidence, step, 1, score, _moved(step))
    assert out == (pytest.approx(0.2), 5, False)


@given(st.tuples(st.floats(1.0, 500.0), st.floats(1.0, 500.0), st.floats(0.1, 300.0),
                 st.floats(0.1, 300.0)))
def test_box_change_is_zero_for_the_same_box_and_grows_with_scale(box):
    assert box_change(box, box) == 0.0
    cx, cy, w, h = box
    assert box_change((cx, cy, 2 * w, 2 * h), box) == pytest.approx(math.log(4.0))
    shifted = (cx + 3 * w, cy + 4 * h, w, h)
    assert box_change(shifted, box) == pytest.approx(
        math.hypot(3 * w, 4 * h) / math.hypot(w, h))


def test_box_change_of_degenerate_boxes():
    point = (5.0, 5.0, 0.0, 0.0)
    assert box_change(point, point) == 0.0
    assert box_change((6.0, 5.0, 0.0, 0.0), point) == math.inf
    assert box_change((5.0, 5.0, 1.0, 1.0), point) == math.inf


# --- broken tracks -----------------------------------------------------------------------

def _seen(evidence: TrackEvidence, track_id: int, values: list[float], start: float = 0.0
          ) -> tuple[float, int, bool]:
    """Track ``track_id`` seen in distinct views with ``values``, ending at ``BOX``."""
    for step, score in enumerate(values):
        out = _frame(evidence, start + 0.1 * step, track_id, score,
                     _moved(step - len(values) + 1))
    return out


@given(st.lists(scores, min_size=2, max_size=10), scores, st.floats(0.0, 2.8))
@settings(max_examples=50)
def test_a_track_that_breaks_and_re_forms_keeps_its_evidence(values, later, gap):
    evidence = TrackEvidence()
    before = _seen(evidence, 4, values)
    stamp = 0.1 * len(values) + gap
    # The object reappears under a new id where it was lost, a little moved, with an
    # embedding close to its last one.
    nearby = (BOX[0] + 2.0, BOX[1] + 1.0, BOX[2], BOX[3])
    out = _frame(evidence, stamp, 9, later, nearby, embedding=EMBEDDING * 1.5 + 0.05)
    assert out == (pytest.approx(before[0]), before[1], False)
    # Evidence reset on the break would restart from `later`, one view.
    assert evidence.state(4) is None and evidence.state(9).views == len(values)
    moved = _frame(evidence, stamp + 0.1, 9, later, _moved(1, nearby))
    assert moved == (pytest.approx(math.fsum([*values, later]) / (len(values) + 1)),
                     len(values) + 1, False)


def test_the_same_id_coming_back_keeps_its_evidence():
    evidence = TrackEvidence()
    before = _seen(evidence, 4, [0.3, 0.5])
    _empty(evidence, 0.5)
    assert _frame(evidence, 0.6, 4, 0.9) == (pytest.approx(before[0]), 2, False)


@pytest.mark.parametrize('change', ['class', 'far box', 'embedding', 'orthogonal embedding'])
def test_another_object_does_not_inherit(change):
    evidence = TrackEvidence()
    _seen(evidence, 4, [0.9, 0.8, 0.95])
    kwargs = {'class': {'class_index': 2},
              'far box': {'box': _moved(3)},
              'embedding': {'embedding': -EMBEDDING},
              'orthogonal embedding': {'embedding': np.array([0.5, -1.0, 0.0, 0.0])}}[change]
    assert _frame(evidence, 0.5, 9, 0.1, **kwargs) == (0.1, 1, False)
    assert evidence.state(4).views == 3, 'the lost track stays remembered'


def test_a_track_without_embedding_does_not_inherit():
    evidence = TrackEvidence()
    _seen(evidence, 4, [0.9])
    out = evidence.update(0.5, np.array([9]), np.array([1]), np.array([BOX]), np.array([0.1]))
    assert (out.score[0], out.views[0]) == (0.1, 1)


@pytest.mark.parametrize('gap, inherits', [(3.0, True), (3.01, False)])
def test_a_lost_track_is_remembered_for_memory_s(gap, inherits):
    evidence = TrackEvidence()
    _frame(evidence, 10.0, 4, 0.9)
    _empty(evidence, 10.0 + gap / 2)
    out = _frame(evidence, 10.0 + gap, 9, 0.1)
    assert out == ((0.9, 1, False) if inherits else (0.1, 1, False))
    assert evidence.state(4) is None


def test_the_best_match_inherits_and_a_lost_track_goes_to_one_new_track():
    evidence = TrackEvidence()
    _frame(evidence, 0.0, 4, 0.9)
    near, close = EMBEDDING + np.array([0.3, 0.0, 0.0, 0.0]), EMBEDDING * 1.01
    out = evidence.update(0.1, np.array([8, 9]), np.array([1, 1]),
                          np.array([BOX, (BOX[0] + 1, *BOX[1:])]), np.array([0.2, 0.4]),
                          np.array([near, close]))
    # 9's embedding is the closer: it takes the evidence; 8 starts its own.
    assert out.score.tolist() == [0.2, 0.9] and out.views.tolist() == [1, 1]


def test_a_live_track_is_not_taken_over():
    evidence = TrackEvidence()
    evidence.update(0.0, np.array([4]), np.array([1]), np.array([BOX]), np.array([0.9]),
                    np.array([EMBEDDING]))
    out = evidence.update(0.1, np.array([4, 9]), np.array([1, 1]), np.array([BOX, BOX]),
                          np.array([0.9, 0.1]), np.array([EMBEDDING, EMBEDDING]))
    assert out.score.tolist() == [0.9, 0.1]


def test_an_earlier_stamp_forgets_every_track():
    evidence = TrackEvidence()
    _seen(evidence, 4, [0.9, 0.9])
    assert _frame(evidence, -5.0, 4, 0.1) == (0.1, 1, False)


# --- labels ------------------------------------------------------------------------------

def test_a_label_clears_the_closest_track_and_marks_it_labelled():
    evidence = TrackEvidence()
    other = np.array([0.0, 0.0, 3.0, -1.0])
    evidence.update(0.0, np.array([4, 5]), np.array([1, 2]), np.array([BOX, _moved(4)]),
                    np.array([0.95, 0.3]), np.array([EMBEDDING, other]))
    assert evidence.label(EMBEDDING * 2 + 0.01, 'teapot') == 4
    state = evidence.state(4)
    assert (state.score, state.views, state.labelled, state.label) == (
        NO_TRACK_SCORE, 0, True, 'teapot')
    assert evidence.state(5).views == 1 and not evidence.state(5).labelled
    # The labelled object's next frames rebuild the mean from scratch.
    out = evidence.update(0.1, np.array([4, 5]), np.array([1, 2]), np.array([BOX, _moved(4)]),
                          np.array([0.1, 0.3]), np.array([EMBEDDING, other]))
    assert (out.score.tolist(), out.views.tolist(), out.labelled.tolist()) == (
        [0.1, 0.3], [1, 1], [True, False])


def test_a_label_reaches_a_remembered_track_and_its_heir_stays_labelled():
    evidence = TrackEvidence()
    _seen(evidence, 4, [0.9, 0.8])
    _empty(evidence, 0.5)
    assert evidence.label(EMBEDDING, 'teapot') == 4
    assert _frame(evidence, 0.6, 9, 0.2) == (0.2, 1, True)
    assert evidence.state(9).label == 'teapot'


@pytest.mark.parametrize('embedding', [-EMBEDDING, np.zeros(4), np.zeros(0), np.ones(5)])
def test_a_label_far_from_every_track_changes_nothing(embedding):
    evidence = TrackEvidence()
    _seen(evidence, 4, [0.9])
    assert evidence.label(embedding, 'teapot') is None
    assert evidence.state(4).views == 1 and not evidence.state(4).labelled


# --- bounds and bad input ----------------------------------------------------------------

def test_at_most_max_tracks_are_held_the_oldest_dropped():
    evidence = TrackEvidence(TrackEvidenceConfig(max_tracks=3, memory_s=100.0))
    for track_id in range(6):
        _frame(evidence, track_id, track_id, 0.5, _moved(3 * track_id))
    assert len(evidence) == 3
    assert [evidence.state(t) is not None for t in range(6)] == [False] * 3 + [True] * 3


def test_a_new_config_keeps_the_evidence_within_its_bounds():
    evidence = TrackEvidence()
    _seen(evidence, 4, [0.9, 0.1, 0.3])
    evidence.config = TrackEvidenceConfig(max_views=2)
    assert evidence.state(4).score == pytest.approx(0.2)
    with pytest.raises(ValueError, match='TrackEvidenceConfig'):
        evidence.config = {'max_views': 2}


@pytest.mark.parametrize('name, value', [
    ('view_change', -0.1), ('view_change', math.nan),
    ('view_change', math.inf), ('view_change', '0.1'), ('max_views', 0), ('max_views', 2.0),
    ('max_views', True), ('memory_s', -1.0), ('memory_s', math.inf), ('reform_iou', 0.0),
    ('reform_iou', 1.5), ('reform_cosine', 0.0), ('reform_cosine', 1.01),
    ('reform_cosine', math.nan), ('max_tracks', 0), ('max_tracks', -3)])
def test_bad_config_is_refused_naming_the_setting(name, value):
    with pytest.raises(ValueError, match=name):
        TrackEvidenceConfig(**{name: value})


@pytest.mark.parametrize('score', [math.nan, math.inf, -math.inf, -1.0, 1.5])
def test_a_frame_without_a_score_is_not_counted(score):
    evidence = TrackEvidence()
    assert _frame(evidence, 0.0, 4, score) == (NO_TRACK_SCORE, 0, False)
    assert _frame(evidence, 0.1, 4, 0.25) == (0.25, 1, False)
    assert _frame(evidence, 0.2, 4, score, _moved(1)) == (0.25, 1, False)


def test_untracked_detections_get_no_evidence():
    out = TrackEvidence().update(0.0, np.array([-1, 3]), np.array([0, 0]),
                                 np.array([BOX, BOX]), np.array([0.5, 0.5]))
    assert out.score.tolist() == [NO_TRACK_SCORE, 0.5] and out.views.tolist() == [0, 1]


@pytest.mark.parametrize('bad', ['box', 'size', 'embedding', 'stamp', 'shape', 'ids',
                                 'float ids'])
def test_invalid_frames_are_refused_and_change_nothing(bad):
    evidence = TrackEvidence()
    _seen(evidence, 4, [0.5])
    arrays = {'stamp': 1.0, 'track_ids': np.array([4, 5]), 'class_indices': np.array([1, 1]),
              'boxes': np.array([BOX, _moved(4)]), 'scores': np.array([0.9, 0.9]),
              'embeddings': np.array([EMBEDDING, EMBEDDING])}
    arrays |= {'box': {'boxes': np.array([BOX, (math.nan, 1.0, 2.0, 2.0)])},
               'size': {'boxes': np.array([BOX, (1.0, 1.0, -2.0, 2.0)])},
               'embedding': {'embeddings': np.array([EMBEDDING, [math.inf, 0, 0, 0]])},
               'stamp': {'stamp': math.nan},
               'shape': {'scores': np.array([0.9])},
               'ids': {'track_ids': np.array([4, 4])},
               'float ids': {'track_ids': np.array([4.0, 5.0])}}[bad]
    with pytest.raises(ValueError):
        evidence.update(**arrays)
    assert evidence.state(4).views == 1 and evidence.state(5) is None
    with pytest.raises(ValueError, match='finite'):
        evidence.label(np.array([math.nan, 0.0, 0.0, 0.0]), 'teapot')


def test_view_change_zero_counts_every_frame():
    """A fixed camera: the box stays, the look changes; every frame is a view."""
    evidence = TrackEvidence(TrackEvidenceConfig(view_change=0.0))
    scores = [0.2, 0.9, 0.5]
    for i, score in enumerate(scores):
        out = evidence.update(float(i), [1], [0], [(50.0, 50.0, 20.0, 20.0)], [score])
    assert out.views[0] == 3
    assert out.score[0] == pytest.approx(sum(scores) / 3)


def _corner_iou(a, b) -> float:
    """IoU from the corners, written independently of the module's centre form."""
    ax1, ay1, ax2, ay2 = a[0] - a[2] / 2, a[1] - a[3] / 2, a[0] + a[2] / 2, a[1] + a[3] / 2
    bx1, by1, bx2, by2 = b[0] - b[2] / 2, b[1] - b[3] / 2, b[0] + b[2] / 2, b[1] + b[3] / 2
    w, h = min(ax2, bx2) - max(ax1, bx1), min(ay2, by2) - max(ay1, by1)
    if w <= 0 or h <= 0:
        return 0.0
    return w * h / (a[2] * a[3] + b[2] * b[3] - w * h)


boxes = st.tuples(st.floats(0, 200), st.floats(0, 200), st.floats(0.5, 80), st.floats(0.5, 80))


@given(a=boxes, b=boxes)
@settings(max_examples=300, deadline=None)
def test_the_reform_iou_is_the_boxes_intersection_over_union(a, b):
    from uq_perception.track_evidence import _iou

    assert _iou(a, b) == pytest.approx(_corner_iou(a, b), abs=1e-9)
    assert _iou(a, b) == pytest.approx(_iou(b, a), abs=1e-12)


def test_the_reform_iou_on_hand_made_boxes():
    from uq_perception.track_evidence import _iou

    assert _iou((0, 0, 10, 10), (0, 0, 10, 10)) == 1.0
    assert _iou((0, 0, 10, 10), (10, 0, 10, 10)) == 0.0  # touching edges share no area
    assert _iou((0, 0, 10, 10), (5, 0, 10, 10)) == pytest.approx(50 / 150)
    assert _iou((0, 0, 10, 10), (0, 5, 10, 10)) == pytest.approx(50 / 150)
    assert _iou((0, 0, 4, 2), (0, 0, 2, 4)) == pytest.approx(4 / 12)
    assert _iou((0, 0, 0.5, 0.5), (0, 0, 0.5, 0.5)) == 1.0


def test_track_zero_is_a_track_and_negative_ids_are_untracked():
    evidence = TrackEvidence()
    out = evidence.update(0.0, [0, -1], [1, 1], [BOX, _moved(4)], [0.4, 0.6])
    assert (out.score[0], out.views[0]) == (pytest.approx(0.4), 1)
    assert (out.score[1], out.views[1]) == (NO_TRACK_SCORE, 0)
    out = evidence.update(0.1, [0], [1], [_moved(1)], [0.8])
    assert (out.score[0], out.views[0]) == (pytest.approx(0.6), 2)
    assert evidence.state(0) is not None and evidence.state(-1) is None


def test_a_move_along_y_alone_is_a_new_view():
    cx, cy, w, h = BOX
    evidence = TrackEvidence()
    evidence.update(0.0, [3], [0], [BOX], [0.2])
    out = evidence.update(0.1, [3], [0], [(cx, cy + math.hypot(w, h), w, h)], [0.6])
    assert out.views[0] == 2 and out.score[0] == pytest.approx(0.4)


def test_frames_of_one_stamp_keep_the_tracks_and_an_earlier_stamp_forgets_them():
    evidence = TrackEvidence()
    evidence.update(1.0, [3], [0], [BOX], [0.2])
    out = evidence.update(1.0, [3], [0], [_moved(1)], [0.6])
    assert out.views[0] == 2
    out = evidence.update(0.5, [3], [0], [_moved(2)], [0.9])
    assert out.views[0] == 1 and out.score[0] == pytest.approx(0.9)


def test_a_zero_size_box_is_accepted_and_a_negative_one_refused():
    evidence = TrackEvidence()
    out = evidence.update(0.0, [3], [0], [(10.0, 10.0, 0.0, 5.0)], [0.3])
    assert out.views[0] == 1
    with pytest.raises(ValueError, match='non-negative width and height'):
        evidence.update(0.1, [3], [0], [(10.0, 10.0, -1.0, 5.0)], [0.3])


@pytest.mark.parametrize('field, value', [
    ('memory_s', 0.0), ('reform_iou', 1.0), ('reform_cosine', 1.0), ('max_views', 1),
    ('max_tracks', 1), ('view_change', 0.0)])
def test_the_ends_of_each_settings_range_are_accepted(field, value):
    assert getattr(TrackEvidenceConfig(**{field: value}), field) == value


def test_a_zero_embedding_has_no_direction_and_inherits_nothing():
    evidence = TrackEvidence()
    evidence.update(0.0, [3], [0], [BOX], [0.9], [EMBEDDING])
    evidence.update(0.1, [], [], np.zeros((0, 4)), [], np.zeros((0, 4)))
    out = evidence.update(0.2, [4], [0], [BOX], [0.1], [np.zeros(4)])
    assert out.views[0] == 1 and out.score[0] == pytest.approx(0.1)
    # A unit-length embedding of the same direction does inherit.
    evidence = TrackEvidence()
    evidence.update(0.0, [3], [0], [BOX], [0.9], [EMBEDDING])
    evidence.update(0.1, [], [], np.zeros((0, 4)), [], np.zeros((0, 4)))
    # (the same box again is no new view: the inherited score stands)
    out = evidence.update(0.2, [4], [0], [BOX], [0.1], [EMBEDDING / 10.0])
    assert out.views[0] == 1 and out.score[0] == pytest.approx(0.9)
