"""The GP's feature transform: per-block centring and L2 normalisation, stored in the
artefact and applied by the engine to every feature it is given."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from uq_perception.ntk import LastLayerNTKGP, NTKGPConfig
from uq_perception.ntk.calibrated_score import ScoreReference
from uq_perception.ntk.feature_transform import FeatureBlock, FeatureTransform, single_block
from uq_perception.ntk.persistence import read_state, write_state
from uq_perception.teaching import teach
from uq_perception.training.metrics import auroc
from uq_perception.training.train import check_variance_spread

# Two scales stacked as the ONNX adapter lays them out: [phi_1 (3); 1; phi_2 (2); 1].
STACKED = (FeatureBlock(0, 3, 3), FeatureBlock(4, 6, 6))


def stacked_rows(rng: np.random.Generator, n: int, block: int) -> np.ndarray:
    rows = np.zeros((n, 7))
    if block == 0:
        rows[:, 0:3] = rng.normal([2.0, 1.0, 0.0], 0.3, (n, 3))
        rows[:, 3] = 1.0
    else:
        rows[:, 4:6] = rng.normal([5.0, -5.0], 1.0, (n, 2))
        rows[:, 6] = 1.0
    return rows


def test_each_block_is_centred_on_its_own_mean_and_put_on_its_own_sphere():
    rng = np.random.default_rng(0)
    x = np.concatenate([stacked_rows(rng, 50, 0), stacked_rows(rng, 30, 1)])
    transform = FeatureTransform.fitted(x, STACKED)
    assert transform.counts == (50, 30)
    np.testing.assert_allclose(transform.means[0], x[:50, 0:3].mean(0))
    np.testing.assert_allclose(transform.means[1], x[50:, 4:6].mean(0))
    y = transform(x)
    np.testing.assert_allclose(np.linalg.norm(y[:50, 0:3], axis=1), math.sqrt(3))
    np.testing.assert_allclose(np.linalg.norm(y[50:, 4:6], axis=1), math.sqrt(2))
    # Another block's features stay zero, and every bias slot keeps its 1.
    assert (y[:50, 4:6] == 0).all() and (y[50:, 0:3] == 0).all()
    np.testing.assert_array_equal(y[:, [3, 6]], x[:, [3, 6]])
    # Only normalising: each block on its sphere without moving its centre.
    plain = FeatureTransform.fitted(x, STACKED, centre=False)(x)
    np.testing.assert_allclose(plain[:50, 0:3], x[:50, 0:3] * math.sqrt(3)
                               / np.linalg.norm(x[:50, 0:3], axis=1, keepdims=True))


def test_a_row_at_its_blocks_mean_stays_at_the_origin_and_the_input_is_not_modified():
    x = np.array([[1.0, 2.0], [3.0, 4.0]])
    transform = FeatureTransform.fitted(x, single_block(2))
    before = x.copy()
    y = transform(np.array([[2.0, 3.0], [4.0, 3.0]]))
    np.testing.assert_allclose(y, [[0.0, 0.0], [math.sqrt(2), 0.0]])
    np.testing.assert_array_equal(x, before)


@pytest.mark.parametrize('blocks, message', [
    ((FeatureBlock(0, 8),), 'not inside'),
    ((FeatureBlock(0, 3, 3), FeatureBlock(2, 6, 6)), 'overlaps'),
    ((FeatureBlock(0, 3), FeatureBlock(4, 6, 6)), 'every block needs its bias slot'),
    ((FeatureBlock(0, 3, 1),), 'outside every block'),
])
def test_bad_layouts_are_refused(blocks, message):
    with pytest.raises(ValueError, match=message):
        FeatureTransform.fitted(np.ones((4, 7)), blocks)


def test_a_scale_without_training_rows_is_only_normalised():
    rng = np.random.default_rng(1)
    transform = FeatureTransform.fitted(stacked_rows(rng, 10, 0), STACKED)
    assert transform.counts == (10, 0)
    assert (transform.means[1] == 0).all()
    later = transform(stacked_rows(rng, 4, 1))
    np.testing.assert_allclose(np.linalg.norm(later[:, 4:6], axis=1), math.sqrt(2))


def _small_norm_problem(seed: int = 0):
    """Known objects: three classes along orthogonal directions, at radius about 10.
    Unknown objects: the same kind of features at a seventh of the length, as a
    cross-entropy network gives what it has not seen: close to the training data's mean in
    the raw kernel's view. The head reads the class directions."""
    rng = np.random.default_rng(seed)
    d = 12
    directions = np.eye(d)[:3]

    def objects(labels: np.ndarray) -> np.ndarray:
        return 10.0 * directions[labels] + rng.normal(0, 2.0, (labels.size, d))

    labels = np.repeat(np.arange(3), 30)
    known, val = objects(labels), objects(np.repeat(np.arange(3), 20))
    unknown = 0.15 * objects(rng.integers(0, 3, 60))
    return directions, known, labels, val, unknown


def _separation(gp: LastLayerNTKGP, val: np.ndarray, unknown: np.ndarray) -> float:
    scores = np.r_[gp.gp_variance(val), gp.gp_variance(unknown)]
    return auroc(scores, np.r_[np.zeros(len(val), bool), np.ones(len(unknown), bool)])


