"""The WIDE route of fp4ref.gemm_triton (tiles failing the PAIR / BLOCK certificates: the four
block dots of a group summed exactly in float64 with TwoSum, rounded once to FP32 through
round-to-odd), bit for bit against two oracles:

* ``_wide_oracle``: exact Fractions, rounded by ``reference.gemm.round_fp32`` (RNE per group,
  RTZ across groups), fed the WIDE kernel directly with crafted bf16 operands whose block dots
  span the whole float32 range: ties at the FP32 rounding, values one float64 ulp off a
  midpoint (the double-rounding traps), cancellation, spans beyond 104 bits (the kernel must
  flag those tiles: its proof does not cover them).
* ``fp4ref.gemm.emulate`` (whole output) and ``reference.gemm.dot`` (sampled outputs) on
  block-scaled operands drawn by hypothesis: heavy tails, every scale code (subnormal scales,
  wide spreads), zero blocks, nearby scales (ties), cancelling rows; and every route forced
  on the same data (None / pair / block / wide / fix) gives identical bits.

Without CUDA the kernels run in the Triton interpreter (marker triton_interpret; run by
tests/test_interpreter.py in a process of its own, or directly:
``TRITON_INTERPRET=1 python -m pytest -q -m triton_interpret tests/test_gemm_triton_wide.py``).
On a GPU (marker gpu): ``python -m pytest -q -m gpu tests/test_gemm_triton_wide.py``."""
from __future__ import annotations

import zlib
from fractions import Fraction

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

triton = pytest.importorskip("triton")

from fp4ref import gemm_triton as GT  # noqa: E402
from fp4ref.gemm_triton.tables import wide_exact, wide_span  # noqa: E402
from fp4ref.gemm_triton.launch import kernels  # noqa: E402
from reference.exact import Exact, Kind  # noqa: E402
from reference.gemm import round_fp32  # noqa: E402
from reference.rounding import Mode  # noqa: E402

from .gemm_helpers import check_sampled, ref_blockscaled, same_bits, sample_positions  # noqa: E402

FORCES = (None, "pair", "block", "wide", "fix")
FORCES_INTERP = (None, "block", "wide", "fix")   # "pair" is the routing's own choice (None)
KINDS = ("heavy", "every_code", "subnormal", "zero_blocks", "narrow", "cancel")
SFMT = {"nvfp4": "ue4m3", "ue5m3": "ue5m3"}
SCALE_CODES = {"ue4m3": (0, 127), "ue5m3": (0, 248)}   # finite codes [lo, hi)
SUBNORMAL = {"ue4m3": (0, 8), "ue5m3": (0, 8)}           # subnormal scale codes (and zero)
NARROW = {"ue4m3": (56, 60), "ue5m3": (120, 124)}


def interp(f):
    f = pytest.mark.skipif(torch.cuda.is_available(),
                           reason="interpreter tests run without CUDA")(f)
    return pytest.mark.triton_interpret(f)


# ------------------------------------------------------------------ the exact oracle
def _fp32(x: Fraction, mode: Mode) -> Fraction:
    return round_fp32(Exact(Kind.FINITE, x < 0, abs(x)), mode).to_fraction()


