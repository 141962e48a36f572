"""The circuit passes and the row operations as registered torch operators (``torch.ops.circuits``).

Every fused pass (C on the CPU, Triton on CUDA, or the torch passes where neither applies) is
reached through one of these operators, so ``torch.compile`` traces through routing without a
graph break: each has a fake (meta) implementation that gives its output shapes, and the
differentiable ones have their autograd registered here.

    log_partition(r, circuit, marginals)        -> (log Z [T], m [T, n] or [0])   d/dr: m - sigmoid(r)
    marginals(r, shift, seed, circuit, values, want_log_z)
                                                -> (m [T, n], z [T, n] or [0], log Z [T] or [0])
                                                   d/dr of m: Cov(z) v (``marginals_jvp``)
    marginals_jvp(r, shift, v, circuit)         -> Cov(z) v [T, n]
    sample(r, shift, seed, circuit)             -> (z [T, n], log Z [T])
    map(r, shift, circuit)                      -> (z [T, n], best [T])
    dp_marginals(r, seed, kmin, kmax, values)   -> (m [T, n] (zeros unless ``values``), one draw
                                                   z [T, n] when a seed is given, else [0])
                                                   d/dr of m: Cov(z) v (``dp_cov_vec``)
    dp_cov_vec(r, v, kmin, kmax)                -> Cov(z) v [T, n]
    dp_log_counts(r, kmin, kmax, paper)         -> log Z_j [T, J], j = kmin..kmax (natural form, or
                                                   log P_indep(|z| = j) with ``paper``)
                                                   d/dr: ``dp_log_counts_backward``
    dp_log_counts_backward(r, g, kmin, kmax, paper) -> Σ_j g_j d log Z_j / dr [T, n]
    group_log_counts(r, circuit, kmin, kmax, paper) -> the same log Z_j [T, J] for the group DP of
                                                   handle ``circuit`` (``circuits.GroupDP``)
                                                   d/dr: ``group_log_counts_backward``
    group_log_counts_backward(r, g, circuit, paper) -> Σ_j g_j d log Z_j / dr [T, n]
    chosen_scores(r, seed, kmin, kmax, circuit, slots, kind, paper)
                                                -> (weights [T, slots], indices [T, slots] long,
                                                   mask [T, slots] bool, π [T, n]): one draw, the
                                                   drawn variables (then the lowest undrawn ones,
                                                   weight 0: a row never repeats a variable)
                                                   by score π = softmax(r) or
                                                   sigmoid(r), weights π there with the straight-
                                                   through gradient (``circuits.kernels.straight_through``)
                                                   d/dr: ``chosen_scores_backward``
    chosen_scores_backward(r, indices, mask, g, kmin, kmax, circuit, kind, paper) -> [T, n]
                                                   (``circuit``: a circuit's handle or the DP's)
    kth_largest(x, k)                           -> [T]            (``circuits.kernels.rows``)
    topk(x, k)                                  -> ([T, k], [T, k] long)
    topk_chosen(z, x, k)                        -> ([T, k], [T, k] long): topk of (z - 1) + x z
    draw_seed(r)                                -> 0-dim int64, from torch's default generator

r: logits [T, n], float32 or float64, contiguous, checked by the caller (``Circuit``). shift:
None, or [T, 1] subtracted from r before the pass (the exactly-k shift; the circuit's answers do
not change, only their rounding). seed: a 0-dim int64 tensor (``circuits.kernels.uniforms``).
circuit: the handle of an evaluator (``register``: a ``Circuit`` or a ``GroupDP``, whose kernels
answer the same queries, or for ``chosen_scores`` a ``CardinalityDP`` too), whose ``kernels`` are
the implementation for the logits' dtype on its device
(``circuits.kernels.select`` picks it once): the operators carry no Python object, so a handle is
valid in the process that registered it. The ``dp_`` operators are the cardinality DP's
(``circuits.CardinalityDP``, kmin <= |z| <= kmax, checked by the caller): their kernels come from the
same ``select``, for a ``circuits.kernels.lattice.Lattice`` instead of a circuit's program. Each
operator asks the kernels for its query; the fused queries (``chosen_scores`` and its backward) are
methods of every implementation (``circuits.kernels.interface.Kernels``), one pass where the
implementation fuses them, composed otherwise.
"""

from __future__ import annotations

import itertools
import threading
import weakref

import torch
from torch import Tensor

from .kernels import straight_through, uniforms
from .kernels.lattice import Lattice
from .kernels.rows import Rows
from .kernels.select import select

