"""Fast path of ``fp4ref.gemm.emulate`` for the fused-FMA family with an accumulator of
FP32's exponent range and at most FP32's precision (issue 13): everything that does not
depend on the running accumulator is computed for all K-steps at once (products, step
exponents, special products, zero signs: tensors [steps, lanes, F]), leaving a thin
sequential recurrence: ~18 elementwise torch ops per fused step on the CPU (the generic
engine issues ~240), one Triton launch for all steps on CUDA (fp4ref/gemm_fast_triton.py,
same arithmetic; on a GPU the cost was the launches).

Which models (``fast_reason`` returns None for them, else why not): no block scales, no
chain / exact runs / overflow_inf / product_format, the accumulator
``reference.gemm.accumulator_format(p)`` with p = acc_frac_bits <= 23 (p + 1 significant
bits, FP32's exponent range, IEEE specials: FP32 itself at p = 23, the Hopper FP8 wgmma
accumulator at p = 13), subnormals kept or flushed, norm_mode and outer_mode RNE or RTZ,
and either

* alignment (``align_bits`` set) by value or by exponent sum, align_mode RNE or RTZ, any
  fused width F, groups G, split-K; or
* exact fused steps of one product (F = 1, ``align=exact``): the FMA chain.

Operands must make every product exact in float64: significands of at most 53 bits
together and every nonzero finite operand within 2**+-400 (FP32, TF32, BF16, FP16, FP8 are).

Why each step is exact (values are float64 tensors holding accumulator / FP32 values):

* products a*b: exact in float64 (<= 53 bits, far from float64's range ends).
* aligned step: emax = max(floor(log2|acc|), the products' exponents), q = 2**(emax -
  align_bits); each term times 1/q (a power of two: exact) rounded to an integer (trunc =
  RTZ, torch.round = half to even = RNE) is < 2**(align_bits + 2) in magnitude, so the
  sum of F + 1 of them is an exact float64 integer (align_bits + 3 + log2(F+1) <= 52 is
  checked), and T = sum * q is the exact aligned sum.  Nothing here depends on p.
* rounding an exact float64 T to the accumulator (``round_acc``), as
  ``reference.gemm.round_fp(T, accumulator_format(p), mode, acc_subnormal)``:
  p = 23: a float64 -> float32 cast is RNE (IEEE, subnormals and overflow to Inf
  included); RTZ steps that result one ulp toward zero when the cast went up in
  magnitude (Inf -> max finite).
  p < 23 (``_round_narrow``): the quantum at T's exponent e is Q = 2**(max(e, -126) - p)
  (FP32's emin: below 2**-126 the grid stays 2**(-126-p), the format's subnormals);
  T times 1/Q (a normal float64 power of two, Q >= 2**-149) is exact and below
  2**(p+1) in magnitude, so trunc / round-half-even of it is RTZ / RNE onto the grid,
  and times Q exact.  A carry to 2**(e+1) is on the grid too.  Then IEEE overflow as round_fp: a
  rounded magnitude above max finite (2 - 2**-p) * 2**127 is Inf under RNE (the tie at
  max + Q/2 goes to the even 2**128) and max finite under RTZ; Inf/NaN T stays.
  FLUSH (both p): round_fp rounds on the KEEP grid, then a nonzero result below 2**-126
  becomes a zero of the value's sign (reference.rounding ``_encode_finite``); y * 0.0
  is that zero (y keeps T's sign, a rounded-away zero included).
* add of two accumulator / FP32 values (or one and an exact product), F = 1 and the
  cross-group / split-K adds: s = fl64(x + y) and its exact error e (two-sum); if e != 0
  and s's last bit is even, s moves one float64 ulp toward x + y: that is x + y rounded
  to odd at 53 bits, and rounding-to-odd at >= n + 2 bits followed by any rounding to n
  bits equals the direct rounding (Boldo & Melquiond, "Emulation of FMA and correctly
  rounded sums: proved algorithms using rounding to odd", IEEE TC 2008); here n = p + 1
  <= 24 and 53 >= n + 2, with the target's exponent range (subnormals included) inside
  float64's normal range.
* cross-group and split-K adds round to FP32 (the reference's ``add_outer`` /
  ``add_slices``); a group's result enters them as is: ``round_outer`` (FP32) is the
  identity on accumulator values, whose grid (same exponent range, quantum
  2**(max(e, -126) - p) >= FP32's) is part of FP32's.
* zero signs: IEEE's for RNE and RTZ (x + (-x) = +0, -0 + -0 = -0), the reference's
  ``_zero_sign`` for those modes; an aligned step whose terms are all zero is -0 only if
  the accumulator and every product are -0.
* specials: IEEE float64 arithmetic on Inf/NaN (Inf - Inf = NaN, Inf * 0 = NaN) is the
  reference's rule; a step's special products are summed apart (order does not matter
  for Inf/NaN) and override the finite result; an Inf/NaN accumulator stays.

Split-K slices and groups (G=n) are independent recurrences from +0 (no chain): they run
as one batch of lanes in lock step, a lane with fewer steps padded in front (steps of -0
products keep +0: ``_lanes``); the cross-group adds then run in order per slice, and the
slices are combined per ``split_reduce`` (``reference.schedule.reduce_levels``: in order,
the halving tree or pairwise).
"""
from __future__ import annotations

