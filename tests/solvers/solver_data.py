"""Shared data for the solver tests: bundled scikit-learn data and generated problems.

Imported by name (`from solver_data import ...`): the test folders are not packages.
"""
import numpy as np
import scipy.sparse as sp


def breast_cancer():
    from sklearn.datasets import load_breast_cancer
    from sklearn.preprocessing import StandardScaler

    X, y = load_breast_cancer(return_X_y=True)
    X = StandardScaler().fit_transform(X).astype(np.float32)
    return X, np.where(y == 1, 1.0, -1.0)


def gaussian(n=1500, d=15, noise=0.5, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d)).astype(np.float32)
    X[:3] = 0.0          # degenerate rows: all-zero ...
    X[3] = X[4]          # ... and a duplicate
    w = rng.normal(size=d)
    y = np.where(X @ w + 0.3 + noise * rng.normal(size=n) > 0, 1.0, -1.0)
    return X, y


def sparse_text_like(n=1500, d=400, density=0.02, seed=1):
    rng = np.random.default_rng(seed)
    X = sp.random(n, d, density=density, format="csr", random_state=seed, dtype=np.float32)
    w = rng.normal(size=d)
    y = np.where(X @ w + 0.1 * rng.normal(size=n) > 0, 1.0, -1.0)
    return X, y


DATASETS = {"breast_cancer": breast_cancer, "gaussian": gaussian, "sparse": sparse_text_like}


def as_layout(X, layout):
    if layout == "csr":
        return sp.csr_matrix(X)
    return X.toarray().astype(np.float32) if sp.issparse(X) else X
