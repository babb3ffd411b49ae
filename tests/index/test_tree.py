"""The in-memory build: metric, K-way Voronoi splits, leaf order, determinism, bad input."""

import numpy as np
import pytest
import scipy.sparse as sp
from _forest_helpers import blobs

from ooc_learn.index._row_kernels import cos2_rows
from ooc_learn.index.tree import build_block_tree
from ooc_learn.storage.arrays import kernel_args
from ooc_learn.storage.errors import ParameterError


def _dense(X):
    return X.toarray() if sp.issparse(X) else np.asarray(X)


def _cos2_matrix(A, B):
    """(âᵀb̂)² for every pair, float64, 0 for zero rows: the slow reference."""
    A, B = _dense(A).astype(np.float64), _dense(B).astype(np.float64)
    na, nb = np.linalg.norm(A, axis=1), np.linalg.norm(B, axis=1)
    G = A @ B.T
    den = np.outer(na, nb) ** 2
    return np.where(den > 0, G * G / np.where(den > 0, den, 1), 0.0)


@pytest.mark.parametrize("csr", [False, True])
def test_cos2_is_the_degree2_embedding_inner_product(csr):
    # rows: e1, (1,1), (-2,1)/.., -e1*3, zero.  V(â)ᵀV(b̂) = (âᵀb̂)²: sign and scale free
    X = np.array([[1, 0], [1, 1], [-2, 1], [-3, 0], [0, 0]], np.float32)
    sq = (X.astype(np.float64) ** 2).sum(1).astype(np.float32)
    arrays = kernel_args(sp.csr_matrix(X) if csr else X)
    c = lambda a, b: cos2_rows(*arrays, sq, a, b)  # noqa: E731
    assert c(0, 1) == pytest.approx(0.5, abs=1e-7)
    assert c(0, 3) == pytest.approx(1.0, abs=1e-7)       # x and -3x: the same point
    assert c(1, 2) == pytest.approx(0.1, abs=1e-7)       # (-2+1)² / (2·5)
    assert c(0, 4) == 0.0 and c(4, 4) == 0.0             # zero row: angle π/2 to all
    emb = lambda x: np.outer(x, x).ravel()  # noqa: E731  V(x) up to the √2 scaling
    a, b = X[1] / np.linalg.norm(X[1]), X[2] / np.linalg.norm(X[2])
    assert c(1, 2) == pytest.approx(emb(a) @ emb(b), abs=1e-6)


def test_hand_checkable_two_axes():
    # two groups on the axes (cos² 1 inside a group, 0 across): any split that separates
    # them is the Voronoi one; leaves of at most 2 rows
    X = np.array([[1, 0], [0, 1], [2, 0], [0, -3]], np.float32)
    for seed in range(5):
        perm, tree = build_block_tree(X, width=2, leaf_size=2, seed=seed)
        assert sorted(perm.tolist()) == [0, 1, 2, 3]
        leaves = [set(perm[tree.start[v]:tree.stop[v]].tolist())
                  for v in range(tree.n_nodes) if tree.n_children[v] == 0]
        assert sorted(map(sorted, leaves)) == [[0, 2], [1, 3]]


def _check_tree(X, perm, tree, width, leaf_size):
    n = X.shape[0]
    Xp = _dense(X)[perm]
    assert np.array_equal(np.sort(perm), np.arange(n))
    assert tree.start[0] == 0 and tree.stop[0] == n
    for v in range(tree.n_nodes):
        k = tree.n_children[v]
        if k == 0:
            assert tree.stop[v] - tree.start[v] <= leaf_size
            continue
        assert 2 <= k <= width
        kids = np.arange(tree.first_child[v], tree.first_child[v] + k)
        # children tile the parent's range in order: every node is one contiguous run
        assert tree.start[kids[0]] == tree.start[v] and tree.stop[kids[-1]] == tree.stop[v]
        assert np.array_equal(tree.start[kids[1:]], tree.stop[kids[:-1]])
        piv = Xp[tree.pivot_row[kids]]
        # the pivot vectors stored in the tree are those rows
        pv = sp.csr_matrix((tree.pv_data, tree.pv_indices, tree.pv_indptr),
                           shape=(tree.n_nodes, X.shape[1])).toarray()
        assert np.array_equal(pv[kids], piv)
        # Voronoi: each row is (to rounding) nearest to its own cell's pivot
        for j, c in enumerate(kids):
            rows = Xp[tree.start[c]:tree.stop[c]]
            C = _cos2_matrix(rows, piv)
            assert np.all(C[:, j] >= C.max(axis=1) - 1e-5)


@pytest.mark.parametrize("csr", [False, True])
@pytest.mark.parametrize("width", [2, 3, 10])
def test_kway_voronoi_split_and_leaf_order(data_rng, csr, width):
    X, _ = blobs(data_rng, n=700, d=9, csr=csr)
    perm, tree = build_block_tree(X, width=width, leaf_size=20, seed=3)
    _check_tree(X, perm, tree, width, 20)


