"""Fit the per-tile K segmentation of cuBLAS's sm90 tf32 segment-K kernel on the H200 dumps.

    PYTHONPATH=. .venv/bin/python scripts/fit_segment_k.py [--npz /tmp/dumps15/tf32.npz]
        [--verify 64] [--corner]
    PYTHONPATH=. .venv/bin/python scripts/fit_segment_k.py --verify-all [--observed] [--only 2500x1900]
        (every dump in DUMPS against segments(): cuts + reduce_tree; --observed: OBSERVED overrides)

Kernel: sm90_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize{128x256x32,64x256x32}_..._execute_segment_k
(a Memset precedes it).  Model per segment: "F=8 align=25:RTZ:esum acc=23:RTZ G=- out=float32:RNE",
segment partials added in FP32 RNE.

Coordinates.  torch.mm(A[M,K], B[K,N]) is cuBLAS C' = B'A' (column major), so the kernel's tile
"TMxTNx32" covers TM torch *columns* (cuBLAS m') by TN = 256 torch *rows* (cuBLAS n').  Raster
order: m' tiles in pairs (a 2x1 cluster), n' inside a pair, the two m' of a pair adjacent:
    idx = (m' // 2) * 2 * NT' + n' * (width of the pair) + m' % 2
(the last pair is one wide when MT' is odd).  T = MT' * NT'.

What it prints: per shape, outputs reproduced by 1 segment / 2 segments (cut = ceil(K/2) rounded
up to 32); the tile map in cuBLAS coordinates; the outputs reproduced by the rule (``segments``);
the random-shape validation grid of the same shapes (other operands, other process) checked
against the map; with --corner, the searches at the one tile no segmentation here explains.

The emulator here is an exact numpy transcription of the model (products of tf32 values are exact
in float64, aligned terms are integers below 2**31 in units of 2**(emax-25)); --verify N checks
it bit for bit against fp4ref.gemm.emulate on N outputs per shape (1 and 2 segments).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SM = 132
MODEL = "F=8 align=25:RTZ:esum acc=23:RTZ G=- out=float32:RNE"
NOEXP = -10 ** 6


# ----------------------------------------------------------------------------- exact emulation
def prep(a, b, pairs):
    """Products [n, Kp] (float64, exact for tf32 factors) and their esum exponents (floor log2 of
    each factor, summed; NOEXP for a zero product), K padded with zero products to a multiple of 8."""
    i = np.array([p[0] for p in pairs]); j = np.array([p[1] for p in pairs])
    A = a[i].astype(np.float64); B = b[:, j].T.astype(np.float64)
    P = A * B
    X = np.where((A != 0) & (B != 0), (np.frexp(A)[1] - 1) + (np.frexp(B)[1] - 1), NOEXP)
    pad = -P.shape[1] % 8
    if pad:
        P = np.pad(P, ((0, 0), (0, pad))); X = np.pad(X, ((0, 0), (0, pad)), constant_values=NOEXP)
    return P, X


def step(S, p, x):
    """One fused step: accumulators S [n, c] (FP32 values in float64) + 8 products p, x [n, 8]:
    terms truncated to multiples of 2**(emax - 25) (emax: the accumulator's exponent and the
    products' exponent sums), summed exactly, the sum truncated to 24 significant bits."""
    eS = np.where(S != 0, np.frexp(S)[1] - 1, NOEXP)
    emax = np.maximum(eS, x.max(1)[:, None])
    q = emax - 25
    sc = np.ldexp(1.0, -q)
    tot = np.trunc(S * sc) + np.trunc(p[:, None, :] * sc[..., None]).sum(-1)
    m, e = np.frexp(tot)
    r = np.ldexp(np.trunc(np.ldexp(m, 24)), e - 24 + q)
    return np.where(emax == NOEXP, S, r)


def chain(P, X, k0, k1):
    """The accumulator over k in [k0, k1) (multiples of 8, k1 may be the padded end) from zero."""
    S = np.zeros((P.shape[0], 1))
    for k in range(k0, min(k1, P.shape[1]), 8):
        S = step(S, P[:, k:k + 8], X[:, k:k + 8])
    return S[:, 0].astype(np.float32)


def segmented(P, X, cuts):
    """Segments [0, c1), [c1, c2), .., [c_last, K), each from zero, added in order in FP32 RNE."""
    edges = [0, *cuts, P.shape[1]]
    acc = None
    for c0, c1 in zip(edges, edges[1:]):
        s = chain(P, X, c0, c1)
        acc = s if acc is None else (acc + s).astype(np.float32)
    return acc


def bits(x):
    return np.asarray(x, dtype=np.float32).view(np.uint32)


def half_cut(K: int) -> int:
    return -(-(-(-K // 2)) // 32) * 32


# ----------------------------------------------------------------------------- the rule
def raster(MT: int, NT: int):
    """idx[m', n'] of the kernel's tile order: m' tiles in pairs g = m' // 2 (g ascending); inside a
    pair n' ascending for even g, descending for odd g (serpentine); the pair's m' adjacent."""
    idx = np.empty((MT, NT), dtype=np.int64)
    for m in range(MT):
        g, w = m // 2, min(2, MT - 2 * (m // 2))
        for n in range(NT):
            nn = n if g % 2 == 0 else NT - 1 - n
            idx[m, n] = g * 2 * NT + nn * w + (m % 2 if w == 2 else 0)
    return idx


def segments_v1(M: int, N: int, K: int, TM: int, TN: int = 256, sms: int = SM):
    """The first rule (superseded by segments below; kept for the report of main()).
    {(m', n'): cuts or None} per output tile (m' over torch columns N in TM, n' over torch rows
    M in TN): [] one segment, [c] two segments at c = ceil(K/2) rounded up to 32, None unknown.

    T tiles, r = T mod sms (T itself when T <= sms): the tail wave.
      r == 0: every tile one segment (not seen).
      2 r <= sms: the last r tiles in raster order two segments, the others one
        (2223x2468x9324: T = 180, r = 48; 273x1608x12664: T = r = 52).
      2 r > sms: one segment, but the last tile in raster order: None (1945x568x13960: T = r = 72;
        its corner tile is neither one segment nor two at any cut).
    Seen only with T < 2 sms; whether a second full wave joins the tail (as CUTLASS's stream-K
    does) is untested."""
    MT, NT = -(-N // TM), -(-M // TN)
    T = MT * NT
    r = T % sms if T > sms else T
    idx = raster(MT, NT)
    half = [half_cut(K)]
    out = {}
    for m in range(MT):
        for n in range(NT):
            if r == 0:
                out[m, n] = []
            elif 2 * r <= sms:
                out[m, n] = half if idx[m, n] >= T - r else []
            else:
                out[m, n] = None if idx[m, n] == T - 1 else []
    return out


def split_units(n: int, s: int):
    """Unit (32-wide k-block) edges of s segments of n k-blocks: floor(n/s) each, the last n % s
    segments one more (1945x568x13960 corner: 13 x 29 + 2 x 30 of 437; 2000x500x10500: 82,82,82,83)."""
    base, rem = divmod(n, s)
    lens = [base] * (s - rem) + [base + 1] * rem
    return [int(x) for x in np.cumsum([0] + lens)]


def seg_cuts(K: int, s: int):
    """Cuts in K (elements) of s segments: 32 * the unit edges."""
    return [32 * u for u in split_units(-(-K // 32), s)[1:-1]]


# Observed structures the shape rule below does not produce (one shape each):
#   2500x1900x9000 (T = 150, r = 18): 24 tiles split in 4, not the last 18 of the pair raster in 7;
#   the 24 are n' 0..2 x m' 8..14 and n' 3 x m' 12..14 (the last 24 of a raster with m' groups of
#   8 wide, serpentine in n', m' ascending in a row).
OBSERVED = {(2500, 1900, 9000): ("tiles", 4, [(m, n) for n in range(3) for m in range(8, 15)] + [(12, 3), (13, 3), (14, 3)])}


def segments(M: int, N: int, K: int, TM: int, sms: int = SM, TN: int = 256, observed: bool = False):
    """{(m', n'): (cuts, tree) or None} per output tile (m' over torch columns N in TM, n' over torch
    rows M in TN).  cuts: the segment boundaries in K (multiples of 32, [] = one segment); each
    segment is a chain from zero; tree = reduce_tree(len(cuts) + 1): the order the segment partials
    are added in FP32 RNE (segment i covers [edges[i], edges[i+1]), edges = [0, *cuts, K]).

    n = ceil(K/32) k-blocks; s segments take floor(n/s) blocks, the last n % s one more.
    T = MT' * NT' tiles, raster(): pair raster (m' pairs, serpentine n').
      T <= sms/2: every tile s = sms // T segments (T = 52: 2; 36, 40: 3; 32: 4).
      sms/2 < T <= sms: every tile one segment but the last in raster order, which gets
        (sms - T) // 4 segments (T = 72: 15; one shape: the formula is a guess among several
        that give 15, e.g. ceil(n/30)).
      T > sms, r = T % sms: r == 0 all one; 2 r <= sms: the last r tiles in raster order
        s = sms // r (T = 180, r = 48: 2) -- but T = 150, r = 18 gave 24 tiles x 4 (OBSERVED);
        2 r > sms: not seen (None for the last tile).
    observed=True substitutes the OBSERVED structure for the shapes listed there."""
    MT, NT = -(-N // TM), -(-M // TN)
    T = MT * NT
    idx = raster(MT, NT)
    one = ([], 0)
    split = lambda s: (seg_cuts(K, s), reduce_tree(s))
    out = {t: one for t in np.ndindex(MT, NT)}
    if observed and (M, N, K) in OBSERVED:
        _, s, tiles = OBSERVED[M, N, K]
        for t in tiles:
            out[t] = split(s)
        return out
    if 2 * T <= sms:
        return {t: split(sms // T) for t in out}
    if T <= sms:
        last = tuple(int(v) for v in np.argwhere(idx == T - 1)[0])
        out[last] = split(max(1, (sms - T) // 4))
        return out
    r = T % sms
    if r == 0:
        return out
    for t in out:
        if idx[t] >= T - r:
            out[t] = split(sms // r) if 2 * r <= sms else (None if idx[t] == T - 1 else one)
    return out


def reduce_tree(s: int, lo: int = 0):
    """The order the s segment partials of a tile are added in (FP32 RNE): a binary tree, nested
    tuples of segment indices, split recursively at floor(s/2) (the larger half last):
    s = 2: (0, 1); 3: (0, (1, 2)); 4: ((0, 1), (2, 3));
    15: (((0, (1, 2)), ((3, 4), (5, 6))), (((7, 8), (9, 10)), ((11, 12), (13, 14))))."""
    if s == 1:
        return lo
    h = s // 2
    return (reduce_tree(h, lo), reduce_tree(s - h, lo + h))


def tree_sum(tree, parts):
    if isinstance(tree, int):
        return parts[tree]
    return (tree_sum(tree[0], parts) + tree_sum(tree[1], parts)).astype(np.float32)


DUMPS = ["/tmp/dumps15/tf32.npz", "/tmp/dumps15b/tf32a.npz", "/tmp/dumps15b/tf32b.npz", "/tmp/dumps15b/tf32c.npz"]


def verify_all(paths=DUMPS, observed=False, only=None):
    """Every segment_k kernel output of the dumps against segments(): per shape, outputs
    bit-exact (segments summed by their tree), of those dumped."""
    tot = [0, 0]
    for path in paths:
        z = np.load(path)
        for m in json.loads(str(z["meta"])):
            key, kern = m["key"], [k for k in m["kernels"] if "segment_k" in k]
            if only and only not in key:
                continue
            M, N, K = (int(v) for v in key.split("|")[1].split("x"))
            if not kern:
                print(f"{path} {key}: skipped (kernels {[k[:60] for k in m['kernels']]})")
                continue
            kern = kern[0]
            TM, TN = (int(v) for v in re.search(r"tilesize(\d+)x(\d+)x", kern).groups())
            a, b, o = z[f"{key}|a"], z[f"{key}|b"], z[f"{key}|out"]
            rows, cols = z[f"{key}|rows"], z[f"{key}|cols"]
            pairs = [(i, j) for i in range(o.shape[0]) for j in range(o.shape[1])]
            P, X = prep(a, b, pairs)
            obs = bits(np.array([o[i, j] for i, j in pairs]))
            tile = [(int(cols[j]) // TM, int(rows[i]) // TN) for i, j in pairs]
            if "segment_k_off" in kern:
                seg = {t: ([], 0) for t in set(tile)}
            else:
                seg = segments(M, N, K, TM, SM, TN, observed)
            good = np.zeros(len(pairs), bool); unk = 0; hist = {}
            for t in sorted(set(tile)):
                sel = np.array([k for k, u in enumerate(tile) if u == t])
                if seg[t] is None:
                    unk += len(sel)
                    continue
                cuts, tree = seg[t]
                edges = [0, *cuts, P.shape[1]]
                parts = [chain(P[sel], X[sel], c0, c1) for c0, c1 in zip(edges, edges[1:])]
                hist[len(parts)] = hist.get(len(parts), 0) + 1
                good[sel] = bits(tree_sum(tree, parts)) == obs[sel]
            tag = "segment_k_off" if "segment_k_off" in kern else "segment_k_on"
            print(f"{path} {key} ({tag}, tile {TM}x{TN}, tiles by segment count {dict(sorted(hist.items()))}): "
                  f"{int(good.sum())} of {len(pairs)} bit-exact, {unk} in tiles left unknown")
            tot[0] += int(good.sum()); tot[1] += len(pairs)
    print(f"all: {tot[0]} of {tot[1]}")


# ----------------------------------------------------------------------------- data
def load(path):
    z = np.load(path)
    meta = {m["key"]: m["kernels"] for m in json.loads(str(z["meta"]))}
    out = {}
    for key, kernels in meta.items():
        d = {s: z[f"{key}|{s}"] for s in ("a", "b", "out", "out1", "out2", "rows", "cols") if f"{key}|{s}" in z.files}
        kern = [k for k in kernels if "segment_k" in k]
        if not kern:
            continue
        kern = kern[0]
        TM, TN = (int(v) for v in re.search(r"tilesize(\d+)x(\d+)x", kern).groups())
        M, N, K = (int(v) for v in key.split("|")[1].split("x"))
        out[key] = (M, N, K, TM, TN, d)
    return out


def verify(P, X, a, b, pairs, K, n):
    """Bit-exact agreement with fp4ref.gemm.emulate on the first n outputs (1 and 2 segments)."""
    import torch
    from fp4ref.gemm import emulate
    from reference.notation import parse_short
    model = parse_short(MODEL)
    c = half_cut(K)
    ok = 0
    for (i, j), p, x in list(zip(pairs, P, X))[:n]:
        at = torch.from_numpy(np.ascontiguousarray(a[i:i + 1])); bt = torch.from_numpy(np.ascontiguousarray(b[:, j:j + 1]))
        r1 = emulate(model, at, bt).numpy()[0, 0]
        r2 = (emulate(model, at[:, :c], bt[:c]).numpy()[0, 0] + emulate(model, at[:, c:], bt[c:]).numpy()[0, 0])
        m1 = segmented(p[None], x[None], [])[0]; m2 = segmented(p[None], x[None], [c])[0]
        ok += int(bits(r1) == bits(m1)) + int(bits(np.float32(r2)) == bits(m2))
    return ok, 2 * min(n, len(pairs))


def grid_map(status, MT, NT):
    ch = {(True, False): "1", (False, True): "2", (True, True): "B", (False, False): "?"}
    lines = []
    for n in range(NT):
        row = ""
        for m in range(MT):
            v = status.get((m, n))
            if not v:
                row += "."
                continue
            v = [c for c in v if c != (True, True)] or v   # an output both reproduce says nothing
            row += ch[v[0]] if len(set(v)) == 1 else "*"
        lines.append(f"    n'{n:2d} {row}")
    return "\n".join(lines)


def validation_check(M, N, K, TM, TN, jsonl="reports/baselines/shapes/nvidia-h200.jsonl"):
    """The random-shape validation's 64 x 64 grid of this shape (its own operands and process):
    outputs the one-segment model missed there vs. outputs in tiles split in the session-15 dump."""
    from probes.shape_validation import _stable_seed, sample_grid
    if not os.path.exists(jsonl):
        return None
    for line in open(jsonl):
        r = json.loads(line)
        if r["device"] == "cuda-cublas-tf32" and r["shape"] == [M, N, K] and r.get("model", "").find("split") < 0:
            rows, cols = sample_grid(M, N, r["outputs"], np.random.default_rng(_stable_seed(0, r["device"], r["draw"]) + 2))
            seg = segments_v1(M, N, K, TM, TN)
            R, C = np.meshgrid(rows, cols, indexing="ij")
            one = np.vectorize(lambda i, j: seg[j // TM, i // TN] == [])(R, C)
            unknown = np.vectorize(lambda i, j: seg[j // TM, i // TN] is None)(R, C)
            fi = (r.get("first_mismatch") or {}).get("index")
            first = None if fi is None else seg[fi[1] // TM, fi[0] // TN]
            return (f"validation draw {r['draw']} ({r['utc']}, own operands and process): one-segment model "
                    f"{r['matches']}/{r['outputs']}; the rule puts {int(one.sum())} of its outputs in one-segment "
                    f"tiles, {int((~one & ~unknown).sum())} in two-segment tiles, {int(unknown.sum())} in the "
                    f"unknown tile; its first miss {fi} is in a tile the rule gives {first}")
    return None


def corner_search(P, X, out_bits, K):
    """The corner tile of 1945x568x13960: 2 segments at every multiple of 8, and s equal segments."""
    lines = []
    hits2 = [c for c in range(8, P.shape[1], 8) if (bits(segmented(P, X, [c])) == out_bits).all()]
    lines.append(f"    2 segments, any cut (multiple of 8): {hits2 or 'none'}")
    found = []
    for s in range(3, 140):
        for g in (8, 32):
            n = -(-K // g); L = -(-n // s)
            cuts = [i * L * g for i in range(1, s) if i * L * g < K]
            for order in ("fwd", "bwd"):
                edges = [0, *cuts, P.shape[1]]
                parts = [chain(P, X, c0, c1) for c0, c1 in zip(edges, edges[1:])]
                if order == "bwd":
                    parts = parts[::-1]
                acc = parts[0]
                for q in parts[1:]:
                    acc = (acc + q).astype(np.float32)
                if (bits(acc) == out_bits).all():
                    found.append((s, g, order))
    lines.append(f"    s = 3..139 equal segments (ceil, k-tile 8 or 32), forward/backward sums: {found or 'none'}")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--npz", default="/tmp/dumps15/tf32.npz", help="also: /tmp/fitdata/tf32.npz (session 14)")
    p.add_argument("--verify", type=int, default=0, help="outputs per shape checked against fp4ref.gemm.emulate")
    p.add_argument("--corner", action="store_true")
    p.add_argument("--verify-all", action="store_true", help="every dump in DUMPS against segments()")
    p.add_argument("--only", help="with --verify-all: shapes whose key contains this")
    p.add_argument("--observed", action="store_true", help="with --verify-all: OBSERVED structures too")
    args = p.parse_args(argv)
    if args.verify_all:
        verify_all(observed=args.observed, only=args.only)
        return
    total = [0, 0, 0]
    for key, (M, N, K, TM, TN, d) in load(args.npz).items():
        a, b, out = d["a"], d["b"], d["out"]
        same = all((bits(d[o]) == bits(out)).all() for o in ("out1", "out2") if o in d) if "out1" in d else "n/a"
        pairs = [(i, j) for i in range(out.shape[0]) for j in range(out.shape[1])]
        P, X = prep(a, b, pairs)
        obs = bits(np.array([out[i, j] for i, j in pairs]))
        c = half_cut(K)
        m1 = segmented(P, X, []) .view(np.uint32) == obs
        m2 = segmented(P, X, [c]).view(np.uint32) == obs
        MT, NT = -(-N // TM), -(-M // TN)
        T = MT * NT
        print(f"{key}: kernel tile {TM}x{TN} (m' = torch cols / {TM}, n' = torch rows / {TN}): "
              f"{MT} x {NT} = {T} tiles, K cut {c} + {K - c}; 3 launches identical: {same}")
        if args.verify:
            ok, n = verify(P, X, a, b, pairs, K, args.verify)
            print(f"  numpy emulator vs fp4ref.gemm.emulate: {ok}/{n} bit-exact")
        print(f"  1 segment {int(m1.sum())}, 2 segments {int(m2.sum())}, either {int((m1 | m2).sum())} of {len(pairs)}")
        status = {}
        for (i, j), u, s in zip(pairs, m1, m2):
            status.setdefault((int(d['cols'][j]) // TM, int(d['rows'][i]) // TN), []).append((bool(u), bool(s)))
        print("  tile map (1: one segment, 2: two, ?: neither, .: not sampled; columns m', rows n'):")
        print(grid_map(status, MT, NT))
        idx = raster(MT, NT)
        two = sorted(int(idx[t]) for t, v in status.items() if all(y and not x for x, y in v))
        one = sorted(int(idx[t]) for t, v in status.items() if all(x and not y for x, y in v))
        print(f"  raster indices: one segment {one[:3]}..{one[-3:] if one else ''} ({len(one)}), "
              f"two {two[:3]}..{two[-3:] if two else ''} ({len(two)})")
        for name, rule in (("rule (shape only)", segments_v1),):
            seg = rule(M, N, K, TM, TN)
            good = unk = 0
            for (i, j), u, s in zip(pairs, m1, m2):
                cuts = seg[int(d['cols'][j]) // TM, int(d['rows'][i]) // TN]
                if cuts is None:
                    unk += 1
                else:
                    good += bool(u if cuts == [] else s)
            print(f"  {name}: {good} of {len(pairs)} predicted bit-exact, {unk} in tiles it leaves unknown")
            if name.startswith("rule"):
                total[0] += good; total[1] += unk; total[2] += len(pairs)
        v = validation_check(M, N, K, TM, TN)
        if v:
            print("  " + v)
        if args.corner and 2 * T > SM >= T:
            sel = [k for k, (i, j) in enumerate(pairs) if idx[int(d['cols'][j]) // TM, int(d['rows'][i]) // TN] == T - 1]
            print(f"  corner tile (raster index {T - 1}), {len(sel)} sampled outputs:")
            print(corner_search(P[sel], X[sel], obs[sel], K))
    print(f"all shapes, the rule: {total[0]} bit-exact, {total[1]} unknown, of {total[2]}")


if __name__ == "__main__":
    main()