import functools
import math
import os
import warnings

import torch

from reference.rounding import Mode, Subnormal
from reference.schedule import AlignRef, Operand, Schedule, ScaleAt, SplitReduce, reduce_levels

__all__ = ["fast_reason", "operands_reason", "fast_totals", "round32", "add_round_acc",
           "round_acc", "max_finite", "BACKENDS"]

_I64 = torch.int64
_F64 = torch.float64
_SIGN = -(1 << 63)        # the bits of float64 -0.0 as int64
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
        (m.acc_frac_bits > 23, "accumulator wider than FP32 (acc_frac_bits > 23)"),
        (m.acc_subnormal not in (Subnormal.KEEP, Subnormal.FLUSH), "acc_subnormal not KEEP/FLUSH"),
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
# the roundings (float64 in, float64 holding FP32 / accumulator-format values out)
# ---------------------------------------------------------------------------
def round32(t: torch.Tensor, mode: Mode) -> torch.Tensor:
    """t (float64, exact) rounded to FP32 with RNE or RTZ (IEEE overflow and specials)."""
    y = t.to(torch.float32)
    if mode is Mode.RTZ:
        up = y.to(_F64).abs() > t.abs()
        y = torch.where(up, torch.nextafter(y, torch.zeros_like(y)), y)
    return y.to(_F64)


@functools.lru_cache(maxsize=None)  # read once per p: the rounding loop asks every step
def max_finite(p: int) -> float:
    """The largest finite value of ``accumulator_format(p)`` (its FormatSpec row)."""
    from reference.gemm import accumulator_format
    return float(accumulator_format(p).max_finite)


def round_acc(t: torch.Tensor, mode: Mode, p: int = 23, flush: bool = False) -> torch.Tensor:
    """t (float64, exact) rounded to ``reference.gemm.accumulator_format(p)`` (p + 1
    significant bits, FP32's exponent range, IEEE overflow and specials) with RNE or RTZ;
    flush: results below 2**-126 become zeros of their sign (``Subnormal.FLUSH``)."""
    y = round32(t, mode) if p == 23 else _round_narrow(t, mode, p)
    if flush:
        y = torch.where(y.abs() < 2.0 ** -126, y * 0.0, y)
    return y


def _round_narrow(t: torch.Tensor, mode: Mode, p: int) -> torch.Tensor:
    """``round_acc`` for p < 23: t times 1/q, q = 2**(max(e, -126) - p) the quantum at t's
    exponent e (a power of two: exact, |t/q| < 2**(p+1)), rounded to an integer (trunc =
    RTZ, torch.round = RNE), times q; then IEEE overflow (RNE: Inf, RTZ: max finite)."""
    bits = t.view(_I64)
    eb = ((bits >> 52) & 0x7FF).clamp(min=1023 - 126, max=2046)  # Inf/NaN: replaced below
    q = ((eb - p) << 52).view(_F64)
    r = t * ((2046 + p - eb) << 52).view(_F64)
    y = (torch.trunc(r) if mode is Mode.RTZ else torch.round(r)) * q
    big = max_finite(p) if mode is Mode.RTZ else math.inf
    y = torch.where(y.abs() > max_finite(p), torch.copysign(torch.full_like(y, big), t), y)
    return torch.where(torch.isfinite(t), y, t)


