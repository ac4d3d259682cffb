"""The CUDA path (uq_perception.runtime.cuda_graph): its building blocks are plain torch and are
tested here on the CPU (preprocessing against OpenCV, the GP buffers and their in-place
refresh, the captured sequence and its decode against the eager backend, and the pipeline
reading the in-graph GP variance from the backend's program run eagerly on the CPU); the
graphs and their fallback run only where CUDA exists."""

from __future__ import annotations

import logging

import cv2
import numpy as np
import pytest
import torch

from uq_perception.detectors.centernet import CenterNetDetector
from uq_perception.detectors.contract import LinearHead
from uq_perception.ntk import Gating, LastLayerNTKGP, NTKGPConfig
from uq_perception.perception import UncertaintyPerception
from uq_perception.runtime.backends import (
    BackendKind,
    BackendUnavailableError,
    CudaGraphBackend,
    TorchBackend,
    create_backend,
)
from uq_perception.runtime.cuda_graph import (
    GP_COLUMNS,
    CandidateProgram,
    CudaOptions,
    DeviceGP,
    Precision,
    decode_candidates,
    parse_precision,
    resize_normalise,
)

HAS_CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason='CUDA graphs need a CUDA GPU; '
                                'torch.cuda.is_available() is False here')
INPUT_SIZE = (64, 96)


@pytest.fixture(scope='module')
def model() -> CenterNetDetector:
    torch.manual_seed(0)
    return CenterNetDetector(['a', 'b', 'c'], embedding_dim=8, input_size=INPUT_SIZE,
                             channels=(8, 8, 8, 8), neck_channels=8, max_candidates=8).eval()


def _fitted_gp(model: CenterNetDetector, gating: Gating = Gating.KMEANS,
               experts: int = 3, seed: int = 0) -> LastLayerNTKGP:
    # One blob per class and a fifth of the labels drawn at random: without label noise
    # each expert's data would be separable and its noise variance fit to zero.
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((model.num_classes, model.embedding_dim)) * 3.0
    labels = rng.integers(0, model.num_classes, 300)
    features = centres[labels] + rng.standard_normal((300, model.embedding_dim))
    noisy = np.where(rng.random(300) < 0.2, rng.integers(0, model.num_classes, 300), labels)
    config = NTKGPConfig(num_experts=experts, gating=gating)
    gp = LastLayerNTKGP(model.head.weight.detach().double().numpy(),
                        model.head.bias.detach().double().numpy(), config,
                        model.class_names, model.model_id)
    return gp.fit(features, noisy)


def _frame(height: int, width: int, seed: int = 0) -> np.ndarray:
    # Smooth content: resizing filters disagree most on pixel noise, which no camera gives.
    noise = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    return cv2.GaussianBlur(noise, (7, 7), 2)


# ------------------------------------------------------------------ options


def test_options_validate_and_describe_themselves():
    assert CudaOptions().eager_fp32
    options = CudaOptions(cuda_graph=True, precision='fp16', gpu_preprocess=True)
    assert options.precision is Precision.FP16 and not options.eager_fp32
    assert options.describe() == 'graph fp16 gpu-preprocess'
    with pytest.raises(ValueError, match='fp32, fp16'):
        CudaOptions(precision='int8')
    with pytest.raises(ValueError, match='cuda_graph must be a bool'):
        CudaOptions(cuda_graph='yes')  # type: ignore[arg-type]
    assert parse_precision('fp32') is Precision.FP32


# ------------------------------------------------------------------ preprocessing


@pytest.mark.parametrize('height, width', [(128, 192), (320, 480), (192, 480)])
def test_gpu_resize_equals_opencv_area_for_integer_ratios(height, width):
    frame = _frame(height, width)
    reference = cv2.resize(frame, INPUT_SIZE[::-1], interpolation=cv2.INTER_AREA)
    got = resize_normalise(torch.from_numpy(frame), INPUT_SIZE)
    assert got.shape == (1, 3, *INPUT_SIZE) and got.dtype == torch.float32
    # OpenCV rounds its average to uint8; the GPU path keeps it: at most half a grey level.
    difference = np.abs(got[0].permute(1, 2, 0).numpy() * 255.0 - reference)
    assert difference.max() <= 0.5 + 1e-3


