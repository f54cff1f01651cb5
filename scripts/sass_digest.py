"""Offline SASS of the flat quantizer kernels (sm_90, Triton's bundled ptxas and nvdisasm;
no GPU needed): per kernel specialization, instruction count, ALU-pipe and FMA-pipe counts
and a digest of the instruction stream.  Two identical digests mean the GPU runs the same
code, so a refactor of the Triton source can be checked without device time.

    python scripts/sass_digest.py > before.txt; (edit); python scripts/sass_digest.py | diff before.txt -
"""
from __future__ import annotations

import collections
import hashlib
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402

from fp4ref.quant import triton_quant as T  # noqa: E402

# Hopper issues these at half the FP32 rate (the ALU pipe); FFMA/FMUL/FADD/IMAD use the FMA pipe
ALU = {"LOP3", "SHF", "FMNMX", "ISETP", "SEL", "FSETP", "VIMNMX", "VIMNMX3", "VIADDMNMX", "SGXT",
       "FSEL", "PLOP3", "PRMT", "LEA", "IADD3", "VIADD", "I2FP", "F2I", "MOV"}
FMA = {"FMUL", "FADD", "FFMA", "IMAD"}


def sass(fn, sig: dict, consts: dict, num_warps: int, aligned=()) -> str:
    attrs = {(i,): [["tt.divisibility", 16]] for i, k in enumerate(sig) if k in aligned}
    src = triton.compiler.ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs)
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=num_warps))
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(k.asm["cubin"])
        f.flush()
        return subprocess.run([triton.__path__[0] + "/backends/nvidia/bin/nvdisasm", "-c", f.name],
                              capture_output=True, text=True, check=True).stdout


def specializations():
    flat = {"x_ptr": "*i32", "q_ptr": "*i64", "s_ptr": "*u8", "par_ptr": "*fp32",
            "amax_ptr": "*fp32", "NB": "i32"}
    for fmt, z in (("ue4m3", False), ("ue5m3", True)):
        mb, bias, mc, nanc, ieee, smax, one = T._SCALE[fmt]
        for fused, canon in ((False, False), (True, False), (True, True)):
            sig = dict(flat, amax_ptr="*i16" if canon else "*fp32")
            yield f"flat-{fmt}-fused{int(fused)}-canon{int(canon)}", T._two_level_flat_kernel, sig, dict(
                NBLK=512, SMBITS=mb, SBIAS=bias, SNAN=nanc, SMAX=smax, ZERO_TO_ONE=z, ONE_CODE=one,
                I64=False, FUSED=fused, CANON=canon, C=2688.0 if fused else 0.0,
                SIXTH=T._sixth() if fused else 0.0, ZERO_ONE=fused), 4, tuple(sig)
        sig = {"x_ptr": "*bf16", "q_ptr": "*u8", "s_ptr": "*u8", "par_ptr": "*fp32", "M": "i32",
               "K": "i32", "stride_x": "i32"}
        yield f"tile-{fmt}", T._two_level_kernel, sig, dict(
            BM=32, BK=128, SMBITS=mb, SBIAS=bias, SMAXCODE=mc, SNAN=nanc, SIEEE=ieee, SMAX=smax,
            ZERO_TO_ONE=z, ONE_CODE=one, IS_BF16=True), 4, ("x_ptr", "q_ptr", "s_ptr", "par_ptr")
    sig = {"x_ptr": "*i32", "q_ptr": "*i64", "s_ptr": "*u8", "NB": "i32"}
    yield "mx-flat", T._mx_flat_kernel, sig, dict(NBLK=512, I64=False), 4, tuple(sig)


def main() -> int:
    for name, fn, sig, consts, nw, aligned in specializations():
        lines = [ln for ln in sass(fn, sig, consts, nw, aligned).splitlines()
                 if re.match(r"\s+/\*[0-9a-f]{4}\*/", ln)]
        ops = collections.Counter(m.group(2) for ln in lines if (m := re.match(
            r"\s*/\*[0-9a-f]+\*/\s+(@!?U?P\w+\s+)?([A-Z0-9_]+)", ln)))
        alu = sum(v for k, v in ops.items() if k in ALU)
        fma = sum(v for k, v in ops.items() if k in FMA)
        print(f"{name:28s} {len(lines):5d} instr  alu {alu:5d}  fma {fma:5d}  "
              f"sha1 {hashlib.sha1(chr(10).join(lines).encode()).hexdigest()[:12]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
