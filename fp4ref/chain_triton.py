"""Triton fast path of the emulated Blackwell ``kind::mxf4nvf4`` chain (issue 17, item 3).

    y = chain_mm(a, bt, scale_a, scale_bt, scale_format="ue4m3", block=16,
                 alpha=None, out_dtype=torch.float32)

computes ``fp4ref.scaled_mm(..., model="blackwell-mxf4nvf4")`` bit for bit on CUDA:
kind::mxf4nvf4 instructions of K = 64 chained along K from C = +0, then alpha (one FP32
RNE product) and out_dtype (RNE, NaN canonical).  ``a`` [M, K/2] and ``bt`` [N, K/2] are
packed e2m1 bytes (low nibble first; [M, K] / [N, K] one code per byte also accepted),
``scale_a`` [M, K/block] and ``scale_bt`` [N, K/block] raw scale bytes (row-major, not
swizzled).  ``fp4ref.scaled_mm`` and ``fp4ref.scaled_gemm.mxf4nvf4_chain`` call it on CUDA.

The model, per output (i, j) and instruction (docs/mma.md): C and the four group terms
T_g = S_g * sa_g * sb_g (S_g the exact sum of 16 e2m1 products) are aligned at
E = max(exp C, max_g es_g), es_g = exp(sa_g) + exp(sb_g) (C = 0 counts as 2^-126), each
truncated toward zero to a multiple of q = 2^(E - 35), summed exactly, and rounded toward
zero to FP32 (|sum| >= 2^128: Inf).  Any NaN scale of row i or column j: NaN.

How each step stays exact:

* Prepass (``_prep_kernel``, one launch per operand): A' = a * s_a (e2m1 value times its
  scale: <= 6 significant bits, exact in bf16; ue8m0 scales only where |exp| <= 48), the
  four group exponents of each row and instruction (one int32 word), and per block of 64
  rows and instruction the largest ||a'||^2 and the smallest / largest scale exponent.  A
  NaN scale decodes as 1 (exponent 0) and marks its row: the output there is NaN.
* ``_plan_kernel`` checks FAST's conditions for every (64 x 64 block, instruction) from those
  statistics alone: all products are multiples of 2^L (L = min es - 8) and Cauchy-Schwarz
  bounds every partial sum of the dot below 2^(L+23), so a tensor-core dot over K = 64 of
  A' and B' is the exact sum D of the four group terms (the H200's W25-truncating fused
  add loses no bit of such values); the exponent spread (<= 27) and a running bound on |C|
  exclude the truncation of any group term; no value leaves FP32's normal range.  Its flag
  per block pair: 0 (FAST at every instruction), 2 (not FAST at gen_pct% of them or more;
  by default at one or more), else 1.
* ``_fast_kernel`` (BM x BN tiles, every block FAST-planned): per instruction one dot, then
  RZ(C + D), one FP32 add rounded toward zero (PTX add.rz.f32; an exact TwoSum emulation in
  the interpreter).  C itself needs no cut while it is a multiple of the tile's largest
  q = 2^(max es - 35): true while the running minimum of (min es - 8) over the instructions
  so far (every product is a multiple of 2^(es - 8); cutting to power-of-two steps keeps
  that) is >= max es - 35, a scalar test; else while min |C| over the nonzero C >= 2^(max
  es - 12) (one reduction); else MEDIUM: C is first truncated at its own q = 2^(max_g
  es_g - 35) (per output) by an add rounded toward zero.
* ``_full_kernel`` (BM/(2 full_split) x BN/(2 full_split) blocks of the other tiles, but
  those flagged 2, each taking its paths from its statistics block's bounds and its own C):
  FAST / MEDIUM where the statistics allow it, else GENERAL: E per output; each term (C, and
  the four group terms from four dots, one per group: a single group's dot is always exact)
  counted in steps q = 2^(E - 35) and truncated toward zero by one conversion
  (cvt.rzi.s64.f32), the int64 counts summed exactly, rounded toward zero to FP32 once
  (ue4m3: cvt.rz.f32.s64, then scaled back by q exactly; ue8m0: the sum times q, exact in
  float64, by cvt.rz.f32.f64, subnormals kept; beyond 2^128 Inf). C's count needs no
  float64: two exact FP32 scalings by halves of its exponent. The bound on |C| grows by the
  bound on |D| on every path, so GENERAL needs no reduction over C. -0 (ue8m0 only: a tiny
  negative sum cut to -0) survives an instruction only if C and every product are -0: the
  loop keeps it through every zero sum, and ``_settle_neg0`` corrects the block's -0 results
  once, after the loop, from the last instruction whose products are not all -0 (-0 words
  from the prepass: which elements are +-0, which negative). Each step's operand tiles,
  exponent words and statistics are loaded a step ahead (their latency overlaps the step
  before). The four group dots: one K = 16 dot per group slice
  (FP4REF_CHAIN_GENERAL="slices", the default) or four masked K = 64 dots of the step's
  tiles ("masked"). On the H200 (session 17, reports/baselines/chain-general/): GENERAL is
  latency-bound, not bound by its per-output arithmetic (ablations: the loop's loads, the
  masked dots and a per-step reduction over C each cost more than the cuts; integer cuts in
  place of float64 ones saved nothing); loading a step ahead and dropping the reduction
  brought the worst NVFP4 operands from 20x to 9x the Gaussian time. Session 18: the -0
  settle after the loop, one scaling per shared ue8m0 scale pair and 16 warps took MXFP4's
  full ue8m0 range from 77.7 to 45.6 ms (docs/blackwell.md). Session 19: two conversions
  fewer per output (C's count, the Inf rule) and fewer integer steps took it to 43.4 ms
  beside 45.1 (session19-variants.md; ncu: half the issue slots idle, the stalls spread over
  dependencies, conversion queues, loads and barriers).
* ``_general_kernel`` (the blocks flagged 2: ``gen_pct``% or more of their instructions, by
  default any one, fail FAST's conditions; their columns split ``gen_split`` ways): the
  same GENERAL step, bit for bit, in a loop without branches, which Triton pipelines: the
  group slices and exponent words of each step are copied to shared memory (cp.async)
  ``gen_stages`` - 1 steps ahead, so no fence before a dot waits for the next step's loads
  as in ``_full_kernel``; at most 128 registers (ue4m3: 80) put two (three) blocks of 8
  warps on an SM.  Session 20 on the H200: MXFP4's full ue8m0 range 43.3 -> 28.9 ms, NVFP4's
  full e4m3 range 36.8 -> 22.8 ms (reports/baselines/chain-general/session20-variants.md).
* Epilogue in the kernels: alpha (one FP32 RNE product), NaN rows / columns, out_dtype
  (bf16 by integer RNE), canonical NaN.

``counts`` (an int32 tensor of 3 zeros on the operands' device, optional) receives how many
(64 x 64 block, instruction) steps took FAST, MEDIUM and GENERAL. Tile sizes: ``CONFIG`` (or
FP4REF_CHAIN_CONFIG="BM,BN,num_warps,num_stages[,GROUP_M[,full_warps[,full_split[,
gen_split[,gen_warps[,gen_stages[,gen_pct]]]]]]]", read at every call: ``parse_config``). Tests:
tests/test_chain_triton.py (interpreter on CPU; ``-m gpu`` on a GPU); benchmark:
``fp4ref.harness.bench_chain``; offline sm_90 build check (registers, spills): compile with
``triton.compile`` as scripts/sass_digest.py does.
"""
from __future__ import annotations

import os

import torch

try:  # triton is optional (pyproject extra "gpu")
    import triton
    import triton.language as tl
    HAVE_TRITON = True
except Exception:  # pragma: no cover - depends on the machine
    triton = tl = None
    HAVE_TRITON = False

__all__ = ["HAVE_TRITON", "CONFIG", "CONFIG_KEYS", "BACKENDS", "available", "interpreting",
           "use_triton", "chain_mm", "SCALE_BLOCKS", "parse_config", "GENERAL_MODES"]

