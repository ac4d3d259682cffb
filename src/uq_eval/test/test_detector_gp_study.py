"""`uq eval detector-gp`: GP variants on the detector's features, scored on unknown objects."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from uq_eval.detector.gp_study import (
    TWO_LAYER_WEIGHTS,
    UnknownSet,
    known_tail,
    markdown_table,
    on_sphere,
    run_study,
    two_layer,
    unknown_set,
)
from uq_perception.detectors.centernet import CenterNetDetector, load_detector
from uq_perception.training.train import object_features

WORKSPACE = Path(__file__).resolve().parents[3]
MODELS = WORKSPACE / 'models'
CLASSES = ['box', 'sphere', 'cylinder', 'capsule', 'ellipsoid', 'mug']


def _embedding_of(model: CenterNetDetector, mlp_input: np.ndarray) -> tuple[np.ndarray,
                                                                               np.ndarray]:
    with torch.no_grad():
        hidden = model.embedding_mlp[1](model.embedding_mlp[0](torch.from_numpy(mlp_input)))
        phi = F.normalize(model.embedding_mlp[2](hidden), dim=-1) * math.sqrt(
            model.embedding_dim)
    return hidden.numpy(), phi.numpy()


@pytest.mark.skipif(not (MODELS / 'detector.pt').is_file(),
                    reason='models/detector.pt (the shipped detector) is not in this checkout')
def test_recorded_layers_belong_to_the_same_detections_as_phi(tmp_path):
    from uq_perception.training.detector_data import load_split
    from uq_sim.dataset import generate_dataset

    generate_dataset(tmp_path, n=20, seed=0, splits=['val', 'test_unknown'], progress=False)
    model = load_detector(MODELS / 'detector.pt', fold_batchnorm=False)
    val = load_split(tmp_path / 'val', model.input_size, model.class_names)
    features, labels = object_features(model, val, with_layers=True)
    plain, plain_labels = object_features(model, val)
    assert len(labels) > 0 and np.array_equal(labels, plain_labels)
    np.testing.assert_array_equal(features['phi'], plain['phi'])
    # The MLP input and hidden units recorded for each object are the ones its phi came
    # from: a mix-up between a ground-truth box and a detection would break this.
    hidden, phi = _embedding_of(model, features['mlp_input'])
    np.testing.assert_allclose(features['hidden'], hidden, atol=1e-4)
    np.testing.assert_allclose(features['phi'], phi, atol=1e-4)

    scored = unknown_set(model, load_split(tmp_path / 'test_unknown', model.input_size,
                                           model.class_names), progress=False)
    assert scored.unknown.any() and scored.features['phi'].shape[0] == scored.unknown.size
    hidden, phi = _embedding_of(model, scored.features['mlp_input'])
    np.testing.assert_allclose(scored.features['phi'], phi, atol=1e-4)


def _clustered(rng: np.random.Generator, centres: np.ndarray, labels: np.ndarray,
               spread: float) -> np.ndarray:
    return on_sphere(centres[labels] + spread * rng.standard_normal((len(labels),
                                                                     centres.shape[1])))


def test_every_variant_is_scored_and_an_outlying_unknown_set_is_separated():
    rng = np.random.default_rng(0)
    model = CenterNetDetector(CLASSES)
    # Known classes along six directions of the first 8 dimensions; unknown objects along
    # the other dimensions, where no training object lies.
    centres = np.zeros((6, 64))
    centres[np.arange(6), np.arange(6)] = 1.0
    train_labels = rng.integers(0, 6, 600)

    def features(labels: np.ndarray, unknown: np.ndarray | None = None) -> dict:
        phi = _clustered(rng, centres, labels, 0.05)
        if unknown is not None:
            phi[unknown] = on_sphere(rng.standard_normal((int(unknown.sum()), 64))
                                     * np.r_[np.zeros(8), np.ones(56)])
        return {'phi': phi.astype(np.float32),
                'hidden': rng.standard_normal((len(labels), 128)).astype(np.float32),
                'mlp_input': rng.standard_normal((len(labels), 992)).astype(np.float32)}

    unknown = np.arange(200) % 4 == 0
    classes = np.where(unknown, -1, rng.integers(0, 6, 200))
    test = UnknownSet('outlying', features(np.maximum(classes, 0), unknown), classes,
                      np.maximum(classes, 0))
    train = features(train_labels)
    lines: list[str] = []
    results = run_study(model, (train, train_labels),
                        (features(train_labels[:100]), train_labels[:100]), [test],
                        log=lines.append)
    assert [r.group for r in results] == ['kernel'] * 4 + ['gating'] * 4 + \
        ['prior precision'] * 3 + ['fit data']
    assert len(lines) == len(results)
    by_variant = {r.variant: r for r in results}
    assert by_variant['phi (shipped)'].auroc['outlying'] > 0.99
    # The hidden units and MLP input here are noise: they cannot tell the sets apart.
    assert abs(by_variant['hidden units'].auroc['outlying'] - 0.5) < 0.15
    assert all(r.fit_objects == 600 for r in results[:-1]) and results[-1].fit_objects == 100

    from uq_perception.ntk import LastLayerNTKGP

    evidence = {g: LastLayerNTKGP(np.zeros((6, 192)), np.zeros(6)).fit(
        two_layer(g)(train), train_labels).log_marginal_likelihood(0)
        for g in TWO_LAYER_WEIGHTS}
    chosen = results[3].variant
    assert chosen.startswith(f'phi and hidden units, g = {max(evidence, key=evidence.get)} ')
    table = markdown_table(results).splitlines()
    assert table[0].endswith('| outlying |') and len(table) == 2 + len(results)


def test_known_tail_reports_the_auroc_lost_to_the_most_uncertain_known_detections():
    # 20 known detections (two misclassified, the most uncertain) and 5 unknown ones.
    labels = np.r_[np.zeros(20, dtype=int), -np.ones(5, dtype=int)]
    predicted = np.r_[np.zeros(18, dtype=int), np.ones(2, dtype=int), np.zeros(5, dtype=int)]
    variance = np.r_[np.linspace(0.0, 0.1, 18), 0.9, 0.95, np.full(5, 0.5)]
    scored = UnknownSet('s', {'phi': np.zeros((25, 2))}, labels, predicted)
    tail = known_tail(variance, scored, share=0.1)
    assert tail['auroc'] == pytest.approx(0.9)
    assert tail['auroc_without_tail'] == 1.0
    assert tail['misclassified_in_tail'] == 1.0 and tail['misclassified_in_known'] == 0.1
    assert known_tail(variance[20:], UnknownSet('u', {}, labels[20:], predicted[20:])) == {}


def test_missing_splits_exit_2_naming_the_directory(tmp_path, capsys):
    from uq_common.cli import main

    (tmp_path / 'train').mkdir()
    code = main(['eval', 'detector-gp', '--data', str(tmp_path)])
    assert code == 2
    assert f'{tmp_path / "val"} is missing' in capsys.readouterr().err
