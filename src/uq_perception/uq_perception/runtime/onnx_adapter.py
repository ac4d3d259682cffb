"""Any ONNX detector with a linear class head as a contract detector (ROS-free).

A user's ONNX file (a YOLO or RT-DETR export, or their own network) runs on ONNX Runtime
(``uq_perception.runtime.onnx_runtime``). The feature tap
(``uq_perception.detectors.onnx_feature_tap``) finds the node(s) making its class logits,
by name or for the ``yolo`` and ``detr`` layouts; the adapter adds each one's input
(``phi``) and output (the logits) to the graph outputs, so every frame gives boxes, scores,
``phi`` and logits, with ``W`` and ``b`` read from the node's weights.

Pre- and post-processing are configurable to match the export (:class:`OnnxAdapterConfig`):
letterbox or plain resize, channel order, mean/std normalisation, box format, score
activation and non-maximum suppression (class-aware, class-agnostic or none).
docs/detector_contract.md describes the layouts and settings.
"""

from __future__ import annotations

import ast
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from uq_common.str_enum import StrEnum
from uq_perception.detectors.contract import (
    Candidates,
    Detections,
    DetectorContract,
    LinearHead,
    check_linear_head,
    check_rgb_image,
)
from uq_perception.detectors.onnx_feature_tap import (
    NO_OBJECT_REFUSAL,
    FeatureTap,
    HeadLayout,
    ScoreActivation,
    activate,
    find_feature_tap,
    infer_types,
    with_outputs,
)
from uq_perception.runtime.onnx_runtime import ExecutionProvider, OnnxRunner

#: Most class nodes an explicit setting may name (one per scale of a multi-scale head).
MAX_CLASS_NODES = 16

__all__ = ['BoxFormat', 'ChannelOrder', 'FeatureTap', 'HeadLayout', 'NmsMode',
           'OnnxAdapterConfig', 'OnnxDetector', 'ResizeMode', 'ScoreActivation',
           'non_max_suppression', 'prepare_input']

class ResizeMode(StrEnum):
    """How a camera frame becomes the network input."""

    AUTO = 'auto'  # stretch for a model whose metadata names RT-DETR, else letterbox
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
        :class:`ResizeMode` and the grey level (0-255) of letterbox padding. ``auto``
        stretches an RT-DETR export, which Ultralytics and Hugging Face ``transformers``
        preprocess by stretching, when the file's metadata names it
        (:func:`metadata_resize`); every other model is letterboxed.
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
    resize: ResizeMode = ResizeMode.AUTO
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


# ------------------------------------------------------------------------ the detector


