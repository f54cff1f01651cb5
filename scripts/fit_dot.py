"""Fit the summation order of cuBLAS's fp32 dot path on H200: torch.mm fp32 at M=1, N=64, K=2048
runs ``dot_kernel<float, 128, 0, cublasDotParams<...>>`` then ``reduce_1Block_kernel<float, 128, 7, ...>``
(one dot product per output column). Dump: /tmp/dumps15c/dot.npz (devices cuda-cublas-fp32 and
cuda-cublas-tf32; the dot path is the same for both, operands differ per device and are not
tf32-rounded).

Model found (32 of 32 outputs bit-exact on each device, K = 2048):
  1. products p[k] = a[k] * b[k] rounded once to fp32 (no FMA chain: each of 128 threads holds one
     product per 128-wide chunk);
  2. K is cut into 16 chunks of 128 consecutive k (chunk j = k // 128); each chunk's 128 products are
     summed by a halving tree over t = k % 128 (v[t] += v[t + s], s = 64, 32, ..., 1; fp32 RNE adds);
  3. chunk sums c[j] (j = 4 * i + r, r = j % 4, i = j // 4): s[r] = ((c[r] + c[r+4]) + c[r+8]) + c[r+12]
     (serial in i), then out = ((s[0] + s[1]) + s[2]) + s[3] (serial in r).
  Reading: 4 blocks (r = blockIdx), grid-stride over chunks of 128 (chunk 4 i + r), each chunk
  block-reduced by a shared-memory halving tree and accumulated serially per block; reduce_1Block sums
  the 4 block partials serially. (Block count 4 for K = 2048 is the fitted value; how it scales with K
  is not determined by this dump.)
The fit is from an exhaustive search over "bit-segment" orders (``search``): K = 2^11, its bits cut into
<= 4 contiguous segments, each labelled FMA-chain / pairwise-ascending / halving / serial, tree segments
applied in every order.

Usage:
  python scripts/fit_dot.py            # check the model on /tmp/dumps15c/dot.npz (per device x/32)
  python scripts/fit_dot.py --search   # the exhaustive bit-segment search (~minutes)
"""
import itertools
import sys

import numpy as np

sys.path.insert(0, '/work/main/scripts')
from fit_gemv import add_exact, fma32  # noqa: E402

F64, F32 = np.float64, np.float32
DEFAULT = '/tmp/dumps15c/dot.npz'
DEVICES = ['cuda-cublas-fp32', 'cuda-cublas-tf32']


def add32(x, y):
    return add_exact(np.asarray(x, F32).astype(F64), np.asarray(y, F32).astype(F64))


def load(path, dev, shape='1x64x2048'):
    d = np.load(path)
    k = f'{dev}|{shape}|'
    return d[k + 'a'][0], d[k + 'b'], d[k + 'out'][0]


def hits(s, ref):
    return int((s.view(np.uint32) == ref.view(np.uint32)).sum())


def halving(v):
    """v [T, ...] (T power of 2): v[t] += v[t + T/2], ... -> v[0]."""
    while v.shape[0] > 1:
        h = v.shape[0] // 2
        v = add32(v[:h], v[h:])
    return v[0]


def serial(v):
    acc = v[0]
    for x in v[1:]:
        acc = add32(acc, x)
    return acc


