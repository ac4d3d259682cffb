"""The suspect gate: a driving track whose evidence over its views says unfamiliar keeps the
level at guided until it is confirmed familiar from changing views or labelled as the
target (uq_autonomy.arbitration.suspect, and its use by the arbiter).

Properties are checked with hypothesis on random score sequences; the expected verdicts are
re-derived here from the frame history, not read from the gate's internals.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from uq_autonomy.arbitration.arbiter import Arbiter
from uq_autonomy.arbitration.config import (
    ArbiterConfig,
    DrivingDetection,
    Level,
    SuspectConfig,
    Thresholds,
)
from uq_autonomy.arbitration.frame_validity import DetectionSummary, assess_frame
from uq_autonomy.arbitration.params import config_from_values, default_values
from uq_autonomy.arbitration.suspect import (
    RIVAL_MAX_IOU,
    DrivingTrack,
    SuspectGate,
    box_iou,
    view_change,
)

SETTINGS = settings(max_examples=80, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])
GATE = SuspectConfig(threshold=0.75, min_views=3, confirm_frames=4, confirm_view_change=0.1)
# Climb thresholds of the simulation profile: every score below 0.86 allows assistance.
THRESHOLDS = Thresholds(up=(0.9, 0.88, 0.86), down=(0.97, 0.95, 0.93))


def evidence(score: float, track_score: float, views: int = 5, *, x: float = 100.0,
             labelled: bool = False, class_id: str = 'ellipsoid', track: int = 7
             ) -> DrivingTrack:
    return DrivingTrack(track, class_id, x, 100.0, 20.0, 20.0, score, track_score, views,
                         labelled)


def detection(score: float, track_score: float, views: int = 5, *, x: float = 100.0,
              labelled: bool = False, class_id: str = 'ellipsoid', track: int = 7
              ) -> DetectionSummary:
    return DetectionSummary(class_id, 0, track, x, 100.0, 20.0, 20.0, 0.0, 0.0, (1.0,),
                            calibrated_score=score, track_score=track_score,
                            track_views=views, track_labelled=labelled)


def arbiter(**changes) -> Arbiter:
    settings = dict(calibrated_score_thresholds=THRESHOLDS, min_dwell_s=0.0,
                    target_class='ellipsoid', suspect=GATE)
    return Arbiter(ArbiterConfig(**(settings | changes)), 0.0)


def test_config_is_validated_by_rule():
    for bad in ({'threshold': 0.0}, {'threshold': 1.0}, {'threshold': math.nan},
                {'min_views': 0}, {'confirm_frames': 0}, {'confirm_view_change': -0.1},
                {'confirm_view_change': math.inf}):
        with pytest.raises(ValueError, match='suspect.'):
            SuspectConfig(**bad)
    values = default_values()
    values['suspect.threshold'] = 1.5
    with pytest.raises(ValueError, match='suspect.threshold'):
        config_from_values(values)
    values['suspect.threshold'] = 1.0
    with pytest.raises(ValueError, match='suspect.threshold'):
        config_from_values(values)


def test_the_shipped_defaults_gate():
    config = config_from_values(default_values())
    assert config.suspect.enabled and 0.0 < config.suspect.threshold < 1.0
    assert config.suspect.confirm_frames > 1


def test_view_change_is_relative_displacement_or_size():
    assert view_change((0, 0, 10, 10), (0, 0, 10, 10)) == 0.0
    # Moved by its own diagonal.
    assert view_change((0, 0, 3, 4), (5, 0, 3, 4)) == pytest.approx(1.0)
    # Doubled in area, not moved.
    assert view_change((0, 0, 10, 10), (0, 0, 20, 10)) == pytest.approx(math.log(2))
    assert view_change((0, 0, 10, 10), (1, 0, 20, 10)) == pytest.approx(math.log(2))


def test_not_suspect_below_threshold_or_with_too_few_views():
    gate = SuspectGate()
    assert not gate.judge(evidence(0.9, 0.7), GATE).suspect
    assert not gate.judge(evidence(0.9, 0.8, views=2), GATE).suspect
    assert gate.judge(evidence(0.9, 0.8, views=3), GATE).suspect
    assert not SuspectGate().judge(evidence(0.9, -1.0), GATE).suspect
    assert not SuspectGate().judge(evidence(0.9, 0.9, track=-1), GATE).suspect
    assert not SuspectGate().judge(evidence(0.9, 0.9),
                                   SuspectConfig(enabled=False)).suspect


@given(later=st.lists(st.tuples(st.floats(0.0, 1.0), st.floats(0.0, 1.0)), max_size=40))
@SETTINGS
def test_a_suspect_track_stays_suspect_without_familiar_views_from_changing_positions(later):
    """Whatever the later scores, a suspect track whose box does not move is never cleared:
    the same view seen again is no confirmation."""
    gate = SuspectGate()
    assert gate.judge(evidence(0.95, 0.9), GATE).suspect
    for score, track_score in later:
        assert gate.judge(evidence(score, track_score), GATE).suspect


@given(steps=st.lists(st.tuples(st.floats(0.0, 1.0), st.booleans()), min_size=1,
                      max_size=40))
@SETTINGS
def test_confirmation_needs_n_familiar_distinct_views_in_a_row(steps):
    """Expected state re-derived: a familiar frame from a moved view counts one, an
    unfamiliar one resets the count, a repeated view counts nothing."""
    gate = SuspectGate()
    gate.judge(evidence(0.95, 0.9), GATE)
    count, x, last_x, cleared = 0, 100.0, None, False
    for score, moves in steps:
        x += 10.0 if moves else 0.0  # 10 px on a 28 px diagonal: a new view
        verdict = gate.judge(evidence(score, 0.9, x=x), GATE)
        if not cleared:
            if score < GATE.threshold:
                if last_x is None or x != last_x:
                    count, last_x = count + 1, x
            else:
                count, last_x = 0, None
            cleared = count >= GATE.confirm_frames
        assert verdict.suspect == (not cleared)


def test_one_low_frame_does_not_lift_the_cap():
    gate = SuspectGate()
    gate.judge(evidence(0.95, 0.9), GATE)
    assert gate.judge(evidence(0.1, 0.9, x=130.0), GATE).suspect
    for i in range(GATE.confirm_frames - 2):
        assert gate.judge(evidence(0.1, 0.9, x=160.0 + 30 * i), GATE).suspect
    assert not gate.judge(evidence(0.1, 0.9, x=400.0), GATE).suspect


def test_a_label_of_the_target_class_lifts_it_and_another_class_does_not():
    gate = SuspectGate()
    gate.judge(evidence(0.95, 0.9), GATE)
    not_target = gate.judge(evidence(0.95, 0.9, labelled=True, class_id='torus'), GATE,
                            'ellipsoid')
    assert not_target.suspect and not_target.track_id == 7
    assert not gate.judge(evidence(0.95, 0.9, labelled=True), GATE, 'ellipsoid').suspect
    # A label is final for the track: later unfamiliar views do not make it suspect again.
    assert not gate.judge(evidence(0.99, 0.99), GATE, 'ellipsoid').suspect


def _climb(arb: Arbiter, t: float, frames: list[DetectionSummary]) -> tuple[float, Level]:
    for det in frames:
        t += 0.1
        arb.observe(t, [det], 1)
    return t, arb.level


@given(scores=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=40))
@SETTINGS
def test_a_suspect_driving_track_never_goes_above_guided(scores):
    """However familiar the later frames look, without confirmation (the box never moves)
    or a label the level stays at or below guided."""
    arb = arbiter()
    t, level = _climb(arb, 0.0, [detection(0.5, 0.2)] * 5)
    assert level is Level.ASSISTANCE  # a familiar track climbs
    step = arb.observe(t + 0.1, [detection(0.9, 0.9)], 1)
    assert step.state.level <= Level.GUIDED and step.state.suspect_track_id == 7
    for i, score in enumerate(scores):
        step = arb.observe(t + 0.2 + 0.1 * i, [detection(score, 0.9)], 1)
        assert step.state.level <= Level.GUIDED, step.state.reason
        assert arb.step(t + 0.25 + 0.1 * i).state.level <= Level.GUIDED


def test_suspect_hold_reports_the_level_held_back_and_the_label_lifts_it():
    arb = arbiter()
    t, level = _climb(arb, 0.0, [detection(0.5, 0.9)] * 6)
    assert level is Level.GUIDED
    state = arb.step(t).state
    assert state.suspect_hold and state.suspect_track_id == 7
    assert state.track_score == pytest.approx(0.9)
    assert 'suspect target' in state.reason
    t, level = _climb(arb, t, [detection(0.5, 0.9, labelled=True)] * 3)
    assert level is Level.ASSISTANCE and not arb.step(t).state.suspect_hold


def test_a_label_of_another_class_keeps_it_capped_however_familiar_it_then_looks():
    arb = arbiter()
    t, _ = _climb(arb, 0.0, [detection(0.5, 0.9)] * 6)
    # The detector has learnt the object: familiar from every (moving) view from now on.
    frames = [detection(0.1, 0.1, labelled=True, class_id='mug', x=100.0 + 15 * i)
              for i in range(3 * GATE.confirm_frames)]
    t, level = _climb(arb, t, frames)
    assert level is Level.GUIDED
    assert 'not the target' in arb.step(t).state.reason


def test_confirmed_from_moving_views_the_level_climbs():
    arb = arbiter()
    t, _ = _climb(arb, 0.0, [detection(0.5, 0.9)] * 6)
    frames = [detection(0.5, 0.9, x=100.0 + 15 * i) for i in range(1, GATE.confirm_frames + 3)]
    t, level = _climb(arb, t, frames)
    assert level is Level.ASSISTANCE


def test_no_hold_while_the_signal_alone_keeps_the_level_low():
    arb = arbiter()
    t, level = _climb(arb, 0.0, [detection(0.99, 0.9)] * 5)
    state = arb.step(t).state
    assert level is Level.TELEOPERATION and not state.suspect_hold


def test_a_reset_forgets_suspect_tracks():
    arb = arbiter()
    t, _ = _climb(arb, 0.0, [detection(0.5, 0.9)] * 6)
    arb.reset(t, 'clock jumped back')
    t, level = _climb(arb, t + 1.0, [detection(0.5, 0.2, views=4)] * 5)
    assert level is Level.ASSISTANCE


def test_a_track_score_outside_its_range_makes_the_frame_invalid():
    config = ArbiterConfig(calibrated_score_thresholds=THRESHOLDS)
    for bad in (1.5, -0.5, math.nan, math.inf):
        verdict = assess_frame([detection(0.5, bad)], 1, config)
        assert not verdict.usable and 'track_score' in verdict.reason
    assert assess_frame([detection(0.5, -1.0)], 1, config).usable
    assert not assess_frame([detection(0.5, 0.5, views=-1)], 1, config).usable


def test_a_perception_outage_forgets_suspect_tracks():
    """A restarted detector reuses track ids: after an outage, the id of a suspect object
    may be another object's."""
    arb = arbiter()
    t, _ = _climb(arb, 0.0, [detection(0.5, 0.9)] * 6)
    assert arb.step(t).state.suspect_hold
    t += 2.0  # no frame for longer than the perception deadline
    assert arb.step(t).state.perception_stale
    t, level = _climb(arb, t, [detection(0.5, 0.3, views=4)] * 6)
    assert level is Level.ASSISTANCE


