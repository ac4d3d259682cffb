"""The one ONNX Runtime runner of the product (ROS-free): sessions on a chosen provider.

Both ONNX paths use it: the ``onnxruntime`` backend of the shipped detector
(``uq_perception.runtime.onnx_export``) and the adapter for users' ONNX detectors
(``uq_perception.runtime.onnx_adapter``). The execution provider is a parameter
(:class:`ExecutionProvider`): the CPU provider runs everywhere; CUDA and TensorRT need
the ``onnxruntime-gpu`` build and their libraries. A provider that is not there is one
clear error line (:class:`OnnxRuntimeUnavailableError`), never a silent CPU fallback.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from uq_common.str_enum import StrEnum


class ExecutionProvider(StrEnum):
    """Where ONNX Runtime runs the network."""

    CPU = 'cpu'
    CUDA = 'cuda'
    TENSORRT = 'tensorrt'


#: ONNX Runtime's name of each provider.
PROVIDER_NAMES = {
    ExecutionProvider.CPU: 'CPUExecutionProvider',
    ExecutionProvider.CUDA: 'CUDAExecutionProvider',
    ExecutionProvider.TENSORRT: 'TensorrtExecutionProvider',
}
#: Most intra-op threads a session may be given.
MAX_THREADS = 64


#: Environment variable naming the cache folder of built artefacts (overrides the ROS home).
CACHE_VARIABLE = 'UQ_CACHE_DIR'


def default_cache_dir() -> Path:
    """Where built artefacts (ONNX exports, TensorRT engines of ONNX Runtime) are cached:
    ``$UQ_CACHE_DIR``, else ``$ROS_HOME/uq_perception``, else ``~/.ros/uq_perception``
    (ROS's own default home)."""
    override = os.environ.get(CACHE_VARIABLE)
    if override:
        return Path(override).expanduser()
    ros_home = os.environ.get('ROS_HOME')
    base = Path(ros_home).expanduser() if ros_home else Path.home() / '.ros'
    return base / 'uq_perception'


class OnnxRuntimeUnavailableError(RuntimeError):
    """ONNX Runtime, or the requested execution provider, cannot run here (one line why)."""


def import_onnxruntime() -> Any:
    """The ``onnxruntime`` module, or :class:`OnnxRuntimeUnavailableError` saying how to get it."""
    try:
        import onnxruntime
    except ImportError as exc:
        raise OnnxRuntimeUnavailableError(
            f'onnxruntime is not installed ({exc}); install it with '
            '`pip install -r requirements/app.in -c requirements/constraints.txt`') from exc
    return onnxruntime


def parse_provider(provider: ExecutionProvider | str) -> ExecutionProvider:
    """``provider`` as an :class:`ExecutionProvider`; ``ValueError`` naming the choices."""
    try:
        return ExecutionProvider(provider)
    except ValueError:
        choices = ', '.join(member.value for member in ExecutionProvider.__members__.values())
        raise ValueError(f'unknown execution provider {provider!r}; choose one of '
                         f'{choices}') from None


def _provider_list(provider: ExecutionProvider, trt_cache: Path) -> list:
    if provider is ExecutionProvider.CPU:
        return ['CPUExecutionProvider']
    # Nodes a GPU provider does not support run on the next one in the list.
    if provider is ExecutionProvider.CUDA:
        return ['CUDAExecutionProvider', 'CPUExecutionProvider']
    # TensorRT builds its engines on first run (minutes); the cache keeps them. FP16 as the
    # shipped detector's engines (docs/gpu_jetson.md).
    options: dict[str, Any] = {'trt_fp16_enable': True, 'trt_engine_cache_enable': True,
                               'trt_engine_cache_path': str(trt_cache)}
    return [('TensorrtExecutionProvider', options), 'CUDAExecutionProvider',
            'CPUExecutionProvider']


class OnnxRunner:
    """An ONNX Runtime inference session on one execution provider.

    Parameters
    ----------
    model : str | Path | bytes
        An ONNX file, or the serialised model.
    provider : ExecutionProvider | str
        ``cpu``, ``cuda`` or ``tensorrt``.
    threads : int
        Intra-op threads of the CPU work (1 to :data:`MAX_THREADS`).
    cache_dir : str | Path | None
        Folder whose ``tensorrt`` subfolder keeps the TensorRT provider's engines
        (``tensorrt`` only; default :func:`default_cache_dir`).

    Raises
    ------
    OnnxRuntimeUnavailableError
        When onnxruntime or the provider is missing (one line, with the available ones).
    ValueError
        On an unknown provider, a thread count out of range, or a file that is not a
        loadable ONNX model.
    """

    def __init__(self, model: str | Path | bytes,
                 provider: ExecutionProvider | str = ExecutionProvider.CPU,
                 threads: int = 1, cache_dir: str | Path | None = None) -> None:
        provider = parse_provider(provider)
        if isinstance(threads, bool) or not isinstance(threads, int) \
                or not 1 <= threads <= MAX_THREADS:
            raise ValueError(f'threads must be an integer in [1, {MAX_THREADS}], got {threads!r}')
        ort = import_onnxruntime()
        wanted = PROVIDER_NAMES[provider]
        available = ort.get_available_providers()
        if wanted not in available:
            raise OnnxRuntimeUnavailableError(
                f'execution provider {provider.value} ({wanted}) is not available in '
                f'onnxruntime {ort.__version__} (available: {", ".join(available)}); '
                + ('install onnxruntime-gpu and the CUDA/TensorRT libraries it needs'
                   if provider is not ExecutionProvider.CPU else 'reinstall onnxruntime'))
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        # Errors only: ONNX Runtime's warnings about unused initialisers and the like are
        # not the user's to act on.
        options.log_severity_level = 3
        source = model if isinstance(model, bytes) else str(model)
        if not isinstance(model, bytes) and not Path(model).is_file():
            raise ValueError(f'ONNX model file not found: {model}')
        try:
            self.session = ort.InferenceSession(
                source, options, providers=_provider_list(
                    provider, Path(cache_dir or default_cache_dir()) / 'tensorrt'))
        except Exception as exc:  # noqa: BLE001 - onnxruntime raises its own error types
            where = 'the serialised model' if isinstance(model, bytes) else str(model)
            message = str(exc).strip().splitlines()[0] if str(exc).strip() else ''
            raise ValueError(f'onnxruntime cannot load {where}: {type(exc).__name__}: '
                             f'{message}') from exc
        used = self.session.get_providers()
        if wanted not in used:
            # onnxruntime falls back to the CPU when a GPU provider's libraries do not load.
            raise OnnxRuntimeUnavailableError(
                f'execution provider {provider.value} ({wanted}) failed to start in '
                f'onnxruntime {ort.__version__} (session runs on {", ".join(used)}): its '
                'CUDA/TensorRT libraries are missing or of another version')
        self.provider = provider
        self.threads = threads
        self.onnxruntime_version = str(ort.__version__)
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.output_names = [o.name for o in self.session.get_outputs()]

    @property
    def device_name(self) -> str:
        """The provider in words, e.g. ``onnxruntime cpu (2 threads)``."""
        return f'onnxruntime {self.provider.value} ({self.threads} threads)'

    def input_shape(self, index: int = 0) -> list:
        """Declared shape of an input: ints, or strings / ``None`` for dynamic axes."""
        return list(self.session.get_inputs()[index].shape)

    def input_type(self, index: int = 0) -> str:
        """ONNX type string of an input, e.g. ``tensor(float)``."""
        return str(self.session.get_inputs()[index].type)

    def run(self, inputs: Mapping[str, np.ndarray],
            outputs: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        """Run the session; returns the requested (default: all) outputs by name."""
        names = list(outputs) if outputs is not None else self.output_names
        values = self.session.run(names, dict(inputs))
        return dict(zip(names, values, strict=True))
