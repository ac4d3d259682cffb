"""The ONNX adapter on small YOLO-style and DETR-style networks written in torch (conftest.py) and
exported to ONNX in the test: the feature tap finds the class-logit nodes, every kept
detection's logits are ``W phi + b``, and boxes and scores match the torch model's own
inference (its own decode and NMS, written in torch below)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

pytest.importorskip('onnx', reason='onnx is part of the CPU install (requirements/app.in)')
pytest.importorskip('onnxruntime', reason='onnxruntime is part of the CPU install')

from uq_perception.detectors.contract import (  # noqa: E402 - after the skips
    check_linear_head,
    extract_features,
    gp_head_arguments,
)
from uq_perception.ntk import LastLayerNTKGP, NTKGPConfig  # noqa: E402
from uq_perception.runtime.onnx_adapter import (  # noqa: E402
    HeadLayout,
    NmsMode,
    OnnxAdapterConfig,
    OnnxDetector,
    ResizeMode,
    non_max_suppression,
)
from uq_perception.runtime.onnx_runtime import (  # noqa: E402
    OnnxRunner,
    OnnxRuntimeUnavailableError,
)

TOLERANCE = 1e-4


# ---------------------------------------------------------- the torch models' own inference


def torch_nms(boxes: torch.Tensor, scores: torch.Tensor, classes: torch.Tensor | None,
              iou: float) -> list[int]:
    """Greedy NMS written independently of the adapter's (pairwise IoU matrix in torch)."""
    x1, y1, x2, y2 = boxes.unbind(1)
    area = (x2 - x1).clamp(min=0) * (y2 - y1).clamp(min=0)
    ix1, iy1 = torch.max(x1[:, None], x1[None]), torch.max(y1[:, None], y1[None])
    ix2, iy2 = torch.min(x2[:, None], x2[None]), torch.min(y2[:, None], y2[None])
    inter = (ix2 - ix1).clamp(min=0) * (iy2 - iy1).clamp(min=0)
    union = area[:, None] + area[None] - inter
    overlap = torch.where(union > 0, inter / union.clamp(min=1e-12), torch.zeros_like(union))
    order = sorted(range(len(scores)), key=lambda i: (-float(scores[i]), i))
    kept: list[int] = []
    for i in order:
        if all(not (overlap[i, k] > iou and (classes is None or classes[i] == classes[k]))
               for k in kept):
            kept.append(i)
    return kept


def letterbox_reference(image: np.ndarray, size: tuple[int, int], pad: int
                        ) -> tuple[torch.Tensor, tuple[float, float], int, int]:
    """Resize keeping the aspect ratio, pad centred; the scale of each axis is that of the
    rounded resize."""
    import cv2

    h, w = image.shape[:2]
    ratio = min(size[0] / h, size[1] / w)
    nh, nw = round(h * ratio), round(w * ratio)
    top, left = (size[0] - nh) // 2, (size[1] - nw) // 2
    resized = cv2.resize(image, (nw, nh), interpolation=cv2.INTER_LINEAR)
    padded = np.pad(resized, ((top, size[0] - nh - top), (left, size[1] - nw - left), (0, 0)),
                    constant_values=pad)
    x = torch.from_numpy(padded).permute(2, 0, 1)[None].float() / 255.0
    return x, (nw / w, nh / h), left, top


@torch.no_grad()
def yolo_reference(model: nn.Module, image: np.ndarray, size: tuple[int, int],
                   threshold: float, iou: float = 0.7, limit: int = 100):
    x, ratio, left, top = letterbox_reference(image, size, 114)
    out = model(x)[0]
    probs = out[4:].T
    scores, classes = probs.max(1)
    keep = torch.nonzero(scores >= threshold).flatten()
    keep = keep[torch.argsort(-scores[keep], stable=True)]
    cx, cy, w, h = out[:4, keep]
    boxes = torch.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], 1)
    kept = torch_nms(boxes, scores[keep], classes[keep], iou)[:limit]
    boxes = boxes[kept]
    boxes[:, [0, 2]] = ((boxes[:, [0, 2]] - left) / ratio[0]).clamp(0, image.shape[1])
    boxes[:, [1, 3]] = ((boxes[:, [1, 3]] - top) / ratio[1]).clamp(0, image.shape[0])
    return boxes.numpy(), scores[keep][kept].numpy(), classes[keep][kept].numpy()


