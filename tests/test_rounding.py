"""reference.rounding against independent computations: nearest-neighbour search
over the sorted value list (<= 8-bit formats), mpmath rounding (wide formats),
numpy's float16 cast, SPEC literals, and exact SR unbiasedness."""
from __future__ import annotations

import bisect
import math
from fractions import Fraction as F

import numpy as np
import pytest
from hypothesis import given, strategies as st
from mpmath.libmp import from_man_exp

from fp4ref.strategies import interesting_float32
from reference.errors import check_choice
from reference.exact import exact, floor_log2, pow2
from reference.formats import get_format, small_formats
from reference.rounding import (DETERMINISTIC_MODES, Mode, NanPolicy, Overflow, Policy,
                                default_policy, encode, parse_mode, quantize_exact, sr)
from tests.cast_helpers import all_16bit_f32, class_keys
from tests.cast_helpers import torch_single_thread  # noqa: F401  (autouse fixture)

SMALL = [f.name for f in small_formats()]
SAT = dict(overflow="satfinite", inf="saturate")


# --- <= 8-bit formats: nearest-neighbour search over the sorted finite values ---------
def _nn(fmt, x: F, mode: Mode) -> int:
    """Code of x's rounding by search over the value list (SATFINITE, |x| >= min positive)."""
    vals = fmt.finite_values
    mags = [v for _, v in vals]
    a, neg = abs(x), x < 0
    if a >= mags[-1]:
        c = vals[-1][0]
    else:
        i = bisect.bisect_right(mags, a) - 1
        (clo, lo), (chi, hi) = vals[i], vals[i + 1]
        if a == lo:
            c = clo
        elif mode is Mode.RNE:
            c = clo if 2 * a < lo + hi else chi if 2 * a > lo + hi else (clo if clo % 2 == 0 else chi)
        elif mode is Mode.RNA:
            c = clo if 2 * a < lo + hi else chi
        elif mode is Mode.RTZ:
            c = clo
        elif mode is Mode.RUP:
            c = clo if neg else chi
        elif mode is Mode.RDN:
            c = chi if neg else clo
        else:  # RTO
            c = clo if clo % 2 == 1 else chi
    return (fmt.sign_mask if neg and fmt.signed else 0) | c


def _policy_for_nn(fmt) -> Policy:
    kw = dict(SAT)
    if not fmt.has_nan:
        kw["nan"] = "to_zero"
    return Policy.make(**kw)


@pytest.mark.parametrize("name", SMALL)
def test_reference_equals_nearest_neighbour_search(name):
    fmt = get_format(name)
    pol = _policy_for_nn(fmt)
    x = all_16bit_f32().double().numpy()
    x = x[np.isfinite(x) & (x != 0)]
    if not fmt.signed:
        x = np.abs(x)
    x = x[np.abs(x) >= float(fmt.min_positive)]
    _, first = np.unique(class_keys(x, fmt), return_index=True)  # one input per rounding class
    for mode in DETERMINISTIC_MODES:
        for v in x[first].tolist():
            got = encode(v, fmt, mode, pol).code
            assert got == _nn(fmt, F(v), mode), (name, mode, v)


@pytest.mark.parametrize("name", SMALL)
@given(data=st.data())
def test_reference_equals_nearest_neighbour_search_hypothesis(name, data):
    fmt = get_format(name)
    v = data.draw(interesting_float32(fmt))
    if not math.isfinite(v) or abs(v) < float(fmt.min_positive) or (v < 0 and not fmt.signed):
        return
    for mode in DETERMINISTIC_MODES:
        assert encode(v, fmt, mode, _policy_for_nn(fmt)).code == _nn(fmt, F(v), mode)


def test_e8m0_below_min_on_the_unbounded_power_of_two_grid():
    fmt = get_format("float8_e8m0fnu")
    pows = [pow2(k) for k in range(-160, -125)]
    for v in [F(k, 64) * pow2(-130) for k in range(64, 512)]:
        i = bisect.bisect_right(pows, v) - 1
        lo, hi = pows[i], pows[i + 1]
        for mode in DETERMINISTIC_MODES:
            if v == lo:
                r = lo
            elif mode in (Mode.RTZ, Mode.RDN):
                r = lo
            elif mode is Mode.RUP:
                r = hi
            elif mode is Mode.RNA:
                r = hi if 2 * v >= lo + hi else lo
            elif mode is Mode.RNE:  # even code = even biased exponent
                even = lo if (floor_log2(lo) + 127) % 2 == 0 else hi
                r = lo if 2 * v < lo + hi else hi if 2 * v > lo + hi else even
            else:
                r = lo if (floor_log2(lo) + 127) % 2 == 1 else hi
            nan = encode(v, fmt, mode, Policy.make(no_zero="nan")).code
            tomin = encode(v, fmt, mode, Policy.make(no_zero="to_min")).code
            ifzero = encode(v, fmt, mode, Policy.make(no_zero="nan_if_zero")).code
            if r >= fmt.min_normal:
                assert nan == tomin == ifzero == floor_log2(r) + 127
            else:
                assert (nan, tomin, ifzero) == (0xFF, 0, 0)


