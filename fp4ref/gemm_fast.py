"""Fast path of ``fp4ref.gemm.emulate`` for the fused-FMA family with an FP32 accumulator
(issue 13): everything that does not depend on the running accumulator is computed for
all K-steps at once (products, step exponents, special products, zero signs: tensors
[steps, lanes, F]), leaving a thin sequential recurrence: ~18 elementwise torch ops per
fused step on the CPU (the generic engine issues ~240), one Triton launch for all steps
on CUDA (fp4ref/gemm_fast_triton.py, same arithmetic; on a GPU the cost was the launches).

Which models (``fast_reason`` returns None for them, else why not): no block scales, no
chain / exact runs / overflow_inf / product_format, the accumulator FP32 itself
(acc_frac_bits 23, subnormals kept), norm_mode and outer_mode RNE or RTZ, and either

* alignment (``align_bits`` set) by value or by exponent sum, align_mode RNE or RTZ, any
  fused width F, groups G, split-K; or
* exact fused steps of one product (F = 1, ``align=exact``): the FP32 FMA chain.

Operands must make every product exact in float64: significands of at most 53 bits
together and every nonzero finite operand within 2**+-400 (FP32, TF32, BF16, FP16 are).

Why each step is exact (values are float64 tensors holding FP32 values):

* products a*b: exact in float64 (<= 53 bits, far from float64's range ends).
* aligned step: emax = max(floor(log2|acc|), the products' exponents), q = 2**(emax -
  align_bits); each term times 1/q (a power of two: exact) rounded to an integer (trunc =
  RTZ, torch.round = half to even = RNE) is < 2**(align_bits + 2) in magnitude, so the
  sum of F + 1 of them is an exact float64 integer (align_bits + 3 + log2(F+1) <= 52 is
  checked), and T = sum * q is the exact aligned sum.  Rounding T to FP32: a float64 ->
  float32 cast is RNE (IEEE, subnormals and overflow to Inf included); RTZ steps that
  result one ulp toward zero when the cast went up in magnitude (Inf -> max finite).
* add of two FP32 values (or an FP32 value and an exact product), F = 1 and the
  cross-group / split-K adds: s = fl64(x + y) and its exact error e (two-sum); if e != 0
  and s's last bit is even, s moves one float64 ulp toward x + y: that is x + y rounded
  to odd at 53 bits, and rounding-to-odd at >= p + 2 bits followed by any rounding to p
  bits (here 24, FP32's range being inside float64's) equals the direct rounding
  (Boldo & Melquiond, "Emulation of FMA and correctly rounded sums: proved algorithms
  using rounding to odd", IEEE TC 2008).
* zero signs: IEEE's for RNE and RTZ (x + (-x) = +0, -0 + -0 = -0), the reference's
  ``_zero_sign`` for those modes; an aligned step whose terms are all zero is -0 only if
  the accumulator and every product are -0.
* specials: IEEE float64 arithmetic on Inf/NaN (Inf - Inf = NaN, Inf * 0 = NaN) is the
  reference's rule; a step's special products are summed apart (order does not matter
  for Inf/NaN) and override the finite result; an Inf/NaN accumulator stays.

Split-K slices and groups (G=n) are independent recurrences from +0 (no chain): they run
as one batch of lanes; the cross-group adds then run in order per slice, and the slices
are added in order.
"""
from __future__ import annotations

import os
import warnings

import torch

from reference.rounding import Mode, Subnormal
from reference.schedule import AlignRef, Operand, Schedule, ScaleAt

__all__ = ["fast_reason", "operands_reason", "fast_totals", "add_round32", "round32", "BACKENDS"]

_I64 = torch.int64
_F64 = torch.float64
_SIGN = -(1 << 63)        # the bits of float64 -0.0 as int64
_TRUNC32 = ~((1 << 29) - 1)  # float64 bits kept by truncation to FP32's 24-bit significand
_XFLOOR = -900            # exponent of "no nonzero term" (below every real one, >= 2**-800)
_MODES = (Mode.RNE, Mode.RTZ)


def fast_reason(model, plan: Schedule) -> str | None:
    """None where the fast path computes ``model`` exactly, else why not (a model check)."""
    m = model
    checks = (
        (plan.K == 0, "K = 0"),
        (plan.scales is not ScaleAt.NONE, "block scales"),
        (m.chain or m.exact_group is not None or m.overflow_inf or m.mma_family, "MMA family"),
        (m.product_format is not None, "product_format"),
        (m.acc_frac_bits != 23 or m.acc_subnormal is not Subnormal.KEEP, "accumulator not FP32"),
        (m.norm_mode not in _MODES or m.outer_mode not in _MODES, "norm/outer mode not RNE/RTZ"),
    )
    for bad, why in checks:
        if bad:
            return why
    if m.align_bits is None:
        return None if m.fma_width == 1 else "exact fused step wider than one product"
    if m.align_mode not in _MODES:
        return "align_mode not RNE/RTZ"
    if plan.acc_exp_floor is not None or m.align_ref not in (AlignRef.VALUE, AlignRef.EXPONENT_SUM):
        return "align_ref"
    if any(f.format is not None or f.operand not in (Operand.A, Operand.B)
           for f in plan.exp_factors or ()):
        return "exp_factors"
    if m.align_bits + 3 + (plan.step_width + 1).bit_length() > 52:
        return "align_bits too wide for a float64 sum"
    return None