def test_an_override_during_an_outage_forgets_the_level_earned_before_it():
    arb = arbiter(resume_window_s=5.0, resume_confirm_s=0.0, min_dwell_s=0.3)
    t, level = _climb(arb, 0.0, [detection(0.5, 0.3, views=5)] * 20)
    assert level is Level.ASSISTANCE
    t += 1.0
    assert arb.step(t).state.perception_stale
    arb.set_override(t, 0, 0.0)
    arb.set_override(t, -1, 0.0)
    t, level = _climb(arb, t, [detection(0.5, 0.3, views=5)] * 2)
    assert level <= Level.GUIDED, arb.step(t).state.reason


# --- boundaries of the rule -----------------------------------------------------------------

def test_view_change_boundaries():
    inf = math.inf
    # An empty box is no view to compare with.
    assert view_change((0, 0, 0, 0), (0, 0, 0, 0)) == inf
    assert view_change((0, 0, 10, 0), (0, 0, 10, 10)) == inf
    assert view_change((0, 0, 10, 10), (0, 0, 0, 10)) == inf
    # Sub-pixel boxes are boxes: their area and diagonal are below 1.
    assert view_change((0, 0, 0.5, 0.5), (0, 0, 0.5, 0.5)) == 0.0
    assert view_change((0, 0, 0.6, 0.8), (0, 0.5, 0.6, 0.8)) == pytest.approx(0.5)
    # Width and height each count: a tall box against a wide one of the same area.
    assert view_change((0, 0, 2, 8), (0, 0, 2, 8)) == 0.0
    assert view_change((0, 0, 2, 8), (0, 0, 8, 2)) == 0.0
    assert view_change((0, 0, 2, 8), (0, 0, 2, 4)) == pytest.approx(math.log(2))


