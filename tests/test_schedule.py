"""GemmModel.plan (reference/schedule.py) against hand-worked literal schedules.

The plan is data that every backend executes (reference.gemm.dot, fp4ref.gemm.emulate,
probes.sim); these literals are written out by hand from the model definitions in
reference/gemm.py, not computed, so a change to the schedule rules shows up here first."""
from __future__ import annotations

from fractions import Fraction

import pytest

from reference.gemm import AlignRef, AlphaMode, GemmModel, ScalePoint, get_preset, split_bounds
from reference.rounding import Mode
from reference.schedule import ExpFactor, Group, Operand, ScaleAt, Slice, Step


def _steps(*bounds):
    return tuple(Step(lo, hi, None) for lo, hi in bounds)


def test_split_k_groups_and_steps_literal():
    # K = 256, split_k 2, groups of 64, fused steps of 16
    m = GemmModel(fma_width=16, group_size=64, split_k=2, outer_mode=Mode.RTZ)
    p = m.plan(256)
    want = tuple(
        Slice(s, s + 128, tuple(
            Group(g, g + 64, _steps(*[(j, j + 16) for j in range(g, g + 64, 16)]), None)
            for g in (s, s + 64)))
        for s in (0, 128))
    assert p.slices == want
    assert p.bounds == ((0, 128), (128, 256))
    assert p.scales is ScaleAt.NONE and p.block is None and not p.chain
    assert p.outer_mode is Mode.RTZ and p.exp_factors is None and p.exact_group is None
    assert p.step_width == 16 and p.uniform
    assert p.group_ends == {64, 128, 192, 256} and p.slice_ends == {128, 256}
    assert len(p.groups) == 4 and len(p.steps) == 16
    assert split_bounds(m, 256) == [(0, 128), (128, 256)]


def test_blackwell_mxf4nvf4_literal():
    # K = 128 under kind::mxf4nvf4 chained: two instructions of K = 64, one fused step each,
    # four exact runs of 16 per step; NVFP4 scales (block 16) multiply each product and
    # the runs align at their scales' exponent sums (ue4m3), not the elements'
    p = get_preset("blackwell_mxf4nvf4").plan(128, 16)
    runs = lambda g: tuple((r, r + 16) for r in range(g, g + 64, 16))  # noqa: E731
    assert p.slices == (Slice(0, 128, (Group(0, 64, (Step(0, 64, runs(0)),), None),
                                       Group(64, 128, (Step(64, 128, runs(64)),), None))),)
    assert p.chain and p.outer_mode is Mode.RTZ and p.exact_group == 16
    assert p.scales is ScaleAt.PRODUCT and p.block == 16
    assert p.exp_factors == (ExpFactor(Operand.SCALE_A, "ue4m3"), ExpFactor(Operand.SCALE_B, "ue4m3"))
    assert p.acc_exp_floor == -126  # C aligns at >= FP32's minimum normal exponent, zeros count
    # without block scales the elements' format exponents align the runs
    assert get_preset("blackwell_mxf4nvf4").plan(64).exp_factors == (
        ExpFactor(Operand.A, "float4_e2m1fn"), ExpFactor(Operand.B, "float4_e2m1fn"))


def test_blackwell_mxf8f6f4_literal():
    # K = 64, instructions of 32, every product its own addend at exp(a)+exp(b)+exp(sa)+exp(sb)
    p = get_preset("blackwell_mxf8f6f4").plan(64, 32)
    assert p.slices == (Slice(0, 64, (Group(0, 32, _steps((0, 32)), None),
                                      Group(32, 64, _steps((32, 64)), None))),)
    assert p.exp_factors == (ExpFactor(Operand.A, "float4_e2m1fn"), ExpFactor(Operand.B, "float4_e2m1fn"),
                             ExpFactor(Operand.SCALE_A, "float8_e8m0fnu"), ExpFactor(Operand.SCALE_B, "float8_e8m0fnu"))


def test_group_scales_literal():
    # scale_point GROUP, block 4: each group of 4 is one block, its scales multiply the partial
    m = GemmModel(fma_width=2, group_size=4, scale_point=ScalePoint.GROUP)
    p = m.plan(12, 4)
    assert p.scales is ScaleAt.GROUP
    assert p.slices == (Slice(0, 12, (Group(0, 4, _steps((0, 2), (2, 4)), 0),
                                      Group(4, 8, _steps((4, 6), (6, 8)), 1),
                                      Group(8, 12, _steps((8, 10), (10, 12)), 2))),)
    # the same model without block scales: no scale points
    assert all(g.scale_block is None for g in m.plan(12).groups)


def test_uneven_steps_and_slices_literal():
    # fused steps of 48 in one group of 64: a step of 48 and one of 16
    p = GemmModel(fma_width=48).plan(64)
    assert p.slices == (Slice(0, 64, (Group(0, 64, _steps((0, 48), (48, 64)), None),)),)
    assert p.step_width == 48 and not p.uniform
    # split_tile: ceil(10 / 3) = 4, a multiple of 2: slices of 4, 4, 2
    p = GemmModel(split_k=3, split_tile=2, fma_width=3).plan(10)
    assert p.bounds == ((0, 4), (4, 8), (8, 10))
    assert p.slices[0].groups == (Group(0, 4, _steps((0, 3), (3, 4)), None),)
    assert p.slices[2].groups == (Group(8, 10, _steps((8, 10)), None),)
    # cuBLAS split-K on the H200: K = 4096 as 3 slices of 1408, 1408, 1280
    assert GemmModel(split_k=3, split_tile=128).plan(4096).bounds == ((0, 1408), (1408, 2816), (2816, 4096))