def dot_model(a, B, chunk=128, blocks=4):
    """a [K], B [K, n] -> [n] fp32 (the fitted rule; K a multiple of chunk * blocks)."""
    K = a.shape[0]
    p = (a.astype(F64)[:, None] * B.astype(F64)).astype(F32)          # one rounding per product
    c = np.stack([halving(p[j * chunk:(j + 1) * chunk]) for j in range(K // chunk)])
    s = [serial(c[r::blocks]) for r in range(blocks)]                  # per block, serial over its chunks
    return serial(np.stack(s))                                         # reduce_1Block: serial over blocks


# ---------------------------------------------------------------- exhaustive bit-segment search
NB = 11


def _chain(a, B, C, fused=True):
    n = B.shape[1]
    rest = [b for b in range(NB - 1, -1, -1) if b not in C]
    Cs = sorted(C, reverse=True)
    acc = np.zeros([2] * len(rest) + [n], F32)
    for v in range(2 ** len(Cs)):
        base = sum(((v >> (len(Cs) - 1 - i)) & 1) << Cs[i] for i in range(len(Cs)))
        ks = np.zeros([2] * len(rest), int) + base
        for j, b in enumerate(rest):
            sh = [1] * len(rest)
            sh[j] = 2
            ks = ks + (np.arange(2) << b).reshape(sh)
        if fused:
            acc = fma32(acc, a[ks][..., None], B[ks])
        else:
            acc = add32(acc, (a[ks][..., None].astype(F64) * B[ks].astype(F64)).astype(F32))
    return acc, rest


def _reduce_bits(arr, rest, ops):
    rest = list(rest)
    for bits, kind in ops:
        if kind == 'pair':
            for b in bits:
                j = rest.index(b)
                arr = add32(np.take(arr, 0, axis=j), np.take(arr, 1, axis=j))
                rest.pop(j)
        else:
            js = [rest.index(b) for b in sorted(bits, reverse=True)]
            arr = np.moveaxis(arr, js, list(range(len(js))))
            arr = arr.reshape((-1,) + arr.shape[len(js):])
            arr = serial(arr)
            rest = [r for r in rest if r not in bits]
    return arr


def search(path=DEFAULT, maxseg=4):
    data = {d: load(path, d) for d in DEVICES}
    cache, res = {}, []
    for nseg in range(1, maxseg + 1):
        for cuts in itertools.combinations(range(1, NB), nseg - 1):
            bounds = [0] + list(cuts) + [NB]
            segs = [list(range(bounds[i], bounds[i + 1])) for i in range(nseg)]
            for labels in itertools.product(['chain', 'asc', 'desc', 'serial'], repeat=nseg):
                C = frozenset(b for s, l in zip(segs, labels) if l == 'chain' for b in s)
                tsegs = [(s, l) for s, l in zip(segs, labels) if l != 'chain']
                if any(l == 'serial' and len(s) > 6 for s, l in tsegs):
                    continue
                if C not in cache:
                    cache[C] = {d: _chain(data[d][0], data[d][1], C) for d in data}
                for perm in itertools.permutations(tsegs):
                    ops = [(s, 'pair') if l == 'asc' else (s[::-1], 'pair') if l == 'desc' else (s, 'serial')
                           for s, l in perm]
                    h = [hits(_reduce_bits(*cache[C][d], ops), data[d][2]) for d in data]
                    desc = ([(s[0], s[-1], l) for s, l in zip(segs, labels)],
                            [(s[0], s[-1], l) for s, l in perm])
                    res.append((sum(h), h, desc))
                    if sum(h) == sum(len(data[d][2]) for d in data):
                        print('FULL', h, desc, flush=True)
    res.sort(key=lambda r: -r[0])
    print(len(res), 'models; best:')
    for r in res[:10]:
        print(r)


def main(path=DEFAULT):
    for dev in DEVICES:
        a, B, out = load(path, dev)
        print(dev, '1x64x2048: model', hits(dot_model(a, B), out), '/', len(out))
        # neighbours (for specificity)
        p = (a.astype(F64)[:, None] * B.astype(F64)).astype(F32)
        c = np.stack([halving(p[j * 128:(j + 1) * 128]) for j in range(16)])
        alts = {'16 chunk sums halving': halving(c), '16 chunk sums serial': serial(c),
                'blocks=4 but final halving': halving(np.stack([serial(c[r::4]) for r in range(4)])),
                'blocks=2 serial': serial(np.stack([serial(c[r::2]) for r in range(2)])),
                'blocks=8 serial': serial(np.stack([serial(c[r::8]) for r in range(8)])),
                'contiguous groups of 4, serial': serial(np.stack([serial(c[4 * r:4 * r + 4]) for r in range(4)]))}
        for k, v in alts.items():
            print('   alt', k, hits(v, out))


if __name__ == '__main__':
    if '--search' in sys.argv:
        search(*[x for x in sys.argv[1:] if x != '--search'])
    else:
        main(*sys.argv[1:])
