"""reference.formats / reference.rounding == gfloat (Graphcore's generic float library), an
oracle that shares no code with the reference.

Decoding: every code of every <= 19-bit format (tf32: every code too), a sample of float32.
Rounding: every code value, every midpoint between neighbours, and the float32 neighbours of
each (plus overflow ties, +-inf, NaN), under each gfloat mode matched to ours by formula:
    TowardZero = RTZ, TowardPositive = RUP, TowardNegative = RDN, TiesToEven = RNE,
    TiesToAway = RNA (delta + 0.5 >= 1 is "ties away"),
    StochasticFastest = SR (round away iff delta + r * 2**-n >= 1, ours: add r/2**n of a step
    then truncate; the same predicate since r and 2**n are integers).
gfloat's Stochastic / StochasticOdd (delta first rounded to n bits, ties to even / odd) and
StochasticFast (adds (r + 0.5) / 2**n) are other formulas: not compared.  Where gfloat's
model differs from ours on purpose (docs/oracles.md) the inputs are left out, by name.
gfloat missing: every test here skips visibly (never passes)."""
from __future__ import annotations

import math
import zlib
from fractions import Fraction

import numpy as np
import pytest

from reference.formats import get_format
from reference.rounding import Mode, Policy, encode

gfloat = pytest.importorskip("gfloat", reason="gfloat (pip install gfloat==0.5.2) is the oracle here")
from gfloat import RoundMode, decode_float, round_float  # noqa: E402
from gfloat import formats as GF  # noqa: E402
from gfloat.types import Domain, FormatInfo  # noqa: E402


def _custom(name, k, p, bias, signed, domain, nans, subn=True):
    return FormatInfo(name, k, p, bias=bias, is_signed=signed, domain=domain, has_nz=signed,
                      num_high_nans=nans, has_subnormals=subn, is_twos_complement=False)


# ours -> gfloat's description (OCP constructors where gfloat has them; the rest built from
# the formats' definitions: SPEC.md for ue4m3 / ue5m3, NVIDIA's TF32 for tf32)
GFLOAT = {
    "float4_e2m1fn": GF.format_info_ocp_e2m1,
    "float6_e2m3fn": GF.format_info_ocp_e2m3,
    "float6_e3m2fn": GF.format_info_ocp_e3m2,
    "float8_e4m3fn": GF.format_info_ocp_e4m3,
    "float8_e5m2": GF.format_info_ocp_e5m2,
    "float8_e8m0fnu": GF.format_info_ocp_e8m0,
    "ue4m3": _custom("ue4m3", 7, 4, 7, False, Domain.Finite, 1),
    "ue5m3": _custom("ue5m3", 8, 4, 15, False, Domain.Extended, 7),
    "bfloat16": GF.format_info_bfloat16,
    "float16": GF.format_info_binary16,
    "tf32": _custom("tf32", 19, 11, 127, True, Domain.Extended, 2 ** 10 - 1),
    "float32": GF.format_info_binary32,
}
SMALL = [n for n in GFLOAT if get_format(n).nbits <= 8]
WIDE = ["bfloat16", "float16", "tf32", "float32"]
MODES = {Mode.RTZ: RoundMode.TowardZero, Mode.RUP: RoundMode.TowardPositive,
         Mode.RDN: RoundMode.TowardNegative, Mode.RNE: RoundMode.TiesToEven,
         Mode.RNA: RoundMode.TiesToAway}


def _same(ours, theirs: float) -> bool:
    """Exact (reference) vs float (gfloat): NaN as NaN, zero by sign, else the exact value."""
    if ours.is_nan or math.isnan(theirs):
        return ours.is_nan and math.isnan(theirs)
    if ours.is_inf or math.isinf(theirs):
        return ours.is_inf and math.isinf(theirs) and ours.negative == (theirs < 0)
    if ours.mag == 0 or theirs == 0:
        return ours.mag == 0 and theirs == 0 and ours.negative == (math.copysign(1, theirs) < 0)
    return (-ours.mag if ours.negative else ours.mag) == Fraction(theirs)


