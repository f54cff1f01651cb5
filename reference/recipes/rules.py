"""The enumerated choices of the recipe rules: one enum per rule field.

Every field of ``TwoLevelRule`` (nvfp4.py) and ``MXRule`` (mx.py) that selects a
variant of a rule is one of these enums.  They are ``StrEnum``: a rule may still be
spelled with the plain strings ("te_mul"), and a member compares equal to its string.
``choose`` turns a value into its member at construction; any other value is a
ValueError naming the field, the value and the valid choices, so no dispatcher on
these fields ever meets an unknown value (each still ends in ``unreachable``).
"""
from __future__ import annotations

import enum
from fractions import Fraction
from typing import NoReturn

__all__ = ["Family", "TensorScale", "ZeroAmax", "BlockScale", "EncodeRule", "PreRound",
           "ElemCast", "ElemNan", "FourOverSix", "RhtAccum", "Pad", "Copy", "ScaleMode",
           "DataPath", "Log2Rule", "BlockSpecials", "choose", "check_flag",
           "check_positive_fraction", "unreachable"]


class Family(enum.StrEnum):
    """Which module implements a recipe profile."""
    NVFP4 = "nvfp4"              # two-level E2M1 with E4M3 block scales (nvfp4.py)
    UE5M3 = "ue5m3"              # two-level E2M1 with UE5M3 block scales (ue5m3.py)
    MX = "mx"                    # E8M0 block scales (mx.py)
    QUARTET = "quartet"          # Hadamard + MXFP4 training quantizers (quartet.py)
    FUSION = "fusion"            # format-aware fusion scale domains (fusion.py)
    FP8_SCALING = "fp8_scaling"  # a per-tensor FP8 scale rule, not a quantizer (scaling.py)


# --- two-level (NVFP4 / UE5M3) rules: see TwoLevelRule for the formulas -----------------
class TensorScale(enum.StrEnum):
    TE = "te"                # S_enc = fl(fl(T*6) / amax), min FLT_MAX (te_s_enc)
    TORCHAO = "torchao"      # decode scale pts = fl(amax / 2688), or given
    NONE = "none"            # one level: no per-tensor scale


class ZeroAmax(enum.StrEnum):
    ONE = "one"              # amax == 0 gives S_enc = 1 (TE's CUDA kernel)
    FLT_MAX = "flt_max"      # S_enc stays FLT_MAX (TE's Python reference)


class BlockScale(enum.StrEnum):
    TE_MUL = "te_mul"        # fl(vec_max * fl(S_enc * fl(1/6)))
    DIV_FIRST = "div_first"  # fl(fl(vec_max / 6) * S_enc)   (TE 2025-09, TE 4over6)
    TORCHAO = "torchao"      # fl(fl(vec_max / 6) / pts)
    SINGLE = "single"        # fl(vec_max / 6)


class EncodeRule(enum.StrEnum):
    TE = "te"                # q = fl(x * min(fl(1 / fl(s * fl(1/S_enc))), FLT_MAX))
    TORCHAO2 = "torchao2"    # q = fl(x * fl(fl(1/pts) / s))
    TORCHAO1 = "torchao1"    # q = fl(x * fl(1/s))
    DIVIDE = "divide"        # q = fl(x / s), +0 where s == 0


class PreRound(enum.StrEnum):
    BFLOAT16 = "bfloat16"    # q rounded to bf16 (RNE) before the element cast


class ElemCast(enum.StrEnum):
    """Element cast rules (elem.py; each profile family allows a subset)."""
    RNE = "rne"                    # exact rounding, satfinite, sign of zero kept
    TE_REF = "te_ref"              # TE's interval table: -0 and NaN -> code 0
    TORCHAO = "torchao"            # torchao's float4/6 bit trick (torch cast for float8)
    TORCH = "torch"                # torch's eager float8 cast
    PYTORCH_TEST = "pytorch_test"  # bf16 first (float4), then as torchao


class ElemNan(enum.StrEnum):
    """A NaN element under the RNE cast."""
    MAX = "max"              # +max finite (our reading of PTX .satfinite for e2m1x2)
    ZERO = "zero"            # +0
    NAN = "nan"              # the format's NaN (formats with one)


class FourOverSix(enum.StrEnum):
    MAE = "mae"              # per block, map-to-4 iff its summed |error| is smaller
    MSE = "mse"              # the same with squared errors


class RhtAccum(enum.StrEnum):
    EXACT = "exact"          # RHT16: the exact sum rounded once to bf16


class Pad(enum.StrEnum):
    ZERO = "zero"            # pad rows/cols to the tile with +0
    RAISE = "raise"          # shapes must divide the tile


class Copy(enum.StrEnum):
    ROWWISE = "rowwise"          # blocks along rows of x
    COLUMNWISE = "columnwise"    # blocks along rows of x.T


# --- MX rules: see MXRule ------------------------------------------------------------
class ScaleMode(enum.StrEnum):
    FLOOR = "floor"
    CEIL = "ceil"
    EVEN = "even"
    RCEIL = "rceil"


class DataPath(enum.StrEnum):
    EXACT = "exact"
    TORCHAO = "torchao"
    PYTORCH_TEST = "pytorch_test"


class Log2Rule(enum.StrEnum):
    EXACT = "exact"          # exact binade
    TORCH_F32 = "torch_f32"  # ceil(RN_f32(log2 d)) as torch.log2 computes it


class BlockSpecials(enum.StrEnum):
    NAN_SCALE = "nan_scale"  # NaN/Inf in a block: scale 0xFF, codes NaN / +0
    UPSTREAM = "upstream"    # whatever the data path computes


def choose(field: str, value, enum_cls: type[enum.Enum], allowed=None, *, optional=False):
    """``value`` (a member or its string) as a member of ``enum_cls``, restricted to
    ``allowed`` when given; None passes when ``optional``.  Otherwise ValueError naming
    the field, the value and the valid choices."""
    if value is None and optional:
        return None
    choices = tuple(enum_cls) if allowed is None else tuple(allowed)
    member = enum_cls._value2member_map_.get(value) if isinstance(value, str) else None
    if member is None or member not in choices:
        valid = ", ".join((["None"] if optional else []) + [m.value for m in choices])
        raise ValueError(f"{field}: unknown value {value!r}; valid choices: {valid}")
    return member


def check_flag(field: str, value) -> bool:
    if type(value) is not bool:
        raise ValueError(f"{field}: {value!r} is not a bool; valid choices: True, False")
    return value


def check_positive_fraction(field: str, value) -> Fraction:
    """A finite rational > 0 (ints, Fractions, finite floats) as a Fraction."""
    try:
        v = Fraction(value) if not isinstance(value, bool) else None
    except (TypeError, ValueError, OverflowError):
        v = None
    if v is None or v <= 0:
        raise ValueError(f"{field}: {value!r} is not a finite number > 0")
    return v


def unreachable(field: str, value) -> NoReturn:
    """The last branch of a dispatcher on a rule field: construction checked the field,
    so reaching this is a bug (a member added to an enum without its arithmetic)."""
    raise ValueError(f"{field}: no implementation for {value!r} here (a rule field checked at "
                     "construction reached a dispatcher that does not handle it)")