# _fast_kernel: BM x BN tiles (one HGMMA 64x128 per warpgroup and k-step, 3 TMA stages; the
# sm_90 build has no register spills); _full_kernel: BM/2 x BN/2 blocks, 16 warps (sm_90, K,
# M, N multiples of 16 as at run time: 128 registers, 16-72 bytes of spills; with 8 warps,
# 211-239 registers and none; session 18's kernel took 3-6% longer with 8 warps on the H200:
# reports/baselines/chain-general/h200-bench-chain-session18d.json;
# with every step's loads issued a step ahead BM/2 x BN/2 beat BM/4 x BN/4 blocks with 4 or
# 8 warps by 1.4-1.9x: h200-grid3-session17.json, h200-variants-session18c.json; GENERAL
# "slices" vs "masked" there too).  GROUP_M row tiles share B tiles in L2.
# _general_kernel: BM/2 x BN/(2 gen_split) blocks, gen_warps warps, gen_stages pipeline stages
# (64 x 32, 8 warps, 3 stages: session 20's calls 1-3 on the H200 beat 64 x 64 and 64 x 16
# blocks, 2-6 stages and TMA loads, reports/baselines/chain-general/session20-variants.md).
# gen_pct: blocks whose instructions fail FAST's conditions at gen_pct% or more of K take
# _general_kernel (GENERAL there at every instruction, FAST's ones too); 1: every block with a
# non-FAST instruction.  Session 20's call h: _full_kernel took 42.9-46.2 ms on MXFP4 blocks
# with 1-50% FAST instructions (its FAST steps cost as much as its GENERAL ones),
# _general_kernel 29.2-29.5 ms whatever the share (h200-mixed-session20h.json).
CONFIG = {"BM": 128, "BN": 128, "num_warps": 8, "num_stages": 3, "GROUP_M": 8, "full_warps": 16,
          "full_split": 1, "gen_split": 2, "gen_warps": 8, "gen_stages": 3, "gen_pct": 1}
_INTERP_CONFIG = {"BM": 32, "BN": 32, "num_warps": 4, "num_stages": 1, "GROUP_M": 2,
                  "full_warps": 4, "full_split": 1, "gen_split": 2, "gen_warps": 4,
                  "gen_stages": 2, "gen_pct": 1}
# _general_kernel's registers per thread, by RESID: at most 128 lets two blocks of 8 warps share
# an SM's 65536; ue4m3's GENERAL fits 80 without spills: three blocks (session 20, call 3)
_GEN_MAXNREG = (80, 128, 128)
SCALE_BLOCKS = {"ue4m3": (16,), "ue8m0": (32, 16)}
BACKENDS = ("auto", "triton", "torch")
_FOLD = 48            # ue8m0 scales with |exponent| <= 48 are folded into the bf16 operand
GENERAL_DEFAULT = "slices"   # measured on the H200: reports/baselines/chain-general/
_OUT_KIND = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}


def available() -> bool:
    return HAVE_TRITON and torch.cuda.is_available()


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def use_triton(backend: str, device) -> bool:
    """Whether ``backend`` ("auto": CUDA tensors with Triton; "triton": required; "torch":
    never) runs ``chain_mm`` for tensors on ``device``."""
    if backend not in BACKENDS:
        raise ValueError(f"backend: unknown value {backend!r}; valid choices: "
                         + ", ".join(BACKENDS))
    dev = torch.device(device)
    if backend == "torch":
        return False
    ok = (dev.type == "cuda" and available()) or (HAVE_TRITON and interpreting()
                                                  and dev.type == "cpu")
    if backend == "triton" and not ok:
        raise ValueError(f"backend: 'triton' needs Triton and CUDA tensors (or CPU tensors "
                         f"with TRITON_INTERPRET=1), got {dev.type} tensors; valid choices "
                         "here: 'auto', 'torch'")
    return ok and (backend == "triton" or dev.type == "cuda")


