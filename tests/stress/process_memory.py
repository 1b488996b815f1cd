"""What the stress and soak runs measure of their own process: one glibc malloc arena (set before
TensorFlow starts its threads), and the resident set size after freed heap memory went back to
the system, so that allocator fragmentation is not read as a leak."""

from __future__ import annotations

import ctypes
import gc


def limit_malloc_arenas(n: int) -> None:
    """glibc's M_ARENA_MAX; call it before TensorFlow is imported."""
    if n > 0:
        try:
            ctypes.CDLL("libc.so.6").mallopt(-8, n)  # M_ARENA_MAX
        except (OSError, AttributeError):
            pass


def rss_kb() -> int:
    """VmRSS in KiB after gc and malloc_trim (0 when /proc does not say)."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0
