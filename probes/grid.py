"""The candidate grid: the values of each GemmModel parameter that inference considers.

Inference (probes.infer), validation's per-shape split-K search (probes.validate), the probe
pools (probes.probes) and the test helpers (probes.testing) all read the grid from here, so
one edit widens or narrows the family everywhere.
"""
from __future__ import annotations

import functools
from fractions import Fraction

from reference.gemm import AlignRef, AlphaMode, GemmModel, split_bounds
from reference.rounding import Mode

__all__ = ["split_candidates", "ACC_BITS_MIN", "ROUND_MODES", "ALIGN_MODES", "F_GRID", "G_SMALL", "P_GRID", "W_GRID",
           "LATTICE_GRID", "SPLIT_GRID", "SPLIT_TILES", "grid_summary", "uneven_splits"]

ACC_BITS_MIN = 12  # narrowest accumulator (fraction bits) of the candidate grid
ROUND_MODES = (Mode.RNE, Mode.RTZ, Mode.RDN, Mode.RUP, Mode.RNA, Mode.RTO)
ALIGN_MODES = (Mode.RTZ, Mode.RDN, Mode.RNE, Mode.RNA, Mode.RUP)
F_GRID = tuple(1 << k for k in range(8))             # 1 .. 128
G_SMALL = tuple(1 << k for k in range(1, 8))         # 2 .. 128
P_GRID = tuple(range(ACC_BITS_MIN, 24))              # accumulator fraction bits
LATTICE_GRID = (None,) + tuple(Fraction(1, 1 << k) for k in range(0, 41))
SPLIT_GRID = (1, 2, 4, 8, 16)
SPLIT_TILES = (16, 32, 64, 128, 256)                 # k-tiles of uneven split-K slices


def W_GRID(p: int):
    return (None,) + tuple(range(ACC_BITS_MIN, p + 5))


def grid_summary() -> dict:
    return {"output_mode": [m.name for m in ROUND_MODES], "lattice": "None or 2^-k, k=0..40",
            "acc_frac_bits": f"{P_GRID[0]}..{P_GRID[-1]}", "align_bits": "None or 12..acc_frac_bits+4",
            "align_mode": [m.name for m in ALIGN_MODES],
            "align_ref": [r.name for r in AlignRef], "norm_mode": [m.name for m in ROUND_MODES],
            "fma_width": list(F_GRID), "group_size": "None or 2..K/2 (powers of 2, >= F)",
            "outer_mode": [m.name for m in ROUND_MODES], "split_k": list(SPLIT_GRID),
            "product_format": "None or float32 (products wider than FP32 only)",
            "acc_subnormal": ["KEEP", "FLUSH"], "alpha_mode": [a.name for a in AlphaMode]}


@functools.lru_cache(maxsize=None)
def uneven_splits(*Ks: int) -> tuple:
    """(S, T) of the uneven split-K schedules (slices of ceil(K/S) rounded up to a k-tile T,
    the last shorter, as cuBLAS split-K kernels cut K) that no equal split of SPLIT_GRID
    gives; each distinct slicing (over all the lengths ``Ks``, the first one split) once."""
    def sl(m):
        return tuple(tuple(split_bounds(m, k)) if k % m.split_k == 0 or m.split_tile else None
                     for k in Ks)
    seen = {sl(GemmModel("s", split_k=s)) for s in SPLIT_GRID if Ks[0] % s == 0}
    out = []
    for S in range(2, 17):
        for T in SPLIT_TILES:
            b = sl(GemmModel("s", split_k=S, split_tile=T))
            if len(b[0]) > 1 and b not in seen:
                seen.add(b)
                out.append((S, T))
    return tuple(out)


def split_candidates(model: GemmModel, K: int):
    """Per-shape schedules of ``model`` at this K (libraries choose split-K per shape): equal
    splits S | K (SPLIT_GRID) with the model's group size, no group or a power-of-two group,
    then uneven splits (slices of ceil(K/S) rounded up to a k-tile, as cuBLAS split-K
    kernels cut K) keeping the group size.  Each model once, ``model`` itself not repeated;
    the one generator of the validation's split search, ``probes.explain`` and the survey."""
    seen = {model}
    gs = [model.group_size, None] + [1 << k for k in range(4, 14) if (1 << k) < K]
    cands = [model.replace(split_k=S, split_tile=None, group_size=G)
             for S in SPLIT_GRID if K % S == 0 for G in gs if G is None or G >= model.fma_width]
    cands += [model.replace(split_k=S, split_tile=T) for S, T in uneven_splits(K)]
    for m in cands:
        if m not in seen:
            seen.add(m)
            yield m
