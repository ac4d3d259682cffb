"""Inference backends: the CPU path runs; CUDA and TensorRT refuse clearly without a GPU
and are exercised where one is present."""

import numpy as np
import pytest
import torch

from uq_perception.detectors.centernet import CenterNetDetector
from uq_perception.runtime.backends import (
    BackendKind,
    BackendUnavailableError,
    TorchBackend,
    build_tensorrt_engine,
    create_backend,
    import_torch_tensorrt,
)

HAS_CUDA = torch.cuda.is_available()
try:
    import_torch_tensorrt()
    HAS_TENSORRT = True
except BackendUnavailableError:  # missing or broken: the CPU tests below still run
    HAS_TENSORRT = False


@pytest.fixture(scope='module')
def model():
    torch.manual_seed(0)
    return CenterNetDetector(['a', 'b', 'c'], embedding_dim=8, input_size=(64, 96),
                             channels=(8, 8, 8, 8), neck_channels=8, max_candidates=8).eval()


def _image(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (48, 80, 3), dtype=np.uint8)


def test_cpu_backend_matches_the_model_and_maps_boxes_to_the_image(model):
    backend = create_backend('pytorch-cpu', model)
    assert isinstance(backend, TorchBackend) and backend.device_name == 'cpu'
    got = backend.infer(_image(), 0.0, 5)
    expected = model.detect(_image(), 0.0, 5)
    np.testing.assert_allclose(got.boxes, expected.boxes, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(got.embeddings, expected.embeddings, rtol=1e-5, atol=1e-5)
    assert len(got) == 5
    assert (got.boxes[:, 0] <= 80).all() and (got.boxes[:, 1] <= 48).all()


def test_unknown_backend_is_a_value_error(model):
    with pytest.raises(ValueError, match='unknown backend'):
        create_backend('opencl', model)


def test_tensorrt_needs_an_engine_path(model):
    with pytest.raises(ValueError, match='engine path'):
        create_backend(BackendKind.TENSORRT, model)


@pytest.mark.skipif(HAS_CUDA, reason='checks the refusal on machines without CUDA')
@pytest.mark.parametrize('kind', [BackendKind.PYTORCH_CUDA, BackendKind.TENSORRT])
def test_gpu_backends_refuse_without_cuda(model, kind, tmp_path):
    with pytest.raises(BackendUnavailableError, match='CUDA'):
        create_backend(kind, model, engine_path=tmp_path / 'x.ep')
    if kind == BackendKind.TENSORRT:
        with pytest.raises(BackendUnavailableError, match='CUDA'):
            build_tensorrt_engine(model, tmp_path / 'x.ep')


@pytest.mark.skipif(not HAS_CUDA, reason='no CUDA GPU on this machine')
def test_cuda_backend_agrees_with_cpu(model):
    cpu = create_backend('pytorch-cpu', model).infer(_image(1), 0.0, 5)
    cuda = create_backend('pytorch-cuda', model).infer(_image(1), 0.0, 5)
    np.testing.assert_allclose(cuda.boxes, cpu.boxes, rtol=1e-3, atol=1e-2)
    model.to('cpu')


@pytest.mark.skipif(not (HAS_CUDA and HAS_TENSORRT),
                    reason='needs a CUDA GPU and torch-tensorrt (requirements/gpu.in)')
def test_tensorrt_engine_builds_with_its_metadata_and_runs(model, tmp_path):
    """Build and load only: this random model's heatmap is nearly flat, so FP16 scores
    tie and their order is arbitrary. Agreement with the CPU is checked on the shipped
    model and rendered frames in test/test_tensorrt_agreement.py."""
    from uq_perception.runtime.backends import check_engine_metadata

    path = build_tensorrt_engine(model, tmp_path / 'detector.ep')
    assert check_engine_metadata(path, model)['input_size'] == [64, 96]
    engine = create_backend('tensorrt', model, engine_path=path)
    got = engine.infer(_image(2), 0.0, 5)
    assert len(got) == 5 and np.isfinite(got.embeddings).all()


def test_engine_metadata_names_both_models_when_they_differ(model, tmp_path):
    from uq_perception.runtime.backends import (
        EngineMismatchError,
        check_engine_metadata,
        engine_metadata_path,
        write_engine_metadata,
    )

    engine = tmp_path / 'detector.ep'
    with pytest.raises(EngineMismatchError, match='has no metadata file'):
        check_engine_metadata(engine, model)
    model.model_id = 'detector-aaaa'
    write_engine_metadata(engine, model)
    assert check_engine_metadata(engine, model)['precision'] == 'fp16'
    model.model_id = 'detector-bbbb'
    try:
        with pytest.raises(EngineMismatchError,
                           match="built from model 'detector-aaaa'.*model 'detector-bbbb'"):
            check_engine_metadata(engine, model)
        write_engine_metadata(engine, model)
        sidecar = engine_metadata_path(engine)
        sidecar.write_text(sidecar.read_text().replace('64', '32'))
        with pytest.raises(EngineMismatchError, match='input_size'):
            check_engine_metadata(engine, model)
        sidecar.write_text('{not json')
        with pytest.raises(EngineMismatchError, match='unreadable'):
            check_engine_metadata(engine, model)
    finally:
        model.model_id = ''


def test_warm_up_runs_the_requested_frames(model):
    backend = create_backend('pytorch-cpu', model)
    assert backend.warm_up(0) < backend.warm_up(3) + 1.0
    assert backend.warm_up(2) > 0.0


_BROKEN_IMPORT = '''
import sys
sys.path.insert(0, sys.argv[1])
import torch
from uq_perception.runtime.backends import BackendUnavailableError, create_backend
from uq_perception.detectors.centernet import CenterNetDetector
import numpy as np
model = CenterNetDetector(['a'], embedding_dim=8, input_size=(64, 96), channels=(8, 8, 8, 8),
                          neck_channels=8, max_candidates=8).eval()
detections = create_backend('pytorch-cpu', model).infer(np.zeros((64, 96, 3), np.uint8), 0.0, 3)
print('cpu', len(detections))
from uq_perception.runtime.backends import import_torch_tensorrt
try:
    import_torch_tensorrt()
except BackendUnavailableError as exc:
    print('error', exc)
'''


@pytest.mark.parametrize('raise_line', ["raise Exception('TensorRT 10 found, 11 required')",
                                        "raise OSError('libnvinfer.so.11: cannot open')"])
def test_a_broken_torch_tensorrt_install_gives_a_clear_error(tmp_path, raise_line):
    """A real broken package on sys.path, imported in a fresh interpreter: the CPU backend
    still runs and the TensorRT import turns into a BackendUnavailableError."""
    import subprocess
    import sys

    package = tmp_path / 'site' / 'torch_tensorrt'
    package.mkdir(parents=True)
    (package / '__init__.py').write_text(raise_line + '\n')
    result = subprocess.run([sys.executable, '-c', _BROKEN_IMPORT, str(tmp_path / 'site')],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert 'cpu 3' in result.stdout
    assert 'torch-tensorrt is installed but fails to load' in result.stdout
    assert raise_line.split('(')[0].split()[-1] in result.stdout  # the exception type
