"""The names of the routing methods a model can be patched with (``probmoe.integrations.transformers``)
and which options each takes: the one home that the patch, its settings files, the vLLM plugin and the
commands' options (``routing_options``) import. No library is imported here, so a command can list
them (``--help``) before it imports transformers. What each method does:
``probmoe.integrations.transformers.methods``.
"""

METHODS = (
    "conventional",
    "frozen",
    "densemixer",
    "probmoe",
    "probmoe-dynamic",
    "sample-dense-ste",
    "topk-marginal",
    "defaultmoe",
    "sparsemixer",
    "remoe",
)
GROUPED_METHODS = ("probmoe-grouped",)  # for the grouped families only
ALL_METHODS = METHODS + GROUPED_METHODS
STOCK = ("conventional", "frozen", "densemixer")  # routed by the family's own top-k (DenseMixer: in eval)
BASELINES = ("defaultmoe", "sparsemixer", "remoe")  # the other baselines of the paper's Table 1
TOP_K = STOCK + BASELINES  # methods that take the model's own top-k (no k, kmin, kmax, backend, grad)
RANGE = ("probmoe-dynamic",)  # methods that take kmin and kmax (a range of experts per token)
EXACT_K = tuple(m for m in ALL_METHODS if m not in TOP_K + RANGE)  # methods that take k (exactly k experts)
UNGROUPED = ("sparsemixer", "remoe")  # defined for softmax gates without group limits only
BALANCES = ("aux-free",)  # DeepSeek-V3's auxiliary-loss-free balancing (``balance``)
L1_LAYERS = ("sum", "mean")  # ReMoE's penalty over the layers: λ per layer (official code), λ/L (the paper)
