"""The onnxruntime backend of the shipped detector: its ONNX export agrees with the torch
model (outputs, W phi + b, GP variance), is cached by model id and weight digest, rebuilt
when corrupt or stale, and falls back to pytorch-cpu with a reason when it cannot run."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip('onnx', reason='onnx is part of the CPU install (requirements/app.in)')
pytest.importorskip('onnxruntime', reason='onnxruntime is part of the CPU install')

from uq_perception.detectors.centernet import CenterNetDetector, load_detector  # noqa: E402
from uq_perception.detectors.contract import check_linear_head  # noqa: E402
from uq_perception.ntk import LastLayerNTKGP, NTKGPConfig  # noqa: E402
from uq_perception.runtime import (
    onnx_export,  # noqa: E402 - after the skips
    onnx_runtime,
)
from uq_perception.runtime.backends import (  # noqa: E402
    BackendKind,
    OnnxRuntimeBackend,
    TorchBackend,
    create_backend,
    create_backend_with_fallback,
)
from uq_perception.runtime.onnx_runtime import OnnxRuntimeUnavailableError  # noqa: E402

REPO = Path(__file__).resolve().parents[3]
SHIPPED = REPO / 'models' / 'detector.pt'
SHIPPED_GP = REPO / 'models' / 'detector_gp.npz'


def _tiny(seed: int, model_id: str = 'tiny-model') -> CenterNetDetector:
    torch.manual_seed(seed)
    model = CenterNetDetector(['a', 'b', 'c'], embedding_dim=8, input_size=(64, 96),
                              channels=(8, 8, 8, 8), neck_channels=8, embedding_channels=8,
                              max_candidates=8).eval()
    # Untrained heads give an almost flat heatmap whose peaks tie up to round-off; wider
    # weights make the candidates distinct, as a trained model's are.
    torch.nn.init.normal_(model.box_head.weight, std=1.0)
    model.model_id = model_id
    return model


@pytest.fixture(scope='module')
def tiny_export(tmp_path_factory) -> tuple[Path, onnx_export.PreparedOnnx]:
    """The first start of ``_tiny(0)`` on an empty cache: (the cache folder, what it
    prepared). An export takes seconds; the tests that need this one file copy it into a cache
    of their own before changing anything, so it is built once for them all."""
    cache = tmp_path_factory.mktemp('tiny-cache')
    return cache, create_backend('onnxruntime', _tiny(0), onnx_cache_dir=cache).prepared


def _seeded_cache(tiny_export: tuple[Path, onnx_export.PreparedOnnx], cache: Path) -> Path:
    """``cache`` holding a copy of the shared export of ``_tiny(0)``, where the backend looks
    for it; the copy's path."""
    path = onnx_export.cached_path(_tiny(0), cache)
    path.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(tiny_export[1].path, path)
    return path


def _scene(seed: int, shape: tuple[int, int]) -> np.ndarray:
    rng = np.random.default_rng(seed)
    image = (rng.random((*shape, 3)) * 80).astype(np.uint8)
    for _ in range(5):
        y, x = rng.integers(0, shape[0] - 40), rng.integers(0, shape[1] - 40)
        image[y:y + rng.integers(15, 60), x:x + rng.integers(15, 60)] = rng.integers(
            90, 256, 3, dtype=np.uint8)
    return image


@pytest.mark.skipif(not SHIPPED.is_file(), reason='the shipped model is not in models/')
def test_shipped_model_on_onnxruntime_agrees_with_torch():
    model = load_detector(SHIPPED)
    gp = LastLayerNTKGP.load(SHIPPED_GP, feature_dim=model.embedding_dim,
                             model_id=model.model_id)
    # The test run's cache (the root conftest.py exports the shipped model into it before
    # the tests start, as a node's start would): its file is checked against torch here as on
    # every start, without a second export of the full model (seconds). Without that file
    # the backend builds it.
    backend = create_backend('onnxruntime', model, gp=gp)
    assert isinstance(backend, OnnxRuntimeBackend) and backend.backend_name == 'onnxruntime'
    agreement = backend.prepared.agreement
    assert agreement.passes() and agreement.gp_variance_difference is not None
    assert onnx_export.read_export_metadata(backend.prepared.path)['model_id'] == model.model_id
    assert backend.model_id == model.model_id and backend.feature_dim == gp.feature_dim
    reference = TorchBackend(model)
    for seed, shape in ((0, (240, 320)), (1, (480, 640)), (2, (300, 500))):
        image = _scene(seed, shape)
        ours, theirs = backend.infer(image, 0.1, 20), reference.infer(image, 0.1, 20)
        assert len(ours) == len(theirs) > 0
        np.testing.assert_allclose(ours.scores, theirs.scores, atol=1e-4)
        np.testing.assert_allclose(ours.embeddings, theirs.embeddings, atol=1e-4)
        np.testing.assert_allclose(ours.logits, theirs.logits, atol=1e-4, rtol=1e-4)
        # Boxes in pixels of the camera frame: 1e-4 of its size.
        np.testing.assert_allclose(ours.boxes, theirs.boxes, atol=1e-4 * max(shape))
        check_linear_head(backend.head(), ours.embeddings, ours.logits)
        ours_var, theirs_var = gp.gp_variance(ours.embeddings), gp.gp_variance(theirs.embeddings)
        assert (np.abs(ours_var - theirs_var) <= 1e-4 * theirs_var).all()


