"""Fit the summation order of cuBLAS's fp32 gemv kernel (``internal::gemvx::kernel<...>``, H200),
which torch.mm in fp32 (TF32 off) runs when N == 1 or M == 1.

Model found (every dumped output of /tmp/dumps15/gemv.npz bit-exact, see ``report``):
  32 FP32 FMA chains ("lanes"); K is cut into tiles of g consecutive products (the partial tile
  last), tile i goes to lane i % 32 (== fp4ref.native.interleaved(K, g, 32)); each lane is one
  FMA chain (one RNE rounding per product) in k order from +0; the 32 lane results are then
  added as a pairwise tree with halving stride (xor-shuffle butterfly 16, 8, 4, 2, 1):
  v[i] += v[i + 16] (i < 16), v[i] += v[i + 8] (i < 8), ..., result v[0]; each add FP32 RNE.
  g per dump: 1 at 1000x1x4000, 3654x1x15364, 2048x1x8192, 1x77x9000; 11 (= ceil(K/32), one
  round: contiguous blocks) at 517x1x333; 64 at 1x1500x3000.

Exact FP32 FMA on the CPU: float64 product (exact for fp32 inputs), TwoSum, round to odd, then
one rounding to float32 (correct since 53 >= 24 + 2).

Lanes are not always 32 (H200 sweep /tmp/dumps15b, ``--sweep``): the same model with T lanes
(tiles dealt to lane i % T, halving tree over T) fits 221 of 222 single-pass gemvx shapes with
(T, g) from ``gemv_layout`` / ``chunk_width`` (empirical rule, see there); gemvx followed by
cublasLt::splitKreduce_kernel (M == 1, large K, n <= 1500) is split-K and not modelled.

Usage:
  python scripts/fit_gemv.py --sweep [dump.npz ...]  # per shape: kernel, fitted (lanes, g), rule, match
  python scripts/fit_gemv.py [dump.npz ...]        # fit (default /tmp/dumps15/gemv.npz)
  python scripts/fit_gemv.py --search [dump.npz]   # the wider grid search (lanes, g, trees)
  python scripts/fit_gemv.py --dump OUT.npz        # ON A GPU (torch): sweep of gemv shapes to fit g
"""
import json
import sys

import numpy as np

F64, F32 = np.float64, np.float32
DEFAULT = '/tmp/dumps15/gemv.npz'


# ---------------------------------------------------------------- exact arithmetic
def add_exact(x, y):
    """float64 x + y (each exactly representable) rounded ONCE to float32 (RNE)."""
    s = x + y
    bb = s - x
    e = (x - (s - bb)) + (y - bb)
    bits = s.view(np.int64)
    fix = (e != 0) & ((bits & 1) == 0) & np.isfinite(s)
    if np.any(fix):  # round to odd
        s = np.where(fix, np.nextafter(s, np.where(e > 0, np.inf, -np.inf)), s)
    return s.astype(F32)


def fma32(acc, a, b):
    """fp32 fma(a, b, acc), one RNE rounding."""
    p = np.asarray(a, F32).astype(F64) * np.asarray(b, F32).astype(F64)
    return add_exact(np.asarray(acc, F32).astype(F64), p)


# ---------------------------------------------------------------- data
def load(path=DEFAULT):
    """{key: (X, Y, ref, (M, N, K), kernel)}: dot operands X, Y (n, K) of the n sampled outputs."""
    d = np.load(path, allow_pickle=True)
    meta = {m['key']: m['kernels'] for m in json.loads(str(d['meta']))} if 'meta' in d.files else {}
    keys = sorted({k.rsplit('|', 1)[0] for k in d.files if k != 'meta'})
    out = {}
    for key in keys:
        a, b, o = d[key + '|a'], d[key + '|b'], d[key + '|out']
        M, N, K = map(int, key.split('|')[1].split('x'))
        if N == 1:
            X = a; Y = np.broadcast_to(b[:, 0], a.shape); ref = o[:, 0]
        else:
            X = np.broadcast_to(a[0], (b.shape[1], K)); Y = b.T; ref = o[0]
        if key + '|out1' in d.files:
            o1 = d[key + '|out1']
            assert np.array_equal(o.view(np.int32), o1.view(np.int32)), key
        kern = ' '.join(meta.get(key, []))
        out[key] = (np.ascontiguousarray(X, F32), np.ascontiguousarray(Y, F32), np.asarray(ref, F32),
                    (M, N, K), kern)
    return out


