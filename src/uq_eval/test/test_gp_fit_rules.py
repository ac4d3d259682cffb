"""Rules of ``uq gp fit`` and ``uq gp diagnose`` on constructed features (no detector run):
which feature transform ``auto`` falls back to with few unknown objects, on both sides of
its norm-spread rule and at the count that ends the fallback; and the feature-norm score of
the diagnosis against an AUROC computed by hand."""

from __future__ import annotations

import numpy as np
import pytest

from uq_eval.gp.diagnose import diagnose
from uq_eval.gp.fitting import (
    MIN_UNKNOWN_FOR_CHOICE,
    NORMALISED_NORM_SPREAD,
    ObjectFeatures,
    choose_feature_transform,
)
from uq_perception.detectors.contract import Detections, DetectorContract, LinearHead
from uq_perception.ntk import LastLayerNTKGP, NTKGPConfig
from uq_perception.ntk.feature_transform import FeatureBlock, FeatureTransform

D = 6
HEAD = LinearHead(np.array([[1.0, -1.0, 0.5, 0.0, 0.2, -0.3],
                            [-1.0, 1.0, -0.5, 0.3, 0.0, 0.2]], np.float32),
                  np.zeros(2, np.float32))


def features_with_norm_spread(spread: float, rows: int = 40, seed: int = 0) -> np.ndarray:
    """``rows`` features in random directions whose norms have exactly this coefficient of
    variation: half at ``r (1 + spread)``, half at ``r (1 - spread)`` (mean r, population
    standard deviation r * spread)."""
    rng = np.random.default_rng(seed)
    directions = rng.normal(size=(rows, D))
    directions /= np.linalg.norm(directions, axis=1, keepdims=True)
    radius = 3.0 * np.where(np.arange(rows) % 2 == 0, 1.0 + spread, 1.0 - spread)
    return directions * radius[:, None]


class Recorder:
    """``fit_with`` of :func:`choose_feature_transform`: fits a real one-expert GP with the
    transform it is asked for, and records the kinds asked."""

    def __init__(self, train: np.ndarray) -> None:
        self.train = train
        self.labels = (np.arange(len(train)) % 2).astype(np.int64)
        self.kinds: list[str] = []

    def __call__(self, kind: str) -> tuple[LastLayerNTKGP, list]:
        self.kinds.append(kind)
        gp = LastLayerNTKGP(HEAD.weight, HEAD.bias, NTKGPConfig(num_experts=1))
        if kind != 'none':
            gp.feature_transform = FeatureTransform.fitted(
                self.train, [FeatureBlock(0, D)], centre=kind == 'centre_l2')
        return gp.fit(self.train, self.labels), []


# Spreads on each side of the rule: a network that normalised its features itself (the
# shipped CenterNet, spread 0 up to round-off) keeps them as they are; raw features (a
# YOLO's, whose norms vary widely) are centred and normalised.
@pytest.mark.parametrize(('spread', 'kind'), [
    (0.0, 'none'), (1e-6, 'none'), (NORMALISED_NORM_SPREAD * 0.98, 'none'),
    (NORMALISED_NORM_SPREAD * 1.02, 'centre_l2'), (0.1, 'centre_l2'), (0.6, 'centre_l2')])
@pytest.mark.parametrize('unknown', [0, 1, MIN_UNKNOWN_FOR_CHOICE - 1])
def test_with_few_unknown_objects_auto_falls_back_to_the_norm_spread_rule(spread, kind,
                                                                         unknown):
    train = features_with_norm_spread(spread)
    fit_with = Recorder(train)
    record = choose_feature_transform('auto', train, train[:8],
                                      features_with_norm_spread(0.3, unknown, seed=1),
                                      fit_with, log=lambda _: None)
    assert record['train_norm_spread'] == pytest.approx(spread, abs=1e-5)
    assert record['kind'] == kind and fit_with.kinds == [kind]
    assert record['rule'].startswith(f'fewer than {MIN_UNKNOWN_FOR_CHOICE} unknown objects')
    assert ('already normalised by the network' in record['rule']) == (kind == 'none')
    gp, _ = record['fitted']
    assert (gp.feature_transform is None) == (kind == 'none')


@pytest.mark.parametrize('spread', [0.0, 0.4])
def test_from_the_least_count_of_unknown_objects_auto_compares_every_transform(spread):
    # At MIN_UNKNOWN_FOR_CHOICE the fallback ends: all three transforms are fitted and the
    # one whose GP variance ranks the unknown objects best is kept, whatever the spread.
    train = features_with_norm_spread(spread)
    fit_with = Recorder(train)
    unknown = features_with_norm_spread(0.3, MIN_UNKNOWN_FOR_CHOICE, seed=1) * 4.0
    record = choose_feature_transform('auto', train, train[:8], unknown, fit_with,
                                      log=lambda _: None)
    assert sorted(fit_with.kinds) == ['centre_l2', 'l2', 'none']
    assert record['rule'].startswith(f'best AUROC on {MIN_UNKNOWN_FOR_CHOICE} unknown')
    assert record['auroc_by_kind'][record['kind']] == max(record['auroc_by_kind'].values())


