"""Command-line entry points: ``ooc-ingest``, ``ooc-index``, ``ooc-info``, ``ooc-check``,
``ooc-train`` and ``ooc-predict`` (one module per command; ``common.py`` what they share).

Every command: ``--help``, ``--version``, ``--memory`` (or ``OOC_MEMORY``), ``--json`` for one
JSON object on stdout, tqdm progress on stderr unless ``--quiet``. The flow is parse ->
validate -> call the library -> print; failures print ``<prog>: <message>`` and the hint on
stderr and exit with 2 for bad input or usage, 1 for runtime failures.
"""

from .common import run_command
from .info import check_main, info_main
from .ingest import index_main, ingest_main
from .predict import predict_main
from .train import train_main

__all__ = ["check_main", "index_main", "info_main", "ingest_main", "predict_main",
           "run_command", "train_main"]
