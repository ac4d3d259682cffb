"""Open any contract detector from its file and settings, with its GP (ROS-free).

One entry point for the detector node and the commands that run a detector
(:func:`open_detector`): the shipped CenterNet (``model_format`` ``torch``) on one of its
backends, with the ``onnxruntime`` fallback to ``pytorch-cpu``; or a user's ONNX file
(``onnx``) through the ONNX adapter. The GP is loaded between the network and the backend,
as the GP artefact must name the detector's model id and feature dimension, and the
onnxruntime backend's check compares GP variances.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from uq_common.str_enum import StrEnum
from uq_perception.detectors.contract import DetectorContract
from uq_perception.detectors.model_files import model_format_mismatch
from uq_perception.runtime.backend_choice import BackendKind, CudaOptions, Precision
from uq_perception.runtime.onnx_adapter import OnnxAdapterConfig, OnnxDetector
from uq_perception.runtime.onnx_checked import (
    CheckedExport,
    CheckedOnnxDetector,
    read_checked_export,
    write_checked_export,
)
from uq_perception.runtime.onnx_runtime import ExecutionProvider, parse_provider

if TYPE_CHECKING:
    from uq_perception.ntk import LastLayerNTKGP

#: ``gp_loader(feature_dim, model_id)``: the GP fitted for that detector.
GpLoader = Callable[[int, str], 'LastLayerNTKGP']


class ModelFormat(StrEnum):
    """What ``model_path`` holds."""

    TORCH = 'torch'  # a detector saved by uq_perception (the shipped CenterNet)
    ONNX = 'onnx'  # any ONNX detector with a linear class head (uq_perception.runtime.onnx_adapter)


@dataclass(frozen=True)
class RuntimeSettings:
    """Where and how the network runs.

    Attributes
    ----------
    backend
        :class:`~uq_perception.runtime.backends.BackendKind`; an ONNX model runs on ``onnxruntime``.
    engine_path
        TensorRT engine (``tensorrt`` only).
    onnx_provider, onnx_threads
        ONNX Runtime execution provider and intra-op threads.
    onnx_cache_dir
        Cache folder of the shipped model's ONNX export and of ONNX Runtime's TensorRT
        engines (``None``: :func:`~uq_perception.runtime.onnx_runtime.default_cache_dir`).
    cuda
        CUDA graph, precision and GPU preprocessing of ``pytorch-cuda``; anything but the
        eager FP32 defaults is refused for another backend.
    torch_threads
        CPU threads of torch, set when a start loads the torch model (a start from a
        checked ONNX export imports no torch).

    Raises
    ------
    ValueError
        On an unknown backend or provider, or CUDA options for another backend than
        ``pytorch-cuda``.
    """

    backend: BackendKind = BackendKind.ONNXRUNTIME
    engine_path: Path | None = None
    onnx_provider: ExecutionProvider = ExecutionProvider.CPU
    onnx_threads: int = 1
    onnx_cache_dir: Path | None = None
    cuda: CudaOptions = CudaOptions()
    torch_threads: int = 1

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, 'backend', BackendKind(self.backend))
        except ValueError:
            raise ValueError(f'unknown backend {self.backend!r}; choose one of '
                             f'{", ".join(k.value for k in BackendKind)}') from None
        object.__setattr__(self, 'onnx_provider', parse_provider(self.onnx_provider))
        if self.backend is not BackendKind.PYTORCH_CUDA and not self.cuda.eager_fp32:
            raise ValueError(f'{cuda_settings(self.cuda)}: for backend pytorch-cuda only, '
                             f'the backend is {self.backend.value}')


def cuda_settings(options: CudaOptions) -> str:
    """The settings of ``options`` that leave eager FP32, as the node's parameters
    (``cuda_graph true, precision fp16``); ``eager fp32`` when none does."""
    changed = ['cuda_graph true'] if options.cuda_graph else []
    if options.precision is not Precision.FP32:
        changed.append(f'precision {options.precision.value}')
    if options.gpu_preprocess:
        changed.append('gpu_preprocess true')
    return ', '.join(changed) or 'eager fp32'


@dataclass(frozen=True)
class OpenedDetector:
    """A detector ready to run, its GP, and why its backend is not the one asked for.

    Attributes
    ----------
    detector
        The contract detector.
    gp
        The GP from ``gp_loader`` (``None`` without one).
    fallback
        One log line when ``onnxruntime`` fell back to ``pytorch-cpu``; '' otherwise.
    """

    detector: DetectorContract
    gp: LastLayerNTKGP | None
    fallback: str


@dataclass(frozen=True)
class LoadedModel:
    """A detector network read from its file, before a backend runs it.

    Attributes
    ----------
    model_format
        :class:`ModelFormat`.
    network
        The :class:`~uq_perception.detectors.centernet.CenterNetDetector` (``torch``); for
        ``torch`` on ``onnxruntime`` with a checked export of the file in the cache, that
        export's :class:`~uq_perception.runtime.onnx_checked.CheckedExport` instead (the
        torch model is read only if the GP turns out not to be checked); or the
        :class:`~uq_perception.runtime.onnx_adapter.OnnxDetector` (``onnx``, already running).
    model_path
        The file it was read from.
    """

    model_format: ModelFormat
    network: Any
    model_path: Path | None = None

    @property
    def feature_dim(self) -> int:
        """``D`` of the features ``phi``: what the GP must have been fitted on."""
        if self.model_format is ModelFormat.ONNX:
            return int(self.network.feature_dim)
        return int(self.network.embedding_dim)

    @property
    def model_id(self) -> str:
        """The identity a GP artefact of this model records."""
        return str(self.network.model_id)


def load_model(model_format: ModelFormat | str, model_path: str | Path,
               runtime: RuntimeSettings = RuntimeSettings(),
               adapter: OnnxAdapterConfig | None = None) -> LoadedModel:
    """Read the detector at ``model_path`` (an ONNX model is tapped and started here).

    Raises
    ------
    ValueError
        On an unknown format, an ONNX model asked to run on another backend than
        ``onnxruntime``, an unreadable model file, or an ONNX model given a torch archive.
    uq_perception.runtime.onnx_runtime.OnnxRuntimeUnavailableError
        When onnxruntime or the ONNX model's provider is missing.
    """
    try:
        model_format = ModelFormat(model_format)
    except ValueError:
        raise ValueError(f'model_format must be one of torch, onnx, got {model_format!r}'
                         ) from None
    if model_format is ModelFormat.ONNX:
        if runtime.backend is not BackendKind.ONNXRUNTIME:
            raise ValueError(f'an ONNX model runs on backend onnxruntime, not '
                             f'{runtime.backend.value} (choose its device with onnx_provider)')
        # A torch archive would fail as an unparsable protobuf; say which format it is.
        # (The torch reader names what it found itself.)
        mismatch = model_format_mismatch(model_path, model_format.value)
        if mismatch:
            raise ValueError(mismatch)
        return LoadedModel(model_format, OnnxDetector(
            model_path, adapter or OnnxAdapterConfig(), runtime.onnx_provider,
            runtime.onnx_threads, runtime.onnx_cache_dir))
    if runtime.backend is BackendKind.ONNXRUNTIME and \
            runtime.onnx_provider is ExecutionProvider.CPU:
        record = read_checked_export(model_path, runtime.onnx_cache_dir)
        if record is not None:
            return LoadedModel(model_format, record, Path(model_path))
    return LoadedModel(model_format, _load_torch_model(model_path, runtime), Path(model_path))


def _load_torch_model(model_path: str | Path, runtime: RuntimeSettings) -> Any:
    import torch

    from uq_perception.detectors.centernet import load_detector

    torch.set_num_threads(runtime.torch_threads)
    return load_detector(model_path)


def start_detector(loaded: LoadedModel, runtime: RuntimeSettings = RuntimeSettings(),
                   gp: LastLayerNTKGP | None = None) -> tuple[DetectorContract, str]:
    """The contract detector that runs ``loaded``, and one log line when ``onnxruntime``
    fell back to ``pytorch-cpu`` ('' otherwise).

    ``gp`` lets the onnxruntime backend's check compare GP variances with the torch model's.

    Raises
    ------
    uq_perception.runtime.backends.BackendUnavailableError
        When the requested backend cannot run here.
    uq_perception.runtime.onnx_runtime.OnnxRuntimeUnavailableError
        When a requested GPU provider of ONNX Runtime is missing.
    """
    if loaded.model_format is ModelFormat.ONNX:
        return loaded.network, ''
    network = loaded.network
    if isinstance(network, CheckedExport):
        if gp is not None and network.checked_with(gp):
            return CheckedOnnxDetector(network, runtime.onnx_threads), ''
        assert loaded.model_path is not None  # load_model records it with the export
        network = _load_torch_model(loaded.model_path, runtime)
    from uq_perception.runtime.backends import OnnxRuntimeBackend, create_backend_with_fallback

    backend, fallback = create_backend_with_fallback(
        runtime.backend, network, runtime.engine_path,
        onnx_provider=runtime.onnx_provider, onnx_threads=runtime.onnx_threads,
        onnx_cache_dir=runtime.onnx_cache_dir, gp=gp, cuda=runtime.cuda)
    if isinstance(backend, OnnxRuntimeBackend) and gp is not None and \
            runtime.onnx_provider is ExecutionProvider.CPU and loaded.model_path is not None:
        try:
            write_checked_export(loaded.model_path, network, backend.prepared.path, gp,
                                 runtime.onnx_cache_dir)
        except OSError:
            pass  # a cache that cannot be written only costs the next start its speed
    return backend, fallback


def open_detector(model_format: ModelFormat | str, model_path: str | Path,
                  runtime: RuntimeSettings = RuntimeSettings(),
                  adapter: OnnxAdapterConfig | None = None,
                  gp_loader: GpLoader | None = None) -> OpenedDetector:
    """:func:`load_model`, the GP of ``gp_loader(feature_dim, model_id)`` (it should refuse
    a GP of another model; ``None``: no GP, e.g. to extract the features a GP is fitted on),
    then :func:`start_detector`. The errors are theirs."""
    loaded = load_model(model_format, model_path, runtime, adapter)
    gp = gp_loader(loaded.feature_dim, loaded.model_id) if gp_loader else None
    detector, fallback = start_detector(loaded, runtime, gp)
    return OpenedDetector(detector, gp, fallback)


def split_names(text: str) -> tuple[str, ...]:
    """Comma-separated names (a string parameter) as a tuple; empty entries are refused.

    Raises
    ------
    ValueError
        On an empty name between commas.
    """
    if not text.strip():
        return ()
    names = tuple(part.strip() for part in text.split(','))
    if not all(names):
        raise ValueError(f'empty name in the comma-separated list {text!r}')
    return names


def adapter_config_from_parameters(values: Mapping[str, Any]) -> OnnxAdapterConfig:
    """The ONNX adapter settings of the detector node's ``onnx_*`` parameters.

    ``onnx_input_width`` and ``onnx_input_height`` are both 0 (the model's own input size)
    or both positive; list and name parameters are checked by
    :class:`~uq_perception.runtime.onnx_adapter.OnnxAdapterConfig`'s rules.

    Raises
    ------
    ValueError
        Naming the parameter that breaks a rule.
    """
    width, height = values['onnx_input_width'], values['onnx_input_height']
    if (width == 0) != (height == 0):
        raise ValueError('onnx_input_width and onnx_input_height must both be 0 (the model\'s '
                         f'input size) or both set, got {width} x {height}')
    names = {}
    for key in ('onnx_class_nodes', 'onnx_class_names'):
        try:
            names[key] = split_names(values[key])
        except ValueError as exc:
            raise ValueError(f'{key}: {exc}') from None
    mean, std = _triple(values['onnx_mean'], 'onnx_mean'), _triple(values['onnx_std'], 'onnx_std')
    try:
        # The settings' own rules name the setting; the parameter is it with onnx_ before.
        return OnnxAdapterConfig(
            layout=values['onnx_layout'], class_nodes=names['onnx_class_nodes'],
            input_size=(height, width) if width else None,
            resize=values['onnx_resize'], pad_value=values['onnx_pad_value'],
            channel_order=values['onnx_channel_order'],
            mean=mean, std=std,
            box_format=values['onnx_box_format'],
            score_activation=values['onnx_score_activation'], nms=values['onnx_nms'],
            nms_iou=values['onnx_nms_iou'], max_candidates=values['onnx_max_candidates'],
            class_names=names['onnx_class_names'])
    except ValueError as exc:
        raise ValueError(f'onnx_{exc}') from None


def _triple(values: Sequence[float], name: str) -> tuple[float, float, float]:
    if len(values) != 3:
        raise ValueError(f'{name} needs 3 values, got {len(values)}')
    return float(values[0]), float(values[1]), float(values[2])


def runtime_from_parameters(values: Mapping[str, Any]) -> RuntimeSettings:
    """The :class:`RuntimeSettings` of the detector node's parameters.

    Raises
    ------
    ValueError
        When ``cuda_graph``, ``precision`` or ``gpu_preprocess`` leave eager FP32 for
        another backend than ``pytorch-cuda`` (one line naming them and the backend).
    """
    return RuntimeSettings(
        backend=values['backend'],
        engine_path=Path(values['engine_path']) if values['engine_path'] else None,
        onnx_provider=values['onnx_provider'], onnx_threads=values['onnx_threads'],
        onnx_cache_dir=Path(values['onnx_cache_dir']).expanduser()
        if values['onnx_cache_dir'] else None,
        cuda=CudaOptions(cuda_graph=values['cuda_graph'], precision=values['precision'],
                         gpu_preprocess=values['gpu_preprocess']),
        torch_threads=values['torch_threads'])
