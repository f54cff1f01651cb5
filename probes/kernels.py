"""Which GemmModel does a named cuBLAS kernel compute?  (issue 13, deliverable 3)

At unaligned random shapes cuBLAS runs CUTLASS 2.x kernels compiled for sm_75 / sm_80 (and
xmma SIMT kernels) instead of the sm_90 kernels the committed device models were fitted on.
``KERNEL_MODELS`` maps a profiler kernel name (regex) and a device-name prefix to the model
that reproduced that kernel's native H200 outputs bit for bit (docs/kernels.md gives the
evidence per row; tests/test_probes_kernels.py replays committed excerpts).

Two properties of these kernels are per launch or outside the model family, so a row
carries them next to its model:

* split-K: cuBLAS picks the number of slices S per shape (3 .. 44 were seen), in-kernel
  ("serial", a Memset of the semaphores precedes it) or through a separate
  ``splitKreduce_kernel`` / ``execute_split_k_kernel`` ("parallel").  Both add the FP32 slice
  results in slice order, which is the family's split-K add.  Each slice but the last holds
  ceil(K / S) rounded up to ``split_align`` elements (16 bytes of the operand), or to a
  128-byte cache line when K is a multiple of it (``slice_align``: CUTLASS 2.x kAlignK).  S is
  left to the caller; slices left empty by the rounding are not launched.
* residue-first k-tiles (``k_tile``): CUTLASS 2.x predicated iterators load the partial
  k-tile (slice length mod k_tile) FIRST, zero-filled, then whole tiles; the F-wide MMA steps
  start at each tile's start.  The family's fused steps start at the slice start and leave
  the partial step last, so at K % k_tile != 0 the family model alone differs.
  ``kernel_operands`` inserts the zero fill into the operands (what the hardware multiplies)
  and returns the family model that then reproduces the kernel bit for bit.
* interleaved split-K (``split_interleave``, the sm80_xmma SIMT FP32 kernels): K is cut into
  tiles of ``split_interleave`` products (the partial tile last) and slice s takes tiles
  s, s + S, s + 2S, ... (round robin), each slice one FMA chain.  ``kernel_operands`` gathers
  each slice's products contiguously (zero-filled to equal lengths: +0 products leave an FMA
  chain unchanged) so the family's split-K model reproduces it.  ``fp4ref.native.KLayout``
  cannot express this order (contiguous slices only).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from reference.gemm import GemmModel
from reference.notation import parse_short
from reference.schedule import split_bounds

from fp4ref.native import KWIDTH4_ORDER, KLayout, gather_k

__all__ = ["KernelModel", "KERNEL_MODELS", "device_model", "kernel_models", "models_for_kernels", "kernel_family",
           "kernel_klayout", "kernel_layout", "kernel_operands", "lane_chunks", "row_layouts", "row_tiles",
           "slice_align", "split_counts"]

_TC = "F=8 align=25:RTZ:esum acc=23:RTZ G=- out=float32:RNE"    # mma.sync m16n8k8 (bf16/f16/tf32)
_TC16 = "F=16 align=25:RTZ:esum acc=23:RTZ G=- out=float32:RNE"  # mma.sync m16n8k16
_FMA = "F=1 align=exact acc=23:RNE G=- out=float32:RNE"          # one FP32 FMA per product
_HALF = ("cuda-cublas-bfloat16", "cuda-cublas-float16")


@dataclass(frozen=True)
class KernelModel:
    """One row: kernels whose name matches ``pattern`` (re.search) on devices whose name
    starts with one of ``devices`` compute ``model`` (short form, split_k = 1), with
    split-K slices rounded up to ``split_align`` elements and residue-first k-tiles of
    ``k_tile`` products (None: the family's step layout is the kernel's); with
    ``split_interleave`` the slices take tiles of that many products round robin; with
    ``k_order`` K is read in chunks of len(k_order) products in that order (no split); with
    ``lanes`` the kernel keeps up to that many partial sums (a warp's threads), dealt chunks
    of a per-shape width round robin (``lane_chunks``: lanes and width per shape) and combined
    as the model's split_reduce says (cuBLAS gemv: a halving tree); ``segment_k``: the
    kernel's ``_on`` variant runs some output tiles in several K segments (``row_tiles``)."""
    pattern: str
    devices: tuple[str, ...]
    model: str
    evidence: str
    confirmed: bool = True
    k_tile: int | None = None
    split_align: int | None = None
    split_interleave: int | None = None
    k_order: tuple = ()
    lanes: int | None = None
    segment_k: bool = False

    def __post_init__(self):
        re.compile(self.pattern)  # a bad regex fails at import, not at lookup
        if not self.devices or not all(isinstance(d, str) and d for d in self.devices):
            raise ValueError(f"KernelModel.devices: invalid value {self.devices!r}; valid choices: "
                             "a non-empty tuple of device-name prefixes")
        for name in ("k_tile", "split_align", "split_interleave", "lanes"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
                raise ValueError(f"KernelModel.{name}: invalid value {v!r}; valid choices: None or an int >= 1")
        if self.k_tile and self.split_interleave:
            raise ValueError(f"KernelModel.split_interleave: invalid value {self.split_interleave!r} with "
                             f"k_tile={self.k_tile}; valid choices: None when k_tile is set")
        if self.k_order and (self.k_tile or self.split_interleave or sorted(self.k_order) != list(range(len(self.k_order)))):
            raise ValueError(f"KernelModel.k_order: invalid value {self.k_order!r}; valid choices: a permutation "
                             "of range(n), without k_tile or split_interleave")
        if self.lanes and (self.k_tile or self.split_interleave or self.k_order):
            raise ValueError(f"KernelModel.lanes: invalid value {self.lanes!r} with k_tile, split_interleave "
                             "or k_order; valid choices: None, or lanes alone")
        parse_short(self.model)

    @property
    def gemm_model(self) -> GemmModel:
        return parse_short(self.model)

    def matches(self, device_name: str, kernel_names) -> bool:
        return (any(device_name.startswith(d) for d in self.devices)
                and any(re.search(self.pattern, k) for k in kernel_names))


KERNEL_MODELS: tuple[KernelModel, ...] = (
    KernelModel(
        r"cutlass_75_tensorop_s1688gemm_(bf16|f16)_(256x128|128x128|128x64|64x64)_nn_align1", _HALF, _TC,
        "H200 survey dumps, 256/256 outputs each, bf16 and f16: 256x128 at 3485x2609x8375 (serial "
        "split-K, 3 slices 2792+2792+2791), 3332x2661x14955 (bf16 4 x 3744 .. 3723; f16 3 x 4992 .. "
        "4971), 2063x2485x15905 (3 x 5304 .. 5297); 128x128 at 1106x1261x672 (no split). Misses: "
        "F=16 0..51/256 per dump, value alignment 1989/2048, no residue-first tile 26..256/256, "
        "k-tile 16 or 64 246..255/256. Random-shape dumps (32 outputs each): 256x128 bf16 at "
        "1555x911x4416 (splitKreduce, 5 x 896 .. 832: 128-byte lines as 4416 % 64 == 0; 888 misses), "
        "64x64 bf16 at 3504x20x13671 (splitKreduce, 19 x 720 .. 711): 64/64. Session 15 dumps, 256 "
        "outputs each, f16: 128x64 at 48x330x12213 (splitKreduce, cuBLASLt S = 88 launched as 85 x "
        "144 .. 117) and 128x128 at 2607x1559x2272 (serial, 760 + 760 + 752: 16 bytes as 2272 % 64 "
        "== 32; whole k-tiles 768 + 768 + 736 28/256): 256/256 each (scripts/fit_f16_split.py)",
        k_tile=32, split_align=8),
    KernelModel(
        r"cutlass_80_tensorop_s16816gemm_(bf16|f16)_64x64_32x6_nn_align2", _HALF, _TC16,
        "H200 survey dumps 309x68x2872 bf16 and f16, 256/256 each: parallel split-K "
        "(splitKreduce_kernel), 13 slices 12 x 224 + 184, last slice's residue tile first; "
        "misses: F=8 94 and 18/256, no residue-first tile 215 and 176/256, k-tile 16 or 64 231..254/256",
        k_tile=32, split_align=8),
    KernelModel(
        r"cutlass_80_tensorop_s16816gemm_(bf16|f16)_(256x128|128x256)_64x3_nn_align2", _HALF, _TC16,
        "H200 random-shape dumps (4 x 8 outputs each), 256/256: bf16 256x128 at 270x2826x16350 (serial, "
        "11 x 1488 ..), 1010x1792x8094 (2), 1066x2006x1534 (3), 2862x2446x14600 (6 x 2440 ..); bf16 "
        "128x256 at 4061x3504x6908 (2), 3760x3960x9340 (3); f16 128x256 at 1776x1612x7338 (4), "
        "2047x3414x3352 and 2318x4060x1160 (no split); f16 256x128 at 1111x3056x858 (no split). "
        "k-tile 32 reproduces these dumps equally (they never tell 32 from 64); misses: no "
        "residue-first tile 29/32 at 1111x3056x858, k-tile 16 at 1111x3056x858 and 1776x1612x7338, "
        "slices rounded to 16 at 2862x2446x14600 28/32",
        k_tile=64, split_align=8),
    KernelModel(
        r"cutlass_80_tensorop_s1688gemm_(128x256|256x128|128x128|128x64|64x64)_32x\d+_nn_align[14]",
        ("cuda-cublas-tf32",), _TC,
        "H200 survey dumps, 256/256 each: 128x256_32x3 align1 at 3485x2609x8375 (serial, 3 x "
        "2792 ..) and 3332x2661x14955 (4 x 3740 .. 3735); 256x128_32x3 align1 at 2063x2485x15905 "
        "(3 x 5304 ..); 64x64_32x6 align4 at 309x68x2872 (parallel, 13 x 224 ..); 128x128_32x3 "
        "align1 at 1106x1261x672 (no split): 4096/4096 in the survey's own GPU check. "
        "Misses: G=64 (the sm90 model) 10/256 at 309x68x2872, value alignment 964/1024, F=4 or 16 "
        "0..19/256 per dump, k-tile 16 or 64 244..253/256, no residue-first tile 14..256/256. "
        "Random-shape dumps (32 outputs each), 160/160: splitKreduce at 135x404x6334 (128x256, "
        "33 x 192 .. 190), 203x37x13412 (64x64_32x6, 33 x 408 .. 356), 55x283x8870 (128x64_32x6, "
        "44 x 204 .. 98) and 168x276x13067 (128x256, 44 x 300 .. 167): S up to 44; serial at "
        "1417x3535x8192 (128x256, 3 x 2752 .. 2688: 128-byte lines as 8192 % 32 == 0; 2732 misses 31/32)",
        k_tile=32, split_align=4),
    KernelModel(
        r"cutlass_80_tensorop_s1688gemm_64x64_16x6_nn_align4", ("cuda-cublas-tf32",), _TC,
        "H200 session 16 dumps (16 x 16 outputs each, with splitKreduce), 768/768: 64x64x100 (13 "
        "slices 12 x 8 + 4), 96x80x48 (12 x 4) and 16x16x4096 (21 x 192 + 64: 128-byte lines as "
        "4096 % 32 == 0), the slices added in order (scripts/fit_tf32_small.py). Misses: tree / "
        "pairwise / reverse order <= 97/256, F=4 34..167/256, align 24 or 26 <= 247/256, 16-byte "
        "slices at 16x16x4096 17/256. These shapes do not tell the k-tile (8, 16, 32) or where the "
        "partial tile sits: k-tile 16 from the name, the partial tile first as CUTLASS 2.x does",
        k_tile=16, split_align=4),
    KernelModel(
        r"cutlass_80_simt_sgemm_(256x128_8x4|128x64_8x5)_nn_align1", ("cuda-cublas-fp32",), _FMA,
        "H200 survey dumps, 256/256 each: 256x128_8x4 at 3485x2609x8375 (serial, 3 x 2792 ..) and "
        "3332x2661x14955 (4 x 3740 .. 3735); 128x64_8x5 at 309x68x2872 (parallel, 26 x 112 .. 72). "
        "Misses: F=2 45/768, RTZ normalization 2/768. Random-shape dumps (32 outputs each) of "
        "256x128_8x4, 128/128: serial at 2793x1904x8743 (3), 587x3620x15257 (5), 2813x3606x4015 (4); "
        "splitKreduce at 198x1441x11306 (11 x 1028 ..)",
        k_tile=None, split_align=4),
    KernelModel(
        r"sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize\d+x\d+x8_stage3_warpsize\d+x\d+x1_ffma",
        ("cuda-cublas-fp32",), _FMA,
        "H200 random-shape dumps (32 outputs each), 192/192: split-K over 8-wide k-tiles dealt round "
        "robin (slice s: tiles s, s+S, ..; the partial tile last), each slice an FMA chain, slices "
        "added in order: 64x64x8 at 818x1537x4023 (Memset, S=10) and 386x207x5935 (split_k_kernel, "
        "14); 64x128x8 at 2997x1581x6751 (Memset, 6); 128x128x8 at 587x518x13172 (10); 256x128x8 "
        "at 510x2247x1126 (3); 128x64x8 at 1306x548x13995 (5). Misses: contiguous slices (S <= 80, "
        "rounded to 1, 4 or 8) 26..28/32 per dump, the partial tile first 25..29/32, tiles of 16..128 "
        ">= 25/32 at 510x2247x1126; survey's own H200 check of 64x64x8 at 1106x1261x672: 4096/4096",
        split_interleave=8, split_align=4),
    KernelModel(
        r"sm90_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize\d+x\d+x32_warpgroupsize\d+x1x1_execute_segment_k",
        ("cuda-cublas-tf32",), _TC,
        "H200 random-shape dumps (32 outputs each), 96/96: per output tile either one segment or "
        "two (split=2/T32: the first ceil(K/2) rounded up to 32); no promotion (G=-, unlike the sm_90 "
        "device model's G=64). 64x256x32 at 1945x568x13960 (all 32 sampled outputs unsplit) and "
        "273x1608x12664 (all split, 6336 + 6328); 128x256x32 at 2223x2468x9324 (n-tiles 0, 3 and "
        "m-tile 13 x n-tile 7 unsplit: 17; the other 15 split 4672 + 4652). Misses: G=64 32/32 per "
        "dump. Which tiles run in segments, and how many, is a rule of the shape "
        "(fp4ref.native.segment_k_split: the last partial wave fills the SMs), not of the launch: "
        "session 15 dumps, one output per 64 x 64 tile and whole corner tiles, three launches "
        "identical, 12704/12963 outputs over 8 shapes (s = 2, 3, 4, 15; scripts/fit_segment_k.py)",
        k_tile=None, split_align=32, segment_k=True),
    KernelModel(
        r"^mm_fp8", ("triton-dot-e4m3-imprecise-0",), _TC16,
        "Triton 3.6 tl.dot e4m3 with max_num_imprecise_acc=0 (probes.backends.triton_fp8, kernel "
        "mm_fp8) compiles to mma.sync m16n8k16 f16 (fp8 upcast; scripts/triton_dump.py, PTX in "
        "reports/baselines/shapes/h200-triton-imprecise-mma.json). H200 dumps, 64 x 64 outputs at "
        "K = 128, 256, 1024, 4096, Gaussian and heavy-tailed: 32768/32768 with K read in Triton's "
        "kWidth-4 operand order (per 32 k: k mod 4 in {0, 1}, then {2, 3}); the natural order "
        "misses (1478/4096 at K = 128 heavy), as do kWidth 2, 8, 16, F=8, align 24/26, value "
        "alignment and RNE normalization. The zero-filled tail at K % 32 != 0 (masked loads) is "
        "not yet checked on hardware",
        k_order=KWIDTH4_ORDER),
    KernelModel(
        r"cutlass_(75|80)_wmma_tensorop_s161616gemm_f16_32x32_64x[12]_nn_align[12]", _HALF, _TC16,
        "cuBLAS f16 WMMA m16n16k16 kernels (mma.sync m16n8k16 on the H200: F=16 also for cutlass_75; "
        "F=8 48..58/256). Session 15 dumps (scripts/fit_wmma.py): cutlass_80 32x32_64x1 align2 at "
        "64x64x100 (no split, partial tile of 36 first), 256/256; cutlass_75 32x32_64x1 align1 + "
        "splitKreduce at 78x877x813 (cuBLASLt S = 8: 7 x 104 + 85), 256/256; 32x32_64x2 at "
        "13x1620x4139 (S = 16: 15 x 264 + 179), 208/208. Misses: k-tile 32 154..197, residue last "
        "38..95, align 24/26 21..162, reverse or pairwise slice adds 51..120",
        k_tile=64, split_align=8),
    KernelModel(
        r"internal::gemvx::kernel<int, int, float, float, float, float,", ("cuda-cublas-fp32", "cuda-cublas-tf32"),
        "F=1 align=exact acc=23:RNE G=- split=1:tree out=float32:RNE",
        "cuBLAS fp32 gemv (torch.mm with N = 1 or M = 1): 32 lanes, K dealt round robin in chunks of "
        "g products (partial chunk last), each lane one FP32 FMA chain from +0, the 32 lane sums "
        "added by a halving tree (16, 8, 4, 2, 1; FP32 RNE). Session 15 H200 dumps, 16 outputs "
        "each: 3654x1x15364, 1000x1x4000, 2048x1x8192, 1x77x9000 (g = 1), 517x1x333 (g = 11 = "
        "ceil(K / 32)), 1x1500x3000 (g = 64): 96/96, every other g <= 5/16 (scripts/fit_gemv.py); "
        "lanes summed in order 2..6/16, the tree from offset 1 up 4..7/16, the sequential FMA chain "
        "0..3/16. Sweep of 320 shapes (K 32..9000, 16..8192 outputs, N = 1 and M = 1): 242 ran "
        "gemvx, 222 in one pass; 221 fit with 2..32 lanes (3 outputs each). Not this row: gemvx + "
        "splitKreduce (M = 1, long K: 20 shapes), dot_kernel, gemv2T/gemv2N, gemvNSP (78 shapes). The "
        "tf32 device runs the same fp32 kernel at M = 1 (1x200x3000, 1x64x500: session 15)",
        lanes=32),
    # Hypotheses: the same instruction and mainloop at tile sizes / layouts not yet seen.
    KernelModel(r"cutlass_75_tensorop_s1688gemm_(bf16|f16)_", _HALF, _TC,
                "unconfirmed: other tiles/layouts of the confirmed cutlass_75 s1688 row",
                confirmed=False, k_tile=32, split_align=8),
    KernelModel(r"cutlass_80_tensorop_s16816gemm_(bf16|f16)_\d+x\d+_32x", _HALF, _TC16,
                "unconfirmed: other tiles/layouts (k-tile 32) of the confirmed s16816 row",
                confirmed=False, k_tile=32, split_align=8),
    KernelModel(r"cutlass_80_tensorop_s16816gemm_(bf16|f16)_\d+x\d+_64x", _HALF, _TC16,
                "unconfirmed: other tiles of the s16816 mainloop with a 64-wide k-tile (name: "
                "_64xN); 256x128_64x3 and 128x256_64x3 are confirmed above",
                confirmed=False, k_tile=64, split_align=8),
    KernelModel(r"cutlass_80_tensorop_s1688gemm_\d+x\d+_32x", ("cuda-cublas-tf32",), _TC,
                "unconfirmed: other tiles/layouts (k-tile 32) of the confirmed tf32 s1688 row",
                confirmed=False, k_tile=32, split_align=4),
    KernelModel(r"(cutlass_80_simt_sgemm_|sm80_xmma_gemm_f32f32_f32f32_f32_.*_ffma)",
                ("cuda-cublas-fp32",), _FMA,
                "unconfirmed: other SIMT FP32 kernels (a sequential FMA chain per output)",
                confirmed=False, k_tile=None, split_align=4),
)


def kernel_models(device_name: str, kernel_names, table=KERNEL_MODELS) -> list[KernelModel]:
    """The rows matching any of ``kernel_names`` on this device: confirmed first, then the
    longer device prefix, then the longer (more specific) pattern; [] if none."""
    names = _names(kernel_names)
    rows = [r for r in table if r.matches(str(device_name), names)]
    return sorted(rows, key=lambda r: (not r.confirmed,
                                       -max(len(d) for d in r.devices if device_name.startswith(d)),
                                       -len(r.pattern)))


def models_for_kernels(device_name: str, kernel_names) -> list[GemmModel]:
    """Candidate models (split_k = 1; the caller tries the split variants), most specific
    first, each once; [] if no row matches.  Rows with ``k_tile`` reproduce the kernel at
    K % k_tile != 0 only on ``kernel_operands``' padded operands."""
    out = []
    for r in kernel_models(device_name, kernel_names):
        m = r.gemm_model
        if m not in out:
            out.append(m)
    return out


def device_model(device_name: str) -> GemmModel | None:
    """The model the confirmed rows written for exactly this device agree on (a device the
    probe family cannot fit, e.g. Triton imprecise-0 with its permuted K order, still has a
    base model for explain and validate-shapes); None if there is none or they disagree."""
    got = {r.gemm_model for r in KERNEL_MODELS if r.confirmed and device_name in r.devices}
    return got.pop() if len(got) == 1 else None


def _names(kernel_names) -> list[str]:
    if isinstance(kernel_names, str):
        raise ValueError(f"kernel_names: invalid value {kernel_names!r}; valid choices: a list of "
                         "profiler kernel names (not one str)")
    return [str(k) for k in kernel_names]


_AUX = re.compile(r"^(Memset|Memcpy)|splitKreduce_kernel")
_CUTLASS = re.compile(r"cutlass_(\d+)_(tensorop|simt)_([a-z0-9]+?)gemm(?:_[a-z0-9]+)*?_\d+x\d+.*?_align(\d+)")


def kernel_family(kernel_names) -> str:
    """A short label of the GEMM kernel: e.g. "cutlass_75 s1688 align1", "cutlass_80
    s16816 align2 +splitKreduce", "cutlass_80 simt sgemm align1 +memset", "sm80_xmma f32
    ffma"; an unknown name shortened; "" without kernels."""
    names = _names(kernel_names)
    main = [k for k in names if not _AUX.search(k)]
    extra = (" +splitKreduce" if any("splitKreduce" in k for k in names) else "") + (
        " +memset" if any(k.startswith("Memset") for k in names) else "")
    if not main:
        return extra.strip()
    k = main[0]
    m = _CUTLASS.search(k)
    if m:
        arch, kind, op, align = m.groups()
        op = f"simt {op}gemm" if kind == "simt" else op
        return f"cutlass_{arch} {op} align{align}{extra}"
    m = re.search(r"(sm\d+)_xmma_gemm_([a-z]+\d+)\S*?_(ffma|hmma|gmma|imma)?(?:_|$)", k)
    if m:
        return f"{m.group(1)}_xmma {m.group(2)}" + (f" {m.group(3)}" if m.group(3) else "") + extra
    short = re.sub(r"^void\s+", "", k).split("(")[0]
    short = re.sub(r"^.*<([^<>]*)>$", r"\1", short)
    return short[:60] + extra


def slice_align(row: KernelModel, K: int) -> int:
    """The multiple split-K slices are rounded up to at length K, as CUTLASS 2.x
    GemmUniversal does (params_universal_base.h, kAlignK): 16 bytes of the operand
    (``row.split_align`` elements), or a 128-byte cache line (8 times that) when K is a
    multiple of the line (torch.mm's A is contiguous in K).  H200 dumps: tf32 8192 = 2752 x
    2 + 2688, bf16 4416 = 896 x 4 + 832, f16 2272 = 760 + 760 + 752 (2272 % 64 = 32: 16
    bytes), f16 12213 in 85 slices of 144 (S = 88: ceil(12213 / 88) = 139 -> 144).  Rows
    without a k-tile (SIMT, segment-K) round to ``split_align``."""
    K = _check_int("K", K, 0)
    align = row.split_align or 1
    if row.k_tile and K and K % (8 * align) == 0:
        return 8 * align
    return align


def split_counts(row: KernelModel, K: int, max_split: int = 64) -> list[int]:
    """The split-K slice counts S = 1..max_split that cut K differently under ``row``'s
    slicing (each distinct slicing once, the smallest S first).  S up to 44 was seen (tf32
    s1688 with splitKreduce at 55x283x8870 and 168x276x13067)."""
    K = _check_int("K", K, 0)
    max_split = _check_int("max_split", max_split, 1)
    if row.k_order:  # a kernel reading K in chunks (Triton's own loop): no split-K
        return [1]
    seen, out = set(), []
    for S in range(1, max_split + 1):
        if row.split_interleave:  # every S deals the tiles differently (while tiles remain)
            b = (S,) if S <= max(1, -(-K // row.split_interleave)) else None
        else:
            b = tuple(split_bounds(K, S, slice_align(row, K)))
        if b is not None and b not in seen:
            seen.add(b)
            out.append(S)
    return out


def lane_chunks(row: KernelModel, K: int) -> list[tuple[int, int]]:
    """(lanes, chunk width) pairs a ``lanes`` row may deal K in at length K, the common ones
    first: up to ``row.lanes`` lanes (powers of two down to 2), chunks of powers of two up to
    64 or ceil(K / lanes) (one block per lane).  H200 gemv sweep (scripts/fit_gemv.py, 221 of
    222 single-pass shapes): 32 lanes with chunks of 1 at long K, one block per lane at K <=
    512, 64 at M = 1; 16, 8, 4 lanes when many outputs fill the SMs; 2 lanes of contiguous
    halves (chunks up to 64) at short K with M = 1.  The cuBLAS rule choosing among them is
    fitted there, not here: explain tries these in order and the outputs decide."""
    K = _check_int("K", K, 0)
    if not row.lanes:
        return []
    out = []
    for L in [row.lanes >> i for i in range(row.lanes.bit_length()) if row.lanes >> i >= 2]:
        whole = max(1, -(-K // L))
        out += [(L, g) for g in sorted({g for g in (1, 2, 4, 8, 16, 32, 64) if g < whole} | {whole})]
    first = [(row.lanes, 1), (row.lanes, max(1, -(-K // row.lanes))), (row.lanes // 2, 1),
             (2, min(max(1, -(-K // 2)), 64))]
    return list(dict.fromkeys([p for p in first if p in out] + out))


def row_layouts(row: KernelModel, K: int, predicted: int | None = None) -> list[tuple]:
    """(KLayout or None, model) for every schedule ``row``'s kernel may run at length K: one
    per distinct split-K slicing (``split_counts``, plus the library's ``predicted`` count
    where it is beyond them: cuBLAS was seen cutting K = 12504 into 75 slices), or per chunk
    width of a ``lanes`` row.  None: K in order, the model's slices as the row rounds them."""
    if row.lanes:
        lays = [KLayout(g, L, 1, interleave=True) for L, g in lane_chunks(row, K)]
        return [(lay, lay.model(row.gemm_model, K)) for lay in lays]
    counts = split_counts(row, K)
    if predicted and predicted not in counts and predicted <= K:
        counts.append(predicted)
    out = []
    for S in counts:
        lay = kernel_klayout(row, S, K)
        out.append((lay, kernel_layout(row, K, S)[1] if lay is None else lay.model(row.gemm_model, K)))
    return out


_TILESIZE = re.compile(r"tilesize(\d+)x(\d+)x\d+")


def row_tiles(row: KernelModel, kernels, K: int, sms: int | None):
    """The TileSchedule of a ``segment_k`` row's ``_on`` kernel among ``kernels`` (tiles of
    TM x TN from its name, segments of whole ``split_align`` blocks: fp4ref.native's
    segment_k_split), or None (no such kernel, or the SM count unknown)."""
    from fp4ref.native import TileSchedule
    if not row.segment_k or not sms:
        return None
    for k in _names(kernels):
        m = _TILESIZE.search(k)
        if m and "segment_k_on" in k and re.search(row.pattern, k):
            return TileSchedule(int(m.group(2)), int(m.group(1)), int(sms), row.split_align or 1, row.gemm_model)
    return None


def _check_int(name: str, v, lo: int) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < lo:
        raise ValueError(f"{name}: invalid value {v!r}; valid choices: an int >= {lo}")
    return int(v)


def kernel_layout(row: KernelModel, K: int, split_k: int = 1, *, chunk: int = 1) -> tuple[np.ndarray, GemmModel]:
    """(index, model): the padded product order of ``row``'s kernel at length K with
    ``split_k`` slices -- index[j] is the k of padded position j, -1 where the kernel
    multiplies a zero fill -- and the family model that reproduces the kernel on operands
    gathered by that index (split_k / split_tile set for the padded slices).  A ``lanes``
    row deals ``chunk``-wide tiles to its lanes (split_k is the row's)."""
    K = _check_int("K", K, 0)
    split_k = _check_int("split_k", split_k, 1)
    base = row.gemm_model
    lay = kernel_klayout(row, split_k, K, chunk=chunk)
    if lay is None:  # contiguous slices, K in order
        bounds = split_bounds(K, split_k, row.split_align or 1) if K else [(0, 0)]
        index = np.arange(K, dtype=np.int64)
        if len(bounds) == 1:
            return index, base.replace(split_k=1, split_tile=None)
        return index, base.replace(split_k=split_k, split_tile=row.split_align or 1)
    index, _ = lay.index(K)
    return index, lay.model(base, K)


def kernel_klayout(row: KernelModel, split_k: int = 1, K: int | None = None, *, chunk: int = 1) -> KLayout | None:
    """The schedule table's form of ``row``'s K order with ``split_k`` slices (None: K as
    given, contiguous slices).  Pass K: where K is a multiple of a 128-byte line the slices
    are rounded to it (``slice_align``)."""
    if row.k_order:
        return KLayout(len(row.k_order), 1, 1, chunk=row.k_order)
    if row.lanes:  # split_k: the lanes (row.lanes when 1)
        return KLayout(_check_int("chunk", chunk, 1), split_k if split_k > 1 else row.lanes, 1, interleave=True)
    if row.split_interleave:
        return KLayout(row.split_interleave, split_k, 1, interleave=True)
    if not row.k_tile:
        return None
    return KLayout(row.k_tile, split_k, row.split_align or 1 if K is None else slice_align(row, K))


def kernel_operands(row: KernelModel, a, b, split_k: int = 1, *, chunk: int = 1):
    """(a', b', model): ``a`` [M, K] and ``b`` [K, N] (numpy arrays or torch tensors) with the
    kernel's zero fill inserted along K, and the family model that computes ``row``'s kernel
    on them (``simulate_gemm(model, a', b')`` / ``fp4ref.gemm.emulate``)."""
    K = a.shape[1]
    if b.shape[0] != K:
        raise ValueError(f"b: invalid shape {tuple(b.shape)}; valid choices: [K={K}, N]")
    index, model = kernel_layout(row, K, split_k, chunk=chunk)
    if np.array_equal(index, np.arange(K)):  # K as given (a permutation is not)
        return a, b, model
    return gather_k(a, index, 1), gather_k(b, index, 0), model