def test_exact_runs_restart_at_each_step():
    # runs of 16 inside steps of 40: each step's runs start at the step (the last is short)
    p = GemmModel(fma_width=40, exact_group=16, group_size=40, chain=True).plan(80)
    assert [st.runs for st in p.steps] == [((0, 16), (16, 32), (32, 40)), ((40, 56), (56, 72), (72, 80))]


def test_empty_dot_is_one_empty_group():
    p = GemmModel(fma_width=4).plan(0)
    assert p.slices == (Slice(0, 0, (Group(0, 0, (), None),)),)
    assert p.step_width == 1 and p.uniform


def test_exponent_sum_factors_follow_the_scale_point():
    m = GemmModel(fma_width=4, align_bits=20, align_ref=AlignRef.EXPONENT_SUM, group_size=4)
    assert m.plan(8).exp_factors == (ExpFactor(Operand.A, None), ExpFactor(Operand.B, None))
    assert m.plan(8, 4).exp_factors == (ExpFactor(Operand.A, None), ExpFactor(Operand.B, None),
                                        ExpFactor(Operand.SCALE_A, None), ExpFactor(Operand.SCALE_B, None))
    g = m.replace(scale_point=ScalePoint.GROUP)
    assert g.plan(8, 4).exp_factors == (ExpFactor(Operand.A, None), ExpFactor(Operand.B, None))
    assert m.plan(8).acc_exp_floor is None  # only nonzero terms align, C by its value
    assert m.replace(align_bits=None).plan(8).exp_factors is None  # exact steps: no alignment
    assert get_preset("blackwell_mxf4nvf4").replace(align_bits=None).plan(64).acc_exp_floor is None
    assert GemmModel(align_bits=9).plan(8).exp_factors is None  # VALUE: by each term's value


@pytest.mark.parametrize("model, K, block, match", [
    (GemmModel(split_k=3), 4, None, r"split_k: K=4 is not a multiple of split_k=3"),
    (GemmModel(), 10, 4, r"block: K=10 is not a multiple of block=4"),
    (GemmModel(group_size=8, scale_point=ScalePoint.GROUP), 16, 4,
     r"GemmModel.group_size: scale_point GROUP needs group_size == block \(4\), got 8"),
    (GemmModel(group_size=2, fma_width=2, scale_point=ScalePoint.GROUP, split_k=2), 6, 2,
     r"split_k: scale_point GROUP needs slices of whole blocks \(2\)"),
    (GemmModel(), -1, None, r"K: -1 is not an int >= 0"),
    (GemmModel(), 8, 0, r"block: 0 is not an int >= 1"),
    (GemmModel(), 8, True, r"block: True is not an int >= 1"),
])
def test_rejected_schedules(model, K, block, match):
    with pytest.raises(ValueError, match=match):
        model.plan(K, block)


def test_plan_is_cached_and_accepts_integer_types():
    import numpy as np
    m = get_preset("probe_matched")
    assert m.plan(128, 16) is m.plan(np.int64(128), np.int64(16))
    assert type(m.plan(np.int64(128), 16).K) is int


@pytest.mark.parametrize("field, value, match", [
    ("align_ref", "nope", r"GemmModel.align_ref: unknown value 'nope'; valid choices: VALUE"),
    ("scale_point", "everywhere", r"GemmModel.scale_point: unknown value 'everywhere'; valid choices"),
    ("alpha_mode", 3, r"GemmModel.alpha_mode: unknown value 3; valid choices"),
    ("norm_mode", "SR", r"GemmModel.norm_mode: invalid value 'SR'; valid choices: RNE"),
    ("output", "float33", r"GemmModel.output: unknown value 'float33'; valid choices: .*float32"),
    ("product_format", "bf16x", r"GemmModel.product_format: unknown value 'bf16x'"),
    ("exp_formats", ("float32", "nope", None), r"GemmModel.exp_formats: unknown value 'nope'"),
    ("exp_formats", "abc", r"GemmModel.exp_formats: invalid value 'abc'"),
    ("group_size", True, r"GemmModel.group_size: invalid value True; valid choices: None or an int"),
    ("acc_frac_bits", 61, r"GemmModel.acc_frac_bits: invalid value 61"),
    ("lattice", "x", r"GemmModel.lattice: invalid value 'x'"),
    ("chain", 1, r"GemmModel.chain: invalid value 1; valid choices: True or False"),
    ("name", None, r"GemmModel.name: invalid value None; valid choices: a str"),
])
def test_model_fields_checked_at_construction(field, value, match):
    with pytest.raises(ValueError, match=match):
        GemmModel(**{field: value})


def test_enum_names_parse():
    m = GemmModel(align_ref="exponent_sum", scale_point="GROUP", alpha_mode="reversed",
                  lattice="1/1024", group_size=16)
    assert (m.align_ref, m.scale_point, m.alpha_mode) == (AlignRef.EXPONENT_SUM, ScalePoint.GROUP,
                                                          AlphaMode.REVERSED)
    assert m.lattice == Fraction(1, 1024)
