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

__all__ = ["LinearModel", "load_model", "is_model_file", "encode_labels", "MODEL_FORMAT",
           "MODEL_VERSION"]

MODEL_FORMAT = "ooc-learn-linear-model"
MODEL_VERSION = 1
MODEL_SUFFIXES = (".npz", ".h5", ".hdf5")


def check_model_suffix(path) -> str:
    """The model file's suffix, or :class:`ParameterError` when it is not one we write."""
    suffix = Path(path).suffix.lower()
    if suffix not in MODEL_SUFFIXES:
        raise ParameterError(f"A model file must end in .npz, .h5 or .hdf5. Got "
                             f"{Path(path).name!r}.", "Choose e.g. -o model.npz.")
    return suffix


def _checksum(coef, intercept, classes, meta: str) -> int:
    """CRC-32 of everything a model file holds beside its checksum."""
    crc = zlib.crc32(np.ascontiguousarray(coef, dtype="<f8").tobytes())
    crc = zlib.crc32(np.float64(intercept).astype("<f8").tobytes(), crc)
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

    def __init__(self, coef, intercept: float = 0.0, *, classes=(-1, 1), meta=None):
        self.coef_ = np.asarray(coef, dtype=np.float64).ravel().copy()
        self.intercept_ = float(intercept)
        self.classes_ = np.asarray(classes)
        if self.classes_.shape != (2,):
            raise ParameterError(f"A LinearModel needs two classes. Got {self.classes_!r}.")
        self.meta = dict(meta or {})

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
        return self.coef_.shape[0]

    # -- prediction ----------------------------------------------------------------------
    def _check_features(self, d: int) -> None:
        if d != self.n_features_in_:
            raise ModelMismatchError(
                f"The model was trained on {self.n_features_in_} features; the data have {d}.",
                "Use the model with data ingested from the same feature space (same "
                "--n-features), or retrain on this data.")

    def _decision_arrays(self, X) -> np.ndarray:
        if not sp.issparse(X):
            X = np.asarray(X)
            if X.ndim == 1:
                X = X.reshape(1, -1)
            if X.ndim != 2:
                raise ParameterError(f"X must be 2-d. Got {X.ndim} dimensions.")
        self._check_features(X.shape[1])
        return np.asarray(X @ self.coef_, dtype=np.float64).ravel() + self.intercept_

    def iter_decision(self, store):
        """Yield ``(decision_values, y, row_ids)`` for each block of a store, in order."""
        self._check_features(store.n_features)
        for X, y, row_ids in store.iter_blocks():
            yield self._decision_arrays(X), y, row_ids

    def decision_function(self, X) -> np.ndarray:
        """``X coef_ + intercept_`` for an array, CSR matrix or store (store row order)."""
        if _is_store(X):
            parts = [dv for dv, _, _ in self.iter_decision(X)]
            return np.concatenate(parts) if parts else np.empty(0)
        return self._decision_arrays(X)

    def predict(self, X) -> np.ndarray:
        """``classes_[1]`` where the decision value is > 0, else ``classes_[0]``."""
        return self.classes_[(self.decision_function(X) > 0).astype(np.intp)]

    def score(self, X, y=None) -> float:
        """Accuracy on ``(X, y)`` (labels in ``classes_``) or on a binary store (streamed)."""
        if _is_store(X):
            if y is not None:
                raise ParameterError("score(store) takes its labels from the store; do not "
                                     "pass y.")
            if X.task != "binary":
                raise ModelMismatchError(f"The store {X.path} holds a {X.task} task; a "
                                         "linear SVM scores binary stores.")
            right = total = 0
            for dv, yb, _ in self.iter_decision(X):
                right += int(np.count_nonzero((dv > 0) == (np.asarray(yb) > 0)))
                total += dv.shape[0]
            return right / total if total else float("nan")
        if y is None:
            raise ParameterError("score(X, y) needs the labels y for arrays.")
        y = np.asarray(y)
        pred = self.predict(X)
        if y.shape != pred.shape:
            raise ParameterError(f"y has {y.shape[0] if y.ndim else 0} labels for "
                                 f"{pred.shape[0]} rows.")
        unknown = ~np.isin(y, self.classes_)
        if np.any(unknown):
            raise ModelMismatchError(
                f"y holds labels {np.unique(y[unknown])[:5].tolist()} the model does not know "
                f"(its classes are {self.classes_.tolist()}).",
                "Score with labels from the training label set.")
        return float(np.mean(pred == y))

    # -- files ---------------------------------------------------------------------------
    def _meta_json(self) -> str:
        meta = dict(self.meta)
        meta.update(format=MODEL_FORMAT, format_version=MODEL_VERSION,
                    n_features=self.n_features_in_)
        return json.dumps(jsonable(meta), sort_keys=True)

    def save(self, path) -> Path:
        """Write the model to ``.npz`` or ``.h5``/``.hdf5`` (no pickle), atomically. Returns
        the path."""
        path = Path(path)
        suffix = check_model_suffix(path)
        classes = self.classes_
        if classes.dtype.kind == "O":
            classes = classes.astype(str)
        meta = self._meta_json()
        crc = np.uint32(_checksum(self.coef_, self.intercept_, classes, meta))
        with atomic_file(path) as tmp:
            if suffix == ".npz":
                with open(tmp, "wb") as fh:
                    np.savez(fh, coef=self.coef_, intercept=np.float64(self.intercept_),
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


def _read_model_file(path: Path):
    """``(coef, intercept, classes, meta_text, checksum or None)`` as stored; raises on a file
    that is not one."""
    if path.suffix.lower() in (".h5", ".hdf5"):
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
        raise UsageError(f"No model file at {path}.", "Train one with: ooc-train STORE -o MODEL")
    fix = "Pass a file written by ooc-train or LinearModel.save (or train the model again)."
    try:
        coef, intercept, classes, meta_text, crc = _read_model_file(path)
        meta = json.loads(meta_text)
        intercept = float(np.asarray(intercept).reshape(()))
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
    if (coef.ndim != 1 or coef.dtype.kind != "f" or not isinstance(d, int)
            or coef.shape[0] != d or np.asarray(classes).shape != (2,)):
        raise UsageError(f"{path} is damaged: coef has shape {coef.shape} ({coef.dtype}) for "
                         f"{d} features and {np.asarray(classes).shape[0]} classes.", fix)
    if not (np.isfinite(coef).all() and np.isfinite(intercept)):
        raise UsageError(f"{path} holds a weight that is NaN or infinite.",
                         "Train the model again (lower C, or scale the features).")
    for key in ("format", "format_version", "n_features"):
        meta.pop(key, None)
    return LinearModel(coef, intercept, classes=classes, meta=meta)