@torch.no_grad()
def detr_reference(model: nn.Module, image: np.ndarray, size: tuple[int, int],
                   threshold: float):
    x, ratio, left, top = letterbox_reference(image, size, 114)
    logits, boxes = model(x)
    scores, classes = logits[0].sigmoid().max(1)
    keep = torch.nonzero(scores >= threshold).flatten()
    keep = keep[torch.argsort(-scores[keep], stable=True)]
    cx, cy, w, h = (boxes[0, keep] * torch.tensor([size[1], size[0], size[1], size[0]])).T
    xyxy = torch.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], 1)
    xyxy[:, [0, 2]] = ((xyxy[:, [0, 2]] - left) / ratio[0]).clamp(0, image.shape[1])
    xyxy[:, [1, 3]] = ((xyxy[:, [1, 3]] - top) / ratio[1]).clamp(0, image.shape[0])
    return xyxy.numpy(), scores[keep].numpy(), classes[keep].numpy()


def to_xyxy(centre_size: np.ndarray) -> np.ndarray:
    c = centre_size.astype(np.float64)
    return np.column_stack([c[:, 0] - c[:, 2] / 2, c[:, 1] - c[:, 3] / 2,
                            c[:, 0] + c[:, 2] / 2, c[:, 1] + c[:, 3] / 2])


# ----------------------------------------------------------------------------- fixtures


YOLO_SIZE = (96, 128)
DETR_SIZE = (64, 64)


@pytest.fixture(scope='module')
def yolo(tiny_yolo):
    # TinyYolo of seed 0 at YOLO_SIZE, exported once for the test run (conftest.py).
    model, path, size = tiny_yolo
    assert size == YOLO_SIZE
    return model, path


@pytest.fixture(scope='module')
def detr(tmp_path_factory, toy):
    torch.manual_seed(1)
    model = toy.TinyDetr().eval()
    path = toy.export(model, DETR_SIZE, tmp_path_factory.mktemp('detr') / 'detr.onnx',
                  ['pred_logits', 'pred_boxes'])
    return model, path


# -------------------------------------------------------------------------------- tests


def assert_same_detections(dets, reference) -> None:
    """The same boxes with the same scores and classes; detections whose scores differ by
    float round-off only may come in either order."""
    boxes, scores, classes = reference
    assert len(dets) == len(scores) > 0
    np.testing.assert_allclose(dets.scores, scores, atol=TOLERANCE)
    found = to_xyxy(dets.boxes)
    unmatched = list(range(len(found)))
    for box, score, cls in zip(boxes, scores, classes, strict=True):
        match = [j for j in unmatched if np.abs(found[j] - box).max() <= 1e-3]
        assert len(match) == 1, f'reference box {box} found {len(match)} times'
        j = match[0]
        assert abs(dets.scores[j] - score) <= TOLERANCE and np.argmax(dets.logits[j]) == cls
        unmatched.remove(j)


@pytest.mark.parametrize('shape', [YOLO_SIZE, (150, 260)])
def test_yolo_head_is_tapped_and_matches_the_torch_inference(yolo, shape, toy):
    model, path = yolo
    detector = OnnxDetector(path)
    assert detector.tap.layout is HeadLayout.YOLO and len(detector.tap.nodes) == 3
    assert detector.tap.scale_sizes == (12 * 16, 6 * 8, 3 * 4)
    # Separate class convolutions per scale: the block head [W_s b_s], b = 0.
    assert detector.tap.stacked and detector.feature_dim == 3 * (16 + 1)
    head = detector.head()
    blocks = [np.concatenate([w, b[:, None]], 1) for w, b in model.class_weights()]
    np.testing.assert_array_equal(head.weight, np.concatenate(blocks, 1))
    assert not head.bias.any()
    for seed in range(3):
        image = toy.scene(seed, shape)
        dets = detector.infer(image, 0.3, 50)
        assert_same_detections(dets, yolo_reference(model, image, YOLO_SIZE, 0.3, limit=50))
        # Every kept detection: logits == W phi + b, and phi is one scale's block.
        check_linear_head(head, dets.embeddings, dets.logits, TOLERANCE)
        np.testing.assert_allclose(dets.logits, head.logits(dets.embeddings), atol=TOLERANCE)
        ones = dets.embeddings[:, [16, 33, 50]]
        assert (ones.sum(1) == 1).all() and set(np.unique(ones)) <= {0.0, 1.0}


