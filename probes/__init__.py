"""The probe suite: infer how native GEMMs accumulate from crafted operands.

device.py (protocol), backends/ (adapters + detection), grid.py (the candidate grid),
probes.py (generated probe pools), sim.py (exact vectorized simulator of reference.gemm
models), infer.py (staged, entropy-driven inference), validate.py (bit-exact validation),
recorder.py (the validation record), result.py (DeviceResult and decide_status, the one
place a device's status is decided), run.py (probe one device), workers.py (many devices,
in worker processes, under a time limit), fleet*.py (a cluster's GPUs).  Nothing here
writes reports: `fp4ref probe` is reports.probe_run.  See docs/probing.md.
"""

# Registers probes.explain.probe_shape as fp4ref.native's shape prober, so that
# fp4ref.emulate_native learns an unknown shape on first use when the device is present.
from . import explain  # noqa: E402,F401
