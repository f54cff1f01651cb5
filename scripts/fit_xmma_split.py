"""Fit the split-K schedule of sm80_xmma FFMA 32x128x8 at 26x1402x11025 (H200 dump).

Fast exact emulator: each slice an FP32 FMA chain (exact product, one RNE rounding per step),
slice results combined by FP32 RNE adds in a given order.  Usage:
  PYTHONPATH=/work/main /work/main/.venv/bin/python scripts/fit_xmma_split.py [npz] [key] [what]
what: interleave (S 1..128 x W 1..128, slice-order/reverse/tree/pairwise combine), contig,
      witness (any-order test per S), structured, buffers, twolevel, onemove, anneal, columns,
      controls.
Finding (H200 dump 26x1402x11025, 128 outputs): the slice partials are interleaved W=8, S=48
(every output is some serial order of them: 128/128, median random-order hit rate 0.16 vs
<= 0.03 for S=47/49/24/32/64/96), but no serial order of them fits (slice order 24/128, best
structured 43/128, best single annealed order ~60/128).  Session 16 read the order with crafted
operands (scripts/gpu_xmma_order.py, probes.explain.crafted_combine_probe): it is not a serial
permutation but a chain of groups, 0+24+47,1+25,...,22+46,23, the same in every tile and run,
which fits every output (reference.schedule.SplitOrder; tests/test_split_order.py).
"""
import sys, itertools
import numpy as np

NPZ = sys.argv[1] if len(sys.argv) > 1 else "/tmp/dumps15c/xmma.npz"
KEY = sys.argv[2] if len(sys.argv) > 2 else "cuda-cublas-fp32|26x1402x11025"


def load():
    d = np.load(NPZ, allow_pickle=True)
    a = d[KEY + "|a"].astype(np.float32)
    b = d[KEY + "|b"].astype(np.float32)
    out = d[KEY + "|out"].astype(np.float32)
    return a, b, out


def fma32(acc, p):
    """round32(acc + p) exactly: acc float64 holding fp32 values, p exact float64 products."""
    s = acc + p
    bb = s - acc
    e = (acc - (s - bb)) + (p - bb)          # TwoSum error: acc + p = s + e exactly
    r = s.astype(np.float32)
    rd = r.astype(np.float64)
    bad = (e != 0) & (rd != s)
    if bad.any():
        # s may be an fp32 midpoint: then the sign of e decides
        toward = np.nextafter(r, np.where(s > rd, np.float32(np.inf), np.float32(-np.inf)).astype(np.float32))
        mid = bad & ((rd + toward.astype(np.float64)) == 2 * s)
        if mid.any():
            # true value = s + e; choose r if e points toward r, else toward
            go = mid & (np.sign(e) == np.sign(s - rd))
            r = np.where(go, toward, r)
    return r.astype(np.float64)


def add32(x, y):
    return fma32(x, y)  # x, y fp32 values: x + y exact in float64 anyway


def chains(P, slices):
    """P [n, K] exact products; slices: list of index arrays (order within each).  Returns
    [n, S] fp32 results of each slice's FMA chain from +0."""
    S = len(slices)
    L = max(len(s) for s in slices)
    idx = np.full((S, L), -1, np.int64)
    for i, s in enumerate(slices):
        idx[i, :len(s)] = s
    Pz = np.concatenate([P, np.zeros((P.shape[0], 1))], 1)
    G = Pz[:, idx]  # [n, S, L]; -1 -> last column (zero)
    acc = np.zeros(G.shape[:2])
    for t in range(L):
        acc = fma32(acc, G[:, :, t])
    return acc


def combine(v, mode):
    n = v.shape[1]
    v = [v[:, i].copy() for i in range(n)]
    if mode == "serial":
        r = v[0]
        for i in range(1, n):
            r = add32(r, v[i])
        return r
    if mode == "serial0":  # memset 0 then C += slice, in order (same as serial except -0)
        r = np.zeros_like(v[0])
        for i in range(n):
            r = add32(r, v[i])
        return r
    if mode == "reverse":
        r = v[-1]
        for i in range(n - 2, -1, -1):
            r = add32(r, v[i])
        return r
    if mode == "tree":
        while n > 1:
            h = (n + 1) // 2
            for i in range(n - h):
                v[i] = add32(v[i], v[i + h])
            n = h
        return v[0]
    if mode == "pairwise":
        def walk(lo, k):
            if k == 1:
                return v[lo]
            h = k // 2
            return add32(walk(lo, h), walk(lo + h, k - h))
        return walk(0, n)
    raise ValueError(mode)


