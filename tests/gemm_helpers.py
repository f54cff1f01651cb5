"""Shared helpers for the GEMM tests: reference matmul, bit comparison, operand strategies,
and an independent FP32 rounding of exact rationals (numpy nextafter + Fraction)."""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import torch
from hypothesis import strategies as st

from reference.gemm import AlignRef, AlphaMode, GemmModel, ScalePoint, dot
from reference.rounding import Mode

E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def ref_matmul(model, a: torch.Tensor, b: torch.Tensor, *, scales_a=None, scales_b=None,
               block=None, alpha=None) -> torch.Tensor:
    """reference.gemm.dot per element, as a float64 tensor (exact for float32-range outputs)."""
    M, K = a.shape
    N = b.shape[1]
    al = None
    if alpha is not None:
        al = [torch.broadcast_to(torch.as_tensor(f, dtype=torch.float64), (M, N))
              for f in (alpha if isinstance(alpha, (list, tuple)) else [alpha])]
    out = torch.empty(M, N, dtype=torch.float64)
    al_ = a.double().tolist()
    bl_ = b.double().t().tolist()
    for i in range(M):
        for j in range(N):
            kw = {}
            if scales_a is not None:
                kw = dict(scales_a=scales_a[i].double().tolist(),
                          scales_b=scales_b[:, j].double().tolist(), block=block)
            if al is not None:
                kw["alpha"] = [float(f[i, j]) for f in al]
            out[i, j] = float(dot(model, al_[i], bl_[j], **kw))
    return out


def same_bits(x: torch.Tensor, y: torch.Tensor) -> bool:
    """Bit-identical as float32 (NaN matches NaN, -0 differs from +0)."""
    x = x.to(torch.float32)
    y = y.to(torch.float32)
    nan = torch.isnan(x) & torch.isnan(y)
    eq = x.view(torch.int32) == y.view(torch.int32)
    return bool((eq | nan).all()) and bool((torch.isnan(x) == torch.isnan(y)).all())


def mismatch(x, y) -> str:
    x = x.to(torch.float32)
    y = y.to(torch.float32)
    bad = ~((x.view(torch.int32) == y.view(torch.int32)) | (torch.isnan(x) & torch.isnan(y)))
    idx = bad.nonzero()[:5].tolist()
    return "; ".join(f"{tuple(i)}: {float(x[tuple(i)])!r} vs {float(y[tuple(i)])!r}" for i in idx)


# --- independent FP32 rounding of an exact rational (no reference code) --------------
def f32_round(v: Fraction, mode: str = "rne") -> float:
    """Round an exact rational to float32 (IEEE: overflow to inf under RNE, max under RTZ)."""
    if v == 0:
        return 0.0
    x = np.float32(float(v))  # within one float32 ulp of v
    cands = {float(x), float(np.nextafter(x, np.float32(np.inf))),
             float(np.nextafter(x, np.float32(-np.inf)))}
    cands = [c for c in cands if math.isfinite(c)]
    if mode == "rtz":
        ok = [c for c in cands if abs(Fraction(c)) <= abs(v) and (c == 0 or (c > 0) == (v > 0))]
        return max(ok, key=lambda c: abs(Fraction(c))) if ok else 0.0
    best = min(cands, key=lambda c: abs(Fraction(c) - v))
    d = abs(Fraction(best) - v)
    ties = [c for c in cands if abs(Fraction(c) - v) == d]
    if len(ties) > 1:
        best = [c for c in ties if not (np.float32(c).view(np.int32) & 1)][0]
    fmax = float(np.finfo(np.float32).max)
    if abs(best) == fmax and abs(v) >= Fraction(fmax) + Fraction(2) ** 103:
        return math.copysign(math.inf, float(v))
    return best


# --- operand strategies ---------------------------------------------------------------
def e2m1_value(exp_lo=0, exp_hi=0):
    return st.builds(lambda v, s, e: v * s * 2.0 ** e, st.sampled_from(E2M1),
                     st.sampled_from((1.0, -1.0)), st.integers(exp_lo, exp_hi))


