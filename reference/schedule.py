"""The schedule of one GEMM accumulation model, as data (SPEC section 4; issue 12).

A ``reference.gemm.GemmModel`` says how a dot product of length K is cut up and where each
rounding applies; ``GemmModel.plan(K, block)`` turns that into one ``Schedule``: the split-K
slices, in each slice its groups (promotion intervals, or MMA instructions when chained), in
each group its fused steps, in each step its exact runs, and the points where block scales,
cross-group rounding and the split-K add apply, plus which factors' exponents align a fused
step.  ``Schedule.run(arith)`` walks it; every backend -- the exact reference
``reference.gemm.dot`` (Fractions), the torch emulator ``fp4ref.gemm.emulate`` and the numpy
simulator ``probes.sim`` (int64) -- runs that one walk and supplies only its arithmetic
(``Arithmetic``: fused steps, scale, round, add-and-round).  A new schedule rule is one
change here.  (``probes.sim`` also walks many plans at once when their steps have one width:
the same order, group and slice ends read from each row's plan.)

Every validity check of a schedule is made here, once (``build``): K a multiple of block,
K a multiple of split_k (equal slices), and scale_point GROUP's group_size == block with
slices of whole blocks.

How ``Schedule.run`` walks a plan (c: a chain model's initial accumulator, default none)::

    parts = []
    for sl in plan.slices:                     # split-K slices, in reduction order
        outer = c if sl.lo == 0 else None
        for g in sl.groups:
            acc = outer if plan.chain and outer is not None else +0
            for st in g.steps:                 # one fused step: acc + products [st.lo, st.hi)
                terms = products, or with st.runs the exact sum of each run [lo, hi)
                acc = fused_step(acc, terms)   # aligned per plan.exp_factors, plan.acc_exp_floor
            if g.scale_block is not None:      # scale_point GROUP: the group's block scales
                acc = round(acc * sa[g.scale_block] * sb[g.scale_block], FP32, RNE)
            if outer is None or plan.chain:    # first group, or a chained instruction's result
                outer = round(acc, FP32, plan.outer_mode)
            else:                              # cross-group rounding
                outer = round(outer + acc, FP32, plan.outer_mode)
        parts.append(outer)                    # the slice's FP32 result
    total = combine(parts)                     # split-K: plan.split_reduce, each add FP32 RNE
    then lattice, alpha (model.alpha_mode), output rounding (the model's epilogue)

``combine`` (``SplitReduce``; every add FP32 RNE, ``Arithmetic.add_slices``) walks
``reduce_levels``: SERIAL adds the n slice results in order, left to right; TREE halves
(cuBLAS's fp32 gemv: an xor-shuffle butterfly over the lane partials, lane 0's result);
PAIRWISE adds the first floor(n/2) and the rest, each half combined likewise (cuBLAS's tf32
segment-K partials)::

    for level in reduce_levels(plan.split_reduce, n):   # TREE: h = ceil(n/2), n -> h
        for dst, src in level: v[dst] = round(v[dst] + v[src], FP32, RNE)
    total = v[0]

With ``plan.scales`` PRODUCT each product is multiplied exactly by its block's two scales
(after ``product_format`` rounding) before any of this.
"""
from __future__ import annotations

import enum
import numbers
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, NamedTuple, Protocol

from .rounding import Mode

if TYPE_CHECKING:  # pragma: no cover
    from .gemm import GemmModel

__all__ = ["ScalePoint", "AlignRef", "SplitReduce", "SplitOrder", "ScaleAt", "Operand", "ExpFactor", "Step",
           "Group", "Slice", "Schedule", "Arithmetic", "plan", "build", "split_bounds", "acc_exp_floor", "reduce_levels"]


class ScalePoint(enum.Enum):
    PRODUCT = "product"  # block scales multiply each product (exact)
    GROUP = "group"      # block scales multiply the rounded group partial


class AlignRef(enum.Enum):
    VALUE = "value"                # floor(log2|t|) of every term
    EXPONENT_SUM = "exponent_sum"  # products: sum of the factors' exponents (unnormalized)
    SCALE_EXPONENT_SUM = "scale_exponent_sum"  # MMA-Sim: format exponents (subnormal/zero at
                                               # emin), exact groups by their scales' exponents


