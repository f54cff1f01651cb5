"""Issue 13: is cuBLASLt's own heuristic (probes.explain.cublaslt_heuristic) a prediction of
the split-K that torch.mm runs?  For every bit-exact cuBLAS shape of the random-shape log,
the heuristic's split_k against the probed split (the explained model's split, 1 without).

    python scripts/gpu_heuristic_check.py --log reports/baselines/shapes/nvidia-h200.jsonl --out x.json
"""
from __future__ import annotations

import argparse
import collections
import json

from probes.explain import cublaslt_heuristic
from reference.notation import parse_short


def probed_split(model: str) -> int:
    return parse_short(model).split_k or 1


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--log", required=True)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    rows, tally = [], collections.Counter()
    for line in open(a.log):
        r = json.loads(line)
        if not r["device"].startswith("cuda-cublas") or r.get("refused") is not None:
            continue
        if r.get("matches") is None or r["matches"] != r["outputs"]:
            continue   # only shapes whose split the probe established
        h = cublaslt_heuristic(r["device"], r["shape"])
        want = probed_split(r["model"])
        got = h.get("split_k")
        verdict = "error" if got is None else ("agree" if max(got, 1) == want else "disagree")
        tally[(r["device"], verdict)] += 1
        rows.append({"device": r["device"], "shape": r["shape"], "probed_split": want, "heuristic": h,
                     "kernels": r.get("family"), "verdict": verdict})
    summary = {f"{d} {v}": n for (d, v), n in sorted(tally.items())}
    json.dump({"summary": summary, "rows": rows}, open(a.out, "w"), indent=1)
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
