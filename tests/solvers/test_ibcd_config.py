"""IBCDConfig: every tunable named once, documented, validated, immutable."""

import dataclasses

import numpy as np
import pytest

from ooc_learn.api import ingest_arrays
from ooc_learn.solvers.ibcd import IBCDConfig, solve_ibcd
from ooc_learn.storage.errors import ParameterError

# a value each field must refuse
BAD = {
    "loss": "log", "C": 0.0, "s": -1.0, "bias": float("nan"), "n": 0, "eps": 0.0,
    "sample_eps": 1.0, "max_outer": 0, "init_sample": 0, "block_iters": 1.5,
    "block_solver": "newton", "shrink_threshold": -1.0, "seed": -1, "init_iters": 0,
    "quick_iters": 0, "max_iters": 0, "newton": "yes", "quick_newton_steps": -1,
    "dual_switch_iters": 0, "primal_eps": 0.0,
    "resolve_growth": 1.0, "check_growth": 0.0, "check_sample": -1.0, "admit": "best",
    "freeze_margin": -0.5, "thaw_stalls": 0,
    "prune_bytes": -1, "query_share": -0.1,
    "min_precision": 1.5,
    "dense_query": 2.0, "cost_model": "yes", "visit_cost": -1.0,
    "read_cost": -1.0, "query_read_cost": float("inf"), "scan_margin": 0.0,
    "pool_band": -1.0, "pool_share": 0, "resident_share": 0.0, "spilled_rounds": 0,
    "spilled_final_rounds": 0, "spilled_stall": 0, "spilled_window_iters": 0,
    "spilled_resolve_rounds": 0,
}


def test_every_field_is_documented_and_has_a_refused_value():
    names = [f.name for f in dataclasses.fields(IBCDConfig)]
    assert sorted(names) == sorted(BAD)
    doc = IBCDConfig.__doc__
    for name in names:
        assert f"\n    {name} : " in doc, f"{name} has no entry in IBCDConfig's docstring"


@pytest.mark.parametrize("name", sorted(BAD))
def test_a_bad_value_is_refused_naming_the_field(name):
    with pytest.raises(ParameterError, match=f"'{name}' parameter of solve_ibcd"):
        IBCDConfig(**{name: BAD[name]})


def test_the_primal_block_solver_needs_the_squared_hinge():
    with pytest.raises(ParameterError, match="squared hinge"):
        IBCDConfig(loss="hinge", block_solver="primal")
    assert IBCDConfig(loss="sqhinge", block_solver="primal").block_solver == "primal"


def test_config_is_frozen_and_replace_validates():
    cfg = IBCDConfig(C=0.5)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.C = 2.0
    assert cfg.replace(n=10).n == 10 and cfg.n == 1000
    with pytest.raises(ParameterError, match="'n' parameter"):
        cfg.replace(n=0)


def test_solve_ibcd_takes_a_config_and_keyword_overrides(tmp_path, rng):
    X = rng.normal(size=(1500, 8)).astype(np.float32)
    y = np.where(X[:, 0] + 0.3 * rng.normal(size=1500) > 0, 1.0, -1.0)
    with ingest_arrays(X, y, tmp_path / "s", n_blocks=3, build_index=True) as store:
        cfg = IBCDConfig(C=0.1, n=100, eps=0.01, init_sample=200, seed=3)
        a = solve_ibcd(store, cfg)
        b = solve_ibcd(store, C=0.1, n=100, eps=0.01, init_sample=200, seed=3)
        np.testing.assert_array_equal(a.w, b.w)
        # an override wins over the config's field: another C, another answer
        c = solve_ibcd(store, cfg, C=1.0)
        assert not np.allclose(c.w, a.w)
        with pytest.raises(ParameterError, match="'eps' parameter"):
            solve_ibcd(store, cfg, eps=-1.0)
