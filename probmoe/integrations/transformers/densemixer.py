"""DenseMixer's weights as router output: an alias kept where this name was imported; the method
is ``probmoe.methods.densemixer``."""

from probmoe.methods.densemixer import densemixer_weights

__all__ = ["densemixer_weights"]
