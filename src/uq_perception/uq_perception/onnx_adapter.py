"""Any ONNX detector with a linear class head as a contract detector (ROS-free).

A user's ONNX file (a YOLO or RT-DETR export, or their own network) runs on ONNX Runtime
(``uq_perception.onnx_runtime``); a *feature tap* makes it give what the NTK-GP needs:

- it finds the node(s) producing the class logits: named explicitly, or found
  automatically for two layouts (:class:`HeadLayout`):

  - ``yolo``: one output ``(1, 4 + C, N)`` over ``N`` anchors of several scales, each
    scale's class scores made by a 1x1 convolution with ``C`` output channels
    (YOLOv8/11-style heads). Boxes are the first four rows.
  - ``detr``: per-query outputs, boxes ``(1, Q, 4)`` and class logits ``(1, Q, C)`` (two
    outputs, or one ``(1, Q, 4 + C)``), the logits made by a final linear layer
    (MatMul + Add, or Gemm) on the per-query features.

  Candidates are linear nodes (1x1 Conv, Gemm, MatMul [+ Add]) with constant weights; the
  tap keeps those whose outputs, passed through the model's own activation (none,
  sigmoid or softmax), reproduce the class part of the model's output on a probe image.
- it adds each class node's input (``phi``) and output (the logits) to the graph outputs,
  and reads ``W`` and ``b`` from the node's initialisers;
- for a YOLO head whose scales have separate class convolutions, ``phi`` of an anchor of
  scale ``s`` is the block vector with ``[phi_s; 1]`` in block ``s`` and zeros elsewhere,
  and ``W = [W_1 b_1 | W_2 b_2 | ...]``, ``b = 0``: one linear head, exact, whose
  last-layer kernel is that of the separate per-scale parameters.

Pre- and post-processing are configurable to match the export (:class:`OnnxAdapterConfig`):
letterbox or plain resize, channel order, mean/std normalisation, box format, score
activation and non-maximum suppression (class-aware, class-agnostic or none).
docs/detector_contract.md describes the layouts and settings.
"""

from __future__ import annotations

import ast
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from uq_common.str_enum import StrEnum
from uq_perception.contract import (
    Detections,
    DetectorContract,
    LinearHead,
    check_linear_head,
    check_rgb_image,
)
from uq_perception.onnx_runtime import ExecutionProvider, OnnxRunner

#: Largest deviation (relative to ``max(1, |value|)``) between a class node's activated
#: output and the model's class output for the node to count as the class-logit node.
MATCH_TOLERANCE = 1e-4
#: Most class nodes an explicit setting may name (one per scale of a multi-scale head).
MAX_CLASS_NODES = 16


class HeadLayout(StrEnum):
    """How the model's outputs are laid out (module docstring)."""

    AUTO = 'auto'
    YOLO = 'yolo'
    DETR = 'detr'


class ResizeMode(StrEnum):
    """How a camera frame becomes the network input."""

    LETTERBOX = 'letterbox'  # keep the aspect ratio, pad the rest with pad_value
    STRETCH = 'stretch'  # resize to the input size, aspect ratio not kept


class ChannelOrder(StrEnum):
    """Channel order the network expects."""

    RGB = 'rgb'
    BGR = 'bgr'


class BoxFormat(StrEnum):
    """Coordinates of the model's boxes, in input pixels or normalised to ``[0, 1]``."""

    AUTO = 'auto'  # yolo: cxcywh; detr: cxcywh-normalized
    CXCYWH = 'cxcywh'
    XYXY = 'xyxy'
    CXCYWH_NORMALIZED = 'cxcywh-normalized'
    XYXY_NORMALIZED = 'xyxy-normalized'


class ScoreActivation(StrEnum):
    """Map from class logits to class probabilities (the score is their maximum)."""

    AUTO = 'auto'  # the activation found in the graph; sigmoid when the output is raw logits
    SIGMOID = 'sigmoid'
    SOFTMAX = 'softmax'


class NmsMode(StrEnum):
    """Non-maximum suppression of overlapping boxes."""

    AUTO = 'auto'  # yolo: class; detr: none (set prediction needs none)
    CLASS = 'class'  # per predicted class
    AGNOSTIC = 'agnostic'  # across classes
    NONE = 'none'


def _parse(enum: type[StrEnum], value: Any, name: str) -> Any:
    try:
        return enum(value)
    except ValueError:
        choices = ', '.join(member.value for member in enum.__members__.values())
        raise ValueError(f'{name} must be one of {choices}, got {value!r}') from None


