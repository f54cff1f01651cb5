"""fp4ref.gridround (the fast paths' one rounding kernel) == reference.rounding, bit for bit.

Every case runs the kernel on numpy and on torch and compares CODES (bit patterns,
signs of zero, NaN and inf codes included) with ``reference.rounding.encode`` /
``round_exact``, which compute with Fractions and share nothing with the kernel.
"""
from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from fp4ref.gridround import (FINITE, INF, MODE_CODE, NAN, GridFormat, bit_length, overflow_to_inf,
                              round_grid, round_int, shift_round, trailing_zeros, unpack_ieee)
from reference.exact import Exact, Kind, floor_log2, pow2
from reference.formats import FORMATS, FormatSpec
from reference.gemm import accumulator_format
from reference.rounding import (DETERMINISTIC_MODES, InfPolicy, Mode, NanPolicy, Negative, NoZero,
                                Overflow, Policy, Subnormal, encode, round_exact)
from tests.cast_helpers import torch_single_thread  # noqa: F401  (autouse fixture)

XPS = [pytest.param(np, id="numpy"), pytest.param(torch, id="torch")]
SPECS = list(FORMATS.values()) + [accumulator_format(p) for p in (4, 11, 23, 30, 47, 58)]
DET = [m for m in DETERMINISTIC_MODES]
SET = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _arr(xp, values, dtype="int64"):
    a = np.array(values, dtype=dtype)
    return a if xp is np else torch.from_numpy(a)


def _np(x):
    return x.numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


@st.composite
def elements(draw, spec: FormatSpec, sticky_ok: bool = True):
    """(neg, mag, exp, tail) around spec's range: ties, exact grid points, the subnormal
    binades, overflow, zero, and 1..62-bit magnitudes."""
    m = spec.man_bits
    kind = draw(st.sampled_from(["any", "tie", "grid", "zero", "tail"]))
    bits = draw(st.integers(1, 62))
    if kind == "zero":
        mag, bits = 0, 1
    elif kind == "tie":  # a 1 just below a random rounding point, zeros under it
        t = draw(st.integers(1, 60))
        mag = (draw(st.integers(1, (1 << min(m + 2, 62 - t)) - 1)) << t) | (1 << (t - 1))
        bits = mag.bit_length()
    elif kind == "grid":
        mag = draw(st.integers(1 << m, (1 << (m + 1)) - 1)) if m else 1
        bits = mag.bit_length()
    else:
        mag = draw(st.integers(1 << (bits - 1), (1 << bits) - 1))
    top = draw(st.integers(spec.emin - m - 4, spec.emax + 3))
    exp = top - (bits - 1)
    tail = Fraction(0)
    if kind == "tail" and sticky_ok and bits >= m + 2:
        tail = Fraction(draw(st.integers(1, 1023)), 1024)
    return draw(st.booleans()), mag, exp, tail


def _batch(spec, n=24, sticky_ok=True):
    return st.lists(elements(spec, sticky_ok), min_size=1, max_size=n)


def _exact(neg, mag, exp, tail) -> Exact:
    return Exact(Kind.FINITE, neg, (mag + tail) * pow2(exp))


def _code(spec: FormatSpec, n, exp, neg, kind) -> int:
    """Code of one kernel result (value form) in spec."""
    sign = spec.sign_mask if (neg and spec.signed) else 0
    if kind == NAN:
        return spec.nan_code
    if kind == INF:
        return sign | spec.inf_code
    return sign | spec.encode_magnitude(Fraction(int(n)) * pow2(int(exp)))


def _policy(spec: FormatSpec, overflow: Overflow, flush: bool) -> Policy:
    """reference.gemm.round_fp's policy family: the finite-input part round_int implements."""
    return Policy(overflow, InfPolicy.PROPAGATE if spec.has_nan else InfPolicy.SATURATE,
                  NanPolicy.CANONICAL if spec.has_nan else NanPolicy.TO_ZERO,
                  Subnormal.FLUSH if flush else Subnormal.KEEP, NoZero.NAN, Negative.NAN)


def _valid_overflows(spec):
    return [o for o in Overflow if spec.has_nan or o is Overflow.SATFINITE]


