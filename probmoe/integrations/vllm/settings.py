"""The routing settings of a checkpoint, read for serving: ``probmoe_routing.json`` and the
selection bias in ``probmoe_state.safetensors``, both written by ``save_pretrained`` of a model
patched with ``probmoe.integrations.transformers`` (the formats: ``probmoe.integrations.settings_file``
and the transformers integration's ``runtime_state``).

The settings file is read by the one reader the transformers integration uses too
(``probmoe.integrations.settings_file``: it imports neither transformers nor vllm, whose venv
pins a transformers our transformers integration refuses: docs/serving.md). Nothing read is
trusted: a missing or damaged file, a hand edit (sha256), an unknown method, a kmax above the
expert count, or a file that does not match the checkpoint's config.json is one
``ServingSettingsError`` naming the file and the value.

``serving_rule(directory, hf_config)`` -> the ``Rule`` a checkpoint is served by, or None for a
checkpoint without a settings file (stock).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

from probmoe.methods import get_method

from .. import model_families, settings_file
from ..settings_file import FILENAME, FORMAT  # noqa: F401 (FORMAT: exported here, tools/bench_serving.py)
from ..settings_file import digest as _digest  # noqa: F401 (the name tools/bench_serving.py uses)

STATE_FILENAME = "probmoe_state.safetensors"

FAMILIES = model_families.SERVED  # the model types the plugin registers (probmoe.integrations.model_families)


class ServingSettingsError(ValueError):
    """A checkpoint's routing settings cannot be served (the message names the file and value)."""


@dataclass(frozen=True)
class Rule:
    """How a checkpoint routes at inference, in vLLM's terms.

    kind: "topk" (the top-k of π(r) + bias, weights π(r): the stock rule when bias is None; the
        bias of the top-k methods is in score units), or the kind of the method's own inference
        rule (``Method.serving``: "range", the ProbMoE methods' MAP, the top clamp(#{r + b > 0},
        kmin, kmax) of r + b, weights π(r), their bias a logit shift; "sparsemixer"; "remoe").
    slots: the width handed to vLLM's FusedMoE (its top_k): k, kmax, or N for ReMoE.
    kmin: the fewest used slots (range; = slots otherwise).
    normalize: renormalise the used weights (the family's norm_topk_prob; Mixtral always).
    bias: layer index -> the selection bias [N] (aux-free balancing) as a list of floats, or None.
    method: the settings file's method; path: the settings file.
    options: the method's own options ({name: value}, ``Method.options``; missing: their defaults).
    scores: the gate scores π ("softmax"; "sigmoid" for DeepSeek-V3).
    ungrouped: served on a family whose stock router groups experts (DeepSeek-V3) by this rule
        instead: vLLM's grouped top-k and its e_score_correction_bias are turned off.
    correction_bias: the selection bias (aux-free balancing) is each layer's
        e_score_correction_bias, read with the weights (DeepSeek-V3; ``bias`` is None then).
    """

    kind: str
    slots: int
    kmin: int
    normalize: bool
    num_experts: int
    method: str
    path: str
    bias: dict | None = None
    options: dict = field(default_factory=dict)
    scores: str = "softmax"
    ungrouped: bool = False
    correction_bias: bool = False

    @property
    def stock(self) -> bool:
        """Served by vLLM's own top-k routing, untouched."""
        return self.kind == "topk" and self.bias is None and not self.ungrouped


def read(directory) -> dict | None:
    """The checked fields of ``directory``'s settings file (``settings_file.read``: ``routing`` a
    ``probmoe.RoutingConfig`` or None, ``options`` the ``RoutingOptions``, ``path`` added), or None if
    there is none."""
    try:
        return settings_file.read(directory)
    except ValueError as e:
        raise ServingSettingsError(str(e)) from e


def _config_value(hf_config, name: str):
    return getattr(hf_config, name, None)


def check_against_config(data: dict, hf_config) -> None:
    """The settings file must describe this checkpoint (config.json's model type, experts, top-k)."""
    path, model_type = data["path"], _config_value(hf_config, "model_type")
    if data["model_type"] != model_type:
        raise ServingSettingsError(
            f"{path}: model_type {data['model_type']!r} does not match config.json's {model_type!r}"
        )
    if model_type not in FAMILIES:
        raise ServingSettingsError(
            f"{path}: model type {model_type!r} has no probmoe serving support (supported: {', '.join(FAMILIES)})"
        )
    field = model_families.TABLE[model_type].experts_attr
    n = _config_value(hf_config, field)
    if data["num_experts"] != n:
        raise ServingSettingsError(f"{path}: num_experts = {data['num_experts']} but config.json has {field} = {n}")
    if data["top_k"] != _config_value(hf_config, "num_experts_per_tok"):
        raise ServingSettingsError(
            f"{path}: top_k = {data['top_k']} but config.json has num_experts_per_tok = "
            f"{_config_value(hf_config, 'num_experts_per_tok')}"
        )


