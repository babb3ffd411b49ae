"""Hold-out, k-fold and LOO predictions against brute-force refits (rtol 1e-6)."""

import numpy as np
import pytest

from ooc_learn.rls import SparseRLS, cawley_talbot_loo
from ooc_learn.rls.holdout import holdout_path
from ooc_learn.storage.errors import ParameterError

from _rls_reference import brute_predict, make_data, shifted_kernel

RTOL = 1e-6
M, NB, LAM = 240, 30, 0.3


def reference(model, X, Y, H, mode, lam):
    """Brute force for the three treatments of held-out basis rows (paper Section 6.4)."""
    m = X.shape[0]
    B = model.basis_
    Hbar = np.setdiff1d(np.arange(m), H)
    if mode == "remove":            # E leaves basis and training
        return brute_predict(model, X, Y, Hbar, np.setdiff1d(B, H), lam, H)
    if mode == "keep_no_loss":      # E stays in the basis, all of H leaves training
        return brute_predict(model, X, Y, Hbar, B, lam, H)
    # keep: E stays in the basis and in training
    return brute_predict(model, X, Y, np.union1d(Hbar, np.intersect1d(H, B)), B, lam, H)


def assert_close(actual, desired):
    scale = np.abs(desired).max()
    np.testing.assert_allclose(actual, desired, rtol=RTOL, atol=RTOL * 1e-2 * scale)


@pytest.fixture(params=[False, True], ids=["dense", "csr"])
def fitted(request, rng):
    Xin, X, Y = make_data(rng, m=M, v=2, sparse=request.param)
    model = SparseRLS(n_basis=NB, lam=LAM, gamma=0.4, seed=1).fit(Xin, Y)
    return model, X, Y, rng


@pytest.mark.parametrize("mode", ["remove", "keep", "keep_no_loss"])
@pytest.mark.parametrize("h", [12, 90], ids=["H<n", "H>n"])
@pytest.mark.parametrize("with_e", [False, True], ids=["E empty", "E nonempty"])
def test_holdout_equals_refit(fitted, mode, h, with_e):
    model, X, Y, rng = fitted
    B = model.basis_
    nonbasis = np.setdiff1d(np.arange(M), B)
    H = rng.choice(nonbasis, size=h - (5 if with_e else 0), replace=False)
    if with_e:
        H = np.r_[H, rng.choice(B, size=5, replace=False)]
    rng.shuffle(H)                                   # predictions follow the order of H
    f = model.holdout_predict(H, basis_mode=mode)
    assert f.shape == (h, 2)
    assert_close(f, reference(model, X, Y, H, mode, LAM))
    # both SMW sides were used across the parametrisation
    used = next(iter(model.cv_stats_["strategies"]))
    assert used == ("small" if h < NB else "chol")


@pytest.mark.parametrize("strategy", ["small", "chol", "eig"])
@pytest.mark.parametrize("mode", ["remove", "keep_no_loss"])
def test_every_strategy_equals_refit(fitted, strategy, mode):
    model, X, Y, rng = fitted
    H = np.r_[rng.choice(np.setdiff1d(np.arange(M), model.basis_), 40, replace=False),
              model.basis_[:4]]
    lams = np.array([0.01, 1.0])
    QE = model.Q_[model.basis_hits(H)[1]] if mode == "remove" else None
    U = model.u_rows(H)[0]
    f, _, used = holdout_path(U, model._z0 - U.T @ Y[H], model.eigvals_, lams, QE=QE,
                              strategy=strategy)
    assert used == strategy
    for k, lam in enumerate(lams):
        assert_close(f[k], reference(model, X, Y, H, mode, lam))


def test_holdout_path_equals_independent_refits(fitted):
    model, X, Y, rng = fitted
    H = np.r_[np.arange(0, 50), model.basis_[:3]]
    H = np.unique(H)
    lams = np.logspace(-3, 2, 6)
    for mode in ["remove", "keep", "keep_no_loss"]:
        path = model.holdout_predict_path(H, lams, basis_mode=mode)
        assert path.shape == (6, H.size, 2)
        for k, lam in enumerate(lams):
            assert_close(path[k], reference(model, X, Y, H, mode, lam))


