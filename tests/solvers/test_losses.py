"""Finite-difference checks of every loss and of the primal pieces TRON uses."""
import numpy as np
import pytest

from ooc_learn.losses import Hinge, SquaredHinge, TruncatedLoss, get_loss
from ooc_learn.storage.errors import ParameterError

LOSSES = [Hinge(), SquaredHinge(), TruncatedLoss(Hinge(), 1.0), TruncatedLoss(SquaredHinge(), 0.5)]
H = 1e-6


def _smooth_points(loss, rng):
    """Margins away from the kinks (1 and -s), where derivatives exist."""
    z = rng.uniform(-4, 4, size=400)
    kinks = [1.0] + ([-loss.s] if isinstance(loss, TruncatedLoss) else [])
    keep = np.all([np.abs(z - k) > 1e-3 for k in kinks], axis=0)
    return z[keep]


@pytest.mark.parametrize("loss", LOSSES, ids=repr)
def test_grad_matches_finite_difference(loss, rng):
    z = _smooth_points(loss, rng)
    fd = (loss.value(z + H) - loss.value(z - H)) / (2 * H)
    assert np.max(np.abs(fd - loss.grad(z))) < 1e-6  # central difference, exact for pieces of degree <= 2


@pytest.mark.parametrize("loss", LOSSES, ids=repr)
def test_hess_vec_matches_finite_difference(loss, rng):
    z = _smooth_points(loss, rng)
    u = rng.normal(size=z.shape)
    fd = (loss.grad(z + H) - loss.grad(z - H)) / (2 * H) * u
    assert np.max(np.abs(fd - loss.hess_vec(z, u))) < 1e-5


@pytest.mark.parametrize("loss", LOSSES, ids=repr)
def test_dual_quantities_and_cap(loss):
    C = 2.0
    base = loss.base()
    if base.name == "hinge":
        assert loss.dual_upper(C) == C and loss.dual_diag(C) == 0.0
    else:
        assert loss.dual_upper(C) == np.inf and loss.dual_diag(C) == pytest.approx(0.25)
    # KKT: the dual value -C L'(z) is in [0, U] and zero for margins >= 1
    z = np.linspace(-5, 5, 101)
    a = loss.dual_from_margin(z, C)
    assert np.all(a >= 0) and np.all(a <= loss.dual_upper(C)) and np.all(a[z >= 1] == 0)


def test_truncation_is_the_papers_min_of_L_and_1_plus_s():
    # R_s(z) = min(L(z), 1 + s) (IBCD paper eq. 2): the outliers are z < L^-1(1 + s), the
    # threshold the index's query uses too (one definition: the squared hinge's cap was
    # L(-s) = (1 + s)^2 here while the query cut at 1 - sqrt(1 + s))
    from ooc_learn.losses import outlier_margin

    for base, s, low in [(Hinge(), 1.0, -1.0), (SquaredHinge(), 3.0, -1.0),
                         (SquaredHinge(), 0.44, -0.2)]:
        t = TruncatedLoss(base, s)
        assert t.cap() == 1.0 + s
        assert t.outlier_margin() == pytest.approx(low)
        assert outlier_margin(base.name, s) == pytest.approx(low)
        z = np.array([-10.0, low - 1e-6, low + 1e-6, 0.0, 2.0])
        np.testing.assert_allclose(t.value(z), np.minimum(base.value(z), 1.0 + s))
        assert t.value(np.array([low]))[0] == pytest.approx(1.0 + s)  # continuous there
        assert t.inlier(z).tolist() == [False, False, True, True, True]
        assert t.grad(z[:2]).tolist() == [0.0, 0.0] and t.grad(z[2:3])[0] < 0.0
        assert t.dual_from_margin(np.array([-10.0]), 1.0)[0] == 0.0


def test_get_loss_names_and_errors():
    assert isinstance(get_loss("l2"), SquaredHinge)
    assert get_loss("hinge", s=1.0).s == 1.0
    with pytest.raises(ParameterError, match="'loss' parameter must be one of hinge, sqhinge"):
        get_loss("logistic")
    with pytest.raises(ParameterError, match="'s' parameter of TruncatedLoss must be >= 0"):
        get_loss("hinge", s=-1.0)