_EVALUATORS: weakref.WeakValueDictionary[int, object] = weakref.WeakValueDictionary()
_HANDLES = itertools.count(1)
_LOCK = threading.Lock()


def register(evaluator) -> int:
    """A handle for ``evaluator`` (a ``Circuit``, ``CardinalityDP`` or ``GroupDP``; kept while it lives), the
    ``circuit`` argument of the operators."""
    with _LOCK:
        handle = next(_HANDLES)
        _EVALUATORS[handle] = evaluator
    return handle


def evaluator(handle: int):
    """The live evaluator of ``handle``; RuntimeError when none has it."""
    found = _EVALUATORS.get(handle)
    if found is None:
        raise RuntimeError(
            f"circuits: no live evaluator has handle {handle} (handles belong to the process and "
            "the evaluator object that registered them)"
        )
    return found


def _kernels(r: Tensor, handle: int):
    """The kernels of ``handle``'s evaluator for logits like r (its ``kernels``, picked once)."""
    return evaluator(handle).kernels(r.dtype)


# --- log Z, twice differentiable ------------------------------------------------------------------
@torch.library.custom_op("circuits::log_partition", mutates_args=())
def log_partition(r: Tensor, circuit: int, marginals: bool) -> tuple[Tensor, Tensor]:
    """(log P_indep(C) [T], the marginals [T, n] when ``marginals``, else an empty tensor)."""
    log_z, m = _kernels(r, circuit).log_partition(r, marginals)
    return log_z, m.contiguous() if m is not None else r.new_empty(0)


@log_partition.register_fake
def _(r, circuit, marginals):
    return r.new_empty(r.shape[0]), r.new_empty(r.shape if marginals else (0,))


def _log_partition_setup(ctx, inputs, output):
    r, circuit, _ = inputs
    ctx.circuit = circuit
    ctx.mark_non_differentiable(output[1])
    ctx.save_for_backward(r, output[1])


def _log_partition_backward(ctx, g_log_z, _):
    """d log Z / d r = m - sigmoid(r); under create_graph m is recomputed differentiably (the
    Hessian of log Z is Cov(z))."""
    r, m = ctx.saved_tensors
    if torch.is_grad_enabled() or m.numel() == 0:
        m = torch.ops.circuits.marginals(r, None, None, ctx.circuit, True, False)[0]
    return g_log_z.unsqueeze(-1) * (m - torch.sigmoid(r)), None, None


log_partition.register_autograd(_log_partition_backward, setup_context=_log_partition_setup)


# --- the marginals (and one draw), differentiable with Jacobian Cov(z) -------------------------------
@torch.library.custom_op("circuits::marginals", mutates_args=())
def marginals(
    r: Tensor, shift: Tensor | None, seed: Tensor | None, circuit: int, values: bool, want_log_z: bool
) -> tuple[Tensor, Tensor, Tensor]:
    """(m [T, n] (zeros unless ``values``), one draw z [T, n] when a seed is given else [0],
    log Z [T] when ``values`` or ``want_log_z`` else [0]).

    At most one sampling pass and one upward-downward pass; with ``values`` False m is zeros that
    still carry the Jacobian Cov(z) (straight-through estimators need only that)."""
    chosen = _kernels(r, circuit)
    z, log_z = r.new_empty(0), None
    if seed is not None:
        z, log_z = chosen.sample(r, *chosen.draw_uniforms(r, seed), shift=shift, log_z=want_log_z and not values)
    if values:
        log_z, m = chosen.log_partition(r, True, shift=shift, accurate=False)  # log Z: only checked
    else:
        m = torch.zeros_like(r)
        if log_z is None and want_log_z:
            log_z, _ = chosen.log_partition(r, False, shift=shift, accurate=False)
        elif not want_log_z:
            log_z = None  # a sampling pass may have made it anyway: the fake says [0]
    return m.contiguous(), z.contiguous(), r.new_empty(0) if log_z is None else log_z  # the fake's strides


@marginals.register_fake
def _(r, shift, seed, circuit, values, want_log_z):
    T = r.shape[0]
    has_log_z = values or want_log_z
    return torch.empty_like(r), r.new_empty(r.shape if seed is not None else (0,)), r.new_empty(T if has_log_z else 0)


def _marginals_setup(ctx, inputs, output):
    r, shift, _, circuit, _, _ = inputs
    ctx.circuit = circuit
    ctx.mark_non_differentiable(output[1], output[2])
    ctx.save_for_backward(r, shift)  # the caller's logits (no copy) and [T, 1]


