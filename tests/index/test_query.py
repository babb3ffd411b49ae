"""The IBCD query (eq. 10): exactness against a full scan, ordering, shrinking, the cache."""

import numpy as np
import pytest
import scipy.sparse as sp
from _forest_helpers import blobs, brute_force, make_indexed

from ooc_learn.losses import outlier_margin
from ooc_learn.storage.budget import MemoryBudget
from ooc_learn.storage.errors import ClosedError, ParameterError


def _check_valid(store, rows, w, w_outer=None, s=1.0, loss="hinge", exclude=None):
    """Every returned row qualifies, none repeated, none excluded."""
    assert rows.dtype == np.int64
    assert len(np.unique(rows)) == len(rows)
    ref = brute_force(store, w, w_outer, s, loss, exclude)
    assert np.isin(rows, ref).all()
    if exclude is not None:
        assert not np.isin(rows, exclude).any()
    return ref


def test_hand_checkable_margins(tmp_path):
    # w = (1, 0): margins y·x₀ are 0.5, 2, -0.5, -3, 0 and, with y = -1, -(0.2)
    X = np.array([[0.5, 1], [2, 0], [-0.5, 0], [-3, 0], [0, 5], [0.2, 1]], np.float32)
    y = np.array([1, 1, 1, 1, -1, -1], np.float32)
    store, _ = make_indexed(X, y, tmp_path, n_blocks=2, width=2, leaf_size=1)
    with store.forest() as f:
        rows, n_e = f.query([1.0, 0.0], n=None, s=1.0)
        assert sorted(store.row_ids[rows].tolist()) == [0, 2, 4, 5]   # -3 is an outlier
        assert n_e == 6
        rows, _ = f.query([1.0, 0.0], n=None, s=None)                 # no truncation
        assert sorted(store.row_ids[rows].tolist()) == [0, 2, 3, 4, 5]
        rows, _ = f.query([1.0, 0.0], n=None, s=0.4)                  # -0.5 < -0.4
        assert sorted(store.row_ids[rows].tolist()) == [0, 4, 5]
        # bias: w = (1, 0), b = 1 shifts margins by +y: 1.5, 3, 0.5, -2, -1, -1.2
        rows, _ = f.query([1.0, 0.0, 1.0], n=None, s=1.0)
        assert sorted(store.row_ids[rows].tolist()) == [2, 4]
        # the outer iterate decides outliers: with w_t = (-1, 0), y·w_tᵀx is -0.5, -2, 0.5,
        # 3, 0, 0.2, so at s = 0.1 row 0 is an outlier and row 3 (-3 at w) is not
        rows, _ = f.query([1.0, 0.0], w_outer=[-1.0, 0.0], n=None, s=0.1)
        assert sorted(store.row_ids[rows].tolist()) == [2, 3, 4, 5]


@pytest.mark.parametrize("csr", [False, True])
@pytest.mark.parametrize("width", [2, 3, 10])
def test_unlimited_traversal_equals_brute_force(tmp_path, data_rng, csr, width):
    X, y = blobs(data_rng, n=900, d=8, csr=csr)
    store, _ = make_indexed(X, y, tmp_path, n_blocks=3, width=width, leaf_size=12)
    w = data_rng.normal(size=8)
    with store.forest() as f:
        for kw in (dict(), dict(s=0.3), dict(s=None), dict(s=2.0, loss="sqhinge"),
                   dict(w_outer=w + data_rng.normal(scale=0.5, size=8))):
            rows, n_e = f.query(w, n=None, **kw)
            ref = _check_valid(store, rows, w, kw.get("w_outer"), kw.get("s", 1.0),
                               kw.get("loss", "hinge"))
            assert np.array_equal(np.sort(rows), ref) and n_e == 900
        wb = np.append(w, 0.7)  # with the bias feature
        rows, _ = f.query(wb, n=None)
        assert np.array_equal(np.sort(rows), brute_force(store, wb))