class SplitReduce(enum.Enum):
    """How the split-K slice results are combined (each add FP32 RNE; ``reduce_levels``)."""
    SERIAL = "serial"      # in order, left to right
    TREE = "tree"          # halving tree: v[i] += v[i + ceil(n/2)] for i < n - ceil(n/2), n -> ceil(n/2)
    PAIRWISE = "pairwise"  # recursive halves: (first floor(n/2)) + (the rest), each half likewise


@dataclass(frozen=True)
class SplitOrder:
    """A measured combine order: a chain of groups.  Each group's slice results are added in
    its order, then the group sums in the chain's order (every add FP32 RNE).  Read at a
    shape by crafted operands (``probes.explain.crafted_combine_probe``), e.g. cuBLAS fp32's
    sm80_xmma 32x128x8 in-place split-K at 26x1402x11025 on the H200:
    ``0+24+47,1+25,2+26,...,22+46,23``.  SERIAL is the one-slice-per-group chain."""
    groups: tuple

    def __post_init__(self):
        g = tuple(tuple(int(i) for i in grp) for grp in self.groups)
        flat = sorted(i for grp in g for i in grp)
        if not g or any(not grp for grp in g) or flat != list(range(len(flat))):
            raise ValueError(f"SplitOrder.groups: {self.groups!r} must list every slice 0..n-1 "
                             "exactly once, in non-empty groups")
        object.__setattr__(self, "groups", g)

    @property
    def n(self) -> int:
        return sum(len(g) for g in self.groups)

    @property
    def value(self) -> str:
        """The short form's part: ``order=0+24+47,1+25,...``."""
        return "order=" + ",".join("+".join(str(i) for i in g) for g in self.groups)

    @classmethod
    def parse(cls, text: str) -> "SplitOrder":
        body = text[len("order="):] if text.startswith("order=") else text
        try:
            return cls(tuple(tuple(int(x) for x in g.split("+")) for g in body.split(",")))
        except ValueError as e:
            raise ValueError(f"split order: {text!r} is not 'order=' followed by groups of slice "
                             f"numbers joined by '+', groups separated by ','; {e}") from None

    def levels(self) -> tuple:
        """``reduce_levels`` of this order.  Each add is hosted where slice 0 is (adds commute
        bit for bit), else at its left operand's host, so the result lands in v[0]."""
        host = lambda grp: 0 if 0 in grp else grp[0]  # noqa: E731
        out: dict = {}
        for grp in self.groups:             # a group: serial, its sum at host(grp)
            for j in range(1, len(grp)):
                dst = host(grp[:j])
                out.setdefault(j, []).append((dst, grp[j]) if grp[j] != 0 else (0, dst))
        depth = max((len(g) for g in self.groups), default=1)
        seen = self.groups[0]
        for k, grp in enumerate(self.groups[1:]):  # the chain: one add per level, after the groups
            a, b = host(seen), host(grp)
            out.setdefault(depth + k, []).append((a, b) if b != 0 else (b, a))
            seen = seen + grp
        return tuple(tuple(out[d]) for d in sorted(out))


def reduce_levels(mode, n: int) -> tuple:
    """The adds combining n slice results, as levels of independent (dst, src) pairs: v[dst]
    = v[dst] + v[src], level by level; the result is v[0].  SERIAL: (0, 1), (0, 2), ...;
    TREE: cuBLAS gemv's warp butterfly; PAIRWISE: cuBLAS segment-K's partials (H200 dumps:
    3 segments (0, (1, 2)), 15 as 7 + 8); a ``SplitOrder``: its groups, then its chain."""
    if isinstance(mode, SplitOrder):
        if mode.n != n:
            raise ValueError(f"split order: {mode.value} names {mode.n} slices, the plan has {n}")
        return mode.levels()
    if mode is SplitReduce.SERIAL:
        return tuple(((0, j),) for j in range(1, n))
    if mode is SplitReduce.TREE:
        out = []
        while n > 1:
            h = (n + 1) // 2
            out.append(tuple((i, i + h) for i in range(n - h)))
            n = h
        return tuple(out)
    levels: dict = {}

    def walk(lo: int, k: int) -> int:  # the subtree's depth; its value lands in v[lo]
        if k == 1:
            return 0
        h = k // 2
        d = 1 + max(walk(lo, h), walk(lo + h, k - h))
        levels.setdefault(d, []).append((lo, lo + h))
        return d
    walk(0, n)
    return tuple(tuple(levels[d]) for d in sorted(levels))


