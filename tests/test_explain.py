"""probes.explain: the schedule a device runs at a shape, inferred from its outputs only.

Oracle: virtual devices with a hidden, randomly drawn shape -> schedule function (split-K
and promotion group chosen by shape, as cuBLAS does).  Their kernel names are opaque
hashes, so explain cannot read the answer; the found model must reproduce the device bit
for bit on a fresh batch at that shape (the simulator against the device's own outputs).
"""
from __future__ import annotations

import hashlib

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fp4ref.native import ScheduleTable, emulate_native
from probes.backends.virtual import virtual_device
from probes.device import Capabilities, DeviceError
from probes.explain import (boundary_positions, candidate_models, crafted_split_probe, explain_shape,
                            rank_by_probe, split_candidates)
from probes.sim import output_bits, simulate_gemm
from reference.gemm import GemmModel
from reference.notation import parse_short

BF16 = parse_short("F=16 align=25:RTZ:esum acc=23:RTZ G=- out=float32:RNE")
FP8 = parse_short("F=32 align=13:RTZ:esum acc=13:RTZ G=128:RNE alpha=REVERSED out=bfloat16:RNE")
CAPS = {"bf16": (BF16, Capabilities("bfloat16", "bfloat16", "float32", max_k=16384)),
        "fp8": (FP8, Capabilities("float8_e4m3fn", "float8_e4m3fn", "bfloat16", alpha="rowwise",
                                  k_multiple=16, mn_multiple=16, max_k=16384))}


def hidden_device(kind: str, seed: int):
    """A virtual device whose schedule depends on the shape through a hidden random rule:
    below a drawn M*N threshold and above a drawn K it splits K (a drawn candidate of that
    K), otherwise it runs the base model.  Kernel names hash the schedule with a secret salt."""
    base, caps = CAPS[kind]
    rng = np.random.default_rng(seed)
    mn_max, k_min, pick = int(rng.integers(64, 2000)), int(rng.integers(32, 400)), int(rng.integers(1 << 30))
    salt = rng.bytes(8)

    def schedule(M, N, K):
        if M * N > mn_max or K < k_min:
            return None
        cands = list(split_candidates(base, K))
        return cands[pick % len(cands)] if cands else None

    def names(M, N, K):
        m = schedule(M, N, K)
        h = hashlib.sha256(salt + repr(m).encode()).hexdigest()[:12]
        return [f"virtual_gemm_{h}"]
    dev = virtual_device(base, caps, f"virtual-hidden-{kind}-{seed}", by_shape=schedule, kernel_names=names)
    return dev, base, schedule


def _fresh_check(dev, model, shape, seed) -> bool:
    """``model`` against the device on a fresh random batch at ``shape``, every output."""
    b = dev.draw(*shape, seed + 1000)
    got = dev.call_tensors(b).double().numpy()
    np_ = lambda t: None if t is None else t.double().numpy()  # noqa: E731
    alpha = None if b.alpha is None else tuple(x if isinstance(x, float) else np_(x) for x in b.alpha)
    exp = simulate_gemm(model, np_(b.a), np_(b.b), alpha=alpha)
    return np.array_equal(exp, output_bits(got, dev.caps.output))


def _shape(kind, rng):
    if kind == "fp8":
        return (16 * int(rng.integers(1, 3)), 16 * int(rng.integers(1, 3)), 16 * int(rng.integers(2, 40)))
    return (int(rng.integers(1, 14)), int(rng.integers(1, 14)), int(rng.integers(8, 640)))


@pytest.mark.parametrize("seed", range(20))
def test_explain_finds_hidden_schedule(seed):
    kind = ("bf16", "fp8")[seed % 2]
    dev, base, schedule = hidden_device(kind, seed)
    rng = np.random.default_rng(seed)
    shape = _shape(kind, rng)
    e = explain_shape(dev, shape, base_model=base, seed=seed, outputs=256)
    assert e.exact, (shape, e)
    assert e.source == "probe" and e.shape == shape and e.device == dev.name
    assert _fresh_check(dev, e.model, shape, seed), (shape, e.model, schedule(*shape))
    hidden = schedule(*shape) or base
    # the split found is the hidden one whenever the two differ on a fresh batch
    if e.model.split_k != hidden.split_k:
        assert _fresh_check(dev, hidden, shape, seed)