@dataclass(frozen=True)
class OnnxAdapterConfig:
    """How to read an ONNX detector; defaults fit a YOLOv8/11 export.

    Attributes
    ----------
    layout
        :class:`HeadLayout`.
    class_nodes
        Names of the class-logit nodes (ONNX node names, or their output tensor names), in
        anchor order for a multi-scale head; empty: found automatically.
    input_size
        Network input ``(height, width)``; ``None``: the model's static input shape.
    resize, pad_value
        :class:`ResizeMode` and the grey level (0-255) of letterbox padding.
    channel_order
        :class:`ChannelOrder`.
    mean, std
        Per-channel normalisation ``(x / 255 - mean) / std`` in the network's channel order.
    box_format, score_activation, nms
        :class:`BoxFormat`, :class:`ScoreActivation`, :class:`NmsMode`.
    nms_iou
        IoU above which the lower-scoring box is suppressed, in ``(0, 1]``.
    max_candidates
        Most candidates (by score) that enter suppression.
    class_names
        Names of the ``C`` classes; empty: from the model's ``names`` metadata (as
        Ultralytics writes it), else ``class_0 ...``.

    Raises
    ------
    ValueError
        On any value out of its rule, naming it.
    """

    layout: HeadLayout = HeadLayout.AUTO
    class_nodes: tuple[str, ...] = ()
    input_size: tuple[int, int] | None = None
    resize: ResizeMode = ResizeMode.LETTERBOX
    pad_value: int = 114
    channel_order: ChannelOrder = ChannelOrder.RGB
    mean: tuple[float, float, float] = (0.0, 0.0, 0.0)
    std: tuple[float, float, float] = (1.0, 1.0, 1.0)
    box_format: BoxFormat = BoxFormat.AUTO
    score_activation: ScoreActivation = ScoreActivation.AUTO
    nms: NmsMode = NmsMode.AUTO
    nms_iou: float = 0.7
    max_candidates: int = 300
    class_names: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        for name, enum in (('layout', HeadLayout), ('resize', ResizeMode),
                           ('channel_order', ChannelOrder), ('box_format', BoxFormat),
                           ('score_activation', ScoreActivation), ('nms', NmsMode)):
            object.__setattr__(self, name, _parse(enum, getattr(self, name), name))
        nodes = tuple(self.class_nodes)
        if len(nodes) > MAX_CLASS_NODES or not all(isinstance(n, str) and n.strip()
                                                   for n in nodes):
            raise ValueError(f'class_nodes must be at most {MAX_CLASS_NODES} non-empty names, '
                             f'got {nodes!r}')
        object.__setattr__(self, 'class_nodes', tuple(n.strip() for n in nodes))
        if self.input_size is not None:
            size = tuple(self.input_size)
            if len(size) != 2 or not all(isinstance(v, int) and not isinstance(v, bool)
                                         and 1 <= v <= 8192 for v in size):
                raise ValueError(f'input_size must be (height, width) integers in [1, 8192], '
                                 f'got {self.input_size!r}')
            object.__setattr__(self, 'input_size', (int(size[0]), int(size[1])))
        if isinstance(self.pad_value, bool) or not isinstance(self.pad_value, int) \
                or not 0 <= self.pad_value <= 255:
            raise ValueError(f'pad_value must be an integer in [0, 255], got {self.pad_value!r}')
        for name in ('mean', 'std'):
            values = tuple(getattr(self, name))
            if len(values) != 3 or not all(isinstance(v, int | float) and not isinstance(v, bool)
                                           and np.isfinite(v) for v in values):
                raise ValueError(f'{name} must be 3 finite numbers, got {values!r}')
            object.__setattr__(self, name, tuple(float(v) for v in values))
        if not all(v > 0 for v in self.std):
            raise ValueError(f'std must be positive, got {self.std!r}')
        if not (isinstance(self.nms_iou, int | float) and 0.0 < self.nms_iou <= 1.0):
            raise ValueError(f'nms_iou must be in (0, 1], got {self.nms_iou!r}')
        if isinstance(self.max_candidates, bool) or not isinstance(self.max_candidates, int) \
                or not 1 <= self.max_candidates <= 100_000:
            raise ValueError(f'max_candidates must be an integer in [1, 100000], got '
                             f'{self.max_candidates!r}')
        names = tuple(self.class_names)
        if not all(isinstance(n, str) and n.strip() for n in names) \
                or len({n.strip() for n in names}) != len(names):
            raise ValueError(f'class_names must be unique non-empty names, got {names!r}')
        object.__setattr__(self, 'class_names', tuple(n.strip() for n in names))


# --------------------------------------------------------------------------- the graph


@dataclass(frozen=True)
class ClassNode:
    """A linear node with constant weights: a candidate class-logit node.

    Attributes
    ----------
    name
        The ONNX node's name (the MatMul's for MatMul + Add).
    op_type
        ``Conv``, ``Gemm`` or ``MatMul``.
    feature_tensor
        Its input: ``phi`` (channels first for Conv, last for Gemm/MatMul).
    logit_tensor
        Its output with the bias added (the Add's output for MatMul + Add).
    head
        ``W`` and ``b``.
    """

    name: str
    op_type: str
    feature_tensor: str
    logit_tensor: str
    head: LinearHead


def _attributes(node: Any) -> dict[str, Any]:
    import onnx

    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


