"""Quartet (QuEST forward, SR backward) and format-aware fusion: fast == exact, literals."""
import pytest
import torch
from fractions import Fraction
from hypothesis import given, settings, strategies as st

from reference.recipes import quantize as rq
from reference.recipes.hadamard import FUSION_H32_SIGNS, fwht_f32, norm_const
from reference.recipes.quartet import round_ties_zero
from reference.exact import exact
from reference.formats import get_format
from fp4ref.quant import quantize as fq
from fp4ref.quant.hadamard import fwht_f32 as t_fwht
from fp4ref.quant.inputs import block_tensors

FEW = max(5, settings().max_examples // 6)


def test_hadamard_literals():
    c = norm_const(32)
    assert c.mag == Fraction(float(torch.tensor(1 / 32, dtype=torch.float64).sqrt().float()))
    e0 = [exact(1.0)] + [exact(0.0)] * 31
    assert all(v == c for v in fwht_f32(e0))
    x = torch.zeros(1, 32)
    x[0, 0] = 1.0
    assert t_fwht(x).tolist() == [[float(c)] * 32]
    assert len(FUSION_H32_SIGNS) == 32 and set(FUSION_H32_SIGNS) == {1, -1}


def test_ties_toward_zero():
    f = get_format("float4_e2m1fn")
    assert round_ties_zero(exact(2.5)) == 4      # 2.5 -> 2 (not 3)
    assert round_ties_zero(exact(-0.75)) == 8 | 1  # -0.75 -> -0.5
    assert round_ties_zero(exact(2.6)) == 5      # not a tie: nearest 3
    assert round_ties_zero(exact(100.0)) == 7    # saturate
    _ = f


@settings(max_examples=FEW)
@given(x=block_tensors([1, 2], [32, 64], 32))
def test_quest_forward(x):
    a = rq(x, "quartet_fwd")
    b = fq(x, "quartet_fwd")
    assert b.same_bits(a)
    assert a.meta["mask"] == tuple(map(tuple, b.meta["mask"].tolist()))


@settings(max_examples=FEW)
@given(x=block_tensors([1, 2], [32], 32), seed=st.integers(0, 2 ** 31))
def test_quartet_backward(x, seed):
    g = torch.Generator().manual_seed(seed)
    signs = [1 if v else -1 for v in torch.randint(0, 2, (32,), generator=g).tolist()]
    rb = torch.randint(0, 256, x.shape, generator=g)
    a = rq(x, "quartet_bwd", signs=signs, rbits=rb, nbits=8)
    assert fq(x, "quartet_bwd", signs=signs, rbits=rb, nbits=8).same_bits(a)


def test_quartet_backward_sr_mean_over_all_rbits_is_truncation():
    # add-then-truncate SR with n bits: the mean over all 2**n random values is q truncated
    # to n bits below the E2M1 step (exactly; unbiased when q lies on that sub-grid)
    from reference.recipes import f32 as F
    from reference.exact import floor_log2, pow2
    nbits = 4
    for a in (1.0, 0.3, 5.0, 1e-3):
        x = torch.zeros(1, 32)
        x[0, 0] = a
        x[0, 1] = -a / 3
        y = fwht_f32([exact(float(v)) for v in x[0].tolist()])
        amax = max(v.mag for v in y)
        s = F.div(exact(pow2(floor_log2(amax))), exact(3))
        f = get_format("float4_e2m1fn")
        for j in (0, 1, 5):
            q = F.div(y[j], s)
            step = f.quantum(floor_log2(q.mag))
            sub = step / 2 ** nbits
            want = (q.mag // sub) * sub
            tot = Fraction(0)
            for r in range(2 ** nbits):
                out = fq(x, "quartet_bwd", signs=[1] * 32, rbits=torch.full((1, 32), r),
                         nbits=nbits)
                tot += f.decode(int(out.codes[0, j])).mag
            assert tot / 2 ** nbits == want, (a, j)


@settings(max_examples=FEW)
@given(x=block_tensors([3, 5], [32, 48], 16), th=st.sampled_from([1, 2, 4]),
       tw=st.sampled_from([16, 32]))
def test_cta_nvfp4(x, th, tw):
    a = rq(x, "fusion_cta_nvfp4", cta_tile=(th, tw))
    assert fq(x, "fusion_cta_nvfp4", cta_tile=(th, tw)).same_bits(a)


def test_cta_whole_tensor_tile_is_global_nvfp4():
    x = torch.randn(4, 32)
    a = fq(x, "fusion_cta_nvfp4", cta_tile=(4, 32))
    b = fq(x, "te_nvfp4")
    assert torch.equal(a.codes, b.codes) and torch.equal(a.scale_codes, b.scale_codes)
    assert a.tensor_scale.view(torch.int32).item() == b.tensor_scale.view(torch.int32).item()
    with pytest.raises(ValueError, match="cta_tile"):
        fq(x, "fusion_cta_nvfp4", cta_tile=(4, 24))


@settings(max_examples=FEW)
@given(x=block_tensors([1, 2], [32, 64], 32), seed=st.integers(0, 2 ** 31))
def test_row_sr_and_h32(x, seed):
    g = torch.Generator().manual_seed(seed)
    rb = torch.randint(0, 256, x.shape, generator=g)
    assert fq(x, "fusion_row_sr_mxfp4", rbits=rb, nbits=8).same_bits(
        rq(x, "fusion_row_sr_mxfp4", rbits=rb, nbits=8))
    assert fq(x, "fusion_h32_mxfp4").same_bits(rq(x, "fusion_h32_mxfp4"))
