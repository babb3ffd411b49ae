import numpy as np
import pytest


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
