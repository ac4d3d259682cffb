"""The CUDA path of the shipped detector (ROS-free): one CUDA graph per camera frame size
holds the preprocessing, the network and the NTK-GP variance of every candidate.

A 1 MB network at 320x240 is hundreds of small kernels; launched one by one from Python
the GPU idles most of each frame. Captured once in a CUDA graph on static buffers and
replayed per frame, the whole sequence is one launch. Per frame :class:`GraphRunner`

1. copies the raw ``(H, W, 3)`` uint8 camera frame into a pinned host buffer and uploads it
   asynchronously (a quarter of the bytes of a float32 image);
2. replays the graph: resize to the network input and normalisation on the GPU
   (:func:`resize_normalise`), the network, the top-K candidates, and the GP variance of
   every candidate from the GP's matrices held in device buffers (:class:`DeviceGP`);
3. downloads the packed candidates (one row per candidate: score, box, ``phi``, logits, GP
   variance, expert) into pinned memory, with one synchronisation; the backend
   (``backends.CudaGraphBackend``) decodes them on the host with the detector's own
   ``decode`` (:func:`decode_candidates`).

An online label update changes the GP's matrices, not the graph: :meth:`DeviceGP.sync`
copies them into the same device buffers before each replay when they changed, so the next
frame uses them without a new capture. When a capture fails (a driver or an operation that
cannot be captured) the runner logs why and runs the same sequence eagerly.

Precision follows the TensorRT engine's rule (``backends.ENGINE_PRECISION``): in ``fp16``
the network's weights and input are float16; its outputs are read as float32. The GP
variance is computed in float64, as on the host: ``phi~^T A^{-1} phi~`` is a small
difference of large terms that float32 would round to a few digits, and the pipeline reads
this variance in place of the host query (it reaches the host in float32, to 1e-7
relative).

The building blocks (:func:`resize_normalise`, :class:`DeviceGP`, :class:`CandidateProgram`,
:func:`decode_candidates`) are plain torch and run on any device, so their logic is tested
on the CPU; :class:`GraphRunner` captures graphs on CUDA and runs the same program eagerly on
a CPU device, which is how the pipeline's use of the in-graph GP variance is tested without
a GPU. This module does not import
``uq_perception.runtime.backends``: the backend there builds on it.
"""

from __future__ import annotations

import copy
import logging
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F

from uq_perception.detectors.candidates import pack_candidates
from uq_perception.detectors.centernet import CenterNetDetector, normalize_images
from uq_perception.detectors.contract import Detections, LinearHead
from uq_perception.ntk import Gating, gp_variance_torch
from uq_perception.runtime.backend_choice import (  # noqa: F401 - re-exported
    CudaOptions,
    Precision,
    parse_precision,
)

if TYPE_CHECKING:
    from uq_perception.ntk import LastLayerNTKGP

logger = logging.getLogger(__name__)

#: Frame sizes whose graphs are kept at once. A camera keeps its size, so a new size is rare
#: (a reconfigured driver); beyond this the least recently used graph is dropped.
MAX_CAPTURED_SIZES = 4
#: Eager runs on a side stream before a capture: lazy initialisation (cuDNN's choice of
#: algorithms, the caching allocator's first blocks) must not happen inside the graph.
CAPTURE_WARMUP_RUNS = 3
#: Columns after the candidate tensors when a GP is attached: its variance and the expert.
GP_COLUMNS = ('gp_variance', 'expert_id')


