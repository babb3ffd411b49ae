"""Generated example data (no downloads): ``python -m ooc_learn.datasets OUT.svm``.

The README's first command uses it to make a LIBSVM file to ingest and train on.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

__all__ = ["make_linear_classification", "write_svmlight"]


def make_linear_classification(n_samples: int = 20000, n_features: int = 50, *,
                               density: float = 0.3, flip: float = 0.05, seed: int = 0):
    """A sparse, nearly linearly separable binary problem with ``flip`` label noise.

    Returns ``(X, y, w_true)`` with ``X`` a float32 CSR matrix and ``y`` in {-1, +1}.
    """
    import scipy.sparse as sp

    rng = np.random.default_rng(seed)
    X = sp.random(n_samples, n_features, density=density, random_state=rng, format="csr",
                  dtype=np.float32, data_rvs=lambda k: rng.normal(size=k))
    w = rng.normal(size=n_features)
    margin = X @ w + 0.3
    y = np.where(margin > 0, 1.0, -1.0)
    flip_rows = rng.random(n_samples) < flip
    y[flip_rows] *= -1
    return X, y, w


def write_svmlight(path, X, y, *, zero_based: bool = False, fmt: str = "%.6g") -> None:
    """Write ``X`` (CSR or dense) and ``y`` as LIBSVM text, streaming row by row."""
    import scipy.sparse as sp

    X = sp.csr_matrix(X)
    base = 0 if zero_based else 1
    with open(path, "w") as fh:
        for i in range(X.shape[0]):
            a, b = X.indptr[i], X.indptr[i + 1]
            toks = " ".join(f"{j + base}:{fmt % v}" for j, v in zip(X.indices[a:b], X.data[a:b]))
            fh.write(f"{y[i]:g} {toks}\n" if toks else f"{y[i]:g}\n")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m ooc_learn.datasets",
                                description="Write a generated binary classification set as LIBSVM text.")
    p.add_argument("output")
    p.add_argument("--rows", type=int, default=20000)
    p.add_argument("--features", type=int, default=50)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--test", metavar="TEST_OUTPUT", default=None,
                   help="also write a test set drawn from the same model")
    p.add_argument("--test-rows", type=int, default=5000)
    args = p.parse_args(argv)
    n_test = args.test_rows if args.test else 0
    X, y, _ = make_linear_classification(args.rows + n_test, args.features, seed=args.seed)
    write_svmlight(args.output, X[: args.rows], y[: args.rows])
    print(f"wrote {args.output}: {args.rows} rows x {args.features} features", file=sys.stderr)
    if args.test:
        write_svmlight(args.test, X[args.rows:], y[args.rows:])
        print(f"wrote {args.test}: {n_test} rows", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
