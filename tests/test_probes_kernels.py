"""probes.kernels: the kernel-name -> model table reproduces native H200 outputs bit for bit.

tests/data/kernel_dumps.npz holds excerpts (whole K) of H200 dumps, the native float32 outputs
being the oracle: 2 rows x 2 columns of the survey dumps at the two smallest-K shapes
(309x68x2872: split-K with splitKreduce; 1106x1261x672: no split), rebuilt with
``.venv/bin/python tests/test_probes_kernels.py SURVEY_DUMPS.npz SURVEY.jsonl``; the random-shape
dumps' excerpts listed in ``RANDOM``, appended with ``... tests/test_probes_kernels.py --random
FOLDER`` (FOLDER holding b16.npz, fp32.npz, tf32.npz); and ``triton_imp0_*``: 4 x 4 outputs of
a Triton fp8 tl.dot (mma.sync m16n8k16) at K = 256 from ``scripts/triton_dump.py``'s dumps (the rows
and columns where the natural K order and the nearest instruction models miss most); the last four
excerpts (2 x 2 outputs of cuBLAS f16 at 48x330x12213, S = 88 with splitKreduce, and 2607x1559x2272,
serial S = 3, fitted by scripts/fit_f16_split.py: 256 of 256 dumped outputs each under slice_align's
cache-line rule; the WMMA s161616 kernels at 78x877x813, S = 8, and 64x64x100, scripts/fit_wmma.py)
are from session 15's dumps (scripts/gpu_dump_shapes.py), as are ``segk*`` (tf32 segment-K) and
``gemv*`` (fp32 gemv); e17-e19 (2 x 2 outputs each) are session 16's dumps of cuBLAS tf32's
cutlass_80 s1688 64x64_16x6 kernel with splitKreduce at 64x64x100, 96x80x48 and 16x16x4096
(scripts/fit_tf32_small.py).
"""
from __future__ import annotations

import itertools
import json
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from probes.kernels import (KERNEL_MODELS, KernelModel, kernel_family, kernel_klayout, kernel_layout,
                            kernel_models, kernel_operands, models_for_kernels, slice_align, split_counts)
from probes.sim import output_bits, simulate_gemm
from reference.notation import parse_short, short

DATA = Path(__file__).parent / "data" / "kernel_dumps.npz"
S1688 = ("void cutlass::Kernel2<cutlass_75_tensorop_s1688gemm_bf16_256x128_nn_align1>"
         "(cutlass_75_tensorop_s1688gemm_bf16_256x128_nn_align1::Params)")
REDUCE = ("void cublasLt::splitKreduce_kernel<32, 16, int, float, float, float, float, false, float, "
          "float, float, true, false, false, false>(cublasLt::cublasSplitKParams<float>, float const*, "
          "float const*, float*, float const*, float const*, float const*, float const*, float*, void*, "
          "long, float*, int*)")
XMMA = ("sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize64x64x8_stage3_warpsize1x4x1_ffma_aligna4_"
        "alignc4_execute_kernel__5x_cublas")


def _excerpts():
    z = np.load(DATA)
    n = 0
    while f"e{n}_device" in z:
        p = f"e{n}_"
        yield pytest.param({k[len(p):]: z[k] for k in z.files if k.startswith(p)},
                           id=f"{z[p + 'device']}-{z[p + 'shape']}")
        n += 1


def _run(row: KernelModel, ex: dict, split_k: int) -> np.ndarray:
    a, b, model = kernel_operands(row, ex["a"].astype(np.float64), ex["b"].astype(np.float64), split_k)
    return simulate_gemm(model, a, b)


@pytest.mark.parametrize("ex", list(_excerpts()))
def test_table_reproduces_native_outputs(ex):
    rows = kernel_models(str(ex["device"]), str(ex["kernels"]).split("\n"))
    assert rows and rows[0].confirmed
    got = _run(rows[0], ex, int(ex["split_k"]))
    assert np.array_equal(got, output_bits(ex["out"].astype(np.float64), "float32"))


