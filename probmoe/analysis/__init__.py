"""Routing analyses of the ProbMoE paper: per-layer statistics (``metrics``) and their figures (``plots``).

``metrics`` needs only torch; ``plots`` imports matplotlib when it draws.
"""

from .metrics import (
    assignment_entropy,
    assignment_top_mass,
    cardinality,
    expert_load,
    experts_to_cover,
    frequency_ranked,
    frequency_vs_active,
    layer_summary,
    load_cv,
    max_vio,
    normalized_entropy,
    token_ranking,
    token_top_mass,
)
from .plots import plot_all, plot_cardinality, plot_concentration, plot_coverage, plot_frequency, plot_load

__all__ = [
    "assignment_entropy",
    "assignment_top_mass",
    "cardinality",
    "expert_load",
    "experts_to_cover",
    "frequency_ranked",
    "frequency_vs_active",
    "layer_summary",
    "load_cv",
    "max_vio",
    "normalized_entropy",
    "plot_all",
    "plot_cardinality",
    "plot_concentration",
    "plot_coverage",
    "plot_frequency",
    "plot_load",
    "token_ranking",
    "token_top_mass",
]
