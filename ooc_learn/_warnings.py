"""One form for a warning a command prints: ``prog: warning: message`` on stderr, as its
errors are, not Python's file, line and source echo. The CLI installs it for its own
process (``cli.common.run_command``), a local Dask cluster's workers for theirs
(``distributed.make_client``)."""

from __future__ import annotations

import sys

__all__ = ["warning_line"]


def warning_line(prog: str, said: list | None = None):
    """A ``warnings.showwarning`` that writes ``prog: warning: message`` and appends the
    message to ``said`` (when given)."""
    def show(message, category, filename, lineno, file=None, line=None):
        text = str(message)
        if said is not None:
            said.append(text)
        print(f"{prog}: warning: {text}", file=sys.stderr if file is None else file)
    return show