def test_keep_with_only_basis_rows_held_out(fitted):
    """Holding out only basis rows in 'keep' mode trains on everything: the full model."""
    model, X, Y, rng = fitted
    H = model.basis_[:3]
    full = brute_predict(model, X, Y, np.arange(M), model.basis_, LAM, H)
    assert_close(model.holdout_predict(H, "keep"), full)


@pytest.mark.parametrize("mode", ["remove", "keep", "keep_no_loss"])
def test_kfold_equals_refits(fitted, mode):
    model, X, Y, rng = fitted
    lams = [0.05, 2.0]
    path = model.kfold_predict_path(5, lams, basis_mode=mode)
    folds = [np.sort(f) for f in np.array_split(np.random.default_rng(1).permutation(M), 5)]
    for k, lam in enumerate(lams):
        for H in folds:
            assert_close(path[k, H], reference(model, X, Y, H, mode, lam))
    # folds as labels or as a list give the same predictions
    labels = np.empty(M, dtype=np.int64)
    for g, H in enumerate(folds):
        labels[H] = g
    np.testing.assert_allclose(model.kfold_predict(labels, mode), path[list(lams).index(0.05)]
                               if model.lam == 0.05 else model.kfold_predict(folds, mode))


def test_kfold_rows_outside_folds_are_nan(fitted):
    model, X, Y, rng = fitted
    labels = np.full(M, -1)
    labels[:60], labels[60:120] = 0, 1
    f = model.kfold_predict(labels)
    assert np.isnan(f[120:]).all() and np.isfinite(f[:120]).all()
    assert_close(f[:60], reference(model, X, Y, np.arange(60), "remove", LAM))


@pytest.mark.parametrize("mode", ["remove", "keep", "keep_no_loss", "skip"])
def test_loo_equals_refits(fitted, mode):
    model, X, Y, rng = fitted
    lams = [0.01, 0.3, 5.0]
    path = model.loo_predict_path(lams, basis_mode=mode)
    assert path.shape == (3, M, 2)
    B = model.basis_
    rows = np.r_[B[:4], np.setdiff1d(np.arange(M), B)[:6]]
    for k, lam in enumerate(lams):
        for i in rows:
            if mode == "skip":
                if i in B:
                    assert np.isnan(path[k, i]).all()
                    continue
                ref = reference(model, X, Y, np.array([i]), "remove", lam)
            else:
                ref = reference(model, X, Y, np.array([i]), mode, lam)
            assert_close(path[k, i], ref[0])


def test_loo_keep_no_loss_equals_cawley_talbot(fitted):
    model, X, Y, rng = fitted
    lams = np.logspace(-3, 2, 5)
    ours = model.loo_predict_path(lams, "keep_no_loss")
    ct = cawley_talbot_loo(X, Y, lams, basis=model.basis_, gamma=0.4)
    assert_close(ours, ct)


def test_streamed_fold_and_uncached_u_equal_in_memory(rng):
    """A memory cap too small for U or for a fold's U~ rows: U is recomputed chunk by chunk and
    folds use the streamed n-side; the predictions do not change."""
    Xin, X, Y = make_data(rng, m=M, v=2)
    big = SparseRLS(n_basis=NB, lam=LAM, gamma=0.4, seed=1).fit(Xin, Y)
    small = SparseRLS(n_basis=NB, lam=LAM, gamma=0.4, seed=1, memory="130K").fit(Xin, Y)
    assert small._ucache is None and big._ucache is not None
    lams = [0.1, 1.0]
    f_small = small.kfold_predict_path(2, lams, "remove")
    assert all(s.endswith("streamed") for s in small.cv_stats_["strategies"])
    assert_close(f_small, big.kfold_predict_path(2, lams, "remove"))
    assert_close(small.loo_predict_path(lams, "remove"), big.loo_predict_path(lams, "remove"))
    H = np.r_[np.arange(150), big.basis_[:2]]
    H = np.unique(H)
    for mode in ["remove", "keep", "keep_no_loss"]:
        assert_close(small.holdout_predict(H, mode), reference(big, X, Y, H, mode, LAM))


def test_vector_labels_give_vector_predictions(rng):
    Xin, X, Y = make_data(rng, m=120)
    model = SparseRLS(n_basis=15, gamma=0.4).fit(Xin, Y[:, 0])
    assert model.loo_predict().shape == (120,)
    assert model.loo_predict_path([0.1, 1.0]).shape == (2, 120)
    assert model.holdout_predict([1, 2, 3]).shape == (3,)
    assert model.kfold_predict(4).shape == (120,)


