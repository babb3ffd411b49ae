"""The data a model is scored on (``--test``, ``ooc-predict``): a store, or a file
read with the training store's conventions, and the files predictions go to."""

from __future__ import annotations

import os




EVAL_PREFIX = "ooc-eval-"


def _eval_prefix() -> str:
    """The prefix of this process's temporary evaluation store (``--test`` / ooc-predict on a
    text file), named after its pid; those of processes that are gone (a killed run cannot
    remove its own) are removed first."""
    import tempfile

    from ooc_learn.storage.resources import remove_dead_owned

    remove_dead_owned(tempfile.gettempdir(), EVAL_PREFIX)
    return f"{EVAL_PREFIX}{os.getpid()}-"


def eval_spec(model=None, store=None) -> dict:
    """What evaluation data must match, from a model or from the training store (before
    training): feature count, task, the positive label and the LIBSVM index base."""
    if model is not None:
        task = ("regression" if model.regression else "multiclass" if model.multiclass
                else "binary")
        label_map = model.meta.get("label_map", {})
        return {"n_features": model.n_features_in_, "task": task,
                "positive": label_map.get("positive"), "label_map": label_map,
                "zero_based": model.meta.get("zero_based"),
                "feature_names": model.meta.get("feature_names"),
                "label_name": model.meta.get("label_name"), "what": "The model"}
    return {"n_features": store.n_features, "task": store.task,
            "positive": store.label_map.get("positive"), "label_map": store.label_map,
            "zero_based": store.libsvm_base,
            "feature_names": store.metadata.get("feature_names"),
            "label_name": store.metadata.get("label_name"),
            "what": f"The training store {store.path}"}


def _names_kw(label_map: dict) -> dict:
    """How evaluation data with class names get the training codes: the same names in the
    same order, or (one class against the rest) that class as the positive label."""
    names = (label_map or {}).get("names")
    if not names:
        return {}
    if label_map.get("one_vs_rest"):
        return {"positive_label": names[1], "label_names": None}
    return {"positive_label": None, "label_names": list(names)}


