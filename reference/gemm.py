"""GEMM accumulation models (SPEC section 4), in exact arithmetic.

One model is one frozen ``GemmModel`` record: a point of the parameterized
family.  ``dot`` computes one output element of a (block-scaled) GEMM under a
model; every intermediate is an exact rational rounded by the reference
rounding core at exactly the points the model names.

Evaluation order of one output c = sum_k a_k * b_k (optional block scales):

1. products p_k = a_k * b_k, exact (or rounded to ``product_format``); with
   block scales and scale_point PRODUCT, p_k *= sa[k // B] * sb[k // B] (exact).
2. K is cut into ``split_k`` contiguous slices, each reduced by steps 3-4,
   then the slice results are combined with FP32 RNE adds: in order
   (``split_reduce`` SERIAL), or as a halving tree (TREE: v[i] += v[i + ceil(n/2)]
   for i < n - ceil(n/2), n -> ceil(n/2), until one is left; cuBLAS's fp32 gemv
   reduces its 32 lane partials so), or pairwise by recursive halves (PAIRWISE:
   cuBLAS's tf32 segment-K partials); see ``reference.schedule.reduce_levels``.  Slices are equal
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

Steps 1-4 are the model's schedule: ``GemmModel.plan(K, block)`` gives it as data (the
slices, groups, fused steps, exact runs, where block scales and each rounding apply, every
validity check; reference/schedule.py).  ``dot`` walks that plan with exact Fractions, as
the fast backends (``fp4ref.gemm``, ``probes.sim``) walk it with their own arithmetic.

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

from . import schedule as _schedule
from .errors import check_choice, parse_enum
from .exact import Exact, Kind, NAN, exact, floor_log2, pow2
from .formats import FORMATS, FormatSpec, Specials, get_format
from .rounding import Mode, Overflow, InfPolicy, NanPolicy, Policy, Subnormal, encode
from .schedule import AlignRef, Operand, ScaleAt, ScalePoint, Schedule, SplitOrder, SplitReduce

__all__ = ["ScalePoint", "AlignRef", "SplitReduce", "AlphaMode", "GemmModel", "Schedule", "PRESETS",
           "get_preset", "dot", "matmul", "split_bounds", "accumulator_format", "round_fp", "round_fp32",
           "mul_exact", "add_exact", "special_sum", "fused_step"]


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
    # How split-K slice results are combined (SERIAL: in order; TREE: halving tree, cuBLAS
    # fp32 gemv; PAIRWISE: recursive halves, cuBLAS tf32 segment-K; a SplitOrder: a chain of
    # groups measured at a shape).  Omitted from to_dict when SERIAL.
    split_reduce: SplitReduce | SplitOrder = SplitReduce.SERIAL

    def __post_init__(self):
        """Check every field: a bad value is a ValueError naming the field, the value and
        the valid choices (enums may arrive as names, e.g. from JSON)."""
        if not isinstance(self.name, str):
            _bad("name", self.name, "a str")
        self._check_ints()
        if self.lattice is not None:
            try:
                lat = Fraction(self.lattice)
            except (TypeError, ValueError):
                lat = None
            if lat is None or lat <= 0:
                _bad("lattice", self.lattice, "None or a positive rational")
            object.__setattr__(self, "lattice", lat)
        for f, cls in _ENUM_FIELDS:
            object.__setattr__(self, f, parse_enum(f"GemmModel.{f}", getattr(self, f), cls))
        self._check_order()
        if self.align_mode not in _ALIGN_MODES:
            _bad("align_mode", self.align_mode.name, ", ".join(m.name for m in _ALIGN_MODES))
        for f in ("norm_mode", "outer_mode", "output_mode"):
            if getattr(self, f) not in _ROUND_MODES:
                _bad(f, getattr(self, f).name, ", ".join(m.name for m in _ROUND_MODES))
        _check_format("output", self.output)
        if self.product_format is not None:
            _check_format("product_format", self.product_format)
        self._check_blackwell()

    def _check_ints(self):
        for name, low, none_ok, valid in _INT_FIELDS:
            v = getattr(self, name)
            if v is None and none_ok:
                continue
            if not isinstance(v, int) or isinstance(v, bool) or v < low or (
                    name == "acc_frac_bits" and v > 60):
                _bad(name, v, valid)

    def _check_order(self):
        """split_reduce: a SplitReduce (member, name or value) or a measured SplitOrder (or
        its ``order=...`` text) naming exactly split_k slices."""
        v = self.split_reduce
        if isinstance(v, str) and v.startswith("order="):
            v = SplitOrder.parse(v)
        if not isinstance(v, SplitOrder):
            v = parse_enum("GemmModel.split_reduce", v, SplitReduce)
        elif v.n != self.split_k:
            _bad("split_reduce", v.value, f"an order of exactly split_k = {self.split_k} slices")
        object.__setattr__(self, "split_reduce", v)

    def _check_blackwell(self):
        for f in ("chain", "overflow_inf"):
            if not isinstance(getattr(self, f), bool):
                _bad(f, getattr(self, f), "True or False")
        if self.exp_formats is not None:
            ef = tuple(self.exp_formats) if isinstance(self.exp_formats, (tuple, list)) else ()
            if len(ef) != 3:
                _bad("exp_formats", self.exp_formats, "None or (a_format, b_format, scale_format or None)")
            for x in ef[:2] + tuple(x for x in ef[2:] if x is not None):
                _check_format("exp_formats", x)
            object.__setattr__(self, "exp_formats", ef)
        if (self.chain or self.exact_group) and self.scale_point is ScalePoint.GROUP:
            _bad("scale_point", "GROUP", "PRODUCT with chain or exact_group")
        if self.chain and self.group_size is None:
            _bad("group_size", None, "the instruction K (an int) when chain is set")

    def plan(self, K: int, block: int | None = None) -> Schedule:
        """This model's schedule for a length-K dot (``block``: the block-scale size, None
        without block scales): slices, groups, fused steps, exact runs and the points where
        scales and roundings apply (``reference.schedule``).  Cached; raises ValueError
        where the model cannot run K / block."""
        return _schedule.plan(self, K, block)

    @property
    def mma_family(self) -> bool:
        """The Blackwell MMA family (issue 17): chained instructions, exact runs, or
        alignment at the operand formats' exponents."""
        return self.chain or self.exact_group is not None or self.align_ref is AlignRef.SCALE_EXPONENT_SUM

    # --- serialization (JSON-friendly, used by reports and baselines) ----------
    def to_dict(self) -> dict:
        d = asdict(self)
        if isinstance(self.split_reduce, SplitOrder):
            d["split_reduce"] = self.split_reduce.value
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


