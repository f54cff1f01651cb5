"""`fp4ref <command>`: one entry point; each command lives in its own module."""
from __future__ import annotations

import importlib
import sys

# command -> (module, function, help).  Imported lazily so one broken backend
# never stops the others from running.
COMMANDS = {
    "probe": ("probes.cli", "main", "probe native GEMMs and infer their accumulation model"),
    "bench": ("fp4ref.bench", "main", "side-by-side throughput ratios (casts, quantizers, GEMMs)"),
    "verify-exhaustive": ("fp4ref.verify", "main", "all 2**32 float32 inputs per <=8-bit format"),
    "conform": ("fp4ref.conform", "main", "conformance matrix of installed public quantizers"),
    "report": ("reports.cli", "report_main", "render report.json files to self-contained HTML"),
    "gate": ("reports.cli", "gate_main", "fail when numerics changed against a baseline"),
    "fleet": ("reports.fleet", "main", "check every GPU of a cluster against its predicted bits (torchrun/srun)"),
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: fp4ref <command> [args]\n\ncommands:")
        for name, (_, _, h) in COMMANDS.items():
            print(f"  {name:<18} {h}")
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    if cmd not in COMMANDS:
        print(f"fp4ref: unknown command {cmd!r}; valid choices: {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    problem = _device_problem(cmd, rest)
    if problem:
        print(f"fp4ref {cmd}: {problem}", file=sys.stderr)
        return 2
    mod, fn, _ = COMMANDS[cmd]
    try:
        rc = getattr(importlib.import_module(mod), fn)(rest)
    except KeyboardInterrupt:
        print(f"fp4ref {cmd}: interrupted", file=sys.stderr)
        return 130
    except ValueError as e:  # a user error (bad name, value or file) is a message, never a traceback
        print(f"fp4ref {cmd}: {e}", file=sys.stderr)
        return 2
    return int(rc or 0)


def _device_problem(cmd: str, rest: list[str]) -> str | None:
    """`--device cuda` on a machine without CUDA: say so before the command starts (the
    commands would fail deep inside torch)."""
    if cmd not in ("bench", "verify-exhaustive"):
        return None
    val = None
    for i, a in enumerate(rest):
        if a == "--device" and i + 1 < len(rest):
            val = rest[i + 1]
        elif a.startswith("--device="):
            val = a.split("=", 1)[1]
    if val is None or not val.startswith("cuda"):
        return None
    import torch
    if torch.cuda.is_available():
        return None
    return (f"--device: {val!r} needs a CUDA GPU, and torch {torch.__version__} sees none here "
            f"(torch.cuda.is_available() is False); use --device cpu")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