def test_multi_output_cv_equals_per_output(rng):
    Xin, X, Y = make_data(rng, m=150, v=3)
    model = SparseRLS(n_basis=20, gamma=0.4, seed=2).fit(Xin, Y)
    lams = [0.1, 3.0]
    loo = model.loo_predict_path(lams)
    kf = model.kfold_predict_path(3, lams)
    for j in range(3):
        one = SparseRLS(n_basis=20, gamma=0.4, seed=2).fit(Xin, Y[:, j])
        assert_close(loo[..., j], one.loo_predict_path(lams))
        assert_close(kf[..., j], one.kfold_predict_path(3, lams))


def test_select_lambda_matches_brute_force_curve(rng):
    Xin, X, Y = make_data(rng, m=120)
    model = SparseRLS(n_basis=25, gamma=0.4, seed=4).fit(Xin, Y[:, 0])
    lams = np.logspace(-4, 3, 6)
    sel = model.select_lambda(lams, cv="loo", metric="mse")
    B, m = model.basis_, 120
    K = shifted_kernel(model, X)
    curve = []
    for lam in lams:
        pred = [brute_predict(model, X, Y, np.setdiff1d(np.arange(m), [i]),
                              np.setdiff1d(B, [i]), lam, [i], K=K)[0, 0] for i in range(m)]
        curve.append(np.mean((np.array(pred) - Y[:, 0]) ** 2))
    np.testing.assert_allclose(sel.curve, curve, rtol=1e-6)
    assert sel.best_lambda == lams[int(np.argmin(curve))]
    assert sel.model is model and model.lam == sel.best_lambda
    best, curve5, _, _ = model.select_lambda(lams, cv=5, metric="mae")
    assert curve5.shape == (6,) and best in lams


def test_cv_bad_inputs(fitted):
    model, X, Y, rng = fitted
    with pytest.raises(ParameterError, match="covers all 240 training rows"):
        model.holdout_predict(np.arange(M))
    with pytest.raises(ParameterError, match="'basis_mode' parameter"):
        model.holdout_predict([1, 2], basis_mode="skip")
    with pytest.raises(ParameterError, match="'basis_mode' parameter"):
        model.loo_predict(basis_mode="drop")
    with pytest.raises(ParameterError, match="must not repeat a row"):
        model.holdout_predict([1, 1])
    with pytest.raises(ParameterError, match="row positions in"):
        model.holdout_predict([M])
    with pytest.raises(ParameterError, match="'lams' parameter.*> 0"):
        model.loo_predict_path([0.1, -1.0])
    with pytest.raises(ParameterError, match="'folds' parameter.*between 2"):
        model.kfold_predict(1)
    with pytest.raises(ParameterError, match="disjoint"):
        model.kfold_predict([np.arange(10), np.arange(5, 15)])
    with pytest.raises(ParameterError, match="'metric' parameter"):
        model.select_lambda([1.0], metric="r2")
    with pytest.raises(ParameterError, match="'cv' parameter"):
        model.select_lambda([1.0], cv="gcv")


@pytest.mark.parametrize("mode", ["remove", "keep", "keep_no_loss"])
@pytest.mark.parametrize("cache", [True, False], ids=["cached", "uncached"])
def test_fit_time_fold_grams_equal_refits(rng, mode, cache):
    """Folds given at construction: per-fold Grams accumulated in the training pass give the
    same k-fold predictions as the brute-force refits."""
    Xin, X, Y = make_data(rng, m=M, v=2)
    labels = np.random.default_rng(7).integers(0, 4, size=M)
    model = SparseRLS(n_basis=NB, lam=LAM, gamma=0.4, seed=1, folds=labels,
                      cache_u=cache).fit(Xin, Y)
    lams = [0.02, 1.0]
    path = model.kfold_predict_path(labels, lams, mode)
    assert set(model.cv_stats_["strategies"]) <= {"eig-gram", "chol-gram"}
    for k, lam in enumerate(lams):
        for g in range(4):
            H = np.flatnonzero(labels == g)
            assert_close(path[k, H], reference(model, X, Y, H, mode, lam))
    # other folds fall back to the general path
    model.kfold_predict(3, mode)
    assert not any(s.endswith("gram") for s in model.cv_stats_["strategies"])


