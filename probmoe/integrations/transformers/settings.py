"""The routing settings file written beside a patched model's checkpoint.

``save_pretrained`` of a patched model writes the stock checkpoint (stock keys, no extra weights)
plus ``probmoe_routing.json``:

    {"format": "probmoe-transformers-routing", "version": 1, "model_type": ..., "num_experts": N,
     "top_k": k, "method": ..., "routing": RoutingConfig.to_dict() or null, "aux_loss": ...,
     "z_loss": ..., "sha256": sha256 of the canonical JSON of every other field}

Reading checks everything: the file exists, parses, carries exactly these fields, its checksum
matches (a hand edit is "tampered"), the routing config is valid (``RoutingConfig.from_dict``), and
it matches the checkpoint's config.json (model type, number of experts, top-k, normalisation).
"""

from __future__ import annotations

import hashlib
import json
import os

import probmoe

from ..method_names import ALL_METHODS
from .methods import STOCK, Plan

FILENAME = "probmoe_routing.json"
FORMAT = "probmoe-transformers-routing"
VERSION = 1
FIELDS = ("format", "version", "model_type", "num_experts", "top_k", "method", "routing", "aux_loss", "z_loss",
          "sha256")


def digest(content: dict) -> str:
    text = json.dumps({k: v for k, v in content.items() if k != "sha256"}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def content(plan: Plan, model_type: str) -> dict:
    data = {"format": FORMAT, "version": VERSION, "model_type": model_type, "num_experts": plan.num_experts,
            "top_k": plan.top_k, "method": plan.method,
            "routing": plan.routing.to_dict() if plan.routing is not None else None,
            "aux_loss": plan.aux_loss, "z_loss": plan.z_loss}
    data["sha256"] = digest(data)
    return data


def write(directory, plan: Plan, model_type: str) -> str:
    """Write the settings file into ``directory`` atomically; returns its path."""
    path = os.path.join(os.fspath(directory), FILENAME)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(content(plan, model_type), f, indent=2, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)
    return path


def read(directory) -> dict:
    """The checked settings of a checkpoint directory: the file's fields, with ``routing`` as a
    ``probmoe.RoutingConfig`` (or None). FileNotFoundError if missing; ValueError if unreadable,
    malformed or tampered."""
    path = os.path.join(os.fspath(directory), FILENAME)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path} is missing: this checkpoint was not saved from a model patched with "
                                "probmoe.integrations.transformers.patch_model; load it with transformers' own "
                                "from_pretrained and patch it")
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path} is unreadable ({e})") from e
    if not isinstance(data, dict):
        raise ValueError(f"{path} must hold a JSON object, got {type(data).__name__}")
    if sorted(data) != sorted(FIELDS):
        raise ValueError(f"{path} must have exactly the fields {list(FIELDS)}; got {sorted(data)}")
    if data["format"] != FORMAT or data["version"] != VERSION:
        raise ValueError(f"{path}: format {data['format']!r} version {data['version']!r} is not "
                         f"{FORMAT!r} version {VERSION}")
    if data["sha256"] != digest(data):
        raise ValueError(f"{path} has been modified after it was written (sha256 mismatch); re-save the model "
                         "from a patched model instead of editing the file")
    if data["method"] not in ALL_METHODS:
        raise ValueError(f"{path}: method must be one of {ALL_METHODS}; got {data['method']!r}")
    try:
        routing = None if data["routing"] is None else probmoe.RoutingConfig.from_dict(data["routing"])
    except (ValueError, TypeError) as e:
        raise ValueError(f"{path}: bad routing config ({e})") from e
    if (routing is None) != (data["method"] in STOCK):
        raise ValueError(f"{path}: routing must be null exactly for the stock methods; method {data['method']!r}")
    return dict(data, routing=routing, path=path)


def patch_arguments(data: dict) -> dict:
    """The ``patch_model`` keywords a read settings file describes."""
    r = data["routing"]
    args = {"method": data["method"], "aux_loss": data["aux_loss"], "z_loss": data["z_loss"]}
    if r is not None:
        args.update(backend=r.backend, grad=r.grad)
        args.update({"kmin": r.kmin, "kmax": r.kmax} if data["method"] == "probmoe-dynamic" else {"k": r.k})
    return args
