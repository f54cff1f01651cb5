"""fp4ref.chain_triton (the Triton path of ``blackwell-mxf4nvf4``) == the torch emulator
(``mxf4nvf4_chain(backend="torch")``: ``fp4ref.gemm.emulate`` under the ``blackwell_mxf4nvf4``
preset), bit for bit; single instructions also == ``reference.mma`` (exact Fractions).

Without CUDA the kernels run in the Triton interpreter (numpy dots: the logic, not the
hardware's adds), in a process of their own: TRITON_INTERPRET=1 must be set before Triton is
imported, so tests/test_interpreter.py (MODULES) starts ``pytest -m triton_interpret`` on this
file with it, as for the other Triton modules.  Each test
asserts which paths (FAST / MEDIUM / GENERAL, ``counts``) it exercised.  On a GPU:
    python -m pytest -q -m gpu tests/test_chain_triton.py
compares 256x192x1024 outputs in full and 1000x777x4096 on sampled rows with the emulator.
"""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings, strategies as st

triton = pytest.importorskip("triton")

from fp4ref import chain_triton as CT  # noqa: E402
from fp4ref.cast import pack_fp4  # noqa: E402
from fp4ref.scaled_gemm import mxf4nvf4_chain, scaled_mm, swizzle_128x4  # noqa: E402
from reference import mma as RM  # noqa: E402

