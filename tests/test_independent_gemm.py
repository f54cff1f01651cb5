"""Independent SPEC 4 GEMM family (tests/independent/gemm.py) vs reference.gemm.dot: named
models and family points (F, W, align mode / reference, accumulator bits, G, cross-group
rounding, lattice, alpha, output dtype), exact outputs compared as (kind, sign, value)."""
import math
from fractions import Fraction

from hypothesis import given, settings, strategies as st

import reference.gemm as G
from reference.rounding import Mode
from tests.independent import gemm
from tests.independent.bridge import key_mine, key_project, to_float
from tests.independent.formats import decode
from tests.independent.num import from_float

E2M1 = [decode(c, "float4_e2m1fn") for c in range(16)]
ALIGN = {"value": G.AlignRef.VALUE, "esum": G.AlignRef.EXPONENT_SUM}


def project_model(m: gemm.Model):
    """Our parameterization -> the project's GemmModel field names (from help() only)."""
    return G.GemmModel(fma_width=m.F, align_bits=m.W, align_mode=Mode(m.align_mode),
                       align_ref=ALIGN[m.align_ref], acc_frac_bits=m.acc_bits,
                       norm_mode=Mode(m.norm_mode), group_size=m.G, outer_mode=Mode(m.outer_mode),
                       lattice=None if m.lattice_exp is None else Fraction(2) ** m.lattice_exp,
                       output=m.out, output_mode=Mode(m.out_mode))


def agree(m, pm, a, b, **kw):
    fl = lambda vs: None if vs is None else [to_float(v) for v in vs]
    mine = gemm.dot(m, a, b, **kw)
    pk = {k: (fl(v) if isinstance(v, list) else v) for k, v in kw.items()}
    theirs = G.dot(pm, fl(a), fl(b), **pk)
    assert key_mine(mine) == key_project(theirs)


def test_every_e2m1_product_exact():
    for x in E2M1:
        for y in E2M1:
            for name in ("exact", "fp32_sequential"):
                agree(gemm.NAMED[name], G.get_preset(name), [x], [y])


def test_named_presets_mean_the_same():
    for name, m in gemm.NAMED.items():
        assert project_model(m).to_dict() | {"name": name} == G.get_preset(name).to_dict()


codes = st.integers(0, 15)
scale_codes = st.integers(0, 0x7E)


@settings(max_examples=40)
@given(st.data(), st.sampled_from(sorted(gemm.NAMED)), st.sampled_from([16, 64, 128, 192]))
def test_named_nvfp4_dots(data, name, K):
    a = [E2M1[data.draw(codes)] for _ in range(K)]
    b = [E2M1[data.draw(codes)] for _ in range(K)]
    sa = [decode(data.draw(scale_codes), "ue4m3") for _ in range(K // 16)]
    sb = [decode(data.draw(scale_codes), "ue4m3") for _ in range(K // 16)]
    agree(gemm.NAMED[name], G.get_preset(name), a, b, scales_a=sa, scales_b=sb, block=16)


def cancelling(data, K):
    """Large terms that cancel plus small ones: exposes every alignment and rounding."""
    big = data.draw(st.sampled_from([2.0 ** 24, 3.0 * 2 ** 20, 1e30, 2.0 ** 127]))
    vals = st.one_of(st.sampled_from([big, -big, 1.0, -1.0, 0.5, 2.0 ** -24, 3.0 * 2 ** -25,
                                      0.0, -0.0, 1.401298464324817e-45]),
                     st.floats(-1e4, 1e4, width=32))
    return [from_float(data.draw(vals)) for _ in range(K)]


models = st.builds(
    gemm.Model, F=st.sampled_from([1, 2, 4, 16]), W=st.sampled_from([None, 3, 13, 25]),
    align_mode=st.sampled_from(["rtz", "rne"]), align_ref=st.sampled_from(["value", "esum"]),
    acc_bits=st.sampled_from([23, 13]), norm_mode=st.sampled_from(["rne", "rtz"]),
    G=st.sampled_from([None, 16, 32]), outer_mode=st.sampled_from(["rne", "rtz"]),
    lattice_exp=st.sampled_from([None, -10]), out=st.sampled_from(["float32", "bfloat16"]),
    out_mode=st.sampled_from(["rne", "rtz"]))


@settings(max_examples=60)
@given(st.data(), models, st.sampled_from([1, 7, 32, 40]))
def test_family_points(data, m, K):
    a = cancelling(data, K)
    b = [from_float(data.draw(st.sampled_from([1.0, -1.0, 1.5, 0.75, 3.0, 2.0 ** -3]))) for _ in range(K)]
    agree(m, project_model(m), a, b)


@settings(max_examples=30)
@given(st.data(), st.sampled_from(sorted(gemm.NAMED)))
def test_specials_and_zero_signs(data, name):
    vals = st.sampled_from([math.inf, -math.inf, math.nan, 0.0, -0.0, 1.0, -1.0, 3.4e38, -3.4e38])
    K = data.draw(st.sampled_from([1, 3, 65]))
    a = [from_float(data.draw(vals)) for _ in range(K)]
    b = [from_float(data.draw(vals)) for _ in range(K)]
    agree(gemm.NAMED[name], G.get_preset(name), a, b)


@settings(max_examples=30)
@given(st.data(), st.sampled_from(sorted(gemm.NAMED)))
def test_alpha(data, name):
    K = 16
    a = [E2M1[data.draw(codes)] for _ in range(K)]
    b = [E2M1[data.draw(codes)] for _ in range(K)]
    al = [from_float(data.draw(st.floats(0.0010000000474974513, 1e3, width=32))) for _ in range(2)]
    agree(gemm.NAMED[name], G.get_preset(name), a, b, alpha=al)
