"""probes.sim must equal reference.gemm.dot bit for bit (the reference is the truth)."""
from fractions import Fraction

import numpy as np
import pytest

from reference import gemm as rg
from reference.rounding import Mode, Subnormal
from probes.sim import Operands, bits_to_float, output_bits, reference_key, simulate, simulate_gemm

AM = [Mode.RTZ, Mode.RDN, Mode.RNE, Mode.RNA, Mode.RUP]
NM = [Mode.RNE, Mode.RTZ, Mode.RDN, Mode.RUP, Mode.RNA, Mode.RTO]


def _model(rng, block=None):
    p = int(rng.choice([23, 23, 13, 10, 18]))
    G = None if rng.random() < 0.5 else int(rng.choice([2, 4, 8, 16]))
    sp = rg.ScalePoint.PRODUCT
    if block and rng.random() < 0.5:
        G, sp = block, rg.ScalePoint.GROUP
    return rg.GemmModel(
        fma_width=int(rng.choice([1, 2, 4, 8, 16])),
        align_bits=None if rng.random() < 0.3 else int(rng.integers(max(1, p - 8), p + 5)),
        align_mode=AM[rng.integers(5)], acc_frac_bits=p, norm_mode=NM[rng.integers(6)],
        acc_subnormal=Subnormal.FLUSH if rng.random() < 0.2 else Subnormal.KEEP,
        group_size=G, outer_mode=NM[rng.integers(6)], scale_point=sp,
        lattice=None if rng.random() < 0.8 else Fraction(1, 2 ** int(rng.integers(0, 20))),
        split_k=int(rng.choice([1, 1, 2, 3])),
        split_tile=None if rng.random() < 0.6 else int(rng.choice([1, 2, 4, 8])),
        alpha_mode=rg.AlphaMode(rng.choice(["exact", "premultiplied", "sequential", "reversed"])),
        output=str(rng.choice(["float32", "bfloat16", "float16"])), output_mode=NM[rng.integers(6)],
        product_format=None if rng.random() < 0.8 else "float32",
        align_ref=rg.AlignRef.EXPONENT_SUM if rng.random() < 0.4 else rg.AlignRef.VALUE)


def _vals(rng, K):
    kind = rng.integers(5)
    if kind == 0:
        m, e = rng.integers(1, 256, K), rng.integers(-10, 10, K)
    elif kind == 1:
        m, e = rng.integers(1, 2 ** 24, K), rng.integers(-40, 40, K)
    elif kind == 2:  # subnormal range
        m, e = rng.integers(1, 16, K), rng.integers(-140, -120, K)
    elif kind == 3:  # overflow range
        m, e = rng.integers(1, 256, K), rng.integers(50, 64, K)
    else:
        m, e = rng.integers(1, 2 ** 12, K), rng.integers(-5, 5, K)
    v = np.ldexp(m.astype(float), e) * rng.choice([-1, 1], K)
    v[rng.random(K) < 0.1] = 0
    v[rng.random(K) < 0.05] *= -0.0 if rng.random() < 0.5 else 1
    if kind == 4:  # near-cancelling pairs
        n = len(v[1::2])
        v[1::2] = -v[0::2][:n] * rng.choice([1, 1 + 2 ** -20], n)
    return v


@pytest.mark.parametrize("seed", range(6))
def test_simulate_matches_reference(seed):
    rng = np.random.default_rng(seed)
    models, ops = [], []
    for _ in range(120):
        m = _model(rng)
        K = int(rng.choice([1, 3, 4, 8, 16, 32, 35]))
        if K % m.split_k and m.split_tile is None:
            K *= m.split_k
        a, b = _vals(rng, K), (_vals(rng, K) if rng.random() < 0.5 else np.ones(K))
        al = None if rng.random() < 0.6 else tuple(float(np.float32(x)) for x in rng.uniform(0.1, 3, 2))
        models.append(m)
        ops.append(Operands(a, b, alpha=al))
    got = simulate(models, ops)
    for i, (m, o) in enumerate(zip(models, ops)):
        assert got[i] == reference_key(m, o), (m, o.a, o.b, o.alpha)


