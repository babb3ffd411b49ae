"""SparseRLS training, lambda switching, prediction, rank deficiency and input checks."""

import numpy as np
import pytest

from ooc_learn.rls import SparseRLS
from ooc_learn.rls.kernel import kernel_block
from ooc_learn.storage.errors import ParameterError, UsageError

from _rls_reference import brute_predict, make_data

KERNELS = [dict(kernel="rbf", gamma=0.3), dict(kernel="linear"),
           dict(kernel="poly", gamma=0.5, degree=2, coef0=1.0)]


@pytest.mark.parametrize("kw", KERNELS, ids=lambda k: k["kernel"])
@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "csr"])
def test_fit_matches_closed_form(rng, kw, sparse):
    Xin, X, Y = make_data(rng, m=200, d=5, sparse=sparse)
    model = SparseRLS(n_basis=30, lam=0.7, **kw).fit(Xin, Y[:, 0])
    allr = np.arange(200)
    # coefficients a = P^-1 K_B y of eq. 12, on the shifted kernel
    K = kernel_block(X, X, model.spec, model.gamma_)
    K[np.diag_indices(200)] += model.delta_
    KB = K[model.basis_]
    a = np.linalg.solve(KB @ KB.T + 0.7 * K[np.ix_(model.basis_, model.basis_)], KB @ Y[:, :1])
    if kw["kernel"] == "rbf":     # linear / poly have n > feature dim: a is ill-posed, f is not
        np.testing.assert_allclose(model.coef_, a, rtol=1e-6, atol=1e-9 * np.abs(a).max())
    # predictions on new rows use the unshifted kernel k(x, x_B)
    Xnew = rng.normal(size=(17, 5))
    ref = kernel_block(Xnew, X[model.basis_], model.spec, model.gamma_) @ a
    scale = np.abs(ref).max()
    np.testing.assert_allclose(model.predict(Xnew), ref[:, 0], rtol=1e-6, atol=1e-7 * scale)
    # training-row predictions (shifted) equal the brute-force fit
    fit_rows = brute_predict(model, X, Y[:, 0], allr, model.basis_, 0.7, allr)
    np.testing.assert_allclose(KB.T @ model.coef_, fit_rows, rtol=1e-6, atol=1e-7 * scale)


def test_set_lambda_and_path_equal_independent_fits(rng, data):
    Xin, X, Y = data
    model = SparseRLS(n_basis=40, lam=1.0, gamma=0.5).fit(Xin, Y)
    lams = [1e-3, 0.1, 10.0]
    path = model.coef_path(lams)
    for k, lam in enumerate(lams):
        ref = SparseRLS(n_basis=40, lam=lam, gamma=0.5).fit(Xin, Y).coef_
        np.testing.assert_allclose(model.set_lambda(lam).coef_, ref, rtol=1e-7, atol=1e-10)
        np.testing.assert_allclose(path[k], ref, rtol=1e-7, atol=1e-10)