def _bad(name: str, val, valid) -> None:
    raise ValueError(f"GemmModel.{name}: invalid value {val!r}; valid choices: {valid}")


def _check_format(name: str, fmt) -> None:
    if not isinstance(fmt, FormatSpec):
        check_choice(f"GemmModel.{name}", fmt, FORMATS)


# (field, minimum, None allowed, valid choices in words)
_INT_FIELDS = (("fma_width", 1, False, "an int >= 1"), ("split_k", 1, False, "an int >= 1"),
               ("split_tile", 1, True, "None (equal slices) or an int >= 1"),
               ("group_size", 1, True, "None or an int >= 1"),
               ("align_bits", 0, True, "None (exact) or an int >= 0"),
               ("acc_frac_bits", 1, False, "an int in [1, 60]"),
               ("exact_group", 1, True, "None or an int >= 1"))
_ENUM_FIELDS = (("align_mode", Mode), ("align_ref", AlignRef), ("norm_mode", Mode), ("outer_mode", Mode),
                ("output_mode", Mode), ("acc_subnormal", Subnormal), ("scale_point", ScalePoint),
                ("alpha_mode", AlphaMode))
_FIELD_DEFAULTS = {f.name: f.default for f in fields(GemmModel)}
_OMIT_DEFAULT = ("exact_group", "chain", "overflow_inf", "exp_formats", "split_reduce")


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


def round_fp32(v: Exact, mode: Mode = Mode.RNE) -> Exact:
    """``v`` rounded to FP32 with ``mode`` (IEEE overflow), as an exact value."""
    return round_fp(v, "float32", mode)


def _zero_sign(negs: Sequence[bool], mode: Mode) -> bool:
    """IEEE sign of an exactly zero sum: -0 if all terms are negative (-0 + -0), +0 if all
    are positive, else (opposite signs) -0 only when rounding toward -inf."""
    if all(negs):
        return True
    if not any(negs):
        return False
    return mode is Mode.RDN


def add_exact(a: Exact, b: Exact, mode: Mode = Mode.RNE) -> Exact:
    """Exact sum of two finite values; an exact zero gets its IEEE sign under ``mode``."""
    s = a.to_fraction() + b.to_fraction()
    if s == 0:
        return Exact(Kind.FINITE, _zero_sign([a.negative, b.negative], mode))
    return Exact(Kind.FINITE, s < 0, abs(s))


def mul_exact(a: Exact, b: Exact) -> Exact:
    """Exact product with IEEE specials (NaN, Inf * 0 -> NaN)."""
    if a.is_nan or b.is_nan:
        return NAN
    neg = a.negative != b.negative
    if a.is_inf or b.is_inf:
        if (a.is_finite and a.mag == 0) or (b.is_finite and b.mag == 0):
            return NAN
        return Exact(Kind.INF, neg)
    return Exact(Kind.FINITE, neg, a.mag * b.mag)


