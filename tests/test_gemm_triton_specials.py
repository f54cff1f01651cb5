"""fp4ref.gemm_triton.fixup: special rows / columns (NaN / Inf block scales) decided by counts of
non-finite products equal the exact torch emulator (the old path, ``method="emulate"``) bit for
bit, NaN patterns included, and the exact reference ``reference.gemm.dot`` (values), on
hypothesis-drawn operands with NaN / Inf / zero scales and zero elements in random rows, columns
and blocks, every operand format.  Torch only (CPU): the fix-up runs no Triton kernel."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings, strategies as st

from fp4ref.gemm_triton import decode, fixup as FX
from fp4ref.gemm_triton.options import Route
from reference.formats import get_format
from reference.gemm import PRESETS

from .gemm_helpers import ref_matmul

MODELS = ("probe_matched", "probe_matched_lattice", "decoded_fp32")
# (scale format, block): every scale format the Triton path accepts
FORMATS = (("ue4m3", 16), ("float8_e4m3fn", 16), ("float8_e8m0fnu", 32), ("ue5m3", 16),
           ("ue5m3", 32))


def _code_kinds(sfmt: str):
    """(finite codes, NaN codes, Inf codes, zero codes) of a scale format."""
    spec = get_format(sfmt)
    vals = [spec.decode(c) for c in range(spec.ncodes)]
    fin = [c for c, v in enumerate(vals) if v.is_finite]
    return (fin, [c for c, v in enumerate(vals) if v.is_nan],
            [c for c, v in enumerate(vals) if v.is_inf],
            [c for c in fin if vals[c].mag == 0])


@st.composite
def _regime(draw, infs):
    """Shared draw parameters of both operands.  ``infs`` (formats with an Inf scale): no NaN,
    few zeros, so outputs end up +-Inf or NaN from Inf times zero / Inf of both signs."""
    return dict(
        nozero=infs or draw(st.booleans()),
        rowsign=infs and draw(st.sampled_from((True, True, False))),  # one sign per row
        pz=(0.0, 0.0, 0.02, 0.05) if infs else (0.0, 0.02, 0.3, 1.0),   # each side draws one
        nan=0.0 if infs else draw(st.sampled_from((0.0, 0.1, 0.4))),
        inf=draw(st.sampled_from((0.1, 0.3, 1.0) if infs else (0.0, 0.1, 0.4))),
        zero=draw(st.sampled_from((0.0, 0.0, 0.1, 0.4))),
        narrow=draw(st.booleans()))


@st.composite
def _side(draw, R, nb, block, sfmt, reg):
    """(e2m1 codes [R, K], scale codes [R, nb]) with specials, zeros, -0 sprinkled."""
    fin, nan, inf, zero = _code_kinds(sfmt)
    g = torch.Generator().manual_seed(draw(st.integers(0, 2 ** 31)))
    K = nb * block
    codes = torch.randint(0, 16, (R, K), generator=g, dtype=torch.uint8)
    if reg["nozero"]:   # no zero element: an Inf scale then gives Inf products
        codes = torch.where((codes & 7) == 0, codes | 1, codes)
    if reg["rowsign"]:  # products of one output share a sign: a single-signed Inf
        sgn = (torch.rand(R, 1, generator=g) < 0.5).to(torch.uint8) * 8
        codes = (codes & 7) | sgn
        if draw(st.booleans()):  # one element of the other sign: +Inf meets one -Inf
            k = torch.randint(0, K, (R,), generator=g)
            codes[torch.arange(R), k] ^= 8
    z = torch.rand(R, K, generator=g) < draw(st.sampled_from(reg["pz"]))   # zero elements (+0 / -0)
    codes[z] = torch.where(torch.rand(R, K, generator=g) < 0.5, 0, 8).to(torch.uint8)[z]
    lo, hi = (len(fin) // 2 - 4, len(fin) // 2 + 4) if reg["narrow"] else (0, len(fin))
    fin_t = torch.tensor(fin[lo:hi], dtype=torch.uint8)
    sc = fin_t[torch.randint(0, len(fin_t), (R, nb), generator=g)]
    for name, pool in (("nan", nan), ("inf", inf), ("zero", zero)):
        if not pool or not reg[name]:
            continue
        hit = torch.rand(R, nb, generator=g) < reg[name]
        pool_t = torch.tensor(pool, dtype=torch.uint8)
        sc[hit] = pool_t[torch.randint(0, len(pool), (R, nb), generator=g)][hit]
    return codes, sc


def _operands(ac, asc, bc, bsc, sfmt, block):
    return decode.operand("a", ac, asc, sfmt, block), decode.operand("b", bc, bsc, sfmt, block)


def _both(model, A, B, block, M, N):
    dev = A.codes.device
    mode = torch.full((1, 1), int(Route.PAIR), device=dev)
    c0 = torch.full((M, N), 0.25, device=dev)   # untouched outputs must stay
    new = FX.fixup(c0.clone(), PRESETS[model], A, B, block, mode, 64, 64)
    old = FX.fixup(c0.clone(), PRESETS[model], A, B, block, mode, 64, 64, method="emulate")
    return new, old


def _assert_bits(new, old, what):
    bad = (new.view(torch.int32) != old.view(torch.int32)).nonzero()[:5].tolist()
    assert not bad, f"{what}: " + "; ".join(
        f"{tuple(i)}: {float(new[tuple(i)])!r} vs {float(old[tuple(i)])!r}" for i in bad)


# (scale format, block, regime "infs"): Inf scales exist in UE5M3 only
CASES = [f + (False,) for f in FORMATS] + [("ue5m3", 16, True), ("ue5m3", 32, True)]


@pytest.mark.parametrize("sfmt,block,infs", CASES)
@settings(deadline=None)
@given(st.data())
def test_counts_equal_emulator(sfmt, block, infs, data):
    model = data.draw(st.sampled_from(MODELS))
    M, N = data.draw(st.integers(1, 6)), data.draw(st.integers(1, 6))
    nb = data.draw(st.integers(1, 5))
    reg = data.draw(_regime(infs))
    ac, asc = data.draw(_side(M, nb, block, sfmt, reg))
    bc, bsc = data.draw(_side(N, nb, block, sfmt, reg))
    A, B = _operands(ac, asc, bc, bsc, sfmt, block)
    new, old = _both(model, A, B, block, M, N)
    _assert_bits(new, old, f"{sfmt} block {block} {model}")


def test_matches_reference_and_nan_bits():
    """Independent oracle: reference.gemm.dot on every special output; NaN as emulate writes it."""
    g = torch.Generator().manual_seed(7)
    for sfmt, block in FORMATS:
        fin, nan, inf, zero = _code_kinds(sfmt)
        M, N, nb = 5, 4, 3
        ac = torch.randint(0, 16, (M, nb * block), generator=g, dtype=torch.uint8)
        bc = torch.randint(0, 16, (N, nb * block), generator=g, dtype=torch.uint8)
        pick = torch.tensor(fin[len(fin) // 2 - 3: len(fin) // 2 + 3], dtype=torch.uint8)
        asc = pick[torch.randint(0, len(pick), (M, nb), generator=g)]
        bsc = pick[torch.randint(0, len(pick), (N, nb), generator=g)]
        asc[0, 1] = nan[0]
        bsc[1, 2] = nan[-1]
        if inf:
            asc[2, 0] = inf[0]
            bsc[3, 0] = inf[0]
            ac[2, :block] = 0                      # Inf scale times zero elements: NaN
            bsc[2, 1] = inf[0]
        if zero:
            bsc[0, 0] = zero[0]                    # meets A's Inf scale in row 2: NaN
        A, B = _operands(ac, asc, bc, bsc, sfmt, block)
        for model in MODELS:
            new, old = _both(model, A, B, block, M, N)
            _assert_bits(new, old, f"{sfmt} {model}")
            av, bv = A.values(), B.values()
            want = ref_matmul(PRESETS[model].replace(lattice=None), av, bv.t(),
                              scales_a=A.scales, scales_b=B.scales.t(), block=block)
            spec = A.bad[:, None] | B.bad[None, :]
            w, n = want[spec].to(torch.float32), new[spec]
            assert torch.equal(torch.isnan(w), torch.isnan(n)), (sfmt, model)
            fin_ = ~torch.isnan(w)
            assert torch.equal(w[fin_].view(torch.int32), n[fin_].view(torch.int32)), (sfmt, model)


def test_fallback_to_emulator(monkeypatch):
    """Outputs outside the proof (bound failed, Inf products only) go to the emulator."""
    monkeypatch.setattr(FX, "_LIMIT", 0.0)
    calls = []
    g = torch.Generator().manual_seed(3)
    sfmt, block = "ue5m3", 16
    fin, nan, inf, _ = _code_kinds(sfmt)
    ac = torch.randint(1, 8, (3, 32), generator=g, dtype=torch.uint8)   # nonzero elements
    bc = torch.randint(9, 16, (4, 32), generator=g, dtype=torch.uint8)  # nonzero, negative
    asc = torch.full((3, 2), fin[120], dtype=torch.uint8)
    bsc = torch.full((4, 2), fin[121], dtype=torch.uint8)
    asc[1, 0] = inf[0]
    bsc[2, 1] = nan[0]
    A, B = _operands(ac, asc, bc, bsc, sfmt, block)
    em = FX._emulator(PRESETS["probe_matched"], A, B, block)

    def spy(ri, ci):
        calls.append((ri.tolist(), ci.tolist()))
        return em(ri, ci)
    got = FX.special_values(PRESETS["probe_matched"], A, B, block, torch.tensor([1]),
                            torch.arange(4), spy)
    assert calls == [([1], [0, 1, 3])]                    # column 2 holds a NaN: decided
    _assert_bits(got, em(torch.tensor([1]), torch.arange(4)), "fallback")


def test_method_checked():
    A, B = _operands(torch.zeros(1, 16, dtype=torch.uint8), torch.full((1, 1), 56, dtype=torch.uint8),
                     torch.zeros(1, 16, dtype=torch.uint8), torch.full((1, 1), 56, dtype=torch.uint8),
                     "ue4m3", 16)
    with pytest.raises(ValueError, match="method"):
        FX.fixup(torch.zeros(1, 1), PRESETS["probe_matched"], A, B, 16,
                 torch.zeros(1, 1, dtype=torch.int64), 64, 64, method="fast")


@pytest.mark.parametrize("model", MODELS)
def test_one_opposite_infinity(model):
    """One -Inf product among +Inf ones (and its mirror) gives NaN; one sign alone gives that Inf."""
    fin, _, inf, _ = _code_kinds("ue5m3")
    ac = torch.full((4, 32), 2, dtype=torch.uint8)       # +1.0 everywhere
    ac[1, 3] = 10                                         # one -1.0 in the Inf block
    ac[2] |= 8                                            # all -1.0
    ac[3] |= 8
    ac[3, 20] = 2                                         # one +1.0 among -1.0 (both blocks Inf)
    asc = torch.full((4, 2), fin[120], dtype=torch.uint8)
    asc[:, 0] = inf[0]
    asc[3, 1] = inf[0]
    bc = torch.full((4, 32), 3, dtype=torch.uint8)       # +1.5
    bc[2, 5] = 0                                          # Inf * 0 in every row: NaN
    bsc = torch.full((4, 2), fin[100], dtype=torch.uint8)
    bsc[3, 0] = 0                                         # zero scale meets Inf: NaN
    A, B = _operands(ac, asc, bc, bsc, "ue5m3", 16)
    new, old = _both(model, A, B, 16, 4, 4)
    _assert_bits(new, old, model)
    inf_ = float("inf")
    assert new[0, :2].tolist() == [inf_, inf_] and new[2, :2].tolist() == [-inf_, -inf_]
    assert bool(torch.isnan(new[1]).all()) and bool(torch.isnan(new[3]).all())
    assert bool(torch.isnan(new[:, 2:]).all())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("sfmt,block", [("ue4m3", 16), ("float8_e8m0fnu", 32), ("ue5m3", 16)])
def test_gpu_counts_equal_emulator(sfmt, block):
    """On the device (cuBLAS float32 / TF32 count matmuls), 256 x 192 x 4096, specials in rows,
    columns and their intersection, Inf-only rows included."""
    fin, nan, inf, zero = _code_kinds(sfmt)
    g = torch.Generator().manual_seed(11)
    M, N, K = 256, 192, 4096
    ac = torch.randint(0, 16, (M, K), generator=g, dtype=torch.uint8)
    bc = torch.randint(0, 16, (N, K), generator=g, dtype=torch.uint8)
    bc[:8] = (bc[:8] & 7).clamp(min=1)                 # positive nonzero columns: +-Inf outputs
    pick = torch.tensor(fin[len(fin) // 2 - 8: len(fin) // 2 + 8], dtype=torch.uint8)
    asc = pick[torch.randint(0, len(pick), (M, K // block), generator=g)]
    bsc = pick[torch.randint(0, len(pick), (N, K // block), generator=g)]
    asc[[3, 50, 100, 200], [1, 7, 100, 20]] = nan[0]
    bsc[[5, 9, 77, 130], [0, 3, 4, 5]] = nan[-1]
    if inf:
        ac[7] = (ac[7] & 7).clamp(min=1)
        asc[7, 9] = inf[0]
        bsc[150, 2] = inf[0]
    A, B = _operands(*(t.cuda() for t in (ac, asc, bc, bsc)), sfmt, block)
    for model in MODELS:
        new, old = _both(model, A, B, block, M, N)
        _assert_bits(new.cpu(), old.cpu(), f"cuda {sfmt} {model}")
