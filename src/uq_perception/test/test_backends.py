"""Inference backends: the CPU path runs; CUDA and TensorRT refuse clearly without a GPU
and are exercised where one is present."""

import numpy as np
import pytest
import torch

from uq_perception.backends import (
    BackendKind,
    BackendUnavailableError,
    TorchBackend,
    build_tensorrt_engine,
    create_backend,
)
from uq_perception.detector import CenterNetDetector

HAS_CUDA = torch.cuda.is_available()
try:
    import torch_tensorrt  # noqa: F401
    HAS_TENSORRT = True
except ImportError:
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
def test_tensorrt_engine_builds_and_agrees_with_cpu(model, tmp_path):
    reference = create_backend('pytorch-cpu', model).infer(_image(2), 0.0, 5)
    path = build_tensorrt_engine(model, tmp_path / 'detector.ep')
    engine = create_backend('tensorrt', model.float(), engine_path=path)
    got = engine.infer(_image(2), 0.0, 5)
    np.testing.assert_allclose(got.boxes, reference.boxes, rtol=5e-2, atol=1.0)
