"""Rolling statistics behind the nodes' diagnostics and the benchmarks."""

from __future__ import annotations

import math

import pytest

from uq_common.rolling_stats import RollingStats, latency_summary


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


def test_latency_summary_over_the_window_and_clear():
    stats = RollingStats(window=3)
    for ms in (1.0, 2.0, 3.0, 4.0):
        stats.record_latency(ms)
    summary = stats.latency_summary()
    assert summary['count'] == 3 and summary['p50_ms'] == pytest.approx(3.0)
    assert summary['max_ms'] == pytest.approx(4.0)
    assert summary['mean_ms'] == pytest.approx(3.0)
    assert math.isnan(latency_summary([])['p99_ms'])
    stats.clear()
    assert stats.latency_samples() == []
