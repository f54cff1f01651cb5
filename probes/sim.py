"""Vectorized exact simulation of reference.gemm models over many (model, operands) rows.

Bit-exact to ``reference.gemm.dot`` (tested against it), but with int64 numpy
arrays instead of Fractions: a finite value is (neg, mag, q) = (-1)^neg * mag * 2^q
with 0 <= mag < 2^62.  Aligned fused steps need no more than W+9 bits; exact
fused steps (align_bits None) keep the top ~60 bits plus a sticky flag and replace
the tail by a proxy half-unit, which rounds identically unless a rounding boundary
falls inside the tail's range.  Those rare rows (deep cancellation) are redone with
the reference's exact ``fused_step``.  Lattice, alpha and output rounding run on
float64, where every value involved is exact.

The schedule is the model's plan (``GemmModel.plan``, reference/schedule.py): rows walk
it step by step, vectorized over rows whose steps have one width (per-row group and slice
boundaries from their plans); this module supplies only the int64 arithmetic.

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
from reference.schedule import Operand, ScaleAt, Schedule, SplitReduce, reduce_levels
from fp4ref.gridround import (MODE_CODE, GridFormat, bit_length, round_int, shift_round,
                              trailing_zeros)

__all__ = ["Operands", "simulate", "simulate_matrix", "simulate_gemm", "reference_key", "ERR_KEY", "output_bits", "bits_to_float",
           "NAN_KEY", "MODE_CODE", "round_float64"]

NAN_KEY = -1  # prediction key of any NaN (NaN compares by isnan, not payload)
_FIN, _INF, _NAN = 0, 1, 2
_I64 = np.int64


# --- integer helpers (the fast paths' one rounding kernel: fp4ref.gridround) ------------------
def _bitlen(x: np.ndarray) -> np.ndarray:
    """bit_length of non-negative int64 values."""
    return bit_length(np, x)


_FP32 = GridFormat.of("float32")


def _acc_formats(pbits) -> GridFormat:
    """Per-row accumulator formats (FP32's exponent range, ``acc_frac_bits`` fraction bits)."""
    uniq = {p: rg.accumulator_format(p) for p in set(pbits)}
    return GridFormat.stack([uniq[p] for p in pbits])


def _round_float(neg, mag, q, fmt: GridFormat, mode, flush=None):
    """Round (neg, mag, q) (mag < 2^62) into ``fmt``; mode: a MODE_CODE array.

    Returns (sp, neg, mag, q) with IEEE overflow (mode-dependent inf/max) and optional
    flush of results below min normal to signed zero; mag's trailing zeros stripped."""
    r = round_int(np, neg, mag, q, fmt, mode, flush=False if flush is None else flush)
    return r.kind, r.neg, r.n, r.exp


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
    tz = trailing_zeros(np, mag)
    mag = mag >> tz
    q = np.where(mag == 0, 0, q + tz)
    return sp, neg, mag, q


def _to_f64(sp, neg, mag, q):
    v = np.ldexp(mag.astype(np.float64), q.astype(np.int32) if q.dtype != np.int32 else q)
    v = np.where(sp == _INF, np.inf, v)
    v = np.where(neg, -v, v)
    return np.where(sp == _NAN, np.nan, v)


# --- fused step -----------------------------------------------------------------------------
def _step_specials(sp, neg, mag):
    """IEEE specials of a sum (any NaN, or infinities of both signs -> NaN; else the
    infinity): (out_sp, out_neg, special, allzero) per row."""
    R = mag.shape[0]
    if not sp.any():
        return np.zeros(R, np.int8), np.zeros(R, bool), np.zeros(R, bool), (mag == 0).all(axis=1)
    isnan = (sp == _NAN).any(axis=1)
    inf = sp == _INF
    pinf = (inf & ~neg).any(axis=1)
    ninf = (inf & neg).any(axis=1)
    special = isnan | pinf | ninf
    out_sp = np.where(isnan | (pinf & ninf), _NAN, np.where(pinf | ninf, _INF, 0)).astype(np.int8)
    return out_sp, ninf & ~pinf, special, ~special & (mag == 0).all(axis=1)


def _align_emax(E, mag, pe, ref, sesum, floor):
    """Per row, the exponent the terms align at: the largest nonzero term's; on ``ref``
    rows (EXPONENT_SUM) products by their exponent sums ``pe``; on ``sesum`` rows (a plan's
    ``acc_exp_floor``) every term counts (zeros too) and the accumulator at >= ``floor``."""
    emax = E.max(axis=1)
    if pe is not None and ref is not None and ref.any():
        Ea = E.copy()
        Ea[:, 1:] = np.where(ref[:, None] & (mag[:, 1:] > 0), pe, E[:, 1:])
        emax = Ea.max(axis=1)
    if sesum is not None and sesum.any():
        Es = np.concatenate([np.maximum(E[:, :1], floor), pe], axis=1)
        emax = np.where(sesum, Es.max(axis=1), emax)
    return emax


def _aligned_sum(neg, mag, q, emax_al, W, am, aligned):
    """Aligned rows: each term rounded (``am``) to a multiple of 2^(emax - W), summed
    exactly: (sum, its exponent)."""
    qa = emax_al - np.where(aligned, W, 0)
    s = qa[:, None] - q
    left = mag << np.clip(-s, 0, 62)
    rq = shift_round(np, neg, mag, s, am[:, None])
    al = np.where(s <= 0, left, rq)
    return np.where(neg, -al, al).sum(axis=1), qa


def _proxy_sum(smag, q, qb):
    """Exact rows: the bits from 2^qb up summed exactly (H), the tail below replaced by a
    proxy half unit when nonzero: (2H+1 at qb-1, or H at qb), H, and how many terms had
    a tail (the true sum lies in (H, H + nst) units)."""
    sh = qb[:, None] - q
    hi_exact = sh <= 0
    hi = np.where(hi_exact, smag << np.clip(-sh, 0, 62), smag >> np.clip(sh, 0, 62))
    rem = np.where(hi_exact, 0, smag - (hi << np.clip(sh, 0, 62)))
    H = hi.sum(axis=1)
    nst = (rem != 0).sum(axis=1)
    sticky = nst > 0
    return np.where(sticky, 2 * H + 1, H), np.where(sticky, qb - 1, qb), H, nst


def _proxy_bad(S, qs, qb, H, nst, accfmt, rows):
    """Rows (of ``rows``) where a rounding boundary falls inside the proxied tail's range:
    the proxy may round differently there (redone exactly)."""
    e_p = qs + _bitlen(np.abs(S)) - 1
    eqp = np.maximum(e_p, accfmt.emin) - accfmt.man_bits
    t = eqp - 1 - qb
    tc = np.clip(t, 0, 62)
    same = (H >> tc) == ((H + np.maximum(nst, 1) - 1) >> tc)
    return rows & ((t < 0) | ~same)


def _fused_step(acc, prods, W, am, accfmt, nm, flush, fallback, add_rule=False, pe=None, ref=None,
                sesum=None, ovf=None, floor=None):
    """acc: (sp, neg, mag, q) [R]; prods: same, [R, f]; per-row params [R].

    pe [R, f]: the products' alignment exponents, used on rows where ``ref`` (align_ref
    EXPONENT_SUM) or ``sesum`` (``floor``: the plan's acc_exp_floor) is set; None: by its
    own exponent.  ``ovf``: rows whose |sum| >= 2^128 is +-Inf (overflow_inf)."""
    sp, neg, mag, q = (np.concatenate([a[:, None], p], axis=1) for a, p in zip(acc, prods))
    R = mag.shape[0]
    out_sp, out_neg, special, allzero = _step_specials(sp, neg, mag)
    # IEEE zero sign: all -0 -> -0, all +0 -> +0, mixed -> +0 (-0 under RDN)
    zneg = neg.all(axis=1) | (neg.any(axis=1) & (nm == 2))
    live = ~special & ~allzero
    E = np.where(mag > 0, q + _bitlen(mag) - 1, np.iinfo(_I64).min // 4)
    aligned = W >= 0
    any_al, all_al = bool(aligned.any()), bool(aligned.all())
    if any_al:
        S_al, qa = _aligned_sum(neg, mag, q, _align_emax(E, mag, pe, ref, sesum, floor), W, am, aligned)
    qb = E.max(axis=1) + 2 + int(mag.shape[1]).bit_length() - 62
    sticky = np.zeros(R, bool)
    if not all_al:
        S_ex, q_ex, H, nst = _proxy_sum(np.where(neg, -mag, mag), q, qb)
        sticky = nst > 0
    if all_al:
        S, qs = S_al, qa
    elif not any_al:
        S, qs = S_ex, q_ex
    else:
        S, qs = np.where(aligned, S_al, S_ex), np.where(aligned, qa, q_ex)
    S = np.where(live, S, 0)
    r_sp, r_neg, r_mag, r_q = _round_float(S < 0, np.abs(S), qs, accfmt, nm, flush)
    if ovf is not None and ovf.any():  # overflow_inf: |sum| >= 2^128 is +-Inf
        big = ovf & (S != 0) & (qs + _bitlen(np.abs(S)) - 1 >= 128)
        r_sp = np.where(big, _INF, r_sp).astype(np.int8)
        r_mag = np.where(big, 0, r_mag)
    inexact = live & ~aligned & sticky
    bad = _proxy_bad(S, qs, qb, H, nst, accfmt, inexact) if inexact.any() else inexact
    out_sp = np.where(live, r_sp, out_sp)
    out_neg = np.where(live, r_neg, np.where(allzero, zneg, out_neg))
    out_neg = np.where(live & (S == 0), nm == 2, out_neg)  # exact zero sum: -0 only under RDN
    out_mag = np.where(live, r_mag, 0)
    out_q = np.where(live, r_q, 0)
    for r in np.nonzero(bad)[0]:
        out_sp[r], out_neg[r], out_mag[r], out_q[r] = fallback(r, (sp[r], neg[r], mag[r], q[r]))
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


def _add_round(a, b, fmt: GridFormat, mode, fallback_model_mode):
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
        sp = rg.special_sum([x, y])
        if sp is None:
            sp = rg.round_fp(rg.add_exact(x, y, _MODE_OF[int(mode_r)]), fmt.name, _MODE_OF[int(mode_r)])
        return _parts_of(sp)

    return _fused_step(acc, prods, W, am, fmt, mode, None, fb, add_rule=True)


_MODE_OF = {v: k for k, v in MODE_CODE.items()}


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


def _by_esum(plan: Schedule) -> bool:
    """The plan aligns products at their factors' exponent sums among the nonzero terms
    (align_ref EXPONENT_SUM): ``ref`` rows of the fused step."""
    return plan.exp_factors is not None and plan.acc_exp_floor is None


def _wants_esum(plans) -> bool:
    return any(_by_esum(p) for p in plans)


# --- post-accumulation stages on float64 ----------------------------------------------------
_OUT_FMTS = ("float32", "bfloat16", "float16")  # output formats run here (else the reference)


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
    if fmt not in _OUT_FMTS:
        raise ValueError(f"fmt: unknown value {fmt!r}; valid choices: {', '.join(_OUT_FMTS)}")
    x = np.asarray(x, dtype=np.float64)
    mode = np.broadcast_to(np.asarray(mode, _I64), x.shape)
    sp, neg, mag, q = _split(x)
    fin = sp == _FIN
    r = _round_float(neg, mag, q, GridFormat.of(fmt), mode)
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
                elif mode is rg.AlphaMode.EXACT:  # one rounding of the exact product (integers)
                    out[rs] = [_exact_alpha(float(x), [float(f) for f in fs]) for x, fs in zip(v, F)]
                else:  # GemmModel rejects any other value at construction
                    raise ValueError(f"GemmModel.alpha_mode: unknown value {mode!r}; valid choices: "
                                     + ", ".join(m.name for m in rg.AlphaMode))
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
def _supported(model: rg.GemmModel) -> bool:
    if model.lattice is not None:
        L = model.lattice
        if L.numerator != 1 or (L.denominator & (L.denominator - 1)):
            if not (L.denominator == 1 and (L.numerator & (L.numerator - 1)) == 0):
                return False
    if model.acc_frac_bits > 58 or (model.align_bits is not None and model.align_bits > 50):
        return False
    if model.align_ref is rg.AlignRef.EXPONENT_SUM and model.align_bits is not None and model.align_bits > 44:
        return False  # exponent sums may sit a few bits below the value: keep int64 headroom
    if model.product_format is not None and model.product_format not in _PF:
        return False
    return True


_PF = ("float32", "bfloat16", "float16", "tf32")  # product formats run here (else the reference)


def _plan(model: rg.GemmModel, K: int, block, scaled: bool) -> Schedule | None:
    """The model's schedule for these operands (reference/schedule.py); None where the
    reference raises (K not splittable, GROUP scales across slices, ...)."""
    try:
        return model.plan(K, block if scaled else None)
    except ValueError:
        return None


def _key(plan: Schedule) -> tuple:
    """Rows of one key run together: (F, K, GROUP scales, block) when every step is F wide
    (rows may then differ in group and slice boundaries and in ``split_reduce``, per-row
    masks), else one layout."""
    key = (plan.step_width, plan.K, plan.scales is ScaleAt.GROUP, plan.block)
    return key if plan.uniform else key + (plan.layout,)


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
    plans: list = [None] * R
    slow, mma_rows = [], []
    for r, (m, op) in enumerate(zip(models, probes)):
        plan = _plan(m, op.K, op.block, op.scales_a is not None)
        if plan is None:
            continue  # the reference rejects it: ERR_KEY
        if m.mma_family:
            mma_rows.append(r)
        elif not _supported(m):
            slow.append(r)
        else:
            plans[r] = plan
            keys.setdefault(_key(plan), []).append(r)
    c = np.zeros(R)
    for key, rows in keys.items():
        c[rows] = _run_key(key, [models[r] for r in rows], [probes[r] for r in rows],
                           [plans[r] for r in rows])
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


def _plan_esum(plans: list, a, b, sa=None, sb=None) -> np.ndarray | None:
    """EXPONENT_SUM rows' product exponent sums [R, K] over the plan's ``exp_factors``
    (a, b [R, K]; sa, sb: callables giving the per-k block scales [R, K]); None if no row
    aligns that way.  Rows of one key share the factor list (it depends on the scale point)."""
    ef = next((p.exp_factors for p in plans if _by_esum(p)), None)
    if ef is None:
        return None
    src = {Operand.A: lambda: a, Operand.B: lambda: b, Operand.SCALE_A: sa, Operand.SCALE_B: sb}
    return _esum(*(src[f.operand]() for f in ef))


def _run_key(key, models: list, probes: list, plans: list) -> np.ndarray:
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
    if _wants_esum(plans):
        blk = ulist[0].block
        PE = _plan_esum(
            plans, np.stack([np.asarray(op.a, np.float64) for op in ulist]),
            np.stack([np.asarray(op.b, np.float64) for op in ulist]),
            lambda: np.stack([np.repeat(np.asarray(op.scales_a, np.float64), blk) for op in ulist]),
            lambda: np.stack([np.repeat(np.asarray(op.scales_b, np.float64), blk) for op in ulist]))
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
    return _run_products(key, models, plans, parts, None if sab is None else sab[idx],
                         None if PE is None else PE[:, offset:][idx])


class _Rows:
    """Per-row arithmetic parameters of a batch of models (one array each)."""

    def __init__(self, models: list):
        self.W = np.array([m.align_bits if m.align_bits is not None else -1 for m in models], _I64)
        self.am = np.array([MODE_CODE[m.align_mode] for m in models], _I64)
        self.nm = np.array([MODE_CODE[m.norm_mode] for m in models], _I64)
        self.om = np.array([MODE_CODE[m.outer_mode] for m in models], _I64)
        self.accfmt = _acc_formats([m.acc_frac_bits for m in models])
        self.flush = np.array([m.acc_subnormal is Subnormal.FLUSH for m in models])
        self.rne = np.zeros(len(models), _I64)

    def step(self, acc, prods, fallback, **kw):
        """One fused step of every row."""
        return _fused_step(acc, prods, self.W, self.am, self.accfmt, self.nm, self.flush, fallback, **kw)


def _step_fallback(models: list):
    """Exact (align_bits None) fused steps whose tail proxy is not valid (deep cancellation):
    the reference's fused step on that row."""
    def fallback(r, parts):
        sp, neg, mag, q = parts
        acc = _exact_of(sp[0], neg[0], mag[0], q[0])
        prods = [_exact_of(sp[i], neg[i], mag[i], q[i]) for i in range(1, len(mag))]
        return _parts_of(rg.fused_step(models[r], acc, prods))
    return fallback


def _zeros(R: int):
    return (np.zeros(R, np.int8), np.zeros(R, bool), np.zeros(R, _I64), np.zeros(R, _I64))


def _round_products(models: list, psp, pneg, pmag, pq) -> None:
    """``product_format``: each row's products rounded RNE in place."""
    pf = [m.product_format for m in models]
    for fmtname in set(x for x in pf if x):
        rows = np.array([r for r in range(len(models)) if pf[r] == fmtname])
        fin = psp[rows] == _FIN
        rr = _round_float(pneg[rows], pmag[rows], pq[rows], GridFormat.of(fmtname),
                          np.zeros(pmag[rows].shape, _I64))
        psp[rows] = np.where(fin, rr[0], psp[rows])
        pmag[rows] = np.where(fin, rr[2], pmag[rows])
        pq[rows] = np.where(fin, rr[3], pq[rows])


def _run_products(key, models: list, plans: list, P, scale_prod, pe=None) -> np.ndarray:
    """Accumulate exact products P [R, K] (block scales already applied unless GROUP).

    key = (F, K, grp, block[, layout]); with a 4-key every step of every row's plan is F
    wide and the rows may differ in group and slice boundaries (per-row masks)."""
    K = key[1]
    parts = P if isinstance(P, tuple) else _split(P)
    offset = K - parts[2].shape[1]  # the last columns only; the first `offset` are +0
    prods = tuple(np.array(x) for x in parts)
    _round_products(models, *prods)
    rows = _Rows(models)
    ref = np.array([_by_esum(p) for p in plans])
    if pe is None or not ref.any():
        pe, ref = None, None
    fallback = _step_fallback(models)
    if len(key) > 4:  # rows sharing one plan layout (any step widths): walk it
        def terms(st):
            return (tuple(x[:, st.lo:st.hi] for x in prods), None if pe is None else pe[:, st.lo:st.hi])
        return _to_f64(*plans[0].run(_SimArithmetic(rows, terms, scale_prod, fallback=fallback, ref=ref)))
    return _run_uniform(key[0], K, offset, plans, rows, prods, scale_prod, fallback, pe, ref)


def _distinct(plans: list):
    """(row -> index into the distinct plans [R], the distinct plans)."""
    uniq: dict = {}
    idx = np.empty(len(plans), np.int64)
    for r, p in enumerate(plans):
        idx[r] = uniq.setdefault(id(p), (len(uniq), p))[0]
    return idx, [p for _, p in uniq.values()]


def _boundaries(plans: list, F: int, K: int):
    """Distinct plans' group and slice ends as step masks [U, K // F] (steps of width F:
    step j ends at (j + 1) * F): group end, slice end, group scale block (-1: none)."""
    n = K // F
    gend = np.zeros((len(plans), n), bool)
    send = np.zeros((len(plans), n), bool)
    sblk = np.full((len(plans), n), -1, _I64)
    for u, p in enumerate(plans):
        for sl in p.slices:
            if sl.hi:
                send[u, sl.hi // F - 1] = True
            for g in sl.groups:
                if g.hi:
                    gend[u, g.hi // F - 1] = True
                    sblk[u, g.hi // F - 1] = -1 if g.scale_block is None else g.scale_block
    return gend, send, sblk


def _started(plans: list, Z: int):
    """Per distinct plan, at product Z (the first step run): (a slice has ended, a group of
    the slice holding Z has ended): the total / outer accumulators already hold +0."""
    total_ok = np.array([any(0 < sl.hi <= Z for sl in p.slices) for p in plans], bool)
    outer_ok = np.array([any(g.hi <= Z for sl in p.slices if sl.lo <= Z < sl.hi for g in sl.groups)
                         for p in plans], bool)
    return total_ok, outer_ok


def _run_uniform(F, K, offset, plans, rows, prods, scale_prod, fallback, pe, ref) -> np.ndarray:
    """Steps of width F over K for every row; at each step end the rows whose plan ends a
    group there round it into their outer accumulator (cross-group rounding), the rows
    whose plan ends a slice add that into their total (split-K, in order), or, when their
    plan combines slices otherwise (``SplitReduce`` TREE / PAIRWISE), keep it apart for
    ``_tree`` at the end."""
    psp, pneg, pmag, pq = prods
    R = len(plans)
    acc, outer, total = _zeros(R), _zeros(R), _zeros(R)
    # leading +0 products: the accumulator stays +0 and every boundary adds +0 exactly
    plus0 = (psp == _FIN) & (pmag == 0) & ~pneg
    nz_cols = np.nonzero(~plus0.all(axis=0))[0]
    first = offset + (int(nz_cols[0]) if len(nz_cols) else K - offset)
    z = first // F
    pidx, uplans = _distinct(plans)
    gends, sends, sblks = _boundaries(uplans, F, K)
    total_ok, outer_ok = np.zeros(R, bool), np.zeros(R, bool)
    tree_u = np.array([_is_tree(p) for p in uplans], bool)
    tree = tree_u[pidx]
    if tree.any():  # the slice index ending at each step; slice results, +0 where skipped
        sidx = np.zeros(gends.shape, _I64)
        for u, p in enumerate(uplans):
            for s, sl in enumerate(p.slices):
                if sl.hi:
                    sidx[u, sl.hi // F - 1] = s
        parts = [_zeros(R) for _ in range(max(len(p.slices) for p in uplans))]
    if z:
        t_u, o_u = _started(uplans, z * F)
        total_ok, outer_ok = t_u[pidx], o_u[pidx]
    for j in range(z, K // F):
        c0 = j * F - offset
        acc = rows.step(acc, tuple(x[:, c0:c0 + F] for x in prods), fallback,
                        pe=None if pe is None else pe[:, c0:c0 + F], ref=ref)
        gend, slice_end = gends[pidx, j], sends[pidx, j]
        if gend.any():
            idx = np.nonzero(gend)[0]
            a = tuple(x[idx] for x in acc)
            blk = sblks[pidx[idx], j]
            if (blk >= 0).any():  # scale_point GROUP (every row of the key)
                a = _mul_round(a, scale_prod[idx, blk], rows.rne[idx])
            _set_outer(outer, outer_ok, idx, a, rows.om[idx])
            for x in acc:
                x[idx] = 0
        if slice_end.any():  # split-K: the first slice's value as is, then FP32 RNE adds
            idx = np.nonzero(slice_end & ~tree)[0]
            if len(idx):
                _set_outer(total, total_ok, idx, tuple(x[idx] for x in outer), rows.rne[idx], False)
            tidx = np.nonzero(slice_end & tree)[0]
            if len(tidx):  # not in order: the slice's result kept in its place
                sl_of = sidx[pidx[tidx], j]
                for s in np.unique(sl_of):
                    ri = tidx[sl_of == s]
                    for x, y in zip(parts[s], outer):
                        x[ri] = y[ri]
            outer_ok[np.nonzero(slice_end)[0]] = False
    if tree.any():
        _tree(total, parts, tree_u, pidx, uplans, rows.rne)
    return _to_f64(*total)


def _is_tree(plan: Schedule) -> bool:
    """A plan whose slices are not added in order (SplitReduce TREE / PAIRWISE; two slices
    are one add either way)."""
    return plan.split_reduce is not SplitReduce.SERIAL and len(plan.slices) > 2


def _tree(total, parts, tree_u, pidx, uplans, rne) -> None:
    """total[r] = parts[0..n)[r] combined per the plan's split_reduce (``reduce_levels``,
    ``Schedule.combine``) for the rows r of the plans ``tree_u`` marks: each level's adds as
    one batch (FP32 RNE)."""
    modes = {p.split_reduce.value: p.split_reduce for p, t in zip(uplans, tree_u) if t}
    keys = sorted({(len(p.slices), p.split_reduce.value) for p, t in zip(uplans, tree_u) if t})
    kid = np.array([keys.index((len(p.slices), p.split_reduce.value)) if t else -1
                    for p, t in zip(uplans, tree_u)])[pidx]   # per row: its (slices, reduce) key
    for k, (n, mode) in enumerate(keys):
        key = (n, modes[mode])
        ri = np.nonzero(kid == k)[0]
        v = [tuple(x[ri] for x in part) for part in parts[:key[0]]]
        m = len(ri)
        for level in reduce_levels(key[1], key[0]):
            x = tuple(np.concatenate([v[d][c] for d, _ in level]) for c in range(4))
            y = tuple(np.concatenate([v[q][c] for _, q in level]) for c in range(4))
            mode = np.tile(rne[ri], len(level))
            out = _add_round(x, y, _FP32, mode, mode)
            for i, (d, _) in enumerate(level):
                v[d] = tuple(c[i * m:(i + 1) * m] for c in out)
        for x, y in zip(total, v[0]):
            x[ri] = y


def _set_outer(outer, ok, idx, a, mode, round_first=True) -> None:
    """outer[idx] = round(a) (or a) where empty, else round(outer + a): FP32, ``mode``."""
    o_first = _round_only(a, _FP32, mode) if round_first else a
    o_add = _add_round(tuple(x[idx] for x in outer), a, _FP32, mode, mode)
    f = ~ok[idx]
    for x, y0, y1 in zip(outer, o_first, o_add):
        x[idx] = np.where(f, y0, y1)
    ok[idx] = True


class _SimArithmetic:
    """``Schedule.run``'s arithmetic for rows sharing one plan layout (each row its own
    rounding modes): ``terms(st)`` gives a step's addends and alignment exponents."""

    def __init__(self, rows: _Rows, terms, scale_prod=None, **step_kw):
        self.rows, self.terms, self.scale_prod, self.step_kw = rows, terms, scale_prod, step_kw

    def zero(self):
        return _zeros(len(self.rows.W))

    def group(self, acc, g):
        for st in g.steps:
            prods, pe = self.terms(st)
            acc = self.rows.step(acc, prods, pe=pe, **self.step_kw)
        return acc

    def scale(self, acc, block: int):
        return _mul_round(acc, self.scale_prod[:, block], self.rows.rne)

    def round_outer(self, acc):
        return _round_only(acc, _FP32, self.rows.om)

    def add_outer(self, outer, acc):
        return _add_round(outer, acc, _FP32, self.rows.om, self.rows.om)

    def add_slices(self, total, part):
        return _add_round(total, part, _FP32, self.rows.rne, self.rows.rne)


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
    plan = _plan(model, K, block, scales_a is not None)
    if plan is None:
        out[:] = ERR_KEY
        return out
    if model.mma_family or not _supported(model):  # one row per output element
        ops = [Operands(A[i], B[:, j], None if scales_a is None else np.asarray(scales_a)[i],
                        None if scales_b is None else np.asarray(scales_b)[:, j], block,
                        None if alpha is None else _alpha_ij(alpha, i, j))
               for i in range(M) for j in range(N)]
        flat = out.reshape(-1)
        if model.mma_family:  # vectorized over all of them
            _simulate_mma([model] * len(ops), ops, flat, list(range(len(ops))))
        else:
            flat[:] = [reference_key(model, op) for op in ops]
        return out
    _gemm_rows(model, plan, A, B, scales_a, scales_b, block, alpha, chunk, out)
    return out


def _neutral_offset(A, B, unit: int, K: int) -> int:
    """The leading columns whose products are all +0, in whole units: a +0 side times a
    finite non-negative side (+0 * -x would be -0)."""
    a0 = ((A == 0) & ~np.signbit(A)).all(axis=0)
    b0 = ((B == 0) & ~np.signbit(B)).all(axis=1)
    anon = (~np.signbit(A) & np.isfinite(A)).all(axis=0)
    bnon = (~np.signbit(B) & np.isfinite(B)).all(axis=1)
    live = ~((a0 & bnon) | (b0 & anon))
    nzc = np.nonzero(live)[0]
    first = int(nzc[0]) if len(nzc) else K
    return (first // unit) * unit


def _gemm_rows(model, plan, A, B, scales_a, scales_b, block, alpha, chunk, out) -> None:
    """simulate_gemm's vectorized path: every output element a row of one key."""
    M, K = A.shape
    N = B.shape[1]
    key = _key(plan)
    grp = plan.scales is ScaleAt.GROUP
    F = plan.step_width
    offset = 0
    if len(key) == 4:
        offset = _neutral_offset(A, B, F if block is None else F * block // np.gcd(F, block), K)
    A = A[:, offset:]
    B = B[offset:, :]
    if scales_a is not None and not grp:  # (group scales are indexed by absolute position)
        nb0 = offset // block
        scales_a = np.asarray(scales_a)[:, nb0:]
        scales_b = np.asarray(scales_b)[nb0:, :]
    rows_per = max(1, chunk // max(K, 1))
    ii, jj = np.meshgrid(np.arange(M), np.arange(N), indexing="ij")
    ii, jj = ii.ravel(), jj.ravel()
    flat = out.reshape(-1)
    for c0 in range(0, M * N, rows_per):
        i = ii[c0:c0 + rows_per]
        j = jj[c0:c0 + rows_per]
        P = A[i, :] * B[:, j].T
        models, plans = [model] * len(i), [plan] * len(i)
        PE = None
        if _wants_esum(plans):
            PE = _plan_esum(plans, A[i, :], B[:, j].T,
                            lambda: np.repeat(np.asarray(scales_a, np.float64)[i, :], block, axis=1),
                            lambda: np.repeat(np.asarray(scales_b, np.float64)[:, j].T, block, axis=1))
        sab = None
        if scales_a is not None:
            sab = np.asarray(scales_a, np.float64)[i, :] * np.asarray(scales_b, np.float64)[:, j].T
            if not grp:
                P = P * np.repeat(sab, block, axis=1)
                sab = None
        c = _run_products(key, models, plans, P, sab, PE)
        alphas = [None] * len(i) if alpha is None else [_alpha_ij(alpha, a, b) for a, b in zip(i, j)]
        flat[c0:c0 + len(i)] = _post(c, models, alphas)


def _alpha_ij(alpha, i, j):
    sa, sb = alpha
    fa = float(sa) if np.ndim(sa) == 0 else float(np.asarray(sa).reshape(-1)[i])
    fb = float(sb) if np.ndim(sb) == 0 else float(np.asarray(sb).reshape(-1)[j])
    return (fa, fb)


# --- Blackwell MMA family (chain / exact_group / SCALE_EXPONENT_SUM; issue 17) ---------------
def _mma_key(m: rg.GemmModel, plan: Schedule):
    """Rows with one key share one schedule (per-row: widths and rounding modes)."""
    return (plan.layout, plan.chain, plan.exp_factors, m.align_bits is None)


def _fexp(x: np.ndarray, fmt: str) -> np.ndarray:
    """floor(log2|x|), or the format's minimum normal exponent for subnormals and zeros."""
    spec = get_format(fmt)
    ax = np.where(np.isfinite(x), np.abs(x), 0.0)
    e = np.frexp(ax)[1].astype(_I64) - 1
    return np.where(ax >= float(spec.min_normal), e, spec.emin).astype(_I64)


def _run_sums(P: np.ndarray, PE, E: int):
    """Exact runs of E products (float64 TwoSum: a row whose run sum is inexact in float64
    is flagged for the reference); a run's exponent is the largest of its products'."""
    R, K = P.shape
    inexact = np.zeros(R, bool)
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
    return acc, (None if PE is None else PE.reshape(R, K // E, E).max(axis=2)), inexact


def _mma_terms(plan: Schedule, ops: list):
    """Addends [R, n] (float64, exact) and their exponents [R, n] (None: by value), and a
    mask of rows whose exact runs are not exact in float64 (redone by the reference)."""
    src = {Operand.A: np.stack([np.asarray(o.a, np.float64) for o in ops]),
           Operand.B: np.stack([np.asarray(o.b, np.float64) for o in ops])}
    P = src[Operand.A] * src[Operand.B]
    if plan.scales is ScaleAt.PRODUCT:
        blk = plan.block
        sa = np.stack([np.asarray(o.scales_a, np.float64) for o in ops])
        sb = np.stack([np.asarray(o.scales_b, np.float64) for o in ops])
        src[Operand.SCALE_A], src[Operand.SCALE_B] = np.repeat(sa, blk, axis=1), np.repeat(sb, blk, axis=1)
        with np.errstate(invalid="ignore"):
            P = P * (src[Operand.SCALE_A] * src[Operand.SCALE_B])
    PE = None
    if plan.exp_factors is not None:
        PE = sum(_fexp(src[f.operand], f.format) for f in plan.exp_factors)
    E = plan.exact_group
    if E is not None and E > 1:
        return _run_sums(P, PE, E)
    return P, PE, np.zeros(len(ops), bool)


def _mma_fast(plan: Schedule) -> bool:
    """The vectorized MMA path covers this plan: PRODUCT (or no) scales, format-exponent
    alignment (or by value), and exact runs that tile K in whole runs of E."""
    if plan.scales is ScaleAt.GROUP or _by_esum(plan):
        return False
    E = plan.exact_group or 1
    if E == 1:
        return True
    if plan.block is not None and E % plan.block and plan.block % E:
        return False
    return all(lo % E == 0 and hi - lo == E for st in plan.steps for lo, hi in st.runs)


def _run_mma(models: list, ops: list, plan: Schedule) -> tuple[np.ndarray, np.ndarray]:
    """Accumulated values (float64, before lattice/alpha/output) of rows of one _mma_key,
    and a mask of rows to redo with the reference."""
    R = len(models)
    if not _mma_fast(plan):
        return np.zeros(R), np.ones(R, bool)
    E = plan.exact_group or 1
    T, TE, slow = _mma_terms(plan, ops)
    terms = _split(T)
    rows = _Rows(models)
    ovf = np.array([m.overflow_inf for m in models])
    sesum = np.ones(R, bool) if TE is not None else None
    fallback = _step_fallback(models)

    def step_terms(st):
        c0, c1 = st.lo // E, st.hi // E
        return tuple(x[:, c0:c1] for x in terms), None if TE is None else TE[:, c0:c1]
    arith = _SimArithmetic(rows, step_terms, fallback=fallback, sesum=sesum, ovf=ovf,
                           floor=plan.acc_exp_floor)
    return _to_f64(*plan.run(arith)), slow


def _simulate_mma(models: list, probes: list, out: np.ndarray, rows: list) -> None:
    """Fill out[rows] for Blackwell-family rows, vectorized per schedule key."""
    keys: dict = {}
    for r in rows:
        op = probes[r]
        plan = models[r].plan(op.K, op.block if op.scales_a is not None else None)
        keys.setdefault(_mma_key(models[r], plan), (plan, []))[1].append(r)
    for plan, rs in keys.values():
        c, slow = _run_mma([models[r] for r in rs], [probes[r] for r in rs], plan)
        fast = [r for r, sl in zip(rs, slow) if not sl]
        if fast:
            cf = np.array([x for x, sl in zip(c, slow) if not sl])
            out[fast] = _post(cf, [models[r] for r in fast], [probes[r].alpha for r in fast])
        for r, sl in zip(rs, slow):
            if sl:
                out[r] = reference_key(models[r], probes[r])
