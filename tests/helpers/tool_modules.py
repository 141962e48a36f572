"""Load a script of ``tools/`` as a module for its tests, once per process.

The module is registered in ``sys.modules`` under its file name (dataclasses and pickling look
their module up there), and a second test asking for the same tool gets the same module object,
so a test that patches it patches what every other user of the tool sees.
"""

import importlib.util
import os
import sys

TOOLS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "tools")


def load_tool(name: str):
    """tools/<name>.py as the module ``name`` (the one already loaded, if any)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, os.path.join(TOOLS, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
