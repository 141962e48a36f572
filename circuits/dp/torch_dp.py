"""The cardinality dynamic program in plain torch (the paper's Alg. 2), batched over tokens: the
meaning of the DP and the test oracle of its C sweeps (``circuits.dp.c_dp``).

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
- the paper-form counts log P_indep(|S| = j) have their own upward sweep on log-probabilities
  (``paper_log_counts``), which neither tilts nor cancels.

Two sweeps per call: up (L, W, and in the backward D, dW) and down (A, m, z, and in the
backward dA). Each step touches one [K + 1, T] row per table (tokens last, contiguous); L and D
are kept as two alternating rows, so the only full tables are W and dW, written once by the up
sweep and read once by the down sweep.

Numerics. Logits enter as log-odds (no log p, log(1 - p)), tilted by the row max ``tau``: the tilt
changes every subset of size j by the same ``j tau``, so W, A and the marginals are unchanged and
the counts are restored as ``L[N, j] + j tau``. -inf logits and unreachable states hold the finite
``LOG_ZERO``: no -inf - (-inf) is ever formed, and W, A, dA are exactly 0 on unreachable states.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from ..native.uniforms import as_seed, uniforms
from ..passes.scratch import ScratchPool

LOG_ZERO = -1e30  # a finite log 0: a few of them add up without overflow in float32


_WS = ScratchPool(max_bytes=64 << 20)  # larger tables are allocated per call


@dataclass
class Up:
    """What the upward sweep leaves: the last lattice row, W, and optionally the tangents dW."""

    top: Tensor  # [K + 1, T] L[N] (tilted)
    tau: Tensor  # [T]
    W: Tensor | None  # [N, K + 1, T], W[:, 0] = 0
    dW: Tensor | None  # [N, K + 1, T]
    dtop: Tensor | None  # [K + 1, T] D[N] = d L[N]
    kmin: int

    @property
    def log_counts(self) -> Tensor:
        """log Z_j = log Σ_{|S| = j} exp(r·z_S) for j = kmin..kmax: -> [J, T] (-inf where no S of size j)."""
        top = self.top[self.kmin :]  # [J, T]
        j = torch.arange(self.kmin, self.kmin + top.shape[0], device=top.device, dtype=top.dtype)
        return torch.where(top > LOG_ZERO / 2, top + j[:, None] * self.tau, -torch.inf)

    def band_probs(self) -> Tensor:
        """P(|S| = j | C) for j = kmin..kmax: -> [J, T] (0 for a size no subset reaches; NaN if none does)."""
        return torch.softmax(self.log_counts, dim=0)

    def seed(self, band: Tensor) -> Tensor:
        """An adjoint row over all sizes from one over the band: [J, T] -> [K + 1, T]."""
        A = band.new_zeros(self.top.shape)
        A[self.kmin :] = band
        return A


def up(r: Tensor, kmin: int, kmax: int, *, keep_w: bool = True, v: Tensor | None = None) -> Up:
    """The upward sweep (Alg. 2). r: [T, N] float32/float64 logits in [-inf, inf); v: [T, N] tangent.

    keep_w: store W (needed for marginals, samples and gradients; not for the counts alone).
    v: also sweep the tangents D = dL along v, ``D[i+1] = (1 - W[i]) D[i] + W[i] (D[i] shifted + v_i)``,
    and store ``dW[i] = W[i] (D[i] shifted + v_i - D[i+1])``.

    Rows carry an extra count j = -1 (always empty) in front, so that every step works on whole
    [K + 1, T] rows, j = 0 included (its take weight is exactly 0).
    """
    T, N = r.shape
    K1 = kmax + 1
    tau = r.amax(dim=-1)  # [T]
    tau = torch.where(torch.isfinite(tau), tau, torch.zeros_like(tau))
    rt = torch.sub(r.T, tau, out=r.new_empty(N, T)).clamp_(min=LOG_ZERO)  # [T, N] -> [N, T]; -inf -> LOG_ZERO
    rows = _WS.get("rows", (2, K1 + 1, T), r)  # L[i] and L[i+1] for j = -1..K, alternating
    rows[:, 0] = LOG_ZERO
    rows[0, 1] = 0.0  # the empty set
    rows[0, 2:] = LOG_ZERO
    shifted, whole = (rows[0, :-1], rows[1, :-1]), (rows[0, 1:], rows[1, 1:])  # L[i, j-1] and L[i, j]
    W = _WS.get("W", (N, K1, T), r) if keep_w else None
    Wrows, rts = W.unbind(0) if keep_w else None, rt.unbind(0)
    dW = dtop = None
    if v is not None:
        vts = v.T.to(r.dtype).contiguous().unbind(0)  # [N] x [T]
        dW = _WS.get("dW", (N, K1, T), r)
        dWrows = dW.unbind(0)
        drows = torch.zeros(2, K1 + 1, T, dtype=r.dtype, device=r.device)  # D[i], D[i+1] for j = -1..K
        dshifted, dwhole = (drows[0, :-1], drows[1, :-1]), (drows[0, 1:], drows[1, 1:])
        t = torch.empty_like(rows[0, 1:])
    take = torch.empty_like(rows[0, 1:])  # [K + 1, T]
    for i in range(N):
        a, b = i % 2, (i + 1) % 2
        torch.add(shifted[a], rts[i], out=take)  # log weight of taking variable i
        torch.logaddexp(whole[a], take, out=whole[b])  # Alg. 2: L[i+1, j]
        if not keep_w:
            continue
        w = torch.sub(take, whole[a], out=Wrows[i]).sigmoid_()  # W[i, j] = exp(take - L[i+1, j])
        if v is not None:
            torch.add(dshifted[a], vts[i], out=t)  # D[i, j-1] + v_i
            torch.lerp(dwhole[a], t, w, out=dwhole[b])  # D[i+1, j]
            torch.sub(t, dwhole[b], out=dWrows[i]).mul_(w)
    if v is not None:
        dtop = dwhole[N % 2].clone()
    return Up(whole[N % 2].clone(), tau, W if keep_w else None, dW, dtop, kmin)


def paper_log_counts(r: Tensor, kmin: int, kmax: int) -> Tensor:
    """log P_indep(|S| = j) with p = sigmoid(r), j = kmin..kmax: [T, N] -> [J, T] (-inf: no S of size j).

    Alg. 2 on probabilities, P[i+1, j] = P[i, j] (1 - p_i) + P[i, j-1] p_i, in log space with
    log p_i = -softplus(-r_i) and log(1 - p_i) = -softplus(r_i). Its entries are log-probabilities
    (<= 0), so it needs no tilt and nothing cancels: log Z_j - Σ_i softplus(r_i) from the natural
    lattice loses ~1e-2 in float32 at logits ~1e4 (the tilt and the subtraction).
    """
    T, N = r.shape
    rt = r.T.contiguous()  # [N, T]
    take = F.softplus(-rt).neg_().clamp_(min=LOG_ZERO)  # log p; -inf logits -> LOG_ZERO
    skip = F.softplus(rt).neg_()  # log(1 - p)
    rows = r.new_full((2, kmax + 2, T), LOG_ZERO)  # P[i] and P[i+1] for j = -1..K, alternating
    rows[0, 1] = 0.0  # the empty set
    t = torch.empty_like(rows[0, 1:])
    for i in range(N):
        a, b = rows[i % 2], rows[(i + 1) % 2]
        torch.add(a[1:], skip[i], out=b[1:])
        torch.add(a[:-1], take[i], out=t)
        torch.logaddexp(b[1:], t, out=b[1:])
    top = rows[N % 2, 1 + kmin :]  # [J, T]
    return torch.where(top > LOG_ZERO / 2, top, -torch.inf)


def down(u: Up, band: Tensor, num_samples: int = 0, seed: Tensor | torch.Generator | None = None):
    """The downward sweep from adjoints ``band`` [J, T] on the band sizes.

    Returns (Σ_j F[i, j] as [T, N], draws [num_samples, T, N] or None). With ``band`` = P(|S| = j)
    the first output is the marginals; with any other seed g it is Σ_j g_j m^(j), the gradient of
    Σ_j g_j log Z_j. Draws: |S| ~ ``band`` (which must then be the band probabilities), then
    z_i ~ Bernoulli(W[i, c]) along the path; one uniform per (draw, token) for the size, then one
    per (variable, draw, token), all from one call of ``circuits.native.uniforms``.
    """
    W = u.W
    N, _, T = W.shape
    Wrows = W.unbind(0)
    A = u.seed(band)  # [K + 1, T]
    f = torch.empty_like(A)
    cols, zs = [], []
    if num_samples:
        cum = band.cumsum(dim=0)  # [J, T]
        # the sizes, then the variables
        rand = uniforms(as_seed(seed, band.device), (N + 1) * num_samples * T, band.device, band.dtype)
        x = rand[: num_samples * T].view(num_samples, T) * cum[-1]
        x = torch.minimum(x, cum[-1] * (1 - torch.finfo(x.dtype).eps))  # u * total may round up to the total
        c = (cum.unsqueeze(1) <= x).sum(dim=0) + u.kmin  # [S, T]: the first size whose cumulative mass passes x
        draws = rand[num_samples * T :].view(N, num_samples, T).unbind(0)
    for i in reversed(range(N)):
        torch.mul(A, Wrows[i], out=f)  # F[i]
        A.sub_(f)
        A[:-1].add_(f[1:])  # the path through (i, j-1) took variable i into (i+1, j)
        cols.append(f.sum(dim=0))  # [T]
        if num_samples:
            zs.append(draws[i] < Wrows[i].gather(0, c))  # [S, T]
            c.sub_(zs[-1].long())
    out = torch.stack(cols[::-1]).T  # [N, T] -> [T, N]
    return out, torch.stack(zs[::-1], dim=-1).to(band.dtype) if num_samples else None


def cov_vec(r: Tensor, v: Tensor, kmin: int, kmax: int) -> Tensor:
    """Cov(z) v = (d m / d r) v, by forward-mode tangents through both sweeps. r, v: [T, N] -> [T, N].

    The up sweep carries D = dL and stores dW; the down sweep carries (A, dA) and sums dF.
    """
    u = up(r, kmin, kmax, v=v)
    q = u.band_probs()  # [J, T]
    Db = u.dtop[kmin:]  # [J, T]
    AA = torch.stack([u.seed(q), u.seed(q * (Db - (q * Db).sum(dim=0)))])  # [2, K + 1, T]: A, dA
    Wrows, dWrows = u.W.unbind(0), u.dW.unbind(0)
    ff = torch.empty_like(AA)  # F, dF
    cols = []
    for i in reversed(range(len(Wrows))):
        torch.mul(AA, Wrows[i], out=ff)  # A W, dA W
        ff[1].addcmul_(AA[0], dWrows[i])  # dF = dA W + A dW
        AA.sub_(ff)
        AA[:, :-1].add_(ff[:, 1:])
        cols.append(ff[1].sum(dim=0))  # [T]
    return torch.stack(cols[::-1]).T  # [N, T] -> [T, N]


def marginals(r: Tensor, kmin: int, kmax: int) -> Tensor:
    """P(i ∈ S | C), no autograd: [T, N] -> [T, N] (NaN rows where C is infeasible)."""
    u = up(r, kmin, kmax)
    return down(u, u.band_probs())[0]


class TorchDP:
    """The DP's kernels in torch, any device and dtype (``circuits.passes.select`` picks it where the
    C sweeps do not apply: float64, CUDA, no compiler, ``PROBMOE_NATIVE=0``). ``CDP`` offers the same
    with the same results and, from the same seed, the same draws. Inputs: logits r [T, N] of one
    dtype, contiguous, checked by the caller."""

    name = "torch"

    def __init__(self, kmin: int, kmax: int):
        self.kmin, self.kmax = kmin, kmax

    def forward_marginals(self, r: Tensor, seed: Tensor | None, values: bool) -> tuple[Tensor, Tensor]:
        """(m [T, N] or zeros, one draw [T, N] from ``seed`` or an empty tensor): one up and one down sweep."""
        u = up(r, self.kmin, self.kmax)
        m, z = down(u, u.band_probs(), int(seed is not None), seed)
        return m if values else torch.zeros_like(m), z[0] if seed is not None else r.new_empty(0)

    def cov_vec(self, r: Tensor, v: Tensor) -> Tensor:
        """Cov(z) v: r, v [T, N] -> [T, N]."""
        return cov_vec(r, v, self.kmin, self.kmax)

    def log_counts(self, r: Tensor, paper: bool) -> Tensor:
        """log Z_j = log Σ_{|S| = j} exp(r·z_S) for j = kmin..kmax: r [T, N] -> [T, J] (-inf: no S of
        size j); ``paper``: log P_indep(|S| = j) = log Z_j - Σ_i softplus(r_i), from its own sweep on
        log-probabilities (``paper_log_counts``: nothing cancels)."""
        counts = paper_log_counts(r, self.kmin, self.kmax) if paper else up(r, self.kmin, self.kmax,
                                                                              keep_w=False).log_counts
        return counts.T.contiguous()  # [J, T] -> [T, J]

    def log_counts_backward(self, r: Tensor, g: Tensor, paper: bool) -> Tensor:
        """The gradient of Σ_j g_j log Z_j, g [T, J]: Σ_j g_j m^(j) [T, N], one downward sweep seeded
        with g (minus Σ_j g_j sigmoid(r) in paper form)."""
        u = up(r, self.kmin, self.kmax)
        grad = down(u, g.T.to(r.dtype))[0]  # [T, N]
        if paper:
            grad = grad - g.sum(dim=-1, keepdim=True).to(r.dtype) * torch.sigmoid(r)
        return grad