def test_track_zero_is_judged_and_an_untracked_detection_is_not():
    assert SuspectGate().judge(evidence(0.9, 0.9, track=0), GATE).suspect
    assert SuspectGate().judge(evidence(0.9, 0.9, track=0), GATE).track_id == 0
    assert not SuspectGate().judge(evidence(0.9, 0.9, track=-1), GATE).suspect


def test_the_threshold_itself_is_suspect_and_zero_is_evidence():
    assert SuspectGate().judge(evidence(0.9, GATE.threshold), GATE).suspect
    assert not SuspectGate().judge(evidence(0.9, GATE.threshold - 1e-9), GATE).suspect
    for invalid in (math.inf, math.nan, -1.0):
        assert not SuspectGate().judge(evidence(0.9, invalid), GATE).suspect


def test_a_familiar_frame_that_makes_a_track_suspect_counts_toward_its_confirmation():
    gate = SuspectGate()
    # Familiar now (0.2), unfamiliar over its views (0.9): suspect, one confirmation.
    assert gate.judge(evidence(0.2, 0.9, x=100.0), GATE).suspect
    for i in range(1, GATE.confirm_frames - 1):
        assert gate.judge(evidence(0.2, 0.9, x=100.0 + 20 * i), GATE).suspect
    assert not gate.judge(evidence(0.2, 0.9, x=500.0), GATE).suspect