def _marginals_backward(ctx, v, _z, _log_z):
    """Cov(z) v at the saved logits: the marginals' Jacobian is Cov(z), symmetric. The shift moves
    every logit of a row by one amount, along which an exactly-k circuit's marginals do not change
    (Cov(z) 1 = 0), so no gradient flows into it."""
    r, shift = ctx.saved_tensors
    return torch.ops.circuits.marginals_jvp(r, shift, v.contiguous(), ctx.circuit), None, None, None, None, None


marginals.register_autograd(_marginals_backward, setup_context=_marginals_setup)


@torch.library.custom_op("circuits::marginals_jvp", mutates_args=())
def marginals_jvp(r: Tensor, shift: Tensor | None, v: Tensor, circuit: int) -> Tensor:
    """Cov(z) v = (d marginals / d r) v: r, v [T, n] -> [T, n] (not differentiable again)."""
    return _kernels(r, circuit).marginals_jvp(r, v.contiguous(), shift=shift).contiguous()


@marginals_jvp.register_fake
def _(r, shift, v, circuit):
    return torch.empty_like(r)


# --- draws and the MAP (not differentiable) ----------------------------------------------------------
@torch.library.custom_op("circuits::sample", mutates_args=())
def sample(r: Tensor, shift: Tensor | None, seed: Tensor, circuit: int) -> tuple[Tensor, Tensor]:
    """(one exact draw z [T, n] in {0, 1}, log Z [T]) from the uniforms of ``seed``."""
    chosen = _kernels(r, circuit)
    z, log_z = chosen.sample(r, *chosen.draw_uniforms(r, seed), shift=shift)
    return z.contiguous(), log_z  # the torch passes build z transposed


@sample.register_fake
def _(r, shift, seed, circuit):
    return torch.empty_like(r), r.new_empty(r.shape[0])


@torch.library.custom_op("circuits::map", mutates_args=())
def map_assignment(r: Tensor, shift: Tensor | None, circuit: int) -> tuple[Tensor, Tensor]:
    """(the most probable satisfying assignment z [T, n] in {0, 1}, its log-value [T]; -inf where none)."""
    z, best = _kernels(r, circuit).map(r, shift=shift)
    return z.contiguous(), best


@map_assignment.register_fake
def _(r, shift, circuit):
    return torch.empty_like(r), r.new_empty(r.shape[0])


# --- the cardinality DP: the marginals (and one draw), differentiable with Jacobian Cov(z) -------------
def _dp(r: Tensor, kmin: int, kmax: int):
    """The DP's kernels for r [T, n] (``TorchDP``, ``CDP`` or ``TritonDP``), as ``select`` picks them."""
    return select(Lattice(r.shape[-1], kmin, kmax, r.device), r.dtype)


@torch.library.custom_op("circuits::dp_marginals", mutates_args=())
def dp_marginals(r: Tensor, seed: Tensor | None, kmin: int, kmax: int, values: bool) -> tuple[Tensor, Tensor]:
    """(m [T, n] (zeros unless ``values``), one draw z [T, n] when a seed is given, else [0]): one
    up and one down sweep."""
    m, z = _dp(r, kmin, kmax).forward_marginals(r, seed, values)
    return m.contiguous(), z.contiguous()  # the torch sweeps build them transposed


@dp_marginals.register_fake
def _(r, seed, kmin, kmax, values):
    return torch.empty_like(r), r.new_empty(r.shape if seed is not None else (0,))


def _dp_marginals_setup(ctx, inputs, output):
    r, _, kmin, kmax, _ = inputs
    ctx.sizes = (kmin, kmax)
    ctx.mark_non_differentiable(output[1])
    ctx.save_for_backward(r)  # the caller's logits: no copy


def _dp_marginals_backward(ctx, v, _z):
    """The marginals' Jacobian is Cov(z), symmetric: the backward is one product Cov(z) v."""
    (r,) = ctx.saved_tensors
    return torch.ops.circuits.dp_cov_vec(r, v.contiguous(), *ctx.sizes), None, None, None, None


dp_marginals.register_autograd(_dp_marginals_backward, setup_context=_dp_marginals_setup)


@torch.library.custom_op("circuits::dp_cov_vec", mutates_args=())
def dp_cov_vec(r: Tensor, v: Tensor, kmin: int, kmax: int) -> Tensor:
    """Cov(z) v = (d m / d r) v: r, v [T, n] -> [T, n] (not differentiable again)."""
    return _dp(r, kmin, kmax).cov_vec(r, v).contiguous()


