"""Inference: which model of the reference.gemm family is this device?

The candidate space is a grid over the family (probes.grid), introduced stage by stage (each
stage adds parameters to every surviving candidate; its probes are built to be insensitive
to the parameters of later stages).  Letters as in the short form (reference.notation):

  output   output_mode (6 modes)                      [narrow outputs only]
  lattice  L = None or 2^-k, k = 0..40
  inner    acc = acc_frac_bits 12..23; align = align_bits None or 12..acc+4; align_mode (5);
           norm_mode (6); product_format None/float32 [products wider than FP32 only]
  width    fma_width F = 1..128 (powers of 2); group_size G = None or 2..128 (G >= F);
           outer_mode (6, with groups); scale_point (block-scaled, G == block)
  long     G = 256..K/2; split = split_k 1, 2, 4, 8, 16
  subnormal acc_subnormal KEEP/FLUSH; alpha alpha_mode (4) [devices with alpha]

Within a stage, each round simulates the surviving candidates (a sample when there are
many) on a sample of the stage's probe pool and sends the probes whose predictions split
the candidates most evenly (greatest partition entropy, greedily batched); candidates that
mispredict any observed output are dropped.  A stage ends when no pool probe splits the
survivors.  The result is the canonical member of the surviving class (see
``equivalent`` and docs/probing.md), then checked on random probes; if every candidate is
contradicted, the report says "no model in the family fits" with the contradicting probes.
"""
from __future__ import annotations

import functools
import math
import time
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Callable

import numpy as np

from reference.formats import get_format
from reference.gemm import AlignRef, AlphaMode, GemmModel, ScalePoint
from reference.notation import hypothesis_name, short
from reference.rounding import Mode, Subnormal

from . import probes as P
from .grid import (ALIGN_MODES, F_GRID, G_SMALL, LATTICE_GRID, P_GRID, ROUND_MODES, SPLIT_GRID, W_GRID,
                   uneven_splits)
from .device import Device, DeviceError, Runner
from .sim import NAN_KEY, ERR_KEY, output_bits, simulate

__all__ = ["Inference", "InferenceResult", "canonical", "predict", "equivalent", "blackwell_candidates",
           "product_quantum"]

# --- prediction cache -----------------------------------------------------------------------
_CACHE: dict = {}
_CACHE_MAX = 3_000_000
_MID: dict = {}  # model -> small int: hashing a GemmModel is slow
_GEN = [0]       # bumped when _MID is cleared: ids remembered on model objects go stale


def _mid(m: GemmModel) -> int:
    """The model's small id, remembered on the object (candidates persist across rounds, so
    each is hashed once instead of once per predict call)."""
    t = m.__dict__.get("_mid")
    if t is not None and t[0] == _GEN[0]:
        return t[1]
    i = _MID.setdefault(m, len(_MID))
    m.__dict__["_mid"] = (_GEN[0], i)  # not a dataclass field: equality and hashing ignore it
    return i


def _sig(probe) -> bytes:
    if getattr(probe, "_sig", None) is None:
        o = probe.ops
        parts = [o.a.tobytes(), o.b.tobytes()]
        if o.scales_a is not None:
            parts += [np.asarray(o.scales_a).tobytes(), np.asarray(o.scales_b).tobytes(), bytes([o.block])]
        parts.append(repr(o.alpha).encode())
        import hashlib
        probe._sig = hashlib.blake2b(b"|".join(parts), digest_size=16).digest()
    return probe._sig


def predict(models: list, probes: list) -> np.ndarray:
    """Predicted output keys [len(models), len(probes)], memoized per (model, probe)."""
    out = np.empty((len(models), len(probes)), np.int64)
    miss_m, miss_p, where = [], [], []
    sigs = [_sig(p) for p in probes]
    mids = [_mid(m) for m in models]
    for i, m in enumerate(models):
        mi = mids[i]
        for j, s in enumerate(sigs):
            v = _CACHE.get((mi, s))
            if v is None:
                miss_m.append(m)
                miss_p.append(probes[j].ops)
                where.append((i, j))
            else:
                out[i, j] = v
    if miss_m:
        res = simulate(miss_m, miss_p)
        if len(_CACHE) > _CACHE_MAX:
            _CACHE.clear()
        if len(_MID) > _CACHE_MAX:
            _MID.clear()
            _CACHE.clear()
            _GEN[0] += 1
            mids = [_mid(m) for m in models]
        for (i, j), v in zip(where, res):
            out[i, j] = v
            _CACHE[(mids[i], sigs[j])] = int(v)
    return out


