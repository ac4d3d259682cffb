"""Inference backends behind one interface: PyTorch CPU, PyTorch CUDA, TensorRT (ROS-free).

Every backend turns an RGB image into the detector's candidate tensors (``scores``,
``boxes``, ``embeddings``, ``logits``) and lets the detector's numpy ``decode`` cut them to
:class:`~uq_perception.detector.Detections`, so the uncertainty pipeline is identical
whatever runs the network.

The TensorRT backend runs an engine built on the target by :func:`build_tensorrt_engine`
(``uq build-engine``) with torch-tensorrt, in FP16. The engine also computes the NTK-GP
variance of every candidate, with the GP matrices (expert centroids and inverse
precisions) as *runtime inputs*: an online label update changes those matrices, and the
next frame uses them without rebuilding the engine. torch-tensorrt needs CUDA; it is an
optional extra (``requirements/gpu.in``), never installed on the CPU path.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
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


@dataclass(frozen=True)
class BackendOutput:
    """Detections of one image, plus the GP variance when the backend computed it.

    ``gp_variance`` and ``expert_id`` are ``(K,)`` arrays aligned with ``detections``
    (TensorRT engines compute them in the graph), or ``None`` when the caller must query
    the GP itself.
    """

    detections: Detections
    gp_variance: np.ndarray | None = None
    expert_id: np.ndarray | None = None


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
              max_detections: int) -> BackendOutput:
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
              max_detections: int) -> BackendOutput:
        images = self.model.preprocess(image_rgb).to(self._device, non_blocking=True)
        outputs = self.model(images)
        detections = self.model.decode(outputs, score_threshold, max_detections,
                                       image_sizes=[image_rgb.shape[:2]])[0]
        return BackendOutput(detections)


class DetectorWithGPVariance(torch.nn.Module):
    """The detector graph plus the NTK-GP variance of every candidate.

    ``forward(images, centroids, precision_inverse)`` returns the detector's candidate
    tensors and ``gp_variance``/``expert_id`` of each candidate embedding, computed with
    :func:`uq_perception.ntk_gp.gp_variance_torch`. The GP matrices are inputs, not
    weights, so they can change between calls of a compiled engine. The GP query runs in
    float32 even when the network runs in FP16: variances are small differences of large
    quadratic forms and lose their meaning at half precision.
    """

    def __init__(self, model: CenterNetDetector) -> None:
        super().__init__()
        self.model = model

    def forward(self, images: torch.Tensor, centroids: torch.Tensor,
                precision_inverse: torch.Tensor) -> tuple[torch.Tensor, ...]:
        from uq_perception.ntk_gp import gp_variance_torch

        out = self.model(images)
        batch, candidates, dim = out['embeddings'].shape
        variance, expert = gp_variance_torch(
            out['embeddings'].reshape(batch * candidates, dim).float(), centroids,
            precision_inverse)
        return (out['scores'].float(), out['boxes'].float(), out['embeddings'].float(),
                out['logits'].float(), variance.reshape(batch, candidates),
                expert.reshape(batch, candidates))


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


def build_tensorrt_engine(model: CenterNetDetector, gp_tensors: dict[str, torch.Tensor],
                          out_path: str | Path) -> Path:
    """Compile the detector (FP16) and the GP query with torch-tensorrt and save it.

    Parameters
    ----------
    model
        The trained detector.
    gp_tensors
        ``LastLayerNTKGP.gp_tensors()``: fixes the shapes (experts, feature dimension) of
        the runtime GP inputs; their values are supplied at every call.
    out_path
        Where to write the engine (an ExportedProgram archive). Engines are specific to
        the GPU and TensorRT version they were built with: build on the target.
    """
    torch_tensorrt = _require_tensorrt()
    device = torch.device('cuda')
    module = DetectorWithGPVariance(model.to(device).eval().half()).eval()
    height, width = model.input_size
    inputs = [torch.rand(1, 3, height, width, device=device, dtype=torch.float16),
              gp_tensors['centroids'].to(device, torch.float32),
              gp_tensors['precision_inverse'].to(device, torch.float32)]
    compiled = torch_tensorrt.compile(module, ir='dynamo', inputs=inputs,
                                      use_explicit_typing=True)
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    torch_tensorrt.save(compiled, str(out_path), inputs=inputs)
    return out_path


class TensorRTBackend(InferenceBackend):
    """Runs an engine from :func:`build_tensorrt_engine`; GP matrices are fed per call."""

    kind = BackendKind.TENSORRT

    def __init__(self, model: CenterNetDetector, engine_path: str | Path,
                 gp_tensors: dict[str, torch.Tensor]) -> None:
        super().__init__(model)
        _require_tensorrt()
        engine_path = Path(engine_path)
        if not engine_path.is_file():
            raise BackendUnavailableError(
                f'TensorRT engine {engine_path} not found; build it on this machine with '
                f'`uq build-engine --out {engine_path}`')
        self._device = torch.device('cuda')
        self._engine = torch.export.load(str(engine_path)).module()
        self.set_gp_tensors(gp_tensors)

    def set_gp_tensors(self, gp_tensors: dict[str, torch.Tensor]) -> None:
        """Use new GP matrices (after an online update) from the next frame on."""
        self._centroids = gp_tensors['centroids'].to(self._device, torch.float32)
        self._precision_inverse = gp_tensors['precision_inverse'].to(self._device,
                                                                     torch.float32)

    @property
    def device_name(self) -> str:
        return torch.cuda.get_device_name(self._device)

    @torch.inference_mode()
    def infer(self, image_rgb: np.ndarray, score_threshold: float,
              max_detections: int) -> BackendOutput:
        images = self.model.preprocess(image_rgb).to(self._device, torch.float16)
        scores, boxes, embeddings, logits, variance, expert = self._engine(
            images, self._centroids, self._precision_inverse)
        outputs = {'scores': scores, 'boxes': boxes, 'embeddings': embeddings,
                   'logits': logits}
        # decode keeps candidates by score; apply the same order to the GP outputs.
        order = torch.argsort(-scores[0], stable=True)
        keep = order[scores[0][order] >= score_threshold][:max_detections]
        detections = self.model.decode(outputs, score_threshold, max_detections,
                                       image_sizes=[image_rgb.shape[:2]])[0]
        return BackendOutput(detections,
                             gp_variance=variance[0][keep].float().cpu().numpy(),
                             expert_id=expert[0][keep].cpu().numpy())


def create_backend(kind: BackendKind | str, model: CenterNetDetector,
                   engine_path: str | Path | None = None,
                   gp_tensors: dict[str, torch.Tensor] | None = None) -> InferenceBackend:
    """Instantiate the backend ``kind`` for ``model``.

    Raises
    ------
    ValueError
        On an unknown kind, or a TensorRT request without an engine path or GP tensors.
    BackendUnavailableError
        When the machine cannot run the backend (no CUDA, no torch-tensorrt, no engine).
    """
    try:
        kind = BackendKind(kind)
    except ValueError:
        raise ValueError(f'unknown backend {kind!r}; choose one of '
                         f'{", ".join(k.value for k in BackendKind)}') from None
    if kind == BackendKind.TENSORRT:
        if engine_path is None or gp_tensors is None:
            raise ValueError('backend tensorrt needs an engine path and the GP tensors')
        return TensorRTBackend(model, engine_path, gp_tensors)
    return TorchBackend(model, kind)