def test_depth_is_about_log_k(data_rng):
    X = data_rng.normal(size=(20000, 12)).astype(np.float32)
    perm, tree = build_block_tree(X, width=10, leaf_size=100, seed=0)
    # log_10(20000/100) ≈ 2.3 levels if splits were even; nearest-pivot cells are not
    assert 3 <= tree.max_depth <= 6
    sizes = tree.stop[tree.n_children == 0] - tree.start[tree.n_children == 0]
    assert sizes.max() <= 100 and sizes.sum() == 20000


def test_all_duplicate_and_zero_rows_still_split():
    X = np.zeros((90, 4), np.float32)
    X[40:] = [1, 2, 3, 4]
    perm, tree = build_block_tree(X, width=3, leaf_size=7, seed=1)
    sizes = tree.stop[tree.n_children == 0] - tree.start[tree.n_children == 0]
    assert sizes.max() <= 7 and sizes.sum() == 90


def test_sparse_and_dense_give_the_same_tree_without_near_ties(data_rng):
    # dense dots sum in float32, CSR dots in float64: only near-ties could split differently
    X = data_rng.normal(size=(500, 7)).astype(np.float32)
    p1, t1 = build_block_tree(X, width=4, leaf_size=15, seed=9)
    p2, t2 = build_block_tree(sp.csr_matrix(X), width=4, leaf_size=15, seed=9)
    assert np.array_equal(p1, p2)
    assert np.array_equal(t1.start, t2.start) and np.array_equal(t1.pivot_row, t2.pivot_row)


def test_build_is_deterministic_for_a_seed(data_rng):
    X, _ = blobs(data_rng, n=800, d=6, csr=True)
    p1, t1 = build_block_tree(X, width=5, leaf_size=10, seed=42)
    p2, t2 = build_block_tree(X, width=5, leaf_size=10, seed=42)
    p3, _ = build_block_tree(X, width=5, leaf_size=10, seed=43)
    assert np.array_equal(p1, p2)
    assert all(np.array_equal(a, b) for a, b in zip(t1, t2))
    assert not np.array_equal(p1, p3)


def test_tiny_blocks():
    perm, tree = build_block_tree(np.zeros((0, 3), np.float32), width=4, leaf_size=5)
    assert perm.shape == (0,) and tree.n_nodes == 1 and tree.n_children[0] == 0
    perm, tree = build_block_tree(np.ones((3, 3), np.float32), width=4, leaf_size=5)
    assert perm.tolist() == [0, 1, 2] and tree.n_nodes == 1


@pytest.mark.parametrize("kw, match", [
    (dict(width=1), "'width' parameter of build_block_tree must be an int >= 2. Got 1"),
    (dict(width=2.5), "'width' parameter"),
    (dict(leaf_size=0), "'leaf_size' parameter of build_block_tree must be an int >= 1"),
    (dict(seed=-1), "'seed' parameter of build_block_tree must be an int >= 0"),
])
def test_bad_parameters(kw, match):
    with pytest.raises(ParameterError, match=match):
        build_block_tree(np.ones((10, 2), np.float32), **kw)


def test_bad_shapes():
    with pytest.raises(ParameterError, match="'X' parameter of build_block_tree must be 2-D"):
        build_block_tree(np.ones(10, np.float32))
    with pytest.raises(ParameterError, match="'sqnorm' parameter .* one entry per row"):
        build_block_tree(np.ones((10, 2), np.float32), np.ones(9, np.float32))


@pytest.mark.parametrize("csr", [False, True])
def test_covering_radii_are_the_smallest_cos2_to_the_pivot(data_rng, csr):
    X, _ = blobs(data_rng, n=600, d=5, csr=csr)
    X = sp.vstack([X, sp.csr_matrix((2, 5))]).tocsr() if csr else \
        np.vstack([X, np.zeros((2, 5), np.float32)])  # zero rows: cos² 0 to everything
    perm, tree = build_block_tree(X, width=4, leaf_size=6, seed=3)
    Xp = _dense(X)[perm].astype(np.float64)
    Xa = np.hstack([Xp, np.ones((Xp.shape[0], 1))])
    assert tree.radius[0] == 1 and tree.radius_aug[0] == 1
    for c in range(1, tree.n_nodes):
        rows = slice(tree.start[c], tree.stop[c])
        p = tree.pivot_row[c]
        want = _cos2_matrix(Xp[rows], Xp[p:p + 1]).min()
        want_aug = _cos2_matrix(Xa[rows], Xa[p:p + 1]).min()
        assert tree.radius[c] == pytest.approx(want, abs=1e-5)
        assert tree.radius_aug[c] == pytest.approx(want_aug, abs=1e-5)


@pytest.mark.parametrize("mu,lam", [(1.0, 0.0), (0.0, 0.0), (0.3, 0.5)])
def test_every_partition_ranking_is_exact_without_a_limit(tmp_path, data_rng, mu, lam):
    from _forest_helpers import brute_force, make_indexed

    from ooc_learn.index.search_config import SearchConfig

    X, y = blobs(data_rng, n=800, d=6)
    store, _ = make_indexed(X, y, tmp_path, n_blocks=2, width=3, leaf_size=5)
    f = store.forest(search=SearchConfig(rank_mu=mu, rank_lam=lam))
    w = data_rng.standard_normal(7)
    rows, n_e = f.query(w, n=None, s=1.0)
    assert sorted(rows.tolist()) == brute_force(store, w).tolist()
    assert n_e == X.shape[0]
    f.close()
