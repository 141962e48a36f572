""" "frozen": the stock top-k routing with the router weights frozen."""

from __future__ import annotations

from .registry import register_method
from .topk import TopK


class Frozen(TopK):
    name = "frozen"
    summary = "stock top-k routing, router weights frozen"
    trains_router = False


register_method(Frozen())
