"""Where a report was made: the environment (versions, GPU, driver, CPU identity), the
machine's names (its reports folder, its gate baseline) and the UTC time stamp.

Versions are read without importing heavy modules; CUDA details only if torch is already
imported; the driver from nvidia-smi.
"""
from __future__ import annotations

import datetime as _dt
import platform
import re
import shutil
import subprocess
import sys
from importlib import metadata
from typing import Iterable

__all__ = ["collect_environment", "cpu_identity", "utc_now", "machine_slug", "baseline_key"]


def utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def collect_environment(libraries: Iterable[str] = ("numpy", "triton", "ml_dtypes", "torchao",
                                                     "transformer_engine", "jinja2")) -> dict:
    """Versions without importing heavy modules; CUDA details only if torch is already imported."""
    env = {"platform": platform.platform(), "python": platform.python_version(),
           "torch": _version("torch"), "cuda": None, "driver": None, "gpu": None,
           "libraries": {}, "host": platform.node() or None, "cpu": platform.machine() or None}
    for lib in libraries:
        env["libraries"][lib] = _version(lib) or _version(lib.replace("_", "-"))
    env["extra"] = cpu_identity()
    torch = sys.modules.get("torch")
    if torch is not None:
        env["torch"] = getattr(torch, "__version__", env["torch"])
        env["cuda"] = getattr(getattr(torch, "version", None), "cuda", None)
        try:
            if torch.cuda.is_available():
                env["gpu"] = torch.cuda.get_device_name(0)
        except Exception:
            pass
    if env["gpu"] and shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=10)
            env["driver"] = out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None
        except (OSError, subprocess.SubprocessError):
            pass
    return env


_ISA_FLAGS = ("avx", "avx2", "fma", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_tile",
              "asimd", "sve", "sve2", "bf16", "i8mm")


def cpu_identity() -> dict:
    """The CPU model and the ISA extensions that decide which kernels a host BLAS runs
    (a CPU baseline is keyed by these and the torch version)."""
    model, flags = None, set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                k, _, v = line.partition(":")
                k = k.strip().lower()
                if k in ("model name", "cpu model") and not model:
                    model = v.strip()
                elif k in ("flags", "features") and not flags:
                    flags = set(v.split())
                if model and flags:
                    break
    except OSError:
        pass
    return {"cpu_model": model or platform.processor() or None,
            "cpu_isa": sorted(f for f in _ISA_FLAGS if f in flags)}


def machine_slug(environment: dict | None = None) -> str:
    """'nvidia-h200' from the GPU name, else 'cpu-x86_64': the <device> level of reports/<device>/<stamp>/."""
    env = environment if environment is not None else collect_environment()
    name = env.get("gpu") or f"cpu-{env.get('cpu') or 'unknown'}"
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "unknown"


def baseline_key(environment: dict | None = None) -> str:
    """The name a gate baseline of this machine goes by: the GPU and driver, or for a CPU-only
    machine the CPU model and the ISA extensions that pick its BLAS kernels; then torch.
    E.g. 'cpu-x86-64-intel-r-xeon-r-processor-amx-bf16-avx512f-torch2.13.0'."""
    env = environment if environment is not None else collect_environment()
    x = env.get("extra") or {}
    if env.get("gpu"):
        parts = [env["gpu"], env.get("driver") or "driver-unknown"]
    else:
        isa = [f for f in x.get("cpu_isa") or [] if f in ("avx512f", "amx_bf16", "avx512_bf16", "sve", "bf16")]
        parts = [f"cpu-{env.get('cpu') or 'unknown'}", x.get("cpu_model") or "", *isa]
    parts.append(f"torch{env.get('torch') or 'none'}")
    return re.sub(r"[^a-z0-9.]+", "-", " ".join(p for p in parts if p).lower()).strip("-")
