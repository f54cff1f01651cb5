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


@st.composite
def family_point(draw, exponent_sum=False):
    from .gemm_helpers import gemm_models
    blocked = draw(st.booleans())
    model = draw(gemm_models(blocked))
    if exponent_sum:  # a point where align_ref matters
        model = model.replace(align_ref=AlignRef.EXPONENT_SUM,
                              align_bits=draw(st.sampled_from((0, 1, 2, 3, 5, 8, 13, 25))))
    a, b, kw = draw(problem(blocked=blocked, kmax=64))
    K = a.shape[1]
    if blocked and model.scale_point is ScalePoint.GROUP:
        model = model.replace(group_size=kw["block"])
    from reference.gemm import split_bounds
    if ((model.split_tile is None and K % model.split_k)
            or (blocked and any(lo % kw["block"] for lo, _ in split_bounds(model, K)))):
        model = model.replace(split_k=1, split_tile=None)
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
