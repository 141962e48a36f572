""" "conventional": the stock top-k routing, in training and eval."""

from __future__ import annotations

from .registry import register_method
from .topk import TopK


class Conventional(TopK):
    name = "conventional"
    summary = "stock top-k routing (training and eval)"


register_method(Conventional())
