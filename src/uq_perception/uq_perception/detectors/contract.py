"""The detector contract: what any detector gives the NTK-GP, the node and the evaluators.

An RGB image goes in; out come the kept detections' boxes, scores, class logits and the
per-detection features ``phi`` of which the class logits are a linear map,
``logits = W phi + b``, plus the head ``(W, b)`` and a model identity. The NTK-GP engine
attaches to ``(phi, W, b)`` (its last-layer kernel needs nothing else), so any network
that exposes them gets sampling-free uncertainty: the shipped CenterNet through its
backends (``uq_perception.runtime.backends``), an ONNX file through the ONNX adapter
(``uq_perception.runtime.onnx_adapter``). docs/detector_contract.md states the contract and the
message fields it fills.

This module is ROS-free and torch-free.
"""

from __future__ import annotations

import abc
import math
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np

#: Largest ``|logits - (W phi + b)|`` tolerated when a detector's output is checked against
#: its own head (:func:`check_linear_head`), relative to ``max(1, |logits|)``: float32
#: round-off of a D-term dot product stays orders of magnitude below it.
HEAD_TOLERANCE = 1e-4


@dataclass(frozen=True)
class Detections:
    """Detections of one image, in the original image's pixel coordinates.

    Attributes
    ----------
    boxes : np.ndarray
        ``(K, 4)`` float32 ``center_x, center_y, width, height`` in pixels.
    scores : np.ndarray
        ``(K,)`` float32 detection confidence in ``[0, 1]`` (objectness, or the best
        class probability for detectors without objectness), sorted in descending order.
    embeddings : np.ndarray
        ``(K, D)`` float32 features ``phi`` that the linear classification head consumes.
    logits : np.ndarray
        ``(K, C)`` float32 class logits, ``W phi + b``.
    """

    boxes: np.ndarray
    scores: np.ndarray
    embeddings: np.ndarray
    logits: np.ndarray

    def __len__(self) -> int:
        return int(self.scores.shape[0])


@dataclass(frozen=True)
class Candidates:
    """Every anchor or query of one image before the score threshold and NMS, in the
    original image's pixel coordinates: what a GP fit may read beyond the kept detections.

    Attributes
    ----------
    boxes, scores, embeddings, logits : np.ndarray
        As in :class:`Detections`, one row per anchor or query, in the network's order.
    cells : np.ndarray | None
        ``(N, 2)`` float32 ``x, y`` centre of each anchor's grid cell; ``None`` for a
        head without a grid (set prediction).
    scale : np.ndarray | None
        ``(N,)`` int64 index of the scale (feature map) of each anchor; ``None`` without a
        grid.
    """

    boxes: np.ndarray
    scores: np.ndarray
    embeddings: np.ndarray
    logits: np.ndarray
    cells: np.ndarray | None = None
    scale: np.ndarray | None = None

    def __len__(self) -> int:
        return int(self.scores.shape[0])


@dataclass(frozen=True)
class LinearHead:
    """The classification head ``logits = weight @ phi + bias``.

    Attributes
    ----------
    weight : np.ndarray
        ``(C, D)`` float32 ``W``.
    bias : np.ndarray
        ``(C,)`` float32 ``b``.
    """

    weight: np.ndarray
    bias: np.ndarray

    def __post_init__(self) -> None:
        w, b = np.asarray(self.weight), np.asarray(self.bias)
        if w.ndim != 2 or b.shape != (w.shape[0],):
            raise ValueError(f'a linear head needs weight (C, D) and bias (C,), got '
                             f'{w.shape} and {b.shape}')
        if not (np.isfinite(w).all() and np.isfinite(b).all()):
            raise ValueError('the head weight and bias must be finite')

    @property
    def num_classes(self) -> int:
        """``C``."""
        return int(self.weight.shape[0])

    @property
    def feature_dim(self) -> int:
        """``D``."""
        return int(self.weight.shape[1])

    def logits(self, features: np.ndarray) -> np.ndarray:
        """``(K, C)`` float64 ``W phi + b`` of ``(K, D)`` features."""
        return np.asarray(features, np.float64) @ np.asarray(self.weight, np.float64).T \
            + np.asarray(self.bias, np.float64)