def open_eval_data(path, spec, budget, stack, *, labels: bool | None = True):
    """A store for evaluation: an existing store, or a source file ingested to a temp dir;
    its feature count and task checked against ``spec`` (:func:`eval_spec`). ``labels``:
    True, the rows must carry the training labels (a score is taken); None, a CSV whose
    header names the model's features alone is read without labels; False, a CSV is read
    without labels (``ooc-predict --no-labels``). Rows read without labels are marked by
    the store's ``unlabeled`` attribute (True), their labels 0."""
    import tempfile
    from pathlib import Path

    from ooc_learn.storage.errors import ModelMismatchError
    from ooc_learn.storage.sharded import ShardedStore, is_sharded_store
    from ooc_learn.storage.store import is_store, open_store

    unlabeled = False
    if labels is False and (is_store(path) or is_sharded_store(path)):
        raise ModelMismatchError(f"--no-labels reads a CSV file without a label column; "
                                 f"{path} is a store (its rows carry labels).",
                                 "Drop --no-labels.")
    if is_store(path):
        data = stack.enter_context(open_store(path, memory=budget))
    elif is_sharded_store(path, damaged=True):  # its shards streamed one after another
        data = _ShardsInTurn(ShardedStore(path), budget)
    else:
        from ooc_learn.api import ingest

        tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix=_eval_prefix()))
        pos = spec["positive"]
        # a LIBSVM file is read with the training store's index base, decided once at its
        # ingest (auto-detected apart, a stray "0:" in either file shifted every feature of
        # one of them: 57 % test accuracy, exit 0); a contradiction is refused with the file
        # and line
        base = spec["zero_based"]
        task = spec["task"] if spec["task"] != "binary" else "binary" if pos is None else "auto"
        kw = {"positive_label": pos, **_names_kw(spec.get("label_map"))}
        # a LIBSVM file names its features: one with fewer than the model has them at 0,
        # one with more has features the model gives no weight (a9a.t against a9a);
        # LIBLINEAR's predict leaves those out, and so does this, saying so
        from ooc_learn.storage.sniff import detect_format

        fmt = detect_format(path)
        named = fmt == "libsvm"
        if labels is False and fmt not in ("csv", "npy"):
            raise ModelMismatchError(f"--no-labels reads a CSV or .npy file without a label "
                                     f"column; {path} is {fmt}.", "Drop --no-labels.")
        if fmt == "npy":  # no header: its width tells features alone from a label and them
            unlabeled = _npy_unlabeled(path, spec, labels)
            if unlabeled:
                from ooc_learn.storage.sniff import NO_LABEL

                kw, task = {"label_column": NO_LABEL}, "regression"
        layout = _probe_csv(path) if fmt == "csv" else None  # its head read once here
        if layout is not None:
            unlabeled = _check_csv_width(path, layout, spec, labels)
            if unlabeled:  # every column a feature; labels 0, read as numbers
                from ooc_learn.storage.sniff import NO_LABEL

                kw, task = {"label_column": NO_LABEL}, "regression"
            elif spec.get("label_name"):  # the training data's label column
                kw["label_column"] = _label_of(layout, spec["label_name"])
        from ooc_learn.storage.ingest_plan import WiderThanAsked

        try:
            data = stack.enter_context(ingest(
                [path], Path(tmp) / "eval.store", build_index=False, memory=budget,
                n_features=None if named else spec["n_features"], task=task,
                zero_based="auto" if base is None else bool(base), **kw))
        except WiderThanAsked as exc:  # its hint named ingest's --n-features
            raise ModelMismatchError(
                f"{spec['what']} has {spec['n_features']} features; {path} has "
                f"{exc.data}.", "Score data of the model's feature space (the same columns), "
                "or retrain on this data.") from None
        d = spec["n_features"]
        if named and data.n_features != d:
            if data.n_features > d:
                import warnings

                what = spec["what"][:1].lower() + spec["what"][1:]  # not the path's case
                warnings.warn(f"{path} has {data.n_features} features, {what} {d}: features "
                              f"beyond {d} have no weight in it and are left out, as "
                              f"LIBLINEAR's predict does.", RuntimeWarning, stacklevel=2)
            data = _Resized(data, d)
    if data.n_features != spec["n_features"]:
        raise ModelMismatchError(
            f"{spec['what']} has {spec['n_features']} features; {path} has "
            f"{data.n_features}.", "Use data ingested from the same feature space (same "
            "--n-features), or retrain on this data.")
    _check_columns(spec, data, path)
    data.unlabeled = unlabeled
    if not unlabeled and data.task != spec["task"]:
        raise ModelMismatchError(f"{spec['what']} is for a {spec['task']} task; {path} holds "
                                 f"a {data.task} task.",
                                 f"Ingest the evaluation data with --task {spec['task']}.")
    if not unlabeled:
        _warn_foreign_labels(spec, data.label_map, path)
    return data


def _foreign_labels(model_map: dict, data_map: dict) -> tuple[list, str]:
    """The labels of the data to score that are none of the model's classes, and how the
    score counts them."""
    def values(v):
        return [] if v is None else [float(x) for x in (v if isinstance(v, list) else [v])]

    if "classes" in model_map:  # multiclass
        known = set(values(model_map["classes"]))
        return (sorted(set(values(data_map.get("classes"))) - known),
                "counted as errors and left out of the confusion matrix")
    if model_map.get("one_vs_rest") or "positive" not in model_map:
        return [], ""  # one class against every other label: any label is the rest
    known = set(values(model_map.get("negative"))) | set(values(model_map["positive"]))
    return (sorted(set(values(data_map.get("negative"))) - known),
            f"scored as the negative class (the model's classes: "
            f"{', '.join(f'{v:g}' for v in sorted(known))})")


def _warn_foreign_labels(spec: dict, data_map: dict, path) -> None:
    """Say where the rows to score carry labels the model never learned (a file of other
    labels, or a model of other data): the score counts them, silently, as errors."""
    if (spec.get("label_map") or {}).get("names"):
        return  # class names: ingest maps them by name (and refuses unknown ones)
    extra, how = _foreign_labels(spec.get("label_map") or {}, data_map or {})
    if extra:
        import warnings

        shown = ", ".join(f"{v:g}" for v in extra[:8]) + (" ..." if len(extra) > 8 else "")
        warnings.warn(f"{path} has labels that are not the model's classes ({shown}): its "
                      f"rows so labelled are {how}. Is it the data the model was trained "
                      f"for?", RuntimeWarning, stacklevel=3)


