"""Example-based tests of the ROS-free arbiter: frame checks, driving-detection selection,
hysteresis, fail-safe, override, configuration and the parameter table."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest

from uq_autonomy.arbitration.arbiter import Arbiter
from uq_autonomy.arbitration.config import (
    NO_CALIBRATED_SCORE,
    ArbiterConfig,
    DrivingDetection,
    Level,
    ModelRange,
    Thresholds,
    UncertaintySignal,
    model_range_problem,
    signal_problem,
)
from uq_autonomy.arbitration.frame_validity import (
    DetectionSummary,
    UncertaintyValues,
    assess_frame,
    future_stamp_problem,
    stamp_problem,
)
from uq_autonomy.arbitration.params import (
    PARAMETERS,
    config_from_values,
    default_values,
    load_parameters_file,
)

REPO = Path(__file__).resolve().parents[3]


def det(gp: float = 0.1, mi: float = 0.01, *, cls: str = 'cup', index: int = 0, track: int = -1,
        x: float = 320.0, y: float = 240.0, w: float = 20.0, h: float = 20.0,
        probs: int = 2, score: float = NO_CALIBRATED_SCORE) -> DetectionSummary:
    return DetectionSummary(cls, index, track, x, y, w, h, gp, mi,
                            (1.0 / probs,) * probs if probs else (), calibrated_score=score)


# Most examples below are in raw GP-variance units with these round thresholds (the expert
# mode); the calibrated score, the default, has tests of its own.
RAW = Thresholds(up=(1.0, 0.5, 0.25), down=(2.0, 1.0, 0.5))


def config(**kwargs) -> ArbiterConfig:
    return ArbiterConfig(**{'uncertainty_signal': 'gp_variance', 'gp_variance_thresholds': RAW,
                            **kwargs})


# -- frame checks and selection -----------------------------------------------------------

def test_highest_uncertainty_drives_by_default():
    p = assess_frame([det(0.2), det(1.5), det(0.7)], 2, config())
    assert p.usable and p.index == 1 and p.uncertainty == pytest.approx(1.5)
    assert ArbiterConfig().driving_detection is DrivingDetection.HIGHEST_UNCERTAINTY


def test_the_calibrated_score_drives_by_default():
    assert ArbiterConfig().uncertainty_signal is UncertaintySignal.CALIBRATED_SCORE
    frame = [det(5.0, score=0.2), det(1e-6, score=0.97), det(0.1, score=0.5)]
    p = assess_frame(frame, 2, ArbiterConfig())
    assert p.usable and p.index == 1 and p.uncertainty == pytest.approx(0.97)


def test_a_candidate_without_a_calibrated_score_makes_the_frame_unusable():
    # -1: the model has no score reference; such a detection could be the most uncertain.
    p = assess_frame([det(score=0.3), det(score=NO_CALIBRATED_SCORE)], 2, ArbiterConfig())
    assert not p.usable and 'detection 1 has no calibrated_score' in p.reason
    # Not a candidate under the selection: the others still drive.
    cfg = ArbiterConfig(driving_detection='track_id', target_track_id=4)
    assert assess_frame([det(score=0.3, track=4), det(track=5)], 2, cfg).usable


@pytest.mark.parametrize('score', [math.nan, 1.5, -0.5, -1.0 + 1e-6, math.inf])
def test_a_calibrated_score_is_in_the_unit_interval_or_exactly_minus_one(score):
    for cfg in (ArbiterConfig(), config()):  # checked whichever signal drives
        p = assess_frame([det(score=0.2), det(score=score)], 2, cfg)
        assert not p.usable and 'calibrated_score' in p.reason
    p = assess_frame([det()], 2, config(), UncertaintyValues(calibrated_score=score))
    assert not p.usable and 'frame-level uncertainty' in p.reason


@pytest.mark.parametrize(('up', 'down'), [
    ((0.95, 0.93, 0.91), (1.0, 0.95, 0.93)),   # a score never exceeds 1
    ((0.95, 0.93, 0.0), (0.98, 0.95, 0.93)),    # nor falls below 0
    ((0.95, 0.93, 0.91), (1.5, 0.95, 0.93)),
])
def test_calibrated_score_thresholds_must_be_able_to_fire(up, down):
    with pytest.raises(ValueError, match=r'calibrated_score thresholds must lie in \(0, 1\)'):
        ArbiterConfig(calibrated_score_thresholds=Thresholds(up=up, down=down))


# The shipped model's figures (models/detector_gp.npz) and the raw thresholds that
# config/arbitration.yaml shipped before the calibrated score: three orders of magnitude
# above anything the model produces.
SHIPPED = ModelRange('centernet-test', reference_variance_max=1.06e-3, ood_threshold=3.7e-4)
PLACEHOLDERS = Thresholds(up=(1.0, 0.5, 0.25), down=(2.0, 1.0, 0.5))


def test_raw_thresholds_that_cannot_fire_for_the_model_are_refused_in_one_line():
    problem = signal_problem(UncertaintySignal.GP_VARIANCE, 'thresholds.gp_variance.down',
                             PLACEHOLDERS.down, SHIPPED)
    assert problem is not None and '\n' not in problem
    assert problem.startswith('thresholds.gp_variance.down [2, 1, 0.5] cannot fire')
    assert 'centernet-test' in problem and '0.00106 logit^2' in problem
    # Up to ten times the largest validation variance is accepted (unknown objects go
    # beyond the known ones), and so are thresholds of the model's own scale.
    for down in ((1.06e-2, 1e-3, 5e-4), (3.7e-4, 3.4e-4, 3.1e-4)):
        assert signal_problem(UncertaintySignal.GP_VARIANCE, 'x', down, SHIPPED) is None
    # Without the model's range (-1) there is nothing to check against.
    assert signal_problem(UncertaintySignal.GP_VARIANCE, 'x', PLACEHOLDERS.down,
                          ModelRange('old')) is None


def test_the_calibrated_score_is_refused_for_a_model_without_a_score_reference():
    problem = signal_problem(UncertaintySignal.CALIBRATED_SCORE, 'x', (0.98, 0.95, 0.93),
                             ModelRange('old-model'))
    assert "model 'old-model' has no score reference" in problem
    assert signal_problem(UncertaintySignal.CALIBRATED_SCORE, 'x', (0.98,), SHIPPED) is None
    # 0 is what a producer that leaves the field unset sends: no range either.
    assert not ModelRange('m', 0.0).has_score_reference
    assert 'no score reference' in signal_problem(UncertaintySignal.CALIBRATED_SCORE, 'x',
                                                  (0.98,), ModelRange('m', 0.0))


def test_a_refused_signal_holds_teleoperation_and_a_fixed_parameter_releases_it():
    arbiter = Arbiter(config(min_dwell_s=0.0, gp_variance_thresholds=PLACEHOLDERS), 0.0)
    t = 0.0
    for _ in range(5):
        t += 0.1
        step = arbiter.observe(t, [det(5e-4, score=0.98)], 2, model=SHIPPED)
    assert step.state.level == Level.TELEOPERATION and step.state.perception_stale
    assert step.state.reason.startswith('refused: thresholds.gp_variance.down [2, 1, 0.5]')
    assert arbiter.signal_problem == step.state.reason.removeprefix('refused: ')
    # The same frames under the calibrated score: an unknown object (0.98 > down[0]) keeps
    # teleoperation, now for the right reason; a familiar one climbs.
    step = arbiter.set_config(ArbiterConfig(min_dwell_s=0.0), t)
    assert arbiter.signal_problem is None and not step.state.perception_stale
    assert step.state.level == Level.TELEOPERATION
    for _ in range(4):
        t += 0.1
        step = arbiter.observe(t, [det(5e-5, score=0.4)], 2, model=SHIPPED)
    assert step.state.level == Level.ASSISTANCE
    step = arbiter.observe(t + 0.1, [det(5e-4, score=0.99)], 2, model=SHIPPED)
    assert step.state.level == Level.TELEOPERATION
    assert 'calibrated_score 0.99 above down threshold 0.98' in step.state.reason


def test_model_figures_are_checked_by_rule():
    for bad in (ModelRange('m', math.nan), ModelRange('m', 1e-3, -0.5),
                ModelRange('m', -2.0), ModelRange('m', 1e-3, math.inf)):
        assert model_range_problem(bad) is not None
        step = Arbiter(ArbiterConfig(), 0.0).observe(0.1, [det(score=0.1)], 2, model=bad)
        assert step.state.perception_stale and 'invalid DetectionArray' in step.state.reason
    for good in (SHIPPED, ModelRange(), ModelRange('m', 0.0, 0.0)):
        assert model_range_problem(good) is None


# -- the autonomy's target ----------------------------------------------------------------

def test_autonomy_target_follows_the_announced_track_only():
    cfg = ArbiterConfig(driving_detection='autonomy_target')
    frame = [det(score=0.99, track=3, cls='ellipsoid'), det(score=0.2, track=8)]
    assert not assess_frame(frame, 2, cfg).usable  # nothing announced
    assert 'announces no target' in assess_frame(frame, 2, cfg, None, -1).reason
    p = assess_frame(frame, 2, cfg, None, 8)
    assert p.usable and p.index == 1 and p.uncertainty == pytest.approx(0.2)
    missing = assess_frame(frame, 2, cfg, None, 5)
    assert not missing.usable and missing.target_missing and 'track 5 not detected' in \
        missing.reason


def test_a_frame_without_the_announced_target_counts_as_no_new_perception():
    arbiter = Arbiter(ArbiterConfig(driving_detection='autonomy_target', min_dwell_s=0.0,
                                    perception_deadline_s=0.5), 0.0)
    t = 0.0
    for _ in range(4):
        t += 0.1
        arbiter.autonomy_target(t, 7)
        arbiter.observe(t, [det(score=0.3, track=7), det(score=0.99, track=2)], 2)
    assert arbiter.level == Level.ASSISTANCE  # the uncertain track 2 is not the target
    # The autonomy switches to track 9, not yet in the frame at hand: the level holds ...
    arbiter.autonomy_target(t + 0.05, 9)
    step = arbiter.observe(t + 0.1, [det(score=0.3, track=7)], 2)
    assert step.state.level == Level.ASSISTANCE and not step.state.perception_stale
    # ... until the deadline after the last frame that had the target.
    step = arbiter.step(t + 0.51)
    assert step.state.level == Level.TELEOPERATION and step.state.perception_stale
    assert 'perception stale: no valid DetectionArray within 0.5 s' in step.state.reason
    # An uncertain target ends assistance at once.
    arbiter = Arbiter(ArbiterConfig(driving_detection='autonomy_target', min_dwell_s=0.0), 0.0)
    for _ in range(4):
        t += 0.1
        arbiter.autonomy_target(t, 7)
        arbiter.observe(t, [det(score=0.3, track=7), det(score=0.2, track=9)], 2)
    arbiter.autonomy_target(t + 0.05, 9)
    step = arbiter.observe(t + 0.1, [det(score=0.3, track=7), det(score=0.99, track=9)], 2)
    assert step.state.level == Level.TELEOPERATION and not step.state.perception_stale


def test_an_old_announcement_counts_as_none():
    arbiter = Arbiter(ArbiterConfig(driving_detection='autonomy_target', min_dwell_s=0.0,
                                    autonomy_timeout_s=0.5), 0.0)
    arbiter.autonomy_target(0.0, 7)
    assert arbiter.observe(0.4, [det(score=0.3, track=7)], 2).state.perception_stale is False
    step = arbiter.observe(0.6, [det(score=0.3, track=7)], 2)
    assert step.state.perception_stale and 'announces no target' in step.state.reason


def test_mutual_information_signal_reads_the_other_field():
    cfg = config(uncertainty_signal='mutual_information')
    p = assess_frame([det(5.0, 0.02), det(0.1, 0.4)], 2, cfg)
    assert p.index == 1 and p.uncertainty == pytest.approx(0.4)


def test_target_class_takes_the_most_uncertain_of_that_class():
    cfg = config(driving_detection=DrivingDetection.TARGET_CLASS, target_class='box')
    frame = [det(3.0, cls='cup'), det(0.3, cls='box', index=1), det(0.6, cls='box', index=1)]
    p = assess_frame(frame, 2, cfg)
    assert p.usable and p.index == 2
    missing = assess_frame([det(0.1, cls='cup')], 2, cfg)
    assert not missing.usable and "'box' not detected" in missing.reason


def test_track_id_selection():
    cfg = config(driving_detection='track_id', target_track_id=7)
    p = assess_frame([det(3.0, track=1), det(0.4, track=7)], 2, cfg)
    assert p.usable and p.index == 1
    assert not assess_frame([det(0.4, track=1)], 2, cfg).usable


def test_nearest_center_selection():
    cfg = config(driving_detection='nearest_center', image_width=200, image_height=100)
    frame = [det(3.0, x=10.0, y=10.0), det(0.4, x=110.0, y=45.0), det(0.9, x=150.0, y=90.0)]
    p = assess_frame(frame, 2, cfg)
    assert p.index == 1 and p.uncertainty == pytest.approx(0.4)


@pytest.mark.parametrize(('width', 'height'), [(640, 480), (480, 640), (1280, 200),
                                             (200, 1280), (301, 99)])
def test_nearest_center_measures_from_x_half_width_y_half_height(width, height):
    # On a non-square image the centre (width/2, height/2) and its mirror (height/2,
    # width/2) are different points: a detection sits on each, the mirror's the more
    # uncertain (so a mix-up cannot hide behind the cautious tie-break), and a third one
    # half-way between them. Only the first is nearest the true centre.
    cfg = config(driving_detection='nearest_center', image_width=width, image_height=height)
    centre, mirror = (width / 2, height / 2), (height / 2, width / 2)
    between = ((centre[0] + mirror[0]) / 2, (centre[1] + mirror[1]) / 2)
    for order in ([0, 1, 2], [1, 2, 0], [2, 0, 1]):
        points = [(centre, 0.3), (mirror, 1.7), (between, 0.9)]
        frame = [det(u, x=x, y=y) for (x, y), u in (points[i] for i in order)]
        chosen = assess_frame(frame, 2, cfg)
        assert chosen.usable and chosen.index == order.index(0), (width, height, order)
        assert chosen.uncertainty == pytest.approx(0.3)


def test_nearest_center_picks_the_least_squared_distance_ties_to_the_more_uncertain():
    # The rule over many frames: the chosen detection is at the least distance from
    # (width/2, height/2); among those at that distance, the most uncertain.
    rng = np.random.default_rng(7)
    for _ in range(300):
        width, height = (int(v) for v in rng.integers(16, 2000, 2))
        cfg = config(driving_detection='nearest_center', image_width=width, image_height=height)
        count = int(rng.integers(1, 8))
        xs = rng.integers(0, width + 1, count).astype(float)
        ys = rng.integers(0, height + 1, count).astype(float)
        if count > 1 and rng.random() < 0.3:  # an exact tie in distance: mirrored about x
            xs[1], ys[1] = width - xs[0], ys[0]
        us = np.round(rng.uniform(0.0, 3.0, count), 3)
        frame = [det(float(u), x=float(x), y=float(y)) for x, y, u in zip(xs, ys, us, strict=True)]
        chosen = assess_frame(frame, 2, cfg)
        dist = (xs - width / 2) ** 2 + (ys - height / 2) ** 2
        nearest = np.flatnonzero(dist == dist.min())
        assert chosen.usable and chosen.index in nearest, (width, height, xs, ys)
        assert chosen.uncertainty == pytest.approx(float(us[nearest].max()))


@pytest.mark.parametrize(('frame', 'n_classes', 'needle'), [
    ([], 2, 'empty'),
    ([det(math.nan)], 2, 'non-finite gp_variance'),
    ([det(0.1), det(math.inf)], 2, 'non-finite gp_variance'),
    ([det(-0.5)], 2, 'negative gp_variance'),
    ([det(0.1, w=-1.0)], 2, 'non-positive box size'),
    ([det(0.1, h=0.0)], 2, 'non-positive box size'),
    ([det(0.1, x=2e5)], 2, 'box beyond'),
    ([det(0.1, x=math.nan)], 2, 'non-finite box'),
    ([det(0.1, index=5)], 2, 'class_index 5'),
    ([det(0.1, probs=3)], 2, '3 class probabilities'),
    ([det(0.1, index=99)], 0, 'class_index 99 outside [-1, 0)'),
    ([det(0.1, probs=0)], 2, '0 class probabilities for 2 classes'),
])
def test_broken_frames_are_unusable_with_a_reason(frame, n_classes, needle):
    p = assess_frame(frame, n_classes, config())
    assert not p.usable and needle in p.reason and math.isnan(p.uncertainty)


def test_every_field_of_every_detection_is_checked_not_only_the_driving_signal():
    base = det(0.1, 0.01)
    cases = {
        'score': (dataclasses.replace(base, score=math.nan), 'score nan'),
        'score range': (dataclasses.replace(base, score=1.5), 'score 1.5 outside'),
        'mi nan': (dataclasses.replace(base, mutual_information=math.nan),
                   'non-finite mutual_information'),
        'mi negative': (dataclasses.replace(base, mutual_information=-1.0),
                        'negative mutual_information'),
        'entropy above ln C': (dataclasses.replace(base, predictive_entropy=3.0),
                               'predictive_entropy 3 above ln(2)'),
        'expected above predictive': (dataclasses.replace(base, predictive_entropy=0.2,
                                                          expected_entropy=0.5),
                                      'expected_entropy 0.5 above predictive_entropy'),
        'max probability': (dataclasses.replace(base, max_probability=1.2),
                            'max_probability 1.2 above 1'),
        'class variance length': (dataclasses.replace(base, class_variance=(0.1,)),
                                  '1 class variances for 2 classes'),
        'class variance inf': (dataclasses.replace(base, class_variance=(0.1, math.inf)),
                               'non-finite class_variance'),
        'probability nan': (dataclasses.replace(base, class_probabilities=(math.nan, 0.5)),
                            'non-finite class probability'),
        'probability range': (dataclasses.replace(base, class_probabilities=(1.5, -0.5)),
                              'outside [0, 1]'),
        'probability sum': (dataclasses.replace(base, class_probabilities=(0.5, 0.2)),
                            'sum to 0.7'),
    }
    for signal in ('gp_variance', 'mutual_information'):
        cfg = config(uncertainty_signal=signal)
        assert assess_frame([base], 2, cfg).usable
        for name, (broken, needle) in cases.items():
            p = assess_frame([base, broken], 2, cfg)
            assert not p.usable and needle in p.reason, (signal, name, p.reason)


def test_frame_level_uncertainty_is_checked():
    good = UncertaintyValues(gp_variance=0.1, mutual_information=0.01)
    assert assess_frame([det()], 2, config(), good).usable
    bad = UncertaintyValues(gp_variance=math.nan)
    p = assess_frame([det()], 2, config(), bad)
    assert not p.usable and 'frame-level uncertainty' in p.reason


def test_too_many_detections_is_refused_before_any_detection_is_read():
    cfg = config(max_detections=3)
    assert assess_frame([det()] * 3, 2, cfg).usable
    # The fourth detection is broken, but the count alone decides.
    p = assess_frame([det()] * 3 + [det(math.nan)], 2, cfg)
    assert not p.usable and '4 detections, more than max_detections 3' in p.reason


@pytest.mark.parametrize(('stamp', 'clock', 'needle'), [
    (0.0, 1e9, 'old, more than max_frame_age_s 1'),
    (100.0 - 3600.0, 100.0, 'old'),
    (100.0 + 3600.0, 100.0, 'ahead of the clock'),
    (100.3, 100.0, 'ahead of the clock'),
    (math.nan, 100.0, 'not comparable'),
])
def test_bad_stamps_are_reported(stamp, clock, needle):
    problem = stamp_problem(stamp, clock, config())
    assert problem is not None and needle in problem


@pytest.mark.parametrize(('stamp', 'ahead'), [
    (0.0, False), (100.0, False), (100.25, False), (100.3, True), (3700.0, True)])
def test_future_stamp_rule_is_the_future_half_of_the_stamp_rule(stamp, ahead):
    """Nodes that accept old frames (ask-for-help) reuse it with their own bound."""
    cfg = config()
    problem = future_stamp_problem(stamp, 100.0, cfg.max_future_stamp_s)
    if ahead:
        assert problem == stamp_problem(stamp, 100.0, cfg)
        assert 'ahead of the clock, more than max_future_stamp_s 0.25' in problem
    else:
        assert problem is None  # old frames too: only stamp_problem refuses those
    assert 'not comparable' in future_stamp_problem(math.nan, 100.0, 0.25)


def test_recent_stamps_pass():
    cfg = config()
    for stamp in (100.0, 99.5, 99.01, 100.2):
        assert stamp_problem(stamp, 100.0, cfg) is None


def test_invalid_frame_and_reset_force_teleoperation():
    arb = Arbiter(config(min_dwell_s=0.0), 0.0)
    t = 0.0
    for _ in range(4):
        t += 0.05
        arb.observe(t, [det(0.05)], 2)
    assert arb.level == Level.ASSISTANCE
    step = arb.observe_invalid(t + 0.05, 'invalid DetectionArray: stamp 3600 s old')
    assert step.state.level == Level.TELEOPERATION and step.state.perception_stale
    assert 'stamp 3600 s old' in step.state.reason
    for _ in range(4):
        t += 0.1
        arb.observe(t, [det(0.05)], 2)
    assert arb.level == Level.ASSISTANCE
    step = arb.reset(t + 0.05, 'clock jumped back')
    assert step.state.level == Level.TELEOPERATION and step.state.reason == 'clock jumped back'
    # Still teleoperation at the next tick: nothing from before the reset counts.
    assert arb.step(t + 0.1).state.level == Level.TELEOPERATION


def test_commands_sent_respect_speed_and_acceleration_limits():
    cfg = config(max_linear_speed=1.0, max_angular_speed=0.5, max_linear_accel=2.0,
                        max_angular_accel=1.0)
    arb = Arbiter(cfg, 0.0)
    huge = np.array([1.7e308, 0.0, 0.0, 0.0, 0.0, -1e300])
    sent = [arb.command_to_send(0.0, huge)]
    t = 0.0
    for _ in range(40):
        t += 0.05
        sent.append(arb.command_to_send(t, huge))
    sent = np.array(sent)
    assert np.all(np.isfinite(sent))
    assert np.all(np.linalg.norm(sent[:, :3], axis=1) <= 1.0 + 1e-12)
    assert np.all(np.linalg.norm(sent[:, 3:], axis=1) <= 0.5 + 1e-12)
    # First command: no time has passed since the (zero) start, so no change at all.
    assert np.all(sent[0] == 0.0)
    steps = np.diff(sent, axis=0)
    assert np.all(np.linalg.norm(steps[:, :3], axis=1) <= 2.0 * 0.05 + 1e-9)
    assert np.all(np.linalg.norm(steps[:, 3:], axis=1) <= 1.0 * 0.05 + 1e-9)
    # The limits are reached, direction kept: full speed forward, full turn to the right.
    assert sent[-1] == pytest.approx([1.0, 0.0, 0.0, 0.0, 0.0, -0.5])
    # Slowing down is rate-limited too, and NaN never reaches the robot.
    nan_cmd = arb.command_to_send(t + 0.05, [math.nan] * 6)
    assert nan_cmd[0] == pytest.approx(0.9) and np.all(np.isfinite(nan_cmd))


def test_lowered_speed_limit_wins_over_the_acceleration_limit():
    arb = Arbiter(config(), 0.0)
    t = 0.0
    for _ in range(20):
        t += 0.05
        arb.command_to_send(t, [1.0, 0, 0, 0, 0, 0])
    arb.set_config(config(max_linear_speed=0.2), t)
    assert arb.command_to_send(t + 0.05, [1.0, 0, 0, 0, 0, 0])[0] == pytest.approx(0.2)


def test_rounding_below_zero_is_tolerated():
    p = assess_frame([det(-1e-9)], 2, config())
    assert p.usable and p.uncertainty == 0.0


# -- configuration ------------------------------------------------------------------------

@pytest.mark.parametrize(('up', 'down', 'needle'), [
    ((1.0, 0.5), (2.0, 1.0, 0.5), 'need 3 values'),
    ((0.5, 1.0, 0.25), (2.0, 1.5, 0.5), 'strictly decrease'),
    ((1.0, 0.5, 0.25), (2.0, 0.4, 0.3), 'down[1] > up[1]'),
    ((1.0, 0.5, -0.1), (2.0, 1.0, 0.5), 'finite and >= 0'),
    ((1.0, 0.5, 0.25), (2.0, 1.0, math.nan), 'finite and >= 0'),
])
def test_invalid_thresholds_are_refused(up, down, needle):
    with pytest.raises(ValueError, match=needle.replace('[', r'\[').replace(']', r'\]')):
        Thresholds(up=up, down=down)


@pytest.mark.parametrize(('kwargs', 'needle'), [
    ({'uncertainty_signal': 'entropy'}, 'uncertainty_signal must be one of'),
    ({'driving_detection': 'biggest'}, 'driving_detection must be one of'),
    ({'driving_detection': 'target_class'}, 'non-empty target_class'),
    ({'driving_detection': 'track_id'}, 'target_track_id >= 0'),
    ({'perception_deadline_s': 0.0}, 'perception_deadline_s'),
    ({'min_dwell_s': math.inf}, 'min_dwell_s'),
    ({'blend_alpha_min': 0.9, 'blend_alpha_max': 0.5}, 'blend_alpha_min <= blend_alpha_max'),
])
def test_invalid_config_is_refused(kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        ArbiterConfig(**kwargs)


def test_shipped_yaml_declares_every_parameter_and_is_valid():
    values = load_parameters_file(REPO / 'config' / 'arbitration.yaml')
    assert set(values) == {spec.name for spec in PARAMETERS}
    assert config_from_values(values) == config_from_values(default_values())


@pytest.mark.parametrize(('name', 'value', 'needle'), [
    ('thresholds.gp_variance.up', [0.2, 0.5, 0.1], 'thresholds.gp_variance: up thresholds'),
    ('thresholds.mutual_information.down', [0.5, 0.1, 0.05], 'down[1] > up[1]'),
    ('min_dwell_s', 1, 'min_dwell_s must be a float'),
    ('perception_deadline_s', 0.01, 'perception_deadline_s must be >= decision_period_s'),
    ('operator_deadband', -0.1, 'operator_deadband must be >= 0'),
    ('uncertainty_signal', 'variance', 'uncertainty_signal must be one of'),
])
def test_parameter_values_are_validated(name, value, needle):
    values = default_values()
    values[name] = value
    with pytest.raises(ValueError, match=needle.replace('[', r'\[').replace(']', r'\]')):
        config_from_values(values)


def test_unknown_parameter_is_refused():
    values = default_values()
    values['min_dwel_s'] = 1.0
    with pytest.raises(ValueError, match='unknown parameters: min_dwel_s'):
        config_from_values(values)


# -- state machine ------------------------------------------------------------------------

def _climb(arbiter: Arbiter, t: float, u: float, until: Level, period: float = 0.1) -> float:
    for _ in range(1000):
        if arbiter.level == until:
            return t
        t += period
        arbiter.observe(t, [det(u)], 2)
    raise AssertionError(f'never reached {until}')


def test_climbs_one_level_per_dwell_and_drops_at_once():
    cfg = config(min_dwell_s=1.0)
    arbiter = Arbiter(cfg, 0.0)
    ups = []
    t = 0.0
    while arbiter.level != Level.ASSISTANCE:
        t += 0.1
        step = arbiter.observe(t, [det(0.01)], 2)
        if step.transition:
            ups.append((step.transition.time, step.transition.to_level))
    assert [lvl for _, lvl in ups] == [Level.GUIDED, Level.SHARED, Level.ASSISTANCE]
    assert all(b[0] - a[0] >= 1.0 - 1e-9 for a, b in zip(ups, ups[1:], strict=False))
    # Above down[0]: straight to teleoperation in one decision, with the crossed threshold.
    step = arbiter.observe(t + 0.1, [det(2.5)], 2)
    assert step.state.level == Level.TELEOPERATION and step.transition is not None
    assert step.transition.from_level == Level.ASSISTANCE
    assert 'above down threshold 2' in step.state.reason


def test_intermediate_drop_lands_on_the_right_level():
    arbiter = Arbiter(config(min_dwell_s=0.0), 0.0)
    t = _climb(arbiter, 0.0, 0.01, Level.ASSISTANCE)
    # down = (2, 1, 0.5): 0.8 ends assistance (> 0.5) but not shared (<= 1).
    step = arbiter.observe(t + 0.1, [det(0.8)], 2)
    assert step.state.level == Level.SHARED and step.state.previous_level == Level.ASSISTANCE


def test_stale_perception_falls_back_and_recovers_after_dwell():
    # Without the restore after an outage (tested below), the climb starts again.
    arbiter = Arbiter(config(min_dwell_s=0.5, perception_deadline_s=0.3, resume_window_s=0.0),
                      0.0)
    t = _climb(arbiter, 0.0, 0.01, Level.SHARED)
    assert arbiter.step(t + 0.29).state.level == Level.SHARED  # within the deadline
    step = arbiter.step(t + 0.31)
    assert step.state.level == Level.TELEOPERATION and step.state.perception_stale
    assert 'perception stale' in step.state.reason and math.isnan(step.state.uncertainty)
    step = arbiter.observe(t + 0.4, [det(0.01)], 2)
    assert not step.state.perception_stale and step.changed
    assert step.state.level == Level.TELEOPERATION  # dwell restarts after the fall-back
    assert arbiter.observe(t + 0.95, [det(0.01)], 2).state.level == Level.GUIDED


MODEL = ModelRange('detector-a', 1.0, -1.0)


def _outage(cfg: ArbiterConfig, u_before: float = 0.01) -> tuple[Arbiter, float]:
    """An arbiter at assistance on frames of MODEL, then no frames: returns it and the time
    of its last frame."""
    arbiter = Arbiter(cfg, 0.0)
    t = 0.0
    while arbiter.level != Level.ASSISTANCE:
        t += 0.1
        arbiter.observe(t, [det(u_before)], 2, model=MODEL)
    step = arbiter.step(t + cfg.perception_deadline_s + 0.01)
    assert step.state.level == Level.TELEOPERATION and step.state.perception_stale
    return arbiter, t


def _frames(arbiter: Arbiter, start: float, stop: float, u: float,
            model: ModelRange | None = MODEL, period: float = 1 / 15) -> list:
    steps, t = [], start
    while t <= stop + 1e-9:
        steps.append(arbiter.observe(t, [det(u)], 2, model=model))
        t += period
    return steps


RESTORE = {'min_dwell_s': 1.0, 'perception_deadline_s': 0.5, 'resume_window_s': 5.0,
           'resume_confirm_s': 0.2}


def test_a_short_outage_restores_the_level_once_the_same_model_confirms_it():
    arbiter, last = _outage(config(**RESTORE))
    back = last + 2.0  # a restarted detector's first frame
    steps = _frames(arbiter, back, back + 0.5, 0.01)
    restored = next(s for s in steps if s.transition is not None)
    assert restored.transition.from_level == Level.TELEOPERATION
    assert restored.transition.to_level == Level.ASSISTANCE
    # Confirmed over 0.2 s of frames (the first at `back`), not a dwell per level.
    assert 0.2 <= restored.transition.time - back < 0.2 + 1 / 15 + 1e-9
    assert 'level before the outage restored' in restored.state.reason
    assert all(s.state.level == Level.TELEOPERATION for s in steps[:steps.index(restored)])
    assert steps[-1].state.level == Level.ASSISTANCE


@pytest.mark.parametrize('case', ['another model', 'less certain', 'window over',
                                  'one uncertain frame', 'disabled'])
def test_otherwise_the_climb_after_an_outage_is_the_normal_one(case):
    cfg = config(**{**RESTORE, 'resume_window_s': 0.0 if case == 'disabled' else 5.0})
    arbiter, last = _outage(cfg)
    back = last + (5.5 if case == 'window over' else 1.5)
    model = ModelRange('detector-b', 1.0, -1.0) if case == 'another model' else MODEL
    # RAW up = (1.0, 0.5, 0.25): 0.3 would allow shared, not assistance.
    u = 0.3 if case == 'less certain' else 0.01
    steps, start = [], back
    if case == 'one uncertain frame':  # two certain frames, one above up[2], then certain
        steps += _frames(arbiter, back, back + 1.5 / 15, 0.01)
        steps += _frames(arbiter, back + 2 / 15, back + 2 / 15, 0.6)
        start = back + 3 / 15
    steps += _frames(arbiter, start, back + 0.9, u, model)
    assert all(s.state.level == Level.TELEOPERATION for s in steps), case
    steps = _frames(arbiter, back + 0.9 + 1 / 15, back + 1.2, u, model)
    assert steps[-1].state.level == Level.GUIDED, case  # one level after one dwell


def test_the_fail_safe_still_holds_during_and_after_a_restore():
    arbiter, last = _outage(config(**RESTORE))
    back = last + 1.0
    _frames(arbiter, back, back + 0.1, 0.01)
    # Lost again before the confirmation: teleoperation at the same deadline.
    step = arbiter.step(back + 0.1 + 0.51)
    assert step.state.level == Level.TELEOPERATION and step.state.perception_stale
    steps = _frames(arbiter, back + 1.0, back + 1.5, 0.01)
    assert steps[-1].state.level == Level.ASSISTANCE
    # Restored, then a high uncertainty: down at once, as always.
    step = arbiter.observe(back + 1.55, [det(2.5)], 2, model=MODEL)
    assert step.state.level == Level.TELEOPERATION and not step.state.perception_stale
    # An override in force when perception is lost: nothing is remembered.
    arbiter, last = _outage(config(**RESTORE))
    _frames(arbiter, last + 1.0, last + 1.2, 0.01)
    arbiter.set_override(last + 1.3, 3, 0.0)
    arbiter.step(last + 2.0)  # lost under the override
    arbiter.set_override(last + 2.1, -1, 0.0)
    steps = _frames(arbiter, last + 2.2, last + 2.8, 0.01)
    assert all(s.state.level == Level.TELEOPERATION for s in steps)


def test_a_reset_forgets_the_level_held_before():
    arbiter = Arbiter(config(**RESTORE), 0.0)
    t = 0.0
    while arbiter.level != Level.ASSISTANCE:  # frames without model figures
        t += 0.1
        arbiter.observe(t, [det(0.01)], 2)
    step = arbiter.reset(t + 0.05, 'clock jumped back')
    assert step.state.level == Level.TELEOPERATION
    steps = _frames(arbiter, t + 0.1, t + 0.9, 0.01, model=None)
    assert all(s.state.level == Level.TELEOPERATION for s in steps)


@pytest.mark.parametrize('held', [Level.GUIDED, Level.SHARED, Level.ASSISTANCE])
@pytest.mark.parametrize('reset_after', [0.0, 0.5, 1.4])
def test_a_reset_during_an_outage_forgets_the_level_held_before_it(held, reset_after):
    # The outage remembers the level; a reset then (a clock jump: frames from before it mean
    # nothing) must forget it too, so the same model's frames within the resume window climb
    # from teleoperation, one level per dwell, as after any reset.
    cfg = config(**RESTORE)
    arbiter = Arbiter(cfg, 0.0)
    t = _climb(arbiter, 0.0, 0.01, held)
    _frames(arbiter, t, t + 0.2, 0.01)  # a few frames of MODEL at the held level
    last = t + 0.2
    lost = arbiter.step(last + cfg.perception_deadline_s + 0.01)
    assert lost.state.level == Level.TELEOPERATION and lost.state.perception_stale
    reset = arbiter.reset(last + cfg.perception_deadline_s + 0.01 + reset_after,
                          'clock jumped back')
    assert reset.state.level == Level.TELEOPERATION
    back = last + 2.0  # after the reset, well within resume_window_s of the last frame
    assert last + cfg.perception_deadline_s + 0.01 + reset_after < back
    assert back - last < cfg.resume_window_s
    steps = _frames(arbiter, back, back + 3 * cfg.min_dwell_s + 0.2, 0.01)
    ups = [s.transition for s in steps if s.transition is not None]
    # Every change is one level up, the first a dwell after the first fresh frame.
    assert [(u.from_level, u.to_level) for u in ups][:1] == [
        (Level.TELEOPERATION, Level.GUIDED)], ups
    assert all(u.to_level == u.from_level + 1 for u in ups), ups
    assert ups[0].time - back >= cfg.min_dwell_s - 1e-9
    assert all(b.time - a.time >= cfg.min_dwell_s - 1e-9
               for a, b in zip(ups, ups[1:], strict=False))
    assert not any('level before the outage restored' in s.state.reason for s in steps)


def test_resume_settings_are_validated():
    for name in ('resume_window_s', 'resume_confirm_s'):
        with pytest.raises(ValueError, match=f'{name} must be finite and >= 0'):
            ArbiterConfig(**{name: -1.0})
        with pytest.raises(ValueError, match=name):
            ArbiterConfig(**{name: math.nan})


def test_perception_is_usable_up_to_and_including_the_deadline():
    # Binary fractions, so that the age at the boundary is exactly the deadline.
    arbiter = Arbiter(config(min_dwell_s=0.0, perception_deadline_s=0.25), 0.0)
    assert _climb(arbiter, 0.0, 0.01, Level.ASSISTANCE) < 2.0
    assert arbiter.observe(2.0, [det(0.01)], 2).state.level == Level.ASSISTANCE
    at_deadline = arbiter.step(2.25).state
    assert not at_deadline.perception_stale and at_deadline.level == Level.ASSISTANCE
    past = arbiter.step(2.25 + 2.0 ** -20).state
    assert past.perception_stale and past.level == Level.TELEOPERATION
    assert 'no valid DetectionArray within 0.25 s' in past.reason


def test_override_forces_a_level_and_expires():
    arbiter = Arbiter(config(min_dwell_s=10.0), 0.0)
    arbiter.observe(0.1, [det(1.5)], 2)  # between up[0] and down[0]: teleoperation holds
    ok, message, step = arbiter.set_override(0.2, 3, 1.0)
    assert ok and 'assistance for 1 s' in message
    assert step.state.level == Level.ASSISTANCE and step.state.override_active
    assert step.state.override_expires == pytest.approx(1.2)
    arbiter.observe(0.6, [det(1.5)], 2)
    arbiter.observe(1.0, [det(1.5)], 2)
    assert arbiter.step(1.19).state.level == Level.ASSISTANCE
    step = arbiter.step(1.2)
    # Released at the signal's mercy: 1.5 > down[2] and down[1], <= down[0] -> guided.
    assert not step.state.override_active and step.state.level == Level.GUIDED
    assert step.transition is not None and 'gp_variance 1.5 above' in step.transition.reason


def test_override_release_and_refusals():
    arbiter = Arbiter(config(), 0.0)
    arbiter.observe(0.1, [det(0.01)], 2)
    assert arbiter.set_override(0.2, 4, 1.0)[0] is False
    assert arbiter.set_override(0.2, 2, -1.0)[0] is False
    assert arbiter.set_override(0.2, 2, math.nan)[0] is False
    ok, _, step = arbiter.set_override(0.2, 2, 0.0)
    assert ok and step.state.level == Level.SHARED and step.state.override_expires is None
    assert arbiter.step(100.0).state.level == Level.TELEOPERATION  # stale beats override
    arbiter.observe(100.1, [det(0.01)], 2)
    assert arbiter.level == Level.SHARED  # the override comes back with perception
    ok, message, step = arbiter.set_override(100.2, -1, 0.0)
    assert ok and message == 'override released' and not step.state.override_active
    assert step.state.reason == 'manual override released'


def test_override_waits_while_perception_is_unusable():
    arbiter = Arbiter(config(), 0.0)
    arbiter.observe(0.1, [det(math.nan)], 2)
    ok, message, step = arbiter.set_override(0.2, 3, 5.0)
    assert ok and 'held at teleoperation' in message
    assert step.state.level == Level.TELEOPERATION and step.state.override_active


def test_switching_signal_reassesses_the_latest_frame():
    arbiter = Arbiter(config(min_dwell_s=0.0), 0.0)
    t = _climb(arbiter, 0.0, 0.01, Level.ASSISTANCE)
    arbiter.observe(t, [det(0.01, mi=0.45)], 2)
    assert arbiter.level == Level.ASSISTANCE
    mi_config = config(min_dwell_s=0.0, uncertainty_signal='mutual_information')
    step = arbiter.set_config(mi_config, t + 0.01)
    # MI 0.45 > down (0.5, 0.3, 0.1)[1] -> guided at once.
    assert step.state.level == Level.GUIDED and step.state.uncertainty_signal.value == \
        UncertaintySignal.MUTUAL_INFORMATION.value
    assert step.state.down_thresholds == (0.5, 0.3, 0.1)


def test_operator_timeout_gives_zero_and_nonfinite_commands_are_ignored():
    arbiter = Arbiter(config(operator_timeout_s=0.5), 0.0)
    assert arbiter.operator_command(0.0, [0.3, 0, 0, 0, 0, 0.1])
    assert not arbiter.operator_command(0.1, [math.nan, 0, 0, 0, 0, 0])
    assert not arbiter.operator_command(0.1, [1.0, 2.0])
    np.testing.assert_allclose(arbiter.step(0.4).command, [0.3, 0, 0, 0, 0, 0.1])
    np.testing.assert_allclose(arbiter.step(0.51).command, np.zeros(6))

