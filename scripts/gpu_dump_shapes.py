"""Exploration for issue 13: operands and outputs of native GEMMs at given shapes, for offline
model fitting (the kernels the random-shape validation left unexplained).

    python scripts/gpu_dump_shapes.py --from LOG.jsonl --devices cuda-cublas-fp32 --misses \
        --max 12 --out /tmp/dump.npz
Per shape: the kernel names, ROWS x COLS sampled outputs with their A rows and B columns
(float32 values as the device read them), keyed "device|MxNxK|field".
"""
from __future__ import annotations

import argparse
import json

import numpy as np
import torch

from probes.backends import detect


def pick(log, devices, misses, most):
    out = []
    for line in open(log):
        r = json.loads(line)
        if r["device"] not in devices or r.get("refused") is not None or "matches" not in r:
            continue
        if misses and r["matches"] == r["outputs"]:
            continue
        out.append((r["device"], tuple(r["shape"])))
    per = {}
    for d, s in out:
        per.setdefault(d, [])
        if len(per[d]) < most:
            per[d].append(s)
    return per


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--from", dest="log", default=None)
    p.add_argument("--devices", required=True)
    p.add_argument("--shape", action="append", default=[], help="MxNxK for every device (instead of the log)")
    p.add_argument("--step", type=int, default=0, help="rows and columns every STEP (one per output tile)")
    p.add_argument("--repeat", type=int, default=1, help="native calls of the same batch (out, out1, ...)")
    p.add_argument("--block", default=None, help="LO:HI,LO:HI: every row and column of that block")
    p.add_argument("--misses", action="store_true")
    p.add_argument("--max", type=int, default=12)
    p.add_argument("--rows", type=int, default=4)
    p.add_argument("--cols", type=int, default=8)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    names = a.devices.split(",")
    if a.shape:
        per = {n: [tuple(int(x) for x in s.split("x")) for s in a.shape] for n in names}
    else:
        per = pick(a.log, names, a.misses, a.max)
    devs = {s.name: s.device for s in detect(include=lambda s: s.name in names) if s.device is not None}
    dumps, meta = {}, []
    for name, shapes in per.items():
        dev = devs[name]
        for (M, N, K) in shapes:
            batch = dev.draw(M, N, K, 1234)
            out = dev.call_tensors(batch)
            kern = dev.kernels(batch)
            g = np.random.default_rng(M * 7 + N * 13 + K)
            if a.block:
                (r0, r1), (c0, c1) = (map(int, x.split(":")) for x in a.block.split(","))
                r, c = np.arange(r0, min(r1, M)), np.arange(c0, min(c1, N))
            elif a.step:
                r, c = np.arange(g.integers(a.step) % M, M, a.step), np.arange(g.integers(a.step) % N, N, a.step)
            else:
                r = np.sort(g.choice(M, min(a.rows, M), replace=False))
                c = np.sort(g.choice(N, min(a.cols, N), replace=False))
            key = f"{name}|{M}x{N}x{K}"
            rt, ct = torch.as_tensor(r, device=out.device), torch.as_tensor(c, device=out.device)
            dumps[key + "|a"] = batch.a[rt].float().cpu().numpy()
            dumps[key + "|b"] = batch.b[:, ct].float().cpu().numpy()
            dumps[key + "|out"] = out[rt][:, ct].float().cpu().numpy()
            dumps[key + "|rows"], dumps[key + "|cols"] = r, c
            for i in range(1, a.repeat):
                dumps[key + f"|out{i}"] = dev.call_tensors(batch)[rt][:, ct].float().cpu().numpy()
            meta.append({"key": key, "kernels": kern})
            print(key, kern, flush=True)
    dumps["meta"] = np.array(json.dumps(meta))
    np.savez_compressed(a.out, **dumps)


if __name__ == "__main__":
    main()
