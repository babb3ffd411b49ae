import numpy as np
import pytest
from sklearn.datasets import load_breast_cancer


@pytest.fixture(scope="session")
def cancer():
    """Standardised breast-cancer data (569 x 30), labels 0/1."""
    X, y = load_breast_cancer(return_X_y=True)
    X = ((X - X.mean(0)) / X.std(0)).astype(np.float32)
    return X, y


@pytest.fixture(scope="session")
def cancer_small(cancer):
    X, y = cancer
    idx = np.random.default_rng(0).choice(len(y), 120, replace=False)
    return X[idx], y[idx]


def blobs(n, d, seed, flip=0.1):
    """Two overlapping Gaussian classes with a few flipped labels and a duplicate row."""
    rng = np.random.default_rng(seed)
    y = np.where(rng.random(n) < 0.5, 1, -1)
    X = rng.normal(size=(n, d)) + 0.8 * y[:, None]
    y = np.where(rng.random(n) < flip, -y, y)
    X[1] = X[0]
    y[1] = y[0]
    return X.astype(np.float32), y


@pytest.fixture(scope="session")
def make_blobs():
    return blobs
