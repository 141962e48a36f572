"""The cardinality lattice as Triton kernels, one token per thread, the lattice in registers: the
source of each kernel, written out for its sizes, and the compiled (or interpreted) function.

Every kernel reads the logits transposed, rT [N, T] (``triton_dp``), so that the loads of a warp's
32 tokens at one variable are one coalesced transaction; its passes over a token's logits load
``CHUNK`` of them at once. Triton cannot shift a register tensor along an axis, and a [B, K] tile
would need a gather or a shift matmul per step, so each kernel holds the count lattice P[0..K] of
its token as K + 1 separate [BLOCK] values and is generated as text for its (kmin, kmax, slots,
...): every lattice state is a named variable, and a DP step P'[j] = q P[j] + p P[j - 1] is two
instructions per state with no shuffle, no shared memory and no dynamic index. ``plain_forward`` is the forward
kernel's lattice and adjoint lattice in plain torch (float64, the same probability form); the tests
compare it and the kernels with the torch DP (``circuits.kernels.torch_dp``), the oracle of every DP
implementation, and the kernels' marginals with it.

The mathematics (probability form, ``docs/performance.md``, "The GPU lattice"). With the tilt c of
``torch_passes.tilt_constant`` (its Newton steps included: the expected size under
Bernoulli(sigma(r - c)) sits in the band, so the likely sizes have probabilities near 1 and nothing
underflows that matters) and x = r - c, p_i = sigma(x_i), q_i = sigma(-x_i):

    P_0 = e_0,  P_{i+1}[j] = q_i P_i[j] + p_i P_i[j - 1]        (Alg. 2 on probabilities)
    pi_j = P_N[j] e^{(j - kmin) c} / sum over the band             (P(|S| = j | C), j = kmin..kmax)
    B_N[j] = pi_j / P_N[j],  B_i[j] = q_i B_{i+1}[j] + p_i B_{i+1}[j + 1]      (the adjoint lattice)
    m_i = p_i sum_j P_i[j - 1] B_{i+1}[j]                          (prefix x suffix)

and the exact draw walks i = N - 1 .. 0 with the remaining size s: z_i = [u_i < p_i P_i[s - 1] /
P_{i+1}[s]], s -= z_i, on the counter-based uniforms of ``circuits.kernels.uniforms`` at the
indices ``torch_dp.down`` uses (the size at t, variable i at T + i T + t), so the same seed draws
the same subsets as the torch and C sweeps (up to a uniform within a rounding of a threshold).
Cov(z) v is the forward-mode tangent of m along v (dp_i = p_i q_i v_i, c held fixed: m does not
depend on it). The reverse sweeps need P_i: the forward sweep stores the lattice every CK variables
(``checkpoint``, token-contiguous [segments, states, T]) and the reverse sweep recomputes each
segment into registers. ``log_counts`` sweeps log-probabilities in float64 instead (the log count
of an unlikely size must not underflow).
"""

from __future__ import annotations

import functools
import hashlib
import linecache
import re
from dataclasses import dataclass

import torch
from torch import Tensor

from .torch_passes import TILT_STEPS
from .uniforms import _GOLDEN, _M1, _M2

BLOCK = 128  # tokens per program: one per thread, 4 warps
CHUNK = 8  # logits a thread loads at once in the passes over its row (``_logit_pass``)
# lattice values a thread keeps for a segment's recompute, per kind: the segment length CK follows.
# Compiled for sm_90 (triton 3.9, with rT loads and 8-logit chunks): 8 of 64 forward with slots at
# CK = 4 uses 80 registers, Cov(z) v at CK = 3 128; 16 of 256 forward at CK = 2 120, Cov(z) v with 16
# slots at CK = 1 248 (triton 3.6, the GPU image's: 95, 168, 94, 254). No spills in any of them.
REGISTER_STATES = {"forward": 40, "cov": 32}
LOG_ZERO = -1e300  # the float64 log sweep's finite log 0 (no -inf - -inf)


