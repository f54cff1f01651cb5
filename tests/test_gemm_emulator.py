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


# --- the fast path with accumulators narrower than FP32 (acc_frac_bits p <= 23, issue 13) ---
# The Hopper FP8 wgmma models (H200 probe: cuBLAS _scaled_mm e4m3, Triton tl.dot e4m3) keep
# p = 13 fraction bits with FP32's exponent range.  Oracles: reference.gemm.round_fp (the
# roundings), hand-worked literals, and the generic engine (_paths="generic") for whole GEMMs.
_H200_FP8 = {  # reports/baselines/redesign/h200-probe-after.json, devices 7-18 (short forms)
    "scaled_mm-tensorwise-slow": "F=32 align=13:RTZ:esum acc=13:RTZ G=128:RNE out=float32:RNE",
    "scaled_mm-tensorwise-fast-bf16": "F=32 align=13:RTZ:esum acc=13:RTZ G=- out=bfloat16:RNE",
    "scaled_mm-rowwise-slow-bf16": "F=32 align=13:RTZ:esum acc=13:RTZ G=128:RNE alpha=REVERSED out=bfloat16:RNE",
    "scaled_mm-rowwise-fast": "F=32 align=13:RTZ:esum acc=13:RTZ G=- alpha=REVERSED out=float32:RNE",
    "triton-dot-32": "F=32 align=13:RTZ:esum acc=13:RTZ G=32:RNE out=float32:RNE",
    "triton-dot-64": "F=32 align=13:RTZ:esum acc=13:RTZ G=64:RNE out=float32:RNE",
}


def _examples(n: int):
    return settings(max_examples=n, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
                    deadline=None)


def _round_cases(p: int) -> list[float]:
    """float64 values around every edge of accumulator_format(p): ties and near-ties of
    the quantum in normal and subnormal binades, min normal, max finite, overflow ties."""
    vals = [0.0, -0.0, math.inf, -math.inf, math.nan, 2.0 ** -126, 2.0 ** -149, 2.0 ** 128]
    mf = (2.0 - 2.0 ** -p) * 2.0 ** 127
    hq = 2.0 ** (126 - p)  # half the quantum at the top binade
    vals += [mf, mf + hq, mf + hq * (1 - 2.0 ** -30), mf + hq * (1 + 2.0 ** -30), mf + 2 * hq]
    g = torch.Generator().manual_seed(p)
    for e in (-150, -140, -130, -127, -126, -125, -1, 0, 1, 60, 126, 127):
        q = 2.0 ** (max(e, -126) - p)
        for k in range(-3, 4):  # 2**e plus multiples of half a quantum, and 2**-30 of it off them
            for off in (0.0, 2.0 ** -30, -(2.0 ** -30)):
                vals.append(2.0 ** e + (k + off) * q / 2)
        m = torch.randint(1 << 52, 1 << 53, (8,), generator=g).double()
        vals += (m * 2.0 ** (e - 52)).tolist()
    return vals + [-v for v in vals]


def _exact_bits(x: torch.Tensor) -> list:
    """float64 bit patterns, NaNs as one token (NaN payloads are not compared)."""
    return ["nan" if math.isnan(v) else b for v, b in zip(x.tolist(), x.view(torch.int64).tolist())]


