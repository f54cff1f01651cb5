"""The call: ``prepare`` checks the arguments, decodes, certifies and routes once and returns a
``Prepared`` GEMM; calling it launches the kernels, fixes up and applies the epilogue."""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import NamedTuple

import torch

from .certify import pair_bounds, pair_ok
from .decode import Operand, check_codes, decode_bf16, finish, operand, raise_codes
from .epilogue import Alpha, alpha_deferred, alpha_list, alpha_premul, alpha_values, epilogue
from .fixup import Specials, fixup
from .launch import HAVE_TRITON, launch_decoded, launch_gemm
from .options import Call, Route, interpret, parse_call, torch_decode
from .route import Routing, forced, route, route_mx, tile_lists, tile_order
from .schedule import KernelPlan, kernel_plan
from .tables import scale_tables, wide_exact

__all__ = ["LaunchConfig", "Prepared", "DecodedPrepared", "prepare", "blockscaled_mm"]


@dataclass(frozen=True)
class LaunchConfig:
    BM: int             # output tile rows
    BN: int             # output tile columns
    NT: int             # column tiles: ceil(N / BN)
    RZ: int             # RzAdd: how the kernels add across groups
    F32: bool           # dots on float32 inputs (the interpreter's bf16 dot is unreliable)
    num_warps: int
    plan: KernelPlan    # the model's schedule as the kernels walk it


class Operands(NamedTuple):
    """The kernels' operands."""
    ap: torch.Tensor                # bf16 [M, K]: a * s_a (MXFP4: a)
    bp: torch.Tensor                # bf16 [N, K]
    fa: torch.Tensor | None = None  # MXFP4: finite nonzero scales [M, nb] (0 elsewhere)
    fb: torch.Tensor | None = None


class Slot(enum.IntEnum):
    """Entries of the fast path's int32 read-back (``_route_fast``)."""
    A_CODES = 0     # A's max e2m1 code where out of range (decode kernel, slot 0)
    A_SCALES = 1    # A's max scale code where out of range
    B_CODES = 2     # (decode kernel, slot 2)
    B_SCALES = 3
    A_SPECIAL = 4   # rows of A with a non-finite scale (bounds kernel: STATS + 4)
    B_SPECIAL = 5   # (STATS + 5)
    PAIR_OK = 8     # tiles passing the pair certificate (after the 8 stats, block 16)


STATS_LEN = 8


class Readback(NamedTuple):
    """What the fast path's one host sync read back."""
    code_max: dict              # check name ("a_codes", ...) -> max code where out of range
    special_a: int              # A rows with a non-finite scale
    special_b: int
    pair_tiles: int | None      # tiles passing the pair certificate (None: not computed)
    alpha_words: list           # int32 words of the scalar alpha tensors (float64 bits)


def _read_back(vals: list, pair_x: bool, n_alpha: int) -> Readback:
    names = {"a_codes": Slot.A_CODES, "a_scales": Slot.A_SCALES, "b_codes": Slot.B_CODES,
             "b_scales": Slot.B_SCALES}
    return Readback({n: vals[s] for n, s in names.items()}, vals[Slot.A_SPECIAL],
                    vals[Slot.B_SPECIAL], vals[Slot.PAIR_OK] if pair_x else None,
                    vals[len(vals) - 2 * n_alpha:])


@dataclass
class Prepared:
    """A decoded and routed GEMM; calling it runs the kernels, the fix-up and the epilogue."""
    call: Call
    cfg: LaunchConfig
    A: Operand
    B: Operand
    ops: Operands
    routing: Routing
    info: Specials      # what the fix-up recomputes
    need_zero: bool     # the fix-up reads C outside the kernels' tiles: start from zeros
    alpha: float        # fused into the kernels' store when ``fuse`` (else 1.0)
    fuse: bool
    factors: Alpha      # what the epilogue still applies

    @property
    def M(self) -> int:
        return self.A.R

    @property
    def N(self) -> int:
        return self.B.R

    @property
    def K(self) -> int:
        return self.A.K

    def __call__(self) -> torch.Tensor:
        c = (torch.zeros if self.need_zero else torch.empty)(self.M, self.N, dtype=torch.float32,
                                                              device=self.A.codes.device)
        flags = launch_gemm(self, c)
        mode, info = self.routing.mode, self.info
        if flags is not None and not wide_exact(self.call.sfmt):
            # WIDE tiles whose kernel could not prove a group exact (one host sync): fix-up
            failed = flags.view(mode.shape) != 0
            if bool(failed.any()):
                mode = torch.where(failed, Route.FIX, mode)
                info = info._replace(any_fix=True)
                for op in (self.A, self.B):
                    if op.scales is None:
                        finish(op)
        c = fixup(c, self.call.model, self.A, self.B, self.call.block, mode, self.cfg.BM,
                  self.cfg.BN, info)
        return epilogue(c, self.call.model, self.factors)

    def wide_fallback_tiles(self) -> int:
        """WIDE tiles the fix-up recomputes (their flags), from one more call of the kernels
        (benchmarks and tests; the GEMM itself does not need it)."""
        c = torch.empty(self.M, self.N, dtype=torch.float32, device=self.A.codes.device)
        flags = launch_gemm(self, c)
        return 0 if flags is None else int((flags != 0).sum())