class _Graph:
    """Constant resolution and linear-node discovery over an ONNX graph."""

    def __init__(self, proto: Any) -> None:
        from onnx import numpy_helper

        self.graph = proto.graph
        self.constants: dict[str, np.ndarray] = {
            i.name: numpy_helper.to_array(i) for i in self.graph.initializer}
        self.producer: dict[str, Any] = {}
        self.consumers: dict[str, list[Any]] = {}
        for node in self.graph.node:
            for out in node.output:
                self.producer[out] = node
            for name in node.input:
                self.consumers.setdefault(name, []).append(node)
            if node.op_type == 'Constant' and node.output:
                value = _attributes(node).get('value')
                if value is not None:
                    self.constants[node.output[0]] = numpy_helper.to_array(value)

    def constant(self, name: str, depth: int = 0) -> np.ndarray | None:
        """The value of ``name`` when it is constant (through Identity, Transpose, Cast)."""
        if name in self.constants:
            return self.constants[name]
        node = self.producer.get(name)
        if node is None or depth > 4 or not node.input:
            return None
        source = self.constant(node.input[0], depth + 1)
        if source is None:
            return None
        if node.op_type == 'Identity':
            return source
        if node.op_type == 'Cast':
            return source.astype(np.float32)
        if node.op_type == 'Transpose':
            perm = _attributes(node).get('perm')
            return np.transpose(source, perm) if perm is not None else source.T
        return None

    def linear_nodes(self) -> list[ClassNode]:
        """Every 1x1 Conv, Gemm and MatMul with a constant weight (and constant bias)."""
        found = []
        for node in self.graph.node:
            made = None
            if node.op_type == 'Conv':
                made = self._conv(node)
            elif node.op_type == 'Gemm':
                made = self._gemm(node)
            elif node.op_type == 'MatMul':
                made = self._matmul(node)
            if made is not None:
                found.append(made)
        return found

    def _conv(self, node: Any) -> ClassNode | None:
        weight = self.constant(node.input[1]) if len(node.input) > 1 else None
        if weight is None or weight.ndim != 4 or weight.shape[2:] != (1, 1):
            return None
        attrs = _attributes(node)
        if attrs.get('group', 1) != 1 or any(s != 1 for s in attrs.get('strides', [1, 1])) \
                or any(p != 0 for p in attrs.get('pads', [0, 0, 0, 0])):
            return None
        bias = self._bias(node, 2, weight.shape[0])
        if bias is None:
            return None
        return ClassNode(node.name, 'Conv', node.input[0], node.output[0],
                         LinearHead(weight[:, :, 0, 0].astype(np.float32), bias))

    def _gemm(self, node: Any) -> ClassNode | None:
        weight = self.constant(node.input[1])
        attrs = _attributes(node)
        if weight is None or weight.ndim != 2 or attrs.get('transA', 0) \
                or attrs.get('alpha', 1.0) != 1.0 or attrs.get('beta', 1.0) != 1.0:
            return None
        w = weight if attrs.get('transB', 0) else weight.T
        bias = self._bias(node, 2, w.shape[0])
        if bias is None:
            return None
        return ClassNode(node.name, 'Gemm', node.input[0], node.output[0],
                         LinearHead(w.astype(np.float32), bias))

    def _matmul(self, node: Any) -> ClassNode | None:
        weight = self.constant(node.input[1])
        if weight is None or weight.ndim != 2:
            return None
        w = weight.T.astype(np.float32)
        out, bias = node.output[0], np.zeros(w.shape[0], np.float32)
        users = self.consumers.get(out, [])
        if len(users) == 1 and users[0].op_type == 'Add':
            add = users[0]
            other = add.input[1] if add.input[0] == out else add.input[0]
            value = self.constant(other)
            if value is not None and value.size == w.shape[0] and \
                    value.shape[-1:] == (w.shape[0],):
                out, bias = add.output[0], value.reshape(-1).astype(np.float32)
        return ClassNode(node.name, 'MatMul', node.input[0], out, LinearHead(w, bias))

    def _bias(self, node: Any, index: int, rows: int) -> np.ndarray | None:
        if len(node.input) <= index or not node.input[index]:
            return np.zeros(rows, np.float32)
        value = self.constant(node.input[index])
        if value is None or value.size != rows:
            return None
        return value.reshape(-1).astype(np.float32)


def _with_outputs(proto: Any, names: Sequence[str]) -> bytes:
    """``proto`` serialised with ``names`` added to its graph outputs (types inferred)."""
    import onnx

    model = onnx.ModelProto()
    model.CopyFrom(proto)
    existing = {o.name for o in model.graph.output}
    types = {v.name: v.type.tensor_type.elem_type for v in model.graph.value_info}
    for name in names:
        if name in existing:
            continue
        # The element type of an intermediate tensor is known once shapes are inferred; the
        # shape itself is left open.
        model.graph.output.append(onnx.helper.make_tensor_value_info(
            name, types.get(name, onnx.TensorProto.FLOAT), None))
        existing.add(name)
    return model.SerializeToString()


