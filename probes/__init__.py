"""The probe suite: infer how native GEMMs accumulate from crafted operands.

device.py (protocol), backends/ (adapters + detection), probes.py (generated probe pools),
sim.py (exact vectorized simulator of reference.gemm models), infer.py (staged,
entropy-driven inference), validate.py (bit-exact validation), cli.py (`fp4ref probe`).
See docs/probing.md.
"""
