"""Pickling of patched modules: ``pickle``, ``torch.save`` / ``torch.load(weights_only=False)``
and ``copy.deepcopy`` give back the patched model, routing and all.

A patched module's class is made at run time (``gate_class``, ``experts_class``,
``model_class``), so pickle cannot save it by name: the top-level model's class even carries the
stock class's name and module (for config.json's ``architectures``), which pickle would resolve
to the stock class. Each patched class therefore reduces to its factory (a module-level
function, saved by name) and the stock class it was made from, and unpickling calls the factory
again. Transformers' output-capturing hooks (installed by the first forward that outputs router
logits; local functions, which pickle cannot save, so a stock model cannot be pickled after such
a forward either) are removed first and the model marked unhooked: the next forward that
captures outputs, of the original or of the copy, installs them again. What a forward left
behind (the routers' last ``GateRecord``, which holds the autograd graph of that forward, and
the last aux losses) is not copied: it is None in the copy until its first forward.
"""

from __future__ import annotations

CAPTURE_MODULE = "transformers.utils.output_capturing"  # where transformers' capturing hooks are defined


def drop_capture_hooks(model) -> None:
    """Remove transformers' output-capturing forward hooks from ``model`` and mark it unhooked."""
    removed = 0
    for module in model.modules():
        for key, hook in list(module._forward_hooks.items()):
            if getattr(hook, "__module__", None) == CAPTURE_MODULE and "<locals>" in getattr(hook, "__qualname__", ""):
                del module._forward_hooks[key]
                module._forward_hooks_with_kwargs.pop(key, None)
                module._forward_hooks_always_called.pop(key, None)
                removed += 1
    if removed:
        for module in model.modules():
            if module.__dict__.get("_output_capturing_hooks_installed"):
                module._output_capturing_hooks_installed = False


def new(factory, *key):
    """An uninitialised instance of ``factory(*key)`` (pickle then restores its ``__dict__``)."""
    cls = factory(*key)
    return cls.__new__(cls)


def stock_class(obj, mixin: type) -> type:
    """The class ``obj``'s run-time class was made from: the first in its MRO that is no ``mixin``."""
    return next(c for c in type(obj).__mro__[1:] if not issubclass(c, mixin))


def reduce(obj, factory, key: tuple, transient: tuple[str, ...]):
    """``obj.__reduce_ex__`` for a run-time class ``factory(*key)``; the ``transient`` attributes
    are saved as None."""
    state = obj.__getstate__()
    state = {name: (None if name in transient else value) for name, value in state.items()}
    return new, (factory, *key), state