def _infer_types(proto: Any) -> Any:
    import onnx

    try:
        return onnx.shape_inference.infer_shapes(proto)
    except Exception:  # noqa: BLE001 - inference is a convenience; float32 is assumed without it
        return proto


# ------------------------------------------------------------------- pre/post-processing


@dataclass(frozen=True)
class InputTransform:
    """Image pixel -> network input pixel: ``input = image * scale + pad`` per axis."""

    scale_x: float
    scale_y: float
    pad_x: float
    pad_y: float

    def to_image(self, boxes_xyxy: np.ndarray) -> np.ndarray:
        """Map ``(K, 4)`` input-pixel ``x1, y1, x2, y2`` back to image pixels."""
        out = np.asarray(boxes_xyxy, np.float64).copy()
        out[:, [0, 2]] = (out[:, [0, 2]] - self.pad_x) / self.scale_x
        out[:, [1, 3]] = (out[:, [1, 3]] - self.pad_y) / self.scale_y
        return out


def prepare_input(image_rgb: np.ndarray, input_size: tuple[int, int],
                  config: OnnxAdapterConfig, dtype: type = np.float32
                  ) -> tuple[np.ndarray, InputTransform]:
    """Letterbox or resize, reorder, normalise: ``(1, 3, H, W)`` network input and the
    transform that maps image pixels to it."""
    import cv2

    check_rgb_image(image_rgb)
    height, width = input_size
    h, w = image_rgb.shape[:2]
    if config.resize is ResizeMode.LETTERBOX:
        ratio = min(height / h, width / w)
        new_w, new_h = max(1, round(w * ratio)), max(1, round(h * ratio))
        resized = image_rgb if (new_h, new_w) == (h, w) else cv2.resize(
            image_rgb, (new_w, new_h), interpolation=cv2.INTER_LINEAR)
        left, top = (width - new_w) // 2, (height - new_h) // 2
        canvas: np.ndarray = np.full((height, width, 3), config.pad_value, np.uint8)
        canvas[top:top + new_h, left:left + new_w] = resized
        transform = InputTransform(new_w / w, new_h / h, float(left), float(top))
    else:
        canvas = image_rgb if (h, w) == (height, width) else cv2.resize(
            image_rgb, (width, height), interpolation=cv2.INTER_LINEAR)
        transform = InputTransform(width / w, height / h, 0.0, 0.0)
    if config.channel_order is ChannelOrder.BGR:
        canvas = canvas[:, :, ::-1]
    x = canvas.astype(np.float32) * np.float32(1.0 / 255.0)
    if config.mean != (0.0, 0.0, 0.0) or config.std != (1.0, 1.0, 1.0):
        x = (x - np.asarray(config.mean, np.float32)) / np.asarray(config.std, np.float32)
    return np.ascontiguousarray(x.transpose(2, 0, 1)[None], dtype=dtype), transform


def to_xyxy(boxes: np.ndarray, box_format: BoxFormat, input_size: tuple[int, int]
            ) -> np.ndarray:
    """``(K, 4)`` boxes of ``box_format`` as input-pixel ``x1, y1, x2, y2`` (float64)."""
    b = np.asarray(boxes, np.float64).reshape(-1, 4)
    if box_format in (BoxFormat.CXCYWH_NORMALIZED, BoxFormat.XYXY_NORMALIZED):
        height, width = input_size
        b = b * np.array([width, height, width, height], np.float64)
    if box_format in (BoxFormat.CXCYWH, BoxFormat.CXCYWH_NORMALIZED):
        half = b[:, 2:] / 2
        return np.concatenate([b[:, :2] - half, b[:, :2] + half], axis=1)
    return b


def box_iou(box: np.ndarray, others: np.ndarray) -> np.ndarray:
    """IoU of one ``x1, y1, x2, y2`` box with ``(K, 4)`` others (0 for empty unions)."""
    x1 = np.maximum(box[0], others[:, 0])
    y1 = np.maximum(box[1], others[:, 1])
    x2 = np.minimum(box[2], others[:, 2])
    y2 = np.minimum(box[3], others[:, 3])
    inter = np.clip(x2 - x1, 0, None) * np.clip(y2 - y1, 0, None)
    area = max(box[2] - box[0], 0) * max(box[3] - box[1], 0)
    areas = np.clip(others[:, 2] - others[:, 0], 0, None) * \
        np.clip(others[:, 3] - others[:, 1], 0, None)
    union = area + areas - inter
    return np.where(union > 0, inter / np.where(union > 0, union, 1.0), 0.0)


