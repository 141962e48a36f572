"""mkdocs hook: the API reference pages list every public name, read from the packages themselves.

A page holding ``<!-- api: PACKAGE -->`` gets one mkdocstrings block (``::: module.name``) per
public name of PACKAGE, so a name added to or moved out of ``__all__`` appears or fails the
build without anyone editing the page. ``circuits`` loads its names lazily (PEP 562); its
``_HOMES`` table says which module defines each (importing ``circuits`` imports no torch), and
mkdocstrings reads that module. The other packages' ``__all__`` are read with ``ast`` (importing
them would import torch, transformers or torchtitan).
"""

from __future__ import annotations

import ast
import importlib
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MARK = re.compile(r"<!-- api: ([\w.]+) -->")
# public names outside an __all__: a module whose names are its functions and classes
EXTRA = {
    "probmoe.integrations.transformers": [
        "probmoe.integrations.transformers.callback.RoutingStatsCallback",
        "probmoe.integrations.transformers.control_callback.RoutingControlCallback",
        "probmoe.integrations.transformers.resume.to_model_layout",
        "probmoe.integrations.transformers.testing.tiny_model",
        "probmoe.integrations.transformers.testing.tiny_config",
    ],
    "probmoe.integrations.vllm": [
        "probmoe.integrations.vllm.ARCHITECTURES",
        "probmoe.integrations.vllm.register",
    ],
    "probmoe.integrations.scale_out": [
        "probmoe.integrations.scale_out.rank_seed",
        "probmoe.integrations.scale_out.rank_generator",
    ],
}


def _init(package: str) -> ast.Module:
    path = ROOT.joinpath(*package.split("."), "__init__.py")
    if not path.exists():
        path = ROOT.joinpath(*package.split(".")).with_suffix(".py")
    return ast.parse(path.read_text(encoding="utf-8"))


def _literal(tree: ast.Module, name: str):
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        if any(isinstance(t, ast.Name) and t.id == name for t in targets) and node.value is not None:
            return node.value
    return None


def _circuits_paths() -> list[str]:
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    homes = importlib.import_module("circuits")._HOMES  # public name -> defining module (None: a module)
    return [f"circuits.{name}" if homes[name] is None else f"circuits.{homes[name]}.{name}" for name in sorted(homes)]


def public_paths(package: str) -> list[str]:
    """The dotted paths mkdocstrings renders for ``package``'s public names."""
    if package == "circuits":
        return _circuits_paths()
    tree = _init(package)
    value = _literal(tree, "__all__")
    names = ast.literal_eval(value) if value is not None else []
    # a re-exported name is shown from the module that defines it (``probmoe.route`` is also a
    # module); one re-exported from circuits from where circuits defines it (its names are lazy)
    lazy = {path.rsplit(".", 1)[1]: path for path in _circuits_paths()}
    homes = {}
    for node in tree.body:
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level == 0 and node.module == "circuits":
            homes.update({a.asname or a.name: lazy[a.name] for a in node.names})
        elif node.level == 1 and node.module:
            # renamed on import (``ALL as ALL_FAMILIES``): shown under the public name, as an alias
            homes.update({a.name: f"{package}.{node.module}.{a.name}" for a in node.names if a.asname is None})
    paths = [homes.get(name, f"{package}.{name}") for name in names]
    return paths + EXTRA.get(package, [])


def on_page_markdown(markdown: str, **_) -> str:
    def block(match: re.Match) -> str:
        return "\n\n".join(f"::: {path}" for path in public_paths(match.group(1)))

    return MARK.sub(block, markdown)
