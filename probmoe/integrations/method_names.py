"""The names of the built-in routing methods, grouped as the docs and tools list them: aliases kept
for the code and docs that import them, each derived from the registry (``probmoe.methods``), which
is the one home of what a method is and takes. Code that routes asks the method object
(``probmoe.methods.get_method``); these tuples do not see a method registered later.
"""

from probmoe.methods import get_method, methods
from probmoe.methods.balance import BALANCES  # noqa: F401 (exported here)
from probmoe.methods.remoe import L1_LAYERS  # noqa: F401 (exported here)

_BUILT_IN = [get_method(name) for name in methods()]
METHODS = tuple(m.name for m in _BUILT_IN if m.groups != "only")
GROUPED_METHODS = tuple(m.name for m in _BUILT_IN if m.groups == "only")  # for the grouped families only
ALL_METHODS = METHODS + GROUPED_METHODS
STOCK = tuple(m.name for m in _BUILT_IN if m.sizes == "top-k" and m.stock(False) and not m.experts)
BASELINES = tuple(m.name for m in _BUILT_IN if m.sizes == "top-k" and m.name not in STOCK)  # Table 1's others
TOP_K = STOCK + BASELINES  # methods that take the model's own top-k (no k, kmin, kmax, backend, grad)
RANGE = tuple(m.name for m in _BUILT_IN if m.sizes == "range")  # methods that take kmin and kmax
EXACT_K = tuple(m.name for m in _BUILT_IN if m.sizes == "exact-k")  # methods that take k (exactly k experts)
UNGROUPED = tuple(m.name for m in _BUILT_IN if m.groups == "never")  # softmax gates without group limits only
