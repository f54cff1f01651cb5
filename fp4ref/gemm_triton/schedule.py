"""The model's schedule (``GemmModel.plan``, ``reference.schedule``) as the kernels execute it.

The kernels' loops are fixed in their source: the tile kernels walk K in groups of
``KERNEL_GROUP`` products (``range(0, K, 64)``), each group one exact sum rounded RNE to FP32,
added across groups rounded toward zero; the decoded_fp32 kernel adds one product per FP32
step.  ``kernel_plan`` reads the plan and raises where it is not one of these walks, so a
change to a model's schedule cannot leave the Triton path computing an older one; the
routing takes its group boundaries (blocks per group) from the plan."""
from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

from reference.gemm import GemmModel
from reference.rounding import Mode
from reference.schedule import ScaleAt, Schedule

__all__ = ["KERNEL_GROUP", "KernelPlan", "kernel_plan"]

KERNEL_GROUP = 64   # products per group of the tile kernels' K loop


class KernelPlan(NamedTuple):
    """What the Triton path takes from ``model.plan(K, block)``."""
    step: int           # products per fused step: KERNEL_GROUP, or 1 (decoded_fp32)
    group_blocks: int   # block-scale blocks per group (the routing's group of bounds)


def _walk(plan: Schedule) -> tuple[list, list]:
    """(groups [lo, hi), steps [lo, hi)) of a single-slice plan."""
    return ([(g.lo, g.hi) for g in plan.groups], [(s.lo, s.hi) for s in plan.steps])


def _grouped(plan: Schedule, width: int) -> bool:
    """Groups [g, g + width) from 0, each one fused step (the tile kernels' K loop)."""
    groups, steps = _walk(plan)
    want = [(g, min(g + width, plan.K)) for g in range(0, plan.K, width)]
    return groups == (want or [(0, 0)]) and steps == want and plan.outer_mode is Mode.RTZ


def _sequential(plan: Schedule) -> bool:
    """One group of unit steps in k order (the decoded_fp32 kernel's FMA loop)."""
    groups, steps = _walk(plan)
    return groups == [(0, plan.K)] and steps == [(k, k + 1) for k in range(plan.K)]


@lru_cache(maxsize=256)
def kernel_plan(model: GemmModel, K: int, block: int, decoded: bool) -> KernelPlan:
    """The kernels' walk of ``model.plan(K, block)`` (``decoded``: the decoded_fp32 kernel,
    else the tile kernels); ValueError if they cannot run it."""
    plan = model.plan(K, block)
    common = (plan.scales is ScaleAt.PRODUCT and not plan.chain and len(plan.slices) == 1
              and plan.exact_group is None and plan.exp_factors is None)
    if common and decoded and _sequential(plan):
        return KernelPlan(1, 0)
    if common and not decoded and _grouped(plan, KERNEL_GROUP) and KERNEL_GROUP % block == 0:
        return KernelPlan(KERNEL_GROUP, KERNEL_GROUP // block)
    raise ValueError(f"model: {model.name!r} has a schedule the Triton kernels do not run "
                     f"(K={K}, block={block}: groups {_walk(plan)[0][:3]}...); valid choices: "
                     f"single-slice plans with product scales and groups of {KERNEL_GROUP} "
                     "(one step each, RTZ across) or unit FP32 steps; use fp4ref.gemm.emulate")
