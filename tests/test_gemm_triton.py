"""fp4ref.gemm_triton.blockscaled_mm == reference.gemm (the exact reference, decoded by
reference.formats), bit for bit, on sampled outputs.  Not fp4ref.gemm.emulate: blockscaled_mm
computes its FIX tiles with emulate, so comparing with it would check the emulator against
itself there (special rows / columns are decided by counts, fixup.special_values: checked
against emulate in tests/test_gemm_triton_specials.py; the reference stays their oracle here).  Each test also asserts which routes (PAIR / BLOCK / WIDE / FIX
tiles,
``route_stats``) it exercised, forced (``force=``) or chosen by the routing.

Without CUDA the kernels run in the Triton interpreter (logic only: the interpreter's dots are
numpy), in a process of their own (tests/test_interpreter.py; marker triton_interpret).  On a
GPU (marker gpu):
    python -m pytest -q -m gpu tests/test_gemm_triton.py
runs 4096^3 random and adversarial operands on the compiled kernels."""
from __future__ import annotations

import math
import zlib

import pytest
import torch

triton = pytest.importorskip("triton")

from fp4ref import gemm_triton as GT  # noqa: E402
from fp4ref.gemm_triton import certify, decode  # noqa: E402
from fp4ref.gemm_triton.schedule import KernelPlan, kernel_plan  # noqa: E402
from reference.gemm import PRESETS  # noqa: E402
from reference.formats import get_format  # noqa: E402

from .gemm_helpers import check_sampled, ref_blockscaled, same_bits, sample_positions  # noqa: E402

MODELS = ("probe_matched", "probe_matched_lattice", "decoded_fp32")
BLOCK = {"nvfp4": 16, "ue5m3": 16, "mxfp4": 32}


