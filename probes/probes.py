"""Probe operands, generated from the formats' parameters (never from one GPU's answers).

A probe is one dot product.  Generators describe it as a list of *terms* (exact product
values, block scales included), right-aligned in a vector of length K (leading zeros are
neutral in every model of the family: the accumulator stays +0, and zero groups or slices
add +0 exactly).  The ``Realizer`` turns terms into operands of the device's formats
(and block scales), or drops a probe whose terms no operand pair can produce.

Pools per inferred parameter:
- output rounding: ties / near-ties at the output precision, both signs and parities;
- lattice: single terms c * 2^-j (c of 1-3 bits);
- inner (alignment bits W, accumulator bits p, alignment and normalization rounding,
  product rounding): two-term sums [+-c 2^e, t] with gaps, carries and cancellation;
- fused width F and groups G: runs of equal small terms around one big term (the
  group-boundary scan), small-then-big runs, and in-step cancellation triples;
- split-K and long groups: the same runs spread over all of K;
- subnormals, alpha (per-tensor / per-row factors), and random checks.

"Accumulation-exact" probes (every partial sum fits 13 significant bits, the narrowest
accumulator of the candidate grid) are insensitive to every accumulation parameter.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from functools import lru_cache

import numpy as np

from reference.exact import floor_log2
from reference.formats import FormatSpec, get_format
from reference.rounding import Mode, round_exact

from .device import Capabilities
from .grid import ACC_BITS_MIN
from .sim import Operands

__all__ = ["Probe", "Realizer", "ProbeContext", "ACC_BITS_MIN", "output_pool", "lattice_pool",
           "inner_pool", "width_pool", "long_pool", "subnormal_pool", "alpha_pool",
           "random_pool", "boundary_scan", "pow2"]



def pow2(e: int) -> Fraction:
    return Fraction(1 << e) if e >= 0 else Fraction(1, 1 << -e)


@dataclass
class Probe:
    name: str
    parameter: str
    description: str
    ops: Operands
    pattern: str = ""
    pid: int = field(default=-1)
    terms: tuple | None = None   # the target products (ProbeContext.make), for anchoring

    def record_operands(self) -> dict:
        d = {"K": self.ops.K, "pattern": self.pattern}
        o = self.ops
        prod = o.a * o.b
        if o.scales_a is not None:
            prod = prod * np.repeat(np.asarray(o.scales_a) * np.asarray(o.scales_b), o.block)
        nz = np.nonzero(prod)[0]
        if len(nz) <= 12:
            d["terms"] = {str(int(k)): _fstr(prod[k]) for k in nz}
        if self.ops.alpha:
            d["alpha"] = [float(x) for x in self.ops.alpha]
        return d


def _fstr(x: float) -> str:
    return float(x).hex()


def _representable(v: Fraction, fmt: FormatSpec) -> bool:
    if v < 0:
        if not fmt.signed:
            return False
        v = -v
    try:
        fmt.encode_magnitude(v)
        return True
    except ValueError:
        return False


@lru_cache(maxsize=None)
def _positive_values(fmtname: str) -> tuple:
    fmt = get_format(fmtname)
    return tuple(v for _, v in fmt.finite_values if v > 0)


@lru_cache(maxsize=None)
def _pair_products(fa: str, fb: str) -> dict:
    """Positive products x*y of two finite operand values -> (x, y) (small formats only)."""
    d = {}
    for x in _positive_values(fa):
        for y in _positive_values(fb):
            d.setdefault(x * y, (x, y))
    return d


@lru_cache(maxsize=None)
def _scale_products(fs: str) -> dict:
    vals = _positive_values(fs) if get_format(fs).nbits <= 16 else ()
    d = {}
    for x in vals:
        for y in vals:
            d.setdefault(x * y, (x, y))
    return d


class Realizer:
    """Operands (and block scales) for target products, in the device's formats."""

    def __init__(self, caps: Capabilities, K: int):
        self.caps = caps
        self.K = K
        self.fa = get_format(caps.a_format)
        self.fb = get_format(caps.b_format)
        self.small = self.fa.nbits <= 8 and self.fb.nbits <= 8
        self._memo: dict = {}
        self._bmemo: dict = {}

    # -- one product ---------------------------------------------------------------------
    def product(self, t) -> tuple | None:
        key = t if isinstance(t, tuple) else Fraction(t)
        if key not in self._memo:
            self._memo[key] = self._product(t)
        return self._memo[key]

    def _product(self, t) -> tuple | None:
        if isinstance(t, tuple):
            x, y = Fraction(t[0]), Fraction(t[1])
            if _representable(x, self.fa) and _representable(y, self.fb):
                return x, y
            if _representable(y, self.fa) and _representable(x, self.fb):
                return y, x
            return None
        t = Fraction(t)
        if t == 0:
            return Fraction(0), Fraction(1)
        neg = t < 0
        m = abs(t)
        if self.small:
            d = _pair_products(self.fa.name, self.fb.name)
            if m in d:
                x, y = d[m]
                return (-x if neg else x), y
            return None
        # odd significand M and exponent E: m = M * 2^E
        num, den = m.numerator, m.denominator
        tz = (num & -num).bit_length() - 1
        M = num >> tz
        E = tz - (den.bit_length() - 1)
        top = E + M.bit_length() - 1
        for fx, fy, swap in ((self.fa, self.fb, False), (self.fb, self.fa, True)):
            if M.bit_length() > fx.man_bits + 1:
                continue
            # y = 2^ey, x = m / y; ey near top/2 keeps both near 1
            lo = max(fy.emin - (fy.man_bits if fy.subnormals else 0), top - fx.emax)
            hi = min(fy.emax, top - fx.emin + fx.man_bits + 1 - M.bit_length())
            if lo > hi:
                continue
            ey = min(max(top // 2, lo), hi)
            for cand in (ey, lo, hi):
                y = pow2(cand)
                x = m / y
                if _representable(x, fx) and _representable(y, fy):
                    x = -x if neg else x
                    return (y, x) if swap else (x, y)
        # split M into two factors (narrow formats)
        pa, pb = self.fa.man_bits + 1, self.fb.man_bits + 1
        if M.bit_length() <= pa + pb and pa <= 12:
            for Ma in range(3, 1 << pa, 2):
                if M % Ma:
                    continue
                Mb = M // Ma
                if Mb.bit_length() > pb:
                    continue
                ta = top - (Mb.bit_length() - 1)
                for ex in (ta // 2, 0, ta):
                    x = Fraction(Ma) * pow2(ex - (Ma.bit_length() - 1))
                    y = m / x
                    if _representable(x, self.fa) and _representable(y, self.fb):
                        return (-x if neg else x), y
        return None

    # -- a whole vector -------------------------------------------------------------------
    def realize(self, terms: list, alpha=None, K: int | None = None, align: str = "right"):
        K = K or self.K
        n = len(terms)
        if n > K:
            return None
        off = K - n if align == "right" else 0
        a = np.zeros(K)
        b = np.zeros(K)
        if not self.caps.block_scaled:
            for i, t in enumerate(terms):
                r = self.product(t)
                if r is None:
                    return None
                a[off + i], b[off + i] = float(r[0]), float(r[1])
            return Operands(a, b, alpha=alpha)
        B = self.caps.block
        nb = K // B
        sa = np.ones(nb)
        sb = np.ones(nb)
        full = [Fraction(0)] * K
        for i, t in enumerate(terms):
            if isinstance(t, tuple):
                return None
            full[off + i] = Fraction(t)
        pe = _pair_products(self.fa.name, self.fb.name)
        sp = _scale_products(self.caps.scale_format)
        for blk in range(nb):
            ts = full[blk * B:(blk + 1) * B]
            nz = [t for t in ts if t != 0]
            if not nz:
                b[blk * B:(blk + 1) * B] = 1.0
                continue
            bkey = tuple(nz)
            if bkey not in self._bmemo:
                self._bmemo[bkey] = self._block_scale(nz, pe, sp)
            S = self._bmemo[bkey]
            if S is None:
                return None
            (xs, ys), Sv = S
            sa[blk], sb[blk] = float(xs), float(ys)
            for k in range(blk * B, (blk + 1) * B):
                t = full[k]
                if t == 0:
                    a[k], b[k] = 0.0, 1.0
                    continue
                x, y = pe[abs(t) / Sv]
                a[k] = float(-x if t < 0 else x)
                b[k] = float(y)
        return Operands(a, b, sa, sb, B, alpha)

    @staticmethod
    def _block_scale(nz, pe, sp):
        t0 = abs(nz[0])
        best = None
        for v in pe:
            S = t0 / v
            if S not in sp:
                continue
            if all(abs(t) / S in pe for t in nz[1:]):
                xs, ys = sp[S]
                score = abs(floor_log2(xs) - floor_log2(ys))
                if best is None or score < best[0]:
                    best = (score, (sp[S], S))
        return None if best is None else best[1]


@dataclass
class ProbeContext:
    caps: Capabilities
    K: int                         # probe length (K_core)
    realizer: Realizer = None
    acc_bits: tuple = (ACC_BITS_MIN, 23)   # plausible accumulator fraction bits (from survivors)
    fixed_k: bool = False          # per-shape inference: every probe has exactly K terms

    def __post_init__(self):
        if self.realizer is None:
            self.realizer = Realizer(self.caps, self.K)

    @property
    def fa(self):
        return get_format(self.caps.a_format)

    @property
    def fb(self):
        return get_format(self.caps.b_format)

    def prod_exp_range(self) -> tuple[int, int]:
        """Exponents of representable products (normal operands; scales included)."""
        lo = self.fa.emin + self.fb.emin
        hi = self.fa.emax + self.fb.emax + 1
        if self.caps.block_scaled:
            fs = get_format(self.caps.scale_format)
            lo += 2 * (fs.emin - (fs.man_bits if fs.subnormals else 0))
            hi += 2 * fs.emax + 1
        return lo, hi

    def bases(self, span: int) -> list[int]:
        """Exponents e0 such that [2^(e0-span), 2^(e0+1)] lies inside the product range,
        largest first (large values keep clear of any output lattice <= 1)."""
        lo, hi = self.prod_exp_range()
        cands = [min(hi - 2, 24), min(hi - 2, span + 2), 0]
        out = []
        for e in cands:
            if e - span >= lo + 1 and e <= hi - 2 and e not in out:
                out.append(e)
        return out or [min(max(0, lo + span + 1), hi - 2)]

    def make(self, terms, name, parameter, description, pattern="", alpha=None, align="right",
             spread=False):
        """A probe from terms; ``spread`` (block-scaled devices): one term per block, since
        one block scale cannot hold terms of very different magnitudes."""
        if spread and self.caps.block_scaled and len(terms) > 1:
            blk = self.caps.block
            sp = []
            for t in terms[:-1]:
                sp += [t] + [Fraction(0)] * (blk - 1)
            terms = sp + [terms[-1]]
        ops = self.realizer.realize(terms, alpha=alpha, align=align)
        if ops is None:
            return None
        return Probe(name, parameter, description, ops, pattern or _pattern(terms),
                     terms=tuple(terms) if alpha is None and align == "right" else None)


def _pattern(terms) -> str:
    def f(t):
        if isinstance(t, tuple):
            return f"({_fr(t[0])}*{_fr(t[1])})"
        return _fr(t)
    if len(terms) > 8:
        nz = [(i, t) for i, t in enumerate(terms) if not (not isinstance(t, tuple) and t == 0)]
        return f"{len(terms)} terms; " + ", ".join(f"[{i}]={f(t)}" for i, t in nz[:6]) + (
            " ..." if len(nz) > 6 else "")
    return "[" + ", ".join(f(t) for t in terms) + "]"


def _fr(x) -> str:
    x = Fraction(x)
    if x == 0:
        return "0"
    s = "-" if x < 0 else ""
    x = abs(x)
    e = floor_log2(x)
    m = x / pow2(e)
    return f"{s}2^{e}" if m == 1 else f"{s}{float(m):g}*2^{e}"


def _keep(ps):
    return [p for p in ps if p is not None]


_POOLS: dict = {}
_REALIZERS: dict = {}


def _term_value(t) -> Fraction:
    return Fraction(t[0]) * Fraction(t[1]) if isinstance(t, tuple) else Fraction(t)


def anchored(ctx: "ProbeContext", probes: list) -> list:
    """Narrow outputs hide the accumulator's low bits: each probe again with one more
    term, a power of two placed last, that puts the exact sum on a tie of the output
    format (half an output ulp above or below the sum's nearest output value).  The
    output's rounding then shows on which side of the tie each candidate's accumulator
    lands.  The anchor sits on a coarse grid (half an output ulp), which every accumulator
    of the grid holds exactly; the simulator predicts each candidate either way."""
    fo = get_format(ctx.caps.output)
    blk = ctx.caps.block if ctx.caps.block_scaled else None
    out = []
    for p in probes:
        if p.terms is None:
            continue
        S = sum((_term_value(t) for t in p.terms), Fraction(0))
        if S == 0:
            continue
        L0 = round_exact(S, fo, Mode.RNE)[0]
        if L0 == 0:
            continue  # below the output's range: no tie to sit on
        e = floor_log2(L0)
        h = pow2(e - fo.man_bits - 1)                  # half an ulp above |L0|
        below = h / 2 if L0 == pow2(e) else h          # half an ulp below |L0|
        sg = 1 if S > 0 else -1
        pad = [Fraction(0)] * (blk - 1) if blk else []  # the anchor in a block of its own
        for a, what in ((sg * h, "above"), (-sg * below, "below")):
            q = ctx.make(list(p.terms) + pad + [a], f"{p.name} @tie {what}", p.parameter,
                         p.description + f"; plus {_fr(a)}: the sum sits on a "
                         f"{fo.name} tie, so the output shows the accumulator's low bits")
            if q is not None:  # None: too long for K, or not realizable
                out.append(q)
    return out


def cached_pool(fn, ctx: "ProbeContext", *args) -> list:
    """Pools depend only on the formats, K and the accumulator range: build each once."""
    key = (fn.__name__, ctx.caps, ctx.K, ctx.acc_bits, ctx.fixed_k, args)
    if key not in _POOLS:
        if (ctx.caps, ctx.K) in _REALIZERS:
            ctx.realizer = _REALIZERS[(ctx.caps, ctx.K)]
        else:
            _REALIZERS[(ctx.caps, ctx.K)] = ctx.realizer
        pool = fn(ctx, *args)
        if get_format(ctx.caps.output).man_bits < ACC_BITS_MIN - 2 and fn in _ANCHORED:
            pool = pool + anchored(ctx, pool)
        _POOLS[key] = pool
    return _POOLS[key]


# --- pools ---------------------------------------------------------------------------------------
def output_pool(ctx: ProbeContext) -> list:
    """Ties and near-ties at the output precision: sums of <= 3 terms spanning <= 13 bits."""
    fo = get_format(ctx.caps.output)
    mo = fo.man_bits
    out = []
    if mo > ACC_BITS_MIN - 2:
        return out
    # every bit >= 2^0: no lattice of the grid (L <= 1) can move these sums
    bases = [e for e in ctx.bases(mo + 3) if e - mo - 2 >= 0] or ctx.bases(mo + 3)[:1]
    for e0 in bases:
        for odd in (False, True):
            base = [pow2(e0)] + ([pow2(e0 - mo)] if odd else [])
            for tail, what in ((pow2(e0 - mo - 1), "tie"), (3 * pow2(e0 - mo - 2), "above tie"),
                               (pow2(e0 - mo - 2), "below tie")):
                for s in (1, -1):
                    terms = [s * t for t in base] + [s * tail]
                    out.append(ctx.make(terms, f"output {what} {'odd' if odd else 'even'} "
                                        f"{'+' if s > 0 else '-'} e={e0}", "output_mode",
                                        f"exact sum {what} between two {fo.name} neighbours "
                                        f"({'odd' if odd else 'even'} lower neighbour)", spread=True))
    return _keep(out)


def lattice_pool(ctx: ProbeContext, kmax: int = 40) -> list:
    out = []
    for j in range(-2, kmax + 2):
        for c in (Fraction(1), Fraction(3, 2), Fraction(5, 4), Fraction(3, 4)):
            for s in (1, -1) if j % 3 == 0 else (1,):
                t = s * c * pow2(-j)
                out.append(ctx.make([t], f"lattice c={c} j={j}", "lattice",
                                    f"one exact term {_fr(t)}: survives only on a fine enough lattice"))
    return _keep(out)


def inner_pool(ctx: ProbeContext, gap_max: int = 56) -> list:
    """Two-term sums [c*2^e, t]: alignment (align), accumulator bits (acc) and their rounding."""
    out = []
    fa, fb = ctx.fa, ctx.fb
    wide = fa.man_bits + fb.man_bits + 2 > 24  # products wider than FP32
    for e0 in ctx.bases(min(gap_max, 40))[:2]:
        E = pow2(e0)
        firsts = [(E, "1"), (E * (2 - pow2(-(ACC_BITS_MIN - 1))), "carry")]
        for f, fname in firsts:
            for j in range(1, gap_max + 1):
                for m in (1, 3, 7):
                    for s1 in (1, -1):
                        for s2 in (1, -1):
                            if m == 7 and (s1 < 0 or j % 2):
                                continue
                            t2 = s2 * m * pow2(e0 - j)
                            out.append(ctx.make([s1 * f, t2], f"gap {fname} j={j} m={m} {s1:+d}{s2:+d}",
                                                "inner", f"{_fr(s1 * f)} then {_fr(t2)}: alignment / "
                                                "normalization of a term j bits below", spread=True))
        # a product whose significands multiply to >= 2 (1.5 * 1.5 = 2.25): its value's
        # exponent is one above the sum of its factors' exponents, so the alignment quantum
        # differs by one bit between align_ref VALUE and EXPONENT_SUM.  The small term goes
        # first: as the accumulator (F = 1) or in the same step (F >= 2) it meets the
        # product's exponent sum alike, so these probes do not depend on F.
        h = e0 // 2
        x, y = Fraction(3, 2) * pow2(h), Fraction(3, 2) * pow2(e0 - h)
        for j in range(1, gap_max + 1):
            for s1 in (1, -1):
                for s2 in (1, -1):
                    t2 = s2 * pow2(e0 + 1 - j)
                    out.append(ctx.make([t2, (s1 * x, y)], f"carry j={j} {s1:+d}{s2:+d}", "inner",
                                        f"{_fr(t2)} then {_fr(s1 * x)}*{_fr(y)}: the alignment's "
                                        "reference exponent (product value or exponent sum)",
                                        spread=True))
        # cancellation: 2^e - (2^e - 2^(e-j)) leaves 2^(e-j) if the alignment keeps j bits
        for j in range(2, gap_max + 1):
            for s in (1, -1):
                t2 = -s * (E - pow2(e0 - j))
                out.append(ctx.make([s * E, t2], f"cancel j={j} {s:+d}", "inner",
                                    f"{_fr(s * E)} + ({_fr(t2)}): catastrophic cancellation", spread=True))
    if wide:  # products that need more than 24 bits (FMA vs rounded products)
        u = pow2(-fa.man_bits)
        # k <= 11: the first term -(1 + 2^-k) is exact in every accumulator of the grid
        for k in range(2, min(fa.man_bits, ACC_BITS_MIN)):
            # x*y sits just below 1 + 2^-k: rounding the product lands on it, the exact
            # product is truncated below it by the alignment
            x = 1 + pow2(-k) + u
            y = 1 - u
            for pre in ([], [-(1 + pow2(-k))]):
                out.append(ctx.make(pre + [(x, y)], f"product-round k={k} {'diff' if pre else 'alone'}",
                                    "product_format", "a product just below a short value: "
                                    "rounded products land on it, exact ones do not"))
    return _keep(out)


def _isolate(terms: list, big_idx: list, blk: int | None, K: int) -> list:
    """Block-scaled operands: zero the small terms that share a block with a big one (one
    block scale cannot span both magnitudes).  Positions are right-aligned in K."""
    if not blk:
        return terms
    off = K - len(terms)
    blocks = {(off + i) // blk for i in big_idx}
    return [t if i in big_idx or (off + i) // blk not in blocks else Fraction(0)
            for i, t in enumerate(terms)]


def width_pool(ctx: ProbeContext, nmax: int = 256) -> list:
    """Runs of equal small terms around one big term (F, G, align), and in-step cancellation."""
    if ctx.caps.block_scaled:
        return _width_pool_blocked(ctx, nmax)
    out = []
    lo_p, hi_p = ctx.acc_bits
    ns = sorted({n for k in range(1, 9) for n in ((1 << k), (1 << k) + 1) if n <= nmax} | {3})
    for e0 in ctx.bases(hi_p + 6)[:1]:
        B = pow2(e0)
        js = sorted(set(range(max(2, lo_p - 1), hi_p + 6)))
        for n in ns:
            for j in js[::2] if n > 64 else js:
                for su in (1, -1, -2):
                    u = (1 if su != -1 else -1) * pow2(e0 - j)
                    Bs = -B if su == -2 else B  # -2: negative big term, positive small ones
                    out.append(ctx.make([Bs] + [u] * (n - 1), f"big-then-small n={n} j={j} {su:+d}",
                                        "fma_width/group_size",
                                        f"{_fr(Bs)} then {n - 1} x {_fr(u)}: how many small terms share "
                                        "a fused step or group with the big one"))
                    out.append(ctx.make([u] * (n - 1) + [Bs], f"small-then-big n={n} j={j} {su:+d}",
                                        "fma_width/group_size",
                                        f"{n - 1} x {_fr(u)} then 2^{e0}: small terms summed before "
                                        "the big one"))
        # in-step cancellation: [+B, s, -B] at distance d reveals F and W beyond p
        for d in ns:
            for j in range(max(2, lo_p - 1), hi_p + 8):
                s = pow2(e0 - j)
                terms = [B] + [Fraction(0)] * (d - 1) + [-B, s]
                out.append(ctx.make(terms, f"cancel-triple d={d} j={j}", "fma_width/align_bits",
                                    f"2^{e0}, -2^{e0} {d} apart, then {_fr(s)}"))
                terms = [B, s] + [Fraction(0)] * (d - 1) + [-B]
                out.append(ctx.make(terms, f"cancel-inner d={d} j={j}", "fma_width/align_bits",
                                    f"2^{e0}, {_fr(s)}, then -2^{e0} {d} later"))
    return _keep(out) + dense_pool(ctx, nmax)


def _width_pool_blocked(ctx: ProbeContext, nmax: int) -> list:
    """Block-scaled variant: big terms sit alone in their block."""
    out = []
    lo_p, hi_p = ctx.acc_bits
    blk = ctx.caps.block
    ns = sorted({n for k in range(1, 9) for n in ((1 << k), (1 << k) + 1, (1 << k) + blk) if n <= nmax + blk})
    for e0 in ctx.bases(hi_p + 6)[:1]:
        B = pow2(e0)
        for n in ns:
            for j in range(max(2, lo_p - 1), hi_p + 6):
                for su in (1, -1):
                    u = su * pow2(e0 - j)
                    t = _isolate([B] + [u] * (n - 1), [0], blk, ctx.K)
                    out.append(ctx.make(t, f"big-then-small n={n} j={j} {su:+d}", "fma_width/group_size",
                                        f"2^{e0} alone in its block, then small terms {_fr(u)}"))
                    t = _isolate([u] * (n - 1) + [B], [n - 1], blk, ctx.K)
                    out.append(ctx.make(t, f"small-then-big n={n} j={j} {su:+d}", "fma_width/group_size",
                                        f"small terms {_fr(u)}, then 2^{e0} alone in its block"))
        for d in ns:
            for j in range(max(2, lo_p - 1), hi_p + 8):
                s = pow2(e0 - j)
                for terms, big, nm in (([B] + [Fraction(0)] * (d - 1) + [-B] + [Fraction(0)] * (blk - 1) + [s],
                                        [0, d], "cancel-triple"),
                                       ([B] + [Fraction(0)] * (blk - 1) + [s] + [Fraction(0)] * (d - 1) + [-B],
                                        [0, blk + d], "cancel-inner")):
                    out.append(ctx.make(terms, f"{nm} d={d} j={j}", "fma_width/align_bits",
                                        f"2^{e0} and -2^{e0} with {_fr(s)}, each alone in its block"))
    return _keep(out) + dense_pool(ctx, nmax)


def dense_value(ctx: ProbeContext, e0: int) -> Fraction | None:
    """A realizable product c * 2^e0, c in [1, 2), with as many significant bits as possible."""
    fa, fb = ctx.fa, ctx.fb
    cands = []
    for ma in range(fa.man_bits, -1, -1):
        for mb in range(fb.man_bits, -1, -1):
            c = (2 - pow2(-ma)) * (2 - pow2(-mb)) / 2 if ma or mb else Fraction(1)
            if c >= 2:
                c /= 2
            cands.append(c)
    cands += [Fraction(9, 8), Fraction(3, 2), Fraction(1)]
    for c in cands:
        if ctx.realizer.product(c * pow2(e0)) is not None:
            return c
    return None


def _bits(c: Fraction) -> int:
    num, den = c.numerator, c.denominator
    return num.bit_length() - ((num & -num).bit_length() - 1)


def dense_pool(ctx: ProbeContext, nmax: int = 256) -> list:
    """Runs of many-bit terms at staggered exponents: their sums fill the accumulator's
    fraction bits, so its precision p and normalization rounding show."""
    out = []
    lo_p, hi_p = ctx.acc_bits
    for e0 in ctx.bases(hi_p + 4)[:1]:
        c = dense_value(ctx, e0)
        if c is None:
            continue
        for depth in sorted({lo_p, (lo_p + hi_p) // 2, hi_p, 12, 16, 20, 24}):
            offs = list(range(0, depth))  # every alignment position down to `depth`
            for n in (2, 3, 5, 9, 17, 33, 65, 129, 257):
                if n > nmax + 1:
                    continue
                for signs, sname in (((1,), "+"), ((1, 1, -1), "++-"), ((1, -1), "+-"), ((1,), "top+"),
                                     ((-1,), "top-")):
                    if sname.startswith("top"):  # mostly top-exponent terms: carries grow the sum
                        terms = [signs[0] * c * pow2(e0 - (0 if i % 8 else offs[-1 - (i // 8) % len(offs)]))
                                 for i in range(n)]
                    else:
                        terms = [signs[i % len(signs)] * c * pow2(e0 - offs[i % len(offs)]) for i in range(n)]
                    out.append(ctx.make(terms, f"dense n={n} {sname} depth={depth}", "acc_frac_bits/norm_mode",
                                        f"{n} terms of {_bits(c)} bits at exponents {e0}..{e0 - depth + 1}: "
                                        "sums that fill the accumulator"))
    return _keep(out)


def boundary_scan(ctx: ProbeContext, n: int, j: int, positions) -> list:
    """The group-boundary scan: one big term at position i among n-1 equal small terms."""
    out = []
    e0 = ctx.bases(j + 2)[0]
    B = pow2(e0)
    u = pow2(e0 - j)
    for i in positions:
        terms = [u] * n
        terms[i] = B
        terms = _isolate(terms, [i], ctx.caps.block, ctx.K)
        out.append(ctx.make(terms, f"scan n={n} i={i} j={j}", "group_size",
                            f"2^{e0} at position {i} among {n - 1} x {_fr(u)}"))
    return out


def long_pool(ctx: ProbeContext, nmin: int = 65) -> list:
    """Long runs (long groups G) and runs over all of K (split-K slices)."""
    out = []
    lo_p, hi_p = ctx.acc_bits
    ns = [n for n in (65, 96, 129, 192, 257, 384, 512, 513, 768, 1024, 1025, 1536, 2048, 2049, 3072, 4096)
          if nmin <= n <= ctx.K]
    blk = ctx.caps.block
    for e0 in ctx.bases(hi_p + 6)[:1]:
        for B in (pow2(e0), 3 * pow2(e0 - 1)):
            for n in ns:
                for j in (6, 9, lo_p, (lo_p + hi_p) // 2, hi_p, hi_p + 1, hi_p + 2, hi_p + 4, hi_p + 6):
                    for su in (1, -1, -2):
                        u = (1 if su != -1 else -1) * pow2(e0 - j)
                        Bs = -B if su == -2 else B  # -2: negative big term
                        t = _isolate([Bs] + [u] * (n - 1), [0], blk, ctx.K)
                        out.append(ctx.make(t, f"long big-then-small n={n} B={_fr(Bs)} j={j} {su:+d}",
                                            "group_size/split_k", f"{_fr(Bs)} then {n - 1} x {_fr(u)}"))
                        t = _isolate([u] * (n - 1) + [Bs], [n - 1], blk, ctx.K)
                        out.append(ctx.make(t, f"long small-then-big n={n} B={_fr(Bs)} j={j} {su:+d}",
                                            "group_size/split_k", f"{n - 1} x {_fr(u)} then {_fr(Bs)}"))
    # split-K slices scale with K, groups do not: the same runs at K/2 and K/4
    for Kx in (() if ctx.fixed_k else (ctx.K // 2, ctx.K // 4)):
        if Kx < 64 or Kx % ctx.caps.k_step():
            continue
        e0 = ctx.bases(hi_p + 6)[0]
        for n in (Kx // 4 + 1, Kx // 2 + 1, Kx):
            for j in (9, hi_p, hi_p + 2, hi_p + 4, hi_p + 6):
                for sb in (1, -1):
                    u = pow2(e0 - j)
                    B = sb * pow2(e0)
                    for t, nm in ((_isolate([u] * (n - 1) + [B], [n - 1], blk, Kx), "small-then-big"),
                                  (_isolate([B] + [u] * (n - 1), [0], blk, Kx), "big-then-small")):
                        ops = ctx.realizer.realize(t, K=Kx)
                        if ops is not None:
                            out.append(Probe(f"long K={Kx} {nm} n={n} j={j} {sb:+d}", "split_k",
                                             f"K={Kx}: {nm}, big {_fr(B)}, small {_fr(u)}", ops, _pattern(t)))
    # big terms at slice-sized positions with cancellation
    K = ctx.K
    e0 = ctx.bases(hi_p + 6)[0]
    B = pow2(e0)
    for S in (2, 4, 8, 16):
        if K % S or K // S < 2:
            continue
        ks = K // S
        for j in (hi_p - 2, hi_p + 2):
            s = pow2(e0 - j)
            terms = [Fraction(0)] * K
            terms[ks - 1] = B
            terms[ks] = s
            terms[K - 1] = -B
            out.append(ctx.make(terms, f"slice-cancel S={S} j={j}", "split_k",
                                f"2^{e0} at {ks - 1}, {_fr(s)} at {ks}, -2^{e0} at {K - 1}", align="left"))
            terms = [Fraction(0)] * K
            terms[0] = s
            terms[ks] = B
            terms[K - 1] = -B
            out.append(ctx.make(terms, f"slice-first S={S} j={j}", "split_k",
                                f"{_fr(s)} at 0, 2^{e0} at {ks}, -2^{e0} at {K - 1}", align="left"))
    return _keep(out)


def subnormal_pool(ctx: ProbeContext) -> list:
    out = []
    for d in range(1, 30, 2):
        for c in (Fraction(1), Fraction(3, 2)):
            t = c * pow2(-126 - d)
            out.append(ctx.make([t], f"subnormal d={d} c={c}", "acc_subnormal",
                                f"one term {_fr(t)} below FP32's smallest normal"))
            out.append(ctx.make([pow2(-125), -pow2(-125) + t], f"subnormal-diff d={d} c={c}",
                                "acc_subnormal", "difference of two normals that lands below 2^-126",
                                spread=True))
    # subnormal operands (inputs): the product itself is normal
    fa = ctx.fa
    if fa.subnormals and fa.min_subnormal is not None and not ctx.caps.block_scaled:
        x = fa.min_subnormal * 3 if fa.man_bits >= 2 else fa.min_subnormal
        y = pow2(-floor_log2(x))
        if _representable(y, ctx.fb):
            out.append(ctx.make([(x, y)], "subnormal input", "input_subnormal",
                                f"a subnormal operand {_fr(x)} times {_fr(y)}"))
    return _keep(out)


def alpha_pool(ctx: ProbeContext, seed: int = 7) -> list:
    """Accumulator value c = 2^e0 (1 + m 2^-9) (exact in every accumulator of the grid)
    times per-tensor / per-row factors whose product is inexact in FP32.  Narrow outputs
    round away the FP32 steps that tell the alpha modes apart unless c * alpha sits near an
    output tie: there the second factor is aimed at a tie, and the pool keeps the probes on
    which the four modes (simulated on an exact accumulator) disagree."""
    rng = np.random.default_rng(seed)
    fo = get_format(ctx.caps.output)
    narrow = fo.man_bits < 23
    out = []
    e0 = ctx.bases(12)[0]
    for i in range(2000 if narrow else 48):
        sa = float(np.float32(rng.uniform(0.5, 2.0)))
        sb = float(np.float32(rng.uniform(0.5, 2.0)))
        if i % 4 == 0:
            sb = float(np.float32(1 + 2.0 ** -23 * int(rng.integers(1, 64))))
        m = int(rng.integers(1, 1 << 7)) * 2 + 1
        c = pow2(e0) * (1 + m * pow2(-9))
        if narrow:  # c * sa * sb a few FP32 ulps from a tie of the output format
            v = float(c) * sa
            t = (np.floor(v / 2.0 ** (floor_log2(Fraction(v)) - fo.man_bits)) + 0.5) \
                * 2.0 ** (floor_log2(Fraction(v)) - fo.man_bits)
            sb = float(np.float32(t / v))
            sb = float(np.nextafter(np.float32(sb), np.float32(np.inf if rng.integers(2) else 0),
                                    dtype=np.float32)) if i % 3 else sb
        out.append(ctx.make([pow2(e0), m * pow2(e0 - 9)], f"alpha {i}", "alpha_mode",
                            "per-tensor / per-row factors whose product is inexact in FP32",
                            alpha=(sa, sb), spread=True))
    out = _keep(out)
    if narrow and out:
        from reference.gemm import AlphaMode, GemmModel
        from .sim import simulate
        ms = [GemmModel("alpha", output=ctx.caps.output, alpha_mode=a) for a in AlphaMode]
        ops = [p.ops for p in out]
        keys = np.asarray(simulate([m for m in ms for _ in ops], ops * len(ms))).reshape(len(ms), -1)
        split = (keys != keys[:1]).any(0)
        out = [p for p, s_ in zip(out, split) if s_][:48]
    return out


def random_pool(ctx: ProbeContext, n: int, seed: int, kind: str = "mixed", K: int | None = None) -> list:
    """Random dot products over the operand formats (checks and determinism)."""
    from .validate import random_operands
    rng = np.random.default_rng(seed)
    K = K or ctx.K
    out = []
    for i in range(n):
        k = ("normal", "heavy", "cancel")[i % 3] if kind == "mixed" else kind
        a, b, sa, sb = random_operands(ctx.caps, 1, 1, K, rng, k)
        ops = Operands(a[0], b[:, 0], None if sa is None else sa[0], None if sb is None else sb[:, 0],
                       ctx.caps.block, None)
        out.append(Probe(f"random {kind} {i}", "check", f"random {kind} operands, K={K}", ops,
                         f"random {kind}"))
    return out


# pools whose probes narrow outputs need anchored (the long and alpha pools' probes already
# differ by whole output ulps; anchoring long probes would cost seconds to realize)
_ANCHORED = (lattice_pool, inner_pool, width_pool, subnormal_pool)


# --- Blackwell hypotheses (issue 17): crafted from the formats' parameters -----------------------
def _bw_probe(caps, K: int, terms, name: str, desc: str) -> "Probe":
    """terms: (position, a, b, sa, sb); a block's scales are those of its first term
    (other blocks: scale 1)."""
    a = np.zeros(K)
    b = np.zeros(K)
    nb = K // caps.block
    sa = np.ones(nb)
    sb = np.ones(nb)
    seen = set()
    for k, x, y, s, t in terms:
        a[k], b[k] = float(x), float(y)
        blk = k // caps.block
        if blk not in seen:
            sa[blk], sb[blk] = float(s), float(t)
            seen.add(blk)
    return Probe(name, "blackwell", desc, Operands(a, b, sa, sb, caps.block, None), "blackwell")


def blackwell_pool(ctx: ProbeContext, K: int = 256) -> list:
    """Cancellation of the largest products past a tiny one, and big + small terms at every
    gap 2^-10 .. 2^-45 (odd significands, both signs) inside one exact group, across groups
    of one instruction and across instructions: they tell instruction K, exact group size,
    alignment reference, fused-add width, truncation vs rounding and per-instruction
    rounding apart (docs/blackwell.md tabulates the predictions); then the families that
    keep a big term, pair small terms, aim at FP32 ties and carries, and put an instruction's
    result among the FP32 subnormals (_bw_keep, _bw_pair, _bw_tie, _bw_carry, _bw_subnormal)."""
    caps = ctx.caps
    fa, fb, fs = ctx.fa, ctx.fb, get_format(caps.scale_format)
    B = caps.block
    amax, bmax, smax = fa.max_finite, fb.max_finite, fs.max_finite
    amin = fa.min_subnormal if fa.subnormals else fa.min_normal
    bmin = fb.min_subnormal if fb.subnormals else fb.min_normal
    smins = [fs.min_normal] + ([fs.min_subnormal] if fs.subnormals else [])
    out = []
    for smin in smins:
        for pos in sorted({2 * B, 3 * B, 64, 64 + B, K - B}):
            out.append(_bw_probe(caps, K, [(0, amax, bmax, smax, smax), (B, -amax, bmax, smax, smax),
                                           (pos, amin, bmin, smin, smin)], f"bw cancel {_fr(smin)}@{pos}",
                                 f"+{_fr(amax * bmax * smax * smax)}, its negation, then a tiny product "
                                 f"with scales {_fr(smin)} at k={pos}"))
    odd = [v for v in _positive_values(caps.a_format) if v.numerator % 3 == 0] or [fa.min_normal]
    x = odd[0]  # a significand 1.5: 3 * 2^k exposes round-to-nearest
    s_exps = sorted({floor_log2(v) for v in _positive_values(caps.scale_format) if v == pow2(floor_log2(v))})
    top = min(s_exps[-1], 8)
    S = pow2(top)
    for gap in range(10, 46):
        e_small = 2 * top - gap  # +-big cancel exactly; what is left of 1.5 * 2^e_small?
        e1 = max(s_exps[0], e_small - top)
        e2 = e_small - e1
        if e2 not in s_exps:
            continue
        for (ea, eb) in ((1, 1), (amax, bmax)):
            # (-big, small) positions: same or other exact group / instruction / split-K slice,
            # the small term before or after the cancelling one
            for p1, p2 in ((16, 32), (16, 48), (32, 48), (64, 80), (64, 96), (64, 128), (64, 16),
                           (64, 32), (128, 16), (128, 64), (144, 128), (192, 160)):
                if max(p1, p2) >= K or p2 // B in (0, p1 // B):
                    continue
                for sgn in (1, -1):
                    out.append(_bw_probe(caps, K, [(0, ea, eb, S, S), (p1, -ea, eb, S, S),
                                                   (p2, sgn * x, 1, pow2(e1), pow2(e2))],
                                         f"bw gap {gap} {_fr(ea * eb)}@0,{p1} {'+-'[sgn < 0]}@{p2}",
                                         f"+-{_fr(ea * eb)}*2^{2 * top} at k=0,{p1} cancel; "
                                         f"{'-' if sgn < 0 else ''}{_fr(x)}*2^{e_small} at k={p2}"))
    kept = _keep(_bw_keep(caps, K) + _bw_wide(caps, K) + _bw_tie(caps, K) + _bw_round(caps, K)
                 + _bw_carry(caps, K))
    return _keep(out + kept + [t for p in kept for t in _bw_tails(caps, K, p)] + _bw_pair(caps, K)
                 + _bw_subnormal(caps, K))


def _bw_tails(caps, K, p) -> list:
    """The probe moved (blocks and scales with it) so that its last term sits in the last
    instruction of K 64, or of K 32: with a width below 23 bits every later instruction
    re-aligns C and could hide how the decisive instruction rounded."""
    o = p.ops
    last = int(np.nonzero(o.a * o.b)[0].max())
    out, seen = [], set()
    for step in (64, 32):
        s = (K - step) - step * (last // step)
        if s <= 0 or s % o.block or s in seen:
            continue
        seen.add(s)
        ops = Operands(np.roll(o.a, s), np.roll(o.b, s), np.roll(o.scales_a, s // o.block),
                       np.roll(o.scales_b, s // o.block), o.block, o.alpha)
        out.append(Probe(f"{p.name} >>{s}", p.parameter, f"{p.description}; all moved {s} later", ops, p.pattern))
    return out


class _BwValues:
    """Target products -> (a, b, scale_a, scale_b) from the formats' own values: the
    element pair and two power-of-two scales whose product is the target (None if the
    formats cannot make it)."""

    def __init__(self, caps):
        self.by_product = _pair_products(caps.a_format, caps.b_format)
        self.pairs = sorted(self.by_product.items())
        self.s_exps = sorted({floor_log2(v) for v in _positive_values(caps.scale_format)
                              if v == pow2(floor_log2(v))})
        self.top = min(self.s_exps[-1], 8)  # big terms at scale 2^top: FP32 ulps >= 1/1024 there

    def make_in(self, k: int, v: Fraction, sa: Fraction, sb: Fraction):
        """v with the given block scales (the elements carry the rest), or None."""
        sgn = -1 if v < 0 else 1
        xy = self.by_product.get(abs(Fraction(v)) / (sa * sb))
        return None if xy is None else (k, sgn * xy[0], xy[1], sa, sb)

    def make(self, k: int, v: Fraction, big: bool = False):
        """``big``: the largest element product that works (room below it in the block)."""
        s = -1 if v < 0 else 1
        v = abs(Fraction(v))
        for prod, (x, y) in (reversed(self.pairs) if big else self.pairs):
            r = v / prod
            e = floor_log2(r)
            if r != pow2(e):
                continue
            e1 = min(max(e - self.s_exps[-1], e // 2), self.s_exps[-1])  # as balanced as the range allows
            if e1 in self.s_exps and e - e1 in self.s_exps:
                return (k, s * x, y, pow2(e1), pow2(e - e1))
        return None


def _bw_terms(caps, K, vals: _BwValues, placed, name, desc):
    """A probe from (k, value) pairs, or None when a value cannot be made or two terms
    of different scales would share a block (a block has one scale pair)."""
    terms = [vals.make(k, v) for k, v in placed]
    if None in terms or any(k >= K for k, _ in placed):
        return None
    scales = {}
    for k, _, _, sa, sb in terms:
        if scales.setdefault(k // caps.block, (sa, sb)) != (sa, sb):
            return None
    return _bw_probe(caps, K, terms, name, desc)


def _bw_positions(caps, K):
    """Where a second term goes relative to a term at k=0: the next block (same exact run or
    instruction for some candidates), the next instructions of K 32 / 64, the split-K slices."""
    B = caps.block
    return sorted({p for p in (B, 2 * B, 48, 64, 96, 128, 192) if p < K and p % B == 0})


def _bw_keep(caps, K) -> list:
    """A big term 1.5*2^E that stays, plus 1.5*2^(E-gap) after it, gap 1..45: the small
    term's last bits meet the fused-add width, its rounding and the per-instruction
    rounding to FP32 (0.75 ulp at gap 24); E is high enough that an FP32 ulp of the result
    survives a 1/1024 lattice."""
    vals = _BwValues(caps)
    E = 2 * vals.top
    out = []
    for gap in range(1, 46):
        for p in _bw_positions(caps, K):
            for sgn in (1, -1):
                small = sgn * Fraction(3, 2) * pow2(E - gap)
                out.append(_bw_terms(caps, K, vals, [(0, Fraction(3, 2) * pow2(E)), (p, small)],
                                     f"bw keep gap {gap} {'+-'[sgn < 0]}@{p}",
                                     f"1.5*2^{E} at k=0 stays; {_fr(small)} at k={p}"))
    return out


def _bw_wide(caps, K) -> list:
    """n copies of the largest element product in block 0 (an exact run's value then sits
    up to log2(n * amax * bmax) binades above its scales' exponent sum, the alignment point
    under scale-exponent alignment), plus 1.5*2^(E-gap) later: a run sum wider than the
    fused-add width, so the per-instruction rounding cuts bits the width kept."""
    vals = _BwValues(caps)
    fa, fb = get_format(caps.a_format), get_format(caps.b_format)
    S = pow2(vals.top)
    E = 2 * vals.top
    pos = [p for p in _bw_positions(caps, K) if p in (caps.block, 2 * caps.block, 64, 128)]
    out = []
    for n in sorted({1, 3, caps.block}):
        head = [(i, fa.max_finite, fb.max_finite, S, S) for i in range(n)]
        for gap in range(1, 46):
            for p in pos:
                for sgn in (1, -1):
                    small = vals.make(p, sgn * Fraction(3, 2) * pow2(E - gap))
                    if small is None:
                        continue
                    out.append(_bw_probe(caps, K, head + [small], f"bw wide n={n} gap {gap} {'+-'[sgn < 0]}@{p}",
                                         f"{n} x {_fr(fa.max_finite * fb.max_finite * S * S)} in block 0; "
                                         f"{_fr(sgn * Fraction(3, 2) * pow2(E - gap))} at k={p}"))
    return out


def _bw_pair(caps, K) -> list:
    """A big term (kept, or cancelled by its negation in the same block) fixes the alignment
    step q; two equal small terms 1.5*2^(E-gap) in two later blocks: an exact group holding
    both rounds 3 of their units at q once, separate addends round each 1.5 (exact group
    size under scale-exponent alignment, where both ways share q)."""
    vals = _BwValues(caps)
    E = 2 * vals.top
    pos = _bw_positions(caps, K)
    out = []
    for gap in range(8, 46):
        for cancel in (False, True):
            # the cancelling pair shares block 0: every later block is free for the small terms
            head = [(0, Fraction(3, 2) * pow2(E))] + ([(1, -Fraction(3, 2) * pow2(E))] if cancel else [])
            for p1, p2 in ((a, b) for a in pos for b in pos if a < b and b - a <= 64):
                for sgn in (1, -1):
                    small = sgn * Fraction(3, 2) * pow2(E - gap)
                    out.append(_bw_terms(caps, K, vals, head + [(p1, small), (p2, small)],
                                         f"bw pair gap {gap} {'cancel ' if cancel else ''}{'+-'[sgn < 0]}@{p1},{p2}",
                                         f"1.5*2^{E} at k=0{' and its negation' if cancel else ''}; "
                                         f"{_fr(small)} at k={p1} and k={p2}"))
    return out


def _bw_tie(caps, K) -> list:
    """C = 1.5*2^E (+ its last FP32 bit, so that a tie rounds up under RNE), then half an
    FP32 ulp of C plus a tiny term 2^-j below it, in the half-ulp's block or another: a
    fused add that keeps the tiny term's bits rounds off the tie, one that cuts them rounds
    the tie to even (the fused-add width seen through round-to-nearest per instruction)."""
    vals = _BwValues(caps)
    E = 2 * vals.top
    m = get_format("float32").man_bits
    pos = _bw_positions(caps, K)
    out = []
    for odd in (False, True):
        head = [(0, Fraction(3, 2) * pow2(E))] + ([(pos[0], pow2(E - m))] if odd else [])
        if _bw_terms(caps, K, vals, head, "", "") is None:
            continue
        for ph in pos[odd:]:
            h = vals.make(ph, pow2(E - m - 1), big=True)
            if h is None:
                continue
            for j in range(1, 24):
                for sgn in (1, -1):
                    tv = sgn * pow2(E - m - 1 - j)
                    for pt in (ph + 1,) + tuple(p for p in pos if p > ph):
                        t = vals.make_in(pt, tv, h[3], h[4]) if pt == ph + 1 else vals.make(pt, tv)
                        if t is None or (pt != ph + 1 and pt // caps.block == ph // caps.block):
                            continue
                        terms = [vals.make(k, v) for k, v in head] + [h, t]
                        out.append(_bw_probe(caps, K, terms, f"bw tie j={j} {'odd ' if odd else ''}"
                                             f"{'+-'[sgn < 0]}@{ph},{pt}",
                                             f"C=1.5*2^{E}{' + 2^' + str(E - m) if odd else ''}; half an ulp "
                                             f"2^{E - m - 1} at k={ph}, {_fr(tv)} at k={pt}"))
    return out


def _bw_round(caps, K) -> list:
    """C = 1.5*2^E (last FP32 bit even or odd), then m/32 of C's FP32 ulp (m = 1..31) as one
    exact run in a later block, a product per binary digit: a fused add that keeps 24..28
    bits rounds m/32 once, a narrower one first to a coarser step and then again to FP32
    (double rounding: the width seen through RNE per instruction)."""
    vals = _BwValues(caps)
    E = 2 * vals.top
    ulp = pow2(E - get_format("float32").man_bits)
    pos = [p for p in _bw_positions(caps, K) if p in (caps.block, 64, 128)]
    out = []
    for odd in (False, True):
        head = [(0, Fraction(3, 2) * pow2(E))] + ([(pos[-1] + caps.block, ulp)] if odd else [])
        if _bw_terms(caps, K, vals, head, "", "") is None:
            continue
        for ph in pos:
            top = vals.make(ph, ulp / 2, big=True)
            if top is None:
                continue
            for m in range(1, 32):
                for sgn in (1, -1):
                    digits = [sgn * ulp * pow2(i - 5) for i in range(5) if m >> i & 1]
                    run = [vals.make_in(ph + i, d, top[3], top[4]) for i, d in enumerate(digits)]
                    if None in run:
                        continue
                    out.append(_bw_probe(caps, K, [vals.make(k, v) for k, v in head] + run,
                                         f"bw round m={m}/32 {'odd ' if odd else ''}{'+-'[sgn < 0]}@{ph}",
                                         f"C=1.5*2^{E}{' + 1 ulp' if odd else ''}; {'-' if sgn < 0 else ''}"
                                         f"{m}/32 ulp as one run at k={ph}"))
    return out


def _bw_carry(caps, K) -> list:
    """1.5*2^E at k=0, a small 1.5*2^(E-g) later, then n more 1.5*2^E in one block: the sum
    carries one or two binades past the largest addend, so with a fused-add width of at
    most 23 bits the per-instruction rounding to FP32 still cuts a set bit (a tie or more)."""
    vals = _BwValues(caps)
    E = 2 * vals.top
    pos = _bw_positions(caps, K)
    out = []
    for g in range(18, 27):
        for n in (1, 2, 3):
            for ps, pb in ((a, b) for a in pos for b in pos if a < b):
                for sgn in (1, -1):
                    big = [(pb + i, sgn * Fraction(3, 2) * pow2(E)) for i in range(n)]
                    placed = [(0, sgn * Fraction(3, 2) * pow2(E)), (ps, sgn * Fraction(3, 2) * pow2(E - g))] + big
                    out.append(_bw_terms(caps, K, vals, placed, f"bw carry g={g} n={n} @{ps},{pb} {'+-'[sgn < 0]}",
                                         f"{'-' if sgn < 0 else ''}1.5*2^{E} at k=0, 1.5*2^{E - g} at k={ps}, "
                                         f"{n} x 1.5*2^{E} from k={pb}"))
    return out


def _bw_subnormal(caps, K) -> list:
    """Products whose instruction result is an FP32 subnormal and inexact (scales near the
    scale format's smallest): alone, after a cancelling pair of normal terms, and split
    over two instructions.  Only for scale formats that reach that far (ue8m0)."""
    vals = _BwValues(caps)
    emin32 = get_format("float32").emin
    mant32 = get_format("float32").man_bits
    out = []
    big = pow2(emin32 + 2)
    for d in range(mant32 - 3, mant32 + 6):  # c * 2^(emin-d): the last FP32 subnormal bits
        for c in (Fraction(3, 2), Fraction(9, 4)):
            t = c * pow2(emin32 - d)
            for sgn in (1, -1):
                st = sgn * t
                tag = f"d={d} c={c} {'+-'[sgn < 0]}"
                for p in (0,) + tuple(_bw_positions(caps, K)):
                    out.append(_bw_terms(caps, K, vals, [(p, st)], f"bw subnormal {tag} @{p}",
                                         f"one product {_fr(st)} at k={p}: an inexact FP32 subnormal"))
                for p in _bw_positions(caps, K)[1:]:
                    out.append(_bw_terms(caps, K, vals, [(0, big), (caps.block, -big), (p, st)],
                                         f"bw subnormal-cancel {tag} @{p}",
                                         f"+-{_fr(big)} cancel at k=0,{caps.block}; {_fr(st)} at k={p}"))
                    out.append(_bw_terms(caps, K, vals, [(0, st), (p, st)], f"bw subnormal-twice {tag} @0,{p}",
                                         f"{_fr(st)} at k=0 and at k={p}: each instruction rounds it"))
    return out
