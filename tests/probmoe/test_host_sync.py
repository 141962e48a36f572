"""Routing never waits for the GPU: no host synchronisation under
``torch.cuda.set_sync_debug_mode("error")`` (an ``.item()``, a data-dependent shape or a host
copy would raise), with the value checks on (assertions in the graph, ``circuits.checks.in_graph``)
or off: a training route forward and backward, an inference route, and a whole training step of a
small MoE layer with AdamW. CUDA only: on the CPU there is nothing to wait for (tools/gpu/check.sh
runs these with --device cuda; tests/probmoe/test_checks_in_graph.py proves the checks' branch on
the CPU)."""

import pytest
import torch
from host_sync import no_host_synchronisation

import circuits
import probmoe

CASES = {
    "exactly 8 of 64": dict(k=8),
    "range 4..8 of 64": dict(kmin=4, kmax=8),
    "group-limited 8 of 64": dict(constraint=circuits.GroupLimited(64, 8, groups=8, max_groups=4)),
}


def needs_cuda(device):
    if device.type != "cuda":
        pytest.skip("host synchronisation is observable on CUDA only")


@pytest.mark.parametrize("validate", [False, True], ids=["unchecked", "checked"])
@pytest.mark.parametrize("backend", ["circuit", "dp"])
@pytest.mark.parametrize("case", CASES, ids=str)
def test_training_route_has_no_host_synchronisation(case, backend, validate, device):
    needs_cuda(device)
    r = torch.randn(4096, 64, device=device, requires_grad=True)  # [T, N]
    c = torch.randn(4096, 8, device=device)  # [T, kmax]

    def step():
        out = probmoe.route(r, **CASES[case], training=True, backend=backend, validate_args=validate)
        (out.weights * c).sum().backward()

    step()  # compiles the circuit, builds the kernels
    with no_host_synchronisation():
        step()
    assert r.grad is not None and bool(r.grad.abs().sum() > 0)


@pytest.mark.parametrize("validate", [False, True], ids=["unchecked", "checked"])
@pytest.mark.parametrize("backend", ["circuit", "dp"])
@pytest.mark.parametrize("case", CASES, ids=str)
def test_inference_route_has_no_host_synchronisation(case, backend, validate, device):
    needs_cuda(device)
    r = torch.randn(4096, 64, device=device)  # [T, N]

    def route():
        return probmoe.route(r, **CASES[case], training=False, backend=backend, validate_args=validate)

    want = route()  # compiles the circuit, builds the kernels
    with no_host_synchronisation():
        got = route()
    assert torch.equal(got.indices, want.indices)


@pytest.mark.parametrize("backend", ["circuit", "dp"])
def test_training_step_has_no_host_synchronisation(backend, device):
    """A whole step of a small MoE layer, validation on (torch's default): a ``ProbMoERouter`` with
    its own generator, the experts weighted densely by the routing (no data-dependent shapes), the
    loss, backward and AdamW's step."""
    if device.type != "cuda":
        pytest.skip("host synchronisation is observable on CUDA only")
    torch.manual_seed(0)
    d, n, t = 64, 64, 2048
    generator = torch.Generator(device).manual_seed(0)
    router = probmoe.ProbMoERouter(d, n, k=8, backend=backend, generator=generator, device=device)
    experts = torch.nn.Parameter(torch.randn(n, d, d, device=device) / d**0.5)  # [N, D, D]
    opt = torch.optim.AdamW([router.weight, experts], lr=1e-3)
    x, y = torch.randn(t, d, device=device), torch.randn(t, d, device=device)  # [T, D]

    def step():
        opt.zero_grad()
        _, weights, indices = router(x)  # [T, k] each
        gates = torch.zeros(t, n, device=device).scatter(1, indices, weights)  # [T, N]
        out = torch.einsum("tn,ndf,td->tf", gates, experts, x)  # [T, D]
        torch.nn.functional.mse_loss(out, y).backward()
        opt.step()

    step()  # compiles the circuit, builds the kernels, makes AdamW's state
    before = router.weight.detach().clone()
    with no_host_synchronisation():
        step()
    assert not torch.equal(router.weight.detach(), before)
