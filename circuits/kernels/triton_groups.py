"""The group DP's two-level lattice as Triton kernels, one token per thread, a group's lattice in
registers and the outer one streamed through scratch: the source of each kernel, written out for
its spec, and the compiled (or interpreted) function. ``circuits.kernels.triton_group_dp`` launches them; their meaning and test oracle is
``circuits.kernels.torch_groups`` (read it first: the same lattices in float64 log form).

Numerics: the "top-relative" form of ``tools/group_numerics.py`` (which measures it against float64;
``docs/gpu-lattice.md``, "Groups: the numerics of their kernel"). The cardinality kernels' probability
form under one tilt does not carry over: a capacity or group limit can force a group far below the
others to contribute, and its probabilities underflow float32. Instead every state is kept relative
to its best subset:

- inside a group, after its first i variables, ``q[j] = Σ_{|A| = j} exp(r·z_A - top_j)`` (float32),
  top_j the sum of the j largest logits so far, held as h_1 >= .. >= h_C (an insertion network; a
  -inf logit or a padding position is ``NEG``). A step over logit x, with d = x - h_j and
  e = exp(-|d|): q'[j] = q[j] (d > 0 ? e : 1) + q[j - 1] (d > 0 ? 1 : e): two positive terms, one
  exp a state, no underflow of anything that matters, no cancellation. Its share of taking x,
  W[j] = (the second term) / q'[j], is P(x true | j true so far); the tangent of the state's log
  weight (Cov(z) v) is dE'[j] = dE[j] + W[j] (dE[j - 1] + v - dE[j]).
- over the groups, the outer states (c true in u nonempty groups; u only when ``max_groups`` limits
  it), ``Qo[c, u]`` (float32) relative to ``Mo[c, u]`` (float64), the best path's log weight, a
  max-plus lattice of sums of logits, exact in float64: after group g (its q_g[j], top_g[j] float64),
  Mo'[c, u] = max_j Mo[c - j, u - [j > 0]] + top_g[j] and Qo'[c, u] = Σ_j Qo[..] q_g[j]
  exp(Mo[..] + top_g[j] - Mo'[c, u]), the exponent a float64 difference <= 0 rounded once.
- log Z (natural) = logsumexp over the band of log Qo + Mo, float64, once a token; no tilt is needed.

The reverse sweeps walk the same shares (``torch_groups``' ``_down``): each outer transition's share
F / A of the state after it, each group's count distribution w_g[j], then inside the group from
B = w_g, F[j] = B[j] W[j] (the marginal of the variable: Σ_j F[j]), B[j] -= F[j], B[j - 1] += F[j];
tangents alongside (dW = W (1 - W) (dE[j - 1] + v - dE[j])). A draw walks them with the uniforms of
``TorchGroupDP.draw_uniforms`` (the band state at t, group g's count at (1 + g) T + t, the variable
of column i at (1 + G + i) T + t), so the same seed draws the same subsets as the torch sweeps.

Scratch (float32 ``ck`` and float64 ``c64``, a block of rows a program, [programs, rows, BLOCK]: a
row of a program's tokens is contiguous, and a row is a constant offset from a token's pointer): the inner lattice
before every segment of ``ck`` positions of every group (q_1..q_C, h_1..h_C, dE_1..dE_C); the outer
rows before each group and after the last (Qo (dO) on the full (K + 1) x (U + 1) grid, Mo in c64),
each group's last inner row (q_g, dE_g; top_g in c64). The reverse sweeps recompute a segment's
lattices from its checkpoint and read an outer row at a per-token state (the draw) by address.

The outer step and its adjoint loop over the outer states at runtime (``_states``), each transition
behind a branch on scalars: written out state by state, a 256-expert backward took minutes to
compile. The MAP's kernel (kind "map") is the same two levels in (max, +), written out (it is small).
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass

from .triton_lattice import Src, define, insert_slot, module_source, store_slots, uniform

BLOCK = 128  # tokens per program: one per thread, 4 warps
# no software pipelining of the loops' loads: there is nothing to overlap (a thread's next scratch row
# depends on the last), and with it triton 3.9 takes many minutes to compile a 256-expert kernel
STAGES = 1
NEG = -1e30  # a -inf logit (and padding) in float32: d = x - h stays finite, its take factor exp(-1e30) = 0
LOG_ZERO = -1e30  # the float64 log weight of an unreachable outer state (no -inf - -inf)
ARGS = (
    "r_ptr, seed_ptr, ps_ptr, v_ptr, idx_ptr, mask_ptr, g_ptr, gs_ptr, gn_ptr, ck_ptr, c64_ptr, "
    "m_ptr, z_ptr, w_ptr, oidx_ptr, omask_ptr, lz_ptr, out_ptr, T, N, t0, tend, BLOCK: tl.constexpr"
)
TENSORS = [a for a in map(str.strip, ARGS.split(",")) if a.endswith("_ptr")]  # the tensor arguments, in order
INTS = {"T", "N", "t0", "tend"}
TYPES = {"seed_ptr": "*i64", "idx_ptr": "*i32", "mask_ptr": "*i8", "gs_ptr": "*i32", "gn_ptr": "*i32",
         "c64_ptr": "*fp64", "oidx_ptr": "*i64", "omask_ptr": "*i8"}  # fmt: skip


@dataclass(frozen=True)
class GroupPlan:
    """One generated kernel and everything its text is written for. ``groups``: the group sizes;
    ``capacity`` and ``max_groups`` as the spec's. kind "forward": ``log_z`` (write log P_indep(C)),
    ``marginals``, ``draw`` (write z), ``slots`` (> 0: the drawn by score in that many slots). kind
    "cov": Cov(z) v, ``v_from`` "given" or "softmax" / "sigmoid" (from slot gradients, Eq. 7's
    backward), ``paper`` (times sigma(-r)). kind "map": the most probable allowed subset and its log
    probability. ``ck``: positions per checkpoint segment (the MAP's: per unrolled step)."""

    kind: str
    groups: tuple[int, ...]
    kmin: int
    kmax: int
    capacity: int
    max_groups: int
    log_z: bool = False
    marginals: bool = False
    draw: bool = False
    slots: int = 0
    v_from: str = "given"
    paper: bool = False
    ck: int = 2

    @property
    def G(self) -> int:
        return len(self.groups)

    @property
    def C(self) -> int:
        """The most true variables a group holds."""
        return min(self.capacity, self.kmax, max(self.groups))

    @property
    def U(self) -> int:
        """The largest nonempty-group count tracked (0: not tracked)."""
        return self.max_groups if self.max_groups < self.G else 0

    @property
    def nseg(self) -> int:
        return -(-max(self.groups) // self.ck)

    @property
    def drawn_slots(self) -> int:
        """Slots the forward kernel fills with the drawn (the cov kernel's slots are its inputs)."""
        return self.slots if self.kind == "forward" else 0

    @property
    def tangent(self) -> bool:
        return self.kind == "cov"

    def valid(self, c: int, u: int) -> bool:
        """Whether outer state (c, u) can hold a path: c <= kmax, and with u tracked u <= c <= u C."""
        if self.U == 0:
            return u == 0 and c <= min(self.kmax, self.G * self.C)
        return u <= min(self.U, self.G) and u <= c <= u * self.C and c <= self.kmax

    @property
    def states(self) -> list[tuple[int, int]]:
        return [(c, u) for c in range(self.kmax + 1) for u in range(self.U + 1) if self.valid(c, u)]

    def source(self, c: int, u: int, j: int) -> tuple[int, int] | None:
        """The state before a group of j true that leads to (c, u), or None."""
        at = (c - j, u - (1 if j and self.U else 0))
        return at if at[0] >= 0 and at[1] >= 0 and self.valid(*at) else None

    # scratch rows, per token
    @property
    def inner_rows(self) -> int:
        return self.C * (3 if self.tangent else 2)

    @property
    def grid(self) -> int:
        return (self.kmax + 1) * (self.U + 1)

    @property
    def outer_at(self) -> int:
        return self.G * self.nseg * self.inner_rows

    @property
    def finals_at(self) -> int:
        return self.outer_at + (self.G + 1) * self.grid * (2 if self.tangent else 1)

    @property
    def adjoint_at(self) -> int:
        return self.finals_at + self.G * (self.C + 1) * (2 if self.tangent else 1)

    @property
    def rows32(self) -> int:
        if self.kind == "map":
            return self.G * self.C  # each group's C largest logits
        return self.adjoint_at + self.grid * (2 if self.tangent else 1)

    @property
    def rows64(self) -> int:
        return (self.G + 1) * self.grid + self.G * (self.C + 1)


def segment(groups: tuple[int, ...], capacity: int, kmax: int, tangent: bool) -> int:
    """Positions per checkpoint segment: 2 (1 for a lattice of more than 8 states with tangents)."""
    C = min(capacity, kmax, max(groups))
    return 1 if tangent and C >= 8 else 2


def _name(c: int, u: int) -> str:
    return f"{c}_{u}"


def _sum(terms: list[str], empty: str = "zero") -> str:
    return " + ".join(terms) if terms else empty


def _max(terms: list[str]) -> str:
    return functools.reduce(lambda a, b: f"tl.maximum({a}, {b})", terms)


def _row(plan: GroupPlan, offset: str, kind: str = "32") -> str:
    """The address of scratch row ``offset`` for this token: the program's block of rows, row j at
    j BLOCK from the token's pointer, so a constant row is an immediate offset of the load (no
    register holds it) and a warp's 32 tokens are one transaction; ``offset`` a scalar, or a
    per-token tensor (the draw's state)."""
    return f"{'ckt' if kind == '32' else 'c64t'} + ({offset}) * BLOCK"


def _outer(plan: GroupPlan, g: str, c, u, part: str) -> str:
    """The int64 row of outer row ``g``'s state (c, u): part "q" (Qo), "d" (dO) or "m" (Mo, c64)."""
    base = {"q": plan.outer_at, "d": plan.outer_at + (plan.G + 1) * plan.grid, "m": 0}[part]
    return f"{base} + ({g}) * {plan.grid} + ({c}) * {plan.U + 1} + ({u})"


def _final(plan: GroupPlan, g: str, j: int, part: str) -> str:
    """The row of group ``g``'s last inner state j: part "q", "d" or "t" (top, c64)."""
    C1 = plan.C + 1
    base = {"q": plan.finals_at, "d": plan.finals_at + plan.G * C1, "t": (plan.G + 1) * plan.grid}[part]
    return f"{base} + ({g}) * {C1} + {j}"


def _prologue(s: Src, plan: GroupPlan) -> None:
    s(
        "t = t0 + tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)  # [BLOCK] tokens, one per thread",
        "live = t < tend",
        "t64 = t.to(tl.int64)",
        "col = r_ptr + t64  # [BLOCK] pointers to the logit of variable 0 in rT [N, T] (i at + i * T)",
        "o64 = t64 * 0  # [BLOCK] int64 zeros",
        "zero = tl.zeros([BLOCK], tl.float32)",
        "one = zero + 1.0",
        "zero64 = zero.to(tl.float64)",
        "pid = tl.program_id(0).to(tl.int64)",
        f"ckt = ck_ptr + pid * {plan.rows32} * BLOCK + tl.arange(0, BLOCK)  # [BLOCK] this token's scratch: row j at + j * BLOCK",
        f"c64t = c64_ptr + pid * {plan.rows64} * BLOCK + tl.arange(0, BLOCK)",
    )


def _slot_inputs(s: Src, plan: GroupPlan) -> None:
    """The cov kernel's slot gradients (``v_from`` not "given"): the scores' normaliser, ix{k}, g{k},
    gs{k} = g{k} times its score, gsum."""
    S = plan.slots
    if plan.v_from == "softmax":
        s("rmax = zero - float('inf')", "for i in range(0, N):")
        with s.block():
            s("rmax = tl.maximum(rmax, tl.load(col + (o64 + i) * T, mask=live, other=float('-inf')))")
        s("den = zero", "for i in range(0, N):")
        with s.block():
            s("den += tl.exp(tl.load(col + (o64 + i) * T, mask=live, other=float('-inf')) - rmax)")
    for k in range(S):
        s(
            f"ix{k} = tl.load(idx_ptr + t64 * {S} + {k}, mask=live, other=-1)",
            f"g{k} = tl.where(tl.load(mask_ptr + t64 * {S} + {k}, mask=live, other=0) != 0, "
            f"tl.load(g_ptr + t64 * {S} + {k}, mask=live, other=0.0), 0.0)",
            f"rk = tl.load(col + tl.maximum(ix{k}, 0).to(tl.int64) * T, mask=live, other=float('-inf'))",
        )
        sc = "tl.exp(rk - rmax) / den" if plan.v_from == "softmax" else "1.0 / (1.0 + tl.exp(-rk))"
        s(f"gs{k} = g{k} * {sc}")
    s("gsum = " + _sum([f"gs{k}" for k in range(S)]))


def _variable(s: Src, plan: GroupPlan, l: int, softplus: bool = False) -> None:
    """Position sg * ck + l of group g: ok{l}, its column i{l} (int64), its logit y{l} (-inf off the
    group) and x{l} (``NEG`` for -inf), with tangents v{l} (and sc{l}, its score, from slots)."""
    s(
        f"pos = sg * {plan.ck} + {l}",
        f"ok{l} = live & (o64 + pos < gsz)",
        f"i{l} = (gst + pos).to(tl.int64)  # the column (a scalar: one for every token)",
        f"y{l} = tl.load(col + i{l} * T, mask=ok{l}, other=float('-inf'))",
        f"x{l} = tl.maximum(y{l}, {NEG})",
    )
    if softplus:
        s(f"y64 = y{l}.to(tl.float64)", "spx += tl.maximum(y64, 0.0) + tl.log(1.0 + tl.exp(-tl.abs(y64)))")
    if not plan.tangent:
        return
    if plan.v_from == "given":
        s(f"v{l} = tl.load(v_ptr + t64 * N + i{l}, mask=ok{l}, other=0.0)")
        return
    s(f"sc{l} = " + (f"tl.exp(y{l} - rmax) / den" if plan.v_from == "softmax" else f"1.0 / (1.0 + tl.exp(-y{l}))"))
    gv = _sum([f"tl.where(ix{k} == i{l}, g{k}, 0.0)" for k in range(plan.slots)])
    s(f"v{l} = tl.where(ok{l}, sc{l} * ({gv}), 0.0)  # the slots' gradients at i, times the score")


def _lat(L: str, part: str, j: int) -> str:
    """State j of inner lattice ``L``: part "q", "h" or "d" (q_0 = 1, dE_0 = 0)."""
    if j == 0 and part == "q":
        return "one"
    if j == 0 and part == "d":
        return "zero"
    return f"{L}{part}{j}"


def _factors(s: Src, plan: GroupPlan, L: str, l: int) -> None:
    """Take shares W{j} (and a{j} + b{j} > 0) of variable l against lattice L, j = 1..C."""
    for j in range(1, plan.C + 1):
        s(
            f"dd = x{l} - {_lat(L, 'h', j)}",
            "ee = tl.exp(-tl.abs(dd))",
            f"a{j} = {_lat(L, 'q', j)} * tl.where(dd > 0.0, ee, 1.0)",
            f"b{j} = {_lat(L, 'q', j - 1)} * tl.where(dd > 0.0, 1.0, ee)",
            f"W{j} = tl.where(a{j} + b{j} > 0.0, b{j} / (a{j} + b{j}), 0.0)",
        )


def _step(s: Src, plan: GroupPlan, L: str, D: str, l: int) -> None:
    """Inner lattice D = lattice L after variable l (in place when D == L: descending j)."""
    C = plan.C
    _factors(s, plan, L, l)
    for j in range(C, 0, -1):
        if plan.tangent:
            s(f"{D}d{j} = {_lat(L, 'd', j)} + W{j} * ({_lat(L, 'd', j - 1)} + v{l} - {_lat(L, 'd', j)})")
        s(f"{D}q{j} = a{j} + b{j}")
    _insert(s, plan, L, D, l)


def _insert(s: Src, plan: GroupPlan, L: str, D: str, l: int) -> None:
    """D's h_1 >= .. >= h_C = the C largest of L's and x{l} (an insertion network)."""
    s(f"xx = x{l}")
    for j in range(1, plan.C + 1):
        s(f"yy = tl.maximum({_lat(L, 'h', j)}, xx)", f"xx = tl.minimum({_lat(L, 'h', j)}, xx)", f"{D}h{j} = yy")


def _checkpoint(s: Src, plan: GroupPlan, L: str, store: bool) -> None:
    """Store (or load into lattice L) the inner lattice before segment sg of group g."""
    s(f"base = (g * {plan.nseg} + sg) * {plan.inner_rows}  # a scalar row")
    parts = ("q", "h", "d") if plan.tangent else ("q", "h")
    for k, part in enumerate(parts):
        for j in range(1, plan.C + 1):
            at = _row(plan, f"base + {k * plan.C + j - 1}")
            s(
                f"tl.store({at}, {L}{part}{j}, mask=live)"
                if store
                else f"{L}{part}{j} = tl.load({at}, mask=live, other=0.0)"
            )


def _load(plan: GroupPlan, g: str, c, u, part: str, name: str, mask: str = "live") -> str:
    """``name`` = outer row ``g``'s part ("q", "d" or "m") at state (c, u), by address."""
    kind = "64" if part == "m" else "32"
    return f"{name} = tl.load({_row(plan, _outer(plan, g, c, u, part), kind)}, mask={mask}, other=0.0)"


def _store(plan: GroupPlan, row: str, value: str, kind: str = "32") -> str:
    """The store of ``value`` at scratch row ``row`` (kind "64": the float64 scratch)."""
    return f"tl.store({_row(plan, row, kind)}, {value}, mask=live)"


def _forward_sweep(s: Src, plan: GroupPlan) -> None:
    """Every group's inner lattice (with checkpoints) in registers, then the outer lattice's step over
    it, from outer row g to row g + 1 in scratch (no outer state is held across groups)."""
    C = plan.C
    for c, u in plan.states:
        first = (c, u) == (0, 0)
        s(_store(plan, _outer(plan, 0, c, u, "q"), "one" if first else "zero"))
        s(_store(plan, _outer(plan, 0, c, u, "m"), "zero64" if first else f"zero64 + {LOG_ZERO}", "64"))
        if plan.tangent:
            s(_store(plan, _outer(plan, 0, c, u, "d"), "zero"))
    s(f"for g in range(0, {plan.G}):")
    with s.block():
        s("gst = tl.load(gs_ptr + g)", "gsz = tl.load(gn_ptr + g)")
        for j in range(1, C + 1):
            s(f"q{j} = zero", f"h{j} = zero + {NEG}")
            if plan.tangent:
                s(f"d{j} = zero")
        s(f"for sg in range(0, {plan.nseg}):")
        with s.block():
            _checkpoint(s, plan, "", store=True)
            for l in range(plan.ck):
                _variable(s, plan, l, softplus=plan.log_z)
                _step(s, plan, "", "", l)
        s("tg0 = zero64")
        for j in range(C + 1):
            if j:
                s(f"tg{j} = tg{j - 1} + h{j}.to(tl.float64)")
            s(_store(plan, _final(plan, "g", j, "t"), f"tg{j}", "64"))
            s(_store(plan, _final(plan, "g", j, "q"), _lat("", "q", j)))
            if plan.tangent:
                s(_store(plan, _final(plan, "g", j, "d"), _lat("", "d", j)))
        _outer_step(s, plan)


@contextlib.contextmanager
def _states(s: Src, plan: GroupPlan):
    """Runtime loops over the valid outer states (c, u) in ``plan.states``' order, c ascending then u
    (scalars c, u in the body written inside the ``with``): one copy of the body instead of one a
    state keeps the kernels' code, and their compile time, small. With C = 0 (k = 0) the one state
    is (0, 0)."""
    top = min(plan.U, plan.G)
    loop_u = plan.U and plan.C
    s(f"for c in range(0, {min(plan.kmax, (top if plan.U else plan.G) * plan.C) + 1}):")
    s.depth += 1
    s(f"for u in range((c + {plan.C - 1}) // {plan.C}, tl.minimum(c, {top}) + 1):" if loop_u else "u = 0")
    s.depth += 1 if loop_u else 0
    yield
    s.depth -= 2 if loop_u else 1


def _valid(plan: GroupPlan, c: str, u: str) -> str:
    """Whether the outer state (c, u) can hold a path (``GroupPlan.valid``), c and u at runtime (scalars,
    or a token's state) that may lie off the grid."""
    c, u = f"({c})", f"({u})"
    if plan.U:
        top = min(plan.U, plan.G)
        return (
            f"({c} >= 0) & ({u} >= 0) & ({u} <= {top}) & ({u} <= {c}) & ({c} <= {u} * {plan.C}) & ({c} <= {plan.kmax})"
        )
    return f"({c} >= 0) & ({u} == 0) & ({c} <= {min(plan.kmax, plan.G * plan.C)})"


def _outer_step(s: Src, plan: GroupPlan) -> None:
    """Outer row g + 1 from row g and the group's q{j}, d{j} (registers) and top_j (scratch), state by
    state (a runtime loop): the sources (c - j, u - [j > 0]) that exist, each behind a branch that
    is the same for every thread (c and u are scalars), so the others cost nothing."""
    C = plan.C
    with _states(s, plan):
        for j in range(C + 1):
            du = 1 if j and plan.U else 0
            tg = f"tl.load({_row(plan, _final(plan, 'g', j, 't'), '64')}, mask=live, other=0.0)" if j else "0.0"
            s(f"ok{j} = {_valid(plan, f'c - {j}', f'u - {du}')}", f"e{j} = zero64 - float('inf')", f"if ok{j}:")
            with s.block():
                s(_load(plan, "g", f"c - {j}", f"u - {du}", "m", f"e{j}"), f"e{j} += {tg}")
        s(f"mn = {_max([f'e{j}' for j in range(C + 1)])}", "qn = zero")
        if plan.tangent:
            s("tq = zero")
        for j in range(C + 1):
            du = 1 if j and plan.U else 0
            s(f"if ok{j}:")
            with s.block():
                s(
                    _load(plan, "g", f"c - {j}", f"u - {du}", "q", "qs"),
                    f"tt = qs * {_lat('', 'q', j)} * tl.exp((e{j} - mn).to(tl.float32))",
                    "qn += tt",
                )
                if plan.tangent:
                    s(_load(plan, "g", f"c - {j}", f"u - {du}", "d", "ds"), f"tq += tt * (ds + {_lat('', 'd', j)})")
        if plan.tangent:
            s(_store(plan, _outer(plan, "g + 1", "c", "u", "d"), "tl.where(qn > 0.0, tq / qn, 0.0)"))
        s(_store(plan, _outer(plan, "g + 1", "c", "u", "q"), "qn"))
        s(_store(plan, _outer(plan, "g + 1", "c", "u", "m"), "mn", "64"))


def _adjoint(plan: GroupPlan, c, u, part: str) -> str:
    """The row of the outer adjoint at (c, u) (ints, or scalars at runtime): part "a" (A) or "d" (its
    tangent dA)."""
    return f"{plan.adjoint_at + (plan.grid if part == 'd' else 0)} + ({c}) * {plan.U + 1} + ({u})"


def _band(s: Src, plan: GroupPlan) -> None:
    """log Z (natural, float64) ``lzn`` and ``allowed`` from outer row G; with an adjoint sweep to
    come, A = P(the final state) (and its tangent dA) in scratch; cum{k}: the band's cumulative
    probabilities (a draw)."""
    band = [(c, u) for c, u in plan.states if c >= plan.kmin]
    G = str(plan.G)
    for c, u in band:
        n = _name(c, u)
        s(_load(plan, G, c, u, "q", f"Qo{n}"), _load(plan, G, c, u, "m", f"Mo{n}"))
        s(f"lw{n} = tl.where(Qo{n} > 0.0, tl.log(Qo{n}.to(tl.float64)) + Mo{n}, {2 * LOG_ZERO})")
    s(f"lmax = {_max([f'lw{_name(c, u)}' for c, u in band])}")
    for c, u in band:
        s(f"ew{_name(c, u)} = tl.exp(lw{_name(c, u)} - lmax)")
    s(f"etot = {_sum([f'ew{_name(c, u)}' for c, u in band])}")
    s("lzn = lmax + tl.log(etot)", f"allowed = lzn > {LOG_ZERO / 2}")
    if plan.marginals or plan.tangent:
        for c, u in band:
            s(f"A{_name(c, u)} = (ew{_name(c, u)} / etot).to(tl.float32)")
        if plan.tangent:
            for c, u in band:
                s(_load(plan, G, c, u, "d", f"dO{_name(c, u)}"))
            s(f"dlz = {_sum([f'A{_name(c, u)} * dO{_name(c, u)}' for c, u in band])}")
        for c, u in plan.states:
            n = _name(c, u)
            s(_store(plan, _adjoint(plan, c, u, "a"), f"A{n}" if (c, u) in band else "zero"))
            if plan.tangent:
                s(_store(plan, _adjoint(plan, c, u, "d"), f"A{n} * (dO{n} - dlz)" if (c, u) in band else "zero"))
    if plan.kind == "forward" and (plan.draw or plan.slots):
        acc = "zero"
        for k, (c, u) in enumerate(band):
            s(f"cum{k} = {acc} + (ew{_name(c, u)} / etot).to(tl.float32)")
            acc = f"cum{k}"
        last = f"cum{len(band) - 1}"
        s("seed = tl.load(seed_ptr).to(tl.uint64)")
        uniform(s, "us", "t64")
        s(f"ux = tl.minimum(us * {last}, {last} * {1.0 - 2.0**-23!r})", "pick = tl.zeros([BLOCK], tl.int32)")
        for k in range(len(band) - 1):
            s(f"pick += (cum{k} <= ux).to(tl.int32)")
        s(f"cs = {_sum([f'tl.where(pick == {k}, {c}, 0)' for k, (c, _) in enumerate(band)], '0')}")
        s(f"us_ = {_sum([f'tl.where(pick == {k}, {u}, 0)' for k, (_, u) in enumerate(band)], '0')}")


def _group_adjoint(s: Src, plan: GroupPlan) -> None:
    """Group g's count distribution w{j} (dw{j}), and the outer adjoint A (dA) stepped back over the
    group, in place in scratch: source states ascending in a runtime loop (a state's targets are
    itself and later states, read before it is written), each target (c + j, u + [j > 0]) that
    exists behind a branch that is the same for every thread."""
    C = plan.C
    for j in range(C + 1):
        s(f"w{j} = zero")
        if plan.tangent:
            s(f"dw{j} = zero")
    with _states(s, plan):
        s(_load(plan, "g", "c", "u", "q", "qs"), _load(plan, "g", "c", "u", "m", "ms"), "acc = zero")
        if plan.tangent:
            s(_load(plan, "g", "c", "u", "d", "ds"), "dacc = zero")
        for j in range(C + 1):
            ct, ut = f"c + {j}", f"u + {1 if j and plan.U else 0}"
            s(f"if {_valid(plan, ct, ut)}:")
            with s.block():
                s(
                    _load(plan, "g + 1", ct, ut, "q", "qt"),
                    _load(plan, "g + 1", ct, ut, "m", "mt"),
                    f"aa = tl.load({_row(plan, _adjoint(plan, ct, ut, 'a'))}, mask=live, other=0.0)",
                    f"qj = tl.load({_row(plan, _final(plan, 'g', j, 'q'))}, mask=live, other=0.0)",
                    f"tj = tl.load({_row(plan, _final(plan, 'g', j, 't'), '64')}, mask=live, other=0.0)",
                    "sh = tl.where(qt > 0.0, qs * qj * tl.exp((ms + tj - mt).to(tl.float32)) / qt, 0.0)",
                    "ff = aa * sh  # the flow through this transition",
                    f"w{j} += ff",
                    "acc += ff",
                )
                if plan.tangent:
                    s(
                        _load(plan, "g + 1", ct, ut, "d", "dt"),
                        f"dat = tl.load({_row(plan, _adjoint(plan, ct, ut, 'd'))}, mask=live, other=0.0)",
                        f"dj = tl.load({_row(plan, _final(plan, 'g', j, 'd'))}, mask=live, other=0.0)",
                        "df = sh * (dat + aa * (ds + dj - dt))",
                        f"dw{j} += df",
                        "dacc += df",
                    )
        s(_store(plan, _adjoint(plan, "c", "u", "a"), "acc"))
        if plan.tangent:
            s(_store(plan, _adjoint(plan, "c", "u", "d"), "dacc"))


def _source(s: Src, plan: GroupPlan, j: int, *parts: tuple[str, str]) -> None:
    """For the per-token state (cs, us_) after group g: (cj, uj), the state before it with j true in
    the group, ``okj`` whether that state exists, and for each (part, name) of ``parts`` ``name`` =
    outer row g's part ("q" or "m") there, 0 where it does not."""
    s(f"cj = cs - {j}", f"uj = us_ - {1 if j and plan.U else 0}", f"okj = live & {_valid(plan, 'cj', 'uj')}")
    for part, name in parts:
        at = _outer(plan, "g", "tl.maximum(cj, 0)", "tl.maximum(uj, 0)", part)
        s(f"{name} = tl.load({_row(plan, at, '64' if part == 'm' else '32')}, mask=okj, other=0.0)")


def _step_back(s: Src, plan: GroupPlan) -> None:
    """The per-token state (cs, us_) before group g, given its count gj."""
    s("cs = cs - gj")
    if plan.U:
        s("us_ = us_ - (gj > 0).to(tl.int32)")


def _group_count(s: Src, plan: GroupPlan) -> None:
    """The draw: group g's count gj from the state (cs, us_) after it, reading the outer rows by
    address; the state steps back."""
    s(_load(plan, "g + 1", "cs", "us_", "m", "mt"))  # the weights p_j below are relative to it
    acc = "zero"
    for j in range(plan.C + 1):
        _source(s, plan, j, ("q", "qs"), ("m", "ms"))
        s(f"pc{j} = {acc} + tl.where(okj, qs * qg{j} * tl.exp((ms + tg{j} - mt).to(tl.float32)), 0.0)")
        acc = f"pc{j}"
    s("uniform_at = (o64 + 1 + g) * T + t64")
    uniform(s, "ug", "uniform_at")
    s(f"ux = tl.minimum(ug * {acc}, {acc} * {1.0 - 2.0**-23!r})", "gj = tl.zeros([BLOCK], tl.int32)")
    for j in range(plan.C):
        s(f"gj += (pc{j} <= ux).to(tl.int32)")
    _step_back(s, plan)
    s("cnt = gj")


def _group_walk(s: Src, plan: GroupPlan) -> None:
    """Group g's positions, last first: the marginals (or their tangents) from B = w (dB = dw), the
    draw's variables given its count, the drawn by score in slots."""
    C, ck, S = plan.C, plan.ck, plan.drawn_slots
    walk = plan.draw or S
    adj = plan.marginals or plan.tangent
    if adj:
        for j in range(C + 1):
            s(f"B{j} = w{j}")
            if plan.tangent:
                s(f"dB{j} = dw{j}")
    s(f"for sg in range({plan.nseg - 1}, -1, -1):")
    with s.block():
        _checkpoint(s, plan, "P0", store=False)
        for l in range(ck):
            _variable(s, plan, l)
            if l + 1 < ck:
                _step(s, plan, f"P{l}", f"P{l + 1}", l)
        for l in range(ck - 1, -1, -1):
            _factors(s, plan, f"P{l}", l)
            if plan.tangent:
                for j in range(1, C + 1):
                    L = f"P{l}"
                    s(f"dW{j} = W{j} * (1.0 - W{j}) * ({_lat(L, 'd', j - 1)} + v{l} - {_lat(L, 'd', j)})")
            if adj:
                for j in range(1, C + 1):
                    s(f"F{j} = B{j} * W{j}")
                    if plan.tangent:
                        s(f"dF{j} = dB{j} * W{j} + B{j} * dW{j}")
                at = f"t64 * N + i{l}"
                if plan.marginals:
                    m = _sum([f"F{j}" for j in range(1, C + 1)])
                    s(f"tl.store(m_ptr + {at}, tl.where(allowed, {m}, float('nan')), mask=ok{l})")
                if plan.tangent:
                    s(f"out = {_sum([f'dF{j}' for j in range(1, C + 1)])}  # d m_i along v")
                    if plan.paper:
                        s(f"out = out / (1.0 + tl.exp(y{l}))  # times sigma(-r)")
                    if plan.v_from == "softmax":
                        s(f"out += v{l} - sc{l} * gsum")
                    elif plan.v_from == "sigmoid":
                        s(f"out += v{l} * (1.0 - sc{l})")
                    s(f"tl.store(out_ptr + {at}, tl.where(allowed, out, float('nan')), mask=ok{l})")
                for j in range(C + 1):
                    nxt = f" + F{j + 1}" if j < C else ""
                    own = f" - F{j}" if j else ""
                    s(f"B{j} = B{j}{own}{nxt}")
                    if plan.tangent:
                        s(f"dB{j} = dB{j}{own.replace('F', 'dF')}{nxt.replace('F', 'dF')}")
            if walk:
                s(f"wz = {_sum([f'tl.where(cnt == {j}, W{j}, 0.0)' for j in range(1, C + 1)])}")
                s(f"uniform_at = (o64 + {1 + plan.G}) * T + i{l} * T + t64")
                uniform(s, "ui", "uniform_at")
                s(f"zi = (ui < wz) & ok{l}", "cnt -= zi.to(tl.int32)")
                if plan.draw:
                    s(
                        f"tl.store(z_ptr + t64 * N + i{l}, tl.where(allowed, zi.to(tl.float32), float('nan')), mask=ok{l})"
                    )
                if S:
                    s(
                        f"kn = tl.where(zi, tl.load(ps_ptr + t64 * N + i{l}, mask=zi, other=0.0), -1.0)",
                        f"kn = tl.where(ok{l}, kn, float('-inf'))",
                        f"jn = i{l}.to(tl.int32)",
                    )
                    insert_slot(s, S)


def _map_sweep(s: Src, plan: GroupPlan) -> None:
    """The MAP's up sweep, (max, +) in float64: each group's C largest logits h{j} (scratch rows
    g C + j - 1) and their prefix sums tg{j} (the best subset of j true in the group; c64), then the
    outer row g + 1 of best log weights, Mo'[c, u] = max_j Mo[c - j, u - [j > 0]] + tg{j}."""
    C = plan.C
    for c, u in plan.states:
        s(_store(plan, _outer(plan, 0, c, u, "m"), "zero64" if (c, u) == (0, 0) else f"zero64 + {LOG_ZERO}", "64"))
    s(f"for g in range(0, {plan.G}):")
    with s.block():
        s("gst = tl.load(gs_ptr + g)", "gsz = tl.load(gn_ptr + g)")
        s(*(f"h{j} = zero + {NEG}" for j in range(1, C + 1)))
        s(f"for sg in range(0, {plan.nseg}):")
        with s.block():
            for l in range(plan.ck):
                _variable(s, plan, l, softplus=True)
                _insert(s, plan, "", "", l)
        s("tg0 = zero64")
        for j in range(1, C + 1):
            s(f"tg{j} = tg{j - 1} + h{j}.to(tl.float64)", _store(plan, f"g * {C} + {j - 1}", f"h{j}"))
            s(_store(plan, _final(plan, "g", j, "t"), f"tg{j}", "64"))
        for c, u in plan.states:
            src = [(j, plan.source(c, u, j)) for j in range(min(C, c) + 1)]
            src = [(j, at) for j, at in src if at is not None]
            for j, at in src:
                s(_load(plan, "g", *at, "m", f"e{j}"), f"e{j} += tg{j}")
            s(_store(plan, _outer(plan, "g + 1", c, u, "m"), _max([f"e{j}" for j, _ in src]), "64"))


def _map_band(s: Src, plan: GroupPlan) -> None:
    """The best final state (cs, us_) of the band, the first in (c, u) order among equals, its log
    weight ``best`` (float64), ``allowed``, and the log probability written to lz."""
    s(f"best = zero64 + {2 * LOG_ZERO}", "cs = tl.zeros([BLOCK], tl.int32)", "us_ = cs")
    for c, u in plan.states:
        if c >= plan.kmin:
            s(_load(plan, str(plan.G), c, u, "m", "mv"), "bt = mv > best")
            s("best = tl.where(bt, mv, best)", f"cs = tl.where(bt, {c}, cs)", f"us_ = tl.where(bt, {u}, us_)")
    s(
        f"allowed = best > {LOG_ZERO / 2}",
        "tl.store(lz_ptr + t64, tl.where(allowed, best - spx, float('-inf')).to(tl.float32), mask=live)",
    )


def _map_back(s: Src, plan: GroupPlan) -> None:
    """The groups last first: group g's count gj, the first j of the best Mo[c - j, u - [j > 0]] +
    tg{j} (as the torch sweeps' max), then its gj largest logits true, equal logits by lower index
    first (the threshold h_gj, ``ties`` of the equal ones to take). Rows that allow nothing: z = 0."""
    C, low = plan.C, f"zero64 + {4 * LOG_ZERO}"
    s(f"for g in range({plan.G - 1}, -1, -1):")
    with s.block():
        s("gst = tl.load(gs_ptr + g)", "gsz = tl.load(gn_ptr + g)", f"eb = {low}", "gj = tl.zeros([BLOCK], tl.int32)")
        for j in range(C + 1):
            top = f"tl.load({_row(plan, _final(plan, 'g', j, 't'), '64')}, mask=live, other=0.0)" if j else "0.0"
            _source(s, plan, j, ("m", "ej"))
            s(
                f"ej = tl.where(okj, ej + {top}, {low})",
                "bt = ej > eb",
                "eb = tl.where(bt, ej, eb)",
                f"gj = tl.where(bt, {j}, gj)",
            )
        _step_back(s, plan)
        for j in range(1, C + 1):
            s(f"h{j} = tl.load({_row(plan, f'g * {C} + {j - 1}')}, mask=live, other=0.0)")
        s(f"thr = {_sum([f'tl.where(gj == {j}, h{j}, 0.0)' for j in range(1, C + 1)])}")
        s(f"ties = gj - ({_sum([f'((h{j} > thr) & (gj >= {j})).to(tl.int32)' for j in range(1, C + 1)], '0')})")
        s(f"for sg in range(0, {plan.nseg}):")
        with s.block():
            for l in range(plan.ck):
                _variable(s, plan, l)
                s(
                    f"tie = ok{l} & (gj > 0) & (x{l} == thr) & (ties > 0)",
                    f"zi = (ok{l} & (gj > 0) & (x{l} > thr)) | tie",
                    "ties -= tie.to(tl.int32)",
                    f"tl.store(z_ptr + t64 * N + i{l}, tl.where(allowed & zi, 1.0, 0.0), mask=ok{l})",
                )


def _map_source(plan: GroupPlan) -> str:
    s = Src()
    _prologue(s, plan)
    s("spx = zero64")
    _map_sweep(s, plan)
    _map_band(s, plan)
    _map_back(s, plan)
    return module_source(f"def kernel({ARGS}):", s)


def source(plan: GroupPlan) -> str:
    """The kernel of ``plan``: the forward sweep, the band, then (when anything is wanted past log Z)
    the groups last first: their count distributions (or the draw's counts), then their positions.
    The MAP's kernel: its (max, +) sweep, the best final state, the groups' counts last first."""
    if plan.kind == "map":
        return _map_source(plan)
    s = Src()
    _prologue(s, plan)
    if plan.tangent and plan.v_from != "given":
        _slot_inputs(s, plan)
    if plan.log_z:
        s("spx = zero64")
    _forward_sweep(s, plan)
    _band(s, plan)
    if plan.log_z:
        s("tl.store(lz_ptr + t64, tl.where(allowed, lzn - spx, float('-inf')).to(tl.float32), mask=live)")
    S = plan.drawn_slots
    for k in range(S):
        s(f"key{k} = zero - float('inf')", f"ix{k} = tl.full([BLOCK], -1, tl.int32)")
    if plan.marginals or plan.tangent or plan.draw or S:
        s(f"for g in range({plan.G - 1}, -1, -1):")
        with s.block():
            s("gst = tl.load(gs_ptr + g)", "gsz = tl.load(gn_ptr + g)")
            if plan.marginals or plan.tangent:
                _group_adjoint(s, plan)
            if plan.draw or S:
                for j in range(plan.C + 1):  # the group's last inner row, for its count's draw
                    s(
                        f"qg{j} = tl.load({_row(plan, _final(plan, 'g', j, 'q'))}, mask=live, other=0.0)",
                        f"tg{j} = tl.load({_row(plan, _final(plan, 'g', j, 't'), '64')}, mask=live, other=0.0)",
                    )
                _group_count(s, plan)
            _group_walk(s, plan)
    store_slots(s, S, "oidx_ptr", "omask_ptr")
    return module_source(f"def kernel({ARGS}):", s)


@functools.lru_cache(maxsize=64)
def kernel(plan: GroupPlan):
    """The Triton kernel of ``plan``, generated and defined once per process."""
    return define(source(plan))