@pytest.mark.parametrize("ex", list(_excerpts()))
def test_exact_reference_agrees(ex):
    """The same rows through the exact Fraction reference (reference.gemm.dot)."""
    from fractions import Fraction
    from reference.exact import exact
    from reference.gemm import dot
    row = kernel_models(str(ex["device"]), str(ex["kernels"]).split("\n"))[0]
    a, b, model = kernel_operands(row, ex["a"].astype(np.float64), ex["b"].astype(np.float64),
                                  int(ex["split_k"]))
    for i, j in itertools.product(range(a.shape[0]), range(b.shape[1])):
        v = dot(model, [exact(float(x)) for x in a[i]], [exact(float(x)) for x in b[:, j]])
        assert v.to_fraction() == Fraction(float(ex["out"][i, j])) and v.negative == bool(
            np.signbit(ex["out"][i, j]))


# (excerpt device, shape, what changes): the nearest models miss at least one excerpt output,
# so the fields the table states are the ones the hardware shows
NEIGHBOURS = [
    ("cuda-cublas-bfloat16", "309x68x2872", {"k_tile": None}),
    ("cuda-cublas-float16", "309x68x2872", {"k_tile": 16}),
    ("cuda-cublas-float16", "309x68x2872", {"k_tile": 64}),
    ("cuda-cublas-float16", "309x68x2872", {"model": {"fma_width": 8}}),
    ("cuda-cublas-float16", "309x68x2872", {"model": {"align_ref": "VALUE"}}),
    ("cuda-cublas-tf32", "309x68x2872", {"model": {"align_bits": 26}}),
    ("cuda-cublas-tf32", "309x68x2872", {"model": {"norm_mode": "RNE"}}),
    ("cuda-cublas-fp32", "309x68x2872", {"split_k": 25}),
    ("cuda-cublas-fp32", "309x68x2872", {"model": {"fma_width": 2}}),
    ("cuda-cublas-float16", "1106x1261x672", {"model": {"fma_width": 16}}),
    ("cuda-cublas-float16", "1106x1261x672", {"model": {"align_ref": "VALUE"}}),
    # random-shape dumps (RANDOM below)
    ("cuda-cublas-float16", "1111x3056x858", {"k_tile": None}),        # s16816 _64x3: residue first
    ("cuda-cublas-float16", "1111x3056x858", {"k_tile": 16}),
    ("cuda-cublas-bfloat16", "1066x2006x1534", {"model": {"fma_width": 8}}),
    ("cuda-cublas-bfloat16", "1066x2006x1534", {"split_k": 2}),
    ("cuda-cublas-bfloat16", "1555x911x4416", {"split_align": 8, "k_tile": None}),  # 888 not 896
    ("cuda-cublas-fp32", "510x2247x1126", {"split_interleave": None}),  # xmma: round robin, not slices
    ("cuda-cublas-fp32", "510x2247x1126", {"split_interleave": 16}),
    ("cuda-cublas-fp32", "818x1537x4023", {"split_interleave": None}),
    ("cuda-cublas-fp32", "818x1537x4023", {"split_k": 9}),
    ("cuda-cublas-tf32", "135x404x6334", {"k_tile": None}),
    ("cuda-cublas-tf32", "135x404x6334", {"split_k": 32}),
    ("cuda-cublas-tf32", "273x1608x12664", {"model": {"group_size": 64}}),  # segment-K: no promotion
    ("cuda-cublas-tf32", "273x1608x12664", {"split_k": 1}),
]


@pytest.mark.parametrize("device,shape,change", NEIGHBOURS)
def test_neighbouring_models_miss(device, shape, change):
    ex = next(p.values[0] for p in _excerpts() if (str(p.values[0]["device"]), str(p.values[0]["shape"]))
              == (device, shape))
    row = kernel_models(device, str(ex["kernels"]).split("\n"))[0]
    change = dict(change)
    split_k = change.pop("split_k", int(ex["split_k"]))
    if "model" in change:
        change["model"] = short(row.gemm_model.replace(**change["model"]))
    got = _run(replace(row, **change), ex, split_k)
    assert not np.array_equal(got, output_bits(ex["out"].astype(np.float64), "float32"))


