"""torch.compile of a patched model (where the stock model compiles).

Slow (10-40 s a case on 2 cores: dynamo traces the whole model); run with ``-m slow``. The
aot_eager backend checks tracing and autograd without inductor's C++ build; one test runs inductor.
"""

import pytest
import torch

pytest.importorskip("transformers", minversion="5.0")

import probmoe.integrations.transformers as pt
from probmoe.integrations.transformers.testing import tiny_model

pytestmark = pytest.mark.slow


def batch(seed=0):
    return torch.randint(3, 256, (2, 8), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("method", ["probmoe", "densemixer", "probmoe-dynamic"])
def test_compiled_equals_eager(method):
    torch._dynamo.reset()
    model = pt.patch_model(tiny_model("qwen3_moe"), method)
    twin = pt.patch_model(tiny_model("qwen3_moe"), method)
    compiled = torch.compile(model, backend="aot_eager")
    x = batch()
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(compiled(x).logits, model(x).logits, atol=1e-5, rtol=0)
    model.train()
    torch.manual_seed(0)
    out = compiled(x, labels=x, output_router_logits=True)
    torch.manual_seed(0)
    want = model(x, labels=x, output_router_logits=True)
    torch.testing.assert_close(out.loss, want.loss, atol=1e-5, rtol=0)
    out.loss.backward()
    if method != "densemixer":  # with the routers' own generator
        for m in (model, twin):
            pt.unpatch_model(m)
        pt.patch_model(model, method, generator=torch.Generator().manual_seed(3))
        pt.patch_model(twin, method, generator=torch.Generator().manual_seed(3))
        torch._dynamo.reset()
        compiled = torch.compile(model, backend="aot_eager")
        torch.testing.assert_close(compiled(x, labels=x).loss, twin.train()(x, labels=x).loss, atol=1e-5, rtol=0)
        model.zero_grad()
        compiled(x, labels=x).loss.backward()
    assert all(b.gate.weight.grad.abs().sum() > 0 for b in model.probmoe_family.blocks(model))


@pytest.mark.parametrize("method", ["conventional", "probmoe", "probmoe-dynamic"])
def test_inductor_training_step_equals_eager(method, device):
    """The default backend (inductor: C++ on the CPU, Triton on CUDA): loss and router gradients of
    one training step equal the eager model's, with the same draws from the routers' generator (a
    generator object is a graph break: fullgraph=True is the global RNG's, test_ops_compile.py)."""
    torch._dynamo.reset()
    model, twin = tiny_model("olmoe").to(device).train(), tiny_model("olmoe").to(device).train()
    if method != "conventional":
        pt.patch_model(model, method, generator=torch.Generator(device).manual_seed(1))
        pt.patch_model(twin, method, generator=torch.Generator(device).manual_seed(1))
    x = batch(1).to(device)
    out = torch.compile(model)(x, labels=x)
    want = twin(x, labels=x)
    torch.testing.assert_close(out.loss, want.loss, atol=1e-5, rtol=0)
    out.loss.backward()
    want.loss.backward()
    for got, ref in zip(model.model.layers, twin.model.layers):
        assert got.mlp.gate.weight.grad.abs().sum() > 0
        torch.testing.assert_close(got.mlp.gate.weight.grad, ref.mlp.gate.weight.grad, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("method", ["defaultmoe", "sparsemixer", "remoe"])
def test_baselines_compile_with_fullgraph(method):
    """The paper's other baselines trace into one graph (``fullgraph=True``: any graph break is an
    error): training loss and router gradients, with the global RNG's draws, and eval logits equal
    the eager model's."""
    torch._dynamo.reset()
    model = pt.patch_model(tiny_model("qwen3_moe"), method)
    twin = pt.patch_model(tiny_model("qwen3_moe"), method)
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    x = batch()
    model.train(), twin.train()
    torch.manual_seed(0)
    out = compiled(x, labels=x)
    torch.manual_seed(0)
    want = twin(x, labels=x)
    torch.testing.assert_close(out.loss, want.loss, atol=1e-6, rtol=0)
    out.loss.backward()
    want.loss.backward()
    for got, ref in zip(model.model.layers, twin.model.layers):
        assert got.mlp.gate.weight.grad.abs().sum() > 0 or method == "sparsemixer"
        torch.testing.assert_close(got.mlp.gate.weight.grad, ref.mlp.gate.weight.grad, atol=1e-6, rtol=1e-5)
    model.eval(), twin.eval()
    with torch.no_grad():
        torch.testing.assert_close(compiled(x).logits, twin(x).logits, atol=1e-6, rtol=0)
