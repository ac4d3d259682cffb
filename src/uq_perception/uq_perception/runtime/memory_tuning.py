"""Keep the C heap's freed blocks for reuse, so per-frame inference does not page-fault.

A CPU forward pass of the detector allocates feature maps of a few megabytes. glibc's
``malloc`` may serve such blocks with fresh ``mmap`` pages (``M_MMAP_THRESHOLD``) and give
memory back to the kernel on ``free`` (``M_TRIM_THRESHOLD``), so at camera rate, with idle
time between frames, the next forward pass touches new pages and pays the page faults.
Raising both thresholds (PyTorch's CPU performance guide addresses the same effect with
jemalloc/tcmalloc or these ``MALLOC_*`` settings; docs/performance.md) keeps at most
``threshold_bytes`` of freed memory in the process for the next frame.
"""

from __future__ import annotations

import ctypes
import ctypes.util

# From glibc's <malloc.h>.
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
# Several times the largest feature map of the detector at 320x240, and glibc's ceiling
# for its own dynamic mmap threshold on 64-bit systems (DEFAULT_MMAP_THRESHOLD_MAX).
DEFAULT_THRESHOLD_BYTES = 32 * 1024 * 1024


def retain_freed_memory(threshold_bytes: int = DEFAULT_THRESHOLD_BYTES) -> bool:
    """Raise glibc's mmap and trim thresholds to ``threshold_bytes`` for this process.

    Parameters
    ----------
    threshold_bytes : int
        Blocks below this size come from the heap (reused after ``free``), and the heap
        top is not returned to the kernel until this much is free.

    Returns
    -------
    bool
        True when both settings were applied; False when ``mallopt`` refused one or the C
        library has none (musl, macOS): the process then keeps its allocator's defaults.
    """
    if threshold_bytes <= 0:
        raise ValueError(f'threshold_bytes must be positive, got {threshold_bytes}')
    name = ctypes.util.find_library('c')
    try:
        mallopt = ctypes.CDLL(name).mallopt if name else None
    except (OSError, AttributeError):
        mallopt = None
    if mallopt is None:
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, threshold_bytes)) and \
        bool(mallopt(_M_TRIM_THRESHOLD, threshold_bytes))
