"""What ``blockscaled_mm`` accepts: operand formats, GEMM models, tile routes, RZ adds."""
from __future__ import annotations

import enum
import os
from dataclasses import dataclass
from typing import NamedTuple

from reference.errors import check_choice
from reference.gemm import PRESETS, GemmModel

__all__ = ["OperandFormat", "OPERAND_FORMATS", "MODELS", "Route", "RzAdd", "Call", "parse_call",
           "fmt_args", "check_model", "interpret", "torch_decode"]


class OperandFormat(NamedTuple):
    """One block-scaled operand format the kernels take (e2m1 elements)."""
    scale_fmt: str                  # default scale format
    scale_fmts: tuple[str, ...]     # accepted scale formats
    block: int                      # default block size
    blocks: tuple[int, ...]         # accepted block sizes


OPERAND_FORMATS: dict[str, OperandFormat] = {
    "nvfp4": OperandFormat("ue4m3", ("ue4m3", "float8_e4m3fn"), 16, (16, 32)),
    "mxfp4": OperandFormat("float8_e8m0fnu", ("float8_e8m0fnu",), 32, (32,)),
    "ue5m3": OperandFormat("ue5m3", ("ue5m3",), 16, (16, 32)),
}
# the models the kernels compute (others: fp4ref.gemm.emulate)
MODELS = ("probe_matched", "probe_matched_lattice", "decoded_fp32")


class Route(enum.IntEnum):
    """Where an output tile is computed (values are the routing tables' entries)."""
    PAIR = 0    # pair / MX kernel: two blocks per tensor-core dot, certified exact
    BLOCK = 1   # block kernel: one dot per block, exact offset sums
    FIX = 2     # the exact torch emulator (fix-up)
    WIDE = 3    # wide kernel: exact block dots summed in float64 (TwoSum), any finite scales


class RzAdd(enum.IntEnum):
    """The cross-group add rounded toward zero (the kernels' RZ constexpr)."""
    ASM = 0         # PTX add.rz.f32 (GPU default)
    TWOSUM = 1      # exact TwoSum emulation (interpreter default)
    LIBDEVICE = 2   # __nv_fadd_rz


RZ_CHOICES = {"asm": RzAdd.ASM, "twosum": RzAdd.TWOSUM, "libdevice": RzAdd.LIBDEVICE}
FORCE_CHOICES = ("pair", "block", "wide", "fix")


def interpret() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def torch_decode() -> bool:
    """FP4REF_GEMM_TORCH_DECODE=1: decode operands with torch ops instead of the kernel."""
    return os.environ.get("FP4REF_GEMM_TORCH_DECODE", "0") == "1"


def fmt_args(fmt: str, scale_fmt: str | None, block: int | None) -> tuple[str, int]:
    """(scale format, block) of ``fmt``, defaults filled in, both checked."""
    fmt = check_choice("fmt", fmt, OPERAND_FORMATS)
    of = OPERAND_FORMATS[fmt]
    sfmt = of.scale_fmt if scale_fmt is None else scale_fmt
    check_choice("scale_fmt", sfmt, of.scale_fmts)
    block = of.block if block is None else block
    if block not in of.blocks:
        raise ValueError(f"block: {block!r} is not supported for {fmt}; valid choices: "
                         + ", ".join(map(str, of.blocks)))
    return sfmt, block


def check_model(model) -> GemmModel:
    """The preset of a model name, or of a GemmModel equal to one up to its name."""
    if isinstance(model, str):
        check_choice("model", model, MODELS)
        return PRESETS[model]
    if isinstance(model, GemmModel):
        for n in MODELS:
            if PRESETS[n].replace(name=model.name) == model:
                return PRESETS[n]
    raise ValueError(f"model: {model!r} is not supported by the Triton path; valid choices: "
                     + ", ".join(MODELS) + " (use fp4ref.gemm.emulate for other models)")


@dataclass(frozen=True)
class Call:
    """One call's checked choices."""
    fmt: str
    sfmt: str
    block: int
    model: GemmModel
    rz: str                 # "auto" or a key of RZ_CHOICES
    force: str | None       # None or one of FORCE_CHOICES

    @property
    def decoded(self) -> bool:
        return self.model is PRESETS["decoded_fp32"]

    def rz_add(self, interp: bool) -> int:
        """The kernels' RZ constexpr: TwoSum in the interpreter, add.rz.f32 on the GPU."""
        if self.rz == "auto":
            return int(RzAdd.TWOSUM if interp else RzAdd.ASM)
        return int(RZ_CHOICES[self.rz])


def parse_call(fmt, model, scale_fmt, block, rz, force) -> Call:
    if isinstance(fmt, (tuple, list)):
        if len(fmt) != 2 or fmt[0] != fmt[1]:
            raise ValueError(f"fmt: mixed operand formats {tuple(fmt)!r} are not supported; valid "
                             f"choices: one of {', '.join(OPERAND_FORMATS)} for both operands")
        fmt = fmt[0]
    sfmt, block = fmt_args(fmt, scale_fmt, block)
    model = check_model(model)
    check_choice("rz", rz, ("auto", "asm", "libdevice", "twosum"))
    if force is None:  # site-wide override, e.g. FP4REF_GEMM_FORCE=block if a GPU's
        force = os.environ.get("FP4REF_GEMM_FORCE") or None  # pair dots prove inexact
    if force is not None:
        check_choice("force", force, FORCE_CHOICES)
    return Call(fmt, sfmt, block, model, rz, force)
