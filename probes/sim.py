"""Vectorized exact simulation of reference.gemm models over many (model, operands) rows.

Bit-exact to ``reference.gemm.dot`` (tested against it), but with int64 numpy
arrays instead of Fractions: a finite value is (neg, mag, q) = (-1)^neg * mag * 2^q
with 0 <= mag < 2^62.  Aligned fused steps need no more than W+9 bits; exact
fused steps (align_bits None) keep the top ~60 bits plus a sticky flag and replace
the tail by a proxy half-unit, which rounds identically unless a rounding boundary
falls inside the tail's range.  Those rare rows (deep cancellation) are redone with
the reference's exact ``fused_step``.  Lattice, alpha and output rounding run on
float64, where every value involved is exact.

Used for candidate predictions during inference (many models x few probes) and
for validation (one model x many outputs).
"""
from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Sequence

import numpy as np

from reference.exact import Exact, Kind
from reference.formats import get_format
from reference import gemm as rg
from reference.rounding import Mode, Subnormal

__all__ = ["Operands", "simulate", "simulate_matrix", "simulate_gemm", "reference_key", "ERR_KEY", "output_bits", "bits_to_float",
           "NAN_KEY", "MODE_CODE", "round_float64"]

NAN_KEY = -1  # prediction key of any NaN (NaN compares by isnan, not payload)
MODE_CODE = {Mode.RNE: 0, Mode.RTZ: 1, Mode.RDN: 2, Mode.RUP: 3, Mode.RNA: 4, Mode.RTO: 5}
_FIN, _INF, _NAN = 0, 1, 2
_I64 = np.int64


# --- integer helpers ------------------------------------------------------------------------
def _bitlen(x: np.ndarray) -> np.ndarray:
    """bit_length of non-negative int64 values (< 2^62)."""
    _, e = np.frexp(x.astype(np.float64))  # frexp(0) = (0, 0)
    e = e.astype(_I64)
    if x.size and x.max() >= (1 << 53):
        # the float conversion may round up to the next power of two
        e = e - ((e > 0) & ((_I64(1) << np.clip(e - 1, 0, 62)) > x))
    return e


def _ctz(x: np.ndarray) -> np.ndarray:
    low = x & -x  # a power of two: exact in float64
    _, e = np.frexp(low.astype(np.float64))
    return np.maximum(e.astype(_I64) - 1, 0)


def _up(mode, neg, q, r, half):
    """Round-up-in-magnitude decision for inexact r (remainder) vs half."""
    gt = r > half
    eq = r == half
    odd = (q & 1) == 1
    if np.ndim(mode) == 0 or (mode.size and (mode == mode.flat[0]).all()):
        m = int(np.asarray(mode).flat[0]) if np.size(mode) else 0
        return [gt | (eq & odd), np.zeros_like(gt), neg & np.ones_like(gt), ~neg & np.ones_like(gt),
                gt | eq, ~odd][m]
    return np.select(
        [mode == 0, mode == 1, mode == 2, mode == 3, mode == 4, mode == 5],
        [gt | (eq & odd), np.zeros_like(gt), neg, ~neg, gt | eq, ~odd])


def _shift_round(mag, s, mode, neg):
    """Round mag / 2^s to an integer by ``mode`` (s > 0 where it matters; clipped at 62).

    Valid for mag < 2^61: for s >= 62 the quotient is 0 and the remainder is below half."""
    sc = np.clip(s, 0, 62)
    q = mag >> sc
    r = mag - (q << sc)
    half = np.where(sc > 0, _I64(1) << np.maximum(sc - 1, 0), 0)
    big = s > 62  # true half exceeds any remainder: below half, inexact if r != 0
    half = np.where(big, np.iinfo(_I64).max, half)
    up = _up(mode, neg, q, r, half) & (r != 0)
    return q + up, r != 0


@dataclass
class _Fmt:
    p: int       # fraction bits
    emin: int
    emax: int


_FP32 = _Fmt(23, -126, 127)


def _round_float(neg, mag, q, fmt: _Fmt, mode, flush=None):
    """Round (neg, mag, q) (mag < 2^61) to a float with p fraction bits and exponent range.

    Returns (sp, neg, mag, q) with IEEE overflow (mode-dependent inf/max) and optional
    flush of results below 2^emin to signed zero."""
    p = fmt.p if np.isscalar(fmt.p) else fmt.p
    e = q + _bitlen(mag) - 1
    eq = np.maximum(e, fmt.emin) - p
    s = eq - q
    rq, _ = _shift_round(mag, s, mode, neg)
    exact = s <= 0
    rmag = np.where(exact, mag, rq)
    rq_e = np.where(exact, q, eq)
    nzr = rmag != 0
    er = rq_e + _bitlen(rmag) - 1
    over = nzr & (er > fmt.emax)
    sp = np.zeros(mag.shape, np.int8)
    if over.any():
        to_inf = np.select([mode == 0, mode == 4, mode == 3, mode == 2],
                           [np.ones_like(neg), np.ones_like(neg), ~neg, neg], np.zeros_like(neg))
        maxmag = (_I64(1) << (p + 1)) - 1
        maxq = fmt.emax - p
        sp = np.where(over & to_inf, _INF, 0).astype(np.int8)
        rmag = np.where(over & ~to_inf, maxmag, rmag)
        rq_e = np.where(over & ~to_inf, maxq, rq_e)
        rmag = np.where(over & to_inf, 0, rmag)
    if flush is not None:
        tiny = nzr & ~over & (er < fmt.emin) & flush
        rmag = np.where(tiny, 0, rmag)
    zero = rmag == 0
    rq_e = np.where(zero, 0, rq_e)
    # normalize: strip trailing zeros (keeps later shifts small)
    tz = _ctz(rmag)
    return sp, neg.copy(), rmag >> tz, rq_e + tz


# --- operands ---------------------------------------------------------------------------------
@dataclass
class Operands:
    """One dot product's operands, decoded (float64 holds every value exactly).

    a, b: [K]; scales_a/scales_b: [K // block] or None; alpha: tuple of factors or None."""
    a: np.ndarray
    b: np.ndarray
    scales_a: np.ndarray | None = None
    scales_b: np.ndarray | None = None
    block: int | None = None
    alpha: tuple | None = None

    @property
    def K(self) -> int:
        return int(len(self.a))


