"""A store written by format version 1, committed: this version must keep reading it."""

from pathlib import Path

import numpy as np

from ooc_learn.storage.store import open_store

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "format_v1.store"

SOURCE_X = np.array([[0, 1.5, 0, 0], [2, 0, 0, -1], [0, 0, 0, 0], [0.25, 0, 3, 0],
                     [0, 0, 0, 7], [1, 1, 1, 1]], dtype=np.float32)
SOURCE_Y = np.array([2, 4, 4, 2, 4, 2])


def test_committed_v1_store_reads_back_exactly():
    with open_store(FIXTURE) as store:
        assert (store.n_samples, store.n_features, store.n_blocks) == (6, 4, 2)
        assert store.layout == "csr" and store.task == "binary"
        assert store.label_map == {"positive": 4.0, "negative": 2.0}
        assert store.block_offsets.tolist() == [0, 3, 6]
        X, y, ids = store.read_range(0, 6)
        assert sorted(ids.tolist()) == list(range(6))
        np.testing.assert_array_equal(X.toarray(), SOURCE_X[ids])
        np.testing.assert_array_equal(y, np.where(SOURCE_Y[ids] == 4, 1, -1))
        np.testing.assert_allclose(store.sqnorms(), (SOURCE_X[ids] ** 2).sum(1), rtol=1e-6)
        assert store.metadata["params"]["seed"] == 7
