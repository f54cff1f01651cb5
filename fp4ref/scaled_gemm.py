"""``fp4ref.scaled_mm``: an emulated library-level block-scaled GEMM, bit-exact to a model.

    y = fp4ref.scaled_mm(a, b, scale_a, scale_b, model="blackwell-mxf4nvf4",
                         alpha=None, out_dtype=torch.float32)

``torch._scaled_mm``'s conventions for NVFP4 and MXFP4 (torch 2.13, ``_meta_registrations``
and ``torch/testing/_internal/common_quantized.py``):

* ``a`` [M, K/2] and ``b`` [K/2, N]: ``torch.float4_e2m1fn_x2`` (or uint8) bytes holding two
  e2m1 codes each, packed along K, element 2i in the LOW nibble (``pack_uint4``).  ``b`` is
  what torch takes as ``mat2``: the transpose of a row-major [N, K/2] weight (``w.t()``).
  Only the logical indices matter here, so any strides are accepted.
* The scale dtype picks the recipe, as in torch: ``float8_e4m3fn`` -> NVFP4 (block 16),
  ``float8_e8m0fnu`` -> MXFP4 (block 32); both scales of one dtype.
* ``scale_a`` holds the [M, K/block] scales of a, ``scale_b`` the [N, K/block] scales of
  b's columns, each in cuBLAS's 128x4 swizzled ("blocked") layout (``to_blocked``): the
  matrix is padded to [128*ceil(R/128), 4*ceil(C/4)] and scale (r, c) sits at flat index
  ``((r//128) * ceil(C/4) + c//4) * 512 + (r%32) * 16 + ((r%128)//32) * 4 + c%4``.
  Any shape with exactly that many elements is accepted; the padding is never read.
* ``alpha``: the per-tensor NVFP4 scale(s): None, a number, a one-element tensor, or a list
  of them, multiplied together in FP32 first (each product rounded RNE), then applied
  once to the FP32 accumulator (one FP32 RNE rounding), then ``out_dtype`` (RNE).

Models (``MODELS``):

* ``blackwell-mxf4nvf4``: the chain of ``tcgen05.mma kind::mxf4nvf4`` instructions along
  K (K = 64 each, ``fp4ref.mma``'s semantics, docs/mma.md), C the running FP32 accumulator
  starting at +0 (so RZ to FP32 once per 64 K-elements), then the epilogue: the GEMM
  family's ``blackwell_mxf4nvf4`` preset (``reference.gemm``; MXFP4 scales with e8m0's
  exponent rule), run by ``fp4ref.gemm.emulate`` on the decoded operands (the one torch
  implementation of the family; this module only decodes bytes).  NVFP4 scales are raw
  e4m3 bytes (the MMA ignores the sign bit); any NaN scale of an instruction or a NaN C
  gives the canonical NaN, which then stays.  K must be a multiple of 64.
  Assumption (not measured): C starts as +0, a zero-initialised accumulator taking part in
  the alignment with exponent -126; a kernel that leaves C out of its first instruction
  differs only where MXFP4 scale-exponent sums fall below -126.
* ``seed-probe-matched``: the seed paper's ``probe_matched`` preset (``reference.gemm``)
  on the decoded operands (e4m3 scales decoded signed, as ``float8_e4m3fn``), run by
  ``fp4ref.blockscaled_mm`` (Triton, CUDA) or ``fp4ref.emulate`` (elsewhere).

NaN results are canonical: float32 0x7FFFFFFF (the MMA's NaN), bfloat16/float16 0x7FFF.
"""
from __future__ import annotations

import math
from fractions import Fraction

import torch

from reference.errors import check_choice
from reference.exact import Exact, Kind, exact
from reference.formats import get_format
from reference.gemm import get_preset, round_fp
from reference.rounding import Mode

__all__ = ["scaled_mm", "mxf4nvf4_chain", "unswizzle_128x4", "swizzle_128x4",
           "swizzled_numel", "MODELS", "OUT_DTYPES"]

