"""Process resource readings used in ``--json`` output and benchmarks."""

from __future__ import annotations

import resource
import sys


def peak_rss_bytes() -> int:
    """Peak resident set size of this process so far, in bytes."""
    ru = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(ru if sys.platform == "darwin" else ru * 1024)


def children_peak_rss_bytes() -> int:
    """Largest peak RSS among waited-for child processes, in bytes (for benchmarks)."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return int(ru if sys.platform == "darwin" else ru * 1024)


def limit_allocator_retention() -> bool:
    """Ask glibc to return freed large buffers to the OS at once.

    glibc raises its mmap threshold after large frees (up to 32 MiB), so later block-sized
    arrays come from the heap and stay resident after they are freed; under a memory cap that
    retention would count against the cap. Pinning the threshold (128 KiB) and the trim
    threshold keeps RSS close to what is alive. Returns False where this is not glibc.
    """
    import ctypes
    import ctypes.util

    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
        ok = libc.mallopt(M_MMAP_THRESHOLD, 128 * 1024) == 1
        ok &= libc.mallopt(M_TRIM_THRESHOLD, 1024 * 1024) == 1
        return bool(ok)
    except (OSError, AttributeError):
        return False


_LIBC = None


def release_free_heap() -> bool:
    """Return the heap's free pages to the OS now (glibc ``malloc_trim(0)``, which also
    releases whole free pages inside the heap, not only at its top). Small arrays freed
    between long-lived ones leave such holes; under a memory cap they would count in RSS
    although nothing lives there. Cheap (a walk of the free lists); False where this is
    not glibc."""
    global _LIBC
    if not sys.platform.startswith("linux"):
        return False
    try:
        if _LIBC is None:
            import ctypes
            import ctypes.util

            _LIBC = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(_LIBC.malloc_trim(0))
    except (OSError, AttributeError):
        return False


_WRAP = ("import resource, subprocess, sys, time\n"
         "t = time.perf_counter()\n"
         "r = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL).returncode\n"
         "dt = time.perf_counter() - t\n"
         "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, dt, r)")


def measure_command(cmd, *, timeout: float | None = None) -> tuple[int, float, int, str]:
    """Run ``cmd`` as the only child of a fresh wrapper process and read its peak RSS there.

    Returns ``(peak_rss_bytes, wall_seconds, returncode, stderr)``. Measuring from a separate
    wrapper keeps the caller's own memory and other children out of the figure (benchmarks
    and the memory-promise tests use it).
    """
    import subprocess

    out = subprocess.run([sys.executable, "-c", _WRAP, *map(str, cmd)], capture_output=True,
                         text=True, timeout=timeout)
    rss, dt, rc = out.stdout.split()
    scale = 1 if sys.platform == "darwin" else 1024
    return int(rss) * scale, float(dt), int(rc), out.stderr