@settings(max_examples=4)
@given(st.integers(0, 10_000))
def test_explain_hypothesis(seed):
    dev, base, _ = hidden_device("bf16", seed)
    shape = _shape("bf16", np.random.default_rng(seed))
    e = explain_shape(dev, shape, base_model=base, seed=seed, outputs=64)
    assert e.exact and _fresh_check(dev, e.model, shape, seed)


def test_crafted_probe_ranks_hidden_split_first():
    base, caps = CAPS["bf16"]
    for hidden in (base.replace(split_k=4), base.replace(split_k=3, split_tile=64), base):
        dev = virtual_device(base, caps, "v", by_shape=lambda M, N, K, h=hidden: h)
        K = 960
        cands = candidate_models([base], K)
        zero = crafted_split_probe(dev, (8, 8, K), boundary_positions(cands, K, 128))
        ranked = rank_by_probe(cands, K, zero)
        assert ranked[0].split_k == hidden.split_k, (hidden, ranked[:3])


def test_split_candidates_distinct_and_valid():
    for K in (1, 7, 64, 1000, 4096):
        c = list(split_candidates(BF16, K))
        assert len(c) == len(set(c)) and BF16 not in c
        for m in c:
            m.plan(K)  # each schedule is valid at this K


def test_table_hit_and_kernel_names():
    dev, base, _ = hidden_device("bf16", 3)
    t = ScheduleTable()
    e = explain_shape(dev, (5, 6, 200), base_model=base, table=t, outputs=30)
    assert len(t) == 1 and e.kernels and e.kernels[0].startswith("virtual_gemm_")
    again = explain_shape(dev, (5, 6, 200), base_model=base, table=t)
    assert again.source == "table" and again.model == e.model


def test_emulate_native_matches_device_and_probes_on_first_use():
    dev, base, _ = hidden_device("bf16", 7)
    t = ScheduleTable()
    explain_shape(dev, (9, 5, 300), base_model=base, table=t, outputs=45)
    for shape in ((9, 5, 300), (4, 3, 500)):  # the second is probed on first use (device present)
        b = dev.draw(*shape, 11)
        got = dev.call_tensors(b)
        out = emulate_native(dev, b.a, b.b, table=t)
        assert torch.equal(out.view(torch.int32), got.view(torch.int32))
    assert len(t) == 2
    with pytest.raises(ValueError, match=r"shape \(2, 2, 64\) is unknown for .*fp4ref explain"):
        emulate_native(dev.name, torch.ones(2, 64), torch.ones(64, 2), table=t)


def test_emulate_native_rowwise_alpha_bit_exact():
    dev, base, _ = hidden_device("fp8", 2)
    t = ScheduleTable()
    explain_shape(dev, (16, 32, 320), base_model=base, table=t, outputs=128)
    b = dev.draw(16, 32, 320, 5)
    got = dev.call_tensors(b)
    out = emulate_native(dev.name, b.a, b.b, alpha=b.alpha, table=t)
    assert torch.equal(out.view(torch.int32), got.view(torch.int32))


def test_device_tensor_calls_default_path():
    base, caps = CAPS["fp8"]
    dev = virtual_device(base, caps, "v8")
    b = dev.draw(16, 16, 32, 0)
    assert b.shape == (16, 16, 32) and b.a.dtype == torch.float64 and dev.kernels(b) == []
    with pytest.raises(DeviceError, match="multiples of 16"):
        dev.draw(15, 16, 32, 0)
    with pytest.raises(ValueError, match="K: must be an integer"):
        dev.draw(16, 16, 0, 0)


def test_explain_bad_inputs():
    dev, base, _ = hidden_device("bf16", 1)
    with pytest.raises(ValueError, match="shape"):
        explain_shape(dev, (1, 2), base_model=base)
    with pytest.raises(TypeError, match="base_model"):
        explain_shape(dev, (1, 2, 3), base_model="bf16")
    assert isinstance(base, GemmModel)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["cuda-cublas-bfloat16", "cuda-scaled_mm-e4m3-tensorwise-fast-float32"])
