"""The routing settings file written beside a patched model's checkpoint.

``save_pretrained`` of a patched model writes the stock checkpoint (stock keys, no extra weights)
plus ``probmoe_routing.json``:

    {"format": "probmoe-transformers-routing", "version": 2, "model_type": ..., "num_experts": N,
     "top_k": k, "method": ..., "routing": RoutingConfig.to_dict() or null, "aux_loss": ...,
     "z_loss": ..., "options": {the other patch_model keywords given: ReMoE's l1_coef, l1_rate and
     l1_layers, SparseMixer's jitter_eps, balance and balance_rate}, "sha256": sha256 of the
     canonical JSON of every other field}

(Version 1 files, written before "options" existed, are read as options {}. A ReMoE file without
"l1_layers", written when the penalty was λ/L, is read as l1_layers "mean", what it trained with.)

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
from .methods import TOP_K, Plan

FILENAME = "probmoe_routing.json"
FORMAT = "probmoe-transformers-routing"
VERSION = 2
FIELDS_V1 = (
    "format",
    "version",
    "model_type",
    "num_experts",
    "top_k",
    "method",
    "routing",
    "aux_loss",
    "z_loss",
    "sha256",
)
FIELDS = FIELDS_V1 + ("options",)
OPTIONS = (
    "l1_coef",
    "l1_rate",
    "l1_layers",
    "jitter_eps",
    "balance",
    "balance_rate",
)  # patch_model keywords an "options" object may carry


def digest(content: dict) -> str:
    text = json.dumps({k: v for k, v in content.items() if k != "sha256"}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def content(plan: Plan, model_type: str) -> dict:
    data = {
        "format": FORMAT,
        "version": VERSION,
        "model_type": model_type,
        "num_experts": plan.num_experts,
        "top_k": plan.top_k,
        "method": plan.method,
        "routing": plan.routing.to_dict() if plan.routing is not None else None,
        "aux_loss": plan.aux_loss,
        "z_loss": plan.z_loss,
        "options": plan.options,
    }
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
        raise FileNotFoundError(
            f"{path} is missing: this checkpoint was not saved from a model patched with "
            "probmoe.integrations.transformers.patch_model; load it with transformers' own "
            "from_pretrained and patch it"
        )
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path} is unreadable ({e})") from e
    if not isinstance(data, dict):
        raise ValueError(f"{path} must hold a JSON object, got {type(data).__name__}")
    if data.get("format") != FORMAT or data.get("version") not in (1, VERSION):
        raise ValueError(
            f"{path}: format {data.get('format')!r} version {data.get('version')!r} is not "
            f"{FORMAT!r} version 1 or {VERSION}"
        )
    fields = FIELDS_V1 if data["version"] == 1 else FIELDS
    if sorted(data) != sorted(fields):
        raise ValueError(f"{path} must have exactly the fields {list(fields)}; got {sorted(data)}")
    if data["sha256"] != digest(data):
        raise ValueError(
            f"{path} has been modified after it was written (sha256 mismatch); re-save the model "
            "from a patched model instead of editing the file"
        )
    if data["method"] not in ALL_METHODS:
        raise ValueError(f"{path}: method must be one of {ALL_METHODS}; got {data['method']!r}")
    try:
        routing = None if data["routing"] is None else probmoe.RoutingConfig.from_dict(data["routing"])
    except (ValueError, TypeError) as e:
        raise ValueError(f"{path}: bad routing config ({e})") from e
    if (routing is None) != (data["method"] in TOP_K):
        raise ValueError(
            f"{path}: routing must be null exactly for the methods {', '.join(TOP_K)}; method {data['method']!r}"
        )
    options = data.get("options", {})
    if not isinstance(options, dict) or not set(options) <= set(OPTIONS):
        raise ValueError(f"{path}: options must be an object with keys among {list(OPTIONS)}; got {options!r}")
    return dict(data, routing=routing, options=options, path=path)


def patch_arguments(data: dict) -> dict:
    """The ``patch_model`` keywords a read settings file describes."""
    r = data["routing"]
    args = {"method": data["method"], "aux_loss": data["aux_loss"], "z_loss": data["z_loss"], **data["options"]}
    if data["method"] == "remoe" and "l1_layers" not in data["options"]:
        args["l1_layers"] = "mean"  # written before the option existed, when the penalty was λ/L
    if r is not None:
        args.update(backend=r.backend, grad=r.grad)
        args.update({"kmin": r.kmin, "kmax": r.kmax} if data["method"] == "probmoe-dynamic" else {"k": r.k})
    return args
