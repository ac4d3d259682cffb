"""The NTK of the layer before the last (uq_perception.ntk.layer_kernel): its exact features
give the class-averaged Jacobian kernel that torch's autograd gives, for a 3x3 convolution
with SiLU before a 1x1 class layer (a YOLO class branch) and for a linear layer put on a
sphere before a linear head (the shipped CenterNet's embedding); the sketch keeps that
kernel in expectation."""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from uq_perception.detectors.layer_taps import BranchLayer, patches
from uq_perception.ntk.layer_kernel import (
    ProductSketch,
    activation_derivative,
    elementwise_signal,
    jacobian_features,
    normalised_signal,
)

C = 3


def jacobian(logits: torch.Tensor, params: list[torch.Tensor]) -> torch.Tensor:
    """``(C, P)``: each logit's gradient with respect to ``params``, by autograd."""
    rows = []
    for c in range(C):
        grads = torch.autograd.grad(logits[c], params, retain_graph=True)
        rows.append(torch.cat([g.reshape(-1) for g in grads]))
    return torch.stack(rows)


def class_averaged(jacobians: list[torch.Tensor]) -> np.ndarray:
    """``(1/C) sum_c J_c(x) . J_c(x')`` for every pair."""
    j = torch.stack(jacobians)
    return (torch.einsum('ncp,mcp->nm', j, j) / C).numpy()


def test_conv_layer_kernel_equals_autograd():
    torch.manual_seed(0)
    cin, width, h, w = 4, 5, 6, 7
    weight = torch.randn(width, cin, 3, 3, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(width, dtype=torch.float64, requires_grad=True)
    head = torch.randn(C, width, dtype=torch.float64)
    maps = [torch.randn(cin, h, w, dtype=torch.float64) for _ in range(4)]
    cells = np.array([[0, 0], [2, 3], [5, 6], [3, 1]])  # corners reach into the padding

    # Each input is a map and the cell read; the kernel is over the convolution's weight and
    # bias.
    expected = class_averaged([
        jacobian(head @ F.silu(F.conv2d(m[None], weight, bias, padding=1))[0, :, row, col],
                 [weight, bias]) for m, (row, col) in zip(maps, cells, strict=True)])
    layer = BranchLayer(0, 1, 'conv', 'in', 'out', 'act', 'silu', 0.0,
                        weight.detach().numpy(), bias.detach().numpy(), (1, 1), (1, 1, 1, 1),
                        (1, 1))
    p = np.stack([patches(m.numpy(), layer, cells[k:k + 1])[0] for k, m in enumerate(maps)])
    z = p @ layer.weight.reshape(width, -1).T + layer.bias
    g = elementwise_signal(head.numpy(), activation_derivative('silu', z))
    features = jacobian_features(g, p)
    assert np.abs(features @ features.T - expected).max() < 1e-6 * max(1.0, np.abs(expected).max())


def test_sphere_layer_kernel_equals_autograd():
    torch.manual_seed(1)
    width, hidden, radius = 6, 5, math.sqrt(6)
    weight = torch.randn(width, hidden, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(width, dtype=torch.float64, requires_grad=True)
    head = torch.randn(C, width, dtype=torch.float64)
    inputs = [torch.randn(hidden, dtype=torch.float64) for _ in range(5)]

    expected = class_averaged([
        jacobian(head @ (F.normalize(weight @ x + bias, dim=0) * radius), [weight, bias])
        for x in inputs])
    h = torch.stack(inputs).numpy()
    z = h @ weight.detach().numpy().T + bias.detach().numpy()
    features = jacobian_features(normalised_signal(head.numpy(), z, radius), h)
    assert np.abs(features @ features.T - expected).max() < 1e-6 * max(1.0, np.abs(expected).max())


def test_sketch_keeps_the_kernel_in_expectation():
    rng = np.random.default_rng(2)
    g = rng.normal(size=(4, C, 3))
    p = rng.normal(size=(4, 5))
    exact = jacobian_features(g, p)
    kernel = exact @ exact.T
    sketch = ProductSketch(C * 3, 6, 200_000, seed=0).of_jacobian(g, p)
    assert sketch.shape == (4, 200_000)
    assert np.abs(sketch @ sketch.T - kernel).max() < 0.05 * np.abs(kernel).max()
