"""The names of the routing methods a model can be patched with (``probmoe.integrations.transformers``),
the one home the patch, its settings files and the commands' options
(``probmoe.experiments.run_config``) import: no library is imported here, so a command can list
them (``--help``) before it imports transformers. What each
method does: ``probmoe.integrations.transformers.methods``.
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
