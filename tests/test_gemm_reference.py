"""reference.gemm against independent computations (numpy float32, Fractions, torch.round)."""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import torch
from hypothesis import given, strategies as st

from reference.exact import Exact, Kind
from reference.gemm import PRESETS, GemmModel, ScalePoint, dot, get_preset, matmul
from reference.rounding import Mode

from .gemm_helpers import e2m1_value, f32_round

vec = st.integers(1, 200).flatmap(
    lambda K: st.tuples(st.lists(e2m1_value(-30, 30), min_size=K, max_size=K),
                        st.lists(e2m1_value(-30, 30), min_size=K, max_size=K)))


def _f(x: Exact) -> float:
    return float(x)


@given(vec)
def test_fp32_sequential_is_numpy_float32_loop(ab):
    a, b = ab
    acc = np.float32(0)
    for x, y in zip(a, b):
        acc = np.float32(acc + np.float32(x * y))  # products are exact float32 values
    got = dot(PRESETS["fp32_sequential"], a, b)
    assert np.float32(_f(got)).tobytes() == acc.tobytes()


@given(vec)
def test_exact_is_one_rounding_of_the_fraction_sum(ab):
    a, b = ab
    s = sum((Fraction(x) * Fraction(y) for x, y in zip(a, b)), Fraction(0))
    assert _f(dot(PRESETS["exact"], a, b)) == f32_round(s)


