import numpy as np
import pytest


@pytest.fixture
def data_rng():
    return np.random.default_rng(20240601)