def test_explain_cuda(name):
    from probes.backends import detect
    found = detect(include=lambda s: s.name == name)
    if not found or found[0].device is None:
        pytest.skip(f"{name} not available here")
    dev = found[0].device
    base = {"cuda-cublas-bfloat16": BF16,
            "cuda-scaled_mm-e4m3-tensorwise-fast-float32":
                parse_short("F=32 align=13:RTZ:esum acc=13:RTZ G=- out=float32:RNE")}[name]
    b = dev.draw(64, 48, 256, 0)
    out = dev.call_tensors(b)
    assert out.dtype == torch.float32 and out.shape == (64, 48) and out.is_cuda
    # the profiler's names (H200: "nvjet_sm90_tss_64x112_...", "cutlass_75_tensorop_...")
    assert [k for k in dev.kernels(b) if not k.startswith("Memset")]
    e = explain_shape(dev, (64, 48, 256), base_model=base, outputs=1024)
    assert e.checked_outputs == 1024 and e.kernels


def test_out_of_family_shape_is_reported_not_exact():
    base, caps = CAPS["bf16"]
    dev = virtual_device(base, caps, "v-pairwise", by_shape=lambda M, N, K: "pairwise" if K == 96 else None)
    t = ScheduleTable()
    e = explain_shape(dev, (6, 5, 96), base_model=base, table=t, outputs=30, budget_s=5)
    assert not e.exact and e.matches < e.checked_outputs == 30
    b = dev.draw(6, 5, 96, 1)
    with pytest.raises(ValueError, match="not bit-exact"):
        emulate_native(dev.name, b.a, b.b, table=t)


def test_explain_reuses_a_given_batch():
    dev, base, _ = hidden_device("bf16", 4)
    b = dev.draw(7, 6, 300, 9)
    calls = dev.calls
    e = explain_shape(dev, (7, 6, 300), base_model=base, batch=b, native=dev.call_tensors(b), outputs=42)
    assert e.exact
    assert dev.calls - calls >= 1  # the native call above, then only crafted probes
    with pytest.raises(ValueError, match="batch: shape"):
        explain_shape(dev, (7, 6, 301), base_model=base, batch=b)


def test_cublaslt_heuristic_never_raises():
    from probes.explain import cublaslt_heuristic
    assert "error" in cublaslt_heuristic("cpu-torch-fp32", (8, 8, 64))
    h = cublaslt_heuristic("cuda-cublas-bfloat16", (64, 1920, 5760))
    assert "error" in h or isinstance(h["split_k"], int)


@pytest.mark.gpu
def test_cublaslt_heuristic_reads_an_algorithm():
    from probes.explain import cublaslt_heuristic
    h = cublaslt_heuristic("cuda-cublas-bfloat16", (64, 1920, 5760))
    assert "error" not in h and h["split_k"] >= 1, h


# --- kernels that reorder K (residue-first k-tiles, probes.kernels) ---------------------------

_XMMA = ("sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize64x128x8_stage3_warpsize1x4x1_ffma_aligna4_"
         "alignc4_execute_kernel__5x_cublas", "cuda-cublas-fp32", "float32")
_S1688 = ("void cutlass::Kernel2<cutlass_75_tensorop_s1688gemm_bf16_256x128_nn_align1>(Params)",
          "cuda-cublas-bfloat16", "bfloat16")


_TRITON0 = ("mm_fp8", "triton-dot-e4m3-imprecise-0", "float8_e4m3fn")
_S1688_16 = ("void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_64x64_16x6_nn_align4>(Params)",
             "cuda-cublas-tf32", "tf32")


@pytest.mark.parametrize("K,S,kernel", [(1000, 1, _S1688), (2872, 13, _S1688), (4131, 3, _S1688),
                                        (1003, 5, _XMMA), (777, 3, _XMMA), (301, 1, _TRITON0),
                                        (256, 1, _TRITON0), (100, 13, _S1688_16), (48, 12, _S1688_16)])
