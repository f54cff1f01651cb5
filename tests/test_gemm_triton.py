"""fp4ref.gemm_triton.blockscaled_mm == fp4ref.gemm.emulate (== reference.gemm), bit for bit.

Without CUDA the kernels run in the Triton interpreter on small shapes (logic only: the
interpreter's dots are numpy). On a GPU (marker gpu):
    python -m pytest -q -m gpu tests/test_gemm_triton.py
runs 4096^3 random and adversarial operands on the compiled kernels."""
from __future__ import annotations

import math
import os

import pytest
import torch

if not torch.cuda.is_available():  # logic tests through the interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")

triton = pytest.importorskip("triton")

from fp4ref import gemm_triton as GT  # noqa: E402
from fp4ref.gemm import emulate  # noqa: E402

from .gemm_helpers import mismatch, same_bits  # noqa: E402

MODELS = ("probe_matched", "probe_matched_lattice", "decoded_fp32")
BLOCK = {"nvfp4": 16, "ue5m3": 16, "mxfp4": 32}


def _operands(M, N, K, fmt, kind, seed, device="cpu", block=None):
    """Codes and scale codes for one adversarial family ``kind``."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    blk = block or BLOCK[fmt]
    sfmt = GT.FORMATS[fmt][0]
    if kind in ("random", "outliers"):
        x = torch.randn(M, K, generator=g)
        w = torch.randn(N, K, generator=g)
        if kind == "outliers":
            x = x * torch.exp(2 * torch.randn(M, 1, generator=g)) * torch.exp(torch.randn(1, K, generator=g))
            w = w * torch.exp(2 * torch.randn(1, K, generator=g))
        ac, asc, ta = GT.quantize_operand(x, fmt, block=blk)
        bc, bsc, tb = GT.quantize_operand(w, fmt, block=blk)
        return [t.to(device) for t in (ac, asc, bc, bsc)], [ta, tb]
    # raw code patterns: all codes, any scale code in a chosen range
    ac = torch.randint(0, 16, (M, K), generator=g, dtype=torch.uint8)
    bc = torch.randint(0, 16, (N, K), generator=g, dtype=torch.uint8)
    nc = {"ue4m3": 127, "ue5m3": 248, "float8_e8m0fnu": 255}[sfmt]  # finite codes
    if kind == "wide":      # every finite scale code: extreme exponent spreads, subnormals
        lo, hi = 0, nc
    elif kind == "narrow":  # nearby scales: ties and exact FP32 group sums
        lo, hi = {"ue4m3": (56, 64), "ue5m3": (120, 128), "float8_e8m0fnu": (125, 129)}[sfmt]
    else:
        raise ValueError(kind)
    asc = torch.randint(lo, hi, (M, K // blk), generator=g, dtype=torch.int64).to(torch.uint8)
    bsc = torch.randint(lo, hi, (N, K // blk), generator=g, dtype=torch.int64).to(torch.uint8)
    if kind == "wide":  # sprinkle zero scales and whole zero blocks
        asc[torch.rand(asc.shape, generator=g) < 0.05] = 0 if sfmt != "float8_e8m0fnu" else 1
        ac[:, : blk] = 0
    return [t.to(device) for t in (ac, asc, bc, bsc)], [0.75, 2.0 ** -7]


SAMPLE = 384  # large GEMMs: the kernel computes everything, the exact emulator checks a
#              random SAMPLE x SAMPLE grid of outputs (rows/cols spread over all tiles)


def _check(ops, alpha, fmt, model, block=None, **kw):
    ac, asc, bc, bsc = ops
    blk = block or BLOCK[fmt]
    got = GT.blockscaled_mm(ac, asc, bc, bsc, fmt=fmt, model=model, alpha=alpha, block=blk, **kw)
    M, N = got.shape
    rows = cols = None
    if M * N > SAMPLE * SAMPLE * 4:
        g = torch.Generator().manual_seed(M * 7 + N)
        rows = torch.randperm(M, generator=g)[:SAMPLE].sort().values.to(ac.device)
        cols = torch.randperm(N, generator=g)[:SAMPLE].sort().values.to(ac.device)
        ac, asc, bc, bsc = ac[rows], asc[rows], bc[cols], bsc[cols]
        got = got[rows][:, cols]
        alpha = [a[rows] if torch.is_tensor(a) and a.dim() == 2 and a.shape[0] == M else a
                 for a in alpha] if isinstance(alpha, list) else alpha
    av, sav = GT.decode_operand(ac, asc, fmt, block=blk)
    bv, sbv = GT.decode_operand(bc, bsc, fmt, block=blk)
    want = emulate(model, av, bv.t(), scales_a=sav, scales_b=sbv.t(), block=blk, alpha=alpha)
    assert same_bits(got, want), f"{fmt} {model} {kw}: {mismatch(got, want)}"


# ---------------------------------------------------------------- interpreter / any device
interp = pytest.mark.skipif(torch.cuda.is_available(), reason="interpreter tests run without CUDA")


@interp
@pytest.mark.parametrize("fmt", list(GT.FORMATS))
@pytest.mark.parametrize("kind", ["random", "wide", "narrow", "outliers"])
def test_interpreter_paths(fmt, kind):
    M, N, K = 40, 36, 208 if fmt != "mxfp4" else 224   # ragged tiles, a partial last group
    ops, alpha = _operands(M, N, K, fmt, kind, seed=hash((fmt, kind)) % 1000)
    for model in MODELS:
        _check(ops, alpha, fmt, model)
    if fmt != "mxfp4":
        _check(ops, alpha, fmt, "probe_matched", force="block")
        _check(ops, None, fmt, "probe_matched_lattice", force="fix")


@interp
def test_interpreter_block32_and_specials():
    ops, alpha = _operands(33, 17, 128, "ue5m3", "random", 3, block=32)
    _check(ops, alpha, "ue5m3", "probe_matched", block=32)
    ac, asc, bc, bsc = _operands(33, 17, 128, "ue5m3", "narrow", 4)[0]
    asc[3, 2] = 0xF8  # ue5m3 inf
    bsc[5, 1] = 0xFC  # ue5m3 NaN
    for model in MODELS:
        _check([ac, asc, bc, bsc], [1.5], "ue5m3", model)
    ac, asc, bc, bsc = _operands(20, 20, 64, "nvfp4", "random", 5)[0]
    asc[0, 0] = 0x7F  # ue4m3 NaN
    _check([ac, asc, bc, bsc], None, "nvfp4", "probe_matched")


@interp
def test_packed_codes_and_tensor_alpha():
    (ac, asc, bc, bsc), _ = _operands(16, 16, 64, "nvfp4", "random", 7)
    packed = ac[:, 0::2] | (ac[:, 1::2] << 4)
    c1 = GT.blockscaled_mm(packed, asc, bc, bsc, alpha=[torch.tensor(0.1), 3.0])
    c2 = GT.blockscaled_mm(ac, asc, bc, bsc, alpha=[torch.tensor(0.1), 3.0])
    assert same_bits(c1, c2)
    _check([ac, asc, bc, bsc], [torch.linspace(0.1, 2, 16)[:, None]], "nvfp4", "probe_matched")


def _mixed_routes(fmt):
    """Rows and columns from three families (tiles of 32): PAIR, BLOCK and FIX tiles in one
    GEMM, so the routing's slow branch (after the pair certificate fails) runs."""
    r = _operands(96, 80, 256, fmt, "random", 1)[0]
    o = _operands(96, 80, 256, fmt, "outliers", 0)[0]
    w = _operands(96, 80, 256, fmt, "wide", 0)[0]
    ac, asc, bc, bsc = [t.clone() for t in r]
    for src, sl in ((o, slice(32, 64)), (w, slice(64, None))):
        ac[sl], asc[sl], bc[sl], bsc[sl] = src[0][sl], src[1][sl], src[2][sl], src[3][sl]
    return [ac, asc, bc, bsc]


