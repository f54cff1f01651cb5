"""fp4ref.scaled_mm: torch._scaled_mm's NVFP4/MXFP4 conventions, bit-exact to the named model.

Oracles (none shares the code under test): the 128x4 swizzle as a literal index formula
(and torch's own ``to_blocked``); packing written out byte by byte; ``blackwell-mxf4nvf4``
as ``reference.mma.mma`` (exact integers / Fractions) chained along K here, with the
epilogue in Fractions through ``reference.gemm.round_fp``; ``seed-probe-matched`` as
``reference.gemm.dot`` with the ``probe_matched`` preset on decoded operands.
"""
from __future__ import annotations

import ast
import struct
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

import fp4ref
from fp4ref.scaled_gemm import MODELS, swizzle_128x4, swizzled_numel, unswizzle_128x4
from reference import mma as RM
from reference.exact import NAN, Exact, Kind, exact
from reference.formats import get_format
from reference.gemm import dot, get_preset, round_fp
from reference.rounding import Mode

E4M3, E8M0 = torch.float8_e4m3fn, torch.float8_e8m0fnu
RECIPE = {"nvfp4": (E4M3, "ue4m3", 16, "float8_e4m3fn"),
          "mxfp4": (E8M0, "ue8m0", 32, "float8_e8m0fnu")}
