"""glibc's allocator, told that the exporter is one long-lived process whose threads each hold little.

glibc gives each thread that allocates its own arena, up to eight per core (mallopt(3), M_ARENA_MAX),
and keeps the pages a start-up frees for later. The exporter's threads (sampler, listeners, XID
watcher, PCIe sampling) allocate little each: one arena serves them, and the pages freed once the
configuration, the fleet and the first cycle have been built go back to the kernel (malloc_trim(3)).
Measured with ``python -m tests.bench``: 1.5 MiB less resident after 1,000 scrapes (docs/performance.md).
Another C library (musl) has neither call; then nothing is done.
"""

from __future__ import annotations

import ctypes

__all__ = ["one_arena", "release_free_pages"]

M_ARENA_MAX = -8  # glibc's malloc.h


def _libc():
    """The C library the interpreter itself is linked with (its symbols, not a second copy)."""
    try:
        return ctypes.CDLL(None)
    except OSError:
        return None


def one_arena() -> bool:
    """Before the threads start: one malloc arena for all of them. True when glibc took it."""
    libc = _libc()
    return bool(libc is not None and hasattr(libc, "mallopt") and libc.mallopt(M_ARENA_MAX, 1))


def release_free_pages() -> bool:
    """Give the pages start-up freed back to the kernel. True when glibc released some."""
    libc = _libc()
    return bool(libc is not None and hasattr(libc, "malloc_trim") and libc.malloc_trim(0))
