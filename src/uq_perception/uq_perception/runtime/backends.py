"""Inference backends of the shipped detector behind one interface (ROS-free): PyTorch CPU,
PyTorch CUDA, ONNX Runtime, TensorRT.

Every backend turns an RGB image into the detector's candidate tensors (``scores``,
``boxes``, ``embeddings``, ``logits``) and lets the detector's numpy ``decode`` cut them to
:class:`~uq_perception.detectors.contract.Detections`, so the uncertainty pipeline is identical
whatever runs the network. Each backend is a
:class:`~uq_perception.detectors.contract.DetectorContract`: the shipped CenterNet implements the
detector contract through them.

The ONNX Runtime backend (``onnxruntime``, the default on the CPU) runs an ONNX export of
the loaded model, built on first start, cached and checked against the torch model at
every start (``uq_perception.runtime.onnx_export``); :func:`create_backend_with_fallback` runs
``pytorch-cpu`` instead, with the reason, when onnxruntime is missing or the check fails.

``pytorch-cuda`` runs eagerly in FP32 unless :class:`~uq_perception.runtime.cuda_graph.CudaOptions`
ask for CUDA graphs (the network and the GP variance of every candidate replayed as one
graph), FP16 or preprocessing on the GPU: :mod:`uq_perception.runtime.cuda_graph`.

The TensorRT backend runs an engine built on the target by :func:`build_tensorrt_engine`
(``uq build-engine``) with torch-tensorrt, in FP16. The engine holds only the network: the
NTK-GP query runs on the host for the (at most ~20) detections of a frame, from the GP's
current matrices, so an online label update takes effect at the next frame without
rebuilding the engine (the query costs microseconds per detection: ``uq bench gp``).
torch-tensorrt needs CUDA; it is an optional extra (``requirements/gpu.in``), never
installed on the CPU path.
"""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from uq_perception.detectors.candidates import DECODED_OUTPUTS, pack_candidates
from uq_perception.detectors.centernet import CenterNetDetector, Detections, normalize_images
from uq_perception.detectors.contract import DetectorContract, LinearHead, check_rgb_image
from uq_perception.runtime.backend_choice import (  # noqa: F401 - re-exported
    DEFAULT_CPU_BACKEND,
    BackendKind,
    BackendUnavailableError,
)
from uq_perception.runtime.onnx_runtime import ExecutionProvider, OnnxRuntimeUnavailableError

if TYPE_CHECKING:
    from uq_perception.ntk import LastLayerNTKGP
    from uq_perception.runtime.cuda_graph import CudaOptions

#: Precision every engine is built in (``uq build-engine``).
ENGINE_PRECISION = 'fp16'


class EngineMismatchError(BackendUnavailableError):
    """A TensorRT engine was built from another detector (or input size, or precision)."""


class InferenceBackend(DetectorContract):
    """Runs the shipped detector on one image; the contract's fields come from its model."""

    kind: BackendKind

    def __init__(self, model: CenterNetDetector) -> None:
        self.model = model
        self._device = torch.device('cpu')

    @property
    def model_id(self) -> str:
        return self.model.model_id

    @property
    def class_names(self) -> list[str]:
        return list(self.model.class_names)

    @property
    def input_size(self) -> tuple[int, int]:
        return self.model.input_size

    @property
    def backend_name(self) -> str:
        return self.kind.value

    def head(self) -> LinearHead:
        return LinearHead(self.model.head.weight.detach().to('cpu', torch.float32).numpy(),
                          self.model.head.bias.detach().to('cpu', torch.float32).numpy())

    def synchronize(self) -> None:
        """Wait for the device's queued work, so a timer around ``infer`` measures it all."""
        if self._device.type == 'cuda':
            torch.cuda.synchronize(self._device)

    def _input_image(self, image_rgb: np.ndarray) -> torch.Tensor:
        """The model's ``(1, 3, h, w)`` uint8 input of ``image_rgb`` (resized on the host),
        its time kept in :attr:`preprocess_ms`."""
        start = time.perf_counter()
        images = self.model.image_tensor(image_rgb)
        self.preprocess_ms = (time.perf_counter() - start) * 1e3
        return images

    def _unpack(self, packed: torch.Tensor, widths: list[int], image_rgb: np.ndarray,
                score_threshold: float, max_detections: int) -> Detections:
        """Decode the packed ``(1, K, sum(widths))`` float32 host tensor."""
        parts = torch.split(packed, widths, dim=2)
        outputs = dict(zip(DECODED_OUTPUTS, parts, strict=True))
        outputs['scores'] = outputs['scores'][..., 0]
        return self.model.decode(outputs, score_threshold, max_detections,
                                 image_sizes=[image_rgb.shape[:2]])[0]


