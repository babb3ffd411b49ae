"""``python -m ooc_learn.cli COMMAND ARGS...``: a command without its console script."""

import sys

from . import index_main, info_main, ingest_main, predict_main, train_main

MAINS = {"ingest": ingest_main, "info": info_main, "train": train_main,
         "predict": predict_main, "index": index_main}

if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in MAINS:
        print(f"usage: python -m ooc_learn.cli {{{','.join(MAINS)}}} ...", file=sys.stderr)
        sys.exit(2)
    sys.exit(MAINS[sys.argv.pop(1)]())
