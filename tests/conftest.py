import os
import shutil
import signal
import tempfile
import zlib

import pytest
import torch

_SAVED: dict = {}
DEVICES = ("cpu", "cuda")


def pytest_addoption(parser):
    parser.addoption(
        "--device",
        default="cpu",
        choices=DEVICES,
        help="the device of the tests that take one (the `device` fixture; selected by -m device): "
        "cpu (default) or cuda. tools/gpu/check.sh runs them with --device cuda",
    )


def pytest_collection_modifyitems(config, items):
    """A test that asks for the ``device`` fixture is a device test: marked ``device``, so that
    ``-m device --device cuda`` runs exactly the tests that can take a GPU."""
    for item in items:
        if "device" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.device)


@pytest.fixture
def device(request) -> torch.device:
    """The device under test (``--device``; the CPU by default). Tests put the computation there and
    keep their references (brute force, pysdd) on the CPU."""
    return torch.device(request.config.getoption("--device"))


def pytest_configure(config):
    """Every test session compiles circuits, builds the C passes and lets matplotlib cache its
    fonts in a directory of its own, never the user's. Set here, before any test module is imported (a session fixture would
    come too late for what runs at collection)."""
    if config.getoption("--device") == "cuda" and not torch.cuda.is_available():
        raise pytest.UsageError("--device cuda: torch sees no CUDA device (torch.cuda.is_available() is False)")
    _SAVED["validate"] = torch.distributions.Distribution._validate_args  # before any test module is imported
    _SAVED["handlers"] = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    _SAVED["sigmask"] = signal.pthread_sigmask(signal.SIG_BLOCK, [])
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


@pytest.fixture(autouse=True)
def _process_state_restored():
    """What a test, a test module's import or a library it loads may change for the whole process is
    as the session started before every test: torch.distributions' default validation (torch.compile
    and importing torch._dynamo turn it off, e.g. the docs' compiled snippets) and the SIGINT /
    SIGTERM handlers, so that no test's outcome depends on what ran or was imported before it."""
    torch.distributions.Distribution.set_default_validate_args(_SAVED["validate"])
    for s, handler in _SAVED["handlers"].items():
        if signal.getsignal(s) is not handler and handler is not None:
            signal.signal(s, handler)
    signal.pthread_sigmask(signal.SIG_SETMASK, _SAVED["sigmask"])  # a library may block signals in this thread
    yield


@pytest.fixture(autouse=True)
def _seeded(request):
    """Seed torch's global generator from the test's id, so that a test's unseeded draws are the
    same in every run and in any order (a chi-squared check on them then passes or fails for good,
    never one run in a thousand)."""
    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()))


@pytest.fixture
def float64():
    """Make float64 the default dtype for one test (brute-force comparisons at 1e-9), then restore it."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)


def _skip_unless_built(native) -> None:
    if native.library() is None:
        pytest.skip(f"{native.label} turned off or unbuildable")


def _turn_off(monkeypatch, native) -> None:
    """The library as without a compiler or with PROBMOE_NATIVE=0, for one test."""
    monkeypatch.setattr(native, "state", {"lib": None, "where": "turned off in this test"})


# Fixtures, not skipif marks: a mark would build the library while the tests are collected, before
# pytest_configure points the cache at a private folder.
@pytest.fixture
def c_passes_built():
    """Skip unless the kernels' C library (circuits.kernels.library: the circuit passes, the DP's
    sweeps, the row operations) loads."""
    from circuits.kernels import library

    _skip_unless_built(library.LIBRARY)


@pytest.fixture
def c_dp_built(c_passes_built):
    """Skip unless the C DP loads: the same library as the C passes (``c_passes_built``)."""


@pytest.fixture
def c_passes_off(monkeypatch):
    """The kernels without their C code (the torch passes, sweeps and row operations), for one test."""
    from circuits.kernels import library

    _turn_off(monkeypatch, library.LIBRARY)


@pytest.fixture
def c_dp_off(c_passes_off):
    """The DP without its C sweeps: the whole C library off, as ``c_passes_off``."""
