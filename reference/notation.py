"""One notation for GEMM models (reference.gemm.GemmModel): the JSON form, a short form and
a sentence form.  The probe command, the report (JSON and HTML), the model card and the gate
all write and read models through this module, so a model reads the same everywhere.

JSON form: ``to_dict`` / ``from_dict`` (the report's ``model`` object; older spellings in
``ALIASES`` are read too, an absent field takes its default).

Short form (``short`` / ``parse_short``, lossless: ``parse_short(short(m)) == m``):
space-separated ``key=value`` tokens in this order, optional ones only when they differ from
the default::

    F=16 align=26:RTZ acc=23:RNE G=128:RNE out=bfloat16:RNE
    F=64 E=16 align=35:RTZ:scale-esum acc=23:RTZ:inf G=64:RTZ:chain expf=... out=float32:RNE

  F=<fma_width>             products added with the accumulator in one fused step
  E=<exact_group>           runs of products summed exactly inside a step      (optional)
  align=<bits|exact>[:<align_mode>][:esum|:scale-esum]
                            fraction bits kept when aligning a fused step (exact: none
                            dropped); the mode is shown unless exact and RTZ; the suffix
                            names the alignment reference (align_ref) when not by value
  acc=<acc_frac_bits>:<norm_mode>[:FTZ][:inf]
                            accumulator fraction bits after each step (23 = FP32) and its
                            rounding; FTZ flushes its subnormals, inf overflows to +-Inf
  G=<group_size|->[:<outer_mode>][:chain]
                            promotion interval (- = none) and the rounding of the
                            cross-group additions (shown unless - and RNE); chain: each
                            instruction starts from the running accumulator
  split=<split_k>[/T<split_tile>][:tree|:pairwise]
                            K slices (uneven: rounded up to a k-tile), their results added
                            in order, as a halving tree, or pairwise by halves   (optional)
  scale=group               block scales multiply group partial sums           (optional)
  L=<lattice>               results snapped to multiples of it, RNE            (optional)
  prod=<product_format>     products rounded to this format                    (optional)
  alpha=<alpha_mode>        how per-tensor/row scales meet the accumulator     (optional)
  expf=<a>,<b>,<scale|->    formats whose exponents align SCALE_EXPONENT_SUM   (optional)
  out=<output>:<output_mode>

No letter means two things: the accumulator is ``acc``, the alignment ``align`` (older
reports wrote "W26:RTZ p23" with W the alignment bits, or "W=23" with W the accumulator
bits; neither is written any more).

Sentence form: ``sentences(m)`` says in evaluation order what the GEMM does (the model
card); ``sentence(m)`` joins them (a report's ``model_summary``).
"""
from __future__ import annotations

from dataclasses import fields
from fractions import Fraction

from .errors import parse_enum
from .gemm import AlignRef, AlphaMode, GemmModel, ScalePoint, SplitReduce, get_preset
from .schedule import SplitOrder
from .rounding import Mode, Subnormal

__all__ = ["PARAMETERS", "ALIASES", "to_dict", "from_dict", "partition", "short", "parse_short",
           "sentences", "sentence", "hypothesis_name", "mode_words"]