@dp_cov_vec.register_fake
def _(r, v, kmin, kmax):
    return torch.empty_like(r)


@torch.library.custom_op("circuits::dp_log_counts", mutates_args=())
def dp_log_counts(r: Tensor, kmin: int, kmax: int, paper: bool) -> Tensor:
    """log Σ_{|z| = j} exp(r·z) for j = kmin..kmax: r [T, n] -> [T, J] (-inf where no z has j ones);
    ``paper``: log P_indep(|z| = j) instead. One upward sweep."""
    return _dp(r, kmin, kmax).log_counts(r, paper)


@dp_log_counts.register_fake
def _(r, kmin, kmax, paper):
    return r.new_empty(r.shape[0], kmax - kmin + 1)


def _dp_log_counts_setup(ctx, inputs, output):
    r, kmin, kmax, paper = inputs
    ctx.args = (kmin, kmax, paper)
    ctx.save_for_backward(r)


def _dp_log_counts_backward(ctx, g):
    (r,) = ctx.saved_tensors
    return torch.ops.circuits.dp_log_counts_backward(r, g.contiguous(), *ctx.args), None, None, None


dp_log_counts.register_autograd(_dp_log_counts_backward, setup_context=_dp_log_counts_setup)


@torch.library.custom_op("circuits::dp_log_counts_backward", mutates_args=())
def dp_log_counts_backward(r: Tensor, g: Tensor, kmin: int, kmax: int, paper: bool) -> Tensor:
    """Σ_j g_j d log Z_j / d r for g [T, J]: [T, n] (one up and one down sweep; not differentiable again)."""
    return _dp(r, kmin, kmax).log_counts_backward(r, g, paper).contiguous()


@dp_log_counts_backward.register_fake
def _(r, g, kmin, kmax, paper):
    return torch.empty_like(r)


# --- the group DP's log counts by size (its other queries are the circuit operators above) ------------
@torch.library.custom_op("circuits::group_log_counts", mutates_args=())
def group_log_counts(r: Tensor, circuit: int, kmin: int, kmax: int, paper: bool) -> Tensor:
    """log Σ_{z allowed, |z| = j} exp(r·z) for j = kmin..kmax under the group DP of handle ``circuit``
    (a ``GroupDP``; ``kmin``, ``kmax``: its sizes, for the fake): r [T, n] -> [T, J] (-inf where nothing
    allowed has j true); ``paper``: less Σ softplus(r). One upward pass."""
    return _kernels(r, circuit).log_counts(r, paper).contiguous()


@group_log_counts.register_fake
def _(r, circuit, kmin, kmax, paper):
    return r.new_empty(r.shape[0], kmax - kmin + 1)


def _group_log_counts_setup(ctx, inputs, output):
    r, circuit, kmin, kmax, paper = inputs
    ctx.args = (circuit, paper)
    ctx.save_for_backward(r)


def _group_log_counts_backward(ctx, g):
    (r,) = ctx.saved_tensors
    return torch.ops.circuits.group_log_counts_backward(r, g.contiguous(), *ctx.args), None, None, None, None


group_log_counts.register_autograd(_group_log_counts_backward, setup_context=_group_log_counts_setup)


@torch.library.custom_op("circuits::group_log_counts_backward", mutates_args=())
def group_log_counts_backward(r: Tensor, g: Tensor, circuit: int, paper: bool) -> Tensor:
    """Σ_j g_j d log Z_j / d r for g [T, J]: [T, n] (one adjoint pass; not differentiable again)."""
    return _kernels(r, circuit).log_counts_backward(r, g, paper).contiguous()


@group_log_counts_backward.register_fake
def _(r, g, circuit, paper):
    return torch.empty_like(r)