class ScaleAt(enum.Enum):
    """Where a plan applies block scales."""
    NONE = "none"        # no block scales
    PRODUCT = "product"  # each product times its block's scales, exactly
    GROUP = "group"      # each rounded group partial times its block's scales, FP32 RNE


class Operand(enum.Enum):
    """A factor of a block-scaled product a_k * b_k * sa[k // block] * sb[k // block]."""
    A = "a"
    B = "b"
    SCALE_A = "scale_a"
    SCALE_B = "scale_b"


class ExpFactor(NamedTuple):
    """One factor of a product's alignment exponent (the exponents of a product's factors
    are summed; a run's exponent is the largest of its products')."""
    operand: Operand
    format: str | None  # None: floor(log2|x|), a zero or non-finite factor has no say;
                        # a name: that format's exponent (subnormals and zeros at its emin)


class Step(NamedTuple):
    """One fused step: the accumulator plus products [lo, hi), normalized once."""
    lo: int
    hi: int
    runs: tuple[tuple[int, int], ...] | None  # exact_group: runs [lo, hi) summed exactly first


class Group(NamedTuple):
    """Products [lo, hi) accumulated from zero (or, chained, from the outer accumulator)."""
    lo: int
    hi: int
    steps: tuple[Step, ...]
    scale_block: int | None  # scale_point GROUP: the block whose scales multiply the partial


class Slice(NamedTuple):
    """One split-K slice: products [lo, hi) reduced to one FP32 value."""
    lo: int
    hi: int
    groups: tuple[Group, ...]


@dataclass(frozen=True)
class Schedule:
    """A model's schedule for one K (and block size): see the module docstring."""
    K: int
    block: int | None                       # block-scale size (None: no block scales)
    scales: ScaleAt
    slices: tuple[Slice, ...]
    chain: bool                             # a group starts from the outer accumulator (C)
    outer_mode: Mode                        # cross-group (or chained result) rounding to FP32
    exact_group: int | None                 # the run length of Step.runs
    exp_factors: tuple[ExpFactor, ...] | None  # None: every term aligns by its own value
    acc_exp_floor: int | None               # see ``acc_exp_floor`` (None also when exact)
    uniform: bool                           # every step has ``step_width`` products
    layout: tuple                           # the inputs of ``slices`` (equal: equal slices)
                                            # and, last, ``split_reduce``
    split_reduce: SplitReduce = SplitReduce.SERIAL  # how the slice results are combined

    @property
    def groups(self) -> tuple[Group, ...]:
        return tuple(g for sl in self.slices for g in sl.groups)

    @property
    def steps(self) -> tuple[Step, ...]:
        return tuple(st for g in self.groups for st in g.steps)

    @property
    def bounds(self) -> tuple[tuple[int, int], ...]:
        """The slices' [lo, hi)."""
        return tuple((sl.lo, sl.hi) for sl in self.slices)

    @property
    def group_ends(self) -> frozenset[int]:
        return frozenset(g.hi for g in self.groups)

    @property
    def slice_ends(self) -> frozenset[int]:
        return frozenset(sl.hi for sl in self.slices)

    @property
    def step_width(self) -> int:
        """The first step's width (the widest; 1 for K = 0)."""
        st = self.slices[0].groups[0].steps
        return st[0].hi - st[0].lo if st else 1

    def run(self, arith: "Arithmetic", c=None):
        """Walk the plan with a backend's arithmetic (the module docstring's order): the
        FP32 sum before the epilogue.  ``c``: a chain model's initial accumulator."""
        parts = []
        for sl in self.slices:
            outer = c if sl.lo == 0 else None
            for g in sl.groups:
                acc = outer if self.chain and outer is not None else arith.zero()
                acc = arith.group(acc, g)
                if g.scale_block is not None:
                    acc = arith.scale(acc, g.scale_block)
                if outer is None or self.chain:  # the first group, or a chained instruction
                    outer = arith.round_outer(acc)
                else:                            # cross-group rounding
                    outer = arith.add_outer(outer, acc)
            parts.append(outer)
        return self.combine(arith, parts)

    def combine(self, arith: "Arithmetic", parts: list):
        """The slices' FP32 results combined per ``split_reduce`` (``reduce_levels``; each
        add ``arith.add_slices``: FP32 RNE)."""
        v = list(parts)
        for level in reduce_levels(self.split_reduce, len(v)):
            for dst, src in level:
                v[dst] = arith.add_slices(v[dst], v[src])
        return v[0]