class _DeviceTransfers:
    """Pinned host staging buffers for one CUDA device: the uint8 frame goes up from a
    pinned buffer (asynchronous, a quarter of a float32 upload) and the packed candidates
    come back into one, with a single synchronisation per frame."""

    def __init__(self, device: torch.device, input_size: tuple[int, int]) -> None:
        height, width = input_size
        self.device = device
        self.upload = torch.empty((1, 3, height, width), dtype=torch.uint8, pin_memory=True)
        self.download: torch.Tensor | None = None

    def to_device(self, images_uint8: torch.Tensor) -> torch.Tensor:
        self.upload.copy_(images_uint8)
        return self.upload.to(self.device, non_blocking=True)

    def to_host(self, packed: torch.Tensor) -> torch.Tensor:
        if self.download is None or self.download.shape != packed.shape:
            self.download = torch.empty(packed.shape, dtype=packed.dtype, pin_memory=True)
        self.download.copy_(packed, non_blocking=True)
        torch.cuda.current_stream(self.device).synchronize()
        return self.download


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
        self._transfers = (_DeviceTransfers(self._device, model.input_size)
                           if self._device.type == 'cuda' else None)

    @property
    def device_name(self) -> str:
        if self._device.type == 'cuda':
            return torch.cuda.get_device_name(self._device)
        return 'cpu'

    @torch.inference_mode()
    def infer(self, image_rgb: np.ndarray, score_threshold: float,
              max_detections: int) -> Detections:
        images = self._input_image(image_rgb)
        if self._transfers is not None:
            images = self._transfers.to_device(images)
        packed, widths = pack_candidates(self.model(normalize_images(images)))
        if self._transfers is not None:
            packed = self._transfers.to_host(packed)
        return self._unpack(packed, widths, image_rgb, score_threshold, max_detections)



class CudaGraphBackend(InferenceBackend):
    """``pytorch-cuda`` with :class:`~uq_perception.runtime.cuda_graph.CudaOptions`: CUDA graphs,
    FP16, preprocessing on the GPU (:class:`uq_perception.runtime.cuda_graph.GraphRunner`).

    Parameters
    ----------
    model
        The loaded detector; it moves to the GPU in float32 (its head and ``decode`` are the
        reference); an FP16 copy runs the network when asked.
    options
        Graph, precision and preprocessing settings.
    gp
        The NTK-GP: when given, the variance of every candidate is computed on the device
        (:attr:`last_frame` holds that of the kept detections, :meth:`device_gp_output`
        gives it to the pipeline).
    device
        The CUDA device (default: the current one). A CPU device runs the same program
        eagerly, without graphs: how the in-graph GP is checked where no GPU is.

    Raises
    ------
    BackendUnavailableError
        Without a CUDA GPU (for a CUDA device).
    """

    kind = BackendKind.PYTORCH_CUDA

    def __init__(self, model: CenterNetDetector, options: CudaOptions,
                 gp: LastLayerNTKGP | None = None, device: torch.device | None = None) -> None:
        from uq_perception.runtime.cuda_graph import DecodedFrame, GraphRunner

        if (device is None or torch.device(device).type == 'cuda') \
                and not torch.cuda.is_available():
            raise BackendUnavailableError(
                f'backend pytorch-cuda ({options.describe()}) needs a CUDA GPU and a CUDA '
                'build of torch; torch.cuda.is_available() is False here (use pytorch-cpu)')
        super().__init__(model)
        self.options = options
        self._device = torch.device('cuda', torch.cuda.current_device()) if device is None \
            else torch.device(device)
        self.model = model.to(self._device).eval()
        self.runner = GraphRunner(self.model, options, self._device, gp)
        #: The last frame's detections with the device GP variance of each.
        self.last_frame: DecodedFrame | None = None

    @property
    def device_name(self) -> str:
        if self._device.type != 'cuda':
            return self._device.type
        return torch.cuda.get_device_name(self._device)

    @property
    def graph_failure(self) -> str:
        """Why CUDA graphs are not used ('' while they are, or when not asked for)."""
        return self.runner.graph_failure

    def infer(self, image_rgb: np.ndarray, score_threshold: float,
              max_detections: int) -> Detections:
        from uq_perception.runtime.cuda_graph import decode_candidates

        check_rgb_image(image_rgb)
        # The raw frame for the GPU to resize, or the frame resized on the host.
        source = image_rgb if self.options.gpu_preprocess \
            else self._input_image(image_rgb).numpy()
        self.last_frame = decode_candidates(self.model, self.runner.run(source),
                                            self.runner.widths, image_rgb.shape[:2],
                                            score_threshold, max_detections)
        return self.last_frame.detections

    def device_gp_output(self) -> tuple[np.ndarray, np.ndarray] | None:
        frame = self.last_frame
        if frame is None or frame.gp_variance is None or frame.expert_id is None:
            return None
        return frame.gp_variance, frame.expert_id