# --- the straight-through selection: one draw, the drawn by score, Eq. 7's gradient -------------------
@torch.library.custom_op("circuits::chosen_scores", mutates_args=())
def chosen_scores(
    r: Tensor, seed: Tensor, kmin: int, kmax: int, circuit: int, slots: int, kind: str, paper: bool
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """One draw z ~ P(z | C, r) and, for the drawn variables by score descending (ties to the lower
    index), their scores π = softmax(r) or sigmoid(r) (``kind``), with the straight-through gradient
    (``circuits.kernels.straight_through``): (weights [T, slots], indices [T, slots] long, mask [T, slots]
    bool, π [T, n]). C: the constraint of the evaluator of handle ``circuit`` (a ``Circuit`` or a
    ``CardinalityDP`` or ``GroupDP``; ``kmin``, ``kmax``: its sizes, for the reader: the evaluator knows them);
    ``paper``: the marginals' Jacobian Cov(z) diag(1 - sigmoid(r)) in the backward. The kernels'
    ``chosen``: one pass where they fuse it (the C kernels, the Triton ones), else the draw of ``dp_marginals`` /
    ``marginals`` with the same seed, then ``topk_chosen``."""
    return _chosen_scores_forward(r, seed, circuit, slots, kind)


def _chosen_scores_forward(r: Tensor, seed: Tensor, circuit: int, slots: int, kind: str):
    """``chosen_scores``' computation, shared by the operator and the eager call (``chosen_scores_call``)."""
    r = r.contiguous()  # the C kernels read rows in place
    p = straight_through.scores(r, kind)
    return (*_kernels(r, circuit).chosen(r, seed, p, slots), p)


@chosen_scores.register_fake
def _(r, seed, kmin, kmax, circuit, slots, kind, paper):
    T = r.shape[0]
    return (
        r.new_empty(T, slots),
        r.new_empty(T, slots, dtype=torch.int64),
        r.new_empty(T, slots, dtype=torch.bool),
        torch.empty_like(r),
    )


def _chosen_scores_setup(ctx, inputs, output):
    r, _, kmin, kmax, circuit, _, kind, paper = inputs
    _, idx, mask, p = output
    ctx.args = (kmin, kmax, circuit, kind, paper)
    ctx.mark_non_differentiable(idx, mask, p)
    ctx.set_materialize_grads(False)  # no zero [T, n] gradient for π (nor for the indices and mask)
    ctx.save_for_backward(r, idx.to(torch.int32), mask)  # the caller's logits (no copy); the rest recomputed


def _chosen_scores_backward(ctx, g_w, g_idx, g_mask, g_p):
    if g_w is None:
        return (None,) * 8
    r, idx, mask = ctx.saved_tensors
    g_r = torch.ops.circuits.chosen_scores_backward(r, idx, mask, g_w.contiguous(), *ctx.args)
    return g_r, None, None, None, None, None, None, None


chosen_scores.register_autograd(_chosen_scores_backward, setup_context=_chosen_scores_setup)


class _ChosenScoresEager(torch.autograd.Function):
    """``circuits::chosen_scores`` and its backward called directly, without the operator's dispatch
    (``chosen_scores_call``): the same computation and saved tensors, a fraction of the host time."""

    @staticmethod
    def forward(ctx, r, seed, kmin, kmax, circuit, slots, kind, paper):
        out = _chosen_scores_forward(r, seed, circuit, slots, kind)
        _chosen_scores_setup(ctx, (r, seed, kmin, kmax, circuit, slots, kind, paper), out)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g_w, g_idx, g_mask, g_p):
        if g_w is None:
            return (None,) * 8
        r, idx, mask = ctx.saved_tensors
        _, _, circuit, kind, paper = ctx.args
        g_r = _chosen_scores_backward_compute(r, idx, mask, g_w.contiguous(), circuit, kind, paper)
        return g_r, None, None, None, None, None, None, None


def eager(r: Tensor) -> bool:
    """Whether a call on ``r`` may skip the operators' dispatch: plain eager torch (no compiler
    tracing, no dispatch or function mode, no functorch transform, a plain tensor with values: not
    "meta", whose calls take the operators' fake implementations). The operators exist for those
    (one graph node, fake tensors, compiled seeds); called directly, the eager computation is the
    same without their dispatch: about 0.1 ms less host time for each operator with its autograd
    on a 2-core EPYC; a route on a GPU is host-bound at 64 experts)."""
    return (
        type(r) is Tensor
        and not r.is_meta
        and not torch.compiler.is_compiling()
        and torch._C._len_torch_dispatch_stack() == 0
        and not torch._C._is_torch_function_mode_enabled()
        and not torch._C._are_functorch_transforms_active()
    )


def chosen_scores_call(
    r: Tensor,
    generator: torch.Generator | Tensor | None,
    kmin: int,
    kmax: int,
    circuit: int,
    slots: int,
    kind: str,
    paper: bool,
):
    """``circuits::chosen_scores`` with the seed of one draw from ``generator`` (``seed``): the
    operator, or where ``eager`` the same computation called directly."""
    if eager(r):
        s = uniforms.as_seed(generator, r.device)
        return _ChosenScoresEager.apply(r, s, kmin, kmax, circuit, slots, kind, paper)
    return torch.ops.circuits.chosen_scores(r, seed(generator, r), kmin, kmax, circuit, slots, kind, paper)


