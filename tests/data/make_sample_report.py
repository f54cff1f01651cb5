"""Regenerate tests/data/sample_report.json (a realistic fixture for the report tests).

    .venv/bin/python tests/data/make_sample_report.py
"""
from __future__ import annotations

import random
import struct
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from probes.recorder import mismatch_record, validation_record  # noqa: E402
from fp4ref.harness.io import write_json_atomic  # noqa: E402
from reports.records import probe_record, scan_record  # noqa: E402


def f32(x: float) -> int:
    return struct.unpack("<I", struct.pack("<f", x))[0]


def h32(x: float) -> str:
    return f"0x{f32(x):08x}"


def model(**kw) -> dict:
    m = {"name": "custom", "product_format": None, "fma_width": 1, "align_bits": None,
         "align_mode": "RTZ", "acc_frac_bits": 23, "norm_mode": "RNE", "acc_subnormal": "KEEP",
         "group_size": None, "outer_mode": "RNE", "scale_point": "PRODUCT", "lattice": None,
         "split_k": 1, "alpha_mode": "PREMULTIPLIED", "output": "float32", "output_mode": "RNE"}
    m.update(kw)
    return m


ENV = {"platform": "Linux-6.8.0-x86_64-with-glibc2.39", "python": "3.12.3", "torch": "2.11.0+cu130",
       "cuda": "13.0", "driver": "580.65.06", "gpu": "NVIDIA H200",
       "libraries": {"numpy": "2.2.6", "triton": "3.6.0", "ml_dtypes": "0.6.0", "torchao": "0.18.0",
                     "transformer_engine": None, "jinja2": "3.1.6"},
       "host": "gpu-host-01", "cpu": "x86_64"}

rng = random.Random(6)

# 1. virtual device: the reference playing probe_matched
virtual = {
    "name": "virtual: probe_matched (UE5M3 paper NVFP4 model)", "backend": "reference.gemm",
    "kind": "virtual", "capabilities": {"formats": ["float4_e2m1fn"], "block": 16, "scale": "ue4m3"},
    "hardware_run": False, "status": "fit", "error": None,
    "model": model(name="probe_matched", fma_width=64, group_size=64, outer_mode="RTZ"),
    "model_summary": "products exact; 64-product groups summed exactly and rounded RNE to FP32; "
                     "cross-group additions RTZ; output float32",
    "probes": [probe_record(
        "cross-group rounding", "outer_mode",
        "Group 0 sums to 1.0, group 1 to 2^-24 * 3: the cross-group add is inexact, so RNE and RTZ differ.",
        operands={"K": 128, "a": "[1.0, 0 x 63, 0.75*2^-22, 0 x 63]", "b": "[1.0 x 128]"},
        predictions={"outer=RNE": h32(1.0 + 2.0 ** -23), "outer=RTZ": h32(1.0)},
        observed=h32(1.0), candidates_before=6, candidates_after=3, format="float32")],
    "scans": [],
    "validation": validation_record(16384, 16384, [[64, 64, 64], [32, 32, 256], [16, 16, 1024]], [], {}),
    "wall_s": 3.2, "notes": ["Self-check of the probe suite: the inferred model must equal the planted one."],
}

# 2. cuBLAS bf16: fits
cands = {"F=1 (sequential FP32)": h32(1.0), "F=4": h32(1.0 + 2.0 ** -21),
         "F=16": h32(1.0 + 2.0 ** -20), "F=32": h32(1.0 + 2.0 ** -20)}
