"""The FormatSpec table: derived properties against SPEC section 1 literals and
third-party decoders (numpy, ml_dtypes, torch)."""
from __future__ import annotations

import math
from fractions import Fraction as F

import ml_dtypes
import numpy as np
import pytest
import torch

from reference.exact import Exact, Kind, exact, floor_log2, pow2
from reference.formats import FORMATS, CodeClass, Specials, get_format, small_formats

P = pow2

# name: (nbits, max finite, min normal, min subnormal) -- SPEC section 1
SPEC = {
    "float4_e2m1fn": (4, F(6), F(1), F(1, 2)),
    "float6_e2m3fn": (6, F(15, 2), F(1), F(1, 8)),
    "float6_e3m2fn": (6, F(28), F(1, 4), F(1, 16)),
    "float8_e4m3fn": (8, F(448), P(-6), P(-9)),
    "float8_e5m2": (8, F(57344), P(-14), P(-16)),
    "ue4m3": (7, F(448), P(-6), P(-9)),
    "ue5m3": (8, F(61440), P(-14), P(-17)),
    "float8_e8m0fnu": (8, P(127), P(-127), None),
    "bfloat16": (16, F(2**8 - 1) * P(120), P(-126), P(-133)),
    "float16": (16, F(65504), P(-14), P(-24)),
    "tf32": (19, F(2**11 - 1) * P(117), P(-126), P(-136)),
    "float32": (32, F(2**24 - 1) * P(104), P(-126), P(-149)),
}


@pytest.mark.parametrize("name", list(SPEC))
def test_derived_properties_match_spec_literals(name):
    nbits, mx, mn, sub = SPEC[name]
    f = get_format(name)
    assert f.nbits == nbits
    assert f.max_finite == mx
    assert f.min_normal == mn
    assert f.min_subnormal == sub


def test_table_has_every_spec_format():
    assert set(FORMATS) == set(SPEC)
    assert {f.name for f in small_formats()} == {n for n, v in SPEC.items() if v[0] <= 8}


def test_e2m1_value_list():
    vals = [v for _, v in get_format("float4_e2m1fn").finite_values]
    assert vals == [F(0), F(1, 2), F(1), F(3, 2), F(2), F(3), F(4), F(6)]


def test_spec_quotes():
    assert get_format("ue5m3").max_finite == F(15, 8) * P(15) == 61440
    assert get_format("float8_e8m0fnu").max_finite == P(127)
    assert get_format("float8_e8m0fnu").min_normal == P(-127)
    # wide formats against numpy / ml_dtypes finfo
    for name, dt in (("float16", np.float16), ("float32", np.float32), ("bfloat16", ml_dtypes.bfloat16)):
        fi = ml_dtypes.finfo(dt)
        f = get_format(name)
        assert f.max_finite == F(float(fi.max))
        assert f.min_normal == F(float(fi.smallest_normal))
        assert f.min_subnormal == F(float(fi.smallest_subnormal))


# counts of each code class, from the SPEC specials column
CLASS_COUNTS = {
    "float4_e2m1fn": {"nan": 0, "inf": 0, "zero": 2},
    "float6_e2m3fn": {"nan": 0, "inf": 0, "zero": 2},
    "float6_e3m2fn": {"nan": 0, "inf": 0, "zero": 2},
    "float8_e4m3fn": {"nan": 2, "inf": 0, "zero": 2},       # S.1111.111
    "float8_e5m2": {"nan": 6, "inf": 2, "zero": 2},         # IEEE
    "ue4m3": {"nan": 1, "inf": 0, "zero": 1},               # 0x7F
    "ue5m3": {"nan": 7, "inf": 1, "zero": 1},               # exponent field 31
    "float8_e8m0fnu": {"nan": 1, "inf": 0, "zero": 0},      # 0xFF, no zero
}


@pytest.mark.parametrize("name", list(CLASS_COUNTS))
def test_code_classes(name):
    f = get_format(name)
    cls = [f.classify(c) for c in range(f.ncodes)]
    exp = CLASS_COUNTS[name]
    assert cls.count(CodeClass.NAN) == exp["nan"]
    assert cls.count(CodeClass.INF) == exp["inf"]
    assert cls.count(CodeClass.ZERO) == exp["zero"]
    if f.has_nan:
        assert f.classify(f.nan_code) is CodeClass.NAN
    if f.has_inf:
        assert f.decode(f.inf_code) == Exact(Kind.INF, False)