def _to_odd(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """x + y (float64, each exact) rounded to odd at 53 bits (two-sum, then one ulp)."""
    s = x + y
    bb = s - x
    e = (x - (s - bb)) + (y - bb)            # two-sum: x + y = s + e exactly
    bits = s.view(_I64)
    fix = (e != 0) & ((bits & 1) == 0) & torch.isfinite(s)
    step = torch.where((e > 0) == (s > 0), 1, -1)  # +1 on the bits is one ulp up in magnitude
    return torch.where(fix, bits + step, bits).view(_F64)


def add_round_acc(x: torch.Tensor, y: torch.Tensor, mode: Mode, p: int = 23,
                  flush: bool = False) -> torch.Tensor:
    """x + y (float64, each exact) rounded once to ``accumulator_format(p)`` (``round_acc``)."""
    return round_acc(_to_odd(x, y), mode, p, flush)


# ---------------------------------------------------------------------------
# lanes: every group of every slice, padded to whole steps of F
# ---------------------------------------------------------------------------
def _lanes(plan: Schedule, F: int, Fp: int, device):
    """idx [L, S * Fp] of every group's products, step by step (steps of F products from
    the group's start, each padded to Fp; K marks padding), and comb [slices, groups]: the
    lane of each group of each slice (-1: none).  A group of n < S steps takes the last n
    steps of its lane: its padding steps come first, where they leave the accumulator +0
    (every product -0, t = 0: +0 + -0 = +0).  After its steps a padding step would not be
    the identity: the accumulator aligned alone to align_bits < its width loses bits."""
    groups = [(si, g.lo, g.hi) for si, sl in enumerate(plan.slices) for g in sl.groups]
    S = max(max(-(-(hi - lo) // F) for _, lo, hi in groups), 1)
    idx = torch.full((len(groups), S, Fp), plan.K, dtype=_I64)
    ng = max(len(sl.groups) for sl in plan.slices)
    comb = torch.full((len(plan.slices), ng), -1, dtype=_I64)
    seen = [0] * len(plan.slices)
    pos = torch.arange(S)[:, None] * F + torch.arange(Fp)[None, :]  # offset in the group
    ok = torch.arange(Fp)[None, :] < F
    for lane, (si, lo, hi) in enumerate(groups):
        at = pos - (S + (hi - lo) // -F) * F  # offset in the group, after S - n padding steps
        idx[lane] = torch.where(ok & (at >= 0) & (at < hi - lo), lo + at, plan.K)
        comb[si, seen[si]] = lane
        seen[si] += 1
    idx = idx.reshape(len(groups), S * Fp)
    pad = (idx == plan.K).reshape(len(groups), S, Fp).all(2).t()  # [S, L]: steps of padding only
    if idx.numel() == plan.K and bool((idx.reshape(-1) == torch.arange(plan.K)).all()):
        idx = None  # no padding, K in order: the gather is a reshape
    return (None if idx is None else idx.to(device)), comb.to(device), S, pad.to(device)


def _steps(x: torch.Tensor, pad, idx, L: int, S: int, F: int) -> torch.Tensor:
    """An operand's rows [R, K] -> [S, R, L, F]: its elements in the lanes' step order
    (padding: ``pad``; idx None: the lanes' steps are K in order, L * S * F = K)."""
    R = x.shape[0]
    if idx is not None:
        xp = torch.cat([x, torch.full((R, 1), pad, dtype=x.dtype, device=x.device)], 1)
        x = xp[:, idx.reshape(-1)]
    return x.reshape(R, L, S, F).permute(2, 0, 1, 3).contiguous()


def _outer(A: torch.Tensor, B: torch.Tensor, op) -> torch.Tensor:
    """A [S, M, L, F], B [S, N, L, F] -> op(a_ik, b_kj) [S, M * N * L, F], lane (i*N + j)*L + l:
    built in step-major order at once (the operands are small, the products are not)."""
    S, M, L, F = A.shape
    return op(A[:, :, None], B[:, None]).reshape(S, M * B.shape[1] * L, F)


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
    # padding products: -0.0 * 1.0 = -0.0; padding exponent sums: -2**21 + 0
    P = _outer(_steps(a, -0.0, idx, L, S, Fp), _steps(b.t(), 1.0, idx, L, S, Fp), torch.mul)
    if model.align_bits is None:  # F = 1: the exact FMA chain
        acc = _chain(P[:, :, 0], model, tri)
    else:
        X = None
        if plan.exp_factors is not None:  # exponent sums of the factors (int32: |x| < 2**22)
            X = _outer(_steps(_exps(a).int(), -(1 << 21), idx, L, S, Fp),
                       _steps(_exps(b).t().int(), 0, idx, L, S, Fp), torch.add)
        # finite operands: no special products; and without zeros a step's products are
        # all -0 only where the step is padding
        finite = bool(torch.isfinite(a).all() & torch.isfinite(b).all())
        negz = None
        if finite and bool((a != 0).all() & (b != 0).all()):
            negz = pad[:, None, :].expand(S, M * N, L).reshape(S, M * N * L)
        acc = _aligned(P, X, model, tri, finite, negz)
    return _combine(acc.reshape(M * N, L), comb, model.outer_mode, plan.split_reduce)


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


def _acc_format(model) -> tuple[int, bool]:
    """(p, flush): the accumulator's fraction bits and whether it flushes subnormals."""
    return model.acc_frac_bits, model.acc_subnormal is Subnormal.FLUSH


def _chain(P: torch.Tensor, model, tri: bool) -> torch.Tensor:
    """P [S, lanes] exact products -> each lane's FMA chain from +0 in the accumulator."""
    p, flush = _acc_format(model)
    if tri:
        from .gemm_fast_triton import chain_lanes
        return chain_lanes(P, model.norm_mode is Mode.RTZ, p, flush)
    acc = torch.zeros(P.shape[1], dtype=_F64, device=P.device)
    for s in range(P.shape[0]):
        acc = add_round_acc(acc, P[s], model.norm_mode, p, flush)
    return acc


def _aligned(P: torch.Tensor, X, model, tri: bool, finite: bool = False, negz=None) -> torch.Tensor:
    """The aligned fused steps of every lane: P [S, lanes, F] products, X their alignment
    exponents (None: by value).  finite: every product is finite; negz given: which
    steps' products are all -0.  Returns the lanes' accumulators (FP32 values)."""
    if not finite:
        fin = torch.isfinite(P)
        spec = torch.where(fin, 0.0, P).sum(-1)       # Inf/NaN of each step (order-free)
        P = torch.where(fin, P, 0.0)
    else:
        spec = torch.zeros(P.shape[:2], dtype=_F64, device=P.device)
    if negz is None:
        negz = (P.view(_I64) == _SIGN).all(-1)        # every product of the step is -0
    if X is None:
        X = _exps(P)
    Xb = (X.amax(-1).clamp(min=_XFLOOR) + 1023).to(_I64)  # biased exponent of the step's top
    if tri:
        from .gemm_fast_triton import aligned_lanes
        return aligned_lanes(P, Xb, spec, negz, model.align_bits, model.align_mode is Mode.RTZ,
                             model.norm_mode is Mode.RTZ, *_acc_format(model))
    return _aligned_torch(P, Xb, spec, negz, model)


def _aligned_torch(P, Xb, spec, negz, model, mask: bool = True) -> torch.Tensor:
    """The torch loop of ``_aligned``: ~18 elementwise ops per step.  The Inf/NaN handling
    runs only where some product is special (without, an Inf accumulator stays Inf by
    itself: Inf times a power of two, rounded, summed with finite terms, rounded); RTZ to
    the accumulator is a mask of the float64 bits where no product is special and every
    nonzero sum is FP32-normal (``_rtz_by_mask``) and, checked after the loop, no masked
    sum exceeds max finite (else the loop runs again with ``round_acc``)."""
    S, RL, _ = P.shape
    ab = model.align_bits
    zs = torch.where(negz, -0.0, 0.0).to(_F64)         # an all-zero step's sign (acc -0 too)
    special = bool((spec != 0).any())
    rnd = torch.trunc if model.align_mode is Mode.RTZ else torch.round  # round: half to even
    p, flush = _acc_format(model)
    mask = mask and model.norm_mode is Mode.RTZ and not special and _rtz_by_mask(Xb, ab)
    keep = ~((1 << (52 - p)) - 1)  # float64 bits kept by truncation to p + 1 significant bits
    acc = torch.zeros(RL, dtype=_F64, device=P.device)
    top = torch.zeros(RL, dtype=_F64, device=P.device)  # the largest masked |sum|
    for s in range(S):
        bits = acc.view(_I64)
        # biased emax (a zero acc: 0; an Inf acc: 2045, so that 1/q stays a normal float64)
        eb = torch.maximum((bits >> 52) & 0x7FF, Xb[s]).clamp_(max=2045)
        inv = ((2046 + ab - eb) << 52).view(_F64)          # 2**(ab - emax)
        q = ((eb - ab) << 52).view(_F64)                   # 2**(emax - ab)
        t = rnd(P[s] * inv[:, None]).sum(1) + rnd(acc * inv)  # exact integers < 2**52
        if mask:
            y = ((t * q).view(_I64) & keep).view(_F64)
            top = torch.maximum(top, y.abs())
        else:
            y = round_acc(t * q, model.norm_mode, p, flush)
        # an exact zero: -0 only if every term was -0 (t == 0 with a nonzero acc: zs is +0)
        y = torch.where(t == 0, acc * 0.0 + zs[s], y)
        if special:
            z = acc + spec[s]                              # Inf/NaN accumulator or products
            y = torch.where(torch.isfinite(z), y, z)
        acc = y
    if mask and bool((top > max_finite(p)).any()):  # an overflow the mask missed: redo
        return _aligned_torch(P, Xb, spec, negz, model, mask=False)
    return acc


def _rtz_by_mask(Xb, ab: int) -> bool:
    """Whether every nonzero aligned sum is an FP32-normal value: then RTZ to the
    accumulator (p fraction bits) is clearing the float64 significand's low 52 - p bits
    up to overflow (nothing to flush; the caller checks overflow).  A sum is a multiple
    of its q = 2**(emax - ab), emax >= the step's top product exponent (>= -126 + ab
    here; a step of no nonzero product has emax = the accumulator's, whose own sum was
    normal or zero)."""
    has = Xb > _XFLOOR + 1023
    return bool(((Xb - 1023 - ab >= -126) | ~has).all())


def _combine(tot: torch.Tensor, comb: torch.Tensor, outer_mode: Mode,
             reduce: SplitReduce = SplitReduce.SERIAL) -> torch.Tensor:
    """Lanes' results [R, L] -> [R]: per slice its groups in order (the first as is, then
    cross-group adds in ``outer_mode``), then the slices combined RNE per ``reduce``
    (``Schedule.combine``, ``reduce_levels``)."""
    outer = tot[:, comb[:, 0]]                        # [R, slices]
    for j in range(1, comb.shape[1]):
        lane = comb[:, j]
        new = add_round_acc(outer, tot[:, lane.clamp(min=0)], outer_mode)
        outer = torch.where(lane >= 0, new, outer)
    for level in reduce_levels(reduce, outer.shape[1]):  # each level's adds at once
        d, q = (torch.tensor(x, device=outer.device) for x in zip(*level))
        outer = outer.index_copy(1, d, add_round_acc(outer[:, d], outer[:, q], Mode.RNE))
    return outer[:, 0]