def file_digest(path: str | Path) -> str:
    """SHA-256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, 'rb') as handle:
        for block in iter(lambda: handle.read(1 << 20), b''):
            digest.update(block)
    return digest.hexdigest()


def _metadata_class_names(proto: Any) -> list[str] | None:
    """Class names from an Ultralytics-style ``names`` metadata entry (a dict literal of
    indices ``0 .. K-1`` to unique names)."""
    for entry in proto.metadata_props:
        if entry.key != 'names' or len(entry.value) > 1_000_000:
            continue
        try:
            names = ast.literal_eval(entry.value)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            return None
        count = len(names) if isinstance(names, dict) else 0
        if count and sorted(names) == list(range(count)) and all(
                isinstance(v, str) and v.strip() for v in names.values()) and \
                len(set(names.values())) == count:
            return [names[i].strip() for i in range(count)]
        return None
    return None


#: Metadata entries (as Ultralytics writes them) that can name the model's architecture.
_ARCHITECTURE_KEYS = ('description', 'head', 'model', 'name')


def metadata_resize(proto: Any) -> ResizeMode:
    """How the model's own pipeline resizes a frame, from its metadata: ``stretch`` when an
    entry of :data:`_ARCHITECTURE_KEYS` names RT-DETR (Ultralytics writes ``description``,
    for example "Ultralytics RT-DETR-l model ..."), else ``letterbox``."""
    for entry in proto.metadata_props:
        if entry.key in _ARCHITECTURE_KEYS and len(entry.value) <= 10_000:
            flat = entry.value.lower().replace('-', '').replace('_', '')
            if 'rtdetr' in flat:
                return ResizeMode.STRETCH
    return ResizeMode.LETTERBOX


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
        :func:`~uq_perception.runtime.onnx_runtime.default_cache_dir`).

    Raises
    ------
    ValueError
        On a missing or unreadable file, an input that is not ``(1, 3, H, W)``, an unknown
        input size, or no class-logit node (see :func:`find_feature_tap`).
    uq_perception.runtime.onnx_runtime.OnnxRuntimeUnavailableError
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
        if config.resize is ResizeMode.AUTO:
            config = replace(config, resize=metadata_resize(proto))
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

        def run_probe(model: bytes) -> dict[str, np.ndarray]:
            return OnnxRunner(model, provider, threads, cache_dir).run(
                {self._input_name: probe})

        self.tap = find_feature_tap(proto, run_probe, config.layout, config.class_nodes)
        # The session of every frame returns the model's box output and the taps.
        needed = sorted({self.tap.box_output} | set(self.tap.tensors))
        self._runner = OnnxRunner(with_outputs(infer_types(proto), needed), provider,
                                  threads, cache_dir)
        self._outputs = [self.tap.box_output] + self.tap.tensors
        self._model_id = f'onnx-{file_digest(path)[:16]}'
        count = self.tap.head.num_classes
        metadata_names = _metadata_class_names(proto) or []
        # C names for C + 1 logits of a set-prediction head: the last logit is "no object".
        stated = list(config.class_names) or metadata_names
        if self.tap.layout is HeadLayout.DETR and len(stated) == count - 1:
            raise ValueError(f'{path}: {len(stated)} class names for {count} logits: '
                             f'{NO_OBJECT_REFUSAL}')
        names = list(config.class_names) or (metadata_names if len(metadata_names) == count
                                             else None) or [f'class_{i}' for i in range(count)]
        if len(names) != count:
            raise ValueError(f'class_names has {len(names)} names, the model has {count} '
                             'classes')
        self._class_names = names
        activation = config.score_activation
        if activation is ScoreActivation.AUTO:
            activation = ScoreActivation.SOFTMAX if self.tap.output_activation == 'softmax' \
                else ScoreActivation.SIGMOID
        self.score_activation = activation
        reduced = self.tap.kept_index is not None
        box_format = config.box_format
        if box_format is BoxFormat.AUTO:
            # An end-to-end YOLO export writes its kept boxes as x1, y1, x2, y2 pixels.
            box_format = (BoxFormat.XYXY if reduced else BoxFormat.CXCYWH) \
                if self.tap.layout is HeadLayout.YOLO else BoxFormat.CXCYWH_NORMALIZED
        self.box_format = box_format
        nms = config.nms
        if nms is NmsMode.AUTO:
            nms = NmsMode.CLASS if self.tap.layout is HeadLayout.YOLO and not reduced \
                else NmsMode.NONE
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

    def feature_blocks(self) -> tuple[tuple[int, int, int | None], ...]:
        if not self.tap.stacked:
            return super().feature_blocks()
        # The stacked layout of _candidates: [phi_s; 1] per class node, one after another.
        blocks, start = [], 0
        for node in self.tap.nodes:
            width = node.head.weight.shape[1]
            blocks.append((start, start + width, start + width))
            start += width + 1
        return tuple(blocks)

    @property
    def class_activation(self) -> str:
        return self.score_activation.value

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

    def candidates(self, image_rgb: np.ndarray) -> Candidates:
        x, transform = prepare_input(image_rgb, self._input_size, self.config,
                                     self._input_dtype)
        values = self._runner.run({self._input_name: x}, self._outputs)
        features, logits, raw_boxes = self._candidates(values)
        scores = activate(logits, self.score_activation).max(axis=1)
        height, width = image_rgb.shape[:2]
        xyxy = transform.to_image(to_xyxy(raw_boxes, self.box_format, self._input_size))
        xyxy[:, [0, 2]] = np.clip(xyxy[:, [0, 2]], 0.0, width)
        xyxy[:, [1, 3]] = np.clip(xyxy[:, [1, 3]], 0.0, height)
        boxes = np.stack([(xyxy[:, 0] + xyxy[:, 2]) / 2, (xyxy[:, 1] + xyxy[:, 3]) / 2,
                          xyxy[:, 2] - xyxy[:, 0], xyxy[:, 3] - xyxy[:, 1]], axis=1)
        cells = scale = None
        if all(node.op_type == 'Conv' for node in self.tap.nodes):
            # Grid heads: cells row-major per feature map, maps in the order of the anchors.
            in_h, in_w = self._input_size
            centres, scales = [], []
            for index, node in enumerate(self.tap.nodes):
                rows, cols = np.asarray(values[node.feature_tensor]).shape[2:]
                y, x = np.meshgrid((np.arange(rows) + 0.5) * in_h / rows,
                                   (np.arange(cols) + 0.5) * in_w / cols, indexing='ij')
                centres.append(np.stack([x.ravel(), y.ravel(), x.ravel(), y.ravel()], 1))
                scales.append(np.full(rows * cols, index, np.int64))
            if sum(len(c) for c in centres) == len(features):  # one anchor per cell
                cells = transform.to_image(np.concatenate(centres))[:, :2].astype(np.float32)
                scale = np.concatenate(scales)
        return Candidates(boxes.astype(np.float32), scores.astype(np.float32),
                          np.ascontiguousarray(features, np.float32),
                          np.ascontiguousarray(logits, np.float32), cells, scale)

    # --- decoding ------------------------------------------------------------------
    def _probe_input(self) -> np.ndarray:
        height, width = self._input_size
        rng = np.random.default_rng(0)
        return rng.random((1, 3, height, width)).astype(self._input_dtype)

    def _raw_boxes(self, values: dict[str, np.ndarray]) -> np.ndarray:
        out = np.asarray(values[self.tap.box_output])
        if self.tap.layout is HeadLayout.YOLO and self.tap.kept_index is None:
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
        if self.tap.kept_index is not None:
            return self._kept_rows(values, feature_rows, np.concatenate(logits))
        return feature_rows, np.concatenate(logits), self._raw_boxes(values)

    def _kept_rows(self, values: dict[str, np.ndarray], features: np.ndarray,
                   logits: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The candidates of an output reduced by TopK selection (onnx_feature_tap): row
        ``k`` is anchor ``index_k // C`` (of the first stage's kept anchors, with two); an
        anchor kept with several classes once, at its first row."""
        index = np.asarray(values[str(self.tap.kept_index)]).reshape(-1).astype(np.int64)
        query = index // self.tap.head.num_classes
        if self.tap.kept_anchors is not None:
            anchors = np.asarray(values[self.tap.kept_anchors]).reshape(-1).astype(np.int64)
            if query.size and not (0 <= query.min() and query.max() < len(anchors)):
                raise ValueError(f'the kept rows name anchors outside 0..{len(anchors) - 1}')
            query = anchors[query]
        first = np.sort(np.unique(query, return_index=True)[1])
        picked = query[first]
        if picked.size and not (0 <= picked.min() and picked.max() < len(features)):
            raise ValueError(f'the kept rows name queries outside 0..{len(features) - 1}')
        return features[picked], logits[picked], self._raw_boxes(values)[first]

    def _decode(self, values: dict[str, np.ndarray], transform: InputTransform,
                image_size: tuple[int, int], score_threshold: float,
                max_detections: int) -> Detections:
        features, logits, raw_boxes = self._candidates(values)
        probabilities = activate(logits, self.score_activation)
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
