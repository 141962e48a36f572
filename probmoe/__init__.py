"""probmoe: differentiable probabilistic routing for Mixture-of-Experts.

RoutingConfig (sizes or a structured constraint, estimator, algorithm, gradient convention, gate
    scores; validated once)
SubsetDistribution (P(S) ∝ exp(Σ_{i∈S} r_i), |S| = k or kmin..kmax, or S allowed by any compiled
    circuit such as circuits.GroupLimited; algorithms "circuit", "dp")
    -> route (straight-through training weights, MAP at eval) -> ProbMoERouter (nn.Module)
"""

from circuits import map_mask, map_size  # the MAP of a size range, in closed form

from .config import ALGORITHMS, BACKENDS, ESTIMATORS, GRADS, METHODS, SCORES, RoutingConfig
from .distribution import SubsetDistribution, Subsets
from .route import Routing, route
from .router import ProbMoERouter

__all__ = [
    "ALGORITHMS",
    "BACKENDS",
    "ESTIMATORS",
    "GRADS",
    "METHODS",
    "SCORES",
    "ProbMoERouter",
    "Routing",
    "RoutingConfig",
    "SubsetDistribution",
    "Subsets",
    "map_mask",
    "map_size",
    "route",
]
