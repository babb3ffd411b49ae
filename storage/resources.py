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
