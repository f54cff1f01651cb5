"""GEMM accumulation models (SPEC section 4), in exact arithmetic.

One model is one frozen ``GemmModel`` record: a point of the parameterized
family.  ``dot`` computes one output element of a (block-scaled) GEMM under a
model; every intermediate is an exact rational rounded by the reference
rounding core at exactly the points the model names.

Evaluation order of one output c = sum_k a_k * b_k (optional block scales):

1. products p_k = a_k * b_k, exact (or rounded to ``product_format``); with
   block scales and scale_point PRODUCT, p_k *= sa[k // B] * sb[k // B] (exact).
2. K is cut into ``split_k`` contiguous slices, each reduced by steps 3-4,
   then the slice results are added in order with FP32 RNE.  Slices are equal
   (K a multiple of split_k), or with ``split_tile`` T each slice but the last
   holds ceil(K / split_k) rounded up to a multiple of T (cuBLAS split-K on the
   H200: K = 4096 as 3 slices of 1408, 1408, 1280); see ``split_bounds``.
3. A slice is cut into groups of ``group_size`` products (the promotion
   interval P of FP8 GEMMs, or the group G of block-scaled GEMMs).  Each group
   starts from a zero inner accumulator and consumes ``fma_width`` products per
   fused step (4).  The group partial (times the block scales if scale_point is
   GROUP, rounded FP32 RNE) is added into the FP32 outer accumulator with
   ``outer_mode`` (cross-group rounding), in physical order.
4. Fused step: terms = {accumulator} + F products.  With ``align_bits`` = None
   the terms are summed exactly; otherwise each term is rounded (``align_mode``)
   to a multiple of 2**(emax - align_bits), emax = the largest exponent over the
   non-zero terms (accumulator included).  A term's exponent is floor(log2|t|)
   (``align_ref`` VALUE), or for a product the sum of its factors' exponents
   floor(log2|a|) + floor(log2|b|) (+ block scales'), as a multiplier array sees it
   before normalizing the significand product (``align_ref`` EXPONENT_SUM: one less
   than the value's exponent when that product is >= 2; Hopper tensor cores).  The sum is then normalized once:
   rounded with ``norm_mode`` to a float with ``acc_frac_bits`` fraction bits and
   FP32's exponent range (IEEE overflow, subnormals per ``acc_subnormal``).
   Blackwell MMA family (issue 17; docs/blackwell.md): ``exact_group`` E sums each run
   of E products of a fused step exactly first, so the step's addends are C and the
   E-sums (an exact zero sum is -0 only when every product is -0); ``align_ref``
   SCALE_EXPONENT_SUM takes every addend's exponent from the operand formats
   (``exp_formats``): a subnormal or zero factor enters with its format's minimum normal
   exponent, zero addends count, a product's exponent is the sum of its factors'
   (elements and block scales), an E-sum's the sum of its scales' (the largest over the
   blocks it spans), and the accumulator's is max(floor(log2|acc|), -126).  With
   ``overflow_inf`` a fused sum of magnitude >= 2^128 is +-Inf whatever ``norm_mode``.
   ``chain``: each group (one MMA instruction of ``group_size`` K) starts from the FP32
   outer accumulator (C of the instruction) instead of zero, and its result becomes the
   outer accumulator (rounded to FP32 with ``outer_mode``): no separate cross-group add.
   ``dot(..., c=)`` gives that accumulator's initial value.
5. Lattice: c = L * RNE(c / L) when ``lattice`` is set.
6. alpha (per-tensor or per-row/column scales): ``alpha_mode`` says how the
   factors meet the accumulator (one rounding, FP32-premultiplied, or one FP32
   rounding per factor in order or in reverse order).
7. Output: rounded to ``output`` with ``output_mode`` (IEEE overflow).

Special values follow IEEE: any NaN product, inf * 0, or infinities of both
signs give NaN; otherwise an infinite product gives that infinity.  An exactly
zero sum (fused step, cross-group or split-K add) is -0 when all its terms are
-0, +0 when all are +0, and otherwise +0, or -0 under RDN (IEEE 754 6.3).
"""
from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, fields, replace
from fractions import Fraction
from typing import Sequence

