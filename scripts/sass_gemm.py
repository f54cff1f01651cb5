"""Offline SASS of the exact block-scaled GEMM's tile kernels (issue 18: where the time goes),
sm_90, Triton's bundled ptxas and nvdisasm; no GPU needed.  Per kernel at the launch
configuration ``fp4ref.gemm_triton`` uses on CUDA (128 x 128 tiles, 8 warps, add.rz.f32 adds,
K = 8192): instructions in all and in the K loop, by class, and per tensor-core instruction.

    python scripts/sass_gemm.py [--json OUT]
"""
from __future__ import annotations

import argparse
import collections
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from sass_digest import sass  # noqa: E402  (the one offline compile + nvdisasm helper)

from fp4ref.gemm_triton import kernels as KK  # noqa: E402

CLASSES = {"tensor core": ("HGMMA", "HMMA"), "wgmma sync": ("WARPGROUP", "WARPSYNC", "DEPBAR"),
           "fp32 add/mul": ("FADD", "FMUL", "FFMA"), "fp64": ("DADD", "DMUL", "DFMA", "DSETP", "F2F.F64", "F2F.F32.F64"),
           "move/select": ("MOV", "SEL", "FSEL", "CS2R", "IMAD.MOV"), "load/store": ("LDG", "LDS", "STS", "STG", "LDGSTS", "LDSM", "UTMALDG", "SYNCS"),
           "integer/address": ("IMAD", "IADD3", "LEA", "SHF", "LOP3", "ISETP", "VIADD", "ULEA", "UIADD3", "UMOV", "USHF", "ULOP3")}


def classify(op: str) -> str:
    for name, prefixes in CLASSES.items():
        if any(op == p or op.startswith(p + ".") for p in prefixes):
            return name
    return "other"


def ops(text: str) -> list:
    """(opcode, line) of each instruction in nvdisasm's listing."""
    out = []
    for line in text.splitlines():
        m = re.match(r"\s*/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", line)
        if m:
            out.append(m.group(1))
    return out


def loop_body(text: str) -> list:
    """The opcodes of the largest backward-branch loop (the K loop)."""
    lines = text.splitlines()
    labels, best = {}, []
    for i, line in enumerate(lines):
        m = re.match(r"\.(L_x_\d+):", line.strip())
        if m:
            labels[m.group(1)] = i
        b = re.search(r"\bBRA\b.*`\(\.(L_x_\d+)\)", line)
        if b and b.group(1) in labels and labels[b.group(1)] < i:
            body = ops("\n".join(lines[labels[b.group(1)]:i + 1]))
            if len(body) > len(best):
                best = body
    return best


SIG_COMMON = {"M": "i32", "N": "i32", "NT": "i32", "alpha": "fp32"}
KW = dict(BM=128, BN=128, RZ=0, F32=False, ALPHA=True)


def specs(K: int):
    c = {"K": K, **KW}
    return {
        "_pair_kernel": (KK._pair_kernel, {"A": "*bf16", "B": "*bf16", "C": "*fp32", "tiles": "*i32", **SIG_COMMON}, c),
        "_block_kernel": (KK._block_kernel, {"A": "*bf16", "B": "*bf16", "C": "*fp32", "MA": "*i32", "QB": "*i32",
                                             "tiles": "*i32", "NG": "i32", **SIG_COMMON}, c),
        "_mx_kernel": (KK._mx_kernel, {"A": "*bf16", "B": "*bf16", "C": "*fp32", "FA": "*i32", "FB": "*i32",
                                       "tiles": "*i32", "NB": "i32", **SIG_COMMON}, c),
    }


def report(K: int = 8192) -> dict:
    out = {}
    for name, (fn, sig, consts) in specs(K).items():
        order = [a for a in fn.arg_names]
        full = {a: ("constexpr" if a in consts else sig[a]) for a in order}
        # Triton specializes 16-byte aligned pointers and ints divisible by 16 at launch (the
        # 8192^3 call has all of them): the same hints here, else loads compile unvectorized
        aligned = [a for a in order if a not in consts and a not in ("alpha",)]
        text = sass(fn, full, {a: consts[a] for a in order if a in consts}, num_warps=8, aligned=aligned)
        allops, body = ops(text), loop_body(text)
        cls = collections.Counter(classify(o) for o in body)
        mma = max(cls["tensor core"], 1)
        out[name] = {"instructions": len(allops), "loop_instructions": len(body),
                     "loop_by_class": dict(cls.most_common()),
                     "loop_per_tensor_core_instruction": round(len(body) / mma, 2),
                     "loop_top_opcodes": collections.Counter(body).most_common(12)}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", default=None)
    ap.add_argument("--K", type=int, default=8192)
    a = ap.parse_args()
    r = {"target": "sm_90 (offline ptxas/nvdisasm)", "config": {**KW, "num_warps": 8, "K": a.K},
         "kernels": report(a.K)}
    text = json.dumps(r, indent=1)
    if a.json:
        tmp = a.json + ".tmp"
        Path(tmp).write_text(text)
        Path(tmp).replace(a.json)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