def test_gpu_resize_of_other_ratios_stays_close_to_opencv():
    frame = _frame(1080, 1920)
    reference = cv2.resize(frame, (320, 240), interpolation=cv2.INTER_AREA).astype(np.float32)
    got = resize_normalise(torch.from_numpy(frame), (240, 320))[0].permute(1, 2, 0).numpy()
    difference = np.abs(got * 255.0 - reference)
    assert difference.mean() <= 1.0 and difference.max() <= 8.0


def test_gpu_preprocessing_passes_model_sized_frames_through_and_enlarges_small_ones():
    frame = _frame(*INPUT_SIZE)
    got = resize_normalise(torch.from_numpy(frame), INPUT_SIZE, torch.float16)
    assert got.dtype == torch.float16
    expected = torch.from_numpy(frame).permute(2, 0, 1)[None].float() / 255.0
    torch.testing.assert_close(got.float(), expected, atol=1e-3, rtol=0)
    small = resize_normalise(torch.from_numpy(_frame(20, 30)), INPUT_SIZE)
    assert small.shape == (1, 3, *INPUT_SIZE) and 0.0 <= small.min() <= small.max() <= 1.0


@pytest.mark.parametrize('bad', [np.zeros((8, 8), np.uint8), np.zeros((8, 8, 4), np.uint8),
                                 np.zeros((8, 8, 3), np.float32)])
def test_gpu_preprocessing_refuses_what_is_not_an_rgb_frame(bad):
    with pytest.raises(ValueError, match=r'\(H, W, 3\) uint8'):
        resize_normalise(torch.from_numpy(bad), INPUT_SIZE)


# ------------------------------------------------------------------ GP buffers


@pytest.mark.parametrize('gating, experts', [(Gating.KMEANS, 1), (Gating.KMEANS, 3),
                                              (Gating.CLASS, 3)])
def test_device_gp_variance_equals_the_host_query(model, gating, experts):
    gp = _fitted_gp(model, gating, experts)
    head = LinearHead(model.head.weight.detach().numpy(), model.head.bias.detach().numpy())
    device_gp = DeviceGP(gp, head, torch.device('cpu'))
    features = np.random.default_rng(1).standard_normal((40, model.embedding_dim)) * 2.0
    variance, expert = device_gp.variance(torch.from_numpy(features.astype(np.float32)))
    np.testing.assert_allclose(variance.numpy(), gp.gp_variance(features), rtol=1e-4)
    np.testing.assert_array_equal(expert.numpy(), gp.predict(features).expert_id)


def test_a_taught_label_reaches_the_same_buffers_at_the_next_sync(model):
    gp = _fitted_gp(model, experts=3)
    head = LinearHead(model.head.weight.detach().numpy(), model.head.bias.detach().numpy())
    device_gp = DeviceGP(gp, head, torch.device('cpu'))
    buffers = (device_gp.centroids.data_ptr(), device_gp.precision_inverse.data_ptr())
    feature = np.full(model.embedding_dim, 3.0)
    query = torch.from_numpy(feature[None].astype(np.float32))
    before = float(device_gp.variance(query)[0][0])
    assert device_gp.sync() is False  # nothing changed
    for i in range(5):
        gp.update(feature, 0, update_id=f'label-{i}')
    # Until the sync the buffers hold the old posterior; after it the new one, in place.
    assert float(device_gp.variance(query)[0][0]) == pytest.approx(before)
    assert device_gp.sync() is True
    assert (device_gp.centroids.data_ptr(), device_gp.precision_inverse.data_ptr()) == buffers
    after = float(device_gp.variance(query)[0][0])
    assert after < 0.5 * before
    assert after == pytest.approx(float(gp.gp_variance(feature[None])[0]), rel=1e-4)
    assert device_gp.sync() is False