def non_max_suppression(boxes_xyxy: np.ndarray, scores: np.ndarray, iou_threshold: float,
                        classes: np.ndarray | None = None) -> np.ndarray:
    """Greedy NMS: indices of the kept boxes, by descending score (ties: lower index first).

    A box is dropped when its IoU with a kept higher-scoring box exceeds ``iou_threshold``;
    with ``classes``, only boxes of the same class suppress each other.
    """
    order = np.argsort(-np.asarray(scores), kind='stable')
    boxes = np.asarray(boxes_xyxy, np.float64)
    keep: list[int] = []
    while order.size:
        best = int(order[0])
        keep.append(best)
        rest = order[1:]
        overlap = box_iou(boxes[best], boxes[rest]) > iou_threshold
        if classes is not None:
            overlap &= classes[rest] == classes[best]
        order = rest[~overlap]
    return np.asarray(keep, dtype=np.int64)


def _activate(logits: np.ndarray, activation: ScoreActivation) -> np.ndarray:
    x = np.asarray(logits, np.float64)
    if activation is ScoreActivation.SOFTMAX:
        e = np.exp(x - x.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)
    return 0.5 * (1.0 + np.tanh(0.5 * x))  # the sigmoid, without overflow warnings


def _deviation(found: np.ndarray, expected: np.ndarray) -> float:
    if found.shape != expected.shape:
        return float('inf')
    a, b = np.asarray(found, np.float64), np.asarray(expected, np.float64)
    dev = np.abs(a - b) / np.maximum(1.0, np.abs(b))
    return float(np.nan_to_num(dev, nan=np.inf).max()) if dev.size else 0.0


def _matching_activation(logits: np.ndarray, target: np.ndarray
                         ) -> ScoreActivation | None | str:
    """Which activation of ``logits`` (classes on the last axis) gives ``target``:
    ``'identity'``, a :class:`ScoreActivation`, or ``None``."""
    if _deviation(logits, target) <= MATCH_TOLERANCE:
        return 'identity'
    for activation in (ScoreActivation.SIGMOID, ScoreActivation.SOFTMAX):
        if _deviation(_activate(logits, activation), target) <= MATCH_TOLERANCE:
            return activation
    return None


# ---------------------------------------------------------------------------- the tap


@dataclass(frozen=True)
class FeatureTap:
    """Where ``phi`` and the logits are read, and the head they form.

    Attributes
    ----------
    layout
        The resolved :class:`HeadLayout`.
    nodes
        The class-logit node(s), in anchor order (one per scale for a YOLO head).
    scale_sizes
        Anchors per node (``h * w`` of each scale; the query count for DETR).
    head
        ``W`` and ``b`` of ``logits = W phi + b``.
    stacked
        Whether ``phi`` is the per-scale block vector (module docstring).
    output_activation
        What the model applies to the logits in its class output (``identity``,
        ``sigmoid``, ``softmax``).
    class_output, box_output
        Names of the model outputs holding the class part and the boxes.
    """

    layout: HeadLayout
    nodes: tuple[ClassNode, ...]
    scale_sizes: tuple[int, ...]
    head: LinearHead
    stacked: bool
    output_activation: str
    class_output: str
    box_output: str

    @property
    def tensors(self) -> list[str]:
        """Graph tensors the session must return: every node's features and logits."""
        names: list[str] = []
        for node in self.nodes:
            names += [node.feature_tensor, node.logit_tensor]
        return names


def _stacked_head(nodes: Sequence[ClassNode]) -> tuple[LinearHead, bool]:
    first = nodes[0].head
    if all(np.array_equal(n.head.weight, first.weight) and np.array_equal(n.head.bias, first.bias)
           for n in nodes[1:]):
        return first, False
    blocks = [np.concatenate([n.head.weight, n.head.bias[:, None]], axis=1) for n in nodes]
    weight = np.concatenate(blocks, axis=1).astype(np.float32)
    return LinearHead(weight, np.zeros(weight.shape[0], np.float32)), True


def _select_named(candidates: Sequence[ClassNode], names: Sequence[str]) -> list[ClassNode]:
    chosen = []
    for name in names:
        match = [c for c in candidates if name in (c.name, c.logit_tensor)]
        if not match:
            raise ValueError(f'class node {name!r} is not a linear node (1x1 Conv, Gemm or '
                             'MatMul) with constant weights in this model')
        chosen.append(match[0])
    return chosen


def _find_yolo(outputs: dict[str, np.ndarray], values: dict[str, np.ndarray],
               candidates: Sequence[ClassNode], explicit: bool) -> FeatureTap | None:
    for name, out in outputs.items():
        if out.ndim != 3 or out.shape[0] != 1 or out.shape[1] < 5:
            continue
        classes, anchors = out.shape[1] - 4, out.shape[2]
        target = out[0, 4:, :]
        pool = [c for c in candidates if c.op_type == 'Conv' and c.head.num_classes == classes
                and values[c.logit_tensor].ndim == 4]
        chosen: list[ClassNode] = []
        activation: str | None = None
        offset = 0
        remaining = list(pool)
        while offset < anchors and remaining:
            for candidate in (remaining[:1] if explicit else remaining):
                flat = values[candidate.logit_tensor][0].reshape(classes, -1)
                stop = offset + flat.shape[1]
                if stop > anchors:
                    continue
                found = _matching_activation(flat.T, target[:, offset:stop].T)
                if found is not None and activation in (None, found):
                    activation = found
                    chosen.append(candidate)
                    remaining.remove(candidate)
                    offset = stop
                    break
            else:
                break
        if chosen and offset == anchors:
            head, stacked = _stacked_head(chosen)
            sizes = tuple(int(np.prod(values[c.logit_tensor].shape[2:])) for c in chosen)
            return FeatureTap(HeadLayout.YOLO, tuple(chosen), sizes, head, stacked,
                              str(activation), name, name)
    return None


