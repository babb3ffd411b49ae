"""What every command shares: common options, the memory budget, and ``run_command``,
which turns failures, signals and closed pipes into one line and an exit code."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import warnings
from typing import Callable

from ooc_learn._json import jsonable
from ooc_learn._warnings import warning_line
from ooc_learn.storage.budget import MemoryBudget, parse_size
from ooc_learn.storage.errors import OOCError
from ooc_learn.storage.stop import request_stop



def add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--memory", metavar="SIZE", default=None,
                   help="memory cap for the whole run, e.g. 512M or 4G "
                        "(default: $OOC_MEMORY, else 25%% of RAM)")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object with the results on stdout")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bars")
    p.add_argument("-v", "--verbose", action="store_true", help="log progress details")
    from ooc_learn import __version__

    p.add_argument("--version", action="version", version=f"%(prog)s (ooc-learn) {__version__}")


def command_budget(args, *, solvers: bool = False, parsers: bool = False) -> MemoryBudget:
    """The run's budget: ``--memory`` is the whole process, its fixed part charged first.

    ``for_process`` imports the libraries every command loads and sets numba's compiler up
    before it measures the fixed part, so the measurement holds them and the allowance covers
    only what loads later: the command's own compiled kernels, the solvers' (``solvers``) and
    the text parsers' (``parsers``) where it uses them.
    """
    from ooc_learn.storage.budget import late_load_bytes

    budget = MemoryBudget.for_process(None if args.memory is None else parse_size(args.memory),
                                      late_load=late_load_bytes(solvers=solvers,
                                                                parsers=parsers),
                                      start_peak=True)
    args.budget_ = budget  # run_command reports its figures in --json
    return budget


def any_text(paths) -> bool:
    """Whether any of ``paths`` is a text source (its parsers' kernels will load)."""
    from ooc_learn.storage.store import is_store

    return any(p is not None and not is_store(p) and not str(p).endswith((".npy", ".npz"))
               for p in paths)


def ahead_kernels(prog: str, args, kernels=None) -> list[str]:
    """The large kernels of ``prog``'s run that a helper process can compile in parallel on
    a first run (see ``_jit.compile_ahead``): those of its main kernels
    (``kernels``, else ``_warmup.first_run_kernels``) in ``_jit.AHEAD``, the tree builder of
    an indexed ingest, the compiled index search of IBCD. None on Dask (the workers compile
    their own)."""
    from ooc_learn._jit import AHEAD
    from ooc_learn._warmup import first_run_kernels

    if getattr(args, "workers", None) is not None or getattr(args, "scheduler", None) is not None:
        return []
    kernels = first_run_kernels(prog, args) if kernels is None else kernels
    return [name for _, name in kernels if name in AHEAD]


def run_command(prog: str, parser: argparse.ArgumentParser, body: Callable, argv=None) -> int:
    """Parse ``argv``, run ``body(args)`` and turn failures into messages and exit codes."""
    # from the start: a signal before the work is taken at its first safe point
    stop = _StopSignals()
    stderr = sys.stderr
    if not isinstance(stderr, _StderrGuard):
        sys.stderr = _StderrGuard(stderr)
    try:
        code = _run_command(prog, parser, body, argv, stop)
        # the work is done and reported: a signal from here on (the console script's handler
        # is back) no longer changes the exit code (a complete store exited 130)
        FINISHED["code"] = code
        return code
    finally:
        stop.restore()
        sys.stderr = stderr


# the exit code of the command this process ran, once it has finished (``_entry``'s
# handler leaves a later SIGINT / SIGTERM alone)
FINISHED: dict = {"code": None}


def _run_command(prog, parser, body, argv, stop) -> int:
    if "--json" in (sys.argv[1:] if argv is None else argv):
        _json_usage_errors(parser)
    args = parser.parse_args(argv)
    from ooc_learn.storage.resources import limit_allocator_retention

    limit_allocator_retention()
    from ooc_learn._warmup import first_run_kernels, warm_up_first  # before numba loads

    cap = getattr(args, "memory", None) or os.environ.get("OOC_MEMORY") or None
    memory_given = cap is not None
    if memory_given:  # a first run's kernels compiled before the work, outside this process
        try:
            cap = parse_size(cap)
        except Exception:  # a bad size: the command's own check names it, at once
            cap = None
    try:
        kernels = first_run_kernels(prog, args, cap)  # this run's main kernels (file reads)
    except OOCError:  # a bad OOC_MEMORY or input: the command's own checks name it, exit 2
        kernels = ()
    if cap is not None:
        warm_up_first(prog, sys.argv[1:] if argv is None else argv, args, stop, cap=cap,
                      kernels=kernels)
    from ooc_learn._jit import announce_first_run, compile_ahead

    if not getattr(args, "quiet", False):
        announce_first_run(prog, kernels, memory_given)
    compile_ahead(ahead_kernels(prog, args, kernels), memory_given=memory_given)
    logging.basicConfig(level=logging.INFO if getattr(args, "verbose", False) else logging.WARNING,
                        format=f"{prog}: %(message)s", stream=sys.stderr)
    said: list[str] = []
    try:
        with warnings.catch_warnings():
            # a warning is a line of the command's, as its errors are, not Python's (file,
            # line and source); --json also lists them
            warnings.showwarning = warning_line(prog, said)
            result = body(args)
    except BaseException as exc:
        if stop.signum is not None:
            # SIGINT or SIGTERM: whatever the exception became on its way out (h5py or numba
            # can wrap it), one line and 128 + the signal; the work's own cleanup (a
            # temporary store, a spill folder) ran while it unwound
            what = "interrupted" if stop.signum == signal.SIGINT else "terminated"
            print(f"{prog}: {what}; no partial output is left", file=sys.stderr)
            if getattr(args, "json", False):
                print(json.dumps({"error": what, "hint": "", "exit_code": 128 + stop.signum}))
            return 128 + stop.signum
        if isinstance(exc, OOCError):
            message, hint, code = exc.message, exc.hint, exc.exit_code
        elif isinstance(exc, OSError):  # the disk, not the data: the file and the fix
            message, hint, code = _os_error(exc)
        else:
            raise
        print(f"{prog}: {message}", file=sys.stderr)
        if hint:
            print(f"{prog}: hint: {hint}", file=sys.stderr)
        if getattr(args, "json", False):  # --json: the failure is JSON on stdout too
            print(json.dumps({"error": message, "hint": hint, "exit_code": code}))
        return code
    if result is None:
        return 0
    budget = getattr(args, "budget_", None)
    if said and isinstance(result.get("json"), dict):
        result["json"]["warnings"] = said
    if budget is not None and isinstance(result.get("json"), dict):
        from ooc_learn.storage.resources import peak_rss_bytes

        out = result["json"]
        out["memory_cap_bytes"] = budget.cap
        out["memory_fixed_bytes"] = budget.fixed  # charged first: interpreter, libraries
        out["memory_reserved_peak_bytes"] = budget.peak  # the most the buffers held at once
        out["memory_start_peak_bytes"] = budget.start_peak  # the least cap: the start's RSS
        if out.get("peak_rss_bytes") is None:
            out["peak_rss_bytes"] = peak_rss_bytes()
    try:
        if getattr(args, "json", False):
            print(json.dumps(jsonable(result["json"])))
        elif result.get("text_to_stderr"):  # stdout holds the command's data (-o -)
            if result["text"] is not None:
                print(result["text"], file=sys.stderr)
        else:
            print(result["text"])
        sys.stdout.flush()
    except BrokenPipeError:
        # the reader went away (``| head``): the work is done and saved; no traceback
        stdout_gone()
    return 0


def _json_usage_errors(parser: argparse.ArgumentParser) -> None:
    """Under ``--json`` a usage error (an unknown flag, a bad choice) is JSON on stdout too,
    as every other failure is; argparse still prints the usage and exits 2."""
    usage_error = parser.error

    def error(message):
        print(json.dumps({"error": message, "hint": f"See {parser.prog} --help.",
                          "exit_code": 2}))
        sys.stdout.flush()
        usage_error(message)

    parser.error = error


class _StderrGuard:
    """``sys.stderr`` that outlives its reader (``ooc-train ... 2>&1 | grep -m1 warning``):
    where a write finds the pipe closed, stderr points at /dev/null from then on and the
    work goes on to save its results (a warning's write had ended the run, the model
    unsaved)."""

    def __init__(self, stream):
        self._stream = stream

    def _gone(self) -> None:
        _to_devnull(self._stream)

    def write(self, text):
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._gone()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._gone()

    def __getattr__(self, name):
        return getattr(self._stream, name)


def stdout_gone() -> None:
    """Point stdout at /dev/null after its reader went away, so the interpreter's own flush
    at exit stays quiet (no BrokenPipeError traceback)."""
    _to_devnull(sys.stdout)


def _to_devnull(stream) -> None:
    """Point ``stream``'s file descriptor at /dev/null (its reader went away)."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), stream.fileno())
    except (OSError, ValueError):  # no descriptor (a test's capture): nothing to point
        pass


class _StopSignals:
    """SIGINT and SIGTERM stop the work at its next safe point by a KeyboardInterrupt
    (SIGTERM's default would kill the process before any cleanup) and are remembered, so that
    ``run_command`` answers one line and 130 / 143 whatever exception the stop became."""

    def __init__(self):
        self.signum = None
        self._old = {}
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                self._old[sig] = signal.signal(sig, self._raise)
            except ValueError:  # not the main thread: leave the handlers alone
                pass

    def _raise(self, signum, frame):
        # the first signal is a request, taken at the work's next safe point (a reservation,
        # a store read, a parsed chunk: stop.check_stop); raising here could land inside
        # a helper a numba kernel calls back into, and crash the process; a second one
        # raises at once
        if self.signum is None:
            self.signum = signum
            request_stop(signum)
            return
        raise KeyboardInterrupt

    def restore(self):
        for sig, old in self._old.items():
            signal.signal(sig, old)


def _os_error(exc: OSError) -> tuple[str, str, int]:
    """A message, a hint and an exit code for a failure of the file system."""
    import errno

    where = exc.filename or "a file"
    what = exc.strerror or str(exc)
    if exc.errno == errno.ENOSPC or exc.errno == getattr(errno, "EDQUOT", None):
        return (f"{where}: {what} (nothing already stored was replaced).",
                "Free disk space, or write to another disk (-o, --spill-dir, TMPDIR).", 1)
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return (f"{where}: {what}.", "Choose a folder you can write to (-o).", 2)
    if exc.errno in (errno.ENOENT, errno.ENOTDIR):
        return f"{where}: {what}.", "Check the path.", 2
    return f"{where}: {what}.", "Check the disk and the path, then run the command again.", 1