def f32_finite():
    return st.floats(width=32, allow_nan=False, allow_infinity=False)


def special():
    return st.sampled_from((math.inf, -math.inf, math.nan, -0.0, 0.0))


def operand(kind: str):
    """Named value distributions: small grids (ties), huge spreads, fp32 bit patterns."""
    if kind == "e2m1":
        return e2m1_value()
    if kind == "spread":
        return e2m1_value(-60, 60)
    if kind == "huge":
        return e2m1_value(-140, 120)
    if kind == "tiny":  # products near the FP32 subnormal range
        return e2m1_value(-80, -60)
    if kind == "f32":
        return f32_finite().filter(lambda x: x == 0 or 2.0 ** -60 < abs(x) < 2.0 ** 60)
    if kind == "special":
        return st.one_of(e2m1_value(-4, 4), special())
    raise ValueError(kind)


OPERAND_KINDS = ("e2m1", "spread", "huge", "tiny", "special")


@st.composite
def matrices(draw, M, K, N, kind_a, kind_b=None):
    kind_b = kind_b or kind_a
    a = draw(st.lists(operand(kind_a), min_size=M * K, max_size=M * K))
    b = draw(st.lists(operand(kind_b), min_size=K * N, max_size=K * N))
    return (torch.tensor(a, dtype=torch.float32).reshape(M, K),
            torch.tensor(b, dtype=torch.float32).reshape(K, N))


def scale_value(kind: str):
    """Decoded block scales: ue4m3-like grid, wide powers of two, zeros and subnormals."""
    mant = st.sampled_from((1.0, 1.125, 1.25, 1.5, 1.875))
    if kind == "narrow":
        return st.builds(lambda m, e: m * 2.0 ** e, mant, st.integers(-9, 8))
    if kind == "wide":
        return st.one_of(st.builds(lambda m, e: m * 2.0 ** e, mant, st.integers(-60, 60)),
                         st.just(0.0), st.just(2.0 ** -17), st.just(2.0 ** -9 * 3))
    if kind == "special":
        return st.one_of(st.builds(lambda m, e: m * 2.0 ** e, mant, st.integers(-4, 4)),
                         st.sampled_from((0.0, math.inf, math.nan)))
    raise ValueError(kind)


@st.composite
def gemm_models(draw, blocked: bool = False):
    """A random point of the family (every field the reference accepts)."""
    modes_r = (Mode.RNE, Mode.RTZ, Mode.RDN, Mode.RUP, Mode.RNA, Mode.RTO)
    modes_a = (Mode.RTZ, Mode.RDN, Mode.RNE, Mode.RNA, Mode.RUP)
    F = draw(st.sampled_from((1, 2, 3, 4, 8, 16, 32, 64, 1 << 30)))
    align = draw(st.one_of(st.none(), st.integers(0, 30), st.just(70)))
    G = draw(st.sampled_from((None, 1, 4, 8, 16, 32, 64)))
    sp = ScalePoint.PRODUCT
    if blocked:
        sp = draw(st.sampled_from((ScalePoint.PRODUCT, ScalePoint.GROUP)))
    lat = draw(st.sampled_from((None, None, Fraction(1, 1024), Fraction(1, 2), Fraction(4))))
    return GemmModel(
        name="drawn", product_format=draw(st.sampled_from((None, None, "bfloat16", "float16",
                                                           "tf32", "float8_e4m3fn"))),
        fma_width=F, align_bits=align, align_mode=draw(st.sampled_from(modes_a)),
        align_ref=draw(st.sampled_from(tuple(AlignRef))),
        acc_frac_bits=draw(st.sampled_from((2, 10, 13, 23, 24, 31, 52, 60))),
        norm_mode=draw(st.sampled_from(modes_r)),
        acc_subnormal=draw(st.sampled_from(("keep", "flush"))),
        group_size=G, outer_mode=draw(st.sampled_from(modes_r)), scale_point=sp, lattice=lat,
        split_k=draw(st.sampled_from((1, 1, 2, 3, 4))),
        split_tile=draw(st.sampled_from((None, None, 1, 2, 16))),
        alpha_mode=draw(st.sampled_from(tuple(AlphaMode))),
        output=draw(st.sampled_from(("float32", "float32", "bfloat16", "float16", "tf32",
                                     "float8_e4m3fn", "float8_e5m2", "ue5m3", "float8_e8m0fnu"))),
        output_mode=draw(st.sampled_from(modes_r)))


