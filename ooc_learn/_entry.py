"""The console scripts (``ooc-ingest`` ...): each installs, before Python imports the
command, a SIGINT / SIGTERM handler that ends the process quietly with 130 / 143 (nothing
is written before the command runs; ``cli.common.run_command`` then takes the signals over
for the work). Without it, a Ctrl-C in the first half second printed a KeyboardInterrupt
traceback from the middle of an import; and where the signal lands inside a C extension's
import (numpy's import of datetime), the extension reports an ImportError in its place,
so a failed import after a signal ends the same way. Once the command has finished, a late signal is
left alone: the work is done and reported, and its exit code stands."""

from __future__ import annotations

import signal
import sys


_ASKED: list[int] = []  # the signals that arrived before the command took them over


def _quit(signum, frame):
    finished = getattr(sys.modules.get("ooc_learn.cli.common"), "FINISHED", None)  # loaded?
    if finished is not None and finished["code"] is not None:
        return  # the command has finished and said so: its exit code stands
    _ASKED.append(signum)
    raise SystemExit(128 + signum)  # no traceback: Python prints nothing for SystemExit


def _run(name: str) -> int:
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _quit)
    try:
        from ooc_learn import cli
    except Exception:
        if _ASKED:  # the stop asked, turned into an ImportError by an extension's import
            raise SystemExit(128 + _ASKED[0]) from None
        raise
    return getattr(cli, name)()


def _script(name: str):
    def main() -> int:
        return _run(name)

    main.__name__ = main.__qualname__ = name
    return main


ingest_main, index_main, info_main, check_main, train_main, predict_main = (
    _script(n) for n in ("ingest_main", "index_main", "info_main", "check_main", "train_main",
                         "predict_main"))

