"""Fixtures of the solver tests."""
import pytest


@pytest.fixture(params=["dense", "csr"])
def layout(request):
    return request.param
