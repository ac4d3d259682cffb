"""``uq eval layers`` and the selection / judging split, on constructed data: a network whose
last layer hides a difference an earlier layer shows (the last-layer GP misses it, the
earlier layer's GP and the penultimate layer's NTK find it); the split of the unknown objects
by class; the bootstrap against the plain AUROC; and the refusal, by ``uq gp fit`` and by the
study, of judging classes that are also selection classes."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest

from uq_common.cli import main as uq
from uq_eval.detector.layer_study import (
    Penultimate,
    Records,
    _gp,
    _weighted_auroc,
    _weighted_fpr95,
    configure,
    split_by_class,
)
from uq_eval.gp.fitting import FitSettings, check_selection_judging
from uq_perception.ntk.layer_kernel import jacobian_features
from uq_perception.training.metrics import auroc
from uq_perception.training.ood_baselines import fpr_at_95_tpr

CLASSES = 3


def hidden_difference(count: int, unknown: bool, rng: np.random.Generator
                      ) -> tuple[np.ndarray, np.ndarray]:
    """Inputs ``h`` of the penultimate layer: the first three coordinates place a known
    class, the last three are near 0 for known objects and near 3 for unknown ones."""
    labels = rng.integers(0, CLASSES, count)
    h = np.zeros((count, 6))
    h[:, :3] = 2.0 * np.eye(CLASSES)[labels] + 0.3 * rng.normal(size=(count, 3))
    h[:, 3:] = (3.0 if unknown else 0.0) + 0.3 * rng.normal(size=(count, 3))
    return h, labels


def test_the_last_layer_hides_what_an_earlier_one_shows():
    rng = np.random.default_rng(0)
    # The penultimate layer reads only the first three coordinates: phi, and so the logits
    # and the last-layer kernel, are blind to the last three.
    weight = np.hstack([rng.normal(size=(4, 3)), np.zeros((4, 3))])
    layer = Penultimate((weight,), (np.zeros(4),), (rng.normal(size=(CLASSES, 4)),), 'silu')
    fit_h, fit_labels = hidden_difference(300, False, rng)
    known_h, _ = hidden_difference(200, False, rng)
    unknown_h, _ = hidden_difference(200, True, rng)
    zero = np.zeros(1, np.int64)

    def phi(h: np.ndarray) -> np.ndarray:
        return layer.output(layer.pre_activation(h, zero.repeat(len(h))))

    def ntk(h: np.ndarray) -> np.ndarray:
        scale = zero.repeat(len(h))
        return jacobian_features(layer.signal(layer.pre_activation(h, scale), scale), h)

    is_unknown = np.r_[np.zeros(200, bool), np.ones(200, bool)]
    found = {}
    for name, features in (('last layer', phi), ('earlier layer', lambda h: h),
                           ('penultimate NTK', ntk)):
        gp = _gp(features(fit_h), fit_labels, CLASSES, 'none')
        found[name] = auroc(np.r_[gp.gp_variance(features(known_h)),
                                  gp.gp_variance(features(unknown_h))], is_unknown)
    assert np.allclose(phi(known_h).mean(axis=0), phi(unknown_h).mean(axis=0), atol=0.2)
    assert 0.35 < found['last layer'] < 0.65, found
    assert found['earlier layer'] > 0.95 and found['penultimate NTK'] > 0.95, found


def records(categories: list[list[str]]) -> Records:
    """One detection per object of each image; known objects are 'box'."""
    names = np.array([c for image in categories for c in image], dtype=object)
    images = np.array([i for i, image in enumerate(categories) for _ in image])
    n = len(names)
    labels = np.where(names == 'box', 0, -1)
    return Records('test_unknown', np.zeros((n, 2)), np.zeros((n, 2)), labels, names, images,
                   {}, np.zeros(n, np.int64))


def test_unknown_objects_are_split_by_class_and_mixed_images_left_out():
    data = records([['box', 'torus'], ['cone', 'box', 'box'], ['torus', 'cone'], ['star'],
                    ['box']])
    selection, judging = split_by_class(data, ['cone', 'star'], ['torus'])
    assert sorted(set(selection.images)) == [1, 3]
    assert sorted(set(judging.images)) == [0]
    assert set(selection.categories[selection.unknown]) == {'cone', 'star'}
    assert set(judging.categories[judging.unknown]) == {'torus'}


def test_bootstrap_with_unit_weights_is_the_plain_figure():
    rng = np.random.default_rng(1)
    scores = np.round(rng.normal(size=300), 1)  # ties count one half
    unknown = rng.random(300) < 0.3
    scores[unknown] += 0.8
    ones = np.ones((1, 300))
    assert _weighted_auroc(scores, unknown, ones)[0] == pytest.approx(auroc(scores, unknown))
    twice = np.where(np.arange(300) % 2 == 0, 2.0, 0.0)[None]
    repeated = np.r_[scores[::2], scores[::2]]
    assert _weighted_auroc(scores, unknown, twice)[0] == pytest.approx(
        auroc(repeated, np.r_[unknown[::2], unknown[::2]]))
    plain = fpr_at_95_tpr(scores[~unknown], scores[unknown])
    assert abs(_weighted_fpr95(scores, unknown, ones)[0] - plain) < 0.02


def test_judging_classes_that_also_select_are_refused():
    check_selection_judging(['cone'], ['torus'])
    with pytest.raises(ValueError, match=r"categories \['cone'\] are both selection and judging"):
        check_selection_judging(['Cone ', 'star'], ['cone'])
    with pytest.raises(ValueError, match='both selection and judging'):
        FitSettings(selection_categories=('torus',), judging_categories=('torus', 'star'))


def test_uq_gp_fit_refuses_an_overlapping_selection_in_one_line(tmp_path, capsys):
    out = tmp_path / 'gp.npz'
    code = uq(['gp', 'fit', '--model', str(tmp_path / 'model.onnx'), '--annotations',
               str(tmp_path / 'a.json'), '--out', str(out), '--select-on', 'blue', 'red',
               '--judge-on', 'blue', '--no-progress'])
    stderr = capsys.readouterr().err
    assert code == 2 and stderr.count('\n') == 1, stderr
    assert stderr.startswith('uq gp fit: error: ') and "['blue']" in stderr
    assert not out.exists()


def test_the_study_refuses_an_overlapping_selection_in_one_line(tmp_path, capsys):
    for split in ('train', 'val', 'test_unknown'):
        (tmp_path / split).mkdir()
    parser = argparse.ArgumentParser()
    configure(parser)
    args = parser.parse_args(['--fit-data', str(tmp_path), '--data', str(tmp_path),
                              '--selection-classes', 'cone', 'torus', '--judging-classes',
                              'torus'])
    assert args.run(args) == 2
    stderr = capsys.readouterr().err
    assert stderr.count('\n') == 1 and "['torus'] are both selection and judging" in stderr


def test_uq_gp_fit_judges_on_the_judging_categories_alone(tmp_path, capsys,
                                                          quadrant_detector):
    pytest.importorskip('onnxruntime', reason='onnxruntime is part of the CPU install')
    quadrants = quadrant_detector
    model = quadrants.export_onnx(tmp_path / 'quadrants.onnx')
    annotations = quadrants.write_quadrant_coco(tmp_path / 'export', 30)
    out = tmp_path / 'gp.npz'
    code = uq(['gp', 'fit', '--model', str(model), '--annotations', str(annotations),
               '--class-names', 'red', 'green', '--unknown', 'blue', '--judge-on', 'blue',
               '--out', str(out), '--timing-images', '0', '--no-progress'])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    report = json.loads(out.with_suffix('.json').read_text())
    assert report['unknown']['judged_on'] == {'judging': ['blue'], 'selection': []}
    assert report['unknown']['objects'] > 0 and report['unknown']['auroc'] is not None
    # No unknown object was left to choose on: the transform and the signal fell back.
    assert report['gp']['feature_transform']['rule'].startswith('fewer than')
    assert report['gp']['score_signal']['signal'] == 'gp_variance'