def test_shared_class_convolution_gives_the_plain_features(tmp_path, toy):
    torch.manual_seed(2)
    model = toy.TinyYolo(num_classes=2, shared_classifier=True).eval()
    detector = OnnxDetector(toy.export(model, YOLO_SIZE, tmp_path / 'shared.onnx', ['output0']))
    assert not detector.tap.stacked and detector.feature_dim == 16
    (weight, bias), *_ = model.class_weights()
    np.testing.assert_array_equal(detector.head().weight, weight)
    image = toy.scene(5, YOLO_SIZE)
    dets = detector.infer(image, 0.2, 30)
    assert_same_detections(dets, yolo_reference(model, image, YOLO_SIZE, 0.2, limit=30))
    check_linear_head(detector.head(), dets.embeddings, dets.logits, TOLERANCE)


@pytest.mark.parametrize('shape', [DETR_SIZE, (90, 70)])
def test_detr_head_is_tapped_and_matches_the_torch_inference(detr, shape, toy):
    model, path = detr
    detector = OnnxDetector(path)
    assert detector.tap.layout is HeadLayout.DETR and detector.nms is NmsMode.NONE
    assert detector.tap.box_output == 'pred_boxes' and detector.tap.class_output == 'pred_logits'
    np.testing.assert_array_equal(detector.head().weight,
                                  model.class_embed.weight.detach().numpy())
    np.testing.assert_array_equal(detector.head().bias, model.class_embed.bias.detach().numpy())
    assert detector.feature_dim == 32 and detector.num_classes == 5
    for seed in range(3):
        image = toy.scene(seed, shape)
        dets = detector.infer(image, 0.2, 12)
        assert_same_detections(dets, detr_reference(model, image, DETR_SIZE, 0.2))
        check_linear_head(detector.head(), dets.embeddings, dets.logits, TOLERANCE)


def test_detr_single_output_and_four_classes_are_resolved(tmp_path, toy):
    torch.manual_seed(3)
    combined = toy.TinyDetr(num_classes=3, combined=True).eval()
    detector = OnnxDetector(toy.export(combined, DETR_SIZE, tmp_path / 'one.onnx', ['output0']))
    assert detector.tap.layout is HeadLayout.DETR and detector.tap.output_activation == 'sigmoid'
    combined.combined = False
    image = toy.scene(1, DETR_SIZE)
    dets = detector.infer(image, 0.1, 12)
    assert_same_detections(dets, detr_reference(combined, image, DETR_SIZE, 0.1))
    # Four classes: boxes and logits are both (1, Q, 4); the box output is known by name.
    torch.manual_seed(4)
    four = toy.TinyDetr(num_classes=4).eval()
    detector = OnnxDetector(toy.export(four, DETR_SIZE, tmp_path / 'four.onnx',
                                   ['pred_logits', 'pred_boxes']))
    np.testing.assert_array_equal(detector.head().weight, four.class_embed.weight.detach().numpy())
    dets = detector.infer(image, 0.1, 12)
    assert_same_detections(dets, detr_reference(four, image, DETR_SIZE, 0.1))


