"""Run the commands on damaged stores in one process: ``python -m ooc_learn._corrupt_driver
OUT STORE...`` prints one JSON line per store and command: the exit code, whether a Python
exception escaped (a traceback), and the message. A signal (a crash) kills the process, and
the last line printed names the store it was on."""

import contextlib
import io
import json
import sys
import traceback
import warnings


def run(fn, argv):
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()), \
                warnings.catch_warnings():
            warnings.simplefilter("ignore")
            rc = fn(argv)
        return {"rc": rc, "traceback": None, "stderr": err.getvalue()[-400:]}
    except SystemExit as exc:
        return {"rc": exc.code, "traceback": None, "stderr": err.getvalue()[-400:]}
    except BaseException:
        return {"rc": None, "traceback": traceback.format_exc()[-1500:],
                "stderr": err.getvalue()[-400:]}


def main(argv):
    from ooc_learn.cli import check_main, train_main

    out, stores = argv[0], argv[1:]
    model = f"{out}/driver-model.npz"
    for s in stores:
        print(json.dumps({"store": s, "cmd": "start"}), flush=True)
        res = {"check": run(check_main, [s, "-q", "--memory", "512M"]),
               "train": run(train_main, [s, "-o", model, "-q", "--memory", "512M"]),
               "dcd": run(train_main, [s, "-o", model, "-q", "--solver", "dcd",
                                       "--memory", "512M"])}
        for cmd, r in res.items():
            print(json.dumps(dict(r, store=s, cmd=cmd)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
