"""The Triton kernels of ``fp4ref.gemm_triton`` (the proofs: the package's docstring).

``launch.kernels()`` executes this module once per TRITON_INTERPRET mode, at first use:
``triton.jit`` chooses interpreter or compiler when it decorates a function, and the
variable may be set after fp4ref is imported.  The jit helpers (``_add_rz`` ...) are plain
module globals, where Triton looks callees up.

Entry points (``launch.Kernels`` names them): ``_pair_kernel`` / ``_block_kernel`` /
``_mx_kernel`` / ``_wide_kernel`` (the routed GEMM tiles), ``_decoded_kernel``
(decoded_fp32), ``_decode_kernel``
(codes -> exact bf16 operands, sums of squares, code-range check), ``_bounds_kernel`` (the
pair certificate's per-tile bounds and the special rows).  Kernels and their names are
unchanged from the single-module version: the names are symbols in the SASS, which stays
identical (scripts/sass_digest.py).
"""
import triton
import triton.language as tl
from triton.language.extra.cuda import libdevice


@triton.jit
def _add_rz(x, y, RZ: tl.constexpr):
    if RZ == 0:   # PTX add.rz.f32 (no .ftz): keeps subnormals
        return tl.inline_asm_elementwise("add.rz.f32 $0, $1, $2;", "=f,f,f", [x, y],
                                         dtype=tl.float32, is_pure=True, pack=1)
    if RZ == 2:
        return libdevice.add_rz(x, y)
    # TwoSum: s = RN(x + y), e = exact error; RZ is s, or s one step toward zero
    s = x + y
    bb = s - x
    e = (x - (s - bb)) + (y - bb)
    bits = s.to(tl.int32, bitcast=True)
    adj = (e != 0) & ((e < 0) != (s < 0))
    r = tl.where(adj, (bits - 1).to(tl.float32, bitcast=True), s)
    fmax = 3.4028234663852886e38
    ovf = (tl.abs(x) <= fmax) & (tl.abs(y) <= fmax) & (tl.abs(s) > fmax)
    return tl.where(ovf, tl.where(s < 0, -fmax, fmax), r)


@triton.jit
def _add_rn(x, y, ASM: tl.constexpr):
    # opaque to the compiler: Triton rewrites dot(a, b) + c into dot(a, b, acc=c), which
    # would move this RNE add into the tensor core's own accumulation
    if ASM:
        return tl.inline_asm_elementwise("add.rn.f32 $0, $1, $2;", "=f,f,f", [x, y],
                                         dtype=tl.float32, is_pure=True, pack=1)
    return x + y


@triton.jit
def _tile(tiles, pid, M, N, NT, BM: tl.constexpr, BN: tl.constexpr):
    t = tl.load(tiles + pid)
    tm = t // NT
    tn = t % NT
    rm = tm * BM + tl.arange(0, BM)
    rn = tn * BN + tl.arange(0, BN)
    return rm, rn


@triton.jit
def _dot(a, b, F32: tl.constexpr):
    if F32:  # the interpreter's bf16 dot is unreliable; fp32 inputs are exact too
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    return tl.dot(a, b)


@triton.jit
def _pair_kernel(A, B, C, tiles, M, N, K: tl.constexpr, NT, alpha,
                 BM: tl.constexpr, BN: tl.constexpr, RZ: tl.constexpr, F32: tl.constexpr,
                 ALPHA: tl.constexpr):
    pid = tl.program_id(0)
    rm, rn = _tile(tiles, pid, M, N, NT, BM, BN)
    rk = tl.arange(0, 32)
    mm = rm < M
    nm = rn < N
    ap = A + rm[:, None].to(tl.int64) * K + rk[None, :]
    bp = B + rn[None, :].to(tl.int64) * K + rk[:, None]
    outer = tl.zeros((BM, BN), dtype=tl.float32)
    for g in range(0, K, 64):
        k0 = g + rk
        k1 = g + 32 + rk
        a0 = tl.load(ap + g, mask=mm[:, None] & (k0[None, :] < K), other=0.0)
        b0 = tl.load(bp + g, mask=nm[None, :] & (k0[:, None] < K), other=0.0)
        a1 = tl.load(ap + g + 32, mask=mm[:, None] & (k1[None, :] < K), other=0.0)
        b1 = tl.load(bp + g + 32, mask=nm[None, :] & (k1[:, None] < K), other=0.0)
        t0 = _dot(a0, b0, F32)
        t1 = _dot(a1, b1, F32)
        outer = _add_rz(outer, _add_rn(t0, t1, not F32), RZ)
    if ALPHA:
        outer = outer * alpha
    cp = C + rm[:, None].to(tl.int64) * N + rn[None, :]
    tl.store(cp, outer, mask=mm[:, None] & nm[None, :])


