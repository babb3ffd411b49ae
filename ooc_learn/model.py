"""The trained linear classifier: scikit-learn style attributes, prediction, pickle-free files.

A :class:`LinearModel` holds ``coef_`` (n_features,), ``intercept_`` and ``classes_``
(``[negative, positive]``: ``predict`` returns ``classes_[1]`` where the decision value is
> 0). It predicts on dense arrays, CSR matrices, or a :class:`~ooc_learn.Store` (block by
block, so a store larger than memory is fine).

Files (no pickle anywhere):

* ``.npz`` -- ``np.savez`` of ``coef``, ``intercept``, ``classes`` and ``meta`` (a JSON
  string); read back with ``np.load(allow_pickle=False)``;
* ``.h5`` / ``.hdf5`` -- datasets ``coef`` and ``classes``, attributes ``intercept`` and
  ``meta`` (the same JSON).

``meta`` records the format and version, the solver, loss, C, s, bias, the feature count, the
label map, the training store's fingerprint and the training statistics. ``checksum`` (a
CRC-32 of the arrays, the intercept and ``meta``) is checked on load, with the shapes, the
feature count and finiteness: a damaged or foreign file is refused (exit 2), never used.
A file is written under a temporary name beside the target, fsynced and renamed over it, so a
kill or a full disk during a save leaves the previous model whole.

>>> import numpy as np
>>> m = LinearModel(np.array([1.0, -1.0]), 0.5, classes=[0, 1])
>>> m.predict(np.array([[2.0, 0.0], [0.0, 2.0]])).tolist()
[1, 0]
"""

from __future__ import annotations

import json
import zlib
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from ooc_learn._json import jsonable
from ooc_learn.storage.errors import ModelMismatchError, ParameterError, UsageError
from ooc_learn.storage.replace import atomic_file

__all__ = ["LinearModel", "load_model", "is_model_file", "model_container", "encode_labels",
           "class_text",
           "regression_errors",
           "error_figures", "MODEL_FORMAT", "MODEL_VERSION"]

MODEL_FORMAT = "ooc-learn-linear-model"
MODEL_VERSION = 1
# names ending so are written as HDF5; any other name holds the npz format (a zip of .npy)
HDF5_SUFFIXES = (".h5", ".hdf5")
_HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"


def model_format(path) -> str:
    """The format a model file of this name is written in: "h5" for ``.h5`` / ``.hdf5``,
    else "npz" (``model.npz``, ``model.model``, ``svm-c1``: any name the user gives)."""
    return "h5" if Path(path).suffix.lower() in HDF5_SUFFIXES else "npz"