@dataclass(frozen=True)
class Plan:
    """One generated kernel: its kind ("forward", "cov" or "log_counts") and everything its text
    is written for. forward: ``marginals`` (write m), ``draw`` (write z), ``slots`` (> 0: the drawn
    by score in that many slots). cov: ``v_from`` "given" (v [T, N]) or "softmax" / "sigmoid" (v
    from slot gradients, Eq. 7's backward with those scores), ``paper`` (times sigma(-r)).
    ``ck``: variables per checkpoint segment."""

    kind: str
    kmin: int
    kmax: int
    marginals: bool = False
    draw: bool = False
    slots: int = 0
    v_from: str = "given"
    paper: bool = False
    ck: int = 1

    @property
    def scratch_at(self) -> int:
        """Where the checkpoint scratch comes among the kernel's tensors after r."""
        return 2 if self.kind == "forward" else 4


def segment(kind: str, kmax: int) -> int:
    """Variables per checkpoint segment: as many lattices of kmax + 1 states as ``REGISTER_STATES``
    holds for ``kind`` (less for "cov", whose lattice carries its tangents too), 1 to 8."""
    return max(1, min(8, REGISTER_STATES[kind] // (kmax + 1)))


class Src:
    """Lines of Python source at an indentation."""

    def __init__(self):
        self.lines: list[str] = []
        self.depth = 1

    def __call__(self, *lines: str) -> None:
        self.lines.extend("    " * self.depth + line for line in lines)

    def block(self):
        src = self

        class _Indent:
            def __enter__(self):
                src.depth += 1

            def __exit__(self, *exc):
                src.depth -= 1

        return _Indent()


def _join(terms: list[str], empty: str = "zero") -> str:
    return " + ".join(terms) if terms else empty


def _logit_pass(s: Src, body) -> None:
    """A pass over the row's logits in chunks of ``CHUNK`` variables: the chunk's loads first, all
    independent (a thread waits out one memory latency per chunk; the compiler unrolled a loop over
    single variables by 4), then ``body(name)`` for each logit in order (``name``: a [BLOCK]
    float32, -inf past N: every pass's neutral element)."""
    s(f"for ib in range(0, N, {CHUNK}):  # the chunk's first variable")
    with s.block():
        for j in range(CHUNK):
            s(f"a{j} = tl.load(col + (o64 + ib + {j}) * T, mask=live & (o64 + ib + {j} < N), other=float('-inf'))")
        for j in range(CHUNK):
            body(f"a{j}")


def _prologue(s: Src, plan: Plan, rmax: bool) -> None:
    """Tokens, rows, and the tilt c [BLOCK] (``torch_passes.tilt_constant`` with its Newton steps):
    the kmax-th and kmin-th largest logits by an insertion network over registers h0 >= h1 >= ...,
    and sum sigma(r), in one pass; ``rmax``: also the row's largest logit (softmax scores)."""
    K = plan.kmax
    s(
        "t = t0 + tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)  # [BLOCK] tokens, one per thread",
        "live = t < tend",
        "t64 = t.to(tl.int64)",
        "tc = (t - t0).to(tl.int64)  # the token in this launch's chunk (the checkpoints' column)",
        "col = r_ptr + t64  # [BLOCK] pointers to each token's logit of variable 0 in rT [N, T] (i at + i * T)",
        "o64 = tc * 0  # [BLOCK] int64 zeros: variable times T in int64",
        "zero = tl.zeros([BLOCK], tl.float32)",
        "ninf = zero - float('inf')",
    )
    for j in range(K):
        s(f"h{j} = ninf")
    if rmax:
        s("rmax = ninf")
    if K:
        s("tot = zero")

    def first(a: str) -> None:
        s(f"x = {a}")
        if rmax:
            s("rmax = tl.maximum(rmax, x)")
        for j in range(K):
            s(f"y = tl.maximum(h{j}, x)", f"x = tl.minimum(h{j}, x)", f"h{j} = y")
        if K:
            s(f"tot += 1.0 / (1.0 + tl.exp(-{a}))")

    _logit_pass(s, first)
    hi = f"h{K - 1}" if K else "(zero + float('inf'))"
    lo = f"h{plan.kmin - 1}" if plan.kmin else "(zero + float('inf'))"
    s(
        f"c = tl.minimum({lo}, tl.maximum({hi}, 0.0))",
        "c = tl.where(tl.abs(c) < float('inf'), c, 0.0)  # [BLOCK]",
    )
    if K == 0:
        return
    s(
        f"lwant = tl.log(tl.minimum(tl.maximum(tot, {float(plan.kmin)}), {float(K)}))",
        f"for _ in range(0, {TILT_STEPS}):  # Newton steps on log sum sigma(r - c) (torch_passes._refine)",
    )
    with s.block():
        s("tot = zero", "slope = zero")

        def newton(a: str) -> None:
            s(f"p = 1.0 / (1.0 + tl.exp(-({a} - c)))", "tot += p", "slope += p * (1.0 - p)")

        _logit_pass(s, newton)
        s(
            "st = (tl.log(tot) - lwant) * tot / slope",
            "ok = (tl.abs(st) < float('inf')) & (tot > 0.0) & (slope > 0.0)",
            "c += tl.where(ok, tl.minimum(tl.maximum(st, -20.0), 20.0), 0.0)",
        )


def uniform(s: Src, out: str, index: str) -> None:
    """``out`` = u(seed, index) [BLOCK] float32 (``uniforms.reference``: splitmix64 of seed +
    (index + 1) golden, top 24 bits)."""
    s(
        f"zz = ({index} + 1).to(tl.uint64) * GOLDEN + seed",
        "zz = (zz ^ (zz >> 30)) * M1",
        "zz = (zz ^ (zz >> 27)) * M2",
        "zz = zz ^ (zz >> 31)",
        f"{out} = (zz >> 40).to(tl.float32) * 5.960464477539063e-08",
    )


def insert_slot(s: Src, S: int) -> None:
    """Insert the key kn [BLOCK] (a drawn variable's score; -1 undrawn, -inf off the row) of variable
    jn (int32) into the slots key0 >= key1 >= .. (indices ix0, ix1, ..): the variables come in
    descending order, so the new one has the lowest index so far and goes before equal keys."""
    for k in range(S):
        s(
            f"sw = kn >= key{k}",
            f"ko = key{k}",
            f"jo = ix{k}",
            f"key{k} = tl.where(sw, kn, ko)",
            f"ix{k} = tl.where(sw, jn, jo)",
            "kn = tl.where(sw, ko, kn)",
            "jn = tl.where(sw, jo, jn)",
        )


def store_slots(s: Src, S: int, idx: str, mask: str) -> None:
    """Write the slots: the weights (a drawn variable's score, 0 for an unused slot) to w_ptr, the
    indices (int64) and the used mask (int8) to the pointers named ``idx`` and ``mask``, [T, S] each."""
    for k in range(S):
        s(
            f"used = key{k} >= 0.0",
            f"tl.store(w_ptr + t64 * {S} + {k}, tl.where(used, key{k}, 0.0), mask=live)",
            f"tl.store({idx} + t64 * {S} + {k}, ix{k}.to(tl.int64), mask=live)",
            f"tl.store({mask} + t64 * {S} + {k}, used.to(tl.int8), mask=live)",
        )


def _pq(s: Src, plan: Plan, l: int, tangent: bool) -> None:
    """p{l}, q{l} of the variable i{l} (x{l} = its tilted logit, r{l} its logit); with ``tangent``
    v{l} (``_v``) and dp{l} = p q v."""
    s(
        f"r{l} = tl.load(col + i{l} * T, mask=live & (i{l} < N), other=float('-inf'))",
        f"x{l} = r{l} - c",
        f"p{l} = 1.0 / (1.0 + tl.exp(-x{l}))",
        f"q{l} = 1.0 / (1.0 + tl.exp(x{l}))",
    )
    if tangent:
        _v(s, plan, l)
        s(f"dp{l} = p{l} * q{l} * v{l}")


def _step(s: Src, K: int, src: str, dst: str, l: int, tangent: bool) -> None:
    """Lattice ``dst`` = one DP step of lattice ``src`` over variable l (tangents d``src`` too)."""
    for j in range(K, -1, -1):
        take = f" + p{l} * {src}_{j - 1}" if j else ""
        if tangent:
            diff = f"{src}_{j - 1} - {src}_{j}" if j else f"-{src}_{j}"
            dtake = f" + p{l} * d{src}_{j - 1}" if j else ""
            s(f"d{dst}_{j} = q{l} * d{src}_{j}{dtake} + dp{l} * ({diff})")
        s(f"{dst}_{j} = q{l} * {src}_{j}{take}")


def _seeds(s: Src, plan: Plan, tangent: bool) -> None:
    """The adjoint lattice at N from P_N (``F_j``): B_j = pi_j / P_N[j] on the band, 0 elsewhere;
    with tangents dB_j = -B_j sum_j' dP_N[j'] B_j'; ``cum{j}``: the band's cumulative pi (a draw). A
    forward kernel without marginals needs no adjoint lattice (the draw walks P alone)."""
    kmin, K = plan.kmin, plan.kmax
    band = range(kmin, K + 1)
    for j in band:
        s(f"lw{j} = tl.where(F_{j} > 0.0, tl.log(F_{j}) + {float(j - kmin)} * c, float('-inf'))")
    s("lmax = " + functools.reduce(lambda a, b: f"tl.maximum({a}, {b})", [f"lw{j}" for j in band]))
    for j in band:
        s(f"e{j} = tl.exp(lw{j} - lmax)")
    s("etot = " + _join([f"e{j}" for j in band]))
    adjoint = plan.kind == "cov" or plan.marginals
    for j in range(K + 1) if adjoint else ():
        s(f"B{j} = tl.where(F_{j} > 0.0, e{j} / etot / F_{j}, 0.0)" if j >= kmin else f"B{j} = zero")
    if tangent:
        s("dz = " + _join([f"dF_{j} * B{j}" for j in band]))
        for j in range(K + 1):
            s(f"dB{j} = -B{j} * dz")
    if plan.kind == "forward" and (plan.draw or plan.slots):
        acc = "zero"
        for j in band:
            s(f"cum{j} = {acc} + e{j} / etot")
            acc = f"cum{j}"


def _sweep_forward(s: Src, plan: Plan, tangent: bool) -> None:
    """The forward sweep with checkpoints: ck [NSEG, K + 1 (x2 with tangents), TC] holds the
    lattice before each segment's first variable; F_j (dF_j) is P_N at the end."""
    K, ck = plan.kmax, plan.ck
    for j in range(K + 1):
        s(f"F_{j} = {'zero + 1.0' if j == 0 else 'zero'}")
        if tangent:
            s(f"dF_{j} = zero")
    s("for sg in range(0, NSEG):")
    with s.block():
        _checkpoint(s, plan, tangent, lambda at, value: f"tl.store({at}, {value}, mask=live)", "F_{j}")
        for l in range(ck):
            _variable(s, plan, l, tangent)
            _step(s, K, "F", "F", l, tangent)


def _checkpoint(s: Src, plan: Plan, tangent: bool, access, lattice: str) -> None:
    """Segment sg's checkpoint, state by state (``access(address, lattice state)``: a store or a
    load's line); ``lattice``, the name pattern of a state, its tangent that name with a d in front."""
    K = plan.kmax
    s(f"base = (tc * 0 + sg * {(K + 1) * (2 if tangent else 1)}) * TC + tc  # int64")
    for j in range(K + 1):
        s(access(f"ck_ptr + base + {j} * TC", lattice.format(j=j)))
        if tangent:
            s(access(f"ck_ptr + base + {K + 1 + j} * TC", "d" + lattice.format(j=j)))


def _variable(s: Src, plan: Plan, l: int, tangent: bool) -> None:
    """Variable i{l} of segment sg: its index, (its tangent component,) p{l} and q{l}."""
    s(f"i{l} = tc * 0 + (sg * {plan.ck} + {l})  # [BLOCK] int64: the variable")
    _pq(s, plan, l, tangent)


def _v(s: Src, plan: Plan, l: int) -> None:
    """v{l}, the tangent's component at variable i{l} (and sc{l}, its score, when v comes from slots:
    of r{l}, its logit)."""
    ok = f"live & (i{l} < N)"
    if plan.v_from == "given":
        s(f"v{l} = tl.load(v_ptr + t64 * N + i{l}, mask={ok}, other=0.0).to(tl.float32)")
        return
    s(f"sc{l} = " + (f"tl.exp(r{l} - rmax) / den" if plan.v_from == "softmax" else f"1.0 / (1.0 + tl.exp(-r{l}))"))
    g = _join([f"tl.where(ix{k} == i{l}, g{k}, 0.0)" for k in range(plan.slots)])
    s(f"v{l} = sc{l} * ({g})  # g_t: the slots' gradients at i, times the score")


def _recompute(s: Src, plan: Plan, tangent: bool) -> None:
    """The lattices P{l} (dP{l}) before each variable of segment sg, from its checkpoint."""
    K, ck = plan.kmax, plan.ck
    _checkpoint(s, plan, tangent, lambda at, state: f"{state} = tl.load({at}, mask=live, other=0.0)", "P0_{j}")
    for l in range(ck):
        _variable(s, plan, l, tangent)
        if l + 1 < ck:
            _step(s, K, f"P{l}", f"P{l + 1}", l, tangent)


def _adjoint_step(s: Src, K: int, l: int, tangent: bool) -> None:
    """B (dB) from B_{i+1} to B_i over variable l."""
    for j in range(K + 1):
        nxt = f" + p{l} * B{j + 1}" if j < K else ""
        if tangent:
            dnxt = f" + p{l} * dB{j + 1}" if j < K else ""
            diff = f"B{j + 1} - B{j}" if j < K else f"-B{j}"
            s(f"dB{j} = q{l} * dB{j}{dnxt} + dp{l} * ({diff})")
        s(f"B{j} = q{l} * B{j}{nxt}")


def _pick(K: int, lattice: str, index: str) -> str:
    """lattice[index] for a per-thread index by a chain of selects (0 outside 0..K)."""
    return _join([f"tl.where({index} == {j}, {lattice}_{j}, 0.0)" for j in range(K + 1)])


def forward_source(plan: Plan) -> str:
    """The forward kernel: marginals, one draw, the drawn by score in slots (``circuits::chosen_scores``)."""
    K, ck, S = plan.kmax, plan.ck, plan.slots
    s = Src()
    _prologue(s, plan, rmax=False)
    _sweep_forward(s, plan, tangent=False)
    _seeds(s, plan, tangent=False)
    walk = plan.draw or S
    if walk:
        s("seed = tl.load(seed_ptr).to(tl.uint64)")
        uniform(s, "us", "t64")
        s(
            f"ux = tl.minimum(us * cum{K}, cum{K} * {1.0 - 2.0**-23!r})",
            f"cnt = tl.full([BLOCK], {plan.kmin}, tl.int32)",
        )
        for j in range(plan.kmin, K):
            s(f"cnt += (cum{j} <= ux).to(tl.int32)  # the first size whose cumulative mass passes u")
    for k in range(S):
        s(f"key{k} = ninf", f"ix{k} = tl.full([BLOCK], -1, tl.int32)  # int32: half the selects of int64")
    s("for sg in range(NSEG - 1, -1, -1):")
    with s.block():
        _recompute(s, plan, tangent=False)
        for l in range(ck - 1, -1, -1):
            s(f"ok = live & (i{l} < N)", f"at = t64 * N + i{l}")
            if plan.marginals:
                m = _join([f"P{l}_{j - 1} * B{j}" for j in range(1, K + 1)])
                s(f"tl.store(m_ptr + at, p{l} * ({m}), mask=ok)")
            if walk:
                s(
                    f"take = p{l} * ({_pick(K, f'P{l}', 'cnt - 1')})",
                    f"wz = take / (take + q{l} * ({_pick(K, f'P{l}', 'cnt')}))",
                )
                uniform(s, "ui", f"i{l} * T + T + t64")
                s("zi = ui < wz", "cnt -= zi.to(tl.int32)")
                if plan.draw:
                    s("tl.store(z_ptr + at, zi.to(tl.float32), mask=ok)")
                if S:
                    s(
                        "kn = tl.where(zi, tl.load(ps_ptr + at, mask=ok & zi, other=0.0), -1.0)",
                        "kn = tl.where(ok, kn, float('-inf'))",
                        f"jn = i{l}.to(tl.int32)",
                    )
                    insert_slot(s, S)
            if plan.marginals:
                _adjoint_step(s, K, l, tangent=False)
    store_slots(s, S, "idx_ptr", "mask_ptr")
    head = "def kernel(r_ptr, seed_ptr, ps_ptr, ck_ptr, m_ptr, z_ptr, w_ptr, idx_ptr, mask_ptr, T, N, NSEG, t0, tend, TC, BLOCK: tl.constexpr):"
    return module_source(head, s)


def cov_source(plan: Plan) -> str:
    """The Cov(z) v kernel: v given, or Eq. 7's backward from the slots' gradients (plus the
    scores' backward: ``straight_through.chosen_backward``'s meaning)."""
    K, ck, S = plan.kmax, plan.ck, plan.slots
    slots = plan.v_from != "given"
    s = Src()
    _prologue(s, plan, rmax=plan.v_from == "softmax")
    if slots:
        if plan.v_from == "softmax":
            s("den = zero")
            _logit_pass(s, lambda a: s(f"den += tl.exp({a} - rmax)"))
        for k in range(S):
            s(
                f"ix{k} = tl.load(idx_ptr + t64 * {S} + {k}, mask=live, other=-1).to(tl.int32)",
                f"g{k} = tl.where(tl.load(mask_ptr + t64 * {S} + {k}, mask=live, other=0) != 0, "
                f"tl.load(g_ptr + t64 * {S} + {k}, mask=live, other=0.0).to(tl.float32), 0.0)",
                f"rk = tl.load(col + tl.maximum(ix{k}, 0).to(tl.int64) * T, mask=live, other=float('-inf'))",
            )
            sc = "tl.exp(rk - rmax) / den" if plan.v_from == "softmax" else "1.0 / (1.0 + tl.exp(-rk))"
            s(f"gs{k} = g{k} * {sc}")
        s("gsum = " + _join([f"gs{k}" for k in range(S)]) + "  # sum of g_t")
    _sweep_forward(s, plan, tangent=True)
    _seeds(s, plan, tangent=True)
    s("for sg in range(NSEG - 1, -1, -1):")
    with s.block():
        _recompute(s, plan, tangent=True)
        for l in range(ck - 1, -1, -1):
            sb = _join([f"P{l}_{j - 1} * B{j}" for j in range(1, K + 1)])
            dsb = _join([f"dP{l}_{j - 1} * B{j} + P{l}_{j - 1} * dB{j}" for j in range(1, K + 1)])
            s(f"out = dp{l} * ({sb}) + p{l} * ({dsb})  # d m_i along v")
            if plan.paper:
                s(f"out = out / (1.0 + tl.exp(r{l}))  # times sigma(-r)")
            if plan.v_from == "softmax":
                s(f"out += v{l} - sc{l} * gsum")
            elif plan.v_from == "sigmoid":
                s(f"out += v{l} * (1.0 - sc{l})")
            s(f"tl.store(out_ptr + t64 * N + i{l}, out, mask=live & (i{l} < N))")
            _adjoint_step(s, K, l, tangent=True)
    head = "def kernel(r_ptr, v_ptr, idx_ptr, mask_ptr, g_ptr, ck_ptr, out_ptr, T, N, NSEG, t0, tend, TC, BLOCK: tl.constexpr):"
    return module_source(head, s)


def log_counts_source(plan: Plan) -> str:
    """The log counts kernel: log Z_j = log sum_{|S| = j} exp(r . z_S), j = kmin..kmax, from one
    forward sweep on float64 log-probabilities (``torch_dp.up`` on float64), ``paper``: log
    P_indep(|S| = j)."""
    K = plan.kmax
    s = Src()
    _prologue(s, plan, rmax=False)
    s("c64 = c.to(tl.float64)", "spx = c64 * 0.0")
    for j in range(K + 1):
        s(f"L{j} = c64 * 0.0 + {0.0 if j == 0 else LOG_ZERO}")
    s("for i in range(0, N):")
    with s.block():
        s(
            "r64 = tl.load(col + (o64 + i) * T, mask=live, other=float('-inf')).to(tl.float64)",
            "x = r64 - c64",
            "sp = tl.maximum(x, 0.0) + tl.log(1.0 + tl.exp(-tl.abs(x)))  # softplus(x); -inf -> 0",
            "spx += sp",
            "lq = -sp",
            f"lp = tl.maximum(x - sp, {LOG_ZERO})",
        )
        if plan.paper:
            s("spx -= tl.maximum(r64, 0.0) + tl.log(1.0 + tl.exp(-tl.abs(r64)))  # less softplus(r)")
        for j in range(K, -1, -1):
            if j == 0:
                s("L0 = L0 + lq")
                continue
            s(
                f"a = L{j} + lq",
                f"b = L{j - 1} + lp",
                f"L{j} = tl.maximum(a, b) + tl.log(1.0 + tl.exp(-tl.abs(a - b)))",
            )
    J = K - plan.kmin + 1
    for j in range(plan.kmin, K + 1):
        s(
            f"o = tl.where(L{j} > {LOG_ZERO / 2}, L{j} + {float(j)} * c64 + spx, float('-inf'))",
            f"tl.store(out_ptr + t64 * {J} + {j - plan.kmin}, o.to(tl.float32), mask=live)",
        )
    head = "def kernel(r_ptr, out_ptr, T, N, t0, tend, BLOCK: tl.constexpr):"
    return module_source(head, s)


def module_source(head: str, body: Src) -> str:
    return "\n".join(
        [
            "import triton",
            "import triton.language as tl",
            "",
            f"GOLDEN = tl.constexpr({_GOLDEN})",
            f"M1 = tl.constexpr({_M1})",
            f"M2 = tl.constexpr({_M2})",
            "",
            "",
            "@triton.jit",
            head,
            *body.lines,
            "",
        ]
    )


SOURCES = {"forward": forward_source, "cov": cov_source, "log_counts": log_counts_source}


@functools.lru_cache(maxsize=128)
def kernel(plan: Plan):
    """The Triton kernel of ``plan``, generated, registered in ``linecache`` (triton reads a kernel's
    source back with ``inspect``) and defined once per process."""
    return define(SOURCES[plan.kind](plan))


def define(src: str):
    """The function ``kernel`` of the generated module source ``src``, registered in ``linecache``
    under a name made from its text (the same in every process)."""
    import triton  # noqa: F401 (an optional extra: only the Triton kernels call this)

    name = f"<probmoe-lattice-{hashlib.sha256(src.encode()).hexdigest()[:16]}>"
    linecache.cache[name] = (len(src), None, src.splitlines(True), name)
    scope: dict = {}
    exec(compile(src, name, "exec"), scope)
    return scope["kernel"]


def plain_forward(r: Tensor, kmin: int, kmax: int, c: Tensor) -> tuple[Tensor, Tensor]:
    """The forward sweep in plain torch, float64, on tilted logits: r [T, N], c [T] -> (P_N [T, K + 1],
    the marginals [T, N]): the meaning of the forward kernel's lattice and adjoint lattice."""
    T, N = r.shape
    x = (r - c[:, None]).double()
    p, q = torch.sigmoid(x), torch.sigmoid(-x)
    P = [torch.zeros(T, kmax + 1, dtype=torch.float64, device=r.device)]
    P[0][:, 0] = 1
    for i in range(N):
        prev = P[-1]
        nxt = q[:, i : i + 1] * prev
        nxt[:, 1:] += p[:, i : i + 1] * prev[:, :-1]
        P.append(nxt)
    j = torch.arange(kmax + 1, device=r.device, dtype=torch.float64)
    lw = torch.where((j >= kmin) & (P[-1] > 0), P[-1].log() + (j - kmin) * c[:, None].double(), -torch.inf)
    B = torch.where(P[-1] > 0, torch.softmax(lw, -1) / P[-1], 0.0)  # [T, K + 1]
    m = torch.empty(T, N, dtype=torch.float64, device=r.device)
    for i in reversed(range(N)):
        m[:, i] = p[:, i] * (P[i][:, :-1] * B[:, 1:]).sum(-1)
        B = q[:, i : i + 1] * B + torch.nn.functional.pad(p[:, i : i + 1] * B[:, 1:], (0, 1))
    return P[-1], m


def resources(plan: Plan, arch: int = 90) -> dict:
    """Compile ``plan``'s kernel for sm_``arch`` without a GPU (triton ships ptxas and cuobjdump) and
    read its registers and local memory (spills) per thread from the cubin: {"registers", "spill_bytes"}."""
    types = {"seed_ptr": "*i64", "idx_ptr": "*i64" if plan.kind == "forward" else "*i32", "mask_ptr": "*i8"}
    return compiled_resources(kernel(plan), types, {"T", "N", "NSEG", "t0", "tend", "TC"}, BLOCK, arch)


def compiled_resources(fn, types: dict, ints: set, block: int, arch: int = 90, options: dict | None = None) -> dict:
    """Compile the generated kernel ``fn`` (``define``) for sm_``arch`` with ``block`` tokens a program
    and read {"registers", "spill_bytes"} per thread from its cubin. ``types``: the Triton type of
    each pointer argument that is not "*fp32"; ``ints``: the int32 arguments; BLOCK is the constexpr;
    ``options``: more compile options (num_stages)."""
    import os
    import subprocess
    import tempfile

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    sig = {a: "constexpr" if a == "BLOCK" else "i32" if a in ints else types.get(a, "*fp32") for a in fn.arg_names}
    src = ASTSource(fn, sig, constexprs={(fn.arg_names.index("BLOCK"),): block})
    options = {"num_warps": block // 32, **(options or {})}
    compiled = triton.compile(src, target=GPUTarget("cuda", arch, 32), options=options)
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "kernel.cubin")
        with open(path, "wb") as f:
            f.write(compiled.asm["cubin"])
        usage = subprocess.run([tool, "--dump-resource-usage", path], capture_output=True, text=True, check=True).stdout
    field = lambda name: int(re.search(rf"{name}:(\d+)", usage).group(1))
    return {"registers": field("REG"), "spill_bytes": max(field("STACK"), field("LOCAL"))}
