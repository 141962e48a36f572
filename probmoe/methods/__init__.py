"""The routing methods, each one registered object (``Method``), framework-free (torch only).

    from probmoe.methods import get_method, methods, register_method, Method

    methods()                         # ('conventional', 'frozen', 'densemixer', 'probmoe', ...)
    m = get_method("remoe")           # its options, sizes, rules, experts, state and control
    m.infer_rule(logits, Gate(top_k=2, num_experts=8))

Each built-in method is one module here: ``conventional``, ``frozen`` (the stock top-k,
``topk``), ``densemixer``, ``probmoe`` (the ProbMoE methods: ``probmoe``, ``probmoe-dynamic``,
``sample-dense-ste``, ``topk-marginal``, ``probmoe-grouped``), ``defaultmoe``, ``sparsemixer``,
``remoe``; ``balance`` is the aux-free selection bias every method but SparseMixer and ReMoE takes.
The integrations (transformers, vLLM, torchtitan, Megatron) call the method's rules; no code
outside this package compares method names. How to add one: docs/methods.md.
"""

# The built-in methods register in this order (the order listings and docs show): not sorted.
# ruff: noqa: I001
from .base import Gate, Method, Routed, Serving
from .registry import get_method, methods, register_method, unregister_method
from . import conventional, frozen, densemixer, probmoe, defaultmoe, sparsemixer, remoe  # noqa: F401

register_method(probmoe.GROUPED)  # the grouped families' own, listed last

__all__ = ["Gate", "Method", "Routed", "Serving", "get_method", "methods", "register_method", "unregister_method"]
