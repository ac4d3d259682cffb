"""A DETR-style detector small enough to reason about, its ONNX export, and COCO folders of
the objects it knows: test material shared by the ``uq gp fit`` tests and the launch test of
an ONNX model (``test/test_launch_onnx_model.py``), which load this file by its path.

Query ``q`` of :class:`QuadrantDetr` is the image quadrant ``q`` (row-major): its box is that
quadrant, its features ``phi`` the quadrant's mean colour, its class logits a final linear
layer on them. Red and green are its classes; blue is a direction of colour space no known
object spans, so a GP fitted on red and green objects gives blue ones a high variance.
"""

from __future__ import annotations

import json
import logging
import warnings
from pathlib import Path

import cv2
import numpy as np
import torch
from torch import nn

SIZE = 64
HALF = SIZE // 2
# Class colours (RGB): two the network knows, one it has no class for.
COLOURS = {'red': (210, 40, 40), 'green': (40, 210, 40), 'blue': (40, 40, 210)}
CATEGORIES = [{'id': 1, 'name': 'red', 'supercategory': 'object'},
              {'id': 2, 'name': 'green', 'supercategory': 'object'},
              {'id': 3, 'name': 'blue', 'supercategory': 'object'}]


class QuadrantDetr(nn.Module):
    """DETR-style set prediction: query ``q`` is the image quadrant ``q`` (row-major); its
    box is that quadrant (normalised centre-size), its features the quadrant's mean colour
    and the class logits a final linear layer on them."""

    def __init__(self) -> None:
        super().__init__()
        self.pool = nn.AdaptiveAvgPool2d(2)
        self.class_embed = nn.Linear(3, 2)
        with torch.no_grad():
            self.class_embed.weight.copy_(torch.tensor([[8.0, -4.0, -4.0], [-4.0, 8.0, -4.0]]))
            self.class_embed.bias.zero_()
        self.register_buffer('quadrant_boxes', torch.tensor([[[0.25, 0.25, 0.5, 0.5],
                                                      [0.75, 0.25, 0.5, 0.5],
                                                      [0.25, 0.75, 0.5, 0.5],
                                                      [0.75, 0.75, 0.5, 0.5]]]))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        phi = self.pool(x).flatten(2).transpose(1, 2)  # (1, 4, 3)
        # 0 * phi keeps the boxes an output of the graph that depends on the input.
        return self.class_embed(phi), self.quadrant_boxes + 0.0 * phi[..., :1]


def export_onnx(path: Path) -> Path:
    """:class:`QuadrantDetr` exported to ``path`` (input ``images`` of ``SIZE`` x ``SIZE``,
    outputs ``logits`` and ``boxes``)."""
    logging.getLogger('torch.onnx').setLevel(logging.ERROR)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter('ignore')
        torch.onnx.export(QuadrantDetr().eval(), (torch.rand(1, 3, SIZE, SIZE),), str(path),
                          dynamo=True, verbose=False, opset_version=18,
                          input_names=['images'], output_names=['logits', 'boxes'])
    return path


def write_quadrant_coco(root: Path, count: int, seed: int = 0) -> Path:
    """``count`` images, each quadrant empty (grey) or filled with a class colour up to a
    2-pixel margin, annotated with the quadrant's box; CVAT's layout."""
    rng = np.random.default_rng(seed)
    (root / 'images').mkdir(parents=True)
    images, annotations = [], []
    names = list(COLOURS)
    for i in range(count):
        pixels = np.full((SIZE, SIZE, 3), 128, np.uint8)
        for q in range(4):
            pick = rng.integers(0, 5)
            if pick >= 3 or (pick == 2 and rng.random() < 0.5):  # blue in 1 of 10 quadrants
                continue
            x, y = (q % 2) * HALF, (q // 2) * HALF
            colour = np.clip(np.array(COLOURS[names[pick]]) + rng.integers(-25, 26, 3), 0, 255)
            pixels[y + 2:y + HALF - 2, x + 2:x + HALF - 2] = colour
            annotations.append({'id': len(annotations) + 1, 'image_id': i + 1,
                                'category_id': int(pick) + 1, 'bbox': [x, y, HALF, HALF],
                                'area': HALF * HALF, 'iscrowd': 0})
        name = f'{i:04d}.png'
        cv2.imwrite(str(root / 'images' / name), pixels[:, :, ::-1])
        images.append({'id': i + 1, 'file_name': name, 'width': SIZE, 'height': SIZE})
    path = root / 'annotations' / 'instances_default.json'
    path.parent.mkdir()
    path.write_text(json.dumps({'images': images, 'annotations': annotations,
                                'categories': CATEGORIES}))
    return path
