"""Step 4, launch: the kernels of the current mode, and the GEMM kernels' launches.

Tensor-core dots: a dot of bf16 values with FP32 accumulation is exact when every product and
partial sum is a multiple of a unit u below 2**23 * u; ``certify`` and ``route`` send each
output tile to a kernel whose dots meet that (the package docstring has the proofs)."""
from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING, NamedTuple

import torch

from .options import interpret
from .tables import wide_exact

if TYPE_CHECKING:  # pragma: no cover
    from .gemm import Prepared

try:  # triton is optional (pyproject extra "gpu")
    import triton  # noqa: F401
    HAVE_TRITON = True
except Exception:  # pragma: no cover - depends on the machine
    HAVE_TRITON = False

__all__ = ["HAVE_TRITON", "available", "Kernels", "kernels", "launch_gemm", "launch_decoded"]


class Kernels(NamedTuple):
    pair: object      # PAIR tiles, block 16 / 32 (bf16 a * s_a operands)
    block: object     # BLOCK tiles (block 16): one dot per block, offset sums
    mx: object        # MXFP4 tiles: e2m1 operands, e8m0 factors after each dot
    decoded: object   # decoded_fp32: FP32 FMAs in k order
    decode: object    # codes -> bf16 operands (+ sums of squares, code-range check)
    bounds: object    # pair-certificate bounds per tile, special rows
    wide: object      # WIDE tiles (block 16): block dots summed exactly in float64


_KERNELS: dict[bool, Kernels] = {}


def available() -> bool:
    return HAVE_TRITON and torch.cuda.is_available()


def kernels() -> Kernels:
    """The kernels for the current TRITON_INTERPRET mode: ``kernels.py`` is executed once per
    mode, at first use (``triton.jit`` picks interpreter or compiler when it decorates)."""
    mode = interpret()
    if mode not in _KERNELS:
        spec = importlib.util.find_spec(f"{__package__}.kernels")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        _KERNELS[mode] = Kernels(*(getattr(mod, f"_{n}_kernel") for n in Kernels._fields))
    return _KERNELS[mode]


WIDE_SUB = 64   # the WIDE kernel's sub-tile (rows and columns): float64 state per output


def launch_gemm(p: "Prepared", c: torch.Tensor) -> torch.Tensor | None:
    """The PAIR / BLOCK / WIDE (or MX) tiles of ``p`` into ``c``; the FIX tiles stay for
    ``fixup``.  Returns the WIDE kernel's per-tile flags (int32 [Mt * Nt], nonzero where a
    group sum was not proven exact: ``fixup`` recomputes those tiles), or None."""
    k, r, cfg, o = kernels(), p.routing, p.cfg, p.ops
    M, N, K = p.M, p.N, p.K
    n_p, n_b = r.pair.numel(), r.block.numel()
    kw = dict(BM=cfg.BM, BN=cfg.BN, RZ=cfg.RZ, F32=cfg.F32, ALPHA=p.fuse, num_warps=cfg.num_warps)
    if p.call.fmt == "mxfp4":
        if n_p:
            k.mx[(n_p,)](o.ap, o.bp, c, o.fa, o.fb, r.pair, M, N, K, cfg.NT, K // p.call.block,
                         p.alpha, **kw)
        return
    if n_p:
        k.pair[(n_p,)](o.ap, o.bp, c, r.pair, M, N, K, cfg.NT, p.alpha, num_stages=3, **kw)
    if n_b:
        q = r.offsets
        k.block[(n_b,)](o.ap, o.bp, c, q.MA, q.QB, r.block, M, N, K, cfg.NT, q.MA.shape[1],
                        p.alpha, **kw)
    return launch_wide(p, c, kw)


def launch_wide(p: "Prepared", c: torch.Tensor, kw: dict) -> torch.Tensor | None:
    """The WIDE tiles, each as (BM / SBM) * (BN / SBN) programs of SBM x SBN outputs; the
    per-tile flags stay zero where ``tables.wide_exact`` proves the error sums exact."""
    r, cfg, o = p.routing, p.cfg, p.ops
    n_w = 0 if r.wide is None else r.wide.numel()
    if not n_w:
        return None
    sbm = WIDE_SUB if cfg.BM % WIDE_SUB == 0 else cfg.BM
    sbn = WIDE_SUB if cfg.BN % WIDE_SUB == 0 else cfg.BN
    nsub = (cfg.BM // sbm) * (cfg.BN // sbn)
    flags = torch.zeros(-(-p.M // cfg.BM) * cfg.NT, dtype=torch.int32, device=c.device)
    kernels().wide[(n_w * nsub,)](o.ap, o.bp, c, flags, r.wide, p.M, p.N, p.K, cfg.NT, p.alpha,
                                  SBM=sbm, SBN=sbn, EXACT=wide_exact(p.call.sfmt), **kw)
    return flags


def launch_decoded(apT: torch.Tensor, bpT: torch.Tensor, c: torch.Tensor) -> None:
    """decoded_fp32: acc = fma(a*s_a, b*s_b, acc) per k in order, 64 x 64 tiles."""
    K, M = apT.shape
    N = bpT.shape[1]
    kernels().decoded[(-(-M // 64), -(-N // 64))](apT, bpT, c, M, N, K, BM=64, BN=64)

