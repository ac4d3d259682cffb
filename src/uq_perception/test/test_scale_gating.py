"""Scale gating of the NTK-GP: one expert, noise, prior precision, OOD threshold and score
reference per scale of a multi-scale head, the documented fallbacks of a scale with too few
objects, and the artefact that records it (older artefacts keep their behaviour)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from uq_perception.ntk import Gating, LastLayerNTKGP, NTKGPConfig
from uq_perception.ntk.feature_transform import FeatureBlock
from uq_perception.ntk.scale_gating import MIN_SCALE_VALIDATION, ScaleGating

# Three scales of widths 4, 5 and 6, each followed by its bias slot (the ONNX adapter's
# layout of a multi-scale YOLO head).
BLOCKS = (FeatureBlock(0, 4, 4), FeatureBlock(5, 10, 10), FeatureBlock(11, 17, 17))
DIM = 18
CLASSES = 3


def _rows(rng: np.random.Generator, scale: int, count: int, magnitude: float) -> np.ndarray:
    block = BLOCKS[scale]
    x = np.zeros((count, DIM))
    x[:, block.start:block.stop] = magnitude * rng.standard_normal((count, block.width))
    x[:, block.bias_index] = 1.0
    return x


def _head(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    return rng.standard_normal((CLASSES, DIM)), np.zeros(CLASSES)


def _data(seed: int, counts: tuple[int, int, int]) -> np.ndarray:
    """Rows of each scale; the scales' features differ in magnitude."""
    rng = np.random.default_rng(seed)
    return np.concatenate([_rows(rng, s, n, m) for s, (n, m) in
                           enumerate(zip(counts, (0.1, 3.0, 1.0), strict=True))])


def _fitted(weight: np.ndarray, bias: np.ndarray, train: np.ndarray,
            val: np.ndarray) -> LastLayerNTKGP:
    gp = LastLayerNTKGP(weight, bias, NTKGPConfig(num_experts=3, gating=Gating.SCALE,
                                                  shared_noise=False), model_id='toy')
    gp.scale_gating = ScaleGating(BLOCKS)
    labels = np.argmax(train @ weight.T + bias, axis=1)
    gp.fit(train, labels)
    gp.calibrate_ood(val)
    gp.calibrate_score(val, 'val')
    return gp


@pytest.fixture(scope='module')
def case():
    weight, bias = _head(np.random.default_rng(0))
    # Scale 2 has 3 training objects (fewer than its width + 1 = 7) and 5 validation
    # objects (fewer than MIN_SCALE_VALIDATION): it takes the pooled values.
    train, val = _data(1, (600, 40, 3)), _data(2, (200, 200, 5))
    return weight, bias, train, val, _fitted(weight, bias, train, val)


def test_each_scale_is_an_expert_with_its_own_noise_and_prior(case):
    weight, bias, train, val, gp = case
    assert list(gp.predict(val).expert_id) == [0] * 200 + [1] * 200 + [2] * 5
    assert gp.sigma2[0] != pytest.approx(gp.sigma2[1], rel=1e-3)
    assert gp.delta[0] != pytest.approx(gp.delta[1], rel=1e-3)
    # A scale with fewer training objects than its width + 1 takes the values of the pooled
    # data of every scale: those of one GP over all rows.
    pooled = LastLayerNTKGP(weight, bias, NTKGPConfig(shared_noise=False)).fit(
        train, np.argmax(train @ weight.T + bias, axis=1))
    assert gp.sigma2[2] == pytest.approx(pooled.sigma2[0], rel=1e-6)
    assert gp.delta[2] == pytest.approx(pooled.delta[0], rel=1e-6)


