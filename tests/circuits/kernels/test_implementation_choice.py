"""``circuits.implementation``: a user picks the kernel implementation (torch, C, Triton) for a
block of code, for debugging and benchmarking (issue 47, point 2); the results are the same."""

from __future__ import annotations

import pytest
import torch

import circuits
import probmoe
from circuits.kernels import c_dp, torch_dp
from circuits.kernels.c_passes import CPasses
from circuits.kernels.lattice import Lattice
from circuits.kernels.library import library
from circuits.kernels.select import chosen, select
from circuits.kernels.torch_passes import TorchPasses

needs_c = pytest.mark.skipif(library() is None, reason="the C library is not built here")


@needs_c
def test_the_block_decides_what_select_picks():
    lattice = Lattice(16, 2, 4, torch.device("cpu"))
    assert isinstance(select(lattice, torch.float32), c_dp.CDP)
    with circuits.implementation("torch"):
        assert chosen() == "torch"
        assert type(select(lattice, torch.float32)) is torch_dp.TorchDP
        with circuits.implementation(None):  # nested: back to select's own pick
            assert isinstance(select(lattice, torch.float32), c_dp.CDP)
    assert chosen() is None
    circuit = circuits.engine(circuits.ExactlyK(10, 3), algorithm="circuit")
    assert isinstance(circuit.kernels(torch.float32), CPasses)
    with circuits.implementation("torch"):
        assert isinstance(circuit.kernels(torch.float32), TorchPasses)
    assert isinstance(circuit.kernels(torch.float32), CPasses)  # the circuit's own pick is kept


@needs_c
@pytest.mark.parametrize("algorithm", ["dp", "circuit"])
def test_routes_agree_across_implementations(algorithm):
    r = torch.randn(64, 12, generator=torch.Generator().manual_seed(0), requires_grad=True)
    c = torch.randn(64, 4, generator=torch.Generator().manual_seed(1))
    out = {}
    for name in ("torch", "c"):
        with circuits.implementation(name):
            g = torch.Generator().manual_seed(5)
            routing = probmoe.route(r, kmin=2, kmax=4, training=True, algorithm=algorithm, generator=g)
            (grad,) = torch.autograd.grad((routing.weights * c).sum(), r)
        out[name] = routing, grad
    (a, ga), (b, gb) = out["torch"], out["c"]
    assert torch.equal(a.indices, b.indices) and torch.equal(a.mask, b.mask)  # the same draws
    torch.testing.assert_close(a.weights, b.weights, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(ga, gb, rtol=1e-4, atol=1e-6)


def test_bad_names_and_impossible_picks_are_clear_errors():
    bad = "implementation must be None or one of 'torch', 'c', 'triton', got 'cuda'"
    with pytest.raises(ValueError, match=bad), circuits.implementation("cuda"):
        pass
    r = torch.randn(8, 6, dtype=torch.float64)
    with circuits.implementation("c"), pytest.raises(ValueError, match="the c passes take float32 logits"):
        probmoe.route(r, k=2, training=True, algorithm="dp")