def test_lookup_by_kernel_name():
    rows = kernel_models("cuda-cublas-bfloat16", ["Memset (Device)", S1688])
    assert [r.confirmed for r in rows] == [True, False]  # confirmed first, the hypothesis after
    assert models_for_kernels("cuda-cublas-bfloat16", ["Memset (Device)", S1688]) == [
        parse_short("F=8 align=25:RTZ:esum acc=23:RTZ G=- out=float32:RNE")]
    assert models_for_kernels("cuda-cublas-float16", [S1688.replace("bf16", "f16")])[0].fma_width == 8
    s16816 = S1688.replace("75", "80").replace("s1688gemm_bf16_256x128", "s16816gemm_f16_64x64_32x6").replace(
        "align1", "align2")
    assert models_for_kernels("cuda-cublas-float16", [REDUCE, s16816])[0].fma_width == 16
    assert models_for_kernels("cuda-cublas-fp32", [XMMA]) == [
        parse_short("F=1 align=exact acc=23:RNE G=- out=float32:RNE")]


def test_lookup_misses_and_bad_input():
    assert models_for_kernels("cuda-cublas-tf32", [S1688]) == []         # another device's kernel
    assert models_for_kernels("cuda-cublas-bfloat16", ["nvjet_tst_128x256_64x4_2x1_v_bz_TNN"]) == []
    assert models_for_kernels("cpu-torch-fp32", []) == []
    other_tile = S1688.replace("256x128", "64x128")                        # seen nowhere yet
    assert [r.confirmed for r in kernel_models("cuda-cublas-bfloat16", [other_tile])] == [False]
    with pytest.raises(ValueError, match="kernel_names"):
        models_for_kernels("cuda-cublas-bfloat16", S1688)
    with pytest.raises(ValueError, match="KernelModel.k_tile"):
        KernelModel("x", ("d",), "F=1 align=exact acc=23:RNE G=- out=float32:RNE", "", k_tile=0)


def test_kernel_family_labels():
    assert kernel_family(["Memset (Device)", S1688]) == "cutlass_75 s1688 align1 +memset"
    assert kernel_family([REDUCE, "void cutlass::Kernel2<cutlass_80_simt_sgemm_128x64_8x5_nn_align1>"
                          "(cutlass_80_simt_sgemm_128x64_8x5_nn_align1::Params)"]) == \
        "cutlass_80 simt sgemm align1 +splitKreduce"
    assert kernel_family(["cutlass_80_tensorop_s1688gemm_64x64_32x6_nn_align4"]) == "cutlass_80 s1688 align4"
    assert kernel_family([XMMA]) == "sm80_xmma f32 ffma"
    assert kernel_family([]) == ""
    assert kernel_family(["void cutlass::Kernel2<sm90_new_gemm>(sm90_new_gemm::Params)"]) == "sm90_new_gemm"
    assert kernel_family(["nvjet_tst_128x256_64x4_2x1_v_bz_TNN"]) == "nvjet_tst_128x256_64x4_2x1_v_bz_TNN"


def test_every_row_is_well_formed():
    for r in KERNEL_MODELS:
        assert r.gemm_model.split_k == 1 and r.evidence
        assert r.confirmed or r.evidence.startswith("unconfirmed")


def test_kernel_layout_literal():
    row = KERNEL_MODELS[0]  # k_tile 32, split_align 8
    small = replace(row, k_tile=4, split_align=1)
    idx, m = kernel_layout(small, 10)
    assert idx.tolist() == [0, 1, -1, -1, 2, 3, 4, 5, 6, 7, 8, 9] and m.split_k == 1
    idx, m = kernel_layout(small, 10, split_k=2)  # slices [0, 5) and [5, 10): a partial tile each
    assert idx.tolist() == [0, -1, -1, -1, 1, 2, 3, 4, 5, -1, -1, -1, 6, 7, 8, 9]
    assert (m.split_k, m.split_tile) == (2, 8)
    # split_align 8: 2872 in 13 slices of 224 (12) and 184, the last one's 24-product tile first
    idx, m = kernel_layout(row, 2872, 13)
    assert (m.split_k, m.split_tile, len(idx)) == (13, 224, 2880)
    assert idx[2688:2720].tolist() == list(range(2688, 2712)) + [-1] * 8
    assert split_counts(row, 2872, 16)[:3] == [1, 2, 3] and 13 in split_counts(row, 2872, 16)
    with pytest.raises(ValueError, match="split_k"):
        kernel_layout(row, 10, 0)


