"""Fast, bit-exact torch emulation of the GEMM model family of ``reference.gemm``.

``emulate(model, a, b, ...)`` computes C = A @ B (M x N) under any ``GemmModel``,
vectorized over M and N (CPU or CUDA), and equals ``reference.gemm.dot`` bit for
bit on every element (tests/test_gemm_emulator.py proves it on hypothesis-drawn
models and adversarial operands).

The schedule (split-K slices, groups, fused steps, exact runs, where scales and roundings
apply, every validity check) is the model's plan, ``GemmModel.plan(K, block)``
(reference/schedule.py); ``_Ctx`` walks it and supplies only the arithmetic below (the
split-K slice results combined per ``split_reduce`` by ``Schedule.run`` itself; the fast
path 3 combines its per-slice results the same way, ``fp4ref.gemm_fast._combine``).

How exactness is kept (no float shortcut is ever trusted):

* Every value lives in an integer form (N, E): a signed int64 significand and the
  exponent of its last bit (value = N * 2**E), plus a sign (for zeros) and a
  kind (finite / inf / nan).  Float inputs unpack exactly from their bit
  pattern; products are int64 products (operand widths are checked so they
  never exceed 62 bits).
* An exact sum of n terms is formed per output element at that element's own
  lowest set bit: when the bits spanned (plus log2(n) carry bits) fit in 62
  bits it is one int64 sum; otherwise a multi-limb fixed-point accumulator
  (30-bit limbs, carries propagated) holds it over the exponent range actually
  present, so catastrophic cancellation and huge exponent spreads are exact.
  The top 62 bits plus a sticky bit then feed one integer rounding step.
* Rounding (any mode, any FormatSpec, IEEE overflow/underflow/flush and
  signed zeros) is integer shifts on the significand, the same rules as
  ``reference.rounding.encode`` with ``reference.gemm.round_fp``'s policies.
* Alignment (``align_bits`` set): emax per output element and fused step is the
  max over the nonzero terms of floor(log2|t|) from the integer form, or, under
  ``align_ref`` EXPONENT_SUM, for products the sum of the factors' (and PRODUCT
  block scales') floor(log2), precomputed per operand element and summed per
  product next to the products themselves (same O(R * F) working set).
* The Blackwell MMA family (issue 17; ``chain``, ``exact_group``, ``overflow_inf``,
  ``align_ref`` SCALE_EXPONENT_SUM with ``exp_formats``) runs on the same engine, one
  rule each: exact runs of E products are exact row sums (one addend per run; a run wider
  than 62 bits sends its output to ``reference.gemm.dot``), alignment exponents come from
  the operand formats (subnormals and zeros at emin; runs of a block-scaled GEMM by their
  scales alone, per block), the fused step aligns at the largest of them and of the
  accumulator's max(floor(log2|acc|), -126), ``overflow_inf`` turns a fused sum >= 2**128
  into +-Inf, and ``chain`` starts each group from the FP32 accumulator.  A NaN in a row
  of a / scales_a or a column of b / scales_b makes that output NaN under every model
  of the family, so those outputs are marked up front and the rest runs on finite
  operands (the chunked matmul path then builds whole runs at once).
* Fast paths, used only where they are provably identical: (1) a chunk of
  products whose operands are small integers (times per-row/column powers of
  two) is summed by a float64 matmul, exact because every partial sum is an
  integer below 2**53; (2) FP32-RNE sequential accumulation of products that
  are exact FP32 values is a native FP32 add (IEEE add is correctly rounded); (3) the
  fused-FMA family with an accumulator of FP32's range and at most its precision (FP32, the
  Hopper FP8 13-bit one; ``fp4ref.gemm_fast``: products, exponents and
  lanes of groups / split-K slices at once, a thin float64 recurrence per fused step).

Input domain: finite values and IEEE specials of float16/bfloat16/float32/
float64 tensors; the operand, scale (and product_format) significand widths must
add up to at most 62 bits (always true for the low-precision formats this
toolkit handles; checked, ValueError otherwise); lattice must be a power of two.
"""
from __future__ import annotations

import math
from fractions import Fraction
from typing import NamedTuple, Sequence

import torch

from reference.errors import check_choice
from reference.formats import FormatSpec, get_format
from reference.gemm import (PRESETS, AlphaMode, GemmModel, Schedule,
                            accumulator_format, get_preset)
from reference.rounding import Mode, Overflow, Subnormal
from reference.schedule import Operand, ScaleAt

from .gemm_fast import fast_reason, fast_totals, operands_reason
from .gridround import GridFormat, bit_length, round_int, shift_round, trailing_zeros

__all__ = ["emulate", "round_float", "apply_alpha", "GemmModel", "PRESETS", "get_preset", "INPUT_DTYPES"]

INPUT_DTYPES = (torch.float64, torch.float32, torch.bfloat16, torch.float16)
_I64 = torch.int64
_FAST_PATHS = {"auto": "auto", "fast_torch": "torch", "fast_triton": "triton"}  # -> gemm_fast backend
_W = 30                      # limb width of the wide accumulator
_MASK = (1 << _W) - 1
_BIG = 1 << 40               # exponent sentinel (far outside every real exponent)
_NOEXP = -_BIG               # "no alignment exponent" (zero / non-finite factor); sums of up
                             # to four stay below _NOEXP // 2


# ---------------------------------------------------------------------------
# integer value form
# ---------------------------------------------------------------------------
class _V(NamedTuple):
    N: torch.Tensor          # int64 signed significand; 0 for zeros and specials
    E: torch.Tensor          # int64 exponent of N's last bit
    neg: torch.Tensor        # bool sign (meaningful for zeros and infinities too)
    kind: torch.Tensor | None  # int8: 0 finite, 1 inf, 2 nan; None = all finite


def _bitlen(x: torch.Tensor) -> torch.Tensor:
    """Bit length of int64 x >= 0 (0 -> 0)."""
    return bit_length(torch, x)


def _strip(N: torch.Tensor, E: torch.Tensor):
    """Drop trailing zero bits (shorter spans make the one-int64 sum path likelier)."""
    tz = trailing_zeros(torch, N)
    return N >> tz, torch.where(N != 0, E + tz, 0)


def _pow2(e: torch.Tensor) -> torch.Tensor:
    """Exact float64 2**e for int64 e in [-1022, 1023]."""
    return ((e + 1023) << 52).view(torch.float64)


def _from_float(x: torch.Tensor) -> _V:
    bits = x.to(torch.float64).view(_I64)
    neg = bits < 0
    ef = (bits >> 52) & 0x7FF
    mf = bits & ((1 << 52) - 1)
    special = ef == 0x7FF
    kind = None
    if bool(special.any()):
        kind = torch.where(special, torch.where(mf == 0, 1, 2), 0).to(torch.int8)
    M = torch.where(ef == 0, mf, mf | (1 << 52))
    M = torch.where(special, 0, M)
    E = torch.where(ef == 0, -1074, ef - 1075)
    M, E = _strip(M, E)
    return _V(torch.where(neg, -M, M), E, neg, kind)


