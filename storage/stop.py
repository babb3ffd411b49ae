"""Stopping on SIGINT / SIGTERM at a safe point.

The CLI's signal handler only records the signal (:func:`request_stop`); the work raises
``KeyboardInterrupt`` at its next safe point (:func:`check_stop`: a memory reservation, a store
read, a parsed chunk, a written block), where raising is safe.
"""

from __future__ import annotations

__all__ = ["request_stop", "check_stop", "stop_signal"]


# the signal (SIGINT, SIGTERM) that asked this process to stop, and whether the stop was raised
_STOP = {"signum": None, "raised": False}


def request_stop(signum: int) -> None:
    """Ask the work to stop at its next safe point (:func:`check_stop`).

    A signal handler must not raise where it runs: Python runs it between any two bytecodes
    of the main thread, including those of the helpers numba's compiled kernels call back
    into (``_numba_unpickle``), where an exception becomes a SystemError or a segfault."""
    _STOP["signum"] = signum


def check_stop() -> None:
    """Raise KeyboardInterrupt once if a stop was asked (called where raising is safe: a
    reservation, a store read, a parsed chunk)."""
    if _STOP["signum"] is not None and not _STOP["raised"]:
        _STOP["raised"] = True
        raise KeyboardInterrupt


def stop_signal():
    """The signal that asked this process to stop, or None."""
    return _STOP["signum"]