def test_slices_of_whole_k_tiles_when_k_is_a_multiple():
    row = kernel_models("cuda-cublas-tf32", ["cutlass_80_tensorop_s1688gemm_128x256_32x3_nn_align1"])[0]
    assert (slice_align(row, 8192), slice_align(row, 8191), slice_align(row, 0)) == (32, 4, 4)
    idx, m = kernel_layout(row, 8192, 3)   # tf32 1417x3535x8192: 2752 + 2752 + 2688 (2732 missed)
    assert (m.split_k, m.split_tile, len(idx)) == (3, 2752, 8192)
    assert kernel_klayout(row, 3, 8192).split_align == 32 and kernel_klayout(row, 3).split_align == 4
    assert 44 in split_counts(row, 8870)   # S = 44 seen at 55x283x8870: the default reaches it


def test_slices_rounded_to_a_cache_line_or_16_bytes():
    """CUTLASS 2.x GemmUniversal's kAlignK for 2-byte operands: 64 elements (128 bytes) when
    K is a multiple of 64, else 8 (16 bytes); H200 f16 2607x1559x2272 (2272 % 64 = 32) runs
    760 + 760 + 752, not whole k-tiles 768 + 768 + 736 (28 of 256 dumped outputs)."""
    row = kernel_models("cuda-cublas-float16", [S1688.replace("bf16", "f16")])[0]
    assert [slice_align(row, K) for K in (2272, 4416, 12213, 64, 32)] == [8, 64, 8, 64, 8]
    _, m = kernel_layout(row, 2272, 3)
    assert (m.split_k, m.split_tile) == (3, 768)   # padded: 8 fill + 760 | 760 + 8 fill | 752 + 16
    assert [len(range(*b)) for b in __import__("reference.gemm", fromlist=["x"]).split_bounds(m, 2304)] == [768] * 3


def test_interleaved_split_literal():
    row = KernelModel("x", ("d",), "F=1 align=exact acc=23:RNE G=- out=float32:RNE", "e", split_interleave=2)
    idx, m = kernel_layout(row, 7, 2)      # tiles [0 1] [2 3] [4 5] [6]: slice 0 takes 0 and 2
    assert idx.tolist() == [0, 1, 4, 5, 2, 3, 6, -1] and (m.split_k, m.split_tile) == (2, 4)
    assert kernel_layout(row, 7, 1)[0].tolist() == list(range(7)) and kernel_layout(row, 7, 1)[1].split_k == 1
    assert split_counts(row, 7, 10) == [1, 2, 3, 4]   # more slices than tiles: not a kernel's
    lay = kernel_klayout(row, 2)           # the schedule table's form of the same order
    assert lay.interleave and lay.index(7)[0].tolist() == idx.tolist() and lay.model(m, 7) == m
    import torch
    a, b = torch.arange(1.0, 8.0).reshape(1, 7), torch.arange(1.0, 8.0).reshape(7, 1)
    pa, pb = lay.pad(a, b)
    assert pa.tolist() == [[1, 2, 5, 6, 3, 4, 7, 0]] and pb.reshape(-1).tolist() == [1, 2, 5, 6, 3, 4, 7, 0]
    with pytest.raises(ValueError, match="split_interleave"):
        KernelModel("x", ("d",), "F=1 align=exact acc=23:RNE G=- out=float32:RNE", "e", k_tile=8,
                     split_interleave=8)


def _triton_kwidth4(K: int) -> np.ndarray:
    """The k order Triton's MMAv2 dot-operand layout with kWidth = 4 (8-bit operands upcast to
    f16) feeds mma.sync m16n8k16: per 32 k, the first instruction takes k mod 4 in {0, 1},
    the second k mod 4 in {2, 3} (lane t holds k = 4t .. 4t+3 and 4t+16 .. 4t+19)."""
    base = np.arange(K).reshape(-1, 32)
    first = base[:, (np.arange(32) % 4) < 2]
    return np.concatenate([first, base[:, (np.arange(32) % 4) >= 2]], axis=1).reshape(-1)


