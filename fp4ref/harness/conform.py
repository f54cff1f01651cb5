"""Conformance matrix: each installed third-party quantizer against the profile it
claims to implement, on the same inputs, bit for bit.

    fp4ref conform [--out PATH] [--cases N] [--cells GLOB ...] [--engine fast|exact]

Default output: reports/conformance/conformance.json (checked writable before the run).
Beside the cells, the matrix carries an "independent" column per profile: which independent
implementations checked it (the cells that agreed in this run, plus the test suite's oracles:
gfloat, ml_dtypes, torch, mpmath, the second implementation in tests/independent) and which
rules are checked only against the spec's literals.

A cell runs a deterministic set of inputs (seeded block-structured tensors:
ties, block-amax edges, zero / tiny / huge blocks, NaN / Inf / -0, plus random
normal and heavy-tailed tensors), then a hypothesis search over the same input
space.  Element codes are compared by bit pattern; block-scale codes too, except
that two NaN scale codes agree (NaN is compared by class: torch.minimum's NaN
sign depends on its vectorized path).  The first disagreement is shrunk
(hypothesis shrinking, then delta debugging over rows and elements) and printed
decoded: hex code, fields, value, expected vs got.  The profile side runs the
fast twin (``--engine fast``, proven bit-identical to the exact reference by
tests) or the exact reference; a counterexample is always re-run exactly.

An implementation that is not installed or cannot run here is reported as
"skipped" with the reason, never replaced by anything else.
"""
from __future__ import annotations

import argparse
import re
import math
import sys
import time
from dataclasses import dataclass
from typing import Callable

import torch

from reference.formats import get_format
from . import thirdparty as tp
from .io import write_json_atomic
from ..quant.inputs import GRID_KINDS

__all__ = ["CellSpec", "CellResult", "CELLS", "cell_names", "run_cell", "run_conformance",
           "write_matrix", "main", "SCHEMA", "SCHEMA_VERSION", "INDEPENDENT_TESTS",
           "independent_column", "DEFAULT_OUT"]
DEFAULT_OUT = "reports/conformance/conformance.json"

SCHEMA = "fp4ref.conformance"
SCHEMA_VERSION = 1


@dataclass
class Output:
    codes: torch.Tensor        # (rows, cols) element codes, uint8
    scales: torch.Tensor       # (ceil(rows/bm), ceil(cols/bk)) scale codes
    elem_fmt: str
    scale_fmt: str


@dataclass
class CellSpec:
    implementation: str
    profile: str
    run_impl: Callable          # x -> Output
    run_profile: Callable       # (x, engine) -> Output
    rows: tuple = (1, 2, 4)
    cols: tuple = (32, 64)
    block: int = 16
    dtypes: tuple = (torch.float32, torch.bfloat16)
    allow_special: bool = True
    kinds: tuple | None = None      # input block kinds (None: all, see quant.inputs)
    needs: Callable | None = None   # raises tp.Unavailable when absent
    note: str = ""


@dataclass
class CellResult:
    implementation: str
    profile: str
    status: str
    cases: int = 0
    agree: int = 0
    reason: str = ""
    counterexample: dict | None = None

    def as_json(self) -> dict:
        return {"implementation": self.implementation, "profile": self.profile,
                "status": self.status, "cases": self.cases, "agree": self.agree,
                "reason": self.reason, "counterexample": self.counterexample}


# ------------------------------------------------------------------ helpers
def _unpack(packed: torch.Tensor, cols: int) -> torch.Tensor:
    from ..quant.blocked import unpack_codes
    return unpack_codes(packed.contiguous().view(torch.uint8), cols)


def _from_q(q) -> Output:
    return Output(q.codes, q.scale_codes, q.elem_fmt, q.scale_fmt)


def _profile_runner(profile: str, **kw):
    def run(x, engine):
        if engine == "exact":
            from reference.recipes import quantize as rq
            from ..quant.blocked import BlockScaledTensor
            return _from_q(BlockScaledTensor.from_reference(rq(x, profile, **kw)))
        from ..quant import quantize as fq
        return _from_q(fq(x, profile, **kw))
    return run