@dataclass
class DecodedPrepared:
    """decoded_fp32: FP32 FMAs in k order where every product is an exact FP32 value
    (``apT`` given), else the fix-up for the whole output."""
    call: Call
    cfg: LaunchConfig
    A: Operand
    B: Operand
    apT: torch.Tensor | None    # float32 [K, M]: a * s_a
    bpT: torch.Tensor | None    # float32 [K, N]
    mode: torch.Tensor          # Route per tile: all PAIR (kernel) or all FIX
    factors: Alpha

    def __call__(self) -> torch.Tensor:
        c = torch.zeros(self.A.R, self.B.R, dtype=torch.float32, device=self.A.codes.device)
        if self.apT is not None:
            launch_decoded(self.apT, self.bpT, c)
        c = fixup(c, self.call.model, self.A, self.B, self.call.block, self.mode, self.cfg.BM,
                  self.cfg.BN)
        return epilogue(c, self.call.model, self.factors)


def _mx_exponents_ok(sa: torch.Tensor, sb: torch.Tensor) -> bool:
    """MXFP4 decoded_fp32: frexp exponents (e + 1) with products below 2**128, last bits (and so
    every partial sum) at or above 2**-126, operands a * s_a normal."""
    ea = torch.frexp(sa[sa > 0].double())[1] if bool((sa > 0).any()) else torch.zeros(1)
    eb = torch.frexp(sb[sb > 0].double())[1] if bool((sb > 0).any()) else torch.zeros(1)
    return (int(ea.max() + eb.max()) <= 123 and int(ea.min() + eb.min()) >= -122
            and int(ea.min()) >= -124 and int(eb.min()) >= -124)


