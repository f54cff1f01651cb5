"""`make bench`: throughput ratios taken side by side in one run, never asserted.

Each section is a function ``run(device) -> list[dict]`` named in ``SECTIONS``; rows are
printed as JSON lines and written atomically to --out (JSON) for the closing note / artifacts.
To add a section: write ``fp4ref/harness/bench_<name>.py`` with ``run(device)`` and add one
line ``"<name>": "fp4ref.harness.bench_<name>:run"`` below.
"""
from __future__ import annotations

import argparse
import importlib
import json
import sys
import traceback

__all__ = ["SECTIONS", "main", "run_section"]

# section name -> "module:function"; imported only when the section runs, so one section's
# missing dependency never stops the others
SECTIONS = {
    "cast": "fp4ref.harness.bench_cast:run",
    "quant": "fp4ref.harness.bench_quant:run",
    "gemm": "fp4ref.harness.bench_gemm:run",
    "chain": "fp4ref.harness.bench_chain:run",
}


def run_section(name: str, device: str) -> list[dict]:
    """The rows of one section (``name`` from SECTIONS)."""
    mod, fn = SECTIONS[name].split(":")
    return getattr(importlib.import_module(mod), fn)(device)


def _parse(argv):
    ap = argparse.ArgumentParser(prog="fp4ref bench")
    ap.add_argument("--sections", default=",".join(SECTIONS),
                    help=f"comma list from: {', '.join(SECTIONS)}")
    ap.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    ap.add_argument("--out", default=None, help="write all rows as JSON here")
    return ap.parse_args(argv)


def _options(args) -> tuple[str, list[str]] | str:
    """(device, sections), or the message of the first bad option."""
    if args.device is not None and args.device not in ("cpu", "cuda"):
        return f"--device: unknown value {args.device!r}; valid choices: cpu, cuda"
    import torch
    if args.device == "cuda" and not torch.cuda.is_available():
        return (f"--device: 'cuda' needs a CUDA GPU and torch {torch.__version__} sees none here; "
                "use --device cpu")
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    wanted = [s.strip() for s in args.sections.split(",") if s.strip()]
    for s in wanted:
        if s not in SECTIONS:
            return f"unknown section {s!r}; valid choices: {', '.join(SECTIONS)}"
    return device, wanted


def main(argv=None) -> int:
    args = _parse(argv)
    opts = _options(args)
    if isinstance(opts, str):
        print(f"bench: {opts}", file=sys.stderr)
        return 2
    device, wanted = opts
    rows, failed = [], 0
    for s in wanted:
        try:
            got = run_section(s, device)
        except Exception as e:  # one broken section must not hide the others
            failed += 1
            traceback.print_exc()
            got = [{"section": s, "error": f"{type(e).__name__}: {e}"}]
        for r in got:
            r.setdefault("section", s)
            print(json.dumps(r, default=str), flush=True)
        rows.extend(got)
    if args.out:
        import torch
        from .io import write_json_atomic
        write_json_atomic(args.out, {"device": device, "torch": torch.__version__,
                                     "gpu": torch.cuda.get_device_name() if device == "cuda" else None,
                                     "rows": rows})
    return 1 if failed else 0
