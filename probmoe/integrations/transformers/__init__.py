"""ProbMoE and the paper's baselines as a drop-in router for transformers 5.x MoE models.

    model = transformers.AutoModelForCausalLM.from_pretrained(...)     # olmoe, qwen2_moe, qwen3_moe, mixtral
    patch_model(model, "probmoe")                                       # in place; returns the model
    model.save_pretrained(path)          # stock checkpoint + probmoe_routing.json
    model = from_pretrained(path)        # transformers' loader, then the same routing
    unpatch_model(model)                 # stock routing again, bit for bit

An optional extra (transformers 5.x); ``import probmoe`` does not import transformers, this
package does. See docs/transformers.md.
"""

import transformers as _transformers

if int(_transformers.__version__.split(".")[0]) != 5:
    raise ImportError(f"probmoe.integrations.transformers needs transformers 5.x, found {_transformers.__version__}; "
                      "install probmoe[transformers]")

from .families import SUPPORTED  # noqa: E402
from .gate import GateRecord, densemixer_weights  # noqa: E402
from .losses import load_balancing_loss, router_z_loss  # noqa: E402
from .methods import METHODS, Plan  # noqa: E402
from .patch import from_pretrained, is_patched, patch_model, router_stats, unpatch_model  # noqa: E402
from .settings import FILENAME as SETTINGS_FILENAME  # noqa: E402

__all__ = [
    "METHODS",
    "SETTINGS_FILENAME",
    "SUPPORTED",
    "GateRecord",
    "Plan",
    "densemixer_weights",
    "from_pretrained",
    "is_patched",
    "load_balancing_loss",
    "patch_model",
    "router_stats",
    "router_z_loss",
    "unpatch_model",
]
