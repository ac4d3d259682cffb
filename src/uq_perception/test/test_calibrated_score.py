"""The calibrated score: the empirical distribution of known validation variances, stored
with its provenance in the GP state, carried in the messages, -1 where a state has none."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from std_msgs.msg import Header

from uq_perception.detectors.centernet import Detections
from uq_perception.messages import detection_array_message
from uq_perception.ntk import NO_CALIBRATED_SCORE, LastLayerNTKGP, NTKGPConfig, ScoreReference
from uq_perception.ntk.model import score_signal
from uq_perception.ntk.persistence import read_state, write_state
from uq_perception.perception import FrameResult
from uq_perception.teaching import teach

REPO = Path(__file__).resolve().parents[3]
SHIPPED_GP = REPO / 'models' / 'detector_gp.npz'
D, C = 6, 3


def _gp() -> tuple[LastLayerNTKGP, np.ndarray]:
    """A fitted GP and held-out features of its known classes."""
    rng = np.random.default_rng(0)
    centres = rng.standard_normal((C, D)) * 3.0
    y = rng.integers(C, size=400)
    x = centres[y] + rng.standard_normal((400, D)) * 0.3
    gp = LastLayerNTKGP(centres, -0.5 * (centres * centres).sum(1), class_names=['a', 'b', 'c'],
                        model_id='net-1').fit(x[:300], y[:300])
    return gp, x[300:]


# ------------------------------------------------------------------ the score itself

def test_the_score_is_the_fraction_of_reference_variances_below():
    variances = np.random.default_rng(1).lognormal(-9.0, 1.5, size=2000)
    reference = ScoreReference.from_variances(variances, 'val', 'm', levels=101)
    queries = np.quantile(variances, [0.01, 0.1, 0.5, 0.9, 0.95, 0.99])
    below = (variances[None, :] < queries[:, None]).mean(1)
    np.testing.assert_allclose(reference.score(queries), below, atol=0.005)
    assert reference.count == 2000 and reference.maximum == variances.max()
    # Beyond the reference: 0 below its smallest variance, 1 above its largest.
    np.testing.assert_array_equal(
        reference.score(np.array([0.0, variances.min() / 2, variances.max() * 2])),
        [0.0, 0.0, 1.0])
    grid = np.geomspace(variances.min() / 10, variances.max() * 10, 500)
    scores = reference.score(grid)
    assert (np.diff(scores) >= 0).all() and scores.min() == 0.0 and scores.max() == 1.0


def test_the_score_does_not_depend_on_the_units_of_the_variance():
    # What makes it the same for every model: rescaling every variance (another GP's
    # hyperparameters, another model's logits) changes no score.
    variances = np.random.default_rng(2).lognormal(-6.0, 1.0, size=500)
    queries = np.random.default_rng(3).lognormal(-6.0, 1.5, size=50)
    small = ScoreReference.from_variances(variances, 'val', 'm').score(queries)
    large = ScoreReference.from_variances(1e4 * variances, 'val', 'm').score(1e4 * queries)
    np.testing.assert_allclose(small, large, atol=1e-12)


def test_tied_reference_variances_score_the_fraction_strictly_below():
    reference = ScoreReference((1.0, 2.0, 2.0, 2.0, 4.0), 'val', 5, 'm')
    np.testing.assert_allclose(reference.score(np.array([2.0, 1.0, 4.0, math.sqrt(2.0),
                                                         math.sqrt(8.0)])),
                               [0.25, 0.0, 1.0, 0.125, 0.875])
    single = ScoreReference.from_variances(np.array([3.0]), 'val', 'm')
    np.testing.assert_array_equal(single.score(np.array([1.0, 3.0, 5.0])), [0.0, 0.0, 1.0])


@pytest.mark.parametrize(('meta', 'problem'), [
    ({'variance_quantiles': [1.0, math.nan]}, 'finite numbers >= 0'),
    ({'variance_quantiles': [1.0, -2.0]}, 'finite numbers >= 0'),
    ({'variance_quantiles': [2.0, 1.0]}, 'non-decreasing'),
    ({'variance_quantiles': [1.0]}, 'tuple of 2 to'),
    ({'variance_quantiles': [1.0, True]}, 'finite numbers >= 0'),
    ({'variance_quantiles': '1, 2'}, 'must be a list'),
    ({'variance_quantiles': [0.0] * 10002}, 'tuple of 2 to'),
    ({'count': 0}, 'count must be an integer >= 1'),
    ({'count': True}, 'count must be an integer >= 1'),
    ({'count': 3.0}, 'count must be an integer >= 1'),
    ({'split': ''}, 'split must name the data'),
    ({'split': 'v' * 201}, 'split must be a printable string'),
    ({'split': 'val\n'}, 'split must be a printable string'),
    ({'model_id': 7}, 'model_id must be a printable string'),
    ({'extra': 1}, 'exactly the fields'),
])
def test_malformed_references_are_refused_by_rule(meta, problem):
    good = {'variance_quantiles': [1e-5, 1e-4, 1e-3], 'split': 'val', 'count': 10,
            'model_id': 'm'}
    with pytest.raises(ValueError, match=problem):
        ScoreReference.from_meta({**good, **meta})
    with pytest.raises(ValueError, match='exactly the fields'):
        ScoreReference.from_meta({k: v for k, v in good.items() if k != 'count'})
    with pytest.raises(ValueError, match='JSON object'):
        ScoreReference.from_meta([1, 2])


@pytest.mark.parametrize('bad', [np.array([]), np.array([[1.0]]), np.array([1.0, math.inf]),
                                 np.array([-1.0, 1.0])])
def test_a_reference_needs_finite_non_negative_variances(bad):
    with pytest.raises(ValueError, match='variances must be'):
        ScoreReference.from_variances(bad, 'val', 'm')
    with pytest.raises(ValueError, match='levels must be an integer'):
        ScoreReference.from_variances(np.ones(3), 'val', 'm', levels=1)
    reference = ScoreReference.from_variances(np.ones(3), 'val', 'm')
    with pytest.raises(ValueError, match='variances must be finite'):
        reference.score(np.array([math.nan]))


# ------------------------------------------------------------------ in the GP state

def test_the_gp_scores_its_variances_and_persists_the_reference(tmp_path):
    gp, held_out = _gp()
    assert gp.predict(held_out[:3]).calibrated_score is None
    reference = gp.calibrate_score(held_out, 'val')
    assert (reference.split, reference.count, reference.model_id) == ('val', 100, 'net-1')
    out = gp.predict(np.concatenate([held_out, 50.0 * held_out[:5]]))
    np.testing.assert_allclose(out.calibrated_score, reference.score(out.gp_variance))
    assert 0.3 < np.median(out.calibrated_score[:100]) < 0.7
    np.testing.assert_array_equal(out.calibrated_score[100:], 1.0)
    gp.save(tmp_path / 'gp.npz')
    again = LastLayerNTKGP.load(tmp_path / 'gp.npz')
    assert again.score_reference == reference
    np.testing.assert_array_equal(again.predict(held_out).calibrated_score,
                                  gp.predict(held_out).calibrated_score)


def test_labels_lower_the_score_and_leave_the_reference_as_it_was(tmp_path):
    gp, held_out = _gp()
    reference = gp.calibrate_score(held_out, 'val')
    novel = np.full(D, 2.0)
    before = float(gp.predict(novel[None]).calibrated_score[0])
    # The detector's default label trust: one label decides 99 % of the posterior there.
    assert teach(gp, 'req-1', 'mug', novel, 'net-1', tmp_path / 'learnt.npz', 0.99).accepted
    after = float(gp.predict(novel[None]).calibrated_score[0])
    assert before == 1.0 and after < 0.5
    assert gp.score_reference == reference
    assert LastLayerNTKGP.load(tmp_path / 'learnt.npz').score_reference == reference


def test_a_new_fit_discards_the_reference():
    gp, held_out = _gp()
    gp.calibrate_score(held_out, 'val')
    gp.fit(held_out, np.argmax(held_out @ gp._weight.T + gp._bias, axis=1))
    assert gp.score_reference is None


def test_a_state_without_reference_loads_and_one_of_another_model_is_refused(tmp_path):
    gp, held_out = _gp()
    gp.save(tmp_path / 'plain.npz')
    assert LastLayerNTKGP.load(tmp_path / 'plain.npz').score_reference is None
    gp.calibrate_score(held_out, 'val')
    gp.save(tmp_path / 'gp.npz')
    meta, arrays = read_state(tmp_path / 'gp.npz')
    meta['score_reference']['model_id'] = 'net-2'
    write_state(tmp_path / 'other.npz', meta, arrays)
    with pytest.raises(ValueError, match="score_reference belongs to model 'net-2'"):
        LastLayerNTKGP.load(tmp_path / 'other.npz')
    meta['score_reference'] = {'variance_quantiles': [1.0, 0.5], 'split': 'val', 'count': 2,
                               'model_id': 'net-1'}
    write_state(tmp_path / 'bad.npz', meta, arrays)
    with pytest.raises(ValueError, match='corrupt NTK-GP state .*non-decreasing'):
        LastLayerNTKGP.load(tmp_path / 'bad.npz')


def test_the_shipped_gp_has_a_validation_reference_that_places_its_ood_threshold():
    gp = LastLayerNTKGP.load(SHIPPED_GP)
    reference = gp.score_reference
    assert reference is not None and reference.model_id == gp.model_id
    assert reference.split.startswith('val ') and reference.count >= 1000
    # The OOD threshold is the ood_quantile of the same validation objects' variances.
    assert gp.ood_threshold is not None
    score = float(reference.score(np.array([gp.ood_threshold]))[0])
    assert score == pytest.approx(gp.config.ood_quantile, abs=0.01)
    meta = json.loads(str(np.load(SHIPPED_GP)['meta']))
    assert meta['score_reference']['count'] == reference.count


# ------------------------------------------------------------------ in the messages

def _frame(gp: LastLayerNTKGP, features: np.ndarray) -> FrameResult:
    k = len(features)
    uncertainty = gp.predict(features)
    detections = Detections(np.tile(np.float32([50, 40, 20, 10]), (k, 1)),
                            np.ones(k, np.float32), features.astype(np.float32),
                            uncertainty.logits.astype(np.float32))
    reference = gp.score_reference
    return FrameResult(detections, uncertainty, np.arange(k), list(gp.class_names), 1.0, 1.0,
                       np.zeros((k, 4), np.float32),
                       None if reference is None else reference.maximum, gp.ood_threshold)


def test_messages_carry_the_score_and_the_model_range():
    gp, held_out = _gp()
    gp.calibrate_ood(held_out)
    reference = gp.calibrate_score(held_out, 'val')
    frame = _frame(gp, held_out[:4])
    out = detection_array_message(frame, Header(), 'pytorch-cpu', 'net-1')
    np.testing.assert_allclose([d.uncertainty.calibrated_score for d in out.detections],
                               frame.uncertainty.calibrated_score, rtol=1e-6)
    worst = int(np.argmax(frame.uncertainty.gp_variance))
    assert out.uncertainty.calibrated_score == out.detections[worst].uncertainty.calibrated_score
    assert out.reference_variance_max == pytest.approx(reference.maximum, rel=1e-6)
    assert out.ood_threshold == pytest.approx(gp.ood_threshold, rel=1e-6)
    empty = detection_array_message(_frame(gp, held_out[:0]), Header(), 'pytorch-cpu', 'net-1')
    assert empty.uncertainty.calibrated_score == 0.0


def test_messages_say_minus_one_where_the_model_has_no_reference():
    gp, held_out = _gp()
    for frame in (_frame(gp, held_out[:3]), _frame(gp, held_out[:0])):
        out = detection_array_message(frame, Header(), 'pytorch-cpu', 'net-1')
        assert out.reference_variance_max == NO_CALIBRATED_SCORE == -1.0
        assert out.ood_threshold == -1.0
        assert out.uncertainty.calibrated_score == -1.0
        assert all(d.uncertainty.calibrated_score == -1.0 for d in out.detections)


def test_a_reference_of_another_signal_keeps_the_models_variance_range():
    entropy = np.linspace(0.1, 1.0, 50)
    reference = ScoreReference.from_variances(entropy, 'val', 'm', signal='predictive_entropy',
                                              variance_maximum=0.004)
    assert reference.maximum == 0.004 and reference.variance_quantiles[-1] == 1.0
    back = ScoreReference.from_meta(reference.to_meta())
    assert back == reference
    # The default signal writes the same fields as before it existed.
    plain = ScoreReference.from_variances(entropy, 'val', 'm')
    assert set(plain.to_meta()) == {'variance_quantiles', 'split', 'count', 'model_id'}
    for meta, message in (
            ({**reference.to_meta(), 'signal': 'energy'}, 'signal must be one of'),
            ({**reference.to_meta(), 'variance_maximum': None}, 'exactly when'),
            ({**plain.to_meta(), 'variance_maximum': 1.0}, 'exactly when'),
            ({**reference.to_meta(), 'variance_maximum': -1.0}, 'finite number >= 0')):
        with pytest.raises(ValueError, match=message):
            ScoreReference.from_meta(meta)


def test_the_score_follows_the_signal_the_artefact_names(tmp_path):
    rng = np.random.default_rng(5)
    weight = rng.normal(size=(3, 4))
    features = rng.normal(size=(200, 4))
    gp = LastLayerNTKGP(weight, np.zeros(3), NTKGPConfig(num_experts=1), model_id='m')
    gp.fit(features, np.argmax(features @ weight.T, axis=1))
    val = rng.normal(size=(40, 4))
    gp.calibrate_score(val, 'val', signal='predictive_entropy')
    out = gp.predict(val)
    assert gp.score_reference.maximum == pytest.approx(out.gp_variance.max())
    # Ranks by entropy: the order of the scores is the order of the entropies.
    order = np.argsort(out.predictive_entropy)
    assert (np.diff(out.calibrated_score[order]) >= -1e-12).all()
    gp.save(tmp_path / 'gp.npz')
    loaded = LastLayerNTKGP.load(tmp_path / 'gp.npz')
    assert loaded.score_reference.signal == 'predictive_entropy'
    np.testing.assert_array_equal(loaded.predict(val).calibrated_score, out.calibrated_score)


def test_the_lower_quantile_confidence_by_hand():
    logits = np.array([[2.0, 0.0, -1.0], [0.5, 0.5, 0.5]])
    variance = np.array([0.25, 0.0])
    zeros = np.zeros(2)
    # Top logit lowered by 2 sigma: 2 - 2 * 0.5 = 1 in the first row, 0.5 in the second.
    sigmoid = score_signal('predictive_lcb_sigmoid', logits, variance, zeros, zeros, logits)
    np.testing.assert_allclose(sigmoid, [1 - 1 / (1 + math.exp(-1.0)),
                                         1 - 1 / (1 + math.exp(-0.5))])
    softmax = score_signal('predictive_lcb_softmax', logits, variance, zeros, zeros, logits)
    np.testing.assert_allclose(softmax, [1 - math.e / (math.e + 1 + math.exp(-1)), 1 - 1 / 3])
    # More GP variance, less confidence, whatever the logits.
    wider = score_signal('predictive_lcb_sigmoid', logits, variance + 1.0, zeros, zeros, logits)
    assert (wider > sigmoid).all()
    # Energy at the logits' lower quantile, through a sigmoid: logsumexp(f - 2 sigma) is
    # log(e + e^-1 + e^-2) in the first row, 0.5 + log 3 in the second.
    energy = score_signal('predictive_lcb_energy', logits, variance, zeros, zeros, logits)
    np.testing.assert_allclose(energy, [
        1 / (1 + math.exp(1) + math.exp(-1) + math.exp(-2)), 1 / (1 + 3 * math.exp(0.5))])
    assert score_signal('predictive_lcb_energy', logits[:0], variance[:0], zeros[:0],
                        zeros[:0], logits[:0]).shape == (0,)
    with pytest.raises(ValueError, match='unknown score signal'):
        score_signal('energy', logits, variance, zeros, zeros, logits)
