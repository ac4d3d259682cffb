"""Property-based tests of the frame validity rule (hypothesis).

A valid frame is generated from scratch (a real distribution over the classes, entropies that
fit it, a box inside a camera image), then exactly one field of one detection, or of the
frame-level uncertainty, is corrupted. For every driving signal:

1. the uncorrupted frame is usable;
2. the corrupted frame is unusable, its reason names the corrupted field, nothing raises;
3. an arbiter fed the corrupted frame falls to teleoperation at once, and a stream of such
   frames never lifts it above teleoperation.
"""

from __future__ import annotations

import dataclasses
import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from uq_autonomy.arbitration.arbiter import Arbiter
from uq_autonomy.arbitration.config import ArbiterConfig, Level, UncertaintySignal
from uq_autonomy.arbitration.frame_validity import DetectionSummary, UncertaintyValues, assess_frame

SETTINGS = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])
SIGNALS = st.sampled_from(list(UncertaintySignal))


@st.composite
def detections(draw: st.DrawFn, num_classes: int) -> DetectionSummary:
    weights = draw(st.lists(st.floats(0.01, 1.0), min_size=num_classes, max_size=num_classes))
    probs = tuple(w / math.fsum(weights) for w in weights)
    pe = draw(st.floats(0.0, math.log(max(num_classes, 2))))
    ee = draw(st.floats(0.0, 1.0)) * pe
    class_variance = draw(st.one_of(
        st.just(()), st.lists(st.floats(0.0, 10.0), min_size=num_classes,
                              max_size=num_classes).map(tuple)))
    return DetectionSummary(
        class_id='c', class_index=draw(st.integers(-1, num_classes - 1)),
        track_id=draw(st.integers(-1, 50)), center_x=draw(st.floats(0.0, 1920.0)),
        center_y=draw(st.floats(0.0, 1080.0)), width=draw(st.floats(1.0, 500.0)),
        height=draw(st.floats(1.0, 500.0)), gp_variance=draw(st.floats(0.0, 8.0)),
        mutual_information=pe - ee, class_probabilities=probs,
        score=draw(st.floats(0.0, 1.0)), predictive_entropy=pe, expected_entropy=ee,
        max_probability=max(probs), class_variance=class_variance,
        calibrated_score=draw(st.floats(0.0, 1.0)))


@st.composite
def valid_frames(draw: st.DrawFn) -> tuple[list[DetectionSummary], int]:
    num_classes = draw(st.integers(1, 6))
    frame = draw(st.lists(detections(num_classes), min_size=1, max_size=5))
    return frame, num_classes


NON_FINITE = st.sampled_from([math.nan, math.inf, -math.inf])
NEGATIVE = st.floats(-1e6, -1e-3)


def corruptions(num_classes: int) -> st.SearchStrategy[tuple[str, dict, str]]:
    """(field, replacement, text expected in the reason) for one bad field."""
    too_big_entropy = st.floats(math.log(max(num_classes, 2)) + 0.01, 1e6)
    uncertainty = [
        st.tuples(st.just('gp_variance'), st.one_of(NON_FINITE, NEGATIVE)),
        st.tuples(st.just('mutual_information'), st.one_of(NON_FINITE, NEGATIVE,
                                                           too_big_entropy)),
        st.tuples(st.just('predictive_entropy'), st.one_of(NON_FINITE, NEGATIVE,
                                                           too_big_entropy)),
        st.tuples(st.just('expected_entropy'), st.one_of(NON_FINITE, NEGATIVE,
                                                         too_big_entropy)),
        st.tuples(st.just('max_probability'), st.one_of(NON_FINITE, NEGATIVE,
                                                        st.floats(1.01, 1e6))),
        # -1 is the one value outside [0, 1] a producer may send (no score reference).
        st.tuples(st.just('calibrated_score'), st.one_of(
            NON_FINITE, NEGATIVE.filter(lambda v: v != -1.0), st.floats(1.01, 1e6))),
    ]
    box = [st.tuples(st.sampled_from(['center_x', 'center_y', 'width', 'height']),
                     st.one_of(NON_FINITE, st.floats(1.01e5, 1e30))),
           st.tuples(st.sampled_from(['width', 'height']), st.floats(-1e6, 0.0))]
    other = [
        st.tuples(st.just('score'), st.one_of(NON_FINITE, NEGATIVE, st.floats(1.01, 1e6))),
        st.tuples(st.just('class_index'), st.one_of(st.integers(num_classes, 2**31 - 1),
                                                    st.integers(-2**31, -2))),
    ]
    scalar = st.one_of(*uncertainty, *box, *other).map(
        lambda fv: (fv[0], {fv[0]: fv[1]}, fv[0] if fv[0] not in (
            'center_x', 'center_y', 'width', 'height') else 'box'))
    return st.one_of(scalar, vectors(num_classes))


