"""The published MMA instruction models (issue 17): an independent oracle and fp4ref.mma against it.

Part 1 pins tests/independent_mma (written from the issue's facts alone) to the issue's worked
literals and to hand-worked cases (each expected value derived in the comment beside it).
Part 2 compares `fp4ref.mma` with that oracle on uniformly random bytes, bit for bit.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import settings

from tests.independent_mma import mma_independent
from tests.independent_mma.model import NAN_BITS, POS_INF, NEG_INF

# e2m1 codes: 0.5=1, 1=2, 1.5=3, 2=4, 3=5, 4=6, 6=7 (+8 negates);
# ue4m3 bytes: 2^-9=0x01, 1=0x38, 256=0x78, 448=0x7E; ue8m0 byte = 127 + log2(scale).
E2M1 = {0.5: 1, 1: 2, 1.5: 3, 2: 4, 3: 5, 4: 6, 6: 7}
NEG = 8


@pytest.fixture(params=["oracle", "fp4ref.mma"])
def engine(request):
    """Each hand-worked literal checks the independent oracle and, where it exists, fp4ref.mma."""
    if request.param == "oracle":
        return mma_independent
    mma = _api()

    def run(kind, a, b, c, sa=None, sb=None, **kw):
        return _bits(mma(kind, *_to_torch(a, b, c, sa, sb), **kw))
    return run


def _bits(out):
    """float32 tensor -> nested lists of its bit patterns."""
    import torch
    return out.contiguous().view(torch.int32).numpy().view(np.uint32).tolist()


def _nvf4(engine, groups, c_bits, scale_format="ue4m3", block=16):
    """One mxf4nvf4 output. groups: 4 entries (a_val, b_val, sa_byte, sb_byte); a_val None =
    all-zero data. Each nonzero group holds its single product at its first element."""
    a, b, sa, sb = [0] * 64, [0] * 64, [], []
    for g, (x, y, s_a, s_b) in enumerate(groups):
        if x is not None:
            a[16 * g] = E2M1[abs(x)] + (NEG if x < 0 else 0)
            b[16 * g] = E2M1[abs(y)] + (NEG if y < 0 else 0)
        if 16 * g % block == 0:
            sa.append(s_a)
            sb.append(s_b)
    return engine("mxf4nvf4", [a], [[v] for v in b], [[c_bits]], [sa], [[s] for s in sb],
                  block=block, scale_format=scale_format)[0][0]


def test_issue_groups_7225344_cancel_and_2_pow_minus20_is_lost(engine):
    # 6*6 with scales 448*448 = 7,225,344 (scale-exponent sum 16 -> truncation step 2^-19);
    # 0.5*0.5 with ue4m3 2^-9 twice = 2^-20 < step -> 0 (exact summation would give 2^-20).
    groups = [(6, 6, 0x7E, 0x7E), (-6, 6, 0x7E, 0x7E), (0.5, 0.5, 0x01, 0x01),
              (None, None, 0x38, 0x38)]
    assert _nvf4(engine, groups, 0) == 0x00000000


def test_issue_c32_plus_three_quarter_ulp_is_truncated(engine):
    # C = 32 (ulp 2^-18) plus 1.5*2 with ue8m0 2^-10 twice = 3*2^-20: kept by the 35-bit add
    # (step 2^-30), then RZ to FP32 -> 32 (RNE would give 32 + 2^-18 = 0x42000001).
    groups = [(1.5, 2, 117, 117)] + [(None, None, 117, 117)] * 3
    assert _nvf4(engine, groups, 0x42000000, scale_format="ue8m0") == 0x42000000


def test_issue_subnormal_scale_enters_with_min_normal_exponent(engine):
    # +-0.25 with scales 2^-9 (= 0.125 * 2^-6) and 256: scale-exponent sum -6 + 8 = 2, step
    # 2^-33, so C = 2^-35 truncates to 0 and the groups cancel -> 0 (not 2^-35).
    groups = [(0.5, 0.5, 0x01, 0x78), (-0.5, 0.5, 0x01, 0x78)] + [(None, None, 0x01, 0x78)] * 2
    assert _nvf4(engine, groups, 0x2E000000) == 0x00000000


@pytest.mark.parametrize("g", range(4))
@pytest.mark.parametrize("fmt,nan_byte,block", [("ue4m3", 0x7F, 16), ("ue4m3", 0xFF, 16),
                                                ("ue8m0", 0xFF, 16), ("ue8m0", 0xFF, 32)])
def test_issue_any_nan_scale_gives_canonical_nan_over_zero_data(engine, g, fmt, nan_byte, block):
    one = 0x38 if fmt == "ue4m3" else 127
    groups = [(None, None, one, one)] * 4
    first = g - g % (block // 16)          # the group whose entry carries this block's scale
    groups[first] = (None, None, nan_byte, one) if g % 2 else (None, None, one, nan_byte)
    assert _nvf4(engine, groups, 0x3F800000, scale_format=fmt, block=block) == NAN_BITS


@pytest.mark.parametrize("c_bits", [0x7FC00000, 0x7F800001, 0xFFC00000])
def test_nan_c_gives_canonical_nan(engine, c_bits):
    assert _nvf4(engine, [(1, 1, 0x38, 0x38)] * 4, c_bits) == NAN_BITS


def test_ue4m3_scale_sign_bit_is_ignored(engine):
    # scale byte 0xB8 is e4m3 -1.0; the MMA reads it as 1.0: 1*1*1*1 = 1.0
    groups = [(1, 1, 0xB8, 0x38)] + [(None, None, 0xB8, 0xB8)] * 3
    assert _nvf4(engine, groups, 0) == 0x3F800000


def _fp8(engine, kind, pairs, c_bits, *, a_format="float8_e4m3fn", b_format=None, scales=None,
         arch="blackwell"):
    """One 32-product output from (a_code, b_code) pairs (the rest are +0 * +0)."""
    a = [p[0] for p in pairs] + [0] * (32 - len(pairs))
    b = [p[1] for p in pairs] + [0] * (32 - len(pairs))
    kw = dict(a_format=a_format, b_format=b_format or a_format, arch=arch)
    sa = sb = None
    if scales is not None:
        sa, sb = [[scales[0]]], [[scales[1]]]
        kw.update(block=32, scale_format="ue8m0")
    return engine(kind, [a], [[v] for v in b], [[c_bits]], sa, sb, **kw)[0][0]


# e4m3 codes: 16 = 0x58, -16 = 0xD8, 1 = 0x38, 1.875 = 0x3F, 2^-6 = 0x08, 2^-7 = 0x04,
# 2^-8 = 0x02, 2^-9 = 0x01 (subnormals: exponent -6, significand m/8).
def test_blackwell_25_fraction_bits_below_the_largest_exponent_sum(engine):
    # 16*16 - 16*16: exponent sum 8, step 2^-17. 2^-9 * 2^-8 = 2^-17 survives, 2^-18 does not.
    big = [(0x58, 0x58), (0xD8, 0x58)]
    assert _fp8(engine, "f8f6f4", big + [(0x01, 0x02)], 0) == 0x37000000          # 2^-17
    assert _fp8(engine, "f8f6f4", big + [(0x01, 0x01)], 0) == 0x00000000


def test_blackwell_c_is_truncated_toward_zero_before_the_sum(engine):
    # 1*1 + C = -2^-26: step 2^-25 truncates C to 0 -> 1.0 (exact then RZ: 0x3F7FFFFF)
    assert _fp8(engine, "f8f6f4", [(0x38, 0x38)], 0xB2800000) == 0x3F800000


def test_hopper_13_fraction_bits_and_output_cut(engine):
    big = [(0x58, 0x58), (0xD8, 0x58)]   # exponent sum 8 -> step 2^-5
    assert _fp8(engine, "wgmma", big + [(0x08, 0x38), (0x10, 0x38)], 0, arch="hopper") == 0x3D000000
    # (2^-6 dropped, 2^-5 kept) -> 2^-5 = 0x3D000000
    # 1.875^2 + 2^-6*2^-7 = 3.515625 + 2^-13: both within 13 bits of exponent sum 0, but the
    # FP32 result is cut to 13 fraction bits of its own exponent 1 -> 3.515625 = 0x40610000
    pairs = [(0x3F, 0x3F), (0x08, 0x04)]
    assert _fp8(engine, "wgmma", pairs, 0, arch="hopper") == 0x40610000
    assert _fp8(engine, "f8f6f4", pairs, 0) == 0x40610200      # Blackwell keeps 2^-13 = 2^9 ulps


def test_mx_scales_overflow_to_infinity(engine):
    # 1 * 1 * 2^127 * 2^127 = 2^254, beyond FP32 -> +-Inf (fact)
    assert _fp8(engine, "mxf8f6f4", [(0x38, 0x38)], 0, scales=(254, 254)) == POS_INF
    assert _fp8(engine, "mxf8f6f4", [(0xB8, 0x38)], 0, scales=(254, 254)) == NEG_INF


def test_infinite_and_nan_exact_sums(engine):
    e5 = dict(a_format="float8_e5m2")   # e5m2: +inf 0x7C, -inf 0xFC, 1.0 0x3C, NaN 0x7D
    assert _fp8(engine, "f8f6f4", [(0x7C, 0x3C)], 0, **e5) == POS_INF
    assert _fp8(engine, "f8f6f4", [(0x7C, 0x00)], 0, **e5) == NAN_BITS          # inf * 0
    assert _fp8(engine, "f8f6f4", [(0x7C, 0x3C)], 0xFF800000, **e5) == NAN_BITS  # inf + -inf
    assert _fp8(engine, "f8f6f4", [(0x7D, 0x3C)], 0, **e5) == NAN_BITS
    assert _fp8(engine, "f8f6f4", [(0x7F, 0x38)], 0) == NAN_BITS                # e4m3 NaN
    assert _fp8(engine, "mxf8f6f4", [], 0, scales=(0xFF, 127)) == NAN_BITS       # NaN scale, zero data


def test_assumed_zero_signs(engine):
    # A2: -0 only when C and every product are -0; any +0 term gives +0
    assert _fp8(engine, "f8f6f4", [(0x80, 0x00)] * 32, 0x80000000) == 0x80000000
    assert _fp8(engine, "f8f6f4", [(0x80, 0x00)] * 31, 0x80000000) == 0x00000000
    assert _fp8(engine, "f8f6f4", [(0x38, 0x38), (0xB8, 0x38)], 0x80000000) == 0x00000000


def test_assumed_zero_products_count_for_alignment(engine):
    # A1: zero elements enter with exponent emin (e4m3: -6), so 32 zero products under
    # scales 2^20 * 2^20 align at -12 + 40 = 28; step 2^3 truncates C = 1.0 to 0.
    assert _fp8(engine, "mxf8f6f4", [], 0x3F800000, scales=(147, 147)) == 0x00000000


@pytest.mark.parametrize("kw,param", [
    (dict(kind="mxf4nvf5"), "kind"), (dict(arch="ampere"), "arch"),
    (dict(scale_format="ue5m3"), "scale_format"), (dict(block=64), "block"),
    (dict(scale_format="ue4m3", block=32), "block"), (dict(a_format="float8_e4m3fn"), "a_format"),
])
def test_bad_choices_name_the_parameter(kw, param):
    args = dict(kind="mxf4nvf4", scale_format="ue8m0", block=32)
    args.update(kw)
    kind = args.pop("kind")
    with pytest.raises(ValueError, match=param):
        mma_independent(kind, [[0] * 64], [[0]] * 64, [[0]], [[127, 127]], [[127], [127]], **args)


def test_code_outside_the_element_format_is_rejected():
    with pytest.raises(ValueError, match="float4_e2m1fn"):
        mma_independent("mxf4nvf4", [[16] + [0] * 63], [[0]] * 64, [[0]], [[127, 127]],
                        [[127], [127]], block=32, scale_format="ue8m0")


# ---- the oracle's decoders against a third-party library (ml_dtypes) and numpy -------------

@pytest.mark.parametrize("fmt,width", [("float4_e2m1fn", 4), ("float6_e2m3fn", 6),
                                       ("float6_e3m2fn", 6), ("float8_e4m3fn", 8),
                                       ("float8_e5m2", 8)])
def test_element_decoding_matches_ml_dtypes(fmt, width):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    from tests.independent_mma.model import decode_element
    codes = np.arange(1 << width, dtype=np.uint8)
    ref = codes.view(getattr(ml_dtypes, fmt)).astype(np.float64)
    for code, want in zip(codes.tolist(), ref.tolist()):
        got = decode_element(code, fmt)
        if np.isnan(want):
            assert got.kind == "nan", (fmt, code)
        elif np.isinf(want):
            assert got.kind == "inf" and got.neg == (want < 0), (fmt, code)
        else:   # exact: value * 2^Q is an integer, compared as ints; -0 by its sign
            assert got.units() == int(want * 2.0 ** 200) << 200, (fmt, code)
            assert got.neg == bool(np.signbit(want)), (fmt, code)


def test_scale_decoding_matches_ml_dtypes():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    from tests.independent_mma.model import Q, decode_scale
    codes = np.arange(256, dtype=np.uint8)
    e8 = codes.view(ml_dtypes.float8_e8m0fnu).astype(np.float64)
    e4 = (codes & 0x7F).view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    for code in range(256):
        for fmt, want in (("float8_e8m0fnu", e8[code]), ("ue4m3", e4[code])):
            got = decode_scale(code, fmt)
            if np.isnan(want):
                assert got.kind == "nan", (fmt, code)
            else:
                m, e = np.frexp(want)   # want = m * 2^e exactly, m has <= 53 bits
                assert got.units() == int(m * 2.0 ** 53) << (Q + int(e) - 53), (fmt, code)


def test_fp32_rounding_matches_mpmath_round_toward_zero():
    # mpmath rounds the exact value toward zero ('d') to 24 bits; float32 then holds it exactly
    import mpmath
    from tests.independent_mma.model import Q, round_rz_fp32
    rng = np.random.default_rng(7)
    for _ in range(2000):   # random 60-bit significands across the normal FP32 range
        mag = int(rng.integers(1 << 59, 1 << 60))
        e = int(rng.integers(-126 - 59, 128 - 59))
        sign = -1 if rng.integers(2) else 1
        v = mpmath.mpf(sign * mag, prec=24, rounding="d") * mpmath.mpf(2) ** e
        want = int(np.array([float(v)], dtype=np.float32).view(np.uint32)[0])
        assert round_rz_fp32(sign * (mag << (Q + e)), False) == want, (sign, hex(mag), e)


# ---- fp4ref.mma against the oracle on uniformly random bytes -------------------------------

M, N = 8, 4                      # small tiles keep the integer oracle fast
TRIALS = max(20, settings.default.max_examples // 3)   # ci: 20 per case; thorough: 666
WIDTH = {"float4_e2m1fn": 4, "float6_e2m3fn": 6, "float6_e3m2fn": 6, "float8_e4m3fn": 8,
         "float8_e5m2": 8}
E4, E5, E2, E3M2, E2M3 = ("float8_e4m3fn", "float8_e5m2", "float4_e2m1fn", "float6_e3m2fn",
                          "float6_e2m3fn")
# (arch, kind, K, a_format, b_format, scale_format, block)
CASES = [
    ("blackwell", "mxf4nvf4", 64, E2, E2, "ue4m3", 16),
    ("blackwell", "mxf4nvf4", 64, E2, E2, "ue8m0", 16),
    ("blackwell", "mxf4nvf4", 64, E2, E2, "ue8m0", 32),
    ("blackwell", "mxf8f6f4", 32, E4, E4, "ue8m0", 32),
    ("blackwell", "mxf8f6f4", 32, E5, E5, "ue8m0", 32),
    ("blackwell", "mxf8f6f4", 32, E4, E5, "ue8m0", 32),
    ("blackwell", "mxf8f6f4", 32, E2, E2, "ue8m0", 32),
    ("blackwell", "mxf8f6f4", 32, E3M2, E2M3, "ue8m0", 32),
    ("blackwell", "f8f6f4", 32, E4, E4, None, None),
    ("blackwell", "f8f6f4", 32, E5, E4, None, None),
    ("blackwell", "f8f6f4", 32, E2M3, E2, None, None),
    ("hopper", "wgmma", 32, E4, E4, None, None),
    ("hopper", "wgmma", 32, E5, E5, None, None),
    ("hopper", "wgmma", 32, E4, E5, None, None),
]
# Spellings the API might use; the first it accepts on an all-zero tile is used.
SPELLINGS = {
    "kind": {"wgmma": ("wgmma", "wgmma_fp8", "f8f6f4")},
    "scale_format": {"ue8m0": ("ue8m0", "float8_e8m0fnu", "e8m0"), "ue4m3": ("ue4m3",)},
}
_RESOLVED: dict = {}


def _api():
    fp4ref = pytest.importorskip("fp4ref")
    if not hasattr(fp4ref, "mma"):
        pytest.skip("fp4ref.mma does not exist yet (issue 17, deliverable 2)")
    return fp4ref.mma


def _special_fp8(codes, fmt):
    if fmt == E4:
        return codes & 0x7F == 0x7F
    if fmt == E5:
        return (codes >> 2) & 0x1F == 0x1F
    return np.zeros(codes.shape, dtype=bool)


def _random_tile(rng, case, narrow):
    """Uniform bytes. `narrow` trials (every other one) keep C and e8m0 scales near 1 and turn
    fp8 NaN/Inf codes finite, so that C, truncation and the products interact more often."""
    arch, kind, K, af, bf, sf, blk = case
    a, b = rng.integers(0, 1 << WIDTH[af], (M, K)), rng.integers(0, 1 << WIDTH[bf], (K, N))
    if narrow:   # clearing bit 6 leaves the e4m3 / e5m2 special exponent field
        a = np.where(_special_fp8(a, af), a ^ 0x40, a)
        b = np.where(_special_fp8(b, bf), b ^ 0x40, b)
    a, b = a.tolist(), b.tolist()
    c = rng.integers(0, 1 << 32, (M, N), dtype=np.uint64)
    if narrow:
        c = (c & 0x807FFFFF) | (rng.integers(127 - 24, 127 + 24, (M, N)).astype(np.uint64) << 23)
    sa = sb = None
    if blk:
        lo, hi = (127 - 8, 127 + 8) if narrow and sf == "ue8m0" else (0, 256)
        sa = rng.integers(lo, hi, (M, K // blk)).tolist()
        sb = rng.integers(lo, hi, (K // blk, N)).tolist()
    return a, b, c.tolist(), sa, sb


def _to_torch(a, b, c, sa, sb):
    import torch
    u8 = lambda m: None if m is None else torch.tensor(m, dtype=torch.uint8)  # noqa: E731
    ct = torch.from_numpy(np.array(c, dtype=np.uint32).view(np.int32)).view(torch.float32)
    return u8(a), u8(b), ct, u8(sa), u8(sb)


def _call(mma, case, a, b, c, sa, sb):
    """Call fp4ref.mma, resolving the API's spelling of kind / scale_format once per case."""
    arch, kind, K, af, bf, sf, blk = case
    key = case
    if key not in _RESOLVED:   # an all-zero tile is valid in every format
        errors = []
        for k in SPELLINGS["kind"].get(kind, (kind,)):
            for s in SPELLINGS["scale_format"].get(sf, (sf,)):
                z = _to_torch([[0] * K] * M, [[0] * N] * K, [[0] * N] * M,
                              *(([[127] * (K // blk)] * M, [[127] * N] * (K // blk)) if blk
                                else (None, None)))
                kw = dict(block=blk, scale_format=s) if blk else {}
                try:
                    mma(k, z[0], z[1], z[2], z[3], z[4], a_format=af, b_format=bf, arch=arch, **kw)
                except ValueError as exc:
                    errors.append(f"{k}/{s}: {exc}")
                    continue
                _RESOLVED[key] = (k, kw)
                break
            if key in _RESOLVED:
                break
        else:
            pytest.skip(f"fp4ref.mma accepts no spelling of {arch} {kind}: {errors[-1]}")
    k, kw = _RESOLVED[key]
    return _bits(mma(k, *_to_torch(a, b, c, sa, sb), a_format=af, b_format=bf, arch=arch, **kw))


def _first_mismatch(case, got, want, a, b, c, sa, sb):
    bad = [(i, j) for i in range(M) for j in range(N) if got[i][j] != want[i][j]]
    if not bad:
        return None
    i, j = bad[0]
    hexs = lambda v: " ".join(f"{x:02x}" for x in v)  # noqa: E731
    K = case[2]
    msg = (f"{len(bad)}/{M * N} outputs differ; first at D[{i},{j}] for {case}: "
           f"fp4ref.mma {got[i][j]:#010x}, independent model {want[i][j]:#010x}\n"
           f"  a[{i},:] = {hexs(a[i])}\n  b[:,{j}] = {hexs([b[k][j] for k in range(K)])}\n"
           f"  c[{i},{j}] = {c[i][j]:#010x}")
    if sa is not None:
        msg += (f"\n  scale_a[{i},:] = {hexs(sa[i])}"
                f"\n  scale_b[:,{j}] = {hexs([r[j] for r in sb])}")
    return msg


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(str(x) for x in c if x))
def test_fp4ref_mma_equals_independent_model_on_random_bytes(case):
    mma = _api()
    arch, kind, K, af, bf, sf, blk = case
    rng = np.random.default_rng(CASES.index(case))   # fixed seed per case
    for trial in range(TRIALS):
        a, b, c, sa, sb = _random_tile(rng, case, narrow=trial % 2 == 1)
        got = _call(mma, case, a, b, c, sa, sb)
        want = mma_independent(kind, a, b, c, sa, sb, block=blk, scale_format=sf,
                               a_format=af, b_format=bf, arch=arch)
        msg = _first_mismatch(case, got, want, a, b, c, sa, sb)
        if msg:
            pytest.fail(f"trial {trial}: {msg}")


def test_fp4ref_mma_rejects_a_code_outside_the_element_format():
    mma = _api()
    import torch
    a = torch.zeros(M, 64, dtype=torch.uint8)
    a[0, 0] = 16                          # not an e2m1 code
    with pytest.raises(ValueError, match="16"):
        mma("mxf4nvf4", a, torch.zeros(64, N, dtype=torch.uint8), torch.zeros(M, N),
            torch.full((M, 4), 0x38, dtype=torch.uint8), torch.full((4, N), 0x38, dtype=torch.uint8),
            block=16, scale_format="ue4m3", a_format=E2, b_format=E2)
