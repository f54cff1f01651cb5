"""Inference on virtual devices with randomly drawn hidden models (seeded).

A device counts as identified when the inferred model equals the hidden one after
``probes.infer.canonical`` (provable equivalences), or else is observationally equivalent
to it: identical outputs on every generated probe pool and on 2048 random outputs
(docs/probing.md, "Equivalence").  The chunks run in parallel under pytest-xdist.
"""
import os

import numpy as np
import pytest

from probes.backends.virtual import virtual_device
from probes.infer import Inference, canonical
from reference.notation import short
from probes.testing import observationally_equivalent, random_hidden

N_DEVICES = 100
CHUNK = 5
K_CORE = 256  # probe length for the test devices (hidden split_k <= 2 keeps slices >= 128)


def _identify(seed):
    caps, hidden = random_hidden(seed)
    dev = virtual_device(hidden, caps, f"virtual-{seed}", diag_only=True)
    res = Inference(dev, quick=True, k_core=K_CORE, seed=seed).run()
    assert res.status == "fit", (seed, short(hidden), res.status, res.notes[:3])
    inferred = canonical(res.model.replace(name=hidden.name), caps)
    if inferred == hidden:
        return "exact"
    ok, why = observationally_equivalent(inferred, hidden, caps, K_CORE, seed=seed)
    assert ok, (seed, short(hidden), short(inferred), why)
    return "equivalent"


@pytest.mark.parametrize("chunk", range(N_DEVICES // CHUNK))
def test_random_virtual_devices_identified(chunk):
    kinds = [_identify(s) for s in range(chunk * CHUNK, (chunk + 1) * CHUNK)]
    print(f"chunk {chunk}: {kinds.count('exact')} exact, {kinds.count('equivalent')} equivalent")


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("FP4REF_SLOW_TESTS"), reason="about 6 minutes; set FP4REF_SLOW_TESTS=1")
def test_fp8_rowwise_bf16_output_device():
    # e4m3 operands, per-row/column scales, bf16 output: the case of torch._scaled_mm rowwise
    from reference.gemm import GemmModel
    from reference.rounding import Mode
    from probes.testing import CAPS_CHOICES
    caps = CAPS_CHOICES["e4m3-bf16-rowwise"]()
    hidden = canonical(GemmModel("hidden", fma_width=32, align_bits=13, align_mode=Mode.RTZ, acc_frac_bits=23,
                                 norm_mode=Mode.RTZ, group_size=64, outer_mode=Mode.RNE, output="bfloat16"), caps)
    dev = virtual_device(hidden, caps, "fp8-rowwise", diag_only=True)
    res = Inference(dev, quick=True, k_core=K_CORE).run()
    assert res.status == "fit", res.notes[:3]
    inferred = canonical(res.model.replace(name="hidden"), caps)
    ok, why = observationally_equivalent(inferred, hidden, caps, K_CORE)
    assert inferred == hidden or ok, why


def test_out_of_family_device_reported_with_evidence():
    from reference.gemm import GemmModel
    from probes.device import Capabilities
    caps = Capabilities("bfloat16", "bfloat16", "float32", max_k=1024, max_batch=16)
    dev = virtual_device(GemmModel("x", output="float32"), caps, "pairwise", variant="pairwise", diag_only=False)
    res = Inference(dev, quick=True).run()
    assert res.status == "no_fit"
    assert any("contradicted by probe" in n for n in res.notes)
    assert res.probes and all(p["candidates_after"] <= p["candidates_before"] for p in res.probes)


def test_nondeterministic_device_flagged():
    from reference.gemm import GemmModel
    from probes.device import Capabilities
    caps = Capabilities("bfloat16", "bfloat16", "float32", max_k=1024, max_batch=16)
    dev = virtual_device(GemmModel("x", output="float32"), caps, "noisy", nondeterministic=True, seed=3)
    res = Inference(dev, quick=True).run()
    assert res.status == "nondeterministic"
    assert any("nondeterministic" in n for n in res.notes)


def test_probe_matched_nvfp4_identified_and_validated():
    from reference.gemm import get_preset
    from probes.backends.virtual import nvfp4_caps
    from probes.validate import validate
    hidden = get_preset("probe_matched")
    dev = virtual_device(hidden, nvfp4_caps(max_k=1024, max_batch=16), "pm", diag_only=True)
    res = Inference(dev, quick=True).run()
    assert res.status == "fit"
    assert canonical(res.model.replace(name=hidden.name), dev.caps) == canonical(hidden, dev.caps)
    full = virtual_device(hidden, dev.caps, "pm-full")  # validation reads every output
    v = validate(full, res.model, outputs=3000, shapes=((16, 16, 64), (8, 8, 256)))
    assert v.record["agreement_pct"] == 100.0


@pytest.mark.parametrize("group", [None, 32])
def test_split_slices_are_not_reported_as_groups(group):
    """Split-K slice boundaries look like group boundaries at the probe K: a sequential FP32
    FMA split in 4 slices of 64 was reported as G64, which is wrong at any K with longer
    slices.  The ungrouped model is reported; a group shorter than the slices is kept."""
    from probes.device import Capabilities
    from reference.gemm import GemmModel, Mode
    hidden = GemmModel("hidden", fma_width=1, acc_frac_bits=23, norm_mode=Mode.RNE, split_k=4,
                       group_size=group, outer_mode=Mode.RNE, output="float32")
    caps = Capabilities("float32", "float32", "float32", max_k=16384, probe_mn=64, max_batch=64)
    res = Inference(virtual_device(hidden, caps, "virtual-fp32-split"), quick=True, k_core=256,
                    seed=1).run()
    assert res.status == "fit", res.notes[:3]
    assert (res.model.split_k, res.model.group_size) == (4, group), short(res.model)