class Arithmetic(Protocol):
    """What a backend supplies to ``Schedule.run`` (values: whatever the backend holds, a
    Fraction-based Exact or an array of rows).  The cross-group mode is the plan's
    ``outer_mode`` (a batch of rows may carry one per row)."""

    def zero(self):
        """+0, a group's starting accumulator."""

    def group(self, acc, group: Group):
        """The group's fused steps from ``acc`` (each: acc + its products, or its exact
        runs' sums, aligned and normalized once)."""

    def scale(self, acc, block: int):
        """acc times block ``block``'s two scales, rounded to FP32 RNE (scale_point GROUP)."""

    def round_outer(self, acc):
        """acc rounded to FP32 with the cross-group mode (``Schedule.outer_mode``)."""

    def add_outer(self, outer, acc):
        """outer + acc rounded to FP32 with the cross-group mode (IEEE specials, zero signs)."""

    def add_slices(self, total, part):
        """total + part rounded to FP32 RNE: the split-K add."""


def split_bounds(K: int, split_k: int, split_tile: int | None) -> list[tuple[int, int]]:
    """The split-K slices [lo, hi) of a length-K dot, in reduction order: equal slices
    (K a multiple of split_k), or with split_tile T every slice but the last holds
    ceil(K / split_k) rounded up to a multiple of T."""
    S = split_k
    if split_tile is None:
        if K % S:
            raise ValueError(f"split_k: K={K} is not a multiple of split_k={S} (set split_tile "
                             f"for uneven slices)")
        L = K // S
    else:
        L = -(-(-(-K // S)) // split_tile) * split_tile
    if K == 0:
        return [(0, 0)]
    return [(lo, min(K, lo + L)) for lo in range(0, K, max(L, 1))]


def _check(model: "GemmModel", K: int, block: int | None, scales: ScaleAt) -> list:
    """Every validity check of a schedule; returns the slice bounds."""
    if block is not None and K % block:
        raise ValueError(f"block: K={K} is not a multiple of block={block}")
    bounds = split_bounds(K, model.split_k, model.split_tile)
    if scales is ScaleAt.GROUP:
        if (model.group_size or K) != block:
            raise ValueError(f"GemmModel.group_size: scale_point GROUP needs group_size == block "
                             f"({block}), got {model.group_size}")
        if any(lo % block for lo, _ in bounds):
            raise ValueError(f"split_k: scale_point GROUP needs slices of whole blocks "
                             f"({block}); got K={K}, split_k={model.split_k}, "
                             f"split_tile={model.split_tile}")
    return bounds


def acc_exp_floor(model: "GemmModel") -> int | None:
    """How a fused step picks the exponent its terms align at (``align_ref``).  None: the
    largest over the nonzero terms, a product's exponent its factors' sum (``exp_factors``)
    where set, else its value's.  An int (MMA-Sim, SCALE_EXPONENT_SUM): every addend takes
    part, zeros too, products (or exact runs) by ``exp_factors``, the accumulator at
    max(floor(log2|acc|), floor) and a zero accumulator at the floor (FP32's -126)."""
    if model.align_ref in (AlignRef.VALUE, AlignRef.EXPONENT_SUM):
        return None
    if model.align_ref is AlignRef.SCALE_EXPONENT_SUM:
        return -126
    raise ValueError(f"GemmModel.align_ref: unknown value {model.align_ref!r}; valid choices: "
                     + ", ".join(m.name for m in AlignRef))


def _exp_factors(model: "GemmModel", scales: ScaleAt) -> tuple[ExpFactor, ...] | None:
    """Which factors' exponents a product aligns at (``align_ref``)."""
    if model.align_bits is None or model.align_ref is AlignRef.VALUE:
        return None
    if model.align_ref is AlignRef.EXPONENT_SUM:
        # the scales join only where they multiply the product itself
        ops = (Operand.A, Operand.B) + ((Operand.SCALE_A, Operand.SCALE_B)
                                        if scales is ScaleAt.PRODUCT else ())
        return tuple(ExpFactor(o, None) for o in ops)
    if model.align_ref is AlignRef.SCALE_EXPONENT_SUM:
        fa, fb, fs = model.exp_formats or ("float32",) * 3  # default: FP32's exponent range
        out = ()
        if not (model.exact_group and scales is not ScaleAt.NONE):  # exact runs: scales only
            out = (ExpFactor(Operand.A, fa), ExpFactor(Operand.B, fb))
        if scales is not ScaleAt.NONE:
            out += (ExpFactor(Operand.SCALE_A, fs or "float32"), ExpFactor(Operand.SCALE_B, fs or "float32"))
        return out
    raise ValueError(f"GemmModel.align_ref: unknown value {model.align_ref!r}; valid choices: "
                     + ", ".join(m.name for m in AlignRef))


def _steps(lo: int, hi: int, F: int, E: int | None) -> tuple[Step, ...]:
    out = []
    for j in range(lo, hi, F):
        j1 = min(j + F, hi)
        runs = None if E is None else tuple((r, min(r + E, j1)) for r in range(j, j1, E))
        out.append(Step(j, j1, runs))
    return tuple(out)


def _groups(lo: int, hi: int, layout: tuple) -> tuple[Group, ...]:
    """A slice's groups: group_size products each (the whole slice when None); an empty
    slice (K = 0) is one empty group."""
    _, block, scales, F, G, _, _, E = layout
    G = G or max(hi - lo, 1)
    out = []
    for g0 in range(lo, max(hi, lo + 1), G):
        g1 = min(g0 + G, hi)
        sb = g0 // block if scales is ScaleAt.GROUP else None
        out.append(Group(g0, g1, _steps(g0, g1, F, E), sb))
    return tuple(out)


@lru_cache(maxsize=4096)
def _layout(layout: tuple, bounds: tuple) -> tuple[tuple[Slice, ...], bool]:
    """The slices of a layout (K, block, scales, fma_width, group_size, split_k, split_tile,
    exact_group) and whether every step has one width.  Cached on the layout alone: the
    probe inference asks for thousands of candidate models sharing a few layouts."""
    slices = tuple(Slice(lo, hi, _groups(lo, hi, layout)) for lo, hi in bounds)
    widths = {st.hi - st.lo for sl in slices for g in sl.groups for st in g.steps}
    return slices, len(widths) <= 1


def _as_int(name: str, v, lo: int) -> int:
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < lo:
        raise ValueError(f"{name}: {v!r} is not an int >= {lo}")
    return int(v)


def plan(model: "GemmModel", K: int, block: int | None = None) -> Schedule:
    """``build``, cached per (model, K, block) (``GemmModel.plan`` calls this)."""
    K = _as_int("K", K, 0)
    return _cached(model, K, None if block is None else _as_int("block", block, 1))


@lru_cache(maxsize=4096)
def _cached(model: "GemmModel", K: int, block: int | None) -> Schedule:
    return build(model, K, block)


def build(model: "GemmModel", K: int, block: int | None = None) -> Schedule:
    """``model``'s schedule for a length-K dot; ``block``: the block-scale size (None: no
    block scales).  Raises ValueError where the model cannot run that K / block."""
    K = _as_int("K", K, 0)
    block = None if block is None else _as_int("block", block, 1)
    scales = (ScaleAt.NONE if block is None else
              ScaleAt.GROUP if model.scale_point is ScalePoint.GROUP else ScaleAt.PRODUCT)
    bounds = _check(model, K, block, scales)
    layout = (K, block, scales, model.fma_width, model.group_size, model.split_k,
              model.split_tile, model.exact_group, model.split_reduce)
    slices, uniform = _layout(layout[:8], tuple(bounds))  # (split_reduce: not the slices')
    return Schedule(K, block, scales, slices, model.chain, model.outer_mode, model.exact_group,
                    _exp_factors(model, scales),
                    None if model.align_bits is None else acc_exp_floor(model), uniform, layout,
                    model.split_reduce)

