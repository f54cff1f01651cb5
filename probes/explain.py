"""Which schedule does a device's GEMM run at this shape?  (`fp4ref explain`, issue 13)

``explain_shape(dev, (M, N, K), base_model=...)`` draws one random batch at exactly that
shape, calls the device once (and the profiler once, for kernel names), and searches the
candidate models: the base model and the models the kernel names suggest
(``probes.kernels.models_for_kernels``), each with every split-K schedule of this K
(``split_candidates``), ranked by a crafted probe that shows where K is cut
(``crafted_split_probe``).  Every candidate is screened on the 4 x 4, then the 16 x 16
corner of the sampled outputs with the numpy simulator (cost ~ K steps), and the first
that passes is confirmed on ``outputs`` sampled outputs with ``fp4ref.gemm.emulate`` on the
batch's torch device.
Inference only reads the device's outputs (and its kernel names, as hints): never a hidden
model.

Importing this module registers ``probe_shape`` as fp4ref.native's shape prober, so
``fp4ref.emulate_native(dev, a, b)`` learns an unknown shape on first use.
"""
from __future__ import annotations

import dataclasses
import math
import time

import numpy as np

from fp4ref.native import (ScheduleTable, ShapeSchedule, environment_key, register_shape_prober, run_schedule,
                            schedule_parts)
from reference.gemm import GemmModel

from .device import Batch, Device, DeviceError
from .grid import split_candidates
from .sim import output_bits, simulate_gemm

__all__ = ["explain_shape", "split_candidates", "candidate_models", "probe_shape", "ShapeSchedule",
           "ScheduleTable", "kernel_hints", "crafted_split_probe", "boundary_positions", "rank_by_probe",
           "cublaslt_heuristic", "crafted_combine_probe", "order_from_distances", "slice_ks"]

SCREEN = (4, 16)  # rows = columns of the simulator screens before the emulated confirmation


def kernel_hints(device_name: str, kernels: list) -> tuple[list, str]:
    """(candidate models, family label) from the kernel names; ([], a plain label) while
    probes.kernels is not there."""
    try:
        from .kernels import kernel_family, models_for_kernels
    except ImportError:  # helper "kernels" has not landed: no hints, the base model only
        names = [k for k in kernels if not k.startswith("Memset")]
        return [], (names[0][:60] if names else "")
    return list(models_for_kernels(device_name, list(kernels))), kernel_family(list(kernels))


def candidate_models(bases: list, K: int, block: int | None = None) -> list:
    """Every base model unsplit first (most likely first), then each one's split schedules;
    only those that can run this K (a base fitted with split_k = 8 cannot run K = 118: its
    split variants can)."""
    out, seen = [], set()
    for m in list(bases) + [s for b in bases for s in split_candidates(b, K)]:
        if m not in seen and _runs(m, K, block):
            seen.add(m)
            out.append(m)
    return out


def _runs(m: GemmModel, K: int, block: int | None) -> bool:
    try:
        m.plan(K, block)
    except ValueError:
        return False
    return True


