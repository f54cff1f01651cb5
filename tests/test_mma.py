"""fp4ref.mma (vectorised int64) == reference.mma (exact, one element at a time), bit for bit,
plus the worked examples of issue 17 / SPEC 4.1 as literals, and every bad-input error.

Random tiles are 128 x 8 (M x N) of uniformly random codes, scale bytes and C bit patterns
(NaN, Inf, subnormals, -0 and NaN scales all occur), mixed with tamer styles that reach the
finite, cancelling and signed-zero paths ("finite", "cancel", "zeros").  CI: 20 trials per configuration, the reference
on 8 random rows of each tile; HYPOTHESIS_PROFILE=thorough: 100 trials, all 128 rows.
"""
from __future__ import annotations

import os
import struct
from fractions import Fraction

import numpy as np
import pytest
import torch

import fp4ref
from fp4ref.mma_tile import decode_table
from reference import mma as ref
from reference.formats import get_format

THOROUGH = os.environ.get("HYPOTHESIS_PROFILE") == "thorough"
TRIALS = 100 if THOROUGH else 20
REF_ROWS = 128 if THOROUGH else 8
M, N = 128, 8

_F8F6F4 = ["e4m3", "e5m2", "e3m2", "e2m3", "e2m1"]
CONFIGS = {  # id -> (kind, fixed kwargs, a/b format pairs drawn per trial or None)
    "mxf4nvf4-ue4m3-16": ("mxf4nvf4", {"scale_format": "ue4m3", "block": 16}, None),
    "mxf4nvf4-ue8m0-16": ("mxf4nvf4", {"scale_format": "ue8m0", "block": 16}, None),
    "mxf4nvf4-ue8m0-32": ("mxf4nvf4", {"scale_format": "ue8m0", "block": 32}, None),
    "mxf8f6f4": ("mxf8f6f4", {}, [(x, y) for x in _F8F6F4 for y in _F8F6F4]),
    "f8f6f4": ("f8f6f4", {}, [(x, y) for x in _F8F6F4 for y in _F8F6F4]),
    "f16-fp16": ("f16", {"a_format": "float16"}, None),
    "f16-bf16": ("f16", {"a_format": "bfloat16"}, None),
    "tf32": ("tf32", {}, None),
    "wgmma-fp8": ("wgmma", {"arch": "hopper"}, [(x, y) for x in _F8F6F4[:2] for y in _F8F6F4[:2]]),
    "wgmma-fp16": ("wgmma", {"arch": "hopper", "a_format": "float16"}, None),
    "wgmma-bf16": ("wgmma", {"arch": "hopper", "a_format": "bfloat16"}, None),
}


# --- random operands ----------------------------------------------------------------

def _finite_codes(rng, fmt: str, shape) -> np.ndarray:
    """Uniform codes with NaN/Inf codes replaced by zeros of random sign."""
    spec = get_format(fmt)
    t = decode_table(fmt)
    x = rng.integers(0, spec.ncodes, shape)
    special = t["nan"][x] | t["inf"][x]
    return np.where(special, rng.integers(0, 2, shape) * spec.sign_mask, x)


def _c_bits(rng, style: str, shape) -> np.ndarray:
    raw = rng.integers(0, 1 << 32, shape, dtype=np.uint64).astype(np.int64)
    if style == "uniform":
        specials = np.array([0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00001, 0x00000001,
                             0x807FFFFF, 0x7F7FFFFF])
        pick = rng.integers(0, 4 * len(specials), shape)   # one in four from the specials
        return np.where(pick < len(specials), specials[pick % len(specials)], raw)
    # moderate exponents (|C| in [2^-20, 2^20)), zeros of both signs, an exact 1.0
    moderate = (raw & 0x807FFFFF) | ((rng.integers(-20, 20, shape) + 127) << 23)
    pick = rng.integers(0, 8, shape)
    return np.select([pick == 0, pick == 1, pick == 2], [0, 0x80000000, 0x3F800000], moderate)