@pytest.mark.parametrize("seed", range(3))
def test_block_scaled_matches_reference(seed):
    rng = np.random.default_rng(100 + seed)
    e2m1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6])
    models, ops = [], []
    for _ in range(80):
        block = int(rng.choice([4, 8]))
        m = _model(rng, block)
        if m.scale_point is rg.ScalePoint.GROUP:
            m = m.replace(split_k=1, split_tile=None)
        K = block * int(rng.integers(1, 5)) * m.split_k
        a = rng.choice(e2m1, K) * rng.choice([-1, 1], K)
        b = rng.choice(e2m1, K)
        sa = np.ldexp(rng.integers(8, 16, K // block) / 8, rng.integers(-9, 9, K // block))
        sb = np.ldexp(1.0, rng.integers(-20, 20, K // block))
        models.append(m)
        ops.append(Operands(a, b, sa, sb, block))
    got = simulate(models, ops)
    for i, (m, o) in enumerate(zip(models, ops)):
        assert got[i] == reference_key(m, o), (m, o)


def test_simulate_gemm_equals_rows():
    rng = np.random.default_rng(7)
    m = rg.GemmModel(fma_width=4, align_bits=25, acc_frac_bits=23, norm_mode=Mode.RTZ, group_size=8,
                     output="bfloat16", output_mode=Mode.RTZ)
    A = rng.standard_normal((5, 32)).astype(np.float32).astype(np.float64)
    B = rng.standard_normal((32, 3)).astype(np.float32).astype(np.float64)
    A[:, :8] = 0  # leading zero columns are skipped, and must not matter
    C = simulate_gemm(m, A, B)
    rows = simulate([m] * 15, [Operands(A[i], B[:, j]) for i in range(5) for j in range(3)])
    assert np.array_equal(C.ravel(), rows)
    assert np.array_equal(output_bits(bits_to_float(C, "bfloat16"), "bfloat16"), C)


def test_simulate_gemm_exponent_sum_equals_reference():
    rng = np.random.default_rng(11)
    m = rg.GemmModel(fma_width=8, align_bits=9, acc_frac_bits=13, norm_mode=Mode.RTZ,
                     align_ref=rg.AlignRef.EXPONENT_SUM, group_size=32)
    A = (rng.integers(8, 16, (4, 64)) * rng.choice([-1, 1], (4, 64)) / 8.0) * np.exp2(rng.integers(-6, 6, (4, 64)))
    B = (rng.integers(8, 16, (64, 3)) / 8.0) * np.exp2(rng.integers(-6, 6, (64, 3)))
    C = simulate_gemm(m, A, B)
    for i in range(4):
        for j in range(3):
            assert C[i, j] == reference_key(m, Operands(A[i], B[:, j]))


def test_exponent_sum_alignment_literal():
    # 1.5 * 1.5 = 2.25: value exponent 1, exponent sum 0.  With W = 3 fraction bits the
    # quantum is 2^-2 (VALUE) or 2^-3 (EXPONENT_SUM): the second product 2^-3 survives
    # only in the latter.  Sums: 2.25 and 2.375, both exact in FP32.
    a, b = np.array([1.5, 1.0]), np.array([1.5, 0.125])
    base = rg.GemmModel(fma_width=2, align_bits=3, align_mode=Mode.RTZ, acc_frac_bits=23)
    for ref, want in ((rg.AlignRef.VALUE, 2.25), (rg.AlignRef.EXPONENT_SUM, 2.375)):
        m = base.replace(align_ref=ref)
        key = simulate([m], [Operands(a, b)])[0]
        assert bits_to_float(np.array([key]), "float32")[0] == want
        assert float(rg.dot(m, list(a), list(b)).to_fraction()) == want


def test_presets_on_a_known_sum():
    # 1 + 2^-24 * 3 (as three terms): exact sum rounds once (RNE) to 1 + 2^-22;
    # FP32 sequential loses each 2^-24 (ties to even) and stays at 1.
    a = [1.0, 2.0 ** -24, 2.0 ** -24, 2.0 ** -24]
    b = [1.0] * 4
    keys = simulate([rg.get_preset("exact"), rg.get_preset("fp32_sequential")], [Operands(np.array(a), np.array(b))] * 2)
    assert keys[0] == np.float32(1 + 2.0 ** -22).view(np.uint32)
    assert keys[1] == np.float32(1.0).view(np.uint32)


def test_reversed_alpha_literal():
    # c = 2^24 - 1, factors (3, 1.25).  In order: fp32(c*3) = 50331644 (ulp 4), then
    # 50331644*1.25 = 62914555 -> 62914556.  Reversed: fp32(c*1.25) = 20971518 (ulp 2), then
    # *3 = 62914554, a tie at ulp 4 -> even 62914552.
    a, b = np.array([16777215.0]), np.array([1.0])
    for mode, want in ((rg.AlphaMode.SEQUENTIAL, 62914556.0), (rg.AlphaMode.REVERSED, 62914552.0)):
        m = rg.GemmModel(alpha_mode=mode)
        key = simulate([m], [Operands(a, b, alpha=(3.0, 1.25))])[0]
        assert bits_to_float(np.array([key]), "float32")[0] == want
        assert float(rg.dot(m, list(a), list(b), alpha=[3.0, 1.25]).to_fraction()) == want


def test_uneven_split_literal():
    # K = 10 in 3 slices with tile 2: ceil(10/3) = 4 -> slices [0,4) [4,8) [8,10)
    assert rg.split_bounds(rg.GemmModel(split_k=3, split_tile=2), 10) == [(0, 4), (4, 8), (8, 10)]
    # [2^24, 3, 3, 0], split_k = 2.  Tile 4: ceil(4/2) = 2 rounds up to 4, one slice, exact
    # sum 2^24 + 6 (FP32 ulp there is 2).  Tile 2: slices [0,2) and [2,4): 2^24 + 3 is a tie
    # -> 2^24 + 4 (even), then + 3 = 2^24 + 7, a tie -> 2^24 + 8.
    a = np.array([2.0 ** 24, 3.0, 3.0, 0.0])
    b = np.ones(4)
    for m, want in ((rg.GemmModel(fma_width=1 << 10, split_k=2, split_tile=4), 2.0 ** 24 + 6),
                    (rg.GemmModel(fma_width=1 << 10, split_k=2, split_tile=2), 2.0 ** 24 + 8)):
        key = simulate([m], [Operands(a, b)])[0]
        assert bits_to_float(np.array([key]), "float32")[0] == want
        assert float(rg.dot(m, list(a), list(b)).to_fraction()) == want
