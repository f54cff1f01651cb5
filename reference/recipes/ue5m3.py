"""The UE5M3 recipe (SPEC 3.3): E2M1 payload, UE5M3 block scales, target T.

Our reading (SPEC: the paper names T but does not print the formula): the
per-tensor encode scale is S_enc = fl(fl(T * 6) / amax_cached), so a block
whose amax equals the cached amax gets block scale T; the remaining FP32 steps
follow Transformer Engine's current NVFP4 order (``te_mul``), the block scale
rounds RNE into UE5M3 saturating at 61440, and a block scale that rounds to
zero is replaced by 1.0 (zero-scale correction).
"""
from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from ..errors import check_choice
from ..formats import get_format
from ..rounding import Mode
from .common import check_target
from .nvfp4 import TwoLevelRule, quantize as _quantize
from .rules import BlockScale, ElemCast, ElemNan, EncodeRule, TensorScale, ZeroAmax

__all__ = ["UE5M3_RULE", "UE5M3Recipe", "RangeBound", "range_bound", "check_target",
           "OPERANDS"]

UE5M3_RULE = TwoLevelRule(scale_fmt="ue5m3", target=Fraction(448), tensor_scale=TensorScale.TE,
                          zero_amax=ZeroAmax.ONE, block_scale=BlockScale.TE_MUL,
                          zero_scale_to_one=True, encode=EncodeRule.TE, elem_cast=ElemCast.RNE,
                          elem_nan=ElemNan.MAX, tiles=((1, 16), (1, 32), (16, 16)))

# operand roles of one linear: activation x, weight w, upstream gradient dy
OPERANDS = ("x", "w", "dy")


@dataclass(frozen=True)
class RangeBound:
    """What a target T leaves of UE5M3's range, as exact ratios to the cached amax.

    headroom       61440 / T: how far a block amax may grow past the cached amax before
                   its scale saturates (about 137x at T = 448, 30x at T = 2048)
    min_ratio      2**-17 / T: the smallest block/cached-amax ratio whose ideal scale is a
                   representable (subnormal) UE5M3 value
    flush_ratio    2**-18 / T: ratios at or below it round the scale to 0 (RNE tie to
                   even), which zero-scale correction replaces by 1.0
    dynamic_range  headroom / min_ratio = 61440 / 2**-17, independent of T
    """
    target: Fraction
    headroom: Fraction
    min_ratio: Fraction
    flush_ratio: Fraction
    dynamic_range: Fraction

    def as_floats(self) -> dict:
        return {k: float(getattr(self, k)) for k in
                ("target", "headroom", "min_ratio", "flush_ratio", "dynamic_range")}


def range_bound(T=448) -> RangeBound:
    t = check_target(T)
    spec = get_format("ue5m3")
    mx, mn = spec.max_finite, spec.min_subnormal
    return RangeBound(t, mx / t, mn / t, mn / 2 / t, mx / mn)


@dataclass(frozen=True)
class UE5M3Recipe:
    """The recipe's wiring: B = 16 (32 as a control), target T with per-operand
    overrides, 2D (16 x 16) weight scales, SR only on the dY payload.

    overrides  ((layer, operand), T) pairs; layer None matches every layer.  The paper:
               T = 2048 for the weight-gradient dY of four final MLP down projections.
    """
    block: int = 16
    target: Fraction = Fraction(448)
    overrides: tuple = ()
    weight_2d: bool = True
    sr_operands: tuple = ("dy",)

    def __post_init__(self):
        if self.block not in (16, 32):
            raise ValueError(f"block: unknown value {self.block!r}; valid choices: 16, 32")
        check_target(self.target)
        for key, t in self.overrides:
            layer, op = key
            check_choice("operand", op, OPERANDS)
            check_target(t)
        for op in self.sr_operands:
            check_choice("sr_operands", op, OPERANDS)

    def target_for(self, operand: str, layer=None) -> Fraction:
        check_choice("operand", operand, OPERANDS)
        t = check_target(self.target)
        for (lay, op), tv in self.overrides:
            if op == operand and lay is None:
                t = check_target(tv)
        for (lay, op), tv in self.overrides:
            if op == operand and lay is not None and lay == layer:
                t = check_target(tv)
        return t

    def tile_for(self, operand: str) -> tuple[int, int]:
        check_choice("operand", operand, OPERANDS)
        if operand == "w" and self.weight_2d:
            return (16, 16)
        return (1, self.block)

    def mode_for(self, operand: str) -> Mode:
        return Mode.SR if operand in self.sr_operands else Mode.RNE

    def quantize(self, x, operand: str, *, layer=None, amax=None, rbits=None, nbits=None,
                 copy: str = "rowwise"):
        """Quantize one operand (amax: the cached amax from the scaling lifecycle)."""
        mode = self.mode_for(operand)
        if mode is Mode.RNE and rbits is not None:
            raise ValueError(f"rbits: operand {operand!r} is rounded RNE in this recipe; "
                             f"SR operands: {', '.join(self.sr_operands)}")
        return _quantize(x, UE5M3_RULE, profile="ue5m3", tile=self.tile_for(operand),
                         amax=amax, target=self.target_for(operand, layer), mode=mode,
                         rbits=rbits, nbits=nbits, copy=copy)