# --- wide formats: mpmath rounding -----------------------------------------------------
_MP = {Mode.RNE: "n", Mode.RTZ: "d"}


def _mp_round(fmt, x: F, mode: Mode):
    """Rounded exact value (or +-inf) of finite non-zero x under fmt's default (IEEE) policy."""
    neg, a = x < 0, abs(x)
    k = a.denominator.bit_length() - 1
    _, man, exp, bc = from_man_exp(a.numerator, -k)
    e = exp + bc - 1
    p = fmt.man_bits + 1
    prec = p - max(0, fmt.emin - e)
    q = pow2(max(e, fmt.emin) - fmt.man_bits)

    def rnd(r):
        if prec <= 0:  # below half the smallest step: lo = 0, hi = min subnormal
            return F(0) if r == "d" else q
        _, m2, e2, _ = from_man_exp(a.numerator, -k, prec, r)
        return m2 * pow2(e2)
    lo, hi = rnd("d"), rnd("u")
    if lo == hi:
        r = lo
    elif mode is Mode.RNE:
        r = rnd("n") if prec > 0 else (lo if 2 * a <= q else hi)
    elif mode is Mode.RNA:
        r = lo if 2 * a < lo + hi else hi
    elif mode is Mode.RTZ:
        r = lo
    elif mode is Mode.RUP:
        r = lo if neg else hi
    elif mode is Mode.RDN:
        r = hi if neg else lo
    else:
        r = lo if (lo / q) % 2 == 1 else hi
    if r > fmt.max_finite:  # IEEE overflow
        to_inf = mode in (Mode.RNE, Mode.RNA) or (mode is Mode.RUP and not neg) or \
            (mode is Mode.RDN and neg)
        return (-math.inf if neg else math.inf) if to_inf else (-fmt.max_finite if neg else fmt.max_finite)
    return -r if neg else r


@pytest.mark.parametrize("name", ["bfloat16", "float16", "tf32", "float32"])
def test_reference_wide_formats_equal_mpmath(name):
    fmt = get_format(name)
    rng = np.random.default_rng(3)
    x64 = rng.integers(-2**63, 2**63 - 1, size=400, dtype=np.int64).view(np.float64)
    x32 = rng.integers(-2**31, 2**31 - 1, size=400, dtype=np.int64).astype(np.int32).view(np.float32)
    x32 = x32[np.isfinite(x32)]
    # and values within the target's range, near its ties
    e = rng.integers(fmt.emin - fmt.man_bits - 2, fmt.emax + 2, size=400)
    near = np.ldexp(rng.integers(1, 1 << 30, size=400).astype(np.float64) / (1 << 30) + 1, e)
    xs = [v for v in np.concatenate([x64, x32.astype(np.float64), near, -near]).tolist()
          if math.isfinite(v) and v != 0]
    for v in xs:
        for mode in DETERMINISTIC_MODES:
            got = quantize_exact(v, fmt, mode)
            exp = _mp_round(fmt, F(v), mode)
            if isinstance(exp, float):
                assert got.is_inf and (got.negative == (exp < 0)), (name, v, mode)
            else:
                assert got.is_finite and got.to_fraction() == exp, (name, v, mode)


def test_reference_float16_rne_equals_numpy_from_float64():
    rng = np.random.default_rng(4)
    e = rng.integers(-28, 18, size=3000)
    x = np.ldexp(rng.random(3000) + 1, e) * np.where(rng.random(3000) < 0.5, -1, 1)
    with np.errstate(over="ignore"):
        h = x.astype(np.float16)
    for v, hv in zip(x.tolist(), h.tolist()):
        got = quantize_exact(v, "float16", Mode.RNE)
        assert float(got) == hv and math.copysign(1, float(got)) == math.copysign(1, hv)


# --- SPEC literals --------------------------------------------------------------------
def _code(x, fmt, mode="rne", **pol):
    return encode(x, fmt, mode, Policy.make(**pol) if pol else None).code