def test_residue_first_kernel_found_and_emulated(K, S, kernel):
    """A device computing like the H200's cutlass_75 s1688 bf16 kernel (partial k-tile first,
    S slices rounded to 8) reporting that kernel's name: explain finds (model, KLayout) and
    emulate_native reproduces a fresh batch bit for bit.  Oracle: the device runs
    simulate_gemm on probes.kernels.kernel_operands' padded operands."""
    from probes.device import Device, TensorOps
    from probes.kernels import kernel_models, kernel_operands
    name, dname, fmt = kernel
    row = kernel_models(dname, [name])[0]
    caps = Capabilities(fmt, fmt, "float32", max_k=16384)

    def fn(a, b, **_):
        a2, b2, m = kernel_operands(row, a, b, S)
        from probes.sim import bits_to_float
        return bits_to_float(simulate_gemm(m, a2, b2), "float32")
    dev = Device(dname, "virtual kernel K order", "virtual", caps, fn,
                 tensors=TensorOps(kernels=lambda batch: [name]))
    table = ScheduleTable()
    e = explain_shape(dev, (9, 7, K), base_model=BF16, table=table, outputs=63, budget_s=60)
    assert e.exact and (S == 1 or e.layout is not None), e
    if e.layout is not None:
        assert e.layout.k_tile == (row.k_tile or row.split_interleave or len(row.k_order)), e
    b = dev.draw(9, 7, K, 77)
    got = dev.call_tensors(b)
    emu = emulate_native(dname, b.a, b.b, table=table)
    assert torch.equal(got.float().view(torch.int32), emu.view(torch.int32))
    again = ScheduleTable.from_dict(table.to_dict())   # the layout survives the table file
    hit = again.lookup(dname, (9, 7, K))
    assert (hit.layout, hit.model) == (e.layout, e.model)


def test_batch_sub_restricts_operands_and_alpha():
    """Batch.sub: the GEMM of some rows / columns; tensorwise alpha (float or one-element
    tensor) as a float, rowwise vectors indexed (oracle: plain indexing of the full batch)."""
    import torch
    from probes.device import Batch
    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(5, 7, generator=g), torch.randn(7, 6, generator=g)
    sa, sb = torch.rand(5, generator=g), torch.rand(6, generator=g)
    r, c = torch.tensor([0, 3, 4]), torch.tensor([1, 5])
    for alpha, want in (((2.0, torch.tensor([0.5])), (2.0, 0.5)),
                        ((sa, sb), (sa[r], sb[c]))):
        s = Batch(a, b, alpha=alpha).sub(r, c)
        assert torch.equal(s.a, a[r]) and torch.equal(s.b, b[:, c])
        for got, exp in zip(s.alpha, want):
            if isinstance(exp, float):
                assert isinstance(got, float) and got == exp
            else:
                assert torch.equal(got, exp)
    assert Batch(a, b).sub(slice(0, 2), slice(0, 3)).alpha is None


def test_layout_candidates_cover_in_order_rows_and_the_predicted_split():
    """Rows that keep K in order (cuBLAS SIMT sgemm: contiguous slices rounded to 4) give
    candidates too, and a split count the library predicts beyond split_counts' range (75
    slices were seen) is among them; predicted_first puts it first."""
    from probes.explain import layout_candidates, predicted_first
    name = "void cutlass::Kernel2<cutlass_80_simt_sgemm_256x128_8x4_nn_align1>(Params)"
    c = layout_candidates("cuda-cublas-fp32", [name], 8743, "float32")
    got = {(m.split_k, m.split_tile) for m, lay in c if lay is None}
    assert (3, 4) in got and (1, None) in got
    c = layout_candidates("cuda-cublas-fp32", [name], 12504, "float32", predicted=75)
    first = predicted_first(c, 75)[0][0]
    assert (first.split_k, first.split_tile) == (75, 4)
    # a k-tile row: cuBLASLt's 88 slices of 12213 launch as 85 of 144 (empty ones dropped);
    # the candidate laid out for 88 still comes first (f16 48x330x12213 on the H200)
    name = "void cutlass::Kernel2<cutlass_75_tensorop_s1688gemm_f16_128x64_nn_align1>(Params)"
    m, lay = predicted_first(layout_candidates("cuda-cublas-float16", [name], 12213, "float32", 88), 88)[0]
    assert (lay.split_k, lay.split_align, m.split_k) == (88, 8, 85)


