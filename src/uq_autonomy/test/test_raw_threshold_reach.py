"""Raw GP-variance thresholds against the loaded model's reach, by rule.

With ``uncertainty_signal: gp_variance`` (the expert mode) the thresholds are in one
model's units. A threshold more than ``RAW_THRESHOLD_REACH`` times the model's largest
validation variance cannot fire for it: a ``down`` threshold out of reach never ends its
level, so that level is never handed back on uncertainty. One such threshold is enough to
make the set unsafe, so the set is refused when ANY threshold is out of reach, not only
when all of them are. The examples elsewhere use sets that are entirely in or entirely out
of reach, which cannot tell the two rules apart; here each position is put out of reach on
its own, and the limit itself is checked on both sides.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from uq_autonomy.arbitration.arbiter import Arbiter
from uq_autonomy.arbitration.config import (
    RAW_THRESHOLD_REACH,
    ArbiterConfig,
    Level,
    ModelRange,
    Thresholds,
    UncertaintySignal,
    signal_problem,
)
from uq_autonomy.arbitration.frame_validity import DetectionSummary

GP = UncertaintySignal.GP_VARIANCE
# The shipped model's figures (models/detector_gp.npz), a model with a far wider range and
# one with a far narrower one: the rule scales with the model, not with one magnitude.
MODELS = [
    ModelRange('shipped', reference_variance_max=1.06e-3, ood_threshold=3.7e-4),
    ModelRange('wide', reference_variance_max=0.3, ood_threshold=0.1),
    ModelRange('narrow', reference_variance_max=2.5e-7, ood_threshold=1e-7),
]
MODEL_IDS = [m.model_id for m in MODELS]


def reach(model: ModelRange) -> float:
    """The largest raw threshold the model can still fire (computed as the rule does)."""
    return RAW_THRESHOLD_REACH * model.reference_variance_max


def just_above(x: float) -> float:
    return math.nextafter(x, math.inf)


@pytest.mark.parametrize('model', MODELS, ids=MODEL_IDS)
@pytest.mark.parametrize('size', [1, 3])  # the ask-for-help node passes its one threshold
@pytest.mark.parametrize('beyond', [just_above, lambda r: 1.01 * r, lambda r: 2.0 * r,
                                    lambda r: 1e3 * r], ids=['next-float', '1.01x', '2x', '1000x'])
def test_a_set_with_any_single_threshold_out_of_reach_is_refused(model, size, beyond):
    # signal_problem takes the thresholds as they are given, so every position is checked:
    # the others sit well inside the model's range, only the one at `position` is out.
    limit = reach(model)
    for position in range(size):
        down = [limit * f for f in (0.5, 0.25, 0.125)[:size]]
        down[position] = beyond(limit)
        problem = signal_problem(GP, 'thresholds.gp_variance.down', down, model)
        assert problem is not None, (
            f'{down} accepted for {model.model_id} (reach {limit:g}); position {position} '
            'is out of reach')
        assert 'cannot fire' in problem and model.model_id in problem


@pytest.mark.parametrize('model', MODELS, ids=MODEL_IDS)
@pytest.mark.parametrize('size', [1, 3])
def test_a_threshold_exactly_at_the_reach_is_accepted_in_every_position(model, size):
    limit = reach(model)
    for position in range(size):
        down = [limit * f for f in (0.5, 0.25, 0.125)[:size]]
        down[position] = limit
        assert signal_problem(GP, 'thresholds.gp_variance.down', down, model) is None, down
    # A whole set within reach, the largest exactly at the limit.
    assert signal_problem(GP, 'x', [limit, limit / 2, limit / 4][:size], model) is None


@settings(max_examples=300, deadline=None)
@given(model=st.sampled_from(MODELS),
       fractions=st.lists(st.floats(0.0, 3.0, allow_nan=False), min_size=1, max_size=3))
def test_refused_exactly_when_some_threshold_is_beyond_reach(model, fractions):
    down = [f * reach(model) for f in fractions]
    refused = signal_problem(GP, 'x', down, model) is not None
    assert refused == any(d > reach(model) for d in down), down


def detection(gp_variance: float) -> DetectionSummary:
    return DetectionSummary('cup', 0, -1, 320.0, 240.0, 20.0, 20.0, gp_variance, 0.01,
                            (0.5, 0.5))


def valid_set(model: ModelRange, out_of_reach: int) -> Thresholds:
    """Thresholds a user could configure (strictly decreasing, down above up) whose
    ``out_of_reach`` largest down thresholds are beyond the model's reach, the rest within."""
    limit = reach(model)
    down = [(4.0, 2.0, 1.5)[i] * limit if i < out_of_reach else (0.9, 0.6, 0.3)[i] * limit
            for i in range(3)]
    return Thresholds(up=tuple(d / 2 for d in down), down=tuple(down))


@pytest.mark.parametrize('model', MODELS, ids=MODEL_IDS)
@pytest.mark.parametrize('out_of_reach', [1, 2, 3])
def test_the_arbiter_holds_teleoperation_on_a_set_partly_out_of_reach(model, out_of_reach):
    # Only the largest thresholds can be the ones out of reach in a decreasing set: with one
    # out, teleoperation (level 1 -> 0 on down[0]) could never be handed back; with two,
    # guided neither. Frames well below every up threshold would otherwise climb.
    thresholds = valid_set(model, out_of_reach)
    arbiter = Arbiter(ArbiterConfig(uncertainty_signal='gp_variance',
                                    gp_variance_thresholds=thresholds, min_dwell_s=0.0), 0.0)
    quiet = thresholds.up[-1] / 10
    for k in range(1, 11):
        step = arbiter.observe(k * 0.1, [detection(quiet)], 2, model=model)
        assert step.state.level == Level.TELEOPERATION, (k, step.state.reason)
    assert step.state.perception_stale
    assert step.state.reason.startswith('refused: thresholds.gp_variance.down')
    assert arbiter.signal_problem is not None


@pytest.mark.parametrize('model', MODELS, ids=MODEL_IDS)
def test_the_arbiter_climbs_on_a_set_within_reach(model):
    # The contrast: the same frames with every threshold within reach (the largest exactly
    # at the limit) reach assistance.
    limit = reach(model)
    thresholds = Thresholds(up=(limit / 2, limit / 4, limit / 8),
                            down=(limit, limit / 2, limit / 4))
    arbiter = Arbiter(ArbiterConfig(uncertainty_signal='gp_variance',
                                    gp_variance_thresholds=thresholds, min_dwell_s=0.0), 0.0)
    for k in range(1, 11):
        step = arbiter.observe(k * 0.1, [detection(limit / 80)], 2, model=model)
    assert arbiter.signal_problem is None
    assert step.state.level == Level.ASSISTANCE, step.state.reason