def _exp_width(x: torch.Tensor):
    """(min exponent, max exponent, max significand width) of x's nonzero finite float64
    values (None when there are none)."""
    bits = x.to(_F64).reshape(-1).view(_I64)
    ef = (bits >> 52) & 0x7FF
    ok = (ef != 0x7FF) & ((bits & ~_SIGN) != 0)
    if not bool(ok.any()):
        return None
    ef, man = ef[ok], bits[ok] & ((1 << 52) - 1)
    if bool((ef == 0).any()):  # float64 subnormal: far outside every supported range
        return (-1074, -1074, 53)
    tz = torch.where(man == 0, 52, (man & -man).to(_F64).log2().to(_I64))
    return int(ef.min()) - 1023, int(ef.max()) - 1023, int((53 - tz).max())


def operands_reason(a: torch.Tensor, b: torch.Tensor) -> str | None:
    """None where every product a_ik * b_kj is exact in float64 (see the module doc)."""
    ra, rb = _exp_width(a), _exp_width(b)
    if ra is None or rb is None:
        return None  # every product zero or special
    if ra[2] + rb[2] > 53:
        return "products wider than 53 bits"
    if min(ra[0], rb[0]) < -400 or max(ra[1], rb[1]) > 400:
        return "operand exponents outside [-400, 400]"
    return None


# ---------------------------------------------------------------------------
# the two roundings to FP32 (float64 in, float64 holding FP32 values out)
# ---------------------------------------------------------------------------
def round32(t: torch.Tensor, mode: Mode) -> torch.Tensor:
    """t (float64, exact) rounded to FP32 with RNE or RTZ (IEEE overflow and specials)."""
    y = t.to(torch.float32)
    if mode is Mode.RTZ:
        up = y.to(_F64).abs() > t.abs()
        y = torch.where(up, torch.nextafter(y, torch.zeros_like(y)), y)
    return y.to(_F64)


def add_round32(x: torch.Tensor, y: torch.Tensor, mode: Mode) -> torch.Tensor:
    """x + y (float64, each exact: FP32 values or exact products) rounded once to FP32."""
    s = x + y
    bb = s - x
    e = (x - (s - bb)) + (y - bb)            # two-sum: x + y = s + e exactly
    bits = s.view(_I64)
    fix = (e != 0) & ((bits & 1) == 0) & torch.isfinite(s)
    step = torch.where((e > 0) == (s > 0), 1, -1)  # +1 on the bits is one ulp up in magnitude
    s = torch.where(fix, bits + step, bits).view(_F64)  # now x + y rounded to odd
    return round32(s, mode)