def test_probe_validation_explains_kernel_order_shapes():
    """make probe's validation of a device whose kernel reads K in an order no probe-family
    model has (Triton imprecise-0's kWidth-4 chunks): the inference's no_fit falls back to
    the kernel table's row, every shape the row misses in natural K order is explained at
    that shape (its KLayout), and the validation on fresh batches then matches bit for bit.
    Oracle: the virtual device runs simulate_gemm on kernel_operands' permuted operands."""
    from types import SimpleNamespace
    from probes.device import Device, TensorOps
    from probes.kernels import device_model, kernel_models, kernel_operands
    from probes.run import _kernel_row_fallback, explain_shapes, precheck_shapes
    from probes.sim import bits_to_float
    from probes.validate import validate
    name, dname, fmt = _TRITON0
    row = kernel_models(dname, [name])[0]

    def fn(a, b, **_):
        a2, b2, m = kernel_operands(row, a, b, 1)
        return bits_to_float(simulate_gemm(m, a2, b2), "float32")
    dev = Device(dname, "virtual kernel K order", "virtual", Capabilities(fmt, fmt, "float32", max_k=16384), fn,
                 tensors=TensorOps(kernels=lambda batch: [name]))
    res, ev = SimpleNamespace(status="no_fit", model=None), {"notes": [], "extra": {}}
    _kernel_row_fallback(dev, ev, res)
    assert res.status == "fit" and res.model.replace(name="custom") == device_model(dname)
    shapes = [(9, 7, 301), (16, 8, 256), (5, 3, 40)]
    failing = precheck_shapes(dev, res.model, shapes, split_search_s=0.0)
    assert sorted(failing) == sorted(shapes)   # natural K order misses each shape
    got, rest = explain_shapes(dev, res.model, failing, seed=3)
    assert rest == [] and all(lay is not None and lay.chunk for _, lay, _ in got.values()), got
    v = validate(dev, res.model, outputs=200, shapes=shapes, shape_models=got, no_split_search=failing)
    assert v.per_shape and all(s["matches"] == s["outputs"] and s["own_model"] for s in v.per_shape), v.per_shape


_SEGK = ("sm90_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize8x16x32_warpgroupsize1x1x1_execute_segment_k_on_"
         "kernel__5x_cublas")   # the H200's tiles are 64x256 or 128x256; small ones keep the test fast