def _to_float(v: _V) -> torch.Tensor:
    """float64 of values with |N| < 2**53 and E in float64's normal scaling range."""
    N, E = v.N, v.E
    nz = N != 0
    x = N.to(torch.float64) * _pow2(torch.where(nz, E, 0).clamp(-1022, 1023))
    x = torch.where(nz, x, torch.where(v.neg, -0.0, 0.0).to(torch.float64))
    if v.kind is not None:
        inf = torch.where(v.neg, -math.inf, math.inf).to(torch.float64)
        x = torch.where(v.kind == 1, inf, x)
        x = torch.where(v.kind == 2, torch.full_like(x, math.nan), x)
    return x


def _kinds(v: _V) -> torch.Tensor:
    return v.kind if v.kind is not None else torch.zeros(v.N.shape, dtype=torch.int8, device=v.N.device)


def _is_zero(v: _V) -> torch.Tensor:
    z = v.N == 0
    return z if v.kind is None else z & (v.kind == 0)


def _zero(shape, device, neg=False) -> _V:
    z = torch.zeros(shape, dtype=_I64, device=device)
    return _V(z, z.clone(), torch.full(shape, bool(neg), device=device), None)


# ---------------------------------------------------------------------------
# formats and rounding
# ---------------------------------------------------------------------------
class _Fmt(NamedTuple):
    """A format's grid (``fp4ref.gridround``) under ``reference.gemm.round_fp``'s policy:
    IEEE overflow where the format has inf, else saturate (finite overflow and inf) with
    NaN kept (or rejected if it has none); ``flush``: results below min normal to zero."""
    g: GridFormat
    flush: bool = False


def _fmt(spec: "str | FormatSpec", flush: bool = False) -> _Fmt:
    return _Fmt(GridFormat.of(spec), flush)


_FP32 = _fmt("float32")


def _acc_fmt(model: GemmModel) -> _Fmt:
    return _fmt(accumulator_format(model.acc_frac_bits), model.acc_subnormal is Subnormal.FLUSH)


def _round_fin(mag, exp, sticky, neg, f: _Fmt, mode: Mode) -> _V:
    """Round the finite value (-1)**neg * (mag * 2**exp + tail) into format f.

    mag >= 0, < 2**62; sticky says tail != 0, in which case mag must carry at least
    man_bits + 2 bits (callers pass the top 62 bits)."""
    r = round_int(torch, neg, mag, exp, f.g, mode, sticky=sticky, flush=f.flush,
                  overflow=Overflow.IEEE if f.g.has_inf else Overflow.SATFINITE)
    kind = r.kind if bool((r.kind != 0).any()) else None
    return _V(torch.where(r.neg, -r.n, r.n), r.exp, r.neg, kind)


def _round_value(v: _V, f: _Fmt, mode: Mode) -> _V:
    """round_fp(v, f, mode) elementwise, specials included."""
    r = _round_fin(v.N.abs(), v.E, torch.zeros_like(v.neg), v.neg, f, mode)
    if v.kind is None:
        return r
    k, f = v.kind, f.g
    if bool((k == 2).any()) and not f.has_nan:
        raise ValueError(f"x: NaN cannot be encoded in {f.name} under nan policy RAISE; "
                         "valid choices: TO_ZERO, TO_NEG_ZERO, TO_MAX, RAISE")
    kind = _kinds(r).clone()
    N, E, neg = r.N, r.E, r.neg
    inf = k == 1
    if f.has_inf:
        kind = torch.where(inf, 1, kind)
        neg = torch.where(inf, v.neg & f.signed, neg)
    else:  # saturate
        N = torch.where(inf, torch.where(v.neg & f.signed, -f.mmax, f.mmax), N)
        E = torch.where(inf, f.top_q, E)
        kind = torch.where(inf, 0, kind)
        neg = torch.where(inf, v.neg & f.signed, neg)
    if not f.signed:
        kind = torch.where(inf & v.neg, 2, kind)
    kind = torch.where(k == 2, 2, kind).to(torch.int8)
    N = torch.where(kind != 0, 0, N)
    N, E = _strip(N, E)
    return _V(N, E, neg, kind)


