"""Rolling runtime statistics for diagnostics: rates, latency percentiles, counters."""

from __future__ import annotations

import threading
from collections import deque

import numpy as np


class RollingStats:
    """Latency samples (per named stage) and event times over a sliding window.

    Thread-safe: the detector node records from its executor and inference threads and
    reads from its diagnostics timer.

    Parameters
    ----------
    window : int
        Number of most recent samples kept for percentiles.
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

    def latency_percentiles(self, *percentiles: float, stage: str = 'frame'
                            ) -> list[float]:
        """Latency percentiles of ``stage`` in ms (NaN when there is no sample yet)."""
        with self._lock:
            samples = list(self._latencies_ms.get(stage, ()))
        if not samples:
            return [float('nan')] * len(percentiles)
        values = np.percentile(np.asarray(samples, dtype=float), percentiles)
        return [float(v) for v in np.atleast_1d(values)]
