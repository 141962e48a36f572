"""Whether a name or a path that docs or code cite exists: shared by tests/docs/test_site.py (the pages)
and tests/test_references.py (the code's docstrings and comments)."""

from __future__ import annotations

import importlib
import importlib.util

# written by commands, not in the tree: tools/gpu/wheels.sh's folder (ignored by git), and the kernels
# a wheel ships compiled (setup.py writes them into the wheel's build folder)
MADE_BY_COMMANDS = ("tools/gpu/wheels", "circuits/kernels/prebuilt")


def missing_package(err: ImportError, module: str) -> str | None:
    """The optional third-party package whose absence made importing ``module`` fail with ``err``,
    None when the failure is ours: a module not found outside circuits and probmoe, or an
    integration (``probmoe.integrations.torchtitan``) whose import refuses because its package
    (``torchtitan``) is not installed."""
    if isinstance(err, ModuleNotFoundError):
        top = (err.name or "").split(".")[0]
        return top if top and top not in ("circuits", "probmoe") else None
    parts = module.split(".")
    if parts[:2] == ["probmoe", "integrations"] and len(parts) > 2:
        try:
            found = importlib.util.find_spec(parts[2])
        except (ImportError, ValueError):
            found = None
        if found is None:
            return parts[2]
    return None


def resolves(dotted: str) -> bool | str:
    """True when ``dotted`` is a module or an attribute path under one, False when it is not; the
    name of the optional package it needs (``torchtitan``, ``vllm``, ...) when that is not
    installed here, so it cannot be checked."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        module = ".".join(parts[:i])
        try:
            obj = importlib.import_module(module)
        except ImportError as e:
            package = missing_package(e, module)
            if package is not None:
                return package
            if isinstance(e, ModuleNotFoundError):
                continue
            raise
        for attr in parts[i:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False
