"""Slow, obviously-correct references for the TreeCV tests."""

import numpy as np
import scipy.sparse as sp


def brute_force_scores(X, y, bounds, ridge):
    """Closed-form ridge on all rows outside each fold; mean squared error on the fold."""
    X = (X.toarray() if sp.issparse(X) else X).astype(np.float64)
    out = []
    for i in range(len(bounds) - 1):
        test = np.zeros(len(y), bool)
        test[bounds[i]:bounds[i + 1]] = True
        A, b = X[~test], y[~test]
        w = np.linalg.solve(A.T @ A + ridge * np.eye(X.shape[1]), A.T @ b)
        out.append(np.mean((X[test] @ w - y[test]) ** 2))
    return np.array(out)


def tree_updates(sizes):
    """Rows fed by Algorithm 1: each internal node (s, e) feeds chunks s..e once."""
    def rec(s, e):
        if s == e:
            return 0
        m = (s + e) // 2
        return sum(sizes[s:e + 1]) + rec(s, m) + rec(m + 1, e)
    return rec(0, len(sizes) - 1)
