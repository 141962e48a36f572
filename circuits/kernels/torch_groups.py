"""The group DP in plain torch: kmin..kmax true of n variables split into contiguous groups, at most
``capacity`` true in a group and at most ``max_groups`` nonempty groups (``circuits.GroupLimited``,
``circuits.GroupCapacity``), evaluated by a two-level lattice batched over tokens, with nothing
compiled. A ``GroupLattice`` gets these sweeps from ``circuits.kernels.select``.

The groups' logits are laid out [T, G, S], S the longest group (the padding holds log 0), and
tilted: x = r - c with c [T] the tilt of the cardinality DP (``torch_passes.tilt_constant``), so a
subset of size j weighs exp(r·z - j c) and the sizes are restored at the end. Then

- the inner lattice, every group at once: ``E_g[j] = log Σ_{S ⊆ group g, |S| = j} exp(x·z_S)``,
  j = 0..C with C = min(capacity, kmax, S) (a group past its capacity is not allowed, so its
  lattice stops there), swept over the positions: E_{i+1}[j] = logaddexp(E_i[j], E_i[j-1] + x_i),
  one [T, G, C + 1] row per step;
- the outer lattice over the groups: ``O_g[c, u]``, the log-weight of the assignments to groups
  0..g-1 with c true variables in u nonempty groups, O_{g+1}[c, u] = logsumexp over j of
  O_g[c - j, u - [j > 0]] + E_g[j]; u is tracked only when max_groups limits it (U = max_groups,
  else one state), c <= kmax: one [T, K + 1, U + 1] row per group;
- log Z_c = logsumexp_u O_G[c, u] + c·(the tilt), natural form, for c = kmin..kmax.

Everything else is linear algebra on those lattices, as in ``circuits.kernels.torch_dp``:

- adjoints, swept down from A_G[c, u] = P(the final state is (c, u)): each group's transitions
  F_j = A_{g+1}[c, u] exp(O_g[c - j, u - [j > 0]] + E_g[j] - O_{g+1}[c, u]) give
  w_g[j] = Σ F_j = P(group g holds j) and A_g; inside a group, from B_S = w_g,
  W_i[j] = sigmoid(E_i[j-1] + x_i - E_i[j]) (P(i taken | the first i+1 hold j)), F_i = B_{i+1} W_i,
  B_i = B_{i+1} (1 - W_i) + F_i shifted, and the marginals m_i = Σ_j F_i[j];
- ``Cov(z) v``, the directional derivative of m along v: tangents of E and O swept up with them,
  then of A, F, w, B, W swept down;
- a draw walks the same lattices down: (c, u) from the band, each group's count j from F_j / A, then
  z_i ~ Bernoulli(W_i[j]) with the group's remaining count;
- the MAP: the outer lattice in (max, +) on each group's best subset of each size (its top-j
  logits), the argmax walked back.

Numerics: float64 lattices and adjoints whatever the logits' dtype (fp32 answers are rounded once,
at the end); -inf logits and unreachable states hold the finite ``LOG_ZERO``, so no -inf - (-inf)
is formed and exp gives exactly 0 on them. Memory: the inner rows E_0..E_S, (S + 1) x [T, G, C + 1]
float64 (their tangents as many again for Cov(z) v), and the outer rows, (G + 1) x [T, K + 1, U + 1],
are kept for the down sweep; calls run over at most ``CHUNK`` tokens at a time. Uniforms of one draw (``circuits.kernels.uniforms``, float32, one call): T for the band
state, then G x T for the groups' counts (group-major), then n x T for the variables.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .interface import Kernels
from .lattice import GroupLattice
from .rows import REFERENCES, RowOps
from .torch_passes import tilt_constant
from .uniforms import as_seed

LOG_ZERO = -1e30  # a finite log 0 (float64: sums of many stay finite)
CHUNK = 4096  # tokens per piece of a call: the kept inner rows are 78 MB at 8 of 256 in 8 groups


class TorchGroupDP(Kernels):
    """The group DP's queries in torch, any device and dtype, for one ``GroupLattice``: the circuit
    passes' query signatures (``circuits.kernels.interface.Passes``: ``log_partition``, ``sample``,
    ``map``, ``marginals_jvp``), so that ``circuits.GroupDP`` reaches them through the circuit
    operators, and ``draw`` / ``cov`` for the fused queries' default. Inputs: logits r [T, n] of one
    dtype, contiguous, checked by the caller; outputs in r's dtype. None synchronises with the host
    (on the CPU the draw reads its seed, inside the operator, as every draw does)."""

    name = "torch"

    def __init__(self, lattice: GroupLattice, rows: RowOps = REFERENCES):
        super().__init__(rows)
        self.spec = spec = lattice.spec
        sizes = spec.groups
        self.G, self.S, self.K = len(sizes), max(sizes), spec.kmax
        self.C = min(spec.capacity, spec.kmax, self.S)
        self.U = spec.max_groups if spec.max_groups < self.G else 0  # 0: not tracked
        index, start = [], 0
        for size in sizes:  # column n of the padded logits holds log 0
            index += [*range(start, start + size)] + [spec.n] * (self.S - size)
            start += size
        self.index = torch.tensor(index, dtype=torch.long, device=lattice.device)  # [G * S]: padded -> column
        self.positions = self.index.argsort(stable=True)[: spec.n]  # [n]: column -> padded position

    # --- the lattices ----------------------------------------------------------------------------
    def _padded(self, r: Tensor) -> tuple[Tensor, Tensor]:
        """(x [T, G, S] float64, the tilted logits by group with log 0 padding; the tilt c [T] float64)."""
        c = tilt_constant(r.detach(), self.spec.kmin, self.spec.kmax, refine=False).double()  # [T]
        return self._by_group((r.double() - c[:, None]).clamp(min=LOG_ZERO), LOG_ZERO), c  # -inf: LOG_ZERO

    def _by_group(self, y: Tensor, pad: float) -> Tensor:
        """[T, n] float64 -> [T, G, S], the groups padded with ``pad`` (the inverse of ``_unpad``)."""
        y = torch.cat([y, y.new_full((y.shape[0], 1), pad)], dim=1)  # [T, n + 1]: column n is the padding
        return y.index_select(1, self.index).view(-1, self.G, self.S)

    def _inner(self, x: Tensor) -> list[Tensor]:
        """The inner lattice rows E_0..E_S, each [T, G, C + 1] float64, for x [T, G, S]."""
        E = x.new_full((*x.shape[:2], self.C + 1), LOG_ZERO)
        E[..., 0] = 0.0
        rows = [E]
        for i in range(self.S):
            E = torch.cat([E[..., :1], torch.logaddexp(E[..., 1:], E[..., :-1] + x[..., i : i + 1])], dim=-1)
            rows.append(E)
        return rows

    def _back(self, F: Tensor) -> Tensor:
        """The flows into each state from the state after the group, summed over j: the adjoint of
        ``_terms``' move, out[c, u] = Σ_j F[j, :, c + j, u + [j > 0]]. [C + 1, T, K + 1, U + 1] ->
        [T, K + 1, U + 1]."""
        K1, U1 = F.shape[2:]
        out = F[0].clone()
        du = int(self.U > 0)
        for j in range(1, self.C + 1):
            out[:, : K1 - j, : U1 - du] += F[j, :, j:, du:]
        return out

    def _terms(self, O: Tensor, E: Tensor, fill: float = LOG_ZERO) -> Tensor:
        """The log-weights of reaching each state through a group of j true, j = 0..C: O [T, K + 1,
        U + 1] (before the group), E [T, C + 1] (its inner lattice) -> [C + 1, T, K + 1, U + 1],
        out[j, :, c, u] = O[:, c - j, u - [j > 0]] + E[:, j] (u unchanged when not tracked);
        ``fill`` (0 for tangents) where no state leads there."""
        T, K1, U1 = O.shape
        out = O.new_full((self.C + 1, T, K1, U1), fill)
        for j in range(self.C + 1):
            du = int(j > 0 and self.U > 0)
            torch.add(O[:, : K1 - j, : U1 - du], E[:, j, None, None], out=out[j, :, j:, du:])
        return out

    def _outer(self, top: Tensor) -> list[Tensor]:
        """The outer lattice rows O_0..O_G, each [T, K + 1, U + 1] float64, from top = E_S [T, G, C + 1]."""
        O = top.new_full((top.shape[0], self.K + 1, self.U + 1), LOG_ZERO)
        O[:, 0, 0] = 0.0
        rows = [O]
        for g in range(self.G):
            O = torch.logsumexp(self._terms(O, top[:, g]), dim=0)
            rows.append(O)
        return rows

    def _band(self, O: Tensor, c: Tensor) -> Tensor:
        """The natural log-weights of the final states in the band: [T, K + 1, U + 1] -> [T, J, U + 1]
        (O_G[s, u] + s c for s = kmin..kmax)."""
        kmin = self.spec.kmin
        s = torch.arange(kmin, self.K + 1, dtype=O.dtype, device=O.device)
        return O[:, kmin:] + s[None, :, None] * c[:, None, None]

    def _lattices(self, r: Tensor) -> tuple[Tensor, Tensor, list[Tensor], list[Tensor]]:
        """The up sweeps for logits r [T, n]: (x [T, G, S], the tilt c [T], the inner rows E, the outer rows O)."""
        x, c = self._padded(r)
        E = self._inner(x)
        return x, c, E, self._outer(E[-1])

    # --- the adjoints and their tangents ----------------------------------------------------------
    def _down(self, x, E, O, c, v=None, dE=None, dO=None, sizes=None) -> Tensor:
        """The marginals [T, G, S] float64 from the lattices (see the module docstring); with the
        tangents v [T, G, S], dE, dO (``_tangents``) their directional derivative along v instead;
        with ``sizes`` g [T, J] (float64) Σ_j g_j m^(j) instead, m^(j) the marginals given j true,
        the gradient of Σ_j g_j log Z_j (``log_counts_backward``)."""
        kmin, T = self.spec.kmin, x.shape[0]
        band = self._band(O[-1], c)  # [T, J, U + 1]
        log_z = torch.logsumexp(band.flatten(1), dim=1)  # [T]
        A = torch.zeros_like(O[-1])
        if sizes is None:
            A[:, kmin:] = torch.exp(band - log_z[:, None, None])  # P(the final state)
        else:  # g_j P(u | j true); 0 for a size nothing reaches
            by_size = torch.logsumexp(band, dim=2, keepdim=True)  # [T, J, 1]
            given = torch.exp(band - by_size)
            A[:, kmin:] = torch.where(by_size > LOG_ZERO / 2, given * sizes[:, :, None], 0.0)
            log_z = log_z.new_zeros(T)  # no row is NaN here
        dA = None
        if v is not None:
            dband = dO[-1][:, kmin:]
            dlog_z = (A[:, kmin:] * dband).flatten(1).sum(1)
            dA = torch.zeros_like(A)
            dA[:, kmin:] = A[:, kmin:] * (dband - dlog_z[:, None, None])
        w = x.new_empty(self.G, T, self.C + 1)
        dw = torch.empty_like(w) if v is not None else None
        for g in reversed(range(self.G)):
            P = torch.exp(self._terms(O[g], E[-1][:, g]) - O[g + 1])  # [C + 1, T, K + 1, U + 1]
            F = A * P
            if v is not None:
                dP = P * (self._terms(dO[g], dE[-1][:, g], 0.0) - dO[g + 1])
                dF = dA * P + A * dP
                dw[g] = dF.flatten(2).sum(2).T
                dA = self._back(dF)
            w[g] = F.flatten(2).sum(2).T  # [T, C + 1]
            A = self._back(F)
        B, dB = w.permute(1, 0, 2).contiguous(), None  # [T, G, C + 1]
        if v is not None:
            dB = dw.permute(1, 0, 2).contiguous()
        cols = []
        for i in reversed(range(self.S)):
            W = torch.zeros_like(B)
            W[..., 1:] = torch.sigmoid(E[i][..., :-1] + x[..., i : i + 1] - E[i][..., 1:])
            F = B * W
            if v is None:
                cols.append(F.sum(-1))
            else:
                dW = torch.zeros_like(B)
                dW[..., 1:] = W[..., 1:] * (dE[i][..., :-1] + v[..., i : i + 1] - dE[i + 1][..., 1:])
                dF = dB * W + B * dW
                cols.append(dF.sum(-1))
                dB = dB - dF
                dB[..., :-1] += dF[..., 1:]
            B = B - F
            B[..., :-1] += F[..., 1:]
        out = torch.stack(cols[::-1], dim=-1)  # [T, G, S]
        return torch.where((log_z > LOG_ZERO / 2)[:, None, None], out, torch.nan)  # NaN rows: nothing allowed

    def _tangents(self, x: Tensor, v: Tensor, E: list[Tensor], O: list[Tensor]) -> tuple[list, list]:
        """The tangents of the lattices along v [T, G, S]: (dE_0..dE_S, dO_0..dO_G), shaped as E and O."""
        dE = [torch.zeros_like(E[0])]
        for i in range(self.S):
            W = torch.sigmoid(E[i][..., :-1] + x[..., i : i + 1] - E[i][..., 1:])  # [T, G, C]
            d = dE[-1]
            dE.append(torch.cat([d[..., :1], torch.lerp(d[..., 1:], d[..., :-1] + v[..., i : i + 1], W)], dim=-1))
        dO = [torch.zeros_like(O[0])]
        for g in range(self.G):
            P = torch.exp(self._terms(O[g], E[-1][:, g]) - O[g + 1])
            dO.append((P * self._terms(dO[-1], dE[-1][:, g], 0.0)).sum(0))
        return dE, dO

    def _unpad(self, y: Tensor) -> Tensor:
        """[T, G, S] -> [T, n] (the padding dropped)."""
        return y.flatten(1).index_select(1, self.positions)

    # --- the queries --------------------------------------------------------------------------------
    def log_partition(self, r: Tensor, marginals: bool, shift=None, *, accurate=True, refine=True):
        """(log P_indep(C) [T], the marginals [T, n] when ``marginals``, else None); ``shift`` must be
        None (the DP tilts itself), ``accurate`` and ``refine`` are always so (float64 lattices)."""
        log_zs, ms = [], []
        for part in r.split(CHUNK):
            x, c, E, O = self._lattices(part)
            band = torch.logsumexp(self._band(O[-1], c).flatten(1), dim=1)
            log_zs.append(torch.where(band > LOG_ZERO / 2, band - _softplus_sum(part), -torch.inf))
            if marginals:
                ms.append(self._unpad(self._down(x, E, O, c)))
        log_z = torch.cat(log_zs).to(r.dtype) if log_zs else r.new_empty(0)
        if not marginals:
            return log_z, None
        return log_z, torch.cat(ms).to(r.dtype) if ms else torch.zeros_like(r)

    def log_counts(self, r: Tensor, paper: bool) -> Tensor:
        """log Z_j = log Σ_{z allowed, |z| = j} exp(r·z) for j = kmin..kmax: r [T, n] -> [T, J] in r's
        dtype (-inf where nothing allowed has j true); ``paper``: log P_indep(the constraint, |z| =
        j), less Σ softplus(r). From the outer lattice's last row."""
        outs = []
        for part in r.split(CHUNK):
            _, c, _, O = self._lattices(part)
            band = torch.logsumexp(self._band(O[-1], c), dim=2)  # [T, J]
            if paper:
                band = band - _softplus_sum(part)[:, None]
            outs.append(torch.where(band > LOG_ZERO / 2, band, -torch.inf))
        J = self.spec.kmax - self.spec.kmin + 1
        return torch.cat(outs).to(r.dtype) if outs else r.new_empty(0, J)

    def log_counts_backward(self, r: Tensor, g: Tensor, paper: bool) -> Tensor:
        """The gradient of Σ_j g_j log Z_j (``log_counts``), g [T, J]: [T, n] = Σ_j g_j m^(j) (less
        Σ_j g_j sigmoid(r) with ``paper``), one adjoint sweep seeded with g."""
        outs = []
        for part, gpart in zip(r.split(CHUNK), g.split(CHUNK), strict=True):
            x, c, E, O = self._lattices(part)
            outs.append(self._unpad(self._down(x, E, O, c, sizes=gpart.double())))
        grad = torch.cat(outs) if outs else r.new_zeros(r.shape, dtype=torch.float64)
        if paper:
            grad = grad - g.double().sum(-1, keepdim=True) * torch.sigmoid(r.double())
        return grad.to(r.dtype)

    def marginals_jvp(self, r: Tensor, v: Tensor, shift=None) -> Tensor:
        """Cov(z) v = (d marginals / d r) v: r, v [T, n] -> [T, n]."""
        outs = []
        for part, vpart in zip(r.split(CHUNK), v.split(CHUNK), strict=True):
            x, c, E, O = self._lattices(part)
            vp = self._by_group(vpart.double(), 0.0)
            dE, dO = self._tangents(x, vp, E, O)
            outs.append(self._unpad(self._down(x, E, O, c, vp, dE, dO)))
        return torch.cat(outs).to(r.dtype) if outs else torch.zeros_like(r)

    def cov(self, r: Tensor, v: Tensor) -> Tensor:
        return self.marginals_jvp(r, v)

    def draw_uniforms(self, r: Tensor, seed: Tensor) -> tuple[Tensor, None]:
        """The uniforms of one draw per token of r [T, n]: ([1 + G + n, T] float32, None)."""
        T, n = r.shape
        u = self.rows.uniforms(as_seed(seed, r.device), (1 + self.G + n) * T, r.device, torch.float32)
        return u.view(1 + self.G + n, T), None

    def draw(self, r: Tensor, seed: Tensor) -> Tensor:
        return self.sample(r, *self.draw_uniforms(r, seed), log_z=False)[0]

    def sample(self, r: Tensor, uniforms: Tensor, fill=None, shift=None, log_z: bool = True):
        """(one exact draw z [T, n] in {0, 1} in r's dtype, log P_indep(C) [T] or None) from the
        uniforms of ``draw_uniforms``."""
        zs, log_zs = [], []
        for part, u in zip(r.split(CHUNK), uniforms.split(CHUNK, dim=1), strict=True):
            z, lz = self._sample(part, u)
            zs.append(z)
            log_zs.append(lz)
        if not zs:
            return torch.zeros_like(r), r.new_empty(0) if log_z else None
        return torch.cat(zs).to(r.dtype), torch.cat(log_zs).to(r.dtype) if log_z else None

    def _sample(self, r: Tensor, u: Tensor) -> tuple[Tensor, Tensor]:
        """One draw for r [T, n] from u [1 + G + n, T]: (z [T, n] float64, log P_indep(C) [T] float64)."""
        T, n = r.shape
        x, c, E, O = self._lattices(r)
        band = self._band(O[-1], c).flatten(1)  # [T, J (U + 1)]
        log_z = torch.logsumexp(band, dim=1)
        state = _pick(torch.exp(band - log_z[:, None]), u[0])
        U1 = self.U + 1
        s, k = state // U1 + self.spec.kmin, state % U1  # the final count and groups used, [T]
        counts = torch.empty(T, self.G, dtype=torch.long, device=r.device)
        rows, js = torch.arange(T, device=r.device), torch.arange(self.C + 1, device=r.device)
        for g in reversed(range(self.G)):  # the group's count j from the state (s, k) after it
            s_j = s[:, None] - js  # [T, C + 1]: the count before the group
            k_j = k[:, None] - (js > 0).long() * int(self.U > 0)
            before = O[g].flatten(1).gather(1, s_j.clamp(min=0) * U1 + k_j.clamp(min=0))  # [T, C + 1]
            log_p = torch.where((s_j >= 0) & (k_j >= 0), before + E[-1][:, g], -torch.inf)
            j = _pick(torch.exp(log_p - O[g + 1][rows, s, k][:, None]), u[1 + g])
            counts[:, g] = j
            s, k = s - j, k - (j > 0).long() * int(self.U > 0)
        uv = torch.cat([u[1 + self.G :], u.new_ones(1, T)]).index_select(0, self.index).T.reshape(T, self.G, self.S)
        z = torch.zeros_like(x)
        for i in reversed(range(self.S)):  # inside each group, its variables given its count
            take = E[i].gather(-1, (counts - 1).clamp(min=0)[..., None])[..., 0] + x[..., i]
            skip = E[i].gather(-1, counts[..., None])[..., 0]
            chosen = (uv[..., i] < torch.sigmoid(take - skip)) & (counts > 0)
            z[..., i] = chosen.double()
            counts = counts - chosen.long()
        soft = _softplus_sum(r)
        allowed = log_z > LOG_ZERO / 2
        z = torch.where(allowed[:, None, None], z, torch.nan)  # NaN rows: nothing allowed to draw
        return self._unpad(z), torch.where(allowed, log_z - soft, -torch.inf)

    def map(self, r: Tensor, shift=None) -> tuple[Tensor, Tensor]:
        """(the most probable allowed assignment z [T, n] in {0, 1}, its log P_indep [T]; z = 0 and
        -inf where nothing is allowed): each group's best subset of j true is its top j logits (equal
        ones by lower index first); the outer lattice in (max, +) picks the j of every group (the
        lowest j among equals)."""
        T, n = r.shape
        x, c = self._padded(r)
        top, order = torch.sort(x, dim=-1, descending=True, stable=True)  # [T, G, S]
        best = torch.cat([x.new_zeros(T, self.G, 1), top[..., : self.C].cumsum(-1)], dim=-1)  # [T, G, C + 1]
        O = x.new_full((T, self.K + 1, self.U + 1), LOG_ZERO)
        O[:, 0, 0] = 0.0
        picks = []
        for g in range(self.G):
            O, j = self._terms(O, best[:, g]).max(dim=0)
            picks.append(j)
        band = self._band(O, c).flatten(1)
        value, state = band.max(dim=1)
        U1 = self.U + 1
        s, k = state // U1 + self.spec.kmin, state % U1
        rows = torch.arange(T, device=r.device)
        counts = torch.empty(T, self.G, dtype=torch.long, device=r.device)
        for g in reversed(range(self.G)):
            j = picks[g][rows, s, k]
            counts[:, g] = j
            s, k = s - j, k - (j > 0).long() * int(self.U > 0)
        z = (torch.arange(self.S, device=r.device) < counts[..., None]).double()  # in sorted order
        z = torch.zeros_like(x).scatter_(-1, order, z)
        allowed = value > LOG_ZERO / 2
        log_p = torch.where(allowed, value - _softplus_sum(r), -torch.inf)
        z = torch.where(allowed[:, None], self._unpad(z), 0.0)
        return z.to(r.dtype), log_p.to(r.dtype)


def _softplus_sum(r: Tensor) -> Tensor:
    """Σ_i softplus(r_i) in float64 (what turns a natural log-weight into a paper-form one): [T, n] -> [T]."""
    return torch.nn.functional.softplus(r.double(), threshold=40.0).sum(1)


def _pick(p: Tensor, u: Tensor) -> Tensor:
    """The first index whose cumulative probability passes u·total: p [T, m] >= 0, u [T] in [0, 1) -> [T] long."""
    cum = p.cumsum(dim=1)
    total = cum[:, -1:]
    x = torch.minimum(u[:, None].double() * total, total * (1 - 2.0**-52))
    return (cum <= x).sum(dim=1).clamp(max=p.shape[1] - 1)
