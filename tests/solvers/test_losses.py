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


def test_truncation_caps_at_L_of_minus_s():
    for base, s in [(Hinge(), 1.0), (SquaredHinge(), 2.0)]:
        t = TruncatedLoss(base, s)
        z = np.array([-10.0, -s - 1e-9, -s, 0.0, 2.0])
        assert t.cap() == pytest.approx(base.value(np.array([-s]))[0])
        np.testing.assert_allclose(t.value(z), np.minimum(base.value(z), t.cap()))
        assert t.grad(np.array([-10.0]))[0] == 0.0 and t.dual_from_margin(np.array([-10.0]), 1.0)[0] == 0.0
    assert TruncatedLoss(Hinge(), 1.0).cap() == 2.0  # the paper's 1 + s for the hinge


def test_get_loss_names_and_errors():
    assert isinstance(get_loss("l2"), SquaredHinge)
    assert get_loss("hinge", s=1.0).s == 1.0
    with pytest.raises(ParameterError, match="'loss' parameter must be one of hinge, sqhinge"):
        get_loss("logistic")
    with pytest.raises(ParameterError, match="'s' parameter of TruncatedLoss must be >= 0"):
        get_loss("hinge", s=-1.0)
