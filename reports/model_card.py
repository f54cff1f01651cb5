"""A GEMM model's parameters (reference.gemm.GemmModel.to_dict()) in plain words."""
from __future__ import annotations

from fractions import Fraction

__all__ = ["describe_model", "hypothesis_words", "STATUS_WORDS", "KIND_WORDS", "mode_words"]

_MODES = {
    "RNE": "round to nearest, ties to even (RNE)",
    "RNA": "round to nearest, ties away from zero (RNA)",
    "RTZ": "truncated, i.e. rounded toward zero (RTZ)",
    "RUP": "rounded toward +infinity (RUP)",
    "RDN": "rounded toward -infinity (RDN)",
    "RTO": "round to odd (RTO)",
    "SR": "stochastic rounding (SR)",
}

STATUS_WORDS = {
    "fit": "a model in the family reproduces every validated output bit for bit",
    "no_fit": "no model in the family reproduces this GEMM; the evidence is below",
    "partial": "the inferred model reproduces every output at some validated shapes; at the "
               "others the library runs another kernel that no model of the family fits",
    "nondeterministic": "identical inputs gave different outputs between runs, so no "
                        "bit-exact model can describe it",
    "error": "the run failed before a model could be inferred",
    "skipped": "not run here",
}

KIND_WORDS = {
    "virtual": "a virtual device: the exact reference playing a known GEMM model (checks the "
               "probe machinery, not a GPU)",
    "cpu": "a CPU library",
    "cuda": "a CUDA GPU library",
    "blackwell-only": "a path that needs a Blackwell GPU (sm_100 or newer)",
}

# Other spellings writers may use -> GemmModel field.
_ALIASES = {"output_format": "output", "promote_interval": "group_size",
            "promotion_interval": "group_size", "output_rounding": "output_mode",
            "products": "product_format"}

_KNOWN = ("name", "product_format", "fma_width", "align_bits", "align_mode", "align_ref", "acc_frac_bits",
          "norm_mode", "acc_subnormal", "group_size", "outer_mode", "scale_point", "lattice",
          "split_k", "alpha_mode", "output", "output_mode",
          "exact_group", "chain", "overflow_inf", "exp_formats", "split_tile")

_MATCHED = "matched the Blackwell hypothesis"  # probes.infer's note for a block-scaled fit


def mode_words(m) -> str:
    if isinstance(m, str) and m.upper() in _MODES:
        return _MODES[m.upper()]
    return f"rounded with {m}"


def _short_mode(m) -> str:
    return str(m).upper() if isinstance(m, str) else str(m)


def _lattice_words(lat) -> str:
    try:
        f = Fraction(str(lat))
    except (ValueError, ZeroDivisionError):
        return str(lat)
    if f > 0 and f.numerator == 1 and f.denominator & (f.denominator - 1) == 0:
        return f"1/{f.denominator} (2^-{f.denominator.bit_length() - 1})"
    return str(f)


def hypothesis_words(model: dict | None, notes=None) -> list[str]:
    """Which hypothesis the device matched, in words, and the crafted probe that decided it
    (from the inference's note); without that note, the hypothesis the model itself is
    (probes.infer.hypothesis_name), when it is one of the named ones."""
    for n in notes or ():
        if isinstance(n, str) and n.startswith(_MATCHED):
            return [n[0].upper() + n[1:] + "."]
    if not model:
        return []
    from probes.infer import hypothesis_name
    from reference.gemm import GemmModel
    try:
        name = hypothesis_name(GemmModel.from_dict(dict(model)))
    except (TypeError, ValueError, KeyError):  # a hand-written or older record: no hypothesis
        return []
    return [] if name == "general family" else [f"Hypothesis: {name}."]