interp = pytest.mark.triton_interpret
N_HYP = max(6, settings.default.max_examples // 10)    # ci: 6, thorough: 200
BYTES = {"ue4m3": {"narrow": (48, 64), "mid": (40, 72), "wide": (0, 256), "tiny": (0, 24)},
         "ue8m0": {"narrow": (120, 135), "mid": (100, 156), "wide": (0, 256), "tiny": (0, 30),
                   "huge": (225, 256)}}
CODES = ("rand", "sparse", "negzero", "big")
OUT = (torch.float32, torch.bfloat16, torch.float16)


# --- operands --------------------------------------------------------------------

def _codes(g, shape, kind: str) -> torch.Tensor:
    c = torch.randint(0, 16, shape, generator=g, dtype=torch.uint8)
    if kind == "sparse":    # mostly +0: zero groups, exact zero sums
        c[torch.rand(shape, generator=g) < 0.7] = 0
    elif kind == "negzero":  # mostly -0: -0 products
        c[torch.rand(shape, generator=g) < 0.8] = 8
    elif kind == "big":     # +-4, +-6 only: group sums near 576
        c = torch.randint(6, 8, shape, generator=g, dtype=torch.uint8) \
            | (torch.randint(0, 2, shape, generator=g, dtype=torch.uint8) << 3)
    return c


def _scales(g, shape, sf: str, kind: str, nan: float = 0.0) -> torch.Tensor:
    lo, hi = BYTES[sf][kind]
    s = torch.randint(lo, hi, shape, generator=g, dtype=torch.int64).to(torch.uint8)
    if nan:
        s[torch.rand(shape, generator=g) < nan] = 0x7F if sf == "ue4m3" else 0xFF
    return s


def operands(seed, M, N, K, sf, block, ka, kb, ca="rand", cb="rand", cancel=False,
             zero_row=False, nan=0.0):
    """Codes a [M, K], b [K, N] and scale bytes sa [M, K/block], sb [K/block, N].
    cancel (K >= 192): small scales in instructions 0 and 1, instruction 1 of b undoing groups
    0-2 of instruction 0, so C is a tiny group term with bits below the step of instruction 2,
    whose scales are large and whose data are zero in half the columns: C must be cut there
    (MEDIUM, or GENERAL), and the cut shows in the result."""
    g = torch.Generator().manual_seed(seed)
    a, b = _codes(g, (M, K), ca), _codes(g, (K, N), cb)
    sa, sb = _scales(g, (M, K // block), sf, ka, nan), _scales(g, (K // block, N), sf, kb, nan)
    if cancel and K >= 192:
        # ue4m3 1.125 * 2^-6 and 1.75 * 2^8; ue8m0 2^-6 and 2^12
        small, large = (9, 126) if sf == "ue4m3" else (121, 139)
        j1, j2, j3 = 64 // block, 128 // block, 192 // block
        sa[:, :j2], sb[:j2] = small, small
        sa[:, j2:j3], sb[j2:j3] = large, large
        b[64:112] = b[:48] ^ 8
        b[112:128] = 0
        b[128:192, : (N + 1) // 2] = 0
    if zero_row:
        a[M // 2] = 0
    return a, b, sa, sb


def run(a, b, sa, sb, sf, block, alpha=None, out_dtype=torch.float32) -> torch.Tensor:
    """chain_mm == the torch emulator, bit for bit (first mismatch with its raw bytes);
    returns the path counts (FAST, MEDIUM, GENERAL steps)."""
    counts = torch.zeros(3, dtype=torch.int32, device=a.device)
    got = CT.chain_mm(a, b.t(), sa, sb.t(), scale_format=sf, block=block, alpha=alpha,
                      out_dtype=out_dtype, counts=counts)
    ref = mxf4nvf4_chain(a, b, sa, sb, scale_format=sf, block=block, alpha=alpha,
                         out_dtype=out_dtype, backend="torch")
    same_bits(got, ref, a, b, sa, sb)
    return counts.cpu()


def same_bits(got, ref, a=None, b=None, sa=None, sb=None):
    it = torch.int32 if got.dtype == torch.float32 else torch.int16
    bad = got.view(it) != ref.view(it)
    if bool(bad.any()):
        i, j = bad.nonzero()[0].tolist()
        raw = "" if a is None else (f"; a row {a[i].tolist()}, b col {b[:, j].tolist()}, scale_a "
                                    f"{sa[i].tolist()}, scale_b {sb[:, j].tolist()}")
        pytest.fail(f"{int(bad.sum())} of {bad.numel()} outputs differ; first ({i}, {j}): "
                    f"triton {got[i, j].item()!r} bits {got.view(it)[i, j].item() & 0xFFFFFFFF:#x}"
                    f", emulator {ref[i, j].item()!r} bits "
                    f"{ref.view(it)[i, j].item() & 0xFFFFFFFF:#x}{raw}")


# --- interpreter (CPU) or compiled (GPU) kernels on small shapes --------------------

PATH_CASES = [
    ("ue4m3", 16, "narrow", "narrow", "rand", False, 0),     # FAST only
    ("ue4m3", 16, "narrow", "mid", "rand", True, 1),         # a tiny C to cut: MEDIUM
    ("ue4m3", 16, "wide", "mid", "rand", False, 2),          # wide scales, NaN: GENERAL
    ("ue8m0", 32, "narrow", "narrow", "big", True, 1),
    ("ue8m0", 32, "wide", "wide", "rand", False, 2),
    ("ue8m0", 16, "tiny", "tiny", "negzero", False, 2),      # subnormal / -0 results
    ("ue8m0", 32, "huge", "mid", "big", False, 2),           # overflow to Inf
]


@interp
@pytest.mark.parametrize("sf,block,ka,kb,codes,cancel,path", PATH_CASES)
def test_paths(sf, block, ka, kb, codes, cancel, path):
    a, b, sa, sb = operands(7, 24, 21, 192, sf, block, ka, kb, codes, codes, cancel=cancel,
                            zero_row=cancel, nan=0.03 if ka == "wide" else 0.0)
    counts = run(a, b, sa, sb, sf, block)
    assert counts[path] > 0, counts


@interp
@pytest.mark.parametrize("mode", CT.GENERAL_MODES)
@pytest.mark.parametrize("sf,block,ka,kb,codes", [("ue4m3", 16, "wide", "mid", "rand"),
                                                   ("ue8m0", 32, "wide", "wide", "rand")])
def test_general_modes(mode, sf, block, ka, kb, codes, monkeypatch):
    """GENERAL's two ways to the group dots (per-group loads, masked TMA tiles) both equal
    the emulator (``run`` compares every output)."""
    monkeypatch.setenv("FP4REF_CHAIN_GENERAL", mode)
    a, b, sa, sb = operands(11, 24, 21, 192, sf, block, ka, kb, codes, codes, nan=0.03)
    assert run(a, b, sa, sb, sf, block)[2] > 0


@interp
@pytest.mark.parametrize("sf,block,ka,kb", [("ue4m3", 16, "wide", "mid"),
                                            ("ue8m0", 32, "wide", "wide")])
def test_full_split(sf, block, ka, kb, monkeypatch):
    """The GENERAL-capable kernel on quarter blocks (full_split 2: each takes its paths from
    its statistics block's bounds and its own C) equals the emulator, ragged edges included."""
    monkeypatch.setenv("FP4REF_CHAIN_CONFIG", "64,64,4,1,2,4,2")
    a, b, sa, sb = operands(13, 70, 45, 192, sf, block, ka, kb, nan=0.03)
    assert run(a, b, sa, sb, sf, block)[2] > 0


@interp
@pytest.mark.parametrize("gen", ["1,4,2", "2,2,3", "4,1,1"])
@pytest.mark.parametrize("sf,block,ka,kb", [("ue4m3", 16, "wide", "wide"),
                                            ("ue8m0", 32, "wide", "wide"),
                                            ("ue8m0", 16, "tiny", "tiny")])
def test_general_kernel(gen, sf, block, ka, kb, monkeypatch):
    """The GENERAL-only kernel (blocks with no FAST instruction), its columns split 1, 2 or 4
    ways, 1-3 pipeline stages, equals the emulator, ragged edges included; all 3 steps of
    each of the 5 x 3 statistics blocks (16 x 16) holding outputs are GENERAL (blocks past M
    or N count too, on any path)."""
    monkeypatch.setenv("FP4REF_CHAIN_CONFIG", "32,32,4,1,2,4,1," + gen)
    a, b, sa, sb = operands(17, 70, 45, 192, sf, block, ka, kb, nan=0.03)
    counts = run(a, b, sa, sb, sf, block)
    assert counts[2] >= 3 * 5 * 3, counts


@interp
@pytest.mark.parametrize("sf,block", [("ue4m3", 16), ("ue8m0", 32)])
def test_plan_flags(sf, block, monkeypatch):
    """One call with block pairs of all three plan flags (16-row statistics blocks and 32-row
    tiles in the interpreter; 3 instructions): rows 0-15 wide scales (no FAST instruction:
    the GENERAL-only kernel), 16-31 wide from instruction 2 (FAST, then GENERAL: the
    GENERAL-capable kernel), 32-47 wide from instruction 1 (2 of 3 instructions not FAST:
    the GENERAL-only kernel at gen_pct 60, the GENERAL-capable one at 100), 48-79 narrow (FAST:
    in a flagged tile, then a tile of its own)."""
    a, b, sa, sb = operands(19, 80, 24, 192, sf, block, "narrow", "narrow")
    if sf == "ue8m0":   # scales 1 and 2: FAST's bounds hold for every narrow block pair
        sa, sb = (torch.randint(127, 129, s.shape, dtype=torch.uint8) for s in (sa, sb))
    wide = operands(23, 80, 24, 192, sf, block, "wide", "wide")[2]
    for rows, p in ((slice(0, 16), 0), (slice(16, 32), 2), (slice(32, 48), 1)):
        sa[rows, p * 64 // block:] = wide[rows, p * 64 // block:]
    counts = {}
    for pct in (60, 100):
        monkeypatch.setenv("FP4REF_CHAIN_CONFIG", f"32,32,4,1,2,4,1,2,4,2,{pct}")
        counts[pct] = run(a, b, sa, sb, sf, block)
    assert counts[60][0] > 0 and counts[60][2] > 0, counts
    # rows 32-47's instruction 0: FAST at 100, GENERAL at 60 (2 column blocks of 16 hold N)
    assert counts[100][0] - counts[60][0] == counts[60][2] - counts[100][2] == 2, counts


def test_parse_config():
    assert CT.parse_config("128,128,8,3,8,4,2") == dict(
        BM=128, BN=128, num_warps=8, num_stages=3, GROUP_M=8, full_warps=4, full_split=2)
    assert CT.parse_config("128,128,8,3,8,4,2,4,4,2,50")["gen_pct"] == 50
    with pytest.raises(ValueError, match="X: full_split=3; valid choices: 1, 2"):
        CT.parse_config("128,128,8,3,8,4,3", "X")
    with pytest.raises(ValueError, match="X: gen_split=3; valid choices: 1, 2, 4"):
        CT.parse_config("128,128,8,3,8,4,1,3", "X")
    with pytest.raises(ValueError, match="X: gen_stages=0; valid choices: integers >= 1"):
        CT.parse_config("128,128,8,3,8,4,1,2,8,0", "X")
    with pytest.raises(ValueError, match="X: gen_pct=0; valid choices: 1 to 100"):
        CT.parse_config("128,128,8,3,8,4,1,2,8,3,0", "X")
    with pytest.raises(ValueError, match="X: '1,2' is not 'BM,BN,num_warps,num_stages"):
        CT.parse_config("1,2", "X")


@pytest.mark.skipif(CT.interpreting(), reason="the interpreter's small tiles have no minimum")
def test_config_block_minimum(monkeypatch):
    """Compiled dots need blocks of at least 16 x 16: a config below that is refused, by name."""
    monkeypatch.setenv("FP4REF_CHAIN_CONFIG", "64,64,8,3,8,4,2,4")
    with pytest.raises(ValueError, match=r"FP4REF_CHAIN_CONFIG: '64,64,8,3,8,4,2,4' gives "
                                         r"16 x 16 blocks \(16 x 4 GENERAL-only\)"):
        CT._config()
    monkeypatch.setenv("FP4REF_CHAIN_CONFIG", "64,64,8,3,8,4,2,1")
    assert CT._config()["gen_split"] == 1


def test_general_mode_choices(monkeypatch):
    monkeypatch.setenv("FP4REF_CHAIN_GENERAL", "fast")
    with pytest.raises(ValueError, match="FP4REF_CHAIN_GENERAL: unknown value 'fast'; "
                                         "valid choices: masked, slices"):
        CT._general_mode()


@interp
def test_negative_zero_chain():
    """-0 survives an instruction only if C is -0 and all 64 products are -0: instruction 0
    underflows a tiny negative sum to -0 (ue8m0 scales 2^-75), instruction 1 multiplies -0
    codes by +1 (all products -0: -0 stays), by -1 (+0 products: +0) or by +0 (-0 stays)."""
    a = torch.zeros(3, 128, dtype=torch.uint8)
    b = torch.zeros(128, 3, dtype=torch.uint8)
    a[:, 5], b[5, :] = 9, 1                    # -0.5 * 0.5 = -0.25 at scale 2^-150: -0
    a[:, 64:] = 8                              # -0 codes in instruction 1
    b[64:, 0], b[64:, 1], b[64:, 2] = 2, 10, 0   # +1, -1, +0
    sa = torch.tensor([[52, 52, 127, 127]] * 3, dtype=torch.uint8)
    sb = torch.tensor([[52] * 3] * 2 + [[127] * 3] * 2, dtype=torch.uint8)
    counts = run(a, b, sa, sb, "ue8m0", 32)
    got = CT.chain_mm(a, b.t(), sa, sb.t(), scale_format="ue8m0", block=32)
    assert got.view(torch.int32)[0].tolist() == [-2 ** 31, 0, -2 ** 31], got
    assert counts[2] > 0, counts


def neg0_chain(seed: int, M: int = 12, N: int = 10, NP: int = 6):
    """Operands whose -0 results come and go: each instruction draws a pattern (random codes
    at tiny ue8m0 scales 2^-83..2^-76, whose sums are cut to +-0 or the least subnormals; all
    products -0 (a's -0 codes times b's positive codes, or +0 codes times negative ones),
    which keep a -0; +0 codes in a (zero sums that turn -0 into +0); random codes at scale 1;
    mostly -0 codes) and its scales; block 32."""
    g = torch.Generator().manual_seed(seed)
    a = torch.randint(0, 16, (M, 64 * NP), generator=g, dtype=torch.uint8)
    b = torch.randint(0, 16, (64 * NP, N), generator=g, dtype=torch.uint8)
    sa = torch.randint(44, 52, (M, 2 * NP), generator=g, dtype=torch.int64).to(torch.uint8)
    sb = torch.randint(44, 52, (2 * NP, N), generator=g, dtype=torch.int64).to(torch.uint8)
    for p in range(NP):
        k, j = slice(64 * p, 64 * p + 64), slice(2 * p, 2 * p + 2)
        kind = int(torch.randint(0, 5, (1,), generator=g))
        if kind == 1:     # all products -0: -0 x positive, or +0 x negative
            a[:, k] = 8
            b[k] = b[k] & 7
            if int(torch.randint(0, 2, (1,), generator=g)):
                a[:, k], b[k] = 0, b[k] | 8
        elif kind == 2:   # zero sums, +0 products (some -0 columns too)
            a[:, k] = 0
        elif kind == 3:   # scale 1: a real sum, no underflow
            sa[:, j], sb[j] = 127, 127
        elif kind == 4:   # mostly -0 codes, tiny scales
            a[:, k][torch.rand(M, 64, generator=g) < 0.9] = 8
    return a, b, sa, sb


@interp
@pytest.mark.parametrize("seed", range(N_HYP))
def test_negative_zero_chains(seed):
    """The -0 rule over chains of instructions (``neg0_chain``): the kernel keeps -0 through
    zero sums and settles it after the loop from the last instruction whose products are not
    all -0; == the emulator's per-instruction rule, bit for bit."""
    a, b, sa, sb = neg0_chain(seed)
    run(a, b, sa, sb, "ue8m0", 32)


@interp
def test_subnormal_results():
    """Sums below 2^-126 round toward zero on FP32's subnormal grid, signs kept: ue8m0 scales
    2^-75 * 2^-75, products 1.5 and 3 (0.75 and 1.5 steps of 2^-149), +-."""
    a = torch.zeros(4, 64, dtype=torch.uint8)
    b = torch.zeros(64, 2, dtype=torch.uint8)
    a[:, 5] = torch.tensor([3, 5, 11, 13], dtype=torch.uint8)   # 1.5, 3, -1.5, -3
    b[5, 0], b[5, 1] = 2, 6                                      # 1, 4
    sa = torch.full((4, 2), 52, dtype=torch.uint8)
    sb = torch.full((2, 2), 52, dtype=torch.uint8)
    run(a, b, sa, sb, "ue8m0", 32)
    got = CT.chain_mm(a, b.t(), sa, sb.t(), scale_format="ue8m0", block=32)
    assert got.view(torch.int32)[:, 0].tolist() == [0, 1, -2 ** 31, -2 ** 31 + 1], got


@interp
@pytest.mark.parametrize("tiny,path", [(9, 2), (17, 0)])
def test_zero_group_sets_the_step(tiny, path):
    """Group 0 holds zeros under 1.75 * 2^8 scales: its scale exponent sum 16 still sets the
    step 2^-19 that cuts the tiny-scaled groups 1-3 (1.125 * 2^-6, sum -12: spread 28,
    GENERAL); with 2^-5 scales (spread 26) nothing is cut and FAST holds."""
    a, b, sa, sb = operands(19, 20, 18, 64, "ue4m3", 16, "mid", "mid", "big", "rand")
    a[:, :16], b[:16] = 0, 0
    sa[:, 0], sb[0] = 126, 126
    sa[:, 1:], sb[1:] = tiny, tiny
    counts = run(a, b, sa, sb, "ue4m3", 16)
    assert counts[path] > 0, counts


@interp
def test_large_c_cuts_small_terms():
    """A large C (instruction 0, scales 1.75 * 2^8) sets the step of instruction 1, whose own
    scales (1.125 * 2^-6, no spread) are tiny: its group terms are cut (a -2^-14-ish sum to 0,
    so RZ(C + D) would be one ulp off), GENERAL by the bound on |C|."""
    a, b, sa, sb = operands(23, 16, 12, 128, "ue4m3", 16, "mid", "mid", "big", "big")
    sa[:, :4], sb[:4] = 126, 126
    sa[:, 4:], sb[4:] = 9, 9
    a[:, 64:], b[64:] = 0, 0
    a[:, 70], b[70] = 9, 1                      # one product -0.5 * 0.5 in instruction 1
    counts = run(a, b, sa, sb, "ue4m3", 16)
    assert counts[2] > 0, counts


@interp
def test_one_quarter_needs_general():
    """Only block pair (rows 0-15, columns 16-31) of an interpreter tile (32 x 32, quarters of
    16) spreads its scale exponent sums over 28 (group 0: 2^8 * 2^8 on zero data, groups
    1-3: (1.125 * 2^-6)^2, cut at 2^-19): the whole tile must take the GENERAL kernel."""
    a, b, sa, sb = operands(29, 32, 32, 64, "ue4m3", 16, "mid", "mid")
    sa[:], sb[:] = 9, 9
    sa[:16, 0], sb[0, 16:] = 120, 120
    a[:16, :16], b[:16, 16:] = 0, 0
    counts = run(a, b, sa, sb, "ue4m3", 16)
    assert counts[2] > 0, counts


@interp
@pytest.mark.parametrize("side", ["a", "b"])
def test_every_e4m3_scale_byte(side):
    """All 256 e4m3 bytes as scales of one operand (sign bit ignored, 0x7F / 0xFF NaN,
    subnormals, zero), every one meeting every kind of e2m1 code."""
    g = torch.Generator().manual_seed(3)
    perm = torch.randperm(256, generator=g).to(torch.uint8).view(64, 4)
    a, b, sa, sb = operands(5, 64, 9, 64, "ue4m3", 16, "mid", "mid")
    if side == "a":
        sa = perm
    else:
        a, b, sa, sb = operands(5, 9, 64, 64, "ue4m3", 16, "mid", "mid")
        sb = perm.t().contiguous()
    counts = run(a, b, sa, sb, "ue4m3", 16)
    assert counts[2] > 0, counts


@interp
@pytest.mark.parametrize("out_dtype,alpha", [(torch.float32, -2.0 ** -7),
                                             (torch.bfloat16, 0.75),
                                             (torch.float16, 2.0 ** 100),
                                             (torch.bfloat16, 1.0e-38)])
def test_epilogue(out_dtype, alpha):
    """alpha (one FP32 RNE product; tiny: subnormal; huge: Inf), out_dtype RNE, NaN rows."""
    al = float(torch.tensor(alpha, dtype=torch.float32))
    a, b, sa, sb = operands(11, 17, 19, 128, "ue4m3", 16, "mid", "wide", nan=0.02)
    run(a, b, sa, sb, "ue4m3", 16, alpha=al, out_dtype=out_dtype)


@interp
@pytest.mark.parametrize("recipe", ["nvfp4", "mxfp4"])
def test_scaled_mm_operands(recipe):
    """torch._scaled_mm's packed operands and swizzled scales, as fp4ref.scaled_mm takes them:
    the kernel's prepass reads the packed bytes directly."""
    sf, block, sdt = (("ue4m3", 16, torch.float8_e4m3fn) if recipe == "nvfp4"
                      else ("ue8m0", 32, torch.float8_e8m0fnu))
    M, N, K = 19, 22, 128
    a, b, sa, sb = operands(13, M, N, K, sf, block, "mid", "wide" if sf == "ue4m3" else "mid")
    A, W = pack_fp4(a), pack_fp4(b.t().contiguous())
    SA, SB = swizzle_128x4(sa).view(sdt), swizzle_128x4(sb.t().contiguous()).view(sdt)
    got = CT.chain_mm(A, W, sa, sb.t(), scale_format=sf, block=block, alpha=0.5,
                      out_dtype=torch.bfloat16)
    ref = scaled_mm(A.view(torch.float4_e2m1fn_x2), W.view(torch.float4_e2m1fn_x2).t(), SA, SB,
                    alpha=0.5, out_dtype=torch.bfloat16)
    same_bits(got, ref)


@interp
@pytest.mark.parametrize("sf,block", [("ue4m3", 16), ("ue8m0", 32), ("ue8m0", 16)])
def test_one_instruction_equals_reference_mma(sf, block):
    """K = 64 from C = +0 is one kind::mxf4nvf4 instruction: reference.mma (exact Fractions,
    one element at a time) on uniformly random codes and scale bytes."""
    g = torch.Generator().manual_seed(17)
    M, N = 8, 6
    a = torch.randint(0, 16, (M, 64), generator=g, dtype=torch.uint8)
    b = torch.randint(0, 16, (64, N), generator=g, dtype=torch.uint8)
    sa = torch.randint(0, 256, (M, 64 // block), generator=g, dtype=torch.int64).to(torch.uint8)
    sb = torch.randint(0, 256, (64 // block, N), generator=g, dtype=torch.int64).to(torch.uint8)
    got = CT.chain_mm(a, b.t(), sa, sb.t(), scale_format=sf, block=block)
    ref = RM.mma("mxf4nvf4", a.tolist(), b.tolist(), [[0] * N for _ in range(M)], sa.tolist(),
                 sb.tolist(), scale_format=sf, block=block)
    same_bits(got, torch.tensor(ref, dtype=torch.int64).to(torch.int32).view(torch.float32),
              a, b, sa, sb)


@interp
@settings(max_examples=N_HYP, deadline=None)
@given(st.data())
def test_drawn_operands(data):
    """Hypothesis-drawn adversarial distributions: scale byte ranges per operand (NaN,
    subnormal, zero, huge), code distributions, cancelling instructions, zero rows, shapes."""
    sf = data.draw(st.sampled_from(["ue4m3", "ue8m0"]), label="scale_format")
    block = data.draw(st.sampled_from(CT.SCALE_BLOCKS[sf]), label="block")
    M, N = data.draw(st.integers(1, 40), label="M"), data.draw(st.integers(1, 40), label="N")
    K = data.draw(st.sampled_from([64, 128, 192]), label="K")
    ka, kb = (data.draw(st.sampled_from(sorted(BYTES[sf])), label=f"scales_{s}") for s in "ab")
    ca, cb = (data.draw(st.sampled_from(CODES), label=f"codes_{s}") for s in "ab")
    alpha = data.draw(st.sampled_from([None, 0.75, -1.0, 2.0 ** -130]), label="alpha")
    out = data.draw(st.sampled_from(OUT), label="out_dtype")
    a, b, sa, sb = operands(data.draw(st.integers(0, 2 ** 16), label="seed"), M, N, K, sf,
                            block, ka, kb, ca, cb, cancel=data.draw(st.booleans(), label="cancel"),
                            zero_row=data.draw(st.booleans(), label="zero_row"),
                            nan=data.draw(st.sampled_from([0.0, 0.05]), label="nan"))
    al = None if alpha is None else float(torch.tensor(alpha, dtype=torch.float32))
    run(a, b, sa, sb, sf, block, alpha=al, out_dtype=out)


# --- dispatch and arguments (no kernel runs) ------------------------------------------

def test_backend_choices():
    a = torch.zeros(2, 64, dtype=torch.uint8)
    b = torch.zeros(64, 3, dtype=torch.uint8)
    sa, sb = torch.full((2, 4), 56, dtype=torch.uint8), torch.full((4, 3), 56, dtype=torch.uint8)
    with pytest.raises(ValueError, match="backend: unknown value 'cuda'.*valid choices: auto"):
        mxf4nvf4_chain(a, b, sa, sb, scale_format="ue4m3", block=16, backend="cuda")
    assert mxf4nvf4_chain(a, b, sa, sb, scale_format="ue4m3", block=16,
                          backend="torch").tolist() == [[0.0] * 3] * 2
    if not (torch.cuda.is_available() or CT.interpreting()):
        with pytest.raises(ValueError, match="backend: 'triton' needs Triton and CUDA"):
            mxf4nvf4_chain(a, b, sa, sb, scale_format="ue4m3", block=16, backend="triton")
        with pytest.raises(ValueError, match="chain_mm: needs Triton and a CUDA device"):
            CT.chain_mm(a, b.t(), sa, sb.t(), scale_format="ue4m3", block=16)


def test_chain_mm_arguments():
    if not (torch.cuda.is_available() or CT.interpreting()):
        pytest.skip("chain_mm checks its arguments where it can run")
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    a = torch.zeros(2, 32, dtype=torch.uint8, device=dev)
    sa = torch.full((2, 4), 56, dtype=torch.uint8, device=dev)
    with pytest.raises(ValueError, match="scale_format: unknown value 'e4m3'.*ue4m3, ue8m0"):
        CT.chain_mm(a, a, sa, sa, scale_format="e4m3", block=16)
    with pytest.raises(ValueError, match="block: unknown value 32 for scale_format 'ue4m3'"):
        CT.chain_mm(a, a, sa, sa, scale_format="ue4m3", block=32)
    with pytest.raises(ValueError, match="alpha: 0.1 is not a finite FP32 value"):
        CT.chain_mm(a, a, sa, sa, scale_format="ue4m3", block=16, alpha=0.1)
    with pytest.raises(ValueError, match=r"bt: shape \[2, 20\] does not match \[2, 32\]"):
        CT.chain_mm(a, a[:, :20].contiguous(), sa, sa, scale_format="ue4m3", block=16)


# The triton_interpret tests above run in a child process with TRITON_INTERPRET=1:
# tests/test_interpreter.py (MODULES).


# --- GPU: the compiled kernels on larger shapes ------------------------------------------

def _gaussian(M, N, K, fmt, seed):
    from fp4ref.gemm_triton import quantize_operand
    g = torch.Generator().manual_seed(seed)
    x, w = torch.randn(M, K, generator=g), torch.randn(N, K, generator=g)
    ac, asc, ta = quantize_operand(x, fmt)
    bc, bsc, tb = quantize_operand(w, fmt)
    return ac, bc.t().contiguous(), asc, bsc.t().contiguous(), ta * tb


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["nvfp4", "mxfp4", "wide", "wide-mx", "tiny-mx", "cancel"])
def test_gpu_full_compare(kind):
    """256 x 192 x 1024, every output against the emulator (on the same GPU)."""
    M, N, K = 256, 192, 1024
    if kind in ("nvfp4", "mxfp4"):
        a, b, sa, sb, al = _gaussian(M, N, K, kind, 1)
        sf, block = ("ue4m3", 16) if kind == "nvfp4" else ("ue8m0", 32)
        al = float(torch.tensor(al, dtype=torch.float32))
    else:
        sf, block = ("ue4m3", 16) if kind in ("wide", "cancel") else ("ue8m0", 32)
        ka = {"wide": "wide", "wide-mx": "wide", "tiny-mx": "tiny", "cancel": "narrow"}[kind]
        a, b, sa, sb = operands(2, M, N, K, sf, block, ka, ka if kind != "cancel" else "mid",
                                "negzero" if kind == "tiny-mx" else "rand",
                                cancel=kind == "cancel", zero_row=True, nan=0.01)
        al = None
    cuda = [t.cuda() for t in (a, b, sa, sb)]
    counts = run(*cuda, sf, block, alpha=al)
    if kind in ("nvfp4", "mxfp4"):
        assert counts[0] > counts[2], counts   # Gaussian operands: mostly FAST


@pytest.mark.gpu
@pytest.mark.parametrize("config", ["", "128,128,8,3,8,8,1"])
def test_gpu_negative_zero_chains(config, monkeypatch):
    """``neg0_chain`` operands over several blocks (200 x 150, 12 instructions), 20 seeds,
    every output against the emulator: the -0 settled after the loop."""
    if config:
        monkeypatch.setenv("FP4REF_CHAIN_CONFIG", config)
    for seed in range(20):
        a, b, sa, sb = neg0_chain(100 + seed, 200, 150, 12)
        run(*[t.cuda() for t in (a, b, sa, sb)], "ue8m0", 32)


@pytest.mark.gpu
@pytest.mark.parametrize("config", ["", "128,128,8,3,8,8,1", "128,128,8,3,8,4,2",
                                    "128,128,8,3,8,8,2", "128,128,8,3,8,16,1,4,4,3"])
@pytest.mark.parametrize("sf,block,ka,kb,codes,cancel,path", PATH_CASES)
def test_gpu_paths(sf, block, ka, kb, codes, cancel, path, config, monkeypatch):
    """The interpreter's path cases compiled (PTX cvt.rz / mul.rz / add.rz, the tensor-core
    dots), at 200 x 150 x 512 under each GENERAL-capable kernel shape and the GENERAL-only
    kernel on 64 x 32 (default) and 64 x 16 blocks; plus ten more seeds of every scale range
    and code kind for GENERAL.  MEDIUM cases again at gen_pct 100: by default their mixed
    blocks run GENERAL throughout, and MEDIUM's cut in the GENERAL-capable kernel needs them
    (replayed in the interpreter under this tiling: MEDIUM at 100, none at 1)."""
    a, b, sa, sb = operands(7, 200, 150, 512, sf, block, ka, kb, codes, codes, cancel=cancel,
                            zero_row=cancel, nan=0.03 if ka == "wide" else 0.0)
    cfg = dict(CT.CONFIG, **(CT.parse_config(config) if config else {}))
    for pct in (cfg["gen_pct"], 100) if path == 1 else (cfg["gen_pct"],):
        monkeypatch.setenv("FP4REF_CHAIN_CONFIG",
                           ",".join(str(dict(cfg, gen_pct=pct)[k]) for k in CT.CONFIG_KEYS))
        counts = run(*(t.cuda() for t in (a, b, sa, sb)), sf, block)
    assert counts[path] > 0, counts
    if path == 2:
        for seed in range(10):
            c = CODES[seed % len(CODES)]
            a, b, sa, sb = operands(100 + seed, 130, 70, 256, sf, block, ka, kb, c, c,
                                    zero_row=True, nan=0.01 * (seed % 3))
            run(*(t.cuda() for t in (a, b, sa, sb)), sf, block)


@pytest.mark.gpu
@pytest.mark.parametrize("out_dtype,alpha", [(torch.float32, 1.0e-38), (torch.bfloat16, -0.75),
                                             (torch.float16, 2.0 ** 100)])
def test_gpu_epilogue(out_dtype, alpha):
    """alpha (subnormal products, overflow), out_dtype, NaN rows / columns on the GPU."""
    al = float(torch.tensor(alpha, dtype=torch.float32))
    a, b, sa, sb = operands(4, 192, 160, 256, "ue4m3", 16, "mid", "wide", nan=0.01)
    run(*(t.cuda() for t in (a, b, sa, sb)), "ue4m3", 16, alpha=al, out_dtype=out_dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_gpu_odd_shape_sampled_rows(fmt):
    """1000 x 777 x 4096 (edge tiles in both dimensions) through fp4ref.scaled_mm's CUDA
    dispatch, 24 sampled rows against the emulator."""
    M, N, K = 1000, 777, 4096
    a, b, sa, sb, al = _gaussian(M, N, K, fmt, 2)
    sf, block, sdt = (("ue4m3", 16, torch.float8_e4m3fn) if fmt == "nvfp4"
                      else ("ue8m0", 32, torch.float8_e8m0fnu))
    A = pack_fp4(a).cuda().view(torch.float4_e2m1fn_x2)
    W = pack_fp4(b.t().contiguous()).cuda().view(torch.float4_e2m1fn_x2)
    SA = swizzle_128x4(sa).view(sdt).cuda()
    SB = swizzle_128x4(sb.t().contiguous()).view(sdt).cuda()
    got = scaled_mm(A, W.t(), SA, SB, alpha=al, out_dtype=torch.bfloat16)
    rows = torch.randperm(M, generator=torch.Generator().manual_seed(3))[:24]
    ref = mxf4nvf4_chain(a[rows].cuda(), b.cuda(), sa[rows].cuda(), sb.cuda(), scale_format=sf,
                         block=block, alpha=al, out_dtype=torch.bfloat16, backend="torch")
    same_bits(got[rows.cuda()], ref)