@pytest.mark.parametrize("k, side", [(40, "small"), (3, "chol")], ids=["H<<n", "H>n"])
@pytest.mark.parametrize("state", ["rt-cached", "u-cached", "uncached"])
def test_single_lambda_kfold_removal_equals_refits(rng, k, side, state):
    """One lambda, basis removal (the paper's Section 6.4 setting): each fold takes the cheaper
    SMW side, O(min(|H|^2 n, |H| n^2)), whatever the model has cached (R^T rows after fit, U
    rows after a LOO, nothing), and equals refitting on the held-in rows with L = B \\ H.
    (Without cached U rows the |H| side also pays for U_H = R_H^T V, so it is taken for folds
    well below n.)"""
    Xin, X, Y = make_data(rng, m=M, v=2)
    model = SparseRLS(n_basis=NB, lam=LAM, gamma=0.4, seed=1,
                      cache_u=state != "uncached").fit(Xin, Y)
    if state == "u-cached":
        model.loo_predict_path([LAM, 2 * LAM])     # (a one-lambda LOO leaves R^T rows)
        assert model._ucache_is_u
    f = model.kfold_predict(k, "remove")
    used = set(model.cv_stats_["strategies"])
    assert {s.split("-")[0] for s in used} == {side}
    if state == "rt-cached":                 # no O(m n^2) rotation of the whole cache
        assert not model._ucache_is_u
    folds = [np.sort(g) for g in np.array_split(np.random.default_rng(1).permutation(M), k)]
    assert sum(np.intersect1d(H, model.basis_).size > 0 for H in folds) >= 2   # E not empty
    for H in folds:
        assert_close(f[H], reference(model, X, Y, H, "remove", LAM))


def test_u_cache_conversion_stopped_early_is_complete(rng):
    """The LOO turns cached R^T rows into U chunk by chunk; a consumer that stops early still
    leaves every row converted (U rows equal those formed from X)."""
    Xin, X, Y = make_data(rng, m=M, v=2)
    model = SparseRLS(n_basis=NB, lam=LAM, gamma=0.4, seed=1).fit(Xin, Y)
    model._u_step = lambda: 17
    chunks = model.iter_u_chunks()
    a, b, U = next(chunks)
    assert (a, b) == (0, 17)
    chunks.close()
    assert model._ucache_is_u
    rows = np.arange(M)
    np.testing.assert_allclose(model._ucache, model._u_from_x(X, rows), rtol=1e-9, atol=1e-12)
    starts = [a for a, _, _ in model.iter_u_chunks()]
    assert starts == list(range(0, M, 17))


@pytest.mark.parametrize("k, folds_at_fit, memory", [(5, True, None), (2, False, "2300K")],
                         ids=["fit-time folds", "streamed n side"])
def test_uncached_kfold_on_ill_conditioned_basis_equals_refits(rng, k, folds_at_fit, memory):
    """Without cached rows, fold predictions go through basis coordinates (K~_H C^-T W): still
    exact on a dense 1-d basis where K_BB is nearly singular (the sinusoid task of Section 6.3)."""
    m = 400
    x = rng.uniform(-20, 20, size=(m, 1))
    y = np.sin(x[:, 0]) + rng.normal(scale=2.0, size=m)
    kw = dict(n_basis=150, lam=0.5, gamma=0.5, seed=2)
    model = SparseRLS(folds=k if folds_at_fit else None, cache_u=False, memory=memory,
                      **kw).fit(x, y)
    assert np.linalg.cond(model.KBB_) > 1e6
    f = model.kfold_predict(k, "remove")
    tags = set(model.cv_stats_["strategies"])
    assert all(t.endswith("-gram" if folds_at_fit else "-r-streamed") for t in tags), tags
    cached = SparseRLS(**kw).fit(x, y).kfold_predict(k, "remove")
    folds = [np.sort(g) for g in np.array_split(np.random.default_rng(2).permutation(m), k)]
    for H in folds:
        assert_close(f[H], reference(model, x, y, H, "remove", 0.5)[:, 0])
        assert_close(cached[H], f[H])


