"""The Triton-interpreter test modules, each in a process of its own with TRITON_INTERPRET=1.

Triton decides interpreter vs compiler when it is imported, so setting the variable inside
this session would either do nothing or leak into every later test (it once routed several
quantizer profiles' auto backend to the interpreter for the whole run, so their torch paths
went unchecked).  Here the variable exists only in the child's environment; the parent
session skips the marked tests visibly and runs them through this file."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODULES = ["tests/test_gemm_triton.py", "tests/test_gemm_triton_wide.py",
           "tests/test_triton_quant_flat.py", "tests/test_triton_current_scaling.py",
           "tests/test_public_quant_fast.py", "tests/test_chain_triton.py",
           "tests/test_gemm_emulator.py"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="with CUDA the compiled kernels run in-process")
@pytest.mark.parametrize("module", MODULES)
def test_module_under_interpreter(module, pytestconfig):
    pytest.importorskip("triton")
    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("this process is itself an interpreter process")
    env = dict(os.environ, TRITON_INTERPRET="1")
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [sys.executable, "-m", "pytest", "-q", "-m", "triton_interpret", module]
    prof = pytestconfig.getoption("hypothesis_profile", None)
    if prof:
        cmd.append(f"--hypothesis-profile={prof}")
    r = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=1800)
    tail = r.stdout[-6000:] + r.stderr[-2000:]
    assert r.returncode == 0, tail
    m = re.search(r"(\d+) passed", r.stdout)
    assert m and int(m.group(1)) > 0 and "skipped" not in r.stdout.splitlines()[-1], tail
