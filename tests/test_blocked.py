"""Block-scaled container: swizzled scale layout, packing, dequantize, round trips."""
import pytest
import torch
from fractions import Fraction
from hypothesis import given, strategies as st

from reference.blocked import (BlockScaled, from_swizzled, pack_fp4, swizzle_index,
                               swizzled_shape, to_swizzled, unpack_fp4)
from reference.exact import exact
from fp4ref.quant.blocked import (BlockScaledTensor, from_swizzled as t_from, pack_codes,
                                  to_swizzled as t_to, unpack_codes)


def test_swizzle_index_literals():
    # cuBLAS 128x4 tile: (r = 32 i + j, c) -> 16 j + 4 i + c; tiles row-major by 512
    assert swizzle_index(0, 0, 4) == 0
    assert swizzle_index(0, 1, 4) == 1
    assert swizzle_index(1, 0, 4) == 16
    assert swizzle_index(32, 0, 4) == 4
    assert swizzle_index(33, 3, 4) == 16 + 4 + 3
    assert swizzle_index(0, 4, 8) == 512          # second column tile
    assert swizzle_index(128, 0, 8) == 1024       # second row tile (2 column tiles per row)
    assert swizzled_shape(1, 1) == (128, 4)
    assert swizzled_shape(129, 5) == (256, 8)


@given(st.integers(1, 300), st.integers(1, 13), st.integers(0, 2 ** 31))
def test_swizzle_matches_torchao_and_round_trips(R, C, seed):
    utils = pytest.importorskip("torchao.prototype.mx_formats.utils")
    to_blocked = utils.to_blocked
    g = torch.Generator().manual_seed(seed)
    s = torch.randint(0, 256, (R, C), generator=g, dtype=torch.int32).to(torch.uint8)
    ref = to_swizzled(s.tolist())
    fast = t_to(s)
    assert fast.tolist() == ref
    assert torch.equal(fast, to_blocked(s).flatten())  # torchao 0.18 (zero padding)
    assert torch.equal(t_from(fast, R, C), s)
    assert from_swizzled(ref, R, C) == s.tolist()


def test_swizzle_padding_value_and_bad_length():
    buf = to_swizzled([[7]], pad=0x7F)
    assert len(buf) == 512 and buf[0] == 7 and set(buf[1:]) == {0x7F}
    with pytest.raises(ValueError, match="buf"):
        from_swizzled([0] * 10, 1, 1)
    with pytest.raises(ValueError, match="buf"):
        t_from(torch.zeros(10, dtype=torch.uint8), 1, 1)


def test_pack_low_nibble_first_and_odd_rows():
    assert pack_fp4([[1, 2]]) == [[0x21]]
    assert pack_fp4([[0xF, 0x1, 0x3]]) == [[0x1F, 0x03]]
    assert unpack_fp4([[0x21]], 2) == [[1, 2]]
    t = torch.tensor([[1, 2, 3]], dtype=torch.uint8)
    assert pack_codes(t).tolist() == [[0x21, 0x03]]
    assert unpack_codes(pack_codes(t), 3).tolist() == [[1, 2, 3]]
    with pytest.raises(ValueError, match="4-bit"):
        pack_fp4([[16, 0]])
    with pytest.raises(TypeError, match="uint8"):
        pack_codes(torch.tensor([[1, 2]], dtype=torch.int32))


@given(st.integers(1, 5), st.integers(1, 40), st.integers(0, 2 ** 31))
def test_pack_round_trip(R, C, seed):
    g = torch.Generator().manual_seed(seed)
    c = torch.randint(0, 16, (R, C), generator=g).to(torch.uint8)
    assert torch.equal(unpack_codes(pack_codes(c), C), c)
    assert unpack_fp4(pack_fp4(c.tolist()), C) == c.tolist()


def _example():
    # 2 x 32 e2m1 codes, 1x16 blocks (ue4m3), per-tensor scale 0.5
    codes = tuple(tuple((r * 5 + c) % 16 for c in range(32)) for r in range(2))
    scales = ((0x38, 0x40), (0x30, 0x7F))  # 1.0, 2.0, 0.5, NaN
    return BlockScaled((2, 32), codes, "float4_e2m1fn", scales, "ue4m3", (1, 16),
                       ((exact(0.5),),), profile="t")


def test_dequantize_literals_and_torch_twin():
    b = _example()
    # code 7 (6.0) at (0, 7) * scale 1.0 * 0.5 = 3.0 ; code 0xF (-6) at (1,...)
    assert b.codes[0][7] == 7 and b.value(0, 7).to_fraction() == Fraction(3)
    assert b.codes[0][17] == 1 and b.value(0, 17).to_fraction() == Fraction(1, 2)  # 0.5*2*0.5
    assert b.value(1, 20).is_nan  # NaN scale
    t = BlockScaledTensor.from_reference(b)
    d = t.dequantize()
    ref = b.dequantize()
    for r in range(2):
        for c in range(32):
            e = ref[r][c]
            if e.is_nan:
                assert torch.isnan(d[r, c])
            else:
                assert d[r, c].item() == float(e)
                assert (torch.signbit(d[r, c]).item()) == e.negative
    assert t.to_reference() == b
    assert t.same_bits(b)
    assert torch.equal(t.packed(), torch.tensor(pack_fp4(b.codes), dtype=torch.uint8))
    assert torch.equal(t.swizzled_scales(), torch.tensor(to_swizzled(b.scale_codes), dtype=torch.uint8))


def test_container_shape_checks():
    with pytest.raises(ValueError, match="scale_codes"):
        BlockScaled((2, 32), tuple(tuple([0] * 32) for _ in range(2)), "float4_e2m1fn",
                    ((0,),), "ue4m3", (1, 16))
    with pytest.raises(ValueError, match="codes"):
        BlockScaled((2, 32), ((0,) * 32,), "float4_e2m1fn", ((0, 0), (0, 0)), "ue4m3", (1, 16))
    with pytest.raises(ValueError, match="not a 4-bit"):
        BlockScaled((1, 2), ((0, 0),), "float8_e4m3fn", ((0,),), "float8_e8m0fnu",
                    (1, 32)).packed()
