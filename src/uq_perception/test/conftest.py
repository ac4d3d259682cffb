"""Small detectors written here in torch, in the two head layouts the ONNX adapter reads,
and their export to ONNX: shared by the adapter and node tests (fixture ``toy``)."""

from __future__ import annotations

import logging
import types
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn


class TinyYolo(nn.Module):
    """Anchor-free three-scale head as in YOLOv8/11: per scale a box branch and a class
    branch ending in a 1x1 convolution; output ``(1, 4 + C, N)`` with ``cx, cy, w, h`` in
    input pixels and sigmoid class scores."""

    strides = (8, 16, 32)

    def __init__(self, num_classes: int = 3, width: int = 16, shared_classifier: bool = False
                 ) -> None:
        super().__init__()
        self.num_classes = num_classes

        def conv(cin: int, cout: int, stride: int = 1) -> nn.Module:
            return nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1), nn.SiLU())

        self.stem = nn.Sequential(conv(3, width, 2), conv(width, width, 2), conv(width, width, 2))
        self.down = nn.ModuleList([conv(width, width, 2), conv(width, width, 2)])
        self.box_branch = nn.ModuleList(
            [nn.Sequential(conv(width, width), nn.Conv2d(width, 4, 1)) for _ in self.strides])
        self.cls_trunk = nn.ModuleList([conv(width, width) for _ in self.strides])
        classifier = nn.Conv2d(width, num_classes, 1)
        self.cls_conv = nn.ModuleList(
            [classifier if shared_classifier else nn.Conv2d(width, num_classes, 1)
             for _ in self.strides])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        feats = [self.stem(x)]
        for down in self.down:
            feats.append(down(feats[-1]))
        outs, anchors, strides = [], [], []
        for i, (feat, stride) in enumerate(zip(feats, self.strides, strict=True)):
            b, _, h, w = feat.shape
            cls = self.cls_conv[i](self.cls_trunk[i](feat))
            outs.append(torch.cat([self.box_branch[i](feat), cls], 1).view(
                b, 4 + self.num_classes, -1))
            ys, xs = torch.meshgrid(torch.arange(h, dtype=x.dtype) + 0.5,
                                    torch.arange(w, dtype=x.dtype) + 0.5, indexing='ij')
            anchors.append(torch.stack([xs.reshape(-1), ys.reshape(-1)]))
            strides.append(torch.full((1, h * w), float(stride)))
        raw = torch.cat(outs, 2)
        box, cls = raw.split((4, self.num_classes), 1)
        ltrb = F.softplus(box)
        anchor, stride = torch.cat(anchors, 1), torch.cat(strides, 1)
        x1y1, x2y2 = anchor - ltrb[:, :2], anchor + ltrb[:, 2:]
        return torch.cat([(x1y1 + x2y2) / 2 * stride, (x2y2 - x1y1) * stride, cls.sigmoid()], 1)

    def class_weights(self) -> list[tuple[np.ndarray, np.ndarray]]:
        return [(c.weight.detach().numpy()[:, :, 0, 0], c.bias.detach().numpy())
                for c in self.cls_conv]


class TinyDetr(nn.Module):
    """Set-prediction head as in DETR/RT-DETR: learnt queries attend to image tokens; a
    final linear ``class_embed`` gives the logits, an MLP the normalised boxes."""

    def __init__(self, num_classes: int = 5, d: int = 32, queries: int = 12,
                 combined: bool = False) -> None:
        super().__init__()
        self.combined = combined
        self.backbone = nn.Sequential(nn.Conv2d(3, d, 4, 4), nn.ReLU(), nn.Conv2d(d, d, 2, 2),
                                      nn.ReLU())
        self.query = nn.Parameter(torch.randn(queries, d))
        self.attn = nn.MultiheadAttention(d, 4, batch_first=True)
        self.ffn = nn.Sequential(nn.Linear(d, d), nn.ReLU(), nn.Linear(d, d))
        self.norm = nn.LayerNorm(d)
        self.class_embed = nn.Linear(d, num_classes)
        self.bbox_embed = nn.Sequential(nn.Linear(d, d), nn.ReLU(), nn.Linear(d, 4))

    def forward(self, x: torch.Tensor):
        tokens = self.backbone(x).flatten(2).transpose(1, 2)
        q = self.query.unsqueeze(0).expand(x.shape[0], -1, -1)
        h, _ = self.attn(q, tokens, tokens)
        h = self.norm(h + self.ffn(h))
        logits, boxes = self.class_embed(h), self.bbox_embed(h).sigmoid()
        if self.combined:  # one output, boxes then class probabilities (RT-DETR exports)
            return torch.cat([boxes, logits.sigmoid()], 2)
        return logits, boxes


class NoLinearHead(nn.Module):
    """A dense net without any 1x1 convolution or linear layer."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 7, 3, 8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x).flatten(2)


def export(module: nn.Module, size: tuple[int, int], path: Path,
           output_names: list[str]) -> Path:
    # Exporter chatter (torchvision operators it cannot register, deprecations) is noise.
    logging.getLogger('torch.onnx').setLevel(logging.ERROR)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter('ignore')
        torch.onnx.export(module.eval(), (torch.rand(1, 3, *size),), str(path), dynamo=True,
                          verbose=False, opset_version=18, input_names=['images'],
                          output_names=output_names)
    return path



def scene(seed: int, shape: tuple[int, int]) -> np.ndarray:
    """A frame with a few bright rectangles on a textured background."""
    rng = np.random.default_rng(seed)
    image = (rng.random((*shape, 3)) * 60).astype(np.uint8)
    for _ in range(4):
        y, x = rng.integers(0, shape[0] - 20), rng.integers(0, shape[1] - 20)
        image[y:y + rng.integers(8, 30), x:x + rng.integers(8, 40)] = rng.integers(
            100, 256, 3, dtype=np.uint8)
    return image


TINY_YOLO_SIZE = (96, 128)


@pytest.fixture(scope='session')
def tiny_yolo(tmp_path_factory: pytest.TempPathFactory) -> tuple[TinyYolo, Path, tuple[int, int]]:
    """``TinyYolo`` of seed 0, exported at 96x128 with output ``output0``: (the network, its
    ONNX file, the size). The adapter's and the node's tests read this same network, and an
    export takes seconds, so it is built once for the test run; read it, never change it."""
    torch.manual_seed(0)
    model = TinyYolo().eval()
    path = export(model, TINY_YOLO_SIZE, tmp_path_factory.mktemp('tiny_yolo') / 'yolo.onnx',
                  ['output0'])
    return model, path, TINY_YOLO_SIZE


@pytest.fixture(scope='session')
def toy() -> types.SimpleNamespace:
    """The networks, their export and a test frame maker."""
    return types.SimpleNamespace(TinyYolo=TinyYolo, TinyDetr=TinyDetr,
                                 NoLinearHead=NoLinearHead, export=export, scene=scene)