def test_mma_sync_k16_instruction_model_on_triton_dumps():
    """H200 Triton fp8 tl.dot with max_num_imprecise_acc=0: mma.sync m16n8k16 f16 chained over
    K = 256.  The s16816 row's instruction model reproduces it bit for bit once K is in the
    order the instructions see; the natural order and the nearest models miss."""
    from reference.exact import exact
    from reference.gemm import dot
    z = np.load(DATA)
    a, b = z["triton_imp0_a"].astype(np.float64), z["triton_imp0_b"].astype(np.float64)
    want = output_bits(z["triton_imp0_out"].astype(np.float64), "float32")
    model = parse_short("F=16 align=25:RTZ:esum acc=23:RTZ G=- out=float32:RNE")
    p = _triton_kwidth4(a.shape[1])
    assert sorted(p.tolist()) == list(range(a.shape[1]))
    assert np.array_equal(simulate_gemm(model, a[:, p], b[p]), want)
    v = dot(model, [exact(float(x)) for x in a[0, p]], [exact(float(x)) for x in b[p, 0]])
    assert float(v.to_fraction()) == float(z["triton_imp0_out"][0, 0])
    assert not np.array_equal(simulate_gemm(model, a, b), want)  # natural k order
    for ch in ({"fma_width": 8}, {"align_bits": 24}, {"align_bits": 26}, {"align_ref": "VALUE"},
               {"norm_mode": "RNE"}):
        assert not np.array_equal(simulate_gemm(model.replace(**ch), a[:, p], b[p]), want), ch


def test_triton_imprecise0_row_reproduces_the_dump_through_its_k_order():
    """The table row for Triton's mm_fp8 at max_num_imprecise_acc=0 (kernel name from the
    profiler) reads K in the kWidth-4 order: kernel_operands + the simulator give the dumped
    H200 outputs (the same order _triton_kwidth4 writes out independently above); at a K that
    is not a multiple of 32 the tail is zero-filled at the end (masked loads)."""
    from fp4ref.native import chunked
    z = np.load(DATA)
    a, b = z["triton_imp0_a"].astype(np.float64), z["triton_imp0_b"].astype(np.float64)
    want = output_bits(z["triton_imp0_out"].astype(np.float64), "float32")
    (row,) = kernel_models("triton-dot-e4m3-imprecise-0", ["mm_fp8"])
    a2, b2, model = kernel_operands(row, a, b)
    assert np.array_equal(simulate_gemm(model, a2, b2), want)
    assert np.array_equal(kernel_layout(row, 256)[0], _triton_kwidth4(256))
    assert split_counts(row, 301) == [1] and kernel_models("triton-dot-e4m3-imprecise-32", ["mm_fp8"]) == []
    idx, lens = chunked(35, row.k_order)
    assert lens == [64] and idx[32:35].tolist() == [32, 33, -1] and idx[48] == 34
    assert sorted(idx[idx >= 0].tolist()) == list(range(35))


def test_kernel_operands_numpy_and_torch_agree():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((3, 37)), rng.standard_normal((37, 2))
    row = replace(KERNEL_MODELS[0], k_tile=8, split_align=4)
    an, bn, mn = kernel_operands(row, a, b, 3)
    at, bt, mt = kernel_operands(row, torch.from_numpy(a), torch.from_numpy(b), 3)
    assert mn == mt and np.array_equal(an, at.numpy()) and np.array_equal(bn, bt.numpy())
    idx, _ = kernel_layout(row, 37, 3)
    assert np.array_equal(an[:, idx >= 0], a[:, idx[idx >= 0]]) and not np.signbit(an[:, idx < 0]).any()