def _probe_csv(path):
    """The CSV's layout as ingest would detect it, or None where it cannot be read (the
    ingest then reports what is wrong with the file)."""
    import warnings

    from ooc_learn.storage.sniff import csv_layout

    try:
        with warnings.catch_warnings():  # a probe: its default label is not the one read
            warnings.simplefilter("ignore")
            return csv_layout(path, None, None, None)
    except Exception:
        return None


def _npy_unlabeled(path, spec, labels) -> bool:
    """Whether a ``.npy`` is read without labels: its rows the model's features alone (or
    ``--no-labels``); with one column more, the first is the label (as ingest reads it).
    Another width is refused before reading, as are features alone where a score needs
    labels (``--test``)."""
    from ooc_learn.storage.parsers import npy_width
    from ooc_learn.storage.errors import ModelMismatchError

    d, k = spec["n_features"], npy_width(path)
    what = spec["what"][:1].lower() + spec["what"][1:]
    if k == d and labels is not True:
        return True
    if k == d:
        raise ModelMismatchError(
            f"{path} has {k} columns, {what}'s features alone: a score needs the label too.",
            f"Save {d + 1} columns, the label first (np.save(f, np.c_[y, X])), or predict "
            f"its rows with ooc-predict.")
    if labels is False or k != d + 1:
        alone = "its features" if labels is False else "a label and its features"
        raise ModelMismatchError(
            f"{path} has {k} columns; read as {alone}, they do not fit {what}'s {d} features.",
            f"Save rows of the model's {d} features (np.save(f, X)) to predict them, or "
            f"{d + 1} columns, the label first, to score them.")
    return False


def _check_csv_width(path, layout, spec, labels) -> bool:
    """Whether a CSV is read without labels (see :func:`open_eval_data`'s ``labels``), after
    refusing, before reading it, one whose columns cannot be the model's features and a
    label: the model's features alone where labels are needed (the first column had been
    taken for the label, and the rows failed in the label mapping), or another number of
    them."""
    from ooc_learn.storage.errors import ModelMismatchError

    d, k = spec["n_features"], layout.n_fields
    names = (None if layout.label_name is None
             else layout.feature_names[:layout.label_col] + [layout.label_name]
             + layout.feature_names[layout.label_col:])
    what = spec["what"][:1].lower() + spec["what"][1:]
    want = spec.get("feature_names")
    label = spec.get("label_name")
    column = f"a label column ({label!r} in training)" if label else "a label column"
    if labels is False:
        if k != d:
            raise ModelMismatchError(
                f"{path} has {k} columns; read without labels (--no-labels), they are its "
                f"features, and {what} has {d}.", "Score data with the training data's "
                "feature columns (and drop --no-labels if one column is the label).")
        return True
    # a column of class names, or the training label's name in the header, is a label
    labelled = layout.text_label or bool(names and label and label in names)
    if not labelled and want and names == list(want) and labels is None:
        return True  # the header names the model's features, in order, and nothing else
    if not labelled and (k == d or (want and names == list(want))):
        maybe = "" if names else ", or a label and one feature too few"
        raise ModelMismatchError(
            f"{path} has {k} columns, as many as {what} has features, and no label "
            f"column{maybe}. "
            "A score is taken from each row's label.",
            f"Add {column}" + ("." if labels else "; or, for predictions alone, pass "
                               "--no-labels to ooc-predict (every column a feature)."))
    if k != d + 1:
        raise ModelMismatchError(
            f"{path} has {k} columns ({k - 1} features and a label); {what} has {d} "
            "features.",
            "Score data with the training data's columns.")
    return False


def _label_of(layout, name):
    """``name`` where the CSV's header (its ``layout``) has that column (the training
    label's), else None (the usual choice)."""
    names = (layout.feature_names or []) + [layout.label_name]
    return name if name in names else None