MODELS = ("blackwell-mxf4nvf4", "seed-probe-matched")
OUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# scale dtype -> (recipe, fp4ref.mma scale format, block, decoded scale format of the seed)
_RECIPES = {torch.float8_e4m3fn: ("nvfp4", "ue4m3", 16, "float8_e4m3fn"),
            torch.float8_e8m0fnu: ("mxfp4", "ue8m0", 32, "float8_e8m0fnu")}
_PACKED = (torch.float4_e2m1fn_x2, torch.uint8)
_K_INSTR = 64                       # kind::mxf4nvf4: K per instruction
_NAN_BITS = {torch.float32: (torch.int32, 0x7FFFFFFF), torch.bfloat16: (torch.int16, 0x7FFF),
             torch.float16: (torch.int16, 0x7FFF)}


# --- cuBLAS's 128x4 swizzled scale layout -------------------------------------

def swizzled_numel(rows: int, cols: int) -> int:
    """Elements of the swizzled layout of a [rows, cols] scale matrix (padding included)."""
    return 128 * -(-rows // 128) * 4 * -(-cols // 4)


def swizzle_128x4(s: torch.Tensor) -> torch.Tensor:
    """[rows, cols] scales -> the flat swizzled layout (zero padding), as ``to_blocked``."""
    rows, cols = s.shape
    R, C = 128 * -(-rows // 128), 4 * -(-cols // 4)
    pad = torch.zeros((R, C), dtype=torch.uint8, device=s.device)
    pad[:rows, :cols] = s.view(torch.uint8) if s.dtype != torch.uint8 else s
    t = pad.view(R // 128, 128, C // 4, 4).permute(0, 2, 1, 3)   # tiles [R/128, C/4, 128, 4]
    t = t.reshape(-1, 4, 32, 4).transpose(1, 2)                  # tile row r -> (r%32, r//32)
    return t.reshape(-1).view(s.dtype) if s.dtype != torch.uint8 else t.reshape(-1)


def unswizzle_128x4(flat: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """The flat swizzled layout -> [rows, cols] (the padding dropped); dtype kept."""
    R, C = 128 * -(-rows // 128), 4 * -(-cols // 4)
    t = flat.reshape(R // 128, C // 4, 32, 4, 4).transpose(2, 3)  # [.., r//32, r%32, c%4]
    t = t.reshape(R // 128, C // 4, 128, 4).permute(0, 2, 1, 3).reshape(R, C)
    return t[:rows, :cols]


# --- operand decoding (byte level) --------------------------------------------

_TABLES: dict = {}


def _value_table(fmt: str, device) -> torch.Tensor:
    """float32 value of every code of ``fmt`` (reference.formats' decode; -0 and NaN kept).
    ``ue4m3`` has 256 entries: the MMA reads the full e4m3 byte and ignores its sign bit."""
    key = (fmt, str(device))
    if key not in _TABLES:
        spec = get_format("float8_e8m0fnu" if fmt == "ue8m0" else fmt)
        mask = 0x7F if fmt == "ue4m3" else 0xFF
        vals = []
        for code in range(256 if fmt == "ue4m3" else spec.ncodes):
            x = spec.decode(code & mask)
            v = math.nan if x.is_nan else (math.inf if x.is_inf else float(x.mag))
            vals.append(-v if x.negative else v)
        _TABLES[key] = torch.tensor(vals, dtype=torch.float32, device=device)
    return _TABLES[key]


def _decode(fmt: str, codes: torch.Tensor) -> torch.Tensor:
    return _value_table(fmt, codes.device)[codes.long()]


# --- the kind::mxf4nvf4 chain: fp4ref.gemm.emulate under the blackwell_mxf4nvf4 preset ----

def _mxf4nvf4_model(sf: str):
    """The preset (NVFP4: ue4m3 exponent rule); MXFP4 scales use e8m0's (no subnormals)."""
    m = get_preset("blackwell_mxf4nvf4")
    if sf == "ue8m0":
        m = m.replace(exp_formats=("float4_e2m1fn", "float4_e2m1fn", "float8_e8m0fnu"))
    return m


def mxf4nvf4_chain(a_codes: torch.Tensor, b_codes: torch.Tensor, scale_a: torch.Tensor,
                   scale_b: torch.Tensor, *, scale_format: str, block: int, alpha=None,
                   out_dtype: torch.dtype = torch.float32, backend: str = "auto") -> torch.Tensor:
    """``blackwell-mxf4nvf4`` on unpacked operands: kind::mxf4nvf4 instructions chained
    along K from C = +0, then the epilogue (alpha, out_dtype) as in ``scaled_mm``.

    ``a_codes`` [M, K], ``b_codes`` [K, N]: e2m1 codes (0..15, one per element);
    ``scale_a`` [M, K/block], ``scale_b`` [K/block, N]: raw scale bytes (uint8);
    ``scale_format`` "ue4m3" (block 16) or "ue8m0" (block 32 or 16); K a multiple of 64.
    ``backend``: "auto" (the Triton kernel ``fp4ref.chain_triton`` for CUDA tensors, the
    torch emulator elsewhere), "triton" or "torch"; both give the same bits."""
    sf = check_choice("scale_format", scale_format, ("ue4m3", "ue8m0"))
    blocks = (16,) if sf == "ue4m3" else (32, 16)
    if block not in blocks:
        raise ValueError(f"block: unknown value {block!r} for scale_format {sf!r}; valid "
                         "choices: " + ", ".join(map(str, blocks)))
    if out_dtype not in OUT_DTYPES:
        raise ValueError(f"out_dtype: unknown value {out_dtype!r}; valid choices: "
                         + ", ".join(map(str, OUT_DTYPES)))
    _check_codes(a_codes, b_codes, scale_a, scale_b, block)
    if _triton_chain(backend, a_codes.device):
        from fp4ref.chain_triton import chain_mm
        return chain_mm(a_codes, b_codes.t(), scale_a, scale_b.t(), scale_format=sf, block=block,
                        alpha=_alpha(alpha), out_dtype=out_dtype)
    return _finish(_chain(a_codes, b_codes, scale_a, scale_b, sf, block, _alpha(alpha)), out_dtype)


def _triton_chain(backend: str, device) -> bool:
    """The dispatch: Triton only where it can run (CPU tensors never import Triton for "auto")."""
    if backend == "auto" and torch.device(device).type != "cuda":
        return False
    if backend == "torch":
        return False
    from fp4ref.chain_triton import use_triton
    return use_triton(backend, device)


def _check_codes(a, b, sa, sb, block: int) -> None:
    """Shapes [M, K] [K, N] [M, K/block] [K/block, N], uint8, e2m1 codes below 16."""
    for name, t in (("a_codes", a), ("b_codes", b), ("scale_a", sa), ("scale_b", sb)):
        if not isinstance(t, torch.Tensor) or t.dtype != torch.uint8 or t.dim() != 2:
            raise ValueError(f"{name}: expected a 2-D uint8 tensor, got "
                             f"{getattr(t, 'dtype', type(t).__name__)} "
                             f"{list(getattr(t, 'shape', []))}; valid choices: torch.uint8 [*, *]")
    M, K = a.shape
    N = b.shape[1]
    want = {"b_codes": (b, (K, N)), "scale_a": (sa, (M, K // block)),
            "scale_b": (sb, (K // block, N))}
    for name, (t, shape) in want.items():
        if tuple(t.shape) != shape:
            raise ValueError(f"{name}: shape {list(t.shape)} does not match {list(shape)}")
    if K % _K_INSTR:
        raise ValueError(f"K: {K} is not a multiple of {_K_INSTR} (one kind::mxf4nvf4 "
                         "instruction); valid choices: multiples of 64")
    if a.numel() and b.numel() and max(int(a.max()), int(b.max())) > 15:
        raise ValueError("a_codes, b_codes: e2m1 codes must lie in 0..15 (one code per "
                         "element, unpacked)")


def _chain(a_codes, b_codes, scale_a, scale_b, sf: str, block: int, al) -> torch.Tensor:
    """The chain and alpha by ``fp4ref.gemm.emulate`` on the decoded operands (float32 [M, N])."""
    from fp4ref.gemm import emulate
    return emulate(_mxf4nvf4_model(sf), _decode("float4_e2m1fn", a_codes), _decode("float4_e2m1fn", b_codes),
                   scales_a=_decode(sf, scale_a), scales_b=_decode(sf, scale_b), block=block,
                   alpha=None if al is None else [al])


# --- argument checking and the public call --------------------------------------

def _alpha(alpha) -> float | None:
    """The FP32 product of the alpha factors (each step RNE), as a Python float."""
    if alpha is None:
        return None
    items = list(alpha) if isinstance(alpha, (list, tuple)) else [alpha]
    al = None
    for i, f in enumerate(items):
        name = f"alpha[{i}]" if isinstance(alpha, (list, tuple)) else "alpha"
        if isinstance(f, torch.Tensor):
            if f.numel() != 1 or not f.dtype.is_floating_point:
                raise ValueError(f"{name}: a tensor alpha must hold one floating-point value "
                                 f"(the per-tensor scale); got shape {list(f.shape)}, {f.dtype}")
            f = f.item()
        if isinstance(f, bool) or not isinstance(f, (int, float, Fraction)):
            raise ValueError(f"{name}: expected a number or a one-element tensor, got "
                             f"{type(f).__name__}")
        v = exact(f)
        if not v.is_finite:
            raise ValueError(f"{name}: non-finite value {f}; valid choices: finite numbers")
        if al is not None:   # the exact product of the FP32 alpha so far and this factor
            neg = v.negative != (math.copysign(1, al) < 0)
            v = Exact(Kind.FINITE, neg, v.mag * Fraction(abs(al)))
        r = round_fp(v, "float32", Mode.RNE)
        al = math.copysign(float(r.mag), -1.0 if r.negative else 1.0)
    return al


def _operand(name: str, x) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in _PACKED:
        raise ValueError(f"{name}: dtype {x.dtype} is not supported; valid choices: "
                         "torch.float4_e2m1fn_x2, torch.uint8 (two e2m1 codes per byte)")
    if x.dim() != 2:
        raise ValueError(f"{name}: expected a 2-D tensor, got shape {list(x.shape)}")
    return x.view(torch.uint8)


def _scale_dtype(name: str, s, dtype) -> None:
    """The scale dtype picks the recipe (torch's rule); both scales share it."""
    if not isinstance(s, torch.Tensor):
        raise ValueError(f"{name}: expected a torch.Tensor, got {type(s).__name__}")
    valid = [dtype] if dtype is not None else list(_RECIPES)
    if s.dtype not in valid:
        raise ValueError(f"{name}: dtype {s.dtype} is not supported; valid choices: "
                         + ", ".join(map(str, valid))
                         + " (float8_e4m3fn: NVFP4 block 16, float8_e8m0fnu: MXFP4 block 32)")


def _scales(name, s, rows: int, cols: int, what: str) -> torch.Tensor:
    """The [rows, cols] raw scale bytes from the swizzled layout (numel checked)."""
    need = swizzled_numel(rows, cols)
    if s.numel() != need:
        raise ValueError(f"{name}: {s.numel()} elements do not fit cuBLAS's 128x4 swizzled "
                         f"layout of the [{what}] = [{rows}, {cols}] scales; valid choices: "
                         f"exactly {need} elements (128*ceil({rows}/128) * 4*ceil({cols}/4))")
    return unswizzle_128x4(s.reshape(-1).view(torch.uint8), rows, cols)


def _check(a, b, scale_a, scale_b, model, out_dtype):
    model = check_choice("model", model, MODELS)
    if out_dtype not in OUT_DTYPES:
        raise ValueError(f"out_dtype: unknown value {out_dtype!r}; valid choices: "
                         + ", ".join(map(str, OUT_DTYPES)))
    A, B = _operand("a", a), _operand("b", b)
    M, K, N = A.shape[0], 2 * A.shape[1], B.shape[1]
    if B.shape[0] != A.shape[1]:
        raise ValueError(f"b: shape {list(B.shape)} does not match [K/2, N] with K/2 = "
                         f"{A.shape[1]} from a {list(A.shape)} (b is torch's mat2: w.t())")
    kmul = _K_INSTR if model == "blackwell-mxf4nvf4" else 32
    if K % kmul:
        raise ValueError(f"a: K = 2 * a.shape[1] = {K} is not a multiple of {kmul}; valid "
                         f"choices: multiples of {kmul} for model {model!r}")
    _scale_dtype("scale_a", scale_a, None)
    _scale_dtype("scale_b", scale_b, scale_a.dtype)
    recipe = _RECIPES[scale_a.dtype]
    SA = _scales("scale_a", scale_a, M, K // recipe[2], "M, K/block")
    SB = _scales("scale_b", scale_b, N, K // recipe[2], "N, K/block")
    if len({str(t.device) for t in (a, b, scale_a, scale_b)}) > 1:
        raise ValueError(f"b, scale_a, scale_b: devices {b.device}, {scale_a.device}, "
                         f"{scale_b.device}; valid choices: a's device {a.device}")
    return model, recipe, A, B, SA, SB


def _finish(y: torch.Tensor, out_dtype) -> torch.Tensor:
    """out_dtype (RNE), NaN made canonical."""
    y = y.to(out_dtype)
    idt, nan = _NAN_BITS[out_dtype]
    canonical = torch.tensor(nan, dtype=idt, device=y.device).view(out_dtype)
    return torch.where(torch.isnan(y), canonical, y)


def scaled_mm(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor, *,
              model: str = "blackwell-mxf4nvf4", alpha=None,
              out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """D [M, N] = alpha * (A @ B) under ``model``, with torch._scaled_mm's NVFP4/MXFP4
    operands (module doc): ``a`` [M, K/2] and ``b`` [K/2, N] packed float4_e2m1fn_x2,
    swizzled ``scale_a`` / ``scale_b`` (float8_e4m3fn: NVFP4, float8_e8m0fnu: MXFP4)."""
    model, (recipe, sfmt, block, seed_sfmt), A, B, SA, SB = _check(a, b, scale_a, scale_b,
                                                                   model, out_dtype)
    al = _alpha(alpha)
    M, N = A.shape[0], B.shape[1]
    if M == 0 or N == 0:
        return torch.empty((M, N), dtype=out_dtype, device=a.device)
    if model == "blackwell-mxf4nvf4" and _triton_chain("auto", a.device):
        from fp4ref.chain_triton import chain_mm   # packed bytes straight to the kernel's prepass
        return chain_mm(A, B.t(), SA, SB, scale_format=sfmt, block=block, alpha=al,
                        out_dtype=out_dtype)
    from fp4ref.cast import unpack_fp4
    ac, bc = unpack_fp4(A), unpack_fp4(B.t()).t()             # [M, K], [K, N]
    if model == "blackwell-mxf4nvf4":
        return mxf4nvf4_chain(ac, bc, SA, SB.t(), scale_format=sfmt, block=block, alpha=al,
                              out_dtype=out_dtype)
    return _finish(_seed(ac, bc, SA, SB, recipe, seed_sfmt, block, al), out_dtype)


def _seed(ac, bc, SA, SB, recipe, sfmt, block, al) -> torch.Tensor:
    """probe_matched on the decoded operands: Triton on CUDA, the torch emulator elsewhere."""
    from fp4ref import gemm_triton as GT
    alpha = None if al is None else [al]
    if ac.is_cuda and GT.available():
        return GT.blockscaled_mm(ac, SA, bc.t().contiguous(), SB, fmt=recipe, scale_fmt=sfmt,
                                 block=block, model="probe_matched", alpha=alpha)
    from fp4ref.gemm import emulate
    va, sa = GT.decode_operand(ac, SA, recipe, scale_fmt=sfmt, block=block)
    vb, sb = GT.decode_operand(bc.t(), SB, recipe, scale_fmt=sfmt, block=block)
    return emulate("probe_matched", va, vb.t(), scales_a=sa, scales_b=sb.t(), block=block,
                   alpha=alpha)