from .errors import check_choice, parse_enum
from .exact import Exact, Kind, NAN, exact, floor_log2, pow2
from .formats import FormatSpec, Specials, get_format
from .rounding import Mode, Overflow, InfPolicy, NanPolicy, Policy, Subnormal, encode

__all__ = ["ScalePoint", "AlignRef", "AlphaMode", "GemmModel", "PRESETS", "get_preset", "dot", "matmul",
           "split_bounds",
           "accumulator_format", "round_fp", "fused_step"]


class ScalePoint(enum.Enum):
    PRODUCT = "product"  # block scales multiply each product (exact)
    GROUP = "group"      # block scales multiply the rounded group partial


class AlignRef(enum.Enum):
    VALUE = "value"                # floor(log2|t|) of every term
    EXPONENT_SUM = "exponent_sum"  # products: sum of the factors' exponents (unnormalized)
    SCALE_EXPONENT_SUM = "scale_exponent_sum"  # MMA-Sim: format exponents (subnormal/zero at
                                               # emin), exact groups by their scales' exponents


class AlphaMode(enum.Enum):
    EXACT = "exact"                # round(c * prod(alpha)) once
    PREMULTIPLIED = "premultiplied"  # alpha = fp32(prod of factors) first, then round(c * alpha)
    SEQUENTIAL = "sequential"      # round(round(c * a1) * a2) ...
    REVERSED = "reversed"          # round(round(c * a2) * a1): the column scale first (H200
                                   # torch._scaled_mm rowwise, measured)


_ALIGN_MODES = (Mode.RTZ, Mode.RDN, Mode.RNE, Mode.RNA, Mode.RUP)
_ROUND_MODES = (Mode.RNE, Mode.RTZ, Mode.RDN, Mode.RUP, Mode.RNA, Mode.RTO)


