"""The architecture ``save_pretrained`` of a patched model writes to config.json: stock where an
engine without probmoe serves the checkpoint's rule, ``ProbMoE`` + the stock name otherwise
(``probmoe.integrations.architectures``, docs/serving.md)."""

from __future__ import annotations

import json
import os

from .. import architectures
from .methods import Plan


def stock_served(plan: Plan, model_type: str) -> bool:
    return architectures.stock_served(
        model_type, plan.method, plan.routing, plan.top_k, plan.num_experts, plan.options.balance is not None
    )


def write(directory, plan: Plan, model_type: str) -> None:
    """Rename the architectures of ``directory``'s config.json (as transformers wrote it) to probmoe
    names unless a stock engine serves ``plan``'s rule; the file is replaced atomically."""
    if stock_served(plan, model_type):
        return
    path = os.path.join(os.fspath(directory), "config.json")
    with open(path) as f:
        data = json.load(f)
    names = data.get("architectures") or []
    data["architectures"] = [architectures.probmoe_name(architectures.stock_name(n)) for n in names]
    tmp = path + ".probmoe-tmp"
    with open(tmp, "w") as f:
        f.write(json.dumps(data, indent=2, sort_keys=True) + "\n")  # as transformers writes it
    os.replace(tmp, path)
