"""Triton GEMMs on block-scaled FP4 operands, bit-identical to ``reference.gemm``.

``blockscaled_mm(a_codes, a_scales, b_codes, b_scales, fmt=..., model=...)`` computes
C = A @ B^T (A: M x K, B: N x K, both K-major, as a Linear layer's X and W) for
NVFP4 (e2m1 + ue4m3/e4m3 scales, block 16, per-tensor scales as ``alpha``),
MXFP4 (e2m1 + e8m0, block 32) and UE5M3 (e2m1 + ue5m3, block 16; block 32 too)
under ``probe_matched``, ``probe_matched_lattice`` and ``decoded_fp32``.

Why it is exact (each step is an exact operation, or one IEEE-rounded operation
that is the model's own rounding):

* Operands: a * s_a (e2m1 value times its block scale) has at most 6
  significant bits and lies in bfloat16's range for ue4m3/e4m3/ue5m3 scales, so
  the bf16 operands A' = a * s_a and B' = b * s_b are exact.  All products of one
  block share the unit 2**(e_a + e_b - 2) (e = exponent of the scale's last bit).
* Tensor-core dots: a dot of bf16 values with FP32 accumulation is exact when
  every product and partial sum is a multiple of a unit u below 2**23 * u (no bit
  is lost by alignment to a >= 23-bit window, and the result is an FP32 value).
  A single block (16 or 32 products) always satisfies it (< 2**20 u).  Two blocks
  (32 products, "pair") satisfy it when a Cauchy-Schwarz bound from per-block
  norms says so; the host checks this per 128x128 output tile (``route``; per call a
  kernel computes the per-tile bounds, ``certify.pair_bounds``, and the BLOCK scheme is
  built only when some tile fails the certificate).
* Group of 64 (probe_matched): pair tiles: S = fl(t0 + t1) of two exact FP32
  pair sums is the RNE rounding of the exact group sum (IEEE addition of two
  floats is correctly rounded).  Block tiles: four exact block sums are added
  exactly as H + L with a per-output offset M = 1.5 * 2**23 * Q (Q a power of two
  chosen from per-row and per-column bounds): R += t rounds t to a multiple of Q
  (R stays in one binade), t - (R_new - R) is the exact remainder, the remainders
  sum exactly, and S = fl((R - M) + L) is again one correct rounding.  MXFP4
  groups are two single-block sums t_b = D_b * 2**(e_a + e_b) (exact when the
  host's range check holds), S = fl(t0 + t1).
* WIDE tiles (block 16, the tiles failing both certificates; any finite scales): per output
  and group the four block dots t_b (exact FP32 values, as above) go to float64 (exact) and
  are summed with TwoSum: s_b, e_b = TwoSum(s_{b-1}, t_b) (s = RN64 of the running sum, e its
  exact error), f_b, q_b = TwoSum(f_{b-1}, e_b).  If every q_b = 0 the exact group sum is
  x = s + f, and hi, lo = TwoSum(s, f) gives hi = RN64(x), lo = x - hi exactly.  Round to odd
  at 53 bits (hi if lo = 0 or hi's last bit is odd, else hi's neighbour toward lo), then one
  RNE conversion to FP32: RN32(RO53(x)) = RN32(x) because 53 >= 24 + 2 (Boldo & Melquiond),
  so ties and values next to an FP32 midpoint are decided by the remainder's sign.  Range: all
  t_b are multiples of 2**L (L = the smallest product unit) with |partial sums| < 2**H; every
  e_b is then a multiple of 2**L below 2**(H - 53), so sum e_b is exact in float64 whenever
  H - L <= 104 (q_b = 0 always).  UE5M3: units >= 2**-36 (0.5 * 2**-17 per side), sums
  < 2**43 (64 * (6 * 61440)**2): H - L = 79; UE4M3 / E4M3 scales (2**-20, 2**29): 49.  No
  float64 overflow or underflow either (|x| < 2**43, units >= 2**-36).  Where H - L > 104
  (E8M0 scales: MXFP4 stays on its own route with the fix-up) a nonzero q_b flags the tile,
  which the fix-up recomputes (``tables.wide_exact`` says, per scale format, when the flags
  need not be read back); for the formats routed to WIDE this is proven never to happen.
* Cross-group: outer = add_rz(outer, S), an FP32 add rounded toward zero
  (libdevice __nv_fadd_rz on GPU; an exact TwoSum-based emulation otherwise).
* decoded_fp32: acc = fma(a*s_a, b*s_b, acc) per k in order; the product is an
  exact FP32 value, so the FMA is the FP32 RNE add of the reference.
* Rows / columns with a non-finite scale: decided by counts of NaN, +Inf and -Inf products
  (``fixup.special_values``: a few indicator matmuls, no sequential emulation).  What else
  the kernels do not cover (MX exponents out of range, forced FIX, flagged WIDE tiles) is
  recomputed by the exact torch emulator ``fp4ref.gemm.emulate``; lattice and alpha are
  applied afterwards in FP32
  (exact IEEE ops, or the emulator's exact products for non-FP32 alpha).

The steps, one module each: ``decode`` (checks, codes -> exact bf16 operands),
``certify`` (pair certificate, special rows), ``route`` (tile -> PAIR / BLOCK / WIDE / FIX),
``launch`` (the kernels, ``kernels.py``), ``fixup`` (special rows / columns by counts of non-finite products, FIX tiles by the exact emulator), ``epilogue``
(lattice, alpha); ``driver.prepare`` runs them in order, ``options`` holds the accepted
choices, ``tables`` the per-code lookup tables.

Memory: the bf16 operands (M*K + N*K), scale tables (M*K/16 + N*K/16) and the
output; no M x N x K/B intermediates.  Tests: tests/test_gemm_triton.py (GPU:
``python -m pytest -q -m gpu tests/test_gemm_triton.py``); benchmark:
``fp4ref.bench_gemm``.
"""
from __future__ import annotations

from .decode import decode_operand
from .driver import Prepared, blockscaled_mm, prepare
from .launch import HAVE_TRITON, available
from .options import MODELS, OPERAND_FORMATS, OperandFormat
from .quantize import quantize_operand
from .route import route_stats
from .tables import code_values

__all__ = ["HAVE_TRITON", "OPERAND_FORMATS", "OperandFormat", "MODELS", "Prepared",
           "blockscaled_mm", "prepare", "decode_operand", "quantize_operand", "route_stats",
           "code_values", "available"]