def test_multi_output_equals_per_output_fits(rng):
    Xin, X, Y = make_data(rng, m=150, v=3)
    model = SparseRLS(n_basis=25, lam=0.2, gamma=0.4).fit(Xin, Y)
    assert model.predict(X[:5]).shape == (5, 3)
    for j in range(3):
        single = SparseRLS(n_basis=25, lam=0.2, gamma=0.4).fit(Xin, Y[:, j])
        np.testing.assert_allclose(model.coef_[:, j], single.coef_[:, 0], rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(model.predict(X)[:, j], single.predict(X), rtol=1e-9,
                                   atol=1e-12)


def test_same_seed_same_basis_and_explicit_basis(data):
    Xin, X, Y = data
    a = SparseRLS(n_basis=20, seed=3).fit(Xin, Y)
    b = SparseRLS(n_basis=20, seed=3).fit(Xin, Y)
    np.testing.assert_array_equal(a.basis_, b.basis_)
    c = SparseRLS(basis=a.basis_[::-1].copy()).fit(Xin, Y)     # order of the basis is irrelevant
    np.testing.assert_allclose(c.predict(X), a.predict(X), rtol=1e-8, atol=1e-10)


def test_rank_deficient_basis_duplicate_rows(rng):
    """Duplicate basis rows make K_BB singular; the diagonal shift delta = jitter * mean diag
    keeps it PD, the fit equals the brute force on the same shifted kernel, and predictions
    agree with the de-duplicated basis to the order of the shift."""
    X = rng.normal(size=(120, 3))
    X[60:80] = X[0:20]                      # 20 exact duplicate rows
    y = np.sin(X[:, 0]) + 0.1 * rng.normal(size=120)
    basis = np.r_[np.arange(0, 20), np.arange(60, 80), np.arange(100, 110)]
    dup = SparseRLS(basis=basis, lam=0.5, gamma=0.5, jitter=1e-8).fit(X, y)
    assert dup.delta_ == pytest.approx(1e-8)
    allr = np.arange(120)
    ref = brute_predict(dup, X, y, allr, basis, 0.5, allr)
    K = kernel_block(X, X[basis], dup.spec, dup.gamma_)
    K[basis, np.arange(basis.size)] += dup.delta_
    np.testing.assert_allclose(K @ dup.coef_[:, 0], ref[:, 0], rtol=1e-5, atol=1e-7)
    uniq = SparseRLS(basis=np.r_[np.arange(0, 20), np.arange(100, 110)], lam=0.5, gamma=0.5,
                     jitter=1e-8).fit(X, y)
    Xnew = rng.normal(size=(30, 3))
    np.testing.assert_allclose(dup.predict(Xnew), uniq.predict(Xnew), rtol=0, atol=1e-5)
    # and the hold-out machinery stays exact with the duplicates removed or kept
    H = np.r_[5, 65, 90]
    np.testing.assert_allclose(
        dup.holdout_predict(H, "remove"),
        brute_predict(dup, X, y, np.setdiff1d(allr, H), np.setdiff1d(basis, H), 0.5, H)[:, 0],
        rtol=1e-5, atol=1e-6)


def test_linear_kernel_more_basis_than_features(rng):
    """Linear kernel with n > d: K_BB has rank d; the shifted fit equals ridge regression
    on the d features (predictions, to the order of the shift)."""
    X = rng.normal(size=(300, 4))
    y = X @ np.array([1.0, -2.0, 0.5, 0.0]) + 0.1 * rng.normal(size=300)
    model = SparseRLS(kernel="linear", n_basis=50, lam=1.0).fit(X, y)
    # the span of the basis is all of R^4, so sparse RLS = ridge: w = (X^T X + lam I)^-1 X^T y
    w = np.linalg.solve(X.T @ X + np.eye(4), X.T @ y)
    np.testing.assert_allclose(model.predict(X), X @ w, rtol=0, atol=1e-5)
    loo = model.loo_predict("keep_no_loss")
    Hm = X @ np.linalg.solve(X.T @ X + np.eye(4), X.T)
    ref = (X @ w - np.diag(Hm) * y) / (1 - np.diag(Hm))
    np.testing.assert_allclose(loo, ref, rtol=0, atol=1e-5)


def test_bad_parameters_raise_before_reading(data):
    Xin, X, Y = data
    with pytest.raises(ParameterError, match="'lam' parameter of SparseRLS must be > 0"):
        SparseRLS(lam=0.0)
    with pytest.raises(ParameterError, match="'lam' parameter of SparseRLS must be > 0"):
        SparseRLS(lam=-1.0)
    with pytest.raises(ParameterError, match="'kernel' parameter"):
        SparseRLS(kernel="sigmoid")
    with pytest.raises(ParameterError, match="'gamma' parameter"):
        SparseRLS(gamma=-2.0)
    with pytest.raises(ParameterError, match="'n_basis' parameter"):
        SparseRLS(n_basis=0)
    with pytest.raises(ParameterError, match="'jitter' parameter"):
        SparseRLS(jitter=-1.0)


def test_bad_inputs(data):
    Xin, X, Y = data
    m = X.shape[0]
    with pytest.raises(ParameterError, match=f"must be <= the number of samples \\({m}\\)"):
        SparseRLS(n_basis=m + 1).fit(Xin, Y)
    bad = Y[:, 0].copy()
    bad[7] = np.nan
    with pytest.raises(ParameterError, match="'y' parameter of SparseRLS.fit must be finite.*row 7"):
        SparseRLS(n_basis=10).fit(Xin, bad)
    with pytest.raises(ParameterError, match="one row per sample"):
        SparseRLS(n_basis=10).fit(Xin, Y[:-1])
    with pytest.raises(ParameterError, match="must not repeat a row"):
        SparseRLS(basis=[1, 2, 2]).fit(Xin, Y)
    with pytest.raises(ParameterError, match="row positions in"):
        SparseRLS(basis=[1, m]).fit(Xin, Y)
    with pytest.raises(UsageError, match="not fitted"):
        SparseRLS().predict(X)
    model = SparseRLS(n_basis=10).fit(Xin, Y)
    with pytest.raises(ParameterError, match="'lam' parameter of SparseRLS.set_lambda must be > 0"):
        model.set_lambda(0)
    with pytest.raises(ParameterError, match="'lam' parameter of SparseRLS.set_lambda must be > 0"):
        model.set_lambda(float("nan"))
    from ooc_learn.storage.errors import ModelMismatchError
    with pytest.raises(ModelMismatchError, match="features"):
        model.predict(X[:, :2])
    Xnan = np.array(X)
    Xnan[3, 1] = np.inf
    with pytest.raises(ParameterError, match="'X' parameter of SparseRLS.fit must be finite"):
        SparseRLS(n_basis=10).fit(Xnan, Y)
    with pytest.raises(ParameterError, match="'y' parameter of SparseRLS.fit is required"):
        SparseRLS(n_basis=10).fit(Xin)


def test_not_positive_definite_even_with_shift():
    X = np.zeros((20, 2))
    y = np.arange(20.0)
    # linear kernel on all-zero rows: K_BB = 0 and jitter 0 leaves nothing to factor
    with pytest.raises(UsageError, match="not positive definite.*jitter"):
        SparseRLS(kernel="linear", n_basis=5, jitter=0.0).fit(X, y)


@pytest.mark.parametrize("layout", ["dense", "csr", "csr-basis"])
@pytest.mark.parametrize("kernel", ["rbf", "linear"])
def test_kernel_block_in_row_slices_equals_the_whole_product(monkeypatch, layout, kernel):
    """The cross term is taken a slice of rows at a time (its float64 copy bounded): with
    slices of 3 rows the block equals the one-product definition."""
    import scipy.sparse as sp

    import ooc_learn.rls.kernel as RK

    rng = np.random.default_rng(3)
    XA = rng.standard_normal((20, 6)).astype(np.float32)
    XB = rng.standard_normal((7, 6)).astype(np.float32)
    A64, B64 = XA.astype(np.float64), XB.astype(np.float64)
    G = A64 @ B64.T
    sq = (A64 ** 2).sum(1)[:, None] + (B64 ** 2).sum(1)[None, :] - 2 * G
    want = G if kernel == "linear" else np.exp(-0.3 * sq)
    if layout == "csr":
        XA = sp.csr_matrix(XA)
    elif layout == "csr-basis":
        XB = sp.csr_matrix(XB)
    monkeypatch.setattr(RK, "CROSS_SLICE_BYTES", 3 * 8 * 6)  # 3 rows a slice
    got = RK.kernel_block(XA, XB, RK.KernelSpec(kernel), 0.3)
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
    assert got.flags.c_contiguous and got.dtype == np.float64
