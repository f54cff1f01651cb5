"""Per-shape inference: a library that runs another kernel at some shapes."""
from probes.backends.virtual import virtual_device
from probes.run import probe_device
from probes.device import Capabilities
from probes.infer import canonical
from reference.gemm import AlignRef, GemmModel
from reference.rounding import Mode

CAPS = Capabilities("bfloat16", "bfloat16", "float32", max_k=1024, max_batch=16)
MAIN = GemmModel("hidden", fma_width=16, align_bits=25, align_mode=Mode.RTZ, align_ref=AlignRef.EXPONENT_SUM,
                 acc_frac_bits=23, norm_mode=Mode.RTZ)
OTHER = GemmModel("other", fma_width=4, align_bits=24, align_mode=Mode.RTZ, acc_frac_bits=23,
                  norm_mode=Mode.RNE)
SHAPES = ((32, 32, 64), (16, 16, 128), (8, 8, 512), (16, 16, 100))


def _dev(other, ks=(512,)):
    return virtual_device(MAIN, CAPS, "v-shapes", by_shape=lambda M, N, K: other if K in ks else None)


def test_other_kernel_at_one_shape_is_inferred_there():
    # K = 100 is not a multiple of 16: the shape's own probes must run at exactly that K
    r = probe_device(_dev(OTHER, (512, 100)), quick=True, outputs=3000, shapes=SHAPES)
    assert r.status == "fit", r.notes
    assert r.model == canonical(MAIN.replace(name="inferred"), CAPS)
    assert [s.shape for s in r.shapes] == [(8, 8, 512), (16, 16, 100)]
    for s in r.shapes:
        assert s.status == "fit", s
        assert canonical(s.model, CAPS) == canonical(OTHER.replace(name="inferred"), CAPS)
    assert r.validation["matches"] == r.validation["outputs"]
    from reports.records import device_record   # the report's form of the same result
    ents = device_record(r)["extra"]["shape_models"]
    assert [e["shape"] for e in ents] == [[8, 8, 512], [16, 16, 100]]
    assert all(GemmModel.from_dict(e["model"]) == s.model for e, s in zip(ents, r.shapes))


def test_shape_outside_the_family_makes_the_device_partial():
    r = probe_device(_dev("pairwise"), quick=True, outputs=3000, shapes=SHAPES)
    assert r.status == "partial", r.notes
    (ent,) = r.shapes
    assert ent.shape == (8, 8, 512) and ent.status == "no_fit"
    per = {tuple(s["shape"]): s for s in r.extra["per_shape"]}
    assert all(s["matches"] == s["outputs"] for k, s in per.items() if k[2] != 512)


def test_split_search_at_a_shape_and_skipping_it():
    """A split-K schedule at one shape is found by validation's split search; a shape the
    pre-check already failed (no_split_search) is not searched again and keeps its misses."""
    from probes.validate import validate
    dev = _dev(MAIN.replace(name="split", split_k=8))
    shapes = ((32, 32, 64), (32, 32, 512))
    v = validate(dev, MAIN, outputs=2000, shapes=shapes, seed=3)
    per = {tuple(s["shape"]): s for s in v.per_shape}
    found = per[(32, 32, 512)]          # S8, or its equivalent: groups of 64 in FP32 RNE
    assert (found["split_k"], found["group_size"]) in ((8, None), (1, 64))
    assert v.record["matches"] == v.record["outputs"]
    v = validate(dev, MAIN, outputs=2000, shapes=shapes, seed=3, no_split_search=[(32, 32, 512)])
    per = {tuple(s["shape"]): s for s in v.per_shape}
    assert (per[(32, 32, 512)]["split_k"], per[(32, 32, 512)]["group_size"]) == (1, None)
    assert per[(32, 32, 512)]["matches"] < per[(32, 32, 512)]["outputs"]
    assert per[(32, 32, 64)]["matches"] == per[(32, 32, 64)]["outputs"]


def test_partial_names_the_kernel_no_model_fits():
    """A device with tensor-level calls that runs an unmodelled kernel at one shape: the
    partial result names it (profiler name and family) in extra.unfitted_kernels and a note."""
    from dataclasses import replace
    from probes.device import TensorOps
    name = "void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_64x64_32x6_nn_align1>(Params)"
    dev = _dev("pairwise")
    dev = replace(dev, tensors=TensorOps(kernels=lambda b: ["gemv2T_kernel"] if b.shape[2] == 512 else [name]))
    r = probe_device(dev, quick=True, outputs=3000, shapes=SHAPES)
    assert r.status == "partial", r.notes
    (u,) = r.extra["unfitted_kernels"]
    assert u["shape"] == [8, 8, 512] and u["kernels"] == ["gemv2T_kernel"]
    assert any("kernels no model fits" in n and "gemv2T_kernel" in n for n in r.notes)