class DetectorContract(abc.ABC):
    """A detector as the rest of the product sees it: image in, :class:`Detections` out.

    Implementations: every :class:`uq_perception.runtime.backends.InferenceBackend` (the shipped
    CenterNet on PyTorch, ONNX Runtime or TensorRT) and
    :class:`uq_perception.runtime.onnx_adapter.OnnxDetector` (any ONNX file with a linear class
    head).
    """

    @property
    @abc.abstractmethod
    def model_id(self) -> str:
        """Identity of the weights; a GP artefact records it and is refused by another model."""

    @property
    @abc.abstractmethod
    def class_names(self) -> list[str]:
        """Names of the head's ``C`` classes, in logit order."""

    @property
    @abc.abstractmethod
    def input_size(self) -> tuple[int, int]:
        """Network input ``(height, width)`` in pixels."""

    @property
    @abc.abstractmethod
    def backend_name(self) -> str:
        """What runs the network (``DetectionArray.backend``), e.g. ``onnxruntime``."""

    @property
    @abc.abstractmethod
    def device_name(self) -> str:
        """Human-readable device (diagnostics and benchmark reports)."""

    @abc.abstractmethod
    def head(self) -> LinearHead:
        """The linear classification head ``(W, b)`` the detections' logits come from."""

    def feature_blocks(self) -> tuple[tuple[int, int, int | None], ...]:
        """The blocks of ``phi`` as ``(start, stop, bias column or None)``: one block, the
        whole vector, unless the detector stacks one block per scale (the ONNX adapter's
        multi-scale YOLO layout). The GP's feature transform normalises each block alone."""
        return ((0, self.feature_dim, None),)

    @property
    def class_activation(self) -> str:
        """``softmax`` or ``sigmoid``: how the detector turns its logits into class
        probabilities (the MSP baseline uses the same)."""
        return 'softmax'

    @abc.abstractmethod
    def infer(self, image_rgb: np.ndarray, score_threshold: float,
              max_detections: int) -> Detections:
        """Detect objects in an ``(H, W, 3)`` uint8 RGB image.

        Parameters
        ----------
        image_rgb : np.ndarray
            Any size; the detector resizes it to :attr:`input_size` itself.
        score_threshold : float
            Minimum score of a kept detection, in ``[0, 1]``.
        max_detections : int
            Most detections kept, by descending score.

        Raises
        ------
        ValueError
            If the image is not an ``(H, W, 3)`` uint8 array.
        """

    def candidates(self, image_rgb: np.ndarray) -> Candidates | None:
        """Every anchor or query of one image before the score threshold and NMS, where the
        detector can give them (the ONNX adapter); ``None`` otherwise.

        Raises
        ------
        ValueError
            If the image is not an ``(H, W, 3)`` uint8 array.
        """
        return None

    @property
    def feature_dim(self) -> int:
        """``D``, the dimension of ``phi`` (and of the GP fitted on it)."""
        return self.head().feature_dim

    @property
    def num_classes(self) -> int:
        """``C``."""
        return self.head().num_classes

    #: Milliseconds the last :meth:`infer` spent resizing and normalising the image (a part
    #: of the call); NaN where a detector does not time that stage apart.
    preprocess_ms: float = math.nan

    def device_gp_output(self) -> tuple[np.ndarray, np.ndarray] | None:
        """The ``(K,)`` GP variance and ``(K,)`` int64 expert of each detection of the last
        :meth:`infer`, where the detector computed them with its network (the CUDA graph of
        ``pytorch-cuda`` with a GP); ``None`` otherwise, and the GP is queried on the host."""
        return None

    def synchronize(self) -> None:  # noqa: B027 - optional hook: CPU detectors queue nothing
        """Wait for queued device work, so a timer around :meth:`infer` measures it all."""

    def warm_up(self, frames: int) -> float:
        """Run ``frames`` inferences on a blank image of :attr:`input_size`, so the first
        camera frames do not pay for lazy initialisation; returns the seconds it took."""
        height, width = self.input_size
        blank = np.zeros((height, width, 3), np.uint8)
        start = time.perf_counter()
        for _ in range(frames):
            self.infer(blank, 0.0, 1)
        self.synchronize()
        return time.perf_counter() - start


def check_rgb_image(image_rgb: np.ndarray) -> None:
    """Refuse anything but a non-empty ``(H, W, 3)`` uint8 array, with a specific message.

    Raises
    ------
    ValueError
        Naming what was given instead.
    """
    if not isinstance(image_rgb, np.ndarray):
        raise ValueError(f'image must be a numpy array, got {type(image_rgb).__name__}')
    if image_rgb.ndim != 3 or image_rgb.shape[2] != 3:
        raise ValueError(f'image must have shape (H, W, 3), got {image_rgb.shape}')
    if image_rgb.dtype != np.uint8:
        raise ValueError(f'image must be uint8 RGB, got dtype {image_rgb.dtype}')
    if image_rgb.shape[0] < 1 or image_rgb.shape[1] < 1:
        raise ValueError(f'image is empty: shape {image_rgb.shape}')


