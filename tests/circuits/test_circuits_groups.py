"""Group constraints (GroupLimited, GroupCapacity and their conjunction) against brute force, pysdd
model counts in Python integers, chi-squared on samples, extreme logits, the cache and the commands."""

import json
import math

import pytest
import torch
from brute import exact
from brute import group_models as models
from brute import satisfies_groups as satisfies
from group_specs import SPECS
from stats import chi2_pvalue, mask_counts

import circuits
from circuits import GroupCapacity, GroupLimited
from circuits.compiler import groups
from circuits.inspect.cli import compile_main, inspect_main
from circuits.kernels.program import draw_uniforms
from circuits.kernels.torch_passes import TorchPasses
from circuits.spec import spec_from_dict, spec_to_dict


@pytest.mark.parametrize("spec", SPECS, ids=str)
def test_matches_brute_force(spec, device):
    allowed = models(spec)
    c = circuits.compile_circuit(spec, device=device)
    assert c.layout.model_count() == len(allowed) == spec.model_count() == int(c.info["model_count"])
    r = torch.randn(7, spec.n, generator=torch.Generator().manual_seed(spec.n), dtype=torch.float64) * 2
    want = exact(r, allowed)
    rd = r.to(device)
    torch.testing.assert_close(c.log_partition(rd).cpu(), want.log_partition, atol=1e-9, rtol=0)
    torch.testing.assert_close(c.marginals(rd).cpu(), want.marginals, atol=1e-9, rtol=0)
    assert torch.equal(c.map(rd).cpu(), want.map)
    torch.testing.assert_close(
        torch.from_numpy(groups.log_partition_reference(spec, r)), want.log_partition, atol=1e-9, rtol=0
    )
    # fp32 takes the fused C passes where they are built (the Triton passes on CUDA)
    r32 = rd.float()
    torch.testing.assert_close(c.log_partition(r32).cpu().double(), want.log_partition, atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(c.marginals(r32).cpu().double(), want.marginals, atol=1e-5, rtol=0)
    assert torch.equal(c.map(r32).cpu().double(), want.map)


def test_some_group_circuits_are_not_smooth():
    """The layout's implicit-variable corrections are exercised: ranges leave variables implicit."""
    smooth = {str(s): circuits.compile_circuit(s).layout.smooth for s in SPECS}
    assert not all(smooth.values()) and any(smooth.values()), smooth


@pytest.mark.parametrize("spec", [SPECS[1], SPECS[3], SPECS[8], SPECS[11]], ids=str)
def test_jacobian_of_marginals_is_covariance(spec, float64):
    r = torch.randn(spec.n, generator=torch.Generator().manual_seed(3)) * 1.5
    c = circuits.compile_circuit(spec)
    jac = torch.autograd.functional.jacobian(c.marginals, r)
    cov = exact(r[None], models(spec)).cov[0]
    torch.testing.assert_close(jac, cov, atol=1e-9, rtol=0)
    jac32 = torch.autograd.functional.jacobian(c.marginals, r.float())  # the C passes' Cov(z) v
    torch.testing.assert_close(jac32.double(), cov, atol=1e-5, rtol=0)


@pytest.mark.parametrize("spec", [SPECS[2], SPECS[4], SPECS[8], SPECS[12]], ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["c-passes", "torch-passes"])
def test_chi_squared(spec, dtype):
    draws = 60_000 if dtype == torch.float32 else 20_000
    gen = torch.Generator().manual_seed(11)
    r = torch.randn(spec.n, generator=gen, dtype=torch.float64) * 1.2
    allowed = models(spec)
    c = circuits.compile_circuit(spec)
    z = c.sample(r.to(dtype).expand(draws, -1), generator=gen)
    counts = mask_counts(z, allowed)  # asserts that no draw violates the constraint
    probs = exact(r[None], allowed).probs[0]
    assert chi2_pvalue(counts, probs) > 1e-3
    assert chi2_pvalue(counts, torch.softmax(torch.randn(len(probs), generator=gen), 0)) < 1e-6  # it can fail


BIG = [
    GroupLimited(64, 8, 8, 2),
    GroupCapacity(64, 8, [4] * 8 + [8] * 4, 1),
    GroupLimited(64, 8, 8, 3, capacity=3),
    GroupLimited(64, None, 8, 2, kmin=2, kmax=8),
]


@pytest.mark.parametrize("spec", BIG, ids=str)
@pytest.mark.parametrize("scale", [1.0, 1e4])
def test_draws_and_map_never_violate_the_constraint(spec, scale, device):
    """At logit scales up to ±1e4 in fp32, with -inf logits, on the C passes (the Triton passes on
    CUDA) and the torch passes."""
    c = circuits.compile_circuit(spec, device=device)
    gen = torch.Generator(device).manual_seed(int(scale))
    r = torch.randn(512, spec.n, generator=gen, device=device) * scale
    r[::3, 8:16] = -torch.inf  # a whole group, or half of the small ones, never chosen
    r[1::3, 0::5] = -torch.inf
    r[2::3] += 3 * scale  # everything likely: only the constraint limits the draws
    z = c.sample(r, generator=gen)
    assert bool(satisfies(z, spec).all()) and not z[r == -torch.inf].any()
    zmap = c.map(r)
    assert bool(satisfies(zmap, spec).all()) and not zmap[r == -torch.inf].any()
    m = c.marginals(r)
    assert bool(torch.isfinite(m).all()) and not m[r == -torch.inf].any()
    if spec.fixed_cardinality:
        torch.testing.assert_close(m.sum(-1), torch.full((512,), float(spec.k), device=device), atol=1e-3, rtol=0)
    torch_passes = TorchPasses(c.program)  # fp32 through the torch passes too
    rs = c.shifted(r)
    zt, log_z = torch_passes.sample(rs, *draw_uniforms(c.program, rs, gen))
    assert bool(satisfies(zt, spec).all()) and bool(torch.isfinite(log_z).all())


def test_unsatisfiable_rows_are_value_errors():
    c = circuits.compile_circuit(GroupLimited(16, 3, 4, 1))
    r = torch.randn(5, 16)
    r[2, :] = -torch.inf
    r[2, [0, 1, 4, 5, 8, 9, 12, 13]] = 0.0  # 8 finite logits, but at most 2 in any one group
    with pytest.raises(
        ValueError,
        match=r"GroupLimited\(n=16, k=3, groups=4x4, max_groups=1\) unsatisfiable at "
        r"row 2: no subset of its 8 finite logits satisfies it$",
    ):
        c.sample(r)


def _sdd_count(mgr, root) -> int:
    """pysdd's SDD counted in Python integers by walking its nodes (independent of our layout)."""
    memo = {}

    def count(node) -> tuple[int, int]:  # (models over the node's vtree variables, how many variables)
        if node.is_false():
            return 0, 0
        if node.is_true():
            return 1, 0
        if node.is_literal():
            return 1, 1
        if node.id not in memo:
            v = node.vtree()
            nl, nr = v.left().var_count(), v.right().var_count()
            total = 0
            for p, s in node.elements():
                (cp, vp), (cs, vs) = count(p), count(s)
                total += cp * 2 ** (nl - vp) * cs * 2 ** (nr - vs)
            memo[node.id] = (total, v.var_count())
        return memo[node.id]

    c, v = count(root)
    return c * 2 ** (mgr.var_count() - v)


@pytest.mark.parametrize(
    "spec",
    [
        GroupLimited(256, 8, 8, 4),
        GroupCapacity(256, 64, 8, 16),
        GroupLimited(256, None, [16] * 8 + [32] * 4, 3, capacity=6, kmin=4, kmax=12),
    ],
    ids=str,
)
def test_n256_counts_against_pysdd(spec):
    mgr, root = circuits.compile_sdd(spec)
    count = _sdd_count(mgr, root)
    assert count == spec.model_count()
    if count < 2**64:
        assert root.global_model_count() == count
    else:  # pysdd's own count is a 64-bit integer: wrong here
        assert root.global_model_count() != count
    wmc = root.wmc(log_mode=True)  # weights log 1: the log model count, in floating point
    assert math.isclose(wmc.propagate(), math.log(count), rel_tol=1e-9)
    c = circuits.compile_circuit(spec)
    assert c.layout.model_count() == count


def test_model_count_closed_forms():
    # exactly k from at most M of G equal groups of s: inclusion-exclusion over which groups are used
    G, s, k, M = 8, 32, 8, 4
    closed = sum(
        math.comb(G, g) * sum((-1) ** (g - h) * math.comb(g, h) * math.comb(h * s, k) for h in range(g + 1))
        for g in range(1, M + 1)
    )
    assert GroupLimited(G * s, k, G, M).model_count() == closed
    # at most c per group: the coefficient of x^k in (sum_{j<=c} C(s, j) x^j)^G
    poly = [1]
    for _ in range(G):
        nxt = [0] * (len(poly) + 2)
        for i, a in enumerate(poly):
            for j in range(3):
                nxt[i + j] += a * math.comb(s, j)
        poly = nxt
    assert GroupCapacity(G * s, k, G, 2).model_count() == poly[k]


def test_group_vtree_keeps_every_group_under_one_node():
    sizes = (3, 5, 1, 7, 4)
    v = groups.group_vtree(sizes)
    spans = set()

    def walk(node):
        if node.is_leaf():
            return [node.var()]
        out = walk(node.left()) + walk(node.right())
        spans.add((min(out), max(out), len(out)))
        return out

    assert walk(v) == list(range(1, 21))
    start = 1
    for size in sizes:
        assert size == 1 or (start, start + size - 1, size) in spans
        start += size


BAD = [
    (lambda: GroupLimited(64, 8, 3, 2), "groups = 3 must divide n = 64"),
    (lambda: GroupLimited(64, 8, [30, 30], 2), "groups must sum to n = 64"),
    (lambda: GroupLimited(64, 8, [32, 0, 32], 2), "group sizes >= 1"),
    (lambda: GroupLimited(64, 8, "8", 2), "groups must be an integer"),
    (lambda: GroupLimited(64, 8, 8, 0), r"max_groups must be in \[1, the number of groups = 8\]"),
    (lambda: GroupLimited(64, 8, 8, 9), r"max_groups must be in \[1, the number of groups = 8\]"),
    (lambda: GroupLimited(64, 8, 8), "max_groups must be given"),
    (lambda: GroupCapacity(64, 8, 8), "capacity must be given"),
    (lambda: GroupCapacity(64, 8, 8, 9), r"capacity must be in \[1, the largest group = 8\]"),
    (lambda: GroupCapacity(64, 17, 8, 2), r"k must be in \[0, 16\], got 17: .*capacity = 2 hold at most 16"),
    (lambda: GroupLimited(64, 9, 8, 1), r"k must be in \[0, 8\], got 9: .*max_groups = 1"),
    (lambda: GroupLimited(64, 5, 8, 2, capacity=2), r"k must be in \[0, 4\]"),
    (lambda: GroupLimited(64, None, 8, 2, kmin=5, kmax=4), r"kmin must be in \[0, kmax = 4\]"),
    (lambda: GroupLimited(64, 4, 8, 2, kmax=4), "either k"),
    (lambda: GroupLimited(0, 0, 1, 1), r"n must be in \[1, inf\]"),
]


@pytest.mark.parametrize("make,match", BAD)
def test_bad_arguments(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_spec_values_keys_and_dicts():
    a = GroupLimited(64, 8, 8, 4)
    assert a == GroupLimited(64, 8, [8] * 8, 4) and hash(a) == hash(GroupLimited(64, 8, [8] * 8, 4))
    assert a != GroupCapacity(64, 8, 8, 8, max_groups=4)  # the same set, another spec (and cache entry)
    assert a.k == 8 and a.cardinalities == range(8, 9) and a.fixed_cardinality
    assert a.describe() == "GroupLimited(n=64, k=8, groups=8x8, max_groups=4)"
    keys = {
        s.key
        for s in [
            a,
            GroupLimited(64, 8, [4] * 16, 4),
            GroupLimited(64, 8, 8, 3),
            GroupCapacity(64, 8, 8, 2),
            GroupLimited(64, 8, 8, 4, capacity=2),
            GroupLimited(64, None, 8, 4, kmin=7, kmax=8),
        ]
    }
    assert len(keys) == 6
    assert a.with_cardinality(3, 5) == GroupLimited(64, None, 8, 4, kmin=3, kmax=5)
    for spec in SPECS + BIG:
        assert spec_from_dict(json.loads(json.dumps(spec_to_dict(spec)))) == spec
    for data, match in [
        ({"type": "GroupLimited"}, "exactly the keys"),
        ([1], "must be a dict"),
        ({"type": "SddFile", "digest": "x"}, "type must be one of"),
        ({**spec_to_dict(a), "max_groups": 9}, "max_groups must be in"),
        ({**spec_to_dict(a), "groups": 8}, "groups must be a list"),
    ]:
        with pytest.raises(ValueError, match=match):
            spec_from_dict(data)


def test_cache_entries_follow_the_spec_and_groups(tmp_path):
    a = circuits.compile_circuit(GroupLimited(16, 3, 4, 2), cache_dir=tmp_path)
    b = circuits.compile_circuit(GroupLimited(16, 3, [2, 6, 4, 4], 2), cache_dir=tmp_path)
    assert not a.info["cache_hit"] and not b.info["cache_hit"] and a.info["cache_path"] != b.info["cache_path"]
    hit = circuits.compile_circuit(GroupLimited(16, 3, 4, 2), cache_dir=tmp_path)
    assert hit.info["cache_hit"] and hit.info["spec"] == spec_to_dict(GroupLimited(16, 3, 4, 2))
    assert hit.info["vtree"] == "grouped" and (hit.layout.children == a.layout.children).all()
    r = torch.randn(4, 16)
    torch.testing.assert_close(hit.marginals(r), a.marginals(r))


def test_commands(tmp_path, capsys):
    argv = ["--n", "256", "--k", "8", "--groups", "8", "--max-groups", "4", "--cache-dir", str(tmp_path), "--json"]
    assert compile_main(argv) == 0
    cold = json.loads(capsys.readouterr().out)
    assert cold["status"] == "compiled" and cold["model_count"] == str(GroupLimited(256, 8, 8, 4).model_count())
    assert cold["model_count_checked"] and cold["vtree"] == "grouped" and cold["sizes"]["variables"] == 256
    assert compile_main(argv) == 0
    hit = json.loads(capsys.readouterr().out)
    assert hit["cache_hit"] and hit["load_seconds"] is not None
    assert (
        compile_main(
            [
                "--n",
                "12",
                "--kmin",
                "2",
                "--kmax",
                "4",
                "--groups",
                "3,4,5",
                "--capacity",
                "2",
                "--max-groups",
                "2",
                "--cache-dir",
                str(tmp_path),
            ]
        )
        == 0
    )
    assert "GroupLimited(n=12, kmin=2, kmax=4, groups=[3, 4, 5], max_groups=2, capacity=2)" in capsys.readouterr().out
    assert (
        inspect_main(
            [
                "--n",
                "8",
                "--k",
                "2",
                "--groups",
                "4",
                "--max-groups",
                "1",
                "--cache-dir",
                str(tmp_path),
                "--format",
                "dot",
            ]
        )
        == 0
    )
    assert capsys.readouterr().out.startswith("digraph")
    for bad, message in [
        (["--n", "64", "--k", "8", "--groups", "3", "--max-groups", "2"], "--groups = 3 must divide"),
        (["--n", "64", "--k", "8", "--groups", "8"], "at least one of --max-groups"),
        (["--n", "64", "--k", "8", "--max-groups", "2"], "group limits need --groups"),
        (["--n", "64", "--k", "8", "--groups", "8", "--max-groups", "9"], "--max-groups must be in"),
        (["--n", "64", "--k", "9", "--groups", "8", "--capacity", "1"], "--k must be in [0, 8]"),
        (["--n", "64", "--k", "9", "--groups", "a,b", "--capacity", "1"], "--groups"),
    ]:
        with pytest.raises(SystemExit) as exit_:
            compile_main(bad + ["--cache-dir", str(tmp_path)])
        assert exit_.value.code == 2
        assert message in capsys.readouterr().err


def test_log_partition_reference_is_the_self_check():
    spec = GroupLimited(64, 8, 8, 2)
    c = circuits.compile_circuit(spec)
    groups.self_check(c.layout, spec)  # passes
    wrong = circuits.compile_circuit(GroupLimited(64, 8, 8, 3))
    with pytest.raises(ValueError, match="wrong function"):
        groups.self_check(wrong.layout, spec)
