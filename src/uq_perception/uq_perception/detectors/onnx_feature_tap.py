"""The feature tap of an ONNX detector: which node makes its class logits (ROS-free).

:func:`find_feature_tap` finds the node(s) producing the class logits: named explicitly,
or automatically for two layouts (:class:`HeadLayout`):

- ``yolo``: one output ``(1, 4 + C, N)`` over ``N`` anchors of several scales, each
  scale's class scores made by a 1x1 convolution with ``C`` output channels
  (YOLOv8/11-style heads). Boxes are the first four rows.
- ``detr``: per-query outputs, boxes ``(1, Q, 4)`` and class logits ``(1, Q, C)`` (two
  outputs, or one ``(1, Q, 4 + C)``), the logits made by a final linear layer
  (MatMul + Add, or Gemm) on the per-query features.

An output already reduced in the graph, one row ``box, score, class`` per kept detection
(``(1, K, 6)``), is read through the graph's own selection when ``TopK`` nodes make it:

- one ``TopK`` over the flattened ``(Q x C)`` class scores (Ultralytics' RT-DETR export):
  row ``k`` is query ``index_k // C`` and class ``index_k mod C``;
- two (Ultralytics' end-to-end YOLO exports, YOLO26 with ``nms=False``): a first ``TopK``
  keeps anchors by their best score, a second the ``(kept anchor x C)`` pairs; row ``k``
  is anchor ``first_k'`` with ``k' = index_k // C``. The class nodes are found as for a
  YOLO output, on the un-reduced ``(1, 4 + C, N)`` tensor inside the graph.

The choice is checked on the probe input: the output's classes must be ``index mod C`` and
its scores those of the mapped anchors. An anchor or query kept with several classes is
one candidate, with its top class (its first row: the rows come by descending score), as
the un-reduced output gives it. Other reductions (in-graph non-maximum suppression) are
refused in one line.

Candidates are linear nodes (1x1 Conv, Gemm, MatMul [+ Add]) with constant weights; the
tap keeps those whose outputs, passed through the model's own activation (none, sigmoid
or softmax), reproduce the class part of the model's output on a probe input. ``W`` and
``b`` are read from the node's initialisers.

For a YOLO head whose scales have separate class convolutions, ``phi`` of an anchor of
scale ``s`` is the block vector with ``[phi_s; 1]`` in block ``s`` and zeros elsewhere, and
``W = [W_1 b_1 | W_2 b_2 | ...]``, ``b = 0``: one linear head, exact, whose last-layer
kernel is that of the separate per-scale parameters.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from uq_common.str_enum import StrEnum
from uq_perception.detectors.contract import LinearHead

#: Largest deviation (relative to ``max(1, |value|)``) between a class node's activated
#: output and the model's class output for the node to count as the class-logit node.
MATCH_TOLERANCE = 1e-4
# Last sizes of an output that is one row per kept detection (box 4, score, class; some
# exports add a batch or mask index): no class logits are left to match.
REDUCED_WIDTHS = (6, 7)


class HeadLayout(StrEnum):
    """How the model's outputs are laid out (module docstring)."""

    AUTO = 'auto'
    YOLO = 'yolo'
    DETR = 'detr'


class ScoreActivation(StrEnum):
    """Map from class logits to class probabilities (the score is their maximum)."""

    AUTO = 'auto'  # the activation found in the graph; sigmoid when the output is raw logits
    SIGMOID = 'sigmoid'
    SOFTMAX = 'softmax'


def activate(logits: np.ndarray, activation: ScoreActivation) -> np.ndarray:
    x = np.asarray(logits, np.float64)
    if activation is ScoreActivation.SOFTMAX:
        e = np.exp(x - x.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)
    return 0.5 * (1.0 + np.tanh(0.5 * x))  # the sigmoid, without overflow warnings


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


def with_outputs(proto: Any, names: Sequence[str]) -> bytes:
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


def infer_types(proto: Any) -> Any:
    import onnx

    try:
        return onnx.shape_inference.infer_shapes(proto)
    except Exception:  # noqa: BLE001 - inference is a convenience; float32 is assumed without it
        return proto


