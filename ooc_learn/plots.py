"""``ooc-train --plot FILE.png``: what a C search or a training run did, as a picture.

- a cross-validation (``--cv K``, a ``--C`` list or ``--C-search``): the CV accuracy (or RMSE)
  against C on a log axis, each fold's score as a dot, the mean as a line, the best C marked;
- a training run: the objective against seconds (one line per class for one-vs-rest), the
  rows read against seconds, and, with ``--test`` where the solver hands its iterate over
  (IBCD, bm), the test error against seconds.

matplotlib is the optional extra ``[plot]`` (``pip install -e ".[plot]"``), imported only here
and only when a plot is asked for, with the non-interactive Agg backend. Files are written
through a temporary sibling and renamed, so a failed plot leaves no half-written file.
"""

from __future__ import annotations

import os
from pathlib import Path

from ooc_learn.storage.errors import ParameterError

__all__ = ["check_plot_target", "plot_cv", "plot_training"]

FORMATS = (".png", ".pdf", ".svg")


def check_plot_target(path, *, other_output=None) -> None:
    """Refuse, before any work, a plot file matplotlib cannot write, that cannot be made, that
    is the model's output too (``other_output``: one of the two was lost), or that exists and
    is not a plot of ours (a file of the user's is never written over, as ``-o`` keeps it)."""
    from ooc_learn.storage.replace import check_file_target

    given, path = str(path), Path(path)
    if path.suffix.lower() not in FORMATS:
        raise ParameterError(f"--plot {path}: the file must end in {', '.join(FORMATS)}.",
                             "Name the picture e.g. cv.png.")
    if other_output is not None and os.path.abspath(other_output) == os.path.abspath(path):
        raise ParameterError(f"--plot {path} is the model's -o too: one would overwrite the "
                             "other.", "Give the picture its own name, e.g. run.png.")
    # a folder (or a name ending in a separator), one that cannot be written, a file not ours
    check_file_target(given, is_ours=is_plot_file, kind="plot", flag="--plot")
    _pyplot()


# written into every picture's metadata, and looked for before one is replaced
MARK = "ooc-learn plot"


def is_plot_file(path) -> bool:
    """Whether ``path`` is a picture this module wrote (its metadata names :data:`MARK`)."""
    try:
        with open(path, "rb") as fh:
            return MARK.encode() in fh.read(8 << 20)
    except OSError:
        return False


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise ParameterError("--plot needs matplotlib, which is not installed.",
                             "Install the plot extra: pip install 'ooc-learn[plot]' (or "
                             "pip install matplotlib).") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path) -> None:
    from ooc_learn.storage.replace import atomic_file

    path = Path(path)
    with atomic_file(path) as tmp:
        fmt = path.suffix[1:].lower()
        key = "Subject" if fmt == "pdf" else "Description"  # a field each format has
        fig.savefig(tmp, format=fmt, dpi=120, bbox_inches="tight", metadata={key: MARK})
    _pyplot().close(fig)


def plot_cv(grid: list[dict], metric: str, best_C: float, path, title: str) -> None:
    """``grid``: ``{"C", "estimate", "fold_scores"}`` per C (``ooc-train --cv --json``;
    leave-one-out lists no fold scores: a score per row)."""
    plt = _pyplot()
    scale = 1.0 if metric == "rmse" else 100.0
    label = "CV RMSE" if metric == "rmse" else "CV accuracy (%)"
    fig, ax = plt.subplots(figsize=(6, 4))
    cs = [g["C"] for g in grid]
    folds = all("fold_scores" in g for g in grid)
    for g in grid if folds else []:
        ax.scatter([g["C"]] * len(g["fold_scores"]), [scale * v for v in g["fold_scores"]],
                   s=12, color="0.6", zorder=2)
    ax.plot(cs, [scale * g["estimate"] for g in grid], "o-", color="C0", zorder=3,
            label="mean of the folds" if folds else "leave-one-out")
    best = next(g for g in grid if g["C"] == best_C)
    ax.plot([best_C], [scale * best["estimate"]], "*", ms=14, color="C3", zorder=4,
            label=f"best C = {best_C:g}")
    if len(cs) > 1:
        ax.set_xscale("log")
    ax.set_xlabel("C")
    ax.set_ylabel(label)
    ax.set_title(title, fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    _save(fig, path)


def plot_training(log: list[dict], path, title: str) -> None:
    """``log``: one dict per outer iteration or epoch, with ``seconds`` and any of
    ``objective`` / ``objective_S``, ``rows_read``, ``test_error`` and ``class``."""
    plt = _pyplot()
    panels = [("objective", "objective"), ("rows_read", "rows read")]
    if any("test_error" in e for e in log):
        panels.append(("test_error", "test error (%)"))
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.6))
    series: dict = {}
    for e in log:
        series.setdefault(e.get("class"), []).append(e)
    for ax, (key, label) in zip(axes, panels):
        for c, entries in series.items():
            pts = [(e["seconds"], _value(e, key)) for e in entries if _value(e, key) is not None]
            if pts:
                xs, ys = zip(*pts)
                ax.plot(xs, ys, "o-", ms=3, label=None if c is None else f"class {c:g}")
        ax.set_xlabel("seconds")
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
        if len(series) > 1 and len(series) <= 10 and key == "objective":
            ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    _save(fig, path)


def _value(entry: dict, key: str):
    if key == "objective":
        v = entry.get("objective_S", entry.get("objective"))
    elif key == "test_error":
        v = entry.get("test_error")
        v = None if v is None else 100.0 * v
    else:
        v = entry.get(key)
    return None if v is None else float(v)