def _require_tensorrt():
    if not torch.cuda.is_available():
        raise BackendUnavailableError(
            'backend tensorrt needs an NVIDIA GPU with CUDA (and TensorRT); '
            'torch.cuda.is_available() is False here (use pytorch-cpu)')
    return import_torch_tensorrt()


def import_torch_tensorrt():
    """Import torch-tensorrt, turning every way its import fails into a clear
    :class:`BackendUnavailableError`: a missing package (``ImportError``), but also a
    broken install, whose import raises ``OSError`` (a shared library that does not load)
    or a bare ``Exception`` (torch-tensorrt's own check of the TensorRT/CUDA versions)."""
    try:
        import torch_tensorrt
    except ImportError as exc:
        raise BackendUnavailableError(
            'backend tensorrt needs torch-tensorrt, which is not installed: see '
            f'docs/gpu_jetson.md (pip install -r requirements/gpu.in) ({exc})') from exc
    except Exception as exc:  # noqa: BLE001 - any failure of a broken GPU stack
        raise BackendUnavailableError(
            'backend tensorrt: torch-tensorrt is installed but fails to load '
            f'({type(exc).__name__}: {exc}); its torch, CUDA and TensorRT versions must '
            'match (docs/gpu_jetson.md)') from exc
    return torch_tensorrt


def engine_metadata_path(engine_path: str | Path) -> Path:
    """The JSON file next to an engine that names the model it was built from."""
    engine_path = Path(engine_path)
    return engine_path.with_name(engine_path.name + '.json')


def engine_metadata(model: CenterNetDetector, precision: str = ENGINE_PRECISION) -> dict:
    """What an engine must agree on with the detector and GP it runs for."""
    return {'model_id': getattr(model, 'model_id', '') or '',
            'input_size': [int(v) for v in model.input_size],
            'precision': precision}


def write_engine_metadata(engine_path: str | Path, model: CenterNetDetector,
                          precision: str = ENGINE_PRECISION) -> Path:
    """Write the sidecar of :func:`engine_metadata_path` for ``model``."""
    path = engine_metadata_path(engine_path)
    path.write_text(json.dumps(engine_metadata(model, precision), indent=2) + '\n')
    return path


def check_engine_metadata(engine_path: str | Path, model: CenterNetDetector) -> dict:
    """Refuse an engine that was not built from ``model`` (``EngineMismatchError`` naming
    both model ids), has another input size or precision, or has no readable sidecar.

    An engine of another ``detector.pt`` would run, but its embeddings would not be the
    ones the NTK-GP was fitted for, so every variance would silently be wrong.
    """
    path = engine_metadata_path(engine_path)
    try:
        found = json.loads(path.read_text())
    except FileNotFoundError:
        raise EngineMismatchError(
            f'TensorRT engine {engine_path} has no metadata file {path}: rebuild it with '
            f'`uq build-engine --out {engine_path}`') from None
    except (OSError, ValueError) as exc:
        raise EngineMismatchError(f'TensorRT engine metadata {path} is unreadable: {exc}'
                                  ) from exc
    if not isinstance(found, dict):
        raise EngineMismatchError(f'TensorRT engine metadata {path} is not a JSON object')
    expected = engine_metadata(model)
    if found.get('model_id') != expected['model_id']:
        raise EngineMismatchError(
            f'TensorRT engine {engine_path} was built from model {found.get("model_id")!r}, '
            f'but the detector is model {expected["model_id"]!r}: rebuild the engine with '
            f'`uq build-engine --out {engine_path}`')
    for key in ('input_size', 'precision'):
        if found.get(key) != expected[key]:
            raise EngineMismatchError(
                f'TensorRT engine {engine_path} has {key} {found.get(key)!r}, the detector '
                f'{expected["model_id"]!r} needs {expected[key]!r}: rebuild the engine')
    return found