# ---------------------------------------------------------------------------- the tap


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
        if _deviation(activate(logits, activation), target) <= MATCH_TOLERANCE:
            return activation
    return None


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
    kept_index, kept_anchors
        For an output reduced in the graph: the indices tensor of the ``TopK`` that chose its
        rows, and of the first ``TopK`` that chose the anchors it picks from when there are
        two (module docstring); None otherwise.
    """

    layout: HeadLayout
    nodes: tuple[ClassNode, ...]
    scale_sizes: tuple[int, ...]
    head: LinearHead
    stacked: bool
    output_activation: str
    class_output: str
    box_output: str
    kept_index: str | None = None
    kept_anchors: str | None = None

    @property
    def tensors(self) -> list[str]:
        """Graph tensors the session must return: every node's features and logits, and
        the indices of the kept rows of a reduced output."""
        names: list[str] = []
        for node in self.nodes:
            names += [node.feature_tensor, node.logit_tensor]
        names += [t for t in (self.kept_index, self.kept_anchors) if t is not None]
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


# What a reduced output's scores may be of the logits (None: the logits themselves).
_KEPT_ACTIVATIONS: tuple[ScoreActivation | None, ...] = (
    None, ScoreActivation.SIGMOID, ScoreActivation.SOFTMAX)


def _kept_selection(out: np.ndarray, scores: np.ndarray, values: dict[str, np.ndarray],
                    topks: Sequence[Any]) -> tuple[str, str | None] | None:
    """The TopK index tensors that chose the rows of the reduced output ``out`` ``(1, K, 6+)``
    from the per-anchor class scores ``scores`` ``(N, C)``: the last TopK's (over ``anchor x
    class`` pairs) and, for two stages, the first's (over anchors); or None.

    Row ``k`` is anchor ``index_k // C`` (of the first stage's kept anchors, with two
    stages) and class ``index_k mod C``. The choice is accepted only when, on the probe
    input, the output's classes are ``index mod C`` and its scores are those anchors' scores
    of those classes.
    """
    kept, classes = out.shape[1], scores.shape[1]
    for last in topks:
        top, index = values.get(last.output[0]), values.get(last.output[1])
        if top is None or index is None or index.shape != (1, kept) \
                or _deviation(out[0, :, 4], top.reshape(-1)) > MATCH_TOLERANCE \
                or not np.array_equal(out[0, :, 5], (index[0] % classes).astype(out.dtype)):
            continue
        for first in [None, *(t for t in topks if t is not last)]:
            rows = index[0] // classes
            if first is not None:
                anchors = values.get(first.output[1])
                if anchors is None or anchors.ndim != 2 or anchors.shape[0] != 1 \
                        or rows.max(initial=0) >= anchors.shape[1]:
                    continue
                rows = anchors[0][rows]
            if rows.min(initial=0) < 0 or rows.max(initial=0) >= len(scores):
                continue
            if _deviation(scores[rows, index[0] % classes], out[0, :, 4]) <= MATCH_TOLERANCE:
                return last.output[1], None if first is None else first.output[1]
    return None


def _find_reduced(outputs: dict[str, np.ndarray], values: dict[str, np.ndarray],
                  candidates: Sequence[ClassNode], topks: Sequence[Any],
                  inner: Sequence[str], explicit: bool) -> FeatureTap | None:
    """The tap of an output reduced by TopK selection (module docstring), or None.

    ``inner`` names graph tensors that may be the un-reduced YOLO output ``(1, 4 + C, N)``
    the selection reads.
    """
    for name, out in outputs.items():
        if out.ndim != 3 or out.shape[0] != 1 or out.shape[2] not in REDUCED_WIDTHS:
            continue
        for tensor in inner:
            yolo = _find_yolo({tensor: values[tensor]}, values, candidates, explicit)
            if yolo is None:
                continue
            rows = values[tensor][0, 4:, :].T
            # The kept scores are the tensor's class rows, or the activation of its logits.
            for activation in _KEPT_ACTIVATIONS:
                if activation is not None and yolo.output_activation != 'identity':
                    continue
                scores = rows if activation is None else activate(rows, activation)
                chosen = _kept_selection(out, scores, values, topks)
                if chosen is not None:
                    return replace(yolo, box_output=name, kept_index=chosen[0],
                                   kept_anchors=chosen[1], output_activation=str(
                                       yolo.output_activation if activation is None
                                       else activation))
        for candidate in candidates:
            logits = values[candidate.logit_tensor]
            logits = logits[0] if logits.ndim == 3 and logits.shape[0] == 1 else logits
            if logits.ndim != 2:
                continue
            for activation in _KEPT_ACTIVATIONS:
                scores = logits if activation is None else activate(logits, activation)
                chosen = _kept_selection(out, scores, values, topks)
                if chosen is not None:
                    return FeatureTap(HeadLayout.DETR, (candidate,), (len(logits),),
                                      candidate.head, False,
                                      'identity' if activation is None else str(activation),
                                      name, name, chosen[0], chosen[1])
    return None


#: Why a softmax head with a trailing "no object" class is refused (one line).
NO_OBJECT_REFUSAL = (
    'its class head is a softmax over C + 1 logits whose last is "no object" (the original '
    'DETR): the GP and the score take every logit for a class of its own, and no head over the '
    'C real classes exists in the graph; export a model with per-class sigmoid logits '
    '(RT-DETR, Deformable DETR)')


def _no_object_softmax(outputs: dict[str, np.ndarray], values: dict[str, np.ndarray],
                       candidates: Sequence[ClassNode]) -> str | None:
    """The output that is ``softmax(logits)[..., :C]`` of a candidate with ``C + 1`` logits
    (a DETR head with its "no object" probability dropped), or None."""
    for name, out in outputs.items():
        if out.ndim != 3 or out.shape[0] != 1:
            continue
        for candidate in candidates:
            logits = values[candidate.logit_tensor]
            logits = logits[None] if logits.ndim == 2 else logits
            if logits.shape[:2] != out.shape[:2] or logits.shape[2] != out.shape[2] + 1:
                continue
            probabilities = activate(logits, ScoreActivation.SOFTMAX)[..., :-1]
            if _deviation(probabilities, out) <= MATCH_TOLERANCE:
                return name
    return None


def find_feature_tap(proto: Any, run: Callable[[bytes], Mapping[str, np.ndarray]],
                     layout: HeadLayout = HeadLayout.AUTO,
                     class_nodes: Sequence[str] = ()) -> FeatureTap:
    """Find the class-logit node(s) of ``proto`` (module docstring).

    Parameters
    ----------
    proto
        The loaded ``onnx.ModelProto``.
    run
        Runs a serialised variant of the model on a probe input and returns every output
        by name (the tap compares the candidates' outputs with the model's on it).
    layout
        Which layouts to try.
    class_nodes
        Names of the class-logit nodes (node or output tensor names), in anchor order;
        empty: every candidate.

    Raises
    ------
    ValueError
        When no node, or no set of per-scale nodes, reproduces the model's class output.
    """
    graph = _Graph(proto)
    candidates = graph.linear_nodes()
    if class_nodes:
        candidates = _select_named(candidates, class_nodes)
    if not candidates:
        raise ValueError('the model has no linear node (1x1 Conv, Gemm or MatMul) with '
                         'constant weights that could produce class logits')
    model_outputs = [o.name for o in proto.graph.output]
    topks = [n for n in proto.graph.node if n.op_type == 'TopK' and len(n.output) == 2]
    # With a selection in the graph, its indices and the concatenations that may be the
    # un-reduced YOLO output are read too.
    selection = {t for n in topks for t in n.output}
    inner = sorted({n.output[0] for n in proto.graph.node if n.op_type == 'Concat'}) \
        if topks else []
    taps = sorted(({c.logit_tensor for c in candidates} | selection | set(inner))
                  - set(model_outputs))
    values = dict(run(with_outputs(infer_types(proto), taps)))
    outputs = {name: values[name] for name in model_outputs}
    tap = None
    if layout in (HeadLayout.AUTO, HeadLayout.YOLO):
        tap = _find_yolo(outputs, values, candidates, bool(class_nodes))
    if tap is None and layout in (HeadLayout.AUTO, HeadLayout.DETR):
        tap = _find_detr(outputs, values, candidates)
    if tap is None and layout in (HeadLayout.AUTO, HeadLayout.DETR):
        tap = _find_reduced(outputs, values, candidates, topks, inner, bool(class_nodes))
    if tap is None:
        no_object = _no_object_softmax(outputs, values, candidates)
        if no_object is not None:
            raise ValueError(f'the output {no_object} {tuple(outputs[no_object].shape)} is not '
                             f'supported: {NO_OBJECT_REFUSAL}')
        shapes = ', '.join(f'{n} {tuple(v.shape)}' for n, v in outputs.items())
        reduced = [n for n, v in outputs.items() if v.ndim == 3 and v.shape[-1] in
                   REDUCED_WIDTHS]
        if len(outputs) == 1 and reduced:
            suppression = any(n.op_type == 'NonMaxSuppression' for n in proto.graph.node)
            raise ValueError(
                f'the output {reduced[0]} {tuple(outputs[reduced[0]].shape)} is already '
                'reduced in the graph (box, score and class of each kept detection) and '
                + ('its rows come from in-graph non-maximum suppression, whose kept boxes '
                   'are not mapped back to anchors' if suppression else
                   'no TopK over the flattened class scores of a linear class node chose its '
                   'rows')
                + '; export the model without the in-graph reduction (Ultralytics: '
                'nms=False)')
        raise ValueError(
            f'no class-logit node found for layout {layout.value} (outputs: {shapes}): '
            'expected a YOLO output (1, 4 + C, N) made from per-scale 1x1 class convolutions, '
            'or DETR outputs (1, Q, 4) and (1, Q, C) from a final linear layer; name the '
            'node(s) with class_nodes, or set the layout')
    return tap