# --- canonical forms and labels ---------------------------------------------------------------
def _fast_replace(m: GemmModel, **kw) -> GemmModel:
    """dataclasses.replace without re-validation (values come from the validated grid)."""
    c = object.__new__(GemmModel)
    c.__dict__.update(m.__dict__)
    c.__dict__.pop("_mid", None)  # another model: its own id
    c.__dict__.update(kw)
    return c


def canonical(m: GemmModel, caps=None) -> GemmModel:
    """Fold parameters that provably cannot change any output (docs/probing.md)."""
    kw = {}
    if m.group_size is not None and m.fma_width > m.group_size:
        kw["fma_width"] = m.group_size          # a step never spans a group
    if m.group_size is None and m.acc_frac_bits <= 23:
        kw["outer_mode"] = Mode.RNE             # one group: its FP32 rounding is exact
    if m.align_bits is None:
        kw["align_mode"] = Mode.RTZ             # nothing is aligned
        kw["align_ref"] = AlignRef.VALUE
    if caps is not None:
        q = product_quantum(caps)
        if m.lattice is not None and m.lattice <= q:
            kw["lattice"] = None                # every result is already on that lattice
        if q >= P.pow2(-126):
            kw["acc_subnormal"] = Subnormal.KEEP  # no accumulator value is ever subnormal
        if not caps.block_scaled:
            kw["scale_point"] = ScalePoint.PRODUCT
        if caps.alpha == "none":
            kw["alpha_mode"] = AlphaMode.PREMULTIPLIED
        if get_format(caps.output).man_bits >= 23 and m.acc_frac_bits <= 23:
            kw["output_mode"] = Mode.RNE        # an FP32 value rounds to FP32 exactly
    kw = {k: v for k, v in kw.items() if getattr(m, k) != v}
    return _fast_replace(m, **kw) if kw else m


@functools.lru_cache(maxsize=None)
def product_quantum(caps) -> Fraction:
    """Every product, partial sum and rounded result is a multiple of this power of two."""
    def lsb(fmt):
        f = get_format(fmt)
        return f.emin - (f.man_bits if f.subnormals else 0)
    e = lsb(caps.a_format) + lsb(caps.b_format)
    if caps.block_scaled:
        e += 2 * lsb(caps.scale_format)
    return P.pow2(e)


def _pref(m: GemmModel):
    """Order among observationally equivalent candidates: simplest first."""
    mi = {x: i for i, x in enumerate(ROUND_MODES)}
    return (m.product_format is not None, m.lattice is not None, m.split_k, m.split_tile or 0,
            m.group_size is not None, m.group_size or 0,
            m.align_bits is not None, m.align_bits or 0, -m.acc_frac_bits, m.fma_width,
            ALIGN_MODES.index(m.align_mode), m.align_ref is AlignRef.EXPONENT_SUM, mi[m.norm_mode], mi[m.outer_mode], mi[m.output_mode],
            m.acc_subnormal is Subnormal.FLUSH, m.scale_point is ScalePoint.GROUP,
            list(AlphaMode).index(m.alpha_mode))


def _hex(key: int, fmt: str) -> str:
    if key == NAN_KEY:
        return "nan"
    if key == ERR_KEY:
        return "error"
    return f"0x{key:0{get_format(fmt).container_bits // 4}x}"


# Stages before split-K is a candidate ignore the sign of a zero result: leading zero
# slices are neutral for every value except the sign of an exact zero (+0 + -0 = +0).
ZERO_BLIND = ("output", "lattice", "inner", "width")


def _fold_zero(keys, fmt: str):
    sign = 1 << (get_format(fmt).nbits - 1)
    keys = np.asarray(keys, np.int64)
    return np.where(keys == sign, 0, keys)


def _entropy(col: np.ndarray) -> float:
    _, c = np.unique(col, return_counts=True)
    p = c / c.sum()
    return float(-(p * np.log2(p)).sum())


@dataclass
class Stage:
    name: str
    parameter: str
    expand: Callable
    pool: Callable


@dataclass
class InferenceResult:
    status: str                      # fit | no_fit | nondeterministic | error
    model: GemmModel | None = None
    survivors: list = field(default_factory=list)
    probes: list = field(default_factory=list)     # report probe records
    scans: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    undetermined: dict = field(default_factory=dict)
    error: str | None = None
    device_calls: int = 0
    wall_s: float = 0.0
    asked: list = field(default_factory=list)      # (Probe, observed key)


class NoFit(Exception):
    pass