F32 = get_format("float32")
N_TRIALS = max(8, settings.default.max_examples // 2)   # ci: 30, thorough: 1000


# --- independent helpers ----------------------------------------------------------

def swz_index(r: int, c: int, cols: int) -> int:
    """cuBLAS's block-scaling-factor layout, literally: 128x4 tiles in row-major tile order,
    each tile stored as 32 rows of 16 bytes, tile row r at (r % 32, 4 * (r // 32) + c)."""
    tiles_per_row = -(-cols // 4)
    tile = (r // 128) * tiles_per_row + c // 4
    return tile * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + (c % 4)


def swizzle_lit(mat, fill: int = 0) -> list[int]:
    rows, cols = len(mat), len(mat[0])
    flat = [fill] * (128 * -(-rows // 128) * 4 * -(-cols // 4))
    for r in range(rows):
        for c in range(cols):
            flat[swz_index(r, c, cols)] = mat[r][c]
    return flat


def pack_rows(codes) -> list[list[int]]:
    """[R][K] codes -> [R][K/2] bytes, element 2i in the low nibble."""
    return [[row[2 * i] | (row[2 * i + 1] << 4) for i in range(len(row) // 2)] for row in codes]


def operands(a, b, sa, sb_nk, recipe, fill=0):
    """Python lists (a [M][K], b [K][N] codes; sa [M][K/B], sb_nk [N][K/B] scale bytes) ->
    torch._scaled_mm arguments: a [M, K/2], b [K/2, N] (= w.t()), swizzled scales."""
    sdt = RECIPE[recipe][0]
    bt = [list(col) for col in zip(*b)]                      # w [N][K]
    A = torch.tensor(pack_rows(a), dtype=torch.uint8).view(torch.float4_e2m1fn_x2)
    W = torch.tensor(pack_rows(bt), dtype=torch.uint8).view(torch.float4_e2m1fn_x2)
    SA = torch.tensor(swizzle_lit(sa, fill), dtype=torch.uint8).view(sdt)
    SB = torch.tensor(swizzle_lit(sb_nk, fill), dtype=torch.uint8).view(sdt)
    return A, W.t(), SA, SB


def chain_bits(a, b, sa, sb_nk, recipe) -> list[list[int]]:
    """reference.mma kind::mxf4nvf4 chained along K from C = +0: FP32 bit patterns."""
    _, sf, blk, _ = RECIPE[recipe]
    M, N, K = len(a), len(b[0]), len(b)
    c = [[0] * N for _ in range(M)]
    for k0 in range(0, K, 64):
        j0, j1 = k0 // blk, (k0 + 64) // blk
        c = RM.mma("mxf4nvf4", [r[k0:k0 + 64] for r in a], b[k0:k0 + 64], c,
                   [r[j0:j1] for r in sa], [list(x) for x in zip(*[r[j0:j1] for r in sb_nk])],
                   scale_format=sf, block=blk)
    return c


def epilogue(bits: int, alpha, out: str):
    """Exact: FP32 alpha premultiplied (RNE per factor), one FP32 RNE rounding, then out."""
    v = F32.decode(bits)
    if alpha is not None and not v.is_nan:
        al = None
        for f in alpha:
            x = exact(f)
            if al is not None:
                x = Exact(Kind.FINITE, x.negative != al.negative, x.mag * al.mag)
            al = round_fp(x, "float32", Mode.RNE)
        neg = v.negative != al.negative
        if v.is_inf:
            v = NAN if al.mag == 0 else Exact(Kind.INF, neg)
        else:
            v = round_fp(Exact(Kind.FINITE, neg, v.mag * al.mag), "float32", Mode.RNE)
    return round_fp(v, out, Mode.RNE)


def f32_bits_of(v) -> int:
    """Exact -> FP32 bit pattern (v must be an FP32 value); NaN -> -1."""
    if v.is_nan:
        return -1
    if v.is_inf:
        return 0x7F800000 | (0x80000000 if v.negative else 0)
    return struct.unpack("<I", struct.pack("<f", float(-v.mag if v.negative else v.mag)))[0] \
        | (0x80000000 if v.negative and v.mag == 0 else 0)


def got_bits(y: torch.Tensor) -> np.ndarray:
    """Output as FP32 bit patterns (bf16/fp16 widen exactly); NaN -> -1."""
    f = y.float()
    bits = f.view(torch.int32).numpy().astype(np.int64) & 0xFFFFFFFF
    return np.where(torch.isnan(f).numpy(), -1, bits)


def assert_bits(y, expected, ctx=""):
    exp = np.array(expected, dtype=np.int64)
    got = got_bits(y)
    bad = np.argwhere(got != exp)
    assert bad.size == 0, (f"{ctx}: first mismatch at {tuple(bad[0])}: got {got[tuple(bad[0])]:#x}"
                           f", expected {exp[tuple(bad[0])]:#x}")


# --- the swizzled scale layout ------------------------------------------------------

SHAPES = [(1, 1), (5, 3), (128, 4), (129, 5), (200, 8), (257, 9)]


@pytest.mark.parametrize("rows,cols", SHAPES)
def test_unswizzle_literal_formula(rows, cols):
    g = np.random.default_rng(rows * 1000 + cols)
    mat = g.integers(0, 256, (rows, cols)).tolist()
    flat = swizzle_lit(mat, fill=0)
    t = torch.tensor(flat, dtype=torch.uint8)
    assert unswizzle_128x4(t, rows, cols).tolist() == mat
    assert swizzle_128x4(torch.tensor(mat, dtype=torch.uint8)).tolist() == flat
    assert swizzled_numel(rows, cols) == len(flat)


def _torch_to_blocked():
    """torch's own to_blocked (torch/testing/_internal/common_quantized.py), read from its
    source: importing that module needs test-only packages (expecttest)."""
    try:
        from torch.testing._internal.common_quantized import to_blocked
        return to_blocked
    except Exception:
        pass
    src = Path(torch.__file__).parent / "testing" / "_internal" / "common_quantized.py"
    tree = ast.parse(src.read_text())
    keep = [n for n in tree.body if isinstance(n, ast.FunctionDef)
            and n.name in ("ceil_div", "to_blocked")]
    if len(keep) != 2:
        pytest.skip("this torch has no to_blocked")
    ns = {"torch": torch}
    exec(compile(ast.Module(keep, []), str(src), "exec"), ns)
    return ns["to_blocked"]


@pytest.mark.parametrize("rows,cols", SHAPES)
def test_swizzle_equals_torch_to_blocked(rows, cols):
    to_blocked = _torch_to_blocked()
    g = torch.Generator().manual_seed(rows + cols)
    mat = torch.randint(0, 256, (rows, cols), generator=g, dtype=torch.uint8)
    ref = to_blocked(mat)
    assert torch.equal(swizzle_128x4(mat), ref.reshape(-1))
    assert torch.equal(unswizzle_128x4(ref, rows, cols), mat)


# --- packing and literal results ---------------------------------------------------

ONE_E4M3, ONE_E8M0 = 0x38, 0x7F


@pytest.mark.parametrize("model", MODELS)
def test_nibble_order_literal_bytes(model):
    # a's first byte 0x21: element 0 = code 1 (0.5, low nibble), element 1 = code 2 (1.0)
    A = torch.zeros(1, 32, dtype=torch.uint8)
    A[0, 0] = 0x21
    # b [K/2, N]: column 0 picks element 0 (byte 0x02: code 2 = 1.0 low), column 1 picks
    # element 1 (byte 0x40: code 4 = 2.0 high)
    B = torch.zeros(32, 2, dtype=torch.uint8)
    B[0, 0], B[0, 1] = 0x02, 0x40
    SA = torch.tensor(swizzle_lit([[ONE_E4M3] * 4]), dtype=torch.uint8).view(E4M3)
    SB = torch.tensor(swizzle_lit([[ONE_E4M3] * 4] * 2), dtype=torch.uint8).view(E4M3)
    y = fp4ref.scaled_mm(A.view(torch.float4_e2m1fn_x2), B.view(torch.float4_e2m1fn_x2),
                         SA, SB, model=model)
    assert y.tolist() == [[0.5, 2.0]]


def _one_group(values_a, values_b, sa0, recipe="nvfp4", model="blackwell-mxf4nvf4", **kw):
    """1 x 1 output, K = 64; a/b codes per k given as dicts {k: code}; scale bytes per block
    given for a (b's scales are one)."""
    _, _, blk, _ = RECIPE[recipe]
    one = ONE_E4M3 if recipe == "nvfp4" else ONE_E8M0
    a = [[values_a.get(k, 0) for k in range(64)]]
    b = [[values_b.get(k, 0)] for k in range(64)]
    sa = [[sa0.get(j, one) for j in range(64 // blk)]]
    return fp4ref.scaled_mm(*operands(a, b, sa, [[one] * (64 // blk)], recipe), model=model, **kw)


def test_bf16_output_rounds_to_nearest_even():
    # 1*1 + (1.5*1) * 2^-7 = 1 + 3*2^-8 = 1.5 bf16 ulps above 1: RNE gives 1 + 2^-6
    y = _one_group({0: 2, 16: 3}, {0: 2, 16: 2}, {1: 0x04}, out_dtype=torch.bfloat16)
    assert y.dtype == torch.bfloat16 and y.float().item() == 1 + 2 ** -6
    # 1 + 2^-8: a tie, to even (1.0)
    y = _one_group({0: 2, 16: 1}, {0: 2, 16: 2}, {1: 0x04}, out_dtype=torch.bfloat16)
    assert y.float().item() == 1.0
    assert _one_group({0: 2, 16: 1}, {0: 2, 16: 2}, {1: 0x04}).item() == 1 + 2 ** -8


def test_alpha_literal():
    y = _one_group({0: 6}, {0: 2}, {}, alpha=[0.5, 3.0])          # 4 * 0.5 * 3
    assert y.item() == 6.0
    y = _one_group({0: 6}, {0: 2}, {}, alpha=torch.tensor(0.25))
    assert y.item() == 1.0


def test_issue_examples_tell_models_apart():
    # issue 17: groups 7,225,344 (6*6, scales 448*448) and 0.375 (1.5*0.5, scale 0.5) in one
    # 64-chunk: 7,225,344 under the 35-bit chain (RZ), 7,225,344.5 under probe_matched
    a = [[7] + [0] * 15 + [3] + [0] * 47]
    b = [[7]] + [[0]] * 15 + [[1]] + [[0]] * 47
    ops = operands(a, b, [[0x7E, 0x30, 0x38, 0x38]], [[0x7E, 0x38, 0x38, 0x38]], "nvfp4")
    assert fp4ref.scaled_mm(*ops, model="blackwell-mxf4nvf4").item() == 7225344.0
    assert fp4ref.scaled_mm(*ops, model="seed-probe-matched").item() == 7225344.5


def test_chain_width_and_rz_per_instruction():
    # instruction 1 gives C = 1; instruction 2: a zero-data group with scales 448 * 448
    # (exponent sum 16: step 2^-19) and 0.5*0.5 scaled by 2^-9 * 2^-8 = 2^-19 (column 0,
    # kept) or 2^-9 * 2^-9 = 2^-20 (column 1, truncated away)
    a = [[2] + [0] * 63 + [0] * 16 + [1] + [0] * 47]
    b = [[2, 2]] + [[0, 0]] * 63 + [[0, 0]] * 16 + [[1, 1]] + [[0, 0]] * 47
    sa = [[0x38] * 4 + [0x7E, 0x01, 0x38, 0x38]]
    sb = [[0x38] * 4 + [0x7E, 0x02, 0x38, 0x38], [0x38] * 4 + [0x7E, 0x01, 0x38, 0x38]]
    ops = operands(a, b, sa, sb, "nvfp4")
    assert fp4ref.scaled_mm(*ops).tolist() == [[1 + 2 ** -19, 1.0]]
    assert fp4ref.scaled_mm(*ops, model="seed-probe-matched").tolist() == \
        [[1 + 2 ** -19, 1 + 2 ** -20]]
    # C = 32 (4*4 + 4*4) plus 1.5*0.5 * 2^-18 = 0.75 ulp of 32: RZ keeps 32; 1 ulp is kept
    a = [[6, 6] + [0] * 62 + [3] + [0] * 63]
    for bcode, want in ((1, 32.0), (2, 32 + 2 ** -18)):
        b = [[6], [6]] + [[0]] * 62 + [[bcode]] + [[0]] * 63
        s = [[0x38] * 4 + [0x01, 0x38, 0x38, 0x38]]
        assert fp4ref.scaled_mm(*operands(a, b, s, s, "nvfp4")).item() == want


# --- NaN, zeros, -0 ---------------------------------------------------------------------

@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("out", [torch.float32, torch.bfloat16])
def test_nan_scale_gives_canonical_nan(model, out):
    # a NaN scale (e4m3 0x7F) in a block whose data are all zero: row 0 is NaN, row 1 not
    a = [[2] * 16 + [0] * 48, [2] * 64]
    b = [[2]] * 64
    sa = [[0x38, 0x7F, 0x38, 0x38], [0x38] * 4]
    y = fp4ref.scaled_mm(*operands(a, b, sa, [[0x38] * 4], "nvfp4"), model=model,
                         out_dtype=out)
    nan_bits = 0x7FFFFFFF if out == torch.float32 else 0x7FFF
    idt = torch.int32 if out == torch.float32 else torch.int16
    assert y.view(idt)[0, 0].item() == nan_bits
    assert y[1, 0].item() == 64.0


def test_zero_blocks_and_negative_zero():
    # -0 products only (code 8 = -0 times 0.5): the chain starts at +0, so D = +0
    y = _one_group({k: 8 for k in range(64)}, {k: 1 for k in range(64)}, {})
    assert y.view(torch.int32).item() == 0
    # MXFP4: -6*6 * 2^-80 * 2^-80 = -36 * 2^-160 is kept by the 35-bit add (step 2^-161)
    # but is below FP32's smallest subnormal: RZ gives -0; a second instruction of -0
    # products keeps -0, one +0 product in it gives +0
    a = [[15] + [0] * 63 + [8] * 64]
    for last, want in ((8, 0x80000000), (0, 0)):
        a[0][127] = last
        b = [[7]] + [[0]] * 63 + [[1]] * 64
        sa, sb = [[47, 47, 127, 127]], [[47, 47, 127, 127]]
        y = fp4ref.scaled_mm(*operands(a, b, sa, sb, "mxfp4"))
        assert y.view(torch.int32).item() & 0xFFFFFFFF == want
        assert chain_bits(a, b, sa, sb, "mxfp4") == [[want]]


@pytest.mark.parametrize("recipe", ["nvfp4", "mxfp4"])
def test_padding_is_never_read(recipe):
    # M = 3 rows and 2 scale columns: the swizzled padding is filled with NaN bytes
    g = np.random.default_rng(7)
    blk = RECIPE[recipe][2]
    one = ONE_E4M3 if recipe == "nvfp4" else ONE_E8M0
    a = g.integers(0, 16, (3, 64)).tolist()
    b = g.integers(0, 16, (64, 2)).tolist()
    sa, sb = [[one] * (64 // blk)] * 3, [[one] * (64 // blk)] * 2
    for model in MODELS:
        y0 = fp4ref.scaled_mm(*operands(a, b, sa, sb, recipe, fill=0), model=model)
        y1 = fp4ref.scaled_mm(*operands(a, b, sa, sb, recipe, fill=0xFF), model=model)
        assert torch.equal(y0.view(torch.int32), y1.view(torch.int32))
        assert not torch.isnan(y0).any()


# --- random bytes against the exact oracles ----------------------------------------------

SCALE_RANGES = {  # narrow: similar blocks; spread: scale-exponent sums up to ~40 apart (no
    # NaN; e4m3 sign bits set at random); wide: every byte (NaN, zero, subnormal scales)
    ("nvfp4", "narrow"): (0x30, 0x48), ("nvfp4", "spread"): (0x00, 0x7F),
    ("nvfp4", "wide"): (0, 256), ("mxfp4", "narrow"): (120, 134),
    ("mxfp4", "spread"): (107, 148), ("mxfp4", "wide"): (0, 256)}


def _draw(g, recipe, M, N, K, mode):
    blk = RECIPE[recipe][2]
    a = g.integers(0, 16, (M, K)).tolist()
    b = g.integers(0, 16, (K, N)).tolist()
    if mode == "steps":
        return a, b, *_steps(g, recipe, a, b, M, N, K)
    lo, hi = SCALE_RANGES[recipe, mode]
    sign = 0x80 if recipe == "nvfp4" and mode == "spread" else 0
    sa, sb = (g.integers(lo, hi, (R, K // blk)) | (g.integers(0, 2, (R, K // blk)) * sign)
              for R in (M, N))
    return a, b, sa.tolist(), sb.tolist()


def _steps(g, recipe, a, b, M, N, K):
    """Blocks of two kinds: "big" ones (high scale exponents) whose groups of 16 sum to
    exactly zero (the second 8 elements of a negate the first 8, b repeats them), and
    "small" ones (low scale exponents, random data).  The big scales still set the
    alignment exponent, so the 35-bit truncation of the small terms and of the running
    accumulator shows in the result."""
    blk = RECIPE[recipe][2]
    nb = K // blk
    big = g.random(nb) < 0.4
    for j in np.flatnonzero(big):
        for k0 in range(j * blk, (j + 1) * blk, 16):
            for k in range(k0, k0 + 8):
                for row in a:
                    row[k + 8] = row[k] ^ 8
                b[k + 8] = list(b[k])
    out = []
    for R in (M, N):
        if recipe == "nvfp4":   # e4m3 exponent field: big 12..15, small 1..6; no NaN
            e = np.where(big, g.integers(12, 16, (R, nb)), g.integers(1, 7, (R, nb)))
            out.append(np.minimum((e << 3) | g.integers(0, 8, (R, nb)), 0x7E).tolist())
        else:
            e = np.where(big, g.integers(10, 21, (R, nb)), g.integers(-20, 1, (R, nb)))
            out.append((127 + e).tolist())
    return out


def _alpha_draw(g):
    if g.random() < 0.4:
        return None
    return [float(np.float32(g.uniform(-4, 4))), float(np.float32(2.0 ** g.integers(-8, 8)))]


@settings(max_examples=N_TRIALS)
@given(seed=st.integers(0, 2 ** 32 - 1), recipe=st.sampled_from(["nvfp4", "mxfp4"]),
       mode=st.sampled_from(["narrow", "spread", "steps", "wide"]), out=st.sampled_from(["float32", "bfloat16"]))
def test_chain_equals_reference_mma(seed, recipe, mode, out):
    g = np.random.default_rng(seed)
    M, N, K = int(g.integers(1, 6)), int(g.integers(1, 6)), 64 * int(g.integers(1, 4))
    a, b, sa, sb = _draw(g, recipe, M, N, K, mode)
    alpha = _alpha_draw(g)
    y = fp4ref.scaled_mm(*operands(a, b, sa, sb, recipe, fill=int(g.integers(0, 256))),
                         model="blackwell-mxf4nvf4", alpha=alpha, out_dtype=getattr(torch, out))
    exp = [[f32_bits_of(epilogue(x, alpha, out)) for x in row]
           for row in chain_bits(a, b, sa, sb, recipe)]
    assert_bits(y, exp, f"seed {seed} {recipe} mode={mode} alpha={alpha} {out}")


def _decoded(a, b, sa, sb, recipe):
    sfmt, blk = RECIPE[recipe][3], RECIPE[recipe][2]
    e2, sc = get_format("float4_e2m1fn"), get_format(sfmt)
    return ([[e2.decode(x) for x in r] for r in a], [[e2.decode(x) for x in r] for r in b],
            [[sc.decode(x) for x in r] for r in sa], [[sc.decode(x) for x in r] for r in sb], blk)


@settings(max_examples=N_TRIALS)
@given(seed=st.integers(0, 2 ** 32 - 1), recipe=st.sampled_from(["nvfp4", "mxfp4"]),
       mode=st.sampled_from(["narrow", "spread", "steps", "wide"]), out=st.sampled_from(["float32", "bfloat16"]))
def test_seed_equals_reference_gemm(seed, recipe, mode, out):
    g = np.random.default_rng(seed)
    M, N, K = int(g.integers(1, 5)), int(g.integers(1, 5)), 32 * int(g.integers(1, 5))
    a, b, sa, sb = _draw(g, recipe, M, N, K, mode)
    alpha = _alpha_draw(g)
    y = fp4ref.scaled_mm(*operands(a, b, sa, sb, recipe), model="seed-probe-matched",
                         alpha=alpha, out_dtype=getattr(torch, out))
    A, B, SA, SB, blk = _decoded(a, b, sa, sb, recipe)
    model = get_preset("probe_matched").replace(output=out)
    exp = [[f32_bits_of(dot(model, A[i], list(col), scales_a=SA[i], scales_b=SB[j], block=blk,
                            alpha=alpha)) for j, col in enumerate(zip(*B))] for i in range(M)]
    assert_bits(y, exp, f"seed {seed} {recipe} mode={mode} alpha={alpha} {out}")


# --- bad input ---------------------------------------------------------------------------

def _good():
    return operands([[2] * 64], [[2]] * 64, [[0x38] * 4], [[0x38] * 4], "nvfp4")


@pytest.mark.parametrize("change,match", [
    (lambda o: dict(o, a=o["a"].view(torch.uint8).float()), r"a: dtype torch\.float32 .*valid choices: torch\.float4_e2m1fn_x2"),
    (lambda o: dict(o, b=torch.zeros(31, 1, dtype=torch.uint8)), r"b: shape \[31, 1\] does not match \[K/2, N\]"),
    (lambda o: dict(o, model="blackwell"), r"model: unknown value 'blackwell'; valid choices: blackwell-mxf4nvf4, seed-probe-matched"),
    (lambda o: dict(o, scale_a=o["scale_a"][:100]), r"scale_a: 100 elements .*valid choices: exactly 512"),
    (lambda o: dict(o, scale_b=o["scale_b"].view(torch.uint8)), r"scale_b: dtype torch\.uint8 .*valid choices: torch\.float8_e4m3fn"),
    (lambda o: dict(o, scale_a=o["scale_a"].view(torch.uint8)), r"scale_a: dtype torch\.uint8 .*valid choices: torch\.float8_e4m3fn, torch\.float8_e8m0fnu"),
    (lambda o: dict(o, out_dtype=torch.float64), r"out_dtype: unknown value torch\.float64; valid choices"),
    (lambda o: dict(o, alpha=float("inf")), r"alpha: non-finite value inf; valid choices: finite numbers"),
    (lambda o: dict(o, alpha=[1.0, "x"]), r"alpha\[1\]: expected a number"),
])
def test_bad_input_names_parameter_and_choices(change, match):
    A, B, SA, SB = _good()
    kw = change(dict(a=A, b=B, scale_a=SA, scale_b=SB))
    with pytest.raises(ValueError, match=match):
        fp4ref.scaled_mm(**kw)


def test_k_not_multiple_of_the_instruction():
    A, B, SA, SB = operands([[2] * 32], [[2]] * 32, [[0x38] * 2], [[0x38] * 2], "nvfp4")
    with pytest.raises(ValueError, match=r"a: K = 2 \* a.shape\[1\] = 32 is not a multiple of 64"):
        fp4ref.scaled_mm(A, B, SA, SB)
    assert fp4ref.scaled_mm(A, B, SA, SB, model="seed-probe-matched").item() == 32.0


def test_chain_bad_input():
    from fp4ref.scaled_gemm import mxf4nvf4_chain
    a, b = torch.zeros(2, 64, dtype=torch.uint8), torch.zeros(64, 3, dtype=torch.uint8)
    sa, sb = torch.zeros(2, 4, dtype=torch.uint8), torch.zeros(4, 3, dtype=torch.uint8)
    with pytest.raises(ValueError, match=r"scale_format: unknown value 'e4m3'; valid choices: ue4m3, ue8m0"):
        mxf4nvf4_chain(a, b, sa, sb, scale_format="e4m3", block=16)
    with pytest.raises(ValueError, match=r"block: unknown value 32 .*valid choices: 16"):
        mxf4nvf4_chain(a, b, sa, sb, scale_format="ue4m3", block=32)
    with pytest.raises(ValueError, match=r"scale_b: shape \[3, 4\] does not match \[4, 3\]"):
        mxf4nvf4_chain(a, b, sa, sb.t(), scale_format="ue4m3", block=16)
    with pytest.raises(ValueError, match=r"a_codes, b_codes: e2m1 codes must lie in 0..15"):
        mxf4nvf4_chain(a + 16, b, sa, sb, scale_format="ue4m3", block=16)
    assert mxf4nvf4_chain(a, b, sa, sb, scale_format="ue4m3", block=16).tolist() == [[0.0] * 3] * 2


# --- fp4ref.nn.Linear(gemm_model=...) ------------------------------------------------------

def test_linear_gemm_model_blackwell_chain():
    from fp4ref.nn import Linear, TENVFP4Quantizer
    torch.manual_seed(0)
    q = TENVFP4Quantizer()
    lin = Linear(64, 16, bias=False, quantizer=q, gemm_model="blackwell-mxf4nvf4")
    x = torch.randn(16, 64)
    y = lin(x)
    qx, qw = TENVFP4Quantizer().quantize(x, "x"), TENVFP4Quantizer().quantize(lin.weight.detach(), "w")
    a, sa = qx.codes.tolist(), qx.scale_codes.tolist()
    b = [list(c) for c in zip(*qw.codes.tolist())]
    exp = [[f32_bits_of(epilogue(v, [qx.alpha, qw.alpha], "float32")) for v in row]
           for row in chain_bits(a, b, sa, qw.scale_codes.tolist(), "nvfp4")]
    assert_bits(y.detach(), exp, "Linear forward")
    with pytest.raises(ValueError, match=r"gemm_model: unknown value 'x'; valid choices"):
        Linear(64, 16, quantizer=q, gemm_model="x")
    assert Linear(64, 16, quantizer=q, gemm_model="seed-probe-matched").model == "probe_matched"


# --- GPU: the same bits on CUDA ---------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("recipe", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("model", MODELS)
def test_gpu_equals_cpu(recipe, model):
    g = np.random.default_rng(1)
    M, N, K = 192, 160, 512
    for mode in ("narrow", "wide"):   # wide: NaN, zero and subnormal scales too
        a, b, sa, sb = _draw(g, recipe, M, N, K, mode)
        ops = operands(a, b, sa, sb, recipe)
        for out in (torch.float32, torch.bfloat16):
            cpu = fp4ref.scaled_mm(*ops, model=model, alpha=[0.75, 3.0], out_dtype=out)
            gpu = fp4ref.scaled_mm(*[t.cuda() for t in ops], model=model, alpha=[0.75, 3.0],
                                   out_dtype=out)
            idt = torch.int32 if out == torch.float32 else torch.int16
            assert torch.equal(gpu.cpu().view(idt), cpu.view(idt)), (recipe, model, mode, out)
