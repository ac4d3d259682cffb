"""Tensors before an ONNX detector's class layer, and what one detection reads of them
(ROS-free).

The feature tap (:mod:`uq_perception.detectors.onnx_feature_tap`) reads ``phi``, the input
of the class layer. The layers before it are in the same graph, so they can be read from
the same forward pass by adding them to the session's outputs
(:func:`~uq_perception.detectors.onnx_feature_tap.with_outputs`); nothing runs twice.
:func:`find_layer_taps` chooses them:

- **the class branch**, for a grid head whose class nodes are convolutions (a YOLO): from
  each class node's input back through its activation (SiLU as ``x * Sigmoid(x)``,
  Sigmoid, Relu, LeakyRelu, or none) to the convolution that made it, and on up to
  ``depth`` convolutions. Each :class:`BranchLayer` keeps its weights, its input, its
  output before the activation and after it. The input of the deepest one is the
  **neck's feature map** that feeds the head at that scale;
- **tensors named by the user** (``feature_nodes``: a node's name, whose first output is
  read, or a tensor's name).

Per detection a feature map is read two ways: pooled over the detection's box
(:func:`box_pool`: the mean over the cells whose centre lies in the box, or the cell
holding the box's centre when none does) and, for the class branch, at the detection's
own anchor cell: a convolution's output there and its input patch (:func:`patches`), the
two factors of that layer's Jacobian (:mod:`uq_perception.ntk.layer_kernel`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from uq_perception.detectors.onnx_feature_tap import FeatureTap, _attributes, _Graph

#: Convolutions read up a class branch by default: the one making ``phi`` and the one
#: before it (a YOLOv8 class branch is two 3x3 convolutions, then the 1x1 class layer).
BRANCH_DEPTH = 2


@dataclass(frozen=True)
class BranchLayer:
    """One convolution of a class branch.

    Attributes
    ----------
    scale
        Index of the class node (the head's scale) the branch feeds.
    depth
        1: the convolution whose activation is ``phi``; 2: the one before it; ...
    node
        The convolution's ONNX node name.
    input_tensor, output_tensor, activated_tensor
        Its input, its output before the activation, and after it.
    activation, slope
        The activation (:data:`uq_perception.ntk.layer_kernel.ACTIVATIONS`) and, for
        LeakyRelu, its negative slope.
    weight, bias
        ``(out, in, kh, kw)`` and ``(out,)``.
    strides, pads, dilations
        ``(sh, sw)``, ``(top, left, bottom, right)``, ``(dh, dw)``.
    """

    scale: int
    depth: int
    node: str
    input_tensor: str
    output_tensor: str
    activated_tensor: str
    activation: str
    slope: float
    weight: np.ndarray
    bias: np.ndarray
    strides: tuple[int, int]
    pads: tuple[int, int, int, int]
    dilations: tuple[int, int]


@dataclass(frozen=True)
class LayerTaps:
    """The tensors read besides the feature tap's.

    Attributes
    ----------
    branches
        Per scale, the class branch's convolutions, nearest the class layer first.
    named
        Tensor names the user chose.
    """

    branches: tuple[tuple[BranchLayer, ...], ...]
    named: tuple[str, ...]

    def maps(self) -> dict[str, str]:
        """Label -> tensor of every map a detection pools over its box: per scale ``s``
        the neck's map (``neck_s``), the activated output of each branch convolution but
        the first (``branch<depth>_s``), ``phi``'s map (``phi_s``); then the named ones
        under their own names."""
        out: dict[str, str] = {}
        for layers in self.branches:
            if not layers:
                continue
            s = layers[0].scale
            out[f'neck_s{s}'] = layers[-1].input_tensor
            for layer in reversed(layers[1:]):
                out[f'branch{layer.depth}_s{s}'] = layer.activated_tensor
            out[f'phi_s{s}'] = layers[0].activated_tensor
        for name in self.named:
            out.setdefault(name, name)
        return out

    @property
    def tensors(self) -> list[str]:
        """Every tensor the session must return for these taps."""
        names = set(self.maps().values())
        for layers in self.branches:
            for layer in layers[:1]:
                names |= {layer.input_tensor, layer.output_tensor}
        return sorted(names)

    def describe(self) -> dict[str, Any]:
        """Which tensors were read, for reports."""
        return {'maps': self.maps(),
                'branch': [[{'scale': layer.scale, 'depth': layer.depth, 'node': layer.node,
                             'weight': list(layer.weight.shape),
                             'activation': layer.activation} for layer in layers]
                           for layers in self.branches]}


def _activation_input(graph: _Graph, tensor: str) -> tuple[str, float, str] | None:
    """``(activation, slope, pre-activation tensor)`` of the node making ``tensor``; a
    convolution's own output is ``identity``; None for anything else."""
    node = graph.producer.get(tensor)
    if node is None:
        return None
    if node.op_type == 'Conv':
        return 'identity', 0.0, tensor
    if node.op_type == 'Mul' and len(node.input) == 2:
        for x, s in (node.input, node.input[::-1]):
            gate = graph.producer.get(s)
            if gate is not None and gate.op_type == 'Sigmoid' and gate.input[0] == x:
                return 'silu', 0.0, x
        return None
    kinds = {'Sigmoid': 'sigmoid', 'Relu': 'relu', 'LeakyRelu': 'leaky_relu'}
    if node.op_type in kinds:
        slope = float(_attributes(node).get('alpha', 0.01)) if node.op_type == 'LeakyRelu' \
            else 0.0
        return kinds[node.op_type], slope, node.input[0]
    return None


def _branch(graph: _Graph, scale: int, phi: str, depth: int) -> tuple[BranchLayer, ...]:
    layers: list[BranchLayer] = []
    current = phi
    for level in range(1, depth + 1):
        found = _activation_input(graph, current)
        if found is None:
            break
        activation, slope, pre = found
        conv = graph.producer.get(pre)
        if conv is None or conv.op_type != 'Conv':
            break
        weight = graph.constant(conv.input[1]) if len(conv.input) > 1 else None
        attrs = _attributes(conv)
        # A grouped (depthwise) convolution's patch is not its whole input: not read here.
        if weight is None or weight.ndim != 4 or attrs.get('group', 1) != 1:
            break
        bias = graph.constant(conv.input[2]) if len(conv.input) > 2 and conv.input[2] else \
            np.zeros(weight.shape[0], np.float32)
        if bias is None or attrs.get('auto_pad', b'NOTSET') not in (b'NOTSET', 'NOTSET'):
            break
        layers.append(BranchLayer(
            scale, level, conv.name, conv.input[0], pre, current, activation, slope,
            np.asarray(weight, np.float64), np.asarray(bias, np.float64).reshape(-1),
            tuple(attrs.get('strides', [1, 1])), tuple(attrs.get('pads', [0, 0, 0, 0])),
            tuple(attrs.get('dilations', [1, 1]))))
        current = conv.input[0]
    return tuple(layers)


def find_layer_taps(proto: Any, tap: FeatureTap, depth: int = BRANCH_DEPTH,
                    feature_nodes: Sequence[str] = ()) -> LayerTaps:
    """The class branch of every scale of ``tap`` (convolution class nodes only) up to
    ``depth`` convolutions, and the tensors of ``feature_nodes`` (module docstring).

    Raises
    ------
    ValueError
        When a name of ``feature_nodes`` is neither a node nor a tensor of the graph, or
        ``depth`` is negative.
    """
    if depth < 0:
        raise ValueError(f'depth must be >= 0, got {depth}')
    graph = _Graph(proto)
    branches = tuple(_branch(graph, s, node.feature_tensor, depth) if node.op_type == 'Conv'
                     else () for s, node in enumerate(tap.nodes))
    by_node = {n.name: n.output[0] for n in proto.graph.node if n.name and n.output}
    tensors = set(graph.producer) | {i.name for i in proto.graph.input}
    named = []
    for name in feature_nodes:
        if name in by_node:
            named.append(by_node[name])
        elif name in tensors:
            named.append(name)
        else:
            raise ValueError(f'feature node {name!r} is neither a node nor a tensor of the '
                             'graph')
    return LayerTaps(branches, tuple(dict.fromkeys(named)))


# ------------------------------------------------------------------ per-detection reads


def cell_centres(shape: tuple[int, int], input_size: tuple[int, int]
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Input-pixel centres ``(x, y)`` of a ``(h, w)`` map's cells, each ``(h, w)``, the map
    spanning the network input ``(height, width)``."""
    h, w = shape
    height, width = input_size
    y, x = np.meshgrid((np.arange(h) + 0.5) * height / h, (np.arange(w) + 0.5) * width / w,
                       indexing='ij')
    return x, y


def box_pool(feature_map: np.ndarray, boxes_xyxy: np.ndarray, input_size: tuple[int, int]
             ) -> np.ndarray:
    """``(K, C)``: the mean of a ``(C, h, w)`` map over the cells whose centre lies in each
    input-pixel box ``x1, y1, x2, y2`` (edges included); the cell holding the box's centre
    when no centre does (a box smaller than a cell)."""
    fmap = np.asarray(feature_map, np.float64)
    channels, h, w = fmap.shape
    x, y = cell_centres((h, w), input_size)
    flat = fmap.reshape(channels, -1)
    out = np.empty((len(boxes_xyxy), channels))
    height, width = input_size
    for k, (x1, y1, x2, y2) in enumerate(np.asarray(boxes_xyxy, np.float64)):
        inside = ((x >= x1) & (x <= x2) & (y >= y1) & (y <= y2)).ravel()
        if inside.any():
            out[k] = flat[:, inside].mean(axis=1)
        else:
            col = int(np.clip((x1 + x2) / 2 * w / width, 0, w - 1))
            row = int(np.clip((y1 + y2) / 2 * h / height, 0, h - 1))
            out[k] = fmap[:, row, col]
    return out


def patches(feature_map: np.ndarray, layer: BranchLayer, cells: np.ndarray) -> np.ndarray:
    """``(K, in kh kw)``: the input patch of ``layer`` at each output cell ``(row, col)`` of
    ``cells`` ``(K, 2)``, zero where it reaches past the map (the padding), flattened in the
    order of the weight's ``(in, kh, kw)``."""
    fmap = np.asarray(feature_map, np.float64)
    channels, h, w = fmap.shape
    kh, kw = layer.weight.shape[2:]
    (sh, sw), (top, left, _, _), (dh, dw) = layer.strides, layer.pads, layer.dilations
    out = np.zeros((len(cells), channels, kh, kw))
    for k, (row, col) in enumerate(np.asarray(cells, np.int64)):
        for a in range(kh):
            i = row * sh - top + a * dh
            if not 0 <= i < h:
                continue
            for b in range(kw):
                j = col * sw - left + b * dw
                if 0 <= j < w:
                    out[k, :, a, b] = fmap[:, i, j]
    return out.reshape(len(cells), -1)


def anchor_cells(anchors: np.ndarray, scale_sizes: Sequence[int], shapes: Sequence[tuple[int, int]]
                 ) -> tuple[np.ndarray, np.ndarray]:
    """The scale of each anchor index (over all scales, in the head's order) and its
    ``(row, col)`` on that scale's ``(h, w)`` map."""
    a = np.asarray(anchors, np.int64)
    starts = np.cumsum([0, *scale_sizes])
    scale = np.searchsorted(starts, a, side='right') - 1
    local = a - starts[scale]
    widths = np.array([shape[1] for shape in shapes])[scale]
    return scale, np.stack([local // widths, local % widths], axis=1)
