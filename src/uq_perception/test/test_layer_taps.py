"""Layer taps of an ONNX detector: on a small YOLOv8-style network written here in torch and
exported to ONNX, the taps find its class branch (two 3x3 convolutions before the 1x1 class
layer) and the neck map that feeds it, and what one forward pass returns per detection (the
box-pooled maps, the penultimate layer's input patch and output at the anchor) equals the
same quantities computed by hand from the torch network's own activations."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

pytest.importorskip('onnx', reason='onnx is part of the CPU install (requirements/app.in)')
pytest.importorskip('onnxruntime', reason='onnxruntime is part of the CPU install')

from uq_perception.detectors.layer_taps import (  # noqa: E402 - after the skips
    anchor_cells,
    box_pool,
    patches,
)
from uq_perception.runtime.onnx_adapter import OnnxAdapterConfig  # noqa: E402
from uq_perception.runtime.onnx_layers import OnnxLayerDetector  # noqa: E402

SIZE = (64, 96)
CLASSES = 3


class TinyYoloV8(nn.Module):
    """Two scales as in YOLOv8: a neck map per scale feeds a box branch and a class branch of
    two 3x3 convolutions with SiLU, then a 1x1 class convolution."""

    strides = (8, 16)

    def __init__(self, width: int = 8) -> None:
        super().__init__()

        def conv(cin: int, cout: int, stride: int = 1) -> nn.Module:
            return nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1), nn.SiLU())

        self.stem = nn.Sequential(conv(3, width, 2), conv(width, width, 2), conv(width, width, 2))
        self.down = conv(width, 2 * width, 2)
        self.box = nn.ModuleList([nn.Conv2d(c, 4, 1) for c in (width, 2 * width)])
        self.cls = nn.ModuleList([nn.Sequential(conv(c, width), conv(width, width),
                                                nn.Conv2d(width, CLASSES, 1))
                                  for c in (width, 2 * width)])

    def necks(self, x: torch.Tensor) -> list[torch.Tensor]:
        p3 = self.stem(x)
        return [p3, self.down(p3)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        outs, anchors, strides = [], [], []
        for i, (feat, stride) in enumerate(zip(self.necks(x), self.strides, strict=True)):
            b, _, h, w = feat.shape
            outs.append(torch.cat([self.box[i](feat), self.cls[i](feat)], 1).view(
                b, 4 + CLASSES, -1))
            ys, xs = torch.meshgrid(torch.arange(h, dtype=x.dtype) + 0.5,
                                    torch.arange(w, dtype=x.dtype) + 0.5, indexing='ij')
            anchors.append(torch.stack([xs.reshape(-1), ys.reshape(-1)]))
            strides.append(torch.full((1, h * w), float(stride)))
        raw = torch.cat(outs, 2)
        box, cls = raw.split((4, CLASSES), 1)
        ltrb = F.softplus(box)
        anchor, stride = torch.cat(anchors, 1), torch.cat(strides, 1)
        x1y1, x2y2 = anchor - ltrb[:, :2], anchor + ltrb[:, 2:]
        return torch.cat([(x1y1 + x2y2) / 2 * stride, (x2y2 - x1y1) * stride, cls.sigmoid()], 1)


@pytest.fixture(scope='module')
def tapped(tmp_path_factory, toy):
    torch.manual_seed(3)
    model = TinyYoloV8().eval()
    path = toy.export(model, SIZE, tmp_path_factory.mktemp('yolo8') / 'tiny.onnx', ['output0'])
    detector = OnnxLayerDetector(path, OnnxAdapterConfig(layout='yolo', resize='stretch'))
    return model, detector


def test_taps_find_the_class_branch_and_the_neck(tapped):
    model, detector = tapped
    branches = detector.layers.branches
    assert len(branches) == 2 and all(len(layers) == 2 for layers in branches)
    for s, layers in enumerate(branches):
        nearest, before = layers
        assert (nearest.scale, nearest.depth, before.depth) == (s, 1, 2)
        assert nearest.activation == before.activation == 'silu'
        # The convolutions are the torch model's, in order: depth 1 is cls[s][1].
        torch_weights = [model.cls[s][k][0].weight.detach().numpy() for k in (1, 0)]
        for layer, expected in zip(layers, torch_weights, strict=True):
            assert np.allclose(layer.weight, expected, atol=1e-6)
        assert nearest.input_tensor == before.activated_tensor
    maps = detector.layers.maps()
    assert list(maps) == ['neck_s0', 'branch2_s0', 'phi_s0', 'neck_s1', 'branch2_s1', 'phi_s1']
    assert maps['phi_s0'] == detector.tap.nodes[0].feature_tensor


def test_named_feature_nodes(tapped):
    _, detector = tapped
    stem = [n for n in detector.layers.maps().values()][0]
    named = OnnxLayerDetector(detector.path, detector.config, feature_nodes=[stem])
    assert stem in named.layers.named and named.layers.maps()[stem] == stem
    # A node's name reads its first output.
    import onnx

    node = next(n for n in onnx.load(str(detector.path)).graph.node if n.output[0] == stem)
    by_node = OnnxLayerDetector(detector.path, detector.config, feature_nodes=[node.name])
    assert by_node.layers.named == (stem,)
    with pytest.raises(ValueError, match="feature node 'no_such' is neither"):
        OnnxLayerDetector(detector.path, detector.config, feature_nodes=['no_such'])


def test_taps_read_per_detection_equal_a_hand_computation(tapped, toy):
    model, detector = tapped
    image = toy.scene(5, SIZE)
    frame = detector.infer_layers(image, 0.3, 12)
    dets = frame.detections
    assert len(dets) >= 3
    x = torch.from_numpy(image).permute(2, 0, 1)[None].double() / 255.0
    model = copy.deepcopy(model).double()
    with torch.no_grad():
        necks = model.necks(x)
        hidden = [model.cls[s][0](n) for s, n in enumerate(necks)]
        pre = [model.cls[s][1][0](h) for s, h in enumerate(hidden)]
        phi = [F.silu(z) for z in pre]
    maps = {'neck': necks, 'branch2': hidden, 'phi': phi}
    shapes = [tuple(p.shape[2:]) for p in phi]
    scale, cells = anchor_cells(frame.anchors, detector.tap.scale_sizes, shapes)
    height, width = SIZE
    for k in range(len(dets)):
        x1, y1, x2, y2 = frame.boxes_input[k]
        s, (row, col) = int(scale[k]), cells[k]
        # The anchor: its phi is the detection's features (stacked block s), its class
        # convolution the detection's logits.
        block = dets.embeddings[k].reshape(-1)
        start = sum(p.shape[1] + 1 for p in phi[:s])
        assert np.allclose(block[start:start + phi[s].shape[1]], phi[s][0, :, row, col],
                           atol=1e-5)
        for kind, tensors in maps.items():
            for t, reference in enumerate(tensors):
                # The tapped map is the torch network's activation ...
                tensor = detector.layers.maps()[f'{kind}_s{t}']
                fmap = torch.from_numpy(frame.values[tensor]).double()
                assert torch.allclose(fmap, reference, atol=1e-5), (kind, t)
                _, c, h, w = fmap.shape
                # ... and its box pool, by hand: every cell whose centre is in the box, else
                # the centre's cell.
                centres_x = (torch.arange(w, dtype=torch.float64) + 0.5) * width / w
                centres_y = (torch.arange(h, dtype=torch.float64) + 0.5) * height / h
                inside = ((centres_y[:, None] >= y1) & (centres_y[:, None] <= y2)
                          & (centres_x[None, :] >= x1) & (centres_x[None, :] <= x2))
                if inside.any():
                    expected = fmap[0][:, inside].mean(dim=1)
                else:
                    expected = fmap[0][:, min(int((y1 + y2) / 2 * h / height), h - 1),
                                       min(int((x1 + x2) / 2 * w / width), w - 1)]
                pooled = box_pool(frame.values[tensor][0], frame.boxes_input[k:k + 1],
                                  detector.input_size)[0]
                assert np.abs(pooled - expected.numpy()).max() < 1e-6, (kind, t)
        # The penultimate layer at the anchor: its input patch (torch's unfold) and output.
        nearest = detector.layers.branches[s][0]
        patch = patches(frame.values[nearest.input_tensor][0], nearest, cells[k:k + 1])[0]
        tapped_input = torch.from_numpy(frame.values[nearest.input_tensor]).double()
        unfolded = F.unfold(tapped_input, 3, padding=1)[0].reshape(-1, *shapes[s])
        assert np.abs(patch - unfolded[:, row, col].numpy()).max() < 1e-6
        z = frame.values[nearest.output_tensor][0][:, row, col]
        assert np.abs(z - pre[s][0, :, row, col].numpy()).max() < 1e-5
        assert np.abs(nearest.weight.reshape(len(z), -1) @ patch + nearest.bias - z).max() < 1e-5
    # The detections are infer's, from the same single pass.
    plain = detector.infer(image, 0.3, 12)
    assert np.array_equal(plain.boxes, dets.boxes) and np.array_equal(plain.logits, dets.logits)