if HAVE_TRITON:
    @triton.jit
    def _p2f(e):
        """2^e as float32 (e an int32 tensor in [-126, 127])."""
        return ((e + 127) << 23).to(tl.float32, bitcast=True)

    @triton.jit
    def _p2d(e):
        """2^e as float64, e an int32 tensor in [-1022, 1023] (GENERAL's -s: [-161, 219];
        ``_fast_ok``'s: [-478, 210])."""
        return (((e + 1023) << 20).to(tl.int64) << 32).to(tl.float64, bitcast=True)

    @triton.jit
    def _add_rz(x, y, ASM: tl.constexpr):
        """RZ(x + y) in FP32, subnormals kept (no overflow in the callers)."""
        if ASM:  # PTX add.rz.f32 without .ftz; asm keeps the compiler from fusing it into a dot
            return tl.inline_asm_elementwise("add.rz.f32 $0, $1, $2;", "=f,f,f", [x, y],
                                             dtype=tl.float32, is_pure=True, pack=1)
        # TwoSum: s = RN(x + y), e the exact error; RZ is s, or s one step toward zero
        s = x + y
        bb = s - x
        e = (x - (s - bb)) + (y - bb)
        adj = (e != 0) & ((e < 0) != (s < 0))
        return tl.where(adj, (s.to(tl.int32, bitcast=True) - 1).to(tl.float32, bitcast=True), s)

    @triton.jit
    def _dot(a, b, F32: tl.constexpr):
        if F32:  # interpreter: numpy float32 matmul, exact on the same operands
            return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
        return tl.dot(a, b)

    @triton.jit
    def _e2m1(c):
        """e2m1 code (int32, 0..15) -> float32: m = c & 7 = 1 is 0.5, m >= 2 is
        (1 + (m & 1) / 2) * 2^((m >> 1) - 1), bit 3 the sign."""
        m = c & 7
        bits = tl.where(m >= 2, ((126 + (m >> 1)) << 23) | ((m & 1) << 22),
                        tl.where(m == 1, 126 << 23, 0))
        return (bits | ((c >> 3) << 31)).to(tl.float32, bitcast=True)

    @triton.jit
    def _scale(s, UE8: tl.constexpr):
        """Raw scale byte (int32) -> (value float32, alignment exponent int32, is NaN).
        ue4m3: the sign bit ignored, a subnormal or zero at exponent -6; ue8m0: 2^(s-127).
        NaN decodes as 1.0 with exponent 0 (its outputs are NaN anyway)."""
        if UE8:
            nan = s == 255
            e = s - 127
            v = tl.where(s == 0, (1 << 22), s << 23).to(tl.float32, bitcast=True)
        else:
            mag = s & 127
            nan = mag == 127
            f = mag >> 3
            m = mag & 7
            e = tl.where(f > 0, f - 7, -6)
            v = tl.where(f > 0, (((f + 120) << 23) | (m << 20)).to(tl.float32, bitcast=True),
                         m.to(tl.float32) * 0.001953125)   # m * 2^-9
        return tl.where(nan, 1.0, v), tl.where(nan, 0, e), nan

    @triton.jit
    def _bf16_word(lo, hi):
        """Two exact bf16 values (as float32) -> one int32 word, the low half first."""
        ulo = lo.to(tl.uint32, bitcast=True)
        uhi = hi.to(tl.uint32, bitcast=True)
        return ((uhi & 0xFFFF0000) | (ulo >> 16)).to(tl.int32, bitcast=True)

    @triton.jit
    def _bits64(lo, hi):
        """Per (row, instruction): the 64 bits of the instruction's elements (element 2w from
        lo, 2w + 1 from hi of word w; 0 / 1 int32 [rows, PC, 32]) as one int64."""
        k2 = 2 * tl.arange(0, 32).to(tl.int64)[None, None, :]
        return tl.sum((lo.to(tl.int64) << k2) | (hi.to(tl.int64) << (k2 + 1)), axis=2)

    @triton.jit
    def _store_nz(NZ, lo, hi, rows, rv, ps, pv, NP):
        """-0 words NZ [R, NP, 2] (int64): of each row and instruction, which elements are +-0
        and which are negative (e2m1 codes lo / hi)."""
        off = rows[:, None].to(tl.int64) * (2 * NP) + 2 * ps[None, :]
        m = rv[:, None] & pv[None, :]
        tl.store(NZ + off, _bits64(((lo & 7) == 0).to(tl.int32), ((hi & 7) == 0).to(tl.int32)),
                 mask=m)
        tl.store(NZ + off + 1, _bits64(lo >> 3, hi >> 3), mask=m)

    @triton.jit
    def _prep_kernel(CODES, SC, OUTF, OUTG, EXPS, ST, STI, NANR, NZ,
                     R, KB, KW, NB, NG, NP,
                     RB: tl.constexpr, PC: tl.constexpr, PACKED: tl.constexpr,
                     UE8: tl.constexpr, BLOCK: tl.constexpr, GEN: tl.constexpr,
                     FOLD: tl.constexpr):
        # program (row block, PC instructions): words [RB, PC, 32] (a word = two elements)
        rb = tl.program_id(0)
        rows = rb * RB + tl.arange(0, RB)
        rv = rows < R
        ps = tl.program_id(1) * PC + tl.arange(0, PC)
        pv = ps < NP
        r3 = rows[:, None, None].to(tl.int64)
        w = ps[None, :, None] * 32 + tl.arange(0, 32)[None, None, :]
        m3 = rv[:, None, None] & pv[None, :, None]
        if PACKED:
            byte = tl.load(CODES + r3 * KB + w, mask=m3, other=0).to(tl.int32)
            lo = byte & 15
            hi = (byte >> 4) & 15
        else:
            lo = tl.load(CODES + r3 * KB + 2 * w, mask=m3, other=0).to(tl.int32) & 15
            hi = tl.load(CODES + r3 * KB + 2 * w + 1, mask=m3, other=0).to(tl.int32) & 15
        s = tl.load(SC + r3 * NB + (2 * w) // BLOCK, mask=m3, other=0).to(tl.int32)
        sv, se, _ = _scale(s, UE8)
        fold = tl.abs(se) <= FOLD
        vlo = _e2m1(lo)
        vhi = _e2m1(hi)
        sv = tl.where(fold, sv, 0.0)
        flo = vlo * sv                           # exact: <= 6 significant bits
        fhi = vhi * sv
        tl.store(OUTF + r3 * KW + w, _bf16_word(flo, fhi), mask=m3)
        if GEN:
            tl.store(OUTG + r3 * KW + w, _bf16_word(vlo, vhi), mask=m3)
            _store_nz(NZ, lo, hi, rows, rv, ps, pv, NP)
        # ||a'||^2 per (row, instruction), rounded up; +inf where a scale was not folded
        sq = tl.sum(flo * flo + fhi * fhi, axis=2) * 1.0000152587890625    # 1 + 2^-16
        unf = tl.max((fold == 0).to(tl.int32), axis=2)
        sq = tl.where(unf > 0, float("inf"), sq)
        sq = tl.where(rv[:, None], sq, 0.0)
        tl.store(ST + rb * 3 * NP + ps, tl.max(sq, axis=0), mask=pv)   # block stats [3, NP]
        # group exponents (scale of group g: index 16 g // BLOCK), their block min / max
        gi = ps[None, :, None] * 4 + tl.arange(0, 4)[None, None, :]
        sg = tl.load(SC + r3 * NB + (16 * gi) // BLOCK, mask=m3, other=0).to(tl.int32)
        _, eg, nan = _scale(sg, UE8)
        tl.store(EXPS + r3 * NG + gi, eg.to(tl.int8), mask=m3)
        big = 1 << 20
        lo_e = tl.min(tl.min(tl.where(m3, eg, big), axis=2), axis=0)
        hi_e = tl.max(tl.max(tl.where(m3, eg, -big), axis=2), axis=0)
        tl.store(STI + rb * 3 * NP + NP + ps, lo_e, mask=pv)
        tl.store(STI + rb * 3 * NP + 2 * NP + ps, hi_e, mask=pv)
        bad = tl.max(tl.max((nan & m3).to(tl.int32), axis=2), axis=1)
        tl.atomic_max(NANR + rows, bad, mask=rv & (bad > 0))   # NaN rows only: no contention

    @triton.jit
    def _grp(w, g):
        """Group g's scale exponent from a row's packed word (four int8, group 0 lowest)."""
        return (w << (24 - 8 * g)) >> 24

    @triton.jit
    def _words(EA, EB, rows, rmask, cols, cmask, p, NP):
        """The packed group-exponent words of step p: of the rows, of the columns."""
        wa = tl.load(EA + rows.to(tl.int64) * NP + p, mask=rmask, other=0)
        wb = tl.load(EB + cols.to(tl.int64) * NP + p, mask=cmask, other=0)
        return wa, wb

    @triton.jit
    def _es(wa, wb, g):
        """es_g = exp(sa_g) + exp(sb_g) per output."""
        return _grp(wa, g)[:, None] + _grp(wb, g)[None, :]

    @triton.jit
    def _esmax(wa, wb):
        """max_g es_g per output from the rows' and columns' words (byte g of a word, group 0
        lowest, is (w << (24 - 8 g)) >> 24)."""
        esm = ((wa << 24) >> 24)[:, None] + ((wb << 24) >> 24)[None, :]
        esm = tl.maximum(esm, ((wa << 16) >> 24)[:, None] + ((wb << 16) >> 24)[None, :])
        esm = tl.maximum(esm, ((wa << 8) >> 24)[:, None] + ((wb << 8) >> 24)[None, :])
        return tl.maximum(esm, (wa >> 24)[:, None] + (wb >> 24)[None, :])

    @triton.jit
    def _cut(C, EA, EB, rows, rmask, cols, cmask, p, NP, ASM: tl.constexpr):
        """MEDIUM's C: truncated toward zero at q = 2^(max_g es_g - 35) where |C| is small."""
        wa, wb = _words(EA, EB, rows, rmask, cols, cmask, p, NP)
        big = _p2f(_esmax(wa, wb) - 12)   # |C| below it: C's bits under q = ulp(big) are cut
        ac = tl.abs(C)
        tr = _add_rz(ac, big, ASM) - big
        tr = tl.where(C < 0, 0.0 - tr, tr)   # a nonzero C cut to zero is +0
        return tl.where(ac < big, tr, C)

    @triton.jit
    def _rz32(v):
        """float64 v -> FP32 rounded toward zero (subnormals kept; >= 2^128 gives Inf)."""
        av = tl.abs(v)
        tiny = tl.floor(av * 7.1362384635297994e44) * 1.401298464324817e-45   # 2^149, 2^-149
        av = tl.where(av < 1.1754943508222875e-38, tiny, av)                 # below 2^-126
        bits = av.to(tl.int64, bitcast=True) & -536870912                        # 29 low bits cut
        m = bits.to(tl.float64, bitcast=True).to(tl.float32).to(tl.int32, bitcast=True)
        # the sign by its bit: Triton's unary minus is 0 - x, which turns -0 into +0
        return tl.where(v < 0, m | -2147483648, m).to(tl.float32, bitcast=True)

    @triton.jit
    def _all_neg0(NZA, NZB, rows, rmask, cols, cmask, p, NP):
        """Every one of instruction p's 64 products is -0 (a +-0 factor, signs differ), from
        the rows' and columns' -0 words (``_store_nz``)."""
        ra = NZA + rows.to(tl.int64) * (2 * NP) + 2 * p
        cb = NZB + cols.to(tl.int64) * (2 * NP) + 2 * p
        za = tl.load(ra, mask=rmask, other=0)
        sa = tl.load(ra + 1, mask=rmask, other=0)
        zb = tl.load(cb, mask=cmask, other=0)
        sb = tl.load(cb + 1, mask=cmask, other=0)
        return ((za[:, None] | zb[None, :]) & (sa[:, None] ^ sb[None, :])) == -1

    @triton.jit
    def _keep_neg0(C, zero, r):
        """r, or -0 where C is -0 and the step's sum is zero (``zero``): -0 + -0 is -0, but a
        zero sum with any +0 or nonzero product is +0; the products are checked once, at the
        end (``_settle_neg0``).  By bits: Triton folds a -0.0 literal to +0."""
        cneg0 = C.to(tl.int32, bitcast=True) == -2147483648
        return tl.where(cneg0 & zero, -2147483648, r.to(tl.int32, bitcast=True)).to(
            tl.float32, bitcast=True)

    @triton.jit
    def _settle_neg0(C, AF, BF, AG, BG, EA, EB, NZA, NZB, rows, rmask, cols, cmask, K, NP,
                     RESID: tl.constexpr, F32DOT: tl.constexpr, ASM: tl.constexpr,
                     SLICES: tl.constexpr):
        """The exact -0 rule for the block's -0 results (ue8m0).  A -0 is made only by a tiny
        negative sum cut to -0 (a nonzero integer sum: "fresh"); it survives an instruction
        iff the sum is zero and all 64 products are -0; a +0 never turns -0.  The loop kept
        -0 through every zero sum (``_keep_neg0``), a superset.  Here, per -0 result, the
        last instruction p whose products are not all -0 decides: -0 iff p made a fresh -0,
        i.e. iff its integer sum with C = 0 is nonzero (after a fresh -0 C is +-0, so later
        sums are the same with C = 0; at the fresh step itself C is zero or subnormal, or
        |C| >= 2^-126 and the group terms nearly cancel it: then they are nonzero with C = 0
        too).  Usually p is the last instruction: one step of GENERAL's work, per block with
        a -0 result, no check per step in the loop."""
        todo = (C.to(tl.int32, bitcast=True) == -2147483648).to(tl.int32)
        p = NP - 1
        while (tl.max(todo) > 0) & (p >= 0):
            hit = todo & (_all_neg0(NZA, NZB, rows, rmask, cols, cmask, p, NP) == 0)
            if tl.max(hit) > 0:
                ops = _ops(AF, BF, AG, BG, rows, rmask, cols, cmask, p, K, RESID, SLICES)
                wa, wb = _words(EA, EB, rows, rmask, cols, cmask, p, NP)
                _, nonzero = _general(tl.zeros_like(C), ops, wa, wb, RESID, F32DOT, ASM, SLICES)
                C = tl.where((hit > 0) & (nonzero == 0), 0.0, C)
            todo = todo & (hit == 0)
            p -= 1
        return C

    @triton.jit
    def _cvt_rz(v, ASM: tl.constexpr):
        """int64 v (|v| < 2^62) -> float32 rounded toward zero."""
        if ASM:  # PTX cvt.rz.f32.s64
            return tl.inline_asm_elementwise("cvt.rz.f32.s64 $0, $1;", "=f,l", [v],
                                             dtype=tl.float32, is_pure=True, pack=1)
        r = v.to(tl.float32)   # RN; one step toward zero where it rounded up in magnitude
        up = tl.abs(r.to(tl.int64)) > tl.abs(v)
        return tl.where(up, (r.to(tl.int32, bitcast=True) - 1).to(tl.float32, bitcast=True), r)

    @triton.jit
    def _f32_rz(v, ASM: tl.constexpr):
        """float64 v -> FP32 rounded toward zero, subnormals kept, |v| >= 2^128: +-Inf."""
        if ASM:  # PTX cvt.rz.f32.f64 (no .ftz); its overflow is +-FLT_MAX, the model's Inf
            r = tl.inline_asm_elementwise("cvt.rz.f32.f64 $0, $1;", "=f,d", [v],
                                          dtype=tl.float32, is_pure=True, pack=1)
            # beyond 2^128: +-FLT_MAX's bits + 1 are +-Inf's (an integer add, no 2nd conversion)
            r = tl.where(tl.abs(v) >= 3.402823669209385e38,
                         (r.to(tl.int32, bitcast=True) + 1).to(tl.float32, bitcast=True), r)
        else:
            r = _rz32(v)
        return r

    @triton.jit
    def _in_q(y, e):
        """y * 2^e truncated toward zero to an integer (int64: cvt.rzi.s64.f32), y a finite
        float32 with |y * 2^e| < 2^62, e in [-126, 127]."""
        return (y * _p2f(e)).to(tl.int64)

    @triton.jit
    def _in_q2(y, e):
        """y * 2^e truncated toward zero (int64), e in [-252, 254], y finite float32 with
        |y * 2^e| < 2^62: two FP32 scalings.  Exact where the result is >= 1 (the first
        product is then >= 2^-126 or the second is an upscaling); below 1, either rounding
        leaves it below 1: 0.  Halves of e, so no clamp: e1 = floor(e / 2) <= e - e1, both
        in [-126, 127]."""
        e1 = e >> 1
        return (y * _p2f(e1) * _p2f(e - e1)).to(tl.int64)

    @triton.jit
    def _term(x, s, wa, wb, g, RESID: tl.constexpr):
        """A group term in steps q, truncated (int64): x = T_g (ue4m3) or S_g (ue8m0, whose
        group scale exponent joins here; far below q: cut to 0)."""
        if RESID:   # one product: |x| <= 576 and t <= 35; below 2^-126 it truncates to 0
            t = s + _es(wa, wb, g)
            return (x * _p2f(tl.maximum(t, -126))).to(tl.int64)
        return _in_q(x, s)

    @triton.jit
    def _general(C, ops, wa, wb, RESID: tl.constexpr, F32DOT: tl.constexpr, ASM: tl.constexpr,
                 SLICES: tl.constexpr):
        """The exact instruction per output, in integers: with q = 2^(E - 35) the truncation
        step, each term (C, and the four group terms) is t / q truncated toward zero, an int64
        (cvt.rzi: one conversion, the cut itself); their sum is exact (|sum| < 2^47: C's count
        < 2^36, a group's < 576 * 2^35), then rounded toward zero to FP32 once: ue4m3, the sum
        by cvt.rz.f32.s64 and scaled back by q (exact, or Inf beyond 2^128); ue8m0, whose q
        and results leave FP32's range, sum * q exact in float64 by cvt.rz.f32.f64 (subnormals
        kept, Inf beyond 2^128).  The group terms come from four dots, one per group (a
        single group's sum is always exact in the dot), of the operand
        tiles loaded a step ahead (ue8m0: the e2m1 values alone; ue4m3: a * s_a): SLICES, ops =
        four [rows, 16] and four [16, cols] slices, one K = 16 dot each; else ops[2], ops[3] =
        [rows, 64], [64, cols], four masked K = 64 dots (4x the tensor work of one dot, and a
        masked copy per group).  Returns (r, the integer sum is nonzero)."""
        if RESID == 2:   # ue8m0 block 32: groups 0 / 1 and 2 / 3 share their scales
            esm = tl.maximum(_es(wa, wb, 0), _es(wa, wb, 2))
        else:
            esm = _esmax(wa, wb)
        # exp C, C = +-0 or subnormal counting as 2^-126: |C| raised to 2^-126, its exponent bits
        ec = tl.maximum(tl.abs(C), 1.1754943508222875e-38).to(tl.int32, bitcast=True) >> 23
        E = tl.maximum(ec - 127, esm)
        s = 35 - E                                       # a term t counts t * 2^s steps q
        # Inf C stays Inf (no Inf - Inf here; replaced at the end): finite meanwhile
        Cf = tl.minimum(tl.maximum(C, -3.4028234663852886e38), 3.4028234663852886e38)
        if RESID:   # 2^s beyond FP32's range (s in [-219, 161]): two exact FP32 scalings
            acc = _in_q2(Cf, s)
        else:
            acc = _in_q(Cf, s)
        if SLICES & (RESID == 2):   # one scaling per shared scale pair, each term cut
            for h in tl.static_range(0, 4, 2):
                f = _p2f(tl.maximum(s + _es(wa, wb, h), -126))   # as _term, once per pair
                acc += (_dot(ops[h], ops[4 + h], F32DOT) * f).to(tl.int64)
                acc += (_dot(ops[h + 1], ops[5 + h], F32DOT) * f).to(tl.int64)
        elif SLICES:
            for g in tl.static_range(4):
                acc += _term(_dot(ops[g], ops[4 + g], F32DOT), s, wa, wb, g, RESID)
        else:
            ga = ops[2]
            kq = tl.arange(0, 64) // 16
            for g in range(4):   # not unrolled: unrolling spills in the sm_90 build
                x = _dot(tl.where((kq == g)[None, :], ga, tl.zeros_like(ga)), ops[3], F32DOT)
                acc += _term(x, s, wa, wb, g, RESID)
        if RESID:   # acc * 2^(E - 35) exact in float64 (|acc| < 2^48), rounded once
            v = acc.to(tl.float64) * _p2d(-s)
            r = _f32_rz(v, ASM)
        else:       # ue4m3: E in [-12, 128], 2^(E - 35) normal: exact, or Inf beyond 2^128
            r = _cvt_rz(acc, ASM) * _p2f(-s)             # 24 bits, then exact
        r = tl.where(Cf != C, C, r)
        if RESID:   # ue4m3: C is never -0 (the sums start at +0; RZ makes x - x +0)
            r = _keep_neg0(C, v == 0, r)      # (the float64 test: one instruction, not two)
        return r, acc != 0

    @triton.jit
    def _stats(SA, SAI, SB, SBI, p, NP):
        """A block pair's statistics at step p: (bound on ||a'||^2 ||b'||^2, min es, max es).
        SA / SAI, SB / SBI: the row and column blocks' (max ||a'||^2, min exp, max exp; [3,
        NP], float32 / int32 views)."""
        esmin = tl.load(SAI + NP + p) + tl.load(SBI + NP + p)
        esmax = tl.load(SAI + 2 * NP + p) + tl.load(SBI + 2 * NP + p)
        return tl.load(SA + p).to(tl.float64) * tl.load(SB + p).to(tl.float64), esmin, esmax

    @triton.jit
    def _fast_ok(bsq, esmin, esmax, CB):
        """FAST's conditions from a block pair's statistics (module doc) and CB, the bound on
        |C|: (ok, bound on |D|)."""
        # 2^(2 esmin + 30) = (2^(L + 23))^2 with L = esmin - 8: the dot's exactness window.
        # Above 90 FAST fails anyway (esmax <= 90), but for a statistics block past M or N,
        # whose min exponent is +2^20 (no rows): clamped, its masked outputs pass as before.
        e = tl.minimum(esmin, 90)
        ok = (esmin >= -90) & (esmax <= 90) & (esmax - esmin <= 27) \
            & (bsq < _p2d(2 * e + 30)) & (CB < _p2d(e + 27))
        return ok, tl.sqrt(bsq) * 1.000001

    @triton.jit
    def _fast_or_medium(C, d, cmin, esmax, EA, EB, rows, rmask, cols, cmask, p, NP,
                        ASM: tl.constexpr):
        """RZ(C + D), or MEDIUM where some |C| may lie below 2^(max es - 12): (C, path).
        (D is used outside the branch: Triton's wgmma pipelining fails on a dot result
        consumed inside an scf.if.)"""
        if cmin >= _p2f(esmax - 12):
            Ct = C
            path = 0
        else:
            Ct = _cut(C, EA, EB, rows, rmask, cols, cmask, p, NP, ASM)
            path = 1
        return _add_rz(Ct, d, ASM), path

    @triton.jit
    def _dfast(ops, wa, wb, F32DOT: tl.constexpr, RESID: tl.constexpr, SLICES: tl.constexpr):
        """FAST's D from the step's tiles.  The group slices' dots add exactly under FAST's
        conditions: each partial sum is a sum over a subset of the 64 products, a multiple of
        2^L below 2^(L + 23) (Cauchy-Schwarz bounds every subset).  ue8m0 slices hold the e2m1
        values alone: each group's exact sum times its scales 2^(e_a + e_b) (exact: FAST's
        exponents stay in FP32's normal range) joins the sum by an exact FP32 add."""
        if SLICES:
            if RESID == 2:   # block 32: a pair of groups shares its scales
                d = (_dot(ops[0], ops[4], F32DOT) + _dot(ops[1], ops[5], F32DOT)) \
                    * _p2f(_es(wa, wb, 0))
                d += (_dot(ops[2], ops[6], F32DOT) + _dot(ops[3], ops[7], F32DOT)) \
                    * _p2f(_es(wa, wb, 2))
            elif RESID:
                d = _dot(ops[0], ops[4], F32DOT) * _p2f(_es(wa, wb, 0))
                for g in tl.static_range(1, 4):
                    d += _dot(ops[g], ops[4 + g], F32DOT) * _p2f(_es(wa, wb, g))
            else:
                d = _dot(ops[0], ops[4], F32DOT)
                for g in tl.static_range(1, 4):
                    d += _dot(ops[g], ops[4 + g], F32DOT)
        else:
            d = _dot(ops[0], ops[1], F32DOT)
        return d

    @triton.jit
    def _step(C, ops, wa, wb, st, CB, EA, EB, rows, rmask, cols, cmask, p, NP,
              RESID: tl.constexpr, F32DOT: tl.constexpr, ASM: tl.constexpr,
              SLICES: tl.constexpr):
        """One instruction on one block, any path: (C, bound on |C|, path 0/1/2); ops, wa / wb
        and st (``_stats``): the step's tiles, exponent words and statistics, loaded a step
        ahead.  The full dot and the min |C| reduction only where FAST / MEDIUM runs.  The
        bound on |C| grows by FAST's bound on |D| on every path (GENERAL's cut terms sum to
        at most |C| + sum_g |T_g| <= |C| + ||a'|| ||b'||): no reduction over C.  ue8m0's -0
        (a tiny negative sum cut to -0) is kept through zero sums on both paths (FAST's dot
        may give either zero) and settled once, after the loop (``_settle_neg0``)."""
        bsq, esmin, esmax = st
        ok, bnd = _fast_ok(bsq, esmin, esmax, CB)
        if ok:
            d = _dfast(ops, wa, wb, F32DOT, RESID, SLICES)
            Cn, path = _fast_or_medium(C, d, _cmin(C), esmax, EA, EB, rows, rmask, cols, cmask,
                                       p, NP, ASM)
            if RESID:
                Cn = _keep_neg0(C, d == 0, Cn)
        else:
            Cn, _ = _general(C, ops, wa, wb, RESID, F32DOT, ASM, SLICES)
            path = 2
        return Cn, CB + bnd, path

    @triton.jit
    def _plan_kernel(SA, SAI, SB, SBI, FLAG, GMIN, NP: tl.constexpr):
        """FLAG[qm, qn] for block pair (qm, qn): 0 where FAST's conditions hold at every
        instruction, 2 where they fail at GMIN or more (``_general_kernel``: GENERAL at every
        one), else 1 (no C needed: the bound on |C| only grows by the bound on |D|)."""
        qm = tl.program_id(0)
        qn = tl.program_id(1)
        CB = tl.max(tl.zeros((2,), tl.float64))
        bad = tl.max(tl.zeros((2,), tl.int32))
        for p in range(0, NP):
            ok, bnd = _fast_ok(*_stats(SA + qm * 3 * NP, SAI + qm * 3 * NP, SB + qn * 3 * NP,
                                       SBI + qn * 3 * NP, p, NP), CB)
            bad += 1 - ok.to(tl.int32)
            CB = CB + bnd
        tl.store(FLAG + qm * tl.num_programs(1) + qn, tl.where(bad >= GMIN, 2, (bad > 0).to(
            tl.int32)))

    @triton.jit
    def _tile_flag(FLAG, tm, tn, NQN):
        """A BM x BN tile needs the GENERAL-capable kernel if any of its quarters does."""
        f = FLAG + 2 * tm * NQN + 2 * tn
        return tl.maximum(tl.maximum(tl.load(f), tl.load(f + 1)),
                          tl.maximum(tl.load(f + NQN), tl.load(f + NQN + 1)))

    @triton.jit
    def _store(OUT, C, rows, rmask, cols, cmask, NANR, NANC, N, alpha,
               ALPHA: tl.constexpr, OUTK: tl.constexpr):
        """The epilogue: alpha, NaN rows / columns, out_dtype (OUTK 0 fp32, 1 bf16, 2 fp16),
        canonical NaN; stored as bits."""
        y = C
        if ALPHA:   # one FP32 RNE product (nothing is added: no FMA)
            y = y * alpha
        nr = tl.load(NANR + rows, mask=rmask, other=0)
        nc = tl.load(NANC + cols, mask=cmask, other=0)
        nan = (nr[:, None] > 0) | (nc[None, :] > 0) | (y != y)
        off = rows[:, None].to(tl.int64) * N + cols[None, :]
        m = rmask[:, None] & cmask[None, :]
        u = y.to(tl.int32, bitcast=True)
        if OUTK == 0:
            tl.store(OUT + off, tl.where(nan, 0x7FFFFFFF, u), mask=m)
        elif OUTK == 1:   # bfloat16 RNE by integer rounding of the FP32 bits (finite or Inf)
            hb = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
            tl.store(OUT + off, tl.where(nan, 0x7FFF, hb).to(tl.int16), mask=m)
        else:
            h = y.to(tl.float16).to(tl.int16, bitcast=True)
            tl.store(OUT + off, tl.where(nan, 0x7FFF, h.to(tl.int32)).to(tl.int16), mask=m)

    @triton.jit
    def _cmin(C):
        """min |C| over the nonzero C: an exact zero needs no cut (MXFP4 sums often cancel
        exactly; padding rows and columns hold +0)."""
        # one pass (was: a second one whenever some C is zero, nearly always for MXFP4)
        return tl.min(tl.where(C == 0, float("inf"), tl.abs(C)))

    @triton.jit
    def _tile_es(ea0, ea1, eb0, eb1, p, NP):
        """(max es, min es) of a tile's two row blocks and two column blocks at step p (ea0 ..
        eb1: the blocks' max exponents, their min exponents NP words before)."""
        esmax = tl.maximum(tl.load(ea0 + p), tl.load(ea1 + p)) \
            + tl.maximum(tl.load(eb0 + p), tl.load(eb1 + p))
        esmin = tl.minimum(tl.load(ea0 - NP + p), tl.load(ea1 - NP + p)) \
            + tl.minimum(tl.load(eb0 - NP + p), tl.load(eb1 - NP + p))
        return esmax, esmin

    @triton.jit
    def _fast_kernel(ADF, BDF, EA, EB, SAI, SBI, FLAG, NANR, NANC, OUT, CNT,
                     M, N, alpha, NP: tl.constexpr,
                     BM: tl.constexpr, BN: tl.constexpr, GROUP_M: tl.constexpr,
                     F32DOT: tl.constexpr, ASM: tl.constexpr, ALPHA: tl.constexpr,
                     OUTK: tl.constexpr, FS: tl.constexpr):
        """The BM x BN tiles whose instructions all pass FAST's conditions (``_plan_kernel``):
        one tensor-core dot per instruction, then FAST (or MEDIUM)."""
        pid = tl.program_id(0)
        nn = tl.cdiv(N, BN)
        per = GROUP_M * nn                  # grouped order: GROUP_M row tiles share B in L2
        fm = (pid // per) * GROUP_M
        gs = tl.minimum(tl.cdiv(M, BM) - fm, GROUP_M)
        tm = fm + (pid % per) % gs
        tn = (pid % per) // gs
        if _tile_flag(FLAG, tm, tn, 2 * nn) == 0:
            rows = tm * BM + tl.arange(0, BM)
            cols = tn * BN + tl.arange(0, BN)
            rmask = rows < M
            cmask = cols < N
            S3 = 3 * NP                      # block statistics: [blocks, 3, NP]
            ea0 = SAI + 2 * tm * S3 + 2 * NP     # max exponent of the tile's two row blocks,
            ea1 = ea0 + S3                       # two column blocks
            eb0 = SBI + 2 * tn * S3 + 2 * NP
            eb1 = eb0 + S3
            C = tl.zeros((BM, BN), tl.float32)
            inf32 = tl.max(tl.full((2,), float("inf"), tl.float32))   # "nothing to cut"
            nmed = tl.max(tl.zeros((2,), tl.int32))
            # every C so far is a multiple of 2^gq (C = +0: any gq): each product of step p is
            # a multiple of 2^(es - 8) >= 2^(esmin_p - 8) (e2m1: 2^-1, a scale: 2^(e - 3)), D
            # is their exact sum, and cutting a multiple of 2^gq to a power-of-two step (RZ to
            # FP32, MEDIUM's cut) keeps it one.  While gq >= max es - 35, C has no bit below
            # MEDIUM's step q: no cut and no reduction over C (one block barrier less per step).
            gq = tl.max(tl.full((2,), 1 << 20, tl.int32))
            esmax_n, esmin_n = _tile_es(ea0, ea1, eb0, eb1, 0, NP)
            for p in range(0, NP):
                esmax = esmax_n      # the statistics of step p + 1 load during step p
                esmin = esmin_n
                esmax_n, esmin_n = _tile_es(ea0, ea1, eb0, eb1, tl.minimum(p + 1, NP - 1), NP)
                if gq >= esmax - 35:
                    cmin = inf32
                else:
                    cmin = _cmin(C)
                gq = tl.minimum(gq, esmin - 8)
                # TMA tiles (rows past M / N read as zeros); B rows are K-major columns of B
                a = ADF.load([tm * BM, 64 * p])
                b = BDF.load([tn * BN, 64 * p]).T
                C, k = _fast_or_medium(C, _dot(a, b, F32DOT), cmin, esmax, EA, EB, rows, rmask,
                                       cols, cmask, p, NP, ASM)
                nmed += k
            _store(OUT, C, rows, rmask, cols, cmask, NANR, NANC, N, alpha, ALPHA, OUTK)
            tl.atomic_add(CNT + 0, FS * FS * 4 * (NP - nmed))   # counted in the full kernel's
            tl.atomic_add(CNT + 1, FS * FS * 4 * nmed)          # QM x QN blocks

    @triton.jit
    def _slice(X, rows, rmask, k0, K, W: tl.constexpr):
        """Columns k0 .. k0 + W of a bf16 [R, K] operand's rows, [rows, W]; zeros past R."""
        kk = tl.arange(0, W) + k0
        return tl.load(X + rows[:, None].to(tl.int64) * K + kk[None, :], mask=rmask[:, None],
                       other=0.0)

    @triton.jit
    def _ops(AF, BF, AG, BG, rows, rmask, cols, cmask, p, K, RESID: tl.constexpr,
             SLICES: tl.constexpr):
        """Step p's operand tiles (``_general``): SLICES, the four groups' [rows, 16] and
        [16, cols] slices of GENERAL's operands; else (a, b, ga, gb), [rows, 64] / [64, cols]
        of FAST's and GENERAL's operands (the same where ue4m3)."""
        if SLICES:
            X = AG if RESID else AF
            Y = BG if RESID else BF
            k0 = 64 * p
            ops = (_slice(X, rows, rmask, k0, K, 16), _slice(X, rows, rmask, k0 + 16, K, 16),
                   _slice(X, rows, rmask, k0 + 32, K, 16), _slice(X, rows, rmask, k0 + 48, K, 16),
                   _slice(Y, cols, cmask, k0, K, 16).T, _slice(Y, cols, cmask, k0 + 16, K, 16).T,
                   _slice(Y, cols, cmask, k0 + 32, K, 16).T,
                   _slice(Y, cols, cmask, k0 + 48, K, 16).T)
        else:
            a = _slice(AF, rows, rmask, 64 * p, K, 64)
            b = _slice(BF, cols, cmask, 64 * p, K, 64).T
            if RESID:
                ops = (a, b, _slice(AG, rows, rmask, 64 * p, K, 64),
                       _slice(BG, cols, cmask, 64 * p, K, 64).T)
            else:
                ops = (a, b, a, b)
        return ops

    @triton.jit
    def _full_kernel(AF, BF, AG, BG, NZA, NZB, EA, EB, SA, SAI, SB, SBI, FLAG, NANR, NANC,
                     OUT, CNT, M, N, K, alpha, NP: tl.constexpr,
                     QM: tl.constexpr, QN: tl.constexpr, FS: tl.constexpr,
                     RESID: tl.constexpr, F32DOT: tl.constexpr, ASM: tl.constexpr,
                     ALPHA: tl.constexpr, OUTK: tl.constexpr, SLICES: tl.constexpr):
        """One QM x QN block of a tile ``_plan_kernel`` flagged: every path, GENERAL included.
        FS: the block is 1 / FS of a statistics block (BM/2 x BN/2) each way; it takes its path
        per step from that block's statistics (bounds of a larger block hold for its part) and
        its own C.  Each step's operand tiles (``_ops``: AF / BF the dot operands a * s_a; AG /
        BG GENERAL's, ue8m0: the e2m1 values alone), exponent words and statistics are loaded
        a step ahead, so their latency overlaps the step before (the loop is not pipelined
        for us: its paths branch).  NZA / NZB: the -0 words (ue8m0, ``_settle_neg0``).
        RESID: 0 ue4m3 (scales folded into AF / BF), 1 ue8m0 block 16, 2 ue8m0 block 32
        (groups 0 / 1 and 2 / 3 share their scales)."""
        qm = tl.program_id(0) // FS        # the statistics blocks
        qn = tl.program_id(1) // FS
        nqn = tl.num_programs(1) // FS
        # a flagged tile's blocks but those flagged 2 (``_general_kernel``'s)
        own = tl.load(FLAG + qm * nqn + qn)
        if (_tile_flag(FLAG, qm // 2, qn // 2, nqn) != 0) & (own != 2):
            rows = tl.program_id(0) * QM + tl.arange(0, QM)
            cols = tl.program_id(1) * QN + tl.arange(0, QN)
            rmask = rows < M
            cmask = cols < N
            sa = SA + qm * 3 * NP
            sai = SAI + qm * 3 * NP
            sb = SB + qn * 3 * NP
            sbi = SBI + qn * 3 * NP
            C = tl.zeros((QM, QN), tl.float32)
            CB = tl.max(tl.zeros((2,), tl.float64))
            n0 = tl.max(tl.zeros((2,), tl.int32))
            n1 = n0
            n2 = n0
            opsn = _ops(AF, BF, AG, BG, rows, rmask, cols, cmask, 0, K, RESID, SLICES)
            wan, wbn = _words(EA, EB, rows, rmask, cols, cmask, 0, NP)
            stn = _stats(sa, sai, sb, sbi, 0, NP)
            for p in range(0, NP):
                ops, wa, wb, st = opsn, wan, wbn, stn
                q = tl.minimum(p + 1, NP - 1)     # the next step's loads, in flight meanwhile
                opsn = _ops(AF, BF, AG, BG, rows, rmask, cols, cmask, q, K, RESID, SLICES)
                wan, wbn = _words(EA, EB, rows, rmask, cols, cmask, q, NP)
                stn = _stats(sa, sai, sb, sbi, q, NP)
                C, CB, k = _step(C, ops, wa, wb, st, CB, EA, EB, rows, rmask, cols, cmask, p, NP,
                                 RESID, F32DOT, ASM, SLICES)
                n0 += (k == 0).to(tl.int32)
                n1 += (k == 1).to(tl.int32)
                n2 += (k == 2).to(tl.int32)
            if RESID:
                C = _settle_neg0(C, AF, BF, AG, BG, EA, EB, NZA, NZB, rows, rmask, cols, cmask,
                                 K, NP, RESID, F32DOT, ASM, SLICES)
            _store(OUT, C, rows, rmask, cols, cmask, NANR, NANC, N, alpha, ALPHA, OUTK)
            tl.atomic_add(CNT + 0, n0)
            tl.atomic_add(CNT + 1, n1)
            tl.atomic_add(CNT + 2, n2)

    @triton.jit
    def _general_kernel(AF, BF, AG, BG, NZA, NZB, EA, EB, FLAG, NANR, NANC, OUT, CNT, M, N, K,
                        alpha, NP: tl.constexpr, QM: tl.constexpr, QN: tl.constexpr,
                        FS: tl.constexpr, GS: tl.constexpr, RESID: tl.constexpr,
                        F32DOT: tl.constexpr, ASM: tl.constexpr, ALPHA: tl.constexpr,
                        OUTK: tl.constexpr, SLICES: tl.constexpr, STAGES: tl.constexpr):
        """One QM x QN block (QN: 1 / GS of ``_full_kernel``'s) of a statistics block pair
        flagged 2 (FAST's conditions fail at gen_pct% of its instructions or more): GENERAL at
        every step, as ``_full_kernel`` runs it at its GENERAL steps, bit for bit.  No branch
        in the loop, so Triton pipelines it: each step's group slices and exponent words are
        copied to shared memory STAGES - 1 steps ahead (cp.async), and no fence before a dot
        waits for the next step's loads (on the H200 this took MXFP4's full ue8m0 range from
        43.3 to 38.4 ms at 64 x 64; at 64 x 32, two blocks per SM, to 28.9:
        reports/baselines/chain-general/session20-variants.md)."""
        qm = tl.program_id(0) // FS
        qn = tl.program_id(1) // (FS * GS)
        nqn = tl.num_programs(1) // (FS * GS)
        if tl.load(FLAG + qm * nqn + qn) == 2:
            rows = tl.program_id(0) * QM + tl.arange(0, QM)
            cols = tl.program_id(1) * QN + tl.arange(0, QN)
            rmask = rows < M
            cmask = cols < N
            C = tl.zeros((QM, QN), tl.float32)
            for p in tl.range(0, NP, num_stages=STAGES):
                ops = _ops(AF, BF, AG, BG, rows, rmask, cols, cmask, p, K, RESID, SLICES)
                wa, wb = _words(EA, EB, rows, rmask, cols, cmask, p, NP)
                C, _ = _general(C, ops, wa, wb, RESID, F32DOT, ASM, SLICES)
            if RESID:
                C = _settle_neg0(C, AF, BF, AG, BG, EA, EB, NZA, NZB, rows, rmask, cols, cmask,
                                 K, NP, RESID, F32DOT, ASM, SLICES)
            _store(OUT, C, rows, rmask, cols, cmask, NANR, NANC, N, alpha, ALPHA, OUTK)
            if tl.program_id(1) % GS == 0:   # counted in _full_kernel's QM x QN blocks
                tl.atomic_add(CNT + 2, NP)


# --- host side ----------------------------------------------------------------------

def _config() -> dict:
    """Tile sizes: CONFIG (interpreter: small tiles), updated by FP4REF_CHAIN_CONFIG (read at
    every call: ``parse_config``; experiments, bench_chain's side-by-side configs)."""
    cfg = dict(_INTERP_CONFIG if interpreting() else CONFIG)
    env = os.environ.get("FP4REF_CHAIN_CONFIG")
    if env:
        cfg.update(parse_config(env, "FP4REF_CHAIN_CONFIG"))
    qm, qn = cfg["BM"] // (2 * cfg["full_split"]), cfg["BN"] // (2 * cfg["full_split"])
    if not interpreting() and min(qm, qn // cfg["gen_split"]) < 16:   # tl.dot's minimum
        raise ValueError(f"FP4REF_CHAIN_CONFIG: {env!r} gives {qm} x {qn} blocks ({qm} x "
                         f"{qn // cfg['gen_split']} GENERAL-only); valid choices: BM / (2 "
                         "full_split) and BN / (2 full_split gen_split) at least 16")
    return cfg


CONFIG_KEYS = ("BM", "BN", "num_warps", "num_stages", "GROUP_M", "full_warps", "full_split",
               "gen_split", "gen_warps", "gen_stages", "gen_pct")


def parse_config(text: str, name: str = "config") -> dict:
    """"BM,BN,num_warps,num_stages[,GROUP_M[,full_warps[,full_split[,gen_split[,gen_warps[,
    gen_stages[,gen_pct]]]]]]]" -> CONFIG keys (e.g. "64,128,4,3"; full_warps: the warps of
    the GENERAL-capable kernel; full_split: it runs on BM/(2 full_split) x BN/(2 full_split)
    blocks, 1 or 2; gen_*: the GENERAL-only kernel's column split (1, 2, 4), warps, stages and
    the share of non-FAST instructions, 1-100%, from which a block takes it)."""
    try:
        vals = [int(v) for v in text.split(",")]
    except ValueError:
        vals = []
    if not 4 <= len(vals) <= len(CONFIG_KEYS):
        raise ValueError(f"{name}: {text!r} is not 'BM,BN,num_warps,num_stages[,GROUP_M"
                         "[,full_warps[,full_split[,gen_split[,gen_warps[,gen_stages"
                         "[,gen_pct]]]]]]]' "
                         "(integers, e.g. '128,128,8,3')")
    cfg = dict(zip(CONFIG_KEYS, vals))
    if cfg["BM"] not in (32, 64, 128, 256) or cfg["BN"] not in (32, 64, 128, 256):
        raise ValueError(f"{name}: BM={cfg['BM']}, BN={cfg['BN']}; valid choices: BM and BN in "
                         "32, 64, 128, 256")
    for k in ("num_warps", "full_warps", "gen_warps"):
        if k in cfg and cfg[k] not in (1, 2, 4, 8, 16):
            raise ValueError(f"{name}: {k}={cfg[k]}; valid choices: 1, 2, 4, 8, 16")
    for k, ok in (("full_split", (1, 2)), ("gen_split", (1, 2, 4))):
        if cfg.get(k, 1) not in ok:
            raise ValueError(f"{name}: {k}={cfg[k]}; valid choices: "
                             + ", ".join(map(str, ok)))
    for k in ("num_stages", "GROUP_M", "gen_stages"):
        if cfg.get(k, 1) < 1:
            raise ValueError(f"{name}: {k}={cfg[k]}; valid choices: integers >= 1")
    if not 1 <= cfg.get("gen_pct", 1) <= 100:
        raise ValueError(f"{name}: gen_pct={cfg['gen_pct']}; valid choices: 1 to 100")
    return cfg


def _codes(name: str, x, rows: int, K: int) -> tuple[torch.Tensor, bool]:
    """(contiguous uint8 codes, packed?): packed [rows, K/2] or one code per byte [rows, K]."""
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        raise ValueError(f"{name}: expected a 2-D tensor of e2m1 codes, got "
                         f"{getattr(x, 'shape', type(x).__name__)}")
    if x.dtype == torch.float4_e2m1fn_x2:
        x = x.view(torch.uint8)
    if x.dtype != torch.uint8:
        raise ValueError(f"{name}: dtype {x.dtype} is not supported; valid choices: "
                         "torch.uint8, torch.float4_e2m1fn_x2")
    if x.shape[0] != rows or x.shape[1] not in (K // 2, K):
        raise ValueError(f"{name}: shape {list(x.shape)} does not match [{rows}, {K // 2}] "
                         f"(packed) or [{rows}, {K}] (one code per byte)")
    return x.contiguous(), x.shape[1] * 2 == K


def _prepare(codes, packed: bool, scales, K: int, RB: int, nblocks: int, sf: str, block: int,
             gen: bool):
    """The prepass of one operand: (bf16 a * s_a, bf16 a (gen) or the same, int8 group
    exponents [R, K/16], block statistics float32 [nblocks, 3, NP], int32 NaN rows, int64 -0
    words [R, NP, 2] (gen) or the group exponents)."""
    R, dev, NP = codes.shape[0], codes.device, K // 64
    outf = torch.empty(R, K, dtype=torch.bfloat16, device=dev)
    outg = torch.empty(R, K, dtype=torch.bfloat16, device=dev) if gen else outf
    exps = torch.empty(R, K // 16, dtype=torch.int8, device=dev)
    st = torch.zeros(nblocks, 3, NP, dtype=torch.float32, device=dev)
    nan = torch.zeros(R, dtype=torch.int32, device=dev)
    nz = torch.empty(R, NP, 2, dtype=torch.int64, device=dev) if gen else exps
    PC = max(1, 4096 // (RB * 32))          # 4096 words per program: no register spills
    grid = (triton.cdiv(R, RB), triton.cdiv(NP, PC))
    _prep_kernel[grid](codes, scales, outf.view(torch.int32), outg.view(torch.int32), exps, st,
                       st.view(torch.int32), nan, nz, R, codes.shape[1], K // 2, scales.shape[1],
                       K // 16, NP, RB=RB, PC=PC, PACKED=packed, UE8=sf == "ue8m0", BLOCK=block,
                       GEN=gen, FOLD=_FOLD, num_warps=8)
    return outf, outg, exps, st, nan, nz


def _check_args(scale_a, scale_bt, M: int, N: int, scale_format: str, block: int, alpha,
                out_dtype) -> int:
    if scale_format not in SCALE_BLOCKS:
        raise ValueError(f"scale_format: unknown value {scale_format!r}; valid choices: "
                         + ", ".join(SCALE_BLOCKS))
    if block not in SCALE_BLOCKS[scale_format]:
        raise ValueError(f"block: unknown value {block!r} for scale_format {scale_format!r}; "
                         "valid choices: " + ", ".join(map(str, SCALE_BLOCKS[scale_format])))
    if out_dtype not in _OUT_KIND:
        raise ValueError(f"out_dtype: unknown value {out_dtype!r}; valid choices: "
                         + ", ".join(map(str, _OUT_KIND)))
    if alpha is not None and (isinstance(alpha, bool) or not isinstance(alpha, (int, float))
                              or float(torch.tensor(float(alpha), dtype=torch.float32)) != alpha
                              or not torch.isfinite(torch.tensor(float(alpha)))):
        raise ValueError(f"alpha: {alpha!r} is not a finite FP32 value; valid choices: None or "
                         "a float equal to its float32 rounding (the combined per-tensor scale)")
    for name, s, rows in (("scale_a", scale_a, M), ("scale_bt", scale_bt, N)):
        if not isinstance(s, torch.Tensor) or s.dtype != torch.uint8 or s.dim() != 2 \
                or s.shape[0] != rows:
            raise ValueError(f"{name}: expected uint8 raw scale bytes [{rows}, K/{block}], got "
                             f"{getattr(s, 'dtype', type(s).__name__)} "
                             f"{list(getattr(s, 'shape', []))}")
    K = scale_a.shape[1] * block
    if scale_bt.shape[1] != scale_a.shape[1] or K % 64:
        raise ValueError(f"scale_bt: shape {list(scale_bt.shape)} and scale_a "
                         f"{list(scale_a.shape)} need the same K/{block} columns, K a multiple "
                         "of 64 (one kind::mxf4nvf4 instruction)")
    return K


def _launch(cfg, A, B, out, cnt, M: int, N: int, K: int, alpha, resid: int) -> None:
    """The plan, then the FAST kernel on unflagged BM x BN tiles, the GENERAL-capable kernel
    on the BM/(2 FS) x BN/(2 FS) blocks of flagged ones (FS: full_split) and the GENERAL-only
    kernel on those of them with no FAST instruction (all three launched, each skips the
    others' blocks)."""
    (af, ag, ea, sa, nanr, nza), (bf, bg, eb, sb, nanc, nzb) = A, B
    BM, BN, interp = cfg["BM"], cfg["BN"], interpreting()
    FS = cfg["full_split"]
    QM, QN = BM // (2 * FS), BN // (2 * FS)
    nqm, nqn = 2 * triton.cdiv(M, BM), 2 * triton.cdiv(N, BN)
    flag = torch.empty(nqm, nqn, dtype=torch.int32, device=out.device)
    gmin = max(1, -(-(K // 64) * cfg["gen_pct"] // 100))    # ceil(NP gen_pct / 100)
    _plan_kernel[(nqm, nqn)](sa, sa.view(torch.int32), sb, sb.view(torch.int32), flag, gmin,
                             NP=K // 64, num_warps=1)
    common = dict(NP=K // 64, F32DOT=interp, ASM=not interp, ALPHA=alpha is not None,
                  OUTK=_OUT_KIND[out.dtype], FS=FS)
    o = out.view(torch.int32 if out.dtype == torch.float32 else torch.int16)
    al = 1.0 if alpha is None else float(alpha)
    ea, eb = ea.view(torch.int32), eb.view(torch.int32)      # [R, NP]: four groups per word
    sai, sbi = sa.view(torch.int32), sb.view(torch.int32)
    _fast_kernel[(nqm // 2 * (nqn // 2),)](
        _desc(af, BM), _desc(bf, BN), ea, eb, sai, sbi, flag, nanr, nanc, o, cnt, M, N, al,
        BM=BM, BN=BN, GROUP_M=cfg["GROUP_M"], num_stages=cfg["num_stages"],
        num_warps=cfg["num_warps"], **common)
    slices = _general_mode() == "slices"
    _full_kernel[(FS * nqm, FS * nqn)](
        af, bf, ag, bg, nza, nzb, ea, eb, sa, sai, sb, sbi, flag, nanr, nanc, o, cnt, M, N, K, al,
        QM=QM, QN=QN, RESID=resid, SLICES=slices, num_stages=1, num_warps=cfg["full_warps"],
        **common)
    GS = cfg["gen_split"]
    _general_kernel[(FS * nqm, FS * nqn * GS)](
        af, bf, ag, bg, nza, nzb, ea, eb, flag, nanr, nanc, o, cnt, M, N, K, al, QM=QM,
        QN=QN // GS, GS=GS, RESID=resid, SLICES=slices, STAGES=cfg["gen_stages"],
        num_warps=cfg["gen_warps"], maxnreg=None if interp else _GEN_MAXNREG[resid], **common)


GENERAL_MODES = ("masked", "slices")


def _general_mode() -> str:
    """How GENERAL gets its four group dots (FP4REF_CHAIN_GENERAL, read at every call):
    "slices" (one K = 16 dot per group of the groups' slices) or "masked" (four masked K = 64
    dots of the instruction's tiles); both loaded a step ahead."""
    mode = os.environ.get("FP4REF_CHAIN_GENERAL", GENERAL_DEFAULT)
    if mode not in GENERAL_MODES:
        raise ValueError(f"FP4REF_CHAIN_GENERAL: unknown value {mode!r}; valid choices: "
                         + ", ".join(GENERAL_MODES))
    return mode


def _desc(t: torch.Tensor, rows: int, width: int = 64):
    """A TMA descriptor of a [R, K] bf16 operand in tiles of [rows, width] (zero padding)."""
    from triton.tools.tensor_descriptor import TensorDescriptor
    return TensorDescriptor.from_tensor(t, [rows, width])


def chain_mm(a: torch.Tensor, bt: torch.Tensor, scale_a: torch.Tensor, scale_bt: torch.Tensor, *,
             scale_format: str, block: int, alpha: float | None = None,
             out_dtype: torch.dtype = torch.float32, counts: torch.Tensor | None = None):
    """``blackwell-mxf4nvf4`` on CUDA (or the Triton interpreter): D [M, N] = alpha * (A @ B^T)
    as the chained kind::mxf4nvf4 instructions compute it (module doc).

    a [M, K/2] / bt [N, K/2]: packed e2m1 bytes (or [M, K] / [N, K], one code per byte;
    codes are not range-checked here); scale_a [M, K/block] / scale_bt [N, K/block]: raw
    uint8 scale bytes ("ue4m3": e4m3 bytes, sign ignored, block 16; "ue8m0": block 32 or 16);
    alpha: None or an FP32 value (the combined per-tensor scale)."""
    if not (available() or (HAVE_TRITON and interpreting())):
        raise ValueError("chain_mm: needs Triton and a CUDA device (or TRITON_INTERPRET=1); "
                         "valid choices elsewhere: fp4ref.scaled_mm's torch path")
    M, N = a.shape[0], bt.shape[0]
    K = _check_args(scale_a, scale_bt, M, N, scale_format, block, alpha, out_dtype)
    a, pa = _codes("a", a, M, K)
    bt, pb = _codes("bt", bt, N, K)
    dev = a.device
    if M == 0 or N == 0 or K == 0:
        y = torch.zeros(M, N, dtype=torch.float32, device=dev)
        return (y if alpha is None else y * alpha).to(out_dtype)
    cfg = _config()
    BM, BN = cfg["BM"], cfg["BN"]
    gen = scale_format == "ue8m0"
    nmt = triton.cdiv(M, BM)
    A = _prepare(a, pa, scale_a.contiguous(), K, BM // 2, 2 * nmt, scale_format, block, gen)
    B = _prepare(bt, pb, scale_bt.contiguous(), K, BN // 2, 2 * triton.cdiv(N, BN),
                 scale_format, block, gen)
    out = torch.empty(M, N, dtype=out_dtype, device=dev)
    cnt = counts if counts is not None else torch.zeros(3, dtype=torch.int32, device=dev)
    # RESID: 0 ue4m3 (scales folded into the operands), 1 ue8m0 block 16, 2 ue8m0 block 32
    _launch(cfg, A, B, out, cnt, M, N, K, alpha, 0 if not gen else 2 if block == 32 else 1)
    return out