# The meaning of every field of a report's model object (docs/report-schema.md).
PARAMETERS = {
    "name": "named model (e.g. probe_matched) or 'custom'",
    "product_format": "null: products exact; else the format products are rounded to",
    "fma_width": "F: products added together with the accumulator in one fused step",
    "align_bits": "null: fused step exact; else fraction bits kept when aligning to the largest exponent",
    "align_mode": "rounding of the alignment shift (RTZ = truncation)",
    "align_ref": "the exponent a term is aligned at: its value's, its factors' exponent sum, or the "
                 "formats' exponents (SCALE_EXPONENT_SUM)",
    "acc_frac_bits": "fraction bits of the accumulator after normalization (23 = FP32)",
    "norm_mode": "rounding of the normalization after each fused step",
    "acc_subnormal": "accumulator subnormals: KEEP or FLUSH",
    "group_size": "products per group/promotion interval before adding into the FP32 accumulator",
    "outer_mode": "rounding of the cross-group (promotion) additions",
    "scale_point": "where block scales apply: PRODUCT or GROUP",
    "lattice": "null or L: results snapped to multiples of L with RNE (e.g. '1/1024')",
    "split_k": "K split into this many slices, summed in FP32 RNE",
    "split_tile": "null: equal slices; else slices of ceil(K/split_k) rounded up to a multiple of it",
    "alpha_mode": "how per-tensor/row scales meet the accumulator",
    "output": "output format",
    "output_mode": "rounding to the output format",
    "exact_group": "null or n: inside a fused step, runs of n products summed exactly first",
    "chain": "true: each instruction of group_size products starts from the running FP32 accumulator",
    "overflow_inf": "true: a fused sum beyond the FP32 range becomes +-Inf",
    "exp_formats": "null or [a, b, scale]: the formats whose exponents SCALE_EXPONENT_SUM aligns at",
    "split_reduce": "how the split-K slice results are combined (each add FP32 RNE): SERIAL in order "
                    "(default), TREE a halving tree v[i] += v[i + ceil(n/2)] (cuBLAS fp32 gemv), PAIRWISE "
                    "by recursive halves, the first floor(n/2) then the rest (cuBLAS tf32 segment-K), or "
                    "'order=0+24+47,1+25,...' a measured chain of groups (reference.schedule.SplitOrder)",
}

# Other spellings older writers used -> GemmModel field.
ALIASES = {"output_format": "output", "promote_interval": "group_size",
           "promotion_interval": "group_size", "output_rounding": "output_mode",
           "products": "product_format"}

_FIELDS = tuple(f.name for f in fields(GemmModel))


# --- JSON form -------------------------------------------------------------------------------
def to_dict(m: GemmModel) -> dict:
    """The report's model object (JSON types; default-valued Blackwell fields left out)."""
    return m.to_dict()


def partition(d: dict) -> tuple[dict, dict]:
    """(model fields, other keys) of a report's model object, older spellings renamed."""
    known, others = {}, {}
    for k, v in d.items():
        f = ALIASES.get(k, k)
        (known if f in _FIELDS else others)[f if f in _FIELDS else k] = v
    return known, others


def from_dict(d: dict) -> GemmModel:
    """The model of a report's model object.  Older spellings (ALIASES) are read, absent
    fields take their defaults; ValueError for an unknown field or a bad value."""
    if not isinstance(d, dict):
        raise ValueError(f"model: expected an object of model fields, got {type(d).__name__}")
    known, others = partition(d)
    if others:
        raise ValueError(f"model: unknown fields {sorted(others)}; valid: {', '.join(_FIELDS)}")
    return GemmModel.from_dict(known)


# --- short form ------------------------------------------------------------------------------
# Every alignment reference but VALUE has a token (indexed, never defaulted: a new
# reference without one is a KeyError here, not a short form that silently drops it).
_REF = {AlignRef.EXPONENT_SUM: "esum", AlignRef.SCALE_EXPONENT_SUM: "scale-esum"}


def short(m: GemmModel, *, name: bool = False) -> str:
    """The one-line form (module doc); ``name``: lead with the model's name unless 'custom'."""
    t = [m.name] if name and m.name != "custom" else []
    t.append(f"F={m.fma_width}")
    if m.exact_group is not None:
        t.append(f"E={m.exact_group}")
    al = ["exact" if m.align_bits is None else str(m.align_bits)]
    if m.align_bits is not None or m.align_mode is not Mode.RTZ:
        al.append(m.align_mode.name)
    if m.align_ref is not AlignRef.VALUE:
        al.append(_REF[m.align_ref])
    acc = [str(m.acc_frac_bits), m.norm_mode.name]
    acc += ["FTZ"] if m.acc_subnormal is Subnormal.FLUSH else []
    acc += ["inf"] if m.overflow_inf else []
    g = ["-" if m.group_size is None else str(m.group_size)]
    if m.group_size is not None or m.outer_mode is not Mode.RNE:
        g.append(m.outer_mode.name)
    g += ["chain"] if m.chain else []
    t += ["align=" + ":".join(al), "acc=" + ":".join(acc), "G=" + ":".join(g)]
    unordered = m.split_reduce is not SplitReduce.SERIAL
    if m.split_k != 1 or m.split_tile is not None or unordered:
        t.append(f"split={m.split_k}" + (f"/T{m.split_tile}" if m.split_tile is not None else "")
                 + (":" + m.split_reduce.value if unordered else ""))
    if m.scale_point is not ScalePoint.PRODUCT:
        t.append(f"scale={m.scale_point.value}")
    if m.lattice is not None:
        t.append(f"L={m.lattice}")
    if m.product_format is not None:
        t.append(f"prod={m.product_format}")
    if m.alpha_mode is not AlphaMode.PREMULTIPLIED:
        t.append(f"alpha={m.alpha_mode.name}")
    if m.exp_formats is not None:
        t.append("expf=" + ",".join("-" if f is None else f for f in m.exp_formats))
    t.append(f"out={m.output}:{m.output_mode.name}")
    return " ".join(t)