def _find_detr(outputs: dict[str, np.ndarray], values: dict[str, np.ndarray],
               candidates: Sequence[ClassNode]) -> FeatureTap | None:
    ranked = [(name, out) for name, out in outputs.items()
              if out.ndim == 3 and out.shape[0] == 1]
    # An output named for boxes is never the class output (both are (1, Q, 4) when C = 4).
    ranked.sort(key=lambda item: 'box' in item[0].lower())
    for name, out in ranked:
        if 'box' in name.lower() and len(ranked) > 1:
            continue
        queries = out.shape[1]
        parts: list[tuple[np.ndarray, str | None]] = [(out, None)]
        if out.shape[2] > 4:
            parts.append((out[..., 4:], name))  # one output: boxes then classes
        for target, combined in parts:
            for candidate in candidates:
                logits = values[candidate.logit_tensor]
                if logits.ndim == 2:  # a Gemm on the (Q, d) rows of the batch of one
                    logits = logits[None]
                if logits.shape != target.shape or logits.shape[1] != queries:
                    continue
                found = _matching_activation(logits[0], target[0])
                if found is None:
                    continue
                if combined is not None:
                    box_output = combined
                else:
                    boxes = [n for n, o in outputs.items() if n != name and o.ndim == 3
                             and o.shape[:2] == (1, queries) and o.shape[2] == 4]
                    if len(boxes) != 1:
                        continue
                    box_output = boxes[0]
                return FeatureTap(HeadLayout.DETR, (candidate,), (queries,), candidate.head,
                                  False, str(found), name, box_output)
    return None


def find_feature_tap(proto: Any, runner_factory: Any, probe: np.ndarray, input_name: str,
                     config: OnnxAdapterConfig) -> FeatureTap:
    """Find the class-logit node(s) of ``proto`` (module docstring).

    Parameters
    ----------
    proto
        The loaded ``onnx.ModelProto``.
    runner_factory
        ``bytes -> OnnxRunner`` for a modified model.
    probe
        A network input to compare the candidates' outputs with the model's on.
    input_name
        The model input's name.
    config
        The layout and explicit node names.

    Raises
    ------
    ValueError
        When no node, or no set of per-scale nodes, reproduces the model's class output.
    """
    graph = _Graph(proto)
    candidates = graph.linear_nodes()
    if config.class_nodes:
        candidates = _select_named(candidates, config.class_nodes)
    if not candidates:
        raise ValueError('the model has no linear node (1x1 Conv, Gemm or MatMul) with '
                         'constant weights that could produce class logits')
    model_outputs = [o.name for o in proto.graph.output]
    taps = sorted({c.logit_tensor for c in candidates} - set(model_outputs))
    runner = runner_factory(_with_outputs(_infer_types(proto), taps))
    values = runner.run({input_name: probe})
    outputs = {name: values[name] for name in model_outputs}
    tap = None
    if config.layout in (HeadLayout.AUTO, HeadLayout.YOLO):
        tap = _find_yolo(outputs, values, candidates, bool(config.class_nodes))
    if tap is None and config.layout in (HeadLayout.AUTO, HeadLayout.DETR):
        tap = _find_detr(outputs, values, candidates)
    if tap is None:
        shapes = ', '.join(f'{n} {tuple(v.shape)}' for n, v in outputs.items())
        raise ValueError(
            f'no class-logit node found for layout {config.layout.value} (outputs: {shapes}): '
            'expected a YOLO output (1, 4 + C, N) made from per-scale 1x1 class convolutions, '
            'or DETR outputs (1, Q, 4) and (1, Q, C) from a final linear layer; name the '
            'node(s) with class_nodes, or set the layout')
    return tap


# ------------------------------------------------------------------------ the detector


