"""Rolling latency statistics (ROS-free), for diagnostics and benchmarks."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable

import numpy as np


def latency_summary_ms(samples_s: Iterable[float]) -> dict[str, float | int]:
    """Summarise durations given in seconds as milliseconds.

    Returns
    -------
    dict
        ``count``, ``p50_ms``, ``p99_ms``, ``max_ms``, ``mean_ms``; the statistics are NaN
        when there is no sample.
    """
    data = np.asarray(list(samples_s), dtype=np.float64) * 1e3
    if data.size == 0:
        nan = float('nan')
        return {'count': 0, 'p50_ms': nan, 'p99_ms': nan, 'max_ms': nan, 'mean_ms': nan}
    p50, p99 = np.percentile(data, [50.0, 99.0])
    return {'count': int(data.size), 'p50_ms': float(p50), 'p99_ms': float(p99),
            'max_ms': float(data.max()), 'mean_ms': float(data.mean())}


class LatencyWindow:
    """The latest ``size`` durations (seconds); appending is O(1) so it can sit on a hot path.

    Thread-safe: a node's callback appends while a benchmark or diagnostics thread reads.

    Parameters
    ----------
    size : int
        Number of samples kept.
    """

    def __init__(self, size: int = 2048) -> None:
        self._samples: deque[float] = deque(maxlen=size)
        self._lock = threading.Lock()

    def add(self, seconds: float) -> None:
        """Record one duration."""
        with self._lock:
            self._samples.append(seconds)

    def samples(self) -> list[float]:
        """Copy of the samples kept, oldest first."""
        with self._lock:
            return list(self._samples)

    def clear(self) -> None:
        """Forget every sample."""
        with self._lock:
            self._samples.clear()

    def summary_ms(self) -> dict[str, float | int]:
        """:func:`latency_summary_ms` of the samples kept."""
        return latency_summary_ms(self.samples())
