"""Element casts of the quantization profiles, torch form (twins of reference.recipes.elem)."""
from __future__ import annotations

import torch

from reference.formats import get_format
from reference.recipes.rules import ElemNan, choose, unreachable
from reference.rounding import Mode, Policy
from fp4ref import cast

__all__ = ["rne_signed", "te_ref_fp4", "torchao_floatx", "torch_fp8", "bf16_torch", "f32_bits",
           "from_f32_bits", "canon_nan", "tmin"]

_POL = {}


def _policy(fmt, nan: str) -> Policy:
    """The satfinite policy whose NaN result is reference.recipes.elem.rne_signed's."""
    key = (fmt, nan)
    if key not in _POL:
        _POL[key] = Policy.make(overflow="satfinite", inf="saturate",
                                nan=_nan_policy(get_format(fmt), choose("nan", nan, ElemNan)))
    return _POL[key]


def _nan_policy(spec, nan: ElemNan) -> str:
    if nan is ElemNan.NAN:   # the format's NaN (float8 elements), +max where it has none
        return "canonical" if spec.has_nan else "to_max"
    if nan is ElemNan.ZERO:
        return "to_zero"
    if nan is ElemNan.MAX:
        return "to_max"
    unreachable("nan", nan)


def rne_signed(q: torch.Tensor, fmt: str, mode=Mode.RNE, rbits=None, nbits=None,
               nan: str = "max") -> torch.Tensor:
    """cvt.rn.satfinite-style cast: nearest (or SR), saturate, keep the sign of zero."""
    return cast.quantize(q, fmt, mode, _policy(fmt, nan), rbits=rbits, nbits=nbits)


def te_ref_fp4(q: torch.Tensor) -> torch.Tensor:
    """TE 2.20.2 ``cast_to_fp4x2``: RNE, but -0 and NaN -> code 0."""
    c = cast.quantize(q, "float4_e2m1fn", Mode.RNE, _policy("float4_e2m1fn", "zero"))
    return torch.where((q == 0) | torch.isnan(q), torch.zeros_like(c), c)


def torch_fp8(q: torch.Tensor, fmt: str) -> torch.Tensor:
    dt = {"float8_e4m3fn": torch.float8_e4m3fn, "float8_e5m2": torch.float8_e5m2}[fmt]
    return q.to(dt).view(torch.uint8)


def f32_bits(x: torch.Tensor) -> torch.Tensor:
    """float32 -> its bit pattern as int64 in [0, 2**32)."""
    return x.contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF


def from_f32_bits(b: torch.Tensor) -> torch.Tensor:
    b = b.to(torch.int64)
    b = torch.where(b >= (1 << 31), b - (1 << 32), b)
    return b.to(torch.int32).view(torch.float32)


_CONSTS: dict = {}


def const(key, device, make) -> torch.Tensor:
    """A 0-dim constant, made once per device: on CUDA each fresh one is a kernel launch,
    and the scalar steps of current scaling are launch-bound.  Never written in place."""
    k = (key, str(device))
    t = _CONSTS.get(k)
    if t is None:
        t = _CONSTS[k] = make()
    return t


def f32_const(v: float, device) -> torch.Tensor:
    return const(("f32", float(v)), device,
                 lambda: torch.full((), float(v), dtype=torch.float32, device=device))


def canon_nan(x: torch.Tensor, bits: int = 0x7FC00000) -> torch.Tensor:
    """Replace every NaN by one float32 bit pattern (reductions: canonical +NaN)."""
    n = const(("nan", bits), x.device, lambda: from_f32_bits(
        torch.full((), bits, dtype=torch.int64, device=x.device)))
    return torch.where(torch.isnan(x), n, x)


def tmin(a: torch.Tensor, b) -> torch.Tensor:
    """torch.minimum with NaN made +canonical (its vectorized path returns 0xFFFFFFFF,
    its scalar path 0x7FC00000: the reference fixes +canonical, f32.tmin)."""
    if not isinstance(b, torch.Tensor):
        b = f32_const(b, a.device)
    return canon_nan(torch.minimum(a, b))


def bf16_torch(q: torch.Tensor) -> torch.Tensor:
    """float32 -> bfloat16 (RNE) -> float32, NaN as torch's vectorized path makes it (0xFFFF)."""
    return canon_nan(q.to(torch.bfloat16).to(torch.float32), 0xFFFF0000)


def torchao_floatx(x: torch.Tensor, fmt: str) -> torch.Tensor:
    """torchao ``_f32_to_floatx_unpacked`` bit trick (NaN bits run through the normal branch)."""
    spec = get_format(fmt)
    ebits, mbits = spec.exp_bits, spec.man_bits
    exp_bias = (1 << (ebits - 1)) - 1
    max_int = (1 << (ebits + mbits)) - 1
    max_normal = 2.0 ** ((1 << ebits) - 1 - exp_bias) * (((1 << (mbits + 1)) - 1) / 2 ** mbits)
    min_normal = 2.0 ** (1 - exp_bias)
    b = f32_bits(x.to(torch.float32))
    sign = b & 0x80000000
    a = b ^ sign
    xa = from_f32_bits(a)
    sat = xa >= max_normal
    den = (~sat) & (xa < min_normal)
    denorm_exp = (127 - exp_bias) + (23 - mbits) + 1
    dm = denorm_exp << 23
    dmf = from_f32_bits(torch.full((), dm, dtype=torch.int64, device=x.device))
    dcode = ((f32_bits(xa + dmf) - dm) & 0xFFFFFFFF) & 0xFF
    mant_odd = (a >> (23 - mbits)) & 1
    n = (a + ((exp_bias - 127) << 23) + ((1 << (23 - mbits - 1)) - 1) + mant_odd) & 0xFFFFFFFF
    ncode = (n >> (23 - mbits)) & 0xFF
    code = torch.where(sat, torch.full_like(a, max_int), torch.where(den, dcode, ncode))
    sign_lp = (sign >> (23 + 8 - mbits - ebits)) & (1 << (ebits + mbits))
    return ((code | sign_lp) & 0xFF).to(torch.uint8)