def test_the_calibrated_score_means_the_same_at_every_scale(case):
    weight, bias, train, val, gp = case
    scales = gp.scale_gating
    assert scales.validation_counts == (200, 200, 5)
    assert scales.ood_thresholds[2] is None and scales.references[2] is None
    assert all(t is not None for t in scales.ood_thresholds[:2])
    fresh = _data(3, (400, 400, 0))
    out = gp.predict(fresh)
    for s in (0, 1):
        rows = out.expert_id == s
        # Known objects of each scale: about 5 % flagged, median score about 0.5.
        assert 0.02 < out.out_of_distribution[rows].mean() < 0.09
        assert 0.4 < np.median(out.calibrated_score[rows]) < 0.6
    # One threshold and one reference for all scales would rank every object of the scale
    # with the smaller variances below every object of the other.
    plain = LastLayerNTKGP(weight, bias, NTKGPConfig(), model_id='toy').fit(
        train, np.argmax(train @ weight.T + bias, axis=1))
    plain.calibrate_score(val, 'val')
    pooled_score = plain.predict(fresh).calibrated_score
    medians = [np.median(pooled_score[out.expert_id == s]) for s in (0, 1)]
    assert abs(medians[0] - medians[1]) > 0.3


def test_a_scale_with_few_validation_objects_uses_the_pooled_threshold_and_reference(case):
    _, _, _, val, gp = case
    rows = _data(4, (0, 0, 50))
    out = gp.predict(rows)
    np.testing.assert_array_equal(out.out_of_distribution, out.gp_variance > gp.ood_threshold)
    np.testing.assert_allclose(out.calibrated_score,
                               gp.score_reference.score(out.gp_variance))
    assert MIN_SCALE_VALIDATION > 5


def test_the_artefact_records_scale_gating_and_older_artefacts_keep_their_behaviour(
        case, tmp_path):
    weight, bias, train, val, gp = case
    gp.save(tmp_path / 'scales.npz')
    loaded = LastLayerNTKGP.load(tmp_path / 'scales.npz')
    with np.load(tmp_path / 'scales.npz') as archive:
        assert json.loads(str(archive['meta']))['version'] == 4
    fresh = _data(5, (30, 30, 30))
    a, b = gp.predict(fresh), loaded.predict(fresh)
    np.testing.assert_allclose(b.gp_variance, a.gp_variance, rtol=1e-12)
    np.testing.assert_array_equal(b.calibrated_score, a.calibrated_score)
    np.testing.assert_array_equal(b.out_of_distribution, a.out_of_distribution)
    assert loaded.scale_gating == gp.scale_gating
    # Without scale gating the artefact is written as before (version 2) and has no field.
    plain = LastLayerNTKGP(weight, bias, NTKGPConfig(), model_id='toy').fit(train)
    plain.calibrate_ood(val)
    plain.save(tmp_path / 'plain.npz')
    with np.load(tmp_path / 'plain.npz') as archive:
        meta = json.loads(str(archive['meta']))
    assert meta['version'] == 2 and 'scale_gating' not in meta
    assert LastLayerNTKGP.load(tmp_path / 'plain.npz').scale_gating is None


def test_rows_outside_the_layout_and_missing_scales_are_refused(case):
    weight, bias, train, _, gp = case
    no_scale = np.zeros((1, DIM))
    two_scales = _data(6, (1, 0, 0))
    two_scales[0, BLOCKS[1].bias_index] = 1.0
    for row in (no_scale, two_scales):
        with pytest.raises(ValueError, match='sets .* of the scale bias slots'):
            gp.predict(row)
    unset = LastLayerNTKGP(weight, bias, NTKGPConfig(num_experts=3, gating=Gating.SCALE))
    with pytest.raises(ValueError, match='set scale_gating before fit'):
        unset.fit(train)
    wrong = LastLayerNTKGP(weight, bias, NTKGPConfig(num_experts=2, gating=Gating.SCALE))
    wrong.scale_gating = ScaleGating(BLOCKS)
    with pytest.raises(ValueError, match='3 scales .* 2 experts'):
        wrong.fit(train)
    with pytest.raises(ValueError, match='at least 2 scales'):
        ScaleGating(BLOCKS[:1])
    with pytest.raises(ValueError, match='in-graph GP query does not gate by scale'):
        gp.gp_tensors()
