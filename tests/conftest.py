import os

import pytest
import torch


@pytest.fixture(autouse=True, scope="session")
def _private_cache(tmp_path_factory):
    """Every test session compiles into its own cache directory, never the user's."""
    path = tmp_path_factory.mktemp("probmoe-cache")
    old = os.environ.get("PROBMOE_CACHE")
    os.environ["PROBMOE_CACHE"] = str(path)
    yield path
    if old is None:
        os.environ.pop("PROBMOE_CACHE", None)
    else:
        os.environ["PROBMOE_CACHE"] = old


@pytest.fixture
def float64():
    """Make float64 the default dtype for one test (brute-force comparisons at 1e-9), then restore it."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)