def _run_round_int(xp, spec, els, mode, overflow, flush, sticky=True):
    neg = _arr(xp, [e[0] for e in els], bool)
    mag = _arr(xp, [e[1] for e in els])
    exp = _arr(xp, [e[2] for e in els])
    st_ = _arr(xp, [e[3] != 0 for e in els], bool) if sticky else None
    r = round_int(xp, neg, mag, exp, GridFormat.of(spec), mode, overflow=overflow, flush=flush,
                  sticky=st_)
    return [_code(spec, *t) for t in zip(*(_np(x).tolist() for x in r))]


@pytest.mark.parametrize("xp", XPS)
@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
@given(data=st.data())
@SET
def test_round_int_matches_encode(xp, spec, data):
    els = data.draw(_batch(spec))
    mode = data.draw(st.sampled_from(DET))
    ovf = data.draw(st.sampled_from(_valid_overflows(spec)))
    flush = data.draw(st.booleans()) and spec.has_zero
    got = _run_round_int(xp, spec, els, mode, ovf, flush)
    pol = _policy(spec, ovf, flush)
    want = [encode(_exact(*e), spec, mode, pol).code for e in els]
    assert got == want, [(e, hex(g), hex(w)) for e, g, w in zip(els, got, want) if g != w][:4]


@pytest.mark.parametrize("xp", XPS)
@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
@given(data=st.data())
@SET
def test_round_grid_matches_round_exact(xp, spec, data):
    """The unbounded grid step: value n * 2**qexp and code, every mode, SR included."""
    els = [e for e in data.draw(_batch(spec, sticky_ok=False)) if e[1]]
    mode = data.draw(st.sampled_from(list(Mode)))
    kw, rb = {}, [None] * len(els)
    if mode is Mode.SR:
        nb = data.draw(st.integers(1, 62))
        rb = [data.draw(st.integers(0, (1 << nb) - 1)) for _ in els]
        kw = dict(rbits=_arr(xp, rb), nbits=nb)
    if not els:
        return
    g = round_grid(xp, _arr(xp, [e[0] for e in els], bool), _arr(xp, [e[1] for e in els]),
                   _arr(xp, [e[2] for e in els]), GridFormat.of(spec), mode, **kw)
    wide = spec.max_code_magnitude >= 1 << 60
    assert (g.code is None) == wide  # codes beyond int64: value form only
    codes = [None] * len(els) if wide else _np(g.code).tolist()
    for e, r, code, n, q in zip(els, rb, codes, _np(g.n).tolist(), _np(g.qexp).tolist()):
        want, _ = round_exact(_exact(*e).to_fraction(), spec, mode, rbits=r,
                              nbits=kw.get("nbits"))
        assert Fraction(n) * pow2(q) == want, (e, n, q, want)
        if wide:
            continue
        if want <= spec.max_finite and (want >= spec.min_normal or spec.subnormals):
            assert code == spec.encode_magnitude(want), (e, code)
        elif want > spec.max_finite:
            assert code > spec.max_code_magnitude
        else:  # below min normal in a format without zero
            assert code < 0


@pytest.mark.parametrize("xp", XPS)
@given(data=st.data())
@SET
def test_min_as_zero_e8m0(xp, data):
    """Subnormal.MIN_AS_ZERO: code -1 is 'rounded to the zero step'; with NoZero.TO_MIN
    and saturation the codes equal encode's."""
    spec = FORMATS["float8_e8m0fnu"]
    els = [(False, *e[1:]) for e in data.draw(_batch(spec, sticky_ok=False)) if e[1]]
    mode = data.draw(st.sampled_from(DET))
    if not els:
        return
    g = round_grid(xp, _arr(xp, [False] * len(els), bool), _arr(xp, [e[1] for e in els]),
                   _arr(xp, [e[2] for e in els]), GridFormat.of(spec), mode, min_as_zero=True)
    code = _np(g.code)
    got = np.where(code < 0, 0, np.minimum(code, spec.max_code_magnitude)).tolist()
    pol = Policy(Overflow.SATFINITE, InfPolicy.SATURATE, NanPolicy.CANONICAL,
                 Subnormal.MIN_AS_ZERO, NoZero.TO_MIN, Negative.NAN)
    want = [encode(_exact(*e), spec, mode, pol).code for e in els]
    assert got == want