@dataclass(frozen=True)
class GemmModel:
    name: str = "custom"
    product_format: str | None = None
    fma_width: int = 1
    align_bits: int | None = None
    align_mode: Mode = Mode.RTZ
    align_ref: AlignRef = AlignRef.VALUE
    acc_frac_bits: int = 23
    norm_mode: Mode = Mode.RNE
    acc_subnormal: Subnormal = Subnormal.KEEP
    group_size: int | None = None
    outer_mode: Mode = Mode.RNE
    scale_point: ScalePoint = ScalePoint.PRODUCT
    lattice: Fraction | None = None
    split_k: int = 1
    split_tile: int | None = None
    alpha_mode: AlphaMode = AlphaMode.PREMULTIPLIED
    output: str = "float32"
    output_mode: Mode = Mode.RNE
    # Blackwell MMA family (issue 17).  Defaults keep every older model; to_dict omits
    # default-valued ones so older reports and baselines compare unchanged.
    exact_group: int | None = None   # products summed exactly in runs of this many
    chain: bool = False              # groups start from the running FP32 accumulator (C)
    overflow_inf: bool = False       # fused sum >= 2^128 in magnitude -> +-Inf
    exp_formats: tuple | None = None  # (a, b, scale) formats for SCALE_EXPONENT_SUM (None: FP32)

    def __post_init__(self):
        def bad(name, val, valid):
            raise ValueError(f"GemmModel.{name}: invalid value {val!r}; valid choices: {valid}")
        for name in ("fma_width", "split_k"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                bad(name, v, "an int >= 1")
        if self.split_tile is not None and (not isinstance(self.split_tile, int) or self.split_tile < 1):
            bad("split_tile", self.split_tile, "None (equal slices) or an int >= 1")
        if self.group_size is not None and (not isinstance(self.group_size, int) or self.group_size < 1):
            bad("group_size", self.group_size, "None or an int >= 1")
        if self.align_bits is not None and (not isinstance(self.align_bits, int) or self.align_bits < 0):
            bad("align_bits", self.align_bits, "None (exact) or an int >= 0")
        if not isinstance(self.acc_frac_bits, int) or not 1 <= self.acc_frac_bits <= 60:
            bad("acc_frac_bits", self.acc_frac_bits, "an int in [1, 60]")
        if self.lattice is not None:
            lat = Fraction(self.lattice)
            if lat <= 0:
                bad("lattice", self.lattice, "None or a positive rational")
            object.__setattr__(self, "lattice", lat)
        # Enums may arrive as names (e.g. from JSON).
        for f, cls in (("align_mode", Mode), ("align_ref", AlignRef), ("norm_mode", Mode), ("outer_mode", Mode),
                       ("output_mode", Mode), ("acc_subnormal", Subnormal),
                       ("scale_point", ScalePoint), ("alpha_mode", AlphaMode)):
            object.__setattr__(self, f, parse_enum(f"GemmModel.{f}", getattr(self, f), cls))
        if self.align_mode not in _ALIGN_MODES:
            bad("align_mode", self.align_mode.name, ", ".join(m.name for m in _ALIGN_MODES))
        for f in ("norm_mode", "outer_mode", "output_mode"):
            if getattr(self, f) not in _ROUND_MODES:
                bad(f, getattr(self, f).name, ", ".join(m.name for m in _ROUND_MODES))
        get_format(self.output)
        if self.product_format is not None:
            get_format(self.product_format)
        self._check_blackwell(bad)

    def _check_blackwell(self, bad):
        if self.exact_group is not None and (not isinstance(self.exact_group, int)
                                             or isinstance(self.exact_group, bool) or self.exact_group < 1):
            bad("exact_group", self.exact_group, "None or an int >= 1")
        for f in ("chain", "overflow_inf"):
            if not isinstance(getattr(self, f), bool):
                bad(f, getattr(self, f), "True or False")
        if self.exp_formats is not None:
            ef = tuple(self.exp_formats)
            if len(ef) != 3:
                bad("exp_formats", self.exp_formats, "None or (a_format, b_format, scale_format or None)")
            for x in ef[:2] + tuple(x for x in ef[2:] if x is not None):
                get_format(x)
            object.__setattr__(self, "exp_formats", ef)
        if (self.chain or self.exact_group) and self.scale_point is ScalePoint.GROUP:
            bad("scale_point", "GROUP", "PRODUCT with chain or exact_group")
        if self.chain and self.group_size is None:
            bad("group_size", None, "the instruction K (an int) when chain is set")

    # --- serialization (JSON-friendly, used by reports and baselines) ----------
    def to_dict(self) -> dict:
        d = asdict(self)
        for k in _OMIT_DEFAULT:  # absent == default: older baselines stay comparable
            if d[k] == _FIELD_DEFAULTS[k]:
                del d[k]
        for k, v in d.items():
            if isinstance(v, enum.Enum):
                d[k] = v.name
            elif isinstance(v, Fraction):
                d[k] = str(v)
            elif isinstance(v, tuple):
                d[k] = list(v)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "GemmModel":
        names = {f.name for f in fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise ValueError(f"GemmModel: unknown fields {sorted(unknown)}; valid: {sorted(names)}")
        d = dict(d)
        if d.get("lattice") is not None:
            d["lattice"] = Fraction(d["lattice"])
        return cls(**d)

    def replace(self, **kw) -> "GemmModel":
        return replace(self, **kw)

    def describe(self) -> str:
        """One paragraph in words, for model cards."""
        parts = ["products exact" if self.product_format is None
                 else f"products rounded to {self.product_format}"]
        if self.align_bits is None:
            parts.append(f"{self.fma_width} product(s) + accumulator summed exactly per step")
        else:
            ref = ("" if self.align_ref is AlignRef.VALUE
                   else " (a product's exponent taken as the sum of its factors' exponents)")
            parts.append(f"{self.fma_width} product(s) + accumulator per fused step, aligned to the "
                         f"largest exponent{ref} keeping {self.align_bits} fraction bits ({self.align_mode.name})")
        if self.exact_group is not None:
            parts.append(f"inside a step, runs of {self.exact_group} products summed exactly first")
        if self.align_ref is AlignRef.SCALE_EXPONENT_SUM:
            parts.append("addends aligned at format exponents (scale-exponent sums for exact runs; "
                         "subnormals and zeros at the minimum normal exponent)")
        parts.append(f"normalized to {self.acc_frac_bits} fraction bits with {self.norm_mode.name}"
                     + (", beyond FP32 range +-Inf" if self.overflow_inf else ""))
        if self.chain:
            parts.append(f"instructions of K={self.group_size} chained along K: the FP32 "
                         "accumulator enters each instruction's fused add as C")
        elif self.group_size is not None:
            parts.append(f"groups of {self.group_size} products added into an FP32 accumulator "
                         f"with {self.outer_mode.name}")
        if self.split_k > 1:
            tile = "" if self.split_tile is None else f" of ceil(K/{self.split_k}) rounded up to a multiple of {self.split_tile}"
            parts.append(f"K split into {self.split_k} slices{tile} summed in FP32 RNE")
        if self.lattice is not None:
            parts.append(f"result snapped to multiples of {self.lattice} (RNE)")
        parts.append(f"output {self.output} ({self.output_mode.name})")
        return "; ".join(parts)


_FIELD_DEFAULTS = {f.name: f.default for f in fields(GemmModel)}
_OMIT_DEFAULT = ("exact_group", "chain", "overflow_inf", "exp_formats")


def accumulator_format(acc_frac_bits: int) -> FormatSpec:
    """A float with FP32's exponent range and ``acc_frac_bits`` fraction bits."""
    return FormatSpec(f"acc_e8m{acc_frac_bits}", 1, 8, acc_frac_bits, 127, Specials.IEEE,
                      storage_bits=64)


_IEEE = Policy(Overflow.IEEE, InfPolicy.PROPAGATE, NanPolicy.CANONICAL)
_IEEE_FTZ = Policy(Overflow.IEEE, InfPolicy.PROPAGATE, NanPolicy.CANONICAL, Subnormal.FLUSH)


def round_fp(v: Exact, fmt, mode: Mode, subnormal: Subnormal = Subnormal.KEEP) -> Exact:
    """Round an exact value into a float format with IEEE specials; return the exact result."""
    fmt = get_format(fmt)
    pol = _IEEE_FTZ if subnormal is Subnormal.FLUSH else _IEEE
    if not fmt.has_inf:
        pol = Policy(Overflow.SATFINITE, InfPolicy.SATURATE,
                     NanPolicy.CANONICAL if fmt.has_nan else NanPolicy.RAISE)
    return fmt.decode(encode(v, fmt, mode, pol).code)


def _fp32(v: Exact, mode: Mode = Mode.RNE) -> Exact:
    return round_fp(v, "float32", mode)


def _zero_sign(negs: Sequence[bool], mode: Mode) -> bool:
    """IEEE sign of an exactly zero sum: -0 if all terms are negative (-0 + -0), +0 if all
    are positive, else (opposite signs) -0 only when rounding toward -inf."""
    if all(negs):
        return True
    if not any(negs):
        return False
    return mode is Mode.RDN


def _add(a: Exact, b: Exact, mode: Mode = Mode.RNE) -> Exact:
    """Exact sum of two finite values; an exact zero gets its IEEE sign under ``mode``."""
    s = a.to_fraction() + b.to_fraction()
    if s == 0:
        return Exact(Kind.FINITE, _zero_sign([a.negative, b.negative], mode))
    return Exact(Kind.FINITE, s < 0, abs(s))


def _mul(a: Exact, b: Exact) -> Exact:
    if a.is_nan or b.is_nan:
        return NAN
    neg = a.negative != b.negative
    if a.is_inf or b.is_inf:
        if (a.is_finite and a.mag == 0) or (b.is_finite and b.mag == 0):
            return NAN
        return Exact(Kind.INF, neg)
    return Exact(Kind.FINITE, neg, a.mag * b.mag)


def _special_sum(terms: Sequence[Exact]) -> Exact | None:
    """IEEE result of a sum with non-finite terms, or None if all are finite."""
    if any(t.is_nan for t in terms):
        return NAN
    infs = {t.negative for t in terms if t.is_inf}
    if not infs:
        return None
    if len(infs) == 2:
        return NAN
    return Exact(Kind.INF, infs.pop())


def _align(t: Fraction, q: Fraction, mode: Mode) -> Fraction:
    """Round t to a multiple of q (q a power of two)."""
    n, r = divmod(t, q)  # floor division: r >= 0
    n = int(n)
    if r == 0:
        return t
    if mode is Mode.RDN:
        up = False
    elif mode is Mode.RUP:
        up = True
    elif mode is Mode.RTZ:
        up = t < 0
    elif mode is Mode.RNA:
        up = 2 * r > q or (2 * r == q and t > 0)
    else:  # RNE
        up = 2 * r > q or (2 * r == q and n % 2 == 1)
    return (n + 1) * q if up else n * q


def fused_step(model: GemmModel, acc: Exact, products: Sequence[Exact],
               exps: Sequence[int | None] | None = None) -> Exact:
    """One fused step: accumulator + up to F products, aligned, summed, normalized once.

    ``exps``: the products' alignment exponents under ``align_ref`` EXPONENT_SUM or
    SCALE_EXPONENT_SUM (None: each term's own floor(log2|t|))."""
    sp = _special_sum([acc, *products])
    if sp is not None:
        return sp
    vals = [acc.to_fraction()] + [p.to_fraction() for p in products]
    nz = [v for v in vals if v != 0]
    if not nz:
        # IEEE: zeros of one sign keep it; mixed signs give +0 (-0 under RDN).
        return Exact(Kind.FINITE, _zero_sign([acc.negative] + [p.negative for p in products],
                                             model.norm_mode))
    if model.align_bits is not None:
        if model.align_ref is AlignRef.SCALE_EXPONENT_SUM:
            # every addend counts, zeros too; C enters with FP32's minimum normal exponent
            ea = max(floor_log2(abs(vals[0])), -126) if vals[0] != 0 else -126
            emax = max([ea] + [e for e in exps if e is not None])
        else:
            pe = [None] * len(products) if exps is None else list(exps)
            emax = max(floor_log2(abs(v)) if e is None else e
                       for v, e in zip(vals, [None] + pe) if v != 0)
        q = pow2(emax - model.align_bits)
        vals = [_align(v, q, model.align_mode) for v in vals]
    s = sum(vals, Fraction(0))
    if model.overflow_inf and abs(s) >= pow2(128):
        return Exact(Kind.INF, s < 0)  # MMA-Sim: "a final result beyond the FP32 range is +-Inf"
    v = Exact(Kind.FINITE, s < 0, abs(s))
    if s == 0:
        v = Exact(Kind.FINITE, model.norm_mode is Mode.RDN)  # IEEE: exact zero sum is -0 under RDN
    return round_fp(v, accumulator_format(model.acc_frac_bits), model.norm_mode, model.acc_subnormal)


def _exact_runs(model: GemmModel, prods: Sequence[Exact], exps):
    """``exact_group`` E: each run of E products summed exactly (one addend); its exponent
    is the largest of its products' exponents.  An exact zero is -0 only if all are -0."""
    E = model.exact_group
    if E is None:
        return prods, exps
    terms, tex = [], []
    for i in range(0, len(prods), E):
        run = prods[i:i + E]
        t = _special_sum(run)
        if t is None:
            s = sum((p.to_fraction() for p in run), Fraction(0))
            t = (Exact(Kind.FINITE, s < 0, abs(s)) if s != 0 else
                 Exact(Kind.FINITE, all(p.negative for p in run)))
        terms.append(t)
        if exps is not None:
            es = [e for e in exps[i:i + E] if e is not None]
            tex.append(max(es) if es else None)
    return terms, (tex if exps is not None else None)


def _reduce_slice(model: GemmModel, prods: Sequence[Exact], group_scales: Sequence[Exact] | None,
                  exps: Sequence[int | None] | None = None, c: Exact | None = None) -> Exact:
    G = model.group_size or max(len(prods), 1)
    F = model.fma_width
    outer: Exact | None = c
    for gi, g0 in enumerate(range(0, max(len(prods), 1), G)):
        grp = prods[g0:g0 + G]
        acc = outer if model.chain and outer is not None else Exact(Kind.FINITE, False)
        for j in range(0, len(grp), F):
            ex = None if exps is None else exps[g0 + j:g0 + j + min(F, len(grp) - j)]
            terms, tex = _exact_runs(model, grp[j:j + F], ex)
            acc = fused_step(model, acc, terms, tex)
        if group_scales is not None:
            acc = _fp32(_mul(acc, group_scales[gi]))
        if outer is None or model.chain:
            outer = round_fp(acc, "float32", model.outer_mode)
        else:
            sp = _special_sum([outer, acc])
            if sp is None:
                sp = round_fp(_add(outer, acc, model.outer_mode), "float32", model.outer_mode)
            outer = sp
    return outer


def dot(model: GemmModel, a: Sequence, b: Sequence, *, scales_a: Sequence | None = None,
        scales_b: Sequence | None = None, block: int | None = None,
        alpha: Sequence | None = None, c=None) -> Exact:
    """One output element under ``model``: sum_k a_k b_k, block scales optional.

    a, b: decoded operand values (anything ``exact()`` takes); scales_a/b: one
    decoded scale per block of ``block`` consecutive k; alpha: factors applied
    after accumulation (e.g. scale_a[i], scale_b[j] of a scaled GEMM); c (``chain``
    models only): the accumulator's initial value, C of the first instruction."""
    if c is not None and not model.chain:
        raise ValueError(f"c: only chain models take an initial accumulator; model "
                         f"{model.name!r} has chain=False (valid choices: c=None)")
    if len(a) != len(b):
        raise ValueError(f"a, b: lengths differ ({len(a)} vs {len(b)})")
    K = len(a)
    av = [exact(x) for x in a]
    bv = [exact(x) for x in b]
    prods = [_mul(x, y) for x, y in zip(av, bv)]
    if model.product_format is not None:
        prods = [round_fp(p, model.product_format, Mode.RNE) for p in prods]

    blocked = scales_a is not None or scales_b is not None
    group_scales_all = None
    if blocked:
        if block is None or scales_a is None or scales_b is None:
            raise ValueError("scales_a, scales_b, block: block-scaled dot needs all three")
        if K % block:
            raise ValueError(f"block: K={K} is not a multiple of block={block}")
        nb = K // block
        if len(scales_a) != nb or len(scales_b) != nb:
            raise ValueError(f"scales_a/scales_b: expected {nb} scales each (K={K}, block={block}), "
                             f"got {len(scales_a)} and {len(scales_b)}")
        sab = [_mul(exact(x), exact(y)) for x, y in zip(scales_a, scales_b)]
        if model.scale_point is ScalePoint.PRODUCT:
            prods = [_mul(p, sab[k // block]) for k, p in enumerate(prods)]
        else:
            if (model.group_size or K) != block:
                raise ValueError(f"GemmModel.group_size: scale_point GROUP needs group_size == block "
                                 f"({block}), got {model.group_size}")
            if any(lo % block for lo, _ in split_bounds(model, K)):
                raise ValueError(f"split_k: scale_point GROUP needs slices of whole blocks "
                                 f"({block}); got K={K}, split_k={model.split_k}, split_tile={model.split_tile}")
            group_scales_all = sab

    exps = _alignment_exponents(model, av, bv, scales_a, scales_b, block, blocked)
    total: Exact | None = None
    for lo, hi in split_bounds(model, K):
        gs = None
        if group_scales_all is not None:
            gs = group_scales_all[lo // block:-(-hi // block)]
        part = _reduce_slice(model, prods[lo:hi], gs, None if exps is None else exps[lo:hi],
                             exact(c) if c is not None and lo == 0 else None)
        if total is None:
            total = part
        else:
            sp = _special_sum([total, part])
            total = sp if sp is not None else _fp32(_add(total, part))
    c = total
    if model.lattice is not None and c.is_finite and c.mag != 0:
        L = model.lattice
        n, r = divmod(c.mag, L)
        n = int(n)
        if 2 * r > L or (2 * r == L and n % 2 == 1):
            n += 1
        c = Exact(Kind.FINITE, c.negative, n * L)
    if alpha:
        fs = [exact(x) for x in alpha]
        if model.alpha_mode is AlphaMode.EXACT:
            for f in fs:
                c = _mul(c, f)
            c = _fp32(c) if c.is_finite else c
        elif model.alpha_mode is AlphaMode.PREMULTIPLIED:
            al = _fp32(fs[0])  # the premultiplied alpha is an FP32 value
            for f in fs[1:]:
                al = _fp32(_mul(al, f))
            c = _mul(c, al)
            c = _fp32(c) if c.is_finite else c
        else:
            for f in (fs if model.alpha_mode is AlphaMode.SEQUENTIAL else fs[::-1]):
                c = _mul(c, f)
                c = _fp32(c) if c.is_finite else c
    return round_fp(c, model.output, model.output_mode)


def _format_exponent(x: Exact, fmt: str) -> int | None:
    """A factor's exponent as an MMA sees it: floor(log2|x|), or the format's minimum
    normal exponent for a subnormal or zero; None for NaN/Inf (decided before alignment)."""
    if not x.is_finite:
        return None
    spec = get_format(fmt)
    return floor_log2(x.mag) if x.mag >= spec.min_normal else spec.emin


def _alignment_exponents(model, av, bv, scales_a, scales_b, block, blocked):
    """Per-product alignment exponents (None: align by value)."""
    if model.align_bits is None or model.align_ref is AlignRef.VALUE:
        return None
    if model.align_ref is AlignRef.EXPONENT_SUM:
        # zero and non-finite products take no part in the alignment
        def _e(xs):
            return (sum(floor_log2(x.mag) for x in xs)
                    if all(x.is_finite and x.mag != 0 for x in xs) else None)
        factors = [[x, y] for x, y in zip(av, bv)]
        if blocked and model.scale_point is ScalePoint.PRODUCT:
            factors = [f + [exact(scales_a[k // block]), exact(scales_b[k // block])]
                       for k, f in enumerate(factors)]
        return [_e(f) for f in factors]
    fa, fb, fs = model.exp_formats or ("float32",) * 3  # default: FP32's exponent range
    out = []
    for k, (x, y) in enumerate(zip(av, bv)):
        es = []
        if not (model.exact_group and blocked):  # exact runs of scaled products: scales only
            es += [_format_exponent(x, fa), _format_exponent(y, fb)]
        if blocked:
            es += [_format_exponent(exact(s), fs) for s in (scales_a[k // block], scales_b[k // block])]
        out.append(None if None in es else sum(es))
    return out


def split_bounds(model: GemmModel, K: int) -> list[tuple[int, int]]:
    """The split-K slices [lo, hi) of a length-K dot, in reduction order."""
    S = model.split_k
    if model.split_tile is None:
        if K % S:
            raise ValueError(f"split_k: K={K} is not a multiple of split_k={S} (set split_tile "
                             f"for uneven slices)")
        L = K // S
    else:
        T = model.split_tile
        L = -(-(-(-K // S)) // T) * T
    if K == 0:
        return [(0, 0)]
    return [(lo, min(K, lo + L)) for lo in range(0, K, max(L, 1))]


def matmul(model: GemmModel, A, B, **kw) -> list[list[Exact]]:
    """C = A @ B elementwise via ``dot`` (A: M x K rows, B: K x N); slow, exact."""
    M, K = len(A), len(A[0]) if A else 0
    N = len(B[0]) if B else 0
    cols = [[B[k][j] for k in range(K)] for j in range(N)]
    return [[dot(model, A[i], cols[j], **kw) for j in range(N)] for i in range(M)]


_P = GemmModel
PRESETS: dict[str, GemmModel] = {
    # One rounding of the exact sum.
    "exact": _P("exact", fma_width=1 << 30, align_bits=None, acc_frac_bits=23, norm_mode=Mode.RNE,
                outer_mode=Mode.RNE),
    # IEEE FP32: RNE after every add, in order.
    "fp32_sequential": _P("fp32_sequential", fma_width=1, align_bits=None, acc_frac_bits=23,
                          norm_mode=Mode.RNE),
    # Decode block-scaled operands, then FP32 sequential accumulation.
    "decoded_fp32": _P("decoded_fp32", fma_width=1, align_bits=None, acc_frac_bits=23,
                       norm_mode=Mode.RNE, scale_point=ScalePoint.PRODUCT),
    # UE5M3 paper: native NVFP4 GEMMs on Blackwell as observed by its probes.
    "probe_matched": _P("probe_matched", fma_width=64, align_bits=None, acc_frac_bits=23,
                        norm_mode=Mode.RNE, group_size=64, outer_mode=Mode.RTZ),
    "probe_matched_lattice": _P("probe_matched_lattice", fma_width=64, align_bits=None,
                                acc_frac_bits=23, norm_mode=Mode.RNE, group_size=64,
                                outer_mode=Mode.RTZ, lattice=Fraction(1, 1024)),
    # MMA-Sim (arXiv 2511.10909) tcgen05 kind::mxf4nvf4 chained along K by a library GEMM:
    # K = 64 per instruction, exact groups of 16, addends aligned at the scale-exponent sums,
    # truncated at 35 fraction bits, RZ to FP32 per instruction (NVFP4: ue4m3 scales).
    "blackwell_mxf4nvf4": _P("blackwell_mxf4nvf4", fma_width=64, group_size=64, chain=True,
                             exact_group=16, align_bits=35, align_mode=Mode.RTZ,
                             align_ref=AlignRef.SCALE_EXPONENT_SUM, acc_frac_bits=23,
                             norm_mode=Mode.RTZ, overflow_inf=True, outer_mode=Mode.RTZ,
                             exp_formats=("float4_e2m1fn", "float4_e2m1fn", "ue4m3")),
    # kind::mxf8f6f4 (here for MXFP4 operands, ue8m0 block 32): K = 32, every product its
    # own addend at exp(a)+exp(b)+exp(sa)+exp(sb), 25 fraction bits, RZ per instruction.
    "blackwell_mxf8f6f4": _P("blackwell_mxf8f6f4", fma_width=32, group_size=32, chain=True,
                             align_bits=25, align_mode=Mode.RTZ,
                             align_ref=AlignRef.SCALE_EXPONENT_SUM, acc_frac_bits=23,
                             norm_mode=Mode.RTZ, overflow_inf=True, outer_mode=Mode.RTZ,
                             exp_formats=("float4_e2m1fn", "float4_e2m1fn", "float8_e8m0fnu")),
}


def get_preset(name: str) -> GemmModel:
    return PRESETS[check_choice("model", name, PRESETS)]
