"""Prints docs/blackwell.md's prediction table: each Blackwell hypothesis's exact output on
the discriminating NVFP4 operands, computed by reference.gemm.dot (tests/test_docs.py checks
that the table in the doc is this script's output)."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from reference import gemm as g  # noqa: E402
from reference.rounding import Mode  # noqa: E402


def _operands(terms, K=64):
    """(k, a, b, scale_a, scale_b) terms on zero operands with unit block-16 scales."""
    a, b = [0.0] * K, [0.0] * K
    sa, sb = [1.0] * (K // 16), [1.0] * (K // 16)
    for k, x, y, s, t in terms:
        a[k], b[k], sa[k // 16], sb[k // 16] = x, y, s, t
    return a, b, dict(scales_a=sa, scales_b=sb, block=16)


def hypotheses() -> dict:
    bw = g.get_preset("blackwell_mxf4nvf4")
    f8 = g.get_preset("blackwell_mxf8f6f4").replace(
        exp_formats=("float4_e2m1fn", "float4_e2m1fn", "ue4m3"))
    return {"blackwell_mxf4nvf4 (W35 RZ, E16, K64 chain)": bw,
            "blackwell_mxf8f6f4-style (W25, per product, K32 chain)": f8,
            "mxf4nvf4 with RNE per instruction": bw.replace(norm_mode=Mode.RNE),
            "mxf4nvf4, exact groups of 64": bw.replace(exact_group=64),
            "probe_matched": g.get_preset("probe_matched"),
            "probe_matched_lattice": g.get_preset("probe_matched_lattice")}


PROBES = {
    "+7225344, -7225344, 0.5*0.5*2^-9*2^-9 (k=0,16,32)":
        ([(0, 6, 6, 448, 448), (16, -6, 6, 448, 448), (32, 0.5, 0.5, 2**-9, 2**-9)], 64),
    "C=32 (previous instruction), 3*2^-20 (k=64)": ([(0, 4, 2, 2, 2), (64, 3, 1, 2**-9, 2**-11)], 128),
    "7225344 and 0.375 in one 64-chunk (k=0,16)": ([(0, 6, 6, 448, 448), (16, 1.5, 1, 0.5, 0.5)], 64),
}


def table() -> str:
    lines = ["| hypothesis | " + " | ".join(PROBES) + " |", "|---" * (len(PROBES) + 1) + "|"]
    for name, model in hypotheses().items():
        row = [str(g.dot(model, *_operands(t, K)[:2], **_operands(t, K)[2]).to_fraction())
               for t, K in PROBES.values()]
        lines.append(f"| {name} | " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(table(), end="")
