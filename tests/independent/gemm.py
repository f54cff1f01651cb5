"""The fused-alignment GEMM family of SPEC 4, on integer pairs.

Parameters (our names): F products per fused step together with the running accumulator;
W: None = the step's terms summed exactly, else every term is rounded (align_mode, on its
magnitude) to a multiple of 2**(Emax - W), Emax the largest floor(log2|t|) among the step's
non-zero terms (accumulator included; ``align_ref='esum'``: a product's exponent is
floor(log2|a|) + floor(log2|b|) instead), then summed exactly; the sum is normalized once to
acc_bits fraction bits (FP32 exponent range, subnormals kept) with norm_mode. G: None = one
accumulator for all of K; else every G products the partial sum is added (outer_mode) into
a separate FP32 accumulator and the inner one restarts from +0 (SPEC's promotion interval P
and block-scaled group size G are the same cut in this family). Then the lattice (multiples
of 2**lattice_exp, RNE), then alpha (the per-tensor factors multiplied together in FP32 RNE,
then one multiply rounded into the output format), then output rounding.

Our readings: accumulators start at +0; an exact zero step sum is -0 only when every term
is -0 (IEEE addition extended to F terms), or -0 in RDN; NaN if any product is NaN or
+inf and -inf meet; an accumulator overflowing follows IEEE for its rounding mode.
Block scales (scale point 'product'): each product is a_k * b_k * sa * sb, exact.
"""
from __future__ import annotations

from dataclasses import dataclass

from . import f32
from .formats import fmt_of
from .num import (NAN, V, ZERO, cmp_abs, exact_sum, fin, flog2, mul, overflow_stops_at_max,
                  round_at, round_float)


@dataclass(frozen=True)
class Model:
    F: int = 1
    W: int | None = None
    align_mode: str = "rtz"
    align_ref: str = "value"          # value | esum
    acc_bits: int = 23
    norm_mode: str = "rne"
    G: int | None = None
    outer_mode: str = "rne"
    lattice_exp: int | None = None
    out: str = "float32"
    out_mode: str = "rne"


NAMED = {
    "exact": Model(F=1 << 30),
    "fp32_sequential": Model(F=1),
    "probe_matched": Model(F=64, G=64, outer_mode="rtz"),
    "probe_matched_lattice": Model(F=64, G=64, outer_mode="rtz", lattice_exp=-10),
}


def acc_round(v: V, bits: int, mode: str) -> V:
    """Normalize into a float of FP32's exponent range with ``bits`` fraction bits."""
    if v.kind != "f":
        return v
    r = round_float(v, bits + 1, -126, mode)
    top = fin(False, (1 << (bits + 1)) - 1, 127 - bits)
    if r.m and cmp_abs(r, top) > 0:
        toward_zero = overflow_stops_at_max(mode, v.neg)
        return fin(v.neg, top.m, top.e) if toward_zero else V("inf", v.neg)
    return r


def special_sum(terms):
    """NaN / inf result of a step with specials, else None."""
    if any(t.kind == "nan" for t in terms):
        return NAN
    infs = {t.neg for t in terms if t.kind == "inf"}
    if len(infs) == 2:
        return NAN
    return V("inf", infs.pop()) if infs else None


def fused_step(m: Model, acc: V, prods, exps):
    terms = [acc] + list(prods)
    sp = special_sum(terms)
    if sp is not None:
        return sp
    zero_neg = all(t.neg for t in terms) or m.norm_mode == "rdn"
    if m.W is not None:
        texps = [flog2(acc) if acc.m else None] + list(exps)
        live = [x for x, t in zip(texps, terms) if t.m]
        if live:
            q = max(live) - m.W
            terms = [round_at(t, q, m.align_mode) for t in terms]
    return acc_round(exact_sum(terms, zero_neg), m.acc_bits, m.norm_mode)


def products(a, b, scales_a=None, scales_b=None, block=None):
    ps, ex = [], []
    for k, (x, y) in enumerate(zip(a, b)):
        p = mul(x, y)
        if scales_a is not None:
            p = mul(mul(p, scales_a[k // block]), scales_b[k // block])
        ps.append(p)
        ok = x.kind == y.kind == "f" and x.m and y.m
        ex.append(flog2(x) + flog2(y) if ok else (flog2(p) if p.kind == "f" and p.m else None))
    return ps, ex


def accumulate(m: Model, ps, ex):
    esum = m.align_ref == "esum"
    G = m.G or max(1, len(ps))
    total = None
    for g0 in range(0, max(1, len(ps)), G):
        acc = ZERO
        for s0 in range(g0, min(g0 + G, len(ps)), m.F):
            s1 = min(s0 + m.F, g0 + G, len(ps))
            exps = [ex[k] if esum else (flog2(ps[k]) if ps[k].kind == "f" and ps[k].m else None)
                    for k in range(s0, s1)]
            acc = fused_step(m, acc, ps[s0:s1], exps)
        total = acc if m.G is None else f32.add(total or ZERO, acc, m.outer_mode)
    return total


def dot(m: Model, a, b, scales_a=None, scales_b=None, block=None, alpha=None) -> V:
    ps, ex = products(a, b, scales_a, scales_b, block)
    c = accumulate(m, ps, ex)
    if m.lattice_exp is not None and c.kind == "f":
        c = round_at(c, m.lattice_exp, "rne")
    out = fmt_of(m.out)
    if alpha:
        al = alpha[0]
        for x in alpha[1:]:
            al = f32.mul(al, x)
        return f32.mul(c, al, m.out_mode, out)
    return f32.rnd(c, m.out_mode, out)
