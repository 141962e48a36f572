"""SGLang's ``EntryClass`` of the package: for each family of ``probmoe.integrations.sglang.FAMILIES``,
its stock SGLang class (``sglang.srt.models.<MODULES[family]>``), routed by the checkpoint's rule
(``probmoe.integrations.sglang.served``), under its stock name and its probmoe one
(``ProbMoEOlmoeForCausalLM``: a checkpoint whose rule stock engines cannot run). Imports sglang."""

import importlib

from sglang.srt.layers.moe.topk import TopKOutputFormat

from ...architectures import probmoe_name
from ...model_families import TABLE
from .. import FAMILIES, MODULES
from ..served import served


def _entry(model_type: str):
    module = importlib.import_module(f"sglang.srt.models.{MODULES[model_type]}")
    return served(getattr(module, TABLE[model_type].architecture), module, TopKOutputFormat.STANDARD)


def _renamed(cls):
    """``cls`` under its probmoe architecture name (``probmoe.integrations.architectures``: the name a
    checkpoint carries when stock engines cannot run its rule), which SGLang looks classes up by."""
    name = probmoe_name(cls.__name__)
    return type(name, (cls,), {"__qualname__": name, "__doc__": cls.__doc__})


_STOCK = [_entry(model_type) for model_type in FAMILIES]
EntryClass = _STOCK + [_renamed(cls) for cls in _STOCK]