@st.composite
def vectors(draw: st.DrawFn, num_classes: int) -> tuple[str, dict, str]:
    """A bad probability or class-variance vector."""
    kind = draw(st.sampled_from(['prob-value', 'prob-length', 'prob-sum', 'var-value',
                                 'var-length']))
    good = [1.0 / num_classes] * num_classes
    i = draw(st.integers(0, num_classes - 1))
    if kind == 'prob-value':
        good[i] = draw(st.one_of(NON_FINITE, NEGATIVE, st.floats(1.01, 1e6)))
        return 'class_probabilities', {'class_probabilities': tuple(good)}, 'class probabilit'
    if kind == 'prob-length':
        n = draw(st.integers(0, 12).filter(lambda n: n != num_classes))
        return ('class_probabilities', {'class_probabilities': (1.0 / max(n, 1),) * n},
                f'{n} class probabilities')
    if kind == 'prob-sum':
        # Scaled up only while every value stays <= 1, so the sum alone is wrong.
        scale = draw(st.floats(0.0, 0.99) if num_classes == 1 else
                     st.one_of(st.floats(0.0, 0.99), st.floats(1.01, 1.0 / max(good))))
        return ('class_probabilities',
                {'class_probabilities': tuple(p * scale for p in good)}, 'sum to')
    variances = [0.5] * num_classes
    if kind == 'var-value':
        variances[i] = draw(st.one_of(NON_FINITE, NEGATIVE))
        return 'class_variance', {'class_variance': tuple(variances)}, 'class_variance'
    n = draw(st.integers(1, 12).filter(lambda n: n != num_classes))
    return 'class_variance', {'class_variance': (0.5,) * n}, 'class variances'


@st.composite
def corrupted_frames(draw: st.DrawFn):
    frame, num_classes = draw(valid_frames())
    field, replacement, needle = draw(corruptions(num_classes))
    target = draw(st.integers(-1, len(frame) - 1))  # -1: the frame-level uncertainty
    frame_uncertainty = UncertaintyValues(gp_variance=0.2, mutual_information=0.01,
                                          predictive_entropy=0.3, expected_entropy=0.29,
                                          max_probability=0.9, calibrated_score=0.5)
    uncertainty_fields = {f.name for f in dataclasses.fields(UncertaintyValues)}
    broken = list(frame)
    if target == -1 and field in uncertainty_fields:
        if field == 'class_variance' and 'class variances' not in needle:
            replacement = {field: (math.nan,) * num_classes}
        frame_uncertainty = dataclasses.replace(frame_uncertainty, **replacement)
        needle = f'{needle}' if field != 'class_variance' else 'class_variance'
        if field == 'class_variance' and len(replacement[field]) != num_classes:
            needle = 'class variances'
    else:
        target = max(target, 0)
        broken[target] = dataclasses.replace(frame[target], **replacement)
    return frame, broken, num_classes, frame_uncertainty, field, needle


@SETTINGS
@given(data=corrupted_frames(), signal=SIGNALS)
def test_one_corrupted_field_makes_the_frame_invalid(data, signal):
    frame, broken, num_classes, frame_uncertainty, field, needle = data
    config = ArbiterConfig(uncertainty_signal=signal)
    good = assess_frame(frame, num_classes, config)
    assert good.usable, good.reason
    verdict = assess_frame(broken, num_classes, config, frame_uncertainty)
    assert not verdict.usable, (field, broken)
    assert math.isnan(verdict.uncertainty)
    # The reason names the field (or, for entropies pushed past their bound, the entropy
    # relation that it breaks).
    assert needle in verdict.reason or 'entropy' in verdict.reason, (field, verdict.reason)


@SETTINGS
@given(data=corrupted_frames(), signal=SIGNALS)
def test_corrupted_frames_never_hold_a_level_above_teleoperation(data, signal):
    frame, broken, num_classes, frame_uncertainty, _, _ = data
    # Thresholds no generated value can fail, so the valid stream surely climbs.
    config = ArbiterConfig(uncertainty_signal=signal, min_dwell_s=0.0)
    certain = [dataclasses.replace(d, gp_variance=0.0, mutual_information=0.0,
                                   predictive_entropy=0.0, expected_entropy=0.0,
                                   calibrated_score=0.0)
               for d in frame]
    arbiter = Arbiter(config, 0.0)
    t = 0.0
    for _ in range(4):
        t += 0.05
        arbiter.observe(t, certain, num_classes)
    assert arbiter.level is Level.ASSISTANCE
    t += 0.05
    step = arbiter.observe(t, broken, num_classes, frame_uncertainty)
    assert step.state.level is Level.TELEOPERATION and step.state.perception_stale
    for _ in range(10):
        t += 0.05
        step = arbiter.observe(t, broken, num_classes, frame_uncertainty)
        assert step.state.level is Level.TELEOPERATION
        assert arbiter.step(t + 0.01).state.level is Level.TELEOPERATION
