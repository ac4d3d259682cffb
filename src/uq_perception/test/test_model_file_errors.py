"""Corrupt or mistaken model files give errors that name the file, what was expected and
what was found: the shipped detector and GP artefacts, cut, emptied, swapped and replaced,
and GP states whose metadata fields are out of range or of the wrong type."""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from uq_perception.detectors.centernet import load_detector
from uq_perception.ntk import LastLayerNTKGP, NTKGPConfig
from uq_perception.ntk.config import MAX_KMEANS_SAMPLES
from uq_perception.ntk.persistence import read_state, write_state

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


def _with_meta(tmp_path: Path, **changes: object) -> Path:
    """The shipped GP state with metadata fields changed, checksums recomputed (so only
    the field checks can refuse it)."""
    meta, arrays = read_state(GP)
    for key, value in changes.items():
        if key.startswith('config.'):
            meta['config'] = dict(meta['config'], **{key[len('config.'):]: value})
        else:
            meta[key] = value
    path = tmp_path / 'edited.npz'
    write_state(path, meta, arrays)
    return path


@pytest.mark.parametrize(('changes', 'problem'), [
    ({'ood_threshold': math.nan}, 'ood_threshold must be finite'),
    ({'ood_threshold': -1.0}, 'ood_threshold must be >= 0'),
    ({'temperature': 0.0}, 'temperature must be > 0'),
    ({'temperature': math.nan}, 'temperature must be finite'),
    ({'temperature': '1.0'}, 'temperature must be a number'),
    ({'probit_lambda': -50.0}, 'probit_lambda must be >= 0'),
    ({'probit_lambda': True}, 'probit_lambda must be a number'),
    ({'feature_dim': math.inf}, 'feature_dim must be an integer'),
    ({'feature_dim': 64.0}, 'feature_dim must be an integer'),
    # A misstated size is refused before anything of that size is allocated.
    ({'feature_dim': 10 ** 6}, r'weight has shape \(6, 64\), expected \(6, 1000000\)'),
    ({'num_base_classes': None}, 'num_base_classes must be an integer'),
    ({'class_names': [0, 1, 2, 3, 4, 5]}, 'class_names must be a list of non-empty'),
    ({'class_names': ['box'] * 6}, 'class_names must be unique'),
    ({'model_id': 123}, 'model_id must be a string'),
    ({'applied_updates': 'abc'}, 'applied_updates must be a list'),
    ({'box_calibration': [1]}, 'box_calibration must hold'),
    ({'box_calibration': {'coordinates': ['x'], 'noise': [1.0], 'scale': [1.0],
                          'samples': 'x'}}, 'box_calibration.samples must be an integer'),
    ({'config.seed': -1}, 'config: seed must be >= 0'),
    ({'config.entropy_samples': 10 ** 12}, r'config: entropy_samples must be in \[2, 1024\]'),
    ({'config.entropy_samples': 3}, 'config: entropy_samples must be even'),
    ({'config.num_experts': '2'}, 'config: num_experts must be an integer'),
    ({'config.num_experts': 10 ** 9}, 'experts disagree with the configuration'),
    ({'config.kmeans_samples': 0}, 'config: kmeans_samples must be in'),
    ({'config.shared_noise': 1}, 'config: shared_noise must be true or false'),
    ({'config.new_class_margin': math.inf}, 'config: new_class_margin must be finite'),
    ({'config.unknown': 1}, "config: .*unexpected keyword argument 'unknown'"),
])
def test_gp_metadata_out_of_range_or_of_the_wrong_type_is_refused_naming_file_and_field(
        tmp_path, changes, problem):
    path = _with_meta(tmp_path, **changes)
    with pytest.raises(ValueError, match=problem) as info:
        LastLayerNTKGP.load(path)
    assert str(path) in str(info.value)


def test_gp_metadata_missing_a_field_is_refused(tmp_path):
    meta, arrays = read_state(GP)
    del meta['temperature']
    write_state(tmp_path / 'gp.npz', meta, arrays)
    with pytest.raises(ValueError, match=r"missing metadata fields \['temperature'\]"):
        LastLayerNTKGP.load(tmp_path / 'gp.npz')


def test_edited_metadata_of_a_checksummed_state_is_refused(tmp_path):
    LastLayerNTKGP.load(GP).save(tmp_path / 'gp.npz')
    with np.load(tmp_path / 'gp.npz') as archive:
        arrays = {k: np.array(archive[k]) for k in archive.files}
    meta = json.loads(str(arrays.pop('meta')))
    assert 'meta_digest' in meta
    meta['temperature'] = 0.5  # in range: only the checksum can tell
    np.savez(tmp_path / 'gp.npz', meta=np.array(json.dumps(meta)), **arrays)
    with pytest.raises(ValueError, match='metadata checksum mismatch'):
        LastLayerNTKGP.load(tmp_path / 'gp.npz')


def test_a_state_saved_now_round_trips_and_an_older_one_still_loads(tmp_path):
    # As written before the metadata checksum and the score reference existed.
    meta, arrays = read_state(GP)
    del meta['meta_digest'], meta['score_reference']
    np.savez(tmp_path / 'old.npz', meta=np.array(json.dumps(meta)), **arrays)
    old = LastLayerNTKGP.load(tmp_path / 'old.npz')
    assert old.score_reference is None and old.predict(np.zeros((1, 64))).calibrated_score is None
    shipped = LastLayerNTKGP.load(GP)
    shipped.save(tmp_path / 'gp.npz')
    again = LastLayerNTKGP.load(tmp_path / 'gp.npz')
    assert again.temperature == shipped.temperature
    assert again.ood_threshold == shipped.ood_threshold
    assert again.class_names == shipped.class_names


@pytest.mark.parametrize(('fields', 'problem'), [
    ({'entropy_samples': 1026}, 'entropy_samples must be in'),
    ({'entropy_samples': 4.0}, 'entropy_samples must be an integer'),
    ({'num_experts': True}, 'num_experts must be an integer'),
    ({'kmeans_samples': MAX_KMEANS_SAMPLES + 1}, 'kmeans_samples must be in'),
    ({'kmeans_iterations': 0}, 'kmeans_iterations must be in'),
    ({'seed': -1}, 'seed must be >= 0'),
    ({'ood_quantile': math.nan}, 'ood_quantile must be finite'),
    ({'new_class_margin': -1.0}, 'new_class_margin must be >= 0'),
])
def test_the_gp_configuration_checks_every_field(fields, problem):
    with pytest.raises(ValueError, match=problem):
        NTKGPConfig(**fields)
