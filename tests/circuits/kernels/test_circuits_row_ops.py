"""The row operations shared by the passes and probmoe: ``topk`` (the k largest of each row, ties to
the lower index), ``topk_chosen`` (the same over the keys of a 0/1 choice) and the counter-based
uniforms (``circuits.kernels.uniforms``), as ``circuits.kernels.select.select`` gives them
(``circuits.kernels.rows.RowOps``), each in C against its plain-torch reference, bit for bit, and
the uniforms against the uniform law."""

from __future__ import annotations

import pytest
import torch
from stats import chi2_pvalue

import circuits
import circuits.kernels.select
from circuits.kernels import library
from circuits.kernels import uniforms as counter_uniforms
from circuits.kernels.program import draw_uniforms
from circuits.kernels.rows import Rows, topk_chosen_reference, topk_reference

needs_native = pytest.mark.usefixtures("c_passes_built")


def _rows(x: torch.Tensor):
    """The row operations ``select`` gives rows like ``x`` (C for float32 CPU rows, where built)."""
    return circuits.kernels.select.select(Rows(x.device), x.dtype)


def topk(x: torch.Tensor, k: int):
    return _rows(x).topk(x, k)


def topk_chosen(z: torch.Tensor, x: torch.Tensor, k: int):
    return _rows(x).topk_chosen(z, x, k)