def test_rounding_literals():
    e2 = dict(overflow="satfinite", inf="saturate", nan="to_zero")
    vals = lambda xs, mode: [float(get_format("float4_e2m1fn").decode(_code(x, "float4_e2m1fn", mode, **e2)))
                             for x in xs]
    assert vals([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5, 7, 100], "rne") == [0, 1, 1, 2, 2, 4, 4, 6, 6]
    assert vals([0.25, 0.75, 1.25, 2.5, 5], "rna") == [0.5, 1, 1.5, 3, 6]
    assert vals([0.9, 5.9, -5.9], "rtz") == [0.5, 4, -4]
    assert vals([0.1, -0.1], "rup") == [0.5, -0.0]
    assert vals([1.1, 0.1], "rto") == [1.5, 0.5]
    # e4m3fn: NaN above 464 without saturation; 448 with it
    ieee = dict(overflow="ieee", inf="propagate")
    assert _code(464.0, "float8_e4m3fn", **ieee) == 0x7E
    assert _code(float(np.nextafter(np.float32(464), np.float32(500))), "float8_e4m3fn", **ieee) == 0x7F
    assert _code(1e9, "float8_e4m3fn") == 0x7E and _code(-1e9, "float8_e4m3fn") == 0xFE
    assert _code(480.0, "float8_e4m3fn", "rtz", **ieee) == 0x7E
    # e5m2: IEEE inf at the tie above max, max in RTZ
    assert _code(61440.0, "float8_e5m2") == 0x7C and _code(61439.0, "float8_e5m2") == 0x7B
    assert _code(1e9, "float8_e5m2", "rtz") == 0x7B and _code(-1e9, "float8_e5m2", "rup") == 0xFB
    # e8m0: ties to even code (even biased exponent) vs away
    assert [_code(v, "float8_e8m0fnu") for v in (1.5, 3.0, 6.0)] == [0x80, 0x80, 0x82]
    assert [_code(v, "float8_e8m0fnu", "rna") for v in (1.5, 3.0, 6.0)] == [0x80, 0x81, 0x82]
    # float16 max and its overflow tie
    assert _code(65519.99, "float16") == 0x7BFF and _code(65520.0, "float16") == 0x7C00
    # subnormal edges: half the min subnormal ties to zero
    assert _code(2.0**-10, "float8_e4m3fn") == 0 and _code(1.5 * 2**-10, "float8_e4m3fn") == 1
    assert _code(2.0**-17, "float8_e5m2") == 0 and _code(2.0**-17, "float8_e5m2", "rna") == 1


def test_policy_literals():
    e4 = "float8_e4m3fn"
    assert _code(-500.0, e4, overflow="ieee", nan="preserve_sign") == 0xFF
    assert _code(-500.0, e4, overflow="ieee", nan="canonical") == 0x7F
    assert _code(-math.inf, e4, inf="propagate", nan="preserve_sign") == 0xFF
    assert _code(float("-nan"), "float8_e5m2", nan="signed_all_ones") == 0xFF
    assert _code(float("nan"), "float8_e5m2", nan="preserve_sign") == 0x7E
    assert _code(-1e9, "float8_e5m2", overflow="nan", nan="preserve_sign") == 0xFE
    e2 = dict(overflow="satfinite", inf="saturate")
    assert _code(float("nan"), "float4_e2m1fn", nan="to_zero_flip_sign", **e2) == 0x8
    assert _code(-float("nan"), "float4_e2m1fn", nan="to_zero_flip_sign", **e2) == 0x0
    assert _code(float("nan"), "float4_e2m1fn", nan="to_neg_zero", **e2) == 0x8
    assert _code(float("nan"), "float4_e2m1fn", nan="to_max", **e2) == 0x7
    assert _code(0.6 * 2**-9, e4, subnormal="flush") == 0x00
    assert _code(-0.6 * 2**-9, e4, subnormal="flush") == 0x80
    e8 = "float8_e8m0fnu"
    assert _code(-4.0, e8, negative="abs") == 0x81
    assert _code(-4.0, e8) == 0xFF and _code(-4.0, e8, negative="to_zero") == 0x00
    assert _code(0.0, e8, no_zero="nan_if_zero") == 0xFF and _code(0.0, e8, no_zero="to_min") == 0
    assert _code(2.0**-140, e8, no_zero="nan_if_zero") == 0 and _code(2.0**-140, e8) == 0xFF
    mz = dict(subnormal="min_as_zero", no_zero="to_min")
    assert [_code(v, e8, "rne", **mz) for v in (2.0**-127, 1.1 * 2**-127, 0.9 * 2**-127, 2.0**-126)] \
        == [0, 1, 0, 1]
    assert _code(1.1 * 2**-127, e8, "rna") == 0
    assert _code(-1.0, "ue4m3", negative="to_zero") == 0
    with pytest.raises(ValueError):
        _code(-1.0, "ue4m3", negative="raise")
    with pytest.raises(ValueError):
        encode(float("nan"), "float4_e2m1fn")  # default: NaN raises where there is no NaN


