"""Independent formats / rounding (tests/independent) vs reference.formats / reference.rounding:
exhaustive decodes, every midpoint and neighbour of the small formats in every mode, SR over
all random-bit values, and hypothesis floats. Codes compared as integers."""
import math

import pytest
from hypothesis import given, strategies as st

from reference.formats import get_format
from reference.rounding import Mode, encode as p_encode, sr as p_sr
from tests.independent import formats as F
from tests.independent.bridge import key_mine, key_project, to_float
from tests.independent.num import fin, from_float, to_fraction

SMALL = ["float4_e2m1fn", "float6_e2m3fn", "float6_e3m2fn", "float8_e4m3fn", "float8_e5m2",
         "ue4m3", "ue5m3", "float8_e8m0fnu"]
MODES = ["rne", "rna", "rtz", "rup", "rdn", "rto"]
IEEE_OVF = {"float8_e5m2", "ue5m3", "bfloat16", "float32"}


def ncodes(name):
    f = F.fmt_of(name)
    return 1 << (f.eb + f.mb + (1 if f.signed else 0))


@pytest.mark.parametrize("name", SMALL + ["bfloat16"])
def test_decode_every_code(name):
    spec = get_format(name)
    for c in range(ncodes(name)):
        assert key_mine(F.decode(c, name)) == key_project(spec.decode(c)), (name, c)


def test_spec_literals():
    lit = {"float4_e2m1fn": 6, "float6_e2m3fn": 7.5, "float6_e3m2fn": 28, "float8_e4m3fn": 448,
           "float8_e5m2": 57344, "ue4m3": 448, "ue5m3": 61440, "float16": 65504}
    for name, mx in lit.items():
        assert to_float(F.fmt_of(name).max_finite) == mx


def finite_values(name):
    out = []
    for c in range(ncodes(name)):
        v = F.decode(c, name)
        if v.kind == "f" and not v.neg:
            out.append(v)
    return sorted(set(out), key=to_float)


def probe_points(name):
    """Every finite value, every midpoint between neighbours, and a nudge either side."""
    vals = finite_values(name)
    pts = []
    for lo, hi in zip(vals, vals[1:]):
        a, b = to_float(lo), to_float(hi)
        mid = (a + b) / 2
        pts += [a, mid, math.nextafter(mid, 0), math.nextafter(mid, math.inf)]
    top = to_float(vals[-1])
    pts += [top, top * 1.0625, top * 1.5, top * 4, math.inf]
    return pts


def overflow_of(name):
    return "ieee" if name in IEEE_OVF else "sat"


@pytest.mark.parametrize("name", [n for n in SMALL if n != "float8_e8m0fnu"])
@pytest.mark.parametrize("mode", MODES)
def test_encode_midpoints(name, mode):
    signed = F.fmt_of(name).signed
    for x in probe_points(name):
        for s in ((1.0, -1.0) if signed else (1.0,)):
            y = s * x
            got = F.encode(from_float(y), name, mode, overflow_of(name))
            assert got == p_encode(y, name, Mode(mode)).code, (name, mode, y)


@pytest.mark.parametrize("name", ["float4_e2m1fn", "float8_e4m3fn", "ue5m3"])
def test_sr_every_rbits(name):
    nb = 4
    for x in probe_points(name)[:-1]:
        for r in range(1 << nb):
            got = F.encode(from_float(x), name, "sr", overflow_of(name), r, nb)
            assert got == p_sr(x, r, nb, name).code, (name, x, r)


floats32 = st.floats(width=32, allow_nan=False, allow_infinity=True)


@given(x=floats32, mode=st.sampled_from(MODES),
       name=st.sampled_from(["float4_e2m1fn", "float8_e4m3fn", "float8_e5m2", "bfloat16", "float32"]))
def test_encode_random(x, mode, name):
    got = F.encode(from_float(x), name, mode, overflow_of(name))
    assert got == p_encode(x, name, Mode(mode)).code


@given(x=st.floats(min_value=0, max_value=1e6, allow_nan=False), mode=st.sampled_from(MODES))
def test_encode_ue5m3_random(x, mode):
    assert F.encode(from_float(x), "ue5m3", mode, "ieee") == p_encode(x, "ue5m3", Mode(mode)).code


def test_signed_zero_and_nan_codes():
    assert F.encode(from_float(-0.0), "float4_e2m1fn") == 8
    assert F.encode(from_float(-0.0), "float8_e4m3fn") == 0x80
    assert F.encode(from_float(math.nan), "float8_e4m3fn") & 0x7F == 0x7F
    assert F.encode(from_float(1e9), "float8_e4m3fn", "rne", "ieee") & 0x7F == 0x7F
    assert F.encode(from_float(1e9), "float8_e4m3fn", "rne", "sat") == 0x7E
    assert to_fraction(F.decode(0, "float8_e8m0fnu"))[2] == 2 ** -127 and F.e8m0_code(-200) == 0
    assert F.encode(fin(False, 3, -1), "float4_e2m1fn", "rnz") == 3       # 1.5 exact
    assert F.encode(fin(False, 5, -2), "float4_e2m1fn", "rnz") == 2       # 1.25 tie -> 1.0