def check_linear_head(head: LinearHead, features: np.ndarray, logits: np.ndarray,
                      tolerance: float = HEAD_TOLERANCE) -> float:
    """Largest relative deviation of ``logits`` from ``W phi + b``; raises above ``tolerance``.

    The deviation of each entry is ``|logit - (W phi + b)| / max(1, |logit|)``.

    Raises
    ------
    ValueError
        If the shapes disagree with the head, or the deviation exceeds ``tolerance``: the
        features are not what the head consumes, and a GP on them would be meaningless.
    """
    x = np.asarray(features, np.float64)
    y = np.asarray(logits, np.float64)
    if x.ndim != 2 or x.shape[1] != head.feature_dim or y.shape != (x.shape[0],
                                                                     head.num_classes):
        raise ValueError(f'features {x.shape} and logits {y.shape} do not fit a head with '
                         f'{head.num_classes} classes over {head.feature_dim} features')
    if x.shape[0] == 0:
        return 0.0
    deviation = float((np.abs(y - head.logits(x)) / np.maximum(1.0, np.abs(y))).max())
    if not deviation <= tolerance:
        raise ValueError(f'the class logits are not W phi + b of the tapped features '
                         f'(largest relative deviation {deviation:.3g} > {tolerance:g})')
    return deviation


@dataclass(frozen=True)
class DetectionFeatures:
    """Kept detections of a set of images, concatenated: what a GP is fitted on.

    Attributes
    ----------
    image_index : np.ndarray
        ``(N,)`` int64 index of the image (in the order given) of each detection.
    boxes, scores, embeddings, logits : np.ndarray
        As in :class:`Detections`, stacked over images (``embeddings`` is ``phi``).
    """

    image_index: np.ndarray
    boxes: np.ndarray
    scores: np.ndarray
    embeddings: np.ndarray
    logits: np.ndarray

    def __len__(self) -> int:
        return int(self.scores.shape[0])


def iter_detections(detector: DetectorContract, images: Iterable[np.ndarray],
                    score_threshold: float, max_detections: int) -> Iterator[Detections]:
    """:meth:`DetectorContract.infer` over ``images``, one :class:`Detections` per image,
    each checked against the detector's head (:func:`check_linear_head`).

    Raises
    ------
    ValueError
        On an image that is not ``(H, W, 3)`` uint8, or detections whose logits are not the
        head's map of their features.
    """
    head = detector.head()
    for image in images:
        detections = detector.infer(image, score_threshold, max_detections)
        check_linear_head(head, detections.embeddings, detections.logits)
        yield detections


def extract_features(detector: DetectorContract, images: Iterable[np.ndarray],
                     score_threshold: float, max_detections: int) -> DetectionFeatures:
    """Run ``detector`` on ``images`` and stack the kept detections (see
    :func:`iter_detections`), with the image each came from.

    The features and logits are what :meth:`uq_perception.ntk.LastLayerNTKGP.fit` and its
    calibrations take; :func:`gp_head_arguments` gives the GP's constructor arguments.
    """
    d, c = detector.feature_dim, detector.num_classes
    parts: list[Detections] = []
    index: list[np.ndarray] = []
    for i, detections in enumerate(iter_detections(detector, images, score_threshold,
                                                   max_detections)):
        parts.append(detections)
        index.append(np.full(len(detections), i, dtype=np.int64))
    if not parts:
        return DetectionFeatures(np.zeros(0, np.int64), np.zeros((0, 4), np.float32),
                                 np.zeros(0, np.float32), np.zeros((0, d), np.float32),
                                 np.zeros((0, c), np.float32))
    return DetectionFeatures(
        np.concatenate(index), np.concatenate([p.boxes for p in parts]).reshape(-1, 4),
        np.concatenate([p.scores for p in parts]),
        np.concatenate([p.embeddings for p in parts]).reshape(-1, d),
        np.concatenate([p.logits for p in parts]).reshape(-1, c))


def gp_head_arguments(detector: DetectorContract) -> dict:
    """Keyword arguments of :class:`uq_perception.ntk.LastLayerNTKGP` for ``detector``:
    ``weight``, ``bias``, ``class_names`` and ``model_id`` (add ``config``)."""
    head = detector.head()
    return {'weight': np.asarray(head.weight, np.float64),
            'bias': np.asarray(head.bias, np.float64),
            'class_names': list(detector.class_names), 'model_id': detector.model_id}
