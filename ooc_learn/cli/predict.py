"""``ooc-predict``: a model's predictions (and score) on a store or a file."""

from __future__ import annotations

import argparse
import sys

from ooc_learn.storage.errors import ParameterError

from .common import add_common, any_text, command_budget, run_command, stdout_gone
from .evaluate import PREDICTIONS_HEADER, eval_spec, is_predictions_file, open_eval_data


def _predict_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ooc-predict",
                                description="Apply a trained model to a store or a source file.",
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="examples:\n"
                                       "  ooc-predict a9a.npz a9a.t\n"
                                       "  ooc-predict iris.npz new-rows.csv --no-labels -o -\n"
                                       "  ooc-predict a9a.npz test.store -o - | head\n"
                                       "  ooc-predict f.npz fashion-test.store --json")
    p.add_argument("model", metavar="MODEL")
    p.add_argument("data", metavar="STORE_OR_FILE")
    p.add_argument("-o", "--output", metavar="PREDICTIONS", default=None,
                   help="write 'row_id,label,decision' lines in source order (CSV); '-': "
                        "to stdout, the summary then on stderr")
    p.add_argument("--no-labels", action="store_true",
                   help="the CSV or .npy file has no label column (every column a "
                        "feature): predictions only, no score; a CSV whose header names "
                        "the model's features alone, or a .npy of the model's width, is "
                        "read so without it")
    add_common(p)
    return p


WRITE_ROWS = 8192  # predictions formatted at a time (their lines: ~80 bytes each)


