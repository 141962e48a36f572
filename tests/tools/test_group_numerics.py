"""tools/group_numerics.py: the float32 top-relative form of the group DP (the numerics of a fused
group kernel) within issue 45's accuracy goals of float64, on the grid's hard rows and on rows whose
limits force a group far below the others to contribute."""

import pytest
import torch
from tool_modules import load_tool

import circuits

numerics = load_tool("group_numerics")
accuracy = load_tool("accuracy_fp32")


@pytest.mark.parametrize("spec", numerics.specs(quick=True), ids=str)
def test_within_the_goals_of_float64(spec):
    dp = circuits.GroupDP(spec)
    for scale in (1.0, 100.0):
        for kind in accuracy.KINDS:
            r32 = accuracy.rows(spec.n, scale, kind, 8, seed=len(kind))
            r32 = r32[dp.reach(r32) >= spec.kmin]
            marginals, log_z = numerics.worst(spec, r32)
            assert marginals < numerics.MARGINAL_BOUND and log_z < numerics.LOG_Z_BOUND, (scale, kind)
    marginals, log_z = numerics.worst(spec, numerics.forced_rows(spec, 8, seed=0))
    assert marginals < numerics.MARGINAL_BOUND and log_z < numerics.LOG_Z_BOUND


def test_the_forced_rows_defeat_one_tilt_in_probability_form():
    """Why the form exists: one group 300 below the rest, forced by a capacity of 1 to give one
    variable; its probabilities under the others' tilt underflow float32, its weights do not here."""
    spec = circuits.GroupCapacity(64, 8, 8, 1)
    r32 = numerics.forced_rows(spec, 4, seed=0)[2:]  # the rows 300 below
    assert (torch.sigmoid(r32[:, :8] - r32[:, 8:].max()) == 0).all()  # float32 probabilities: 0
    log_norm, m = numerics.top_relative(r32, spec)
    assert torch.isfinite(log_norm).all()
    torch.testing.assert_close(m[:, :8].sum(-1), torch.ones(2), atol=1e-6, rtol=0)  # exactly one from it