def _codes(name):
    n = get_format(name).ncodes
    if n <= 1 << 19:
        return range(n)
    rng = np.random.default_rng(zlib.crc32(name.encode()))   # float32: a stable sample
    edge = [0, 1, 2, 0x7FFFFF, 0x800000, 0x7F7FFFFF, 0x7F800000, 0x7F800001, 0x7FC00000]
    edge += [c | 0x80000000 for c in edge]
    return edge + [int(c) for c in rng.integers(0, 1 << 32, 20000)]


@pytest.mark.parametrize("name", list(GFLOAT))
def test_decode_every_code(name):
    fmt, fi = get_format(name), GFLOAT[name]
    assert fi.k == fmt.nbits, (fi.k, fmt.nbits)
    bad = [(c, fmt.decode(c), decode_float(fi, c).fval) for c in _codes(name)
           if not _same(fmt.decode(c), decode_float(fi, c).fval)]
    assert not bad, bad[:5]


def _f32_neighbours(v: float) -> list[float]:
    if not math.isfinite(v) or abs(v) > 3.4028234663852886e38:
        return []
    x = np.float32(v)
    if float(x) != v:
        return []
    return [float(np.nextafter(x, np.float32(np.inf))), float(np.nextafter(x, np.float32(-np.inf)))]


def _inputs(name) -> list[float]:
    """Code values, midpoints, overflow ties, the float32 neighbours of each, +-inf, NaN."""
    fmt = get_format(name)
    mags = {float(v) for _, v in fmt.finite_values}
    vals = sorted(mags | ({-m for m in mags} if fmt.signed else set()))
    mids = [(a + b) / 2 for a, b in zip(vals, vals[1:])]
    top = float(fmt.max_finite)
    ulp = float(fmt.quantum(fmt.emax))
    over = [top + ulp / 2, top + ulp, 2 * top]
    pts = vals + mids + over + [-v for v in over]
    pts += [n for p in pts for n in _f32_neighbours(p)]
    return sorted(set(pts)) + [math.inf, -math.inf, math.nan]


def _comparable(name, v: float, sat: bool) -> bool:
    """Inputs where gfloat's model is ours (the rest: docs/oracles.md, "Where gfloat differs")."""
    fmt = get_format(name)
    if not fmt.signed and (v < 0 or math.copysign(1, v) < 0):
        return False      # gfloat has no negative-input rule for unsigned formats
    if not fmt.has_zero and v < float(fmt.min_normal):
        return False      # gfloat rounds below e8m0's smallest value to values outside the format
    if not fmt.has_nan and (math.isnan(v) or not sat):
        return False      # no NaN: gfloat raises on NaN input and on overflow without sat
    return True


def _policy(name, sat: bool) -> Policy:
    """gfloat's sat flag as our policy: sat -> clamp overflow and inf to max finite; no sat ->
    IEEE overflow (directed modes clamp by sign) and inf stays inf (NaN without inf)."""
    fmt = get_format(name)
    extra = {"negative": "to_zero"} if not fmt.signed else {}
    if not fmt.has_zero:
        extra["no_zero"] = "to_min"
    if not fmt.has_nan:
        extra["nan"] = "raise"
    if sat:
        return Policy.make(overflow="satfinite", inf="saturate", **extra)
    return Policy.make(overflow="ieee", inf="propagate", **extra)


def _rna_double_rounding(fmt, v: float, ours, theirs: float, pol: Policy) -> bool:
    """gfloat's known TiesToAway slip (docs/oracles.md, gfloat issue 1): it tests
    ``delta + 0.5 >= 1.0`` in float64, so a delta just below 1/2 (0.5 - 2**-54) rounds up to
    1.0 and the input goes away from zero.  True only where exactly that happened."""
    if not (math.isfinite(v) and math.isfinite(theirs)) or v == 0 or not ours.is_finite:
        return False
    lo = encode(v, fmt, Mode.RTZ, pol).code
    lo_v = fmt.decode(lo).mag
    hi_v = abs(Fraction(theirs))
    if hi_v <= lo_v or ours.mag != lo_v:
        return False
    delta = (abs(Fraction(v)) - lo_v) / (hi_v - lo_v)
    return delta < Fraction(1, 2) and float(delta) + 0.5 >= 1.0


