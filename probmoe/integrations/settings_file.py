"""``probmoe_routing.json``, the routing settings file written beside a patched model's checkpoint:
its one writer's content and its one reader, shared by the transformers integration (which loads
the model with it) and the vLLM plugin (which serves it). No library is imported here (vLLM's venv
pins a transformers the transformers integration refuses: docs/serving.md).

Version 3 (written now):

    {"format": "probmoe-transformers-routing", "version": 3, "model_type": ..., "num_experts": N,
     "top_k": k, "method": ..., "routing": RoutingConfig.to_dict() or null, "options": every
     other field of the resolved RoutingOptions.to_dict(), "sha256": sha256 of the canonical JSON
     of every other field}

Versions 1 and 2 (read as they were): "method", "aux_loss" and "z_loss" beside "routing", the
method-specific options in "options" (version 2 only), k / kmin / kmax / backend / grad in
"routing"; what a method's old files meant is the method's to say (``Method.legacy_options``: a
ReMoE file without "l1_layers", written when the penalty was λ/L, is read as l1_layers "mean", what
it trained with).

Reading checks everything: the file parses, carries exactly its version's fields, its checksum
matches (a hand edit is "tampered"), the routing config and options are valid, routing is null
exactly for the methods without an estimator (the top-k methods). The checks against the checkpoint's config.json are the callers'.
"""

from __future__ import annotations

import hashlib
import json
import os

import probmoe
from probmoe.methods import get_method, methods

from .routing_options import RoutingOptions

FILENAME = "probmoe_routing.json"
FORMAT = "probmoe-transformers-routing"
VERSION = 3
_V1 = ("format", "version", "model_type", "num_experts", "top_k", "method", "routing", "aux_loss", "z_loss", "sha256")
FIELDS = {
    1: _V1,
    2: (*_V1, "options"),
    3: ("format", "version", "model_type", "num_experts", "top_k", "method", "routing", "options", "sha256"),
}
V2_OPTIONS = ("l1_coef", "l1_rate", "l1_layers", "jitter_eps", "balance", "balance_rate")  # a version 2 "options"


def digest(content: dict) -> str:
    text = json.dumps({k: v for k, v in content.items() if k != "sha256"}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def content(options: RoutingOptions, routing, *, model_type: str, num_experts: int, top_k: int) -> dict:
    """The file's fields (version 3) for resolved ``options`` and their ``routing`` config (or None)."""
    data = {
        "format": FORMAT,
        "version": VERSION,
        "model_type": model_type,
        "num_experts": num_experts,
        "top_k": top_k,
        "method": options.method,
        "routing": routing.to_dict() if routing is not None else None,
        "options": {name: value for name, value in options.to_dict().items() if name != "method"},
    }
    data["sha256"] = digest(data)
    return data


def write(directory, data: dict) -> str:
    """Write ``content``'s ``data`` into ``directory`` atomically; returns the file's path."""
    path = os.path.join(os.fspath(directory), FILENAME)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)
    return path


def read(directory) -> dict | None:
    """The checked settings of checkpoint ``directory``, or None if it has no settings file:
    {"model_type", "num_experts", "top_k", "version", "path", "method", "routing": a
    ``probmoe.RoutingConfig`` or None, "options": the ``RoutingOptions`` it routes by}.
    ValueError naming the file when it is unreadable, malformed or tampered."""
    path = os.path.join(os.fspath(directory), FILENAME)
    if not os.path.exists(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path} is unreadable ({e}); re-save the checkpoint from the patched model") from e
    if not isinstance(data, dict):
        raise ValueError(f"{path} must hold a JSON object, got {type(data).__name__}")
    if data.get("format") != FORMAT or data.get("version") not in FIELDS:
        raise ValueError(
            f"{path}: format {data.get('format')!r} version {data.get('version')!r} is not "
            f"{FORMAT!r} version {', '.join(map(str, FIELDS))}"
        )
    fields = FIELDS[data["version"]]
    if sorted(data) != sorted(fields):
        raise ValueError(f"{path} must have exactly the fields {list(fields)}; got {sorted(data)}")
    if data["sha256"] != digest(data):
        raise ValueError(
            f"{path} has been modified after it was written (sha256 mismatch); re-save the model "
            "from a patched model instead of editing the file"
        )
    n = data["num_experts"]
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"{path}: num_experts must be an integer >= 1, got {n!r}")
    kmax = data["routing"].get("kmax") if isinstance(data["routing"], dict) else None
    if isinstance(kmax, int) and not isinstance(kmax, bool) and kmax > n:
        raise ValueError(f"{path}: routing kmax = {kmax} is above the expert count num_experts = {n} (allowed: 1..{n})")
    try:
        routing = None if data["routing"] is None else probmoe.RoutingConfig.from_dict(data["routing"])
    except (ValueError, TypeError) as e:
        raise ValueError(f"{path}: bad routing config ({e})") from e
    try:
        options = _options(data, routing)
    except (ValueError, TypeError) as e:
        raise ValueError(f"{path}: {e}") from e
    if (routing is None) != (get_method(options.method).estimator is None):
        top_k = [name for name in methods() if get_method(name).estimator is None]
        raise ValueError(
            f"{path}: routing must be null exactly for the methods {', '.join(top_k)}; method {options.method!r}"
        )
    return dict(
        model_type=data["model_type"],
        num_experts=n,
        top_k=data["top_k"],
        version=data["version"],
        path=path,
        method=options.method,
        routing=routing,
        options=options,
    )


def _options(data: dict, routing) -> RoutingOptions:
    """The ``RoutingOptions`` a file of any version describes."""
    if data["version"] >= 3:
        options = data["options"]
        if not isinstance(options, dict) or "method" in options:  # the method is a field of its own
            known = [name for name in RoutingOptions.__dataclass_fields__ if name != "method"]
            raise ValueError(f"options must be an object with keys among {known}; got {options!r}")
        return RoutingOptions.from_dict({**options, "method": data["method"]})
    options = data.get("options", {})
    if not isinstance(options, dict) or not set(options) <= set(V2_OPTIONS):
        raise ValueError(f"options must be an object with keys among {list(V2_OPTIONS)}; got {options!r}")
    method = get_method(data["method"])
    values = {"method": method.name, "aux_loss": data["aux_loss"], "z_loss": data["z_loss"], **options}
    values = method.legacy_options(values, options)
    if routing is not None:
        values.update(backend=routing.algorithm, grad=routing.grad)
        if method.sizes == "range":
            values.update(kmin=routing.kmin, kmax=routing.kmax)
        else:
            values["k"] = routing.k
    return RoutingOptions.from_dict(values)