def _int(key: str, text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"short form: {key}={text!r} is not an integer") from None


def _parts(key: str, parts: list, kw: dict, mode_field: str, flags: dict) -> None:
    """Each part after the head: a rounding mode (into ``mode_field``) or one of ``flags``
    (name -> (field, value))."""
    for p in parts:
        if p in flags:
            kw[flags[p][0]] = flags[p][1]
        elif p in Mode.__members__:
            kw[mode_field] = Mode[p]
        else:
            raise ValueError(f"short form: {key}: unknown part {p!r}; valid: a rounding mode "
                             f"({', '.join(Mode.__members__)}) or {', '.join(flags)}")


def _p_align(v, kw):
    head, *rest = v.split(":")
    kw["align_bits"] = None if head == "exact" else _int("align", head)
    _parts("align", rest, kw, "align_mode", {tok: ("align_ref", ref) for ref, tok in _REF.items()})


def _p_acc(v, kw):
    head, *rest = v.split(":")
    kw["acc_frac_bits"] = _int("acc", head)
    _parts("acc", rest, kw, "norm_mode", {"FTZ": ("acc_subnormal", Subnormal.FLUSH),
                                          "inf": ("overflow_inf", True)})


def _p_group(v, kw):
    head, *rest = v.split(":")
    kw["group_size"] = None if head == "-" else _int("G", head)
    _parts("G", rest, kw, "outer_mode", {"chain": ("chain", True)})


def _p_split(v, kw):
    v, *rest = v.split(":")
    valid = [r.value for r in SplitReduce if r is not SplitReduce.SERIAL] + ["order=G,G,... (G: slices joined by +)"]
    for p in rest:
        if p.startswith("order="):
            kw["split_reduce"] = SplitOrder.parse(p)
            continue
        if p not in valid:
            raise ValueError(f"short form: split: unknown part {p!r}; valid: {', '.join(valid)}")
        kw["split_reduce"] = SplitReduce(p)
    s, sep, t = v.partition("/T")
    kw["split_k"] = _int("split", s)
    if sep:
        kw["split_tile"] = _int("split tile", t)


def _p_out(v, kw):
    fmt, _, mode = v.partition(":")
    kw["output"] = fmt
    if mode:
        kw["output_mode"] = parse_enum("short form: out mode", mode, Mode)


_PARSE = {
    "F": lambda v, kw: kw.__setitem__("fma_width", _int("F", v)),
    "E": lambda v, kw: kw.__setitem__("exact_group", _int("E", v)),
    "align": _p_align, "acc": _p_acc, "G": _p_group, "split": _p_split,
    "scale": lambda v, kw: kw.__setitem__("scale_point", parse_enum("short form: scale", v, ScalePoint)),
    "L": lambda v, kw: kw.__setitem__("lattice", Fraction(v)),
    "prod": lambda v, kw: kw.__setitem__("product_format", v),
    "alpha": lambda v, kw: kw.__setitem__("alpha_mode", parse_enum("short form: alpha", v, AlphaMode)),
    "expf": lambda v, kw: kw.__setitem__("exp_formats", tuple(None if f == "-" else f for f in v.split(","))),
    "out": _p_out,
}


