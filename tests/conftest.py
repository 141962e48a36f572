import os
import shutil
import tempfile

import pytest
import torch

_SAVED: dict = {}


def pytest_configure(config):
    """Every test session compiles circuits, builds the C passes and lets matplotlib cache its
    fonts in a directory of its own, never the user's. Set here, before any test module is imported (a session fixture would
    come too late for what runs at collection)."""
    _SAVED["old"] = {name: os.environ.get(name) for name in ("PROBMOE_CACHE", "MPLCONFIGDIR")}
    _SAVED["path"] = tempfile.mkdtemp(prefix="probmoe-test-cache-")
    os.environ["PROBMOE_CACHE"] = _SAVED["path"]
    os.environ["MPLCONFIGDIR"] = os.path.join(_SAVED["path"], "matplotlib")  # its font cache, too


def pytest_unconfigure(config):
    if "path" not in _SAVED:
        return
    shutil.rmtree(_SAVED.pop("path"), ignore_errors=True)
    for name, old in _SAVED.pop("old").items():
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


@pytest.fixture
def float64():
    """Make float64 the default dtype for one test (brute-force comparisons at 1e-9), then restore it."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)