def test_familiar_frames_bounds_and_the_least_view_change():
    def frame(score: float, x: float) -> DrivingTrack:
        # A 30 x 40 box: diagonal 50, so a move of 5 px is exactly a change of 0.1.
        return DrivingTrack(7, 'ellipsoid', x, 100.0, 30.0, 40.0, score, 0.9, 5)

    step = GATE.confirm_view_change * 50.0
    gate = SuspectGate()
    gate.judge(frame(0.95, 100.0), GATE)
    for i in range(1, GATE.confirm_frames):
        assert gate.judge(frame(0.0, 100.0 + step * i), GATE).suspect
    assert not gate.judge(frame(0.0, 100.0 + step * GATE.confirm_frames), GATE).suspect
    # A frame at the threshold is not familiar: it starts the count again.
    gate = SuspectGate()
    gate.judge(frame(0.95, 100.0), GATE)
    for i in range(1, 3 * GATE.confirm_frames):
        assert gate.judge(frame(GATE.threshold, 100.0 + 20 * i), GATE).suspect


def test_a_label_without_a_target_class_lifts_the_cap_for_good():
    gate = SuspectGate()
    gate.judge(evidence(0.95, 0.9), GATE)
    verdict = gate.judge(evidence(0.95, 0.9, labelled=True, class_id='mug'), GATE)
    assert not verdict.suspect
    assert not gate.judge(evidence(0.99, 0.99), GATE).suspect