def kernel_tag(name):
    """'T,7' etc: the gemvx template's 4th bool (op(A) = T: contiguous dots) and int."""
    import re
    m = re.search(r'gemvx::kernel<int, int, float, float, float, float, (\w+), (\w+), (\w+), (\w+), (\d+),', name)
    if m:
        return f"{'T' if m.group(3) == 'true' else 'N'},{m.group(5)}"
    return '?:' + ';'.join(k.split('(')[0][-50:] for k in name.split(' ') if k) if name else '?'


# ---------------------------------------------------------------- the model
def lane_index(K, g, lanes=32):
    """(lanes, L) product indices (-1: zero fill): tiles of g dealt round robin (partial tile
    last); == fp4ref.native.interleaved(K, g, lanes) reshaped."""
    tiles = np.arange(K) // g
    owner = tiles % lanes
    rows = [np.flatnonzero(owner == t) for t in range(lanes)]
    L = max(len(r) for r in rows)
    return np.stack([np.concatenate([r, np.full(L - len(r), -1)]) for r in rows])


def lane_partials(X, Y, index, fused=True):
    n = X.shape[0]
    Xp = np.concatenate([X, np.zeros((n, 1), F32)], 1)  # index -1 -> the zero column
    Yp = np.concatenate([Y, np.zeros((n, 1), F32)], 1)
    acc = np.zeros((n, index.shape[0]), F32)
    for j in range(index.shape[1]):
        col = index[:, j]
        if fused:
            acc = fma32(acc, Xp[:, col], Yp[:, col])
        else:
            acc = (acc + (Xp[:, col] * Yp[:, col]).astype(F32)).astype(F32)
    return acc


def reduce(P, how):
    """(n, T) partials -> (n,), each add FP32 RNE."""
    v = P.astype(F32)
    if how == 'seq':  # slice order (the project's split-K sum)
        s = v[:, 0]
        for t in range(1, v.shape[1]):
            s = (s + v[:, t]).astype(F32)
        return s
    if how == 'tree_down':  # butterfly 16, 8, 4, 2, 1: v[i] += v[i + T/2], ...
        while v.shape[1] > 1:
            h = v.shape[1] // 2
            v = (v[:, :h] + v[:, h:2 * h]).astype(F32)
        return v[:, 0]
    if how == 'tree_up':  # butterfly 1, 2, 4, ...: pairs (2i, 2i + 1)
        while v.shape[1] > 1:
            v = (v[:, 0::2] + v[:, 1::2]).astype(F32)
        return v[:, 0]
    raise ValueError(how)


def gemv_model(X, Y, g, lanes=32, how='tree_down', fused=True):
    return reduce(lane_partials(X, Y, lane_index(X.shape[1], g, lanes), fused), how)


def hits(s, ref):
    return int((s.view(np.int32) == ref.view(np.int32)).sum())