def _mismatch(a: Output, b: Output):
    """First (kind, r, c) where impl a and profile b disagree, or None."""
    if tuple(a.codes.shape) != tuple(b.codes.shape):
        return ("shape", -1, -1)
    ne = (a.codes.to(torch.int64) != b.codes.to(torch.int64)).nonzero()
    if len(ne):
        return ("elem", int(ne[0, 0]), int(ne[0, 1]))
    if tuple(a.scales.shape) != tuple(b.scales.shape):
        return ("scale_shape", -1, -1)
    sa, sb = a.scales.to(torch.int64), b.scales.to(torch.int64)
    sf = get_format("float8_e4m3fn" if b.scale_fmt == "ue4m3" else b.scale_fmt)
    if sf.name == "float32":  # bit patterns; two NaNs agree (NaN compared by class)
        isn = lambda t: ((t >> 23) & 0xFF == 0xFF) & ((t & 0x7FFFFF) != 0)  # noqa: E731
        ne = ((sa != sb) & ~(isn(sa) & isn(sb))).nonzero()
    elif sf.nbits <= 8 and sf.has_nan:
        nan = torch.tensor([sf.classify(c).value == "nan" for c in range(sf.ncodes)]
                           + [False] * (256 - sf.ncodes))
        both_nan = nan[sa.clamp(0, 255)] & nan[sb.clamp(0, 255)]
        ne = ((sa != sb) & ~both_nan).nonzero()
    else:
        ne = (sa != sb).nonzero()
    if len(ne):
        return ("scale", int(ne[0, 0]), int(ne[0, 1]))
    return None


def _decode(code: int, fmt: str) -> dict:
    spec = get_format("float8_e4m3fn" if fmt == "ue4m3" else fmt)  # stored as e4m3fn bytes
    try:
        s, e, m = spec.fields(code)
        v = spec.decode(code)
        val = float(v)
        return {"hex": f"0x{code:0{max(1, (spec.nbits + 3) // 4)}X}",
                "fields": {"sign": s, "exp": e, "man": m}, "value": repr(val)}
    except ValueError:
        return {"hex": f"0x{code:X}", "fields": None, "value": "invalid code"}


def _f32hex(v: float) -> str:
    import struct
    return "0x%08X" % struct.unpack("<I", struct.pack("<f", v))[0]


def _counterexample(x: torch.Tensor, a: Output, b: Output, where, spec: CellSpec,
                    exact: Output | None) -> dict:
    kind, r, c = where
    xs = x.to(torch.float32)
    ce = {"shape": list(x.shape), "dtype": str(x.dtype).replace("torch.", ""),
          "input_f32_hex": [[_f32hex(v) for v in row] for row in xs.tolist()],
          "input": [[repr(v) for v in row] for row in xs.tolist()],
          "kind": kind, "row": r, "col": c}
    if kind == "elem":
        ce["input_value"] = {"hex": _f32hex(xs[r, c].item()), "value": repr(xs[r, c].item())}
        ce["expected"] = _decode(int(b.codes[r, c]), b.elem_fmt)
        ce["got"] = _decode(int(a.codes[r, c]), a.elem_fmt)
    elif kind == "scale":
        ce["expected"] = _decode(int(b.scales[r, c]), b.scale_fmt)
        ce["got"] = _decode(int(a.scales[r, c]), a.scale_fmt)
    if exact is not None:
        ce["exact_reference_agrees_with_fast"] = (_mismatch(exact, b) is None)
    ce["text"] = _text(ce, spec)
    return ce


def _text(ce, spec) -> str:
    lines = [f"{spec.implementation} vs profile {spec.profile}: {ce['kind']} mismatch at "
             f"(row {ce['row']}, col {ce['col']}) of a {ce['shape'][0]}x{ce['shape'][1]} "
             f"{ce['dtype']} input"]
    if "input_value" in ce:
        lines.append(f"  input  {ce['input_value']['hex']} = {ce['input_value']['value']}")
    for k in ("expected", "got"):
        if k in ce:
            d = ce[k]
            f = d["fields"]
            fs = "" if f is None else f" (s={f['sign']} e={f['exp']} m={f['man']})"
            lines.append(f"  {k:<8} {d['hex']}{fs} = {d['value']}")
    r = max(ce["row"], 0)
    row = ce["input_f32_hex"][r] if ce["input_f32_hex"] else []
    lines.append(f"  input row {r} (float32 bits): " + " ".join(row[:64])
                 + (" ..." if len(row) > 64 else ""))
    return "\n".join(lines)


