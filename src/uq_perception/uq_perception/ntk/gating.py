"""k-means gating: the partition of feature space into GP experts."""

from __future__ import annotations

import math

import numpy as np


def kmeans(points: np.ndarray, k: int, *, iterations: int = 50, seed: int = 0) -> np.ndarray:
    """k-means (Lloyd) with k-means++ initialisation; returns ``(k, D)`` float64 centroids.

    Deterministic for a fixed ``seed``. An emptied cluster is re-seeded at the point
    farthest from its centroid.
    """
    import torch  # here: fitting needs it, a query of a loaded GP does not

    x = torch.from_numpy(np.ascontiguousarray(points, dtype=np.float64))
    n = x.shape[0]
    if n < k:
        raise ValueError(f'k-means with {k} clusters needs at least {k} points, got {n}')
    rng = np.random.default_rng(seed)
    x_sq = (x * x).sum(1)
    centroids = torch.empty(k, x.shape[1], dtype=torch.float64)

    def sq_distance(c: torch.Tensor) -> torch.Tensor:
        return (x_sq - 2.0 * (x @ c) + c @ c).clamp_min(0.0)

    centroids[0] = x[int(rng.integers(n))]
    closest = sq_distance(centroids[0])
    for j in range(1, k):
        weights = closest.numpy()
        total = weights.sum()
        pick = int(rng.choice(n, p=weights / total)) if total > 0 else int(rng.integers(n))
        centroids[j] = x[pick]
        closest = torch.minimum(closest, sq_distance(centroids[j]))
    assign = torch.full((n,), -1, dtype=torch.int64)
    for _ in range(iterations):
        dist = x_sq[:, None] - 2.0 * (x @ centroids.T) + (centroids * centroids).sum(1)
        best, new_assign = dist.min(1)
        if torch.equal(new_assign, assign):
            break
        assign = new_assign
        counts = torch.bincount(assign, minlength=k)
        sums = torch.zeros_like(centroids).index_add_(0, assign, x)
        for j in torch.nonzero(counts == 0).flatten().tolist():
            far = int(best.argmax())
            sums[j], counts[j] = x[far], 1
            best[far] = -math.inf
        centroids = sums / counts[:, None].to(torch.float64)
    return centroids.numpy()


def nearest_centroid(x: np.ndarray, centroids: np.ndarray, centroid_sq: np.ndarray
                      ) -> np.ndarray:
    # ||x||^2 is the same for all centroids of a row, so it does not affect the argmin.
    return np.argmin(centroid_sq - 2.0 * (x @ centroids.T), axis=1)


# --------------------------------------------------------------------------- outputs