def awkward_rows(T: int, n: int) -> torch.Tensor:
    """Rows with ties, -inf, NaN, signed zeros and a constant row."""
    x = torch.randn(T, n, generator=torch.Generator().manual_seed(T * 1000 + n)).round(decimals=1)
    if T > 4:
        x[0] = -torch.inf
        x[1, -1] = float("nan")
        x[2] = 1.0
        x[3, : n // 2] = -0.0
        x[4, : n // 2] = -torch.inf
    return x


@needs_native
@pytest.mark.parametrize(
    "T,n,k", [(0, 4, 2), (1, 1, 1), (5, 3, 0), (7, 3, 3), (33, 10, 3), (4097, 64, 8), (300, 256, 16), (40, 300, 300)]
)
def test_topk_in_c_equals_a_stable_sort(T, n, k):
    x = awkward_rows(T, n)
    values, indices = topk(x, k)
    want_values, want_indices = topk_reference(x, k)
    assert indices.dtype == torch.int64 and values.shape == indices.shape == (T, k)
    assert torch.equal(indices, want_indices)
    assert torch.equal(values, want_values)  # NaN reported as -inf, as the reference


@needs_native
@pytest.mark.parametrize(
    "T,n,k,p",
    [
        (0, 4, 2, 0.5),
        (5, 3, 0, 0.5),
        (300, 64, 8, 0.125),
        (300, 64, 8, 0.3),
        (200, 256, 16, 0.0625),
        (50, 10, 10, 0.5),
        (50, 7, 3, 1.0),
        (50, 7, 3, 0.0),
    ],
)
def test_topk_chosen_in_c_equals_the_topk_of_its_keys(T, n, k, p):
    """The chosen entries by value (ties to the lower index, zeros included), then the unchosen by
    index, bit for bit as a stable sort of (z - 1) + x z; more chosen than k keeps the k largest,
    fewer pads with the first unchosen; float64 takes the reference."""
    gen = torch.Generator().manual_seed(T + n)
    z = (torch.rand(T, n, generator=gen) < p).float()
    x = torch.softmax(torch.randn(T, n, generator=gen), -1).round(decimals=3)  # ties, and some exact zeros
    values, indices = topk_chosen(z, x, k)
    want_values, want_indices = topk_chosen_reference(z, x, k)
    assert torch.equal(values, want_values) and torch.equal(indices, want_indices)
    assert torch.equal(topk_chosen(z.double(), x.double(), k)[1], want_indices)
    if T > 2:  # a NaN among the chosen (routing with validation off): last, as -inf, and every slot written
        x[1, :3] = x[2, :] = float("nan")
        values, indices = topk_chosen(z, x, k)
        want_values, want_indices = topk_chosen_reference(z, x, k)
        assert torch.equal(values, want_values) and torch.equal(indices, want_indices)


def test_topk_chosen_bad_arguments():
    with pytest.raises(ValueError, match="topk_chosen takes z, x"):
        topk_chosen(torch.zeros(3, 4), torch.zeros(3, 5), 2)
    with pytest.raises(ValueError, match="topk_chosen takes z, x"):
        topk_chosen(torch.zeros(3, 4), torch.zeros(3, 4), 5)


def test_topk_breaks_ties_toward_the_lower_index(c_passes_off):
    x = torch.tensor([[1.0, 2.0, 2.0, 1.0, 2.0], [0.0, -0.0, 0.0, -torch.inf, -torch.inf]])
    assert topk(x, 4)[1].tolist() == [[1, 2, 4, 0], [0, 1, 2, 3]]


@needs_native
def test_topk_ties_in_c_too():
    x = torch.tensor([[1.0, 2.0, 2.0, 1.0, 2.0], [0.0, -0.0, 0.0, -torch.inf, -torch.inf]])
    assert topk(x, 4)[1].tolist() == [[1, 2, 4, 0], [0, 1, 2, 3]]
    assert topk(x, 5)[0][1].tolist() == [0.0, 0.0, 0.0, -torch.inf, -torch.inf]


def test_topk_of_other_dtypes_takes_the_reference():
    x = awkward_rows(20, 9).double()
    assert torch.equal(topk(x, 4)[1], topk_reference(x, 4)[1])


@pytest.mark.parametrize("shape,k", [((3,), 1), ((2, 3, 4), 1), ((3, 4), 5), ((3, 4), -1)])
def test_topk_bad_arguments(shape, k):
    with pytest.raises(ValueError, match="topk takes x"):
        topk(torch.zeros(shape), k)


@needs_native
@pytest.mark.parametrize("seed", [0, 1, 987654321, (1 << 62) - 1])
@pytest.mark.parametrize("offset,count", [(0, 1), (0, 70_000), (12_345, 999)])
def test_uniforms_in_c_equal_the_reference(seed, offset, count):
    out = torch.empty(count)
    library.library().pm_uniforms(seed, offset, count, out.data_ptr(), torch.get_num_threads())
    assert torch.equal(out, counter_uniforms.reference(seed, offset, count))


def test_uniforms_are_a_function_of_seed_and_index():
    a = counter_uniforms.reference(42, 0, 1000)
    assert torch.equal(a[100:300], counter_uniforms.reference(42, 100, 200))
    assert not torch.equal(a, counter_uniforms.reference(43, 0, 1000))


@pytest.mark.parametrize("seed", [0, 7])
def test_uniforms_follow_the_uniform_law(seed):
    """χ² on 64 equal bins, on pairs of neighbours (8 x 8 bins) and the 24-bit grid of [0, 1)."""
    u = counter_uniforms.reference(seed, 0, 400_000)
    assert float(u.min()) >= 0.0 and float(u.max()) < 1.0
    assert torch.equal(u, torch.floor(u * 2**24) / 2**24)
    cells = torch.bincount((u * 64).long(), minlength=64)
    assert chi2_pvalue(cells, torch.full((64,), 1 / 64)) > 1e-3
    pairs = (u[0::2] * 8).long() * 8 + (u[1::2] * 8).long()
    assert chi2_pvalue(torch.bincount(pairs, minlength=64), torch.full((64,), 1 / 64)) > 1e-3


def test_uniforms_reproduce_with_a_seeded_generator_with_and_without_c(monkeypatch):
    cpu = torch.device("cpu")

    def draw(seed, count=5000, dtype=torch.float32):
        return circuits.kernels.select.select(Rows(cpu), dtype).uniforms(
            counter_uniforms.seed_tensor(torch.Generator().manual_seed(seed)), count, cpu, dtype
        )

    fast = draw(3)
    monkeypatch.setattr(library.LIBRARY, "state", {"lib": None, "where": "turned off in this test"})
    slow = draw(3)
    assert torch.equal(fast, slow)
    assert draw(3, 5, torch.float64).dtype == torch.float64
    assert not torch.equal(slow, draw(4))


def test_draw_uniforms_slices_one_call():
    """A draw's uniforms ([count, T], then [T, n] for an unsmooth circuit) are one counter run."""
    c = circuits.compile_circuit(circuits.RangeK(6, 2, 4))
    r = torch.randn(5, 6)
    u, fill = draw_uniforms(c.program, r, torch.Generator().manual_seed(9))
    seed = counter_uniforms.seed_from(torch.Generator().manual_seed(9))
    _, count = c.program.scope_ids
    want = counter_uniforms.reference(seed, 0, count * 5 + 30)
    assert not c.program.smooth
    assert torch.equal(u.flatten(), want[: count * 5]) and torch.equal(fill.flatten(), want[count * 5 :])