@pytest.mark.parametrize('named', ['none', 'l2', 'centre_l2'])
@pytest.mark.parametrize('spread', [0.0, 0.4])
def test_a_named_transform_is_used_as_named(named, spread):
    train = features_with_norm_spread(spread)
    fit_with = Recorder(train)
    record = choose_feature_transform(named, train, train[:8],
                                      features_with_norm_spread(0.3, 20, seed=1), fit_with,
                                      log=lambda _: None)
    assert (record['setting'], record['kind'], record['rule']) == (named, named, 'named')
    assert fit_with.kinds == [named]


# -- uq gp diagnose: the feature-norm score ---------------------------------------------------

class LinearDetector(DetectorContract):
    """A detector reduced to what the diagnosis reads of it: its linear head and the blocks
    of its features (it never sees an image here)."""

    def __init__(self, head: LinearHead, blocks: tuple) -> None:
        self._head, self._blocks = head, blocks

    model_id = 'linear-test'
    class_names = ['red', 'green']
    input_size = (32, 32)
    backend_name = 'numpy'
    device_name = 'cpu'

    def head(self) -> LinearHead:
        return self._head

    def feature_blocks(self) -> tuple:
        return self._blocks

    def infer(self, image_rgb: np.ndarray, score_threshold: float,
              max_detections: int) -> Detections:
        raise AssertionError('the diagnosis is given collected objects; it runs no image')


def hand_auroc(known_scores: list[float], unknown_scores: list[float]) -> float:
    """P(an unknown object scores above a known one), ties counted half: every pair."""
    pairs = [(u > k) + 0.5 * (u == k) for u in unknown_scores for k in known_scores]
    return sum(pairs) / len(pairs)


def objects(norms_known: list[float], norms_unknown: list[float], width: int, seed: int,
            place=lambda rows, width: rows) -> ObjectFeatures:
    rng = np.random.default_rng(seed)
    norms = np.array(norms_known + norms_unknown)
    directions = np.abs(rng.normal(size=(len(norms), width))) + 0.1
    directions /= np.linalg.norm(directions, axis=1, keepdims=True)
    x = place(directions * norms[:, None], width)
    labels = np.r_[np.arange(len(norms_known)) % 2, np.full(len(norms_unknown), -1)]
    return ObjectFeatures(x.astype(np.float32), np.zeros((len(norms), 2), np.float32),
                          labels.astype(np.int64))


# Unknown objects with smaller features than known ones (what a network trained with
# cross-entropy does), overlapping, so the AUROC is neither 0.5 nor 1.
KNOWN = [2.0, 2.4, 2.6, 3.0, 3.3, 1.2, 2.8, 3.6]
UNKNOWN = [0.5, 0.9, 1.3, 2.5, 1.0, 0.7]


def test_the_negative_norm_auroc_is_the_hand_computed_one_on_one_block():
    detector = LinearDetector(HEAD, ((0, D, None),))
    train = objects(KNOWN, [], D, seed=0)
    val = objects(KNOWN, UNKNOWN, D, seed=1)
    result = diagnose(detector, train, val)
    expected = hand_auroc([-n for n in KNOWN], [-n for n in UNKNOWN])
    assert 0.8 < expected < 1.0  # small norms mark the unknowns, imperfectly
    assert result['auroc']['neg_block_norm'] == pytest.approx(round(expected, 4), abs=1e-9)
    assert result['block_norm_median']['unknown'] < result['block_norm_median']['known']
    (block,) = result['per_block']
    assert block['auroc']['neg_block_norm'] == result['auroc']['neg_block_norm']


def test_the_negative_norm_auroc_is_per_block_on_a_multi_scale_layout():
    # Two blocks of 3 features with bias slots 6 and 7 (the ONNX adapter's multi-scale
    # layout): a row's norm is that of its own block; each block's AUROC is computed on its
    # rows alone.
    head = LinearHead(np.tile(HEAD.weight[:, :4], 2), np.zeros(2, np.float32))

    def in_block(which):
        def place(rows, width):
            out = np.zeros((len(rows), 8))
            for i, row in enumerate(rows):
                b = which[i]
                out[i, 3 * b:3 * b + 3] = row
                out[i, 6 + b] = 1.0
            return out
        return place

    known_a, unknown_a = KNOWN[:4], UNKNOWN[:3]
    known_b, unknown_b = KNOWN[4:], UNKNOWN[3:]
    known, unknown = known_a + known_b, unknown_a + unknown_b
    which = [0] * 4 + [1] * 4 + [0] * 3 + [1] * 3
    val = objects(known, unknown, 3, seed=2, place=lambda r, w: in_block(which)(r, w))
    train = objects(known, [], 3, seed=3, place=lambda r, w: in_block(which[:8])(r, w))
    detector = LinearDetector(head, ((0, 3, 6), (3, 6, 7)))
    result = diagnose(detector, train, val)
    expected_all = hand_auroc([-n for n in known], [-n for n in unknown])
    assert result['auroc']['neg_block_norm'] == pytest.approx(round(expected_all, 4),
                                                              abs=1e-9)
    for row, (k, u) in zip(result['per_block'], ((known_a, unknown_a), (known_b, unknown_b)),
                           strict=True):
        assert (row['known'], row['unknown']) == (len(k), len(u))
        assert row['auroc']['neg_block_norm'] == pytest.approx(
            round(hand_auroc([-n for n in k], [-n for n in u]), 4), abs=1e-9)
