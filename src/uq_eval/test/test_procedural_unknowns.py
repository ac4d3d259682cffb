"""`uq eval detector --procedural-unknowns`: held-out generated unknown objects, scored
with the shipped detector and GP on MuJoCo renders."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from uq_eval.detector.procedural_unknowns import render_procedural_split
from uq_sim.objects import KNOWN_CLASSES, PROCEDURAL_CATEGORY_BASE, PROCEDURAL_CLASSES

WORKSPACE = Path(__file__).resolve().parents[3]
MODELS = WORKSPACE / 'models'


def _eval_detector(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, '-m', 'uq_common.cli', 'eval', 'detector', *args],
                          capture_output=True, text=True, timeout=180, cwd=WORKSPACE)


def test_procedural_split_labels_boxes_and_categories():
    split = render_procedural_split(3, 11, (240, 320), KNOWN_CLASSES)
    assert split.images.shape == (3, 240, 320, 3) and len(split) == 3
    for i in range(3):
        unknown = split.category_ids[i] >= PROCEDURAL_CATEGORY_BASE
        # Exactly one procedural object per scene, of the family whose turn it is, whole.
        assert unknown.sum() == 1
        assert split.category_names[int(split.category_ids[i][unknown][0])] == \
            PROCEDURAL_CLASSES[i % 3]
        assert not split.hard(i)[unknown].any()
        assert (split.labels[i][unknown] == -1).all()
        known = split.labels[i][~unknown]
        assert ((known >= 0) & (known < len(KNOWN_CLASSES))).all()
        assert split.category_ids[i][~unknown].tolist() == (known + 1).tolist()
        boxes = split.boxes[i]
        assert (boxes[:, 2:] > 0).all() and (boxes[:, 0] <= 320).all()
    again = render_procedural_split(3, 11, (240, 320), KNOWN_CLASSES)
    assert np.array_equal(split.images, again.images)
    with pytest.raises(ValueError, match='known classes'):
        render_procedural_split(1, 0, (240, 320), ['a', 'b'])
    with pytest.raises(ValueError, match='1..'):
        render_procedural_split(0, 0, (240, 320), KNOWN_CLASSES)


@pytest.mark.parametrize('args, message', [
    (['--procedural-unknowns', '0'], 'must be 1..'),
    (['--procedural-unknowns', '-4'], 'must be 1..'),
    (['--procedural-unknowns', '100000'], 'must be 1..'),
    (['--procedural-unknowns', 'many'], 'expected a whole number'),
    (['--procedural-unknowns', '2', '--procedural-seed', '-1'], 'seed must be >= 0'),
])
def test_bad_options_exit_2_with_a_clear_message(tmp_path, capsys, args, message):
    from uq_common.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(['eval', 'detector', '--data', str(tmp_path), *args])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.skipif(not (MODELS / 'detector.pt').is_file(), reason='no shipped detector')
def test_eval_detector_reports_procedural_auroc_next_to_the_fixed_set(tmp_path):
    from uq_sim.dataset import generate_dataset

    data = tmp_path / 'data'
    generate_dataset(data, n=20, seed=0, splits=['test', 'test_unknown'], progress=False)
    out = tmp_path / 'eval.json'
    proc = _eval_detector('--data', str(data), '--model', str(MODELS / 'detector.pt'),
                          '--gp', str(MODELS / 'detector_gp.npz'), '--latency-runs', '2',
                          '--no-progress', '--procedural-unknowns', '2',
                          '--procedural-seed', '3', '--out', str(out))
    assert proc.returncode == 0, proc.stderr
    report = json.loads(out.read_text())
    assert json.loads(proc.stdout) == report
    procedural = report['procedural_unknowns']
    assert procedural['objects'] == 2 and procedural['seed'] == 3
    scored = procedural['objects'] - procedural['ignored']
    found = procedural['ood_matched_unknown']
    assert procedural['missed'] == scored - found
    assert procedural['unknown_recall'] == pytest.approx(found / scored, abs=1e-4)
    auroc = procedural['auroc_unknown']['gp_variance']
    # Defined exactly when both known and unknown detections were matched.
    assert (auroc is not None) == (found > 0 and procedural['ood_matched_known'] > 0)
    assert auroc is None or 0.0 <= auroc <= 1.0
    assert report['ood_auroc_gp_variance'] == {
        'fixed_unknown_set': report['uncertainty']['auroc_unknown']['gp_variance'],
        'procedural_unknowns': auroc}
    assert report['ood_auroc_mutual_information'] == {
        'fixed_unknown_set': report['uncertainty']['auroc_unknown']['mutual_information'],
        'procedural_unknowns': procedural['auroc_unknown']['mutual_information']}
    assert 'GP-variance OOD AUROC: fixed unknown set' in proc.stderr
    assert (f"known-vs-unknown AUROC on the fixed unknown set "
            f"({report['uncertainty']['ood_matched_unknown']} unknown") in proc.stderr
    assert f'procedural objects missed: {procedural["missed"]} of {scored}' in proc.stderr