def resize_normalise(frame: torch.Tensor, input_size: tuple[int, int],
                     dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """An ``(H, W, 3)`` uint8 RGB frame, on any device, as the network's ``(1, 3, h, w)``
    input in ``[0, 1]`` of ``dtype``.

    Shrinking averages the source pixels each output pixel covers (area interpolation): for
    integer ratios (640x480, 1280x720 to 320x240) that is OpenCV's ``INTER_AREA`` of the
    host path, up to its rounding to uint8; for other ratios the windows differ slightly
    (about 0.6 grey levels on average from 1920x1080). Enlarging is bilinear. The
    arithmetic is float32 whatever ``dtype`` is.

    Raises
    ------
    ValueError
        If ``frame`` is not an ``(H, W, 3)`` uint8 tensor.
    """
    if frame.dtype != torch.uint8 or frame.ndim != 3 or frame.shape[2] != 3:
        raise ValueError(f'frame must be an (H, W, 3) uint8 tensor, got {frame.dtype} '
                         f'{tuple(frame.shape)}')
    height, width = input_size
    images = frame.permute(2, 0, 1).unsqueeze(0).float()
    if tuple(frame.shape[:2]) != (height, width):
        shrinking = frame.shape[0] >= height and frame.shape[1] >= width
        if shrinking:
            images = F.interpolate(images, size=(height, width), mode='area')
        else:
            images = F.interpolate(images, size=(height, width), mode='bilinear',
                                   align_corners=False)
    return images.div_(255.0).to(dtype)


class DeviceGP:
    """The NTK-GP's gating centroids and posterior covariances ``A_m^{-1}`` in float64 device
    buffers.

    A captured graph reads these buffers; :meth:`sync` refreshes their contents in place
    from the GP (never reallocating them), so a label taught online reaches the next replay
    without a new capture.

    Parameters
    ----------
    gp
        The fitted NTK-GP whose variance is computed.
    head
        The network's classification head; class gating routes a candidate to the expert
        of its predicted class, computed in float64 from this head as the GP does.
    device
        Where the buffers live.
    """

    def __init__(self, gp: LastLayerNTKGP, head: LinearHead, device: torch.device) -> None:
        if head.feature_dim != gp.feature_dim:
            raise ValueError(f'the head has {head.feature_dim} features, the GP '
                             f'{gp.feature_dim}')
        self.gp = gp
        self.device = torch.device(device)
        self.class_gating = gp.config.gating is Gating.CLASS
        snapshot = gp.gp_tensors(torch.float64)
        pin = self.device.type == 'cuda'
        # Normal (not inference-mode) tensors, so that sync() may update them anywhere.
        with torch.inference_mode(False):
            self._host = {name: torch.empty(t.shape, dtype=t.dtype, pin_memory=pin)
                          for name, t in snapshot.items()}
            self.centroids = torch.empty(snapshot['centroids'].shape, dtype=torch.float64,
                                         device=self.device)
            self.precision_inverse = torch.empty(snapshot['precision_inverse'].shape,
                                                 dtype=torch.float64, device=self.device)
            self.head_weight = torch.as_tensor(head.weight, dtype=torch.float64,
                                               device=self.device).clone()
            self.head_bias = torch.as_tensor(head.bias, dtype=torch.float64,
                                             device=self.device).clone()
        self._copy_in(snapshot)

    def _copy_in(self, snapshot: dict[str, torch.Tensor]) -> None:
        with torch.no_grad():
            for name, tensor in snapshot.items():
                self._host[name].copy_(tensor)
            # Blocking copies: they happen only when the GP changed (a taught label), and
            # the pinned staging buffers may then be reused at once.
            self.centroids.copy_(self._host['centroids'])
            self.precision_inverse.copy_(self._host['precision_inverse'])

    def sync(self) -> bool:
        """Copy the GP's current matrices into the buffers if they changed.

        Costs one float64 snapshot of the GP (``O(M D^2)``, taken under its lock, so it is
        consistent with a label applied from another thread) and a comparison per call.

        Returns
        -------
        bool
            Whether the buffers were updated.

        Raises
        ------
        ValueError
            If the GP's matrices changed shape (another GP): the buffers cannot hold them.
        """
        snapshot = self.gp.gp_tensors(torch.float64)
        for name, tensor in snapshot.items():
            if tensor.shape != self._host[name].shape:
                raise ValueError(f'the GP\'s {name} changed shape from '
                                 f'{tuple(self._host[name].shape)} to {tuple(tensor.shape)}: '
                                 'build the backend again for this GP')
        if all(torch.equal(tensor, self._host[name]) for name, tensor in snapshot.items()):
            return False
        self._copy_in(snapshot)
        return True

    def variance(self, embeddings: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(K,)`` float64 GP variance and int64 expert of ``(K, D)`` embeddings.

        No data-dependent control flow and no host synchronisation: it can be captured.
        """
        features = embeddings.double()
        expert = None
        if self.class_gating:
            logits = features @ self.head_weight.T + self.head_bias
            expert = logits.argmax(1)
        return gp_variance_torch(features, self.centroids, self.precision_inverse, expert)


class CandidateProgram:
    """Frame in, packed candidates out: the sequence a CUDA graph captures.

    Parameters
    ----------
    network
        The detector in the precision it runs in (its ``forward`` gives the candidates).
    input_size
        Network input ``(height, width)``.
    dtype
        The network's floating-point type.
    gpu_preprocess
        The input is the raw ``(H, W, 3)`` uint8 frame (resized here); otherwise it is the
        ``(1, 3, h, w)`` uint8 image already resized on the host.
    device_gp
        When given, the GP variance and expert of every candidate are appended
        (:data:`GP_COLUMNS`).
    """

    def __init__(self, network: CenterNetDetector, input_size: tuple[int, int],
                 dtype: torch.dtype, gpu_preprocess: bool,
                 device_gp: DeviceGP | None = None) -> None:
        self.network = network
        self.input_size = input_size
        self.dtype = dtype
        self.gpu_preprocess = gpu_preprocess
        self.device_gp = device_gp

    def widths(self, embedding_dim: int, num_classes: int) -> list[int]:
        """Column widths of the packed rows: score, box, ``phi``, logits (then GP columns)."""
        widths = [1, 4, embedding_dim, num_classes]
        return widths + [1] * len(GP_COLUMNS) if self.device_gp is not None else widths

    def __call__(self, frame: torch.Tensor) -> torch.Tensor:
        """``(1, K, sum(widths))`` float32 packed candidates of one frame."""
        if self.gpu_preprocess:
            images = resize_normalise(frame, self.input_size, self.dtype)
        else:
            images = normalize_images(frame, self.dtype)
        outputs = self.network(images)
        packed, _ = pack_candidates(outputs)
        if self.device_gp is None:
            return packed
        variance, expert = self.device_gp.variance(outputs['embeddings'][0])
        return torch.cat([packed, variance.reshape(1, -1, 1).float(),
                          expert.reshape(1, -1, 1).float()], dim=2)


@dataclass(frozen=True)
class DecodedFrame:
    """A frame's detections and, when the GP ran on the device, their GP variance.

    Attributes
    ----------
    detections
        As :meth:`CenterNetDetector.decode` cuts them.
    gp_variance
        ``(K,)`` float32 variance of each kept detection, or ``None`` without a device GP.
    expert_id
        ``(K,)`` int64 expert of each kept detection, or ``None``.
    """

    detections: Detections
    gp_variance: np.ndarray | None
    expert_id: np.ndarray | None


def decode_candidates(model: CenterNetDetector, packed: torch.Tensor, widths: list[int],
                      image_size: tuple[int, int], score_threshold: float,
                      max_detections: int) -> DecodedFrame:
    """Cut packed candidates (``(1, K, sum(widths))`` on the host) to a frame's detections.

    The GP columns ride along with the embedding rows through ``model.decode``, so they
    are kept, dropped and ordered exactly as the detections are.
    """
    parts = torch.split(packed, widths, dim=2)
    scores, boxes, embeddings, logits = parts[:4]
    extra = parts[4:]
    outputs = {'scores': scores[..., 0], 'boxes': boxes,
               'embeddings': torch.cat([embeddings, *extra], dim=2), 'logits': logits}
    decoded = model.decode(outputs, score_threshold, max_detections,
                           image_sizes=[image_size])[0]
    d = embeddings.shape[2]
    detections = Detections(decoded.boxes, decoded.scores,
                            np.ascontiguousarray(decoded.embeddings[:, :d]), decoded.logits)
    if not extra:
        return DecodedFrame(detections, None, None)
    return DecodedFrame(detections, decoded.embeddings[:, d].copy(),
                        decoded.embeddings[:, d + 1].astype(np.int64))


class _FrameSlot:
    """Static buffers (pinned host input, device input) and the graph of one input shape."""

    def __init__(self, host: torch.Tensor, device_input: torch.Tensor) -> None:
        self.host = host
        self.device_input = device_input
        self.graph: torch.cuda.CUDAGraph | None = None
        self.output: torch.Tensor | None = None


class GraphRunner:
    """Runs a :class:`CandidateProgram` on a CUDA device, one frame at a time: pinned
    upload, the GP buffers refreshed, graph replay (or the eager program), pinned download.

    One graph is captured per input shape, on that shape's first frame (which pays for
    the capture); at most :data:`MAX_CAPTURED_SIZES` are kept.

    Parameters
    ----------
    model
        The float32 detector on ``device``: its head routes class gating and is the GP's.
    options
        Graph, precision and preprocessing settings.
    device
        The CUDA device; on a CPU device the program runs eagerly (no graph, no pinned
        memory).
    gp
        The NTK-GP whose variance the program computes for every candidate, or ``None``.
    """

    def __init__(self, model: CenterNetDetector, options: CudaOptions, device: torch.device,
                 gp: LastLayerNTKGP | None = None) -> None:
        self.options = options
        self.device = torch.device(device)
        self._cuda = self.device.type == 'cuda'
        dtype = torch.float16 if options.precision is Precision.FP16 else torch.float32
        # The caller's model stays float32: its head is the GP's.
        network = copy.deepcopy(model).half() if dtype == torch.float16 else model
        head = LinearHead(model.head.weight.detach().to('cpu', torch.float32).numpy(),
                          model.head.bias.detach().to('cpu', torch.float32).numpy())
        self.device_gp = DeviceGP(gp, head, device) if gp is not None else None
        self.program = CandidateProgram(network, model.input_size, dtype,
                                        options.gpu_preprocess, self.device_gp)
        self.widths = self.program.widths(model.embedding_dim, model.num_classes)
        self._slots: OrderedDict[tuple[int, ...], _FrameSlot] = OrderedDict()
        self._download: torch.Tensor | None = None
        #: Why graphs are not used ('' while they are, or when not asked for).
        self.graph_failure = ''

    @property
    def graphs_active(self) -> bool:
        """Whether new input shapes are captured (asked for, on CUDA, and no capture
        failed)."""
        return self.options.cuda_graph and self._cuda and not self.graph_failure

    def graph_for(self, shape: tuple[int, ...]) -> torch.cuda.CUDAGraph | None:
        """The captured graph of an input shape, if any."""
        slot = self._slots.get(tuple(shape))
        return None if slot is None else slot.graph

    @torch.inference_mode()
    def run(self, source: np.ndarray) -> torch.Tensor:
        """Packed candidates (``(1, K, sum(widths))`` float32, pinned host memory, valid
        until the next call) of one input: the raw ``(H, W, 3)`` uint8 frame with GPU
        preprocessing, else the host-resized ``(1, 3, h, w)`` uint8 image."""
        slot = self._slot(source)
        # copyto takes any strides (a flipped or cropped view) straight into pinned memory.
        np.copyto(slot.host.numpy(), source)
        slot.device_input.copy_(slot.host, non_blocking=True)
        if self.device_gp is not None:
            self.device_gp.sync()
        if slot.graph is not None:
            slot.graph.replay()
            packed = slot.output
            assert packed is not None  # captured with the graph
        else:
            packed = self.program(slot.device_input)
        if self._download is None or self._download.shape != packed.shape:
            self._download = torch.empty(packed.shape, dtype=packed.dtype,
                                         pin_memory=self._cuda)
        self._download.copy_(packed, non_blocking=True)
        if self._cuda:
            torch.cuda.current_stream(self.device).synchronize()
        return self._download

    def _slot(self, source: np.ndarray) -> _FrameSlot:
        key = tuple(source.shape)
        slot = self._slots.get(key)
        if slot is not None:
            self._slots.move_to_end(key)
            return slot
        if len(self._slots) >= MAX_CAPTURED_SIZES:
            self._slots.popitem(last=False)
        slot = _FrameSlot(torch.empty(key, dtype=torch.uint8, pin_memory=self._cuda),
                          torch.empty(key, dtype=torch.uint8, device=self.device))
        # The capture's warm-up runs on this frame.
        np.copyto(slot.host.numpy(), source)
        slot.device_input.copy_(slot.host)
        if self.graphs_active:
            self._capture(slot, key)
        self._slots[key] = slot
        return slot

    def _capture(self, slot: _FrameSlot, key: tuple[int, ...]) -> None:
        """Capture the program on ``slot``'s buffers; on failure log once and run eagerly."""
        current = torch.cuda.current_stream(self.device)
        side = torch.cuda.Stream(self.device)
        try:
            side.wait_stream(current)
            with torch.cuda.stream(side):
                for _ in range(CAPTURE_WARMUP_RUNS):
                    self.program(slot.device_input)
            current.wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                output = self.program(slot.device_input)
        except Exception as exc:  # noqa: BLE001 - any capture failure falls back to eager
            torch.cuda.synchronize(self.device)
            self.graph_failure = f'{type(exc).__name__}: {" ".join(str(exc).split())}'
            logger.warning('CUDA graph capture failed for input %s (%s); running the '
                           'network eagerly', 'x'.join(map(str, key)), self.graph_failure)
            return
        slot.graph, slot.output = graph, output
