"""README's "Wrap your own kernel as a device", run as written: wrapping a CPU torch fp32
matmul gives the same status and model as the built-in CPU adapter for the same matmul."""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import numpy as np

README = Path(__file__).resolve().parents[1] / "README.md"
MARKER = "<!-- wrap-example -->"


def readme_example() -> str:
    """The python block right after the marker (or, without it, the first python block of the
    'Wrap your own kernel as a device' section)."""
    text = README.read_text()
    at = text.find(MARKER)
    if at < 0:
        at = text.index("## Wrap your own kernel as a device")
    m = re.compile(r"```python\n(.*?)```", re.S).search(text, at)
    assert m, "README: no python block after the wrap-example marker"
    return m.group(1)


def _torch_fp32(a, b):
    import torch
    return (torch.from_numpy(a).to(torch.float32) @ torch.from_numpy(b).to(torch.float32)).double().numpy()


def wrapped_device():
    from probes.device import Device
    ns = {"my_kernel": _torch_fp32}  # the older example calls my_kernel(a, b)
    exec(compile(readme_example(), str(README), "exec"), ns)
    devs = [v for v in ns.values() if isinstance(v, Device)]
    assert len(devs) == 1, "the README example should define one Device"
    return devs[0]


def test_readme_wrap_example_matches_the_builtin_adapter():
    from probes.backends.cpu import cpu_fp32
    from probes.run import probe_device
    dev = wrapped_device()
    builtin = cpu_fp32()
    # both with the built-in adapter's K / shape settings and the example's declared formats:
    # the probe call shapes pick the CPU BLAS kernel (on an AMD EPYC, calls of M = N = the
    # batch size, the wrapped default, run one outside the family: no fit), and this test is
    # about the wrapping, not about which kernel the BLAS picks at which shape
    caps = dataclasses.replace(builtin.caps, a_format=dev.caps.a_format, b_format=dev.caps.b_format,
                               output=dev.caps.output)
    ref = dataclasses.replace(builtin, caps=caps)
    dev = dataclasses.replace(dev, caps=dataclasses.replace(
        dev.caps, probe_mn=caps.probe_mn, max_k=caps.max_k, max_batch=caps.max_batch))
    a = np.array([[1.0, 2.0 ** -24, -1.0]])
    assert np.array_equal(dev(a, a.T.copy()), ref(a, a.T.copy()))  # the same matmul
    kw = dict(quick=True, outputs=1, per_shape=False)
    mine, theirs = probe_device(dev, **kw), probe_device(ref, **kw)
    assert theirs.status in ("fit", "partial"), theirs.notes[:3]
    assert mine.status == theirs.status, mine.notes[:3]
    assert mine.model == theirs.model