def _build(dumps: str, survey: str) -> None:
    """Rewrite DATA from the survey files: per dump 2 rows x 2 columns where the neighbouring
    models miss the most (NEIGHBOURS is then checked on it)."""
    z = np.load(dumps)
    kern = {}
    for line in open(survey):
        d = json.loads(line)
        if "kernels" in d:
            kern[(d["device"], "x".join(map(str, d["shape"])))] = d["kernels"]
    cases = [(d, "309x68x2872", 26 if d.endswith("fp32") else 13) for d in
             ("cuda-cublas-bfloat16", "cuda-cublas-float16", "cuda-cublas-tf32", "cuda-cublas-fp32")]
    cases += [(d, "1106x1261x672", 1) for d in ("cuda-cublas-bfloat16", "cuda-cublas-float16")]
    save = {"source": np.array("H200 survey dumps: rows/cols of the 16x16 dump; out = native float32 "
                               "outputs; a, b = decoded operand values")}
    for n, (d, s, S) in enumerate(cases):
        full = {"a": z[f"{d}|{s}|a"], "b": z[f"{d}|{s}|b"], "out": z[f"{d}|{s}|out"]}
        row = kernel_models(d, kern[(d, s)])[0]
        want = output_bits(full["out"].astype(np.float64), "float32")
        misses = [_run(replace(row, k_tile=kt), full, S) != want for kt in (None, 16, 64)]
        misses += [_run(replace(row, model=short(row.gemm_model.replace(**ch))), full, S) != want
                   for ch in ({"fma_width": 2 * row.gemm_model.fma_width}, {"align_ref": "VALUE"})]
        misses += [_run(row, full, S2) != want for S2 in (S - 1, S + 1) if S2 >= 1]
        m = np.stack(misses)
        ri, ci = max(((r, c) for r in itertools.combinations(range(16), 2)
                      for c in itertools.combinations(range(16), 2)),
                     key=lambda rc: m[:, rc[0], :][:, :, rc[1]].any(axis=(1, 2)).sum())
        p = f"e{n}_"
        save.update({p + "device": np.array(d), p + "shape": np.array(s), p + "split_k": np.array(S),
                     p + "kernels": np.array("\n".join(kern[(d, s)])), p + "rows": np.array(ri),
                     p + "cols": np.array(ci), p + "a": full["a"][list(ri)], p + "b": full["b"][:, list(ci)],
                     p + "out": full["out"][np.ix_(ri, ci)]})
    np.savez_compressed(DATA, **save)


# Random-shape dumps (scripts' {b16,fp32,tf32}.npz: 4 x 8 outputs per shape, "meta" lists the
# kernels): (device, shape, split_k, rows x cols kept, changes the excerpt must tell apart).
RANDOM = [
    ("cuda-cublas-float16", "1111x3056x858", 1, (2, 2), [{"k_tile": None}, {"k_tile": 16}]),
    ("cuda-cublas-bfloat16", "1066x2006x1534", 3, (2, 2), [{"k_tile": None}, {"model": {"fma_width": 8}}]),
    ("cuda-cublas-bfloat16", "1555x911x4416", 5, (2, 2), [{"split_align": 8, "k_tile": None}]),
    ("cuda-cublas-fp32", "510x2247x1126", 3, (2, 2), [{"split_interleave": None}, {"split_interleave": 16}]),
    ("cuda-cublas-fp32", "818x1537x4023", 10, (2, 2), [{"split_interleave": None}]),
    ("cuda-cublas-tf32", "135x404x6334", 33, (1, 2), [{"k_tile": None}]),
    ("cuda-cublas-tf32", "273x1608x12664", 2, (1, 1), [{"model": {"group_size": 64}}]),
]


def _append_random(folder: str) -> None:
    """Append RANDOM's excerpts to DATA from the random-shape dumps in ``folder``: per dump
    the rows x cols where RANDOM's changes (and S - 1, S + 1) miss the most."""
    z = {f: np.load(Path(folder) / f"{f}.npz") for f in ("b16", "fp32", "tf32")}
    meta = {m["key"]: (f, m["kernels"]) for f, zf in z.items() for m in json.loads(str(zf["meta"]))}
    save = dict(np.load(DATA))
    n = sum(1 for k in save if k.endswith("_device"))
    have = {(str(save[k]), str(save[k[:-6] + "shape"])) for k in save if k.endswith("_device")}
    for d, s, S, (nr, nc), changes in RANDOM:
        if (d, s) in have:  # appending twice keeps one copy
            continue
        f, kern = meta[f"{d}|{s}"]
        full = {x: z[f][f"{d}|{s}|{x}"] for x in ("a", "b", "out")}
        ri, ci = _pick(kernel_models(d, kern)[0], full, S, changes, nr, nc)
        p = f"e{n}_"
        save.update({p + "device": np.array(d), p + "shape": np.array(s), p + "split_k": np.array(S),
                     p + "kernels": np.array("\n".join(kern)), p + "rows": np.array(ri),
                     p + "cols": np.array(ci), p + "a": full["a"][list(ri)], p + "b": full["b"][:, list(ci)],
                     p + "out": full["out"][np.ix_(ri, ci)]})
        n += 1
    np.savez_compressed(DATA, **save)


