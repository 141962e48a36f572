"""The routing settings file written beside a patched model's checkpoint (``probmoe_routing.json``).

``save_pretrained`` of a patched model writes the stock checkpoint (stock keys, no extra weights)
plus the settings file: the plan's resolved ``RoutingOptions`` and ``RoutingConfig``, checked
against the checkpoint's config.json when read. The format, its writer and its one reader (also the
vLLM plugin's) are ``probmoe.integrations.settings_file``.
"""

from __future__ import annotations

import os

from .. import settings_file
from ..settings_file import FILENAME, FORMAT, VERSION, digest  # noqa: F401 (exported here)
from .methods import Plan


def content(plan: Plan, model_type: str) -> dict:
    return settings_file.content(
        plan.options, plan.routing, model_type=model_type, num_experts=plan.num_experts, top_k=plan.top_k
    )


def write(directory, plan: Plan, model_type: str) -> str:
    """Write the settings file into ``directory`` atomically; returns its path."""
    return settings_file.write(directory, content(plan, model_type))


def read(directory) -> dict:
    """The checked settings of a checkpoint directory (``settings_file.read``). FileNotFoundError if
    missing; ValueError if unreadable, malformed or tampered."""
    data = settings_file.read(directory)
    if data is None:
        raise FileNotFoundError(
            f"{os.path.join(os.fspath(directory), FILENAME)} is missing: this checkpoint was not saved from a "
            "model patched with probmoe.integrations.transformers.patch_model; load it with transformers' own "
            "from_pretrained and patch it"
        )
    return data
