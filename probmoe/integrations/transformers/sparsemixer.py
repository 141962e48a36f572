"""SparseMixer v2's weights: aliases kept where these names were imported; the method (and the
references to the official code) is ``probmoe.methods.sparsemixer``."""

from probmoe.methods.sparsemixer import JITTER_EPS, sparsemixer_weights

__all__ = ["JITTER_EPS", "sparsemixer_weights"]