def _operands(M, N, K, fmt, kind, seed, device="cpu", block=None):
    """Codes and scale codes for one adversarial family ``kind``."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    blk = block or BLOCK[fmt]
    sfmt = GT.OPERAND_FORMATS[fmt].scale_fmt
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


def _special_rows(sc: torch.Tensor, sfmt: str) -> list[int]:
    """Rows holding a NaN or inf scale code (the exact fix-up's special rows)."""
    spec = get_format(sfmt)
    bad = torch.tensor([not spec.decode(c).is_finite for c in range(spec.ncodes)] +
                       [False] * (256 - spec.ncodes))
    return bad[sc.cpu().long()].any(1).nonzero().squeeze(1).tolist()


def _check(ops, alpha, fmt, model, block=None, n=None, **kw):
    """blockscaled_mm vs reference.gemm.dot at n sampled outputs (default: about 8192
    reference products per call, 24 to 96 outputs), plus one on each special row / column."""
    ac, asc, bc, bsc = ops
    blk = block or BLOCK[fmt]
    sfmt = kw.get("scale_fmt") or GT.OPERAND_FORMATS[fmt].scale_fmt
    got = GT.blockscaled_mm(ac, asc, bc, bsc, fmt=fmt, model=model, alpha=alpha, block=blk, **kw)
    M, N = got.shape
    K = asc.shape[1] * blk
    n = n or max(24, min(96, 8192 // K))
    pos = sample_positions(M, N, n, seed=zlib.crc32(repr((M, N, K, fmt, model, kw)).encode()),
                           rows=_special_rows(asc, sfmt)[:8], cols=_special_rows(bsc, sfmt)[:8])
    want = ref_blockscaled(model, ac, asc, bc, bsc, sfmt, blk, alpha, pos)
    check_sampled(got, want, pos, f"{fmt} {model} {kw}")


def _routes(ops, fmt, tile, block=None) -> dict:
    """Share of output tiles per route as the routing picks them (before any force)."""
    return GT.route_stats(*ops, fmt=fmt, block=block or BLOCK[fmt], tile=tile)


# ---------------------------------------------------------------- interpreter / any device
def interp(f):
    f = pytest.mark.skipif(torch.cuda.is_available(), reason="interpreter tests run without CUDA")(f)
    return pytest.mark.triton_interpret(f)


@interp
@pytest.mark.parametrize("fmt", list(GT.OPERAND_FORMATS))
@pytest.mark.parametrize("kind", ["random", "wide", "narrow", "outliers"])
def test_interpreter_paths(fmt, kind):
    M, N, K = 40, 36, 208 if fmt != "mxfp4" else 224   # ragged tiles, a partial last group
    ops, alpha = _operands(M, N, K, fmt, kind, seed=zlib.crc32(f"{fmt}/{kind}".encode()) % 1000)
    r = _routes(ops, fmt, (32, 32))
    if kind == "wide":   # every finite scale code: WIDE tiles (MXFP4: the exact fix-up)
        assert r["fix" if fmt == "mxfp4" else "wide"] > 0, r
    elif kind in ("random", "narrow"):
        assert r["pair"] > 0, r
    for model in MODELS:
        _check(ops, alpha, fmt, model)
    if fmt != "mxfp4":
        _check(ops, alpha, fmt, "probe_matched", force="block")   # PAIR tiles -> BLOCK kernel
        _check(ops, alpha, fmt, "probe_matched", force="wide")    # every tile -> WIDE kernel
        _check(ops, None, fmt, "probe_matched_lattice", force="fix")
        _check(ops, alpha, fmt, "probe_matched", force="pair")    # = the routing's choice
    else:
        _check(ops, alpha, fmt, "probe_matched", force="fix")


@interp
@pytest.mark.parametrize("fmt", ["nvfp4", "ue5m3"])
def test_interpreter_block_path_share(fmt):
    """The BLOCK kernel really runs: with force="block" every PAIR tile goes to it, so its
    share is the routing's pair + block share, asserted large; checked on many outputs."""
    ops, alpha = _operands(64, 64, 256, fmt, "narrow", seed=21)
    r = _routes(ops, fmt, (32, 32))
    assert r["pair"] + r["block"] >= 0.75, r
    _check(ops, alpha, fmt, "probe_matched", force="block", n=96)
    _check(ops, None, fmt, "probe_matched_lattice", force="block", n=48)


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
    """Rows and columns from three families (tiles of 32): PAIR, BLOCK and WIDE tiles in one
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
    r = _routes([ac, asc, bc, bsc], fmt, (32, 32))
    assert r["pair"] > 0 and r["block"] > 0 and r["wide"] > 0, r   # all three, unforced
    alpha = [torch.tensor(0.75), 2.0 ** -7]   # a tensor factor: read back with the routing
    for model in ("probe_matched", "probe_matched_lattice"):
        _check([ac, asc, bc, bsc], alpha, fmt, model, tile=(32, 32), n=96)
    asc[5, 3] = {"nvfp4": 0x7F, "ue5m3": 0xFC}[fmt]   # NaN scale: a special row as well
    _check([ac, asc, bc, bsc], alpha, fmt, "probe_matched", tile=(32, 32))


@interp
@pytest.mark.parametrize("fmt", ["nvfp4", "ue5m3"])
def test_pair_bounds_kernel(fmt):
    """The routing kernel's per-tile pair bounds and special rows equal the torch route's
    (``certify.route_bounds``), bit for bit: ragged tiles, unequal tile sizes, K not a multiple
    of 64."""
    sfmt = GT.OPERAND_FORMATS[fmt].scale_fmt
    nan = {"nvfp4": 0x7F, "ue5m3": 0xFC}[fmt]
    cases = [((40, 36, 208), (32, 32)), ((70, 20, 272), (64, 16)), ((16, 48, 16), (16, 32))]
    for i, kind in enumerate(["random", "wide", "narrow", "outliers"]):
        for (M, N, K), tile in cases:
            ac, asc, bc, bsc = _operands(M, N, K, fmt, kind, seed=i)[0]
            asc[i % M, i % (K // 16)] = nan
            bsc[(3 * i) % N, 0] = nan
            A, B = decode.operand("a", ac, asc, sfmt, 16), decode.operand("b", bc, bsc, sfmt, 16)
            sqa = decode.decode_bf16(A, 16, True, True)[1]
            sqb = decode.decode_bf16(B, 16, True, True)[1]
            b = certify.route_bounds(A, B, 16, *tile, sqa, sqb, group_blocks=4)  # 64 / 16
            want = (b.XAn, b.XBn)
            bad = (A.bad.clone(), B.bad.clone())
            stats = torch.zeros(8, dtype=torch.int32)
            got = certify.pair_bounds(A, B, 16, *tile, sqa, sqb, stats, group_blocks=4)
            for g, w in zip(got, want):
                assert torch.equal(g.view(torch.int64), w.view(torch.int64)), (kind, M, N, K, tile)
            assert torch.equal(A.bad, bad[0]) and torch.equal(B.bad, bad[1])
            assert stats[4:6].tolist() == [int(bad[0].sum()), int(bad[1].sum())]


def test_kernel_plan():
    """The kernels' walk of the model's plan, against hand-worked cases: groups of 64 (four
    blocks of 16, two of 32, a partial last group), decoded_fp32's unit steps, and plans the
    kernels do not run (other group sizes, split-K, chained MMA instructions) rejected."""
    pm = PRESETS["probe_matched"]
    assert kernel_plan(pm, 208, 16, False) == KernelPlan(64, 4)
    assert kernel_plan(PRESETS["probe_matched_lattice"], 224, 32, False) == KernelPlan(64, 2)
    assert kernel_plan(pm, 0, 16, False) == KernelPlan(64, 4)
    assert kernel_plan(PRESETS["decoded_fp32"], 48, 16, True) == KernelPlan(1, 0)
    with pytest.raises(ValueError, match="model: 'probe_matched' has a schedule"):
        kernel_plan(pm, 64, 16, True)                       # decoded kernel, grouped plan
    for other in (pm.replace(group_size=128, fma_width=128), pm.replace(split_k=2),
                  pm.replace(outer_mode="RNE"), PRESETS["blackwell_mxf4nvf4"]):
        with pytest.raises(ValueError, match="schedule the Triton kernels do not run"):
            kernel_plan(other, 256, 16, False)


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
# The reference costs about 1 ms per K = 64 output: 64 sampled outputs at K = 4096 take ~4 s.
gpu = pytest.mark.gpu
NG = 24   # sampled outputs per check at K = 4096 (the exact reference: ~60 ms each there)


@gpu
@pytest.mark.parametrize("fmt", list(GT.OPERAND_FORMATS))
@pytest.mark.parametrize("kind", ["random", "outliers", "narrow"])
def test_gpu_4096(fmt, kind):
    S = 4096
    ops, alpha = _operands(S, S, S, fmt, kind, seed=11, device="cuda")
    r = _routes(ops, fmt, (128, 128))
    if kind != "outliers":
        assert r["pair"] > 0.5, r
    for model in MODELS:
        _check(ops, alpha, fmt, model, n=NG)


@gpu
@pytest.mark.parametrize("fmt", list(GT.OPERAND_FORMATS))
def test_gpu_wide_scales(fmt):
    """Every finite scale code: extreme spreads, zero and subnormal scales (the tiles go to the
    WIDE kernel, MXFP4's to the exact fix-up, asserted; the reference is the oracle)."""
    ops, alpha = _operands(2048, 2048, 2048, fmt, "wide", seed=13, device="cuda")
    assert _routes(ops, fmt, (128, 128))["fix" if fmt == "mxfp4" else "wide"] > 0
    for model in MODELS:
        _check(ops, alpha, fmt, model, n=NG)


@gpu
@pytest.mark.parametrize("fmt", ["nvfp4", "ue5m3"])
@pytest.mark.parametrize("kind", ["random", "narrow", "wide"])
def test_gpu_forced_paths_and_rz(fmt, kind):
    """Forced BLOCK (every PAIR tile to the block kernel: its share asserted), forced FIX, the
    TwoSum RZ add and 64x64 tiles, each against the reference."""
    ops, alpha = _operands(1024, 768, 2048 + 80, fmt, kind, seed=5, device="cuda")
    r = _routes(ops, fmt, (128, 128))
    if kind != "wide":
        assert r["pair"] + r["block"] > 0.5, r     # the BLOCK kernel's share under force
    _check(ops, alpha, fmt, "probe_matched", force="block", n=NG)
    _check(ops, alpha, fmt, "probe_matched_lattice", force="block", n=NG)
    _check(ops, alpha, fmt, "probe_matched", force="fix", n=32)
    _check(ops, alpha, fmt, "probe_matched", force="wide", n=NG)
    _check(ops, alpha, fmt, "probe_matched_lattice", force="wide", tile=(64, 64), n=NG)
    _check(ops, alpha, fmt, "probe_matched", rz="twosum", n=NG)
    _check(ops, alpha, fmt, "probe_matched_lattice", tile=(64, 64), n=NG)


@gpu
def test_gpu_mixed_routes():
    """PAIR, BLOCK and WIDE tiles in one GEMM, unforced, at the GPU's 128x128 tiles."""
    for fmt in ("nvfp4", "ue5m3"):
        parts = [_operands(384, 384, 1024, fmt, k, s, device="cuda")[0]
                 for k, s in (("random", 1), ("outliers", 0), ("wide", 0))]
        ops = [t.clone() for t in parts[0]]
        for src, sl in ((parts[1], slice(128, 256)), (parts[2], slice(256, None))):
            for t, u in zip(ops, src):
                t[sl] = u[sl]
        r = _routes(ops, fmt, (128, 128))
        assert r["pair"] > 0 and r["wide"] > 0, r
        for model in ("probe_matched", "probe_matched_lattice"):
            _check(ops, [torch.tensor(0.75), 2.0 ** -7], fmt, model, n=NG)


@gpu
def test_gpu_specials_and_odd_shapes():
    for fmt in GT.OPERAND_FORMATS:
        (ac, asc, bc, bsc), alpha = _operands(517, 389, 1024 + 64 + BLOCK[fmt], fmt, "random", 9,
                                              device="cuda")
        nanc = {"nvfp4": 0x7F, "ue5m3": 0xFC, "mxfp4": 0xFF}[fmt]
        asc[7, 3] = nanc
        bsc[11, 0] = nanc
        if fmt == "ue5m3":
            asc[9, 1] = 0xF8  # inf scale
        for model in MODELS:
            _check([ac, asc, bc, bsc], alpha, fmt, model, n=NG)
    ops, alpha = _operands(300, 200, 512, "ue5m3", "random", 2, device="cuda", block=32)
    _check(ops, alpha, "ue5m3", "probe_matched", block=32, n=NG)
