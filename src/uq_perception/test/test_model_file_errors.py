"""Corrupt or mistaken model files give errors that name the file, what was expected and
what was found: the shipped detector and GP artefacts, cut, emptied, swapped and replaced."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import torch

from uq_perception.detector import load_detector
from uq_perception.ntk import LastLayerNTKGP

REPO = Path(__file__).resolve().parents[3]
DETECTOR = REPO / 'models' / 'detector.pt'
GP = REPO / 'models' / 'detector_gp.npz'


def _copy(src: Path, dst: Path, keep_bytes: int | None = None) -> Path:
    data = src.read_bytes()
    dst.write_bytes(data if keep_bytes is None else data[:keep_bytes])
    return dst


@pytest.mark.parametrize(('make', 'found'), [
    (lambda d: _copy(DETECTOR, d / 'empty.pt', 0), 'found an empty file (0 bytes)'),
    (lambda d: _copy(GP, d / 'gp_as_model.pt'),
     'found an NTK-GP state file (NumPy .npz archive) with arrays'),
    (lambda d: _copy(DETECTOR, d / 'truncated.pt', DETECTOR.stat().st_size // 2),
     'found a truncated or damaged zip archive'),
    (lambda d: (d / 'notes.pt').write_text('model: detector\n') and d / 'notes.pt',
     "found text (16 bytes) starting 'model: detector'"),
], ids=['empty', 'gp-file', 'truncated', 'text'])
def test_corrupt_detector_files_name_file_expectation_and_finding(tmp_path, make, found):
    path = make(tmp_path)
    with pytest.raises(ValueError, match='cannot read detector file') as info:
        load_detector(path)
    message = str(info.value)
    assert str(path) in message
    assert 'expected a detector saved by save_detector' in message
    assert found in message, message


def test_foreign_torch_file_names_its_format(tmp_path):
    path = tmp_path / 'other.pt'
    torch.save({'format': 'someone.else', 'weights': torch.zeros(2)}, path)
    with pytest.raises(ValueError, match=re.escape(f'{path} is not a')) as info:
        load_detector(path)
    assert "found a dict with format 'someone.else'" in str(info.value)


@pytest.mark.parametrize(('make', 'found'), [
    (lambda d: _copy(GP, d / 'empty.npz', 0), 'found an empty file (0 bytes)'),
    (lambda d: _copy(DETECTOR, d / 'model_as_gp.npz'), 'found a PyTorch checkpoint'),
    (lambda d: _copy(GP, d / 'truncated.npz', GP.stat().st_size // 2),
     'found a truncated or damaged zip archive'),
], ids=['empty', 'detector-file', 'truncated'])
def test_corrupt_gp_files_name_file_expectation_and_finding(tmp_path, make, found):
    path = make(tmp_path)
    with pytest.raises(ValueError, match='not a readable NTK-GP state file') as info:
        LastLayerNTKGP.load(path)
    message = str(info.value)
    assert str(path) in message and 'expected a NumPy .npz archive' in message
    assert found in message, message


def test_shipped_files_still_load(tmp_path):
    # The checks above must not refuse good files (copied, so the path differs too).
    model = load_detector(_copy(DETECTOR, tmp_path / 'detector.pt'))
    assert model.model_id
    shutil.copy(GP, tmp_path / 'gp.npz')
    assert LastLayerNTKGP.load(tmp_path / 'gp.npz') is not None
