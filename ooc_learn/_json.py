"""One conversion to plain JSON values for models, CV results and the CLI's ``--json``."""

from __future__ import annotations

import math

import numpy as np

__all__ = ["jsonable"]


def jsonable(obj):
    """Numpy scalars/arrays, NamedTuples, dicts and sequences as plain JSON values.

    Non-finite floats become strings (``"nan"``, ``"inf"``) so the output is strict JSON;
    anything else unknown becomes its ``str``.

    >>> jsonable({"a": np.float32(1.5), "b": np.arange(2), "c": float("nan")})
    {'a': 1.5, 'b': [0, 1], 'c': 'nan'}
    """
    if hasattr(obj, "_asdict"):
        return {k: jsonable(v) for k, v in obj._asdict().items()}
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return jsonable(obj.tolist())
    if isinstance(obj, (np.bool_, bool)):
        return bool(obj)
    if isinstance(obj, (np.integer, int)):
        return int(obj)
    if isinstance(obj, (np.floating, float)):
        f = float(obj)
        return f if math.isfinite(f) else str(f)
    if obj is None or isinstance(obj, str):
        return obj
    return str(obj)