def fit_g(X, Y, ref, gs=None):
    """All g (tiles per lane) with every output bit-exact (pruned on 2 outputs first)."""
    K = X.shape[1]
    full = range(1, -(-K // 32) + 1)
    if gs is None:  # likely values first; the full scan only if none fits
        good = fit_g(X, Y, ref, sorted({g for g in list(range(1, 65)) + [128, 256, -(-K // 32)] if g in full}))
        return good or fit_g(X, Y, ref, [g for g in full if g > 64])
    good = []
    for g in gs:
        if hits(gemv_model(X[:2], Y[:2], g), ref[:2]) < min(2, len(ref)):
            continue
        if hits(gemv_model(X, Y, g), ref) == len(ref):
            good.append(g)
    return good


# ---------------------------------------------------------------- reports
def report(path=DEFAULT):
    data = load(path)
    for key, (X, Y, ref, (M, N, K), kern) in data.items():
        good = fit_g(X, Y, ref)
        line = f"{key:36s} {kernel_tag(kern):5s} n={len(ref):3d} exact g: {good}"
        if good:
            g = good[0]
            P = lane_partials(X, Y, lane_index(K, g))
            alt = {h: hits(reduce(P, h), ref) for h in ('tree_down', 'tree_up', 'seq')}
            alt['mul+add'] = hits(gemv_model(X, Y, g, fused=False), ref)
            alt['sequential K'] = hits(gemv_model(X, Y, 1, lanes=1), ref)
            line += f"  [g={g}: " + ', '.join(f"{k} {v}/{len(ref)}" for k, v in alt.items()) + "]"
            # the project's KLayout order: interleaved(K, g, 32) == lane_index
            try:
                from fp4ref.native import interleaved
                idx, lens = interleaved(K, g, 32)
                assert np.array_equal(idx, lane_index(K, g).reshape(-1)), 'layout differs'
                line += " (== fp4ref interleaved)"
            except ImportError:
                pass
        print(line, flush=True)


def search(path=DEFAULT):
    """Wider grid: lanes T, tile g, FMA vs mul+add, three reductions; prints models >= 12/16."""
    data = load(path)
    for key, (X, Y, ref, (M, N, K), kern) in data.items():
        found = []
        for T in (4, 8, 16, 32, 64, 128, 256):
            for g in list(range(1, 17)) + [32, 64, 128]:
                for fused in (True, False):
                    P = lane_partials(X, Y, lane_index(K, g, T), fused)
                    for how in ('tree_down', 'tree_up', 'seq'):
                        m = hits(reduce(P, how), ref)
                        if m >= 12:
                            found.append((m, T, g, fused, how))
        print(key, kernel_tag(kern), found, flush=True)


# ---------------------------------------------------------------- GPU sweep (run on a device)
def dump(out_path, n_sample=8, seed=0, device='cuda', Ks=None, outs=None):
    """Sweep gemv shapes on the GPU (torch fp32, TF32 off), store operands/outputs/kernels in the
    gemv.npz format so ``report`` fits g per shape (how g depends on K, M/N and the template)."""
    import torch
    torch.backends.cuda.matmul.allow_tf32 = False
    gen = torch.Generator(device=device).manual_seed(seed)
    Ks = Ks or [32, 64, 100, 256, 333, 512, 1000, 1024, 1500, 2048, 2049, 2500, 3000, 3500, 4000, 4096,
          5000, 6000, 8192, 9000]
    outs = outs or [16, 77, 256, 517, 1000, 1500, 3000, 8192]
    arrays, meta = {}, []
    from torch.profiler import profile, ProfilerActivity
    for K in Ks:
        for n_out in outs:
            for case in ('N1', 'M1'):
                M, N = (n_out, 1) if case == 'N1' else (1, n_out)
                A = torch.randn(M, K, device=device, generator=gen)
                B = torch.randn(K, N, device=device, generator=gen)
                with profile(activities=[ProfilerActivity.CUDA] if device == 'cuda' else [ProfilerActivity.CPU]) as prof:
                    C = A @ B
                    torch.cuda.synchronize() if device == 'cuda' else None
                kern = [e.name for e in prof.events() if e.device_type.name == 'CUDA']
                key = f"cuda-cublas-fp32|{M}x{N}x{K}"
                r = torch.randperm(M, generator=gen, device=device)[:n_sample].sort().values if M > 1 \
                    else torch.zeros(1, dtype=torch.long, device=device)
                c = torch.randperm(N, generator=gen, device=device)[:n_sample].sort().values if N > 1 \
                    else torch.zeros(1, dtype=torch.long, device=device)
                arrays[key + '|a'] = A[r].cpu().numpy()
                arrays[key + '|b'] = B[:, c].cpu().numpy()
                arrays[key + '|out'] = C[r][:, c].cpu().numpy()
                arrays[key + '|rows'] = r.cpu().numpy()
                arrays[key + '|cols'] = c.cpu().numpy()
                meta.append({'key': key, 'kernels': kern})
    np.savez_compressed(out_path, meta=json.dumps(meta), **arrays)


# ---------------------------------------------------------------- the rule choosing (lanes, g)
def kernel_args(name):
    """(b1, opT, int, splitK) from a gemvx kernel name (None if no gemvx kernel): b1 = the 1st
    template bool (true only at K = 32 here), opT = the 3rd bool (N == 1: contiguous dots), int =
    the template int (log2 of the block size?), splitK = a cublasLt::splitKreduce_kernel follows."""
    import re
    m = re.search(r'gemvx::kernel<int, int, float, float, float, float, (\w+), (\w+), (\w+), (\w+), (\d+),', name or '')
    if not m:
        return None
    return m.group(1) == 'true', m.group(3) == 'true', int(m.group(5)), 'splitKreduce' in name


def gemv_layout(M, N, K, kernel_name):
    """(lanes, g) of the single-pass gemvx kernel: lanes FMA chains, tiles of g dealt round robin,
    halving tree over the lanes. Empirical (H200 sweep /tmp/dumps15b, see --sweep).
    None: not modelled (non-gemvx kernel, or gemvx + splitKreduce split-K)."""
    a = kernel_args(kernel_name)
    if a is None or a[3]:
        return None
    b1, opT, iv, _ = a
    n = M if N == 1 else N
    cdiv = lambda x, y: -(-x // y)
    if b1:                              # K = 32 variant (T,6): 2 lanes, two contiguous halves
        return 2, min(cdiv(K, 2), 64)
    if opT:                             # N == 1
        if iv in (7, 8):                # 32 lanes: one contiguous block per lane while K <= 512
            return 32, (cdiv(K, 32) if K <= 512 else 1)
        if iv == 9:                     # same lane choice as M == 1, int 9 (below); g = 1
            L = 32
            while L > 1 and n * L > 132 * 512:
                L //= 2
            return L, 1
        return 16, 1                    # T,6 (seen only at M = 3000, K >= 1500)
    if iv == 8:                         # M == 1
        return 32, 1
    if iv == 6:
        return 2, min(cdiv(K, 2), 64)
    if iv == 7:
        if K < 512:
            return 2, min(cdiv(K, 2), 64)
        return (32, 1) if n <= 1024 else (4, 1)
    if iv == 9:                         # lanes: largest power of 2 <= 32 with n * lanes <= 132 * 512
        L = 32
        while L > 1 and n * L > 132 * 512:
            L //= 2
        if K >= 8192:
            L = max(L, 16)
        return L, min(cdiv(K, L), 64)
    return None


def chunk_width(M, N, K, kernel_name):
    """g (products per tile) of gemv_layout; None where not modelled."""
    lay = gemv_layout(M, N, K, kernel_name)
    return None if lay is None else lay[1]


def fit_layouts(X, Y, ref, K):
    """All (lanes, g) with every sampled output bit-exact, lanes in 2..64, g in
    {1, min(ceil(K/lanes), 64), ceil(K/lanes), 64} (tree_down, FMA)."""
    found = []
    for T in (2, 4, 8, 16, 32, 64):
        for g in sorted({1, min(-(-K // T), 64), -(-K // T), 64}):
            if g > K:
                continue
            idx = lane_index(K, g, T)
            if hits(reduce(lane_partials(X[:1], Y[:1], idx), 'tree_down'), ref[:1]) < 1:
                continue
            if hits(reduce(lane_partials(X, Y, idx), 'tree_down'), ref) == len(ref):
                found.append((T, g))
    return found


def _sweep_one(item):
    key, (X, Y, ref, (M, N, K), kern) = item
    lay = gemv_layout(M, N, K, kern)
    a = kernel_args(kern)
    if a is None:
        return key, kernel_tag(kern), None, lay, None, len(ref)
    fits = fit_layouts(X, Y, ref, K)
    ok = None
    if lay is not None:
        ok = hits(gemv_model(X, Y, lay[1], lanes=lay[0]), ref)
    tag = kernel_tag(kern) + (',b1' if a[0] else '') + (',splitK' if a[3] else '')
    return key, tag, fits, lay, ok, len(ref)


def sweep(paths):
    """Per shape: kernel tag, fitted (lanes, g) set, the rule's (lanes, g), match."""
    from multiprocessing import Pool
    items = []
    for p in paths:
        items += list(load(p).items())
    with Pool(2) as pool:
        res = pool.map(_sweep_one, items, chunksize=4)
    cnt = dict(gemvx=0, modelled=0, match=0, other=0, splitk=0, outs=0, outs_ok=0)
    for key, tag, fits, lay, ok, n in res:
        if fits is None:
            cnt['other'] += 1
            print(f"{key:34s} non-gemvx {tag[:60]}")
            continue
        cnt['gemvx'] += 1
        if lay is None:
            cnt['splitk'] += 1
        else:
            cnt['modelled'] += 1
            cnt['match'] += ok == n
            cnt['outs'] += n
            cnt['outs_ok'] += ok
        st = 'n/a' if lay is None else ('OK' if ok == n else f'FAIL {ok}/{n}')
        print(f"{key:34s} {tag:12s} fits(lanes,g)={fits} rule={lay} {st}")
    print(cnt)


if __name__ == '__main__':
    args = sys.argv[1:]
    if args[:1] == ['--sweep']:
        sweep(args[1:] or ['/tmp/dumps15b/gemv1.npz', '/tmp/dumps15b/gemv2.npz'])
        sys.exit(0)
    if args[:1] == ['--dump']:
        dump(args[1])
    elif args[:1] == ['--search']:
        search(args[1] if len(args) > 1 else DEFAULT)
    else:
        for p in (args or [DEFAULT]):
            report(p)