def test_explicit_class_nodes_and_layout(yolo, detr, toy):
    model, path = yolo
    auto = OnnxDetector(path)
    names = tuple(node.name for node in auto.tap.nodes)
    explicit = OnnxDetector(path, OnnxAdapterConfig(layout='yolo', class_nodes=names))
    assert [n.name for n in explicit.tap.nodes] == list(names)
    image = toy.scene(7, YOLO_SIZE)
    a, b = auto.infer(image, 0.3, 20), explicit.infer(image, 0.3, 20)
    np.testing.assert_array_equal(a.embeddings, b.embeddings)
    with pytest.raises(ValueError, match="class node 'no_such_node' is not a linear node"):
        OnnxDetector(path, OnnxAdapterConfig(class_nodes=('no_such_node',)))
    # The scales in the wrong order do not reproduce the output.
    with pytest.raises(ValueError, match='no class-logit node found'):
        OnnxDetector(path, OnnxAdapterConfig(class_nodes=names[::-1]))
    with pytest.raises(ValueError, match='no class-logit node found for layout detr'):
        OnnxDetector(path, OnnxAdapterConfig(layout='detr'))
    _, detr_path = detr
    with pytest.raises(ValueError, match='no class-logit node found for layout yolo'):
        OnnxDetector(detr_path, OnnxAdapterConfig(layout='yolo'))


def test_model_without_a_linear_head_is_refused(tmp_path, toy):
    path = toy.export(toy.NoLinearHead(), (32, 32), tmp_path / 'dense.onnx', ['out'])
    with pytest.raises(ValueError, match='no linear node'):
        OnnxDetector(path)