def _shrink(x: torch.Tensor, fails: Callable[[torch.Tensor], bool], budget: int = 400) -> torch.Tensor:
    """Delta debugging: fewer rows, then zero elements, then simpler values."""
    calls = 0

    def still(t):
        nonlocal calls
        calls += 1
        try:
            return fails(t)
        except Exception:  # noqa: BLE001 - an input the impl rejects is not a counterexample
            return False
    # single rows
    if x.shape[0] > 1:
        for r in range(x.shape[0]):
            t = x[r:r + 1].clone()
            if calls < budget and still(t):
                x = t
                break
    # keep only the leading columns up to the first failing one (whole blocks)
    for keep in (16, 32, 64):
        if keep < x.shape[1] and calls < budget:
            t = x[:, :keep].clone()
            if still(t):
                x = t
                break
    changed = True
    while changed and calls < budget:
        changed = False
        flat = x.reshape(-1)
        for i in range(flat.numel()):
            if calls >= budget:
                break
            v = flat[i].item()
            for cand in (0.0, 1.0 if v > 0 else -1.0):
                if v == cand or (isinstance(v, float) and math.isnan(v) and False):
                    continue
                t = x.clone().reshape(-1)
                t[i] = cand
                t = t.reshape(x.shape)
                if still(t):
                    x, changed = t, True
                    break
    return x