@interp
@pytest.mark.parametrize("fmt", ["nvfp4", "ue5m3"])
def test_interpreter_mixed_routes(fmt):
    ac, asc, bc, bsc = _mixed_routes(fmt)
    sfmt = GT.FORMATS[fmt][0]
    A, B = GT._prep("a", ac, asc, sfmt, 16), GT._prep("b", bc, bsc, sfmt, 16)
    mode = GT._route(A, B, 16, 32, 32)[0]
    assert set(mode.unique().tolist()) == {GT._PAIR, GT._BLOCK, GT._FIX}
    alpha = [torch.tensor(0.75), 2.0 ** -7]   # a tensor factor: read back with the routing
    for model in ("probe_matched", "probe_matched_lattice"):
        _check([ac, asc, bc, bsc], alpha, fmt, model, tile=(32, 32))
    asc[5, 3] = {"nvfp4": 0x7F, "ue5m3": 0xFC}[fmt]   # NaN scale: a special row as well
    _check([ac, asc, bc, bsc], alpha, fmt, "probe_matched", tile=(32, 32))


@interp
@pytest.mark.parametrize("fmt", ["nvfp4", "ue5m3"])
def test_pair_bounds_kernel(fmt):
    """The routing kernel's per-tile pair bounds and special rows equal the torch route's
    (``_route_bounds``), bit for bit: ragged tiles, unequal tile sizes, K not a multiple of 64."""
    sfmt = GT.FORMATS[fmt][0]
    nan = {"nvfp4": 0x7F, "ue5m3": 0xFC}[fmt]
    cases = [((40, 36, 208), (32, 32)), ((70, 20, 272), (64, 16)), ((16, 48, 16), (16, 32))]
    for i, kind in enumerate(["random", "wide", "narrow", "outliers"]):
        for (M, N, K), tile in cases:
            ac, asc, bc, bsc = _operands(M, N, K, fmt, kind, seed=i)[0]
            asc[i % M, i % (K // 16)] = nan
            bsc[(3 * i) % N, 0] = nan
            A, B = GT._prep("a", ac, asc, sfmt, 16), GT._prep("b", bc, bsc, sfmt, 16)
            sqa = GT._decode_bf16(A, 16, True, True)[1]
            sqb = GT._decode_bf16(B, 16, True, True)[1]
            want = GT._route_bounds(A, B, 16, *tile, sqa, sqb)[4:]
            bad = (A.bad.clone(), B.bad.clone())
            stats = torch.zeros(8, dtype=torch.int32)
            got = GT._pair_bounds(A, B, 16, *tile, sqa, sqb, stats)
            for g, w in zip(got, want):
                assert torch.equal(g.view(torch.int64), w.view(torch.int64)), (kind, M, N, K, tile)
            assert torch.equal(A.bad, bad[0]) and torch.equal(B.bad, bad[1])
            assert stats[4:6].tolist() == [int(bad[0].sum()), int(bad[1].sum())]


def test_bad_input():
    ac = torch.zeros(4, 32, dtype=torch.uint8)
    s = torch.full((4, 2), 56, dtype=torch.uint8)
    with pytest.raises(ValueError, match="fmt: mixed operand formats"):
        GT.blockscaled_mm(ac, s, ac, s, fmt=("nvfp4", "mxfp4"))
    with pytest.raises(ValueError, match="fmt: unknown value 'nvfp8'; valid choices"):
        GT.blockscaled_mm(ac, s, ac, s, fmt="nvfp8")
    with pytest.raises(ValueError, match=r"a_scales: shape \(4, 3\)"):
        GT.blockscaled_mm(ac, torch.full((4, 3), 56, dtype=torch.uint8), ac, s)
    with pytest.raises(ValueError, match="a_codes: K=30 is not a multiple of block=16"):
        GT.blockscaled_mm(torch.zeros(4, 30, dtype=torch.uint8), s, ac, s)
    with pytest.raises(ValueError, match="block: 8 is not supported for nvfp4; valid choices: 16, 32"):
        GT.blockscaled_mm(ac, s, ac, s, block=8)
    with pytest.raises(ValueError, match="b_codes: K=64"):
        GT.blockscaled_mm(ac, s, torch.zeros(4, 64, dtype=torch.uint8), torch.full((4, 4), 56, dtype=torch.uint8))
    with pytest.raises(ValueError, match="alpha: non-finite"):
        GT.blockscaled_mm(ac, s, ac, s, alpha=[1.0, math.nan])
    with pytest.raises(ValueError, match="model: .*valid choices: probe_matched"):
        GT.blockscaled_mm(ac, s, ac, s, model="exact")
    with pytest.raises(ValueError, match="ue4m3 codes must lie in"):
        GT.blockscaled_mm(ac, torch.full((4, 2), 200, dtype=torch.uint8), ac, s)
    # the four code-range checks share one host sync: each operand's errors still named
    with pytest.raises(ValueError, match="b_scales: ue4m3 codes must lie in .* got 128"):
        GT.blockscaled_mm(ac, s, ac, torch.full((4, 2), 128, dtype=torch.uint8))
    with pytest.raises(ValueError, match="b_codes: codes must be 4-bit"):
        GT.blockscaled_mm(ac, s, torch.full_like(ac, 16), s)
    # range checks read back late (with the routing) still come first, before alpha's
    with pytest.raises(ValueError, match="a_codes: codes must be 4-bit"):
        GT.blockscaled_mm(torch.full_like(ac, 16), s, ac, s, alpha=[torch.tensor(math.nan)])
    with pytest.raises(ValueError, match="alpha: non-finite value inf"):
        GT.blockscaled_mm(ac, s, ac, s, alpha=[torch.tensor(2.0), torch.tensor(math.inf)])
    with pytest.raises(ValueError, match="scale_fmt: unknown value 'ue5m3'"):
        GT.blockscaled_mm(ac, s, ac, s, fmt="nvfp4", scale_fmt="ue5m3")
    if hasattr(torch, "float8_e8m0fnu"):
        with pytest.raises(ValueError, match="holds float8_e8m0fnu scales"):
            GT.blockscaled_mm(ac, s.view(torch.float8_e8m0fnu), ac, s)


# ---------------------------------------------------------------- GPU (compiled kernels)
gpu = pytest.mark.gpu


@gpu
@pytest.mark.parametrize("fmt", list(GT.FORMATS))
@pytest.mark.parametrize("kind", ["random", "outliers", "narrow"])
def test_gpu_4096(fmt, kind):
    S = 4096
    ops, alpha = _operands(S, S, S, fmt, kind, seed=11, device="cuda")
    for model in MODELS:
        _check(ops, alpha, fmt, model)


@gpu
@pytest.mark.parametrize("fmt", list(GT.FORMATS))
def test_gpu_wide_scales(fmt):
    """Every finite scale code: extreme spreads, zero and subnormal scales (block / fixup
    tiles; the exact reference side is slow here, hence 2048)."""
    ops, alpha = _operands(2048, 2048, 2048, fmt, "wide", seed=13, device="cuda")
    for model in MODELS:
        _check(ops, alpha, fmt, model)


@gpu
@pytest.mark.parametrize("fmt", ["nvfp4", "ue5m3"])
@pytest.mark.parametrize("kind", ["random", "wide"])
def test_gpu_forced_paths_and_rz(fmt, kind):
    ops, alpha = _operands(1024, 768, 2048 + 80, fmt, kind, seed=5, device="cuda")
    _check(ops, alpha, fmt, "probe_matched", force="block")
    _check(ops, alpha, fmt, "probe_matched", rz="twosum")
    _check(ops, alpha, fmt, "probe_matched_lattice", tile=(64, 64))


@gpu
def test_gpu_specials_and_odd_shapes():
    for fmt in GT.FORMATS:
        (ac, asc, bc, bsc), alpha = _operands(517, 389, 1024 + 64 + BLOCK[fmt], fmt, "random", 9,
                                              device="cuda")
        nanc = {"nvfp4": 0x7F, "ue5m3": 0xFC, "mxfp4": 0xFF}[fmt]
        asc[7, 3] = nanc
        bsc[11, 0] = nanc
        if fmt == "ue5m3":
            asc[9, 1] = 0xF8  # inf scale
        for model in MODELS:
            _check([ac, asc, bc, bsc], alpha, fmt, model)
    ops, alpha = _operands(300, 200, 512, "ue5m3", "random", 2, device="cuda", block=32)
    _check(ops, alpha, "ue5m3", "probe_matched", block=32)
