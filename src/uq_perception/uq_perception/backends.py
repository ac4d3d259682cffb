"""Inference backends behind one interface: PyTorch CPU, PyTorch CUDA, TensorRT (ROS-free).

Every backend turns an RGB image into the detector's candidate tensors (``scores``,
``boxes``, ``embeddings``, ``logits``) and lets the detector's numpy ``decode`` cut them to
:class:`~uq_perception.detector.Detections`, so the uncertainty pipeline is identical
whatever runs the network.

The TensorRT backend runs an engine built on the target by :func:`build_tensorrt_engine`
(``uq build-engine``) with torch-tensorrt, in FP16. The engine holds only the network: the
NTK-GP query runs on the host for the (at most ~20) detections of a frame, from the GP's
current matrices, so an online label update takes effect at the next frame without
rebuilding the engine (the query costs microseconds per detection: ``uq bench gp``).
torch-tensorrt needs CUDA; it is an optional extra (``requirements/gpu.in``), never
installed on the CPU path.
"""

from __future__ import annotations

import abc
from enum import Enum
from pathlib import Path

import numpy as np
import torch

from uq_perception.detector import CenterNetDetector, Detections


class BackendKind(str, Enum):
    """Where the detector network runs."""

    PYTORCH_CPU = 'pytorch-cpu'
    PYTORCH_CUDA = 'pytorch-cuda'
    TENSORRT = 'tensorrt'


class BackendUnavailableError(RuntimeError):
    """The requested backend cannot run on this machine; the message says why."""


class InferenceBackend(abc.ABC):
    """Runs the detector on one image."""

    kind: BackendKind

    def __init__(self, model: CenterNetDetector) -> None:
        self.model = model

    @property
    @abc.abstractmethod
    def device_name(self) -> str:
        """Human-readable device (for diagnostics and benchmark reports)."""

    @abc.abstractmethod
    def infer(self, image_rgb: np.ndarray, score_threshold: float,
              max_detections: int) -> Detections:
        """Detect objects in an ``(H, W, 3)`` uint8 RGB image."""


class TorchBackend(InferenceBackend):
    """PyTorch eager execution on the CPU or a CUDA device."""

    def __init__(self, model: CenterNetDetector, kind: BackendKind = BackendKind.PYTORCH_CPU
                 ) -> None:
        super().__init__(model)
        if kind == BackendKind.PYTORCH_CUDA:
            if not torch.cuda.is_available():
                raise BackendUnavailableError(
                    'backend pytorch-cuda needs a CUDA GPU and a CUDA build of torch; '
                    'torch.cuda.is_available() is False here (use pytorch-cpu)')
            self._device = torch.device('cuda')
        elif kind == BackendKind.PYTORCH_CPU:
            self._device = torch.device('cpu')
        else:
            raise ValueError(f'TorchBackend does not run {kind.value}')
        self.kind = kind
        self.model = model.to(self._device).eval()

    @property
    def device_name(self) -> str:
        if self._device.type == 'cuda':
            return torch.cuda.get_device_name(self._device)
        return 'cpu'

    @torch.inference_mode()
    def infer(self, image_rgb: np.ndarray, score_threshold: float,
              max_detections: int) -> Detections:
        images = self.model.preprocess(image_rgb).to(self._device, non_blocking=True)
        outputs = self.model(images)
        detections = self.model.decode(outputs, score_threshold, max_detections,
                                       image_sizes=[image_rgb.shape[:2]])[0]
        return detections


def _require_tensorrt():
    if not torch.cuda.is_available():
        raise BackendUnavailableError(
            'backend tensorrt needs an NVIDIA GPU with CUDA (and TensorRT); '
            'torch.cuda.is_available() is False here (use pytorch-cpu)')
    try:
        import torch_tensorrt
    except ImportError as exc:
        raise BackendUnavailableError(
            'backend tensorrt needs torch-tensorrt: pip install -r requirements/gpu.in '
            f'({exc})') from exc
    return torch_tensorrt


def build_tensorrt_engine(model: CenterNetDetector, out_path: str | Path) -> Path:
    """Compile the detector network with torch-tensorrt in FP16 and save the engine.

    Engines are specific to the GPU and TensorRT version they were built with: build on
    the target (``uq build-engine``); they are built artefacts, never committed.
    """
    torch_tensorrt = _require_tensorrt()
    device = torch.device('cuda')
    module = model.to(device).eval().half()
    height, width = model.input_size
    inputs = [torch.rand(1, 3, height, width, device=device, dtype=torch.float16)]
    compiled = torch_tensorrt.compile(module, ir='dynamo', inputs=inputs,
                                      use_explicit_typing=True)
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    torch_tensorrt.save(compiled, str(out_path), inputs=inputs)
    return out_path


class TensorRTBackend(InferenceBackend):
    """Runs an engine from :func:`build_tensorrt_engine`."""

    kind = BackendKind.TENSORRT

    def __init__(self, model: CenterNetDetector, engine_path: str | Path) -> None:
        super().__init__(model)
        _require_tensorrt()
        engine_path = Path(engine_path)
        if not engine_path.is_file():
            raise BackendUnavailableError(
                f'TensorRT engine {engine_path} not found; build it on this machine with '
                f'`uq build-engine --out {engine_path}`')
        self._device = torch.device('cuda')
        self._engine = torch.export.load(str(engine_path)).module()

    @property
    def device_name(self) -> str:
        return torch.cuda.get_device_name(self._device)

    @torch.inference_mode()
    def infer(self, image_rgb: np.ndarray, score_threshold: float,
              max_detections: int) -> Detections:
        images = self.model.preprocess(image_rgb).to(self._device, torch.float16)
        outputs = {k: v.float() for k, v in self._engine(images).items()}
        return self.model.decode(outputs, score_threshold, max_detections,
                                 image_sizes=[image_rgb.shape[:2]])[0]


def create_backend(kind: BackendKind | str, model: CenterNetDetector,
                   engine_path: str | Path | None = None) -> InferenceBackend:
    """Instantiate the backend ``kind`` for ``model``.

    Raises
    ------
    ValueError
        On an unknown kind, or a TensorRT request without an engine path.
    BackendUnavailableError
        When the machine cannot run the backend (no CUDA, no torch-tensorrt, no engine).
    """
    try:
        kind = BackendKind(kind)
    except ValueError:
        raise ValueError(f'unknown backend {kind!r}; choose one of '
                         f'{", ".join(k.value for k in BackendKind)}') from None
    if kind == BackendKind.TENSORRT:
        if engine_path is None:
            raise ValueError('backend tensorrt needs an engine path (engine_path)')
        return TensorRTBackend(model, engine_path)
    return TorchBackend(model, kind)
