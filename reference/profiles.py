"""Named cast profiles: third-party casts as exact (format, Mode, Policy) points.

Each profile was determined by experiment with the installed library and is
proven bit for bit by tests/test_oracles.py (all bf16/fp16 bit patterns and
over 10**6 float32 inputs, every tie point included).  Inputs are float32
(bf16/fp16 widen exactly).  Both libraries cast float64 through float32 first
(double rounding: e.g. 1.125 + 2**-40 -> e5m2 gives 1.0, not 1.25); that is
``via_float32`` below, and a float64 input must be rounded to float32 (RNE)
before the profile applies.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from .errors import check_choice
from .formats import FormatSpec, get_format
from .rounding import Mode, Policy

__all__ = ["CastProfile", "CAST_PROFILES", "get_cast_profile", "cast_profile_names"]


@dataclass(frozen=True)
class CastProfile:
    name: str
    library: str          # "ml_dtypes 0.6.0", "torch 2.13"
    fmt: str              # a FORMATS name
    mode: Mode
    policy: Policy
    description: str
    via_float32: bool = True  # float64 inputs are rounded to float32 (RNE) first

    @property
    def spec(self) -> FormatSpec:
        return get_format(self.fmt)


def _p(**kw) -> Policy:
    return Policy.make(**kw)


# ml_dtypes 0.6.0 float4/float6 (no NaN, no inf): RNE, saturate finite
# overflow and +-inf to +-max, NaN -> zero of the *opposite* sign (a positive
# NaN gives -0, a negative NaN +0; payload ignored).
_ML_SMALL = _p(overflow="satfinite", inf="saturate", nan="to_zero_flip_sign", negative="raise")

_PROFILES = (
    CastProfile("ml_dtypes.float4_e2m1fn", "ml_dtypes 0.6.0", "float4_e2m1fn", Mode.RNE, _ML_SMALL,
                "RNE; |x| > 6 (and +-inf) saturate to +-6; NaN -> zero with the NaN's sign flipped"),
    CastProfile("ml_dtypes.float6_e2m3fn", "ml_dtypes 0.6.0", "float6_e2m3fn", Mode.RNE, _ML_SMALL,
                "RNE; saturate to +-7.5 (inf too); NaN -> zero with the NaN's sign flipped"),
    CastProfile("ml_dtypes.float6_e3m2fn", "ml_dtypes 0.6.0", "float6_e3m2fn", Mode.RNE, _ML_SMALL,
                "RNE; saturate to +-28 (inf too); NaN -> zero with the NaN's sign flipped"),
    CastProfile("ml_dtypes.float8_e4m3fn", "ml_dtypes 0.6.0", "float8_e4m3fn", Mode.RNE,
                _p(overflow="ieee", inf="propagate", nan="preserve_sign"),
                "RNE, no saturation: |x| > 464 (rounds above 448) and +-inf -> NaN carrying the "
                "input's sign (0x7F/0xFF); NaN keeps its sign"),
    CastProfile("ml_dtypes.float8_e5m2", "ml_dtypes 0.6.0", "float8_e5m2", Mode.RNE,
                _p(overflow="ieee", inf="propagate", nan="preserve_sign"),
                "IEEE RNE: overflow -> +-inf; NaN -> quiet NaN 0x7E/0xFE with the input's sign"),
    CastProfile("ml_dtypes.float8_e8m0fnu", "ml_dtypes 0.6.0", "float8_e8m0fnu", Mode.RNA,
                _p(overflow="ieee", inf="propagate", nan="canonical", no_zero="nan_if_zero",
                   negative="nan", subnormal="min_as_zero"),
                "ties round up (RNA on the power-of-two grid: 1.5 -> 2, 3 -> 4); x >= 1.5*2**127, "
                "+-inf, NaN, +-0 and negatives -> NaN 0xFF; below 2**-126 the smallest code acts "
                "as zero (fp32 subnormal path): 0 < x <= 2**-127 -> 0x00, 2**-127 < x < 2**-126 -> 0x01"),
    CastProfile("torch.float8_e4m3fn", "torch 2.13", "float8_e4m3fn", Mode.RNE,
                _p(overflow="satfinite", inf="saturate", nan="preserve_sign"),
                "RNE; finite overflow and +-inf saturate to +-448; NaN keeps its sign (0x7F/0xFF)"),
    CastProfile("torch.float8_e5m2", "torch 2.13", "float8_e5m2", Mode.RNE,
                _p(overflow="ieee", inf="propagate", nan="signed_all_ones"),
                "IEEE RNE: overflow -> +-inf; NaN -> 0x7F/0xFF (all-ones payload, input's sign)"),
    CastProfile("torch.float8_e8m0fnu", "torch 2.13", "float8_e8m0fnu", Mode.RNA,
                _p(overflow="ieee", inf="propagate", nan="canonical", no_zero="to_min",
                   negative="abs", subnormal="min_as_zero"),
                "sign ignored (|x|); ties round up (RNA: 1.5 -> 2, 3 -> 4); |x| >= 1.5*2**127, "
                "+-inf and NaN -> 0xFF; below 2**-126 the smallest code acts as zero (fp32 "
                "subnormal path): |x| <= 2**-127 (+-0 too) -> 0x00, 2**-127 < |x| < 2**-126 -> 0x01"),
)

CAST_PROFILES: Mapping[str, CastProfile] = {p.name: p for p in _PROFILES}


def cast_profile_names() -> tuple[str, ...]:
    return tuple(CAST_PROFILES)


def get_cast_profile(name: "str | CastProfile") -> CastProfile:
    if isinstance(name, CastProfile):
        return name
    return CAST_PROFILES[check_choice("profile", name, CAST_PROFILES)]