# ------------------------------------------------------------------ cells
def _te_runner(tile, copy, rht=False, fo6=None):
    def run(x):
        m = tp.te_reference_nvfp4()
        kw = {}
        if fo6:
            kw = dict(nvfp4_use_4over6=True, nvfp4_e4m3_max=256, nvfp4_4over6_err_mode=fo6)
        q = m.NVFP4QuantizerRef(dtype=m.reference_utils.Fp4Formats.E2M1, quant_tile_shape=tile,
                                with_rht=rht, **kw)
        r = q.quantize(x)
        data, scale = (r.data, r.scale) if copy == "rowwise" else (r.data_t, r.scale_t)
        cols = x.shape[1] if copy == "rowwise" else x.shape[0]
        codes = _unpack(data, cols)
        sc = scale.view(torch.uint8)
        if tile == (16, 16):
            sc = sc[::16]
        rows = codes.shape[0]
        return Output(codes, sc[: -(-rows // tile[0])].contiguous(), "float4_e2m1fn", "ue4m3")
    return run


def _torchao_nvfp4_runner(two_level: bool, api: str):
    def run(x):
        nv = tp.torchao_nvfp4()
        pts = nv.per_tensor_amax_to_scale(torch.max(torch.abs(x))) if two_level else None
        if api == "nvfp4_quantize":
            s, d = nv.nvfp4_quantize(x, 16, pts)
        else:
            t = nv.NVFP4Tensor.to_nvfp4(x, 16, per_tensor_scale=pts,
                                       is_swizzled_scales=(api == "to_nvfp4_swizzled"))
            d, s = t.qdata, t.scale
            if api == "to_nvfp4_swizzled":
                from ..quant.blocked import from_swizzled
                s = from_swizzled(s.reshape(-1).view(torch.uint8), x.shape[0], x.shape[1] // 16)
        return Output(_unpack(d, x.shape[1]), s.view(torch.uint8).reshape(x.shape[0], -1),
                      "float4_e2m1fn", "float8_e4m3fn")
    return run


def _torchao_nvfp4_profile(two_level: bool):
    name = "torchao_nvfp4" if two_level else "torchao_nvfp4_1level"

    def run(x, engine):
        kw = {}
        if two_level:
            nv = tp.torchao_nvfp4()
            kw["tensor_scale"] = nv.per_tensor_amax_to_scale(torch.max(torch.abs(x)))
        return _profile_runner(name, **kw)(x, engine)
    return run


_MX_DT = {}


def _mx_dtype(fmt):
    if not _MX_DT:
        from torchao.prototype.mx_formats.constants import DTYPE_FP6_E2M3, DTYPE_FP6_E3M2
        _MX_DT.update({"float4_e2m1fn": torch.float4_e2m1fn_x2, "float6_e2m3fn": DTYPE_FP6_E2M3,
                       "float6_e3m2fn": DTYPE_FP6_E3M2, "float8_e4m3fn": torch.float8_e4m3fn,
                       "float8_e5m2": torch.float8_e5m2})
    return _MX_DT[fmt]


def _torchao_mx_runner(mode: str, fmt: str):
    def run(x):
        mx = tp.torchao_mx()
        from torchao.prototype.mx_formats.config import ScaleCalculationMode as S
        s, d = mx.to_mx(x, _mx_dtype(fmt), 32, getattr(S, mode.upper()))
        d = d.view(torch.uint8)
        codes = _unpack(d, x.shape[1]) if fmt == "float4_e2m1fn" else d
        return Output(codes, s.view(torch.uint8), fmt, "float8_e8m0fnu")
    return run


def _pt_mx_runner(fmt: str):
    def run(x):
        cq = tp.torch_test_quantized()
        s, d = cq.to_mxfp(x, 32, "mxfp4" if fmt == "float4_e2m1fn" else "mxfp8")
        d = d.view(torch.uint8)
        codes = _unpack(d, x.shape[1]) if fmt == "float4_e2m1fn" else d
        return Output(codes, s.view(torch.uint8), fmt, "float8_e8m0fnu")
    return run


def _bits32(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.float32).contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF


def _te_cs_runner(fmt: str, pow2: bool):
    def run(x):
        m = tp.te_reference_current_scaling()
        dt = {"float8_e4m3fn": torch.float8_e4m3fn, "float8_e5m2": torch.float8_e5m2}[fmt]
        a = x.to(torch.float32).abs().reshape(-1)
        s = m._scale_from_amax_tensor(torch.float32, a, dt, eps=0.0, pow_2_scales=pow2)[0]
        return Output(torch.zeros(x.shape, dtype=torch.uint8), _bits32(s).reshape(x.shape),
                      "float4_e2m1fn", "float32")
    return run


def _te_cs_profile(fmt: str, pow2: bool):
    def run(x, engine):
        a = x.to(torch.float32).abs()
        if engine == "exact":
            from reference.recipes import f32 as F
            from reference.recipes.scaling import te_current_scale
            from reference.recipes.common import scalar_exact
            vals = [[F.bits(te_current_scale(scalar_exact(v.reshape(1)), fmt, pow2=pow2,
                                             variant="ref")) for v in row] for row in a]
            bits = torch.tensor(vals, dtype=torch.int64)
        else:
            from ..quant.scaling import te_current_scale
            bits = _bits32(te_current_scale(a, fmt, pow2=pow2, variant="ref"))
        return Output(torch.zeros(x.shape, dtype=torch.uint8), bits, "float4_e2m1fn", "float32")
    return run


def _absent(reason: str):
    def needs():
        raise tp.Unavailable(reason)
    return needs


def _build_cells() -> list[CellSpec]:
    """Every cell, in the matrix's order."""
    tev = tp.te_version() or "?"
    aov = tp.torchao_version() or "?"
    return (_te_nvfp4_cells(tev) + _torchao_cells(aov) + _torch_cells() + _te_current_cells(tev)
            + _unwired_cells(tev))


def _te_nvfp4_cells(tev: str) -> list[CellSpec]:
    """Transformer Engine's NVFP4QuantizerRef: tiles, copies, RHT, 4over6."""
    cells = []
    for tile in ((1, 16), (16, 16)):
        for copy in ("rowwise", "columnwise"):
            t = f"{tile[0]}x{tile[1]}"
            cells.append(CellSpec(f"transformer_engine {tev} NVFP4QuantizerRef [{t}, {copy}]",
                                  "te_nvfp4_ref", _te_runner(tile, copy),
                                  _profile_runner("te_nvfp4_ref", tile=tile, copy=copy),
                                  rows=(16, 32), cols=(32, 64), needs=tp.te_reference_nvfp4))
    cells.append(CellSpec(f"transformer_engine {tev} NVFP4QuantizerRef [1x16, columnwise, RHT]",
                          "te_nvfp4_ref_rht", _te_runner((1, 16), "columnwise", rht=True),
                          _profile_runner("te_nvfp4_ref_rht", tile=(1, 16), copy="columnwise"),
                          rows=(16, 32), cols=(32,), dtypes=(torch.bfloat16,),
                          allow_special=False, kinds=GRID_KINDS, needs=tp.te_reference_nvfp4,
                          note="bf16 fixed-point inputs (multiples of 2**-8, |x| <= 64): TE's "
                               "reference RHT is a CPU bf16 matmul whose FP32 summation order "
                               "depends on the GEMM shape; on these inputs every order is exact"))
    for mode, prof in (("MAE", "te_nvfp4_4over6"), ("MSE", "te_nvfp4_4over6_mse")):
        for tile in ((1, 16), (16, 16)):
            t = f"{tile[0]}x{tile[1]}"
            cells.append(CellSpec(
                f"transformer_engine {tev} NVFP4QuantizerRef [4over6 {mode}, e4m3 max 256, {t}]",
                prof, _te_runner(tile, "rowwise", fo6=mode),
                _profile_runner(prof, tile=tile, copy="rowwise"), rows=(16,), cols=(32, 64),
                needs=tp.te_reference_nvfp4))
    return cells


def _torchao_cells(aov: str) -> list[CellSpec]:
    """torchao: NVFP4 (three APIs, one and two levels) and to_mx (every mode and format)."""
    cells = []
    for two in (True, False):
        prof = "torchao_nvfp4" if two else "torchao_nvfp4_1level"
        lvl = "two-level" if two else "one-level"
        for api in ("nvfp4_quantize", "to_nvfp4", "to_nvfp4_swizzled"):
            cells.append(CellSpec(f"torchao {aov} {'NVFP4Tensor.' if api != 'nvfp4_quantize' else ''}"
                                  f"{api.replace('_swizzled', '')} [{lvl}"
                                  f"{', swizzled scales' if 'swizzled' in api else ''}]", prof,
                                  _torchao_nvfp4_runner(two, api), _torchao_nvfp4_profile(two),
                                  needs=tp.torchao_nvfp4))
    from reference.recipes.mx import MX_ELEM_FORMATS
    for mode in ("floor", "ceil", "even", "rceil"):
        for fmt in MX_ELEM_FORMATS:
            cells.append(CellSpec(f"torchao {aov} to_mx [{mode.upper()}, {fmt}]",
                                  f"torchao_mx_{mode}", _torchao_mx_runner(mode, fmt),
                                  _profile_runner(f"torchao_mx_{mode}", elem_fmt=fmt),
                                  block=32, cols=(32, 64), needs=tp.torchao_mx))
    return cells


def _torch_cells() -> list[CellSpec]:
    """PyTorch's own test reference (testing common_quantized.to_mxfp)."""
    cells = []
    for fmt in ("float4_e2m1fn", "float8_e4m3fn"):
        cells.append(CellSpec(f"torch {torch.__version__.split('+')[0]} testing common_quantized."
                              f"to_mxfp [{'mxfp4' if fmt == 'float4_e2m1fn' else 'mxfp8'}]",
                              "pytorch_test_mx", _pt_mx_runner(fmt),
                              _profile_runner("pytorch_test_mx", elem_fmt=fmt), block=32,
                              cols=(32, 64), needs=tp.torch_test_quantized))
    return cells


def _te_current_cells(tev: str) -> list[CellSpec]:
    """Transformer Engine's FP8 current-scaling reference: the scale of each amax."""
    cells = []
    for fmt in ("float8_e4m3fn", "float8_e5m2"):
        for pow2 in (False, True):
            cells.append(CellSpec(
                f"transformer_engine {tev} reference_current_scaling._scale_from_amax_tensor "
                f"[{fmt}{', pow_2_scales' if pow2 else ''}] (each element's |x| is an amax)",
                "te_fp8_current_ref", _te_cs_runner(fmt, pow2), _te_cs_profile(fmt, pow2),
                block=1, rows=(1, 4), cols=(16,), dtypes=(torch.float32,),
                needs=tp.te_reference_current_scaling))
    return cells


def _unwired_cells(tev: str) -> list[CellSpec]:
    """Implementations we know of but cannot run here: reported, never faked."""
    cells = []
    cells.append(CellSpec("transformer_engine NVFP4 CUDA kernel (tex.quantize)", "te_nvfp4",
                          None, None, needs=_te_kernel_needs))
    cells.append(CellSpec("torchao NVFP4 Triton kernel (use_triton_kernel=True)", "torchao_nvfp4",
                          None, None, needs=_absent("needs a CUDA GPU with sm_100 (Blackwell) "
                                                    "and the MSLK kernels; none here")))
    cells.append(CellSpec("microsoft/microxcaling quantize_mx", "microxcaling", None, None,
                          needs=_microxcaling_needs))
    cells.append(CellSpec(f"transformer_engine {tev} NVFP4QuantizerRef [MXFP4 pow_2_scales]",
                          "ocp_mx_rceil", None, None, needs=_te_mxfp4_needs))
    return cells


def _te_kernel_needs():
    try:
        import importlib
        importlib.import_module("transformer_engine_torch")
        if isinstance(sys.modules.get("transformer_engine_torch"), tp._TexStandIn):
            raise ImportError("stand-in only")
    except Exception:  # noqa: BLE001
        raise tp.Unavailable("the compiled extension transformer_engine_torch (CUDA) is not "
                             "installed; TE's NVFP4 kernel also needs a Blackwell GPU") from None
    if not torch.cuda.is_available():
        raise tp.Unavailable("needs a CUDA GPU (Blackwell for NVFP4)")
    raise tp.Unavailable("TE kernel cell not wired on this machine")


def _te_mxfp4_needs():
    m = tp.te_reference_nvfp4()
    try:
        q = m.NVFP4QuantizerRef(dtype=m.reference_utils.Fp4Formats.E2M1,
                                quant_tile_shape=(1, 32), pow_2_scales=True)
        q.quantize(torch.ones(1, 32))
    except Exception as e:  # noqa: BLE001 - the upstream failure is the reason
        raise tp.Unavailable(f"its MXFP4 path (pow_2_scales=True) fails upstream: "
                             f"{type(e).__name__}: {e}") from None
    raise tp.Unavailable("TE's MXFP4 reference path runs here but is not wired to a profile")


def _microxcaling_needs():
    import importlib.util
    if importlib.util.find_spec("mx") is None:
        raise tp.Unavailable("microxcaling (package 'mx') is not installed")
    raise tp.Unavailable("microxcaling cell not wired (its emulation returns floats, not codes)")


CELLS: list[CellSpec] = []


def _cells() -> list[CellSpec]:
    if not CELLS:
        CELLS.extend(_build_cells())
    return CELLS


def cell_names() -> list[str]:
    return [c.implementation for c in _cells()]


# ------------------------------------------------------------------ running
def run_cell(spec: CellSpec, cases: int = 60, seed: int = 0, engine: str = "fast",
             hypothesis_examples: int | None = None) -> CellResult:
    res = CellResult(spec.implementation, spec.profile, "agree")
    if spec.needs is not None:
        try:
            spec.needs()
        except tp.Unavailable as e:
            res.status, res.reason = "skipped", str(e)
            return res
    if spec.run_impl is None:
        res.status, res.reason = "skipped", "no runner"
        return res

    def check(x):
        a = spec.run_impl(x)
        b = spec.run_profile(x, engine)
        return a, b, _mismatch(a, b)

    first = None
    k = 0
    from ..quant.inputs import BLOCK_KINDS, crafted_tensors, random_tensor
    inputs = []
    for i in range(cases):
        R = spec.rows[i % len(spec.rows)]
        C = spec.cols[(i // len(spec.rows)) % len(spec.cols)]
        dt = spec.dtypes[i % len(spec.dtypes)]
        inputs.append(random_tensor(R, C, spec.block, dt, seed * 100003 + i,
                                    kinds=spec.kinds or BLOCK_KINDS,
                                    allow_special=spec.allow_special))
    if spec.kinds is None:
        for dt in spec.dtypes:
            inputs += crafted_tensors(spec.rows[-1], spec.cols[-1], dt, seed)
    for x in inputs:
        k += 1
        a, b, mm = check(x)
        res.cases += 1
        if mm is None:
            res.agree += 1
        elif first is None:
            first = x
    if spec.note:
        res.reason = spec.note
    n_hyp = cases if hypothesis_examples is None else hypothesis_examples
    if first is None and n_hyp > 0:
        first = _hypothesis_search(spec, check, n_hyp, res)
    if first is not None:
        res.status = "disagree"
        x = _shrink(first, lambda t: check(t)[2] is not None)
        a, b, mm = check(x)
        ex = None
        try:
            ex = spec.run_profile(x, "exact")
        except Exception:  # noqa: BLE001
            ex = None
        res.counterexample = _counterexample(x, a, b, mm, spec, ex)
        res.reason = ("first disagreement shrunk; see counterexample"
                      + (f" ({spec.note})" if spec.note else ""))
    return res


def _hypothesis_search(spec, check, n, res):
    try:
        from hypothesis import HealthCheck, Phase, given, settings
    except ImportError:
        return None
    from ..quant.inputs import BLOCK_KINDS, block_tensors
    failing = []

    @settings(max_examples=n, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck),
              phases=[Phase.generate, Phase.shrink])
    @given(block_tensors(list(spec.rows), list(spec.cols), spec.block, spec.dtypes,
                         kinds=spec.kinds or BLOCK_KINDS, allow_special=spec.allow_special))
    def prop(x):
        a, b, mm = check(x)
        res.cases += 1
        if mm is None:
            res.agree += 1
            return
        failing.append(x)
        raise AssertionError("disagree")

    try:
        prop()
    except AssertionError:
        pass
    return failing[-1] if failing else None


def _match(name: str, pat: str) -> bool:
    """Glob with * and ? only (brackets in cell names are literal)."""
    rx = re.escape(pat).replace(r"\*", ".*").replace(r"\?", ".")
    return re.fullmatch(rx, name) is not None


def run_conformance(cells: list[str] | None = None, cases: int = 60, seed: int = 0,
                    engine: str = "fast", progress=None) -> list[CellResult]:
    from reference.errors import check_choice
    check_choice("engine", engine, ("fast", "exact"))
    if isinstance(cases, bool) or not isinstance(cases, int) or cases < 0:
        raise ValueError(f"cases: {cases!r} is not an integer >= 0")
    out = []
    for spec in _cells():
        if cells and not any(_match(spec.implementation, pat) or _match(spec.profile, pat)
                             for pat in cells):
            continue
        t0 = time.time()
        r = run_cell(spec, cases, seed, engine)
        if progress:
            progress(r, time.time() - t0)
        out.append(r)
    return out


# --- independent checks per profile (the test suite's oracles; docs/oracles.md) -------------
_CASTS = "gfloat, ml_dtypes, torch: element and scale casts (tests/test_oracle_gfloat.py, test_oracles.py)"
_SECOND = "second implementation from SPEC.md (tests/independent)"
_NV_LIT = "two-level scale order of TE's CUDA kernel (S_enc, fl(v * fl(S/6))): SPEC literals only"
_MX_LIT = "OCP MX shared-scale rule (floor/ceil/even/rceil) without a torchao cell: SPEC literals only"
# profile -> (independent checks in the test suite, rules checked only against SPEC literals)
INDEPENDENT_TESTS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "te_nvfp4": ((_CASTS, _SECOND + " (two-level rule)"), (_NV_LIT,)),
    "te_nvfp4_2509": ((_CASTS,), ("TE 2.5-2.9 divide-first scale order: SPEC literals only",)),
    "te_nvfp4_ref": ((_CASTS, "transformer_engine NVFP4QuantizerRef"), ()),
    "te_nvfp4_ref_rht": ((_CASTS, "transformer_engine NVFP4QuantizerRef (RHT)"), ()),
    "te_nvfp4_rht": ((_CASTS,), ("RHT of the kernel profile: SPEC literals only",)),
    "te_nvfp4_4over6": ((_CASTS, "transformer_engine NVFP4QuantizerRef (4over6 MAE)"), ()),
    "te_nvfp4_4over6_mse": ((_CASTS, "transformer_engine NVFP4QuantizerRef (4over6 MSE)"), ()),
    "torchao_nvfp4": ((_CASTS, "torchao nvfp4_quantize / NVFP4Tensor"), ()),
    "torchao_nvfp4_1level": ((_CASTS, "torchao NVFP4Tensor (one level)"), ()),
    "pytorch_test_nvfp4": ((_CASTS,), ("torch testing NVFP4 helper: SPEC literals only",)),
    "ue5m3": ((_CASTS, _SECOND + " (UE5M3 op order)"), ()),
    "quartet_fwd": ((_CASTS, _SECOND + " (QuEST forward, ties)"), ()),
    "quartet_bwd": ((_CASTS,), ("Quartet backward SR and signs: SPEC literals only",)),
    "fusion_cta_nvfp4": ((_CASTS, _SECOND + " (fusion scale domains)"), ()),
    "fusion_row_sr_mxfp4": ((_CASTS, _SECOND + " (fusion scale domains)"), ()),
    "fusion_h32_mxfp4": ((_CASTS, _SECOND + " (fusion scale domains)"), ()),
    "ocp_mx_floor": ((_CASTS,), (_MX_LIT,)),
    "ocp_mx_ceil": ((_CASTS,), (_MX_LIT,)),
    "ocp_mx_even": ((_CASTS,), (_MX_LIT,)),
    "ocp_mx_rceil": ((_CASTS,), (_MX_LIT,)),
    "torchao_mx_floor": ((_CASTS, "torchao to_mx (FLOOR)"), ()),
    "torchao_mx_ceil": ((_CASTS, "torchao to_mx (CEIL)"), ()),
    "torchao_mx_even": ((_CASTS, "torchao to_mx (EVEN)"), ()),
    "torchao_mx_rceil": ((_CASTS, "torchao to_mx (RCEIL)"), ()),
    "pytorch_test_mx": ((_CASTS, "torch testing common_quantized.to_mxfp"), ()),
    "microxcaling": ((_CASTS,), ("microxcaling RNA rule: SPEC literals only (not installable here)",)),
    "te_fp8_current": ((_CASTS,), ("TE FP8 current scaling of the kernel: SPEC literals only",)),
    "te_fp8_current_ref": ((_CASTS, "transformer_engine reference_current_scaling"), ()),
    "te_fp8_delayed": ((_CASTS,), ("delayed scaling (amax history): SPEC literals only",)),
}


def independent_column(results: list[CellResult]) -> list[dict]:
    """Per profile: the implementations that agreed with it in this run, the test suite's
    independent checks, and the rules checked only against SPEC literals."""
    from reference.recipes import RECIPE_PROFILES
    ran = {}
    for r in results:
        if r.status == "agree":
            ran.setdefault(r.profile, []).append(r.implementation)
    out = []
    for prof in RECIPE_PROFILES:
        tests, lits = INDEPENDENT_TESTS.get(prof, ((), ("not listed: SPEC literals only",)))
        out.append({"profile": prof, "agreed_in_this_run": ran.get(prof, []),
                    "test_suite": list(tests), "spec_literals_only": list(lits)})
    return out


def write_matrix(results: list[CellResult], path: str) -> None:
    """Atomic JSON write (temp file in the target directory, then os.replace)."""
    obj = {"schema": SCHEMA, "schema_version": SCHEMA_VERSION,
           "cells": [r.as_json() for r in results], "independent": independent_column(results)}
    write_json_atomic(path, obj)


def _check_cells(pats: list[str]) -> str | None:
    """Each --cells pattern must match some cell (implementation or profile name)."""
    names = [(s.implementation, s.profile) for s in _cells()]
    for pat in pats:
        if not any(_match(i, pat) or _match(p, pat) for i, p in names):
            valid = sorted({p for _, p in names}) + [i for i, _ in names]
            return (f"--cells: {pat!r} matches no cell; valid choices (globs on these names): "
                    + "; ".join(valid))
    return None


def _check_out(path: str) -> str | None:
    """--out must be writable before cells run for minutes: its directory is created (as the
    atomic writer would) and a probe file written and removed there."""
    import os
    import tempfile
    d = os.path.dirname(os.path.abspath(path)) or "."
    if os.path.isdir(path):
        return f"--out: {path!r} is a directory; valid: a file path such as {DEFAULT_OUT}"
    try:
        os.makedirs(d, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=d, prefix=".conform-probe-"):
            pass
    except OSError as e:
        return f"--out: {path!r} is not writable ({e.strerror or e}); valid: a writable file path"
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="fp4ref conform",
                                 description="conformance matrix of installed public quantizers")
    ap.add_argument("--out", default=DEFAULT_OUT,
                    help=f"JSON matrix path (atomic write; default {DEFAULT_OUT})")
    ap.add_argument("--cases", type=int, default=60,
                    help="seeded inputs per cell, and as many hypothesis examples (default 60)")
    ap.add_argument("--cells", action="append", default=[],
                    help="glob on implementation or profile (* and ?; repeat, or separate "
                         "with ';')")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--engine", default="fast", choices=("fast", "exact"),
                    help="profile side: fast twin (default) or exact reference")
    ap.add_argument("--list", action="store_true", help="list cells and exit")
    args = ap.parse_args(argv)
    if args.list:
        for s in _cells():
            print(f"{s.profile:<22} {s.implementation}")
        return 0
    if args.cases < 0:
        print(f"conform: --cases {args.cases} must be >= 0", file=sys.stderr)
        return 2
    pats = [p.strip() for c in args.cells for p in c.split(";") if p.strip()]
    err = _check_cells(pats) or _check_out(args.out)
    if err:
        print(f"conform: {err}", file=sys.stderr)
        return 2

    def progress(r, dt):
        print(f"{r.status:<9} {r.agree:>5}/{r.cases:<5} {r.profile:<22} {r.implementation}"
              f"  [{dt:.1f}s]" + (f"  ({r.reason})" if r.status == "skipped" else ""))
        if r.counterexample:
            print("  " + r.counterexample["text"].replace("\n", "\n  "))
    res = run_conformance(pats or None, args.cases, args.seed, args.engine, progress)
    write_matrix(res, args.out)
    n = {s: sum(r.status == s for r in res) for s in ("agree", "disagree", "skipped")}
    print(f"conform: {n['agree']} agree, {n['disagree']} disagree, {n['skipped']} skipped "
          f"-> {args.out}")
    return 1 if n["disagree"] else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