def test_small_norm_unknowns_fool_the_raw_kernel_and_not_the_transformed_one():
    directions, known, labels, val, unknown = _small_norm_problem()
    raw = LastLayerNTKGP(directions, np.zeros(3), NTKGPConfig(num_experts=1)).fit(known, labels)
    assert _separation(raw, val, unknown) < 0.1
    gp = LastLayerNTKGP(directions, np.zeros(3), NTKGPConfig(num_experts=1))
    gp.feature_transform = FeatureTransform.fitted(known, single_block(known.shape[1]))
    gp.fit(known, labels)
    assert _separation(gp, val, unknown) > 0.95
    # The transform changes the kernel, not the mean: the logits are the raw features'.
    out = gp.predict(val[:5])
    np.testing.assert_allclose(out.logits, val[:5] @ directions.T)


def test_the_transform_round_trips_through_the_artefact(tmp_path):
    directions, known, labels, val, unknown = _small_norm_problem(1)
    gp = LastLayerNTKGP(directions, np.zeros(3), NTKGPConfig(num_experts=2), model_id='m')
    gp.feature_transform = FeatureTransform.fitted(known, single_block(known.shape[1]))
    gp.fit(known, labels)
    gp.calibrate_ood(val)
    gp.calibrate_score(val, 'val')
    path = tmp_path / 'gp.npz'
    gp.save(path)
    loaded = LastLayerNTKGP.load(path, model_id='m')
    assert loaded.feature_transform is not None and loaded.feature_transform.centred
    queries = np.concatenate([val, unknown])
    np.testing.assert_allclose(loaded.gp_variance(queries), gp.gp_variance(queries),
                               rtol=1e-12)
    np.testing.assert_array_equal(loaded.predict(queries).calibrated_score,
                                  gp.predict(queries).calibrated_score)
    # A state without a transform still loads as it always did.
    plain = LastLayerNTKGP(directions, np.zeros(3), NTKGPConfig(num_experts=1)).fit(known,
                                                                                  labels)
    plain.save(tmp_path / 'plain.npz')
    assert LastLayerNTKGP.load(tmp_path / 'plain.npz').feature_transform is None
    # Readers that predate the transform refuse a transformed file (a new version) instead of
    # querying it without its transform, and still read the others.
    assert read_state(path)[0]['version'] == 3
    assert read_state(tmp_path / 'plain.npz')[0]['version'] == 2


def test_a_corrupt_transform_in_the_artefact_is_refused(tmp_path):
    directions, known, labels, _, _ = _small_norm_problem(2)
    gp = LastLayerNTKGP(directions, np.zeros(3), NTKGPConfig(num_experts=1))
    gp.feature_transform = FeatureTransform.fitted(known, single_block(known.shape[1]))
    gp.fit(known, labels)
    path = tmp_path / 'gp.npz'
    gp.save(path)
    meta, arrays = read_state(path)
    for change, message in (
            (lambda m, a: m['feature_transform'].update(kind='cube'), 'kind centre_l2 or l2'),
            (lambda m, a: m['feature_transform'].update(blocks=[[0, 99, None]]), 'not inside'),
            (lambda m, a: a.update(feature_transform_means=np.full(12, np.nan)), 'finite'),
            (lambda m, a: a.pop('feature_transform_means'), 'without its means')):
        # Written with fresh checksums: the field checks, not the digest, must refuse it.
        m, a = json.loads(json.dumps(meta)), dict(arrays)
        change(m, a)
        bad = tmp_path / 'bad.npz'
        write_state(bad, m, a)
        with pytest.raises(ValueError, match=message):
            LastLayerNTKGP.load(bad)


def test_a_class_taught_online_under_a_transform_is_learnt_where_it_was_taught():
    directions, known, labels, val, unknown = _small_norm_problem(3)
    gp = LastLayerNTKGP(directions, np.zeros(3), NTKGPConfig(num_experts=1), model_id='m')
    gp.feature_transform = FeatureTransform.fitted(known, single_block(known.shape[1]))
    gp.fit(known, labels)
    taught = unknown[:1]
    before = gp.gp_variance(taught)[0]
    # As the node teaches an answer (one label, the product's default trust).
    result = teach(gp, 'req-1', 'new', taught[0], 'm')
    assert result.accepted, result.message
    assert gp.class_names[-1] == 'new'
    assert gp.predict(taught).probabilities[0].argmax() == 3
    assert gp.gp_variance(taught)[0] < before
    # Known objects keep their classes: the new logit's prior mean sits below theirs.
    assert (gp.predict(val).probabilities.argmax(axis=1) == np.repeat(np.arange(3), 20)).all()


def test_a_degenerate_fit_is_refused_and_its_reference_is_reported():
    directions, known, labels, val, _ = _small_norm_problem(4)
    gp = LastLayerNTKGP(directions, np.zeros(3), NTKGPConfig(num_experts=1)).fit(known, labels)
    check_variance_spread(gp.gp_variance(val), gp, len(labels))
    flat = np.full(20, 1.7e-11) + np.linspace(0, 1e-18, 20)
    with pytest.raises(ValueError, match=r'degenerate GP fit.*at least 13 are needed'):
        check_variance_spread(flat, gp, 13)
    assert ScoreReference.from_variances(flat, 'val', 'm').spread_problem() is not None
    assert ScoreReference.from_variances(gp.gp_variance(val), 'val', 'm').spread_problem() \
        is None
