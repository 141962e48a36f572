"""fp32 accuracy of the exact engine at every logit scale: worst errors against float64 references.

For each constraint, logit scale s and kind of row (N(0, s^2); shifted by +1e4 or -1e4; a quarter
of the entries -inf; all entries equal), the fp32 marginals and log Z of every implementation are
compared with an independent float64 reference computed on the same fp32 logits:

    cardinality (exactly-k, range-k)   a log-space DP over elementary symmetric polynomials
    groups (GroupLimited/Capacity)     a DP within each group, then over (size, groups used)
    CNF                                 enumeration of the formula's models (n = 20)

Marginals come from autograd of the float64 log-normaliser (-inf entries enter as -1e300, which
carries no gradient). Errors: marginals absolute, log Z relative, |a - b| / max(1, |b|).
Implementations: the compiled circuit's passes (torch, fused C, Triton; Triton in its CPU
interpreter on fewer rows unless CUDA is present) and the DP, cardinality only: ``dp`` through the
public ``probmoe.SubsetDistribution`` (``backend="dp"``: the fused C sweeps for fp32 on the CPU),
``dp-torch`` its torch sweeps (the C sweeps' oracle) and ``dp-triton`` its Triton lattice kernels
(interpreted without CUDA), picked by ``circuits.passes.select``.

    PYTHONPATH=$PWD python tools/accuracy_fp32.py            # the Markdown table of docs/reports/circuits-evaluation-accuracy-epyc-2026-11.md
    PYTHONPATH=$PWD python tools/accuracy_fp32.py --impl c,dp,dp-torch --rows 64 --quick

The tests (tests/circuits/test_fp32_accuracy.py) import the references and the row generator from here.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import tempfile

import torch
import torch.nn.functional as F
from torch import Tensor

SCALES = (1.0, 3.0, 10.0, 30.0, 100.0)
KINDS = ("normal", "+1e4", "-1e4", "-inf", "equal")
NEG = -1e300  # -inf in the float64 references: exp() is 0 and it carries no gradient
MARGINAL_BOUND, LOG_Z_BOUND = 1e-5, 1e-6


# --- rows ---------------------------------------------------------------------------------------
def rows(n: int, scale: float, kind: str, count: int, seed: int) -> Tensor:
    """fp32 logits [count, n] of one kind (see the module docstring) at scale s."""
    g = torch.Generator().manual_seed(seed)
    r = torch.randn(count, n, generator=g, dtype=torch.float64) * scale
    if kind == "+1e4":
        r += 1e4
    elif kind == "-1e4":
        r -= 1e4
    elif kind == "-inf":
        r[torch.rand(count, n, generator=g) < 0.25] = -torch.inf
    elif kind == "equal":
        level = torch.tensor([0.0, scale, -scale, 1e4, -1e4], dtype=torch.float64)
        r = level[torch.arange(count) % 5].unsqueeze(1).expand(count, n).clone()
    elif kind != "normal":
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    return r.float()


# --- float64 references: natural log-normaliser log sum_{S in C} exp(r . z_S) -------------------------
def _lse(*xs: Tensor) -> Tensor:
    return torch.logsumexp(torch.stack(xs), dim=0)


def esp(r: Tensor, top: int) -> Tensor:
    """log e_j(e^r) for j = 0..top: r [T, m] float64 (finite or NEG) -> [T, top + 1] (NEG: none)."""
    T = r.shape[0]
    e = torch.full((T, top + 1), NEG, dtype=torch.float64)
    e[:, 0] = 0.0
    for i in range(r.shape[1]):
        x = r[:, i : i + 1]
        e = torch.cat([e[:, :1], _lse(e[:, 1:], e[:, :-1] + x)], dim=1)
    return e


def cardinality_log_norm(r: Tensor, kmin: int, kmax: int) -> Tensor:
    """log sum_{kmin <= |S| <= kmax} exp(r . z_S): [T, n] float64 -> [T]."""
    return torch.logsumexp(esp(r, kmax)[:, kmin:], dim=1)


def group_log_norm(r: Tensor, spec) -> Tensor:
    """The same for a group spec (``circuits.GroupLimited`` / ``GroupCapacity``): per group the sizes
    0..capacity, then a DP over (total size, groups used)."""
    T, kmax, G = r.shape[0], spec.kmax, spec.max_groups
    f = torch.full((T, kmax + 1, G + 1), NEG, dtype=torch.float64)  # [T, size, groups used]
    f[:, 0, 0] = 0.0
    for part in r.split(list(spec.groups), dim=1):
        e = esp(part, min(spec.capacity, part.shape[1], kmax))  # [T, c + 1]
        parts = [f]
        for j in range(1, e.shape[1]):  # j of this group: one more group used
            moved = torch.full_like(f, NEG)
            moved[:, j:, 1:] = f[:, : kmax + 1 - j, :-1] + e[:, j : j + 1, None]
            parts.append(moved)
        f = torch.logsumexp(torch.stack(parts), dim=0)
    return torch.logsumexp(f[:, spec.kmin :, :].reshape(T, -1), dim=1)


def models_log_norm(r: Tensor, models: Tensor) -> Tensor:
    """The same over an explicit list of models [M, n] in {0, 1} (float64)."""
    return torch.logsumexp(r @ models.T, dim=1)


def reference(log_norm, r32: Tensor) -> tuple[Tensor, Tensor]:
    """(log Z [T] paper form, marginals [T, n]) in float64 for fp32 logits r32 [T, n]:
    log Z = log-normaliser - sum softplus(r), marginals = its gradient."""
    r = torch.where(torch.isfinite(r32), r32.double(), torch.full_like(r32, NEG, dtype=torch.float64))
    r.requires_grad_()
    with torch.enable_grad():
        nat = log_norm(r)
        (m,) = torch.autograd.grad(nat.sum(), r)
    return (nat - F.softplus(r).sum(1)).detach(), m


# --- the constraints --------------------------------------------------------------------------------
def random_cnf(n: int, clauses: int, seed: int) -> list[list[int]]:
    """A random 3-CNF over n variables (ratio below the threshold: many models)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(clauses):
        vs = torch.randperm(n, generator=g)[:3] + 1
        signs = torch.randint(0, 2, (3,), generator=g) * 2 - 1
        out.append((vs * signs).tolist())
    return out


