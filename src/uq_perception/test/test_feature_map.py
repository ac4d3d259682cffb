"""The norm-aware feature map of the NTK-GP kernel and its choice by the evidence."""

from __future__ import annotations

import numpy as np
import pytest

from uq_perception.ntk import (
    LastLayerNTKGP,
    NormFeatureMap,
    NTKGPConfig,
    select_feature_map,
)


def test_alpha_one_is_the_cosine_map_and_the_scale_is_the_typical_norm():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((200, 5)) * rng.uniform(0.5, 4.0, (200, 1))
    cosine = NormFeatureMap.fitted(x, alpha=1.0, scale=3.0)
    np.testing.assert_allclose(np.linalg.norm(cosine(x), axis=1), 3.0)
    raw = NormFeatureMap.fitted(x, alpha=0.0, scale=2.0)
    assert np.mean(np.linalg.norm(raw(x), axis=1)) == pytest.approx(2.0)
    # alpha > 1 turns small features into large ones, and stays finite at the origin.
    inverse = NormFeatureMap.fitted(x, alpha=2.0, scale=1.0)
    small, large = inverse(0.1 * x[:1]), inverse(10.0 * x[:1])
    assert np.linalg.norm(small) > np.linalg.norm(large)
    assert np.isfinite(inverse(np.zeros((1, 5)))).all()


def test_invalid_maps_are_refused():
    with pytest.raises(ValueError, match='scale and reference must be > 0'):
        NormFeatureMap(1.0, 0.0)
    with pytest.raises(ValueError, match='alpha must be finite'):
        NormFeatureMap(float('nan'))
    with pytest.raises(ValueError, match='non-finite'):
        NormFeatureMap.fitted(np.full((3, 2), np.nan), 1.0, 1.0)


def test_selection_takes_the_largest_evidence_on_the_training_features_only():
    rng = np.random.default_rng(1)
    centres = rng.standard_normal((3, 6)) * 4.0
    y = rng.integers(3, size=300)
    # Class clusters at very different norms: a norm-aware kernel explains them better.
    x = centres[y] * rng.uniform(0.2, 5.0, (300, 1)) + 0.1 * rng.standard_normal((300, 6))
    seen = []

    def evidence(mapped, m):
        seen.append(mapped.shape)
        gp = LastLayerNTKGP(np.eye(3, 6), np.zeros(3), NTKGPConfig(num_experts=m)).fit(mapped, y)
        return sum(gp.log_marginal_likelihood(e) for e in range(gp.num_experts))

    fmap, experts, candidates = select_feature_map(x, evidence, (0.0, 1.0), (1.0, 3.0), (1, 2))
    assert len(candidates) == 8 and all(shape == x.shape for shape in seen)
    best = max(candidates, key=lambda c: c.log_evidence)
    assert (fmap.alpha, fmap.scale, experts) == (best.alpha, best.scale, best.num_experts)
    with pytest.raises(ValueError, match='grid is empty'):
        select_feature_map(x, evidence, (), (1.0,), (1,))
