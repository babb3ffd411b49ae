import os

import numpy as np
import pytest

# a first run under --memory warms its kernels up in helper processes (ooc_learn._warmup);
# the suite's commands compile in-process as before (tests/test_warmup.py tests the helpers)
os.environ.setdefault("OOC_WARMUP", "0")


@pytest.fixture
def rng():
    return np.random.default_rng(12345)


@pytest.fixture
def without_module(monkeypatch):
    """``without_module("dask")``: importing that package (or a submodule) raises ImportError
    from now to the end of the test, as where it is not installed."""
    import builtins

    real_import = builtins.__import__

    def block(top: str):
        def guarded(name, *args, **kwargs):
            if name == top or name.startswith(top + "."):
                raise ImportError(f"no {top} here")
            return real_import(name, *args, **kwargs)

        monkeypatch.setattr(builtins, "__import__", guarded)
    return block
