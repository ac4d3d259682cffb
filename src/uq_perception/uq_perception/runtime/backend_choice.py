"""Which backend runs the detector, and how the CUDA one runs it (ROS-free, and free of
torch, so the detector node reads its parameters without importing the libraries that
run the network: a start on the ONNX Runtime path needs none of them).

:mod:`uq_perception.runtime.backends` and :mod:`uq_perception.runtime.cuda_graph` use and
re-export these.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class BackendKind(str, Enum):
    """Where the detector network runs."""

    PYTORCH_CPU = 'pytorch-cpu'
    PYTORCH_CUDA = 'pytorch-cuda'
    ONNXRUNTIME = 'onnxruntime'
    TENSORRT = 'tensorrt'


#: The backend a CPU-only machine runs by default (when its ONNX export passes its checks).
DEFAULT_CPU_BACKEND = BackendKind.ONNXRUNTIME


class BackendUnavailableError(RuntimeError):
    """The requested backend cannot run on this machine; the message says why."""



class Precision(str, Enum):
    """Floating-point precision of the network on the GPU."""

    FP32 = 'fp32'
    FP16 = 'fp16'


def parse_precision(value: Precision | str) -> Precision:
    """``value`` as a :class:`Precision`; a ``ValueError`` naming the choices otherwise."""
    try:
        return Precision(value)
    except ValueError:
        raise ValueError(f'unknown precision {value!r}; choose one of '
                         f'{", ".join(p.value for p in Precision)}') from None


@dataclass(frozen=True)
class CudaOptions:
    """How the ``pytorch-cuda`` backend runs the network.

    Attributes
    ----------
    cuda_graph : bool
        Capture the network (and the GP variance) in a CUDA graph per frame size.
    precision : Precision
        ``fp32``, or ``fp16`` as the TensorRT engine.
    gpu_preprocess : bool
        Upload the raw camera frame and resize and normalise it on the GPU; otherwise the
        frame is resized on the host (OpenCV) as on the CPU path.
    """

    cuda_graph: bool = False
    precision: Precision = Precision.FP32
    gpu_preprocess: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, 'precision', parse_precision(self.precision))
        for name in ('cuda_graph', 'gpu_preprocess'):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f'{name} must be a bool, got {getattr(self, name)!r}')

    @property
    def eager_fp32(self) -> bool:
        """Whether these are the plain eager FP32 settings of :class:`~uq_perception.
        backends.TorchBackend` (no graph, FP32, host preprocessing)."""
        return not self.cuda_graph and self.precision is Precision.FP32 \
            and not self.gpu_preprocess

    def describe(self) -> str:
        """Short label, e.g. ``graph fp16 gpu-preprocess``."""
        parts = ['graph' if self.cuda_graph else 'eager', self.precision.value]
        if self.gpu_preprocess:
            parts.append('gpu-preprocess')
        return ' '.join(parts)