def normalizes(hf_config) -> bool:
    """The family's router renormalises its used weights (Mixtral always; the others by norm_topk_prob)."""
    if model_families.TABLE[hf_config.model_type].always_normalize:
        return True
    return bool(getattr(hf_config, "norm_topk_prob", False))


def _read_bias(directory, path: str, n: int) -> dict:
    """layer index -> bias [N] from ``probmoe_state.safetensors`` (``<...>.layers.L.<...>.probmoe_bias``)."""
    state = os.path.join(os.fspath(directory), STATE_FILENAME)
    if not os.path.isfile(state):
        raise ServingSettingsError(f"{path} says balance 'aux-free', but {state} (the selection bias) is missing")
    from safetensors import safe_open

    out = {}
    try:
        with safe_open(state, framework="pt") as f:
            for key in f.keys():  # noqa: SIM118 (a safe_open is not iterable)
                if not key.endswith(".probmoe_bias"):
                    continue
                parts = key.split(".")
                layer = int(parts[parts.index("layers") + 1])
                values = f.get_tensor(key).float().tolist()
                if len(values) != n or not all(math.isfinite(v) for v in values):
                    raise ServingSettingsError(f"{state}: {key} must hold {n} finite numbers")
                out[layer] = values
    except ServingSettingsError:
        raise
    except Exception as e:  # safetensors' own errors for a damaged file
        raise ServingSettingsError(f"{state} is unreadable ({type(e).__name__}: {e})") from e
    if not out:
        raise ServingSettingsError(f"{path} says balance 'aux-free', but {state} holds no probmoe_bias")
    return out


def _check_scores(path: str, routing, hf_config, normalize: bool) -> None:
    scores = model_families.TABLE[hf_config.model_type].scores
    if routing is not None and (routing.scores != scores or routing.normalize != normalize):
        raise ServingSettingsError(
            f"{path}: routing scores {routing.scores!r} / normalize {routing.normalize} do "
            f"not match the {hf_config.model_type} family's {scores} / normalize {normalize}"
        )


def _grouped_rule(data: dict, hf_config, serving, own: dict) -> Rule:
    """The rule of a checkpoint of a family whose stock router groups experts (DeepSeek-V3: the top
    ``topk_group`` of ``n_group`` groups, sigmoid scores + e_score_correction_bias selecting, the
    weights times routed_scaling_factor). A method whose eval is that router (the top-k methods;
    their aux-free bias is e_score_correction_bias) is served stock; another is served by its own
    rule with the groups and the correction bias turned off, as it was trained and evaluated
    (ProbMoE: the MAP of the sigmoid scores; with aux-free balancing e_score_correction_bias is its
    logit shift); the grouped MAP ("probmoe-grouped") is refused."""
    path, method, n, top_k = data["path"], data["method"], data["num_experts"], data["top_k"]
    routing, balanced = data["routing"], data["options"].balance == "aux-free"
    method_rules = get_method(method)
    if method_rules.stock(False):
        return Rule("topk", top_k, top_k, True, n, method, path)
    if serving is None or routing is None:
        raise ServingSettingsError(
            f"{path}: method {method!r} on model type {hf_config.model_type!r} is not served: its rule "
            "selects within expert groups (n_group, topk_group) by the exact MAP, which vLLM's grouped top-k "
            "does not compute and the plugin has no static-shape form for; evaluate it with transformers"
        )
    normalize = normalizes(hf_config)
    _check_scores(path, routing, hf_config, normalize)
    scores = model_families.TABLE[hf_config.model_type].scores
    return Rule(
        serving.kind,
        serving.slots,
        serving.kmin,
        normalize and serving.normalizes,
        n,
        method,
        path,
        options=own,
        scores=scores,
        ungrouped=True,
        correction_bias=balanced,
    )


def serving_rule(directory, hf_config) -> Rule | None:
    """The rule ``directory``'s checkpoint is served by (None: no settings file, stock)."""
    data = read(directory)
    if data is None:
        return None
    check_against_config(data, hf_config)
    path, method, n, top_k = data["path"], data["method"], data["num_experts"], data["top_k"]
    routing, options = data["routing"], data["options"]
    model_type = hf_config.model_type
    balanced = options.balance == "aux-free"
    method_rules = get_method(method)
    serving = method_rules.serving(routing, top_k, n, balanced)
    own = {name: getattr(options, name) for name in method_rules.options}  # checked by RoutingOptions
    if model_families.TABLE[model_type].grouped:
        return _grouped_rule(data, hf_config, serving, own)
    normalize = normalizes(hf_config)
    bias = _read_bias(directory, path, n) if balanced else None
    if serving is None:
        raise ServingSettingsError(
            f"{path}: routing with a structured constraint ({routing.constraint!r}) is not "
            "served by the plugin (sizes only: exactly k or kmin..kmax)"
        )
    _check_scores(path, routing, hf_config, normalize)
    return Rule(serving.kind, serving.slots, serving.kmin, normalize and serving.normalizes, n, method, path, bias, own)