def build_tensorrt_engine(model: CenterNetDetector, out_path: str | Path) -> Path:
    """Compile the detector network with torch-tensorrt in FP16 and save the engine, with
    the sidecar of :func:`write_engine_metadata` (model id, input size, precision).

    Engines are specific to the GPU and TensorRT version they were built with: build on
    the target (``uq build-engine``); they are built artefacts, never committed.
    """
    torch_tensorrt = _require_tensorrt()
    device = torch.device('cuda')
    module = copy.deepcopy(model).to(device).eval().half()  # the caller's model stays float
    height, width = model.input_size
    inputs = [torch.rand(1, 3, height, width, device=device, dtype=torch.float16)]
    compiled = torch_tensorrt.compile(module, ir='dynamo', inputs=inputs,
                                      use_explicit_typing=True)
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    torch_tensorrt.save(compiled, str(out_path), inputs=inputs)
    write_engine_metadata(out_path, model)
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
        check_engine_metadata(engine_path, model)
        self._device = torch.device('cuda')
        try:
            self._engine = torch.export.load(str(engine_path)).module()
        except Exception as exc:  # noqa: BLE001 - a corrupt file or a TensorRT/GPU mismatch
            raise BackendUnavailableError(
                f'TensorRT engine {engine_path} does not load ({type(exc).__name__}: {exc}); '
                'engines are specific to the GPU and TensorRT version: rebuild it on this '
                f'machine with `uq build-engine --out {engine_path}`') from exc
        self._transfers = _DeviceTransfers(self._device, model.input_size)

    @property
    def device_name(self) -> str:
        return torch.cuda.get_device_name(self._device)

    @torch.inference_mode()
    def infer(self, image_rgb: np.ndarray, score_threshold: float,
              max_detections: int) -> Detections:
        images = self._transfers.to_device(self._input_image(image_rgb))
        packed, widths = pack_candidates(self._engine(normalize_images(images, torch.float16)))
        packed = self._transfers.to_host(packed)
        return self._unpack(packed, widths, image_rgb, score_threshold, max_detections)


class OnnxRuntimeBackend(InferenceBackend):
    """Runs the ONNX export of the model on ONNX Runtime (``uq_perception.runtime.onnx_export``).

    Parameters
    ----------
    model
        The loaded detector; its export is taken from the cache or built.
    provider
        ONNX Runtime execution provider (``cpu``, ``cuda``, ``tensorrt``).
    threads
        Intra-op CPU threads.
    cache_dir
        Cache folder of the export
        (default :func:`uq_perception.runtime.onnx_runtime.default_cache_dir`).
    gp
        The NTK-GP the detections will be queried with: the check then also compares the GP
        variance of the export's embeddings with the torch model's.

    Raises
    ------
    uq_perception.runtime.onnx_runtime.OnnxRuntimeUnavailableError
        When onnxruntime, onnx or the provider is missing.
    uq_perception.runtime.onnx_export.OnnxExportError
        When the export fails or disagrees with the torch model.
    """

    kind = BackendKind.ONNXRUNTIME

    def __init__(self, model: CenterNetDetector,
                 provider: ExecutionProvider | str = ExecutionProvider.CPU, threads: int = 1,
                 cache_dir: str | Path | None = None, gp: LastLayerNTKGP | None = None) -> None:
        from uq_perception.runtime.onnx_export import INPUT_NAME, OUTPUT_NAME, prepare_onnx

        super().__init__(model.to('cpu').eval())
        self.prepared = prepare_onnx(self.model, provider, threads, cache_dir, gp)
        self._runner = self.prepared.runner
        self._names = (INPUT_NAME, [OUTPUT_NAME])
        d, c = model.embedding_dim, model.num_classes
        self._widths = [1, 4, d, c]
        # The session reads a contiguous (1, 3, h, w) image: filled in place frame after frame.
        self._input = np.empty((1, 3, *model.input_size), np.uint8)

    @property
    def device_name(self) -> str:
        return self._runner.device_name

    def infer(self, image_rgb: np.ndarray, score_threshold: float,
              max_detections: int) -> Detections:
        start = time.perf_counter()
        np.copyto(self._input, self.model.image_tensor(image_rgb).numpy())
        self.preprocess_ms = (time.perf_counter() - start) * 1e3
        input_name, outputs = self._names
        packed = self._runner.run({input_name: self._input}, outputs)[outputs[0]]
        return self._unpack(torch.from_numpy(packed), self._widths, image_rgb,
                            score_threshold, max_detections)


