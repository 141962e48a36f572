"""The Triton DP kernels' scratch filled before they run, for the checks that no kernel reads a row
of scratch it has not written (an uninitialised read otherwise passes or fails by chance)."""

import torch

# NaN passes through no max and no comparison (fmax ignores it, NaN > x is false): huge values do
FILLS = (float("nan"), 3e38, -3e38)


def assert_no_unwritten_reads(monkeypatch, queries) -> None:
    """``queries()`` (a list of result tensors) gives the same bits with the kernels' scratch
    (``circuits.kernels.triton_dp.scratch``) filled with each of ``FILLS`` as uninitialised."""
    from circuits.kernels import triton_dp  # triton is an optional extra

    clean = queries()
    for fill in FILLS:
        full = lambda x, numel, dtype, f=fill: torch.full((numel,), f, dtype=dtype, device=x.device)
        monkeypatch.setattr(triton_dp, "scratch", full)
        for a, b in zip(clean, queries(), strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)
