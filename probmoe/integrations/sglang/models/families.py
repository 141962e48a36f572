"""SGLang's ``EntryClass`` of the package: for each family of ``probmoe.integrations.sglang.FAMILIES``,
its stock SGLang class (``sglang.srt.models.<MODULES[family]>``), routed by the checkpoint's rule
(``probmoe.integrations.sglang.served``). Imports sglang."""

import importlib

from sglang.srt.layers.moe.topk import TopKOutputFormat

from ...model_families import TABLE
from .. import FAMILIES, MODULES
from ..served import served


def _entry(model_type: str):
    module = importlib.import_module(f"sglang.srt.models.{MODULES[model_type]}")
    return served(getattr(module, TABLE[model_type].architecture), module, TopKOutputFormat.STANDARD)


EntryClass = [_entry(model_type) for model_type in FAMILIES]
