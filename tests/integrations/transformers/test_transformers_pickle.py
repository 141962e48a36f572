"""pickle, torch.save / torch.load(weights_only=False) and copy.deepcopy of a patched model give
back the patched model: same classes, plan and generator, the same draws in training and the same
logits in eval; and transformers' capture hooks come back on the next forward."""

import copy
import io
import pickle

import pytest
import torch

pytest.importorskip("transformers", minversion="5.0")

import probmoe.integrations.transformers as pt
from probmoe.integrations.transformers.testing import tiny_model


def via_pickle(model):
    return pickle.loads(pickle.dumps(model))


def via_torch_save(model):
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=False)


COPIES = {"pickle": via_pickle, "torch.save": via_torch_save, "deepcopy": copy.deepcopy}
X = torch.randint(3, 256, (2, 10), generator=torch.Generator().manual_seed(0))


def step(model):
    """One training forward + backward (so the model carries hooks, a routing graph and a last record)."""
    model.train()
    out = model(X, labels=X, output_router_logits=True)
    out.loss.backward()
    return out.loss.detach()


CASES = [("olmoe", "probmoe", how) for how in COPIES] + [
    ("qwen3_moe", "probmoe-dynamic", "pickle"),
    ("mixtral", "densemixer", "torch.save"),
    ("deepseek_v3", "probmoe-grouped", "deepcopy"),
]


@pytest.mark.parametrize("family,method,how", CASES)
def test_copy_keeps_the_routing(family, method, how):
    model = pt.patch_model(
        tiny_model(family), method, aux_loss=0.01, z_loss=0.001, generator=torch.Generator().manual_seed(3)
    )
    step(model)
    copied = COPIES[how](model)
    assert type(copied) is type(model) and pt.is_patched(copied)
    assert [type(m) for m in copied.modules()] == [type(m) for m in model.modules()]  # patched gates, experts
    assert copied.probmoe_plan == model.probmoe_plan
    gates = [b.gate for b in copied.probmoe_family.blocks(copied)]
    assert all(g.probmoe_generator is copied.probmoe_generator for g in gates)  # still one shared generator
    assert all(g.probmoe_last is None for g in gates) and copied.probmoe_last_z_loss is None
    assert copied.probmoe_generator.get_state().equal(model.probmoe_generator.get_state())
    torch.manual_seed(5)
    want = step(model)
    torch.manual_seed(5)
    got = step(copied)  # same generator state: the same subsets, the same loss (aux loss included)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert copied.probmoe_last_z_loss is not None  # router logits captured again after the copy
    with torch.no_grad():
        torch.testing.assert_close(copied.eval()(X).logits, model.eval()(X).logits, rtol=0, atol=0)
    assert pt.unpatch_model(copied) is copied and not pt.is_patched(copied)


def test_stock_model_copies_stay_stock():
    model = tiny_model("olmoe")
    model(X, output_router_logits=True)
    copied = copy.deepcopy(model)
    assert type(copied) is type(model) and not pt.is_patched(copied)


def test_unpatching_a_wrapped_model_is_a_clear_error():
    model = pt.patch_model(tiny_model("olmoe"), "probmoe")

    class FSDPModule:  # fully_shard swaps in a class FSDP<name>(FSDPModule, <the model's class>)
        pass

    model.__class__ = type("FSDPOlmoeForCausalLM", (FSDPModule, type(model)), {})
    with pytest.raises(ValueError, match="class FSDPOlmoeForCausalLM was changed after patch_model"):
        pt.unpatch_model(model)