def create_backend(kind: BackendKind | str, model: CenterNetDetector,
                   engine_path: str | Path | None = None, *,
                   onnx_provider: ExecutionProvider | str = ExecutionProvider.CPU,
                   onnx_threads: int = 1, onnx_cache_dir: str | Path | None = None,
                   gp: LastLayerNTKGP | None = None,
                   cuda: CudaOptions | None = None) -> InferenceBackend:
    """Instantiate the backend ``kind`` for ``model``.

    Parameters
    ----------
    kind
        One of :class:`BackendKind`.
    model
        The loaded detector.
    engine_path
        TensorRT engine (``tensorrt`` only).
    onnx_provider, onnx_threads, onnx_cache_dir, gp
        Settings of the ``onnxruntime`` backend (see :class:`OnnxRuntimeBackend`).
    cuda
        CUDA graph, precision and GPU preprocessing of ``pytorch-cuda``
        (:class:`uq_perception.runtime.cuda_graph.CudaOptions`); with any of them set, ``gp`` is the
        GP whose variance the graph computes. ``None``: eager FP32.

    Raises
    ------
    ValueError
        On an unknown kind, a TensorRT request without an engine path, or CUDA options for
        another backend than ``pytorch-cuda``.
    BackendUnavailableError
        When the machine cannot run the backend (no CUDA, no torch-tensorrt, no engine).
    uq_perception.runtime.onnx_runtime.OnnxRuntimeUnavailableError
        When ``onnxruntime`` lacks the package or the provider.
    uq_perception.runtime.onnx_export.OnnxExportError
        When the ONNX export fails its checks.
    """
    try:
        kind = BackendKind(kind)
    except ValueError:
        raise ValueError(f'unknown backend {kind!r}; choose one of '
                         f'{", ".join(k.value for k in BackendKind)}') from None
    if cuda is not None and not cuda.eager_fp32:
        if kind != BackendKind.PYTORCH_CUDA:
            raise ValueError(f'CUDA options ({cuda.describe()}) apply to backend pytorch-cuda, '
                             f'not {kind.value}')
        return CudaGraphBackend(model, cuda, gp)
    if kind == BackendKind.TENSORRT:
        if engine_path is None:
            raise ValueError('backend tensorrt needs an engine path (engine_path)')
        return TensorRTBackend(model, engine_path)
    if kind == BackendKind.ONNXRUNTIME:
        return OnnxRuntimeBackend(model, onnx_provider, onnx_threads, onnx_cache_dir, gp)
    return TorchBackend(model, kind)


def create_backend_with_fallback(kind: BackendKind | str, model: CenterNetDetector,
                                 engine_path: str | Path | None = None, *,
                                 onnx_provider: ExecutionProvider | str = ExecutionProvider.CPU,
                                 onnx_threads: int = 1,
                                 onnx_cache_dir: str | Path | None = None,
                                 gp: LastLayerNTKGP | None = None,
                                 cuda: CudaOptions | None = None
                                 ) -> tuple[InferenceBackend, str]:
    """:func:`create_backend`, except that ``onnxruntime`` on the CPU provider falls back to
    ``pytorch-cpu`` when onnxruntime is missing or the export fails its checks.

    Returns
    -------
    tuple[InferenceBackend, str]
        The backend, and why it is not the one asked for ('' when it is): one line for
        the log.
    """
    from uq_perception.runtime.onnx_export import OnnxExportError
    from uq_perception.runtime.onnx_runtime import parse_provider

    try:
        return create_backend(kind, model, engine_path, onnx_provider=onnx_provider,
                              onnx_threads=onnx_threads, onnx_cache_dir=onnx_cache_dir,
                              gp=gp, cuda=cuda), ''
    except (OnnxRuntimeUnavailableError, OnnxExportError) as exc:
        # A GPU provider is an explicit choice: its absence is an error, not a fallback.
        if parse_provider(onnx_provider) is not ExecutionProvider.CPU:
            raise
        reason = ' '.join(str(exc).split())
        return TorchBackend(model, BackendKind.PYTORCH_CPU), (
            f'backend onnxruntime unusable, running pytorch-cpu instead: {reason}')