def test_device_gp_refuses_a_gp_of_another_shape(model):
    gp = _fitted_gp(model, experts=3)
    head = LinearHead(model.head.weight.detach().numpy(), model.head.bias.detach().numpy())
    device_gp = DeviceGP(gp, head, torch.device('cpu'))
    device_gp.gp = _fitted_gp(model, experts=2)
    with pytest.raises(ValueError, match='changed shape'):
        device_gp.sync()


# ------------------------------------------------------------------ captured sequence


@pytest.mark.parametrize('gpu_preprocess', [False, True])
def test_the_captured_sequence_decodes_to_the_eager_backends_detections(model, gpu_preprocess):
    gp = _fitted_gp(model)
    backend = TorchBackend(model)
    device_gp = DeviceGP(gp, backend.head(), torch.device('cpu'))
    program = CandidateProgram(model, INPUT_SIZE, torch.float32, gpu_preprocess, device_gp)
    widths = program.widths(model.embedding_dim, model.num_classes)
    assert len(widths) == 4 + len(GP_COLUMNS)
    for seed in range(3):
        image = _frame(*INPUT_SIZE, seed=seed)
        frame = torch.from_numpy(image) if gpu_preprocess else model.image_tensor(image)
        with torch.inference_mode():
            packed = program(frame)
        decoded = decode_candidates(model, packed, widths, image.shape[:2], 0.0, 5)
        expected = backend.infer(image, 0.0, 5)
        for field in ('boxes', 'scores', 'embeddings', 'logits'):
            np.testing.assert_allclose(getattr(decoded.detections, field),
                                       getattr(expected, field), rtol=1e-5, atol=1e-5)
        assert decoded.gp_variance is not None and decoded.expert_id is not None
        np.testing.assert_allclose(decoded.gp_variance,
                                   gp.gp_variance(expected.embeddings), rtol=1e-4)
        assert decoded.expert_id.dtype == np.int64


# The uncertainty fields the GP gives each detection, all compared to 1e-6.
UNCERTAINTY_FIELDS = ('logits', 'gp_variance', 'class_variance', 'probabilities',
                      'predictive_entropy', 'expected_entropy', 'mutual_information',
                      'out_of_distribution', 'expert_id')


def _assert_same_uncertainty(found, expected) -> None:
    for name in UNCERTAINTY_FIELDS:
        np.testing.assert_allclose(getattr(found, name), getattr(expected, name), rtol=1e-6,
                                   atol=1e-6, err_msg=name)


@pytest.mark.parametrize('gating', [Gating.KMEANS, Gating.CLASS])
@pytest.mark.parametrize('gpu_preprocess', [False, True])
def test_the_pipeline_reads_the_in_graph_variance_equal_to_the_host_query(model, gating,
                                                                          gpu_preprocess):
    gp = _fitted_gp(model, gating)
    gp.calibrate_ood(np.random.default_rng(2).standard_normal((50, model.embedding_dim)))
    # The graph backend's own program, run eagerly on the CPU: the sequence a graph replays.
    backend = CudaGraphBackend(model, CudaOptions(cuda_graph=True, gpu_preprocess=gpu_preprocess),
                               gp, device=torch.device('cpu'))
    pipeline = UncertaintyPerception(backend, gp, score_threshold=0.0, max_detections=8)
    for seed in range(3):
        image = _frame(96, 144, seed=seed)
        result = pipeline.process(image)
        assert len(result) > 0 and backend.device_gp_output() is not None
        assert backend.runner.graph_for(image.shape if gpu_preprocess
                                        else (1, 3, *INPUT_SIZE)) is None
        _assert_same_uncertainty(result.uncertainty, gp.predict(result.detections.embeddings))


