"""The common export shapes that are not a plain YOLO or DETR output, on small networks built
here: an output reduced in the graph by a TopK over the flattened class scores (Ultralytics'
RT-DETR export), or by two (an end-to-end YOLO export: YOLO26 with nms=False), is read
through the graph's own indices; one reduced by in-graph
non-maximum suppression (YOLOv8 with nms=True) and a softmax head with a trailing "no
object" class (the original DETR) are refused in one line saying why; an RT-DETR named in
the file's metadata is stretched, not letterboxed."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

onnx = pytest.importorskip('onnx', reason='onnx is part of the CPU install (requirements/app.in)')
pytest.importorskip('onnxruntime', reason='onnxruntime is part of the CPU install')

from uq_perception.detectors.contract import check_linear_head  # noqa: E402 - after the skips
from uq_perception.runtime.onnx_adapter import (  # noqa: E402
    HeadLayout,
    OnnxAdapterConfig,
    OnnxDetector,
    ResizeMode,
)

SIZE = (64, 64)
CLASSES = 4
KEPT = 100  # more than the 64 queries: some are kept with several classes


class TopKDetr(nn.Module):
    """Set prediction with the selection of Ultralytics' RT-DETR export: the top ``KEPT``
    (query, class) pairs of the flattened sigmoid scores, each written as
    ``cx, cy, w, h, score, class`` of its query."""

    def __init__(self) -> None:
        super().__init__()
        self.backbone = nn.Sequential(nn.Conv2d(3, 16, 8, 8), nn.ReLU())
        self.mix = nn.Linear(16, 16)
        self.class_embed = nn.Linear(16, CLASSES)
        self.bbox_embed = nn.Linear(16, 4)

    def queries(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.mix(self.backbone(x).flatten(2).transpose(1, 2)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.queries(x)
        boxes, scores = self.bbox_embed(h).sigmoid(), self.class_embed(h).sigmoid()
        top, index = scores.flatten(1).topk(KEPT)
        query = torch.div(index, CLASSES, rounding_mode='floor')
        kept = boxes.gather(1, query.unsqueeze(-1).expand(-1, -1, 4))
        return torch.cat([kept, top[..., None], (index - query * CLASSES)[..., None].float()],
                         -1)


class NoObjectDetr(TopKDetr):
    """The original DETR's head: a softmax over ``C + 1`` logits whose last is "no object";
    ``dropped`` writes the class probabilities without it, else the raw logits."""

    def __init__(self, dropped: bool) -> None:
        super().__init__()
        self.dropped = dropped
        self.class_embed = nn.Linear(16, CLASSES + 1)

    def forward(self, x: torch.Tensor):
        h = self.queries(x)
        logits = self.class_embed(h)
        classes = logits.softmax(-1)[..., :-1] if self.dropped else logits
        return classes, self.bbox_embed(h).sigmoid()


def test_an_output_reduced_by_a_topk_is_read_through_the_graphs_indices(tmp_path, toy):
    torch.manual_seed(0)
    model = TopKDetr().eval()
    detector = OnnxDetector(toy.export(model, SIZE, tmp_path / 'topk.onnx', ['output0']))
    assert detector.tap.layout is HeadLayout.DETR and detector.tap.kept_index is not None
    np.testing.assert_array_equal(detector.head().weight,
                                  model.class_embed.weight.detach().numpy())
    image = toy.scene(4, SIZE)
    found = detector.infer(image, 0.0, 100)
    check_linear_head(detector.head(), found.embeddings, found.logits, 1e-4)
    # The reference, in torch: the kept pairs' queries, each once at its best pair.
    with torch.no_grad():
        x = torch.from_numpy(image.astype(np.float32) / 255).permute(2, 0, 1)[None]
        h = model.queries(x)[0]
        scores = model.class_embed(h).sigmoid()
        boxes = model.bbox_embed(h).sigmoid() * SIZE[0]
    pairs = torch.topk(scores.flatten(), KEPT).indices // CLASSES
    queries = list(dict.fromkeys(pairs.tolist()))
    assert len(found) == len(queries) < KEPT
    np.testing.assert_allclose(found.embeddings, h[queries].numpy(), atol=1e-5)
    np.testing.assert_allclose(found.scores, scores[queries].max(1).values.numpy(), atol=1e-5)
    np.testing.assert_allclose(found.boxes, boxes[queries].numpy(), atol=1e-3)


class EndToEndYolo(nn.Module):
    """A multi-scale YOLO head with the selection of Ultralytics' end-to-end export: the top
    ``anchors`` anchors by best score, then the top ``anchors`` (anchor, class) pairs among
    them, each written as ``x1, y1, x2, y2, score, class``."""

    def __init__(self, yolo: nn.Module, anchors: int) -> None:
        super().__init__()
        self.yolo, self.anchors = yolo, anchors

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        boxes, scores = self.yolo(x).permute(0, 2, 1).split([4, self.yolo.num_classes], -1)
        xyxy = torch.cat([boxes[..., :2] - boxes[..., 2:] / 2,
                          boxes[..., :2] + boxes[..., 2:] / 2], -1)
        first = scores.max(-1).values.topk(self.anchors).indices
        among = scores.gather(1, first.unsqueeze(-1).expand(-1, -1, scores.shape[-1]))
        top, index = among.flatten(1).topk(self.anchors)
        anchor = first.gather(1, torch.div(index, scores.shape[-1], rounding_mode='floor'))
        kept = xyxy.gather(1, anchor.unsqueeze(-1).expand(-1, -1, 4))
        label = index - torch.div(index, scores.shape[-1], rounding_mode='floor') \
            * scores.shape[-1]
        return torch.cat([kept, top[..., None], label[..., None].float()], -1)


def test_an_end_to_end_yolo_output_is_read_through_its_two_selections(tmp_path, toy):
    torch.manual_seed(3)
    yolo = toy.TinyYolo().eval()
    size = (96, 128)
    detector = OnnxDetector(toy.export(EndToEndYolo(yolo, 30).eval(), size,
                                       tmp_path / 'end2end.onnx', ['output0']))
    tap = detector.tap
    assert tap.layout is HeadLayout.YOLO and tap.stacked and len(tap.nodes) == 3
    assert tap.kept_index is not None and tap.kept_anchors is not None
    assert detector.box_format.value == 'xyxy' and detector.nms.value == 'none'
    image = toy.scene(6, size)
    found = detector.infer(image, 0.0, 100)
    check_linear_head(detector.head(), found.embeddings, found.logits, 1e-4)
    with torch.no_grad():
        x = torch.from_numpy(image.astype(np.float32) / 255).permute(2, 0, 1)[None]
        out = yolo(x)[0].T
    scores, boxes = out[:, 4:], out[:, :4]
    first = scores.max(1).values.topk(30).indices
    pairs = scores[first].flatten().topk(30).indices // scores.shape[1]
    anchors = list(dict.fromkeys(first[pairs].tolist()))
    assert len(found) == len(anchors)
    np.testing.assert_allclose(found.scores, scores[anchors].max(1).values.numpy(), atol=1e-5)
    # The contract clips boxes to the image.
    centre, extent = boxes[anchors, :2].numpy(), boxes[anchors, 2:].numpy()
    xyxy = np.clip(np.c_[centre - extent / 2, centre + extent / 2], 0, [128, 96, 128, 96])
    np.testing.assert_allclose(found.boxes, np.c_[(xyxy[:, :2] + xyxy[:, 2:]) / 2,
                                                  xyxy[:, 2:] - xyxy[:, :2]], atol=1e-3)
    # Each detection's features are its anchor's scale block.
    scale_of = np.searchsorted(np.cumsum([192, 48, 12]), anchors, side='right')
    np.testing.assert_array_equal(found.embeddings[:, [16, 33, 50]],
                                  np.eye(3, dtype=np.float32)[scale_of])


def _suppressed_export(path) -> None:
    """A YOLO-style graph that ends in ONNX NonMaxSuppression and writes one row per kept
    box, as YOLOv8's nms=True export does (built node by node: no exporter writes it from
    torch without torchvision)."""
    helper, tensor = onnx.helper, onnx.TensorProto
    rng = np.random.default_rng(0)

    def const(name, value, kind=tensor.FLOAT):
        return helper.make_tensor(name, kind, value.shape, value.flatten().tolist())

    nodes = [
        helper.make_node('Conv', ['images', 'w_stem', 'b_stem'], ['stem'], strides=[8, 8],
                         kernel_shape=[8, 8]),
        helper.make_node('Relu', ['stem'], ['phi']),
        helper.make_node('Conv', ['phi', 'w_cls', 'b_cls'], ['logits']),
        helper.make_node('Sigmoid', ['logits'], ['prob']),
        helper.make_node('Reshape', ['prob', 'shape_scores'], ['scores']),  # (1, C, N)
        helper.make_node('Conv', ['phi', 'w_box', 'b_box'], ['raw_boxes']),
        helper.make_node('Reshape', ['raw_boxes', 'shape_scores_box'], ['boxes_cn']),
        helper.make_node('Transpose', ['boxes_cn'], ['boxes'], perm=[0, 2, 1]),  # (1, N, 4)
        helper.make_node('NonMaxSuppression', ['boxes', 'scores', 'max_out', 'iou', 'thr'],
                         ['selected']),
        helper.make_node('Gather', ['selected', 'two'], ['anchor'], axis=1),
        helper.make_node('Gather', ['selected', 'one'], ['label'], axis=1),
        helper.make_node('Gather', ['boxes', 'anchor'], ['kept_boxes'], axis=1),
        helper.make_node('Squeeze', ['kept_boxes', 'zero'], ['kept_boxes_2d']),
        helper.make_node('Cast', ['label'], ['label_f'], to=tensor.FLOAT),
        helper.make_node('Unsqueeze', ['label_f', 'one_axis'], ['label_col']),
        helper.make_node('Concat', ['kept_boxes_2d', 'label_col', 'label_col'], ['rows'],
                         axis=1),
        helper.make_node('Unsqueeze', ['rows', 'zero'], ['output0']),
    ]
    initialisers = [
        const('w_stem', rng.standard_normal((6, 3, 8, 8)).astype(np.float32) * 0.1),
        const('b_stem', np.zeros(6, np.float32)),
        const('w_cls', rng.standard_normal((CLASSES, 6, 1, 1)).astype(np.float32)),
        const('b_cls', np.zeros(CLASSES, np.float32)),
        const('w_box', rng.random((4, 6, 1, 1)).astype(np.float32)),
        const('b_box', np.zeros(4, np.float32)),
        const('shape_scores', np.array([1, CLASSES, -1]), tensor.INT64),
        const('shape_scores_box', np.array([1, 4, -1]), tensor.INT64),
        const('max_out', np.array([5]), tensor.INT64),
        const('iou', np.array([0.5], np.float32)),
        const('thr', np.array([0.0], np.float32)),
        const('two', np.array(2), tensor.INT64),
        const('one', np.array(1), tensor.INT64),
        const('zero', np.array([0]), tensor.INT64),
        const('one_axis', np.array([1]), tensor.INT64),
    ]
    graph = helper.make_graph(
        nodes, 'suppressed', [helper.make_tensor_value_info('images', tensor.FLOAT,
                                                            [1, 3, *SIZE])],
        [helper.make_tensor_value_info('output0', tensor.FLOAT, None)], initialisers)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid('', 17)]), path)


def test_an_output_reduced_by_in_graph_suppression_is_refused_saying_so(tmp_path):
    path = tmp_path / 'suppressed.onnx'
    _suppressed_export(path)
    with pytest.raises(ValueError, match=r'reduced in the graph .* its rows come from in-graph '
                                         r'non-maximum suppression.*nms=False\)$'):
        OnnxDetector(path)


def test_a_softmax_head_with_a_no_object_class_is_refused_in_one_line(tmp_path, toy):
    torch.manual_seed(1)
    dropped = toy.export(NoObjectDetr(dropped=True).eval(), SIZE, tmp_path / 'dropped.onnx',
                         ['pred_probs', 'pred_boxes'])
    with pytest.raises(ValueError, match=r'the output pred_probs \(1, 64, 4\) is not supported: '
                                         r'its class head is a softmax over C \+ 1 logits'):
        OnnxDetector(dropped)
    # Raw C + 1 logits (the Hugging Face export) look like C + 1 sigmoid classes; the C class
    # names (given, or in the file's names metadata) tell them apart.
    raw = toy.export(NoObjectDetr(dropped=False).eval(), SIZE, tmp_path / 'raw.onnx',
                     ['logits', 'pred_boxes'])
    assert OnnxDetector(raw).num_classes == CLASSES + 1
    names = tuple(f'kind_{i}' for i in range(CLASSES))
    with pytest.raises(ValueError) as refused:
        OnnxDetector(raw, OnnxAdapterConfig(class_names=names))
    message = str(refused.value)
    assert '4 class names for 5 logits' in message and '"no object"' in message
    assert '\n' not in message
    proto = onnx.load(raw)
    onnx.helper.set_model_props(proto, {'names': repr(dict(enumerate(names)))})
    onnx.save(proto, tmp_path / 'named.onnx')
    with pytest.raises(ValueError, match='4 class names for 5 logits'):
        OnnxDetector(tmp_path / 'named.onnx')


def test_an_rtdetr_named_in_the_metadata_is_stretched(tmp_path, toy):
    torch.manual_seed(2)
    path = toy.export(toy.TinyDetr(num_classes=3).eval(), SIZE, tmp_path / 'detr.onnx',
                      ['pred_logits', 'pred_boxes'])
    assert OnnxDetector(path).config.resize is ResizeMode.LETTERBOX
    proto = onnx.load(path)
    onnx.helper.set_model_props(proto, {'description': 'Ultralytics rtdetr-l model ',
                                        'head': 'RTDETRDecoder'})
    onnx.save(proto, tmp_path / 'rtdetr.onnx')
    detector = OnnxDetector(tmp_path / 'rtdetr.onnx')
    assert detector.config.resize is ResizeMode.STRETCH
    assert detector.describe()['resize'] == 'stretch'
    # A setting wins over the metadata, and the network then sees another input.
    image = toy.scene(3, (64, 160))
    boxed = OnnxDetector(tmp_path / 'rtdetr.onnx', OnnxAdapterConfig(resize='letterbox'))
    assert boxed.config.resize is ResizeMode.LETTERBOX
    assert not np.allclose(detector.infer(image, 0.0, 12).scores,
                           boxed.infer(image, 0.0, 12).scores)