@pytest.mark.parametrize("p", [1, 10, 13, 18, 22, 23])
def test_round_acc_equals_reference_round_fp(p):
    """gemm_fast.round_acc / add_round_acc == reference.gemm.round_fp(accumulator_format(p))
    (RNE, RTZ; KEEP, FLUSH) on the format's edges, and add_round_acc == rounding the exact
    Fraction sum (pairs whose float64 sum double-rounds)."""
    from reference.exact import Exact, Kind, exact
    from reference.gemm import accumulator_format, round_fp
    from reference.rounding import Mode, Subnormal
    from fp4ref.gemm_fast import add_round_acc, round_acc
    fmt = accumulator_format(p)
    vals = _round_cases(p)
    t = torch.tensor(vals, dtype=torch.float64)
    xs = [v for v in vals if math.isfinite(v)]
    x = torch.tensor(xs, dtype=torch.float64)
    y = x * 2.0 ** -40 + torch.tensor([2.0 ** -93 if i % 2 else -(2.0 ** -94) for i in range(len(xs))],
                                      dtype=torch.float64)
    for mode in (Mode.RNE, Mode.RTZ):
        for sub in (Subnormal.KEEP, Subnormal.FLUSH):
            want = torch.tensor([float(round_fp(exact(v), fmt, mode, sub)) for v in vals], dtype=torch.float64)
            got = round_acc(t, mode, p, sub is Subnormal.FLUSH)
            assert _exact_bits(got) == _exact_bits(want), (p, mode, sub)
            ws = []
            for u, w in zip(xs, y.tolist()):
                s = Fraction(u) + Fraction(w)
                ex = Exact(Kind.FINITE, s < 0, abs(s)) if s else exact(u + w)
                ws.append(float(round_fp(ex, fmt, mode, sub)))
            got = add_round_acc(x, y, mode, p, sub is Subnormal.FLUSH)
            assert _exact_bits(got) == _exact_bits(torch.tensor(ws, dtype=torch.float64)), (p, mode, sub)


def test_narrow_accumulator_literals():
    """acc=10 (11 significant bits, FP32's range), exact FMA chain; values by hand: ties to
    even, RTZ, overflow tie to Inf / max finite, subnormal-quantum tie, FTZ to signed zero."""
    from reference.notation import parse_short
    u = 2.0 ** -10
    mf = (2 - u) * 2.0 ** 127
    a = torch.tensor([[1.0, u / 2], [1.0, 3 * u / 2], [2.0 ** 127, 2.0 ** 127 - 2.0 ** 116],
                      [2.0 ** -136, 2.0 ** -137], [-(2.0 ** -136), -(2.0 ** -137)], [-0.0, -0.0]])
    b = torch.ones(2, 1)
    want = {  # (norm mode, FTZ) -> the six rows (the chain starts at +0: +0 + -0 = +0)
        ("RNE", False): [1.0, 1 + 2 * u, math.inf, 2.0 ** -135, -(2.0 ** -135), 0.0],
        ("RTZ", False): [1.0, 1 + u, mf, 2.0 ** -136, -(2.0 ** -136), 0.0],
        ("RNE", True): [1.0, 1 + 2 * u, math.inf, 0.0, -0.0, 0.0],
        ("RTZ", True): [1.0, 1 + u, mf, 0.0, -0.0, 0.0],
    }
    for (mode, ftz), rows in want.items():
        m = parse_short(f"F=1 align=exact acc=10:{mode}{':FTZ' if ftz else ''} G=- out=float32:RNE")
        for p in ("auto", "generic"):
            got = emulate(m, a, b, _paths=p)
            assert same_bits(got, torch.tensor(rows)[:, None]), (mode, ftz, p, got.flatten().tolist())