def _scale_bytes(rng, style: str, scale_format: str, shape) -> np.ndarray:
    if style == "uniform":
        return rng.integers(0, 256, shape)
    if scale_format == "ue8m0":
        return rng.integers(120, 135, shape)              # 2^-7 .. 2^7
    return rng.integers(0, 0x7F, shape) | (rng.integers(0, 2, shape) << 7)  # no NaN, any sign


def _operands(rng, ins: ref.Instr, style: str):
    fa, fb = ins.a_format, ins.b_format
    if style == "uniform":
        a = rng.integers(0, get_format(fa).ncodes, (M, ins.k))
        b = rng.integers(0, get_format(fb).ncodes, (ins.k, N))
    else:
        a, b = _finite_codes(rng, fa, (M, ins.k)), _finite_codes(rng, fb, (ins.k, N))
    if style == "cancel":
        # second half of each row = first half negated; B's halves equal; zero runs
        h = ins.k // 2
        a[:, h:] = a[:, :h] ^ get_format(fa).sign_mask
        b[h:] = b[:h]
        a[rng.random((M, ins.k)) < 0.3] = 0
    if style == "zeros":
        # rows of zeros of one sign times columns of one sign: products all +0 or all -0
        ma, mb = get_format(fa).sign_mask, get_format(fb).sign_mask
        zero_rows = rng.random(M) < 0.75
        a[zero_rows] = (rng.integers(0, 2, (M, 1)) * ma)[zero_rows]
        b = (b & ~mb) | rng.integers(0, 2, (1, N)) * mb
    sa = sb = None
    if ins.scale_format is not None:
        nb = ins.k // ins.block
        sa = _scale_bytes(rng, style, ins.scale_format, (M, nb))
        sb = _scale_bytes(rng, style, ins.scale_format, (nb, N))
        if style == "cancel" and nb > 1:  # the negated half meets the same scales
            sa[:, nb // 2:], sb[nb // 2:] = sa[:, :nb // 2], sb[:nb // 2]
    c = _c_bits(rng, style, (M, N))
    if style == "zeros":
        c = np.where(rng.random((M, N)) < 0.75, rng.integers(0, 2, (M, N)) << 31, c)
    return a, b, c, sa, sb


def _tensor(x, fmt: str | None = None):
    if x is None:
        return None
    narrow = fmt is None or get_format(fmt).nbits <= 8
    return torch.from_numpy(x.astype(np.uint8 if narrow else np.int32))


def _rows(x, rows):
    return None if x is None else x[rows].tolist()


def _describe(ins, r, j, want, got, a, b, c, sa, sb) -> str:
    return (f"{ins}: D[{r},{j}] reference 0x{want:08x} fast 0x{got:08x}; raw bytes: "
            f"a[{r}]={a[r].tolist()} b[:,{j}]={b[:, j].tolist()} c=0x{int(c[r, j]):08x} "
            f"scale_a[{r}]={None if sa is None else sa[r].tolist()} "
            f"scale_b[:,{j}]={None if sb is None else sb[:, j].tolist()}")


def _one_trial(rng, kind, kw, pairs) -> str | None:
    kw = dict(kw)
    if pairs:
        kw["a_format"], kw["b_format"] = pairs[rng.integers(len(pairs))]
    ins = ref.resolve(kind, **kw)
    style = ["uniform", "uniform", "finite", "cancel", "zeros"][rng.integers(5)]
    a, b, c, sa, sb = _operands(rng, ins, style)
    d = fp4ref.mma(kind, _tensor(a, ins.a_format), _tensor(b, ins.b_format),
                   torch.from_numpy(c.astype(np.uint32).view(np.float32)),
                   _tensor(sa), _tensor(sb), **kw)
    assert d.dtype == torch.float32 and tuple(d.shape) == (M, N)
    got = d.numpy().view(np.uint32)
    rows = np.sort(rng.choice(M, REF_ROWS, replace=False))
    want = ref.mma(kind, _rows(a, rows), b.tolist(), _rows(c, rows), _rows(sa, rows),
                   None if sb is None else sb.tolist(), **kw)
    for i, r in enumerate(rows):
        for j in range(N):
            if want[i][j] != int(got[r, j]):
                return _describe(ins, r, j, want[i][j], int(got[r, j]), a, b, c, sa, sb)
    return None


@pytest.mark.parametrize("config", list(CONFIGS))
def test_random_tiles_fast_equals_reference(config):
    kind, kw, pairs = CONFIGS[config]
    rng = np.random.default_rng(sorted(CONFIGS).index(config) + 17 * THOROUGH)
    for trial in range(TRIALS):
        mismatch = _one_trial(rng, kind, kw, pairs)
        assert mismatch is None, f"trial {trial}: first mismatch {mismatch}"


def test_decode_tables_match_reference_formats():
    names = ["float4_e2m1fn", "float6_e2m3fn", "float6_e3m2fn", "float8_e4m3fn", "float8_e5m2",
             "ue4m3", "ue8m0"]
    for name in names + ["float16", "bfloat16", "tf32"]:
        t = decode_table(name)
        spec = get_format({"ue8m0": "float8_e8m0fnu"}.get(name, name))
        codes = range(len(t["sig"])) if name in names else range(0, spec.ncodes, 61)
        for code in codes:
            v = spec.decode(code & 0x7F if name == "ue4m3" else code)
            assert bool(t["nan"][code]) == v.is_nan and bool(t["inf"][code]) == v.is_inf
            if v.is_finite:
                got = int(t["sig"][code]) * Fraction(2) ** (int(t["exp"][code]) - spec.man_bits)
                assert (got, bool(t["neg"][code])) == (v.mag, v.negative), (name, code)
                assert int(t["exp"][code]) >= spec.emin, (name, code)


# --- literal examples (expected values worked out by hand from the published facts) ----

def _f32(x) -> int:
    return struct.unpack("<I", struct.pack("<f", x))[0]


def _code(fmt: str, x) -> int:
    """Code of an exactly representable value; ``"-0"`` for the negative zero."""
    spec = get_format(fmt)
    if x == "-0":
        return spec.sign_mask
    x = Fraction(x)
    return spec.encode_magnitude(abs(x)) | (spec.sign_mask if x < 0 else 0)


def _both(kind, a_terms, c, sa=None, sb=None, **kw) -> int:
    """D[0,0] for one row/column given as {k: (a value, b value)}; other products 0 * 0.
    Runs fp4ref.mma and reference.mma, asserts they agree, returns the float32 bits."""
    ins = ref.resolve(kind, **kw)
    a = [_code(ins.a_format, 0)] * ins.k
    b = [_code(ins.b_format, 0)] * ins.k
    for k, (x, y) in a_terms.items():
        a[k], b[k] = _code(ins.a_format, x), _code(ins.b_format, y)
    c_bits = c if isinstance(c, int) else _f32(c)
    sa_t = None if sa is None else torch.tensor([sa], dtype=torch.uint8)
    sb_t = None if sb is None else torch.tensor([[s] for s in sb], dtype=torch.uint8)
    wide = torch.int32 if get_format(ins.a_format).nbits > 8 else torch.uint8
    d = fp4ref.mma(kind, torch.tensor([a], dtype=wide), torch.tensor([[x] for x in b], dtype=wide),
                   torch.tensor([[c_bits]], dtype=torch.int64).to(torch.int32).view(torch.float32),
                   sa_t, sb_t, **kw)
    fast = int(d.view(torch.int32)[0, 0]) & 0xFFFFFFFF
    want = ref.mma(kind, [a], [[x] for x in b], [[c_bits]], None if sa is None else [sa],
                   None if sb is None else [[s] for s in sb], **kw)[0][0]
    assert fast == want, (hex(fast), hex(want))
    return want


UE4M3_448, UE4M3_2M9, UE4M3_256, UE4M3_1 = 0x7E, 0x01, 0x78, 0x38   # 2^-9 is subnormal
P = Fraction(1, 2)


def test_issue_example_cancelling_groups_truncate_2m20():
    # 6*6*448*448 = 7,225,344; the scale-exponent sum 16 sets the step to 2^(16-35)
    terms = {0: (6, 6), 16: (-6, 6), 32: (P, P)}
    scales = [UE4M3_448, UE4M3_448, UE4M3_2M9, UE4M3_2M9]
    assert _both("mxf4nvf4", terms, 0.0, scales, scales) == 0
    small = [UE4M3_2M9] * 4   # without the big groups the 2^-20 group survives
    assert _both("mxf4nvf4", {32: (P, P)}, 0.0, small, small) == _f32(2.0 ** -20)


def test_issue_example_rz_keeps_32():
    small = [UE4M3_2M9] * 4
    assert _both("mxf4nvf4", {0: (Fraction(3, 2), P)}, 32.0, small, small) == _f32(32.0)
    assert _both("mxf4nvf4", {0: (2, P)}, 32.0, small, small) == _f32(32.0 + 2.0 ** -18)
    # SPEC 4.1: C = 1 + 0.75 ulp gives 1.0 (ue8m0 scales 2^-9: 0.75 * 2^-18 * 2^-5 ...)
    e8 = [127 - 13] * 2   # 2^-13 * 2^-13 = 2^-26; 0.75 * 2^-26 = 3 * 2^-28 < 1 ulp of 1
    assert _both("mxf4nvf4", {0: (Fraction(3, 2), P)}, 1.0, e8, e8,
                 scale_format="ue8m0") == _f32(1.0)


def test_issue_example_subnormal_scale_convention():
    # groups +-0.25, scales 2^-9 (exponent -6, significand 1/8) and 256: sum -6 + 8 = 2,
    # step 2^-33, so C = 2^-35 is truncated away
    sa, sb = [UE4M3_2M9] * 4, [UE4M3_256] * 4
    assert _both("mxf4nvf4", {0: (P, P), 16: (-P, P)}, 2.0 ** -35, sa, sb) == 0
    sa = [0x08] * 4   # 2^-6: sum 2 again; with 2^-9 on both sides (sum -12) C survives
    assert _both("mxf4nvf4", {0: (P, P), 16: (-P, P)}, 2.0 ** -35, sa, sb) == 0
    small = [UE4M3_2M9] * 4
    assert _both("mxf4nvf4", {0: (P, P), 16: (-P, P)}, 2.0 ** -35, small, small) == _f32(2.0 ** -35)


def test_nan_scales_and_c_give_canonical_nan():
    ones = [UE4M3_1] * 4
    for bad in (0x7F, 0xFF):           # ue4m3: the sign bit is ignored, both are NaN
        assert _both("mxf4nvf4", {0: (1, 1)}, 1.0, ones[:3] + [bad], ones) == 0x7FFFFFFF
        assert _both("mxf4nvf4", {0: (1, 1)}, 1.0, ones, [bad] + ones[1:]) == 0x7FFFFFFF
    e8 = [127, 127]
    assert _both("mxf4nvf4", {}, 1.0, e8, [127, 0xFF], scale_format="ue8m0") == 0x7FFFFFFF
    assert _both("mxf4nvf4", {0: (1, 1)}, 0xFFC12345, ones, ones) == 0x7FFFFFFF
    assert _both("mxf8f6f4", {}, 0.0, [0xFF], [127], a_format="e4m3") == 0x7FFFFFFF
    assert _both("f8f6f4", {}, 0x7F800001, a_format="e4m3") == 0x7FFFFFFF


def test_ue4m3_sign_bit_ignored():
    neg_one = [UE4M3_1 | 0x80] * 4
    assert _both("mxf4nvf4", {0: (1, 1)}, 0.0, neg_one, neg_one) == _f32(1.0)
    assert _both("mxf4nvf4", {0: (3, -2)}, 0.0, [0xB8] * 4, [0x40] * 4) == _f32(-12.0)


def test_infinities():
    kw = {"a_format": "e5m2"}
    inf = float("inf")
    assert _both("f8f6f4", {0: (1, 1)}, _f32(-inf), **kw) == _f32(-inf)
    assert _both("f8f6f4", {0: (2, 1)}, _f32(inf), **kw) == _f32(inf)
    a = get_format("float8_e5m2").inf_code
    # e5m2 infinity times 1 (through raw codes: inf has no exact value to encode)
    assert _wgmma_raw_inf(a, _code("float8_e5m2", 1), _f32(1.0)) == _f32(inf)
    assert _wgmma_raw_inf(a, _code("float8_e5m2", 0), _f32(1.0)) == 0x7FFFFFFF   # inf * 0
    assert _wgmma_raw_inf(a, _code("float8_e5m2", 1), _f32(-inf)) == 0x7FFFFFFF  # inf - inf


def _wgmma_raw_inf(a_code, b_code, c_bits) -> int:
    a = torch.zeros(1, 32, dtype=torch.uint8)
    b = torch.zeros(32, 1, dtype=torch.uint8)
    a[0, 3], b[3, 0] = a_code, b_code
    c = torch.tensor([[c_bits]], dtype=torch.int64).to(torch.int32).view(torch.float32)
    out = []
    for kind, kw in (("f8f6f4", {}), ("wgmma", {"arch": "hopper"})):
        d = fp4ref.mma(kind, a, b, c, a_format="e5m2", **kw)
        want = ref.mma(kind, a.tolist(), b.tolist(), [[c_bits]], a_format="e5m2", **kw)[0][0]
        out.append(want)
        assert int(d.view(torch.int32)[0, 0]) & 0xFFFFFFFF == want
    assert out[0] == out[1]
    return out[0]


def test_overflow_beyond_fp32_is_inf():
    big = [254, 254]   # 2^127 * 2^127
    assert _both("mxf4nvf4", {0: (6, 6)}, 0.0, big, big, scale_format="ue8m0") == 0x7F800000
    assert _both("mxf4nvf4", {0: (-6, 6)}, 0.0, big, big, scale_format="ue8m0") == 0xFF800000
    # C = max finite plus a product far below its truncation step: RZ keeps max finite
    assert _both("f8f6f4", {0: (448, 448)}, 0x7F7FFFFF, a_format="e4m3") == 0x7F7FFFFF


def test_signed_zero_of_the_result():
    ones = [UE4M3_1] * 4
    neg0 = {k: ("-0", 1) for k in range(64)}
    assert _both("mxf4nvf4", neg0, 0x80000000, ones, ones) == 0x80000000
    assert _both("mxf4nvf4", neg0, 0x00000000, ones, ones) == 0
    assert _both("mxf4nvf4", {**neg0, 5: (1, 1), 6: (-1, 1)}, 0x80000000, ones, ones) == 0
    # a negative group sum times a zero scale is -0 (IEEE signs); a positive one +0
    zs = [0x00, UE4M3_1, UE4M3_1, UE4M3_1]
    assert _both("mxf4nvf4", {**neg0, 0: (-1, 1)}, 0x80000000, zs, ones) == 0x80000000
    assert _both("mxf4nvf4", {**neg0, 0: (1, 1)}, 0x80000000, zs, ones) == 0
    kw = {"a_format": "e4m3"}
    neg0 = {k: ("-0", 2) for k in range(32)}
    assert _both("f8f6f4", neg0, 0x80000000, **kw) == 0x80000000
    assert _both("f8f6f4", {**neg0, 1: (1, 1), 2: (-1, 1)}, 0x80000000, **kw) == 0
    # a negative sum below the smallest subnormal rounds toward zero to -0
    t = Fraction(1, 2 ** 75)   # bf16: -2^-75 * 2^-75 = -2^-150
    assert _both("f16", {0: (-t, t)}, 0x80000000, a_format="bf16") == 0x80000000
    assert _both("f16", {0: (-t, t)}, 0x00000000, a_format="bf16") == 0x80000000


def test_alignment_at_exponent_sums_and_widths():
    # 1.5 * 1.5 = 2.25 has exponent 1, but aligns at exp(a) + exp(b) = 0: step 2^-25
    kw = {"a_format": "e4m3"}
    pair = {0: (Fraction(3, 2), Fraction(3, 2)), 1: (-Fraction(3, 2), Fraction(3, 2))}
    assert _both("f8f6f4", pair, 3 * 2.0 ** -26, **kw) == _f32(2.0 ** -25)
    assert _both("wgmma", pair, 3 * 2.0 ** -14, arch="hopper", **kw) == _f32(2.0 ** -13)
    # wgmma fp8 cuts the result to 13 fraction bits; Blackwell keeps FP32's 23
    sixteen = {k: (1, 1) for k in range(16)} | {20: (Fraction(1, 64), Fraction(1, 64))}
    assert _both("f8f6f4", sixteen, 0.0, **kw) == _f32(16 + 2.0 ** -12)
    assert _both("wgmma", sixteen, 0.0, arch="hopper", **kw) == _f32(16.0)
    # mxf8f6f4: scale exponents join the product's; C below 2^(E-25) is truncated
    # (+1024 - 1024 with scale 2^10: E = 10, step 2^-15; 2^-13 + 2^-16 keeps 2^-13)
    cancel = {0: (1, 1), 1: (-1, 1)}
    assert _both("mxf8f6f4", cancel, 2.0 ** -13 + 2.0 ** -16, [137], [127], **kw) == _f32(2.0 ** -13)
    assert _both("mxf8f6f4", cancel, 2.0 ** -13 + 2.0 ** -16, [127], [127], **kw) \
        == _f32(2.0 ** -13 + 2.0 ** -16)


def test_fp32_subnormal_results():
    kw = {"a_format": "bf16"}
    t = Fraction(1, 2 ** 74)
    # 1.75 * 2^-148 = 3.5 * 2^-149: truncated toward zero to 3 * 2^-149
    assert _both("f16", {0: (Fraction(7, 4) * t, t)}, 0.0, **kw) == 3
    assert _both("f16", {0: (Fraction(1, 2 ** 100), Fraction(1, 2 ** 30))}, 0.0, **kw) == 1 << 19
    # C subnormal (exponent -126) beside e4m3 zeros (exponent -6 - 6): step 2^-37, C lost
    assert _both("f8f6f4", {}, 3, a_format="e4m3") == 0
    assert _both("f16", {}, 3, **kw) == 3   # bf16 zeros: exponent -252; C kept


# --- bad input: a ValueError naming the parameter, the value and the valid choices ----

def _args(kind="mxf4nvf4", k=64, m=2, n=3, nb=4, a_dtype=torch.uint8):
    return (torch.zeros(m, k, dtype=a_dtype), torch.zeros(k, n, dtype=a_dtype),
            torch.zeros(m, n), torch.zeros(m, nb, dtype=torch.uint8),
            torch.zeros(nb, n, dtype=torch.uint8))


_U8 = torch.uint8
BAD = {  # id -> (call, words the message must hold)
    "kind": (lambda: fp4ref.mma("mxf4", *_args()), ["kind", "'mxf4'", "mxf4nvf4", "f8f6f4"]),
    "arch": (lambda: fp4ref.mma("mxf4nvf4", *_args(), arch="ampere"), ["arch", "hopper"]),
    "kind-for-arch": (lambda: fp4ref.mma("wgmma", *_args()[:3], a_format="e4m3"),
                      ["kind", "'wgmma'", "blackwell", "mxf4nvf4"]),
    "hopper-kind": (lambda: fp4ref.mma("mxf4nvf4", *_args(), arch="hopper"), ["kind", "wgmma"]),
    "a_format": (lambda: fp4ref.mma("f8f6f4", *_args(k=32)[:3], a_format="e8m0"),
                 ["a_format", "'e8m0'", "float8_e4m3fn", "float4_e2m1fn"]),
    "a_format-missing": (lambda: fp4ref.mma("mxf8f6f4", *_args(k=32, nb=1)),
                         ["a_format", "float8_e5m2"]),
    "a_format-mxf4": (lambda: fp4ref.mma("mxf4nvf4", *_args(), a_format="e4m3"),
                      ["a_format", "float4_e2m1fn"]),
    "b_format-f16": (lambda: fp4ref.mma("f16", *_args(k=16)[:3], a_format="bf16", b_format="fp16"),
                     ["b_format", "bfloat16"]),
    "b_format-wgmma": (lambda: fp4ref.mma("wgmma", *_args()[:3], arch="hopper", a_format="e4m3",
                                          b_format="bf16"), ["b_format", "float8_e5m2"]),
    "scale_format": (lambda: fp4ref.mma("mxf4nvf4", *_args(), scale_format="ue5m3"),
                     ["scale_format", "'ue5m3'", "ue4m3", "ue8m0"]),
    "scale_format-mxf8": (lambda: fp4ref.mma("mxf8f6f4", *_args(k=32, nb=1), a_format="e4m3",
                                             scale_format="ue4m3"), ["scale_format", "ue8m0"]),
    "block-ue4m3": (lambda: fp4ref.mma("mxf4nvf4", *_args(nb=2), block=32),
                    ["block", "32", "ue4m3", "16"]),
    "block-ue8m0": (lambda: fp4ref.mma("mxf4nvf4", *_args(), block=8, scale_format="ue8m0"),
                    ["block", "8", "16, 32"]),
    "block-unscaled": (lambda: fp4ref.mma("f8f6f4", *_args(k=32)[:3], a_format="e4m3", block=32),
                       ["block", "f8f6f4", "None"]),
    "scales-unscaled": (lambda: fp4ref.mma("f8f6f4", *_args(k=32, nb=1), a_format="e4m3"),
                        ["scale_a", "no scales"]),
    "scales-missing": (lambda: fp4ref.mma("mxf4nvf4", *_args()[:3]), ["scale_a", "ue4m3", "[M, 4]"]),
    "code": (lambda: fp4ref.mma("mxf4nvf4", torch.full((2, 64), 16, dtype=_U8), *_args()[1:]),
             ["a", "code 16", "float4_e2m1fn", "0..15"]),
    "code-e3m2": (lambda: fp4ref.mma("f8f6f4", torch.zeros(1, 32, dtype=_U8),
                                     torch.full((32, 1), 64, dtype=_U8), torch.zeros(1, 1),
                                     a_format="e4m3", b_format="e3m2"),
                  ["b", "code 64", "float6_e3m2fn", "0..63"]),
    "code-negative": (lambda: fp4ref.mma("f16", -torch.ones(1, 16, dtype=torch.int32),
                                         torch.zeros(16, 1, dtype=torch.int32), torch.zeros(1, 1),
                                         a_format="fp16"), ["a", "code -1", "0..65535"]),
    "scale-byte": (lambda: fp4ref.mma("mxf4nvf4", *_args()[:3], torch.full((2, 4), 256),
                                      _args()[4]), ["scale_a", "code 256", "0..255"]),
    "a-float": (lambda: fp4ref.mma("mxf4nvf4", torch.zeros(2, 64), *_args()[1:]),
                ["a", "torch.float32", "integer"]),
    "a-shape": (lambda: fp4ref.mma("mxf4nvf4", *_args(k=32)), ["a", "[2, 32]", "[*, 64]"]),
    "b-shape": (lambda: fp4ref.mma("mxf4nvf4", _args()[0], torch.zeros(32, 3, dtype=_U8),
                                   *_args()[2:]), ["b", "[32, 3]", "[64, *]"]),
    "c-shape": (lambda: fp4ref.mma("mxf4nvf4", *_args()[:2], torch.zeros(3, 2), *_args()[3:]),
                ["c", "[3, 2]", "[2, 3]"]),
    "c-dtype": (lambda: fp4ref.mma("mxf4nvf4", *_args()[:2], torch.zeros(2, 3, dtype=torch.float64),
                                   *_args()[3:]), ["c", "torch.float64", "torch.float32"]),
    "scale-shape": (lambda: fp4ref.mma("mxf4nvf4", *_args(nb=2)), ["scale_a", "[2, 2]", "[2, 4]"]),
    "scale_b-shape": (lambda: fp4ref.mma("mxf4nvf4", *_args()[:4], torch.zeros(4, 2, dtype=_U8)),
                      ["scale_b", "[4, 2]", "[4, 3]"]),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_is_a_clear_value_error(case):
    call, words = BAD[case]
    with pytest.raises(ValueError) as err:
        call()
    for w in words:
        assert w in str(err.value), (case, w, str(err.value))


def test_lists_in_and_device_out():
    # plain nested lists work; the result is float32 on c's device, shape [M, N]
    d = fp4ref.mma("tf32", [[0] * 8], [[0]] * 8, [[1.5]])
    assert d.dtype == torch.float32 and d.tolist() == [[1.5]]