def test_named_codes():
    assert get_format("float8_e4m3fn").nan_code == 0x7F
    assert get_format("ue4m3").nan_code == 0x7F
    assert get_format("float8_e8m0fnu").nan_code == 0xFF
    assert get_format("float8_e5m2").inf_code == 0x7C
    assert get_format("float8_e8m0fnu").decode(0).mag == P(-127)
    assert get_format("float8_e8m0fnu").decode(0xFE).mag == P(127)
    assert get_format("ue5m3").decode(0xF7).mag == 61440


def _numpy_decode(name):
    """All codes decoded by a third-party library (float64 array), or None."""
    c8 = np.arange(256, dtype=np.uint8)
    if name in ("float4_e2m1fn", "float6_e2m3fn", "float6_e3m2fn", "float8_e4m3fn",
                "float8_e5m2", "float8_e8m0fnu"):
        n = get_format(name).ncodes
        return c8[:n].view(getattr(ml_dtypes, name)).astype(np.float64)
    if name == "ue4m3":  # positive half of e4m3fn
        return c8[:128].view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    if name == "bfloat16":
        with np.errstate(invalid="ignore"):
            return np.arange(65536, dtype=np.uint32).astype(np.uint16).view(ml_dtypes.bfloat16).astype(np.float64)
    if name == "float16":
        return np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float64)
    return None


@pytest.mark.parametrize("name", [n for n in SPEC if _numpy_decode(n) is not None])
def test_decode_every_code_matches_third_party(name):
    f = get_format(name)
    lib = _numpy_decode(name)
    for c in range(f.ncodes):
        d, v = f.decode(c), lib[c]
        if math.isnan(v):
            assert d.is_nan
        elif math.isinf(v):
            assert d.is_inf and d.negative == (v < 0)
        else:
            assert d.is_finite and d.to_fraction() == F(float(v))
            assert d.negative == (math.copysign(1, v) < 0)


def test_decode_ue5m3_against_a_formula():
    f = get_format("ue5m3")
    for c in range(256):
        e, m = c >> 3, c & 7
        d = f.decode(c)
        if e == 31:
            assert d.is_inf if m == 0 else d.is_nan
        elif e == 0:
            assert d.mag == F(m, 8) * P(-14)
        else:
            assert d.mag == (1 + F(m, 8)) * P(e - 15)


def test_decode_torch_float8():
    for name in ("float8_e4m3fn", "float8_e5m2", "float8_e8m0fnu"):
        f = get_format(name)
        vals = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(getattr(torch, name)).double()
        for c, v in enumerate(vals.tolist()):
            d = f.decode(c)
            assert (math.isnan(v) and d.is_nan) or (not d.is_nan and float(d) == v)


@pytest.mark.parametrize("name", [f.name for f in small_formats()])
def test_finite_values_sorted_and_encode_magnitude_inverts(name):
    f = get_format(name)
    vals = f.finite_values
    assert all(a[1] < b[1] for a, b in zip(vals, vals[1:]))
    assert vals[-1][1] == f.max_finite and vals[-1][0] == f.max_code_magnitude
    for c, v in vals:
        assert f.encode_magnitude(v) == c


def test_quantum():
    f = get_format("float8_e4m3fn")
    assert f.quantum(8) == 32 and f.quantum(0) == F(1, 8) and f.quantum(-20) == P(-9)
    assert get_format("float8_e8m0fnu").quantum(-130) == P(-130)


def test_exact_and_floor_log2():
    for k in range(-1100, 1100, 7):
        assert floor_log2(P(k)) == k
        assert floor_log2(P(k) * F(3, 2)) == k
        assert floor_log2(P(k + 1) - P(k - 60)) == k
    assert exact(-0.0).negative and exact(-0.0).is_zero
    assert exact(float("nan")).is_nan and exact(float("-inf")) == Exact(Kind.INF, True)
    assert exact(F(-3, 4)).to_fraction() == F(-3, 4)
    with pytest.raises(TypeError):
        exact(True)
    with pytest.raises(ValueError):
        floor_log2(F(0))


def test_unknown_format_and_bad_codes():
    with pytest.raises(ValueError, match="float8_e4m3fn"):
        get_format("float8_e4m3")
    with pytest.raises(ValueError):
        get_format("ue4m3").decode(0x80)  # sign bit must be 0
    with pytest.raises(ValueError):
        get_format("float4_e2m1fn").decode(16)
    with pytest.raises(ValueError):
        get_format("float8_e8m0fnu").encode_magnitude(F(0))
    assert get_format("ue4m3").container_bits == 8 and get_format("tf32").container_bits == 32
    assert get_format("ue4m3").specials is Specials.NAN_ALL_ONES
