"""The old words of the routing options, read as aliases of the new ones (issue 47: one word per
concept): ``method`` for the training **estimator** ("probmoe", "topk-marginal",
"sample-dense-ste") and ``backend`` for the exact **algorithm** ("circuit", "dp"). (The kernel
**implementation**, torch, C or Triton, is picked in ``circuits.kernels.select``.) "method" is kept
for what it names elsewhere: a routing method (``probmoe.methods``).

A keyword given in its old word works as the new one, with a ``DeprecationWarning``; both at once
is a ValueError. Files read from disk (settings files, ``RoutingConfig.from_dict``) take the old
keys silently: a checkpoint cannot be asked to change.
"""

from __future__ import annotations

import sys
import warnings

RENAMED = {"method": "estimator", "backend": "algorithm"}  # old word -> new word


def new_words(new: dict, old: dict) -> tuple[dict, dict]:
    """(``new`` with the values ``old`` gives in the old words, {new word: the word the caller used}):
    ``new`` is {new word: value or None}, ``old`` {old word: value or None} (``**kwargs``).
    TypeError for a keyword that is neither (as Python's own), ValueError for a value given in both
    words; a DeprecationWarning per old word given, attributed to the first caller outside probmoe."""
    unknown = sorted(set(old) - set(RENAMED))
    if unknown:
        raise TypeError(f"got an unexpected keyword argument {unknown[0]!r}")
    words, names = dict(new), {word: word for word in new}
    for word, value in old.items():
        if value is None:
            continue
        to = RENAMED[word]
        if words.get(to) is not None:
            raise ValueError(f"give {to}= only ({word}= is its old name), not both")
        if not _compiling():  # dynamo traces neither the frame walk nor the warning
            warnings.warn(f"{word}= is deprecated, use {to}=", DeprecationWarning, stacklevel=_outside())
        words[to], names[to] = value, word
    return words, names


def _compiling() -> bool:
    """Whether torch.compile is tracing this call (the old words then pass without a warning)."""
    import torch

    return torch.compiler.is_compiling()


def _outside() -> int:
    """The stacklevel of the first frame outside probmoe, for a warning issued by ``new_words``."""
    frame, level = sys._getframe(2), 2  # new_words' caller
    while frame is not None and frame.f_globals.get("__name__", "").split(".")[0] == "probmoe":
        frame, level = frame.f_back, level + 1
    return level


def quietly(make, data: dict):
    """``make(**data)`` for a dict read from disk, its old keys taken without a warning (the names
    in its errors are the file's); ValueError if both words of a concept are there."""
    both = [word for word in RENAMED if word in data and RENAMED[word] in data]
    if both:
        raise ValueError(f"{both[0]!r} is the old name of {RENAMED[both[0]]!r}: give one of them, not both")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return make(**data)


def deprecated_attribute(old: str):
    """A read-only property ``old`` returning the new word's attribute, with a DeprecationWarning."""
    new = RENAMED[old]

    def get(self):
        if not _compiling():
            warnings.warn(f"{type(self).__name__}.{old} is deprecated, use .{new}", DeprecationWarning, stacklevel=2)
        return getattr(self, new)

    return property(get, doc=f"Deprecated alias of ``{new}``.")