def test_flags():
    r = encode(464.0 + 32, "float8_e4m3fn")
    assert r.flags.overflow and r.flags.inexact
    r = encode(2.0**-12, "float8_e4m3fn")
    assert r.flags.underflow and r.flags.inexact
    assert encode(1.0, "float8_e4m3fn").flags.inexact is False
    assert encode(float("nan"), "float8_e8m0fnu", policy=Policy.make(nan="to_max")).flags.invalid


# --- SR: exact unbiasedness over all rbits ----------------------------------------------
def _intervals(fmt, count):
    vals = [v for _, v in fmt.finite_values]
    idx = sorted(set(np.linspace(0, len(vals) - 2, count).astype(int).tolist())
                 | {0, 1, len(vals) - 2})
    return [(vals[i], vals[i + 1]) for i in idx]


@pytest.mark.parametrize("name", SMALL + ["bfloat16"])
def test_sr_is_exactly_unbiased(name):
    fmt = get_format(name)
    pol = default_policy(fmt) if fmt.has_nan else Policy.make(nan="to_zero", **SAT)
    for nbits, count in ((1, 12), (3, 12), (5, 3)):
        R = 1 << nbits
        for lo, hi in _intervals(fmt, count):
            step = (hi - lo) / R
            for k in range(R):  # every input on the nbits-finer grid
                for sign in (1, -1) if fmt.signed else (1,):
                    x = sign * (lo + k * step)
                    outs = [fmt.decode(sr(x, r, nbits, fmt, pol).code).to_fraction() for r in range(R)]
                    assert sum(outs, F(0)) / R == x, (name, x, nbits)
                    assert set(outs) <= {sign * lo, sign * hi}
                    assert outs.count(sign * hi) == k  # P(up) = distance / step, exactly


def test_sr_needs_bits_and_checks_them():
    with pytest.raises(ValueError):
        encode(1.0, "float8_e4m3fn", Mode.SR)
    with pytest.raises(ValueError):
        encode(1.0, "float8_e4m3fn", Mode.SR, rbits=4, nbits=2)
    with pytest.raises(ValueError):
        encode(1.0, "float8_e4m3fn", Mode.RNE, rbits=1, nbits=2)


# --- names and validation -----------------------------------------------------------------
def test_mode_and_policy_names():
    assert parse_mode("rne") is Mode.RNE and parse_mode("RTZ") is Mode.RTZ and parse_mode(Mode.SR) is Mode.SR
    with pytest.raises(ValueError, match="RNE"):
        parse_mode("nearest")
    with pytest.raises(ValueError, match="overflow"):
        Policy.make(overflw="ieee")
    with pytest.raises(ValueError, match="SATFINITE"):
        Policy.make(overflow="saturate")
    with pytest.raises(ValueError, match="valid choices"):
        check_choice("fmt", "e4m3", ["float8_e4m3fn"])
    assert Policy.make(overflow="IEEE", nan=NanPolicy.TO_MAX).overflow is Overflow.IEEE


def test_policy_validation_rejects_impossible_combinations():
    bad = [("float4_e2m1fn", dict(overflow="ieee")), ("float4_e2m1fn", dict(inf="propagate")),
           ("float4_e2m1fn", dict(nan="canonical")), ("float8_e8m0fnu", dict(subnormal="flush")),
           ("float8_e8m0fnu", dict(nan="to_zero")), ("float8_e4m3fn", dict(subnormal="min_as_zero"))]
    for fmt, kw in bad:
        with pytest.raises(ValueError, match="valid choices"):
            encode(1.0, fmt, Mode.RNE, Policy.make(**kw))
    with pytest.raises(TypeError):
        encode(1.0, "float8_e4m3fn", Mode.RNE, {"overflow": "ieee"})


def test_exact_input_kinds():
    assert encode(F(3, 4), "float4_e2m1fn", policy=_policy_for_nn(get_format("float4_e2m1fn"))).code == 2
    assert encode(np.float32(0.75), "float8_e4m3fn").code == encode(0.75, "float8_e4m3fn").code
    assert encode(exact(-0.0), "float8_e4m3fn").code == 0x80