def cnf_models(n: int, clauses: list[list[int]]) -> Tensor:
    """All models of a CNF over n variables: [M, n] float64 (n <= 22)."""
    z = torch.tensor(list(itertools.product((0, 1), repeat=n)), dtype=torch.bool)
    ok = torch.ones(len(z), dtype=torch.bool)
    for c in clauses:
        ok &= torch.stack([z[:, abs(v) - 1] if v > 0 else ~z[:, abs(v) - 1] for v in c]).any(0)
    return z[ok].double()


def constraints(quick: bool = False) -> list[dict]:
    """name, spec, its float64 log-normaliser, (kmin, kmax) for the DP or None."""
    import circuits
    from circuits import ExactlyK, GroupCapacity, GroupLimited, RangeK

    out = []
    for n, kmin, kmax in ((64, 8, 8), (256, 16, 16), (64, 0, 1), (256, 0, 1), (64, 4, 8), (64, 0, 8)):
        if quick and n == 256:
            continue
        spec = ExactlyK(n, kmin) if kmin == kmax else RangeK(n, kmin, kmax)
        name = f"exactly {kmin} of {n}" if kmin == kmax else f"range {kmin}..{kmax} of {n}"
        out.append(
            {
                "name": name,
                "spec": spec,
                "dp": (kmin, kmax),
                "log_norm": lambda r, a=kmin, b=kmax: cardinality_log_norm(r, a, b),
            }
        )
    for spec, name in (
        (GroupLimited(64, 8, 8, 2), "GroupLimited 8 of 64, 2 of 8 groups"),
        (GroupCapacity(64, None, 8, 2, kmin=0, kmax=8), "GroupCapacity 0..8 of 64, 2 per group"),
    ):
        out.append({"name": name, "spec": spec, "dp": None, "log_norm": lambda r, s=spec: group_log_norm(r, s)})
    n, clauses = 20, random_cnf(20, 50, seed=7)
    path = os.path.join(tempfile.mkdtemp(prefix="accuracy-fp32-"), "random.cnf")
    with open(path, "w") as f:
        f.write(f"p cnf {n} {len(clauses)}\n" + "".join(" ".join(map(str, c)) + " 0\n" for c in clauses))
    models = cnf_models(n, clauses)
    out.append(
        {
            "name": f"CNF, 20 variables, 50 clauses ({len(models)} models)",
            "spec": circuits.CnfFile(path),
            "dp": None,
            "log_norm": lambda r, m=models: models_log_norm(r, m),
        }
    )
    return out