def test_the_pipeline_takes_the_variance_from_the_backend_not_from_a_host_query(model):
    # The backend's program holds another GP's matrices (same shapes): the variance the
    # pipeline reports is that GP's, so it came from the backend, not from querying its own.
    gp, other = _fitted_gp(model), _fitted_gp(model, seed=5)
    backend = CudaGraphBackend(model, CudaOptions(cuda_graph=True), other,
                               device=torch.device('cpu'))
    result = UncertaintyPerception(backend, gp, 0.0, 8, duplicates=None).process(_frame(64, 96))
    embeddings = result.detections.embeddings
    np.testing.assert_allclose(result.uncertainty.gp_variance, other.gp_variance(embeddings),
                               rtol=1e-6)
    assert not np.allclose(result.uncertainty.gp_variance, gp.gp_variance(embeddings),
                           rtol=1e-3)


def test_a_gp_output_of_the_wrong_shape_or_range_is_refused(model):
    gp = _fitted_gp(model)
    features = np.zeros((2, model.embedding_dim))
    for bad, message in (((np.ones(3), np.zeros(3, np.int64)), 'must hold'),
                         ((np.array([1.0, np.nan]), np.zeros(2, np.int64)), 'finite'),
                         ((np.ones(2), np.array([0, gp.num_experts])), 'experts')):
        with pytest.raises(ValueError, match=message):
            gp.predict(features, gp_output=bad)


def test_without_a_gp_the_sequence_packs_the_candidates_only(model):
    program = CandidateProgram(model, INPUT_SIZE, torch.float32, True)
    widths = program.widths(model.embedding_dim, model.num_classes)
    image = _frame(128, 192)
    with torch.inference_mode():
        packed = program(torch.from_numpy(image))
    assert packed.shape == (1, model.max_candidates, sum(widths))
    decoded = decode_candidates(model, packed, widths, image.shape[:2], 0.0, 3)
    assert decoded.gp_variance is None and len(decoded.detections) == 3
    assert decoded.detections.boxes[:, 0].max() <= 192


def test_fp16_sequence_runs_the_network_in_half_and_packs_float32(model):
    gp = _fitted_gp(model)
    backend = TorchBackend(model)
    half = CenterNetDetector(model.class_names, embedding_dim=8, input_size=INPUT_SIZE,
                             channels=(8, 8, 8, 8), neck_channels=8, max_candidates=8)
    half.load_state_dict(model.state_dict())
    half = half.eval().half()
    program = CandidateProgram(half, INPUT_SIZE, torch.float16, True,
                               DeviceGP(gp, backend.head(), torch.device('cpu')))
    with torch.inference_mode():
        packed = program(torch.from_numpy(_frame(*INPUT_SIZE)))
    assert packed.dtype == torch.float32 and torch.isfinite(packed).all()
    assert next(half.parameters()).dtype == torch.float16


# ------------------------------------------------------------------ the backend


@pytest.mark.skipif(HAS_CUDA, reason='checks the refusal on a machine without CUDA')
def test_backend_refuses_without_cuda(model):
    with pytest.raises(BackendUnavailableError, match='graph fp16.*CUDA'):
        CudaGraphBackend(model, CudaOptions(cuda_graph=True, precision=Precision.FP16))
    with pytest.raises(BackendUnavailableError, match='eager fp32 gpu-preprocess'):
        create_backend('pytorch-cuda', model, cuda=CudaOptions(gpu_preprocess=True))


def test_cuda_options_belong_to_pytorch_cuda_only(model):
    with pytest.raises(ValueError, match='apply to backend pytorch-cuda, not pytorch-cpu'):
        create_backend('pytorch-cpu', model, cuda=CudaOptions(cuda_graph=True))
    # The eager FP32 settings are the plain backend, on any kind.
    assert isinstance(create_backend('pytorch-cpu', model, cuda=CudaOptions()), TorchBackend)


