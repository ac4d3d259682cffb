"""Rolling statistics behind the detector node's diagnostics."""

from __future__ import annotations

import math

import pytest

from uq_perception.runtime_stats import RollingStats


def test_latency_percentiles_per_stage_and_window():
    stats = RollingStats(window=4)
    assert all(math.isnan(v) for v in stats.latency_percentiles(50, 99))
    for value in (100.0, 1.0, 2.0, 3.0, 4.0):  # the first falls out of the window
        stats.record_latency(value)
    stats.record_latency(7.0, stage='transport')
    assert stats.latency_percentiles(50, 100) == pytest.approx([2.5, 4.0])
    assert stats.latency_percentiles(50, stage='transport') == [7.0]
    assert math.isnan(stats.latency_percentiles(50, stage='dispatch')[0])


def test_rate_and_counters():
    stats = RollingStats(rate_window_s=1.0)
    for k in range(11):
        stats.record_arrival(10.0 + 0.1 * k)
    assert stats.rate_hz(11.0) == pytest.approx(10.0)
    assert stats.rate_hz(30.0) == 0.0
    stats.increment('dropped', 2)
    stats.increment('dropped')
    assert stats.counters == {'dropped': 3}