@triton.jit
def _block_kernel(A, B, C, MA, QB, tiles, M, N, K: tl.constexpr, NT, NG, alpha,
                  BM: tl.constexpr, BN: tl.constexpr, RZ: tl.constexpr, F32: tl.constexpr,
                  ALPHA: tl.constexpr):
    pid = tl.program_id(0)
    rm, rn = _tile(tiles, pid, M, N, NT, BM, BN)
    rk = tl.arange(0, 16)
    mm = rm < M
    nm = rn < N
    ap = A + rm[:, None].to(tl.int64) * K + rk[None, :]
    bp = B + rn[None, :].to(tl.int64) * K + rk[:, None]
    outer = tl.zeros((BM, BN), dtype=tl.float32)
    for g in range(0, K, 64):
        gi = g // 64
        ma = tl.load(MA + rm.to(tl.int64) * NG + gi, mask=mm, other=1.0)
        qb = tl.load(QB + rn.to(tl.int64) * NG + gi, mask=nm, other=1.0)
        m0 = ma[:, None] * qb[None, :]           # 1.5 * 2**23 * Q, exact
        r = m0
        lo = tl.zeros((BM, BN), dtype=tl.float32)
        for j in tl.static_range(4):
            kk = g + 16 * j + rk
            a = tl.load(ap + g + 16 * j, mask=mm[:, None] & (kk[None, :] < K), other=0.0)
            b = tl.load(bp + g + 16 * j, mask=nm[None, :] & (kk[:, None] < K), other=0.0)
            t = _dot(a, b, F32)
            r2 = _add_rn(r, t, not F32)           # t rounded to a multiple of Q
            lo = lo + (t - (r2 - r))              # exact remainder, exact sum
            r = r2
        s = (r - m0) + lo                         # one RNE rounding of the exact sum
        outer = _add_rz(outer, s, RZ)
    if ALPHA:  # the epilogue's scalar alpha, one FP32 RNE product (no add follows: no FMA)
        outer = outer * alpha
    cp = C + rm[:, None].to(tl.int64) * N + rn[None, :]
    tl.store(cp, outer, mask=mm[:, None] & nm[None, :])


@triton.jit
def _two_sum(x, y):
    # Knuth's TwoSum (float64): s = RN(x + y) and the exact error e = (x + y) - s, for any
    # finite x, y without overflow (no ordering condition); no multiply, so nothing to contract
    s = x + y
    bb = s - x
    e = (x - (s - bb)) + (y - bb)
    return s, e


