"""The registry of routing methods: ``register_method``, ``get_method``, ``methods``.

The one place a method's name is looked up. The built-in methods register themselves when
``probmoe.methods`` is imported; a new method registers an instance of its ``Method`` subclass
(a test can register one and ``unregister_method`` it afterwards).
"""

from __future__ import annotations

from .base import EXPERTS, GROUPS, SIZES, Method

_METHODS: dict[str, Method] = {}


def register_method(method: Method, *, replace: bool = False) -> Method:
    """Add ``method`` (an instance of a ``Method`` subclass) under ``method.name``; ValueError for a
    name already taken (unless ``replace``) or a declaration out of range. Returns ``method``."""
    if not isinstance(method, Method):
        raise ValueError(f"method must be an instance of probmoe.methods.Method, got {type(method).__name__}")
    name = method.name
    if not isinstance(name, str) or not name or name != name.strip() or name.lower() != name:
        raise ValueError(f"method.name must be a non-empty lower-case string without spaces, got {name!r}")
    if name in _METHODS and not replace:
        raise ValueError(f"a routing method {name!r} is registered already (pass replace=True to replace it)")
    for what, value, allowed in (
        ("sizes", method.sizes, SIZES),
        ("groups", method.groups, GROUPS),
        ("experts", method.experts, EXPERTS),
    ):
        if value not in allowed:
            raise ValueError(f"method {name!r}: {what} must be one of {allowed}, got {value!r}")
    if (method.estimator is None) != (method.sizes == "top-k"):
        raise ValueError(
            f"method {name!r}: a method that takes k or kmin..kmax is routed by probmoe.route (give its "
            f"estimator); a top-k method has none (sizes {method.sizes!r}, estimator {method.estimator!r})"
        )
    _METHODS[name] = method
    return method


def unregister_method(name: str) -> None:
    """Remove the method ``name`` (KeyError-free: ValueError naming the registered ones)."""
    get_method(name)
    del _METHODS[name]


def get_method(name) -> Method:
    """The registered method ``name``; ValueError naming the registered ones otherwise."""
    method = _METHODS.get(name) if isinstance(name, str) else None
    if method is None:
        raise ValueError(f"method must be one of {', '.join(repr(m) for m in _METHODS)}; got {name!r}")
    return method


def methods() -> tuple[str, ...]:
    """The registered methods' names, in registration order."""
    return tuple(_METHODS)