# --- exact reference on sampled outputs of a block-scaled GEMM (no fp4ref code) ----------
def _decode_rows(codes: torch.Tensor, fmt: str, rows) -> list[list]:
    """Rows of codes -> lists of reference.formats Exact values (spec decode, not fp4ref's)."""
    from reference.formats import get_format
    spec = get_format(fmt)
    table = [spec.decode(c) for c in range(spec.ncodes)]
    c = codes.cpu()
    return {i: [table[v] for v in c[i].tolist()] for i in rows}


def sample_positions(M: int, N: int, n: int, seed: int, rows=(), cols=()) -> list[tuple[int, int]]:
    """n output positions spread over all tiles (uniform, stable seed), plus one position on
    each listed row / column (special rows, e.g. NaN scales) and the four corners."""
    g = torch.Generator().manual_seed(seed)
    ii = torch.randint(0, M, (n,), generator=g).tolist()
    jj = torch.randint(0, N, (n,), generator=g).tolist()
    pos = set(zip(ii, jj)) | {(0, 0), (0, N - 1), (M - 1, 0), (M - 1, N - 1)}
    pos |= {(int(r), jj[k % n]) for k, r in enumerate(rows)}
    pos |= {(ii[k % n], int(c)) for k, c in enumerate(cols)}
    return sorted(pos)


def ref_blockscaled(model, ac, asc, bc, bsc, sfmt: str, block: int, alpha, positions) -> torch.Tensor:
    """reference.gemm.dot at each (i, j) of C = A @ B^T from e2m1 codes and scale codes
    (decoded by reference.formats), alpha: None, a number, a tensor broadcastable to [M, N],
    or a list of them.  float32 [len(positions)]."""
    from reference.gemm import get_preset
    model = get_preset(model) if isinstance(model, str) else model
    M, N = ac.shape[0], bc.shape[0]
    ri = sorted({i for i, _ in positions})
    ci = sorted({j for _, j in positions})
    A, SA = _decode_rows(ac, "float4_e2m1fn", ri), _decode_rows(asc, sfmt, ri)
    B, SB = _decode_rows(bc, "float4_e2m1fn", ci), _decode_rows(bsc, sfmt, ci)
    al = None
    if alpha is not None:
        al = [torch.broadcast_to(torch.as_tensor(f, dtype=torch.float64).cpu(), (M, N))
              for f in (alpha if isinstance(alpha, (list, tuple)) else [alpha])]
    out = []
    for i, j in positions:
        kw = {"alpha": [float(f[i, j]) for f in al]} if al is not None else {}
        out.append(float(dot(model, A[i], B[j], scales_a=SA[i], scales_b=SB[j], block=block, **kw)))
    return torch.tensor(out, dtype=torch.float32)


def check_sampled(got: torch.Tensor, want: torch.Tensor, positions, what: str = "") -> None:
    """got [M, N] at ``positions`` == want, bit for bit (NaN as NaN, -0 by its bits)."""
    idx = torch.tensor(positions, dtype=torch.int64)
    g = got.detach().cpu()[idx[:, 0], idx[:, 1]]
    if not same_bits(g, want):
        bad = [(positions[k], float(g[k]), float(want[k])) for k in range(len(positions))
               if not same_bits(g[k:k + 1], want[k:k + 1])]
        raise AssertionError(f"{what}: {len(bad)} of {len(positions)} sampled outputs differ "
                             f"from reference.gemm, e.g. {bad[:4]}")