def _tail_tiles(tiles_m, tiles_n, sms):
    """The segment-K rule, spelled as the H200 fit states it (scripts/fit_segment_k.py):
    ({cuBLAS tiles (m', n') cut in segments}, s), tiles launched in pairs of m' serpentine
    in n'; 2 T <= sms: all, s = sms // T; T <= sms: the last, s = (sms - T) // 4; else the
    last r = T mod sms when 2 r <= sms, s = sms // r."""
    order = []
    for g in range(-(-tiles_m // 2)):
        ns = range(tiles_n) if g % 2 == 0 else range(tiles_n - 1, -1, -1)
        order += [(m, n) for n in ns for m in range(2 * g, min(2 * g + 2, tiles_m))]
    T = len(order)
    if 2 * T <= sms:
        return set(order), sms // T
    if T <= sms:
        return {order[-1]}, max(1, (sms - T) // 4)
    r = T % sms
    return (set(order[T - r:]), sms // r) if 0 < r and 2 * r <= sms else (set(), 1)


def _pairwise(parts):
    """float32 partials added by recursive halves (first floor(n/2), then the rest)."""
    if len(parts) == 1:
        return parts[0]
    h = len(parts) // 2
    return np.float32(_pairwise(parts[:h]) + _pairwise(parts[h:]))


@pytest.mark.parametrize("shape", [(20, 20, 200), (16, 16, 333), (40, 30, 333), (48, 20, 500)])
def test_segment_k_tiles_found_and_emulated(shape, monkeypatch):
    """A device computing like the H200's sm_90 tf32 segment-K kernel (tiles of TM torch
    columns x TN torch rows; the tiles of the last partial wave cut into s K segments of whole
    32-blocks, the longer ones last, on 8 SMs): explain finds the tile schedule and
    emulate_native reproduces a fresh batch bit for bit.  Oracle: the device computes each
    segment on its own K range and adds the float32 partials pairwise in numpy."""
    import probes.explain as ex
    from probes.device import Device, TensorOps
    from probes.sim import bits_to_float
    M, N, K = shape
    monkeypatch.setattr(ex, "environment_key", lambda name: {"device": name, "sm_count": 8})
    one = parse_short("F=8 align=25:RTZ:esum acc=23:RTZ G=- out=float32:RNE")
    TM, TN = 8, 16
    tail, s = _tail_tiles(-(-N // TM), -(-M // TN), 8)
    n = -(-K // 32)
    cuts = [32 * (j * (n // s) + max(0, j - (s - n % s))) for j in range(s)] + [K]

    def fn(a, b, **_):
        out = bits_to_float(simulate_gemm(one, a, b), "float32")
        parts = [bits_to_float(simulate_gemm(one, a[:, lo:hi], b[lo:hi]), "float32").astype(np.float32)
                 for lo, hi in zip(cuts, cuts[1:])]
        for m, q in tail:
            for i in range(q * TN, min((q + 1) * TN, M)):
                for j in range(m * TM, min((m + 1) * TM, N)):
                    out[i, j] = _pairwise([p[i, j] for p in parts])
        return out
    caps = Capabilities("tf32", "tf32", "float32", max_k=16384)
    dev = Device("cuda-cublas-tf32", "virtual segment-K", "virtual", caps, fn,
                 tensors=TensorOps(kernels=lambda batch: [_SEGK]))
    table = ScheduleTable()
    e = explain_shape(dev, shape, base_model=one, table=table, outputs=1024, budget_s=60)
    assert e.exact, e
    assert (e.tiles is not None) == (bool(tail) and s > 1), e.tiles
    b = dev.draw(M, N, K, 5)
    got = dev.call_tensors(b)
    emu = emulate_native("cuda-cublas-tf32", b.a, b.b, table=table)
    assert torch.equal(got.float().view(torch.int32), emu.view(torch.int32))
    hit = ScheduleTable.from_dict(table.to_dict()).lookup("cuda-cublas-tf32", shape)
    assert hit.tiles == e.tiles and hit.model == e.model


_GEMV = ("std::enable_if<!(false), void>::type internal::gemvx::kernel<int, int, float, float, float, float, "
         "false, true, true, false, 7, false, cublasGemvParamsEx<int, float> >(Params)")


@pytest.mark.parametrize("M,N,K,g", [(37, 1, 333, 11), (1, 29, 2100, 64), (40, 1, 700, 1)])
def test_gemv_lanes_found_and_emulated(M, N, K, g):
    """A device computing like the H200's cuBLAS fp32 gemv (32 lanes fed chunks of g round
    robin, a halving tree): explain finds the chunk width among lane_chunks and
    emulate_native reproduces a fresh batch bit for bit.  Oracle: the device runs
    simulate_gemm on kernel_operands' lane-gathered operands."""
    from probes.device import Device, TensorOps
    from probes.kernels import kernel_models, kernel_operands
    from probes.sim import bits_to_float
    row = kernel_models("cuda-cublas-fp32", [_GEMV])[0]

    def fn(a, b, **_):
        a2, b2, m = kernel_operands(row, a, b, chunk=g)
        return bits_to_float(simulate_gemm(m, a2, b2), "float32")
    dev = Device("cuda-cublas-fp32", "virtual gemv", "virtual", Capabilities("float32", "float32", "float32",
                 max_k=16384), fn, tensors=TensorOps(kernels=lambda batch: [_GEMV]))
    table = ScheduleTable()
    fma = parse_short("F=1 align=exact acc=23:RNE G=- out=float32:RNE")
    e = explain_shape(dev, (M, N, K), base_model=fma, table=table, outputs=64, budget_s=60)
    assert e.exact and e.layout.k_tile == g and e.model.split_reduce.value == "tree", e
    b = dev.draw(M, N, K, 9)
    emu = emulate_native("cuda-cublas-fp32", b.a, b.b, table=table)
    assert torch.equal(dev.call_tensors(b).float().view(torch.int32), emu.view(torch.int32))
