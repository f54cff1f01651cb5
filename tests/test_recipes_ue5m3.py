"""UE5M3 recipe: range bounds (paper numbers), wiring, zero-scale correction, fast == exact."""
import math

import pytest
import torch
from fractions import Fraction
from hypothesis import given, settings, strategies as st

from reference.recipes import quantize as rq
from reference.recipes.ue5m3 import UE5M3Recipe, range_bound
from fp4ref.quant import quantize as fq
from fp4ref.quant.ue5m3 import quantize_operand
from fp4ref.quant.inputs import block_tensors

FEW = max(5, settings().max_examples // 6)


def test_range_bound_paper_numbers():
    r = range_bound(448)
    assert r.headroom == Fraction(61440, 448)
    assert round(float(r.headroom)) == 137
    assert range_bound(2048).headroom == 30
    assert r.min_ratio == Fraction(1, 2 ** 17 * 448)
    assert r.flush_ratio == r.min_ratio / 2
    assert r.dynamic_range == Fraction(61440) * 2 ** 17
    assert range_bound(Fraction(1, 3)).headroom == 61440 * 3


@pytest.mark.parametrize("T", [0, -1, float("inf"), float("nan"), "x", True])
def test_bad_target(T):
    with pytest.raises(ValueError, match="T"):
        range_bound(T)
    with pytest.raises(ValueError, match="T"):
        fq(torch.ones(1, 16), "ue5m3", target=T)
    with pytest.raises(ValueError, match="T"):
        rq(torch.ones(1, 16), "ue5m3", target=T)


@settings(max_examples=FEW)
@given(x=block_tensors([1, 16], [32], 16), T=st.sampled_from([448, 2048, 1000.5]),
       tile=st.sampled_from([(1, 16), (1, 32), (16, 16)]),
       amax=st.sampled_from([None, 1.0, 1e-6, 1e6]))
def test_fast_equals_reference(x, T, tile, amax):
    a = rq(x, "ue5m3", target=T, tile=tile, amax=amax)
    assert fq(x, "ue5m3", target=T, tile=tile, amax=amax).same_bits(a)


def test_scale_literals_zero_correction_and_saturation():
    x = torch.zeros(1, 48)
    x[0, 0] = 6.0            # block amax == cached amax -> scale T = 448
    x[0, 16] = 6.0 * 2 ** -30  # scale 448 * 2**-30 < 2**-18: rounds to 0 -> corrected to 1.0
    x[0, 32] = 6.0 * 200     # 200x growth > 137x headroom: scale saturates at 61440
    q = fq(x, "ue5m3", amax=6.0)
    assert q.scale_codes.tolist() == [[0xBE, 0x78, 0xF7]]  # 448, 1.0, 61440
    assert q.codes[0, 0].item() == 7 and q.codes[0, 16].item() == 0
    assert q.codes[0, 32].item() == 7  # clipped at 6


def test_recipe_wiring():
    R = UE5M3Recipe(overrides=((("mlp.down.47", "dy"), 2048),))
    assert R.tile_for("w") == (16, 16) and R.tile_for("x") == (1, 16)
    assert R.target_for("dy", "mlp.down.47") == 2048 and R.target_for("dy", "other") == 448
    assert R.mode_for("dy").name == "SR" and R.mode_for("x").name == "RNE"
    assert UE5M3Recipe(block=32).tile_for("dy") == (1, 32)
    with pytest.raises(ValueError, match="block"):
        UE5M3Recipe(block=64)
    with pytest.raises(ValueError, match="operand"):
        R.target_for("bias")
    x = torch.randn(16, 32)
    rb = torch.randint(0, 256, x.shape)
    q = quantize_operand(R, x, "dy", layer="mlp.down.47", rbits=rb, nbits=8)
    a = R.quantize(x, "dy", layer="mlp.down.47", rbits=rb, nbits=8)
    assert q.same_bits(a)
    assert quantize_operand(R, x, "w").same_bits(R.quantize(x, "w"))
    with pytest.raises(ValueError, match="rbits"):
        quantize_operand(R, x, "x", rbits=rb, nbits=8)
    _ = math