def interleaved(K, W, S, partial_first=False):
    starts = list(range(0, K, W))
    tiles = [np.arange(t, min(t + W, K)) for t in starts]
    if partial_first and K % W:
        # partial tile first: tiles cut from the end
        r = K % W
        tiles = [np.arange(0, r)] + [np.arange(t, t + W) for t in range(r, K, W)]
    return [np.concatenate(tiles[s::S]) if tiles[s::S] else np.zeros(0, np.int64) for s in range(S)]


def contiguous(K, S, align):
    per = -(-K // S)
    per = -(-per // align) * align
    return [np.arange(s * per, min(K, (s + 1) * per)) for s in range(S) if s * per < K]


def main():
    a, b, out = load()
    K = a.shape[1]
    P = (a.astype(np.float64)[:, None, :] * b.T.astype(np.float64)[None, :, :]).reshape(-1, K)
    want = out.reshape(-1).view(np.uint32)
    n = want.size
    modes = ["serial", "reverse", "tree", "pairwise"]

    def score(slices, tag):
        v = chains(P, slices)
        res = {}
        for m in modes:
            got = combine(v, m).astype(np.float32).view(np.uint32)
            res[m] = int((got == want).sum())
        best = max(res.values())
        return res, best

    results = []
    which = sys.argv[3] if len(sys.argv) > 3 else "interleave"
    if which == "interleave":
        for W in (8, 4, 16, 32, 1, 2, 64, 128):
            for S in range(1, 129):
                for pf in (False, True):
                    if pf and K % W == 0:
                        continue
                    res, best = score(interleaved(K, W, S, pf), None)
                    results.append((best, f"interleave W={W} S={S} partial_first={pf}", res))
                    if best >= n * 0.5:
                        print(results[-1], flush=True)
            print("done W", W, max(results)[:2], flush=True)
    elif which == "contig":
        for align in (1, 4, 8, 16, 32, 128):
            for S in range(1, 129):
                res, best = score(contiguous(K, S, align), None)
                results.append((best, f"contig align={align} S={S}", res))
                if best >= n * 0.5:
                    print(results[-1], flush=True)
            print("done align", align, max(results)[:2], flush=True)
    results.sort(key=lambda r: -r[0])
    for r in results[:15]:
        print(r)




# ---- combine-order search (S=48 interleaved W=8: the slice partials fit, the order of the adds does not)
def serial_perm(v, p):
    r = v[:, p[0]].copy()
    for j in p[1:]:
        r = add32(r, v[:, j])
    return r


def order_search(S=48, W=8, iters=20000, seed=0):
    a, b, out = load()
    K = a.shape[1]
    d = np.load(NPZ, allow_pickle=True)
    cols = d[KEY + "|cols"]
    rows = d[KEY + "|rows"]
    P = (a.astype(np.float64)[:, None, :] * b.T.astype(np.float64)[None, :, :]).reshape(-1, K)
    v = chains(P, interleaved(K, W, S)).reshape(len(rows), len(cols), S)
    want = out.astype(np.float32)
    rng = np.random.default_rng(seed)
    found = {}
    for j, c in enumerate(cols):
        vv = v[:, j, :]
        w = want[:, j].astype(np.float64)
        ulp = np.spacing(np.abs(want[:, j])).astype(np.float64)

        def cost(p):
            r = serial_perm(vv, p)
            dd = np.abs(r - w) / ulp
            return (dd != 0).sum() * 1000 + dd.sum()
        p, _, moves = _descend(cost, S, iters, rng, reach=None)
        nmatch = int(((serial_perm(vv, p).astype(np.float32)) == want[:, j]).sum())
        found[int(c)] = (nmatch, p)
        print(f"col {c} (tile {c // 32}): {nmatch}/8 after {moves} moves; order {p}", flush=True)
    return found


def _order_cost(S, W):
    """cost(order) of adding the S interleaved W-wide slices' results in ``order``: 1000 per
    output off, plus the ulps off (capped at 50 each)."""
    a, b, out = load()
    K = a.shape[1]
    P = (a.astype(np.float64)[:, None, :] * b.T.astype(np.float64)[None, :, :]).reshape(-1, K)
    v = chains(P, interleaved(K, W, S))
    w = out.reshape(-1).astype(np.float64)
    ulp = np.spacing(np.abs(out.reshape(-1))).astype(np.float64)

    def cost(p):
        dd = np.abs(serial_perm(v, p) - w) / ulp
        return (dd != 0).sum() * 1000 + np.minimum(dd, 50).sum()
    return cost


def global_order_search(S=48, W=8, iters=20000, seed=0, start=None):
    """One combine order for all outputs (a fixed lock order): insertion-move descent."""
    p, cb, _ = _descend(_order_cost(S, W), S, iters, np.random.default_rng(seed), start, log=True)
    return p, cb


def _descend(cost, S, iters, rng, start=None, log=False, reach=6):
    """(order, cost, moves): insertion moves (of <= ``reach`` places; None: anywhere) kept
    while the cost does not grow."""
    p = list(range(S)) if start is None else list(start)
    cb, it = cost(p), -1
    for it in range(iters):
        if cb == 0:
            break
        q = p.copy()
        i = rng.integers(S)
        k = rng.integers(S) if reach is None else int(np.clip(i + rng.integers(-reach, reach + 1), 0, S - 1))
        q.insert(k, q.pop(i))
        cq = cost(q)
        if cq <= cb:
            p, cb = q, cq
        if log and it % 2000 == 0:
            print(it, cb // 1000, p, flush=True)
    return p, cb, it + 1


def column_order_search(S=48, W=8, iters=8000, seed=0, groups=None):
    """One combine order per output column group (a CTA tile: outputs sharing cuBLAS's
    32-wide m-tile of torch's N), near slice order: insertion moves of <= 6 places."""
    a, b, out = load()
    K = a.shape[1]
    d = np.load(NPZ, allow_pickle=True)
    cols = d[KEY + "|cols"]
    P = (a.astype(np.float64)[:, None, :] * b.T.astype(np.float64)[None, :, :]).reshape(-1, K)
    v = chains(P, interleaved(K, W, S)).reshape(out.shape[0], out.shape[1], S)
    if groups is None:
        groups = {}
        for j, c in enumerate(cols):
            groups.setdefault(int(c) // 32, []).append(j)
    rng = np.random.default_rng(seed)
    total = 0
    res = {}
    for g, js in groups.items():
        vv = v[:, js, :].reshape(-1, S)
        wf = out[:, js].reshape(-1)
        w = wf.astype(np.float64)
        ulp = np.spacing(np.abs(wf)).astype(np.float64)

        def cost(p):
            dd = np.abs(serial_perm(vv, p) - w) / ulp
            return (dd != 0).sum() * 1000 + np.minimum(dd, 50).sum()
        c0 = cost(list(range(S))) // 1000
        p, cb, moves = _descend(cost, S, iters, rng)
        n = len(wf)
        m = n - int(cb // 1000)
        total += m
        disp = int(np.abs(np.array(p) - np.arange(S)).sum())
        res[g] = p
        print(f"tile {g} cols {[int(cols[j]) for j in js]}: serial {n - c0}/{n} -> {m}/{n} "
              f"(moves {moves}, displacement {disp}) {p}", flush=True)
    print("total", total)
    return res


def structured_orders(S=48, W=8):
    """Structured combine schedules of the S interleaved slice partials."""
    a, b, out = load()
    K = a.shape[1]
    P = (a.astype(np.float64)[:, None, :] * b.T.astype(np.float64)[None, :, :]).reshape(-1, K)
    v = chains(P, interleaved(K, W, S))
    want = out.reshape(-1).view(np.uint32)

    def sc(r):
        return int((r.astype(np.float32).view(np.uint32) == want).sum())
    res = []
    for r in range(S):
        res.append((sc(serial_perm(v, [(r + i) % S for i in range(S)])), f"rotate {r}"))
        res.append((sc(serial_perm(v, [(r - i) % S for i in range(S)])), f"rotate-reverse {r}"))
    for g in [d for d in range(2, S) if S % d == 0]:
        for inner in ("serial", "reverse", "tree", "pairwise"):
            for outer in ("serial", "reverse", "tree", "pairwise"):
                # contiguous groups of g
                parts = np.stack([combine(v[:, i:i + g], inner) for i in range(0, S, g)], 1)
                res.append((sc(combine(parts, outer)), f"contig groups g={g} inner={inner} outer={outer}"))
                # strided groups: group i = slices i, i+S/g*?  (slice s in group s % (S//g))
                ng = S // g
                parts = np.stack([combine(v[:, i::ng], inner) for i in range(ng)], 1)
                res.append((sc(combine(parts, outer)), f"strided groups size={g} inner={inner} outer={outer}"))
    res.sort(key=lambda t: -t[0])
    for t in res[:15]:
        print(t)
    return res


def two_level(Zs=range(1, 97), As=(2, 3, 4, 8), W=8, modes=("tile", "elem", "half")):
    """Z grid slices (tiles dealt round robin) x A accumulators inside each CTA: 'tile': the
    CTA's j-th tile goes to accumulator j % A; 'elem': element k of each tile to (k % W) % A;
    'half': the CTA's tiles cut into A contiguous runs.  Accumulators summed (serial/tree/
    reverse), then slices serially."""
    a, b, out = load()
    K = a.shape[1]
    P = (a.astype(np.float64)[:, None, :] * b.T.astype(np.float64)[None, :, :]).reshape(-1, K)
    want = out.reshape(-1).view(np.uint32)
    best = []
    for Z in Zs:
        base = interleaved(K, W, Z)
        for A in As:
            for mode in modes:
                slices = []
                for s in base:
                    if mode == "tile":
                        tiles = [s[i:i + W] for i in range(0, len(s), W)]
                        subs = [np.concatenate(tiles[q::A]) if tiles[q::A] else np.zeros(0, np.int64) for q in range(A)]
                    elif mode == "elem":
                        subs = [s[(s % W) % A == q] for q in range(A)]
                    else:
                        nt = -(-len(s) // W)
                        per = -(-nt // A) * W
                        subs = [s[q * per:(q + 1) * per] for q in range(A)]
                    slices.extend(subs)
                v = chains(P, slices)
                n = v.shape[1] // A
                for inner in ("serial", "reverse", "tree"):
                    parts = np.stack([combine(v[:, i * A:(i + 1) * A], inner) for i in range(n)], 1)
                    for outer in ("serial", "reverse"):
                        m = int((combine(parts, outer).astype(np.float32).view(np.uint32) == want).sum())
                        best.append((m, f"Z={Z} A={A} {mode} inner={inner} outer={outer}"))
                        if m >= 64:
                            print(best[-1], flush=True)
        if Z % 8 == 0:
            print("Z", Z, max(best), flush=True)
    best.sort(key=lambda t: -t[0])
    for t in best[:15]:
        print(t)


def buffers(S=48, W=8):
    """Slice z added (serially, in z order) into buffer z % B; buffers then combined."""
    a, b, out = load()
    K = a.shape[1]
    P = (a.astype(np.float64)[:, None, :] * b.T.astype(np.float64)[None, :, :]).reshape(-1, K)
    v = chains(P, interleaved(K, W, S))
    want = out.reshape(-1).view(np.uint32)
    res = []
    for B in range(1, S + 1):
        for inner in ("serial", "reverse", "tree", "pairwise"):
            parts = np.stack([combine(v[:, i::B], inner) for i in range(B)], 1)
            for outer in ("serial", "reverse", "tree", "pairwise"):
                res.append((int((combine(parts, outer).astype(np.float32).view(np.uint32) == want).sum()),
                            f"B={B} inner={inner} outer={outer}"))
        # contiguous buffers: slices cut into B runs
        for inner in ("serial", "tree"):
            cuts = np.array_split(np.arange(S), B)
            parts = np.stack([combine(v[:, c], inner) for c in cuts], 1)
            for outer in ("serial", "tree", "pairwise"):
                res.append((int((combine(parts, outer).astype(np.float32).view(np.uint32) == want).sum()),
                            f"contig B={B} inner={inner} outer={outer}"))
    res.sort(key=lambda t: -t[0])
    for t in res[:12]:
        print(t)


def any_order(parts, NP=600, seed=0):
    """(outputs matched by some of NP random serial orders, mean match rate)."""
    _, _, out = load()
    want = out.reshape(-1).view(np.uint32)
    rng = np.random.default_rng(seed)
    n = parts.shape[1]
    hit = np.zeros(want.size, bool)
    fr = 0.0
    for t in range(NP):
        m = serial_perm(parts, rng.permutation(n)).astype(np.float32).view(np.uint32) == want
        hit |= m
        fr += m.mean()
    return int(hit.sum()), fr / NP


def pair_tests():
    a, b, out = load()
    K = a.shape[1]
    P = (a.astype(np.float64)[:, None, :] * b.T.astype(np.float64)[None, :, :]).reshape(-1, K)
    v = chains(P, interleaved(K, 8, 48))
    cands = {
        "48 slices": v,
        "24 pairs (i, i+24) serial": np.stack([add32(v[:, i], v[:, i + 24]) for i in range(24)], 1),
        "24 pairs (2i, 2i+1)": np.stack([add32(v[:, 2 * i], v[:, 2 * i + 1]) for i in range(24)], 1),
        "S=24 interleaved": chains(P, interleaved(K, 8, 24)),
        "16 triples (i, i+16, i+32)": np.stack([add32(add32(v[:, i], v[:, i + 16]), v[:, i + 32]) for i in range(16)], 1),
    }
    for k, c in cands.items():
        print(k, any_order(c), flush=True)


def one_move(S=48, W=8):
    """Serial slice order with one slice moved (insertion): which outputs does each fit, and
    does one move fit all 8 rows of a column (one CTA tile)?"""
    a, b, out = load()
    K = a.shape[1]
    P = (a.astype(np.float64)[:, None, :] * b.T.astype(np.float64)[None, :, :]).reshape(-1, K)
    v = chains(P, interleaved(K, W, S))
    want = out.reshape(-1).view(np.uint32)
    R, C = out.shape
    anyhit = np.zeros(want.size, bool)
    colfull = {}
    for i in range(S):
        for k in range(S):
            if i == k:
                continue
            p = list(range(S))
            p.insert(k, p.pop(i))
            m = (serial_perm(v, p).astype(np.float32).view(np.uint32) == want)
            anyhit |= m
            mc = m.reshape(R, C).sum(0)
            for c in np.nonzero(mc == R)[0]:
                colfull.setdefault(int(c), []).append((i, k))
    print("outputs fit by serial or one move:", int(anyhit.sum()), "/", want.size)
    print("columns fit fully by one move:", {c: l[:4] for c, l in colfull.items()})


def anneal_global(S=48, W=8, iters=60000, seed=0, T0=3000.0):
    cost = _order_cost(S, W)
    rng = np.random.default_rng(seed)
    p = list(range(S))
    cc = cost(p)
    best = (cc, p)
    for it in range(iters):
        T = T0 * (1 - it / iters) + 1
        q = p.copy()
        i, k = rng.integers(S), rng.integers(S)
        q.insert(k, q.pop(i))
        cq = cost(q)
        if cq <= cc or rng.random() < np.exp((cc - cq) / T):
            p, cc = q, cq
            if cc < best[0]:
                best = (cc, p)
        if it % 10000 == 0:
            print(it, cc // 1000, best[0] // 1000, flush=True)
    print("best misses", best[0] // 1000, best[1])
    return best


def witness(Ss=(48, 47, 49, 24, 32, 64, 96), W=8, NP=5000, seed=0):
    """For each S: how many outputs some random serial order of the S interleaved slice
    partials reproduces (NP orders, the same for every output), and the mean hit rate."""
    a, b, out = load()
    K = a.shape[1]
    P = (a.astype(np.float64)[:, None, :] * b.T.astype(np.float64)[None, :, :]).reshape(-1, K)
    want = out.reshape(-1).view(np.uint32)
    for S in Ss:
        v = chains(P, interleaved(K, W, S))
        rng = np.random.default_rng(seed)
        first = np.full(want.size, -1)
        rate = np.zeros(want.size)
        for t in range(NP):
            m = serial_perm(v, rng.permutation(S)).astype(np.float32).view(np.uint32) == want
            first[(first < 0) & m] = t
            rate += m
        print(f"S={S}: {int((first >= 0).sum())}/{want.size} outputs hit by some order; "
              f"per-output hit rate median {np.median(rate) / NP:.3f} min {rate.min() / NP:.4f}; "
              f"serial (slice order) {int((combine(v, 'serial').astype(np.float32).view(np.uint32) == want).sum())}",
              flush=True)


def controls_and_bias(NP=3000, seed=0):
    a, b, out = load()
    K = a.shape[1]
    P = (a.astype(np.float64)[:, None, :] * b.T.astype(np.float64)[None, :, :]).reshape(-1, K)
    want = out.reshape(-1).view(np.uint32)
    for name, sl in (("contiguous S=48 T232", contiguous(K, 48, 8)),
                     ("interleaved S=48 partial tile first", interleaved(K, 8, 48, True))):
        print(name, any_order(chains(P, sl), NP=1000))
    v = chains(P, interleaved(K, 8, 48))
    rng = np.random.default_rng(seed)
    corr_hit, corr_all = [], []
    for t in range(NP):
        p = rng.permutation(48)
        rho = np.corrcoef(np.arange(48), p)[0, 1]   # position vs slice index
        m = serial_perm(v, p).astype(np.float32).view(np.uint32) == want
        corr_hit.extend([rho] * int(m.sum()))
        corr_all.append(rho)
    print("mean rank correlation (order vs slice index) of matching orders", np.mean(corr_hit),
          "of all sampled", np.mean(corr_all))


if __name__ == "__main__":
    what = sys.argv[3] if len(sys.argv) > 3 else "interleave"
    {"interleave": main, "contig": main, "witness": witness, "structured": structured_orders,
     "buffers": buffers, "twolevel": two_level, "onemove": one_move, "anneal": anneal_global,
     "columns": column_order_search, "controls": controls_and_bias}[what]()
