"""The console scripts (``ooc-ingest`` ...): each installs, before Python imports the
command, a SIGINT / SIGTERM handler that ends the process quietly with 130 / 143 (nothing
is written before the command runs; ``cli.common.run_command`` then takes the signals over
for the work). Without it, a Ctrl-C in the first half second printed a KeyboardInterrupt
traceback from the middle of an import."""

from __future__ import annotations

import signal
import sys


def _quit(signum, frame):
    raise SystemExit(128 + signum)  # no traceback: Python prints nothing for SystemExit


def _run(name: str) -> int:
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _quit)
    from ooc_learn import cli

    return getattr(cli, name)()


def ingest_main() -> int:
    return _run("ingest_main")


def index_main() -> int:
    return _run("index_main")


def info_main() -> int:
    return _run("info_main")


def check_main() -> int:
    return _run("check_main")


def train_main() -> int:
    return _run("train_main")


def predict_main() -> int:
    return _run("predict_main")


if __name__ == "__main__":  # python -m ooc_learn._entry ooc-train ARGS: what the scripts run
    prog = sys.argv.pop(1)
    sys.argv[0] = prog
    sys.exit(_run(prog.replace("ooc-", "") + "_main"))