def _wide_oracle(A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    """C = A @ B^T under probe_matched (groups of 64: exact sum, RNE to FP32; RTZ across),
    from exact Fractions of the bf16 inputs.  float32 [M, N]."""
    M, K = A.shape
    N = B.shape[0]
    a = [[Fraction(float(v)) for v in row] for row in A.float().tolist()]
    b = [[Fraction(float(v)) for v in row] for row in B.float().tolist()]
    out = torch.empty(M, N, dtype=torch.float32)
    for i in range(M):
        for j in range(N):
            acc = Fraction(0)
            for g in range(0, K, 64):
                s = sum((a[i][k] * b[j][k] for k in range(g, min(g + 64, K))), Fraction(0))
                acc = _fp32(acc + _fp32(s, Mode.RNE), Mode.RTZ)
            out[i, j] = float(acc)
    return out


def _run_wide(A: torch.Tensor, B: torch.Tensor, BM=16, BN=16, exact=False):
    """The WIDE kernel on bf16 A [M, K], B [N, K], every tile: (C, per-tile flags).  exact:
    the kernel variant that relies on the span proof (no error check, no flags)."""
    M, K = A.shape
    N = B.shape[0]
    Mt, Nt = -(-M // BM), -(-N // BN)
    c = torch.full((M, N), float("nan"), dtype=torch.float32)
    flags = torch.zeros(Mt * Nt, dtype=torch.int32)
    tiles = torch.arange(Mt * Nt, dtype=torch.int64)
    kernels().wide[(Mt * Nt,)](A.contiguous(), B.contiguous(), c, flags, tiles, M, N, K, Nt, 1.0,
                               BM=BM, BN=BN, SBM=BM, SBN=BN, RZ=1, F32=True, ALPHA=False,
                               EXACT=exact, num_warps=4)
    return c, flags.view(Mt, Nt)


def _place(terms_a, terms_b, K):
    """bf16 rows whose block b holds a single product terms_a[b] * terms_b[b] (one element)."""
    a = torch.zeros(K, dtype=torch.float32)
    b = torch.zeros(K, dtype=torch.float32)
    for blk, (x, y) in enumerate(zip(terms_a, terms_b)):
        a[16 * blk + blk % 16] = x
        b[16 * blk + blk % 16] = y
    return a.to(torch.bfloat16), b.to(torch.bfloat16)


# the double-rounding traps: hi = RN64(x) lands on an FP32 midpoint, the remainder decides
TRAPS = [
    [(2.0 ** 12, 2.0 ** 12), (1.0, 1.0), (2.0 ** -30, 2.0 ** -30), (0.0, 0.0)],   # 2^24+1+tiny
    [(2.0 ** 12, 2.0 ** 12), (1.0, 1.0), (-2.0 ** -30, 2.0 ** -30), (0.0, 0.0)],  # 2^24+1-tiny
    [(2.0 ** 12, 2.0 ** 12), (1.0, 1.0), (0.0, 0.0), (0.0, 0.0)],                 # exact tie
    [(2.0 ** 12, 2.0 ** 12), (3.0, 1.0), (0.0, 0.0), (0.0, 0.0)],                 # tie, odd
    [(-2.0 ** 12, 2.0 ** 12), (-1.0, 1.0), (2.0 ** -30, 2.0 ** -30), (0.0, 0.0)],  # negative
    [(2.0 ** 60, 2.0 ** 60), (-2.0 ** 60, 2.0 ** 60), (1.5, 1.0), (2.0 ** -40, 1.0)],  # cancel
    [(2.0 ** 20, 2.0 ** 10), (2.0 ** -20, 2.0 ** -10), (-2.0 ** 20, 2.0 ** 10), (0.0, 0.0)],
    [(2.0 ** 13, 2.0 ** 12), (1.0, 1.0), (1.0, 2.0 ** -31), (0.0, 0.0)],          # 2^25+1+tiny
]


@interp
def test_wide_kernel_traps():
    """Hand-made groups around FP32 midpoints (where fl64 then fl32 would round twice) and
    exact cancellation: the WIDE kernel equals the exact oracle, and flags nothing."""
    K = 128
    rows = []
    for t in TRAPS:
        rows.append(_place([x for x, _ in t], [y for _, y in t], K))
    A = torch.stack([r[0] for r in rows])
    B = torch.stack([r[1] for r in rows])
    want = _wide_oracle(A, B)
    c, flags = _run_wide(A, B)
    assert not bool(flags.any())
    assert same_bits(c, want)
    assert same_bits(_run_wide(A, B, exact=True)[0], want)   # spans within the proof's
    naive = (A.double() @ B.double().t()).float()   # one fl64 then fl32: wrong on a trap
    assert not same_bits(torch.diagonal(c), torch.diagonal(naive))


@st.composite
def _term_rows(draw, n_rows: int, K: int):
    """bf16 rows of single-product blocks with exponents anywhere in [-60, 60] per side."""
    rows = []
    for _ in range(n_rows):
        a = torch.zeros(K)
        for blk in range(K // 16):
            if draw(st.integers(0, 5)) == 0:
                continue   # a zero block
            m = draw(st.integers(-255, 255))
            e = draw(st.integers(-60, 60))
            k = 16 * blk + draw(st.integers(0, 15))
            a[k] = m * 2.0 ** (e - 7)
        rows.append(a)
    return torch.stack(rows).to(torch.bfloat16)


@interp
@settings(max_examples=20)
@given(A=_term_rows(6, 128), B=_term_rows(5, 128))
def test_wide_kernel_hypothesis(A, B):
    """Block dots spanning up to 2**+-240 per group: unflagged tiles equal the exact oracle;
    a tile is flagged only where a group's spread makes the error terms inexact (> 104 bits,
    never for the block-scaled formats, ``wide_exact``)."""
    c, flags = _run_wide(A, B, BM=16, BN=16)
    want = _wide_oracle(A, B)
    if not bool(flags.any()):
        assert same_bits(c, want)


@interp
def test_wide_kernel_flags_wide_spans():
    """Three terms 2**100, 1, 2**-100 apart: the errors 1 and 2**-100 cannot sum exactly in
    float64, so the tile is flagged (and the fix-up would recompute it)."""
    t = [(2.0 ** 50, 2.0 ** 50), (1.0, 1.0), (2.0 ** -50, 2.0 ** -50), (0.0, 0.0)]
    a, b = _place([x for x, _ in t], [y for _, y in t], 64)
    c, flags = _run_wide(a[None], b[None])
    assert bool(flags.all())


def test_wide_span_proof():
    """H - L of the proof per scale format (package docstring): UE5M3 79 bits, UE4M3 / E4M3
    49, all <= 104 (the WIDE flags need no read-back); E8M0 522 (MXFP4 keeps its route)."""
    assert wide_span("ue5m3") == 79 and wide_span("ue4m3") == 49
    assert wide_span("float8_e4m3fn") == 49 and wide_span("float8_e8m0fnu") == 522
    assert wide_exact("ue5m3") and wide_exact("ue4m3") and not wide_exact("float8_e8m0fnu")


# ------------------------------------------------------------------ block-scaled operands
def _draw_operands(kind: str, fmt: str, M: int, N: int, K: int, seed: int):
    """(codes, scale codes) of both operands for one adversarial family, and alpha."""
    g = torch.Generator().manual_seed(seed)
    sfmt = SFMT[fmt]
    nb = K // 16
    if kind == "heavy":
        s = 1 + seed % 3
        x = torch.randn(M, K, generator=g) * torch.exp(s * torch.randn(M, K, generator=g))
        w = torch.randn(N, K, generator=g) * torch.exp(s * torch.randn(N, K, generator=g))
        ac, asc, ta = GT.quantize_operand(x, fmt)
        bc, bsc, tb = GT.quantize_operand(w, fmt)
        return [ac, asc, bc, bsc], [ta, tb]
    lo, hi = {"every_code": SCALE_CODES, "subnormal": SUBNORMAL, "zero_blocks": SCALE_CODES,
              "narrow": NARROW, "cancel": SCALE_CODES}[kind][sfmt]
    ac = torch.randint(0, 16, (M, K), generator=g, dtype=torch.uint8)
    bc = torch.randint(0, 16, (N, K), generator=g, dtype=torch.uint8)
    asc = torch.randint(lo, hi, (M, nb), generator=g).to(torch.uint8)
    bsc = torch.randint(lo, hi, (N, nb), generator=g).to(torch.uint8)
    if kind == "zero_blocks":
        za = (torch.rand(M, nb, generator=g) < 0.3).repeat_interleave(16, 1)
        ac[za] = 0
        asc[torch.rand(M, nb, generator=g) < 0.2] = 0
    if kind == "cancel":   # odd rows: the previous row with every sign flipped
        ac[1::2] = ac[0::2][: M // 2] ^ 8
        asc[1::2] = asc[0::2][: M // 2]
    return [ac, asc, bc, bsc], [0.75, 2.0 ** -7]


def _all_forces(ops, alpha, fmt, tile=(32, 32)):
    outs = {f: GT.blockscaled_mm(*ops, fmt=fmt, alpha=alpha, force=f, tile=tile)
            for f in FORCES_INTERP}
    for f, c in outs.items():
        assert same_bits(c, outs["fix"]), f"force={f} differs from force='fix'"
    return outs["wide"]


def _emulated(ops, alpha, fmt):
    from fp4ref.gemm import emulate
    ac, asc, bc, bsc = ops
    av, sa = GT.decode_operand(ac, asc, fmt)
    bv, sb = GT.decode_operand(bc, bsc, fmt)
    return emulate("probe_matched", av, bv.t(), scales_a=sa, scales_b=sb.t(), block=16,
                   alpha=alpha)


@interp
@settings(max_examples=6)
@given(kind=st.sampled_from(KINDS), fmt=st.sampled_from(sorted(SFMT)),
       seed=st.integers(0, 2 ** 16), shape=st.sampled_from([(24, 20, 208), (33, 16, 128)]))
def test_wide_route_hypothesis(kind, fmt, seed, shape):
    """Every forced route gives the same bits; they equal fp4ref.gemm.emulate on every output
    and reference.gemm.dot on sampled ones."""
    M, N, K = shape
    ops, alpha = _draw_operands(kind, fmt, M, N, K, seed)
    c = _all_forces(ops, alpha, fmt)
    assert same_bits(c, _emulated(ops, alpha, fmt))
    pos = sample_positions(M, N, 6, seed=zlib.crc32(f"{kind}{fmt}{seed}".encode()))
    want = ref_blockscaled("probe_matched", *ops, SFMT[fmt], 16, alpha, pos)
    check_sampled(c, want, pos, f"{fmt} {kind} seed {seed}")


@interp
@pytest.mark.parametrize("fmt", sorted(SFMT))
def test_wide_route_unforced(fmt):
    """Every finite scale code: the routing itself sends tiles to WIDE (asserted), with
    special rows (NaN / inf scales) still recomputed by the fix-up."""
    ops, alpha = _draw_operands("every_code", fmt, 40, 40, 192, seed=3)
    r = GT.route_stats(*ops, fmt=fmt, tile=(32, 32))
    assert r["wide"] > 0 and r["fix"] == 0, r
    ac, asc, bc, bsc = [t.clone() for t in ops]
    asc[5, 2] = {"nvfp4": 0x7F, "ue5m3": 0xFC}[fmt]
    bsc[7, 1] = {"nvfp4": 0x7F, "ue5m3": 0xF8}[fmt]
    ops = [ac, asc, bc, bsc]
    c = GT.blockscaled_mm(*ops, fmt=fmt, alpha=alpha, tile=(32, 32))
    pos = sample_positions(40, 40, 12, seed=5, rows=[5], cols=[7])
    check_sampled(c, ref_blockscaled("probe_matched", *ops, SFMT[fmt], 16, alpha, pos), pos)
    assert same_bits(c, GT.blockscaled_mm(*ops, fmt=fmt, alpha=alpha, tile=(32, 32), force="fix"))


# ------------------------------------------------------------------ GPU (compiled kernels)
gpu = pytest.mark.gpu


@gpu
@pytest.mark.parametrize("fmt", sorted(SFMT))
@pytest.mark.parametrize("kind", KINDS)
def test_gpu_wide_forced_routes(fmt, kind):
    """128x128 tiles on the compiled kernels: every forced route gives the same bits, equal to
    reference.gemm.dot on sampled outputs, ragged shape and a partial last group."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    M, N, K = 640, 384, 1024 + 80
    ops, alpha = _draw_operands(kind, fmt, M, N, K, seed=zlib.crc32(kind.encode()) % 997)
    ops = [t.cuda() for t in ops]
    outs = {f: GT.blockscaled_mm(*ops, fmt=fmt, alpha=alpha, force=f) for f in FORCES}
    for f, c in outs.items():
        assert same_bits(c, outs["fix"]), f"force={f}"
    pos = sample_positions(M, N, 24, seed=11)
    want = ref_blockscaled("probe_matched", *ops, SFMT[fmt], 16, alpha, pos)
    check_sampled(outs[None], want, pos, f"{fmt} {kind}")


@gpu
def test_gpu_wide_kernel_traps():
    """The midpoint traps and the flagged spread on the compiled WIDE kernel (float64 TwoSum
    in PTX, cvt.rn.f32.f64), against the exact oracle."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    rows = [_place([x for x, _ in t], [y for _, y in t], 128) for t in TRAPS]
    A = torch.stack([r[0] for r in rows])
    B = torch.stack([r[1] for r in rows])
    M, N, K = A.shape[0], B.shape[0], 128
    c = torch.empty(M, N, dtype=torch.float32, device="cuda")
    flags = torch.zeros(1, dtype=torch.int32, device="cuda")
    tiles = torch.zeros(1, dtype=torch.int64, device="cuda")
    for F32, exact in ((False, False), (True, False), (False, True)):
        kernels().wide[(1,)](A.cuda(), B.cuda(), c, flags, tiles, M, N, K, 1, 1.0, BM=16, BN=16,
                             SBM=16, SBN=16, RZ=0, F32=F32, ALPHA=False, EXACT=exact,
                             num_warps=4)
        assert int(flags[0]) == 0
        assert same_bits(c.cpu(), _wide_oracle(A, B))