def special_sum(terms: Sequence[Exact]) -> Exact | None:
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
    elif mode is Mode.RNE:
        up = 2 * r > q or (2 * r == q and n % 2 == 1)
    else:  # GemmModel rejects the others at construction
        raise ValueError(f"GemmModel.align_mode: {mode.name} is not an alignment mode; valid "
                         f"choices: {', '.join(m.name for m in _ALIGN_MODES)}")
    return (n + 1) * q if up else n * q


def _align_emax(model: GemmModel, vals: list, exps) -> int:
    """The fused step's alignment exponent: the largest term exponent (``acc_exp_floor``)."""
    floor = _schedule.acc_exp_floor(model)
    if floor is not None:  # every addend counts, zeros too; C at >= the floor
        ea = max(floor_log2(abs(vals[0])), floor) if vals[0] != 0 else floor
        return max([ea] + [e for e in exps if e is not None])
    pe = [None] * (len(vals) - 1) if exps is None else list(exps)
    return max(floor_log2(abs(v)) if e is None else e for v, e in zip(vals, [None] + pe) if v != 0)


def fused_step(model: GemmModel, acc: Exact, products: Sequence[Exact],
               exps: Sequence[int | None] | None = None) -> Exact:
    """One fused step: accumulator + up to F products, aligned, summed, normalized once.

    ``exps``: the products' alignment exponents under ``align_ref`` EXPONENT_SUM or
    SCALE_EXPONENT_SUM (None: each term's own floor(log2|t|))."""
    sp = special_sum([acc, *products])
    if sp is not None:
        return sp
    vals = [acc.to_fraction()] + [p.to_fraction() for p in products]
    if not any(vals):
        # IEEE: zeros of one sign keep it; mixed signs give +0 (-0 under RDN).
        return Exact(Kind.FINITE, _zero_sign([acc.negative] + [p.negative for p in products],
                                             model.norm_mode))
    if model.align_bits is not None:
        q = pow2(_align_emax(model, vals, exps) - model.align_bits)
        vals = [_align(v, q, model.align_mode) for v in vals]
    s = sum(vals, Fraction(0))
    if model.overflow_inf and abs(s) >= pow2(128):
        return Exact(Kind.INF, s < 0)  # MMA-Sim: "a final result beyond the FP32 range is +-Inf"
    v = Exact(Kind.FINITE, s < 0, abs(s))
    if s == 0:
        v = Exact(Kind.FINITE, model.norm_mode is Mode.RDN)  # IEEE: exact zero sum is -0 under RDN
    return round_fp(v, accumulator_format(model.acc_frac_bits), model.norm_mode, model.acc_subnormal)


def _run_terms(runs, prods: Sequence[Exact], exps):
    """A step's exact runs (``Step.runs``): each run of products summed exactly (one
    addend), its exponent the largest of its products'.  An exact zero is -0 only if all
    its products are -0."""
    terms, tex = [], []
    for lo, hi in runs:
        run = prods[lo:hi]
        t = special_sum(run)
        if t is None:
            s = sum((p.to_fraction() for p in run), Fraction(0))
            t = (Exact(Kind.FINITE, s < 0, abs(s)) if s != 0 else
                 Exact(Kind.FINITE, all(p.negative for p in run)))
        terms.append(t)
        if exps is not None:
            es = [e for e in exps[lo:hi] if e is not None]
            tex.append(max(es) if es else None)
    return terms, (tex if exps is not None else None)


class _ExactArithmetic:
    """``Schedule.run``'s arithmetic in exact values: the fused steps of ``prods`` (with
    their alignment exponents ``exps``), group scales ``sab``, FP32 roundings."""

    def __init__(self, model: GemmModel, prods: Sequence[Exact], exps, sab):
        self.model, self.prods, self.exps, self.sab = model, prods, exps, sab

    def zero(self) -> Exact:
        return Exact(Kind.FINITE, False)

    def group(self, acc: Exact, group) -> Exact:
        prods, exps = self.prods, self.exps
        for st in group.steps:
            if st.runs is None:
                terms, tex = prods[st.lo:st.hi], None if exps is None else exps[st.lo:st.hi]
            else:
                terms, tex = _run_terms(st.runs, prods, exps)
            acc = fused_step(self.model, acc, terms, tex)
        return acc

    def scale(self, acc: Exact, block: int) -> Exact:
        return round_fp32(mul_exact(acc, self.sab[block]))

    def round_outer(self, acc: Exact) -> Exact:
        return round_fp32(acc, self.model.outer_mode)

    def add_outer(self, outer: Exact, acc: Exact) -> Exact:
        return _add_round(outer, acc, self.model.outer_mode)

    def add_slices(self, total: Exact, part: Exact) -> Exact:
        return _add_round(total, part, Mode.RNE)