cublas = {
    "name": "cuBLAS bf16 matmul (H200)", "backend": "torch.matmul (cuBLAS, bf16 in, fp32 accumulate)",
    "kind": "cuda", "capabilities": {"sm": "9.0", "dtypes": ["bfloat16"], "tensor_cores": True},
    "hardware_run": True, "status": "fit", "error": None,
    "model": model(fma_width=16, align_bits=26, align_mode="RTZ", norm_mode="RTZ", group_size=128,
                   outer_mode="RNE", output="bfloat16"),
    "model_summary": "products exact; 16 products + accumulator fused per step, aligned to the largest "
                     "exponent keeping 23+3 bits, truncated; normalized with RTZ; promoted to FP32 every "
                     "128 products; output RNE to bf16",
    "probes": [
        probe_record("product exactness", "product_format",
                     "(1+2^-7)^2 = 1 + 2^-6 + 2^-14 needs 15 bits: exact products keep 2^-14, "
                     "bf16-rounded products lose it.",
                     operands={"K": 1, "a": [h32(1.0 + 2 ** -7)], "b": [h32(1.0 + 2 ** -7)], "output": "float32"},
                     predictions={"exact": h32((1 + 2 ** -7) ** 2), "rounded to bfloat16": h32(1.0 + 2 ** -6)},
                     observed=h32((1 + 2 ** -7) ** 2), candidates_before=96, candidates_after=48,
                     format="float32"),
        probe_record("swamping: 1 + 16 x 2^-24", "fma_width",
                     "A leading 1.0 followed by sixteen 2^-24 terms. Sequential FP32 drops each small term; "
                     "a fused step of F products adds F of them before rounding.",
                     operands={"K": 17, "a": "[1.0, 2^-24 x 16]", "b": "[1.0 x 17]", "output": "float32"},
                     predictions=cands, observed=h32(1.0 + 2.0 ** -20), candidates_before=48,
                     candidates_after=12, format="float32"),
        probe_record("alignment width", "align_bits",
                     "Terms 2^-26 below the leading term survive alignment only with 3 or more extra bits.",
                     operands={"K": 16, "a": "[1.0, 2^-26 x 15]", "b": "[1.0 x 16]", "output": "float32"},
                     predictions={"W=23+0": h32(1.0), "W=23+3 (truncate)": h32(1.0 + 2.0 ** -23),
                                  "W=23+3 (RNE)": h32(1.0 + 2.0 ** -22)},
                     observed=h32(1.0 + 2.0 ** -23), candidates_before=12, candidates_after=2,
                     format="float32"),
        probe_record("promotion interval", "group_size",
                     "A cancellation crossing product 128 only survives if the partial sum is promoted to "
                     "FP32 at that boundary.",
                     operands={"K": 256, "perturbed_index": [127, 128], "output": "float32"},
                     predictions={"P=64": h32(0.5), "P=128": h32(0.75), "never": h32(0.0)},
                     observed=h32(0.75), candidates_before=2, candidates_after=1, format="float32"),
    ],
    "scans": [
        scan_record("group-boundary scan", list(range(0, 257, 8)),
                    [0 if k < 128 else 1 for k in range(0, 257, 8)],
                    xlabel="position k of the small term", ylabel="output change (ULP)", kind="scatter",
                    description="The small term counts only from k = 128 on: the promotion interval is 128."),
        scan_record("error vs K", [64, 128, 256, 512, 1024, 2048, 4096, 8192],
                    [0.21, 0.35, 0.52, 0.81, 1.2, 1.9, 2.8, 4.1],
                    xlabel="K", ylabel="mean |error| vs exact (ULP of fp32)", xscale="log", yscale="log",
                    description="Truncating alignment makes the error grow with K."),
    ],
    "validation": validation_record(1048576, 1048576, [[256, 256, 256], [128, 64, 4096], [64, 64, 8192]], [], {}),
    "wall_s": 41.7, "notes": [],
}

# 3. FP8 fast-accum: no fit
rows, hist = [], {"1": 1201, "2": 301, "3": 97, "4": 31, "8": 12, "16": 3, "nonfinite": 1}
for i, u in enumerate([1, 1, 2, 1, 3, 1, 4, 2, 8, 1, 16]):
    x = rng.uniform(-40, 40)
    e = f32(x)
    g = e + (u if rng.random() < 0.5 else -u)
    rows.append(mismatch_record([rng.randrange(256), rng.randrange(256)], [256, 256, 4096], "float32", e, g))
rows.append(mismatch_record([17, 3], [256, 256, 4096], "float32", 0x7F800000, 0x7FC00000))
fp8 = {
    "name": "torch._scaled_mm e4m3 use_fast_accum=True (H200)",
    "backend": "torch._scaled_mm (cuBLASLt, e4m3 x e4m3, tensorwise scales)", "kind": "cuda",
    "capabilities": {"sm": "9.0", "a": "float8_e4m3fn", "b": "float8_e4m3fn", "fast_accum": True},
    "hardware_run": True, "status": "no_fit", "error": None,
    "model": model(fma_width=4, align_bits=13, align_mode="RTZ", acc_frac_bits=13, norm_mode="RTZ"),
    "model_summary": "closest candidate: 4-wide fused steps keeping 13 bits, truncated; "
                     "97.5% agreement, so not a fit",
    "probes": [probe_record(
        "accumulator width", "acc_frac_bits",
        "1 + 2^-k for k = 10..24: the largest k that survives accumulation gives the kept fraction bits.",
        operands={"K": 32, "k": list(range(10, 25)), "scale_a": 1.0, "scale_b": 1.0},
        predictions={"W=23": h32(1 + 2 ** -14), "W=13": h32(1.0), "W=10": h32(1.0)},
        observed=h32(1.0), candidates_before=40, candidates_after=9, format="float32")],
    "scans": [scan_record("error vs K", [32, 64, 128, 256, 512, 1024, 2048, 4096],
                          [0.4, 1.1, 2.9, 7.5, 16.0, 35.0, 70.0, 141.0], xlabel="K",
                          ylabel="max |error| (ULP of fp32)", xscale="log", yscale="log")],
    "validation": validation_record(65536, 65536 - 1646, [[256, 256, 4096]], rows, hist),
    "wall_s": 12.9,
    "notes": ["Outputs depend on the K-blocking of the chosen cuBLASLt kernel; no single model fits."],
}