# --- the implementations ------------------------------------------------------------------------------
def circuit_runner(circuit, impl: str):
    """fp32 (log Z, marginals) of one implementation of the circuit passes, as ``Circuit``'s operators
    call them (``circuits.ops``): log Z accumulated in float64 without the shift, the marginals with
    the circuit's shift (and, for circuits that are not cardinality constraints, the rows of the
    pass on logarithms from float64: ``Program.float64_rows``)."""
    import circuits

    passes = circuits.passes.select(circuit.program, torch.float32, prefer=impl)

    def run(r: Tensor) -> tuple[Tensor, Tensor]:
        log_z, _ = passes.log_partition(r, False)
        _, m = passes.log_partition(r, True, circuit._shift(r), accurate=False)
        return log_z, m

    return run


def dp_runner(kmin: int, kmax: int, impl: str = "dp"):
    """fp32 (log Z, marginals) of the DP: ``dp`` through the public distribution, ``dp-torch`` the
    torch sweeps and ``dp-triton`` the Triton lattice kernels (interpreted on the CPU: set
    TRITON_INTERPRET=1 first) as ``circuits.passes.select`` gives them."""
    if impl in ("dp-torch", "dp-triton"):
        import circuits
        from circuits.kernels.lattice import Lattice

        lattice = Lattice(0, kmin, kmax, torch.device("cpu"))
        sweeps = circuits.passes.select(lattice, torch.float32, prefer=impl.removeprefix("dp-"))

        def run_torch(r: Tensor) -> tuple[Tensor, Tensor]:
            log_z = torch.logsumexp(sweeps.log_counts(r, True), dim=-1)
            return log_z, sweeps.forward_marginals(r, None, True)[0]

        return run_torch
    import probmoe

    def run(r: Tensor) -> tuple[Tensor, Tensor]:
        d = probmoe.SubsetDistribution(r, kmin=kmin, kmax=kmax, algorithm="dp")
        return d.log_partition, d.mean

    return run


def errors(run, log_norm, r: Tensor) -> tuple[float, float]:
    """(worst marginal error, worst relative log Z error) of ``run`` on fp32 rows r [T, n] whose
    constraint is satisfiable (rows without a satisfying assignment are dropped)."""
    want_z, want_m = reference(log_norm, r)
    ok = torch.isfinite(want_z) & (want_z > NEG / 2)
    r, want_z, want_m = r[ok], want_z[ok], want_m[ok]
    if len(r) == 0:
        return 0.0, 0.0
    log_z, m = run(r.contiguous())
    m_err = float((m.double() - want_m).abs().max())
    z_err = float(((log_z.double() - want_z).abs() / want_z.abs().clamp(min=1.0)).max())
    return m_err, z_err