# ---------------------------------------------------------------------------
# exact sums and products
# ---------------------------------------------------------------------------
def _exact_sum(N: torch.Tensor, E: torch.Tensor, force_limbs: bool = False):
    """Exact row sums of N * 2**E ([R, n]); returns (mag, exp, sticky, neg, zero):
    |sum| = mag * 2**exp + tail, 0 <= tail < 2**exp, sticky = tail != 0, mag < 2**62."""
    R, n = N.shape
    dev = N.device
    nz = N != 0
    mag = N.abs()
    bl = _bitlen(mag)
    lo = torch.where(nz, E, _BIG).amin(1) if n else torch.zeros(R, dtype=_I64, device=dev)
    hi = torch.where(nz, E + bl, -_BIG).amax(1) if n else lo
    anynz = nz.any(1)
    lo = torch.where(anynz, lo, 0)
    span = torch.where(anynz, hi - lo, 0)
    lg = max(n - 1, 1).bit_length() + 1
    fast = span + lg <= 62
    if force_limbs:
        fast = torch.zeros_like(fast)
    if bool(fast.all()):
        sh = torch.where(nz, E - lo[:, None], 0)
        S = (N << sh).sum(1)
        return S.abs(), lo, torch.zeros_like(anynz), S < 0, S == 0
    out_mag = torch.zeros(R, dtype=_I64, device=dev)
    out_exp = lo.clone()
    out_sticky = torch.zeros(R, dtype=torch.bool, device=dev)
    out_neg = torch.zeros(R, dtype=torch.bool, device=dev)
    out_zero = torch.zeros(R, dtype=torch.bool, device=dev)
    fi = fast.nonzero().squeeze(1)
    if fi.numel():
        m, e, st, ng, z = _exact_sum(N[fi], E[fi])
        out_mag[fi], out_exp[fi], out_sticky[fi], out_neg[fi], out_zero[fi] = m, e, st, ng, z
    si = (~fast).nonzero().squeeze(1)
    # bound memory of the limb accumulator
    step = max(1, (1 << 24) // max(1, n * 4 + int(span.max()) // _W + 8))
    for c0 in range(0, si.numel(), step):
        idx = si[c0:c0 + step]
        m, e, st, ng, z = _sum_limbs(N[idx], E[idx], lo[idx], span[idx], lg)
        out_mag[idx], out_exp[idx], out_sticky[idx], out_neg[idx], out_zero[idx] = m, e, st, ng, z
    return out_mag, out_exp, out_sticky, out_neg, out_zero


def _normalize(L: torch.Tensor) -> torch.Tensor:
    for j in range(L.shape[1] - 1):
        c = L[:, j] >> _W
        L[:, j] -= c << _W
        L[:, j + 1] += c
    return L


def _sum_limbs(N, E, lo, span, lg):
    """Multi-limb exact sum (rows whose span does not fit one int64)."""
    R, n = N.shape
    dev = N.device
    nz = N != 0
    nl = int(span.max()) // _W + lg // _W + 8
    sh = torch.where(nz, E - lo[:, None], 0)
    q = sh // _W
    r = sh - q * _W
    mag = N.abs()
    sgn = torch.where(N < 0, -1, 1)
    c = [mag & _MASK, (mag >> _W) & _MASK, mag >> (2 * _W)]
    v = [ci << r for ci in c]  # each < 2**60
    parts = [v[0] & _MASK, (v[0] >> _W) + (v[1] & _MASK), (v[1] >> _W) + (v[2] & _MASK), v[2] >> _W]
    L = torch.zeros(R, nl, dtype=_I64, device=dev)
    for d, p in enumerate(parts):
        L.scatter_add_(1, q + d, p * sgn)
    L = _normalize(L)
    neg = L[:, -1] < 0
    L = torch.where(neg[:, None], -L, L)
    L = _normalize(L)
    nzL = L != 0
    zero = ~nzL.any(1)
    ar = torch.arange(nl, device=dev)
    t = torch.where(nzL, ar, 0).amax(1)
    Lt = L.gather(1, t[:, None]).squeeze(1)
    total = _W * t + _bitlen(Lt)
    pos = (total - 62).clamp(min=0)
    k = pos // _W
    s = pos - k * _W
    Lp = torch.cat([L, torch.zeros(R, 4, dtype=_I64, device=dev)], 1)
    g = [Lp.gather(1, (k + d)[:, None]).squeeze(1) for d in range(4)]
    m = (g[0] >> s) + (g[1] << (_W - s)) + (g[2] << (2 * _W - s)) + torch.where(s == 29, g[3] << 61, 0)
    cnz = nzL.to(_I64).cumsum(1)
    below = torch.where(k > 0, cnz.gather(1, (k - 1).clamp(min=0)[:, None]).squeeze(1) > 0, False)
    sticky = ((g[0] & ((1 << s) - 1)) != 0) | below
    return m, lo + pos, sticky, neg & ~zero, zero


def _split31(N: torch.Tensor, E: torch.Tensor):
    """N * 2**E as two terms with |significand| < 2**31."""
    mag = N.abs()
    s = torch.where(N < 0, -1, 1)
    return [((mag >> 31) * s, E + 31), ((mag & ((1 << 31) - 1)) * s, E)]


def _mul_special(x: _V, y: _V):
    """(kind, neg) of x * y by IEEE rules, kind None when both are finite."""
    neg = x.neg ^ y.neg
    if x.kind is None and y.kind is None:
        return None, neg
    kx, ky = _kinds(x), _kinds(y)
    nan = (kx == 2) | (ky == 2) | ((kx == 1) & _is_zero(y)) | ((ky == 1) & _is_zero(x))
    inf = ((kx == 1) | (ky == 1)) & ~nan
    return torch.where(nan, 2, torch.where(inf, 1, 0)).to(torch.int8), neg


def _mul_exact(x: _V, y: _V) -> _V:
    """Exact product; significands must multiply below 2**62 (checked by callers)."""
    kind, neg = _mul_special(x, y)
    N = x.N * y.N
    if kind is not None:
        N = torch.where(kind != 0, 0, N)
    return _V(N, x.E + y.E, neg, kind)


def _finish(r: _V, kind, neg, zero_neg=None) -> _V:
    """Overlay specials (kind) and zero signs on a rounded result."""
    if zero_neg is not None:
        r = _V(r.N, r.E, torch.where(r.N == 0, zero_neg, r.neg), r.kind)
    if kind is None:
        return r
    sp = kind != 0
    if not bool(sp.any()):
        return r
    k = torch.where(sp, kind, _kinds(r)).to(torch.int8)
    return _V(torch.where(sp, 0, r.N), r.E, torch.where(sp, neg, r.neg), k)


def _mul_round(x: _V, y: _V, f: _Fmt, mode: Mode) -> _V:
    """round(x * y) into f; specials pass through unrounded (reference ``_mul`` then round)."""
    kind, neg = _mul_special(x, y)
    terms = [(a * b, ea + eb) for a, ea in _split31(x.N, x.E) for b, eb in _split31(y.N, y.E)]
    N = torch.stack([t[0] for t in terms], 1)
    E = torch.stack([t[1] for t in terms], 1)
    mag, exp, sticky, _, zero = _exact_sum(N, E)
    r = _round_fin(mag, exp, sticky, neg, f, mode)
    return _finish(r, kind, neg)


def _add_special(xs: Sequence[_V]):
    if all(x.kind is None for x in xs):
        return None, None
    ks = torch.stack([_kinds(x) for x in xs], -1)
    ng = torch.stack([x.neg for x in xs], -1)
    nan = (ks == 2).any(-1)
    pinf = ((ks == 1) & ~ng).any(-1)
    ninf = ((ks == 1) & ng).any(-1)
    nan = nan | (pinf & ninf)
    kind = torch.where(nan, 2, torch.where(pinf | ninf, 1, 0)).to(torch.int8)
    return kind, ninf & ~nan


def _zero_sign(negs: torch.Tensor, mode: Mode) -> torch.Tensor:
    """IEEE sign of an exactly zero sum over the last dim (see reference.gemm._zero_sign)."""
    alln = negs.all(-1)
    anyn = negs.any(-1)
    return alln | (anyn & (mode is Mode.RDN))


def _add_round(x: _V, y: _V, f: _Fmt, mode: Mode) -> _V:
    kind, sneg = _add_special([x, y])
    N = torch.stack([x.N, y.N], 1)
    E = torch.stack([x.E, y.E], 1)
    mag, exp, sticky, neg, zero = _exact_sum(N, E)
    zs = _zero_sign(torch.stack([x.neg, y.neg], 1), mode)
    neg = torch.where(zero, zs, neg)
    r = _round_fin(mag, exp, sticky, neg, f, mode)
    return _finish(r, kind, sneg)


# ---------------------------------------------------------------------------
# the fused step
# ---------------------------------------------------------------------------
def _align_terms(N, E, align_bits: int, mode: Mode, X=None, floor: int | None = None):
    """Round each term to a multiple of 2**(emax - align_bits), emax over the row's nonzero terms.

    X [R, n - 1] (align_ref EXPONENT_SUM): the products' (columns 1..) alignment exponents, the
    sums of their factors' floor(log2) (_NOEXP where a factor is zero or non-finite: the
    product is then zero or special, so it takes no part); column 0, the accumulator, and
    every term without X use their own floor(log2|t|).
    floor (the plan's ``acc_exp_floor``, align_ref SCALE_EXPONENT_SUM): emax is the max of X
    over every term, zeros included, and of the accumulator's max(floor(log2|acc|), floor)
    (floor when it is zero)."""
    nz = N != 0
    mag = N.abs()
    if floor is not None:  # only the accumulator's own exponent is needed
        e0 = (E[:, :1] + _bitlen(mag[:, :1]) - 1).clamp(min=floor)
        e0 = torch.where(nz[:, :1], e0, floor)
        top = torch.cat([e0, X], 1).amax(1, keepdim=True)
    else:
        ex = E + _bitlen(mag) - 1
        if X is not None:
            ex = torch.cat([ex[:, :1], torch.where(X > _NOEXP // 2, X, ex[:, 1:])], 1)
        top = torch.where(nz, ex, -_BIG).amax(1, keepdim=True)
    qexp = top - align_bits
    s = qexp - E
    n = shift_round(torch, N < 0, mag, s.clamp(min=0), mode)
    move = nz & (s > 0)
    Nn = torch.where(move, torch.where(N < 0, -n, n), N)
    En = torch.where(move, qexp.expand_as(E), E)
    return Nn, En


class _Restart(Exception):
    """A chunked fast path met a case it does not cover; redo the rows generically."""


def _fused_step(model: GemmModel, fa: _Fmt, acc: _V, P: _V, force_limbs=False,
                strict_zero=False, X=None, floor=None) -> _V:
    """acc [R] + products P [R, f]: one fused step (reference.gemm.fused_step).

    X: the products' alignment exponents [R, f] (the plan's ``exp_factors``; None: by
    value); floor: the plan's ``acc_exp_floor`` (see _align_terms).
    strict_zero: raise _Restart when a nonzero sum rounds to zero (its sign would then
    depend on zero products' signs, which pre-reduced chunks do not keep)."""
    N = torch.cat([acc.N[:, None], P.N], 1)
    E = torch.cat([acc.E[:, None], P.E], 1)
    negs = torch.cat([acc.neg[:, None], P.neg], 1)
    allzero = ~(N != 0).any(1)
    if model.align_bits is not None:
        N, E = _align_terms(N, E, model.align_bits, model.align_mode, X, floor)
    mag, exp, sticky, neg, zero = _exact_sum(N, E, force_limbs)
    zneg = torch.where(allzero, _zero_sign(negs, model.norm_mode),
                       torch.full_like(allzero, model.norm_mode is Mode.RDN))
    neg = torch.where(zero, zneg, neg)
    r = _round_fin(mag, exp, sticky, neg, fa, model.norm_mode)
    if strict_zero and bool(((r.N == 0) & ~zero).any()):
        raise _Restart
    kind, sneg = (None, None)
    if acc.kind is not None or P.kind is not None:
        ks = torch.cat([_kinds(acc)[:, None], _kinds(P)], 1)
        pinf = ((ks == 1) & ~negs).any(1)
        ninf = ((ks == 1) & negs).any(1)
        nan = (ks == 2).any(1) | (pinf & ninf)
        kind = torch.where(nan, 2, torch.where(pinf | ninf, 1, 0)).to(torch.int8)
        sneg = ninf & ~nan
    if model.overflow_inf:  # a finite fused sum of magnitude >= 2**128 is +-Inf (any norm_mode)
        big = ~zero & (exp + _bitlen(mag) - 1 >= 128)
        if bool(big.any()):
            k0 = kind if kind is not None else torch.zeros(big.shape, dtype=torch.int8, device=big.device)
            sneg = torch.where(k0 != 0, sneg if sneg is not None else neg, neg)
            kind = torch.where(k0 != 0, k0, big.to(torch.int8))
    return _finish(r, kind, sneg)


# ---------------------------------------------------------------------------
# argument checking
# ---------------------------------------------------------------------------
def _check_model(model) -> GemmModel:
    if isinstance(model, str):
        return get_preset(model)
    if not isinstance(model, GemmModel):
        raise ValueError(f"model: expected a GemmModel or a preset name, got {model!r}; "
                         f"valid choices: {', '.join(PRESETS)}")
    if model.lattice is not None:
        lat = Fraction(model.lattice)
        k = lat.numerator.bit_length() - lat.denominator.bit_length()
        if lat != Fraction(2) ** k or not -1000 <= k <= 1000:
            raise ValueError(f"GemmModel.lattice: {model.lattice} is not supported by the emulator; "
                             "valid choices: None or a power of two 2**k, |k| <= 1000")
    return model


def _check_tensor(name, x, ndim=2) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in INPUT_DTYPES:
        raise ValueError(f"{name}: dtype {x.dtype} is not supported; valid choices: "
                         + ", ".join(str(d) for d in INPUT_DTYPES))
    if x.dim() != ndim:
        raise ValueError(f"{name}: expected a {ndim}-D tensor, got shape {tuple(x.shape)}")
    return x


def _alpha_factors(alpha, M, N, device) -> list[torch.Tensor]:
    if alpha is None:
        return []
    items = list(alpha) if isinstance(alpha, (list, tuple)) else [alpha]
    out = []
    for i, f in enumerate(items):
        name = f"alpha[{i}]" if isinstance(alpha, (list, tuple)) else "alpha"
        if isinstance(f, bool) or not isinstance(f, (int, float, Fraction, torch.Tensor)):
            raise ValueError(f"{name}: expected a number or a tensor broadcastable to [{M}, {N}], "
                             f"got {type(f).__name__}")
        if isinstance(f, torch.Tensor):
            if f.dtype not in INPUT_DTYPES:
                raise ValueError(f"{name}: dtype {f.dtype} is not supported; valid choices: "
                                 + ", ".join(str(d) for d in INPUT_DTYPES))
            try:
                t = torch.broadcast_to(f.to(device=device, dtype=torch.float64), (M, N))
            except RuntimeError:
                raise ValueError(f"{name}: shape {tuple(f.shape)} does not broadcast to [{M}, {N}]") from None
        else:
            v = float(f)
            if isinstance(f, Fraction) and Fraction(v) != f:
                raise ValueError(f"{name}: {f} is not exactly representable in float64")
            t = torch.full((M, N), v, dtype=torch.float64, device=device)
        bad = ~torch.isfinite(t)
        if bool(bad.any()):
            raise ValueError(f"{name}: non-finite value {float(t[bad][0])}; valid choices: finite numbers")
        out.append(t.contiguous())
    return out


def _exp_of(v: _V) -> torch.Tensor:
    """floor(log2|x|) elementwise; _NOEXP for zeros and specials."""
    ok = v.N != 0
    if v.kind is not None:
        ok = ok & (v.kind == 0)
    return torch.where(ok, v.E + _bitlen(v.N.abs()) - 1, _NOEXP)


def _format_exp(v: _V, fmt: str) -> torch.Tensor:
    """A factor's exponent as an MMA sees it (reference.gemm._factor_exponent): floor(log2|x|),
    or the format's minimum normal exponent for subnormals and zeros (specials: any value,
    their products are special and decided before alignment)."""
    emin = get_format(fmt).emin
    ex = v.E + _bitlen(v.N.abs()) - 1
    return torch.where((v.N != 0) & (ex >= emin), ex, emin)


def _width(v: _V) -> int:
    return int(_bitlen(v.N.abs()).max()) if v.N.numel() else 0


# ---------------------------------------------------------------------------
# public API
# ---------------------------------------------------------------------------
def round_float(x: torch.Tensor, fmt, mode="rne") -> torch.Tensor:
    """Round every element of x exactly into ``fmt`` (a format name, a FormatSpec, or an
    accumulator format) with ``mode``, with ``reference.gemm.round_fp``'s policy (IEEE
    where the format has inf, else saturating); returns the float64 values."""
    from reference.rounding import parse_mode
    mode = parse_mode(mode)
    if mode is Mode.SR:
        raise ValueError("mode: SR is not supported here; valid choices: "
                         + ", ".join(m.name for m in Mode if m is not Mode.SR))
    _check_tensor("x", x, x.dim())
    v = _from_float(x.reshape(-1))
    return _to_float(_round_value(v, _fmt(fmt), mode)).reshape(x.shape)


def emulate(model, a: torch.Tensor, b: torch.Tensor, *, scales_a=None, scales_b=None,
            block: int | None = None, alpha=None, _paths: str = "auto") -> torch.Tensor:
    """C = A @ B under ``model`` (a GemmModel or preset name), bit-identical to
    ``reference.gemm.dot`` per element.

    a: [M, K], b: [K, N] decoded operand values; scales_a: [M, K // block] and
    scales_b: [K // block, N] decoded block scales; alpha: None, a number, a tensor
    broadcastable to [M, N], or a list of such factors (combined per
    ``model.alpha_mode``).  Returns float32 [M, N] (outputs of narrower formats are
    exact float32 values).  ``_paths`` (tests only): "auto", "generic" (no fast
    paths), "limbs" (generic, and every exact sum through the limb accumulator),
    "fast_torch" / "fast_triton" (auto, with ``fp4ref.gemm_fast``'s recurrences in torch /
    in Triton: CUDA, or TRITON_INTERPRET=1).
    """
    model = _check_model(model)
    check_choice("_paths", _paths, ("auto", "generic", "limbs") + tuple(_FAST_PATHS)[1:])
    plan = _check_operands(model, a, b, scales_a, scales_b, block)
    M, Nn, dev = a.shape[0], b.shape[1], a.device
    factors = _alpha_factors(alpha, M, Nn, dev)
    nan_out = None
    if model.mma_family and get_format(model.output).has_nan:
        a, b, scales_a, scales_b, nan_out = _nan_prepass(a, b, scales_a, scales_b)
    blocked = plan.scales is not ScaleAt.NONE
    if _paths in _FAST_PATHS and nan_out is None:
        fast = _fast_emulate(model, plan, a, b, factors, _FAST_PATHS[_paths])
        if fast is not None:
            return fast
    A, B = _from_float(a), _from_float(b)
    SA = _from_float(scales_a) if blocked else None
    SB = _from_float(scales_b) if blocked else None
    _check_widths(model, plan, A, B, SA, SB)
    ctx = _Ctx(model, plan, A, B, SA, SB, _paths, raw=(a, b, scales_a, scales_b))
    out = torch.empty(M, Nn, dtype=torch.float32, device=dev)
    per_row = max(1, Nn * max(2, min(model.fma_width, plan.K // model.split_k or 1) + 1))
    budget = (1 << 25) if dev.type == "cuda" else (1 << 21)
    rows = max(1, budget // per_row)
    for r0 in range(0, M, rows):
        r1 = min(M, r0 + rows)
        out[r0:r1] = ctx.rows(r0, r1, [f[r0:r1] for f in factors])
    if nan_out is not None:
        out = torch.where(nan_out, torch.full_like(out, math.nan), out)
    return out


def _check_operands(model: GemmModel, a, b, scales_a, scales_b, block) -> Schedule:
    """Check the operands; return the model's plan for their K (which checks the schedule)."""
    _check_tensor("a", a)
    _check_tensor("b", b)
    M, K = a.shape
    if b.shape[0] != K:
        raise ValueError(f"b: shape {tuple(b.shape)} does not match a's K={K} (a is {tuple(a.shape)})")
    Nn = b.shape[1]
    dev = a.device
    if b.device != dev:
        raise ValueError(f"b: device {b.device} differs from a's device {dev}")
    if scales_a is None and scales_b is None and block is None:
        return model.plan(K)
    if scales_a is None or scales_b is None or block is None:
        raise ValueError("scales_a, scales_b, block: a block-scaled GEMM needs all three "
                         f"(got scales_a={'set' if scales_a is not None else None}, "
                         f"scales_b={'set' if scales_b is not None else None}, block={block})")
    plan = model.plan(K, block)
    nb = K // plan.block
    _check_tensor("scales_a", scales_a)
    _check_tensor("scales_b", scales_b)
    if tuple(scales_a.shape) != (M, nb):
        raise ValueError(f"scales_a: shape {tuple(scales_a.shape)} does not match "
                         f"[M, K // block] = [{M}, {nb}]")
    if tuple(scales_b.shape) != (nb, Nn):
        raise ValueError(f"scales_b: shape {tuple(scales_b.shape)} does not match "
                         f"[K // block, N] = [{nb}, {Nn}]")
    for nm, t in (("scales_a", scales_a), ("scales_b", scales_b)):
        if t.device != dev:
            raise ValueError(f"{nm}: device {t.device} differs from a's device {dev}")
    return plan


def _check_widths(model: GemmModel, plan: Schedule, A: _V, B: _V, SA, SB) -> None:
    """Products (times PRODUCT block scales) must fit the int64 form: at most 62 bits."""
    wp = _width(A) + _width(B)
    if model.product_format is not None:
        wp = min(wp, get_format(model.product_format).man_bits + 1)
    if plan.scales is ScaleAt.PRODUCT:
        wp += _width(SA) + _width(SB)
    elif plan.scales is ScaleAt.GROUP and _width(SA) + _width(SB) > 62:
        raise ValueError("scales_a, scales_b: scale significands wider than 62 bits together")
    if wp > 62:
        raise ValueError(f"a, b: products need {wp} significant bits; the emulator supports at most 62 "
                         "(operand, product_format and scale significand widths added)")


def _nan_prepass(a, b, sa, sb):
    """Every model of the family gives NaN for output (i, j) when row i of a / scales_a or
    column j of b / scales_b holds a NaN (a NaN factor makes a NaN product, and NaN
    survives every sum, product and rounding after it), and output (i, j) reads nothing
    else of those rows and columns: mark those outputs, and replace the NaNs (elements by
    0, scales by 1) so the finite fast paths can run on the rest."""
    rows = torch.isnan(a).any(1)
    cols = torch.isnan(b).any(0)
    if sa is not None:
        rows = rows | torch.isnan(sa).any(1)
        cols = cols | torch.isnan(sb).any(0)
    if not bool(rows.any() or cols.any()):
        return a, b, sa, sb, None
    def fill(x, v):  # NaN only: infinities stay (Inf * 0 is NaN elsewhere too)
        return torch.where(torch.isnan(x), torch.full_like(x, v), x)
    a, b = fill(a, 0.0), fill(b, 0.0)
    if sa is not None:
        sa, sb = fill(sa, 1.0), fill(sb, 1.0)
    return a, b, sa, sb, rows[:, None] | cols[None, :]


def _reference_outputs(model, raw, block, factors, r0, idx) -> list[float]:
    """Outputs (r0 + i, j) for flat indices ``idx`` of a row chunk, by ``reference.gemm.dot``
    (exact): the rare elements whose exact runs do not fit the int64 form (a run of
    ``exact_group`` products spanning more than 62 bits)."""
    from reference.gemm import dot
    a, b, sa, sb = raw
    n = b.shape[1]
    out = []
    for f in idx.tolist():
        i, j = r0 + f // n, f % n
        kw = {}
        if sa is not None:
            kw = dict(scales_a=sa[i].double().tolist(), scales_b=sb[:, j].double().tolist(), block=block)
        if factors:
            kw["alpha"] = [float(x.reshape(-1)[f]) for x in factors]
        out.append(float(dot(model, a[i].double().tolist(), b[:, j].double().tolist(), **kw)))
    return out


# ---------------------------------------------------------------------------
# the per-row-chunk engine
# ---------------------------------------------------------------------------
def _sub(v: _V, *idx) -> _V:
    return _V(v.N[idx], v.E[idx], v.neg[idx], None if v.kind is None else v.kind[idx])


class _Ctx:
    """The per-row-chunk engine: walks ``plan`` (reference/schedule.py) with this module's
    integer arithmetic; fast paths chosen per call (chunked matmul, native FP32)."""

    def __init__(self, model: GemmModel, plan: Schedule, A, B, SA, SB, paths, raw=None):
        self.m = model
        self.plan = plan
        self.raw = raw
        self.A, self.B, self.SA, self.SB, self.block = A, B, SA, SB, plan.block
        self.paths = paths
        self.fa = _acc_fmt(model)
        self.pf = _fmt(model.product_format) if model.product_format is not None else None
        self.K = A.N.shape[1]
        self.Nn = B.N.shape[1]
        self.dev = A.N.device
        self.finite = all(v is None or v.kind is None for v in (A, B, SA, SB))
        self.chunk = self._plan_chunk() if paths == "auto" else 0
        self.native = paths == "auto" and self._plan_native()
        self._plan_exps()

    def _plan_exps(self) -> None:
        """Per-operand alignment exponents ([M, K], [K, N], scales) of the plan's
        ``exp_factors``, summed per product in _products (O(MK + KN) here, O(R * F) per
        fused step).  A factor without a format: floor(log2|x|) (_NOEXP for zeros and
        specials); with one: that format's exponent (subnormals and zeros at its emin)."""
        src = {Operand.A: self.A, Operand.B: self.B, Operand.SCALE_A: self.SA, Operand.SCALE_B: self.SB}
        x = dict.fromkeys(Operand)
        for f in self.plan.exp_factors or ():
            v = src[f.operand]
            x[f.operand] = _exp_of(v) if f.format is None else _format_exp(v, f.format)
        self.xa, self.xb, self.xsa, self.xsb = (x[Operand.A], x[Operand.B], x[Operand.SCALE_A],
                                                x[Operand.SCALE_B])
        self.has_x = self.xa is not None or self.xsa is not None

    # --- fast path 1: chunks of products summed by an exact float64 matmul -----------
    def _plan_chunk(self) -> int:
        m = self.m
        blocked = self.SA is not None
        E = m.exact_group
        # chunked runs align by value or by format exponents (not by factor exponent sums)
        runs_ok = E is not None and all(f.format is not None for f in self.plan.exp_factors or ())
        if (not self.finite or (m.align_bits is not None and not runs_ok) or m.product_format is not None
                or m.norm_mode is Mode.RDN or self.plan.scales is ScaleAt.GROUP):
            return 0
        # every slice boundary (and so every group and step start) is a multiple of ks
        ks = math.gcd(*[x for lo, hi in self.plan.bounds for x in (lo, hi)])
        C = math.gcd(m.fma_width, m.group_size or ks, ks)
        if E is not None:  # chunks build whole runs: every step a whole number of runs
            if C % E:
                return 0
            C = E
        if blocked:
            C = math.gcd(C, self.block)
        if C < 2:
            return 0

        def lows(v: _V, dim):
            nz = v.N != 0
            lo = torch.where(nz, v.E, _BIG).amin(dim)
            top = torch.where(nz, v.E + _bitlen(v.N.abs()), -_BIG).amax(dim)
            lo = torch.where(nz.any(dim), lo, 0)
            bits = int((top - lo).clamp(min=0).max()) if v.N.numel() else 0
            return lo, bits
        self.la, ba = lows(self.A, 1)
        self.lb, bb = lows(self.B, 0)
        while C >= 2 and ba + bb + (C - 1).bit_length() > 53:
            C //= 2 if C % 2 == 0 else C
        if C < 2:
            return 0
        ws = (_width(self.SA) + _width(self.SB)) if blocked else 0
        if ba + bb + (C - 1).bit_length() + ws > 62:
            return 0
        # operands as exact float64 integers (per-row / per-column power-of-two offsets)
        self.Ia = (self.A.N << (self.A.E - self.la[:, None]).clamp(min=0)).to(torch.float64)
        self.Ib = (self.B.N << (self.B.E - self.lb[None, :]).clamp(min=0)).to(torch.float64)
        return C

    def _chunk_terms(self, r0, r1, SA, j0, j1) -> _V:
        C = self.chunk
        Ns, Es = [], []
        Ebase = (self.la[r0:r1, None] + self.lb[None, :]).reshape(-1)
        for c0 in range(j0, j1, C):
            D = (self.Ia[r0:r1, c0:c0 + C] @ self.Ib[c0:c0 + C]).to(_I64).reshape(-1)
            E = Ebase
            if SA is not None:
                blk = c0 // self.block
                sa, sb = SA.N[:, blk], self.SB.N[blk]
                D = D * (sa[:, None] * sb[None, :]).reshape(-1)
                E = E + (SA.E[:, blk][:, None] + self.SB.E[blk][None, :]).reshape(-1)
            Ns.append(D)
            Es.append(E)
        N = torch.stack(Ns, 1)
        E = torch.stack(Es, 1)
        return _V(N, E, torch.zeros(N.shape, dtype=torch.bool, device=self.dev), None)

    # --- fast path 2: FP32 RNE sequential sums of exact FP32 products ------------------
    def _plan_native(self) -> bool:
        m = self.m
        if (m.fma_width != 1 or m.align_bits is not None or m.acc_frac_bits != 23 or m.mma_family
                or m.norm_mode is not Mode.RNE or m.acc_subnormal is not Subnormal.KEEP
                or m.product_format is not None):
            return False
        vs = [self.A, self.B]
        if self.SA is not None:
            if self.plan.scales is not ScaleAt.PRODUCT:
                return False
            vs += [self.SA, self.SB]
        if sum(_width(v) for v in vs) > 24:
            return False
        lo = top = 0
        for v in vs:
            nz = v.N != 0
            if bool(nz.any()):
                lo += int(torch.where(nz, v.E, _BIG).min())
                top += int(torch.where(nz, v.E + _bitlen(v.N.abs()), -_BIG).max())
            else:  # every product is zero or special
                lo, top = 0, 0
                break
        # every nonzero product then is a multiple of 2**-149 below 2**128: an FP32 value
        if lo < -149 or top > 128:
            return False
        self.f64 = [_to_float(v) for v in vs]
        return True

    def _native_group(self, r0, r1, g0, g1) -> _V:
        a, b = self.f64[0][r0:r1], self.f64[1]
        acc = torch.zeros(r1 - r0, self.Nn, dtype=torch.float32, device=self.dev)
        for k in range(g0, g1):
            p = a[:, k, None] * b[None, k, :]
            if len(self.f64) > 2:
                blk = k // self.block
                p = p * (self.f64[2][r0:r1, blk, None] * self.f64[3][None, blk, :])
            acc = acc + p.to(torch.float32)  # IEEE FP32 add: RNE of the exact sum
        return _from_float(acc.reshape(-1))

    # products of columns [k0, k1) for rows A (sub-block) -> [R, f], and their alignment
    # exponents [R, f] under align_ref EXPONENT_SUM (else None)
    def _products(self, A: _V, SA, k0, k1) -> tuple[_V, torch.Tensor | None]:
        m = A.N.shape[0]
        n = self.Nn
        f = k1 - k0

        a = _sub(A, slice(None), slice(k0, k1))
        b = _sub(self.B, slice(k0, k1), slice(None))
        ka = a.kind if a.kind is not None else None
        kb = b.kind if b.kind is not None else None

        def bc_a(t):
            return t[:, :, None].expand(m, f, n).permute(0, 2, 1).reshape(m * n, f)

        def bc_b(t):
            return t[None, :, :].expand(m, f, n).permute(0, 2, 1).reshape(m * n, f)

        va = _V(bc_a(a.N), bc_a(a.E), bc_a(a.neg), None if ka is None else bc_a(ka))
        vb = _V(bc_b(b.N), bc_b(b.E), bc_b(b.neg), None if kb is None else bc_b(kb))
        p = _mul_exact(va, vb)
        if self.pf is not None:
            p = _round_value(p, self.pf, Mode.RNE)
        if self.plan.scales is ScaleAt.PRODUCT:
            blk = torch.arange(k0, k1, device=self.dev) // self.block
            sa = _sub(SA, slice(None), blk)
            sb = _sub(self.SB, blk, slice(None))
            vsa = _V(bc_a(sa.N), bc_a(sa.E), bc_a(sa.neg), None if sa.kind is None else bc_a(sa.kind))
            vsb = _V(bc_b(sb.N), bc_b(sb.E), bc_b(sb.neg), None if sb.kind is None else bc_b(sb.kind))
            p = _mul_exact(p, _mul_exact(vsa, vsb))
        X = None
        if self.has_x:
            X = torch.zeros((m * n, f), dtype=_I64, device=self.dev)
            if self.xa is not None:
                X = X + bc_a(self.xa[self.r0:self.r0 + m, k0:k1]) + bc_b(self.xb[k0:k1])
            if self.xsa is not None:
                blk = torch.arange(k0, k1, device=self.dev) // self.block
                X = X + bc_a(self.xsa[self.r0:self.r0 + m][:, blk]) + bc_b(self.xsb[blk])
        return p, X

    # --- exact runs (exact_group E): each run of E products of a step is one addend ---------
    def _runs(self, P: _V, X) -> tuple[_V, torch.Tensor | None]:
        """[R, f] products -> [R, ceil(f / E)] exact run sums (reference.gemm._run_terms):
        IEEE specials per run, an exact zero is -0 only if all its products are -0, the run's
        alignment exponent is the largest of its products'.  A run whose exact sum needs more
        than 62 bits marks its row for the reference (self.redo)."""
        E = self.m.exact_group
        R, f = P.N.shape
        nr = -(-f // E)
        pad = nr * E - f
        kind = _kinds(P) if P.kind is not None else None
        if pad:  # -0 fillers: no value, no special, no say in the zero sign or the exponent
            z = torch.zeros(R, pad, dtype=_I64, device=self.dev)
            P = _V(torch.cat([P.N, z], 1), torch.cat([P.E, z], 1),
                   torch.cat([P.neg, torch.ones(R, pad, dtype=torch.bool, device=self.dev)], 1), None)
            kind = None if kind is None else torch.cat([kind, z.to(torch.int8)], 1)
            X = None if X is None else torch.cat([X, torch.full_like(z, _NOEXP)], 1)
        mag, exp, sticky, neg, zero = _exact_sum(P.N.reshape(R * nr, E), P.E.reshape(R * nr, E))
        negs = P.neg.reshape(R * nr, E)
        neg = torch.where(zero, negs.all(1), neg)
        self.redo |= sticky.reshape(R, nr).any(1)
        N, Ex = _strip(torch.where(neg, -mag, mag), exp)
        rk = None
        if kind is not None:
            ks = kind.reshape(R * nr, E)
            pinf, ninf = ((ks == 1) & ~negs).any(1), ((ks == 1) & negs).any(1)
            nan = (ks == 2).any(1) | (pinf & ninf)
            rk = torch.where(nan, 2, torch.where(pinf | ninf, 1, 0)).to(torch.int8)
            N = torch.where(rk != 0, 0, N)
            neg = torch.where(rk != 0, ninf & ~nan, neg)
            rk = rk.reshape(R, nr)
        runs = _V(N.reshape(R, nr), Ex.reshape(R, nr), neg.reshape(R, nr), rk)
        return runs, (None if X is None else X.reshape(R, nr, E).amax(2))

    def _chunk_runs(self, SA, j0, j1) -> tuple[_V, torch.Tensor | None]:
        """Exact runs from the chunked matmul path (finite operands; C divides E)."""
        P = self._chunk_terms(self.r0, self.r1, SA, j0, j1)
        E, C = self.m.exact_group, self.chunk
        if C != E:  # chunks of one run may carry different block scales: exact sum
            R, nc = P.N.shape
            nr, per = nc * C // E, E // C
            mag, exp, sticky, neg, zero = _exact_sum(P.N.reshape(R * nr, per), P.E.reshape(R * nr, per))
            self.redo |= sticky.reshape(R, nr).any(1)
            N, Ex = _strip(torch.where(neg & ~zero, -mag, mag), exp)
            P = _V(N.reshape(R, nr), Ex.reshape(R, nr), torch.zeros_like(N, dtype=torch.bool).reshape(R, nr), None)
        return P, (self._run_exps(j0, j1) if self.has_x else None)

    def _run_exps(self, j0, j1) -> torch.Tensor:
        """[R, runs] alignment exponents of the runs of columns [j0, j1): the largest over
        each run of its products' exponent sums (scales only: per block, not per element)."""
        E, r0, r1 = self.m.exact_group, self.r0, self.r1
        cols = []
        for s in range(j0, j1, E):
            x = None
            if self.xa is not None:
                x = self.xa[r0:r1, s:s + E, None] + self.xb[None, s:s + E, :]
            if self.xsa is not None:
                blk = (torch.arange(s, s + E, device=self.dev) // self.block if x is not None else
                       torch.arange(s // self.block, (s + E - 1) // self.block + 1, device=self.dev))
                xs = self.xsa[r0:r1][:, blk, None] + self.xsb[None, blk, :]
                x = xs if x is None else x + xs
            cols.append(x.amax(1).reshape(-1))
        return torch.stack(cols, 1)

    def _group_scale(self, SA, g) -> _V:
        m = SA.N.shape[0]
        n = self.Nn
        sa = _sub(SA, slice(None), g)
        sb = _sub(self.SB, g, slice(None))

        def ea(t):
            return t[:, None].expand(m, n).reshape(-1)

        def eb(t):
            return t[None, :].expand(m, n).reshape(-1)
        va = _V(ea(sa.N), ea(sa.E), ea(sa.neg), None if sa.kind is None else ea(sa.kind))
        vb = _V(eb(sb.N), eb(sb.E), eb(sb.neg), None if sb.kind is None else eb(sb.kind))
        return _mul_exact(va, vb)

    def rows(self, r0, r1, factors) -> torch.Tensor:
        try:
            c = self._rows(r0, r1)
        except _Restart:
            self.chunk = 0
            c = self._rows(r0, r1)
        out = self._finish_rows(c, r0, r1, factors)
        if bool(self.redo.any()):  # rare: exact runs wider than the int64 form
            idx = self.redo.nonzero().squeeze(1)
            vals = _reference_outputs(self.m, self.raw, self.block, factors, r0, idx)
            out.view(-1)[idx] = torch.tensor(vals, dtype=torch.float32, device=self.dev)
        return out

    def _rows(self, r0, r1) -> _V:
        self.r0, self.r1 = r0, r1
        A = _sub(self.A, slice(r0, r1))
        SA = _sub(self.SA, slice(r0, r1)) if self.SA is not None else None
        R = (r1 - r0) * self.Nn
        self.redo = torch.zeros(R, dtype=torch.bool, device=self.dev)
        return self.plan.run(_EmuArithmetic(self, A, SA, R))

    def _finish_rows(self, total: _V, r0, r1, factors) -> torch.Tensor:
        return _epilogue(self.m, total, factors).reshape(r1 - r0, self.Nn)

    def _group(self, A, SA, g, acc: _V) -> _V:
        m = self.m
        if self.native:  # (never chained: acc is +0)
            return self._native_group(self.r0, self.r1, g.lo, g.hi)
        if self.plan.chain and self.chunk and bool((_is_zero(acc) & acc.neg).any()):
            raise _Restart  # a -0 C: the zero sign then depends on zero products' signs
        limbs = self.paths == "limbs"
        floor = self.plan.acc_exp_floor
        for st in g.steps:
            j0, j1 = st.lo, st.hi
            if self.chunk and st.runs is not None:
                P, X = self._chunk_runs(SA, j0, j1)
                acc = _fused_step(m, self.fa, acc, P, strict_zero=True, X=X, floor=floor)
            elif self.chunk:
                P = self._chunk_terms(self.r0, self.r1, SA, j0, j1)
                acc = _fused_step(m, self.fa, acc, P, strict_zero=True, floor=floor)
            else:
                P, X = self._products(A, SA, j0, j1)
                if st.runs is not None:
                    P, X = self._runs(P, X)
                acc = _fused_step(m, self.fa, acc, P, limbs, X=X, floor=floor)
        return acc

    def _lattice(self, c: _V) -> _V:
        return _snap_lattice(c, self.m.lattice)

    def _alpha(self, c: _V, factors) -> _V:
        return _apply_alpha(self.m.alpha_mode, c, factors)


class _EmuArithmetic:
    """``Schedule.run``'s arithmetic for one row chunk of ``_Ctx`` (R = rows x N outputs)."""

    def __init__(self, ctx: _Ctx, A: _V, SA, R: int):
        self.ctx, self.A, self.SA, self.R = ctx, A, SA, R

    def zero(self) -> _V:
        return _zero((self.R,), self.ctx.dev)

    def group(self, acc: _V, g) -> _V:
        return self.ctx._group(self.A, self.SA, g, acc)

    def scale(self, acc: _V, block: int) -> _V:
        return _mul_round(acc, self.ctx._group_scale(self.SA, block), _FP32, Mode.RNE)

    def round_outer(self, acc: _V) -> _V:
        if self.ctx.plan.chain and self.ctx.m.acc_frac_bits == 23:
            return acc  # a chained result in the FP32 accumulator format: rounding is the identity
        return _round_value(acc, _FP32, self.ctx.plan.outer_mode)

    def add_outer(self, outer: _V, acc: _V) -> _V:
        return _add_round(outer, acc, _FP32, self.ctx.plan.outer_mode)

    def add_slices(self, total: _V, part: _V) -> _V:
        return _add_round(total, part, _FP32, Mode.RNE)


# ---------------------------------------------------------------------------
# the epilogue: lattice, alpha
# ---------------------------------------------------------------------------
def _epilogue(m: GemmModel, c: _V, factors) -> torch.Tensor:
    """The FP32 sums ``c`` through lattice, alpha and the output rounding: float32, flat."""
    if m.lattice is not None:
        c = _snap_lattice(c, m.lattice)
    if factors:
        c = _apply_alpha(m.alpha_mode, c, [f.reshape(-1) for f in factors])
    c = _round_value(c, _fmt(m.output), m.output_mode)
    return _to_float(c).to(torch.float32)


def _fast_emulate(model: GemmModel, plan: Schedule, a, b, factors, backend) -> torch.Tensor | None:
    """``fp4ref.gemm_fast`` where it is exact for this model and these operands, else None."""
    if fast_reason(model, plan) is not None or operands_reason(a, b) is not None:
        return None
    (M, K), Nn, dev = a.shape, b.shape[1], a.device
    a64, b64 = a.to(torch.float64), b.to(torch.float64)
    budget = (1 << 26) if dev.type == "cuda" else (1 << 22)  # float64 products held at once
    rows = max(1, budget // max(1, Nn * K))
    out = torch.empty(M, Nn, dtype=torch.float32, device=dev)
    for r0 in range(0, M, rows):
        r1 = min(M, r0 + rows)
        tot = _from_float(fast_totals(model, plan, a64[r0:r1], b64, backend))
        out[r0:r1] = _epilogue(model, tot, [f[r0:r1] for f in factors]).reshape(r1 - r0, Nn)
    return out


def _snap_lattice(c: _V, lattice) -> _V:
    """c = L * RNE(c / L) for a power-of-two lattice L."""
    lat = Fraction(lattice)
    k = lat.numerator.bit_length() - lat.denominator.bit_length()
    fin = (c.N != 0)
    s = (k - c.E).clamp(min=0)
    n = shift_round(torch, c.neg, c.N.abs(), s, Mode.RNE)
    move = fin & (c.E < k)
    N = torch.where(move, torch.where(c.neg, -n, n), c.N)
    E = torch.where(move, k, c.E)
    N, E = _strip(N, E)
    return _V(N, E, c.neg, c.kind)


def _apply_alpha(mode: AlphaMode, c: _V, factors) -> _V:
    """c times the alpha factors (float tensors, flat) as ``mode`` says (reference.gemm
    ``_apply_alpha``): one FP32 rounding of the exact product, FP32-premultiplied, or one
    FP32 rounding per factor in order / reversed."""
    fs = [_from_float(f) for f in factors]
    if mode in (AlphaMode.SEQUENTIAL, AlphaMode.REVERSED):
        for f in (fs if mode is AlphaMode.SEQUENTIAL else fs[::-1]):
            c = _mul_round(c, f, _FP32, Mode.RNE)
        return c
    if mode is AlphaMode.PREMULTIPLIED:
        al = _round_value(fs[0], _FP32, Mode.RNE)
        for f in fs[1:]:
            al = _mul_round(al, f, _FP32, Mode.RNE)
        return _mul_round(c, al, _FP32, Mode.RNE)
    if mode is not AlphaMode.EXACT:  # GemmModel rejects any other value at construction
        raise ValueError(f"GemmModel.alpha_mode: unknown value {mode!r}; valid choices: "
                         + ", ".join(m.name for m in AlphaMode))
    # EXACT: the whole product as an expansion of < 2**62 terms, rounded once
    terms = [(c.N, c.E)]
    kind, neg = None, c.neg
    cur = c
    for f in fs:
        kind, neg = _mul_special(cur, f)
        cur = _V(torch.where(_is_zero(cur) | _is_zero(f), 0, 1), torch.zeros_like(c.E), neg, kind)
        terms = [(sn * fn, se + fe) for tn, te in terms for sn, se in _split31(tn, te)
                 for fn, fe in _split31(f.N, f.E)]
    N = torch.stack([t[0] for t in terms], 1)
    E = torch.stack([t[1] for t in terms], 1)
    mag, exp, sticky, _, zero = _exact_sum(N, E)
    r = _round_fin(mag, exp, sticky, neg, _FP32, Mode.RNE)
    return _finish(r, kind, neg)


def apply_alpha(model: GemmModel, c: torch.Tensor, factors: Sequence[torch.Tensor]) -> torch.Tensor:
    """The alpha stage of ``model``'s epilogue on accumulated values ``c`` (float32, any
    shape): the factors (float tensors of c's shape) combined per ``model.alpha_mode``,
    bit-identical to ``reference.gemm.dot``.  Returns float32 of c's shape."""
    v = _apply_alpha(model.alpha_mode, _from_float(c.reshape(-1)), [f.reshape(-1) for f in factors])
    return _to_float(v).float().reshape(c.shape)