class ReducedDetr(nn.Module):
    """A DETR-style head whose graph already keeps the top queries and writes box, score and
    class per kept query, as Ultralytics' RT-DETR export and YOLO exports with nms=True do."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.width = width
        self.conv = nn.Conv2d(3, 8, 3, 4, 1)
        self.classes = nn.Linear(8, 5)
        self.boxes = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        queries = self.conv(x).flatten(2).transpose(1, 2)
        scores, labels = self.classes(queries).sigmoid().max(-1)
        keep = scores.topk(10, dim=1).indices

        def kept(t: torch.Tensor) -> torch.Tensor:
            return torch.gather(t, 1, keep.unsqueeze(-1).expand(-1, -1, t.shape[-1]))

        parts = [kept(self.boxes(queries).sigmoid()), kept(scores.unsqueeze(-1)),
                 kept(labels.float().unsqueeze(-1))]
        return torch.cat(parts + [torch.zeros_like(parts[1])] * (self.width - 6), -1)


@pytest.mark.parametrize('width', [6, 7])
def test_outputs_already_reduced_in_the_graph_are_refused_for_that_reason(tmp_path, toy, width):
    torch.manual_seed(0)
    path = toy.export(ReducedDetr(width).eval(), (32, 32), tmp_path / 'reduced.onnx', ['out'])
    with pytest.raises(ValueError, match=rf'the output out \(1, 10, {width}\) is already '
                                         r'reduced in the graph.*nms=False'):
        OnnxDetector(path)


def test_settings_change_the_processing(yolo, toy):
    _, path = yolo
    image = toy.scene(3, (150, 260))
    stretched = OnnxDetector(path, OnnxAdapterConfig(resize=ResizeMode.STRETCH))
    boxed = OnnxDetector(path)
    a, b = stretched.infer(image, 0.0, 5), boxed.infer(image, 0.0, 5)
    assert not np.allclose(a.scores, b.scores)
    none = OnnxDetector(path, OnnxAdapterConfig(nms='none', max_candidates=50))
    assert len(none.infer(image, 0.0, 100)) == 50
    # Suppression across classes removes at least what suppression within a class does.
    agnostic = OnnxDetector(path, OnnxAdapterConfig(nms='agnostic', nms_iou=0.05,
                                                    max_candidates=50))
    per_class = OnnxDetector(path, OnnxAdapterConfig(nms='class', nms_iou=0.05,
                                                     max_candidates=50))
    assert 0 < len(agnostic.infer(image, 0.0, 100)) <= len(per_class.infer(image, 0.0, 100)) < 50
    named = OnnxDetector(path, OnnxAdapterConfig(class_names=('cup', 'box', 'ball')))
    assert named.class_names == ['cup', 'box', 'ball']
    with pytest.raises(ValueError, match='class_names has 2 names, the model has 3 classes'):
        OnnxDetector(path, OnnxAdapterConfig(class_names=('cup', 'box')))


@pytest.mark.parametrize('settings, message', [
    ({'layout': 'ssd'}, 'layout must be one of auto, yolo, detr'),
    ({'nms_iou': 0.0}, 'nms_iou must be in'),
    ({'nms_iou': float('nan')}, 'nms_iou must be in'),
    ({'std': (1.0, 0.0, 1.0)}, 'std must be positive'),
    ({'mean': (0.0, float('inf'), 0.0)}, 'mean must be 3 finite numbers'),
    ({'pad_value': 300}, 'pad_value must be an integer in'),
    ({'input_size': (0, 64)}, 'input_size must be'),
    ({'max_candidates': 0}, 'max_candidates must be'),
    ({'class_names': ('a', 'a')}, 'class_names must be unique'),
    ({'class_nodes': ('',)}, 'class_nodes must be'),
])
def test_invalid_settings_are_refused_by_rule(settings, message):
    with pytest.raises(ValueError, match=message):
        OnnxAdapterConfig(**settings)


def test_bad_images_and_files_are_refused(yolo, tmp_path):
    _, path = yolo
    detector = OnnxDetector(path)
    for bad in (np.zeros((10, 10), np.uint8), np.zeros((10, 10, 3), np.float32),
                np.zeros((0, 10, 3), np.uint8), 'image'):
        with pytest.raises(ValueError, match='image'):
            detector.infer(bad, 0.3, 5)
    corrupt = tmp_path / 'corrupt.onnx'
    corrupt.write_bytes(b'\x08\x07garbage')
    with pytest.raises(ValueError, match='not a readable ONNX model'):
        OnnxDetector(corrupt)
    with pytest.raises(ValueError, match='ONNX model file not found'):
        OnnxDetector(tmp_path / 'missing.onnx')


def test_missing_provider_is_one_clear_line(yolo):
    import onnxruntime

    _, path = yolo
    for provider, name in (('cuda', 'CUDAExecutionProvider'),
                           ('tensorrt', 'TensorrtExecutionProvider')):
        if name in onnxruntime.get_available_providers():
            continue
        with pytest.raises(OnnxRuntimeUnavailableError) as error:
            OnnxRunner(path, provider)
        assert '\n' not in str(error.value) and f'{provider} ({name}) is not available' in str(
            error.value)
    with pytest.raises(ValueError, match='unknown execution provider'):
        OnnxRunner(path, 'opencl')
    with pytest.raises(ValueError, match='threads must be an integer'):
        OnnxRunner(path, 'cpu', threads=0)
    runner = OnnxRunner(path, 'cpu', threads=2)
    assert runner.session.get_session_options().intra_op_num_threads == 2


def test_nms_suppresses_by_rule():
    boxes = np.array([[0, 0, 10, 10], [1, 1, 11, 11], [20, 20, 30, 30], [0, 0, 10, 10]], float)
    scores = np.array([0.9, 0.8, 0.7, 0.95])
    assert non_max_suppression(boxes, scores, 0.5).tolist() == [3, 2]
    assert non_max_suppression(boxes, scores, 0.5, np.array([0, 0, 0, 1])).tolist() == [3, 0, 2]
    assert non_max_suppression(boxes, scores, 1.0).tolist() == [3, 0, 1, 2]


def test_features_of_a_dataset_fit_a_gp_of_the_model_dimension(yolo, toy):
    _, path = yolo
    detector = OnnxDetector(path)
    images = [toy.scene(seed, (120, 160)) for seed in range(6)]
    features = extract_features(detector, images, 0.05, 20)
    assert len(features) > 20 and features.embeddings.shape[1] == detector.feature_dim == 51
    assert features.image_index.min() == 0 and features.image_index.max() == 5
    gp = LastLayerNTKGP(config=NTKGPConfig(num_experts=1), **gp_head_arguments(detector))
    gp.fit(features.embeddings)
    assert gp.model_id == detector.model_id and gp.feature_dim == 51
    out = gp.predict(features.embeddings[:5], features.logits[:5])
    assert out.gp_variance.shape == (5,) and np.isfinite(out.gp_variance).all()
