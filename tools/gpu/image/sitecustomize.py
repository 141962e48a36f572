"""The device image's missing packages, for the CPU rehearsal of the device check: every top-level
module named in ``PROBMOE_CHECK_HIDE`` (comma-separated) is absent here as it is there (``import``
raises ModuleNotFoundError, ``importlib.util.find_spec`` gives None), so that the rehearsal finds a
test module or a command that needs one. tools/gpu/check.py puts this folder first on PYTHONPATH
when it rehearses."""

import os
import sys

for _name in os.environ.get("PROBMOE_CHECK_HIDE", "").split(","):
    if _name.strip():
        sys.modules[_name.strip()] = None  # the import system's mark for "not importable"
