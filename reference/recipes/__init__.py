"""Quantization recipes, exact (SPEC section 3), and the one profile registry.

``RECIPE_PROFILES[name]`` is a frozen ``RecipeProfile`` (registry.py): which rule a
quantizer implements, its family, the exact rule record, where it comes from, the
conformance cell (third-party implementation) it is checked against, and its exact
entry point.  ``quantize(x, profile, **kw)`` runs any profile exactly.  The rule
fields' choices are the enums of rules.py.
"""
from __future__ import annotations

from ..errors import check_choice
from .registry import RECIPE_PROFILES, RecipeProfile
from .rules import Family

__all__ = ["RecipeProfile", "RECIPE_PROFILES", "get_profile", "profile_names", "quantize",
           "Family"]


def profile_names(family: str | None = None) -> tuple[str, ...]:
    return tuple(k for k, p in RECIPE_PROFILES.items() if family is None or p.family == family)


def get_profile(name) -> RecipeProfile:
    if isinstance(name, RecipeProfile):
        return name
    return RECIPE_PROFILES[check_choice("profile", name, RECIPE_PROFILES)]


def _check_nonempty(x) -> None:
    shape = tuple(getattr(x, "shape", ()))
    if shape and 0 in shape:
        raise ValueError(f"x: empty tensor of shape {shape}; nothing to quantize "
                         "(valid: at least one row and one column)")
    if not shape and hasattr(x, "__len__") and (len(x) == 0 or len(x[0]) == 0):
        raise ValueError("x: empty input; nothing to quantize")


def quantize(x, profile, **kw):
    """Run any profile exactly (see each family's ``quantize`` for keyword arguments)."""
    p = get_profile(profile)
    if p.exact is None:
        raise ValueError(f"profile: {p.name!r} is a tensor-scale rule, not a quantizer; use "
                         "reference.recipes.scaling (te_current_scale, TEDelayedScaling)")
    _check_nonempty(x)
    return p.exact(x, **kw)