def describe_model(model: dict | None, status: str | None = None, notes=None) -> list[str]:
    """Sentences, in evaluation order, saying what the GEMM does; unknown keys listed last.
    ``notes``: the device's notes, for the hypothesis it matched and the deciding probe."""
    if not model:
        return []
    m = {}
    for k, v in model.items():
        m[_ALIASES.get(k, k)] = v
    out: list[str] = []
    name = m.get("name")
    if isinstance(name, str) and name not in ("", "custom"):
        out.append(f"Closest named model: {name}." if status == "no_fit" else f"Named model: {name}.")
    if status != "no_fit":
        out += hypothesis_words(model, notes)

    pf = m.get("product_format")
    sp = str(m.get("scale_point") or "").upper()
    scales = " Block scales, if any, multiply each product exactly." if sp == "PRODUCT" else ""
    if pf in (None, "exact"):
        out.append("Products a*b are exact (no rounding)." + scales)
    else:
        out.append(f"Each product a*b is rounded to {pf}." + scales)
    if sp == "GROUP":
        out.append("Block scales multiply each rounded group partial sum (scale applied per group).")
    elif sp not in ("", "PRODUCT"):
        out.append(f"Block scales applied at: {m.get('scale_point')}.")

    F = m.get("fma_width")
    ab = m.get("align_bits")
    W = m.get("acc_frac_bits")
    if isinstance(F, int) and F >= 1 << 20 and ab is None:
        out.append("All products are summed exactly and rounded once (no intermediate rounding).")
    elif F == 1 and ab is None:
        out.append("Products are added to the accumulator one at a time; each addition is exact, "
                   "then rounded.")
    elif F is not None:
        step = f"{F} products plus the running accumulator are added in one fused step"
        if ab is None:
            out.append(step + "; inside the step the sum is exact.")
        else:
            extra = f" ({W}+{ab - W})" if isinstance(W, int) and isinstance(ab, int) and ab > W else ""
            ref = (" (a product's exponent is the sum of its factors' exponents, taken before "
                   "the significand product is normalized)" if m.get("align_ref") == "EXPONENT_SUM" else "")
            out.append(step + f": every term is aligned to the largest exponent among them{ref}, keeping "
                       f"{ab}{extra} fraction bits; bits shifted out are "
                       f"{mode_words(m.get('align_mode', 'RTZ'))}.")
    out += _mma_words(m)
    if W is not None:
        fp32 = " (FP32 precision)" if W == 23 else ""
        out.append(f"After each step the accumulator is normalized to {W} fraction bits{fp32}, "
                   f"{mode_words(m.get('norm_mode', 'RNE'))}.")
    sub = m.get("acc_subnormal")
    if isinstance(sub, str) and sub.upper() == "FLUSH":
        out.append("Accumulator results below the smallest normal are flushed to zero.")

    G = m.get("group_size")
    if G is not None and m.get("chain"):
        out.append(f"Instructions of K={G} are chained along K: the running FP32 accumulator enters "
                   f"each instruction's fused add as C, and each instruction's result is rounded to FP32.")
    elif G is not None:
        out.append(f"Every {G} products the partial sum is added (promoted) into a separate FP32 "
                   f"accumulator, in order; those additions are {mode_words(m.get('outer_mode', 'RNE'))}.")
    sk = m.get("split_k")
    if isinstance(sk, int) and sk > 1:
        tile = f" (tiles of {m['split_tile']})" if m.get("split_tile") else ""
        out.append(f"K is split into {sk} slices{tile} reduced separately, then added in FP32 (RNE).")
    lat = m.get("lattice")
    if lat is not None:
        out.append(f"The result is snapped to multiples of {_lattice_words(lat)}, ties to even.")
    am = m.get("alpha_mode")
    if am is not None and (m.get("alpha") is not None or str(am).upper() != "PREMULTIPLIED"):
        out.append(f"Per-tensor scales (alpha) are applied: {str(am).lower()}.")
    outf = m.get("output")
    if outf is not None:
        out.append(f"Output: {mode_words(m.get('output_mode', 'RNE'))} to {outf}.")

    others = [f"{k} = {v}" for k, v in m.items() if k not in _KNOWN]
    if others:
        out.append("Other parameters: " + "; ".join(others) + ".")
    return out


def _mma_words(m: dict) -> list[str]:
    """The Blackwell MMA fields (issue 17), in words."""
    out = []
    if m.get("exact_group") is not None:
        out.append(f"Inside a fused step, each run of {m['exact_group']} products is summed exactly first "
                   "and enters as one addend.")
    if m.get("align_ref") == "SCALE_EXPONENT_SUM":
        ef = m.get("exp_formats") or ["float32"] * 3
        out.append("Addends are aligned at exponents read from the formats, not from their values: a product "
                   "at the sum of its factors' exponents, an exact run at its block scales' exponent sum, "
                   "zeros and subnormals at the format's smallest normal exponent "
                   f"(formats {', '.join(map(str, ef))}).")
    if m.get("overflow_inf"):
        out.append("A fused sum beyond the FP32 range becomes +-infinity.")
    return out


def one_line(model: dict | None) -> str:
    """Compact form for tables: 'F=16 W=23+3 RTZ/RTZ G=128 out=bfloat16'."""
    if not model:
        return ""
    m = {_ALIASES.get(k, k): v for k, v in model.items()}
    parts = []
    if m.get("name") not in (None, "", "custom"):
        parts.append(str(m["name"]))
    if m.get("fma_width") is not None:
        parts.append(f"F={m['fma_width']}")
    if m.get("align_bits") is not None:
        parts.append(f"align={m['align_bits']} {_short_mode(m.get('align_mode', 'RTZ'))}"
                     + (" esum" if m.get("align_ref") == "EXPONENT_SUM" else ""))
    if m.get("acc_frac_bits") is not None:
        parts.append(f"W={m['acc_frac_bits']} {_short_mode(m.get('norm_mode', 'RNE'))}")
    if m.get("group_size") is not None:
        parts.append(f"G={m['group_size']} {_short_mode(m.get('outer_mode', 'RNE'))}")
    if m.get("lattice") is not None:
        parts.append(f"L={m['lattice']}")
    if m.get("output") is not None:
        parts.append(f"out={m['output']}")
    return " ".join(parts)