def _prepare_decoded(call: Call, cfg: LaunchConfig, A: Operand, B: Operand,
                     factors: Alpha) -> DecodedPrepared:
    block = call.block
    sa = torch.where(torch.isfinite(A.scales), A.scales, torch.zeros_like(A.scales))
    sb = torch.where(torch.isfinite(B.scales), B.scales, torch.zeros_like(B.scales))
    ap = A.vals * sa.repeat_interleave(block, 1)
    bp = B.vals * sb.repeat_interleave(block, 1)
    # products exact FP32 values? (ue4m3 / ue5m3 always; e8m0 when exponents allow)
    ok = bool(torch.isfinite(ap).all() and torch.isfinite(bp).all())
    if ok and call.fmt == "mxfp4":
        ok = _mx_exponents_ok(sa, sb)
    ok = ok and call.force != "fix"
    apT, bpT = (ap.t().contiguous(), bp.t().contiguous()) if ok else (None, None)
    del ap, bp
    mode = torch.full((-(-A.R // cfg.BM), cfg.NT), Route.PAIR if ok else Route.FIX,
                      device=A.codes.device)
    return DecodedPrepared(call, cfg, A, B, apT, bpT, mode, factors)


def _route_mx(call: Call, cfg: LaunchConfig, A: Operand, B: Operand):
    """MXFP4: e2m1 operands, the e8m0 factors applied after each block's dot."""
    mode = forced(route_mx(A, B, cfg.BM, cfg.BN), call.force, has_block=False)
    sane = scale_tables(call.sfmt, A.codes.device).sane
    sa, sb = sane[A.scode.long()], sane[B.scode.long()]   # finite scales, 0 elsewhere
    fa = torch.where(sa > 0, sa, torch.zeros_like(sa)).contiguous()
    fb = torch.where(sb > 0, sb, torch.zeros_like(sb)).contiguous()
    ap, _ = decode_bf16(A, call.block, scale=False, want_sq=False)   # e2m1 values: exact
    bp, _ = decode_bf16(B, call.block, scale=False, want_sq=False)
    ptiles, btiles, n_fix, (nra, nrb), _ = tile_lists(mode, [A.bad.sum(), B.bad.sum()])
    return Operands(ap, bp, fa, fb), Routing(mode, ptiles, btiles, n_fix, None), (nra, nrb)


def _route_slow(call: Call, cfg: LaunchConfig, A: Operand, B: Operand):
    """NVFP4 / UE5M3 with torch decoding (or empty operands): route on the host."""
    block = call.block
    ap, sqa = decode_bf16(A, block, scale=True, want_sq=block == 16)  # a * s_a: exact
    bp, sqb = decode_bf16(B, block, scale=True, want_sq=block == 16)
    mode, offsets = route(A, B, block, cfg.BM, cfg.BN, sqa, sqb,
                          group_blocks=cfg.plan.group_blocks)
    del sqa, sqb
    mode = forced(mode, call.force, has_block=offsets is not None, has_wide=block == 16)
    # one host sync: tile lists and whether any fixup is needed
    ptiles, btiles, n_fix, (nra, nrb), wtiles = tile_lists(mode, [A.bad.sum(), B.bad.sum()])
    return Operands(ap, bp), Routing(mode, ptiles, btiles, n_fix, offsets, wtiles), (nra, nrb)


def _route_fast(call: Call, cfg: LaunchConfig, A: Operand, B: Operand, checks, alpha):
    """NVFP4 / UE5M3 probe_matched(_lattice) with the decode kernel: the code-range checks,
    special rows, pair certificate and scalar alphas come back in one host sync."""
    block, force, dev = call.block, call.force, A.codes.device
    Mt = -(-A.R // cfg.BM)
    stats = torch.zeros(STATS_LEN, dtype=torch.int32, device=dev)
    ap, sqa = decode_bf16(A, block, True, block == 16, stats=stats, slot=Slot.A_CODES)
    bp, sqb = decode_bf16(B, block, True, block == 16, stats=stats, slot=Slot.B_CODES)
    # the BLOCK scheme (and its offset tables) only when some tile fails the pair
    # certificate, or a path is forced: found after the sync
    routed = force in (None, "pair")     # "pair" forces nothing (as below)
    pair_x = block == 16 and routed
    XAn, XBn = pair_bounds(A, B, block, cfg.BM, cfg.BN, sqa if pair_x else None,
                           sqb if pair_x else None, stats, group_blocks=cfg.plan.group_blocks)
    parts = [stats] + ([pair_ok(XAn, XBn).sum(dtype=torch.int32).view(1)] if pair_x else [])
    items, aparts = alpha_deferred(alpha, dev)
    rb = _read_back(torch.cat(parts + aparts).tolist(), pair_x, len(aparts))  # the one sync
    raise_codes([(c.name, rb.code_max[c.name], c.limit, c.fmt) for c in checks])
    if items is not None:
        factors = Alpha(alpha_premul(alpha_values(items, rb.alpha_words, dev)), [])
    else:
        factors = alpha_list(alpha, A.R, B.R, dev)
    if routed and (block == 32 or rb.pair_tiles == Mt * cfg.NT):   # every tile PAIR
        ptiles = tile_order(Mt, cfg.NT, 8, dev)[2]
        routing = Routing(None, ptiles, ptiles[:0], 0, None)
    else:
        mode, offsets = route(A, B, block, cfg.BM, cfg.BN, sqa, sqb,
                              group_blocks=cfg.plan.group_blocks)
        mode = forced(mode, force, has_block=offsets is not None, has_wide=block == 16)
        ptiles, btiles, n_fix, _, wtiles = tile_lists(mode)
        routing = Routing(mode, ptiles, btiles, n_fix, offsets, wtiles)
    del sqa, sqb
    if rb.special_a or rb.special_b or routing.n_fix:   # decoded scales for the exact fixup
        finish(A)
        finish(B)
    return Operands(ap, bp), routing, (rb.special_a, rb.special_b), factors


def _prepared(call, cfg, A, B, ops, routing, nrows, factors: Alpha) -> Prepared:
    """The fix-up's special rows / columns, and where alpha goes."""
    nra, nrb = nrows
    info = Specials(A.bad.nonzero().squeeze(1) if nra else None,
                    B.bad.nonzero().squeeze(1) if nrb else None, routing.n_fix > 0)
    need_zero = bool(nra or nrb or routing.n_fix)
    # a scalar alpha goes into the kernels' store when nothing comes after them (no fixup,
    # no lattice): saves one full pass over C
    # (not with WIDE tiles that may be flagged: the fix-up recomputes those without alpha)
    wide_fix = routing.wide is not None and routing.wide.numel() and not wide_exact(call.sfmt)
    fuse = (factors.scalar is not None and not need_zero and call.model.lattice is None
            and not wide_fix)
    al = factors.scalar if fuse else 1.0
    if fuse:
        factors = Alpha(None, factors.factors)
    return Prepared(call, cfg, A, B, ops, routing, info, need_zero, al, fuse, factors)


def _check_pair(A: Operand, B: Operand) -> None:
    if B.K != A.K:
        raise ValueError(f"b_codes: K={B.K} differs from a_codes' K={A.K}")
    if A.codes.device != B.codes.device:
        raise ValueError(f"b_codes: device {B.codes.device} differs from a_codes' {A.codes.device}")


def prepare(a_codes, a_scales, b_codes, b_scales, *, fmt="nvfp4", model="probe_matched",
            alpha=None, scale_fmt=None, block=None, tile=None, rz="auto", force=None):
    """Decode, check and route once; returns a callable that runs the kernels, the exact
    fixups and the epilogue (same arguments as ``blockscaled_mm``)."""
    call = parse_call(fmt, model, scale_fmt, block, rz, force)
    checks = []   # code-range checks of both operands: one host sync
    A = operand("a", a_codes, a_scales, call.sfmt, call.block, checks=checks)
    B = operand("b", b_codes, b_scales, call.sfmt, call.block, checks=checks)
    _check_pair(A, B)
    M, K, N, dev = A.R, A.K, B.R, A.codes.device
    interp = interpret()
    use_kernel = HAVE_TRITON and (dev.type == "cuda" or interp)
    # NVFP4 / UE5M3 probe_matched(_lattice) with the decode kernel: the code-range checks,
    # special rows, pair certificate and scalar alphas come back in one host sync
    fast = (use_kernel and call.fmt != "mxfp4" and not call.decoded
            and not torch_decode() and M * K > 0 and N > 0)
    factors = None
    if not fast:
        check_codes(checks)
        finish(A)
        finish(B)
        factors = alpha_list(alpha, M, N, dev)
    BM, BN = tile or ((32, 32) if interp else (128, 128))
    if not use_kernel:
        raise RuntimeError("blockscaled_mm: needs triton and a CUDA tensor (or "
                           "TRITON_INTERPRET=1); use fp4ref.gemm.emulate on the decoded "
                           "operands instead")
    cfg = LaunchConfig(BM, BN, -(-N // BN), call.rz_add(interp), interp, 8 if not interp else 4,
                       kernel_plan(call.model, K, call.block, call.decoded))
    if call.decoded:
        return _prepare_decoded(call, cfg, A, B, factors)
    if call.fmt == "mxfp4":
        ops, routing, nrows = _route_mx(call, cfg, A, B)
    elif fast:
        ops, routing, nrows, factors = _route_fast(call, cfg, A, B, checks, alpha)
    else:
        ops, routing, nrows = _route_slow(call, cfg, A, B)
    return _prepared(call, cfg, A, B, ops, routing, nrows, factors)


def blockscaled_mm(a_codes: torch.Tensor, a_scales: torch.Tensor, b_codes: torch.Tensor,
                   b_scales: torch.Tensor, *, fmt="nvfp4", model="probe_matched", alpha=None,
                   scale_fmt: str | None = None, block: int | None = None,
                   tile: tuple[int, int] | None = None, rz: str = "auto",
                   force: str | None = None) -> torch.Tensor:
    """C [M, N] float32 = A @ B^T under ``model``, bit-identical to ``fp4ref.gemm.emulate``
    / ``reference.gemm.dot`` on the decoded operands.

    a_codes: e2m1 codes [M, K] (uint8, or packed [M, K/2] / float4_e2m1fn_x2);
    b_codes: [N, K]; a_scales [M, K/B], b_scales [N, K/B]: scale codes (uint8 or the
    matching float8 dtype); fmt: "nvfp4", "mxfp4", "ue5m3" (a pair of equal names is
    accepted; mixed formats are rejected); alpha: per-tensor factors (e.g. NVFP4's
    decode scales), a number, a tensor broadcastable to [M, N], or a list of them.
    tile / rz / force are for tests: tile sizes, RZ adds by "asm" (add.rz.f32, the GPU
    default), "libdevice" (__nv_fadd_rz) or "twosum" (exact emulation, interpreter default),
    force "block" / "wide" / "fix" routing (force never breaks exactness: it only sends
    tiles to slower exact paths).  ``prepare(...)`` returns the decoded and routed GEMM, a
    callable running the kernels (benchmarks)."""
    return prepare(a_codes, a_scales, b_codes, b_scales, fmt=fmt, model=model, alpha=alpha,
                   scale_fmt=scale_fmt, block=block, tile=tile, rz=rz, force=force)()
