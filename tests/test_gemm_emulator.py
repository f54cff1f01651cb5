"""fp4ref.gemm.emulate == reference.gemm.dot, bit for bit, for every preset and for
hypothesis-drawn points of the model family, on adversarial operands."""
from __future__ import annotations

import math
from fractions import Fraction

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings, strategies as st

from reference.gemm import PRESETS, AlignRef, GemmModel, ScalePoint
from fp4ref.gemm import emulate, round_float
from reference.notation import short

from .gemm_helpers import (OPERAND_KINDS, matrices, mismatch, ref_matmul, same_bits,
                           scale_value)

_slow = settings(suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
                 deadline=None)


def _check(model, a, b, paths=("auto",), **kw):
    try:
        want = ref_matmul(model, a, b, **kw)
    except ValueError:
        with pytest.raises(ValueError):
            emulate(model, a, b, **kw)
        assume(False)
        return
    for p in paths:
        got = emulate(model, a, b, _paths=p, **kw)
        assert got.dtype == torch.float32 and got.shape == want.shape
        assert same_bits(got, want), f"{model} paths={p}: {mismatch(got, want)}"


@st.composite
def problem(draw, blocked=None, kmax=96):
    blocked = draw(st.booleans()) if blocked is None else blocked
    M = draw(st.integers(1, 3))
    N = draw(st.integers(1, 3))
    kind = draw(st.sampled_from(OPERAND_KINDS))
    kw = {}
    if blocked:
        block = draw(st.sampled_from((1, 2, 4, 16, 32)))
        nb = draw(st.integers(1, max(1, kmax // block)))
        K = block * nb
        sk = draw(st.sampled_from(("narrow", "wide", "special")))
        sa = draw(st.lists(scale_value(sk), min_size=M * nb, max_size=M * nb))
        sb = draw(st.lists(scale_value(sk), min_size=N * nb, max_size=N * nb))
        kw = dict(scales_a=torch.tensor(sa).reshape(M, nb), scales_b=torch.tensor(sb).reshape(nb, N),
                  block=block)
    else:
        K = draw(st.integers(1, kmax))
    a, b = draw(matrices(M, K, N, kind))
    return a, b, kw


@pytest.mark.parametrize("name", list(PRESETS))
@given(prob=problem())
def test_presets(name, prob):
    a, b, kw = prob
    _check(PRESETS[name], a, b, **kw)


@_slow
@given(prob=problem(blocked=True, kmax=512))
def test_probe_matched_long_k(prob):
    a, b, kw = prob
    for name in ("probe_matched", "probe_matched_lattice", "decoded_fp32"):
        _check(PRESETS[name], a, b, **kw)


def _fit_split(model: GemmModel, K: int, block: int | None) -> GemmModel:
    """A drawn model made to fit K: GROUP scales take group_size = block, and split_k falls
    back to 1 unless K splits into slices of whole blocks."""
    if block is not None and model.scale_point is ScalePoint.GROUP:
        model = model.replace(group_size=block)
    from reference.gemm import split_bounds
    if ((model.split_tile is None and K % model.split_k)
            or (block is not None and any(lo % block for lo, _ in split_bounds(model, K)))):
        model = model.replace(split_k=1, split_tile=None)
    return model


@st.composite
def family_point(draw, exponent_sum=False):
    from .gemm_helpers import gemm_models
    blocked = draw(st.booleans())
    model = draw(gemm_models(blocked))
    if exponent_sum:  # a point where align_ref matters
        model = model.replace(align_ref=AlignRef.EXPONENT_SUM,
                              align_bits=draw(st.sampled_from((0, 1, 2, 3, 5, 8, 13, 25))))
    a, b, kw = draw(problem(blocked=blocked, kmax=64))
    model = _fit_split(model, a.shape[1], kw.get("block") if blocked else None)
    alpha = draw(st.sampled_from((None, "scalar", "tensor", "list")))
    M, N = a.shape[0], b.shape[1]
    if alpha == "scalar":
        kw["alpha"] = draw(st.sampled_from((0.1, 3.0, 2.0 ** -140, 1e30, -0.5)))
    elif alpha == "tensor":
        kw["alpha"] = torch.tensor(draw(st.lists(st.floats(-4, 4, width=32), min_size=M, max_size=M)))[:, None]
    elif alpha == "list":
        kw["alpha"] = [draw(st.sampled_from((1.5, 2.0 ** 100, 0.3))), torch.full((1, N), 2.0 ** -90)]
    return model, a, b, kw


@_slow
@given(family_point())
def test_family_points(pt):
    model, a, b, kw = pt
    _check(model, a, b, paths=("auto", "generic"), **kw)


@_slow
@given(family_point(exponent_sum=True))
def test_family_points_exponent_sum(pt):
    model, a, b, kw = pt
    _check(model, a, b, paths=("auto", "generic", "limbs"), **kw)


@_slow
@given(prob=problem(kmax=48), model=st.sampled_from(list(PRESETS.values())))
def test_limb_accumulator_path(prob, model):
    """Every exact sum through the multi-limb accumulator (the huge-spread path)."""
    a, b, kw = prob
    _check(model, a, b, paths=("limbs",), **kw)


def test_cancellation_and_spread_explicit():
    big = 2.0 ** 100
    a = torch.tensor([[big, 1.0, -big, 2.0 ** -120]])
    b = torch.tensor([[1.0], [2.0 ** -80], [1.0], [2.0 ** 3]])
    for name in PRESETS:
        _check_plain(PRESETS[name], a, b)
    got = emulate("exact", a, b)
    assert float(got) == float(torch.tensor(2.0 ** -80 + 2.0 ** -117, dtype=torch.float32))


def _check_plain(model, a, b, **kw):
    want = ref_matmul(model, a, b, **kw)
    for p in ("auto", "generic", "limbs"):
        got = emulate(model, a, b, _paths=p, **kw)
        assert same_bits(got, want), f"{model.name} {p}: {mismatch(got, want)}"


def _es_case(want_value, want_exponent_sum, a, b, **model_kw):
    """Reference and emulator (every path) against hand-derived literals, both align_refs."""
    kw = {k: model_kw.pop(k) for k in ("scales_a", "scales_b", "block") if k in model_kw}
    for ref, want in ((AlignRef.VALUE, want_value), (AlignRef.EXPONENT_SUM, want_exponent_sum)):
        model = GemmModel(align_ref=ref, **model_kw)
        assert float(ref_matmul(model, a, b, **kw)[0, 0]) == want, (ref, model_kw)
        for p in ("auto", "generic", "limbs"):
            got = emulate(model, a, b, _paths=p, **kw)
            assert float(got[0, 0]) == want, (ref, p, float(got[0, 0]), model_kw)


def test_exponent_sum_alignment_literals():
    """Worked by hand from SPEC step 4 (exponent of a product = floor(log2|a|) + floor(log2|b|)
    (+ PRODUCT block scales'), one below the value's exponent when the significand product
    is >= 2; the accumulator keeps floor(log2|acc|)); all align_mode RTZ."""
    bf = torch.bfloat16
    # 1.5*1.5 = 2.25 (value exp 1, exponent sum 0) and 0.25*0.25 = 2^-4 (exp -4) in one step
    # (F=2), W=4.  VALUE: q = 2^(1-4) = 2^-3, 2^-4 truncates to 0 -> 2.25.  EXPONENT_SUM:
    # q = 2^(0-4) = 2^-4, 2.25 = 36 q and 2^-4 = q both survive -> 2.3125.
    a = torch.tensor([[1.5, 0.25]], dtype=bf)
    b = torch.tensor([[1.5], [0.25]], dtype=bf)
    _es_case(2.25, 2.3125, a, b, fma_width=2, align_bits=4)
    # F=1: step 1 gives acc = 2.25 exactly (either way); step 2 aligns acc (value exp 1, never
    # an exponent sum) with 2^-4: q = 2^-3, 2^-4 truncates -> 2.25 under both.
    _es_case(2.25, 2.25, a, b, fma_width=1, align_bits=4)
    # Signs: -2.25 and -2^-4 -> -2.25 (VALUE) / -2.3125 (EXPONENT_SUM); RTZ on magnitudes.
    _es_case(-2.25, -2.3125, -a, b, fma_width=2, align_bits=4)
    # A lone product truncated by its own window: 1.75*1.75 = 3.0625 = 11.0001b, W=4.
    # VALUE: q = 2^(1-4) = 2^-3 -> 3.0.  EXPONENT_SUM: q = 2^(0-4) -> 3.0625 kept.
    _es_case(3.0, 3.0625, torch.tensor([[1.75]], dtype=bf), torch.tensor([[1.75]], dtype=bf),
             align_bits=4)
    # A zero product takes no part: 0 * 2^100 next to 2.25 and 2^-4 changes nothing.
    a3 = torch.tensor([[0.0, 1.5, 0.25]], dtype=bf)
    b3 = torch.tensor([[2.0 ** 100], [1.5], [0.25]], dtype=bf)
    _es_case(2.25, 2.3125, a3, b3, fma_width=4, align_bits=4)
    # Block scales, PRODUCT: sa = 12 (floor log2 = 3), sb = 1.  Products 2.25*12 = 27 (value
    # exp 4, exponent sum 0+0+3+0 = 3) and 2^-4*12 = 0.75 (exponent sum -4+3 = -1), W=4.
    # VALUE: q = 2^0, 0.75 -> 0: 27.  EXPONENT_SUM: q = 2^-1, 0.75 -> 0.5: 27.5.
    # (Were the scales left out of the sum, emax = 0, q = 2^-4: 27.75.)
    sc = dict(scales_a=torch.tensor([[12.0]]), scales_b=torch.tensor([[1.0]]), block=2)
    _es_case(27.0, 27.5, a, b, fma_width=2, align_bits=4, **sc)
    # Block scales, GROUP: the scales multiply the group partial afterwards and take no part
    # in the alignment: the inner step is the first case (2.25 / 2.3125), times 12 exactly.
    _es_case(27.0, 27.75, a, b, fma_width=2, align_bits=4, group_size=2,
             scale_point=ScalePoint.GROUP, **sc)
    # Hopper bf16 shape (F=16, W=25 RTZ, normalize to 23 fraction bits RTZ): 2.25 plus 15
    # products 2^-13 * 2^-12 = 2^-25.  VALUE: emax 1, q = 2^-24, every 2^-25 truncates -> 2.25.
    # EXPONENT_SUM: emax 0, q = 2^-25, all kept: 2.25 + 15*2^-25 = 2.25 + 1.875*2^-22,
    # RTZ on the 2^-22 grid of [2, 4) -> 2.25 + 2^-22.
    ah = torch.tensor([[1.5] + [2.0 ** -13] * 15], dtype=bf)
    bh = torch.tensor([[1.5]] + [[2.0 ** -12]] * 15, dtype=bf)
    _es_case(2.25, 2.25 + 2.0 ** -22, ah, bh, fma_width=16, align_bits=25,
             acc_frac_bits=23, norm_mode="RTZ")


def test_ties_and_subnormals():
    # a 64-group sum exactly halfway between FP32 neighbours, and subnormal results
    a = torch.tensor([[1.0] + [2.0 ** -24] + [0.0] * 62])
    b = torch.ones(64, 1)
    _check_plain(PRESETS["probe_matched"], a, b)
    assert float(emulate("probe_matched", a, b)) == 1.0  # tie to even
    a2 = torch.tensor([[1.0] + [2.0 ** -24] * 3 + [0.0] * 60])
    assert float(emulate("probe_matched", a2, b)) == 1.0 + 2.0 ** -22  # 1+3*2^-24 rounds up
    tiny = torch.tensor([[2.0 ** -75, -(2.0 ** -75) * 3]])
    _check_plain(PRESETS["fp32_sequential"], tiny, torch.tensor([[2.0 ** -75], [2.0 ** -76]]))
    sc = torch.tensor([[2.0 ** -17, 0.0]])  # zero and subnormal ue5m3-like scales
    _check_plain(PRESETS["probe_matched"], torch.ones(1, 32), torch.ones(32, 2),
                 scales_a=sc, scales_b=torch.tensor([[2.0 ** -17, 3.0], [1.0, 1.0]]), block=16)


@pytest.mark.parametrize("K", [64, 256])
def test_random_nvfp4_like_all_paths(K):
    g = torch.Generator().manual_seed(K)
    e2m1 = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6])
    M, N = 3, 4
    a = e2m1[torch.randint(0, 8, (M, K), generator=g)] * (torch.randint(0, 2, (M, K), generator=g) * 2 - 1)
    b = e2m1[torch.randint(0, 8, (K, N), generator=g)] * (torch.randint(0, 2, (K, N), generator=g) * 2 - 1)
    sa = (torch.randint(8, 16, (M, K // 16), generator=g) * 2.0 ** torch.randint(-12, 6, (M, K // 16), generator=g))
    sb = (torch.randint(8, 16, (K // 16, N), generator=g) * 2.0 ** torch.randint(-12, 6, (K // 16, N), generator=g))
    for name in PRESETS:
        _check_plain(PRESETS[name], a, b, scales_a=sa, scales_b=sb, block=16,
                     alpha=[torch.tensor(0.75), 2.0 ** -7])


def test_round_float_matches_torch_casts():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4096, generator=g, dtype=torch.float64) * 2.0 ** torch.randint(-140, 130, (4096,), generator=g)
    x = torch.cat([x, torch.tensor([math.inf, -math.inf, math.nan, -0.0, 0.0, 65520.0, 65519.0])])
    for fmt, dt in (("float32", torch.float32), ("bfloat16", torch.bfloat16), ("float16", torch.float16)):
        want = x.to(dt).to(torch.float64)  # torch casts: RNE with IEEE overflow
        got = round_float(x, fmt, "rne")
        assert same_bits(got, want) or bool(((got == want) | (got.isnan() & want.isnan())).all()), fmt


def test_bad_input():
    a = torch.ones(2, 8)
    b = torch.ones(8, 3)
    with pytest.raises(ValueError, match="block: K=8 is not a multiple of block=3"):
        emulate("probe_matched", a, b, scales_a=torch.ones(2, 2), scales_b=torch.ones(2, 3), block=3)
    with pytest.raises(ValueError, match=r"scales_a: shape \(2, 3\)"):
        emulate("probe_matched", a, b, scales_a=torch.ones(2, 3), scales_b=torch.ones(2, 3), block=4)
    with pytest.raises(ValueError, match=r"scales_b: shape \(3, 2\)"):
        emulate("probe_matched", a, b, scales_a=torch.ones(2, 2), scales_b=torch.ones(3, 2), block=4)
    with pytest.raises(ValueError, match="needs all three"):
        emulate("probe_matched", a, b, scales_a=torch.ones(2, 2))
    with pytest.raises(ValueError, match="alpha: non-finite"):
        emulate("probe_matched", a, b, alpha=math.inf)
    with pytest.raises(ValueError, match=r"alpha\[1\]: non-finite"):
        emulate("probe_matched", a, b, alpha=[1.0, torch.tensor(math.nan)])
    with pytest.raises(ValueError, match="model: unknown value 'nope'; valid choices"):
        emulate("nope", a, b)
    with pytest.raises(ValueError, match="b: shape"):
        emulate("exact", a, torch.ones(7, 3))
    with pytest.raises(ValueError, match="dtype torch.int32"):
        emulate("exact", a.int(), b)
    with pytest.raises(ValueError, match="lattice"):
        emulate(GemmModel(lattice=Fraction(1, 1000)), a, b)
    with pytest.raises(ValueError, match="split_k"):
        emulate(GemmModel(split_k=3), a, b)
    with pytest.raises(ValueError, match="62"):
        emulate("exact", torch.full((1, 2), 1 + 2.0 ** -52, dtype=torch.float64),
                torch.full((2, 1), 1 + 2.0 ** -40, dtype=torch.float64))


# --- the Blackwell MMA family (issue 17): chain, exact runs, scale-exponent alignment --------
# Oracles: reference.gemm.dot (exact, every output of small tiles) and reference.mma's
# kind::mxf4nvf4 instruction chained along K here; never the emulator itself.
import numpy as np  # noqa: E402

from reference import mma as RM  # noqa: E402
from reference.formats import get_format  # noqa: E402
from reference.gemm import dot, get_preset  # noqa: E402
from reference.rounding import Mode, encode  # noqa: E402

_SCALE_FMT = {"nvfp4": ("ue4m3", 16), "mxfp4": ("float8_e8m0fnu", 32)}


def _bw(recipe, **kw):
    """blackwell_mxf4nvf4 with the recipe's scale format for the exponent rule."""
    m = get_preset("blackwell_mxf4nvf4")
    return m.replace(exp_formats=("float4_e2m1fn", "float4_e2m1fn", _SCALE_FMT[recipe][0]), **kw)


def _family(recipe):
    bw = _bw(recipe)
    return [bw, bw.replace(split_k=2, lattice=Fraction(1, 1024)),
            bw.replace(align_bits=25, align_mode=Mode.RNE, norm_mode=Mode.RNE, exact_group=32),
            bw.replace(group_size=32, fma_width=32), bw.replace(align_ref=AlignRef.VALUE, align_bits=13),
            bw.replace(align_ref=AlignRef.EXPONENT_SUM), bw.replace(norm_mode=Mode.RUP, output="bfloat16"),
            get_preset("blackwell_mxf8f6f4").replace(exp_formats=bw.exp_formats)]


def _codes(g, recipe, M, N, K):
    """Random e2m1 codes (zero blocks of 16, groups that cancel exactly, -0) and raw scale
    bytes of every value (NaN, zero, subnormal ue4m3; e8m0 up to 2^127: overflow)."""
    a, b = g.integers(0, 16, (M, K)), g.integers(0, 16, (K, N))
    for k0 in range(0, K, 16):
        r = g.random()
        if r < 0.15:
            a[:, k0:k0 + 16] = g.choice([0, 8], (M, 16))        # +-0 only
        elif r < 0.35:                                            # the group sums to 0
            a[:, k0 + 8:k0 + 16] = a[:, k0:k0 + 8] ^ 8
            b[k0 + 8:k0 + 16] = b[k0:k0 + 8]
    blk = _SCALE_FMT[recipe][1]
    lo = 0 if g.random() < 0.5 else (0x30 if recipe == "nvfp4" else 110)
    hi = 256 if lo == 0 else (0x48 if recipe == "nvfp4" else 140)
    sa, sb = g.integers(lo, hi, (M, K // blk)), g.integers(lo, hi, (K // blk, N))
    return a, b, sa, sb


def _decode(codes, fmt, mask=0xFF):
    spec = get_format(fmt)
    table = [spec.decode(c & mask) for c in range(256 if fmt != "float4_e2m1fn" else 16)]
    val = [math.nan if x.is_nan else float(-x.mag if x.negative else x.mag) if x.is_finite
           else math.copysign(math.inf, -1 if x.negative else 1) for x in table]
    # -0 by its sign (float(-Fraction(0)) is +0)
    val = [math.copysign(0.0, -1) if (x.is_finite and x.mag == 0 and x.negative) else v
           for x, v in zip(table, val)]
    return torch.tensor(val, dtype=torch.float32)[torch.as_tensor(codes, dtype=torch.int64)]


def _values(recipe, a, b, sa, sb):
    sf = _SCALE_FMT[recipe][0]
    mask = 0x7F if sf == "ue4m3" else 0xFF   # the MMA reads ue4m3 bytes without the sign bit
    return (_decode(a, "float4_e2m1fn"), _decode(b, "float4_e2m1fn"), _decode(sa, sf, mask),
            _decode(sb, sf, mask))


def _ref_all(model, A, B, SA, SB, block, alpha=None):
    M, N = A.shape[0], B.shape[1]
    out = torch.empty(M, N, dtype=torch.float32)
    for i in range(M):
        for j in range(N):
            kw = {} if alpha is None else {"alpha": alpha}
            out[i, j] = float(dot(model, A[i].tolist(), B[:, j].tolist(), scales_a=SA[i].tolist(),
                                  scales_b=SB[:, j].tolist(), block=block, **kw))
    return out


@pytest.mark.parametrize("recipe", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("K", [64, 128, 192])
def test_family_block_scaled_random(recipe, K):
    """7 x 5 x K tiles, every output against reference.gemm.dot, both engine paths."""
    g = np.random.default_rng(K + len(recipe))
    blk = _SCALE_FMT[recipe][1]
    for t, model in enumerate(_family(recipe)):
        A, B, SA, SB = _values(recipe, *_codes(g, recipe, 7, 5, K))
        alpha = [0.75, 2.0 ** -3] if t % 3 == 1 else None
        want = _ref_all(model, A, B, SA, SB, blk, alpha)
        for p in ("auto", "generic"):
            got = emulate(model, A, B, scales_a=SA, scales_b=SB, block=blk, alpha=alpha, _paths=p)
            assert same_bits(got, want), f"{recipe} K={K} {short(model)} {p}: {mismatch(got, want)}"


def _f32_bits(y: torch.Tensor) -> list[list[int]]:
    """FP32 bit patterns, NaN as -1."""
    bits = y.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    return torch.where(torch.isnan(y), -1, bits).tolist()


@pytest.mark.parametrize("sf,blk", [("ue4m3", 16), ("ue8m0", 32), ("ue8m0", 16)])
@pytest.mark.parametrize("K", [64, 128, 192])
def test_chain_equals_reference_mma(sf, blk, K):
    """blackwell_mxf4nvf4 on random bytes == reference.mma kind::mxf4nvf4 chained along K
    from C = +0 (the instruction-level model, separate code), every output of 7 x 5."""
    g = np.random.default_rng(K * blk + len(sf))
    recipe = "nvfp4" if sf == "ue4m3" else "mxfp4"
    a, b, sa, sb = _codes(g, recipe, 7, 5, K)
    sa, sb = g.integers(0, 256, (7, K // blk)), g.integers(0, 256, (K // blk, 5))
    if g.random() < 0.5:   # no NaN scale: the chain's arithmetic shows everywhere
        sa, sb = np.where(sa & 0x7F == 0x7F, 0x38, sa), np.where(sb & 0x7F == 0x7F, 0x38, sb)
        if sf == "ue8m0":
            sa, sb = np.where(sa == 255, 127, sa), np.where(sb == 255, 127, sb)
    c = [[0] * 5 for _ in range(7)]
    for k0 in range(0, K, 64):
        j0, j1 = k0 // blk, (k0 + 64) // blk
        c = RM.mma("mxf4nvf4", a[:, k0:k0 + 64].tolist(), b[k0:k0 + 64].tolist(), c,
                   sa[:, j0:j1].tolist(), sb[j0:j1].tolist(), scale_format=sf, block=blk)
    want = [[-1 if (x & 0x7FFFFFFF) > 0x7F800000 else x for x in row] for row in c]
    recipe_fmt = "ue4m3" if sf == "ue4m3" else "float8_e8m0fnu"
    model = get_preset("blackwell_mxf4nvf4").replace(
        exp_formats=("float4_e2m1fn", "float4_e2m1fn", recipe_fmt))
    A, B = _decode(a, "float4_e2m1fn"), _decode(b, "float4_e2m1fn")
    mask = 0x7F if sf == "ue4m3" else 0xFF
    got = emulate(model, A, B, scales_a=_decode(sa, recipe_fmt, mask),
                  scales_b=_decode(sb, recipe_fmt, mask), block=blk)
    assert _f32_bits(got) == want, f"{sf} block {blk} K={K}"


def test_family_literals():
    """Issue 17's discriminating operands, worked by hand (NVFP4, scales 1 unless given)."""
    bw = _bw("nvfp4")

    def one(terms, model=bw, K=64):
        """terms: (k, a, b, sa, sb): a[k]*b[k] with the scales of k's block."""
        a, b = torch.zeros(1, K), torch.zeros(K, 1)
        sa, sb = torch.ones(1, K // 16), torch.ones(K // 16, 1)
        for k, x, y, s, u in terms:
            a[0, k], b[k, 0], sa[0, k // 16], sb[k // 16, 0] = x, y, s, u
        want = float(dot(model, a[0].tolist(), b[:, 0].tolist(), scales_a=sa[0].tolist(),
                         scales_b=sb[:, 0].tolist(), block=16))
        got = emulate(model, a, b, scales_a=sa, scales_b=sb, block=16)
        assert same_bits(got, torch.tensor([[want]])), (terms, float(got), want)
        return got
    # +7,225,344 (6*6*448*448), -7,225,344 and 0.5*0.5 * 2^-9 * 2^-9 = 2^-20: the scale
    # exponent sum 16 sets the step to 2^-19, so 2^-20 is truncated: 0
    big = [(0, 6.0, 6.0, 448.0, 448.0), (16, -6.0, 6.0, 448.0, 448.0), (32, 0.5, 0.5, 2.0 ** -9, 2.0 ** -9)]
    assert float(one(big)) == 0.0
    # every product exact (no alignment): 2^-20
    assert float(one(big, bw.replace(align_bits=None))) == 2.0 ** -20
    # C = 32 (instruction 1) plus 1.5*0.5 * 2^-9 * 2^-9 = 0.75 ulp of 32: RZ keeps 32, RNE
    # normalization gives 32 + 2^-18
    chain = [(0, 4.0, 4.0, 1.0, 1.0), (1, 4.0, 4.0, 1.0, 1.0), (64, 1.5, 0.5, 2.0 ** -9, 2.0 ** -9)]
    assert float(one(chain, K=128)) == 32.0
    assert float(one(chain, bw.replace(norm_mode=Mode.RNE), K=128)) == 32 + 2.0 ** -18
    # -0 products only: the chain starts at +0, so +0
    got = one([(k, -0.0, 0.5, 1.0, 1.0) for k in range(64)])
    assert got.view(torch.int32).item() == 0
    # 6*6 * 2^127 * 2^127 (e8m0 scales): beyond FP32, +Inf (RZ would give the max finite)
    mx = _bw("mxfp4")
    got = emulate(mx, torch.tensor([[6.0] + [0.0] * 63]), torch.tensor([[6.0]] + [[0.0]] * 63),
                  scales_a=torch.tensor([[2.0 ** 127, 1.0]]), scales_b=torch.tensor([[2.0 ** 127], [1.0]]),
                  block=32)
    assert float(got) == math.inf


def test_family_nan_scale_rows_and_columns():
    """A NaN scale in a zero-data block makes its row (scales_a) or column (scales_b) NaN and
    leaves the others alone (emulator pre-pass vs the reference on every output)."""
    A, B = torch.full((3, 64), 0.5), torch.full((64, 4), 2.0)
    A[0, :16] = 0.0
    SA, SB = torch.ones(3, 4), torch.ones(4, 4)
    SA[0, 0] = math.nan
    SB[2, 3] = math.nan
    bw = _bw("nvfp4")
    got = emulate(bw, A, B, scales_a=SA, scales_b=SB, block=16)
    assert same_bits(got, _ref_all(bw, A, B, SA, SB, 16))
    assert torch.isnan(got[0]).all() and torch.isnan(got[:, 3]).all() and float(got[1, 0]) == 64.0


def test_family_wide_exact_runs_fall_back_to_reference(monkeypatch):
    """Exact runs of unscaled fp32 products 2^100 and 2^-100 need ~200 bits: those outputs
    are computed by reference.gemm.dot (and only those)."""
    import fp4ref.gemm as FG
    calls = []
    real = FG._reference_outputs
    monkeypatch.setattr(FG, "_reference_outputs", lambda *a: calls.append(len(a[-1])) or real(*a))
    model = GemmModel(fma_width=8, group_size=8, chain=True, exact_group=4, align_bits=25,
                      align_mode=Mode.RTZ, align_ref=AlignRef.SCALE_EXPONENT_SUM, norm_mode=Mode.RTZ,
                      overflow_inf=True)
    a = torch.tensor([[2.0 ** 100, 2.0 ** -100, 1.0, -3.0] * 4, [1.0, 2.0, 3.0, 4.0] * 4])
    b = torch.tensor([[1.0, 1.0]] * 16)
    for p in ("auto", "generic", "limbs"):
        calls.clear()
        got = emulate(model, a, b, _paths=p)
        assert same_bits(got, ref_matmul(model, a, b)), p
        assert calls == [2], (p, calls)   # row 0, both columns


@st.composite
def mma_family_point(draw):
    """gemm_models() points with the family fields drawn on top (valid combinations)."""
    from .gemm_helpers import gemm_models
    blocked = draw(st.booleans())
    model = draw(gemm_models(blocked))
    chain = draw(st.booleans())
    E = draw(st.sampled_from((None, 1, 2, 4, 16)))
    G = model.group_size or draw(st.sampled_from((4, 8, 16, 32)))
    ref = draw(st.sampled_from((AlignRef.SCALE_EXPONENT_SUM, AlignRef.SCALE_EXPONENT_SUM, model.align_ref)))
    ef = draw(st.sampled_from((None, ("float32",) * 3, ("bfloat16", "bfloat16", "float32"),
                               ("float4_e2m1fn", "float4_e2m1fn", "ue4m3"))))
    model = model.replace(chain=chain, exact_group=E, align_ref=ref, exp_formats=ef,
                          overflow_inf=draw(st.booleans()), group_size=G if chain else model.group_size,
                          scale_point=ScalePoint.PRODUCT if (chain or E) else model.scale_point)
    a, b, kw = draw(problem(blocked=blocked, kmax=64))
    model = _fit_split(model, a.shape[1], kw.get("block") if blocked else None)
    return model, a, b, kw


@_slow
@given(mma_family_point())
def test_mma_family_points(pt):
    model, a, b, kw = pt
    _check(model, a, b, paths=("auto", "generic", "limbs"), **kw)


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", ["nvfp4", "mxfp4"])
def test_family_cuda_equals_reference(recipe):
    """CUDA tensors: blackwell_mxf4nvf4 on 192 x 160 x 512 == reference.gemm.dot on sampled
    outputs (and the CPU run on every output)."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from .gemm_helpers import sample_positions
    g = np.random.default_rng(5)
    blk = _SCALE_FMT[recipe][1]
    A, B, SA, SB = _values(recipe, *_codes(g, recipe, 192, 160, 512))
    model = _bw(recipe)
    got = emulate(model, A.cuda(), B.cuda(), scales_a=SA.cuda(), scales_b=SB.cuda(), block=blk,
                  alpha=[0.75]).cpu()
    pos = sample_positions(192, 160, 48, 1)
    want = torch.tensor([float(dot(model, A[i].tolist(), B[:, j].tolist(), scales_a=SA[i].tolist(),
                                   scales_b=SB[:, j].tolist(), block=blk, alpha=[0.75]))
                         for i, j in pos], dtype=torch.float32)
    idx = torch.tensor(pos)
    assert same_bits(got[idx[:, 0], idx[:, 1]], want), recipe
    cpu = emulate(model, A, B, scales_a=SA, scales_b=SB, block=blk, alpha=[0.75])
    assert same_bits(got, cpu), recipe


# --- the fused-FMA fast path (fp4ref.gemm_fast, issue 13) --------------------------------
_FAST_SHORT = {  # the issue-13 models (H200 cuBLAS bf16 / tf32 / fp32)
    "bf16": "F=16 align=25:RTZ:esum acc=23:RTZ G=- out=float32:RNE",
    "tf32": "F=8 align=25:RTZ:esum acc=23:RTZ G=64:RNE",
    "fp32": "F=1 align=exact acc=23:RNE G=- split=16/T64 out=float32:RNE",
}


@st.composite
def fast_models(draw):
    """A model the fast path takes: FP32 accumulator, RNE/RTZ, exact F=1 or aligned steps."""
    from reference.rounding import Mode
    modes = st.sampled_from((Mode.RNE, Mode.RTZ))
    exact = draw(st.booleans())
    kw = dict(fma_width=1) if exact else dict(
        fma_width=draw(st.sampled_from((1, 2, 3, 4, 8, 16, 1 << 30))),
        align_bits=draw(st.sampled_from((0, 1, 3, 8, 23, 24, 25, 26, 40))),
        align_mode=draw(modes), align_ref=draw(st.sampled_from((AlignRef.VALUE, AlignRef.EXPONENT_SUM))))
    if exact:
        kw["align_bits"] = None
    split_k = draw(st.sampled_from((1, 2, 3, 16)))
    return GemmModel(name="fast", acc_frac_bits=23, norm_mode=draw(modes), outer_mode=draw(modes),
                     group_size=draw(st.sampled_from((None, 1, 4, 8, 64))), split_k=split_k,
                     split_tile=draw(st.sampled_from((None, 1, 2, 64))) if split_k > 1 else None,
                     lattice=draw(st.sampled_from((None, Fraction(1, 1024)))),
                     output=draw(st.sampled_from(("float32", "bfloat16"))), **kw)


@st.composite
def fast_problem(draw):
    kind = draw(st.sampled_from(("e2m1", "spread", "huge", "tiny", "special", "f32")))
    M, N, K = draw(st.integers(1, 3)), draw(st.integers(1, 3)), draw(st.integers(1, 80))
    a, b = draw(matrices(M, K, N, kind, draw(st.sampled_from((kind, "f32", "e2m1")))))
    model = _fit_split(draw(fast_models()), K, None)
    alpha = draw(st.sampled_from((None, 0.3, 2.0 ** -140)))
    return model, a, b, ({} if alpha is None else {"alpha": alpha})


def _fast_check(pt):
    from fp4ref.gemm_fast import fast_reason, operands_reason
    model, a, b, kw = pt
    assert fast_reason(model, model.plan(a.shape[1])) is None
    assert operands_reason(a, b) is None
    _check(model, a, b, paths=("auto", "generic"), **kw)


@settings(max_examples=30, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
          deadline=None)
@given(fast_problem())
def test_fast_path_equals_reference(pt):
    """fp4ref.gemm_fast (taken: checked) == reference.gemm.dot == the generic engine."""
    _fast_check(pt)


@pytest.mark.slow
@settings(max_examples=1000, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
          deadline=None)
@given(fast_problem())
def test_fast_path_equals_reference_sweep(pt):
    _fast_check(pt)


def _near_ties(M: int, K: int, seed: int):
    """Operands whose running sums land next to FP32 midpoints: a random FP32 x, then
    products 2**(e-24) * (1 + r u) * (1 - s u) (u = 2**-23), so the exact sum sits within
    ~2**-46 ulp of a midpoint, above or below; more columns shift the pattern."""
    g = torch.Generator().manual_seed(seed)
    u = 2.0 ** -23
    e = torch.randint(-100, 100, (M, 1), generator=g).double()
    x = (1 + torch.randint(0, 1 << 23, (M, 1), generator=g).double() * u) * torch.exp2(e)
    x = x * torch.where(torch.rand(M, 1, generator=g) < 0.5, -1.0, 1.0).double()
    r = torch.randint(-3, 4, (M, K - 1), generator=g).double()
    sgn = torch.where(torch.rand(M, K - 1, generator=g) < 0.8, 1.0, -1.0).double()
    y = torch.sign(x) * sgn * torch.exp2(e - 24 - torch.randint(0, 2, (M, K - 1), generator=g)) * (1 + r * u)
    a = torch.cat([x, y], 1).float()
    s = torch.randint(-3, 4, (K, 4), generator=g).double()
    b = (1 - s * u)
    b[0] = 1.0
    return a, b.float()


@pytest.mark.parametrize("short", ["F=1 align=exact acc=23:RNE G=-", "F=1 align=exact acc=23:RTZ G=4:RTZ",
                                   "F=1 align=exact acc=23:RNE G=- split=2/T2",
                                   "F=2 align=25:RNE acc=23:RNE G=-", "F=4 align=24:RTZ:esum acc=23:RTZ G=8:RNE"])
def test_fast_path_near_ties(short):
    """512 rows of near-midpoint sums: fast path == generic engine (== reference on a few)."""
    from reference.notation import parse_short
    m = parse_short(short)
    a, b = _near_ties(512, 6, 7)
    got = emulate(m, a, b)
    assert same_bits(got, emulate(m, a, b, _paths="generic")), short
    assert same_bits(got[:6], ref_matmul(m, a[:6], b)), short


def _f32(x: float) -> float:
    assert float(torch.tensor(x, dtype=torch.float32)) == x
    return x


def test_fast_path_double_rounding_literals():
    """Sums a float64 add would double-round (a 53-bit tie then an FP32 tie): the exact
    value is just below / above an FP32 midpoint; expected values by hand."""
    u = 2.0 ** -23
    x = _f32(2.0 ** 30 * (1 + u))             # odd last bit, ulp 2**7
    y = (_f32(2.0 ** 6 * (1 + u)), _f32(1 - u))  # product 2**6 - 2**-40: below the midpoint
    m = GemmModel(name="chain", fma_width=1, align_bits=None, acc_frac_bits=23)
    a = torch.tensor([[x, y[0]], [-x, -y[0]]])
    b = torch.tensor([[1.0], [y[1]]])
    want = torch.tensor([[2.0 ** 30 + 2.0 ** 7], [-(2.0 ** 30 + 2.0 ** 7)]])
    assert same_bits(emulate(m, a, b), want)
    b2 = torch.tensor([[1.0], [_f32(1 + u)]])    # product 2**6 + 2**-16 + 2**-40: above
    assert same_bits(emulate(m, a, b2), torch.tensor([[2.0 ** 30 + 2.0 ** 8], [-(2.0 ** 30 + 2.0 ** 8)]]))
    rtz = m.replace(norm_mode=Mode_RTZ())
    assert same_bits(emulate(rtz, a, b2), torch.tensor([[2.0 ** 30 + 2.0 ** 7], [-(2.0 ** 30 + 2.0 ** 7)]]))
    for mm in (m, rtz):  # and the generic engine agrees
        assert same_bits(emulate(mm, a, b2, _paths="generic"), emulate(mm, a, b2))


def Mode_RTZ():
    from reference.rounding import Mode
    return Mode.RTZ


def test_fast_path_specials_and_overflow():
    """Inf - Inf, NaN, Inf * 0, overflow to Inf (RNE) or max finite (RTZ), -0 sums."""
    big = 2.0 ** 127
    inf, nan = math.inf, math.nan
    a = torch.tensor([[big, big, -big], [inf, 1.0, -inf], [0.0, inf, 1.0],
                      [-0.0, -0.0, -0.0], [nan, 1.0, 1.0], [2.0 ** -149, -(2.0 ** -149), 0.0]])
    b = torch.tensor([[1.5], [1.5], [1.0]])
    for s in _FAST_SHORT.values():
        from reference.notation import parse_short
        m = parse_short(s)
        for mm in (m, m.replace(split_k=1, split_tile=None), m.replace(norm_mode=Mode_RTZ())):
            _check(mm, a, b, paths=("auto", "generic"))
            _check(mm, a, -b, paths=("auto",))


@pytest.mark.parametrize("name", list(_FAST_SHORT))
def test_fast_path_long_k_vs_simulator(name):
    """K = 4096, a few outputs: the fast path == probes.sim.simulate_gemm (numpy, int64)."""
    import numpy as np
    from probes.sim import output_bits, simulate_gemm
    from reference.notation import parse_short
    m = parse_short(_FAST_SHORT[name])
    g = torch.Generator().manual_seed(13)
    K = 4096
    a = torch.randn(2, K, generator=g) * torch.exp2(torch.randint(-20, 20, (2, K), generator=g))
    b = torch.randn(K, 3, generator=g)
    if name == "bf16":
        a, b = a.bfloat16().float(), b.bfloat16().float()
    elif name == "tf32":
        a = (a.view(torch.int32) & ~0x1FFF).view(torch.float32)
        b = (b.view(torch.int32) & ~0x1FFF).view(torch.float32)
    got = emulate(m, a, b)
    want = simulate_gemm(m, a.double().numpy(), b.double().numpy())
    assert np.array_equal(output_bits(got.double().numpy(), "float32"), want), name


# --- the Triton recurrences (compiled on CUDA; interpreter via tests/test_interpreter.py) ---
def _triton_dev():
    return "cuda" if torch.cuda.is_available() else "cpu"


def _triton_check(model, a, b, **kw):
    pytest.importorskip("triton")
    dev = _triton_dev()
    got = emulate(model, a.to(dev), b.to(dev), _paths="fast_triton", **kw).cpu()
    want = emulate(model, a, b, _paths="generic", **kw)
    assert same_bits(got, want), f"{model}: {mismatch(got, want)}"


@pytest.mark.triton_interpret
@settings(max_examples=25, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
          deadline=None)
@given(fast_problem())
def test_fast_path_triton_equals_generic(pt):
    model, a, b, kw = pt
    _triton_check(model, a, b, **kw)


@pytest.mark.triton_interpret
@pytest.mark.parametrize("short", ["F=1 align=exact acc=23:RNE G=-", "F=1 align=exact acc=23:RTZ G=4:RTZ",
                                   "F=3 align=25:RNE acc=23:RNE G=- split=2/T2",
                                   "F=4 align=24:RTZ:esum acc=23:RTZ G=8:RNE"])
def test_fast_path_triton_near_ties_and_specials(short):
    from reference.notation import parse_short
    m = parse_short(short)
    _triton_check(m, *_near_ties(256, 6, 11))
    big, inf, nan = 2.0 ** 127, math.inf, math.nan
    a = torch.tensor([[big, big, -big], [inf, 1.0, -inf], [0.0, inf, 1.0], [-0.0, -0.0, -0.0],
                      [nan, 1.0, 1.0], [2.0 ** -149, -(2.0 ** -149), 0.0]])
    b = torch.tensor([[1.5, -1.0], [1.5, 2.0 ** -30], [1.0, -0.0]])
    _triton_check(m, a, b)


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(_FAST_SHORT))
def test_fast_path_cuda_equals_cpu(name):
    """CUDA (Triton recurrences, and the torch loop) == the CPU fast path, K = 4096."""
    from reference.notation import parse_short
    m = parse_short(_FAST_SHORT[name])
    g = torch.Generator().manual_seed(3)
    a = torch.randn(8, 4096, generator=g).bfloat16().float()
    b = torch.randn(4096, 8, generator=g).bfloat16().float()
    cpu = emulate(m, a, b)
    for p in ("auto", "fast_torch", "fast_triton"):
        assert same_bits(emulate(m, a.cuda(), b.cuda(), _paths=p).cpu(), cpu), (name, p)


def test_fast_path_overflow_then_more_terms():
    """align=0 (1/q at the edge of float64): an accumulator overflowed to Inf stays Inf
    (found by the sweep)."""
    from reference.rounding import Mode
    m = GemmModel(name="o", fma_width=1, align_bits=0, align_mode=Mode.RNE, align_ref=AlignRef.VALUE,
                  acc_frac_bits=23)
    a = torch.tensor([[2.0 ** 120, 2.0 ** 120, 0.0, 1.0, -3.0], [-(2.0 ** 120), -(2.0 ** 120), 0.5, 0.0, 2.0]])
    b = torch.tensor([[2.0 ** 8], [2.0 ** 8], [1.0], [1.0], [1.0]])
    _check(m, a, b, paths=("auto", "generic"))
    _check(m.replace(fma_width=2), a, b, paths=("auto", "generic"))


@pytest.mark.triton_interpret
def test_fast_path_triton_overflow_then_more_terms():
    from reference.rounding import Mode
    m = GemmModel(name="o", fma_width=1, align_bits=0, align_mode=Mode.RNE, align_ref=AlignRef.VALUE,
                  acc_frac_bits=23)
    a = torch.tensor([[2.0 ** 120, 2.0 ** 120, 0.0, 1.0, -3.0], [-(2.0 ** 120), -(2.0 ** 120), 0.5, 0.0, 2.0]])
    b = torch.tensor([[2.0 ** 8], [2.0 ** 8], [1.0], [1.0], [1.0]])
    for mm in (m, m.replace(fma_width=2), m.replace(norm_mode=Mode.RTZ)):
        _triton_check(mm, a, b)
