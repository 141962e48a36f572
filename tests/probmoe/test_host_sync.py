"""A training route, forward and backward, never waits for the GPU: no host synchronisation under
``torch.cuda.set_sync_debug_mode("error")`` (an ``.item()``, a data-dependent shape or a host
copy would raise), with the value checks on (asynchronous assertions) or off. CUDA only: on the CPU there is nothing to wait for (tools/gpu/check.sh runs
it with --device cuda)."""

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


@pytest.mark.parametrize("validate", [False, True], ids=["unchecked", "checked"])
@pytest.mark.parametrize("backend", ["circuit", "dp"])
@pytest.mark.parametrize("case", CASES, ids=str)
def test_training_route_has_no_host_synchronisation(case, backend, validate, device):
    if device.type != "cuda":
        pytest.skip("host synchronisation is observable on CUDA only")
    if backend == "dp" and "constraint" in CASES[case]:
        pytest.skip("a structured constraint takes the circuit backend only")
    r = torch.randn(4096, 64, device=device, requires_grad=True)  # [T, N]
    c = torch.randn(4096, 8, device=device)  # [T, kmax]

    def step():
        out = probmoe.route(r, **CASES[case], training=True, backend=backend, validate_args=validate)
        (out.weights * c).sum().backward()

    step()  # compiles the circuit, builds the kernels
    with no_host_synchronisation():
        step()
    assert r.grad is not None and bool(r.grad.abs().sum() > 0)
