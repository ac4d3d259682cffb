"""An ONNX detector whose forward pass also returns the layers before its class layer
(ROS-free; read off the robot, by ``uq eval layers``).

:class:`OnnxLayerDetector` is the adapter's :class:`~uq_perception.runtime.onnx_adapter.
OnnxDetector` with the tensors of :func:`~uq_perception.detectors.layer_taps.
find_layer_taps` added to its session's outputs: one pass gives the detections, as
``infer`` gives them, and per detection its anchor and the tapped tensors
(:class:`LayerFrame`). The node's per-frame path does not use it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from uq_perception.detectors.contract import Detections
from uq_perception.detectors.layer_taps import BRANCH_DEPTH, LayerTaps, find_layer_taps
from uq_perception.detectors.onnx_feature_tap import HeadLayout, infer_types, with_outputs
from uq_perception.runtime.onnx_adapter import (
    OnnxAdapterConfig,
    OnnxDetector,
    prepare_input,
    to_xyxy,
)
from uq_perception.runtime.onnx_runtime import ExecutionProvider, OnnxRunner


@dataclass(frozen=True)
class LayerFrame:
    """One frame's detections and what the taps read.

    Attributes
    ----------
    detections
        As :meth:`OnnxDetector.infer` returns them.
    anchors
        ``(K,)`` each detection's anchor (its row among the head's candidates).
    boxes_input
        ``(K, 4)`` their boxes ``x1, y1, x2, y2`` in network-input pixels.
    values
        Every tensor of the session by name, batch axis kept.
    """

    detections: Detections
    anchors: np.ndarray
    boxes_input: np.ndarray
    values: dict[str, np.ndarray]


class OnnxLayerDetector(OnnxDetector):
    """:class:`OnnxDetector` that also reads :class:`LayerTaps` from the same pass.

    Parameters
    ----------
    path, config, provider, threads
        As :class:`OnnxDetector`.
    feature_nodes
        Nodes or tensors to read besides the class branch (the ``onnx_feature_nodes``
        choice of ``uq eval layers``).
    depth
        Convolutions read up each class branch.

    Raises
    ------
    ValueError
        As :class:`OnnxDetector`; for an output reduced in the graph (its rows are not
        anchors, so no anchor cell can be read); for a feature node not in the graph.
    """

    def __init__(self, path: str | Path, config: OnnxAdapterConfig,
                 feature_nodes: Sequence[str] = (), depth: int = BRANCH_DEPTH,
                 provider: ExecutionProvider | str = ExecutionProvider.CPU,
                 threads: int = 1) -> None:
        import onnx

        super().__init__(path, config, provider, threads)
        if self.tap.kept_index is not None:
            raise ValueError(f'{path}: its output is reduced in the graph, so a detection\'s '
                             'anchor cell is unknown; layer taps need the un-reduced output')
        proto = onnx.load(str(path))
        self.layers: LayerTaps = find_layer_taps(proto, self.tap, depth, feature_nodes)
        self._layer_outputs = list(dict.fromkeys(self._outputs + self.layers.tensors))
        self._runner = OnnxRunner(with_outputs(infer_types(proto), self._layer_outputs),
                                  provider, threads)

    def infer_layers(self, image_rgb: np.ndarray, score_threshold: float,
                     max_detections: int) -> LayerFrame:
        """:meth:`infer`'s detections of one frame, with their anchors and the taps."""
        x, transform = prepare_input(image_rgb, self.input_size, self.config,
                                     self._input_dtype)
        values = self._runner.run({self._input_name: x}, self._layer_outputs)
        dets = self._decode(values, transform, image_rgb.shape[:2], score_threshold,
                            max_detections)
        features, logits, raw_boxes = self._candidates(values)
        candidate_boxes = transform.to_image(to_xyxy(raw_boxes, self.box_format,
                                                     self.input_size))
        xyxy = np.column_stack([dets.boxes[:, :2] - dets.boxes[:, 2:] / 2,
                                dets.boxes[:, :2] + dets.boxes[:, 2:] / 2]).astype(np.float64)
        anchors = np.empty(len(dets), np.int64)
        for k in range(len(dets)):
            # The detection's features and logits are its anchor's row, copied; equal rows
            # elsewhere (a uniform region) are told apart by the box.
            same = np.flatnonzero((features == dets.embeddings[k]).all(axis=1)
                                  & (logits == dets.logits[k]).all(axis=1))
            if same.size == 0:
                raise RuntimeError('a detection matches no candidate of its frame')
            centre = (candidate_boxes[same, :2] + candidate_boxes[same, 2:]) / 2
            anchors[k] = same[np.argmin(np.abs(centre - (xyxy[k, :2] + xyxy[k, 2:]) / 2)
                                        .sum(axis=1))]
        boxes_input = xyxy.copy()
        boxes_input[:, [0, 2]] = boxes_input[:, [0, 2]] * transform.scale_x + transform.pad_x
        boxes_input[:, [1, 3]] = boxes_input[:, [1, 3]] * transform.scale_y + transform.pad_y
        return LayerFrame(dets, anchors, boxes_input, values)

    def map_shapes(self, values: dict[str, np.ndarray]) -> list[tuple[int, int]]:
        """``(h, w)`` of each class node's map, in the head's order (grid heads)."""
        if self.tap.layout is not HeadLayout.YOLO:
            raise ValueError('anchor cells exist on a grid head (layout yolo) only')
        return [tuple(np.asarray(values[n.feature_tensor]).shape[2:])  # type: ignore[misc]
                for n in self.tap.nodes]
