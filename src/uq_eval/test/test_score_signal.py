"""What the calibrated score ranks: the GP's whole predictive, chosen by rule."""

from __future__ import annotations

import numpy as np

from uq_eval.gp.fitting import MIN_UNKNOWN_FOR_CHOICE, ObjectFeatures, choose_score_signal
from uq_perception.ntk import LastLayerNTKGP, NTKGPConfig


def _between_classes(seed: int = 0):
    """Two classes on either side of a line densely covered by training objects; unknown
    objects sit on that line, between them. Their features are as familiar as any known
    object's, so the GP variance cannot tell them; the logits, which tie there, can."""
    rng = np.random.default_rng(seed)

    def objects(n: int, low: float, high: float) -> np.ndarray:
        return np.c_[rng.uniform(low, high, n), rng.normal(0, 0.3, (n, 2))]

    train = np.r_[objects(200, -3, -0.2), objects(200, 0.2, 3), objects(40, -0.2, 0.2)]
    labels = (train[:, 0] > 0).astype(np.int64)
    val = np.r_[objects(60, -3, -1), objects(60, 1, 3)]
    unknown = objects(40, -0.15, 0.15)
    weight = np.array([[-4.0, 0.0, 0.0], [4.0, 0.0, 0.0]])
    return weight, train, labels, val, unknown


def _known_and_unknown(gp, weight, val, unknown):
    logits = unknown @ weight.T
    return ObjectFeatures(unknown, logits, np.full(len(unknown), -1)), val @ weight.T


def test_the_predictive_score_finds_what_the_logits_carry_and_the_variance_does_not():
    weight, train, labels, val, unknown = _between_classes()
    gp = LastLayerNTKGP(weight, np.zeros(2), NTKGPConfig(num_experts=1), model_id='m')
    gp.fit(train, labels)
    gp.calibrate_score(val, 'val')
    objects, val_logits = _known_and_unknown(gp, weight, val, unknown)
    choice = choose_score_signal(gp, val, val_logits, objects, 'val', 'softmax',
                                 log=lambda _: None)
    aurocs = choice['auroc_by_signal']
    assert aurocs['gp_variance'] < 0.75
    assert choice['signal'] in ('predictive_entropy', 'predictive_msp')
    assert aurocs[choice['signal']] > 0.95
    # The artefact's score now ranks that signal: unknown objects score above known ones.
    assert gp.score_reference.signal == choice['signal']
    known_scores = gp.predict(val, val_logits).calibrated_score
    unknown_scores = gp.predict(unknown, objects.logits).calibrated_score
    assert np.median(unknown_scores) > 0.95 > np.median(known_scores)


def test_without_enough_unknown_objects_the_score_ranks_the_gp_variance():
    weight, train, labels, val, unknown = _between_classes(1)
    gp = LastLayerNTKGP(weight, np.zeros(2), NTKGPConfig(num_experts=1), model_id='m')
    gp.fit(train, labels)
    gp.calibrate_score(val, 'val')
    few = unknown[:MIN_UNKNOWN_FOR_CHOICE - 1]
    objects, val_logits = _known_and_unknown(gp, weight, val, few)
    choice = choose_score_signal(gp, val, val_logits, objects, 'val', 'softmax',
                                 log=lambda _: None)
    assert choice['signal'] == 'gp_variance' and 'auroc_by_signal' not in choice
    assert gp.score_reference.signal == 'gp_variance'
