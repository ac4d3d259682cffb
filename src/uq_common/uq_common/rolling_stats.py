"""Rolling runtime statistics for diagnostics and benchmarks: latency percentiles per named
stage, input rate, event counters (ROS-free, thread-safe)."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable

import numpy as np


def latency_summary(samples_ms: Iterable[float]) -> dict[str, float | int]:
    """Summarise durations in milliseconds.

    Returns
    -------
    dict
        ``count``, ``p50_ms``, ``p99_ms``, ``max_ms``, ``mean_ms``; the statistics are NaN
        when there is no sample.
    """
    data = np.asarray(list(samples_ms), dtype=np.float64)
    if data.size == 0:
        nan = float('nan')
        return {'count': 0, 'p50_ms': nan, 'p99_ms': nan, 'max_ms': nan, 'mean_ms': nan}
    p50, p99 = np.percentile(data, [50.0, 99.0])
    return {'count': int(data.size), 'p50_ms': float(p50), 'p99_ms': float(p99),
            'max_ms': float(data.max()), 'mean_ms': float(data.mean())}


class RollingStats:
    """Latency samples (per named stage, in ms) and event times over a sliding window.

    Recording is O(1) so it can sit on a node's hot path; a node records from its callbacks
    and reads from its diagnostics timer or a benchmark thread, hence the lock.

    Parameters
    ----------
    window : int
        Number of most recent samples kept per stage.
    rate_window_s : float
        Time span over which the input rate is computed.
    """

    def __init__(self, window: int = 300, rate_window_s: float = 5.0) -> None:
        self._window = window
        self._latencies_ms: dict[str, deque[float]] = {}
        self._arrivals: deque[float] = deque()
        self._rate_window_s = rate_window_s
        self._counters: dict[str, int] = {}
        self._lock = threading.Lock()

    def record_arrival(self, now_s: float) -> None:
        """Note one input at monotonic time ``now_s`` (seconds)."""
        with self._lock:
            self._arrivals.append(now_s)
            while self._arrivals and now_s - self._arrivals[0] > self._rate_window_s:
                self._arrivals.popleft()

    def record_latency(self, latency_ms: float, stage: str = 'frame') -> None:
        """Add one latency sample (ms) of ``stage``."""
        with self._lock:
            self._latencies_ms.setdefault(stage, deque(maxlen=self._window)).append(
                latency_ms)

    def increment(self, counter: str, by: int = 1) -> None:
        """Add ``by`` to the event counter ``counter``."""
        with self._lock:
            self._counters[counter] = self._counters.get(counter, 0) + by

    @property
    def counters(self) -> dict[str, int]:
        """A copy of the event counters."""
        with self._lock:
            return dict(self._counters)

    def rate_hz(self, now_s: float) -> float:
        """Inputs per second over the rate window ending at ``now_s``."""
        with self._lock:
            recent = [t for t in self._arrivals if now_s - t <= self._rate_window_s]
        if len(recent) < 2:
            return 0.0
        span = max(now_s - recent[0], recent[-1] - recent[0])
        return (len(recent) - 1) / span if span > 0 else 0.0

    def latency_samples(self, stage: str = 'frame') -> list[float]:
        """Copy of the samples (ms) kept for ``stage``, oldest first."""
        with self._lock:
            return list(self._latencies_ms.get(stage, ()))

    def latency_percentiles(self, *percentiles: float, stage: str = 'frame'
                            ) -> list[float]:
        """Latency percentiles of ``stage`` in ms (NaN when there is no sample yet)."""
        samples = self.latency_samples(stage)
        if not samples:
            return [float('nan')] * len(percentiles)
        values = np.percentile(np.asarray(samples, dtype=float), percentiles)
        return [float(v) for v in np.atleast_1d(values)]

    def latency_summary(self, stage: str = 'frame') -> dict[str, float | int]:
        """:func:`latency_summary` of the samples kept for ``stage``."""
        return latency_summary(self.latency_samples(stage))

    def clear(self) -> None:
        """Forget every latency sample, arrival and counter."""
        with self._lock:
            self._latencies_ms.clear()
            self._arrivals.clear()
            self._counters.clear()
