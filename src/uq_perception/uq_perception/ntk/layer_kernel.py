"""The NTK of a layer before the last, in the weight-space form (ROS-free, numpy only).

For logits ``f_c = W_c . a(z) + b_c`` with ``z = V p + u`` (a linear layer, or a convolution
at one output position whose input patch is ``p``), the Jacobian of ``f_c`` with respect to
``V`` and ``u`` is the outer product ``g_c (x) [p; 1]`` of the back-propagated signal
``g_c = J_a(z)^T W_c`` and the augmented input. The kernel of that layer's parameters is
therefore a product,

    k_cc'(x, x') = (g_c . g'_c') ([p; 1] . [p'; 1]),

and its class-averaged trace ``(1/C) sum_c k_cc`` (the scalar kernel the engine shares
across classes, as the last layer's identity over classes does) is the inner product of
the features ``vec(G) / sqrt(C) (x) [p; 1]``, ``G`` the ``C x width`` matrix of the
``g_c``. :func:`jacobian_features` writes them exactly; they have ``C width (|p| + 1)``
entries (221,184 for a YOLOv8n class branch), so the GP reads them through
:class:`ProductSketch`, a random projection that keeps the kernel in expectation and has
the width the engine's ``D x D`` weight-space matrix can hold.

Signals for the two layer shapes of the detectors here:

- an element-wise activation (SiLU, ReLU, ...): ``G = W * a'(z)`` row-wise
  (:func:`elementwise_signal`);
- an L2 normalisation to radius ``r`` after the layer (the shipped CenterNet's embedding):
  ``G = W (r / |z|) (I - z z^T / |z|^2)`` (:func:`normalised_signal`).
"""

from __future__ import annotations

import math

import numpy as np

#: Element-wise activations whose derivative :func:`activation_derivative` knows.
ACTIVATIONS = ('identity', 'relu', 'leaky_relu', 'sigmoid', 'silu')


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * z))


def activation_derivative(kind: str, z: np.ndarray, slope: float = 0.01) -> np.ndarray:
    """``a'(z)`` of an element-wise activation (``slope``: LeakyReLU's negative slope).

    Raises
    ------
    ValueError
        For an activation not in :data:`ACTIVATIONS`.
    """
    z = np.asarray(z, np.float64)
    if kind == 'identity':
        return np.ones_like(z)
    if kind == 'relu':
        return (z > 0).astype(np.float64)
    if kind == 'leaky_relu':
        return np.where(z > 0, 1.0, slope)
    if kind == 'sigmoid':
        s = _sigmoid(z)
        return s * (1.0 - s)
    if kind == 'silu':
        s = _sigmoid(z)
        return s * (1.0 + z * (1.0 - s))
    raise ValueError(f'activation must be one of {", ".join(ACTIVATIONS)}, got {kind!r}')


def elementwise_signal(weight: np.ndarray, derivative: np.ndarray) -> np.ndarray:
    """``(N, C, width)`` signals ``W_c * a'(z)`` of a layer followed by an element-wise
    activation and the linear head ``weight`` ``(C, width)``; ``derivative`` ``(N, width)``."""
    w = np.asarray(weight, np.float64)
    return w[None, :, :] * np.asarray(derivative, np.float64)[:, None, :]


def normalised_signal(weight: np.ndarray, z: np.ndarray, radius: float) -> np.ndarray:
    """``(N, C, width)`` signals of a layer whose output ``z`` ``(N, width)`` is put on the
    sphere of ``radius`` before the linear head ``weight`` ``(C, width)``: the head's rows
    through the normalisation's Jacobian ``(r / |z|) (I - z z^T / |z|^2)``."""
    z = np.asarray(z, np.float64)
    w = np.asarray(weight, np.float64)
    norm = np.maximum(np.linalg.norm(z, axis=1, keepdims=True), 1e-12)
    unit = z / norm
    along = w @ unit.T  # (C, N): each head row's component along the unit vector
    return (radius / norm)[:, :, None] * (w[None, :, :] - along.T[:, :, None] * unit[:, None, :])


def augmented(inputs: np.ndarray) -> np.ndarray:
    """``[p; 1]``: the layer's input with the slot of its bias."""
    p = np.asarray(inputs, np.float64)
    return np.hstack([p, np.ones((len(p), 1))])


def jacobian_features(signal: np.ndarray, inputs: np.ndarray) -> np.ndarray:
    """Exact features of the layer's class-averaged Jacobian kernel (module docstring):
    ``vec(G) / sqrt(C) (x) [p; 1]``, ``(N, C width (|p| + 1))``.

    Parameters
    ----------
    signal
        ``(N, C, width)`` back-propagated signals ``g_c``.
    inputs
        ``(N, |p|)`` the layer's inputs (a convolution's patch, flattened as its weight is).
    """
    g = np.asarray(signal, np.float64)
    flat = g.reshape(len(g), -1) / math.sqrt(g.shape[1])
    p = augmented(inputs)
    return (flat[:, :, None] * p[:, None, :]).reshape(len(g), -1)


class ProductSketch:
    """Random features of a product of two linear kernels: for ``a (x) b``,
    ``s = (R_a a) * (R_b b) / sqrt(m)`` with Gaussian ``R_a``, ``R_b`` has
    ``E[s . s'] = (a . a') (b . b')``, at ``m`` entries instead of ``|a| |b|``.

    Parameters
    ----------
    left_dim, right_dim
        Widths of ``a`` and ``b``.
    width
        ``m``, the sketch's width.
    seed
        Seed of the projections (fixed: a fitted GP and its queries must share them).
    """

    def __init__(self, left_dim: int, right_dim: int, width: int, seed: int = 0) -> None:
        if min(left_dim, right_dim, width) < 1:
            raise ValueError(f'sketch sizes must be >= 1, got {left_dim}, {right_dim}, {width}')
        rng = np.random.default_rng(seed)
        self.width = int(width)
        self.left = rng.standard_normal((left_dim, width))
        self.right = rng.standard_normal((right_dim, width))

    def __call__(self, left: np.ndarray, right: np.ndarray) -> np.ndarray:
        a = np.asarray(left, np.float64) @ self.left
        b = np.asarray(right, np.float64) @ self.right
        return a * b / math.sqrt(self.width)

    def of_jacobian(self, signal: np.ndarray, inputs: np.ndarray) -> np.ndarray:
        """The sketch of :func:`jacobian_features` (same kernel in expectation)."""
        g = np.asarray(signal, np.float64)
        return self(g.reshape(len(g), -1) / math.sqrt(g.shape[1]), augmented(inputs))