def _split(x: np.ndarray):
    """float64 -> (sp, neg, mag, q) exactly."""
    x = np.asarray(x, dtype=np.float64)
    neg = np.signbit(x)
    sp = np.where(np.isnan(x), _NAN, np.where(np.isinf(x), _INF, _FIN)).astype(np.int8)
    fin = np.where(sp == _FIN, np.abs(x), 0.0)
    m, e = np.frexp(fin)
    mag = (m * 2.0 ** 53).astype(_I64)
    q = e.astype(_I64) - 53
    tz = _ctz(mag)
    mag = mag >> tz
    q = np.where(mag == 0, 0, q + tz)
    return sp, neg, mag, q


def _to_f64(sp, neg, mag, q):
    v = np.ldexp(mag.astype(np.float64), q.astype(np.int32) if q.dtype != np.int32 else q)
    v = np.where(sp == _INF, np.inf, v)
    v = np.where(neg, -v, v)
    return np.where(sp == _NAN, np.nan, v)


# --- fused step -----------------------------------------------------------------------------
def _fused_step(acc, prods, W, am, accfmt, nm, flush, fallback, add_rule=False, pe=None, ref=None,
                sesum=None, ovf=None):
    """acc: (sp, neg, mag, q) [R]; prods: same, [R, f]; per-row params [R].

    pe [R, f]: the products' exponent sums, used for alignment on rows where ``ref``
    (align_ref EXPONENT_SUM) is set; None: every term aligns by its own exponent."""
    sp = np.concatenate([acc[0][:, None], prods[0]], axis=1)
    neg = np.concatenate([acc[1][:, None], prods[1]], axis=1)
    mag = np.concatenate([acc[2][:, None], prods[2]], axis=1)
    q = np.concatenate([acc[3][:, None], prods[3]], axis=1)
    R = mag.shape[0]
    out_sp = np.zeros(R, np.int8)
    out_neg = np.zeros(R, bool)
    # specials (IEEE): any NaN, or infinities of both signs -> NaN; else the infinity
    if sp.any():
        isnan = (sp == _NAN).any(axis=1)
        inf = sp == _INF
        pinf = (inf & ~neg).any(axis=1)
        ninf = (inf & neg).any(axis=1)
        special = isnan | pinf | ninf
        out_sp = np.where(isnan | (pinf & ninf), _NAN, np.where(pinf | ninf, _INF, 0)).astype(np.int8)
        out_neg = ninf & ~pinf
        allzero = ~special & (mag == 0).all(axis=1)
    else:
        special = np.zeros(R, bool)
        allzero = (mag == 0).all(axis=1)
    # IEEE zero sign: all -0 -> -0, all +0 -> +0, mixed -> +0 (-0 under RDN)
    zneg = neg.all(axis=1) | (neg.any(axis=1) & (nm == 2))
    live = ~special & ~allzero
    E = np.where(mag > 0, q + _bitlen(mag) - 1, np.iinfo(_I64).min // 4)
    emax = E.max(axis=1)
    emax_al = emax
    if pe is not None and ref is not None and ref.any():
        Ea = E.copy()
        Ea[:, 1:] = np.where(ref[:, None] & (mag[:, 1:] > 0), pe, E[:, 1:])
        emax_al = Ea.max(axis=1)
    if sesum is not None and sesum.any():
        # SCALE_EXPONENT_SUM rows: every term counts (zeros too), the accumulator at >= -126
        Es = np.concatenate([np.maximum(E[:, :1], -126), pe], axis=1)
        emax_al = np.where(sesum, Es.max(axis=1), emax_al)
    smag = np.where(neg, -mag, mag)

    aligned = W >= 0
    any_al = bool(aligned.any())
    all_al = bool(aligned.all())
    if any_al:
        # aligned rows: round each term to a multiple of 2^(emax - W)
        qa = emax_al - np.where(aligned, W, 0)
        s = qa[:, None] - q
        left = mag << np.clip(-s, 0, 62)
        rq, _ = _shift_round(mag, s, am[:, None], neg)
        al = np.where(s <= 0, left, rq)
        S_al = np.where(neg, -al, al).sum(axis=1)
    nterms = mag.shape[1]
    g = int(nterms).bit_length()
    qb = emax + 2 + g - 62
    if not all_al:
        # exact rows: top bits + sticky; proxy 2H+1 at half a unit when inexact
        sh = qb[:, None] - q
        hi_exact = sh <= 0
        hi = np.where(hi_exact, smag << np.clip(-sh, 0, 62), smag >> np.clip(sh, 0, 62))
        rem = np.where(hi_exact, 0, smag - (hi << np.clip(sh, 0, 62)))
        H = hi.sum(axis=1)
        nst = (rem != 0).sum(axis=1)  # the tail lies in (H, H + nst) units
        sticky = nst > 0
        S_ex = np.where(sticky, 2 * H + 1, H)
        q_ex = np.where(sticky, qb - 1, qb)
    if all_al:
        S, qs, sticky = S_al, qa, np.zeros(R, bool)
    elif not any_al:
        S, qs = S_ex, q_ex
    else:
        S = np.where(aligned, S_al, S_ex)
        qs = np.where(aligned, qa, q_ex)
    S = np.where(live, S, 0)
    rneg = S < 0
    r_sp, r_neg, r_mag, r_q = _round_float(rneg, np.abs(S), qs, accfmt, nm, flush)
    if ovf is not None and ovf.any():  # overflow_inf: |sum| >= 2^128 is +-Inf
        big = ovf & (S != 0) & (qs + _bitlen(np.abs(S)) - 1 >= 128)
        r_sp = np.where(big, _INF, r_sp).astype(np.int8)
        r_mag = np.where(big, 0, r_mag)

    # validity of the proxy: no rounding boundary inside (H, H + nterms)
    bad = np.zeros(R, bool)
    if (live & ~aligned & sticky).any():
        e_p = qs + _bitlen(np.abs(S)) - 1
        eqp = np.maximum(e_p, accfmt.emin) - accfmt.p
        t = eqp - 1 - qb
        tc = np.clip(t, 0, 62)
        same = (H >> tc) == ((H + np.maximum(nst, 1) - 1) >> tc)
        bad = live & ~aligned & sticky & ((t < 0) | ~same)
    zero_sum = live & (S == 0)
    out_sp = np.where(live, r_sp, out_sp)
    out_neg = np.where(live, r_neg, np.where(allzero, zneg, out_neg))
    out_neg = np.where(zero_sum, nm == 2, out_neg)  # exact zero sum: -0 only under RDN
    out_mag = np.where(live, r_mag, 0)
    out_q = np.where(live, r_q, 0)
    if not all_al and bad.any():
        for r in np.nonzero(bad)[0]:
            res = fallback(r, (sp[r], neg[r], mag[r], q[r]))
            out_sp[r], out_neg[r], out_mag[r], out_q[r] = res
    return out_sp, out_neg, out_mag, out_q


def _exact_of(sp, neg, mag, q) -> Exact:
    if sp == _NAN:
        return Exact(Kind.NAN, False)
    if sp == _INF:
        return Exact(Kind.INF, bool(neg))
    m = Fraction(int(mag)) * (Fraction(2) ** int(q))
    return Exact(Kind.FINITE, bool(neg), m)


def _parts_of(x: Exact):
    if x.is_nan:
        return _NAN, False, 0, 0
    if x.is_inf:
        return _INF, x.negative, 0, 0
    if x.mag == 0:
        return _FIN, x.negative, 0, 0
    n, d = x.mag.numerator, x.mag.denominator
    e = d.bit_length() - 1
    tz = (n & -n).bit_length() - 1
    return _FIN, x.negative, n >> tz, tz - e


def _add_round(a, b, fmt: _Fmt, mode, fallback_model_mode):
    """round(a + b) with the reference's _add zero rule (+0 unless both -0)."""
    acc = a
    prods = tuple(x[:, None] for x in b)
    R = a[2].shape[0]
    W = np.full(R, -1, _I64)
    am = np.zeros(R, _I64)
    # the exact fused-step path on two terms, with _add's zero rule

    def fb(r, parts):
        mode_r = fallback_model_mode[r] if np.ndim(fallback_model_mode) else fallback_model_mode
        x = _exact_of(a[0][r], a[1][r], a[2][r], a[3][r])
        y = _exact_of(b[0][r], b[1][r], b[2][r], b[3][r])
        sp = rg._special_sum([x, y])
        if sp is None:
            sp = rg.round_fp(rg._add(x, y, _MODE_OF[int(mode_r)]), _fmt_spec(fmt), _MODE_OF[int(mode_r)])
        return _parts_of(sp)

    return _fused_step(acc, prods, W, am, fmt, mode, None, fb, add_rule=True)


_MODE_OF = {v: k for k, v in MODE_CODE.items()}


def _fmt_spec(fmt: _Fmt):
    if fmt.p == 23 and fmt.emin == -126:
        return "float32"
    return rg.accumulator_format(fmt.p)


def _esum(*factors) -> np.ndarray:
    """Sum of floor(log2|x|) over the factors (int64; 0 where any factor is 0 or
    non-finite: such products take no part in the alignment)."""
    tot = 0
    ok = True
    for x in factors:
        x = np.asarray(x, np.float64)
        ok = ok & np.isfinite(x) & (x != 0)
        tot = tot + (np.frexp(np.where(np.isfinite(x), x, 1.0))[1].astype(_I64) - 1)
    return np.where(ok, tot, 0).astype(_I64)


def _wants_esum(models) -> bool:
    return any(m.align_ref is rg.AlignRef.EXPONENT_SUM and m.align_bits is not None for m in models)


# --- post-accumulation stages on float64 ----------------------------------------------------
_OUT_FMTS = {"float32": (23, -126, 127), "bfloat16": (7, -126, 127), "float16": (10, -14, 15)}


def _exact_alpha(v: float, fs: list) -> float:
    """fp32(v * f1 * f2 ...) rounded once (RNE), by integer arithmetic."""
    import math
    x = v
    for f in fs:
        x = x * f  # only for the special cases below
    if not all(math.isfinite(t) for t in [v] + fs) or v == 0 or any(f == 0 for f in fs):
        return float(np.float32(x)) if math.isfinite(x) else x
    neg = (v < 0) ^ (sum(f < 0 for f in fs) % 2 == 1)
    m, e = 1, 0
    for t in [v] + fs:
        mt, et = math.frexp(abs(t))
        m *= int(mt * (1 << 53))
        e += et - 53
    e_top = e + m.bit_length() - 1
    q = max(e_top, -126) - 23  # FP32 quantum
    if q > e:
        sh = q - e
        n, r = m >> sh, m & ((1 << sh) - 1)
        half = 1 << (sh - 1)
        if r > half or (r == half and n & 1):
            n += 1
        val = math.ldexp(n, q) if n.bit_length() + q <= 1024 else math.inf
    else:
        val = math.ldexp(m, e)
    if val > float(np.finfo(np.float32).max):
        val = math.inf
    return -val if neg else val


def round_float64(x: np.ndarray, fmt: str, mode) -> np.ndarray:
    """Round float64 values to ``fmt`` (float32/bfloat16/float16) with a per-element mode
    code, IEEE overflow; the result is float64 holding the rounded value exactly."""
    p, emin, emax = _OUT_FMTS[fmt]
    x = np.asarray(x, dtype=np.float64)
    mode = np.broadcast_to(np.asarray(mode, _I64), x.shape)
    sp, neg, mag, q = _split(x)
    fin = sp == _FIN
    r = _round_float(neg, mag, q, _Fmt(p, emin, emax), mode)
    out = _to_f64(np.where(fin, r[0], sp), neg, np.where(fin, r[2], 0), np.where(fin, r[3], 0))
    return out


def output_bits(x: np.ndarray, fmt: str) -> np.ndarray:
    """Keys of float64 values exactly representable in ``fmt``: the code, NaN -> NAN_KEY."""
    x = np.asarray(x, dtype=np.float64)
    if fmt == "float32":
        b = x.astype(np.float32).view(np.uint32).astype(_I64)
    elif fmt == "bfloat16":
        b = (x.astype(np.float32).view(np.uint32) >> 16).astype(_I64)
    elif fmt == "float16":
        b = x.astype(np.float16).view(np.uint16).astype(_I64)
    else:
        raise ValueError(f"output: unsupported format {fmt!r}; valid choices: {', '.join(_OUT_FMTS)}")
    return np.where(np.isnan(x), NAN_KEY, b)


def bits_to_float(bits: np.ndarray, fmt: str) -> np.ndarray:
    bits = np.asarray(bits, dtype=_I64)
    if fmt == "float32":
        v = bits.astype(np.uint32).view(np.float32).astype(np.float64)
    elif fmt == "bfloat16":
        v = (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    elif fmt == "float16":
        v = bits.astype(np.uint16).view(np.float16).astype(np.float64)
    else:
        raise ValueError(f"output: unsupported format {fmt!r}")
    return np.where(bits == NAN_KEY, np.nan, v)


def _post(c: np.ndarray, models: Sequence[rg.GemmModel], alphas: Sequence) -> np.ndarray:
    """Lattice, alpha, output rounding for rows (c float64 exact); returns keys."""
    R = len(c)
    out = c.copy()
    lat = np.array([float(m.lattice) if m.lattice is not None else 0.0 for m in models])
    has = (lat > 0) & np.isfinite(out) & (out != 0)
    if has.any():
        L = lat[has]
        out[has] = np.rint(out[has] / L) * L
    # alpha: vectorized per mode (float64 holds c * f exactly: 24 + 24 bits)
    rows = [r for r in range(R) if alphas[r]]
    if rows:
        modes = {}
        for r in rows:
            modes.setdefault((models[r].alpha_mode, len(alphas[r])), []).append(r)
        for (mode, nf), rs in modes.items():
            rs = np.array(rs)
            F = np.array([alphas[r] for r in rs], np.float64)  # [n, nf]
            v = out[rs]
            with np.errstate(all="ignore"):
                if mode is rg.AlphaMode.PREMULTIPLIED:
                    a = F[:, 0].astype(np.float32).astype(np.float64)  # the alpha is an FP32 value
                    for k in range(1, nf):
                        a = (a * F[:, k]).astype(np.float32).astype(np.float64)
                    v = v * a
                    out[rs] = np.where(np.isfinite(v), v.astype(np.float32).astype(np.float64), v)
                elif mode in (rg.AlphaMode.SEQUENTIAL, rg.AlphaMode.REVERSED):
                    for k in (range(nf) if mode is rg.AlphaMode.SEQUENTIAL else range(nf - 1, -1, -1)):
                        v = v * F[:, k]
                        v = np.where(np.isfinite(v), v.astype(np.float32).astype(np.float64), v)
                    out[rs] = v
                else:  # EXACT: one rounding of the exact product (integers)
                    out[rs] = [_exact_alpha(float(x), [float(f) for f in fs]) for x, fs in zip(v, F)]
    res = np.empty(R, _I64)
    byfmt: dict = {}
    for r, m in enumerate(models):
        byfmt.setdefault(m.output, []).append(r)
    for fmt, rows in byfmt.items():
        rows = np.array(rows)
        modes = np.array([MODE_CODE[models[r].output_mode] for r in rows])
        if fmt in _OUT_FMTS:
            v = round_float64(out[rows], fmt, modes)
            res[rows] = output_bits(v, fmt)
        else:  # other output formats: exact reference rounding
            for r in rows:
                x = out[r]
                ex = Exact(Kind.NAN, False) if np.isnan(x) else (
                    Exact(Kind.INF, bool(x < 0)) if np.isinf(x) else
                    Exact(Kind.FINITE, bool(np.signbit(x)), abs(Fraction(float(x)))))
                y = rg.round_fp(ex, fmt, models[r].output_mode)
                spec = get_format(fmt)
                from reference.rounding import encode
                res[r] = NAN_KEY if y.is_nan else encode(y, spec, Mode.RNE).code
    return res


# --- main entry -------------------------------------------------------------------------------
def _products(ops: Operands, model: rg.GemmModel):
    """Products (float64, exact) and per-block group scales for GROUP scale point."""
    a = np.asarray(ops.a, np.float64)
    b = np.asarray(ops.b, np.float64)
    p = a * b  # exact: <= 48 significant bits, far inside float64's range
    return p


def _supported(model: rg.GemmModel, ops: Operands | None) -> bool:
    if model.lattice is not None:
        L = model.lattice
        if L.numerator != 1 or (L.denominator & (L.denominator - 1)):
            if not (L.denominator == 1 and (L.numerator & (L.numerator - 1)) == 0):
                return False
    if model.acc_frac_bits > 58 or (model.align_bits is not None and model.align_bits > 50):
        return False
    if model.align_ref is rg.AlignRef.EXPONENT_SUM and model.align_bits is not None and model.align_bits > 44:
        return False  # exponent sums may sit a few bits below the value: keep int64 headroom
    if model.product_format is not None and model.product_format not in ("float32", "bfloat16", "float16", "tf32"):
        return False
    return True


_PF = {"float32": _Fmt(23, -126, 127), "bfloat16": _Fmt(7, -126, 127), "float16": _Fmt(10, -14, 15),
       "tf32": _Fmt(10, -126, 127)}


def _rejects(model: rg.GemmModel, K: int, block, grp: bool) -> bool:
    """True where the reference raises (K not splittable, groups across slices)."""
    if model.split_tile is None and K % model.split_k:
        return True
    return grp and ((model.group_size or K) != block or
                    any(lo % block for lo, _ in rg.split_bounds(model, K)))


def _schedule(model: rg.GemmModel, K: int):
    S = model.split_k
    ks = K // S if model.split_tile is None else rg.split_bounds(model, K)[0][1]
    G = min(model.group_size or ks, ks) if ks else 1
    F = min(model.fma_width, G)
    return F, G, S


def simulate_matrix(models: Sequence[rg.GemmModel], probes: Sequence[Operands]) -> np.ndarray:
    """Output keys [len(models), len(probes)] (codes of the output format, NaN -> NAN_KEY).

    A (model, probe) pair whose K is not a multiple of split_k predicts NAN_KEY - 1 (the
    reference rejects it)."""
    pairs = [(i, j) for i in range(len(models)) for j in range(len(probes))]
    res = simulate([models[i] for i, _ in pairs], [probes[j] for _, j in pairs])
    return res.reshape(len(models), len(probes))


ERR_KEY = NAN_KEY - 1


def simulate(models: Sequence[rg.GemmModel], probes: Sequence[Operands]) -> np.ndarray:
    """Output key of row r = dot(models[r], probes[r]) (same length sequences)."""
    R = len(models)
    if len(probes) != R:
        raise ValueError(f"probes: {len(probes)} rows but models has {R}")
    out = np.full(R, ERR_KEY, _I64)
    keys: dict = {}
    slow = []
    mma_rows: list = []
    for r, (m, op) in enumerate(zip(models, probes)):
        K = op.K
        grp = op.scales_a is not None and m.scale_point is rg.ScalePoint.GROUP
        if _rejects(m, K, op.block, grp):
            continue  # the reference rejects it
        if _is_mma(m):
            mma_rows.append(r)
            continue
        if not _supported(m, op):
            slow.append(r)
            continue
        F, G, S = _schedule(m, K)
        ks = K // S
        if m.split_tile is not None:  # uneven slices: one schedule per key
            keys.setdefault((F, K, grp, op.block if op.scales_a is not None else None, G, S, m.split_tile),
                            []).append(r)
        elif ks % F == 0 and (G % F == 0 or G == ks):
            keys.setdefault((F, K, grp, op.block if op.scales_a is not None else None), []).append(r)
        else:  # uneven steps: one schedule per key
            keys.setdefault((F, K, grp, op.block if op.scales_a is not None else None, G, S), []).append(r)
    c = np.zeros(R)
    for key, rows in keys.items():
        c[rows] = _run_key(key, [models[r] for r in rows], [probes[r] for r in rows])
    done = [r for rows in keys.values() for r in rows]
    if done:
        out[done] = _post(c[done], [models[r] for r in done], [probes[r].alpha for r in done])
    for r in slow:
        out[r] = reference_key(models[r], probes[r])
    if mma_rows:
        _simulate_mma(models, probes, out, mma_rows)
    return out


def reference_key(model: rg.GemmModel, op: Operands) -> int:
    """The same key from the exact reference (slow; for checks and unsupported models)."""
    kw = {}
    if op.scales_a is not None:
        kw = dict(scales_a=[float(x) for x in op.scales_a], scales_b=[float(x) for x in op.scales_b],
                  block=op.block)
    if op.alpha:
        kw["alpha"] = [float(x) for x in op.alpha]
    try:
        e = rg.dot(model, [float(x) for x in op.a], [float(x) for x in op.b], **kw)
    except ValueError:
        return ERR_KEY
    if e.is_nan:
        return NAN_KEY
    v = float(e)
    if model.output in _OUT_FMTS:
        return int(output_bits(np.array([v]), model.output)[0])
    from reference.rounding import encode
    return encode(e, model.output, Mode.RNE).code


def _run_key(key, models: list, probes: list) -> np.ndarray:
    """Rows of one schedule key; products are built once per distinct probe, without the
    leading all-(+0) columns (neutral: see _run_products)."""
    F, K, grp, block = key[:4]
    uniq: dict = {}
    idx = np.empty(len(probes), np.int64)
    for r, op in enumerate(probes):
        idx[r] = uniq.setdefault(id(op), len(uniq))
    ops = {}
    for op in probes:
        ops.setdefault(id(op), op)
    ulist = [ops[k] for k in uniq]
    P = np.stack([np.asarray(op.a, np.float64) * np.asarray(op.b, np.float64) for op in ulist])
    PE = None
    if _wants_esum(models):
        fac = [np.stack([np.asarray(op.a, np.float64) for op in ulist]),
               np.stack([np.asarray(op.b, np.float64) for op in ulist])]
        if ulist[0].scales_a is not None and not grp:
            blk = ulist[0].block
            fac += [np.stack([np.repeat(np.asarray(op.scales_a, np.float64), blk) for op in ulist]),
                    np.stack([np.repeat(np.asarray(op.scales_b, np.float64), blk) for op in ulist])]
        PE = _esum(*fac)
    sab = None
    if ulist[0].scales_a is not None:
        sab = np.stack([np.asarray(op.scales_a, np.float64) * np.asarray(op.scales_b, np.float64)
                        for op in ulist])
        if not grp:
            P = P * np.repeat(sab, ulist[0].block, axis=1)  # exact: few significant bits
            sab = None
    offset = 0
    if len(key) == 4:
        blk = ulist[0].block if ulist[0].scales_a is not None else None
        unit = F if blk is None else F * blk // np.gcd(F, blk)
        plus0 = (P == 0) & ~np.signbit(P)
        nzc = np.nonzero(~plus0.all(axis=0))[0]
        first = int(nzc[0]) if len(nzc) else K
        offset = (first // unit) * unit
    P = P[:, offset:]
    parts = tuple(x[idx] for x in _split(P))  # split once per distinct probe, then gather
    return _run_products(key, models, parts, None if sab is None else sab[idx],
                         None if PE is None else PE[:, offset:][idx])


def _run_products(key, models: list, P: np.ndarray, scale_prod, pe=None) -> np.ndarray:
    """Accumulate exact products P [R, K] (block scales already applied unless GROUP).

    key = (F, K, grp, block[, G, S]); rows may differ in group size and split when F
    divides both (boundaries are then per-row masks after common fused steps)."""
    F, K, grp, block = key[:4]
    R = len(models)
    parts = P if isinstance(P, tuple) else _split(P)
    offset = K - parts[2].shape[1]  # the last columns only; the first `offset` are +0
    psp, pneg, pmag, pq = (np.array(x) for x in parts)
    # product rounding (product_format)
    pf = [m.product_format for m in models]
    if any(pf):
        for fmtname in set(x for x in pf if x):
            rows = np.array([r for r in range(R) if pf[r] == fmtname])
            fin = psp[rows] == _FIN
            rr = _round_float(pneg[rows], pmag[rows], pq[rows], _PF[fmtname],
                              np.zeros(pmag[rows].shape, _I64))
            psp[rows] = np.where(fin, rr[0], psp[rows])
            pmag[rows] = np.where(fin, rr[2], pmag[rows])
            pq[rows] = np.where(fin, rr[3], pq[rows])
    W = np.array([m.align_bits if m.align_bits is not None else -1 for m in models], _I64)
    am = np.array([MODE_CODE[m.align_mode] for m in models], _I64)
    nm = np.array([MODE_CODE[m.norm_mode] for m in models], _I64)
    om = np.array([MODE_CODE[m.outer_mode] for m in models], _I64)
    pbits = np.array([m.acc_frac_bits for m in models], _I64)
    flush = np.array([m.acc_subnormal is Subnormal.FLUSH for m in models])
    accfmt = _Fmt(pbits, -126, 127)
    rne = np.zeros(R, _I64)
    ref = np.array([m.align_ref is rg.AlignRef.EXPONENT_SUM for m in models])
    if pe is None or not ref.any():
        pe, ref = None, None

    def step_fallback(r, parts):
        sp, neg, mag, q = parts
        m = models[r]
        acc = _exact_of(sp[0], neg[0], mag[0], q[0])
        prods = [_exact_of(sp[i], neg[i], mag[i], q[i]) for i in range(1, len(mag))]
        return _parts_of(rg.fused_step(m, acc, prods))

    sched = [_schedule(m, K) for m in models]
    if len(key) > 4 or any(F != sc[0] for sc in sched):
        return _run_uneven(key, models, (psp, pneg, pmag, pq), scale_prod, W, am, nm, om, accfmt,
                           flush, step_fallback, pe, ref)
    Gr = np.array([sc[1] for sc in sched], _I64)
    ksr = np.array([K // sc[2] for sc in sched], _I64)
    zero = lambda n: (np.zeros(n, np.int8), np.zeros(n, bool), np.zeros(n, _I64), np.zeros(n, _I64))
    acc = zero(R)
    outer = zero(R)
    total = zero(R)
    outer_ok = np.zeros(R, bool)
    total_ok = np.zeros(R, bool)
    # leading +0 products: the accumulator stays +0 and every boundary adds +0 exactly
    plus0 = (psp == _FIN) & (pmag == 0) & ~pneg
    nz_cols = np.nonzero(~plus0.all(axis=0))[0]
    first = offset + (int(nz_cols[0]) if len(nz_cols) else K - offset)
    z = first // F
    Z = z * F
    if Z:
        nsl = Z // ksr
        total_ok = nsl > 0
        outer_ok = ((Z - nsl * ksr) // Gr) > 0
    for j in range(z, K // F):
        j0 = j * F
        c0 = j0 - offset
        prods = (psp[:, c0:c0 + F], pneg[:, c0:c0 + F], pmag[:, c0:c0 + F], pq[:, c0:c0 + F])
        acc = _fused_step(acc, prods, W, am, accfmt, nm, flush, step_fallback,
                          pe=None if pe is None else pe[:, c0:c0 + F], ref=ref)
        end = j0 + F
        slice_end = (end % ksr) == 0
        gend = slice_end | (((end % ksr) % Gr) == 0)
        if gend.any():
            idx = np.nonzero(gend)[0]
            a = tuple(x[idx] for x in acc)
            if grp:
                a = _mul_round(a, scale_prod[idx, (end - 1) // block], rne[idx])
            o_first = _round_only(a, _FP32, om[idx])
            o_add = _add_round(tuple(x[idx] for x in outer), a, _FP32, om[idx], om[idx])
            f = ~outer_ok[idx]
            for x, y0, y1 in zip(outer, o_first, o_add):
                x[idx] = np.where(f, y0, y1)
            outer_ok[idx] = True
            for x in acc:
                x[idx] = 0
        if slice_end.any():
            idx = np.nonzero(slice_end)[0]
            o = tuple(x[idx] for x in outer)
            t_add = _add_round(tuple(x[idx] for x in total), o, _FP32, rne[idx], rne[idx])
            f = ~total_ok[idx]
            for x, y0, y1 in zip(total, o, t_add):
                x[idx] = np.where(f, y0, y1)
            total_ok[idx] = True
            outer_ok[idx] = False
    return _to_f64(*total)


def _run_uneven(key, models, prods_all, scale_prod, W, am, nm, om, accfmt, flush, step_fallback,
                pe=None, ref=None):
    psp, pneg, pmag, pq = prods_all
    F, G, S = _schedule(models[0], key[1])
    K = key[1]
    grp, block = key[2], key[3]
    R = len(models)
    rne = np.zeros(R, _I64)

    def zero():
        return (np.zeros(R, np.int8), np.zeros(R, bool), np.zeros(R, _I64), np.zeros(R, _I64))

    total = None
    for lo, hi in rg.split_bounds(models[0], K):
        outer = None
        for g0 in range(lo, hi, G):
            g1 = min(g0 + G, hi)
            acc = zero()
            for j in range(g0, g1, F):
                j1 = min(j + F, g1)
                prods = (psp[:, j:j1], pneg[:, j:j1], pmag[:, j:j1], pq[:, j:j1])
                acc = _fused_step(acc, prods, W, am, accfmt, nm, flush, step_fallback,
                                  pe=None if pe is None else pe[:, j:j1], ref=ref)
            if grp:
                acc = _mul_round(acc, scale_prod[:, (g0 // block)], rne)
            if outer is None:
                outer = _round_only(acc, _FP32, om)
            else:
                outer = _add_round(outer, acc, _FP32, om, om)
        total = outer if total is None else _add_round(total, outer, _FP32, rne, rne)
    return _to_f64(*total)


def _round_only(x, fmt, mode):
    sp, neg, mag, q = x
    fin = sp == _FIN
    r = _round_float(neg, mag, q, fmt, mode)
    return (np.where(fin, r[0], sp).astype(np.int8), neg, np.where(fin, r[2], mag), np.where(fin, r[3], q))


def _mul_round(x, scale: np.ndarray, mode):
    """fp32(x * scale), RNE (group scale point)."""
    ssp, sneg, smag, sq = _split(scale)
    sp, neg, mag, q = x
    nsp = np.where((sp == _NAN) | (ssp == _NAN), _NAN,
                   np.where((sp == _INF) | (ssp == _INF),
                            np.where(((sp == _INF) & (smag == 0) & (ssp == _FIN)) |
                                     ((ssp == _INF) & (mag == 0) & (sp == _FIN)), _NAN, _INF), _FIN))
    prod = mag * smag  # < 2^24 * 2^12
    r = _round_float(neg ^ sneg, prod, q + sq, _FP32, mode)
    fin = nsp == _FIN
    return (np.where(fin, r[0], nsp).astype(np.int8), neg ^ sneg, np.where(fin, r[2], 0),
            np.where(fin, r[3], 0))


def simulate_gemm(model: rg.GemmModel, A: np.ndarray, B: np.ndarray, *, scales_a=None, scales_b=None,
                  block: int | None = None, alpha=None, chunk: int = 1 << 21) -> np.ndarray:
    """C = A @ B under ``model``: output keys [M, N].

    A [M, K], B [K, N] decoded float64; scales_a [M, K/block], scales_b [K/block, N];
    alpha: None, or (sa, sb) with sa a scalar or [M] and sb a scalar or [N]."""
    A = np.asarray(A, np.float64)
    B = np.asarray(B, np.float64)
    M, K = A.shape
    N = B.shape[1]
    out = np.empty((M, N), _I64)
    grp = scales_a is not None and model.scale_point is rg.ScalePoint.GROUP
    if _rejects(model, K, block, grp):
        out[:] = ERR_KEY
        return out
    if _is_mma(model):  # one row per output element, vectorized over all of them
        ops = [Operands(A[i], B[:, j], None if scales_a is None else np.asarray(scales_a)[i],
                        None if scales_b is None else np.asarray(scales_b)[:, j], block,
                        None if alpha is None else _alpha_ij(alpha, i, j))
               for i in range(M) for j in range(N)]
        flat = out.reshape(-1)
        _simulate_mma([model] * len(ops), ops, flat, list(range(len(ops))))
        return out
    if not _supported(model, None):
        for i in range(M):
            for j in range(N):
                op = Operands(A[i], B[:, j], None if scales_a is None else scales_a[i],
                              None if scales_b is None else scales_b[:, j], block,
                              None if alpha is None else _alpha_ij(alpha, i, j))
                out[i, j] = reference_key(model, op)
        return out
    F, G, S = _schedule(model, K)
    ks = K // S
    key = (F, K, grp, block if grp else None)
    if model.split_tile is not None:
        key = key + (G, S, model.split_tile)
    elif not (ks % F == 0 and (G % F == 0 or G == ks)):
        key = key + (G, S)
    rows_per = max(1, chunk // max(K, 1))
    ii, jj = np.meshgrid(np.arange(M), np.arange(N), indexing="ij")
    ii, jj = ii.ravel(), jj.ravel()
    flat = out.reshape(-1)
    offset = 0
    if len(key) == 4:
        unit = F if block is None else F * block // np.gcd(F, block)
        # a column is neutral when all its products are +0: a +0 side times a finite
        # non-negative side (+0 * -x would be -0)
        a0 = ((A == 0) & ~np.signbit(A)).all(axis=0)
        b0 = ((B == 0) & ~np.signbit(B)).all(axis=1)
        anon = (~np.signbit(A) & np.isfinite(A)).all(axis=0)
        bnon = (~np.signbit(B) & np.isfinite(B)).all(axis=1)
        live = ~((a0 & bnon) | (b0 & anon))
        nzc = np.nonzero(live)[0]
        first = int(nzc[0]) if len(nzc) else K
        offset = (first // unit) * unit
    A = A[:, offset:]
    B = B[offset:, :]
    if scales_a is not None and grp:
        pass  # group scales are indexed by absolute position inside _run_products
    elif scales_a is not None:
        nb0 = offset // block
        scales_a = np.asarray(scales_a)[:, nb0:]
        scales_b = np.asarray(scales_b)[nb0:, :]
    for c0 in range(0, M * N, rows_per):
        i = ii[c0:c0 + rows_per]
        j = jj[c0:c0 + rows_per]
        P = A[i, :] * B[:, j].T
        PE = None
        if _wants_esum([model]):
            fac = [A[i, :], B[:, j].T]
            if scales_a is not None and not grp:
                fac += [np.repeat(np.asarray(scales_a, np.float64)[i, :], block, axis=1),
                        np.repeat(np.asarray(scales_b, np.float64)[:, j].T, block, axis=1)]
            PE = _esum(*fac)
        sab = None
        if scales_a is not None:
            sab = np.asarray(scales_a, np.float64)[i, :] * np.asarray(scales_b, np.float64)[:, j].T
            if not grp:
                P = P * np.repeat(sab, block, axis=1)
                sab = None
        models = [model] * len(i)
        c = _run_products(key, models, P, sab, PE)
        alphas = [None] * len(i) if alpha is None else [_alpha_ij(alpha, a, b) for a, b in zip(i, j)]
        flat[c0:c0 + len(i)] = _post(c, models, alphas)
    return out


def _alpha_ij(alpha, i, j):
    sa, sb = alpha
    fa = float(sa) if np.ndim(sa) == 0 else float(np.asarray(sa).reshape(-1)[i])
    fb = float(sb) if np.ndim(sb) == 0 else float(np.asarray(sb).reshape(-1)[j])
    return (fa, fb)


# --- Blackwell MMA family (chain / exact_group / SCALE_EXPONENT_SUM; issue 17) ---------------
def _is_mma(m: rg.GemmModel) -> bool:
    return m.chain or m.exact_group is not None or m.align_ref is rg.AlignRef.SCALE_EXPONENT_SUM


def _mma_key(m: rg.GemmModel, op: Operands):
    """Rows with one key share one schedule (per-row: widths and rounding modes)."""
    scaled = op.scales_a is not None
    return (op.K, op.block if scaled else None, m.group_size, m.fma_width, m.exact_group,
            m.split_k, m.split_tile, m.chain, m.align_ref, m.exp_formats, m.align_bits is None)


def _fexp(x: np.ndarray, fmt: str) -> np.ndarray:
    """floor(log2|x|), or the format's minimum normal exponent for subnormals and zeros."""
    spec = get_format(fmt)
    ax = np.where(np.isfinite(x), np.abs(x), 0.0)
    e = np.frexp(ax)[1].astype(_I64) - 1
    return np.where(ax >= float(spec.min_normal), e, spec.emin).astype(_I64)


def _mma_terms(model: rg.GemmModel, ops: list):
    """Addends [R, n] (float64, exact) and their exponents [R, n] (None: by value), and a
    mask of rows whose exact runs are not exact in float64 (redone by the reference)."""
    A = np.stack([np.asarray(o.a, np.float64) for o in ops])
    B = np.stack([np.asarray(o.b, np.float64) for o in ops])
    scaled = ops[0].scales_a is not None
    P = A * B
    if scaled:
        blk = ops[0].block
        SA = np.repeat(np.stack([np.asarray(o.scales_a, np.float64) for o in ops]), blk, axis=1)
        SB = np.repeat(np.stack([np.asarray(o.scales_b, np.float64) for o in ops]), blk, axis=1)
        with np.errstate(invalid="ignore"):
            P = P * (SA * SB)
    PE = None
    if model.align_ref is rg.AlignRef.SCALE_EXPONENT_SUM and model.align_bits is not None:
        fa, fb, fs = model.exp_formats or ("float32",) * 3
        PE = np.zeros(P.shape, _I64)
        if not (model.exact_group and scaled):
            PE = _fexp(A, fa) + _fexp(B, fb)
        if scaled:
            PE = PE + _fexp(SA, fs) + _fexp(SB, fs)
    inexact = np.zeros(len(ops), bool)
    E = model.exact_group
    if E is not None and E > 1:
        R, K = P.shape
        Pr = P.reshape(R, K // E, E)
        acc = Pr[:, :, 0].copy()
        with np.errstate(invalid="ignore"):
            for i in range(1, E):  # TwoSum: a nonzero error term means the float sum is inexact
                x = Pr[:, :, i]
                s_ = acc + x
                bb = s_ - acc
                err = (acc - (s_ - bb)) + (x - bb)
                inexact |= (np.isfinite(s_) & (err != 0)).any(axis=1)
                acc = s_
        P = acc
        if PE is not None:
            PE = PE.reshape(R, K // E, E).max(axis=2)
    return P, PE, inexact


def _run_mma(models: list, ops: list) -> tuple[np.ndarray, np.ndarray]:
    """Accumulated values (float64, before lattice/alpha/output) of rows of one _mma_key,
    and a mask of rows to redo with the reference."""
    m0 = models[0]
    R, K = len(models), ops[0].K
    E = m0.exact_group or 1
    F, G, S = _schedule(m0, K)
    if F % E or G % F or any(lo % G for lo, _ in rg.split_bounds(m0, K)) or (
            ops[0].scales_a is not None and E > 1 and E % ops[0].block and ops[0].block % E):
        return np.zeros(R), np.ones(R, bool)
    T, TE, slow = _mma_terms(m0, ops)
    tsp, tneg, tmag, tq = _split(T)
    W = np.array([m.align_bits if m.align_bits is not None else -1 for m in models], _I64)
    am = np.array([MODE_CODE[m.align_mode] for m in models], _I64)
    nm = np.array([MODE_CODE[m.norm_mode] for m in models], _I64)
    om = np.array([MODE_CODE[m.outer_mode] for m in models], _I64)
    accfmt = _Fmt(np.array([m.acc_frac_bits for m in models], _I64), -126, 127)
    flush = np.array([m.acc_subnormal is Subnormal.FLUSH for m in models])
    ovf = np.array([m.overflow_inf for m in models])
    sesum = np.ones(R, bool) if TE is not None else None
    rne = np.zeros(R, _I64)

    def fallback(r, parts):  # rare deep cancellation in an exact (align_bits None) step
        sp, neg, mag, q = parts
        acc = _exact_of(sp[0], neg[0], mag[0], q[0])
        return _parts_of(rg.fused_step(models[r], acc, [_exact_of(sp[i], neg[i], mag[i], q[i])
                                                         for i in range(1, len(mag))]))

    zero = lambda: (np.zeros(R, np.int8), np.zeros(R, bool), np.zeros(R, _I64), np.zeros(R, _I64))
    total = None
    for lo, hi in rg.split_bounds(m0, K):
        outer = None
        for g0 in range(lo, hi, G):
            acc = outer if (m0.chain and outer is not None) else zero()
            for j in range(g0, min(g0 + G, hi), F):
                c0, c1 = j // E, min(j + F, hi) // E
                acc = _fused_step(acc, (tsp[:, c0:c1], tneg[:, c0:c1], tmag[:, c0:c1], tq[:, c0:c1]),
                                  W, am, accfmt, nm, flush, fallback,
                                  pe=None if TE is None else TE[:, c0:c1], sesum=sesum, ovf=ovf)
            if outer is None or m0.chain:
                outer = _round_only(acc, _FP32, om)
            else:
                outer = _add_round(outer, acc, _FP32, om, om)
        total = outer if total is None else _add_round(total, outer, _FP32, rne, rne)
    return _to_f64(*total), slow


def _simulate_mma(models: list, probes: list, out: np.ndarray, rows: list) -> None:
    """Fill out[rows] for Blackwell-family rows, vectorized per schedule key."""
    keys: dict = {}
    for r in rows:
        keys.setdefault(_mma_key(models[r], probes[r]), []).append(r)
    for rs in keys.values():
        c, slow = _run_mma([models[r] for r in rs], [probes[r] for r in rs])
        fast = [r for r, sl in zip(rs, slow) if not sl]
        if fast:
            cf = np.array([x for x, sl in zip(c, slow) if not sl])
            out[fast] = _post(cf, [models[r] for r in fast], [probes[r].alpha for r in fast])
        for r, sl in zip(rs, slow):
            if sl:
                out[r] = reference_key(models[r], probes[r])
