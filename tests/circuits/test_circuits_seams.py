"""The engine's seams: passes picked once per (circuit, dtype); the autograd contract on its own;
the exactly-k shift at any k (the C pass keeps its column on the heap)."""

import concurrent.futures

import pytest
import torch
from brute import exact, masks

import circuits
import circuits.kernels.select
from circuits.kernels import library
from circuits.kernels import rows as select
from circuits.kernels.c_passes import CPasses
from circuits.kernels.program import Program
from circuits.kernels.rows import Rows
from circuits.kernels.torch_passes import TorchPasses


def test_passes_are_picked_once_per_dtype(monkeypatch):
    calls = []
    select = circuits.kernels.select.select
    # the circuit's passes (select as Circuit reads it; the operators' row operations and the DP ask it too)
    monkeypatch.setattr(
        circuits.kernels.select,
        "select",
        lambda prog, dtype: (calls.append(dtype) if isinstance(prog, Program) else None) or select(prog, dtype),
    )
    c = circuits.compile_circuit(circuits.RangeK(12, 2, 5))
    r = torch.randn(40, 12)
    for _ in range(3):
        c.marginals(r), c.sample(r), c.map(r), c.log_partition(r.double())
    assert calls == [torch.float32, torch.float64]
    want = CPasses if library.library() is not None else TorchPasses
    assert type(c.kernels(torch.float32)) is want and type(c.kernels(torch.float64)) is TorchPasses
    assert c.kernels(torch.float32) is c.kernels(torch.float32)
    assert c.to("cpu").kernels(torch.float32) is not c.kernels(torch.float32)  # a copy picks its own


def test_concurrent_first_calls_share_one_choice():
    c = circuits.compile_circuit(circuits.ExactlyK(10, 3))
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        chosen = list(pool.map(lambda _: c.kernels(torch.float32), range(32)))
    assert all(p is chosen[0] for p in chosen)


def test_validate_false_skips_every_check():
    """validate = False is for a caller that checked the logits (probmoe does): no argument check
    and no host sync; validate = True names the argument."""
    c = circuits.compile_circuit(circuits.ExactlyK(6, 2))
    with pytest.raises(ValueError, match=r"logits must have shape \[\.\.\., n\] with n = 6"):
        c.marginals(torch.randn(3, 5))
    with pytest.raises(ValueError, match="generator must be a torch.Generator on cpu"):
        c.sample(torch.randn(3, 6), generator="seed")
    with pytest.raises(ValueError, match="unsatisfiable at row 1"):
        c.marginals(torch.tensor([[0.0] * 6, [0.0] + [-torch.inf] * 5]))
    c.validate = False
    m = c.marginals(torch.tensor([[0.0] * 6, [0.0] + [-torch.inf] * 5]))  # garbage in, no error
    assert m.shape == (2, 6)


@pytest.mark.parametrize("values", [True, False])
@pytest.mark.parametrize("spec", [circuits.ExactlyK(5, 2), circuits.RangeK(5, 1, 2)], ids=str)
def test_marginals_operator_contract(values, spec):
    """``circuits::marginals``: values (or zeros), a draw of the right support, Jacobian Cov(x), and
    only the caller's logits (their storage, no copy) and the [T, 1] shift saved for the backward."""
    c = circuits.compile_circuit(spec)
    allowed = masks(5, list(spec.cardinalities))
    r = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    shift = torch.randn(3, 1, dtype=torch.float64) if isinstance(spec, circuits.ExactlyK) else None
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        m, z, _ = torch.ops.circuits.marginals(r, shift, circuits.ops.seed(None, r), c.handle, values, False)
    assert saved[0].data_ptr() == r.data_ptr() and len(saved) == 1 + (shift is not None)
    want = exact(r.detach(), allowed)
    torch.testing.assert_close(m.detach(), want.marginals if values else torch.zeros_like(r))
    assert not z.requires_grad and ((z.sum(-1) >= 1) & (z.sum(-1) <= 2)).all()
    for t in range(3):
        (row,) = torch.autograd.grad(m[t].sum(), r, retain_graph=True)
        torch.testing.assert_close(row[t], want.cov[t].sum(0))  # Cov is symmetric: rows = columns


@pytest.mark.parametrize("T,n,k", [(32, 20_000, 10_000), (300, 30_000, 29_990), (3, 25_000, 12_500)])
def test_kth_largest_at_k_in_the_tens_of_thousands(T, n, k):
    """Once a stack array of k x 32 floats per OpenMP worker, which overflowed for k like these."""
    if library.library() is None:
        pytest.skip("the C row operations are turned off or unbuildable")
    r = torch.randn(T, n, generator=torch.Generator().manual_seed(n)).round(decimals=2)  # ties
    r[0, :100] = -torch.inf
    want = select.kth_largest_reference(r, k)
    assert torch.equal(circuits.kernels.select.select(Rows(r.device), r.dtype).kth_largest(r, k), want)
    assert torch.equal(want, r.sort(dim=-1, descending=True).values[:, k - 1])