def _acc_operands(p: int, K: int, N: int, seed: int, clean: bool = False):
    """Rows that reach every case of a p-bit accumulator (b's column 0 is 1, so those
    products are a's values; the other columns are e4m3 values times 2**[-40, 40]):
    heavy tails; near ties (x of p + 1 bits at 2**e, then odd multiples of 2**(e-p-1..4))
    in a normal binade, a low one and the top one (ties at max finite + q/2: Inf or not);
    subnormal-range sums, mixed signs and all negative (FTZ gives -0); overflow then
    cancellation; with ``clean`` False also Inf / NaN / zeros / -0 rows and exact
    cancellation.  float32 (a [R, K], b [K, N])."""
    g = torch.Generator().manual_seed(seed)
    rnd = lambda *s: torch.rand(*s, generator=g)  # noqa: E731
    ints = lambda lo, hi, *s: torch.randint(lo, hi, s, generator=g).double()  # noqa: E731
    sgn = lambda pos, *s: torch.where(rnd(*s) < pos, 1.0, -1.0).double()  # noqa: E731

    def e4m3(*s):  # e4m3fn values, no zeros
        v = (torch.randn(*s, generator=g) * 8).to(torch.float8_e4m3fn).double()
        return torch.where(v == 0, 1.0, v)
    rows = [e4m3(K) * torch.exp2(ints(-40, 41, K))]
    for e in (ints(-60, 60, 1), ints(-126 + p, -100, 1), torch.tensor([127.0], dtype=torch.float64)):
        top = 2.0 ** (p + 1) - (4 if p > 2 else 1) if e.item() == 127 else None  # near max finite
        x = (ints(2 ** p, 2 ** (p + 1), 1) if top is None else torch.tensor([top])) * torch.exp2(e - p)
        t = (2 * ints(0, 2, K) + 1) * torch.exp2(e - p - ints(1, 5, K)) * sgn(0.6, K)
        rows.append(torch.cat([x, t[1:]]))
    rows.append(e4m3(K) * torch.exp2(ints(-140, -126, K)) * sgn(0.5, K))  # subnormal range
    rows.append(-(1 + ints(0, 64, K) / 64) * torch.exp2(ints(-140, -134, K)))  # bits to 2**-146
    big = (1 + ints(0, 8, K) / 8) * torch.exp2(ints(120, 128, K))
    rows.append(big * torch.where(torch.arange(K) < K // 2, 1.0, sgn(0.3, K)))  # overflow
    if not clean:
        sp = torch.tensor([math.inf, -math.inf, math.nan, 0.0, -0.0], dtype=torch.float64)
        for allowed in (sp[[0, 3, 4]], sp[[0, 1]], sp[[2, 3]], sp[[3, 4]]):
            r = e4m3(K)
            hit = rnd(K) < 0.1
            r[hit] = allowed[torch.randint(0, len(allowed), (int(hit.sum()),), generator=g)]
            rows.append(r)
        rows.append(torch.full((K,), -0.0, dtype=torch.float64))
        half = e4m3(K // 2)
        rows.append(torch.cat([half, -half, torch.zeros(K - 2 * (K // 2), dtype=torch.float64)]))
    b = torch.cat([torch.ones(K, 1, dtype=torch.float64),
                   e4m3(K, N - 1) * torch.exp2(ints(-40, 41, K, N - 1))], 1)
    return torch.stack(rows).float(), b.float()


def _acc_model(p, align_mode, norm_mode, G, split, i):
    """A grid point; F, align_bits, align_ref, FTZ and the exact chain cycle with i."""
    from reference.rounding import Mode, Subnormal
    F = (32, 4, 32, 1, 8, 16)[i % 6]
    kw = dict(fma_width=F, align_bits=(13, p + 2, 25, 8, p)[i % 5], align_mode=align_mode,
              align_ref=(AlignRef.EXPONENT_SUM, AlignRef.VALUE)[i % 2])
    if F == 1 and (i // 12) % 2 == 0:  # (i = 3, 9, 27, 33, ...: FTZ on and off)
        kw = dict(fma_width=1, align_bits=None)  # the exact FMA chain
    sk, tile = {"1": (1, None), "2": (2, None), "uneven": (3, 64)}[split]
    return GemmModel(name="acc", acc_frac_bits=p, norm_mode=norm_mode, outer_mode=Mode.RNE,
                     acc_subnormal=(Subnormal.KEEP, Subnormal.FLUSH)[(i // 2) % 2],
                     group_size=G, split_k=sk, split_tile=tile, **kw)


# 13 (the Hopper FP8 accumulator) and 23 (FP32) in every run; 10 and 18 with the slow sweeps
@pytest.mark.parametrize("p", [13, pytest.param(10, marks=pytest.mark.slow),
                               pytest.param(18, marks=pytest.mark.slow), 23])
def test_fast_path_narrow_accumulator_grid(p):
    """acc_frac_bits p x align RTZ/RNE x norm RTZ/RNE x G None/32/128 x split-K 1/2/uneven,
    each on crafted operands (ties, subnormal sums, overflow, Inf/NaN, -0) and on clean
    and moderate ones (the finite-operand and RTZ-by-mask branches): fast == generic."""
    from reference.rounding import Mode
    from fp4ref.gemm_fast import fast_reason, operands_reason
    K = 260  # G=128: groups 128, 128, 4; split 2: 130 + 130; uneven: 128, 128, 4
    ops = [_acc_operands(p, K, 3, 100 + p), _acc_operands(p, K, 3, 200 + p, clean=True)]
    g = torch.Generator().manual_seed(p)
    moderate = ((torch.randn(6, K, generator=g) * 8).to(torch.float8_e4m3fn).float() + 2.0 ** -6,
                (torch.randn(K, 5, generator=g) * 8).to(torch.float8_e4m3fn).float() + 2.0 ** -6)
    i = 0
    for am in (Mode.RTZ, Mode.RNE):
        for nm in (Mode.RTZ, Mode.RNE):
            for G in (None, 32, 128):
                for split in ("1", "2", "uneven"):
                    m = _acc_model(p, am, nm, G, split, i)
                    i += 1
                    assert fast_reason(m, m.plan(K)) is None, short(m)
                    for a, b in ops + ([moderate] if nm is Mode.RTZ else []):
                        assert operands_reason(a, b) is None
                        got, want = emulate(m, a, b), emulate(m, a, b, _paths="generic")
                        assert same_bits(got, want), f"{short(m)}: {mismatch(got, want)}"


def test_fast_path_narrow_accumulator_vs_reference():
    """A few crafted rows against reference.gemm.dot itself (not only the generic engine);
    accumulators wider than FP32 stay on the generic engine."""
    from reference.notation import parse_short
    from fp4ref.gemm_fast import fast_reason
    wide = parse_short("F=4 align=30:RTZ acc=24:RTZ G=-")
    assert fast_reason(wide, wide.plan(8)) == "accumulator wider than FP32 (acc_frac_bits > 23)"
    a, b = _acc_operands(13, 96, 2, 5)
    for s in ("F=32 align=13:RTZ:esum acc=13:RTZ G=32:RNE split=3/T16",
              "F=4 align=15:RNE acc=10:RNE:FTZ G=- split=2", "F=1 align=exact acc=18:RTZ G=-"):
        _check(parse_short(s), a, b, paths=("auto",))


@st.composite
def narrow_problem(draw):
    """A fast-path model with acc_frac_bits <= 23 and operands of the shared kinds or e4m3."""
    from reference.rounding import Mode, Subnormal
    modes = st.sampled_from((Mode.RNE, Mode.RTZ))
    exact = draw(st.booleans())
    kw = dict(fma_width=1, align_bits=None) if exact else dict(
        fma_width=draw(st.sampled_from((1, 2, 4, 32, 1 << 30))),
        align_bits=draw(st.sampled_from((0, 8, 13, 14, 15, 25, 40))), align_mode=draw(modes),
        align_ref=draw(st.sampled_from((AlignRef.VALUE, AlignRef.EXPONENT_SUM))))
    split_k = draw(st.sampled_from((1, 2, 3)))
    model = GemmModel(name="narrow", acc_frac_bits=draw(st.sampled_from((13, 10, 18, 23, 1, 5))),
                      acc_subnormal=draw(st.sampled_from((Subnormal.KEEP, Subnormal.FLUSH))),
                      norm_mode=draw(modes), outer_mode=draw(modes),
                      group_size=draw(st.sampled_from((None, 4, 32, 128))), split_k=split_k,
                      split_tile=draw(st.sampled_from((None, 16))) if split_k > 1 else None,
                      alpha_mode=draw(st.sampled_from(("PREMULTIPLIED", "REVERSED"))),
                      output=draw(st.sampled_from(("float32", "bfloat16"))), **kw)
    M, N, K = draw(st.integers(1, 3)), draw(st.integers(1, 3)), draw(st.integers(1, 200))
    kind = draw(st.sampled_from(("e4m3", "spread", "huge", "tiny", "special")))
    if kind == "e4m3":  # e4m3-like values: 3 fraction bits, 2**-9 .. 480
        el = st.builds(lambda v, s, e: v * s * 2.0 ** e, st.sampled_from(E4M3_SIG),
                       st.sampled_from((1.0, -1.0)), st.integers(-9, 8))
        a = torch.tensor(draw(st.lists(el, min_size=M * K, max_size=M * K))).reshape(M, K)
        b = torch.tensor(draw(st.lists(el, min_size=K * N, max_size=K * N))).reshape(K, N)
    else:
        a, b = draw(matrices(M, K, N, kind, draw(st.sampled_from((kind, "e2m1")))))
    model = _fit_split(model, K, None)
    alpha = draw(st.sampled_from((None, [0.375, 2.0 ** -7], [torch.full((M, 1), 1.5), 2.0 ** 90])))
    return model, a, b, ({} if alpha is None else {"alpha": alpha})


E4M3_SIG = (0.0, 1.0, 1.125, 1.25, 1.375, 1.5, 1.625, 1.75, 1.875)


@_examples(40)
@given(narrow_problem())
def test_fast_path_narrow_accumulator_equals_reference(pt):
    """Drawn narrow-accumulator models: fast path (taken: checked) == reference == generic."""
    _fast_check(pt)


@pytest.mark.parametrize("name", list(_H200_FP8))
def test_fast_path_h200_fp8_models(name):
    """The H200 e4m3 models with _scaled_mm's alpha (tensorwise: two scalars; rowwise:
    a column and a row of scales) and bfloat16 outputs, K = 1024: fast == generic."""
    from reference.notation import parse_short
    from fp4ref.gemm_fast import fast_reason
    m = parse_short(_H200_FP8[name])
    g = torch.Generator().manual_seed(len(name))
    K = 1024
    assert fast_reason(m, m.plan(K)) is None
    a = (torch.randn(16, K, generator=g) * 30).to(torch.float8_e4m3fn).float()
    b = (torch.randn(K, 8, generator=g) * 30).to(torch.float8_e4m3fn).float()
    if "rowwise" in name:
        alpha = [torch.rand(16, 1, generator=g) * 0.01, torch.rand(1, 8, generator=g) * 0.01]
    else:
        alpha = [0.0123, 0.00731]
    got = emulate(m, a, b, alpha=alpha)
    want = emulate(m, a, b, alpha=alpha, _paths="generic")
    assert same_bits(got, want), f"{name}: {mismatch(got, want)}"
    corner = [f if isinstance(f, float) else f[:1, :2] for f in alpha]  # outputs [0, 0:2]
    assert same_bits(got[:1, :2], ref_matmul(m, a[:1], b[:, :2], alpha=corner)), name


@pytest.mark.triton_interpret
@pytest.mark.parametrize("short_form", ["F=32 align=13:RTZ:esum acc=13:RTZ G=128:RNE split=3/T64",
                                        "F=4 align=15:RNE acc=10:RNE:FTZ G=32:RTZ split=2",
                                        "F=1 align=exact acc=13:RTZ G=-",
                                        "F=1 align=exact acc=18:RNE:FTZ G=- split=3/T64",
                                        "F=8 align=25:RTZ acc=23:RTZ:FTZ G=-"])
def test_fast_path_triton_narrow_accumulator(short_form):
    """The Triton recurrences (interpreter on CPU) with p-bit accumulators == generic."""
    from reference.notation import parse_short
    m = parse_short(short_form)
    p = m.acc_frac_bits
    _triton_check(m, *_acc_operands(p, 300, 3, 7 + p))
    _triton_check(m, *_acc_operands(p, 300, 3, 8 + p, clean=True))


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(_H200_FP8))
def test_fast_path_h200_fp8_cuda_equals_cpu(name):
    """CUDA (Triton recurrences, and the torch loop) == the CPU fast path, e4m3, K = 4096."""
    from reference.notation import parse_short
    m = parse_short(_H200_FP8[name])
    g = torch.Generator().manual_seed(1)
    a = (torch.randn(32, 4096, generator=g) * 30).to(torch.float8_e4m3fn).float()
    b = (torch.randn(4096, 16, generator=g) * 30).to(torch.float8_e4m3fn).float()
    alpha = [0.0123, 0.00731]
    cpu = emulate(m, a, b, alpha=alpha)
    ops = _acc_operands(13, 4096, 4, 3)
    cpu2 = emulate(m, *ops)
    for p in ("auto", "fast_torch", "fast_triton"):
        assert same_bits(emulate(m, a.cuda(), b.cuda(), alpha=alpha, _paths=p).cpu(), cpu), (name, p)
        assert same_bits(emulate(m, ops[0].cuda(), ops[1].cuda(), _paths=p).cpu(), cpu2), (name, p)


def test_fast_path_group_with_fewer_steps():
    """F=4, G=8, K=12: the second group has one step, the first two.  The fast path's
    lanes run in lock step; a step of padding after the short group's own step would align
    its accumulator 2 + 2**-8 (10 bits) alone at align_bits 8 and truncate it to 2 (found
    by the narrow-accumulator grid).  By hand: group 1 = 8 * 2**-30 = 2**-27, group 2 =
    (1 + 2**-8) + 1, then 2 + 2**-8 + 2**-27 rounded to FP32 = 2 + 2**-8 (RNE and RTZ)."""
    from reference.notation import parse_short
    a = torch.tensor([[2.0 ** -30] * 8 + [1 + 2.0 ** -8, 1.0, 2.0 ** -40, 2.0 ** -40]])
    b = torch.ones(12, 1)
    for s in ("F=4 align=8:RTZ acc=23:RTZ G=8:RNE", "F=4 align=8:RTZ acc=13:RTZ G=8:RTZ",
              "F=4 align=8:RTZ:esum acc=23:RNE G=- split=2/T8"):
        m = parse_short(s)
        for p in ("auto", "generic"):
            assert same_bits(emulate(m, a, b, _paths=p), torch.tensor([[2 + 2.0 ** -8]])), (s, p)


@pytest.mark.triton_interpret
@_examples(25)
@given(narrow_problem())
def test_fast_path_triton_narrow_accumulator_drawn(pt):
    """Drawn narrow-accumulator models through the Triton recurrences == generic."""
    model, a, b, kw = pt
    _triton_check(model, a, b, **kw)


def test_fast_path_rtz_mask_overflow():
    """RTZ sums of finite nonzero normal products take the bit-mask branch; an overflow
    there must still saturate at max finite: (2 - 2**-13) * 2**127 for acc=13 (by hand);
    with groups (FP32, G=16) each group saturates and the RNE cross-group add overflows
    to Inf.  The row that does not overflow: 64 * (1 + 2**-6) = 65, exact."""
    from reference.notation import parse_short
    a = torch.tensor([[1.5 * 2.0 ** 126] * 64, [-(1.5 * 2.0 ** 126)] * 64, [1.0 + 2.0 ** -6] * 64])
    b = torch.ones(64, 1)
    mf = (2 - 2.0 ** -13) * 2.0 ** 127
    for s, big in (("F=32 align=13:RTZ:esum acc=13:RTZ G=-", mf), ("F=8 align=25:RTZ acc=23:RTZ G=16:RNE", math.inf)):
        m = parse_short(s)
        want = torch.tensor([[big], [-big], [65.0]])
        for p in ("auto", "generic"):
            assert same_bits(emulate(m, a, b, _paths=p), want), (s, p, emulate(m, a, b, _paths=p))