def _pick(row: KernelModel, full: dict, S: int, changes: list, nr: int, nc: int):
    """(rows, cols): nr x nc outputs of the dump where the most of ``changes`` (and S +- 1) miss."""
    want = output_bits(full["out"].astype(np.float64), "float32")
    m = []
    for ch in changes + [{"split_k": S - 1}, {"split_k": S + 1}]:
        ch = dict(ch)
        S2 = ch.pop("split_k", S)
        if S2 < 1:
            continue
        if "model" in ch:
            ch["model"] = short(row.gemm_model.replace(**ch["model"]))
        m.append(_run(replace(row, **ch), full, S2) != want)
    m = np.stack(m)
    R, C = full["out"].shape
    return max(((r, c) for r in itertools.combinations(range(R), nr) for c in itertools.combinations(range(C), nc)),
               key=lambda rc: (m[:, list(rc[0]), :][:, :, list(rc[1])].any(axis=(1, 2)).sum(),
                               m[:, list(rc[0]), :][:, :, list(rc[1])].sum()))


if __name__ == "__main__":
    if sys.argv[1] == "--random":
        _append_random(sys.argv[2])
    else:
        _build(*sys.argv[1:3])


@pytest.mark.parametrize("i", [0, 1, 2, 3])
def test_segment_k_tiles_reproduce_native_outputs(i):
    """H200 tf32 sm90 segment-K (132 SMs; session 15 dumps, whole K): segk0 2223x2468x9324
    (128x256 tiles, the last 48 of 180 in 2 segments; 4 x 4 outputs, 6 in such tiles), segk1
    2000x500x10500 (all 32 tiles in 4), segk2 1530x700x12000 (all 42 in 3), segk3 the corner
    tile of 1945x568x13960 (the last of 72, in 15).  The row's tile schedule (segments of whole
    32-blocks, the longer last, added pairwise) reproduces every output; one segment misses.
    Oracle: the native float32 outputs."""
    from fp4ref.native import tile_select
    from probes.kernels import row_tiles
    z = np.load(DATA)
    p = f"segk{i}_"
    kern = str(z[p + "kernels"]).split("\n")
    M, N, K = (int(x) for x in z[p + "shape"])
    row = kernel_models("cuda-cublas-tf32", kern)[0]
    tiles = row_tiles(row, kern, K, 132)
    a, b = z[p + "a"].astype(np.float64), z[p + "b"].astype(np.float64)
    one = simulate_gemm(row.gemm_model, a, b)
    got = tile_select(tiles, one, lambda lay, m: simulate_gemm(m, *((a, b) if lay is None else lay.pad(a, b))),
                      (M, N, K), z[p + "rows"], z[p + "cols"])
    want = output_bits(z[p + "out"].astype(np.float64), "float32")
    assert np.array_equal(got, want) and not np.array_equal(one, want)
    assert row_tiles(row, [k.replace("segment_k_on", "segment_k_off") for k in kern], K, 132) is None


@pytest.mark.parametrize("i", [0, 1, 2])
def test_gemv_lanes_and_tree_reproduce_native_outputs(i):
    """H200 cuBLAS fp32 gemv (session 15 dumps; excerpts gemv0..2: 517x1x333 with chunks of
    11, 1x1500x3000 with 64, 1000x1x4000 with 1): 32 FMA-chain lanes fed round robin, their
    sums added by a halving tree, reproduce every excerpted output, through the simulator and
    the exact reference; the same lanes added in order miss some.  Oracle: the native outputs."""
    from reference.exact import exact
    from reference.gemm import dot
    z = np.load(DATA)
    p = f"gemv{i}_"
    row = kernel_models("cuda-cublas-fp32", str(z[p + "kernels"]).split("\n"))[0]
    assert row.lanes == 32 and row.confirmed
    a, b, model = kernel_operands(row, z[p + "a"].astype(np.float64), z[p + "b"].astype(np.float64),
                                  chunk=int(z[p + "chunk"]))
    want = output_bits(z[p + "out"].astype(np.float64), "float32")
    assert np.array_equal(simulate_gemm(model, a, b), want)
    serial = model.replace(split_reduce="serial")
    assert not np.array_equal(simulate_gemm(serial, a, b), want)
    if a.shape[1] <= 4096:  # the exact reference, one output
        v = dot(model, [exact(float(x)) for x in a[0]], [exact(float(x)) for x in b[:, 0]])
        assert float(v.to_fraction()) == float(z[p + "out"][0, 0])