@pytest.mark.parametrize("side, tag", [("small", "small-chol"), ("n", "chol-rs")])
@pytest.mark.parametrize("mode", ["remove", "keep", "keep_no_loss"])
@pytest.mark.parametrize("state", ["rt-cached", "uncached"])
def test_kfold_in_cholesky_coordinates_equals_refits(rng, monkeypatch, side, tag, mode, state):
    """k-fold with P^-1 factored by Cholesky factors in R coordinates, each side forced for
    every fold size: the |H| side (one Cholesky of A + lam I shared by all folds, X_H = L^-1
    R_H, J = X_H^T Pi X_H) and the n side (A - R_H R_H^T + lam I = U^T U, the constraint
    a_E = 0 by a range-space projection in U coordinates) equal refitting, for a lambda path,
    folds smaller and larger than n, and the three basis treatments."""
    from ooc_learn.rls import kfold_chol
    monkeypatch.setattr(kfold_chol, "FORCE_CHOL_SIDE", side)
    Xin, X, Y = make_data(rng, m=M, v=2)
    model = SparseRLS(n_basis=NB, lam=LAM, gamma=0.4, seed=1,
                      cache_u=state != "uncached").fit(Xin, Y)
    lams = [0.02, 1.0]
    for k in (12, 4):                        # |H| = 20 < n = 30, |H| = 60 > n
        path = model.kfold_predict_path(k, lams, mode)
        assert model.cv_stats_["strategies"] == {tag: k}
        assert model._ucache is None or not model._ucache_is_u
        folds = [np.sort(g) for g in np.array_split(np.random.default_rng(1).permutation(M), k)]
        assert sum(np.intersect1d(H, model.basis_).size > 0 for H in folds) >= 2
        for j, lam in enumerate(lams):
            for H in folds:
                assert_close(path[j, H], reference(model, X, Y, H, mode, lam))


@pytest.mark.parametrize("side, tag", [("small", "small-chol"), ("n", "chol-rs")])
def test_kfold_in_cholesky_coordinates_ill_conditioned_basis(rng, monkeypatch, side, tag):
    """Both Cholesky-coordinate sides with removal on a nearly singular K_BB (the sinusoid
    task of Section 6.3): (C^-1)_E columns are large, the result is still the refit's."""
    from ooc_learn.rls import kfold_chol
    m = 400
    x = rng.uniform(-20, 20, size=(m, 1))
    y = np.sin(x[:, 0]) + rng.normal(scale=2.0, size=m)
    model = SparseRLS(n_basis=150, lam=0.5, gamma=0.5, seed=2).fit(x, y)
    assert np.linalg.cond(model.KBB_) > 1e6
    general = model.kfold_predict(10, "remove")
    monkeypatch.setattr(kfold_chol, "FORCE_CHOL_SIDE", side)
    f = model.kfold_predict(10, "remove")
    assert model.cv_stats_["strategies"] == {tag: 10}
    folds = [np.sort(g) for g in np.array_split(np.random.default_rng(2).permutation(m), 10)]
    for H in folds:
        assert_close(f[H], reference(model, x, y, H, "remove", 0.5)[:, 0])
    assert_close(f, general)


@pytest.mark.parametrize("mode", ["remove", "keep", "keep_no_loss", "skip"])
@pytest.mark.parametrize("cache", [True, False], ids=["rt-cached", "uncached"])
def test_single_lambda_loo_by_cholesky_equals_refits(rng, mode, cache):
    """One lambda: the hat diagonal from a Cholesky of A + lam I (h_i = |L^-1 r_i|^2, one
    triangular solve over the rows) instead of the rotation U = R^T V; cached R^T rows are
    left as they are; equals refits and the eigen (lambda path) LOO."""
    Xin, X, Y = make_data(rng, m=M, v=2)
    model = SparseRLS(n_basis=NB, lam=LAM, gamma=0.4, seed=1, cache_u=cache).fit(Xin, Y)
    f = model.loo_predict(mode)
    assert model.cv_stats_["strategy"] == "chol"
    assert model._ucache is None or not model._ucache_is_u
    B = model.basis_
    rows = np.r_[B[:4], np.setdiff1d(np.arange(M), B)[:6]]
    for i in rows:
        if mode == "skip" and i in B:
            assert np.isnan(f[i]).all()
            continue
        ref = reference(model, X, Y, np.array([i]), "remove" if mode == "skip" else mode, LAM)
        assert_close(f[i], ref[0])
    path = model.loo_predict_path([LAM, 1.0], mode)
    assert model.cv_stats_["strategy"] == "eig"
    np.testing.assert_allclose(f, path[0], rtol=1e-9, atol=1e-12)