def test_the_least_recently_judged_tracks_are_forgotten_beyond_the_bound():
    from uq_autonomy.arbitration.suspect import MAX_TRACKS

    gate = SuspectGate()
    assert gate.judge(evidence(0.95, 0.9, track=0), GATE).suspect
    assert gate.judge(evidence(0.95, 0.9, track=1), GATE).suspect
    for track in range(2, MAX_TRACKS):  # exactly the bound: every track is kept
        gate.judge(evidence(0.1, 0.1, track=track), GATE)
    assert gate.judge(evidence(0.1, 0.1, track=0), GATE).suspect
    # Track 1 is now the least recently judged: one more track drops it, not track 0.
    gate.judge(evidence(0.1, 0.1, track=MAX_TRACKS), GATE)
    assert gate.judge(evidence(0.1, 0.1, track=0), GATE).suspect
    assert not gate.judge(evidence(0.1, 0.1, track=1), GATE).suspect


# ----------------------------------------------------------------------------- rivals


def _rival_arbiter(**changes) -> Arbiter:
    return arbiter(driving_detection=DrivingDetection.TRACK_ID, target_track_id=7, **changes)


@given(driving=st.floats(0.0, 0.74), rival=st.floats(0.0, 0.74),
       views=st.integers(GATE.min_views, 50), scores=st.lists(st.floats(0.0, 1.0),
                                                            min_size=1, max_size=20))
@SETTINGS
def test_while_another_object_passes_for_the_target_the_level_stays_at_most_guided(
        driving, rival, views, scores):
    """Two familiar detections of the target class, apart: once the other has read as the
    target for min_views frames, whatever either scores per frame, the driving one never
    climbs above guided while the other is in view."""
    arb = _rival_arbiter()
    t = 0.0
    for _ in range(GATE.min_views):  # unfamiliar frames: the level stays at teleoperation
        t += 0.1
        arb.observe(t, [detection(0.99, driving), detection(0.99, rival, views, x=200.0,
                                                            track=8)], 1)
    for score in scores:
        t += 0.1
        step = arb.observe(t, [detection(score, driving),
                               detection(score, rival, views, x=200.0, track=8)], 1)
        assert step.state.level <= Level.GUIDED, step.state.reason
    if arb.step(t).state.suspect_hold:
        assert 'ambiguous target' in arb.step(t).state.reason
        assert arb.step(t).state.suspect_track_id == 7


def test_the_rival_hold_lifts_when_the_rival_leaves_or_on_a_target_label():
    arb = _rival_arbiter()
    pair = [detection(0.5, 0.3), detection(0.5, 0.3, x=200.0, track=8)]
    t = 0.0
    for _ in range(6):
        t += 0.1
        arb.observe(t, pair, 1)
    state = arb.step(t).state
    assert state.level is Level.GUIDED and state.suspect_hold and state.suspect_track_id == 7
    t, level = _climb(arb, t, [detection(0.5, 0.3)] * 4)  # the rival is out of view
    assert level is Level.ASSISTANCE
    arb = _rival_arbiter()
    for labelled in (False,) * 5 + (True,) * 4:
        t += 0.1
        arb.observe(t, [detection(0.5, 0.3, labelled=labelled), pair[1]], 1)
    assert arb.level is Level.ASSISTANCE  # a person said the driving track is the target


def find_rival(driving: DrivingTrack, others: list[DrivingTrack], config: SuspectConfig,
               target_class: str, frames: int = GATE.min_views) -> DrivingTrack | None:
    """The rival a gate finds after ``frames`` frames that each held these detections."""
    gate = SuspectGate()
    for _ in range(frames):
        gate.count_readings([driving, *others], target_class)
    return gate.find_rival(driving, others, config, target_class)