def _cells(m: GemmModel, K: int) -> tuple:
    """(slice, group) of each k under ``m``: its split-K slice and its innermost partial
    within the slice (the promotion group, or the fused FMA step without groups; both
    restart in each slice)."""
    from reference.gemm import split_bounds
    sl = np.empty(K, np.int64)
    gr = np.empty(K, np.int64)
    n = 0
    for i, (lo, hi) in enumerate(split_bounds(m, K)):
        G = max(m.group_size or m.fma_width, 1)
        sl[lo:hi] = i
        gr[lo:hi] = n + (np.arange(hi - lo) // G)
        n += -(-(hi - lo) // G) + 1
    return sl, gr


def _probe_q(p: int, K: int) -> int:
    return min(p + 64, K - 1)


def boundary_positions(cands: list, K: int, limit: int) -> list:
    """Positions p to probe: the first slice boundaries of the split candidates, then their
    other slice starts (at most ``limit``; 0 < p < K - 1)."""
    from reference.gemm import split_bounds
    first, rest = [], []
    for m in cands:
        if m.split_k > 1:
            b = [lo for lo, _ in split_bounds(m, K)][1:]
            first += b[:1]
            rest += b[1:]
    out = []
    for p in first + rest:
        if 0 < p < K - 1 and p not in out:
            out.append(p)
    return sorted(out[:limit])


def crafted_split_probe(dev: Device, shape, positions: list):
    """One crafted call (diagonal probes, as many as min(M, N) allows) per chunk of
    ``positions``: probe i has X*X at k = 0, -X*X at k = p_i and a tiny s*s at
    q = p_i + 64.  The tiny term survives (output != 0) when +-X*X cancel before it joins
    them; it is absorbed (output 0) when it joins -X*X first: q in p's promotion group with
    0 outside it, or q in p's split-K slice with 0 in another slice.  Returns
    {p: output == 0}, or None for block-scaled devices (their formats are too narrow)."""
    import torch
    from reference.formats import get_format
    caps = dev.caps
    if caps.block_scaled or not positions:
        return None
    M, N, K = shape
    fa, fo = get_format(caps.a_format), get_format(caps.output)
    lg = lambda v: math.log2(float(v))  # noqa: E731
    # X*X and s*s normal in the output format, X*X / s*s >= 2^26: absorbed by 24-bit sums
    ex = min(10, math.floor(lg(fa.max_finite)) - 1, (math.floor(lg(fo.max_finite)) - 1) // 2)
    es = max(-14, math.ceil(lg(fa.min_normal)), math.ceil(lg(fo.min_normal) / 2))
    if 2 * (ex - es) < 26:
        return None
    X, s = 2.0 ** ex, 2.0 ** es
    per, out, where = min(M, N), {}, dev.torch_device
    for c0 in range(0, len(positions), per):
        chunk = positions[c0:c0 + per]
        i = torch.arange(len(chunk), device=where)
        p = torch.tensor(chunk, device=where)
        q = torch.tensor([_probe_q(x, K) for x in chunk], device=where)
        a = torch.zeros(M, K, device=where)  # float32: X, s and 0 are exact in every operand format here
        b = torch.zeros(K, N, device=where)
        a[i, 0], b[0, i], a[i, p], b[p, i], a[i, q], b[q, i] = X, X, -X, X, s, s
        got = dev.call_tensors(dev.batch_from(a, b, alpha=_unit_alpha(caps, M, N)))
        d = got.diagonal()[: len(chunk)].cpu()
        out.update({x: bool(d[j] == 0) for j, x in enumerate(chunk)})
    return out


def _unit_alpha(caps, M: int, N: int):
    import torch
    if caps.alpha == "tensorwise":
        return (1.0, 1.0)
    if caps.alpha == "rowwise":
        return (torch.ones(M), torch.ones(N))
    return None


def slice_ks(cand, K: int) -> list:
    """One k of each split-K slice of a candidate (a model, or (model, KLayout[, tiles])),
    in slice order: the middle one of the slice's own (not zero-filled) positions."""
    model, lay, _ = schedule_parts(cand)
    if lay is None:
        sl = _cells(model, K)[0]
        return [int(np.nonzero(sl == s)[0][(sl == s).sum() // 2]) for s in range(int(sl.max()) + 1)]
    index, lens = lay.index(K)
    out, lo = [], 0
    for n in lens:
        own = [int(k) for k in index[lo:lo + n] if k >= 0]
        lo += n
        if own:
            out.append(own[len(own) // 2])
    return out


def crafted_combine_probe(dev: Device, shape, ks: list, max_calls: int = 16):
    """The order in which the device adds its split-K slice results at ``shape`` (a
    SplitOrder; SERIAL when in slice order), read from crafted calls; None when the formats
    cannot carry the probe, it needs over ``max_calls`` calls, or the outputs are not those
    of any chain of groups (then the candidate keeps its order).

    ``ks``: one k per slice (``slice_ks``).  Output (i, j) gets slice r_i = +X*u, slice s_j =
    -X*u and every other slice u*u (one nonzero product per slice; X/u >= 2^25 * S, so a
    partial holding +-X*u absorbs any count of u*u).  Wherever the two meet, +X*u - X*u = 0
    exactly; the u*u already added to either are lost, those added later kept.  So for any
    binary combine tree the output is (S - size of the subtree where r and s meet) * u*u:
    a distance that fixes the tree (agglomeration by increasing size).  Every column that
    repeats a probe slice must agree (one order across the output tiles read)."""
    import torch
    from reference.formats import get_format
    caps, (M, N, K), S = dev.caps, shape, len(ks)
    if caps.block_scaled or S < 3:
        return None
    fa, fo = get_format(caps.a_format), get_format(caps.output)
    # X*u and u*u normal, u = 1 where the formats allow it, X/u >= 2^25 * S
    ex = min(40, math.floor(math.log2(float(fa.max_finite))) - 1)
    top = ex - 25 - math.ceil(math.log2(S))
    eu = max(math.ceil(math.log2(float(fa.min_normal))), math.ceil(math.log2(float(fo.min_normal)) / 2) + 1,
             min(0, top))
    if eu > top or -(-S // M) * -(-S // N) > max_calls:
        return None
    X, u, where = 2.0 ** ex, 2.0 ** eu, dev.torch_device
    kt = torch.tensor(ks, device=where)
    D = np.full((S, S), -1, np.int64)
    for r0 in range(0, S, M):
        refs = torch.arange(r0, min(S, r0 + M), device=where)
        for c0 in range(0, S, N):
            probes = (c0 + torch.arange(N, device=where) % min(S - c0, N)) % S
            a = torch.zeros(M, K, device=where)
            b = torch.zeros(K, N, device=where)
            a[:, kt] = u
            b[kt, :] = u
            a[torch.arange(len(refs), device=where), kt[refs]] = X
            b[kt[probes], torch.arange(N, device=where)] = -X
            got = dev.call_tensors(dev.batch_from(a, b, alpha=_unit_alpha(caps, M, N)))
            d = S - (got[:len(refs)].double() / (u * u)).cpu().numpy()
            if not _record(D, d, refs.cpu().numpy(), probes.cpu().numpy()):
                return None  # not a count, or the output tiles disagree
    return order_from_distances(D)


def _record(D: np.ndarray, d: np.ndarray, refs: np.ndarray, probes: np.ndarray) -> bool:
    """D[r, s] = D[s, r] = d[i, j] for reference r = refs[i], probe s = probes[j], r != s;
    False when a value is not an integer or two readings of one pair differ (with each
    other or with D)."""
    r, s = np.broadcast_arrays(refs[:, None], probes[None, :])
    keep = r != s
    r, s, v = r[keep], s[keep], d[keep]
    if (v != np.round(v)).any():
        return False
    v = v.astype(np.int64)
    lo, hi = D.copy(), D.copy()                 # per pair: the smallest and largest reading
    known = D >= 0
    lo[~known], hi[~known] = np.iinfo(np.int64).max, -1
    for x, y in ((r, s), (s, r)):
        np.minimum.at(lo, (x, y), v)
        np.maximum.at(hi, (x, y), v)
    seen = hi >= 0
    if (lo[seen] != hi[seen]).any():
        return False
    D[seen] = hi[seen]
    return True


def order_from_distances(D: np.ndarray):
    """The SplitOrder whose combine tree has these meeting sizes (D[r, s]: leaves of the
    smallest subtree holding r and s; -1 unknown: every merge must be witnessed by a known
    pair), SERIAL for slice order; None when no chain of groups has them."""
    from reference.schedule import SplitOrder, SplitReduce
    S = len(D)
    off = np.delete(D.reshape(-1), np.arange(0, S * S, S + 1))
    if ((off >= 0) & (off < 2)).any():
        return None
    node = {i: i for i in range(S)}                 # union-find root -> subtree
    root = list(range(S))

    def find(x):
        while root[x] != x:
            x = root[x]
        return x
    for d, r, s in sorted((int(D[r, s]), r, s) for r in range(S) for s in range(r + 1, S) if D[r, s] >= 0):
        a, b = find(r), find(s)
        if a == b:
            continue
        sub = (node[a], node[b])
        if _leaves(sub) != d:
            return None                             # not a tree with these sizes
        root[b], node[a] = a, sub
    if len({find(i) for i in range(S)}) != 1:
        return None                                 # too few pairs known to join them all
    groups = _chain(node[find(0)])
    if groups is None:
        return None
    while len(groups) > 1 and len(groups[1]) == 1:  # leading singles: one group, same adds
        groups = [groups[0] + groups[1]] + groups[2:]
    if [g for grp in groups for g in grp] == list(range(S)) and all(len(g) == 1 for g in groups[1:]):
        return SplitReduce.SERIAL
    return SplitOrder(tuple(groups))


def _leaves(t) -> int:
    return 1 if isinstance(t, int) else _leaves(t[0]) + _leaves(t[1])


def _group(t):
    """A subtree as one group ((a + b) + c ...: every right child a leaf), else None."""
    if isinstance(t, int):
        return (t,)
    left, right = t if isinstance(t[1], int) else (t[1], t[0])
    if not isinstance(right, int):
        return None
    g = _group(left)
    return None if g is None else g + (right,)


def _chain(t):
    """A tree as a chain of groups (the larger child continues the chain), else None."""
    if isinstance(t, int):
        return [(t,)]
    a, b = sorted(t, key=_leaves, reverse=True)
    for rest, grp in ((a, b), (b, a)):
        g = _group(grp)
        if g is not None:
            c = _chain(rest)
            if c is not None:
                return c + [g]
    return None


def rank_by_probe(cands: list, K: int, zero: dict | None) -> list:
    """``cands`` ordered by agreement with the crafted probe's zeros (predicted from each
    candidate's slices and groups), stable: a probe that says nothing keeps the order."""
    if not zero:
        return list(cands)
    ps = np.array(sorted(zero))
    obs = np.array([zero[p] for p in ps])
    qs = np.array([_probe_q(int(p), K) for p in ps])

    def score(m):
        # s*s is absorbed (output 0) when it joins -X*X before +X*X does: in p's group, with
        # 0 in another group; or in p's slice, with 0 in another slice (slices meet last)
        try:
            sl, gr = _cells(m, K)
        except ValueError:
            return -1
        pred = ((gr[ps] == gr[qs]) & (gr[0] != gr[ps])) | ((sl[0] != sl[ps]) & (sl[ps] == sl[qs]))
        return int((pred == obs).sum())
    sc = [score(m) for m in cands]
    order = sorted(range(len(cands)), key=lambda i: -sc[i])
    return [cands[i] for i in order]


def _sample(M: int, N: int, outputs: int, g, device: str):
    """Sorted random rows and columns, about ``outputs`` outputs together."""
    import torch
    m = min(M, max(SCREEN[-1], math.isqrt(max(outputs, 1))))
    n = min(N, max(SCREEN[-1], -(-outputs // m)))
    cpu = torch.Generator().manual_seed(int(torch.randint(0, 1 << 62, (1,), generator=g, device=device)))
    r = torch.randperm(M, generator=cpu)[:m].sort().values
    c = torch.randperm(N, generator=cpu)[:n].sort().values
    return r.to(device), c.to(device)


def _np(t):
    return None if t is None else t.detach().cpu().double().numpy()


def _simulate(model, sub: Batch, block) -> np.ndarray:
    alpha = None
    if sub.alpha is not None:
        alpha = tuple(x if isinstance(x, float) else _np(x) for x in sub.alpha)
    return simulate_gemm(model, _np(sub.a), _np(sub.b), scales_a=_np(sub.scales_a),
                         scales_b=_np(sub.scales_b), block=block, alpha=alpha)


def _emulate(model, sub: Batch, block):
    from fp4ref.gemm import emulate
    from fp4ref.native import alpha_factors
    return emulate(model, sub.a, sub.b, scales_a=sub.scales_a, scales_b=sub.scales_b,
                   block=block if sub.scales_a is not None else None, alpha=alpha_factors(sub.alpha))


def _same(x, y) -> int:
    """Outputs equal bit for bit (float32 patterns; NaN equals NaN)."""
    import torch
    x, y = x.float().contiguous(), y.float().contiguous()
    eq = (x.view(torch.int32) == y.view(torch.int32)) | (torch.isnan(x) & torch.isnan(y))
    return int(eq.sum())


def layout_candidates(device_name: str, kernels, K: int, output: str, predicted: int | None = None,
                      sms: int | None = None) -> list:
    """(model, KLayout or None[, TileSchedule]) candidates of the kernel rows (probes.kernels)
    for ``kernels``: every schedule each row's kernel may run at length K (``row_layouts``),
    led by the row's per-tile schedule where it has one (``row_tiles``; ``sms``: the device's
    SM count); [] without rows.  Rows that keep K in order give (model, None)."""
    try:
        from .kernels import kernel_models, row_layouts, row_tiles
    except ImportError:
        return []
    out = []
    for row in kernel_models(device_name, list(kernels)):
        tiles = row_tiles(row, kernels, K, sms)
        if tiles is not None:
            out.append((row.gemm_model.replace(output=output), None,
                        dataclasses.replace(tiles, model=tiles.model.replace(output=output))))
        out += [(model.replace(output=output), lay) for lay, model in row_layouts(row, K, predicted)]
    return out


def _lanes_kernel(device_name: str, kernels) -> bool:
    from .kernels import kernel_models
    return any(r.lanes for r in kernel_models(device_name, list(kernels)))


def predicted_first(cands: list, split: int | None) -> list:
    """``cands`` with those of ``split`` split-K slices first (stable): the library's own
    prediction (cublaslt_heuristic) tried before the rest, never instead of it."""
    if not split:
        return cands

    def slices(c):  # the count the library launches with: a layout's, before empty slices drop
        m, lay, _ = schedule_parts(c)
        return lay.split_k if lay is not None else m.split_k or 1
    return sorted(cands, key=lambda c: slices(c) != split)


def heuristic_split(device_name: str, shape) -> int | None:
    """cuBLASLt's predicted split-K slice count at ``shape`` (None: no prediction; the sm_90
    kernels report no split attribute, 2**32 - 1)."""
    s = cublaslt_heuristic(device_name, shape).get("split_k")  # {"error"} for other devices
    return s if isinstance(s, int) and 1 <= s < 1 << 16 else None


def _reordered(dev: Device, shape, cand):
    """``cand`` with its split-K slice results added in the order the device adds them
    (``crafted_combine_probe``), or None: not a serial split of 3 or more slices, or the
    device adds them in slice order, or the probe cannot tell."""
    from reference.schedule import SplitReduce
    model, lay, tiles = schedule_parts(cand)
    if tiles is not None or model.split_k < 3 or model.split_reduce is not SplitReduce.SERIAL:
        return None
    ks = slice_ks(cand, shape[2])
    if len(ks) != model.split_k:
        return None
    try:
        order = crafted_combine_probe(dev, shape, ks)
    except DeviceError:
        return None
    if order is None or order is SplitReduce.SERIAL:
        return None
    return model.replace(split_reduce=order) if lay is None else (model.replace(split_reduce=order), lay)


def _padded(b: Batch, lay) -> Batch:
    if lay is None:
        return b
    a2, b2 = lay.pad(b.a, b.b)
    return Batch(a2, b2, b.scales_a, b.scales_b, b.alpha, None, b.kind)


def _predict(c, x: Batch, rows, cols, shape, block, run):
    """A candidate's outputs at ``x`` (the batch's rows x cols of an M x N x K result):
    ``run`` (the simulator or the emulator) on the candidate's operands in each of its K
    orders (fp4ref.native.run_schedule)."""
    return run_schedule(c, lambda lay, m: run(m, _padded(x, lay), block), shape,
                        _np(rows).astype(np.int64), _np(cols).astype(np.int64))


def _search(cands: list, sub: Batch, want, caps, t_end: float, rows, cols, shape) -> tuple:
    """(candidate, matches): the first candidate (a model, or a (model, KLayout[,
    TileSchedule]) tuple) that passes both simulator screens and the emulated confirmation
    on every sampled output (``rows`` x ``cols`` of ``shape``); else the best confirmed one;
    else (None, -1).  Stops at ``t_end``."""
    screens = [(sub.sub(slice(0, w), slice(0, w)), output_bits(_np(want[:w, :w]), caps.output), rows[:w], cols[:w])
               for w in SCREEN]
    best, best_n = None, -1
    for c in cands:
        if time.perf_counter() > t_end:
            break
        if not all(np.array_equal(_predict(c, x, r, q, shape, caps.block, _simulate), k) for x, k, r, q in screens):
            continue
        n = _same(_predict(c, sub, rows, cols, shape, caps.block, _emulate), want)
        if n > best_n:
            best, best_n = c, n
        if n == want.numel():
            break
    return best, best_n


def explain_shape(dev: Device, shape, *, base_model: GemmModel, table: ScheduleTable | None = None,
                  seed: int = 0, outputs: int = 4096, extra_models=(), budget_s: float = 60.0,
                  kind: str = "normal", batch: Batch | None = None, native=None) -> ShapeSchedule:
    """The schedule ``dev`` runs at ``shape`` = (M, N, K).

    A ``table`` hit is returned as is (source "table").  Else: one random batch at exactly
    this shape, one native call, one profiled call (kernel names), one to a few crafted
    calls (``crafted_split_probe``: where K is cut) that rank the candidates
    (``base_model``, ``extra_models``, the kernel hints, each with its split-K schedules);
    each is screened on 4 x 4 and 16 x 16 outputs by the numpy simulator, the first
    survivor confirmed on ``outputs`` sampled outputs by fp4ref.gemm.emulate.  When none is
    exact, the best and the first three candidates (split-K of 3 or more slices, added in
    order) are tried again with the order the device adds its slices in
    (``crafted_combine_probe``, a few more calls).  No candidate
    confirmed: the best confirmed one (most matches; else the base model) is returned with
    ``exact`` False.  The result is added to ``table``.

    Cost: the device calls (milliseconds on a GPU), per screened candidate two simulator
    runs of K steps (~0.2-0.4 s at K = 16k for the FMA-width-16/32 models, ~3 s for a
    sequential FP32 model), one emulation of the confirmed outputs (launch-bound on CUDA:
    ~3.5 s for 4096 outputs at K = 16k before the emulator speed-up).  Target: under 2 s per
    shape on the H200 when the base model or a split of it fits and ranks first; met at
    moderate K, not yet at K near 16k (the confirmation dominates).  ``budget_s`` bounds
    the search.  A shape the library refuses raises DeviceError (the library's message).
    ``batch`` (and its ``native`` outputs): a random batch at this shape the caller already
    has (Device.draw), used instead of drawing one."""
    import torch
    t0 = time.perf_counter()
    shape = tuple(int(x) for x in shape)
    if len(shape) != 3 or min(shape) < 1:
        raise ValueError(f"shape: expected (M, N, K), three integers >= 1, got {shape!r}")
    if not isinstance(base_model, GemmModel):
        raise TypeError(f"base_model: expected a reference.gemm.GemmModel, got {type(base_model).__name__}")
    if table is not None:
        hit = table.lookup(dev.name, shape)
        if hit is not None:
            return hit.replace(source="table")
    M, N, K = shape
    g = torch.Generator(device=dev.torch_device).manual_seed(int(seed))
    if batch is None:
        batch = dev.draw(M, N, K, g, kind)
    elif batch.shape != shape:
        raise ValueError(f"batch: shape {batch.shape} differs from shape {shape}")
    got = dev.call_tensors(batch) if native is None else native
    kernels = dev.kernels(batch)
    hints, family = kernel_hints(dev.name, kernels)
    out_fmt = dev.caps.output
    bases = [base_model.replace(output=out_fmt)] + [m.replace(output=out_fmt) for m in (*extra_models, *hints)]
    cands = candidate_models(bases, K, dev.caps.block)
    try:
        zero = crafted_split_probe(dev, shape, boundary_positions(cands, K, 16 * min(M, N, 64)))
    except DeviceError:
        zero = None
    cands = rank_by_probe(cands, K, zero)
    # cuBLASLt's heuristic describes its GEMM algorithms, not the gemv / dot kernels cuBLAS
    # runs at M = 1 or N = 1 (their rows keep lanes, not a split count)
    predicted = None if _lanes_kernel(dev.name, kernels) else heuristic_split(dev.name, shape)
    env = environment_key(dev.name)
    if dev.caps.block is None:  # the kernel rows' K orders come first: the most specific answer
        cands = layout_candidates(dev.name, kernels, K, out_fmt, predicted, env.get("sm_count")) + cands
    cands = predicted_first(cands, predicted)
    r, c = _sample(M, N, outputs, g, batch.a.device)
    sub, want = batch.sub(r, c), got[r][:, c]
    best, best_n = _search(cands, sub, want, dev.caps, t0 + budget_s, r, c, shape)
    if best is None:  # nothing passed the screens: report how well the first candidate does
        best = cands[0] if cands else bases[0].replace(split_k=1, split_tile=None)
        best_n = _same(_predict(best, sub, r, c, shape, dev.caps.block, _emulate), want)
    if best_n < want.numel():  # the slices may be right and their combine order not:
        seen, again = set(), []     # the best and the crafted probe's first candidates, reordered
        for cand in [best] + cands[:3]:
            x = None if cand is None or repr(cand) in seen else _reordered(dev, shape, cand)
            seen.add(repr(cand))
            again += [x] if x is not None else []
        t_end = max(t0 + budget_s, time.perf_counter() + budget_s / 3)  # its own share
        b2, n2 = _search(again, sub, want, dev.caps, t_end, r, c, shape)
        if n2 > best_n:
            best, best_n = b2, n2
    model, lay, tiles = schedule_parts(best)
    if tiles is not None and not tiles.active(M, N, K):
        tiles = None  # no tile of this shape runs in segments
    entry = ShapeSchedule(dev.name, shape, model, tuple(kernels), family, "probe", int(want.numel()),
                          best_n, time.perf_counter() - t0, dev.caps.block, env,
                          layout=lay, predicted_split=predicted, tiles=tiles)
    if table is not None:
        table.add(entry)
    return entry


def probe_shape(device, shape, *, table: ScheduleTable) -> ShapeSchedule:
    """fp4ref.native's shape prober: explain ``shape`` on ``device`` with the models the
    table already records for it as the base (most shapes first)."""
    if not isinstance(device, Device):
        raise TypeError(f"device: expected a probes.device.Device to probe, got {type(device).__name__}")
    models = table.models(device.name)
    if not models:
        raise ValueError(f"device: {device.name} has no model in this table to start from; run "
                         f"`fp4ref explain {device.name} --shape M,N,K` once (it starts from the "
                         "baseline report's model)")
    return explain_shape(device, shape, base_model=models[0], extra_models=models[1:], table=table)


register_shape_prober(probe_shape)


# --- stretch: cuBLASLt's own heuristic (issue 13), read through ctypes --------------------------
# Enum values from cublasLt.h / library_types.h (CUDA 12).  torch.mm's default cuBLAS path
# (cublasGemmEx) need not pick what cublasLtMatmulAlgoGetHeuristic describes, so a prediction
# read here is only ever compared with the probed schedule, never used in its place.
_LT_TYPES = {  # device -> (compute type, A/B data type, C/D data type)
    "cuda-cublas-bfloat16": (68, 14, 0), "cuda-cublas-float16": (68, 2, 0),
    "cuda-cublas-tf32": (77, 0, 0), "cuda-cublas-fp32": (68, 0, 0)}


def cublaslt_heuristic(device_name: str, shape, *, workspace: int = 32 << 20) -> dict:
    """cuBLASLt's first heuristic algorithm for torch.mm's call at ``shape`` (row-major
    A [M, K] @ B [K, N], i.e. column-major C^T = B^T A^T): {"split_k", "algo_id", "tile_id",
    "reduction_scheme", "workspace"}, or {"error": why} (no library, a device it does not
    describe, a failing call).  Never raises."""
    if device_name not in _LT_TYPES:
        return {"error": f"no cuBLASLt description for {device_name} (only {', '.join(_LT_TYPES)})"}
    try:
        return _lt_query(_LT_TYPES[device_name], tuple(int(x) for x in shape), workspace)
    except Exception as e:  # a missing library or symbol: no prediction, the probe decides
        return {"error": f"{type(e).__name__}: {e}"}


def _lt_query(types, shape, workspace) -> dict:
    import ctypes as C
    from fp4ref.native import cublaslt_library
    lib = cublaslt_library()
    if lib is None:
        return {"error": "libcublasLt not found"}

    class Algo(C.Structure):
        _fields_ = [("data", C.c_uint64 * 8)]

    class Result(C.Structure):
        _fields_ = [("algo", Algo), ("workspaceSize", C.c_size_t), ("state", C.c_int),
                    ("wavesCount", C.c_float), ("reserved", C.c_int * 4)]

    def ok(status, what):
        if status != 0:
            raise RuntimeError(f"{what} returned cuBLAS status {status}")
    M, N, K = shape
    compute, ab, cd = types
    h, desc, pref = C.c_void_p(), C.c_void_p(), C.c_void_p()
    ok(lib.cublasLtCreate(C.byref(h)), "cublasLtCreate")
    ok(lib.cublasLtMatmulDescCreate(C.byref(desc), C.c_int(compute), C.c_int(0)), "MatmulDescCreate")
    for attr in (3, 4):  # TRANSA, TRANSB: CUBLAS_OP_N
        ok(lib.cublasLtMatmulDescSetAttribute(desc, C.c_int(attr), C.byref(C.c_int32(0)), C.c_size_t(4)),
           "MatmulDescSetAttribute")
    lay = []
    for dt, rows, cols, ld in ((ab, N, K, N), (ab, K, M, K), (cd, N, M, N), (cd, N, M, N)):
        x = C.c_void_p()
        ok(lib.cublasLtMatrixLayoutCreate(C.byref(x), C.c_int(dt), C.c_uint64(rows), C.c_uint64(cols),
                                          C.c_int64(ld)), "MatrixLayoutCreate")
        lay.append(x)
    ok(lib.cublasLtMatmulPreferenceCreate(C.byref(pref)), "PreferenceCreate")
    ok(lib.cublasLtMatmulPreferenceSetAttribute(pref, C.c_int(1), C.byref(C.c_uint64(workspace)),
                                                C.c_size_t(8)), "PreferenceSetAttribute")
    res, n = (Result * 1)(), C.c_int(0)
    ok(lib.cublasLtMatmulAlgoGetHeuristic(h, desc, *lay, pref, C.c_int(1), res, C.byref(n)),
       "MatmulAlgoGetHeuristic")
    if n.value < 1:
        return {"error": "the heuristic returned no algorithm"}

    def cfg(attr):
        v, w = C.c_uint32(0), C.c_size_t(0)
        ok(lib.cublasLtMatmulAlgoConfigGetAttribute(C.byref(res[0].algo), C.c_int(attr), C.byref(v),
                                                    C.c_size_t(4), C.byref(w)), "AlgoConfigGetAttribute")
        return int(v.value)
    return {"split_k": cfg(2), "algo_id": cfg(0), "tile_id": cfg(1), "reduction_scheme": cfg(3),
            "workspace": int(res[0].workspaceSize)}