# On the GPU the variance is float32 arithmetic against the host's float64: 1e-3 leaves room
# for cancellation in phi~^T A^{-1} phi~ (1.4e-4 on the shipped GP, CPU float32).
@needs_cuda
@pytest.mark.parametrize('options', [
    CudaOptions(cuda_graph=True),
    CudaOptions(cuda_graph=True, gpu_preprocess=True),
    CudaOptions(gpu_preprocess=True),
])
def test_graph_backend_agrees_with_the_eager_cuda_backend(model, options):
    gp = _fitted_gp(model)
    reference = TorchBackend(_copy(model), BackendKind.PYTORCH_CUDA)
    graphed = CudaGraphBackend(_copy(model), options, gp)
    for seed in range(4):
        image = _frame(*INPUT_SIZE, seed=seed)
        got, expected = graphed.infer(image, 0.0, 5), reference.infer(image, 0.0, 5)
        np.testing.assert_allclose(got.boxes, expected.boxes, rtol=1e-4, atol=1e-3)
        np.testing.assert_allclose(got.embeddings, expected.embeddings, rtol=1e-4, atol=1e-4)
        assert graphed.last_frame is not None and graphed.last_frame.gp_variance is not None
        np.testing.assert_allclose(graphed.last_frame.gp_variance,
                                   gp.gp_variance(got.embeddings), rtol=1e-3)
    assert graphed.runner.graphs_active == options.cuda_graph, graphed.graph_failure
    flipped = _frame(*INPUT_SIZE, seed=9)[:, ::-1]  # negative strides
    np.testing.assert_allclose(graphed.infer(flipped, 0.0, 5).embeddings,
                               reference.infer(np.ascontiguousarray(flipped), 0.0, 5).embeddings,
                               rtol=1e-4, atol=1e-4)


@needs_cuda
def test_an_online_label_reaches_the_next_frame_with_the_graph_captured(model):
    gp = _fitted_gp(model)
    backend = CudaGraphBackend(_copy(model), CudaOptions(cuda_graph=True, gpu_preprocess=True),
                               gp)
    image = _frame(*INPUT_SIZE)
    first = backend.infer(image, 0.0, 5)
    assert backend.runner.graphs_active, backend.graph_failure
    graph = backend.runner.graph_for(image.shape)
    assert graph is not None
    before = backend.last_frame.gp_variance.copy()  # type: ignore[union-attr]
    for i in range(10):
        gp.update(first.embeddings[0], 0, update_id=f'taught-{i}')
    backend.infer(image, 0.0, 5)
    assert backend.runner.graph_for(image.shape) is graph  # replayed, not captured again
    after = backend.last_frame.gp_variance  # type: ignore[union-attr]
    assert after[0] < 0.9 * before[0]
    np.testing.assert_allclose(after, gp.gp_variance(first.embeddings), rtol=1e-3)


@needs_cuda
def test_a_failed_capture_is_logged_and_the_network_runs_eagerly(model, caplog):
    backend = CudaGraphBackend(_copy(model), CudaOptions(cuda_graph=True))
    program = backend.runner.program

    def uncapturable(frame: torch.Tensor) -> torch.Tensor:
        packed = program(frame)
        packed.sum().item()  # a host synchronisation: not allowed while capturing
        return packed

    backend.runner.program = uncapturable  # type: ignore[assignment]
    image = _frame(*INPUT_SIZE)
    with caplog.at_level(logging.WARNING, logger='uq_perception.runtime.cuda_graph'):
        got = backend.infer(image, 0.0, 5)
    assert not backend.runner.graphs_active and 'capture failed' in caplog.text
    expected = TorchBackend(_copy(model), BackendKind.PYTORCH_CUDA).infer(image, 0.0, 5)
    np.testing.assert_allclose(got.embeddings, expected.embeddings, rtol=1e-4, atol=1e-4)


def _copy(model: CenterNetDetector) -> CenterNetDetector:
    import copy

    return copy.deepcopy(model).cpu()
