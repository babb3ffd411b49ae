"""The console scripts (``ooc-ingest`` ...): each installs, before Python imports the
command, a SIGINT / SIGTERM handler that ends the process quietly with 130 / 143 (nothing
is written before the command runs; ``cli.common.run_command`` then takes the signals over
for the work). Without it, a Ctrl-C in the first half second printed a KeyboardInterrupt
traceback from the middle of an import."""

from __future__ import annotations

import signal


def _quit(signum, frame):
    raise SystemExit(128 + signum)  # no traceback: Python prints nothing for SystemExit


def _run(name: str) -> int:
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _quit)
    from ooc_learn import cli

    return getattr(cli, name)()


def _script(name: str):
    def main() -> int:
        return _run(name)

    main.__name__ = main.__qualname__ = name
    return main


ingest_main, index_main, info_main, check_main, train_main, predict_main = (
    _script(n) for n in ("ingest_main", "index_main", "info_main", "check_main", "train_main",
                         "predict_main"))