@pytest.mark.slow  # four exports, beside the shared one
def test_export_is_cached_by_model_and_rebuilt_when_corrupt_or_stale(tmp_path, tiny_export):
    model = _tiny(0)
    # The shared first start built the file in <cache>/onnx, named by the model id.
    shared_cache, built_first = tiny_export
    assert built_first.rebuilt == 'not built yet'
    assert built_first.path.parent == shared_cache / 'onnx'
    assert built_first.path.name.startswith('tiny-model-')
    assert built_first.path == onnx_export.cached_path(model, shared_cache)
    path = _seeded_cache(tiny_export, tmp_path)
    built = path.stat().st_mtime_ns
    again = create_backend('onnxruntime', model, onnx_cache_dir=tmp_path)
    assert again.prepared.rebuilt == '' and again.prepared.path == path
    assert path.stat().st_mtime_ns == built
    # Other weights under the same model id get a file of their own.
    other = _tiny(1)
    assert onnx_export.cached_path(other, tmp_path) != path
    # A truncated or overwritten file is rebuilt, and the rebuilt one agrees.
    path.write_bytes(path.read_bytes()[:1000])
    repaired = create_backend('onnxruntime', model, onnx_cache_dir=tmp_path)
    assert 'not a readable ONNX file' in repaired.prepared.rebuilt
    assert repaired.prepared.agreement.passes()
    # Retrained weights under the same id replace the older export; other ids stay.
    kept = create_backend('onnxruntime', _tiny(5, 'tiny-model-2'), onnx_cache_dir=tmp_path)
    newer = create_backend('onnxruntime', other, onnx_cache_dir=tmp_path)
    assert sorted(tmp_path.joinpath('onnx').iterdir()) == sorted(
        [kept.prepared.path, newer.prepared.path])
    # A file exported from other weights (the newer export), put in this model's place, is
    # found stale; its rebuild replaces the other weights' export in turn.
    shutil.copy(newer.prepared.path, path)
    assert onnx_export.read_export_metadata(path)['digest'] == \
        onnx_export.export_metadata(other)['digest']
    stale = create_backend('onnxruntime', model, onnx_cache_dir=tmp_path)
    assert stale.prepared.rebuilt.startswith('digest is ')
    assert stale.prepared.agreement.passes()
    assert onnx_export.read_export_metadata(path)['digest'] == \
        onnx_export.export_metadata(model)['digest']
    assert sorted(tmp_path.joinpath('onnx').iterdir()) == sorted([kept.prepared.path, path])


def test_cache_folder_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv(onnx_runtime.CACHE_VARIABLE, raising=False)
    monkeypatch.setenv('ROS_HOME', str(tmp_path / 'ros'))
    assert onnx_runtime.default_cache_dir() == tmp_path / 'ros' / 'uq_perception'
    monkeypatch.setenv(onnx_runtime.CACHE_VARIABLE, str(tmp_path / 'cache'))
    assert onnx_runtime.default_cache_dir() == tmp_path / 'cache'
    model = _tiny(0)
    assert onnx_export.cached_path(model).parent == tmp_path / 'cache' / 'onnx'


def test_gp_variance_is_part_of_the_check(tmp_path, tiny_export):
    model = _tiny(0)
    head = model.head
    gp = LastLayerNTKGP(head.weight.detach().numpy(), head.bias.detach().numpy(),
                        NTKGPConfig(num_experts=1), model.class_names, model.model_id)
    gp.fit(np.random.default_rng(0).normal(size=(200, 8)))
    # The cached file is checked with the GP on every start, as a fresh one is.
    _seeded_cache(tiny_export, tmp_path)
    backend = create_backend('onnxruntime', model, onnx_cache_dir=tmp_path, gp=gp)
    assert backend.prepared.rebuilt == ''
    difference = backend.prepared.agreement.gp_variance_difference
    assert difference is not None and 0 <= difference <= onnx_export.GP_VARIANCE_TOLERANCE


def test_missing_onnxruntime_falls_back_to_pytorch_cpu(monkeypatch, tmp_path):
    model = _tiny(0)
    # The import itself fails, as on a machine without the package.
    monkeypatch.setitem(sys.modules, 'onnxruntime', None)
    with pytest.raises(OnnxRuntimeUnavailableError, match='onnxruntime is not installed'):
        create_backend('onnxruntime', model, onnx_cache_dir=tmp_path)
    backend, reason = create_backend_with_fallback('onnxruntime', model,
                                                   onnx_cache_dir=tmp_path)
    assert backend.kind is BackendKind.PYTORCH_CPU and '\n' not in reason
    assert reason.startswith('backend onnxruntime unusable, running pytorch-cpu instead: '
                             'onnxruntime is not installed')


def test_disagreement_falls_back_and_a_gpu_provider_never_does(monkeypatch, tmp_path):
    model = _tiny(0)
    monkeypatch.setattr(onnx_export, 'OUTPUT_TOLERANCE', 0.0)
    with pytest.raises(onnx_export.OnnxAgreementError, match='disagrees with the torch model'):
        create_backend('onnxruntime', model, onnx_cache_dir=tmp_path)
    backend, reason = create_backend_with_fallback('onnxruntime', model,
                                                   onnx_cache_dir=tmp_path)
    assert backend.kind is BackendKind.PYTORCH_CPU and 'disagrees' in reason
    monkeypatch.undo()
    import onnxruntime

    if 'CUDAExecutionProvider' not in onnxruntime.get_available_providers():
        with pytest.raises(OnnxRuntimeUnavailableError, match='execution provider cuda'):
            create_backend_with_fallback('onnxruntime', model, onnx_provider='cuda',
                                         onnx_cache_dir=tmp_path)
