"""A start from a checked ONNX export: once the export of a detector file has passed the
check with a GP, the next start with the same files and GP runs it without torch and gives
the same detections; a changed detector file, ONNX file or GP takes the full start again."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip('onnx', reason='onnx is part of the CPU install (requirements/app.in)')
pytest.importorskip('onnxruntime', reason='onnxruntime is part of the CPU install')

from uq_perception.detectors.centernet import CenterNetDetector, save_detector  # noqa: E402
from uq_perception.ntk import LastLayerNTKGP, NTKGPConfig  # noqa: E402
from uq_perception.runtime.backends import OnnxRuntimeBackend  # noqa: E402
from uq_perception.runtime.loading import (  # noqa: E402
    RuntimeSettings,
    load_model,
    start_detector,
)
from uq_perception.runtime.onnx_checked import (  # noqa: E402
    CheckedExport,
    CheckedOnnxDetector,
    read_checked_export,
)

# A start in a fresh process: what it ran, whether torch was imported, and its detections
# and GP variances on fixed scenes.
START = '''
import json, sys
import numpy as np
from uq_perception.ntk import LastLayerNTKGP
from uq_perception.runtime.loading import RuntimeSettings, load_model, start_detector
model_path, gp_path, cache = sys.argv[1:4]
runtime = RuntimeSettings(onnx_cache_dir=cache)
loaded = load_model('torch', model_path, runtime)
gp = LastLayerNTKGP.load(gp_path, feature_dim=loaded.feature_dim, model_id=loaded.model_id)
detector, fallback = start_detector(loaded, runtime, gp)
out = {'detector': type(detector).__name__, 'torch': 'torch' in sys.modules,
       'fallback': fallback, 'scenes': []}
rng = np.random.default_rng(3)
for shape in ((64, 96), (120, 200)):
    found = detector.infer((rng.random((*shape, 3)) * 255).astype(np.uint8), 0.0, 8)
    out['scenes'].append({'boxes': found.boxes.tolist(), 'scores': found.scores.tolist(),
                          'logits': found.logits.tolist(),
                          'variance': gp.gp_variance(found.embeddings).tolist()})
print(json.dumps(out))
'''


def _tiny(seed: int) -> CenterNetDetector:
    torch.manual_seed(seed)
    model = CenterNetDetector(['a', 'b', 'c'], embedding_dim=8, input_size=(64, 96),
                              channels=(8, 8, 8, 8), neck_channels=8, embedding_channels=8,
                              max_candidates=8).eval()
    # Distinct candidates, as a trained model's (untrained heads tie up to round-off).
    torch.nn.init.normal_(model.box_head.weight, std=1.0)
    return model


def _gp(model: CenterNetDetector, seed: int, path: Path) -> Path:
    head = model.head
    gp = LastLayerNTKGP(head.weight.detach().numpy(), head.bias.detach().numpy(),
                        NTKGPConfig(num_experts=1), model.class_names, 'tiny-model')
    gp.fit(np.random.default_rng(seed).normal(size=(200, 8)))
    gp.save(path)
    return path


@pytest.fixture(scope='module')
def tiny_export(tmp_path_factory) -> Path:
    """The ONNX export of ``_tiny(0)`` saved as 'tiny-model', built as a first start builds
    it into its cache. An export takes seconds: each test's first start finds a copy in its
    own cache (:func:`_seed`) and is still the full start (torch, the check against the
    torch model, a record written), since no record of a passed check comes with it."""
    folder = tmp_path_factory.mktemp('tiny-export')
    save_detector(_tiny(0), folder / 'tiny.pt', 'tiny-model')
    runtime = RuntimeSettings(onnx_cache_dir=folder / 'cache')
    backend, fallback = start_detector(load_model('torch', folder / 'tiny.pt', runtime), runtime)
    assert isinstance(backend, OnnxRuntimeBackend), fallback
    return backend.prepared.path


def _seed(cache: Path, tiny_export: Path) -> None:
    """Put the shared export of ``_tiny(0)`` where a start with ``cache`` looks for it."""
    (cache / 'onnx').mkdir(parents=True)
    shutil.copy2(tiny_export, cache / 'onnx' / tiny_export.name)


def _start(model_path: Path, gp_path: Path, cache: Path) -> dict:
    result = subprocess.run([sys.executable, '-c', START, str(model_path), str(gp_path),
                             str(cache)], capture_output=True, text=True, timeout=600,
                            check=True)
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_a_checked_export_starts_without_torch_and_detects_the_same(tmp_path, tiny_export):
    model_path, cache = tmp_path / 'tiny.pt', tmp_path / 'cache'
    save_detector(_tiny(0), model_path, 'tiny-model')
    _seed(cache, tiny_export)
    assert read_checked_export(model_path, cache) is None
    gp_path = _gp(_tiny(0), 0, tmp_path / 'gp.npz')
    full = _start(model_path, gp_path, cache)
    assert full['detector'] == 'OnnxRuntimeBackend' and full['torch'] and not full['fallback']
    record = read_checked_export(model_path, cache)
    assert isinstance(record, CheckedExport) and record.model_id == 'tiny-model'
    checked = _start(model_path, gp_path, cache)
    assert checked['detector'] == 'CheckedOnnxDetector' and not checked['torch']
    for ours, theirs in zip(checked['scenes'], full['scenes'], strict=True):
        assert ours == theirs  # the same file on the same runtime: identical numbers


def test_another_gp_detector_file_or_onnx_file_takes_the_full_start(tmp_path, tiny_export):
    model_path, cache = tmp_path / 'tiny.pt', tmp_path / 'cache'
    model = _tiny(0)
    save_detector(model, model_path, 'tiny-model')
    _seed(cache, tiny_export)
    first, second = _gp(model, 0, tmp_path / 'first.npz'), _gp(model, 1, tmp_path / 'second.npz')
    runtime = RuntimeSettings(onnx_cache_dir=cache)

    def start(gp_path: Path):
        loaded = load_model('torch', model_path, runtime)
        gp = LastLayerNTKGP.load(gp_path, feature_dim=loaded.feature_dim,
                                 model_id=loaded.model_id)
        return start_detector(loaded, runtime, gp)[0]

    assert isinstance(start(first), OnnxRuntimeBackend)
    assert isinstance(start(first), CheckedOnnxDetector)
    # Another GP: checked once in full, then recorded beside the first.
    assert isinstance(start(second), OnnxRuntimeBackend)
    assert isinstance(start(second), CheckedOnnxDetector)
    assert isinstance(start(first), CheckedOnnxDetector)
    # The ONNX file changed since its check: no record matches.
    onnx_path = Path(read_checked_export(model_path, cache).onnx_path)
    onnx_path.write_bytes(onnx_path.read_bytes() + b'\0')
    assert read_checked_export(model_path, cache) is None
    assert isinstance(start(first), OnnxRuntimeBackend)
    assert isinstance(start(first), CheckedOnnxDetector)
    # Other weights in the detector file: no record of that file, the full start.
    save_detector(_tiny(1), model_path, 'tiny-model')
    assert read_checked_export(model_path, cache) is None
    assert isinstance(start(_gp(_tiny(1), 0, tmp_path / 'third.npz')), OnnxRuntimeBackend)


def test_an_unreadable_record_is_no_record(tmp_path, tiny_export):
    model_path, cache = tmp_path / 'tiny.pt', tmp_path / 'cache'
    model = _tiny(0)
    save_detector(model, model_path, 'tiny-model')
    _seed(cache, tiny_export)
    gp_path = _gp(model, 0, tmp_path / 'gp.npz')
    runtime = RuntimeSettings(onnx_cache_dir=cache)
    loaded = load_model('torch', model_path, runtime)
    gp = LastLayerNTKGP.load(gp_path, feature_dim=8, model_id='tiny-model')
    start_detector(loaded, runtime, gp)
    records = list((cache / 'onnx').glob('checked-*.json'))
    assert len(records) == 1
    records[0].write_text('{"format": "uq_perception.checked_onnx_export"', encoding='utf-8')
    assert read_checked_export(model_path, cache) is None
    assert isinstance(start_detector(load_model('torch', model_path, runtime), runtime, gp)[0],
                      OnnxRuntimeBackend)
    assert isinstance(load_model('torch', model_path, runtime).network, CheckedExport)
    # A GPU provider never takes the recorded path (its numerics are not the check's).
    gpu = RuntimeSettings(onnx_provider='cuda', onnx_cache_dir=cache)
    assert not isinstance(load_model('torch', model_path, gpu).network, CheckedExport)