def model_container(path) -> str | None:
    """The container a file's first bytes show: "h5" (HDF5) or "npz" (a zip), else None
    (unreadable, or neither: no model of ours)."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(8)
    except OSError:
        return None
    if head == _HDF5_MAGIC:
        return "h5"
    return "npz" if head[:2] == b"PK" else None


def _stored_format(path: Path) -> str:
    """The format a model file holds, from its first bytes (its name where unreadable)."""
    return model_container(path) or model_format(path)


def _checksum(coef, intercept, classes, meta: str) -> int:
    """CRC-32 of everything a model file holds beside its checksum."""
    crc = zlib.crc32(np.ascontiguousarray(coef, dtype="<f8").tobytes())
    crc = zlib.crc32(np.asarray(intercept, dtype="<f8").tobytes(), crc)
    crc = zlib.crc32(json.dumps([str(c) for c in np.asarray(classes).tolist()]).encode(), crc)
    return zlib.crc32(meta.encode(), crc)


def encode_labels(y) -> tuple[np.ndarray, np.ndarray]:
    """Map two classes to -1/+1 (the larger label is +1, as ingest does).

    Returns ``(y_pm, classes)`` with ``classes = [negative, positive]``.

    >>> encode_labels(np.array(["b", "a", "b"]))
    (array([ 1., -1.,  1.]), array(['a', 'b'], dtype='<U1'))
    """
    y = np.asarray(y)
    classes = np.unique(y)
    if classes.size > 2:
        raise ParameterError(
            f"A linear SVM separates two classes. Got {classes.size} distinct labels.",
            "Train one model per class (one-vs-rest) or ingest with --positive-label.")
    if classes.size == 1:
        only = classes[0]
        if only in (-1, 1) and y.dtype.kind in "iuf":
            classes = np.array([-1, 1], dtype=y.dtype)
        else:
            raise ParameterError("A linear SVM needs two classes. Got only one label "
                                 f"({only!r}).", "Check the labels of the training data.")
    return np.where(y == classes[1], 1.0, -1.0), classes


def _is_store(obj) -> bool:
    return hasattr(obj, "iter_blocks") and hasattr(obj, "n_features") and hasattr(obj, "task")


def _store_path(X):
    """An open store where ``X`` is the path of one (closed by the caller), else None
    (:func:`~ooc_learn.storage.store.is_store_path` refuses other paths)."""
    from ooc_learn.storage.store import is_store_path, open_store

    return open_store(X) if is_store_path(X) else None


def _check_values(X) -> None:
    """Refuse rows to score that hold text (numpy's UFuncTypeError from the product) or NaN
    / infinite values (their decision value is NaN, and NaN > 0 is False: a confident
    class for nothing), as ingest refuses them."""
    from ooc_learn.storage.arrays import IMPUTE_HINT, refuse_nonfinite

    kind = (X.data if sp.issparse(X) else X).dtype.kind
    if kind not in "biuf":
        raise ParameterError(f"X must hold numbers. Got an array of dtype {X.dtype}.",
                             "Encode text columns as numbers first (e.g. sklearn's "
                             "OneHotEncoder).")
    if kind == "f":
        refuse_nonfinite(X, hint=IMPUTE_HINT)


class LinearModel:
    """A linear classifier ``sign(x^T coef_ + intercept_)``.

    Parameters
    ----------
    coef : array (n_features,)
    intercept : float
    classes : sequence of two labels, ``[negative, positive]`` (default ``[-1, 1]``)
    meta : dict, optional
        Provenance saved with the model (solver, loss, C, s, bias, store fingerprint, stats).
    """

    def __init__(self, coef, intercept=0.0, *, classes=(-1, 1), meta=None):
        coef = np.asarray(coef, dtype=np.float64)
        self.classes_ = np.asarray([] if classes is None else classes)
        K = self.classes_.shape[0] if self.classes_.ndim == 1 else -1
        if K == 0:  # a regressor: predict returns the decision value
            self.coef_ = coef.ravel().copy()
            self.intercept_ = float(np.asarray(intercept).reshape(()))
        elif coef.ndim == 2 and K >= 3:
            # one-vs-rest: row k separates classes_[k] from the rest (scikit-learn's layout)
            self.coef_ = coef.copy()
            self.intercept_ = np.asarray(intercept, dtype=np.float64).reshape(-1).copy()
            if coef.shape[0] != K or self.intercept_.shape != (K,):
                raise ParameterError(f"A one-vs-rest LinearModel of {K} classes needs coef of "
                                     f"shape ({K}, d) and {K} intercepts. Got {coef.shape} "
                                     f"and {self.intercept_.shape}.")
        else:
            self.coef_ = coef.ravel().copy()
            self.intercept_ = float(np.asarray(intercept).reshape(()))
            if self.classes_.shape != (2,):
                raise ParameterError(f"A binary LinearModel needs two classes (one-vs-rest: "
                                     f"coef of shape (classes, d)). Got {self.classes_!r}.")
        self.meta = dict(meta or {})

    @property
    def multiclass(self) -> bool:
        """Whether this is a one-vs-rest model of three or more classes."""
        return self.coef_.ndim == 2

    @property
    def regression(self) -> bool:
        """Whether this is a regressor (no classes: ``predict`` is the decision value)."""
        return self.classes_.size == 0

    @classmethod
    def one_vs_rest(cls, models, classes, **meta) -> "LinearModel":
        """One model from the binary ``models`` (class k against the rest, in the order of
        ``classes``): ``predict`` picks the class whose model gives the largest value."""
        coef = np.stack([m.coef_ for m in models])
        intercept = np.array([m.intercept_ for m in models])
        return cls(coef, intercept, classes=classes, meta=meta)

    @classmethod
    def from_weights(cls, w, *, bias: float = 1.0, classes=(-1, 1), **meta) -> "LinearModel":
        """From a solver's augmented weights ``w`` (d + 1): ``intercept = w[d] * bias``."""
        w = np.asarray(w, dtype=np.float64)
        meta.setdefault("bias", float(bias))
        return cls(w[:-1], w[-1] * bias, classes=classes, meta=meta)

    @staticmethod
    def classes_from_label_map(label_map: dict) -> np.ndarray:
        """``[negative, positive]`` from a store's label map (-1/+1 for one-vs-rest)."""
        pos, neg = label_map.get("positive"), label_map.get("negative")
        if pos is None or neg is None or isinstance(neg, (list, tuple)):
            return np.array([-1.0, 1.0])
        return np.array([neg, pos])

    @property
    def n_features_in_(self) -> int:
        return self.coef_.shape[-1]

    # -- prediction ----------------------------------------------------------------------
    def _check_features(self, d: int) -> None:
        if d != self.n_features_in_:
            raise ModelMismatchError(
                f"The model was trained on {self.n_features_in_} features; the data have {d}.",
                "Use the model with data ingested from the same feature space (same "
                "--n-features), or retrain on this data.")

    def _decision_arrays(self, X, check: bool = True) -> np.ndarray:
        """Decision values of the rows of an array or a sparse matrix; ``check``: refuse
        values that are not numbers, NaN or infinite (a store's blocks hold finite numbers
        already)."""
        if not sp.issparse(X):
            X = np.asarray(X)
            if X.dtype.kind == "O":  # Python numbers (or text: refused below)
                try:
                    X = X.astype(np.float64)
                except (TypeError, ValueError):
                    pass
            if X.ndim == 1:
                X = X.reshape(1, -1)
            if X.ndim != 2:
                raise ParameterError(f"X must be 2-d. Got {X.ndim} dimensions.")
        self._check_features(X.shape[1])
        if check:
            _check_values(X)
        if self.multiclass:
            return np.asarray(X @ self.coef_.T, dtype=np.float64) + self.intercept_
        return np.asarray(X @ self.coef_, dtype=np.float64).ravel() + self.intercept_

    def iter_decision(self, store):
        """Yield ``(decision_values, y, row_ids)`` for each block of a store, in order."""
        self._check_features(store.n_features)
        for X, y, row_ids in store.iter_blocks():
            yield self._decision_arrays(X, check=False), y, row_ids

    def decision_function(self, X) -> np.ndarray:
        """``X coef_ + intercept_`` for an array, CSR matrix or store (store row order; a
        store's path too)."""
        opened = _store_path(X)
        if opened is not None:
            with opened:
                return self.decision_function(opened)
        if _is_store(X):
            parts = [dv for dv, _, _ in self.iter_decision(X)]
            return np.concatenate(parts) if parts else np.empty(0)
        return self._decision_arrays(X)

    def predict(self, X) -> np.ndarray:
        """``classes_[1]`` where the decision value is > 0, else ``classes_[0]``; one-vs-rest:
        the class of the largest decision value. A model of class names (text labels at
        ingest) predicts the names."""
        codes = self.labels_of(self.decision_function(X))
        names = self.class_names
        return codes if names is None else np.asarray(names)[codes.astype(np.intp)]

    @property
    def class_names(self) -> list | None:
        """The class names of a model trained on text labels (``classes_`` holds their
        codes 0, 1, ...), else None."""
        names = self.meta.get("label_map", {}).get("names")
        return None if self.regression or not names else list(names)

    def labels_of(self, decision) -> np.ndarray:
        """The predicted labels of decision values (one per row, or a row per row)."""
        if self.regression:
            return np.asarray(decision, dtype=np.float64)
        if self.multiclass:
            return self.classes_[np.argmax(decision, axis=1)]
        return self.classes_[(decision > 0).astype(np.intp)]

    def score(self, X, y=None) -> float:
        """Accuracy on ``(X, y)`` (labels in ``classes_``) or on a binary store (streamed; a
        store's path too)."""
        opened = _store_path(X)
        if opened is not None:
            with opened:
                return self.score(opened, y)
        if self.regression:
            return self._r2(X, y)
        if _is_store(X):
            if y is not None:
                raise ParameterError("score(store) takes its labels from the store; do not "
                                     "pass y.")
            want = "multiclass" if self.multiclass else "binary"
            if X.task != want:
                raise ModelMismatchError(
                    f"The store {X.path} holds a {X.task} task; this model scores {want} "
                    f"stores.", "Score with a store ingested like the training store.")
            right = total = 0
            for dv, yb, _ in self.iter_decision(X):
                if self.multiclass:
                    right += int(np.count_nonzero(self.labels_of(dv) == np.asarray(yb)))
                else:
                    right += int(np.count_nonzero((dv > 0) == (np.asarray(yb) > 0)))
                total += dv.shape[0]
            return right / total if total else float("nan")
        if y is None:
            raise ParameterError("score(X, y) needs the labels y for arrays.")
        y = np.asarray(y)
        names = self.class_names
        if names is not None and y.dtype.kind in "USO":  # labels as names: scored as names
            pred = self.predict(X)
            known = names
        else:
            pred = self.labels_of(self.decision_function(X))
            known = self.classes_
        if y.shape != pred.shape:
            raise ParameterError(f"y has {y.shape[0] if y.ndim else 0} labels for "
                                 f"{pred.shape[0]} rows.")
        unknown = ~np.isin(y, known)
        if np.any(unknown):
            raise ModelMismatchError(
                f"y holds labels {np.unique(y[unknown])[:5].tolist()} the model does not know "
                f"(its classes are {list(known) if names else self.classes_.tolist()}).",
                "Score with labels from the training label set.")
        return float(np.mean(pred == y))

    def _r2(self, X, y=None) -> float:
        """R^2 of a regressor (scikit-learn's ``score``) on ``(X, y)`` or a store."""
        st = regression_errors(self, X, y)
        return st["r2"]

    # -- files ---------------------------------------------------------------------------
    def _meta_json(self) -> str:
        meta = dict(self.meta)
        meta.update(format=MODEL_FORMAT, format_version=MODEL_VERSION,
                    n_features=self.n_features_in_)
        return json.dumps(jsonable(meta), sort_keys=True)

    def save(self, path) -> Path:
        """Write the model (no pickle), atomically: HDF5 for a name ending in ``.h5`` /
        ``.hdf5``, npz for any other name, which is kept as given. Returns the path."""
        path = Path(path)
        if path.is_dir():
            raise UsageError(f"{path} is a folder (a store?), where a model file is written.",
                             "Pass a file name, e.g. model.npz.")
        fmt = model_format(path)
        classes = self.classes_
        if classes.dtype.kind == "O":
            classes = classes.astype(str)
        meta = self._meta_json()
        crc = np.uint32(_checksum(self.coef_, self.intercept_, classes, meta))
        with atomic_file(path) as tmp:
            if fmt == "npz":
                with open(tmp, "wb") as fh:  # a file object: np.savez adds no ".npz"
                    np.savez(fh, coef=self.coef_, intercept=np.asarray(self.intercept_,
                                                                        dtype=np.float64),
                             classes=classes, meta=np.array(meta), checksum=crc)
            else:
                import h5py

                with h5py.File(tmp, "w") as f:
                    f.create_dataset("coef", data=self.coef_)
                    if classes.dtype.kind == "U":
                        f.create_dataset("classes", data=classes.astype(object),
                                         dtype=h5py.string_dtype())
                    else:
                        f.create_dataset("classes", data=classes)
                    f.attrs["intercept"] = self.intercept_
                    f.attrs["meta"] = meta
                    f.attrs["checksum"] = crc
        return path

    def __repr__(self) -> str:
        return (f"LinearModel(n_features={self.n_features_in_}, classes={self.classes_.tolist()}, "
                f"solver={self.meta.get('solver')!r}, loss={self.meta.get('loss')!r})")


def class_text(value, names=None) -> str:
    """A class as its source wrote it: its name (``names``: the label map's, indexed by the
    class code), or the value's shortest form that reads back (9, not 9.0)."""
    if names and float(value).is_integer() and 0 <= int(value) < len(names):
        return str(names[int(value)])
    return np.format_float_positional(float(value), trim="-")


def regression_errors(model, X, y=None) -> dict:
    """``{"rmse", "r2", "mae", "n"}`` of a regressor on ``(X, y)`` or a regression store
    (streamed block by block: sums of residuals and labels, never every row at once)."""
    if _is_store(X):
        if y is not None:
            raise ParameterError("A store holds its labels; do not pass y.")
        if X.task != "regression":
            raise ModelMismatchError(f"The store {X.path} holds a {X.task} task; a "
                                     "regressor scores regression stores.",
                                     "Score with a store ingested like the training store.")
        parts = ((dv, yb) for dv, yb, _ in model.iter_decision(X))
    else:
        if y is None:
            raise ParameterError("score(X, y) needs the targets y for arrays.")
        parts = [(model.decision_function(X), y)]
    return error_figures(parts)


def error_figures(parts) -> dict:
    """``{"rmse", "r2", "mae", "n"}`` from ``(decision values, targets)`` pairs, summed part
    by part (a store's blocks, or one pair of arrays)."""
    n = 0
    sse = sae = sy = syy = 0.0
    for dv, yb in parts:
        dv = np.asarray(dv, dtype=np.float64)
        yb = np.asarray(yb, dtype=np.float64).ravel()
        if yb.shape != dv.shape:
            raise ParameterError(f"y has {yb.shape[0]} values for {dv.shape[0]} rows.")
        r = yb - dv
        n += yb.size
        sse += float(r @ r)
        sae += float(np.abs(r).sum())
        sy += float(yb.sum())
        syy += float(yb @ yb)
    if n == 0:
        return {"n": 0, "rmse": float("nan"), "mae": float("nan"), "r2": float("nan")}
    sst = syy - sy * sy / n
    return {"n": n, "rmse": float(np.sqrt(sse / n)), "mae": sae / n,
            "r2": float(1.0 - sse / sst) if sst > 0 else float("nan")}


def _read_model_file(path: Path):
    """``(coef, intercept, classes, meta_text, checksum or None)`` as stored; raises on a file
    that is not one."""
    if _stored_format(path) == "h5":
        import h5py

        with h5py.File(path, "r") as f:
            coef = f["coef"][:]
            classes = f["classes"][:]
            if classes.dtype.kind in "OS":
                classes = np.array([c.decode() if isinstance(c, bytes) else str(c)
                                    for c in classes])
            crc = f.attrs.get("checksum")
            return coef, f.attrs["intercept"], classes, str(f.attrs["meta"]), crc
    with np.load(path, allow_pickle=False) as f:
        crc = f["checksum"] if "checksum" in f.files else None
        return f["coef"], f["intercept"], f["classes"], str(f["meta"][()]), crc


def is_model_file(path) -> bool:
    """Whether ``path`` is a file an ooc-learn model was written to (its format is named)."""
    try:
        return json.loads(_read_model_file(Path(path))[3]).get("format") == MODEL_FORMAT
    except Exception:
        return False


def load_model(path) -> LinearModel:
    """Read a model written by :meth:`LinearModel.save` (``np.load(allow_pickle=False)``).

    The file's checksum, shapes, feature count and values are checked: a damaged, foreign or
    non-finite model raises :class:`UsageError` naming the file.
    """
    path = Path(path)
    if not path.is_file():
        from ooc_learn.storage.store import is_store

        if is_store(path):
            raise UsageError(f"{path} is a store, where a model file was expected.",
                             "The model comes first: ooc-predict MODEL DATA; train one with "
                             "ooc-train STORE -o MODEL.")
        raise UsageError(f"No model file at {path}.", "Train one with: ooc-train STORE -o MODEL")
    fix = "Pass a file written by ooc-train or LinearModel.save (or train the model again)."
    try:
        coef, intercept, classes, meta_text, crc = _read_model_file(path)
        meta = json.loads(meta_text)
        intercept = np.asarray(intercept, dtype=np.float64)
        intercept = float(intercept) if intercept.ndim == 0 else intercept
    except Exception as exc:  # h5py, zipfile, numpy and json each raise their own
        why = str(exc).split(". ")[0] or type(exc).__name__
        raise UsageError(f"{path} is not an ooc-learn model file ({why}).", fix) from None
    if not isinstance(meta, dict) or meta.get("format") != MODEL_FORMAT:
        raise UsageError(f"{path} is not an ooc-learn linear model.", fix)
    if int(meta.get("format_version", -1)) != MODEL_VERSION:
        raise UsageError(f"{path} was written by model format {meta.get('format_version')}; "
                         f"this ooc-learn reads format {MODEL_VERSION}.",
                         "Retrain the model with this version.")
    if crc is not None and int(np.asarray(crc).reshape(())) != _checksum(coef, intercept,
                                                                          classes, meta_text):
        raise UsageError(f"{path} is damaged: its contents do not match its checksum.", fix)
    d = meta.get("n_features")
    K = np.asarray(classes).shape[0] if np.asarray(classes).ndim == 1 else -1
    shape_ok = (coef.ndim == 1 and K in (0, 2)) or (coef.ndim == 2 and K >= 3
                                                and coef.shape[0] == K
                                                and np.shape(intercept) == (K,))
    if (not shape_ok or coef.dtype.kind != "f" or not isinstance(d, int)
            or coef.shape[-1] != d):
        raise UsageError(f"{path} is damaged: coef has shape {coef.shape} ({coef.dtype}) for "
                         f"{d} features and {K} classes.", fix)
    if not (np.isfinite(coef).all() and np.isfinite(intercept).all()):
        raise UsageError(f"{path} holds a weight that is NaN or infinite.",
                         "Train the model again (lower C, or scale the features).")
    for key in ("format", "format_version", "n_features"):
        meta.pop(key, None)
    return LinearModel(coef, intercept, classes=classes, meta=meta)