@pytest.mark.parametrize("xp", XPS)
@given(data=st.data())
@SET
def test_per_element_modes(xp, data):
    """An int64 array of MODE_CODE: each element rounds by its own mode."""
    spec = data.draw(st.sampled_from(SPECS))
    els = data.draw(_batch(spec))
    modes = [data.draw(st.sampled_from(list(MODE_CODE))) for _ in els]
    code_arr = _arr(xp, [MODE_CODE[m] for m in modes])
    ovf = data.draw(st.sampled_from(_valid_overflows(spec)))
    got = _run_round_int(xp, spec, els, code_arr, ovf, False)
    pol = _policy(spec, ovf, False)
    want = [encode(_exact(*e), spec, m, pol).code for e, m in zip(els, modes)]
    assert got == want


@pytest.mark.parametrize("xp", XPS)
@given(data=st.data())
@SET
def test_stacked_formats(xp, data):
    """GridFormat.stack: one row per format (the simulator's per-model accumulators)."""
    specs = [accumulator_format(data.draw(st.integers(1, 58))) for _ in range(6)]
    rows = [data.draw(elements(s)) for s in specs]
    flush = _arr(xp, [data.draw(st.booleans()) for _ in specs], bool)
    mode = data.draw(st.sampled_from(DET))
    fmt = GridFormat.stack(specs)
    if xp is torch:
        fmt = type(fmt)(**{k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v
                           for k, v in vars(fmt).items()})
    r = round_int(xp, _arr(xp, [e[0] for e in rows], bool), _arr(xp, [e[1] for e in rows]),
                  _arr(xp, [e[2] for e in rows]), fmt, mode, flush=flush,
                  sticky=_arr(xp, [e[3] != 0 for e in rows], bool))
    got = [_code(s, *t) for s, t in zip(specs, zip(*(_np(x).tolist() for x in r)))]
    want = [encode(_exact(*e), s, mode, _policy(s, Overflow.IEEE, bool(f))).code
            for s, e, f in zip(specs, rows, _np(flush).tolist())]
    assert got == want


def _int_round(neg: bool, v: Fraction, mode: Mode) -> int:
    """v >= 0 rounded to an integer by mode, from floor and the remainder (Python ints)."""
    n, r = divmod(v, 1)
    n = int(n)
    if r == 0:
        return n
    up = {Mode.RTZ: False, Mode.RUP: not neg, Mode.RDN: neg, Mode.RTO: n % 2 == 0,
          Mode.RNA: r >= Fraction(1, 2),
          Mode.RNE: r > Fraction(1, 2) or (r == Fraction(1, 2) and n % 2 == 1)}[mode]
    return n + up


@pytest.mark.parametrize("xp", XPS)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, (1 << 62) - 1), st.integers(0, 70),
                          st.sampled_from(DET), st.booleans()), min_size=1, max_size=40))
@SET
def test_shift_round(xp, rows):
    """mag / 2**s to an integer (the fused steps' alignment), per-element modes, sticky."""
    rows = [(n, m, s, mode, t and s >= 1) for n, m, s, mode, t in rows]  # a tail needs s >= 1
    neg, mag, s = (_arr(xp, [r[i] for r in rows], bool if i == 0 else "int64") for i in range(3))
    sticky = _arr(xp, [r[4] for r in rows], bool)
    got = _np(shift_round(xp, neg, mag, s, _arr(xp, [MODE_CODE[r[3]] for r in rows]),
                          sticky=sticky)).tolist()
    want = [_int_round(n, Fraction(m) / 2 ** sh + (Fraction(1, 2 ** (sh + 1)) if t else 0), mode)
            for n, m, sh, mode, t in rows]
    assert got == want


def test_literal_cases():
    """Hand-worked results: ties to even, the e8m0 exponent parity, -0, overflow."""
    e2m1, e8m0 = GridFormat.of("float4_e2m1fn"), GridFormat.of("float8_e8m0fnu")
    mag, exp = np.array([3, 5, 7, 1, 0, 13, 25]), np.full(7, -1)
    g = round_grid(np, mag < 0, mag, exp, e2m1, Mode.RNE)  # 1.5 2.5 3.5 .5 0 6.5 12.5
    assert g.code.tolist() == [3, 4, 6, 1, 0, 7, 9]
    assert (g.n * 2.0 ** g.qexp).tolist() == [1.5, 2, 4, 0.5, 0, 6, 12]
    # e8m0: 3 * 2**e is a tie between 2**(e+1) and 2**(e+2); RNE picks the even exponent field
    g = round_grid(np, np.zeros(2, bool), np.array([3, 3]), np.array([0, 1]), e8m0, Mode.RNE)
    assert g.code.tolist() == [128, 130]  # 3 -> 2 (field 128), 6 -> 8 (field 130)
    r = round_int(np, np.array([True, True]), np.array([0, 1]), np.array([0, 200]),
                  GridFormat.of("bfloat16"), Mode.RTZ)
    assert r.kind.tolist() == [FINITE, FINITE] and r.neg.tolist() == [True, True]
    assert r.n.tolist() == [0, 255] and r.exp.tolist() == [0, 120]  # -0; -max under RTZ