def _round_all(name, inputs, modes, sat, sr=False):
    fmt, fi = get_format(name), GFLOAT[name]
    if not (sat or fmt.has_nan):
        pytest.skip(f"{name} has no NaN: gfloat raises on overflow without sat (compared with sat)")
    pol, bad, n, known = _policy(name, sat), [], 0, 0
    for v in inputs:
        if not _comparable(name, v, sat):
            continue
        for mode in modes:
            if sr:   # explicit bits: r from a stable hash of (v, n)
                nb = 1 + zlib.crc32(repr(v).encode()) % 8
                r = zlib.crc32(repr((v, nb)).encode()) % (1 << nb)
                theirs = round_float(fi, v, RoundMode.StochasticFastest, sat, r, nb)
                ours = fmt.decode(encode(v, fmt, Mode.SR, pol, rbits=r, nbits=nb).code)
            else:
                theirs = round_float(fi, v, MODES[mode], sat)
                ours = fmt.decode(encode(v, fmt, mode, pol).code)
            n += 1
            if mode is Mode.RNA and _rna_double_rounding(fmt, v, ours, theirs, pol):
                known += 1
                continue
            if not _same(ours, theirs):
                bad.append((v, mode.name, str(ours), theirs))
    assert n > known
    assert not bad, f"{name} sat={sat}: {len(bad)} of {n} differ, e.g. {bad[:5]}"


@pytest.mark.parametrize("sat", [False, True], ids=["ieee", "sat"])
@pytest.mark.parametrize("name", SMALL)
def test_round_deterministic_modes(name, sat):
    _round_all(name, _inputs(name), list(MODES), sat)


@pytest.mark.parametrize("sat", [False, True], ids=["ieee", "sat"])
@pytest.mark.parametrize("name", SMALL)
def test_round_stochastic_fastest_is_our_sr(name, sat):
    _round_all(name, _inputs(name), [Mode.SR], sat, sr=True)


def _wide_inputs(name, n=1500) -> list[float]:
    """A stable sample of codes of a wide format, their midpoints and neighbours (float64
    neighbours for float32, whose float32 neighbours are codes)."""
    fmt = get_format(name)
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    codes = [int(c) for c in rng.integers(0, fmt.ncodes, n)] + [0, 1, fmt.max_code_magnitude]
    out = []
    for c in codes:
        v = fmt.decode(c)
        if v.is_nan or v.is_inf:
            continue
        lo = float(-v.mag if v.negative else v.mag)
        hi = float(fmt.decode(c + 1).mag * (-1 if v.negative else 1)) \
            if c + 1 <= fmt.max_code_magnitude | (fmt.sign_mask if v.negative else 0) else lo
        mid = (lo + hi) / 2 if math.isfinite(hi) else lo
        for p in (lo, mid):
            out.append(p)
            out += [float(np.nextafter(p, math.inf)), float(np.nextafter(p, -math.inf))] \
                if name == "float32" else _f32_neighbours(p)
    return out + [math.inf, -math.inf, math.nan]


@pytest.mark.parametrize("sat", [False, True], ids=["ieee", "sat"])
@pytest.mark.parametrize("name", WIDE)
def test_round_wide_formats(name, sat):
    inputs = _wide_inputs(name)
    _round_all(name, inputs, list(MODES), sat)
    _round_all(name, inputs[::7], [Mode.SR], sat, sr=True)


def test_gfloat_ties_away_slip_is_still_there():
    """The one input class left out above, pinned: just below the float32 midpoint between 0
    and 2**-149 (exactly 2**-150 - 2**-203), RNA must give +0 (it is below the tie); gfloat
    gives 2**-149.  If this fails, gfloat fixed it: drop _rna_double_rounding and the
    docs/oracles.md entry."""
    v = float(np.nextafter(2.0 ** -150, 0.0))
    assert Fraction(v) < Fraction(1, 2 ** 150)
    f32 = get_format("float32")
    assert encode(v, f32, Mode.RNA).code == 0
    assert round_float(GFLOAT["float32"], v, RoundMode.TiesToAway) == 2.0 ** -149
