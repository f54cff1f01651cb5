"""One make-probe report.json in a few lines: how many devices per status, and for each one
not fit, the shapes and kernel families left uncovered (``extra.unfitted_kernels``).

    python scripts/probe_summary.py PATH/report.json
"""
from __future__ import annotations

import json
import sys
from collections import Counter


def summary(report: dict) -> str:
    lines = [str(Counter(d["status"] for d in report["devices"]))]
    for d in report["devices"]:
        if d["status"] != "fit":
            u = (d.get("extra") or {}).get("unfitted_kernels") or []
            lines.append(f"{d['name']} {d['status']} "
                         f"{[(x['shape'], x['family'][:60]) for x in u]}")
    return "\n".join(lines)


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        print(summary(json.load(f)))
