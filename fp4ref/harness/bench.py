"""`make bench`: throughput ratios taken side by side in one run, never asserted.

Each section module exposes ``run(device) -> list[dict]``; rows are printed as a
table and written atomically to --out (JSON) for the closing note / artifacts.
"""
from __future__ import annotations

import argparse
import importlib
import json
import sys
import traceback

SECTIONS = {
    "cast": "fp4ref.bench_cast",
    "quant": "fp4ref.bench_quant",
    "gemm": "fp4ref.bench_gemm",
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="fp4ref bench")
    ap.add_argument("--sections", default=",".join(SECTIONS),
                    help=f"comma list from: {', '.join(SECTIONS)}")
    ap.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    ap.add_argument("--out", default=None, help="write all rows as JSON here")
    args = ap.parse_args(argv)
    if args.device is not None and args.device not in ("cpu", "cuda"):
        print(f"bench: --device: unknown value {args.device!r}; valid choices: cpu, cuda", file=sys.stderr)
        return 2
    import torch
    if args.device == "cuda" and not torch.cuda.is_available():
        print(f"bench: --device: 'cuda' needs a CUDA GPU and torch {torch.__version__} sees none here; "
              "use --device cpu", file=sys.stderr)
        return 2
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    wanted = [s.strip() for s in args.sections.split(",") if s.strip()]
    for s in wanted:
        if s not in SECTIONS:
            print(f"bench: unknown section {s!r}; valid choices: {', '.join(SECTIONS)}", file=sys.stderr)
            return 2
    rows, failed = [], 0
    for s in wanted:
        try:
            mod = importlib.import_module(SECTIONS[s])
            got = mod.run(device)
        except Exception as e:  # one broken section must not hide the others
            failed += 1
            traceback.print_exc()
            got = [{"section": s, "error": f"{type(e).__name__}: {e}"}]
        for r in got:
            r.setdefault("section", s)
            print(json.dumps(r, default=str), flush=True)
        rows.extend(got)
    if args.out:
        from reports.schema import write_json_atomic
        write_json_atomic(args.out, {"device": device, "torch": torch.__version__,
                                 "gpu": torch.cuda.get_device_name() if device == "cuda" else None,
                                 "rows": rows})
    return 1 if failed else 0