@triton.jit
def _wide_kernel(A, B, C, FLAG, tiles, M, N, K: tl.constexpr, NT, alpha,
                 BM: tl.constexpr, BN: tl.constexpr, SBM: tl.constexpr, SBN: tl.constexpr,
                 RZ: tl.constexpr, F32: tl.constexpr, ALPHA: tl.constexpr,
                 EXACT: tl.constexpr):
    # one SBM x SBN sub-tile of a WIDE tile (float64 state per output: smaller tiles spill less);
    # EXACT: the scale format's span proves the error sum exact (``tables.wide_exact``)
    pid = tl.program_id(0)
    nsn: tl.constexpr = BN // SBN
    nsub: tl.constexpr = (BM // SBM) * nsn
    t = tl.load(tiles + pid // nsub)
    sub = pid % nsub
    rm = (t // NT) * BM + (sub // nsn) * SBM + tl.arange(0, SBM)
    rn = (t % NT) * BN + (sub % nsn) * SBN + tl.arange(0, SBN)
    rk = tl.arange(0, 16)
    mm = rm < M
    nm = rn < N
    ap = A + rm[:, None].to(tl.int64) * K + rk[None, :]
    bp = B + rn[None, :].to(tl.int64) * K + rk[:, None]
    outer = tl.zeros((SBM, SBN), dtype=tl.float32)
    bad = tl.zeros((SBM, SBN), dtype=tl.int32)
    for g in range(0, K, 64):
        s = tl.zeros((SBM, SBN), dtype=tl.float64)
        f = tl.zeros((SBM, SBN), dtype=tl.float64)
        for j in tl.static_range(4):
            kk = g + 16 * j + rk
            a = tl.load(ap + g + 16 * j, mask=mm[:, None] & (kk[None, :] < K), other=0.0)
            b = tl.load(bp + g + 16 * j, mask=nm[None, :] & (kk[:, None] < K), other=0.0)
            tb = _dot(a, b, F32).to(tl.float64)   # exact block dot, exact in float64
            s, e = _two_sum(s, tb)                # sum = s + (errors so far), exactly
            if EXACT:
                f = f + e                         # exact by the span proof
            else:
                f, q = _two_sum(f, e)             # errors summed; q != 0: not exactly
                bad = bad | (q != 0).to(tl.int32)
        hi, lo = _two_sum(s, f)                   # hi = RN64(exact sum), lo = remainder
        # round to odd at 53 bits (hi, or its neighbour toward lo, whichever is odd), then
        # one RNE conversion: RN32(RO64(x)) = RN32(x) since 53 >= 24 + 2
        hb = hi.to(tl.int64, bitcast=True)
        step = tl.where((lo > 0) == (hi > 0), 1, -1).to(tl.int64)
        ro = tl.where((lo != 0) & ((hb & 1) == 0), (hb + step).to(tl.float64, bitcast=True), hi)
        outer = _add_rz(outer, ro.to(tl.float32), RZ)
    if ALPHA:  # the epilogue's scalar alpha, one FP32 RNE product (no add follows: no FMA)
        outer = outer * alpha
    cp = C + rm[:, None].to(tl.int64) * N + rn[None, :]
    tl.store(cp, outer, mask=mm[:, None] & nm[None, :])
    if not EXACT:
        nbad = tl.max(tl.max(bad, axis=1), axis=0)
        tl.atomic_max(FLAG + t, nbad, mask=nbad > 0)   # the fix-up recomputes the tile


@triton.jit
def _mx_kernel(A, B, C, FA, FB, tiles, M, N, K: tl.constexpr, NT, NB, alpha,
               BM: tl.constexpr, BN: tl.constexpr, RZ: tl.constexpr, F32: tl.constexpr,
               ALPHA: tl.constexpr):
    pid = tl.program_id(0)
    rm, rn = _tile(tiles, pid, M, N, NT, BM, BN)
    rk = tl.arange(0, 32)
    mm = rm < M
    nm = rn < N
    ap = A + rm[:, None].to(tl.int64) * K + rk[None, :]
    bp = B + rn[None, :].to(tl.int64) * K + rk[:, None]
    outer = tl.zeros((BM, BN), dtype=tl.float32)
    for g in range(0, K, 64):
        s = tl.zeros((BM, BN), dtype=tl.float32)
        for j in tl.static_range(2):
            kk = g + 32 * j + rk
            a = tl.load(ap + g + 32 * j, mask=mm[:, None] & (kk[None, :] < K), other=0.0)
            b = tl.load(bp + g + 32 * j, mask=nm[None, :] & (kk[:, None] < K), other=0.0)
            blk = (g + 32 * j) // 32
            fa = tl.load(FA + rm.to(tl.int64) * NB + blk, mask=mm & (blk < NB), other=0.0)
            fb = tl.load(FB + rn.to(tl.int64) * NB + blk, mask=nm & (blk < NB), other=0.0)
            t = _dot(a, b, F32) * (fa[:, None] * fb[None, :])  # exact (range-checked)
            s = _add_rn(s, t, not F32)                         # t0 + t1: one RNE rounding
        outer = _add_rz(outer, s, RZ)
    if ALPHA:  # the epilogue's scalar alpha, one FP32 RNE product (no add follows: no FMA)
        outer = outer * alpha
    cp = C + rm[:, None].to(tl.int64) * N + rn[None, :]
    tl.store(cp, outer, mask=mm[:, None] & nm[None, :])


@triton.jit
def _decoded_kernel(AT, BT, C, M, N, K: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
    pm = tl.program_id(0)
    pn = tl.program_id(1)
    rm = pm * BM + tl.arange(0, BM)
    rn = pn * BN + tl.arange(0, BN)
    mm = rm < M
    nm = rn < N
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, K):
        a = tl.load(AT + k * M + rm, mask=mm, other=0.0)
        b = tl.load(BT + k * N + rn, mask=nm, other=0.0)
        acc = acc + a[:, None] * b[None, :]   # exact product: FP32 RNE add (FMA or not)
    cp = C + rm[:, None].to(tl.int64) * N + rn[None, :]
    tl.store(cp, acc, mask=mm[:, None] & nm[None, :])


@triton.jit
def _e2m1_val(c):
    # e2m1 code -> float32 bits: m = 1 is 0.5; m >= 2 is (1 + (m & 1) / 2) * 2**((m >> 1) - 1)
    m = c & 7
    bits = tl.where(m >= 2, ((126 + (m >> 1)) << 23) | ((m & 1) << 22),
                    tl.where(m == 1, 126 << 23, 0))
    return (bits | ((c >> 3) << 31)).to(tl.float32, bitcast=True)


@triton.jit
def _decode_kernel(CODES, SC, SLUT, VLUT, OUT, SQ, STATS, NBT, LIMC, LIMS, HB: tl.constexpr,
                   NBP: tl.constexpr, PACKED: tl.constexpr, SCALE: tl.constexpr,
                   WANT_SQ: tl.constexpr, I64: tl.constexpr, CHECK: tl.constexpr):
    # operand blocks are contiguous: block i = code words [i*HB, (i+1)*HB) (a word = two
    # codes: a packed byte, or two one-code bytes read as int16), scale code i, output
    # int32 words [i*HB, (i+1)*HB) holding two bf16 values (low half first)
    pid = tl.program_id(0)
    if I64:
        bi = pid.to(tl.int64) * NBP + tl.arange(0, NBP)
    else:
        bi = pid * NBP + tl.arange(0, NBP)
    bm = bi < NBT
    off = bi[:, None] * HB + tl.arange(0, HB)[None, :]
    w = tl.load(CODES + off, mask=bm[:, None], other=0).to(tl.int32)
    if CHECK:  # code-range check (host reads STATS later); SLUT has 256 entries
        if not PACKED:
            cm = tl.maximum(tl.max(w & 255), tl.max((w >> 8) & 255))
            tl.atomic_max(STATS, cm, mask=cm >= LIMC)   # only bad codes: no contention
        sm = tl.max(tl.load(SC + bi, mask=bm, other=0).to(tl.int32))
        tl.atomic_max(STATS + 1, sm, mask=sm >= LIMS)
    lo = w & 15
    if PACKED:
        hi = (w >> 4) & 15
    else:
        hi = (w >> 8) & 15
    vlo = _e2m1_val(lo)               # e2m1 values, by their float32 bits
    vhi = _e2m1_val(hi)
    if WANT_SQ:                       # multiples of 1/4 below 2**11: exact in any order
        tl.store(SQ + bi, tl.sum(vlo * vlo + vhi * vhi, axis=1), mask=bm)
    if SCALE:
        sc = tl.load(SC + bi, mask=bm, other=0).to(tl.int32)
        s = tl.load(SLUT + sc)        # scale value, 0 where not finite
        vlo = vlo * s[:, None]        # exact: <= 6 significant bits, in bf16's range
        vhi = vhi * s[:, None]
    ulo = vlo.to(tl.uint32, bitcast=True)
    uhi = vhi.to(tl.uint32, bitcast=True)
    word = (uhi & 0xFFFF0000) | (ulo >> 16)   # bf16 = high half of the (exact) fp32
    tl.store(OUT + off, word.to(tl.int32, bitcast=True), mask=bm[:, None])


@triton.jit
def _bounds_kernel(SQA, SCA, SQB, SCB, XN, BAD, STATS, SQRT, SANE, UE1, NF, RA, RB, MT, TA, TB,
                   NB, NBP, SQN, NP: tl.constexpr, TM: tl.constexpr, PC: tl.constexpr,
                   XON: tl.constexpr):
    # one row tile of A (t < MT) or B: XN[t, b] = max over the tile's rows of the
    # pair-normalized bound X * 2**-up (``side_bounds`` + ``pair_norm`` of ``route_bounds``,
    # same float64 operations); BAD[row] = a non-finite scale in the row
    t = tl.program_id(0)
    isa = t < MT
    if isa:
        sqp = SQA
        scp = SCA
    else:
        sqp = SQB
        scp = SCB
    R = tl.where(isa, RA, RB)
    T = tl.where(isa, TA, TB)
    r0 = tl.where(isa, t * TA, (t - MT) * TB)
    ri = tl.arange(0, TM)
    rows = r0 + ri
    rm = (ri < T) & (rows < R)
    roff = rows.to(tl.int64) * NB
    cst = tl.load(SQRT + SQN)              # 1 + 2**-40 (float64)
    bad = tl.zeros((TM,), dtype=tl.int32)
    for p0 in range(0, NP, PC):          # NP = NBP / 2 pairs (constexpr, as K elsewhere)
        c0 = 2 * (p0 + tl.arange(0, PC))
        c1 = c0 + 1
        m0 = rm[:, None] & (c0[None, :] < NB)
        m1 = rm[:, None] & (c1[None, :] < NB)
        s0 = tl.load(scp + roff[:, None] + c0[None, :], mask=m0, other=0).to(tl.int32)
        s1 = tl.load(scp + roff[:, None] + c1[None, :], mask=m1, other=0).to(tl.int32)
        bad = tl.maximum(bad, tl.max(tl.maximum(tl.load(NF + s0), tl.load(NF + s1)), axis=1))
        if XON:
            q0 = tl.load(sqp + roff[:, None] + c0[None, :], mask=m0, other=0.0)
            q1 = tl.load(sqp + roff[:, None] + c1[None, :], mask=m1, other=0.0)
            # |s| * sqrt(sq) * (1 + 2**-40): sq is a multiple of 1/4, sqrt by table
            k0 = tl.minimum((q0 * 4).to(tl.int32), SQN - 1)   # <= 144 * block anyway
            k1 = tl.minimum((q1 * 4).to(tl.int32), SQN - 1)
            x0 = tl.load(SANE + s0) * tl.load(SQRT + k0) * cst
            x1 = tl.load(SANE + s1) * tl.load(SQRT + k1) * cst
            u0 = tl.where(x0 > 0, tl.load(UE1 + s0), 1 << 20)
            u1 = tl.where(x1 > 0, tl.load(UE1 + s1), 1 << 20)
            e = tl.minimum(tl.maximum(-tl.minimum(u0, u1), -1022), 1022)
            p2 = ((e + 1023).to(tl.int64) << 52).to(tl.float64, bitcast=True)
            xo = XN + t.to(tl.int64) * NBP
            tl.store(xo + c0, tl.max(x0 * p2, axis=0), mask=c0 < NBP)
            tl.store(xo + c1, tl.max(x1 * p2, axis=0), mask=c1 < NBP)
    tl.store(BAD + tl.where(isa, 0, RA) + rows, bad.to(tl.uint8), mask=rm)
    nbad = tl.sum(bad)
    tl.atomic_add(STATS + tl.where(isa, 4, 5), nbad, mask=nbad > 0)
