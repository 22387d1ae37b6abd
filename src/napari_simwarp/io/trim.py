"""Giving freed memory back to the system between batches (glibc's ``malloc_trim``).

A batch of frames read through dask's threaded scheduler is made in several threads, each
with its own glibc malloc arena; the frame-sized buffers they free stay in those arenas
(glibc raises its mmap threshold after freeing large blocks, so later frames come from
the heap, and a heap gives memory back only from its top). The process then holds the
memory of many batches though it uses one: in the issue 28 measurement a 64 MiB budget
grew the resident set by 315 to 742 MiB on a 192 MiB stack, and by 27 to 32 MiB with
malloc's mmap threshold pinned (docs/benchmarks.md, "Memory budget and lazy sources").
:func:`release` after each batch hands the freed pages back (``malloc_trim(0)`` releases
free pages in every arena, not only at the top), so the budget bounds the resident set.

A no-op where the C library has no ``malloc_trim`` (macOS, Windows, musl).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os


@functools.cache
def _malloc_trim():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError, TypeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


def release() -> bool:
    """Return the memory freed so far to the system, where the C library allows it (glibc);
    returns whether it could. Costs a walk over malloc's free lists (well under a
    millisecond after a batch)."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


def resident_bytes() -> int | None:
    """This process's resident set in bytes (Linux ``/proc/self/statm``), or None."""
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError, AttributeError):
        return None
