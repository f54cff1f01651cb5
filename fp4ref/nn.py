"""A drop-in ``Linear`` whose three GEMMs run through a quantization recipe and a GEMM model.

    lin = fp4ref.nn.Linear(256, 1024, quantizer=UE5M3Quantizer(), model="probe_matched")

Y = X W^T (fprop), dX = dY W (dgrad) and dW = dY^T X (wgrad) each quantize their two
operands along the contraction dimension and run ``fp4ref.gemm_triton.blockscaled_mm``
(CUDA, supported formats and models) or the exact torch emulator ``fp4ref.gemm.emulate``;
both are bit-identical to ``reference.gemm``.

Quantizer protocol (``Quantizer``): ``quantize(x, role) -> QOperand`` where role is one of
"x", "w", "dy" (rowwise: contraction along x's last dim) or "x_t", "w_t", "dy_t" (the
columnwise copy of the same tensor: contraction along x's first dim, quantized from the
high-precision tensor, never re-quantized).  ``QOperand`` carries the decoded elements,
the decoded block scales (one per row and block of the contraction dim) and the per-tensor
factor, plus the codes for the Triton path.

Recipes (adapters to ``fp4ref.quant``):
* ``TENVFP4Quantizer``: Transformer Engine NVFP4: current scaling, 1 x 16 blocks, 16 x 16
  weight tiles, RNE; SR on dY (both backward GEMMs); RHT16 on the wgrad operands (the
  columnwise copies of X and dY).
* ``UE5M3Quantizer``: the UE5M3 recipe: UE5M3 scales, target T, sample-and-hold amax
  caches with D = 50 (one per operand role: x, w, dy), 16 x 16 weight tiles, SR only on dY,
  no RHT.

State: a Linear's ``state_dict`` holds weight and bias only.  The quantizer's amax caches
(and its SR generator position) are deliberately not saved (as in the UE5M3 paper): a
reloaded layer re-samples its caches at its first step.  ``quantizer.state_dict()`` saves
the configuration only.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from reference.errors import check_choice

__all__ = ["QOperand", "Quantizer", "TENVFP4Quantizer", "UE5M3Quantizer", "Linear", "qgemm",
           "ROLES"]

ROLES = ("x", "w", "dy", "x_t", "w_t", "dy_t")


@dataclass
class QOperand:
    values: torch.Tensor            # decoded elements [R, K] float32
    scales: torch.Tensor            # decoded block scales [R, K // block] float32
    alpha: float                    # per-tensor factor (decode scale), 1.0 if none
    block: int
    codes: torch.Tensor | None = None        # e2m1 codes [R, K] uint8 (Triton path)
    scale_codes: torch.Tensor | None = None  # [R, K // block] uint8
    fmt: str | None = None                   # fp4ref.gemm_triton format name
    scale_fmt: str | None = None


@runtime_checkable
class Quantizer(Protocol):
    block: int

    def quantize(self, x: torch.Tensor, role: str) -> QOperand: ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, sd: dict) -> None: ...


def _from_bst(q, fmt: str) -> QOperand:
    """fp4ref.quant BlockScaledTensor -> QOperand (2D tiles expanded to per-row scales)."""
    from fp4ref.gemm_triton import code_values
    bm, bk = q.block
    sc = q.scale_codes.to(torch.uint8)
    if bm > 1:
        sc = sc.repeat_interleave(bm, 0)[: q.codes.shape[0]]
    codes = q.codes.to(torch.uint8)
    dev = codes.device
    vals = code_values("float4_e2m1fn", dev)[codes.long()]
    scales = code_values(q.scale_fmt, dev)[sc.long()]
    alpha = 1.0 if q.tensor_scale is None else float(q.tensor_scale.reshape(-1)[0])
    return QOperand(vals, scales, alpha, bk, codes.contiguous(), sc.contiguous(), fmt, q.scale_fmt)


def _check_role(role):
    return check_choice("role", role, ROLES)


def _check_2d(x, role):
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        raise ValueError(f"x: expected a 2-D tensor for role {role!r}, got "
                         f"{getattr(x, 'shape', type(x).__name__)}")
    if x.shape[0] % 16 or x.shape[1] % 16:
        raise ValueError(f"x: shape {tuple(x.shape)} for role {role!r} is not a multiple of 16 in "
                         "both dims; valid choices: multiples of 16 (FP4 blocks and 16x16 tiles)")


class _SRBits:
    """Random bits for stochastic rounding from a private, seeded generator."""

    def __init__(self, seed: int, nbits: int = 16):
        self.seed, self.nbits = seed, nbits
        self.gen: dict = {}

    def __call__(self, shape, device):
        key = str(device)
        if key not in self.gen:
            self.gen[key] = torch.Generator(device=device).manual_seed(self.seed)
        return torch.randint(0, 1 << self.nbits, shape, generator=self.gen[key], device=device,
                             dtype=torch.int64)


class TENVFP4Quantizer:
    """Transformer Engine NVFP4 recipe (SPEC 3.1) on fp4ref.quant.nvfp4."""
    block = 16

    def __init__(self, profile: str = "te_nvfp4", seed: int = 0, sr_nbits: int = 16):
        self.profile = profile
        self.sr = _SRBits(seed, sr_nbits)

    def quantize(self, x: torch.Tensor, role: str) -> QOperand:
        from fp4ref.quant import nvfp4
        _check_role(role)
        _check_2d(x, role)
        op = role.split("_")[0]
        col = role.endswith("_t")
        tile = (16, 16) if op == "w" else (1, 16)
        # RHT only on the wgrad operands: columnwise copies of activations and gradients
        prof = self.profile + "_rht" if (col and op in ("x", "dy")) else self.profile
        kw = {}
        if op == "dy":
            shape = (x.shape[1], x.shape[0]) if col else tuple(x.shape)
            kw = dict(mode="sr", rbits=self.sr(shape, x.device), nbits=self.sr.nbits)
        q = nvfp4.quantize(x.float(), prof, tile=tile, copy="columnwise" if col else "rowwise", **kw)
        return _from_bst(q, "nvfp4")

    def state_dict(self) -> dict:
        return {"recipe": "te_nvfp4", "profile": self.profile, "seed": self.sr.seed,
                "sr_nbits": self.sr.nbits}

    def load_state_dict(self, sd: dict) -> None:
        self.profile = sd["profile"]
        self.sr = _SRBits(sd["seed"], sd["sr_nbits"])


class UE5M3Quantizer:
    """UE5M3 recipe (SPEC 3.3) on fp4ref.quant.ue5m3 with sample-and-hold amax caches."""

    def __init__(self, delay: int = 50, target=448, overrides=(), block: int = 16, seed: int = 0,
                 layer=None, sr_nbits: int = 16):
        from fractions import Fraction
        from fp4ref.quant.scaling import SampleAndHold
        from reference.recipes.ue5m3 import UE5M3Recipe
        self.recipe = UE5M3Recipe(block=block, target=Fraction(target), overrides=tuple(overrides))
        self.block = block
        self.layer = layer
        self.hold = SampleAndHold(delay)
        self.sr = _SRBits(seed, sr_nbits)

    def quantize(self, x: torch.Tensor, role: str) -> QOperand:
        from fp4ref.quant import ue5m3
        _check_role(role)
        _check_2d(x, role)
        op = role.split("_")[0]
        col = role.endswith("_t")
        amax = x.detach().abs().amax().float()
        if col and self.hold.cached(op) is not None:
            held = self.hold.cached(op)     # the second copy of this step's tensor
        else:
            held = self.hold.observe(op, amax)
        kw = {}
        if op == "dy":
            shape = (x.shape[1], x.shape[0]) if col else tuple(x.shape)
            kw = dict(rbits=self.sr(shape, x.device), nbits=self.sr.nbits)
        q = ue5m3.quantize_operand(self.recipe, x.float(), op, layer=self.layer,
                                   amax=torch.tensor(float(held), dtype=torch.float32, device=x.device),
                                   copy="columnwise" if col else "rowwise", **kw)
        return _from_bst(q, "ue5m3")

    def cached_amax(self, op: str):
        return self.hold.cached(op)

    def state_dict(self) -> dict:
        # configuration only: the amax caches are deliberately not serialized
        return {"recipe": "ue5m3", "hold": self.hold.state_dict(), "block": self.block,
                "target": str(self.recipe.target), "seed": self.sr.seed}

    def load_state_dict(self, sd: dict) -> None:
        self.hold.load_state_dict(sd["hold"])
        self.sr = _SRBits(sd["seed"], self.sr.nbits)


def qgemm(model, qa: QOperand, qb: QOperand, backend: str = "auto") -> torch.Tensor:
    """C = A B^T from two quantized operands (both [rows, K]); float32 [Ra, Rb]."""
    check_choice("backend", backend, ("auto", "triton", "emulate"))
    if isinstance(model, str) and model == "blackwell-mxf4nvf4":
        return _mxf4nvf4(qa, qb)
    if qa.block != qb.block:
        raise ValueError(f"qb.block: {qb.block} differs from qa.block {qa.block}")
    from fp4ref import gemm_triton as GT
    name = model if isinstance(model, str) else None
    tri = (backend != "emulate" and qa.codes is not None and qb.codes is not None
           and qa.values.is_cuda and GT.available() and qa.fmt == qb.fmt and qa.fmt in GT.OPERAND_FORMATS
           and name in GT.MODELS)
    if backend == "triton" and not tri:
        raise ValueError("backend: 'triton' needs CUDA, triton, codes of one format and a model in "
                         + ", ".join(GT.MODELS))
    if tri:
        return GT.blockscaled_mm(qa.codes, qa.scale_codes, qb.codes, qb.scale_codes, fmt=qa.fmt,
                                 scale_fmt=qa.scale_fmt, block=qa.block, model=name,
                                 alpha=[qa.alpha, qb.alpha])
    from fp4ref.gemm import emulate
    return emulate(model, qa.values, qb.values.t(), scales_a=qa.scales, scales_b=qb.scales.t(),
                   block=qa.block, alpha=[qa.alpha, qb.alpha])


def _mxf4nvf4(qa: QOperand, qb: QOperand) -> torch.Tensor:
    """gemm_model="blackwell-mxf4nvf4": fp4ref.scaled_mm's chain of kind::mxf4nvf4
    instructions on the quantized codes, the operands' per-tensor factors as alpha."""
    from fp4ref.scaled_gemm import mxf4nvf4_chain
    sf = {"ue4m3": "ue4m3", "float8_e8m0fnu": "ue8m0"}.get(qa.scale_fmt)
    if sf is None or qb.scale_fmt != qa.scale_fmt or qa.codes is None or qb.codes is None:
        raise ValueError(f"gemm_model: 'blackwell-mxf4nvf4' needs e2m1 codes with ue4m3 or "
                         f"float8_e8m0fnu block scales (kind::mxf4nvf4); the quantizer gives "
                         f"{qa.scale_fmt!r}, {qb.scale_fmt!r}")
    return mxf4nvf4_chain(qa.codes, qb.codes.t(), qa.scale_codes, qb.scale_codes.t(),
                          scale_format=sf, block=qa.block, alpha=[qa.alpha, qb.alpha])


