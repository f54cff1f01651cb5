"""``fp4ref.mma``: one tensor-core MMA instruction, D = A*B + C, bit-exact and vectorised.

The same instruction models as ``reference.mma`` (docs/mma.md), computed on whole tiles
with numpy int64 arithmetic: every operand is decoded once from a lookup table into
(sign, integer significand, exponent); a term's value is significand * 2^(exponent - f);
alignment is an integer shift to units of 2^(E - W) (truncating the magnitude: toward
zero); the sum is an int64 reduction; the FP32 bits are assembled from the bit length
of the sum.  Every intermediate stays below 2^50 (bounds in the comments), so int64 is
exact.  ``reference.mma`` computes the same thing one element at a time in Fractions.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch

from reference.formats import FormatSpec, Specials, get_format
from reference.mma import CANONICAL_NAN, Instr, resolve

__all__ = ["mma", "decode_table"]

_SIGN = 0x80000000
_INF = 0x7F800000
_F32 = get_format("float32")


def _fields(spec: FormatSpec, codes: np.ndarray) -> dict[str, np.ndarray]:
    """Decode codes from the format's fields: value = (-1)^neg * sig * 2^(exp - man_bits).

    A subnormal or zero gets the minimum normal exponent (spec.emin) and sig < 2^man_bits."""
    codes = codes.astype(np.int64)
    mb = spec.man_bits
    ef = (codes >> mb) & spec.exp_max_field
    mf = codes & spec.man_mask
    normal = ef > 0 if spec.subnormals else np.ones(codes.shape, bool)
    sig = np.where(normal, mf | (1 << mb), mf)
    exp = np.maximum(ef - spec.bias, spec.emin)
    mag = codes & ~spec.sign_mask
    if spec.specials is Specials.IEEE:
        top = ef == spec.exp_max_field
        inf, nan = top & (mf == 0), top & (mf != 0)
    elif spec.specials is Specials.NAN_ALL_ONES:
        inf, nan = np.zeros(codes.shape, bool), mag == (1 << (spec.nbits - spec.sign_bits)) - 1
    else:
        inf = nan = np.zeros(codes.shape, bool)
    neg = (codes & spec.sign_mask) != 0
    return {"neg": neg, "sig": np.where(inf | nan, 0, sig), "exp": exp, "inf": inf, "nan": nan,
            "zero": (sig == 0) & ~inf & ~nan}


@lru_cache(maxsize=None)
def decode_table(fmt: str) -> dict[str, np.ndarray]:
    """Per-code decode table of an element or scale format (``ue4m3``: 256 raw bytes, the
    sign bit ignored as the MMA does; ``ue8m0``: the float8_e8m0fnu bytes)."""
    if fmt == "ue4m3":
        return _fields(get_format("ue4m3"), np.arange(256) & 0x7F)
    spec = get_format("float8_e8m0fnu" if fmt == "ue8m0" else fmt)
    return _fields(spec, np.arange(1 << spec.nbits))


def _man_bits(fmt: str) -> int:
    return 0 if fmt == "ue8m0" else get_format(fmt).man_bits


def _lookup(fmt: str, codes: np.ndarray) -> dict[str, np.ndarray]:
    return {k: v[codes] for k, v in decode_table(fmt).items()}


def _shift(x: np.ndarray, sh: np.ndarray) -> np.ndarray:
    """x * 2^sh truncated toward zero (shifts the magnitude)."""
    mag = np.abs(x)
    out = np.where(sh >= 0, mag << np.clip(sh, 0, 62), mag >> np.clip(-sh, 0, 63))
    return np.where(x < 0, -out, out)


def _bit_length(x: np.ndarray) -> np.ndarray:
    n = np.zeros(x.shape, np.int64)
    for s in (32, 16, 8, 4, 2, 1):
        big = x >= (1 << s)
        x = np.where(big, x >> s, x)
        n += np.where(big, s, 0)
    return n + (x > 0)


def _to_bits(total, unit_exp, out_frac_bits: int, neg_zero) -> np.ndarray:
    """FP32 bits of total * 2^unit_exp rounded toward zero to out_frac_bits fraction bits."""
    F = out_frac_bits
    mag = np.abs(total)
    top = unit_exp + _bit_length(mag) - 1           # exponent of the leading bit
    e = np.maximum(top, -126)                       # FP32 subnormals kept
    kept = _shift(mag, unit_exp - (e - F))          # units of the quantum 2^(e - F), < 2^(F+1)
    normal = kept >= (1 << F)
    bits = np.where(normal, ((e + 127) << 23) | ((kept - (1 << F)) << (23 - F)),
                    kept << (23 - F))
    bits = np.where((mag > 0) & (top >= 128), _INF, bits)   # beyond the FP32 range: +-Inf
    sign = (total < 0) | ((total == 0) & neg_zero)
    return bits | np.where(sign, _SIGN, 0)


def _c_fields(c_bits: np.ndarray) -> dict[str, np.ndarray]:
    d = _fields(_F32, c_bits)
    d["val"] = np.where(d["neg"], -d["sig"], d["sig"])   # < 2^24
    return d


def _finish(bits, nan, pos_inf, neg_inf) -> np.ndarray:
    bits = np.where(pos_inf, _INF, np.where(neg_inf, _INF | _SIGN, bits))
    return np.where(nan | (pos_inf & neg_inf), CANONICAL_NAN, bits)


def _mxf4nvf4(ins: Instr, a, b, c, sa, sb) -> np.ndarray:
    """Four groups of 16: exact integer group sums, scaled, aligned at the scale-exponent sums."""
    M, N = a.shape[0], b.shape[1]
    ta, tb = _lookup(ins.a_format, a), _lookup(ins.b_format, b)
    # element value * 2 = sig << exp (e2m1: emin 0, 1 fraction bit); |.| <= 12
    av = np.where(ta["neg"], -1, 1) * (ta["sig"] << ta["exp"])
    bv = np.where(tb["neg"], -1, 1) * (tb["sig"] << tb["exp"])
    S = np.einsum("igk,gkj->igj", av.reshape(M, 4, 16), bv.reshape(4, 16, N))  # 4 * group sum
    g_idx = np.arange(4) * 16 // ins.block
    ssa, ssb = _lookup(ins.scale_format, sa[:, g_idx]), _lookup(ins.scale_format, sb[g_idx, :])
    fs = _man_bits(ins.scale_format)
    T = S * ssa["sig"][:, :, None] * ssb["sig"][None, :, :]      # |T| < 2304 * 15 * 15 < 2^19
    esum = ssa["exp"][:, :, None] + ssb["exp"][None, :, :]       # [M, 4, N]
    cf = _c_fields(c)
    E = np.maximum(cf["exp"], esum.max(axis=1))
    W = ins.width
    q = _shift(T, esum - E[:, None, :] + W - 2 - 2 * fs).sum(axis=1)        # each < 2^46
    q = q + _shift(cf["val"], cf["exp"] - 23 - E + W)            # < 2^36
    # a group term is -0 when its exact sum is negative or -0 and a scale is zero, or its
    # products are all -0 (IEEE signs); D is -0 only if C and all four terms are -0
    pneg0 = (ta["neg"][:, :, None] != tb["neg"][None, :, :]) \
        & (ta["zero"][:, :, None] | tb["zero"][None, :, :])
    all_neg0 = pneg0.reshape(M, 4, 16, N).all(axis=2)
    term_neg0 = (T == 0) & ((S < 0) | ((S == 0) & all_neg0))
    neg_zero = term_neg0.all(axis=1) & cf["zero"] & cf["neg"]
    bits = _to_bits(q, E - W, ins.out_frac_bits, neg_zero)
    nan = cf["nan"] | ssa["nan"].any(axis=1)[:, None] | ssb["nan"].any(axis=0)[None, :]
    return _finish(bits, nan, cf["inf"] & ~cf["neg"], cf["inf"] & cf["neg"])


def _products(ins: Instr, a, b, c, sa, sb) -> np.ndarray:
    """C plus K products (times scales), aligned at the largest exponent sum, W bits."""
    ta, tb = _lookup(ins.a_format, a), _lookup(ins.b_format, b)
    fa, fb = get_format(ins.a_format).man_bits, get_format(ins.b_format).man_bits
    A, B = (lambda t: t[:, :, None]), (lambda t: t[None, :, :])   # [M,K] / [K,N] -> [M,K,N]
    P = np.where(A(ta["neg"]) != B(tb["neg"]), -1, 1) * A(ta["sig"]) * B(tb["sig"])  # < 2^22
    pe = A(ta["exp"]) + B(tb["exp"])
    pnan = A(ta["nan"]) | B(tb["nan"]) | (A(ta["inf"]) & B(tb["zero"])) \
        | (A(ta["zero"]) & B(tb["inf"]))
    if ins.scale_format is not None:
        k_idx = np.arange(ins.k) // ins.block
        ssa, ssb = _lookup(ins.scale_format, sa[:, k_idx]), _lookup(ins.scale_format, sb[k_idx, :])
        P = P * A(ssa["sig"]) * B(ssb["sig"])    # ue8m0: significand 1
        pe = pe + A(ssa["exp"]) + B(ssb["exp"])
        pnan = pnan | A(ssa["nan"]) | B(ssb["nan"])
    pinf = (A(ta["inf"]) | B(tb["inf"])) & ~pnan
    pneg = A(ta["neg"]) != B(tb["neg"])
    cf = _c_fields(c)
    E = np.maximum(cf["exp"], pe.max(axis=1))
    W = ins.width
    q = _shift(P, pe - fa - fb - E[:, None, :] + W).sum(axis=1)   # each < 2^27, K <= 32 terms
    q = q + _shift(cf["val"], cf["exp"] - 23 - E + W)
    neg_zero = ((P == 0) & pneg & ~pnan & ~pinf).all(axis=1) & cf["zero"] & cf["neg"]
    bits = _to_bits(q, E - W, ins.out_frac_bits, neg_zero)
    pos_inf = (pinf & ~pneg).any(axis=1) | (cf["inf"] & ~cf["neg"])
    neg_inf = (pinf & pneg).any(axis=1) | (cf["inf"] & cf["neg"])
    return _finish(bits, pnan.any(axis=1) | cf["nan"], pos_inf, neg_inf)


_KERNELS = {"mxf4nvf4": _mxf4nvf4, "mxf8f6f4": _products, "f8f6f4": _products,
            "f16": _products, "tf32": _products, "wgmma": _products}


def _as_codes(param: str, x, shape: tuple, what: str, ncodes: int) -> np.ndarray:
    """Check an integer code tensor: dtype, shape ([M, K] with None = any) and range."""
    t = torch.as_tensor(x)
    if t.dtype in (torch.bool,) or t.dtype.is_floating_point or t.dtype.is_complex:
        raise ValueError(f"{param}: dtype {t.dtype} holds no raw codes; pass an integer tensor "
                         f"(uint8 for formats of 8 bits or fewer), one {what} code per element")
    if t.dim() != len(shape) or any(w is not None and w != s for w, s in zip(shape, t.shape)):
        want = "[" + ", ".join("*" if w is None else str(w) for w in shape) + "]"
        raise ValueError(f"{param}: shape {list(t.shape)} does not match {want}")
    v = t.detach().cpu().to(torch.int64).numpy()
    bad = (v < 0) | (v >= ncodes)
    if bad.any():
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ValueError(f"{param}: code {int(v[idx])} at index {list(idx)} is not a {what} "
                         f"code; valid codes: 0..{ncodes - 1} (one code per element, unpacked)")
    return v


def _as_c(c, M: int, N: int) -> np.ndarray:
    t = torch.as_tensor(c)
    if t.dtype != torch.float32:
        raise ValueError(f"c: dtype {t.dtype} is not supported; valid choices: torch.float32")
    if tuple(t.shape) != (M, N):
        raise ValueError(f"c: shape {list(t.shape)} does not match [{M}, {N}] (rows of a, "
                         "columns of b)")
    return t.detach().cpu().contiguous().view(torch.int32).numpy().astype(np.int64) & 0xFFFFFFFF


def _as_scales(ins: Instr, scale_a, scale_b, M: int, N: int):
    if ins.scale_format is None:
        for param, s in (("scale_a", scale_a), ("scale_b", scale_b)):
            if s is not None:
                raise ValueError(f"{param}: kind {ins.kind!r} takes no scales; valid choices: None")
        return None, None
    nb = ins.k // ins.block
    for param, s in (("scale_a", scale_a), ("scale_b", scale_b)):
        if s is None:
            raise ValueError(f"{param}: kind {ins.kind!r} needs raw {ins.scale_format} scale "
                             f"bytes (scale_a [M, {nb}], scale_b [{nb}, N])")
    what = f"{ins.scale_format} scale byte"
    return (_as_codes("scale_a", scale_a, (M, nb), what, 256),
            _as_codes("scale_b", scale_b, (nb, N), what, 256))


def mma(kind, a, b, c, scale_a=None, scale_b=None, *, block=None, scale_format=None,
        a_format=None, b_format=None, arch="blackwell") -> torch.Tensor:
    """D = A*B + C for one MMA instruction tile, bit-exact to the named model (docs/mma.md).

    ``a`` [M, K] and ``b`` [K, N]: raw element codes (uint8, one code per element, unpacked;
    16/19-bit codes of fp16/bf16/tf32 in a wider integer dtype); ``c`` [M, N] float32;
    ``scale_a`` [M, K/block] and ``scale_b`` [K/block, N]: raw scale bytes.  K is fixed by
    the kind: mxf4nvf4 64; mxf8f6f4, f8f6f4 32; f16 16; tf32 8; wgmma (arch="hopper") 32
    for fp8, 16 for fp16/bf16.  Returns float32 [M, N] on c's device.
    """
    ins = resolve(kind, arch=arch, a_format=a_format, b_format=b_format,
                  scale_format=scale_format, block=block)
    fa, fb = get_format(ins.a_format), get_format(ins.b_format)
    A = _as_codes("a", a, (None, ins.k), fa.name, fa.ncodes)
    B = _as_codes("b", b, (ins.k, None), fb.name, fb.ncodes)
    M, N = A.shape[0], B.shape[1]
    C = _as_c(c, M, N)
    SA, SB = _as_scales(ins, scale_a, scale_b, M, N)
    bits = _KERNELS[ins.kind](ins, A, B, C, SA, SB)
    out = torch.from_numpy(bits.astype(np.uint32).view(np.float32).copy())
    return out.to(torch.as_tensor(c).device)