@pytest.mark.parametrize('rival, why', [
    (evidence(0.5, 0.3, x=200.0, track=8, class_id='mug'), 'another class'),
    (evidence(0.5, 0.75, x=200.0, track=8), 'suspect itself: at the threshold'),
    (evidence(0.5, 0.3, x=104.0, track=8), 'the same object seen twice'),
    (evidence(0.5, math.nan, x=200.0, track=8), 'no evidence'),
    (evidence(0.5, -1.0, x=200.0, track=8), 'no evidence (the no-value marker)'),
    (evidence(0.5, 0.3), 'the driving track itself'),
])
def test_what_is_no_rival(rival, why):
    assert find_rival(evidence(0.5, 0.3), [rival], GATE, 'ellipsoid') is None, why


def test_a_rival_counts_only_with_the_rule_on_a_named_target_the_driving_track_reads_as():
    driving, rival = evidence(0.5, 0.3), evidence(0.5, 0.3, x=200.0, track=8)
    assert find_rival(driving, [rival], GATE, 'ellipsoid') == rival
    assert find_rival(driving, [rival], GATE, '') is None
    off = SuspectConfig(threshold=0.75, min_views=3, hold_on_rival=False)
    assert find_rival(driving, [rival], off, 'ellipsoid') is None
    disabled = SuspectConfig(enabled=False, threshold=0.75, min_views=3)
    assert find_rival(driving, [rival], disabled, 'ellipsoid') is None
    assert find_rival(evidence(0.5, 0.3, class_id='mug'), [rival], GATE, 'ellipsoid') is None
    # The most familiar track score there is: a rival.
    zero = evidence(0.5, 0.0, x=200.0, track=8)
    assert find_rival(driving, [zero], GATE, 'ellipsoid') == zero
    # A person's label that the rival is the target makes it no less a rival.
    labelled = evidence(0.5, 0.3, x=200.0, track=8, labelled=True)
    assert find_rival(driving, [labelled], GATE, 'ellipsoid') == labelled


def test_a_rival_reads_as_the_target_in_min_views_frames_and_in_most_of_its_frames():
    driving, rival = evidence(0.5, 0.3), evidence(0.5, 0.3, x=200.0, track=8)
    assert find_rival(driving, [rival], GATE, 'ellipsoid', GATE.min_views - 1) is None
    assert find_rival(driving, [rival], GATE, 'ellipsoid', GATE.min_views) == rival
    # A sphere misread as the target while the gripper hides part of it: no rival.
    gate = SuspectGate()
    sphere = evidence(0.5, 0.3, x=200.0, track=8, class_id='sphere')
    for _ in range(10):
        gate.count_readings([driving, sphere], 'ellipsoid')
    for frame in range(12):
        gate.count_readings([driving, rival], 'ellipsoid')
        found = gate.find_rival(driving, [rival], GATE, 'ellipsoid')
        assert (found == rival) is (frame + 1 > 10), frame  # a majority from the 11th on
    # A reset forgets the readings.
    gate.reset()
    assert gate.find_rival(driving, [rival], GATE, 'ellipsoid') is None
    # Without a target class nothing is counted.
    gate.count_readings([rival] * 5, '')
    assert gate.find_rival(driving, [rival], GATE, 'ellipsoid') is None


def test_the_readings_are_bounded_and_untracked_detections_are_not_counted():
    from uq_autonomy.arbitration.suspect import MAX_TRACKS

    gate = SuspectGate()
    driving = evidence(0.5, 0.3)
    for track in range(MAX_TRACKS + 5):
        gate.count_readings([evidence(0.5, 0.3, x=200.0, track=track)] * 3, 'ellipsoid')
    assert gate.find_rival(driving, [evidence(0.5, 0.3, x=200.0, track=0)], GATE,
                           'ellipsoid') is None  # the oldest, forgotten
    for kept in (5, MAX_TRACKS + 4):  # the oldest and the newest of the last MAX_TRACKS
        track = evidence(0.5, 0.3, x=200.0, track=kept)
        assert gate.find_rival(driving, [track], GATE, 'ellipsoid') == track, kept
    untracked = evidence(0.5, 0.3, x=200.0, track=-1)
    for _ in range(5):
        gate.count_readings([untracked], 'ellipsoid')
    assert gate.find_rival(driving, [untracked], GATE, 'ellipsoid') is None
    # An untracked detection does not stop the count of the frame's other detections.
    gate = SuspectGate()
    zero = evidence(0.5, 0.3, x=200.0, track=0)
    for _ in range(GATE.min_views):
        gate.count_readings([untracked, zero], 'ellipsoid')
    assert gate.find_rival(driving, [zero], GATE, 'ellipsoid') == zero
    # A track never counted is no rival, even where one frame would do.
    one_frame = SuspectConfig(threshold=0.75, min_views=1)
    assert SuspectGate().find_rival(driving, [zero], one_frame, 'ellipsoid') is None