def file_digest(path: str | Path) -> str:
    """SHA-256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, 'rb') as handle:
        for block in iter(lambda: handle.read(1 << 20), b''):
            digest.update(block)
    return digest.hexdigest()


def _metadata_class_names(proto: Any, count: int) -> list[str] | None:
    """Class names from an Ultralytics-style ``names`` metadata entry (a dict literal)."""
    for entry in proto.metadata_props:
        if entry.key != 'names' or len(entry.value) > 1_000_000:
            continue
        try:
            names = ast.literal_eval(entry.value)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            return None
        if isinstance(names, dict) and sorted(names) == list(range(count)) and all(
                isinstance(v, str) and v.strip() for v in names.values()) and \
                len(set(names.values())) == count:
            return [names[i].strip() for i in range(count)]
        return None
    return None


def _static_input_size(shape: Sequence[Any]) -> tuple[int, int] | None:
    if len(shape) == 4 and all(isinstance(v, int) and v > 0 for v in shape[2:]):
        return int(shape[2]), int(shape[3])
    return None


class OnnxDetector(DetectorContract):
    """A user's ONNX detector behind the detector contract.

    Parameters
    ----------
    path
        The ONNX file.
    config
        Layout, tap and pre/post-processing settings.
    provider, threads
        ONNX Runtime execution provider and intra-op threads.
    cache_dir
        Cache folder of the TensorRT provider's engines (default
        :func:`~uq_perception.onnx_runtime.default_cache_dir`).

    Raises
    ------
    ValueError
        On a missing or unreadable file, an input that is not ``(1, 3, H, W)``, an unknown
        input size, or no class-logit node (see :func:`find_feature_tap`).
    uq_perception.onnx_runtime.OnnxRuntimeUnavailableError
        When onnxruntime or the provider is missing.
    """

    def __init__(self, path: str | Path, config: OnnxAdapterConfig = OnnxAdapterConfig(),
                 provider: ExecutionProvider | str = ExecutionProvider.CPU,
                 threads: int = 1, cache_dir: str | Path | None = None) -> None:
        import onnx

        path = Path(path)
        if not path.is_file():
            raise ValueError(f'ONNX model file not found: {path}')
        try:
            proto = onnx.load(str(path))
        except Exception as exc:  # noqa: BLE001 - protobuf and onnx raise their own types
            raise ValueError(f'{path} is not a readable ONNX model ({type(exc).__name__}: '
                             f'{exc})') from exc
        self.path = path
        self.config = config
        base = OnnxRunner(path, provider, threads, cache_dir)
        if len(base.input_names) != 1:
            raise ValueError(f'{path}: the model must have one image input, it has '
                             f'{base.input_names}')
        shape = base.input_shape()
        channels_ok = shape[1:2] == [3] or (len(shape) > 1 and not isinstance(shape[1], int))
        if len(shape) != 4 or not channels_ok:
            raise ValueError(f'{path}: the input must be (1, 3, H, W), it is {shape}')
        size = config.input_size or _static_input_size(shape)
        if size is None:
            raise ValueError(f'{path}: the input size is dynamic ({shape}); set input_size')
        self._input_size = size
        self._input_name = base.input_names[0]
        self._input_dtype: type = np.float16 if 'float16' in base.input_type() else np.float32
        probe = self._probe_input()

        def factory(model: bytes) -> OnnxRunner:
            return OnnxRunner(model, provider, threads, cache_dir)

        self.tap = find_feature_tap(proto, factory, probe, self._input_name, config)
        # The session of every frame returns the model's box/class outputs and the taps.
        needed = sorted({self.tap.box_output} | set(self.tap.tensors))
        self._runner = factory(_with_outputs(_infer_types(proto), needed))
        self._outputs = [self.tap.box_output] + self.tap.tensors
        self._model_id = f'onnx-{file_digest(path)[:16]}'
        count = self.tap.head.num_classes
        names = list(config.class_names) or _metadata_class_names(proto, count) \
            or [f'class_{i}' for i in range(count)]
        if len(names) != count:
            raise ValueError(f'class_names has {len(names)} names, the model has {count} '
                             'classes')
        self._class_names = names
        activation = config.score_activation
        if activation is ScoreActivation.AUTO:
            activation = ScoreActivation.SOFTMAX if self.tap.output_activation == 'softmax' \
                else ScoreActivation.SIGMOID
        self.score_activation = activation
        box_format = config.box_format
        if box_format is BoxFormat.AUTO:
            box_format = BoxFormat.CXCYWH if self.tap.layout is HeadLayout.YOLO \
                else BoxFormat.CXCYWH_NORMALIZED
        self.box_format = box_format
        nms = config.nms
        if nms is NmsMode.AUTO:
            nms = NmsMode.CLASS if self.tap.layout is HeadLayout.YOLO else NmsMode.NONE
        self.nms = nms
        # The tap must give the head's own logits: checked once here on the probe image.
        values = self._runner.run({self._input_name: probe}, self._outputs)
        features, logits, _ = self._candidates(values)
        check_linear_head(self.tap.head, features, logits)

    # --- contract ------------------------------------------------------------------
    @property
    def model_id(self) -> str:
        return self._model_id

    @property
    def class_names(self) -> list[str]:
        return list(self._class_names)

    @property
    def input_size(self) -> tuple[int, int]:
        return self._input_size

    @property
    def backend_name(self) -> str:
        return 'onnxruntime'

    @property
    def device_name(self) -> str:
        return self._runner.device_name

    def head(self) -> LinearHead:
        return self.tap.head

    def describe(self) -> dict[str, Any]:
        """The resolved tap and settings, for logs and reports."""
        return {'model_id': self.model_id, 'layout': self.tap.layout.value,
                'class_nodes': [n.name for n in self.tap.nodes],
                'anchors_per_node': list(self.tap.scale_sizes),
                'feature_dim': self.feature_dim, 'classes': len(self._class_names),
                'per_scale_blocks': self.tap.stacked,
                'score_activation': self.score_activation.value,
                'box_format': self.box_format.value, 'nms': self.nms.value,
                'input_size': list(self.input_size), 'resize': self.config.resize.value}

    def infer(self, image_rgb: np.ndarray, score_threshold: float,
              max_detections: int) -> Detections:
        if not 0.0 <= score_threshold <= 1.0:
            raise ValueError(f'score_threshold must be in [0, 1], got {score_threshold}')
        if max_detections < 0:
            raise ValueError(f'max_detections must be >= 0, got {max_detections}')
        x, transform = prepare_input(image_rgb, self._input_size, self.config,
                                     self._input_dtype)
        values = self._runner.run({self._input_name: x}, self._outputs)
        return self._decode(values, transform, image_rgb.shape[:2], score_threshold,
                            max_detections)

    # --- decoding ------------------------------------------------------------------
    def _probe_input(self) -> np.ndarray:
        height, width = self._input_size
        rng = np.random.default_rng(0)
        return rng.random((1, 3, height, width)).astype(self._input_dtype)

    def _raw_boxes(self, values: dict[str, np.ndarray]) -> np.ndarray:
        out = np.asarray(values[self.tap.box_output])
        if self.tap.layout is HeadLayout.YOLO:
            return out[0, :4, :].T
        return out[0, :, :4]

    def _candidates(self, values: dict[str, np.ndarray]
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(features (N, D), logits (N, C), boxes (N, 4))`` of every anchor or query."""
        logits, features = [], []
        for node in self.tap.nodes:
            phi = np.asarray(values[node.feature_tensor], np.float32)
            lg = np.asarray(values[node.logit_tensor], np.float32)
            if node.op_type == 'Conv':  # (1, c, h, w): channels first, cells row-major
                phi = phi[0].reshape(phi.shape[1], -1).T
                lg = lg[0].reshape(lg.shape[1], -1).T
            else:  # (1, Q, c)
                phi = phi.reshape(-1, phi.shape[-1])
                lg = lg.reshape(-1, lg.shape[-1])
            logits.append(lg)
            features.append(phi)
        if self.tap.stacked:
            width = sum(f.shape[1] + 1 for f in features)
            blocks = []
            start = 0
            for phi in features:
                block = np.zeros((phi.shape[0], width), np.float32)
                block[:, start:start + phi.shape[1]] = phi
                block[:, start + phi.shape[1]] = 1.0
                start += phi.shape[1] + 1
                blocks.append(block)
            feature_rows = np.concatenate(blocks)
        else:
            feature_rows = np.concatenate(features)
        return feature_rows, np.concatenate(logits), self._raw_boxes(values)

    def _decode(self, values: dict[str, np.ndarray], transform: InputTransform,
                image_size: tuple[int, int], score_threshold: float,
                max_detections: int) -> Detections:
        features, logits, raw_boxes = self._candidates(values)
        probabilities = _activate(logits, self.score_activation)
        classes = np.argmax(probabilities, axis=1)
        scores = probabilities[np.arange(len(classes)), classes]
        finite = np.isfinite(scores) & np.isfinite(raw_boxes).all(axis=1)
        order = np.flatnonzero(finite & (scores >= score_threshold))
        order = order[np.argsort(-scores[order], kind='stable')][:self.config.max_candidates]
        boxes = to_xyxy(raw_boxes[order], self.box_format, self._input_size)
        if self.nms is not NmsMode.NONE and len(order):
            kept = non_max_suppression(boxes, scores[order], self.config.nms_iou,
                                       classes[order] if self.nms is NmsMode.CLASS else None)
        else:
            kept = np.arange(len(order))
        kept = kept[:max_detections]
        pick = order[kept]
        height, width = image_size
        xyxy = transform.to_image(boxes[kept])
        xyxy[:, [0, 2]] = np.clip(xyxy[:, [0, 2]], 0.0, width)
        xyxy[:, [1, 3]] = np.clip(xyxy[:, [1, 3]], 0.0, height)
        centre_size = np.stack([(xyxy[:, 0] + xyxy[:, 2]) / 2, (xyxy[:, 1] + xyxy[:, 3]) / 2,
                                xyxy[:, 2] - xyxy[:, 0], xyxy[:, 3] - xyxy[:, 1]], axis=1)
        return Detections(
            boxes=centre_size.astype(np.float32).reshape(-1, 4),
            scores=scores[pick].astype(np.float32),
            embeddings=np.ascontiguousarray(features[pick], np.float32),
            logits=np.ascontiguousarray(logits[pick], np.float32))
