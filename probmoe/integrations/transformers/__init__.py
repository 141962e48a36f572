"""ProbMoE and the paper's baselines as a drop-in router for transformers 5.x MoE models.

    model = transformers.AutoModelForCausalLM.from_pretrained(...)     # olmoe, qwen2_moe, qwen3_moe, mixtral, flex_olmo,
    patch_model(model, "probmoe")                                       # deepseek_v3; in place; returns the model
    model.save_pretrained(path)          # stock checkpoint + probmoe_routing.json
    model = from_pretrained(path)        # transformers' loader, then the same routing
    unpatch_model(model)                 # stock routing again, bit for bit

``SUPPORTED`` families (olmoe, qwen2_moe, qwen3_moe, mixtral, flex_olmo) take every method of ``METHODS``;
``GROUPED_FAMILIES`` (deepseek_v3) take those and ``GROUPED_METHODS`` ("probmoe-grouped").
An optional extra (transformers>=5.23,<6, checked at import: ``version``); ``import probmoe`` does
not import transformers, this package does. For the Hugging Face trainers,
``callback.RoutingStatsCallback`` puts routing statistics into their logs; ``weights_file``
checks safetensors files before they are loaded; a patched model resumes under ``Trainer`` with
its experts and routing state (``resume``, ``trainer_resume``). See docs/transformers.md and docs/constraints.md.
"""

import transformers as _transformers

from . import version as _version

_version.check(_transformers.__version__)

from ..routing_options import RoutingOptions  # noqa: E402
from .densemixer import densemixer_weights  # noqa: E402
from .families import ALL as ALL_FAMILIES  # noqa: E402
from .families import GROUPED as GROUPED_FAMILIES  # noqa: E402
from .families import SUPPORTED, LayoutError  # noqa: E402
from .gate import GateRecord  # noqa: E402
from .losses import load_balancing_loss, router_z_loss  # noqa: E402
from .methods import ALL_METHODS, GROUPED_METHODS, METHODS, Plan  # noqa: E402
from .patch import from_pretrained, is_patched, patch_model, router_stats, unpatch_model  # noqa: E402
from .settings import FILENAME as SETTINGS_FILENAME  # noqa: E402
from .trainer_resume import install_if_imported as _install_trainer_resume  # noqa: E402
from .weights_file import DamagedWeightsError, check_weights_files  # noqa: E402

_install_trainer_resume()  # Trainer resume restores the routing state (trainer_resume)

__all__ = [
    "ALL_FAMILIES",
    "ALL_METHODS",
    "GROUPED_FAMILIES",
    "GROUPED_METHODS",
    "METHODS",
    "SETTINGS_FILENAME",
    "SUPPORTED",
    "DamagedWeightsError",
    "GateRecord",
    "LayoutError",
    "Plan",
    "RoutingOptions",
    "check_weights_files",
    "densemixer_weights",
    "from_pretrained",
    "is_patched",
    "load_balancing_loss",
    "patch_model",
    "router_stats",
    "router_z_loss",
    "unpatch_model",
]