def parse_short(text: str) -> GemmModel:
    """The model a short form names (a leading token without '=' is its name)."""
    toks = str(text).split()
    kw: dict = {}
    if toks and "=" not in toks[0]:
        kw["name"] = toks.pop(0)
    seen = set()
    for tok in toks:
        key, sep, val = tok.partition("=")
        if not sep or key not in _PARSE:
            raise ValueError(f"short form: unknown token {tok!r}; valid keys: {', '.join(_PARSE)}")
        if key in seen:
            raise ValueError(f"short form: {key}= given twice in {text!r}")
        seen.add(key)
        _PARSE[key](val, kw)
    return GemmModel(**kw)


# --- sentence form ---------------------------------------------------------------------------
_MODE_WORDS = {
    Mode.RNE: "round to nearest, ties to even (RNE)",
    Mode.RNA: "round to nearest, ties away from zero (RNA)",
    Mode.RTZ: "truncated, i.e. rounded toward zero (RTZ)",
    Mode.RUP: "rounded toward +infinity (RUP)",
    Mode.RDN: "rounded toward -infinity (RDN)",
    Mode.RTO: "round to odd (RTO)",
    Mode.SR: "stochastic rounding (SR)",
}


def mode_words(m: Mode) -> str:
    return _MODE_WORDS[m]


def _lattice_words(lat: Fraction) -> str:
    if lat.numerator == 1 and lat.denominator & (lat.denominator - 1) == 0:
        return f"1/{lat.denominator} (2^-{lat.denominator.bit_length() - 1})"
    return str(lat)


def _product_words(m: GemmModel) -> list[str]:
    scales = " Block scales, if any, multiply each product exactly." if m.scale_point is ScalePoint.PRODUCT else ""
    if m.product_format is None:
        out = ["Products a*b are exact (no rounding)." + scales]
    else:
        out = [f"Each product a*b is rounded to {m.product_format}." + scales]
    if m.scale_point is ScalePoint.GROUP:
        out.append("Block scales multiply each rounded group partial sum (scale applied per group).")
    return out


# How a fused step's alignment reads, per reference (SCALE_EXPONENT_SUM: its own sentence,
# _mma_words).  Indexed: a new reference needs its words here.
_REF_WORDS = {AlignRef.VALUE: "", AlignRef.SCALE_EXPONENT_SUM: "",
              AlignRef.EXPONENT_SUM: " (a product's exponent is the sum of its factors' exponents, "
                                     "taken before the significand product is normalized)"}


def _step_words(m: GemmModel) -> list[str]:
    F, ab, W = m.fma_width, m.align_bits, m.acc_frac_bits
    if F >= 1 << 20 and ab is None:
        return ["All products are summed exactly and rounded once (no intermediate rounding)."]
    if F == 1 and ab is None:
        return ["Products are added to the accumulator one at a time; each addition is exact, then rounded."]
    step = f"{F} products plus the running accumulator are added in one fused step"
    if ab is None:
        return [step + "; inside the step the sum is exact."]
    extra = f" ({W}+{ab - W})" if ab > W else ""
    ref = _REF_WORDS[m.align_ref]
    return [step + f": every term is aligned to the largest exponent among them{ref}, keeping "
            f"{ab}{extra} fraction bits; bits shifted out are {mode_words(m.align_mode)}."]


def _mma_words(m: GemmModel) -> list[str]:
    """The Blackwell MMA fields (issue 17), in words."""
    out = []
    if m.exact_group is not None:
        out.append(f"Inside a fused step, each run of {m.exact_group} products is summed exactly first "
                   "and enters as one addend.")
    if m.align_ref is AlignRef.SCALE_EXPONENT_SUM:
        ef = m.exp_formats or ("float32",) * 3
        out.append("Addends are aligned at exponents read from the formats, not from their values: a product "
                   "at the sum of its factors' exponents, an exact run at its block scales' exponent sum, "
                   "zeros and subnormals at the format's smallest normal exponent "
                   f"(formats {', '.join(map(str, ef))}).")
    if m.overflow_inf:
        out.append("A fused sum beyond the FP32 range becomes +-infinity.")
    return out