def _check_columns(spec, data, path) -> None:
    """Refuse evaluation rows whose CSV header names other columns, or the same ones in
    another order, than the training data's: read by position, they would be scored
    silently wrong (as scikit-learn refuses feature names that differ from fit's)."""
    from ooc_learn.storage.errors import ModelMismatchError
    from ooc_learn.storage.sniff import first_difference

    want = spec.get("feature_names")
    got = getattr(data, "metadata", {}).get("feature_names")
    if not want or not got or list(want) == list(got):
        return
    if sorted(want) == sorted(got):
        raise ModelMismatchError(
            f"{path} has the training data's columns in another order: "
            f"{', '.join(got[:6])}{' ...' if len(got) > 6 else ''} against "
            f"{', '.join(want[:6])}{' ...' if len(want) > 6 else ''}.",
            "Write the columns in the training order (they are read by position).")
    at = first_difference(got, want)
    theirs = repr(got[at]) if at < len(got) else "nothing"
    ours = repr(want[at]) if at < len(want) else "nothing"
    raise ModelMismatchError(
        f"{path}'s header names other columns than the training data's: column {at + 1} is "
        f"{theirs} there and {ours} in training.",
        "Score data with the training data's columns, in its order.")


class _Resized:
    """A store read with ``d`` features: columns beyond ``d`` left out, or missing ones at
    0 (a LIBSVM file whose largest index differs from the model's)."""

    def __init__(self, store, d: int):
        self.store, self.n_features = store, int(d)
        for name in ("path", "n_samples", "task", "label_map", "n_blocks"):
            setattr(self, name, getattr(store, name))

    def iter_blocks(self):
        import numpy as np
        import scipy.sparse as sp

        d = self.n_features
        for X, y, ids in self.store.iter_blocks():
            if sp.issparse(X):
                X = X[:, :d] if X.shape[1] > d else sp.csr_matrix(
                    (X.data, X.indices, X.indptr), shape=(X.shape[0], d))
            else:
                X = X[:, :d] if X.shape[1] > d else np.pad(X, ((0, 0), (0, d - X.shape[1])))
            yield X, y, ids


def _check_shards(sharded, budget) -> None:
    """Refuse, before any work, a sharded store whose shards are missing or are not the ones
    its manifest lists (each shard's metadata read, not its rows): a shard replaced by
    other data was scored as the one listed (its rows counted twice, exit 0)."""
    from ooc_learn.storage.errors import StoreFormatError
    from ooc_learn.storage.store import open_store

    for k in range(sharded.n_shards):
        path = sharded.shard_path(k)
        if not path.is_dir():
            raise StoreFormatError(f"Shard {k} of {sharded.path} is missing ({path}).",
                                   "Put it back, or ingest the source again with --shards.")
        with open_store(path, memory=budget) as st:
            problems = sharded.shard_problems(k, st)
        if problems:
            raise StoreFormatError(f"The sharded store {sharded.path}: {problems[0]}.",
                                   "Put the listed shard back, or ingest the source again "
                                   "with --shards.")


class _ShardsInTurn:
    """A sharded store read as one for scoring and prediction: every block of every shard,
    each shard opened in turn under the budget (what a model CoCoA+ trained over the shards
    is scored on)."""

    def __init__(self, sharded, budget):
        _check_shards(sharded, budget)  # missing or swapped shards: before the work
        self.sharded, self.budget, self.path = sharded, budget, sharded.path
        self.n_samples, self.n_features = sharded.n_samples, sharded.n_features
        self.task, self.label_map = sharded.task, sharded.label_map
        self.n_blocks = sharded.n_blocks

    def iter_blocks(self):
        from ooc_learn.storage.store import open_store

        for path in self.sharded.shard_paths:
            with open_store(path, memory=self.budget) as st:
                yield from st.iter_blocks()


PREDICTIONS_HEADER = "row_id,label,decision\n"


def check_model_output(path) -> None:
    """Refuse, before any work, a model path that is not one or holds a file not ours."""
    from ooc_learn.model import is_model_file
    from ooc_learn.storage.replace import check_file_target

    check_file_target(path, is_ours=is_model_file, kind="model")


def is_predictions_file(path) -> bool:
    try:
        with open(path) as fh:
            return fh.readline() == PREDICTIONS_HEADER
    except (OSError, UnicodeDecodeError):
        return False