def test_box_overlap_boundary_and_degenerate_boxes():
    a = evidence(0.5, 0.3)
    assert box_iou(a, a) == pytest.approx(1.0)
    assert box_iou(a, evidence(0.5, 0.3, x=120.0)) == 0.0  # touching edges
    # Shifted by a quarter: 15 x 20 shared of 25 x 20 covered.
    assert box_iou(a, evidence(0.5, 0.3, x=105.0)) == pytest.approx(0.6)
    empty = DrivingTrack(8, 'ellipsoid', 100.0, 100.0, 0.0, 0.0, 0.5, 0.3, 5)
    assert box_iou(a, empty) == 0.0 and box_iou(empty, empty) == 0.0
    huge = DrivingTrack(8, 'ellipsoid', 100.0, 100.0, 1e308, 1e308, 0.5, 0.3, 5)
    assert box_iou(huge, huge) == 0.0  # an overflowing area is no overlap, not NaN
    wide = DrivingTrack(8, 'ellipsoid', 100.0, 100.0, 1e308, 20.0, 0.5, 0.3, 5)
    assert box_iou(wide, wide) == 0.0 and box_iou(a, wide) == 0.0
    # Boxes of other sizes, apart on both axes: a (90..110, 90..110) and b (100..130,
    # 95..135) share 10 x 15 of 400 + 1200 - 150.
    b = DrivingTrack(8, 'ellipsoid', 115.0, 115.0, 30.0, 40.0, 0.5, 0.3, 5)
    assert box_iou(a, b) == pytest.approx(150.0 / 1450.0)
    assert box_iou(b, a) == pytest.approx(150.0 / 1450.0)
    # Tiny boxes: a half-pixel box inside a one-pixel one.
    small = DrivingTrack(8, 'ellipsoid', 0.0, 0.0, 1.0, 1.0, 0.5, 0.3, 5)
    smaller = DrivingTrack(9, 'ellipsoid', 0.0, 0.0, 0.5, 0.5, 0.5, 0.3, 5)
    assert box_iou(small, smaller) == pytest.approx(0.25)


def test_boxes_overlapping_up_to_the_bound_are_two_objects():
    driving = evidence(0.5, 0.3)
    # Shifted by s: IoU = (20 - s) / (20 + s), so s = 20 (1 - b) / (1 + b) gives IoU b.
    at_bound = 20.0 * (1.0 - RIVAL_MAX_IOU) / (1.0 + RIVAL_MAX_IOU)
    rival = evidence(0.5, 0.3, x=100.0 + at_bound + 1e-6, track=8)
    assert find_rival(driving, [rival], GATE, 'ellipsoid') == rival
    closer = evidence(0.5, 0.3, x=100.0 + at_bound - 0.5, track=8)
    assert find_rival(driving, [closer], GATE, 'ellipsoid') is None
    # Exactly at the bound: a box of 0.3 of the driving box's area inside it.
    inside = DrivingTrack(8, 'ellipsoid', 100.0, 100.0, 20.0 * RIVAL_MAX_IOU, 20.0, 0.5, 0.3, 5)
    assert box_iou(driving, inside) == RIVAL_MAX_IOU
    assert find_rival(driving, [inside], GATE, 'ellipsoid') == inside


def test_the_rival_rule_is_a_validated_parameter():
    values = default_values()
    assert values['suspect.hold_on_rival'] is True
    values['suspect.hold_on_rival'] = 'yes'
    with pytest.raises(ValueError, match='suspect.hold_on_rival'):
        config_from_values(values)