def _add_round(x: Exact, y: Exact, mode: Mode) -> Exact:
    """round(x + y) to FP32 with ``mode`` (IEEE specials; an exact zero's sign per ``mode``)."""
    sp = special_sum([x, y])
    return sp if sp is not None else round_fp32(add_exact(x, y, mode), mode)


def _epilogue(model: GemmModel, c: Exact, alpha) -> Exact:
    """Lattice, alpha (``alpha_mode``), output rounding."""
    if model.lattice is not None and c.is_finite and c.mag != 0:
        L = model.lattice
        n, r = divmod(c.mag, L)
        n = int(n)
        if 2 * r > L or (2 * r == L and n % 2 == 1):
            n += 1
        c = Exact(Kind.FINITE, c.negative, n * L)
    if alpha:
        c = _apply_alpha(model.alpha_mode, c, [exact(x) for x in alpha])
    return round_fp(c, model.output, model.output_mode)


def _apply_alpha(mode: AlphaMode, c: Exact, fs: list) -> Exact:
    def fp32(x):
        return round_fp32(x) if x.is_finite else x
    if mode is AlphaMode.EXACT:
        for f in fs:
            c = mul_exact(c, f)
        return fp32(c)
    if mode is AlphaMode.PREMULTIPLIED:
        al = round_fp32(fs[0])  # the premultiplied alpha is an FP32 value
        for f in fs[1:]:
            al = round_fp32(mul_exact(al, f))
        return fp32(mul_exact(c, al))
    if mode in (AlphaMode.SEQUENTIAL, AlphaMode.REVERSED):
        for f in (fs if mode is AlphaMode.SEQUENTIAL else fs[::-1]):
            c = fp32(mul_exact(c, f))
        return c
    raise ValueError(f"GemmModel.alpha_mode: unknown value {mode!r}; valid choices: "
                     + ", ".join(m.name for m in AlphaMode))


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
    blocked = scales_a is not None or scales_b is not None
    if blocked and (block is None or scales_a is None or scales_b is None):
        raise ValueError("scales_a, scales_b, block: block-scaled dot needs all three")
    plan = model.plan(len(a), block if blocked else None)
    ops = {Operand.A: [exact(x) for x in a], Operand.B: [exact(x) for x in b]}
    sab = None
    if blocked:
        nb = plan.K // plan.block
        if len(scales_a) != nb or len(scales_b) != nb:
            raise ValueError(f"scales_a/scales_b: expected {nb} scales each (K={plan.K}, block={block}), "
                             f"got {len(scales_a)} and {len(scales_b)}")
        ops[Operand.SCALE_A] = [exact(x) for x in scales_a]
        ops[Operand.SCALE_B] = [exact(x) for x in scales_b]
        sab = [mul_exact(x, y) for x, y in zip(ops[Operand.SCALE_A], ops[Operand.SCALE_B])]
    prods = [mul_exact(x, y) for x, y in zip(ops[Operand.A], ops[Operand.B])]
    if model.product_format is not None:
        prods = [round_fp(p, model.product_format, Mode.RNE) for p in prods]
    if plan.scales is ScaleAt.PRODUCT:
        prods = [mul_exact(p, sab[k // plan.block]) for k, p in enumerate(prods)]
    exps = _alignment_exponents(plan, ops)
    acc = plan.run(_ExactArithmetic(model, prods, exps, sab), None if c is None else exact(c))
    return _epilogue(model, acc, alpha)


def _factor_exponent(x: Exact, fmt: str | None) -> int | None:
    """A factor's alignment exponent (``ExpFactor``): fmt None: floor(log2|x|), None for
    zero or non-finite (no say); else as an MMA sees it: floor(log2|x|), or the format's
    minimum normal exponent for a subnormal or zero, None for NaN/Inf (decided before
    alignment)."""
    if not x.is_finite:
        return None
    if fmt is None:
        return floor_log2(x.mag) if x.mag != 0 else None
    spec = get_format(fmt)
    return floor_log2(x.mag) if x.mag >= spec.min_normal else spec.emin


def _alignment_exponents(plan: Schedule, ops: dict) -> list | None:
    """Per-product alignment exponents: the sum over ``plan.exp_factors`` (None where a
    factor has no say; None overall: align by value)."""
    if plan.exp_factors is None:
        return None
    cols = []
    for f in plan.exp_factors:
        xs = ops[f.operand]
        per_k = xs if f.operand in (Operand.A, Operand.B) else [xs[k // plan.block] for k in range(plan.K)]
        cols.append([_factor_exponent(x, f.format) for x in per_k])
    return [None if None in es else sum(es) for es in zip(*cols)]


def split_bounds(model: GemmModel, K: int) -> list[tuple[int, int]]:
    """The split-K slices [lo, hi) of a length-K dot, in reduction order."""
    return _schedule.split_bounds(K, model.split_k, model.split_tile)


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
