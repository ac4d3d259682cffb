"""``uq gp fit`` end to end, through the ``uq`` command line, on generated COCO folders.

Two detectors: a small DETR-style network (``quadrant_detector.py`` beside this file),
exported to ONNX in the test and read through the ONNX adapter (its four queries look at the
four quadrants of the image, its features are the quadrant's mean colour); and the shipped
CenterNet on a few simulator renders written by ``uq sim dataset``'s generator. Then every
kind of bad input: one line on stderr, exit status 2, no file written or changed.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import cv2
import numpy as np
import pytest

from uq_common.cli import main as uq
from uq_perception.detectors.model_files import shipped_model_dir
from uq_perception.ntk import LastLayerNTKGP


def _load_quadrant_detector():
    """The shared test detector and data (quadrant_detector.py beside this file)."""
    spec = importlib.util.spec_from_file_location(
        'quadrant_detector', Path(__file__).with_name('quadrant_detector.py'))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


quadrants = _load_quadrant_detector()
write_quadrant_coco = quadrants.write_quadrant_coco


@pytest.fixture(scope='module')
def onnx_model(tmp_path_factory) -> Path:
    pytest.importorskip('onnx', reason='onnx is part of the CPU install')
    pytest.importorskip('onnxruntime', reason='onnxruntime is part of the CPU install')
    return quadrants.export_onnx(tmp_path_factory.mktemp('model') / 'quadrants.onnx')


def fit(capsys, *arguments: str) -> tuple[int, str, str]:
    code = uq(['gp', 'fit', '--no-progress', *arguments])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_onnx_detector_fit_report_and_artefact(tmp_path, capsys, onnx_model):
    annotations = write_quadrant_coco(tmp_path / 'export', 40)
    out = tmp_path / 'gp' / 'quadrants_gp.npz'
    code, stdout, stderr = fit(capsys, '--model', str(onnx_model), '--annotations',
                               str(annotations), '--class-names', 'red', 'green',
                               '--unknown', 'blue', '--out', str(out), '--timing-images', '5')
    assert code == 0, stderr
    report = json.loads(out.with_suffix('.json').read_text())
    coco = json.loads(annotations.read_text())
    # Every annotated quadrant is found by its query (IoU 1), so the balance is the file's.
    for name, category in (('red', 1), ('green', 2)):
        row = report['class_balance'][name]
        assert row['train_annotated'] + row['val_annotated'] == sum(
            a['category_id'] == category for a in coco['annotations'])
        assert row['train_found'] == row['train_annotated']
    blue = sum(a['category_id'] == 3 for a in coco['annotations'])
    assert report['unknown']['objects'] == blue > 0
    # Blue is a direction of colour space no known object spans: the GP variance says so.
    assert report['unknown']['auroc'] > 0.9
    assert report['data']['train_images'] == 32 and report['data']['val_images'] == 8
    assert report['data']['categories'] == {'red': 'class', 'green': 'class',
                                            'blue': 'unknown'}
    assert report['model']['format'] == 'onnx' and report['model']['adapter']['layout'] == 'detr'
    assert report['model']['feature_dim'] == 3
    cost = report['query_cost']
    assert cost['images'] == 5 and cost['query_ms'] > 0 and cost['forward_ms'] > 0
    assert cost['query_over_forward'] == pytest.approx(cost['query_ms'] / cost['forward_ms'],
                                                       rel=1e-2)
    assert report['gp']['experts'][0]['train_objects'] > 0
    assert all(np.isfinite(e['log_evidence']) for e in report['gp']['experts'])
    # The artefact is what the node loads: checked against the model's identity.
    gp = LastLayerNTKGP.load(out, feature_dim=3, class_names=['red', 'green'],
                             model_id=report['model']['model_id'])
    assert gp.ood_threshold == pytest.approx(report['gp']['ood_threshold'])
    assert gp.score_reference is not None
    assert gp.score_reference.count == report['validation']['known_objects']
    red, blue_phi = np.array([[0.8, 0.16, 0.16]]), np.array([[0.16, 0.16, 0.8]])
    assert gp.gp_variance(blue_phi)[0] > gp.ood_threshold > gp.gp_variance(red)[0]
    # The GP beside every post-hoc baseline, on the same detections, in the report and output.
    rows = {row['score']: row for row in report['unknown']['scores']}
    # The quadrant DETR's head is sigmoid: its lower-quantile confidence is the sigmoid's.
    assert list(rows) == ['gp_variance', 'predictive_entropy', 'mutual_information',
                          'predictive_msp', 'predictive_lcb_sigmoid', 'predictive_lcb_energy',
                          'calibrated_score', 'msp',
                          'max_logit', 'energy', 'mahalanobis', 'knn', 'fused_gp_msp']
    assert rows['gp_variance']['auroc'] == report['unknown']['auroc']
    assert all(0.0 <= r['auroc'] <= 1.0 and 0.0 <= r['fpr95'] <= 1.0 for r in rows.values())
    assert all(name in stdout for name in rows) and 'FPR95' in stdout and str(out) in stdout
    # With unknown objects annotated, the transform is chosen by their AUROC and recorded.
    choice = report['gp']['feature_transform']
    assert choice['kind'] in ('centre_l2', 'l2', 'none') and 'best AUROC' in choice['rule']
    assert choice['auroc_by_kind'][choice['kind']] == max(choice['auroc_by_kind'].values())
    assert (gp.feature_transform is None) == (choice['kind'] == 'none')
    # So is what the calibrated score ranks: the best of the GP's predictive signals there.
    signal = report['gp']['score_signal']
    assert signal['auroc_by_signal'][signal['signal']] == max(signal['auroc_by_signal'].values())
    assert gp.score_reference.signal == signal['signal']
    # The score is a monotone map of that signal (saturating at 1 beyond every known object).
    assert rows['calibrated_score']['auroc'] <= signal['auroc_by_signal'][signal['signal']]
    assert report['provenance']['arguments']['annotations'] == str(annotations)


@pytest.fixture(scope='module')
def small_export(tmp_path_factory) -> Path:
    return write_quadrant_coco(tmp_path_factory.mktemp('small') / 'export', 24)


@pytest.mark.parametrize('unknown', [['--unknown', 'blue'], ['--ignore', 'blue']],
                         ids=['unknown objects', 'none'])
@pytest.mark.parametrize('named', ['l2', 'none', 'centre_l2'])
def test_a_named_feature_transform_is_the_one_fitted_and_reported(tmp_path, capsys, onnx_model,
                                                                 small_export, named, unknown):
    # --feature-transform NAME is used as named, whatever auto would choose on these data
    # (by AUROC with unknown objects, by the norm-spread rule without): the artefact holds
    # that transform and the report says it was named.
    out = tmp_path / 'gp.npz'
    code, _, stderr = fit(capsys, '--model', str(onnx_model), '--annotations', str(small_export),
                          '--class-names', 'red', 'green', *unknown, '--out', str(out),
                          '--timing-images', '0', '--feature-transform', named)
    assert code == 0, stderr
    report = json.loads(out.with_suffix('.json').read_text())
    choice = report['gp']['feature_transform']
    assert (choice['setting'], choice['kind'], choice['rule']) == (named, named, 'named')
    assert report['settings']['feature_transform'] == named
    assert report['provenance']['arguments']['feature_transform'] == named
    gp = LastLayerNTKGP.load(out, feature_dim=3, class_names=['red', 'green'],
                             model_id=report['model']['model_id'])
    if named == 'none':
        assert gp.feature_transform is None
    else:
        transform = gp.feature_transform
        assert transform is not None and transform.to_meta()['kind'] == named
        # l2 only normalises (zero means); centre_l2 centres on the training mean first.
        assert transform.centred == (named == 'centre_l2')
        assert bool(transform.means_array().any()) == (named == 'centre_l2')


def test_diagnose_tells_the_causes_apart(tmp_path, capsys, onnx_model):
    annotations = write_quadrant_coco(tmp_path / 'export', 40)
    out = tmp_path / 'diagnosis.json'
    code = uq(['gp', 'diagnose', '--no-progress', '--model', str(onnx_model), '--annotations',
               str(annotations), '--class-names', 'red', 'green', '--unknown', 'blue',
               '--out', str(out)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    result = json.loads(out.read_text())
    assert set(result['auroc']) == {'gp_variance_none', 'gp_variance_l2',
                                    'gp_variance_centre_l2', 'neg_block_norm', 'msp',
                                    'max_logit', 'energy'}
    assert result['objects']['unknown'] > 0 and result['objects']['known'] > 0
    # One block (a DETR head), holding every detection.
    (block,) = result['per_block']
    assert block['known'] == result['objects']['known']
    assert sum(row['known'] + row['unknown'] for row in result['per_score_bin']) == \
        result['objects']['known'] + result['objects']['unknown']
    assert 'known-vs-unknown AUROC' in captured.out
    # Without unknown objects there is nothing to tell apart: one line, exit 2.
    code = uq(['gp', 'diagnose', '--no-progress', '--model', str(onnx_model), '--annotations',
               str(annotations), '--class-names', 'red', 'green', '--ignore', 'blue'])
    captured = capsys.readouterr()
    assert code == 2 and captured.err.count('\n') == 1 and 'unknown' in captured.err


def test_onnx_class_names_must_match_the_data(tmp_path, capsys, onnx_model):
    annotations = write_quadrant_coco(tmp_path / 'export', 10)
    out = tmp_path / 'gp.npz'
    # Without names the model's classes are class_0 and class_1: the data's are not among them.
    code, _, stderr = fit(capsys, '--model', str(onnx_model), '--annotations', str(annotations),
                          '--out', str(out))
    assert code == 2 and stderr.count('\n') == 1
    assert "are not classes of the model (class_0, class_1)" in stderr
    assert not out.exists() and not out.with_suffix('.json').exists()


@pytest.fixture(scope='module')
def sim_coco(tmp_path_factory) -> Path:
    pytest.importorskip('mujoco', reason='the simulator renders the images')
    from uq_sim.dataset import generate_dataset

    root = tmp_path_factory.mktemp('sim')
    generate_dataset(root, 20, seed=11, fractions={'train': 0.6, 'val': 0.0, 'test': 0.0,
                                                   'test_unknown': 0.4}, progress=False)
    return root


def test_shipped_centernet_on_simulator_renders(tmp_path, capsys, sim_coco):
    model = shipped_model_dir() / 'detector.pt'
    out = tmp_path / 'gp.npz'
    code, stdout, stderr = fit(
        capsys, '--model', str(model),
        '--annotations', str(sim_coco / 'train' / 'annotations.json'),
        '--val-annotations', str(sim_coco / 'test_unknown' / 'annotations.json'),
        '--out', str(out), '--report', str(tmp_path / 'report.json'), '--timing-images', '3')
    assert code == 0, stderr
    report = json.loads((tmp_path / 'report.json').read_text())
    assert report['model']['format'] == 'torch' and report['model']['adapter'] is None
    assert list(report['class_balance']) == ['box', 'sphere', 'cylinder', 'capsule',
                                             'ellipsoid', 'mug']
    # The simulator's supercategories mark its unknown and auxiliary objects.
    assert report['data']['categories']['torus'] == 'unknown'
    assert report['data']['categories']['rock'] == 'auxiliary'
    assert report['unknown']['objects'] > 0 and 0.0 <= report['unknown']['auroc'] <= 1.0
    shipped = LastLayerNTKGP.load(shipped_model_dir() / 'detector_gp.npz')
    gp = LastLayerNTKGP.load(out, feature_dim=64, class_names=shipped.class_names,
                             model_id=shipped.model_id)
    assert gp.fitted and gp.score_reference is not None


def _copy_tree(source: Path, target: Path) -> Path:
    import shutil

    shutil.copytree(source, target)
    return target / 'annotations' / 'instances_default.json'


@pytest.fixture(scope='module')
def clean_export(tmp_path_factory) -> Path:
    return write_quadrant_coco(tmp_path_factory.mktemp('clean') / 'export', 12).parent.parent


def _edit_json(path: Path, change) -> None:
    coco = json.loads(path.read_text())
    change(coco)
    path.write_text(json.dumps(coco))


BAD_INPUTS = {
    'corrupt JSON': (lambda ann: ann.write_text(ann.read_text()[:-40]), 'is not valid JSON'),
    'NaN in JSON': (lambda ann: ann.write_text(ann.read_text().replace(
        '"width": 64', '"width": NaN', 1)), 'is not valid JSON'),
    'missing image': (lambda ann: (ann.parent.parent / 'images' / '0003.png').unlink(),
                      'image files not found'),
    'image of another size': (lambda ann: cv2.imwrite(
        str(ann.parent.parent / 'images' / '0005.png'), np.zeros((48, 64, 3), np.uint8)),
        'is 64x48 pixels but the annotations say 64x64'),
    'undecodable image': (lambda ann: (ann.parent.parent / 'images' / '0002.png').write_bytes(
        b'\x89PNG broken'), 'cannot read image'),
    'box outside the image': (lambda ann: _edit_json(ann, lambda c: c['annotations'][0].update(
        bbox=[40, 40, 32, 32])), 'outside its 64x64 image'),
    'class not in the model': (lambda ann: _edit_json(ann, lambda c: c['categories'][1].update(
        name='purple')), "'purple'"),
}


@pytest.mark.parametrize('case', list(BAD_INPUTS))
def test_bad_input_one_line_exit_2_nothing_written(tmp_path, capsys, onnx_model, clean_export,
                                                   case):
    break_it, message = BAD_INPUTS[case]
    annotations = _copy_tree(clean_export, tmp_path / 'export')
    break_it(annotations)
    out = tmp_path / 'models' / 'gp.npz'
    out.parent.mkdir()
    out.write_bytes(b'previous artefact')
    code, stdout, stderr = fit(capsys, '--model', str(onnx_model), '--annotations',
                               str(annotations), '--class-names', 'red', 'green',
                               '--unknown', 'blue', '--out', str(out))
    assert code == 2
    assert stderr.startswith('uq gp fit: error: ') and stderr.count('\n') == 1, stderr
    assert message in stderr
    assert out.read_bytes() == b'previous artefact'
    assert sorted(p.name for p in out.parent.iterdir()) == ['gp.npz']


@pytest.mark.parametrize('arguments, message', [
    (['--model', 'absent.onnx'], 'model file not found'),
    (['--model', '{shipped}', '--layout', 'yolo'], 'apply to ONNX models only'),
    (['--model', '{onnx}', '--layout', 'ssd'], 'layout must be one of'),
    (['--model', '{onnx}', '--provider', 'gpu'], 'unknown execution provider'),
    (['--model', '{junk}.onnx'], 'not a readable ONNX model'),
    (['--model', '{junk}.bin'], 'cannot tell the format'),
    (['--model', '{junk}.bin', '--model-format', 'torch'], 'cannot read detector file'),
    (['--model', '{onnx}', '--unknown', 'teal'], "categories ['teal'] are in no annotations"),
])
def test_bad_model_or_settings(tmp_path, capsys, onnx_model, clean_export, arguments, message):
    annotations = clean_export / 'annotations' / 'instances_default.json'
    for suffix in ('.onnx', '.bin'):
        (tmp_path / 'junk').with_suffix(suffix).write_bytes(b'\x08\x07 not a model')
    values = {'shipped': str(shipped_model_dir() / 'detector.pt'), 'onnx': str(onnx_model),
              'junk': str(tmp_path / 'junk')}
    out = tmp_path / 'gp.npz'
    code, _, stderr = fit(capsys, *[a.format(**values) for a in arguments], '--annotations',
                          str(annotations), '--out', str(out))
    assert code == 2 and stderr.count('\n') == 1, stderr
    assert message in stderr
    assert not out.exists()
