"""The allocator setting the detector node applies before loading its model."""

from __future__ import annotations

import platform

import pytest

from uq_perception.runtime.memory_tuning import DEFAULT_THRESHOLD_BYTES, retain_freed_memory


@pytest.mark.skipif(platform.libc_ver()[0] != 'glibc',
                    reason='mallopt thresholds are a glibc feature')
def test_glibc_accepts_the_thresholds():
    assert retain_freed_memory(DEFAULT_THRESHOLD_BYTES // 2) is True
    assert retain_freed_memory() is True


def test_non_positive_threshold_is_rejected():
    with pytest.raises(ValueError, match='threshold_bytes must be positive'):
        retain_freed_memory(0)
