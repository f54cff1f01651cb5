"""Step 3, route: each output tile to the PAIR, BLOCK or FIX path, and the tile lists.

* PAIR (block 16): the pair certificate holds (``certify``); S = fl(t0 + t1) of two exact
  FP32 pair sums is the RNE rounding of the exact group sum.  Block 32: always PAIR.
* BLOCK (block 16): four exact block sums are added exactly as H + L with a per-output
  offset M = 1.5 * 2**23 * Q (Q a power of two chosen from per-row and per-column bounds):
  R += t rounds t to a multiple of Q, t - (R_new - R) is the exact remainder, and
  S = fl((R - M) + L) is again one correct rounding.  ``route`` checks Q's range per tile.
* MXFP4: t_b = D_b * 2**(e_a + e_b) is exact when the exponents are in range
  (``route_mx``), S = fl(t0 + t1).
* WIDE (block 16): tiles failing both certificates.  Per output and group the four exact
  block dots are summed in float64 with TwoSum and rounded once to FP32 (``kernels``
  ``_wide_kernel``; the proof is in the package docstring); exact for any finite scales.  A
  group whose error terms do not sum exactly flags its tile, which ``fixup`` recomputes.
* FIX: special rows, MX tiles out of range, forced FIX and flagged WIDE tiles: recomputed
  exactly by ``fixup`` (the torch emulator)."""
from __future__ import annotations

from typing import NamedTuple

import torch

from reference.gemm import PRESETS

from .certify import Bounds, ceil_log2, p2, pair_ok, route_bounds
from .decode import Operand, operand
from .options import Route, fmt_args
from .schedule import kernel_plan

__all__ = ["Routing", "BlockOffsets", "route", "route_mx", "forced", "tile_order", "tile_lists",
           "route_stats"]


class BlockOffsets(NamedTuple):
    """The BLOCK kernel's per-group offsets: M = MA[i, g] * QB[j, g] = 1.5 * 2**23 * Q."""
    MA: torch.Tensor    # float32 [M, NG]: 1.5 * 2**23 * 2**qa
    QB: torch.Tensor    # float32 [N, NG]: 2**qb


class Routing(NamedTuple):
    """Where each output tile is computed."""
    mode: torch.Tensor | None   # Route per tile [Mt, Nt] (None: every tile PAIR)
    pair: torch.Tensor          # linear tile indices for the pair / MX kernel, grouped order
    block: torch.Tensor         # linear tile indices for the block kernel
    n_fix: int                  # FIX tiles
    offsets: BlockOffsets | None   # for the block kernel (None: no BLOCK tiles possible)
    wide: torch.Tensor | None = None   # linear tile indices for the wide kernel


def _block_scheme(b: Bounds, M: int, N: int, BM: int, BN: int, gb: int):
    """BLOCK offsets per row / column and group (``gb`` blocks), and which tiles they make
    exact: Q = 2**(qa + qb), sum|t| <= 2**21 Q, Q <= 2**23 u_min, Q's exponent in range."""
    NG = b.XA.shape[1] // gb
    Mt, Nt = b.XAn.shape[0], b.XBn.shape[0]
    SX = b.XA.view(-1, NG, gb).sum(-1)                           # [Mp, NG]
    MY = b.XB.view(-1, NG, gb).amax(-1)                          # [Np, NG]
    uga = b.ua.view(-1, NG, gb).amin(-1)
    ugb = b.ub.view(-1, NG, gb).amin(-1)
    sa_live, mb_live = SX > 0, MY > 0
    qa = torch.where(sa_live, ceil_log2(SX) - 21, -30)
    qb = torch.where(mb_live, ceil_log2(MY), 0)
    ra = torch.where(sa_live, qa - uga, -(1 << 20))
    rb = torch.where(mb_live, qb - ugb, -(1 << 20))
    raT = ra.view(Mt, BM, NG).amax(1)
    rbT = rb.view(Nt, BN, NG).amax(1)
    qaT_hi = qa.view(Mt, BM, NG).amax(1)
    qbT_hi = qb.view(Nt, BN, NG).amax(1)
    qaT_lo = qa.view(Mt, BM, NG).amin(1)
    qbT_lo = qb.view(Nt, BN, NG).amin(1)
    ok_blk = ((raT[:, None, :] + rbT[None, :, :]) <= 23).all(-1)
    ok_blk &= ((qaT_hi[:, None, :] + qbT_hi[None, :, :]) <= 100).all(-1)
    ok_blk &= ((qaT_lo[:, None, :] + qbT_lo[None, :, :]) >= -100).all(-1)
    MA = (1.5 * 2.0 ** 23 * p2(qa.clamp(-120, 120))).float()[:M].contiguous()
    QB = p2(qb.clamp(-120, 120)).float()[:N].contiguous()
    return ok_blk, BlockOffsets(MA, QB)