def _probe_matched_independent(a, b, sa, sb, block, lattice=False):
    total = None
    for g in range(0, len(a), 64):
        s = sum((Fraction(a[k]) * Fraction(b[k]) * Fraction(sa[k // block]) * Fraction(sb[k // block])
                 for k in range(g, min(g + 64, len(a)))), Fraction(0))
        part = f32_round(s)
        total = part if total is None else f32_round(Fraction(total) + Fraction(part), "rtz")
    if lattice:
        total = float(torch.round(torch.tensor(1024.0 * total, dtype=torch.float32)) / 1024)
    return total


@given(st.integers(1, 6).flatmap(lambda nb: st.tuples(
    st.lists(e2m1_value(), min_size=16 * nb, max_size=16 * nb),
    st.lists(e2m1_value(), min_size=16 * nb, max_size=16 * nb),
    st.lists(st.builds(lambda m, e: m * 2.0 ** e, st.sampled_from((1.0, 1.125, 1.5, 1.875)),
                       st.integers(-9, 8)), min_size=nb, max_size=nb),
    st.lists(st.builds(lambda m, e: m * 2.0 ** e, st.sampled_from((1.0, 1.25, 1.75)),
                       st.integers(-9, 8)), min_size=nb, max_size=nb))), st.booleans())
def test_probe_matched_is_groups_rne_then_rtz(args, lattice):
    a, b, sa, sb = args
    name = "probe_matched_lattice" if lattice else "probe_matched"
    got = dot(PRESETS[name], a, b, scales_a=sa, scales_b=sb, block=16)
    assert _f(got) == _probe_matched_independent(a, b, sa, sb, 16, lattice)


@given(vec)
def test_decoded_fp32_scale_product(ab):
    a, b = ab
    K = len(a) - len(a) % 4 or 4
    a, b = (a * 4)[:K], (b * 4)[:K]
    sa = [2.0 ** (i % 5 - 2) for i in range(K // 4)]
    sb = [1.5 * 2.0 ** (-(i % 3)) for i in range(K // 4)]
    acc = np.float32(0)
    for k in range(K):
        acc = np.float32(acc + np.float32(a[k] * b[k] * sa[k // 4] * sb[k // 4]))
    got = dot(PRESETS["decoded_fp32"], a, b, scales_a=sa, scales_b=sb, block=4)
    assert np.float32(_f(got)).tobytes() == acc.tobytes()


def test_catastrophic_cancellation_and_spread():
    big = 2.0 ** 100
    assert _f(dot(PRESETS["exact"], [big, 1.0, -big], [1.0, 2.0 ** -80, 1.0])) == 2.0 ** -80
    # sequential FP32 loses the small term
    assert _f(dot(PRESETS["fp32_sequential"], [big, 1.0, -big], [1.0, 2.0 ** -80, 1.0])) == 0.0
    # one probe_matched group keeps it exactly
    assert _f(dot(PRESETS["probe_matched"], [big, 1.0, -big], [1.0, 2.0 ** -80, 1.0])) == 2.0 ** -80


def test_cross_group_rtz():
    # group 1 = 1, group 2 = 2**-30: 1 + 2**-30 truncates to 1 (RTZ), RNE would too; use -2**-30
    a = [1.0] + [0.0] * 63 + [-(2.0 ** -30)] + [0.0] * 63
    b = [1.0] * 128
    got = _f(dot(PRESETS["probe_matched"], a, b))
    assert got == float(np.nextafter(np.float32(1), np.float32(0)))  # RTZ goes below 1
    assert _f(dot(PRESETS["fp32_sequential"], a, b)) == 1.0


def test_lattice_literal():
    # SPEC: torch.round(1024 * c) / 1024, ties to even
    c = 3 / 2048 + 1.0  # 1024*c = 1025.5 -> 1026
    got = _f(dot(PRESETS["probe_matched_lattice"], [c], [1.0]))
    assert got == float(torch.round(torch.tensor(1024 * c)) / 1024) == 1026 / 1024


def test_signed_zeros_ieee():
    m = PRESETS["fp32_sequential"]
    z = dot(m, [-0.0, -0.0], [1.0, 1.0])  # +0 accumulator start: +0 + -0 = +0
    assert z.is_zero and not z.negative
    rdn = m.replace(norm_mode=Mode.RDN)
    assert dot(rdn, [1.0, -1.0], [1.0, 1.0]).negative  # exact cancellation under RDN is -0
    assert dot(rdn, [-0.0], [1.0]).negative  # +0 + -0 under RDN is -0
    assert not dot(m, [1.0, -1.0], [1.0, 1.0]).negative


def test_specials():
    m = PRESETS["probe_matched"]
    assert dot(m, [math.inf, 0.0], [1.0, 1.0]).is_inf
    assert dot(m, [math.inf, 0.0], [0.0, 1.0]).is_nan  # inf * 0
    assert dot(m, [math.inf, -math.inf], [1.0, 1.0]).is_nan
    assert dot(m, [1.0], [1.0], scales_a=[math.nan], scales_b=[1.0], block=1).is_nan


def test_split_k_and_group_scale_point():
    m = GemmModel(fma_width=1, split_k=2)
    # halves summed separately: (2**24 + 1) + (1) -> each half FP32, then one RNE add
    got = _f(dot(m, [2.0 ** 24, 1.0, 1.0, 1.0], [1.0] * 4))
    assert got == float(np.float32(np.float32(2.0 ** 24) + np.float32(2.0)))
    g = GemmModel(fma_width=2, group_size=2, scale_point=ScalePoint.GROUP)
    got = _f(dot(g, [1.0, 2.0, 3.0, 4.0], [1.0] * 4, scales_a=[2.0, 0.5], scales_b=[1.0, 1.0], block=2))
    assert got == 3.0 * 2 + 7.0 * 0.5


def test_bad_input():
    with pytest.raises(ValueError, match="block"):
        dot(PRESETS["exact"], [1.0] * 5, [1.0] * 5, scales_a=[1.0], scales_b=[1.0], block=4)
    with pytest.raises(ValueError, match="scales_a/scales_b"):
        dot(PRESETS["exact"], [1.0] * 8, [1.0] * 8, scales_a=[1.0], scales_b=[1.0, 1.0], block=4)
    with pytest.raises(ValueError, match="split_k"):
        dot(GemmModel(split_k=3), [1.0] * 4, [1.0] * 4)
    with pytest.raises(ValueError, match="model.*valid choices"):
        get_preset("nope")
    with pytest.raises(ValueError, match="fma_width"):
        GemmModel(fma_width=0)
    g = GemmModel(fma_width=2, group_size=2, scale_point=ScalePoint.GROUP, split_k=2)
    with pytest.raises(ValueError, match="split_k"):
        dot(g, [1.0] * 6, [1.0] * 6, scales_a=[1.0] * 3, scales_b=[1.0] * 3, block=2)


def test_model_roundtrip_and_matmul():
    for m in PRESETS.values():
        assert GemmModel.from_dict(m.to_dict()) == m
    C = matmul(PRESETS["exact"], [[1.0, 2.0]], [[3.0], [4.0]])
    assert _f(C[0][0]) == 11.0
    assert Exact(Kind.FINITE, False, Fraction(11)) == C[0][0]
