"""The cardinality dynamic program in plain torch (the paper's Alg. 2), batched over tokens: the
meaning of the DP and the test oracle of its C sweeps (``circuits.kernels.c_dp``).

P(S | C) ∝ exp(Σ_{i∈S} r_i) for |S| in [kmin, kmax], S a subset of the n variables. With K = kmax, the prefix table

    L[i, j] = log Σ_{S ⊆ {0..i-1}, |S| = j} exp(Σ_{l∈S} r_l)        i = 0..N, j = 0..K

obeys L[i+1, j] = logaddexp(L[i, j], L[i, j-1] + r_i) (Alg. 2). Everything else is linear
algebra on the lattice it defines, with no further logarithms:

- ``W[i, j] = exp(L[i, j-1] + r_i - L[i+1, j]) = sigmoid(L[i, j-1] + r_i - L[i, j])``:
  P(i ∈ S | the first i+1 variables hold j members).
- adjoints ``A[i, j] = P(|S ∩ {0..i-1}| = j)``, swept down from ``A[N] = P(|S| = j)``:
  ``F[i, j] = A[i+1, j] W[i, j]``, ``A[i, j] = A[i+1, j] - F[i, j] + F[i, j+1]``, and the marginals
  are ``m_i = Σ_j F[i, j]`` (inside-outside: the gradient of log Σ_band exp L[N, j]).
- sampling walks one path of the same lattice downwards: ``z_i ~ Bernoulli(W[i, c])``, ``c -= z_i``.
- ``Cov(z) v`` is the directional derivative of m along v: forward-mode tangents
  ``D = dL`` (swept up with L), then ``dW`` and ``dA`` (swept down with A).
- the log counts: log Z_j from the last row, in paper form log Z_j - Σ_i softplus(r_i), both
  from a float64 sweep (``TorchDP.log_counts``).

Two sweeps per call: up (L, W, and in the backward D, dW) and down (A, m, z, and in the
backward dA). Each step touches one [K + 1, T] row per table (tokens last, contiguous); L and D
are kept as two alternating rows, so the only full tables are W and dW, written once by the up
sweep and read once by the down sweep.

Numerics: the tilt and the lattice on log-probabilities. Each row gets the constant c of the
circuit passes' tilt (``circuits.kernels.torch_passes.tilt_constant`` without its Newton steps:
clamp(0, kmax-th largest, kmin-th largest logit)), and the lattice is swept on x = r - c in
probability form,

    P[i+1, j] = logaddexp(P[i, j] + log sigma(-x_i), P[i, j-1] + log sigma(x_i))

(P[i, j] = log P_indep(|S ∩ {0..i-1}| = j) under Bernoulli(sigma(x)) = L[i, j] - j c - Σ_{l<i} sp(x_l):
the tilt moves the sizes apart by the same j c at every level, and the last term is a constant per
level, so W and A are those above). A subset of size j weighs exp(r·z - j c)
under x, so the band's weights are P[N, j] + (j - kmin) c and the log counts are restored as
P[N, j] + j c + Σ_i sp(x_i). Why: in float32 a state is good to its magnitude times 6e-8. On the
likely paths of this lattice the states are log-probabilities of likely counts, near 0; with the
row-max tilt and no normalisation they were sums of logits, hundreds at logit scale 100, and the
marginals were off by up to 7e-5 (docs/reports/circuits-evaluation-accuracy-epyc-2026-11.md, "fp32 accuracy"). The variables whose
marginals are not saturated have r near c, so x = r - c is exact for them. ``log_counts`` (log Z)
needs 1e-6 relative even where log Z is near 0, which n alike roundings of all-equal logits
exceed in float32: ``TorchDP.log_counts`` runs this sweep in float64 (it is not on the routing
path). -inf logits and unreachable states hold the finite ``LOG_ZERO``: no -inf - (-inf) is ever
formed, and W, A, dA are exactly 0 on unreachable states.

Precision: float64 states and adjoints, float32 tables. Where most logits are nearly equal and
saturated (sigma(x) within 1e-7 of 0 or 1), each step moves a mass of about 4e-8 between
neighbouring states, less than half a float32 ulp of 1, and it does so at all N steps alike, so
float32 roundings add up instead of cancelling: the marginals were off by up to 1.5e-5 at N = 256
(9.3e-5 in the C sweeps; docs/reports/circuits-evaluation-accuracy-epyc-2026-11.md, "The DP's precision"). So

- the states P and the adjoints A, dA are float64 (rows of [K + 1, T]: small), while log sigma(±x),
  exp(-|d|), its log1p and the tables W, dW stay in the logits' dtype: a float32 log1p's error
  is relative to its result, which is tiny exactly where the steps are many and alike;
- W is stored signed, as min(W, 1 - W) with the sign set where W >= 1/2 (``unpack_w``), so that
  1 - W near 0 is as good as W near 0, and the down step is A (1 - W) + F shifted: no cancellation.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from .interface import Sweeps
from .rows import REFERENCES, RowOps
from .scratch import ScratchPool
from .torch_passes import tilt_constant
from .uniforms import as_seed

LOG_ZERO = -1e30  # a finite log 0: a few of them add up without overflow in float32


_WS = ScratchPool(max_bytes=64 << 20)  # larger tables are allocated per call


@dataclass
class Up:
    """What the upward sweep leaves: the last lattice row, W, and optionally the tangents dW."""

    top: Tensor  # [K + 1, T] float64 P[N] (log-probabilities of the sizes under Bernoulli(sigma(x)))
    c: Tensor  # [T] the tilt
    softplus_x: Tensor  # [T] Σ_i sp(x_i), float64
    W: Tensor | None  # [N, K + 1, T] in the logits' dtype, signed (unpack_w); W[:, 0] = 0
    dW: Tensor | None  # [N, K + 1, T]
    dtop: Tensor | None  # [K + 1, T] D[N] = d L[N]
    kmin: int

    def band_logits(self) -> Tensor:
        """log Z_j - log Z_kmin + const for j = kmin..kmax: P[N, j] + (j - kmin) c -> [J, T] (-inf
        where no S of size j)."""
        top = self.top[self.kmin :]  # [J, T]
        j = torch.arange(top.shape[0], device=top.device, dtype=top.dtype)
        return torch.where(top > LOG_ZERO / 2, top + j[:, None] * self.c, -torch.inf)

    @property
    def log_counts(self) -> Tensor:
        """log Z_j = log Σ_{|S| = j} exp(r·z_S) for j = kmin..kmax: -> [J, T] (-inf where no S of size j)."""
        return self.band_logits() + (self.kmin * self.c.double() + self.softplus_x).to(self.top.dtype)

    def band_probs(self) -> Tensor:
        """P(|S| = j | C) for j = kmin..kmax: -> [J, T] (0 for a size no subset reaches; NaN if none does)."""
        return torch.softmax(self.band_logits(), dim=0)

    def seed(self, band: Tensor) -> Tensor:
        """An adjoint row over all sizes from one over the band: [J, T] -> [K + 1, T]."""
        A = self.top.new_zeros(self.top.shape)  # float64
        A[self.kmin :] = band
        return A


def unpack_w(s: Tensor, w: Tensor, wc: Tensor | None = None) -> None:
    """W and 1 - W from a row of the table as the up sweep stores it: s = W where W < 1/2 and
    s = -(1 - W) where W >= 1/2 (-0.0 for W = 1), so that both are good to their own magnitude in
    s's dtype. s [K + 1, T] -> w (and wc) [K + 1, T], written in place in their own dtype: in
    float64, 1 - s is exact, so the adjoints lose nothing where W is within 6e-8 of 0 or 1."""
    neg = torch.signbit(s)
    w.copy_(s)
    if wc is not None:
        torch.add(neg.logical_not(), w, alpha=-1, out=wc)  # 1 - s, or -s where the sign is set
    w.add_(neg)  # s + 1 where the sign is set


def log_sigmoids(x: Tensor) -> tuple[Tensor, Tensor]:
    """(log sigma(x), log sigma(-x)) for x in [-inf, inf), from one log1p(exp(-|x|)) as the C sweep
    computes them; log sigma(-inf) is LOG_ZERO."""
    soft = torch.log1p(torch.exp(-x.abs()))
    return (-(torch.relu(-x) + soft)).clamp_(min=LOG_ZERO), -(torch.relu(x) + soft)


def up(r: Tensor, kmin: int, kmax: int, *, keep_w: bool = True, v: Tensor | None = None) -> Up:
    """The upward sweep (Alg. 2, on log-probabilities of the tilted logits; see the module docstring).
    r: [T, N] float32/float64 logits in [-inf, inf); v: [T, N] tangent.

    keep_w: store W (needed for marginals, samples and gradients; not for the counts alone), in
    r's dtype as ``unpack_w`` reads it.
    v: also sweep the tangents D = dL along v (c held fixed: the results do not depend on it),
    ``D[i+1] = (1 - W[i]) D[i] + W[i] (D[i] shifted + v_i)``, and store
    ``dW[i] = W[i] (D[i] shifted + v_i - D[i+1])`` (both in r's dtype).

    The states P are float64 whatever r's dtype; log sigma(±x), exp(-|d|) and its log1p are
    computed in r's dtype (see "Precision" in the module docstring). Rows carry an extra count
    j = -1 (always empty) in front, so that every step works on whole [K + 1, T] rows, j = 0
    included (its take weight is exactly 0).
    """
    T, N = r.shape
    K1 = kmax + 1
    c = tilt_constant(r, kmin, kmax, refine=False)  # [T]
    xt = torch.sub(r.T, c, out=r.new_empty(N, T))  # [T, N] -> [N, T]
    lp, lq = log_sigmoids(xt)  # [N, T] each, r's dtype
    softplus_x = -lq.double().sum(0)  # [T]: Σ sp(x_i)
    rows = _WS.get("rows", (2, K1 + 1, T), softplus_x)  # P[i] and P[i+1] for j = -1..K, alternating
    rows[:, 0] = LOG_ZERO
    rows[0, 1] = 0.0  # the empty set
    rows[0, 2:] = LOG_ZERO
    shifted, whole = (rows[0, :-1], rows[1, :-1]), (rows[0, 1:], rows[1, 1:])  # P[i, j-1] and P[i, j]
    W = _WS.get("W", (N, K1, T), r) if keep_w else None
    Wrows, lps, lqs = W.unbind(0) if keep_w else None, lp.double().unbind(0), lq.double().unbind(0)
    dW = dtop = None
    take, skip, diff = (torch.empty_like(rows[0, 1:]) for _ in range(3))  # [K + 1, T] float64
    e, soft = r.new_empty(K1, T), r.new_empty(K1, T)  # r's dtype
    if v is not None:
        vts = v.T.to(r.dtype).contiguous().unbind(0)  # [N] x [T]
        dW = _WS.get("dW", (N, K1, T), r)
        dWrows = dW.unbind(0)
        drows = torch.zeros(2, K1 + 1, T, dtype=r.dtype, device=r.device)  # D[i], D[i+1] for j = -1..K
        dshifted, dwhole = (drows[0, :-1], drows[1, :-1]), (drows[0, 1:], drows[1, 1:])
        t, w = torch.empty_like(e), torch.empty_like(e)
    for i in range(N):
        a, b = i % 2, (i + 1) % 2
        torch.add(shifted[a], lps[i], out=take)  # log weight of taking variable i
        torch.add(whole[a], lqs[i], out=skip)  # and of leaving it
        d = torch.sub(take, skip, out=diff)  # the log-odds of taking it
        e.copy_(d).abs_().neg_()  # -|d|, rounded to r's dtype
        if keep_w:
            torch.sigmoid(e, out=Wrows[i]).copysign_(d.neg_())  # min(W, 1 - W), signed (unpack_w)
        torch.exp(e, out=soft).log1p_()  # log1p(exp(-|d|))
        torch.maximum(take, skip, out=whole[b]).add_(soft)  # Alg. 2: P[i+1, j] = logaddexp(skip, take)
        if v is not None:
            unpack_w(Wrows[i], w)  # W[i, j] = exp(take - P[i+1, j])
            torch.add(dshifted[a], vts[i], out=t)  # D[i, j-1] + v_i
            torch.lerp(dwhole[a], t, w, out=dwhole[b])  # D[i+1, j]
            torch.sub(t, dwhole[b], out=dWrows[i]).mul_(w)
    if v is not None:
        dtop = dwhole[N % 2].clone()
    return Up(whole[N % 2].clone(), c, softplus_x, W if keep_w else None, dW, dtop, kmin)


def down(
    u: Up, band: Tensor, num_samples: int = 0, seed: Tensor | torch.Generator | None = None, rows: RowOps = REFERENCES
):
    """The downward sweep from adjoints ``band`` [J, T] on the band sizes, in float64.

    Returns (Σ_j F[i, j] as [T, N] in the logits' dtype, draws [num_samples, T, N] or None). With
    ``band`` = P(|S| = j) the first output is the marginals; with any other seed g it is
    Σ_j g_j m^(j), the gradient of Σ_j g_j log Z_j. Draws: |S| ~ ``band`` (which must then be the
    band probabilities), then z_i ~ Bernoulli(W[i, c]) along the path; one uniform per (draw,
    token) for the size, then one per (variable, draw, token), all from one call of
    ``circuits.kernels.uniforms`` in the logits' dtype (made by ``rows``: the same bits either way).
    """
    W = u.W
    N, _, T = W.shape
    dtype = u.c.dtype  # the logits'
    Wrows = W.unbind(0)
    A = u.seed(band)  # [K + 1, T] float64
    f, w, wc = torch.empty_like(A), torch.empty_like(A), torch.empty_like(A)
    cols, zs = [], []
    if num_samples:
        cum = A[u.kmin :].cumsum(dim=0)  # [J, T]
        # the sizes, then the variables
        rand = rows.uniforms(as_seed(seed, band.device), (N + 1) * num_samples * T, band.device, dtype)
        x = rand[: num_samples * T].view(num_samples, T) * cum[-1]
        x = torch.minimum(x, cum[-1] * (1 - torch.finfo(dtype).eps))  # u * total may round up to the total
        c = (cum.unsqueeze(1) <= x).sum(dim=0) + u.kmin  # [S, T]: the first size whose cumulative mass passes x
        draws = rand[num_samples * T :].view(N, num_samples, T).unbind(0)
    for i in reversed(range(N)):
        unpack_w(Wrows[i], w, wc)
        torch.mul(A, w, out=f)  # F[i]
        A.mul_(wc)  # A - F, with no cancellation where W is near 1
        A[:-1].add_(f[1:])  # the path through (i, j-1) took variable i into (i+1, j)
        cols.append(f.sum(dim=0))  # [T]
        if num_samples:
            zs.append(draws[i] < w.gather(0, c))  # [S, T]
            c.sub_(zs[-1].long())
    out = torch.stack(cols[::-1]).T.to(dtype)  # [N, T] -> [T, N]
    return out, torch.stack(zs[::-1], dim=-1).to(dtype) if num_samples else None


def cov_vec(r: Tensor, v: Tensor, kmin: int, kmax: int) -> Tensor:
    """Cov(z) v = (d m / d r) v, by forward-mode tangents through both sweeps. r, v: [T, N] -> [T, N].

    The up sweep carries D = dL and stores dW; the down sweep carries (A, dA) in float64 and sums dF.
    """
    u = up(r, kmin, kmax, v=v)
    q = u.band_probs()  # [J, T] float64
    Db = u.dtop[kmin:].double()  # [J, T]
    AA = torch.stack([u.seed(q), u.seed(q * (Db - (q * Db).sum(dim=0)))])  # [2, K + 1, T]: A, dA
    Wrows, dWrows = u.W.unbind(0), u.dW.unbind(0)
    ff = torch.empty_like(AA)  # F, dF
    w, wc = torch.empty_like(AA[0]), torch.empty_like(AA[0])
    cols = []
    for i in reversed(range(len(Wrows))):
        unpack_w(Wrows[i], w, wc)
        torch.mul(AA, w, out=ff)  # A W, dA W
        ff[1].addcmul_(AA[0], dWrows[i])  # dF = dA W + A dW
        AA[0].mul_(wc)  # A - F
        AA[1].sub_(ff[1])  # dA - dF
        AA[:, :-1].add_(ff[:, 1:])
        cols.append(ff[1].sum(dim=0))  # [T]
    return torch.stack(cols[::-1]).T.to(r.dtype)  # [N, T] -> [T, N]


def marginals(r: Tensor, kmin: int, kmax: int) -> Tensor:
    """P(i ∈ S | C), no autograd: [T, N] -> [T, N] (NaN rows where C is infeasible)."""
    u = up(r, kmin, kmax)
    return down(u, u.band_probs())[0]


class TorchDP(Sweeps):
    """The DP's kernels in torch, any device and dtype (``circuits.kernels.select`` picks it where the
    C sweeps do not apply: float64, CUDA, no compiler, ``PROBMOE_NATIVE=0``). ``CDP`` offers the same
    with the same results and, from the same seed, the same draws. Inputs: logits r [T, N] of one
    dtype, contiguous, checked by the caller."""

    name = "torch"

    def forward_marginals(self, r: Tensor, seed: Tensor | None, values: bool) -> tuple[Tensor, Tensor]:
        """(m [T, N] or zeros, one draw [T, N] from ``seed`` or an empty tensor): one up and one down sweep."""
        u = up(r, self.kmin, self.kmax)
        m, z = down(u, u.band_probs(), int(seed is not None), seed, self.rows)
        return m if values else torch.zeros_like(m), z[0] if seed is not None else r.new_empty(0)

    def cov_vec(self, r: Tensor, v: Tensor) -> Tensor:
        """Cov(z) v: r, v [T, N] -> [T, N]."""
        return cov_vec(r, v, self.kmin, self.kmax)

    def log_counts(self, r: Tensor, paper: bool) -> Tensor:
        """log Z_j = log Σ_{|S| = j} exp(r·z_S) for j = kmin..kmax: r [T, N] -> [T, J] (-inf: no S of
        size j); ``paper``: log P_indep(|S| = j) = log Z_j - Σ_i softplus(r_i). One up sweep in
        float64 whatever r's dtype, so the subtraction loses nothing."""
        r64 = r.double()  # float64: 1e-6 relative where log Z is near 0 (see the module docstring)
        counts = up(r64, self.kmin, self.kmax, keep_w=False).log_counts  # [J, T]
        if paper:
            counts = counts - F.softplus(r64, threshold=40.0).sum(1)  # exact in float64 past 40
        return counts.T.to(r.dtype).contiguous()  # [J, T] -> [T, J]

    def log_counts_backward(self, r: Tensor, g: Tensor, paper: bool) -> Tensor:
        """The gradient of Σ_j g_j log Z_j, g [T, J]: Σ_j g_j m^(j) [T, N], one downward sweep seeded
        with g (minus Σ_j g_j sigmoid(r) in paper form)."""
        u = up(r, self.kmin, self.kmax)
        grad = down(u, g.T.to(r.dtype))[0]  # [T, N]
        if paper:
            grad = grad - g.sum(dim=-1, keepdim=True).to(r.dtype) * torch.sigmoid(r)
        return grad