def test_a_query_of_some_trees_searches_their_blocks_only(tmp_path, data_rng):
    """``trees``: a shard's blocks of a store. Unlimited, it returns exactly the qualifying
    rows of those blocks, examining no other; a limited one returns valid rows of them."""
    X, y = blobs(data_rng, n=900, d=8)
    store, _ = make_indexed(X, y, tmp_path, n_blocks=3, width=3, leaf_size=12)
    w = data_rng.normal(size=8)
    off = np.asarray(store.block_offsets)
    mine = np.concatenate([np.arange(off[0], off[1]), np.arange(off[2], off[3])])
    with store.forest() as f:
        rows, n_e = f.query(w, n=None, trees=[0, 2])
        ref = brute_force(store, w)
        assert np.array_equal(np.sort(rows), ref[np.isin(ref, mine)]) and n_e == mine.size
        rows, _ = f.query(w, n=5, trees=[2])
        assert len(rows) == 5 and np.all((rows >= off[2]) & (rows < off[3]))
        with pytest.raises(ParameterError, match="trees"):
            f.query(w, n=5, trees=[3])

@pytest.mark.parametrize("csr", [False, True])
def test_limited_queries_return_valid_fresh_rows(tmp_path, data_rng, csr):
    X, y = blobs(data_rng, n=1200, d=10, csr=csr)
    store, _ = make_indexed(X, y, tmp_path, n_blocks=4, width=5, leaf_size=20)
    w = data_rng.normal(size=10)
    excl = data_rng.choice(1200, size=300, replace=False)
    with store.forest() as f:
        for n in (1, 7, 50, 400):
            rows, n_e = f.query(w, n=n, exclude=excl, seed=n)
            ref = _check_valid(store, rows, w, exclude=excl)
            assert len(rows) == min(n, len(ref)) and len(rows) <= n_e <= 900
        mask = np.zeros(1200, bool)
        mask[excl] = True
        assert np.array_equal(f.query(w, n=60, exclude=mask)[0],
                              f.query(w, n=60, exclude=excl)[0])
        rows, n_e = f.query(w, n=None, max_examined=77)
        assert n_e == 77
        _check_valid(store, rows, w)


def test_min_precision_stops_a_sparse_query_early(tmp_path, data_rng):
    X, y = blobs(data_rng, n=3000, d=6)
    store, _ = make_indexed(X, y, tmp_path, n_blocks=2, width=5, leaf_size=10)
    # a steep w: qualifying rows (0 <= y w^T x < 1 at s = 0) lie in a thin band
    w = 50 * np.linalg.lstsq(X, y, rcond=None)[0]
    ref = brute_force(store, w, s=0.0)
    assert 0 < len(ref) < 300
    with store.forest() as f:
        full, n_full = f.query(w, n=100, s=0.0)
        assert not f.last_query["low_precision"]
        rows, n_e = f.query(w, n=100, s=0.0, min_precision=0.9)
        assert f.last_query["low_precision"]
        _check_valid(store, rows, w, s=0.0)
        # it stopped as soon as 2n rows were examined with fewer than 90 % qualifying
        assert 200 <= n_e < 200 + 2 * 10 + 5 and len(rows) < 0.9 * n_e
        assert n_e < n_full
        # the first rows are the ones the unrestricted best-first search returns first
        assert np.array_equal(rows, full[:len(rows)])


def test_max_read_stops_a_query_that_reads_more_than_it_examines(tmp_path, data_rng):
    X, y = blobs(data_rng, n=3000, d=6)
    store, _ = make_indexed(X, y, tmp_path, n_blocks=2, width=5, leaf_size=10)
    w = data_rng.normal(size=6)
    with store.forest(cache_bytes=0) as f:  # no cache: every slice is read again
        full, _ = f.query(w, n=None)
        read_full = f.last_query["rows_read"]
        assert not f.last_query["read_limited"] and read_full > 400
        rows, n_e = f.query(w, n=None, max_read=400)
        lq = f.last_query
        assert lq["read_limited"]
        # it stops before the next read once 400 rows were read; one read is a node's 5
        # pivot rows, a leaf of 10 rows or a node read whole, at most a quarter of max_read
        # (100 rows: 128 KB of these rows would be a whole 1500-row block)
        assert 400 <= lq["rows_read"] < 400 + 100
        assert lq["rows_read"] < read_full and len(rows) < len(full)
        _check_valid(store, rows, w)
        # the first rows are the ones the unrestricted best-first search returns first
        assert np.array_equal(rows, full[:len(rows)])