@torch.library.custom_op("circuits::chosen_scores_backward", mutates_args=())
def chosen_scores_backward(
    r: Tensor, indices: Tensor, mask: Tensor, g: Tensor, kmin: int, kmax: int, circuit: int, kind: str, paper: bool
) -> Tensor:
    """The gradient of ``chosen_scores``' weights: r [T, n], indices [T, slots] (int32 or long), mask
    [T, slots] bool, g [T, slots] -> [T, n] = J(g_t) + the scores' backward of g (softmax: g_t - π Σ g_t;
    sigmoid: g_t (1 - π)), g_t = (g at the used slots, scattered to their variables) ⊙ π, J the
    marginals' Jacobian (Cov(z), times diag(1 - sigmoid(r)) with ``paper``): the kernels'
    ``chosen_backward``. Not differentiable again."""
    return _chosen_scores_backward_compute(r, indices, mask, g, circuit, kind, paper)


def _chosen_scores_backward_compute(r, indices, mask, g, circuit: int, kind: str, paper: bool) -> Tensor:
    """``chosen_scores_backward``'s computation, shared by the operator and the eager call."""
    r = r.contiguous()
    return _kernels(r, circuit).chosen_backward(r, indices, mask, g, kind, paper)


@chosen_scores_backward.register_fake
def _(r, indices, mask, g, kmin, kmax, circuit, kind, paper):
    return torch.empty_like(r)


# --- row operations ------------------------------------------------------------------------------------
def _rows(x: Tensor):
    """The row operations for rows like ``x``, as ``select`` picks them."""
    return select(Rows(x.device), x.dtype)


@torch.library.custom_op("circuits::kth_largest", mutates_args=())
def kth_largest(x: Tensor, k: int) -> Tensor:
    """Each row's k-th largest entry: x [T, n], 1 <= k <= n -> [T] (``circuits.kernels.rows``)."""
    return _rows(x).kth_largest(x, k)


@kth_largest.register_fake
def _(x, k):
    return x.new_empty(x.shape[0])


@torch.library.custom_op("circuits::topk", mutates_args=())
def topk(x: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """The k largest entries of each row, descending, ties to the lower index: x [T, n] ->
    (values [T, k], indices [T, k] long) (``circuits.kernels.rows``)."""
    values, indices = _rows(x).topk(x, k)
    return values.contiguous(), indices.contiguous()  # the reference slices a sort


@topk.register_fake
def _(x, k):
    return x.new_empty(x.shape[0], k), x.new_empty(x.shape[0], k, dtype=torch.int64)


@torch.library.custom_op("circuits::topk_chosen", mutates_args=())
def topk_chosen(z: Tensor, x: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """``topk`` of the keys (z - 1) + x z for a 0/1 choice z and x >= 0, z, x [T, n]: the chosen entries
    by x descending, then the others (value -1) by index (``circuits.kernels.rows``)."""
    values, indices = _rows(x).topk_chosen(z, x, k)
    return values.contiguous(), indices.contiguous()


@topk_chosen.register_fake
def _(z, x, k):
    return x.new_empty(x.shape[0], k), x.new_empty(x.shape[0], k, dtype=torch.int64)


@torch.library.custom_op("circuits::draw_seed", mutates_args=(), tags=(torch.Tag.nondeterministic_seeded,))
def draw_seed(r: Tensor) -> Tensor:
    """A sampling seed from torch's default generator of r's device: 0-dim int64 (an operator, so a
    compiled model draws the same seeds as the eager one). ``r``, the logits the seed is for, is
    not read: it makes every call's arguments distinct, so that a compiler never merges two draws
    into one (two routers' draw_seed(device) calls were merged, tag or not)."""
    return uniforms.seed_tensor(None, r.device)


@draw_seed.register_fake
def _(r):
    return torch.empty((), dtype=torch.int64, device=r.device)


def seed(generator: torch.Generator | Tensor | None, r: Tensor) -> Tensor:
    """The seed of one draw for logits ``r``: ``generator`` itself where it is a seed tensor (0-dim
    int64), else one drawn from it, or from the default generator (``draw_seed``)."""
    return uniforms.as_seed(generator, r.device) if generator is not None else draw_seed(r.detach())