def _accumulator_words(m: GemmModel) -> list[str]:
    fp32 = " (FP32 precision)" if m.acc_frac_bits == 23 else ""
    out = [f"After each step the accumulator is normalized to {m.acc_frac_bits} fraction bits{fp32}, "
           f"{mode_words(m.norm_mode)}."]
    if m.acc_subnormal is Subnormal.FLUSH:
        out.append("Accumulator results below the smallest normal are flushed to zero.")
    G = m.group_size
    if G is not None and m.chain:
        out.append(f"Instructions of K={G} are chained along K: the running FP32 accumulator enters "
                   f"each instruction's fused add as C, and each instruction's result is rounded to FP32.")
    elif G is not None:
        out.append(f"Every {G} products the partial sum is added (promoted) into a separate FP32 "
                   f"accumulator, in order; those additions are {mode_words(m.outer_mode)}.")
    return out


def _epilogue_words(m: GemmModel) -> list[str]:
    out = []
    if m.split_k > 1:
        tile = f" (tiles of {m.split_tile})" if m.split_tile else ""
        if m.split_reduce is SplitReduce.TREE:
            out.append(f"K is split into {m.split_k} slices{tile} reduced separately, then combined by a "
                       "halving tree in FP32 (RNE): of n partial results, each i < n - ceil(n/2) adds "
                       "result i + ceil(n/2), leaving ceil(n/2), until one is left.")
        elif isinstance(m.split_reduce, SplitOrder):
            out.append(f"K is split into {m.split_k} slices{tile} reduced separately, then combined "
                       "in a measured order in FP32 (RNE): each group (slices joined by +) added in "
                       "its order, then the group sums in order: "
                       + m.split_reduce.value[len("order="):] + ".")
        elif m.split_reduce is SplitReduce.PAIRWISE:
            out.append(f"K is split into {m.split_k} slices{tile} reduced separately, then combined "
                       "pairwise in FP32 (RNE): the first floor(n/2) partial results and the rest, "
                       "each half combined the same way, then the two added.")
        else:
            out.append(f"K is split into {m.split_k} slices{tile} reduced separately, then added in "
                       "FP32 (RNE).")
    if m.lattice is not None:
        out.append(f"The result is snapped to multiples of {_lattice_words(m.lattice)}, ties to even.")
    if m.alpha_mode is not AlphaMode.PREMULTIPLIED:
        out.append(f"Per-tensor scales (alpha) are applied: {m.alpha_mode.name.lower()}.")
    out.append(f"Output: {mode_words(m.output_mode)} to {m.output}.")
    return out


def sentences(m: GemmModel) -> list[str]:
    """What the GEMM does, in evaluation order, one sentence per step of the schedule."""
    return (_product_words(m) + _step_words(m) + _mma_words(m) + _accumulator_words(m)
            + _epilogue_words(m))


def sentence(m: GemmModel) -> str:
    """The sentences as one paragraph (a report's model_summary)."""
    return " ".join(sentences(m))


def hypothesis_name(m: GemmModel) -> str:
    """The named hypothesis a model is, in words (model cards, the probe's notes); 'general
    family' when it is none of them."""
    if not m.chain:
        seed = get_preset("probe_matched")
        keys = ("product_format", "fma_width", "align_bits", "acc_frac_bits", "norm_mode", "acc_subnormal",
                "group_size", "outer_mode", "scale_point", "split_k", "exact_group", "align_ref",
                "split_reduce")
        if any(getattr(m, k) != getattr(seed, k) for k in keys):
            return "general family"
        return "seed probe_matched" + (f" with the {m.lattice} lattice" if m.lattice is not None else "")
    kind = ("mxf4nvf4" if m.exact_group == 16 and m.group_size == 64 else
            "mxf8f6f4" if m.exact_group is None and m.group_size == 32 else "neighbour")
    words = (f"Blackwell {kind} chain (instruction K {m.group_size}, exact groups of "
             f"{m.exact_group or 1}, {m.align_bits} fraction bits {m.align_mode.name}, "
             f"{m.norm_mode.name} per instruction, aligned by {m.align_ref.name.lower().replace('_', ' ')}")
    if m.split_k > 1:
        words += f", split-K {m.split_k}" + ("" if m.split_reduce is SplitReduce.SERIAL
                                             else f" ({m.split_reduce.value})")
    if m.lattice is not None:
        words += f", lattice {m.lattice}"
    return words + ")"