class Inference:
    """Adaptive probing of one device.  ``run()`` returns an InferenceResult."""

    def __init__(self, device: Device, *, quick: bool = False, seed: int = 0, batch: int = 8,
                 sample: int = 32, cand_sample: int = 600, progress: Callable | None = None,
                 k_core: int | None = None, record_limit: int = 400, shape: tuple | None = None):
        """``shape`` = (M, N, K): probe at exactly this GEMM shape (per-shape inference:
        libraries choose the kernel, hence the model, by shape); K is then the probe length."""
        self.dev = device
        self.caps = device.caps
        self.quick = quick
        self.rng = np.random.default_rng(seed)
        self.seed = seed
        self.batch = batch
        self.sample = sample
        self.cand_sample = cand_sample
        self.progress = progress or (lambda *a, **k: None)
        self.runner = Runner(device, None if shape is None else shape[:2])
        self.shape = shape
        step = self.caps.k_step()
        kc = k_core or (1024 if quick else 2048)
        kc = min(kc, self.caps.max_k)
        self.K = max(step, kc - kc % step)
        if shape is not None:
            K = int(shape[2])
            if K % (self.caps.block or self.caps.k_multiple) or K > self.caps.max_k:
                raise ValueError(f"shape: K={K} is not a valid K for {device.name} (multiple of "
                                 f"{self.caps.block or self.caps.k_multiple}, at most {self.caps.max_k})")
            self.K = K
        self.ctx = P.ProbeContext(self.caps, self.K, fixed_k=shape is not None)
        self.asked: list = []           # (Probe, key)
        self.observed: list = []        # (probes, keys) of each observe() call
        self.broad = 0                  # long stage: 0 equal slices, 1 + uneven, 2 + groups reopened
        self.records: list = []
        self.record_limit = record_limit
        self.fmt = self.caps.output
        fa, fb = get_format(self.caps.a_format), get_format(self.caps.b_format)
        self.wide_products = fa.man_bits + fb.man_bits + 2 > 24 and not self.caps.block_scaled

    # -- device -----------------------------------------------------------------------------
    def observe(self, probes: list) -> np.ndarray:
        vals = self.runner.run([p.ops for p in probes])
        keys = output_bits(vals, self.fmt)
        self.observed.append((probes, keys))  # each call kept as sent: repeated verbatim later
        return keys

    def repeats_differ(self, seconds: float) -> str | None:
        """Send earlier observe() calls again, exactly as sent (the same packing, so a kernel
        chosen by shape is the same kernel), newest first, for at most ``seconds``.  A device
        that answers one question two ways is nondeterministic, not a device no model fits:
        returns a note naming the first such probe, or None."""
        t_end = time.perf_counter() + seconds
        for probes, keys in reversed(list(self.observed)):
            if time.perf_counter() > t_end:
                break
            again = output_bits(self.runner.run([p.ops for p in probes]), self.fmt)
            if not np.array_equal(again, keys):
                j = int(np.nonzero(again != keys)[0][0])
                return (f"nondeterministic: probe '{probes[j].name}' gave {_hex(int(keys[j]), self.fmt)} "
                        f"then {_hex(int(again[j]), self.fmt)} for identical operands (found when "
                        f"repeating the probes after no candidate fitted)")
        return None

    # -- stages ---------------------------------------------------------------------------------
    def stages(self) -> list:
        caps = self.caps
        out = get_format(caps.output)
        st = []
        if out.man_bits < 23:
            st.append(Stage("output", "output_mode",
                            lambda S: [m.replace(output_mode=o) for m in S for o in ROUND_MODES],
                            lambda ctx: P.cached_pool(P.output_pool, ctx)))
        st.append(Stage("lattice", "lattice",
                        lambda S: [m.replace(lattice=L) for m in S for L in LATTICE_GRID],
                        lambda ctx: P.cached_pool(P.lattice_pool, ctx)))
        st.append(Stage("inner", "align_bits/acc_frac_bits/align_mode/norm_mode/product_format",
                        self._expand_inner, lambda ctx: P.cached_pool(P.inner_pool, ctx)))
        st.append(Stage("width", "fma_width/group_size/outer_mode/scale_point", self._expand_width,
                        lambda ctx: P.cached_pool(P.width_pool, ctx, 64 if self.quick else 256)))
        st.append(Stage("long", "group_size/split_k", self._expand_long,
                        lambda ctx: P.cached_pool(P.long_pool, ctx)))
        st.append(Stage("subnormal", "acc_subnormal",
                        lambda S: [m.replace(acc_subnormal=s) for m in S for s in (Subnormal.KEEP, Subnormal.FLUSH)],
                        lambda ctx: P.cached_pool(P.subnormal_pool, ctx)))
        if caps.alpha != "none":
            st.append(Stage("alpha", "alpha_mode",
                            lambda S: [m.replace(alpha_mode=a) for m in S for a in AlphaMode],
                            lambda ctx: P.cached_pool(P.alpha_pool, ctx)))
        # the early stages ignored the sign of exact zeros (split-K was unknown); now it is
        # known, their probes may split the survivors by it (e.g. x + -x = -0 under RDN)
        blind = [s_ for s_ in st if s_.name in ZERO_BLIND]
        st.append(Stage("zero", "signs of exact zeros", lambda S: S,
                        lambda ctx: [p for s_ in blind for p in s_.pool(ctx) if _zero_sign_probe(p)]))
        return st

    def _expand_inner(self, S):
        out = []
        pfs = (None, "float32") if self.wide_products else (None,)
        # block-scaled operands are realized through block scales, which fix neither factor's
        # exponent: only the value reference is identifiable there
        refs = (AlignRef.VALUE,) if self.caps.block_scaled else (AlignRef.VALUE, AlignRef.EXPONENT_SUM)
        for m in S:
            for p in P_GRID:
                for W in W_GRID(p):
                    for am in (ALIGN_MODES if W is not None else (Mode.RTZ,)):
                        for ar in (refs if W is not None else (AlignRef.VALUE,)):
                            for nm in ROUND_MODES:
                                for pf in pfs:
                                    out.append(_fast_replace(m, acc_frac_bits=p, align_bits=W, align_mode=am,
                                                             align_ref=ar, norm_mode=nm, product_format=pf))
        return out

    def _expand_width(self, S):
        out = []
        blk = self.caps.block
        gmax = 128 if not self.quick else max(64, 4 * (blk or 1))
        for m in S:
            for F in F_GRID:
                out.append(_fast_replace(m, fma_width=F, group_size=None))
                for G in G_SMALL:
                    if G < F or G > gmax or (blk and (G % blk or G < 2 * blk and G != blk)):
                        continue  # block-scaled: groups of whole blocks
                    for om in ROUND_MODES:
                        out.append(_fast_replace(m, fma_width=F, group_size=G, outer_mode=om))
                        if self.caps.block_scaled and G == self.caps.block:
                            out.append(_fast_replace(m, fma_width=F, group_size=G, outer_mode=om,
                                                     scale_point=ScalePoint.GROUP))
        return out

    def _expand_long(self, S):
        """First pass: the width stage's groups kept, equal split-K slices.  When a pass
        explains no observation, the next one (``self.broad``) adds: 1, uneven slices (cuBLAS
        split-K kernels), groups kept; 2, groups reopened (none, longer, every outer mode): a
        group boundary the width stage saw may be a slice boundary instead, and slice sums
        seen as groups can mimic another outer rounding.  Pass 1 is a fraction of pass 2's
        set, which with a sequential-FMA model takes minutes to simulate."""
        out = []
        K = self.K
        broad = self.broad >= 2
        gl = [1 << k for k in range(6 if self.quick else 8, 14) if (1 << k) <= K // 2]
        for m in S:
            if m.group_size is None:
                gs = [None] + gl
            elif broad:
                gs = [m.group_size, None] + [g for g in gl if g > m.group_size]
            else:
                gs = [m.group_size]
            for G in gs:
                if G is None:
                    oms = (m.outer_mode,)
                elif G != m.group_size or broad:
                    oms = ROUND_MODES
                else:
                    oms = (m.outer_mode,)
                for om in oms:
                    for s in SPLIT_GRID:
                        if K % s or (G is not None and G > K // s):
                            continue
                        out.append(_fast_replace(m, group_size=G, outer_mode=om, split_k=s))
                    for s, T in (uneven_splits(K, K // 2, K // 4) if self.broad else ()):  # long-pool lengths
                        out.append(_fast_replace(m, group_size=G, outer_mode=om, split_k=s,
                                                 split_tile=T))
        return out

    # -- engine -----------------------------------------------------------------------------------
    def _canon(self, ms):
        seen = {}
        for m in ms:
            c = canonical(m, self.caps)
            seen.setdefault(c, None)
        return list(seen)

    def _record(self, probe, key, cands_before, preds_col, n_after, stage):
        if len(self.records) >= self.record_limit:
            return
        groups: dict = {}
        for m, v in zip(cands_before, preds_col):
            groups.setdefault(int(v), []).append(m)
        preds = {}
        for v, ms in sorted(groups.items(), key=lambda kv: -len(kv[1]))[:8]:
            lab = short(ms[0]) + (f" (+{len(ms) - 1} more)" if len(ms) > 1 else "")
            preds[lab] = _hex(v, self.fmt)
        self.records.append({"name": probe.name, "parameter": probe.parameter or stage,
                             "description": probe.description, "operands": probe.record_operands(),
                             "predictions": preds, "observed": _hex(int(key), self.fmt),
                             "candidates_before": int(len(cands_before)),
                             "candidates_after": int(n_after), "format": self.fmt})

    def _select(self, cands, pool, asked_sigs, blind=False):
        """``blind``: the stage ignores the sign of a zero result, so probes that split the
        candidates only by it are worth nothing there."""
        rem = [p for p in pool if _sig(p) not in asked_sigs]
        if not rem:
            return []
        cs = cands
        if len(cands) > self.cand_sample:
            idx = self.rng.choice(len(cands), self.cand_sample, replace=False)
            cs = [cands[i] for i in idx]
        order = self.rng.permutation(len(rem))
        for lo in range(0, len(rem), self.sample):
            chunk = [rem[i] for i in order[lo:lo + self.sample]]
            pr = predict(cs, chunk)
            if blind:
                pr = _fold_zero(pr, self.fmt)
            H = np.array([_entropy(pr[:, j]) for j in range(pr.shape[1])])
            if H.max() <= 0:
                continue
            # greedy batch: add the probe that refines the joint partition most
            chosen = []
            labels = np.zeros(len(cs), np.int64)
            cur = 0.0
            for _ in range(self.batch):
                best, bj = cur, None
                for j in np.argsort(-H)[: 4 * self.batch]:
                    if j in chosen:
                        continue
                    _, inv = np.unique(np.stack([labels, pr[:, j]], 1), axis=0, return_inverse=True)
                    h = _entropy(inv.ravel())
                    if h > best + 1e-9:
                        best, bj = h, j
                if bj is None:
                    break
                chosen.append(bj)
                _, labels = np.unique(np.stack([labels, pr[:, bj]], 1), axis=0, return_inverse=True)
                labels = labels.ravel()
                cur = best
            return [chunk[j] for j in chosen]
        return []

    def _filter(self, cands, probes, keys, stage):
        """Drop candidates that mispredict; one probe at a time, so each simulation only
        covers the candidates still alive."""
        blind = stage in ZERO_BLIND
        for p, k in zip(probes, keys):
            col = predict(cands, [p])[:, 0]
            ok = (_fold_zero(col, self.fmt) == _fold_zero(k, self.fmt)) if blind else (col == k)
            self._record(p, k, cands, col, int(ok.sum()), stage)
            cands = [c for c, o in zip(cands, ok) if o]
            if not cands:
                break
        return cands, None

    def run_stage(self, stage: Stage, survivors: list) -> list:
        cands = self._canon(stage.expand(survivors))
        label = stage.name + ("", " (uneven slices)", " (broad pass)")[self.broad]
        # pools depend only on formats and K (not on survivors): the same probes every run
        self.ctx.acc_bits = (P_GRID[0], P_GRID[-1])
        pool = stage.pool(self.ctx)
        asked = {_sig(p) for p, _ in self.asked}
        self.progress(stage=label, candidates=len(cands))
        while len(cands) > 1:
            chosen = self._select(cands, pool, asked, stage.name in ZERO_BLIND)
            if not chosen:
                break
            keys = self.observe(chosen)
            for p, k in zip(chosen, keys):
                self.asked.append((p, int(k)))
                self.asked_stage.append(stage.name)
                asked.add(_sig(p))
            before = cands
            cands, pr = self._filter(cands, chosen, keys, stage.name)
            self.progress(stage=label, candidates=len(cands))
            if not cands:
                self._explain(before, stage)
                raise NoFit(f"stage {stage.name}: no candidate of the family reproduces the observed outputs")
        return cands

    def _random_checks(self, survivors):
        """The zero signs the early stages ignored must match now that split-K is known;
        then the chosen model must reproduce unseen random probes."""
        probes_ = [p for p, _ in self.asked]
        keys_ = np.array([k for _, k in self.asked], np.int64)
        if probes_:
            exact = (predict(survivors, probes_) == keys_[None, :]).all(axis=1)
            if exact.any():
                survivors = [c for c, o in zip(survivors, exact) if o]
        if self._checks is None:
            checks = P.random_pool(self.ctx, 12, self.seed + 21, "normal") + \
                P.random_pool(self.ctx, 8, self.seed + 22, "cancel") + \
                P.random_pool(self.ctx, 8, self.seed + 23, "heavy")
            keys = self.observe(checks)
            for p, k in zip(checks, keys):
                self.asked.append((p, int(k)))
                self.asked_stage.append("check")
            self._checks = ([p for p, _ in self.random_obs] + checks,
                            np.concatenate([[k for _, k in self.random_obs], keys]).astype(np.int64))
        checks, keys = self._checks
        before = survivors
        survivors, _ = self._filter(survivors, checks, keys, "check")
        if not survivors:
            self._explain(before, "check")
            raise NoFit("random checks: no surviving candidate reproduces them")
        return survivors

    def _stage_checked(self, st, survivors):
        out = self._check_all(self.run_stage(st, survivors))
        if not out:
            raise NoFit(f"after stage {st.name}: no candidate reproduces every observation")
        return out

    def _ungrouped_twins(self, survivors):
        """The width stage sees split-K slice boundaries as group boundaries, and the long
        stage's first pass keeps that group size: a group at least as long as every slice is
        invisible at the probe K, but not at a K with longer slices.  Its ungrouped twin is
        added where it reproduces every observation, so the simplest model is reported."""
        from reference.gemm import split_bounds
        twins = []
        for m in survivors:
            if m.group_size is None or m.split_k == 1:
                continue
            try:
                longest = max(hi - lo for lo, hi in split_bounds(m, self.K))
            except ValueError:
                continue
            t = canonical(m.replace(group_size=None), self.caps)
            if longest <= m.group_size and t not in survivors and t not in twins:
                twins.append(t)
        return survivors + (self._check_all(twins, explain=False) if twins else [])

    def _explain(self, before, stage):
        """For the last candidates, the first observed probe each one mispredicts."""
        shown = sorted(before, key=_pref)[:4]
        probes = [p for p, _ in self.asked]
        keys = np.array([k for _, k in self.asked])
        pr = predict(shown, probes)
        for m, row in zip(shown, pr):
            bad = np.nonzero(row != keys)[0]
            if len(bad):
                j = bad[0]
                self.notes.append(f"{short(m)} contradicted by probe '{probes[j].name}': predicted "
                                  f"{_hex(int(row[j]), self.fmt)}, observed {_hex(int(keys[j]), self.fmt)}")
        self.closest = shown[0] if shown else None

    def _check_all(self, cands, explain=True):
        """Survivors consistent with every observation so far (later stages may add axes
        that earlier probes were designed to ignore; verify instead of trusting)."""
        probes = [p for p, _ in self.asked]
        keys = np.array([k for _, k in self.asked], np.int64)
        if not probes:
            return cands
        pr = predict(cands, probes)
        blind = np.array([st in ZERO_BLIND for st in self.asked_stage])
        eq = np.where(blind[None, :], _fold_zero(pr, self.fmt) == _fold_zero(keys, self.fmt)[None, :],
                      pr == keys[None, :])
        ok = eq.all(axis=1)
        if explain and not ok.any():
            self._explain(cands, "all")
        return [c for c, o in zip(cands, ok) if o]

    def determinism(self) -> bool:
        # all at the probe shape (K_core): libraries pick kernels per shape
        ps = P.random_pool(self.ctx, 6, self.seed + 11, "mixed")
        first = self.observe(ps)
        for _ in range(2):
            again = self.observe(ps)
            if not np.array_equal(first, again):
                j = int(np.nonzero(first != again)[0][0])
                self.notes.append(f"nondeterministic: probe '{ps[j].name}' gave {_hex(int(first[j]), self.fmt)} "
                                  f"then {_hex(int(again[j]), self.fmt)} for identical operands")
                return False
        self.random_obs = list(zip(ps, (int(k) for k in first)))  # checked at the end only
        return True

    def run(self) -> InferenceResult:
        t0 = time.perf_counter()
        self.notes: list = []
        self.closest = None
        self.random_obs = []
        self.asked_stage = []
        self._checks = None
        res = InferenceResult("error")
        try:
            if not self.determinism():
                res.status = "nondeterministic"
                return self._finish(res, t0)
            if self.caps.block_scaled and self.shape is None:
                hit = self._blackwell(res)  # the Blackwell hypotheses first (issue 17)
                if hit is not None:
                    return self._finish(hit, t0)
            survivors = [GemmModel("inferred", output=self.caps.output)]
            stages = self.stages()
            i_long = next(i for i, st in enumerate(stages) if st.name == "long")
            i, saved = 0, None
            while True:
                try:
                    for st in stages[i:]:
                        if st.name == "long":
                            saved = (survivors, len(self.notes))
                        survivors = self._stage_checked(st, survivors)
                    survivors = self._random_checks(survivors)
                    break
                except NoFit:
                    if self.broad == 2 or saved is None:
                        raise
                    # the pass explains no long run or random check: the stages from "long"
                    # on again with the next pass's larger set (_expand_long)
                    self.broad += 1
                    survivors, n = saved
                    del self.notes[n:]
                    self.closest = None
                    self.notes.append(
                        "equal split-K slices explain no observation: uneven slices tried"
                        if self.broad == 1 else "the width stage's groups with equal or uneven "
                        "split-K slices explain no observation: groups reopened")
                    i = i_long
            survivors = sorted(self._ungrouped_twins(survivors), key=_pref)
            res.model = survivors[0].replace(name="inferred")
            res.survivors = survivors
            res.undetermined = _undetermined(survivors)
            res.status = "fit"
            res.scans = self._scans(res.model)
        except NoFit as e:
            try:
                noisy = self.repeats_differ(max(5.0, 0.25 * (time.perf_counter() - t0)))
            except DeviceError:
                noisy = None
            if noisy:
                res.status = "nondeterministic"
                self.notes.insert(0, noisy)
                return self._finish(res, t0)
            res.status = "no_fit"
            self.notes.insert(0, f"no model in the family fits: {e}")
            res.model = self.closest.replace(name="closest") if self.closest is not None else None
        except DeviceError as e:
            res.status = "error"
            res.error = str(e)
        return self._finish(res, t0)

    def _blackwell(self, res):
        """The Blackwell hypothesis family (blackwell_candidates) against the crafted
        blackwell pool, then alpha and the random checks.  A fit names the hypothesis, its
        equivalence class and the probe that decided it; otherwise the observations stay
        and the grid stages run (they may explain a model outside this family)."""
        stages = [Stage("blackwell", "instruction K/exact group/align_ref/align_bits/modes/lattice/split_k",
                        lambda S: blackwell_candidates(self.caps),
                        lambda ctx: P.cached_pool(P.blackwell_pool, ctx)),
                  # what the crafted pool leaves together, the general pools may still split
                  Stage("blackwell-confirm", "the same axes, general probes", lambda S: S,
                        lambda ctx: P.cached_pool(blackwell_confirm_pool, ctx))]
        if self.caps.alpha != "none":
            stages.append(Stage("alpha", "alpha_mode",
                                lambda S: [m.replace(alpha_mode=a) for m in S for a in AlphaMode],
                                lambda ctx: P.cached_pool(P.alpha_pool, ctx)))
        n_rec, n_notes = len(self.records), len(self.notes)
        try:
            survivors = []
            for st in stages:
                survivors = self._stage_checked(st, survivors)
            n_staged = len(self.records)
            survivors = self._random_checks(survivors)
        except NoFit:
            del self.records[n_rec:], self.notes[n_notes:]
            self.closest = None
            self._checks = None
            self.notes.append("no Blackwell hypothesis fits: the general family searched")
            return None
        survivors = sorted(survivors, key=_pref)
        res.model = survivors[0].replace(name="inferred")
        res.survivors = survivors
        res.undetermined = _undetermined(survivors)
        res.status = "fit"
        self.notes.append(_blackwell_note(res.model, survivors, self.records[n_rec:], n_staged - n_rec))
        res.scans = self._scans(res.model)
        return res

    def _finish(self, res, t0):
        res.probes = self.records
        res.notes = list(self.notes)
        res.asked = list(self.asked)
        res.device_calls = self.runner.calls
        res.wall_s = time.perf_counter() - t0
        return res

    def _scans(self, model: GemmModel) -> list:
        """Group-boundary scan: output vs the position of one big term (plot data)."""
        n = min(self.K, 64 if self.quick else 256)
        j = model.acc_frac_bits + 1
        pos = list(range(0, n, max(1, n // 64)))
        ps = [p for p in P.boundary_scan(self.ctx, n, j, pos) if p is not None]
        if not ps:
            return []
        try:
            keys = self.observe(ps)
        except DeviceError:
            return []
        pred = predict([model], ps)[0]
        from .sim import bits_to_float
        got = bits_to_float(keys, self.fmt)
        exp = bits_to_float(pred, self.fmt)
        e0 = self.ctx.bases(j + 2)[0]
        B = 2.0 ** e0
        u = 2.0 ** (e0 - j)
        y = [None if not np.isfinite(v) else float((v - B) / u) for v in got]
        ym = [None if not np.isfinite(v) else float((v - B) / u) for v in exp]
        base = dict(xlabel="position of the big term", ylabel="(output - big) / small term")
        return [dict(name=f"group-boundary scan (device), n={n}, small=2^-{j} big", x=pos, y=y,
                     description="jumps mark fused-step / group boundaries", **base),
                dict(name=f"group-boundary scan (inferred model), n={n}", x=pos, y=ym, **base)]


# --- Blackwell hypotheses (issue 17, docs/blackwell.md) ------------------------------------------
BW_INSTR_K = (32, 64)
BW_EXACT_GROUPS = (None, 16, 32, 64)
BW_WIDTHS = tuple(range(13, 41))
BW_SPLITS = (1, 2, 4)


def blackwell_candidates(caps) -> list:
    """The Blackwell family for a block-scaled device: chained instructions of K 32 or 64,
    exact groups of 16/32/64 (or none), alignment at format exponents or values, fused-add
    width 13..40, truncation or RNE in the add and per instruction (overflow to Inf), lattice
    None or 1/1024, split-K 1/2/4; plus the seed's probe_matched and its lattice variant."""
    from reference.gemm import get_preset
    ef = (caps.a_format, caps.b_format, caps.scale_format)
    base = get_preset("blackwell_mxf4nvf4").replace(name="inferred", output=caps.output, exp_formats=ef)
    out = [get_preset(n).replace(name="inferred", output=caps.output)
           for n in ("probe_matched", "probe_matched_lattice")]
    for ik in BW_INSTR_K:
        for eg in BW_EXACT_GROUPS:
            if eg is not None and (eg > ik or (eg % caps.block and caps.block % eg)):
                continue
            for ar in (AlignRef.SCALE_EXPONENT_SUM, AlignRef.VALUE):
                for W in BW_WIDTHS:
                    for am in (Mode.RTZ, Mode.RNE):
                        for nm in (Mode.RTZ, Mode.RNE):
                            for L in (None, Fraction(1, 1024)):
                                for sk in BW_SPLITS:
                                    out.append(_fast_replace(base, group_size=ik, fma_width=ik, exact_group=eg,
                                                             align_ref=ar, align_bits=W, align_mode=am,
                                                             norm_mode=nm, lattice=L, split_k=sk))
    return out


def blackwell_confirm_pool(ctx) -> list:
    """The general crafted pools (those probes.testing.observationally_equivalent also
    asks) for the Blackwell stage's last split: widths, inner order, long runs, subnormals."""
    out = []
    for fn, args in ((P.lattice_pool, ()), (P.inner_pool, ()), (P.width_pool, (64,)),
                     (P.width_pool, (256,)), (P.long_pool, ()), (P.subnormal_pool, ())):
        out += P.cached_pool(fn, ctx, *args)
    return out


def _blackwell_note(model, survivors, records, n_staged) -> str:
    """'matched the Blackwell hypothesis ...; decided by crafted probe ...': the deciding
    probe is the last one that cut the candidates (a crafted one, or a random check)."""
    cut = [(i, r) for i, r in enumerate(records) if r["candidates_before"] > r["candidates_after"]]
    words = f"matched the Blackwell hypothesis {hypothesis_name(model)!r}"
    if len(survivors) > 1:
        words += (f" ({len(survivors)} candidates agree on every probe: equivalence class "
                  f"{', '.join(short(m) for m in survivors[:4])})")
    if cut:
        i, r = cut[-1]
        words += f"; decided by {'crafted probe' if i < n_staged else 'random check'} '{r['name']}'"
    return words


def _zero_sign_probe(p) -> bool:
    """Probes whose output can be a zero of either sign: cancellation (the exact sum at
    least 2^10 below the largest term, so an accumulator may lose what is left), or one
    term (a lattice may round it to a signed zero)."""
    if p.terms is None:
        return False
    vals = [P._term_value(t) for t in p.terms]
    return abs(sum(vals)) * 1024 <= max(map(abs, vals)) or sum(1 for v in vals if v) == 1


def _undetermined(ms: list) -> dict:
    out = {}
    if len(ms) <= 1:
        return out
    for f in ("fma_width", "align_bits", "align_mode", "acc_frac_bits", "norm_mode", "group_size",
              "outer_mode", "lattice", "split_k", "split_tile", "product_format", "acc_subnormal", "alpha_mode",
              "output_mode", "scale_point"):
        vals = sorted({str(getattr(m, f)) for m in ms})
        if len(vals) > 1:
            out[f] = vals
    return out


def equivalent(m1: GemmModel, m2: GemmModel, probes: list, extra: Callable | None = None) -> bool:
    """Observational equivalence on a probe set (and optional extra check, e.g. validation)."""
    pr = predict([m1, m2], probes)
    if not np.array_equal(pr[0], pr[1]):
        return False
    return extra(m1, m2) if extra else True


_ = math
