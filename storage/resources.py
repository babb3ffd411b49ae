"""This process's memory: RSS readings, memory handed back to the OS, dead runs' temporaries;
and the machine's largest CPU cache.

RSS readings feed the memory budget, ``--json`` output and benchmarks; the release helpers
keep RSS close to what is alive (glibc's allocator retention, free heap pages, the compiler's
code pages); :func:`remove_dead_owned` removes what killed runs left behind.
"""

from __future__ import annotations

import functools
import glob
import os
import resource
import sys
import threading
import time


def peak_rss_bytes() -> int:
    """Peak resident set size of this process so far, in bytes: ``VmHWM`` where /proc has
    it, else ``ru_maxrss``. (``ru_maxrss`` keeps the peak of the image before an exec.)"""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    ru = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(ru if sys.platform == "darwin" else ru * 1024)


# /proc/self/statm kept open and re-read with pread (1.7 us a reading against 12.5 us for an
# open, read and close: the budget reads the RSS at every reservation, 2-4 % of a capped
# run's samples); reopened in a forked child, whose inherited descriptor reads the parent
_STATM = {"fd": -1, "pid": -1}
_STATM_LOCK = threading.Lock()
_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _statm_fd() -> int:
    pid = os.getpid()
    if _STATM["pid"] != pid:
        with _STATM_LOCK:
            if _STATM["pid"] != pid:
                fd = os.open("/proc/self/statm", os.O_RDONLY)
                if _STATM["fd"] >= 0:
                    try:
                        os.close(_STATM["fd"])
                    except OSError:
                        pass
                _STATM["fd"], _STATM["pid"] = fd, pid
    return _STATM["fd"]


def current_rss_bytes() -> int:
    """Resident set size of this process now (0 where it cannot be read)."""
    try:
        return int(os.pread(_statm_fd(), 128, 0).split()[1]) * _PAGE_SIZE
    except (OSError, ValueError, IndexError, AttributeError):
        try:
            import psutil

            return int(psutil.Process().memory_info().rss)
        except Exception:  # pragma: no cover - psutil is a dependency
            return 0


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
    if not sys.platform.startswith("linux"):
        return False
    try:
        return bool(_libc().malloc_trim(0))
    except (OSError, AttributeError):
        return False


def _libc():
    """The C library, loaded once (glibc on Linux)."""
    global _LIBC
    if _LIBC is None:
        import ctypes
        import ctypes.util

        try:  # find_library runs ldconfig in a child process: only where needed
            _LIBC = ctypes.CDLL("libc.so.6")
        except OSError:
            _LIBC = ctypes.CDLL(ctypes.util.find_library("c"))
    return _LIBC


# madvise(2) advice: reclaim these pages now (Linux >= 5.4)
_MADV_PAGEOUT = 21
# the shared objects whose code only compiling needs: LLVM, through llvmlite
_COMPILER_LIBRARIES = ("libllvmlite",)
_LAST_PAGEOUT = -float("inf")


def release_compiler_pages(min_interval: float = 0.0) -> int:
    """Hand the compiler's resident code pages back to the kernel; return how many bytes the
    RSS fell by (0 where this is not Linux or the kernel refuses, or when the last call was
    less than ``min_interval`` seconds ago: a call walks this process's mappings, and the
    pages come back only when a kernel loads).

    Setting numba's code generation up touches much of LLVM's shared library (llvmlite),
    which stays resident although a run only calls compiled kernels afterwards: loading one
    from the cache touches a part of it again. ``madvise(MADV_PAGEOUT)`` on its read-only
    mappings drops those clean file pages from this process and the page cache (so from a
    memory cgroup's count too); whatever LLVM needs later faults back in from the file.
    """
    global _LAST_PAGEOUT
    if not sys.platform.startswith("linux"):
        return 0
    now = time.monotonic()
    if now - _LAST_PAGEOUT < min_interval:
        return 0
    _LAST_PAGEOUT = now
    try:
        import ctypes

        madvise = _libc().madvise
        madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        before = current_rss_bytes()
        with open("/proc/self/maps") as fh:
            for line in fh:
                parts = line.split()
                if (len(parts) < 6 or "w" in parts[1]
                        or not any(name in parts[5] for name in _COMPILER_LIBRARIES)):
                    continue
                start, end = (int(x, 16) for x in parts[0].split("-"))
                if madvise(start, end - start, _MADV_PAGEOUT) != 0:
                    return 0  # an older kernel (EINVAL): nothing to gain
        return max(0, before - current_rss_bytes())
    except (OSError, AttributeError, ValueError):
        return 0


def process_gone(pid) -> bool:
    """Whether no process ``pid`` runs on this machine, so that a temporary folder named
    after it (a killed run's) may be removed. False where unsure: a live process, another
    user's (no permission to signal it), a name that holds no pid."""
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except (ValueError, OverflowError, PermissionError):
        return False
    return False


def remove_dead_owned(folder, prefix: str) -> None:
    """Remove the entries of ``folder`` named ``prefix + PID + "-..."`` whose process is gone:
    the temporaries of killed runs (stores being written, spill folders, evaluation stores),
    which cannot remove their own."""
    import glob
    import shutil
    from pathlib import Path

    folder = Path(folder)
    if not folder.is_dir():
        return
    for p in folder.glob(f"{glob.escape(prefix)}*"):
        if not process_gone(p.name[len(prefix):].split("-")[0]):
            continue
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            try:
                p.unlink()
            except OSError:
                pass


@functools.lru_cache(maxsize=1)
def last_level_cache_bytes() -> int:
    """The largest CPU data cache of this machine in bytes (Linux sysfs), 32 MiB where the
    system does not say."""
    sizes = []
    for d in glob.glob("/sys/devices/system/cpu/cpu0/cache/index*"):
        try:
            with open(os.path.join(d, "type")) as fh:
                if fh.read().strip() == "Instruction":
                    continue
            with open(os.path.join(d, "size")) as fh:
                txt = fh.read().strip().upper()
            mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(txt[-1:], 1)
            sizes.append(int(txt.rstrip("KMG")) * mult)
        except (OSError, ValueError):
            continue
    return max(sizes) if sizes else 32 << 20
