"""DefaultMoE's router output and default-output update: aliases kept where these names were
imported; the method is ``probmoe.methods.defaultmoe``."""

from probmoe.methods.defaultmoe import BETA, defaultmoe_weights, update_defaults

__all__ = ["BETA", "defaultmoe_weights", "update_defaults"]
