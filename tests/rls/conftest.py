"""Fixtures for the sparse RLS tests."""

import pytest

from _rls_reference import make_data


@pytest.fixture
def data(rng):
    return make_data(rng)