@pytest.mark.parametrize("xp", XPS)
@given(st.lists(st.integers(0, (1 << 63) - 1), min_size=1, max_size=40))
@SET
def test_bit_length_and_trailing_zeros(xp, xs):
    a = _arr(xp, xs)
    assert _np(bit_length(xp, a)).tolist() == [x.bit_length() for x in xs]
    assert _np(trailing_zeros(xp, a)).tolist() == [(x & -x).bit_length() - 1 if x else 0
                                                   for x in xs]


@pytest.mark.parametrize("xp", XPS)
@pytest.mark.parametrize("width", [32, 64])
@given(data=st.data())
@SET
def test_unpack_ieee(xp, width, data):
    xs = data.draw(st.lists(st.floats(width=width, allow_nan=True), min_size=1, max_size=40))
    arr = np.array(xs, np.float64 if width == 64 else np.float32)
    bits = arr.view(np.int64) if width == 64 else arr.view(np.int32).astype(np.int64)
    u = unpack_ieee(xp, bits if xp is np else torch.from_numpy(bits),
                    52 if width == 64 else 23, 11 if width == 64 else 8)
    for x, *t in zip(arr.tolist(), *(_np(v).tolist() for v in u)):
        neg, mag, exp, e, nan, inf, zero = t
        assert (nan, inf, zero) == (x != x, abs(x) == float("inf"), x == 0)
        assert neg == (np.copysign(1.0, x) < 0)
        if x == x and abs(x) != float("inf") and x != 0:
            a = abs(Fraction(x))
            assert Fraction(mag) * pow2(exp) == a and e == floor_log2(a)


def test_errors_name_the_choices():
    f = GridFormat.of("float8_e4m3fn")
    z = np.zeros(2, np.int64)
    with pytest.raises(ValueError, match="mode: codes in .*valid codes: 0 \\(RNE\\)"):
        round_grid(np, z < 0, z + 3, z, f, np.array([0, 9]))
    with pytest.raises(ValueError, match="overflow: unknown value 'clamp'; valid choices"):
        round_int(np, z < 0, z + 3, z, f, Mode.RNE, overflow="clamp")
    with pytest.raises(ValueError, match="mode SR needs rbits"):
        round_grid(np, z < 0, z + 3, z - 9, f, Mode.SR)
    with pytest.raises(ValueError, match="must agree on subnormals"):
        GridFormat.stack(["float32", "float8_e8m0fnu"])
    assert overflow_to_inf(Mode.RUP) == (True, False)
    assert overflow_to_inf(Mode.RTO) == (False, False)


def test_operand_generator_rules():
    """probes.validate.quantize (the kernel's numpy caller) keeps the generator's rules:
    ties toward the smaller magnitude in 8-bit grids, +0 for -0, +max for NaN, saturation;
    ties to even in bfloat16; float32 subnormals keep 11 significant bits in tf32."""
    from probes.validate import quantize
    x = np.array([1.6875, -1.6875, 1.5625, -0.0, np.nan, -1e9, 500.0])
    assert quantize(x, "float8_e4m3fn").tolist() == [1.625, -1.625, 1.5, 0.0, 448.0, -448.0, 448.0]
    bf = quantize(np.array([1 + 2.0 ** -8, 1 + 3 * 2.0 ** -8, -0.0]), "bfloat16")
    assert bf.tolist() == [1.0, 1 + 2.0 ** -6, -0.0] and np.signbit(bf[2])
    tiny = (2.0 ** -127) * (1 + 2.0 ** -11 + 2.0 ** -20)  # a float32 subnormal (22 bits)
    assert quantize(np.array([tiny]), "tf32").tolist() == [(2.0 ** -127) * (1 + 2.0 ** -10)]
    with pytest.raises(ValueError, match="fmt: 'float8_e8m0fnu' has no zero.*valid choices"):
        quantize(x, "float8_e8m0fnu")