def _predict_body(args):
    import contextlib

    import numpy as np

    from pathlib import Path

    from ooc_learn.model import load_model
    from ooc_learn.storage.replace import atomic_file, check_file_target

    to_stdout = args.output == "-"
    if to_stdout and args.json:
        raise ParameterError("-o - writes the predictions to stdout, where --json writes its "
                             "object.", "Drop --json, or write the predictions to a file.")
    if args.output and not to_stdout:  # before the work: only a file of ours is replaced
        check_file_target(args.output, is_ours=is_predictions_file, kind="predictions")
    budget = command_budget(args, parsers=any_text([args.data]))
    # the weights as stored, read and converted (an upper bound that needs no parsing)
    model_bytes = 3 * Path(args.model).stat().st_size if Path(args.model).is_file() else 0
    budget.reserve(model_bytes, f"model {args.model}",
                   hint="or check the training source for a stray large feature index")
    model = load_model(args.model)
    with contextlib.ExitStack() as stack:
        data = open_eval_data(args.data, eval_spec(model=model), budget, stack,
                              labels=False if args.no_labels else None)
        unlabeled = data.unlabeled
        # row ids, decisions, labels, the sort order and the predicted labels of every row
        # (and, one-vs-rest, each row's winning class)
        budget.reserve(48 * data.n_samples, f"predictions of {data.n_samples:,} rows",
                       hint="or predict a part of the rows at a time")
        ids, dec, ys, pred = [], [], [], []
        from tqdm.auto import tqdm

        for X, y, row_ids in tqdm(data.iter_blocks(), total=data.n_blocks, desc="predict",
                                  unit="block", disable=args.quiet, leave=False):
            ids.append(row_ids)
            dv = model.decision_function(X)
            if model.multiclass:  # the winning class's value, not the whole row
                k = np.argmax(dv, axis=1)
                pred.append(k)
                dv = dv[np.arange(dv.shape[0]), k]
            dec.append(dv)
            ys.append(y)
        # one array at a time: each block list is let go before the next is joined
        ids = np.concatenate(ids)
        dec = np.concatenate(dec)
        ys = np.concatenate(ys)
        pred = (np.concatenate(pred) if pred else np.zeros(dec.size, np.intp)
                if model.regression else (dec > 0).astype(np.intp))
    names = model.meta.get("label_map", {}).get("names")
    if model.regression:
        texts = None
    else:  # a class as the source wrote it: its name, or 9, not 9.0 (one text a class)
        from ooc_learn.model import class_text

        texts = np.array([class_text(c, names) for c in model.classes_.tolist()], dtype=object)
    out = {"model": args.model, "data": args.data, "n_samples": int(ids.size),
           "labelled": not unlabeled}
    if unlabeled:  # predictions alone: nothing to score them against (classes: counted)
        accuracy = None
        if not model.regression:
            counts = np.bincount(pred, minlength=texts.size)
            out["predicted"] = {str(t): int(k) for t, k in sorted(zip(texts.tolist(), counts))
                                if k}
    elif model.regression:
        from ooc_learn.model import error_figures

        err = error_figures([(dec, ys)])
        out.update(rmse=err["rmse"], mae=err["mae"], r2=err["r2"])
        accuracy = None
    elif model.multiclass:
        accuracy = float(np.mean(model.classes_[pred].astype(np.float64) == ys))
        classes = np.asarray(model.classes_, dtype=np.float64)  # sorted, as ingest lists them
        truth = np.minimum(np.searchsorted(classes, ys), classes.size - 1)
        known = classes[truth] == ys
        confusion = np.zeros((classes.size, classes.size), np.int64)
        np.add.at(confusion, (truth[known], pred[known]), 1)
        out["classes"] = list(names) if names else model.classes_.tolist()
        out["confusion_matrix"] = confusion.tolist()  # rows: true class, columns: predicted
        out["unknown_labels"] = int((~known).sum())
    else:
        accuracy = float(np.mean(np.where(dec > 0, 1.0, -1.0) == ys))
    if not model.regression and not unlabeled:
        out["accuracy"] = accuracy
    out["output"] = args.output

    def write(fh):
        """The rows in source order, a slice of them formatted at a time (never a Python
        object per row of the whole set)."""
        fh.write(PREDICTIONS_HEADER)
        order = np.argsort(ids, kind="stable")
        for a in range(0, order.size, WRITE_ROWS):
            at = order[a:a + WRITE_ROWS]
            shown = ([f"{v:.9g}" for v in dec[at].tolist()] if texts is None
                     else texts[pred[at]].tolist())
            fh.write("".join(f"{i},{lab},{dv:.9g}\n" for i, lab, dv in zip(
                ids[at].tolist(), shown, dec[at].tolist())))

    if to_stdout:  # the CSV on stdout, the summary on stderr (unless --quiet)
        try:
            write(sys.stdout)
            sys.stdout.flush()
        except BrokenPipeError:  # the reader went away (| head)
            stdout_gone()
    elif args.output:
        with atomic_file(args.output) as tmp, open(tmp, "w") as fh:
            write(fh)
    if unlabeled:
        text = f"{ids.size} rows predicted (no labels to score them against)" + (
            ": " + ", ".join(f"{c} {k}" for c, k in out["predicted"].items())
            if "predicted" in out else "")
    elif model.regression:
        text = f"{ids.size} rows, RMSE {out['rmse']:.6g}, R^2 {out['r2']:.4f}"
    else:
        text = f"{ids.size} rows, accuracy {100 * accuracy:.2f}%"
    text += f", predictions in {args.output}" if args.output and not to_stdout else ""
    if model.multiclass and not unlabeled:
        text += "\n" + _confusion_text(out["classes"], out["confusion_matrix"])
    if to_stdout:
        return {"json": out, "text": None if args.quiet else text, "text_to_stderr": True}
    return {"json": out, "text": text}


def _confusion_text(classes, confusion) -> str:
    """The confusion matrix as a table: a row per true class, a column per predicted one."""
    import numpy as np

    from ooc_learn.model import class_text

    names = [class_text(c) if isinstance(c, float) else str(c)
             for c in np.asarray(classes).tolist()]
    width = max(6, max(len(n) for n in names) + 1,
                max(len(str(v)) for row in confusion for v in row) + 1)
    lines = ["confusion matrix (rows: true class, columns: predicted)",
             " " * width + "".join(f"{n:>{width}}" for n in names)]
    for n, row in zip(names, confusion):
        lines.append(f"{n:>{width}}" + "".join(f"{v:>{width}}" for v in row))
    return "\n".join(lines)


def predict_command():
    """ooc-predict's parser and body (a first run's warm-up runs them: ``cli.warmup``)."""
    return _predict_parser(), _predict_body


def predict_main(argv=None) -> int:
    return run_command("ooc-predict", _predict_parser(), _predict_body, argv)