def route(A: Operand, B: Operand, block: int, BM: int, BN: int, sqa=None, sqb=None, *,
          group_blocks: int | None = None):
    """(tile modes [Mt, Nt] of Route, BlockOffsets or None).  sqa / sqb: per-block sums of
    squares (from the decode kernel), computed here if None; ``group_blocks``: blocks per
    group of the model's plan (``schedule.kernel_plan``; None: probe_matched's)."""
    if group_blocks is None:
        group_blocks = kernel_plan(PRESETS["probe_matched"], A.K, block, False).group_blocks
    M, N = A.R, B.R
    Mt, Nt = -(-M // BM), -(-N // BN)
    dev = A.codes.device
    if block == 32:  # one block per half group: always exact
        return torch.zeros(Mt, Nt, dtype=torch.int64, device=dev), None
    b = route_bounds(A, B, block, BM, BN, sqa, sqb, group_blocks=group_blocks)
    ok_pair = pair_ok(b.XAn, b.XBn)
    ok_blk, offsets = _block_scheme(b, M, N, BM, BN, group_blocks)
    mode = torch.where(ok_pair, Route.PAIR, torch.where(ok_blk, Route.BLOCK, Route.WIDE))
    return mode, offsets


def route_mx(A: Operand, B: Operand, BM: int, BN: int) -> torch.Tensor:
    """MXFP4 tile modes: PAIR where every product's exponent range keeps t exact, else FIX."""
    def ex(op, T):
        s = op.scales
        e = torch.where(torch.isfinite(s) & (s > 0), torch.frexp(s.double())[1].to(torch.int64) - 1,
                        torch.zeros_like(s, dtype=torch.int64))
        pad = (-e.shape[0]) % T
        if pad:
            e = torch.cat([e, e.new_zeros(pad, e.shape[1])])
        e = e.view(-1, T, e.shape[1])
        return e.amax((1, 2)), e.amin((1, 2))
    ahi, alo = ex(A, BM)
    bhi, blo = ex(B, BN)
    # t = D * 2**(ea + eb), D a multiple of 1/4 below 2**11: exact FP32 iff in range; a last
    # bit >= 2**-126 also keeps every sum normal, so flush-to-zero could not matter
    ok = ((ahi[:, None] + bhi[None, :]) <= 117) & ((alo[:, None] + blo[None, :]) >= -124)
    return torch.where(ok, Route.PAIR, Route.FIX)


def forced(mode: torch.Tensor, force: str | None, has_block: bool,
           has_wide: bool = False) -> torch.Tensor:
    """``force``: "block" sends PAIR tiles to the BLOCK kernel (when it has offsets), "wide"
    every tile to the WIDE kernel (block 16, not MX: ``has_wide``), "fix" every tile to the
    fix-up; "pair" / None keep the routing's choice."""
    if force == "block" and has_block:
        return torch.where(mode == Route.PAIR, Route.BLOCK, mode)
    if force == "wide" and has_wide:
        return torch.full_like(mode, Route.WIDE)
    if force == "fix":
        return torch.full_like(mode, Route.FIX)
    return mode


_ORDERS: dict = {}


def tile_order(Mt: int, Nt: int, group: int, dev):
    """(grouped-order key, linear index, all tiles in key order), flat [Mt * Nt] int64 on
    ``dev``; made once per shape (constant tensors: no per-call torch ops)."""
    k = (Mt, Nt, group, str(dev))
    if k not in _ORDERS:
        if len(_ORDERS) > 64:
            _ORDERS.clear()
        tm = torch.arange(Mt)[:, None].expand(Mt, Nt)
        tn = torch.arange(Nt)[None, :].expand(Mt, Nt)
        key = (((tm // group) * Nt + tn) * group + tm % group).reshape(-1)   # unique
        lin = (tm * Nt + tn).reshape(-1)
        _ORDERS[k] = tuple(t.to(dev) for t in (key, lin, lin[torch.argsort(key)]))
    return _ORDERS[k]


def tile_lists(mode: torch.Tensor, extra: list | None = None, group: int = 8):
    """Linear indices of the PAIR, BLOCK and WIDE tiles, each in grouped order (8 row tiles
    per column sweep) so concurrent CTAs share operand panels in L2; one host sync, which also
    reads the scalars in ``extra`` (tensors) back.  Returns (pair, block, fix count, extra,
    wide); the sort puts the routes in Route order (PAIR, BLOCK, FIX, WIDE)."""
    Mt, Nt = mode.shape
    key, lin, _ = tile_order(Mt, Nt, group, mode.device)
    span = (Mt + group) * Nt
    m = mode.reshape(-1).long()
    order = torch.argsort((m * span + key))
    lin = lin[order]
    routes = (Route.PAIR, Route.BLOCK, Route.FIX, Route.WIDE)
    cnt = torch.stack([(m == r).sum() for r in routes]
                      + [e.reshape(()).long() for e in (extra or [])]).tolist()
    n_p, n_b, n_f = cnt[0], cnt[1], cnt[2]
    w0 = n_p + n_b + n_f
    return (lin[:n_p].contiguous(), lin[n_p:n_p + n_b].contiguous(), n_f, cnt[4:],
            lin[w0:w0 + cnt[3]].contiguous())


def route_stats(a_codes, a_scales, b_codes, b_scales, *, fmt="nvfp4", scale_fmt=None, block=None,
                tile=(128, 128)) -> dict:
    """Fraction of output tiles on each path (for benchmarks and reports)."""
    sfmt, block = fmt_args(fmt, scale_fmt, block)
    A = operand("a", a_codes, a_scales, sfmt, block)
    B = operand("b", b_codes, b_scales, sfmt, block)
    if fmt == "mxfp4":
        mode = route_mx(A, B, *tile)
    else:  # probe_matched's routing; sums of squares by table look-up (no kernel)
        mode = route(A, B, block, *tile)[0]
    n = mode.numel()
    return {"pair": int((mode == Route.PAIR).sum()) / n,
            "block": int((mode == Route.BLOCK).sum()) / n,
            "wide": int((mode == Route.WIDE).sum()) / n,
            "fix": int((mode == Route.FIX).sum()) / n,
            "special_rows": int(A.bad.sum()), "special_cols": int(B.bad.sum())}