def measure(
    impls: list[str], count: int, triton_count: int, quick: bool, progress: bool = True, only: str = ""
) -> list[tuple]:
    """One row per (constraint, implementation, scale): the worst errors over the kinds of rows
    (``only``: the constraints whose name contains it)."""
    import circuits

    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover
        tqdm = None
    out = []
    cons = [c for c in constraints(quick) if only in c["name"]]
    jobs = [(c, impl) for c in cons for impl in impls if not impl.startswith("dp") or c["dp"] is not None]
    bar = tqdm(total=len(jobs) * len(SCALES), desc="accuracy", disable=not progress) if tqdm else None
    for c, impl in jobs:
        if impl.startswith("dp"):
            run = dp_runner(*c["dp"], impl)
        else:
            run = circuit_runner(circuits.compile_circuit(c["spec"]), impl)
        for s in SCALES:
            n = c["spec"].n if hasattr(c["spec"], "n") else None
            worst_m = worst_z = 0.0
            for j, kind in enumerate(KINDS):
                interpreted = impl in ("triton", "dp-triton")
                r = rows(n or _cnf_n(c), s, kind, triton_count if interpreted else count, seed=1000 * j + int(s))
                m_err, z_err = errors(run, c["log_norm"], r)
                worst_m, worst_z = max(worst_m, m_err), max(worst_z, z_err)
            out.append(
                (
                    c["name"],
                    {"dp": "DP", "dp-torch": "DP (torch)", "dp-triton": "DP (Triton)"}.get(impl, f"circuit ({impl})"),
                    s,
                    worst_m,
                    worst_z,
                )
            )
            if bar:
                bar.update(1)
    if bar:
        bar.close()
    return out


def _cnf_n(c: dict) -> int:
    with open(c["spec"].path) as f:
        return int(next(line for line in f if line.startswith("p")).split()[2])


def markdown(results: list[tuple]) -> str:
    """The table: one row per constraint and implementation, the worst marginal / log Z error per scale."""
    head = "| constraint | algorithm (passes) | " + " | ".join(f"s = {s:g}" for s in SCALES) + " |"
    lines = [head, "|---|---|" + "---|" * len(SCALES)]
    keyed: dict[tuple, dict] = {}
    for name, impl, s, m, z in results:
        keyed.setdefault((name, impl), {})[s] = (m, z)
    for (name, impl), per in keyed.items():
        cells = []
        for s in SCALES:
            m, z = per[s]
            flag = "" if m <= MARGINAL_BOUND and z <= LOG_Z_BOUND else " **!**"
            cells.append(f"{m:.1e} / {z:.1e}{flag}")
        lines.append(f"| {name} | {impl} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--impl", default="torch,c,triton,dp,dp-torch", help="comma list of torch, c, triton, dp, dp-torch, dp-triton"
    )
    ap.add_argument("--rows", type=int, default=256, help="rows per (scale, kind)")
    ap.add_argument("--triton-rows", type=int, default=32, help="rows per (scale, kind) for Triton (interpreted)")
    ap.add_argument("--quick", action="store_true", help="skip the n = 256 constraints")
    ap.add_argument("--only", default="", help="only the constraints whose name contains this, e.g. 'range 0..8'")
    args = ap.parse_args(argv)
    impls = [x for x in args.impl.split(",") if x]
    bad = [x for x in impls if x not in ("torch", "c", "triton", "dp", "dp-torch", "dp-triton")]
    if bad:
        ap.error(f"--impl takes torch, c, triton, dp, dp-torch, dp-triton; got {bad}")
    if (
        {"triton", "dp-triton"} & set(impls)
        and not torch.cuda.is_available()
        and os.environ.get("TRITON_INTERPRET") != "1"
    ):
        os.environ["TRITON_INTERPRET"] = "1"  # before triton_passes is imported: kernels on the CPU
    results = measure(impls, args.rows, args.triton_rows, args.quick, only=args.only)
    print(
        f"worst marginal error (absolute) / log Z error (relative) over the rows {', '.join(KINDS)}; "
        f"bounds {MARGINAL_BOUND:g} / {LOG_Z_BOUND:g} (**!**: above)"
    )
    print(markdown(results))
    worst = max((m > MARGINAL_BOUND or z > LOG_Z_BOUND) for *_, m, z in results)
    return 1 if worst else 0


if __name__ == "__main__":
    sys.exit(main())