class _QLinearFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, b, mod):
        q = mod.quantizer
        y = qgemm(mod.model, q.quantize(x, "x"), q.quantize(w, "w"), mod.backend)
        if b is not None:
            y = y + b.float()
        ctx.mod = mod
        ctx.has_b = b is not None
        ctx.save_for_backward(x, w)
        return y.to(x.dtype)

    @staticmethod
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        mod = ctx.mod
        q = mod.quantizer
        dy = dy.contiguous()
        dx = dw = db = None
        qdy = q.quantize(dy, "dy")
        if ctx.needs_input_grad[0]:   # dX = dY W: A = dY [T, out], B = W^T [in, out]
            dx = qgemm(mod.model, qdy, q.quantize(w, "w_t"), mod.backend).to(x.dtype)
        if ctx.needs_input_grad[1]:   # dW = dY^T X: A = dY^T [out, T], B = X^T [in, T]
            dw = qgemm(mod.model, q.quantize(dy, "dy_t"), q.quantize(x, "x_t"), mod.backend).to(w.dtype)
        if ctx.has_b and ctx.needs_input_grad[2]:
            db = dy.float().sum(0).to(dy.dtype)
        return dx, dw, db, None


class Linear(torch.nn.Linear):
    """torch.nn.Linear with quantized GEMMs (``quantizer=None``: plain high-precision).

    Inputs are flattened to [tokens, in_features]; tokens, in and out features must be
    multiples of 16.  ``model``: a GemmModel or preset name; ``backend``: auto / triton /
    emulate.  ``gemm_model`` (replaces ``model``): an ``fp4ref.scaled_mm`` model name,
    "blackwell-mxf4nvf4" (the chain of kind::mxf4nvf4 instructions; contraction dims
    multiples of 64) or "seed-probe-matched" (= model="probe_matched")."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *,
                 quantizer: Quantizer | None = None, model="probe_matched", backend: str = "auto",
                 device=None, dtype=None, gemm_model: str | None = None):
        super().__init__(in_features, out_features, bias, device=device, dtype=dtype)
        if quantizer is not None and not isinstance(quantizer, Quantizer):
            raise ValueError(f"quantizer: {type(quantizer).__name__} does not implement the "
                             "Quantizer protocol (quantize(x, role), state_dict, load_state_dict)")
        self.quantizer = quantizer
        from fp4ref.gemm import _check_model
        self.model = model if isinstance(model, str) else _check_model(model)
        if isinstance(model, str):
            _check_model(model)
        self.backend = check_choice("backend", backend, ("auto", "triton", "emulate"))
        if gemm_model is not None:
            from fp4ref.scaled_gemm import MODELS
            check_choice("gemm_model", gemm_model, MODELS)
            self.model = "probe_matched" if gemm_model == "seed-probe-matched" else gemm_model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.quantizer is None:
            return super().forward(x)
        shp = x.shape
        y = _QLinearFn.apply(x.reshape(-1, shp[-1]), self.weight, self.bias, self)
        return y.reshape(*shp[:-1], self.out_features)

    def extra_repr(self) -> str:
        q = type(self.quantizer).__name__ if self.quantizer is not None else None
        m = self.model if isinstance(self.model, str) else self.model.name
        return super().extra_repr() + f", quantizer={q}, model={m}"