# ---------------------------------------------------------------------------
# lanes: every group of every slice, padded to whole steps of F
# ---------------------------------------------------------------------------
def _lanes(plan: Schedule, F: int, Fp: int, device):
    """idx [L, S * Fp] of every group's products, step by step (steps of F products from
    the group's start, each padded to Fp; K marks padding), and comb [slices, groups]: the
    lane of each group of each slice (-1: none)."""
    groups = [(si, g.lo, g.hi) for si, sl in enumerate(plan.slices) for g in sl.groups]
    S = max(max(-(-(hi - lo) // F) for _, lo, hi in groups), 1)
    idx = torch.full((len(groups), S, Fp), plan.K, dtype=_I64)
    ng = max(len(sl.groups) for sl in plan.slices)
    comb = torch.full((len(plan.slices), ng), -1, dtype=_I64)
    seen = [0] * len(plan.slices)
    pos = torch.arange(S)[:, None] * F + torch.arange(Fp)[None, :]  # offset in the group
    ok = torch.arange(Fp)[None, :] < F
    for lane, (si, lo, hi) in enumerate(groups):
        idx[lane] = torch.where(ok & (pos < hi - lo), lo + pos, plan.K)
        comb[si, seen[si]] = lane
        seen[si] += 1
    idx = idx.reshape(len(groups), S * Fp)
    pad = (idx == plan.K).reshape(len(groups), S, Fp).all(2).t()  # [S, L]: steps of padding only
    if idx.numel() == plan.K and bool((idx.reshape(-1) == torch.arange(plan.K)).all()):
        idx = None  # no padding, K in order: the gather is a reshape
    return (None if idx is None else idx.to(device)), comb.to(device), S, pad.to(device)


def _gather(x: torch.Tensor, pad, idx, L: int, S: int, F: int) -> torch.Tensor:
    """[R, K] -> [S, R * L, F] in step-major order (padding: ``pad``; idx None: the lanes'
    steps are K in order, L * S * F = K)."""
    R = x.shape[0]
    if idx is None:
        g = x.reshape(R, L, S, F)
    else:
        xp = torch.cat([x, torch.full((R, 1), pad, dtype=x.dtype, device=x.device)], 1)
        g = xp[:, idx.reshape(-1)].reshape(R, L, S, F)
    return g.permute(2, 0, 1, 3).reshape(S, R * L, F).contiguous()


def _exps(x: torch.Tensor) -> torch.Tensor:
    """floor(log2|x|) of nonzero finite normal float64 x, a large negative number otherwise."""
    bits = x.view(_I64)
    ef = (bits >> 52) & 0x7FF
    ok = (ef != 0x7FF) & (ef != 0)
    return torch.where(ok, ef - 1023, -(1 << 20))


# ---------------------------------------------------------------------------
# the recurrences
# ---------------------------------------------------------------------------
def fast_totals(model, plan: Schedule, a: torch.Tensor, b: torch.Tensor,
                backend: str = "auto") -> torch.Tensor:
    """The FP32 sums before the epilogue (``Schedule.run``'s result), float64 [M * N], of
    a [M, K] @ b [K, N] (float64) under ``model`` (``fast_reason`` and ``operands_reason``
    None).  backend: the recurrences' (``BACKENDS``)."""
    tri = _use_triton(backend, a.device)
    if tri and backend == "auto":
        try:
            return _totals(model, plan, a, b, True)
        except Exception as e:  # a Triton build failure must not stop the emulator: torch loop
            warnings.warn(f"fp4ref.gemm_fast: Triton recurrences failed ({e!r}); using the torch loop")
            tri = False
    return _totals(model, plan, a, b, tri)


def _totals(model, plan: Schedule, a, b, tri: bool) -> torch.Tensor:
    F = plan.step_width  # the widest step (fma_width, or less where groups are shorter)
    Fp = 1 << (F - 1).bit_length() if tri else F  # Triton: a power of two, -0.0 padding
    idx, comb, S, pad = _lanes(plan, F, Fp, a.device)
    M, N, L = a.shape[0], b.shape[1], pad.shape[1]
    P = _gather((a[:, None, :] * b.t()[None]).reshape(M * N, -1), -0.0, idx, L, S, Fp)
    if model.align_bits is None:  # F = 1: the exact FMA chain
        acc = _chain(P[:, :, 0], model.norm_mode, tri)
    else:
        X = None
        if plan.exp_factors is not None:  # exponent sums of the factors (int32: |x| < 2**22)
            X = (_exps(a).int()[:, None, :] + _exps(b).t().int()[None]).reshape(M * N, -1)
            X = _gather(X, -(1 << 21), idx, L, S, Fp)
        # operands without zeros or specials: no special products, and a step's products
        # are all -0 only where the step is padding
        clean = bool(torch.isfinite(a).all() & torch.isfinite(b).all() & (a != 0).all() & (b != 0).all())
        negz = pad[:, None, :].expand(S, M * N, L).reshape(S, M * N * L) if clean else None
        acc = _aligned(P, X, model, tri, negz)
    return _combine(acc.reshape(M * N, L), comb, model.outer_mode)


BACKENDS = ("auto", "torch", "triton")


def _use_triton(backend: str, device) -> bool:
    """auto: Triton on CUDA where it imports; triton: required (CUDA, or CPU tensors under
    TRITON_INTERPRET=1); torch: the torch loop."""
    if backend not in BACKENDS:
        raise ValueError(f"backend: unknown value {backend!r}; valid choices: {', '.join(BACKENDS)}")
    if backend == "torch" or (backend == "auto" and device.type != "cuda"):
        return False
    try:
        from . import gemm_fast_triton  # noqa: F401
    except ImportError:
        ok = False
    else:
        ok = device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"
    if backend == "triton" and not ok:
        raise ValueError(f"backend: 'triton' needs the triton package and CUDA tensors (or "
                         f"TRITON_INTERPRET=1), got {device.type} tensors; valid choices: auto, torch")
    return ok


def _chain(P: torch.Tensor, mode: Mode, tri: bool) -> torch.Tensor:
    """P [S, lanes] exact products -> each lane's FP32 FMA chain from +0."""
    if tri:
        from .gemm_fast_triton import chain_lanes
        return chain_lanes(P, mode is Mode.RTZ)
    acc = torch.zeros(P.shape[1], dtype=_F64, device=P.device)
    for s in range(P.shape[0]):
        acc = add_round32(acc, P[s], mode)
    return acc


def _aligned(P: torch.Tensor, X, model, tri: bool, negz=None) -> torch.Tensor:
    """The aligned fused steps of every lane: P [S, lanes, F] products, X their alignment
    exponents (None: by value).  negz given: the products are finite and negz says which
    steps' products are all -0.  Returns the lanes' FP32 results."""
    if negz is None:
        fin = torch.isfinite(P)
        spec = torch.where(fin, 0.0, P).sum(-1)       # Inf/NaN of each step (order-free)
        P = torch.where(fin, P, 0.0)
        negz = (P.view(_I64) == _SIGN).all(-1)        # every product of the step is -0
    else:
        spec = torch.zeros(negz.shape, dtype=_F64, device=P.device)
    if X is None:
        X = _exps(P)
    Xb = (X.amax(-1).clamp(min=_XFLOOR) + 1023).to(_I64)  # biased exponent of the step's top
    if tri:
        from .gemm_fast_triton import aligned_lanes
        return aligned_lanes(P, Xb, spec, negz, model.align_bits, model.align_mode is Mode.RTZ,
                             model.norm_mode is Mode.RTZ)
    return _aligned_torch(P, Xb, spec, negz, model)


def _aligned_torch(P, Xb, spec, negz, model) -> torch.Tensor:
    """The torch loop of ``_aligned``: ~18 elementwise ops per step.  The accumulator joins
    each step as column 0 of the products; the Inf/NaN handling runs only where some
    product is special (without, an Inf accumulator stays Inf by itself: Inf times a
    power of two, rounded, summed with finite terms, rounded to FP32); RTZ to FP32 is a
    mask of the float64 bits where every nonzero sum is FP32-normal (``_rtz_by_mask``)."""
    S, RL, _ = P.shape
    ab = model.align_bits
    P = torch.cat([torch.zeros(S, RL, 1, dtype=_F64, device=P.device), P], 2)
    zs = torch.where(negz, -0.0, 0.0).to(_F64)         # an all-zero step's sign (acc -0 too)
    special = bool((spec != 0).any())
    rnd = torch.trunc if model.align_mode is Mode.RTZ else torch.round  # round: half to even
    rtz = model.norm_mode is Mode.RTZ
    mask = rtz and _rtz_by_mask(P, Xb, ab)
    acc = torch.zeros(RL, dtype=_F64, device=P.device)
    for s in range(S):
        P[s, :, 0] = acc
        bits = acc.view(_I64)
        # biased emax (a zero acc: 0; an Inf acc: 2045, so that 1/q stays a normal float64)
        eb = torch.maximum((bits >> 52) & 0x7FF, Xb[s]).clamp_(max=2045)
        inv = ((2046 + ab - eb) << 52).view(_F64)          # 2**(ab - emax)
        q = ((eb - ab) << 52).view(_F64)                   # 2**(emax - ab)
        t = rnd(P[s] * inv[:, None]).sum(1)                # exact integers < 2**52
        y = (((t * q).view(_I64) & _TRUNC32).view(_F64) if mask
             else round32(t * q, model.norm_mode))
        # an exact zero: -0 only if every term was -0 (t == 0 with a nonzero acc: zs is +0)
        y = torch.where(t == 0, acc * 0.0 + zs[s], y)
        if special:
            z = acc + spec[s]                              # Inf/NaN accumulator or products
            y = torch.where(torch.isfinite(z), y, z)
        acc = y
    return acc


def _rtz_by_mask(P, Xb, ab: int) -> bool:
    """Whether every nonzero aligned sum is an FP32-normal value: then RTZ to FP32 is
    clearing the float64 significand's low 29 bits.  A sum's quantum is at least the
    step's top product exponent minus ab (>= -126 here), and no sum exceeds the lane's
    sum of |products| plus rounding slack (< 2**120 here)."""
    has = Xb > _XFLOOR + 1023
    low = bool(((Xb - 1023 - ab >= -126) | ~has).all())
    return low and bool((P.abs().sum((0, 2)) < 2.0 ** 120).all())


def _combine(tot: torch.Tensor, comb: torch.Tensor, outer_mode: Mode) -> torch.Tensor:
    """Lanes' results [R, L] -> [R]: per slice its groups in order (the first as is, then
    cross-group adds in ``outer_mode``), then the slices added in order, RNE."""
    outer = tot[:, comb[:, 0]]                        # [R, slices]
    for j in range(1, comb.shape[1]):
        lane = comb[:, j]
        new = add_round32(outer, tot[:, lane.clamp(min=0)], outer_mode)
        outer = torch.where(lane >= 0, new, outer)
    total = outer[:, 0]
    for s in range(1, outer.shape[1]):
        total = add_round32(total, outer[:, s], Mode.RNE)
    return total