# 4. Blackwell-only path: skipped
nvfp4 = {
    "name": "NVFP4 block-scaled torch._scaled_mm", "backend": "torch._scaled_mm (float4_e2m1fn_x2, swizzled ue4m3 scales)",
    "kind": "blackwell-only", "capabilities": {"needs": "sm_100"}, "hardware_run": False,
    "status": "skipped", "error": None, "model": None, "model_summary": "", "probes": [], "scans": [],
    "validation": None, "wall_s": 0.0,
    "notes": ["This GPU is sm_90 (Hopper); NVFP4 tensor-core GEMMs need sm_100 or newer."],
}

# 5. error
te = {
    "name": "Transformer Engine NVFP4 GEMM", "backend": "transformer_engine.pytorch general_gemm",
    "kind": "cuda", "capabilities": {}, "hardware_run": False, "status": "error",
    "error": "ImportError: transformer_engine_torch (the compiled extension) is not installed",
    "model": None, "model_summary": "", "probes": [], "scans": [], "validation": None, "wall_s": 0.4,
    "notes": [],
}

# 6. host BLAS
cpu = {
    "name": "host BLAS float32 (torch.matmul, CPU)", "backend": "torch.matmul (MKL/oneDNN)", "kind": "cpu",
    "capabilities": {"dtypes": ["float32"]}, "hardware_run": True, "status": "fit", "error": None,
    "model": model(fma_width=1, split_k=1), "model_summary": "sequential FP32 with RNE after every add",
    "probes": [], "scans": [],
    "validation": validation_record(262144, 262144, [[64, 64, 64]], [], {}), "wall_s": 1.1, "notes": [],
}

cells = [
    dict(implementation="torchao NVFP4Tensor.to_nvfp4", profile="nvfp4_te", status="agree", cases=4096,
         agree=4096, reason=None, counterexample=None),
    dict(implementation="torchao NVFP4Tensor.to_nvfp4", profile="nvfp4_ue5m3", status="skipped", cases=0,
         agree=0, reason="torchao has no ue5m3 scale format", counterexample=None),
    dict(implementation="TE NVFP4QuantizerRef", profile="nvfp4_te", status="agree", cases=4096, agree=4096,
         reason=None, counterexample=None),
    dict(implementation="TE NVFP4QuantizerRef", profile="mxfp4_ocp", status="skipped", cases=0, agree=0,
         reason="UnboundLocalError in the pow_2_scales path (TE 2.20.2)", counterexample=None),
    dict(implementation="torch .to(float8_e4m3fn)", profile="e4m3_rne_satfinite", status="agree",
         cases=4294967296, agree=4294967296, reason=None, counterexample=None),
    dict(implementation="ml_dtypes float8_e4m3fn", profile="e4m3_rne_satfinite", status="disagree",
         cases=4294967296, agree=4294967296 - 2 * 8388608 * 30, reason="no saturation above 464",
         counterexample={"input_bits": h32(464.0), "input_format": "float32", "format": "float8_e4m3fn",
                         "expected_bits": "0x7e", "got_bits": "0x7f",
                         "note": "profile saturates to 448; ml_dtypes gives NaN"}),
    dict(implementation="ml_dtypes float4_e2m1fn", profile="e2m1_rne_satfinite", status="agree",
         cases=4294967296, agree=4294967296, reason=None, counterexample=None),
]

report = {
    "schema": "fp4ref.report", "schema_version": 1, "created": "2026-11-30T03:12:45Z",
    "fp4ref_version": "0.1.0", "title": "fp4ref agreement report: H200 probe run",
    "command": "fp4ref probe --all", "environment": ENV,
    "devices": [virtual, cublas, fp8, nvfp4, te, cpu],
    "conformance": {"schema": "fp4ref.conformance", "schema_version": 1, "cells": cells},
}

if __name__ == "__main__":
    out = Path(__file__).with_name("sample_report.json")
    write_json_atomic(out, report)
    print(out)