def test_best_bin_first_finds_rows_nearer_the_hyperplane(tmp_path, data_rng):
    X, y = blobs(data_rng, n=4000, d=6)
    store, _ = make_indexed(X, y, tmp_path, n_blocks=2, width=10, leaf_size=25)
    w = np.linalg.lstsq(X, y, rcond=None)[0]
    Xn = X / np.maximum(np.linalg.norm(X, axis=1, keepdims=True), 1e-12)
    cos = np.abs(store.X @ w / np.linalg.norm(w)) / np.maximum(
        np.linalg.norm(store.X, axis=1), 1e-12)
    with store.forest() as f:
        rows, n_e = f.query(w, n=200, s=None)
    base = len(brute_force(store, w, s=None)) / 4000
    assert len(rows) / n_e > base + 0.1, (len(rows) / n_e, base)
    # the rows it found lie nearer the hyperplane (in angle) than the data on average
    assert np.median(cos[rows]) < 0.5 * np.median(np.abs(Xn @ w / np.linalg.norm(w)))


def test_reopen_gives_identical_answers(tmp_path, data_rng):
    X, y = blobs(data_rng, n=700, d=5, csr=True)
    store, _ = make_indexed(X, y, tmp_path, n_blocks=2, width=4, leaf_size=10)
    w = data_rng.normal(size=5)
    with store.forest() as f:
        first = [f.query(w, n=n, seed=sd) for n in (10, 100) for sd in (0, 1)]
    with store.forest() as f:
        again = [f.query(w, n=n, seed=sd) for n in (10, 100) for sd in (0, 1)]
    for (r1, e1), (r2, e2) in zip(first, again):
        assert np.array_equal(r1, r2) and e1 == e2


def test_shrinking_skips_far_rows_and_unshrink_restores(tmp_path, data_rng):
    X, y = blobs(data_rng, n=1500, d=6)
    store, _ = make_indexed(X, y, tmp_path, n_blocks=3, width=4, leaf_size=15)
    w = 2.0 * data_rng.normal(size=6)
    ref = brute_force(store, w, s=0.5)
    with store.forest() as f:
        assert f.shrink(threshold=0.5) == 0
        rows, n_e = f.query(w, n=None, s=0.5)
        assert np.array_equal(np.sort(rows), ref) and n_e == 1500
        # rows with y·wᵀx > 1 + T or outliers (< −s) were shrunk: not examined again
        m = store.y * (store.X @ w)
        n_far = f.n_shrunk
        assert n_far == np.count_nonzero((m > 1.5) | (m < -0.5)) > 0
        rows2, n_e2 = f.query(w, n=None, s=0.5)
        assert np.array_equal(np.sort(rows2), ref) and n_e2 == 1500 - n_far
        # a node whose rows are all shrunk is skipped without a read
        f.shrink(threshold=0.5, rows=np.arange(1500))
        store.reads = 0
        f.cache.clear()
        rows3, n_e3 = f.query(w, n=None, s=0.5)
        assert len(rows3) == 0 and n_e3 == 0 and store.reads == 0
        assert f.last_query["nodes_skipped"] == 3
        assert f.unshrink() == 1500 and f.n_shrunk == 0
        rows4, n_e4 = f.query(w, n=None, s=0.5)
        assert np.array_equal(np.sort(rows4), ref) and n_e4 == 1500


def test_cache_reserves_from_the_budget_and_releases(tmp_path, data_rng):
    X, y = blobs(data_rng, n=800, d=6)
    budget = MemoryBudget("8M")
    store, _ = make_indexed(X, y, tmp_path, n_blocks=2, width=4, leaf_size=10, budget=budget)
    w = data_rng.normal(size=6)
    f = store.forest()
    rows, _ = f.query(w, n=None)
    cached = f.cache.nbytes + f.node_cache.nbytes  # leaf/pivot rows, and node records apart
    assert budget.used == cached + f.map_window_bytes
    assert f.cache.nbytes > 0 and f.node_cache.nbytes > 0
    misses = f.cache.misses, f.node_cache.misses
    assert np.array_equal(f.query(w, n=None)[0], rows)
    assert (f.cache.misses, f.node_cache.misses) == misses
    f.shrink()
    assert budget.used == cached + f.map_window_bytes + 5 * 800
    f.close()
    assert budget.used == 0
    f.close()  # closing twice is fine
    with pytest.raises(ClosedError, match="index of store .* is closed"):
        f.query(w)
    # a cache too small for anything still answers correctly, reading every leaf each time
    with store.forest(cache_bytes=1) as tiny:
        assert np.array_equal(tiny.query(w, n=None)[0], rows)
        assert len(tiny.cache) == 0 and len(tiny.node_cache) == 0


