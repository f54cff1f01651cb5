"""The UE5M3 recipe, torch (bit-identical to ``reference.recipes.ue5m3``)."""
from __future__ import annotations

import torch

from reference.recipes.ue5m3 import OPERANDS, UE5M3_RULE, UE5M3Recipe, range_bound
from reference.rounding import Mode
from . import nvfp4 as _nv
from .blocked import BlockScaledTensor

__all__ = ["quantize", "quantize_operand", "UE5M3Recipe", "range_bound", "OPERANDS"]


def quantize(x: torch.Tensor, *, tile=(1, 16), amax=None, target=448, mode="rne", rbits=None,
             nbits=None, copy: str = "rowwise", backend: str = "auto") -> BlockScaledTensor:
    """One UE5M3 quantization (amax: the cached amax; default the tensor's own)."""
    return _nv.quantize(x, "ue5m3", tile=tile, amax=amax, target=target, mode=mode, rbits=rbits,
                        nbits=nbits, copy=copy, rule=UE5M3_RULE, backend=backend)


def quantize_operand(recipe: UE5M3Recipe, x: torch.Tensor, operand: str, *, layer=None,
                     amax=None, rbits=None, nbits=None, copy: str = "rowwise") -> BlockScaledTensor:
    """The recipe's wiring for one operand (tile, T override, SR only on dY)."""
    mode = recipe.mode_for(operand)
    if mode is Mode.RNE and rbits is not None:
        raise ValueError(f"rbits: operand {operand!r} is rounded RNE in this recipe; "
                         f"SR operands: {', '.join(recipe.sr_operands)}")
    return quantize(x, tile=recipe.tile_for(operand), amax=amax,
                    target=recipe.target_for(operand, layer), mode=mode, rbits=rbits,
                    nbits=nbits, copy=copy)