def test_node_records_outlast_rows_under_pressure(tmp_path, data_rng):
    # the node-record cache registers with the budget after the row cache, so a reservation
    # that needs room takes leaf and pivot rows first (every query walks the upper nodes)
    X, y = blobs(data_rng, n=800, d=6)
    budget = MemoryBudget("8M")
    store, _ = make_indexed(X, y, tmp_path, n_blocks=2, width=4, leaf_size=10, budget=budget)
    with store.forest() as f:
        f.query(data_rng.normal(size=6), n=None)
        rows_b, nodes_b = f.cache.nbytes, f.node_cache.nbytes
        assert rows_b > 0 and nodes_b > 0
        budget.reserve(budget.available + rows_b // 2, "pressure")
        assert f.cache.nbytes <= rows_b // 2 + 1 and f.node_cache.nbytes == nodes_b
        budget.release(budget.used - f.cache.nbytes - nodes_b - f.map_window_bytes)


def test_outlier_margin():
    assert outlier_margin("hinge", 0.5) == -0.5
    assert outlier_margin("sqhinge", 0.44) == pytest.approx(1 - 1.2)   # (1 − z)² = 1.44
    assert outlier_margin("hinge", None) == -np.inf


@pytest.mark.parametrize("kw, match", [
    (dict(w=np.ones(3)), "'w' parameter of query must be a finite vector of 6 weights "
                         r"\(or 7 with the bias last\). Got 3"),
    (dict(w=np.full(6, np.nan)), "'w' parameter of query must be a finite vector"),
    (dict(w_outer=np.ones(7)), "'w_outer' parameter of query must have as many entries"),
    (dict(n=0), "'n' parameter of query must be an int >= 1 or None. Got 0"),
    (dict(s=-1.0), "'s' parameter of query must be >= 0 or None. Got -1.0"),
    (dict(loss="log"), "'loss' parameter of query must be 'hinge' or 'sqhinge'"),
    (dict(exclude=[5000]), r"'exclude' parameter of query must hold row positions in \[0, "),
    (dict(exclude=np.zeros(3, bool)), "'exclude' parameter of query must be a boolean mask"),
    (dict(max_examined=-1), "'max_examined' parameter of query must be >= 0"),
    (dict(min_precision=1.0), r"'min_precision' parameter of query must be in \[0, 1\)"),
    (dict(max_read=-1), "'max_read' parameter of query must be >= 0"),
])
def test_bad_query_parameters(tmp_path, data_rng, kw, match):
    X, y = blobs(data_rng, n=200, d=6)
    store, _ = make_indexed(X, y, tmp_path, n_blocks=1)
    kw.setdefault("w", np.ones(6))
    with store.forest() as f:
        with pytest.raises(ParameterError, match=match):
            f.query(kw.pop("w"), **kw)


def test_bad_shrink_parameters(tmp_path, data_rng):
    X, y = blobs(data_rng, n=200, d=6, csr=True)
    store, _ = make_indexed(X, y, tmp_path, n_blocks=1)
    with store.forest() as f:
        with pytest.raises(ParameterError, match="'threshold' parameter of shrink must be"):
            f.shrink(threshold=-1)
        with pytest.raises(ParameterError, match="'rows' parameter of shrink must hold row"):
            f.shrink(rows=[-1])
    assert sp.issparse(store.X)


@pytest.mark.parametrize("field,bad", [("span_bytes", -1), ("span_read_share", 0.0),
                                       ("rank_mu", 1.5), ("rank_lam", float("nan")),
                                       ("pivot_candidates", "all")])
def test_search_config_refuses_bad_values_naming_them(field, bad):
    from ooc_learn.index.search_config import SearchConfig

    with pytest.raises(ParameterError, match=f"'{field}' parameter of SearchConfig"):
        SearchConfig(**{field: bad})
