"""Which GemmModel does a named cuBLAS kernel compute?  (issue 13, deliverable 3)

At unaligned random shapes cuBLAS runs CUTLASS 2.x kernels compiled for sm_75 / sm_80 (and
xmma SIMT kernels) instead of the sm_90 kernels the committed device models were fitted on.
``KERNEL_MODELS`` maps a profiler kernel name (regex) and a device-name prefix to the model
that reproduced that kernel's native H200 outputs bit for bit (docs/kernels.md gives the
evidence per row; tests/test_probes_kernels.py replays committed excerpts).

Two properties of these kernels are per launch or outside the model family, so a row
carries them next to its model:

* split-K: cuBLAS picks the number of slices S per shape (3, 4, 13 and 26 were seen), in-
  kernel ("serial", a Memset of the semaphores precedes it) or through a separate
  ``splitKreduce_kernel`` ("parallel").  Both add the FP32 slice results in slice order,
  which is the family's split-K add.  Each slice but the last holds ceil(K / S) rounded up
  to ``split_align`` elements (16 bytes of the operand).  S is left to the caller.
* residue-first k-tiles (``k_tile``): CUTLASS 2.x predicated iterators load the partial
  k-tile (slice length mod k_tile) FIRST, zero-filled, then whole tiles; the F-wide MMA steps
  start at each tile's start.  The family's fused steps start at the slice start and leave
  the partial step last, so at K % k_tile != 0 the family model alone differs.
  ``kernel_operands`` inserts the zero fill into the operands (what the hardware multiplies)
  and returns the family model that then reproduces the kernel bit for bit.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from reference.gemm import GemmModel
from reference.notation import parse_short
from reference.schedule import split_bounds

from fp4ref.native import KLayout, residue_first

__all__ = ["KernelModel", "KERNEL_MODELS", "kernel_models", "models_for_kernels", "kernel_family", "kernel_klayout",
           "kernel_layout", "kernel_operands", "split_counts"]

_TC = "F=8 align=25:RTZ:esum acc=23:RTZ G=- out=float32:RNE"    # mma.sync m16n8k8 (bf16/f16/tf32)
_TC16 = "F=16 align=25:RTZ:esum acc=23:RTZ G=- out=float32:RNE"  # mma.sync m16n8k16
_FMA = "F=1 align=exact acc=23:RNE G=- out=float32:RNE"          # one FP32 FMA per product
_HALF = ("cuda-cublas-bfloat16", "cuda-cublas-float16")


@dataclass(frozen=True)
class KernelModel:
    """One row: kernels whose name matches ``pattern`` (re.search) on devices whose name
    starts with one of ``devices`` compute ``model`` (short form, split_k = 1), with
    split-K slices rounded up to ``split_align`` elements and residue-first k-tiles of
    ``k_tile`` products (None: the family's step layout is the kernel's)."""
    pattern: str
    devices: tuple[str, ...]
    model: str
    evidence: str
    confirmed: bool = True
    k_tile: int | None = None
    split_align: int | None = None

    def __post_init__(self):
        re.compile(self.pattern)  # a bad regex fails at import, not at lookup
        if not self.devices or not all(isinstance(d, str) and d for d in self.devices):
            raise ValueError(f"KernelModel.devices: invalid value {self.devices!r}; valid choices: "
                             "a non-empty tuple of device-name prefixes")
        for name in ("k_tile", "split_align"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
                raise ValueError(f"KernelModel.{name}: invalid value {v!r}; valid choices: None or an int >= 1")
        parse_short(self.model)

    @property
    def gemm_model(self) -> GemmModel:
        return parse_short(self.model)

    def matches(self, device_name: str, kernel_names) -> bool:
        return (any(device_name.startswith(d) for d in self.devices)
                and any(re.search(self.pattern, k) for k in kernel_names))


KERNEL_MODELS: tuple[KernelModel, ...] = (
    KernelModel(
        r"cutlass_75_tensorop_s1688gemm_(bf16|f16)_(256x128|128x128)_nn_align1", _HALF, _TC,
        "H200 survey dumps, 256/256 outputs each, bf16 and f16: 256x128 at 3485x2609x8375 (serial "
        "split-K, 3 slices 2792+2792+2791), 3332x2661x14955 (bf16 4 x 3744 .. 3723; f16 3 x 4992 .. "
        "4971), 2063x2485x15905 (3 x 5304 .. 5297); 128x128 at 1106x1261x672 (no split). Misses: "
        "F=16 0..51/256 per dump, value alignment 1989/2048, no residue-first tile 26..256/256, "
        "k-tile 16 or 64 246..255/256",
        k_tile=32, split_align=8),
    KernelModel(
        r"cutlass_80_tensorop_s16816gemm_(bf16|f16)_64x64_32x6_nn_align2", _HALF, _TC16,
        "H200 survey dumps 309x68x2872 bf16 and f16, 256/256 each: parallel split-K "
        "(splitKreduce_kernel), 13 slices 12 x 224 + 184, last slice's residue tile first; "
        "misses: F=8 94 and 18/256, no residue-first tile 215 and 176/256, k-tile 16 or 64 231..254/256",
        k_tile=32, split_align=8),
    KernelModel(
        r"cutlass_80_tensorop_s1688gemm_(128x256|256x128|128x128|64x64)_32x\d+_nn_align[14]",
        ("cuda-cublas-tf32",), _TC,
        "H200 survey dumps, 256/256 each: 128x256_32x3 align1 at 3485x2609x8375 (serial, 3 x "
        "2792 ..) and 3332x2661x14955 (4 x 3740 .. 3735); 256x128_32x3 align1 at 2063x2485x15905 "
        "(3 x 5304 ..); 64x64_32x6 align4 at 309x68x2872 (parallel, 13 x 224 ..); 128x128_32x3 "
        "align1 at 1106x1261x672 (no split): 4096/4096 in the survey's own GPU check. "
        "Misses: G=64 (the sm90 model) 10/256 at 309x68x2872, value alignment 964/1024, F=4 or 16 "
        "0..19/256 per dump, k-tile 16 or 64 244..253/256, no residue-first tile 14..256/256",
        k_tile=32, split_align=4),
    KernelModel(
        r"cutlass_80_simt_sgemm_(256x128_8x4|128x64_8x5)_nn_align1", ("cuda-cublas-fp32",), _FMA,
        "H200 survey dumps, 256/256 each: 256x128_8x4 at 3485x2609x8375 (serial, 3 x 2792 ..) and "
        "3332x2661x14955 (4 x 3740 .. 3735); 128x64_8x5 at 309x68x2872 (parallel, 26 x 112 .. 72). "
        "Misses: F=2 45/768, RTZ normalization 2/768",
        k_tile=None, split_align=4),
    KernelModel(
        r"sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize64x64x8_stage3_warpsize1x4x1_ffma",
        ("cuda-cublas-fp32",), _FMA,
        "survey's own H200 check at 1106x1261x672 (no split): 4096/4096; no dump",
        k_tile=None, split_align=4),
    # Hypotheses: the same instruction and mainloop at tile sizes / layouts not yet seen.
    KernelModel(r"cutlass_75_tensorop_s1688gemm_(bf16|f16)_", _HALF, _TC,
                "unconfirmed: other tiles/layouts of the confirmed cutlass_75 s1688 row",
                confirmed=False, k_tile=32, split_align=8),
    KernelModel(r"cutlass_80_tensorop_s16816gemm_(bf16|f16)_\d+x\d+_32x", _HALF, _TC16,
                "unconfirmed: other tiles/layouts (k-tile 32) of the confirmed s16816 row",
                confirmed=False, k_tile=32, split_align=8),
    KernelModel(r"cutlass_80_tensorop_s16816gemm_(bf16|f16)_\d+x\d+_64x", _HALF, _TC16,
                "unconfirmed: the s16816 mainloop with a 64-wide k-tile (name: _64x3 / _64x6). "
                "The H200 random-shape run (reports/baselines/shapes/) met 256x128_64x3 and "
                "128x256_64x3 kernels at 13 shapes and no row explained them (k-tile 32 "
                "assumed there); k_tile = the name's threadblock K, to be confirmed",
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


def split_counts(row: KernelModel, K: int, max_split: int = 32) -> list[int]:
    """The split-K slice counts S = 1..max_split that cut K differently under ``row``'s
    slice rounding (each distinct slicing once, the smallest S first)."""
    K = _check_int("K", K, 0)
    max_split = _check_int("max_split", max_split, 1)
    seen, out = set(), []
    for S in range(1, max_split + 1):
        b = tuple(split_bounds(K, S, row.split_align or 1))
        if b not in seen:
            seen.add(b)
            out.append(S)
    return out


def _check_int(name: str, v, lo: int) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < lo:
        raise ValueError(f"{name}: invalid value {v!r}; valid choices: an int >= {lo}")
    return int(v)


def kernel_layout(row: KernelModel, K: int, split_k: int = 1) -> tuple[np.ndarray, GemmModel]:
    """(index, model): the padded product order of ``row``'s kernel at length K with
    ``split_k`` slices -- index[j] is the k of padded position j, -1 where the kernel
    multiplies a zero fill -- and the family model that reproduces the kernel on operands
    gathered by that index (split_k / split_tile set for the padded slices)."""
    K = _check_int("K", K, 0)
    split_k = _check_int("split_k", split_k, 1)
    base = row.gemm_model
    if not row.k_tile:
        bounds = split_bounds(K, split_k, row.split_align or 1) if K else [(0, 0)]
        index = np.arange(K, dtype=np.int64)
        if len(bounds) == 1:
            return index, base.replace(split_k=1, split_tile=None)
        return index, base.replace(split_k=split_k, split_tile=row.split_align or 1)
    lay = KLayout(row.k_tile, split_k, row.split_align or 1)
    index, _ = residue_first(K, lay.k_tile, lay.split_k, lay.split_align)
    return index, lay.model(base, K)


def kernel_klayout(row: KernelModel, split_k: int = 1) -> KLayout | None:
    """The schedule table's form of ``row``'s K order with ``split_k`` slices (None: as given)."""
    return KLayout(row.k_tile, split_k, row.split_align or 1) if row.k_tile else None


def kernel_operands(row: KernelModel, a, b, split_k: int = 1):
    """(a', b', model): ``a`` [M, K] and ``b`` [K, N] (numpy arrays or torch tensors) with the
    kernel's zero fill inserted along K, and the family model that computes ``row``'s kernel
    on them (``simulate_gemm(model, a', b')`` / ``fp4ref.gemm.emulate``)."""
    K = a.shape[1]
    if b.shape[0] != K:
        raise ValueError(f"b: invalid shape {tuple(b.shape)}; valid choices: [K={K}, N]")
    index, model = kernel_layout(row, K, split_k)
    if (index >= 0).all():
        return a, b, model
    return _gather(a, index, 1), _gather(b, index, 0), model


def _gather(x, index: np.ndarray, axis: int):
    """x taken at ``index`` along ``axis``, +0 where index is -1."""
    keep = np.maximum(index, 0)
    zero = index < 0
    if isinstance(x, np.ndarray):
        y = np.take(x, keep, axis=axis)
        shape = (1, -1) if axis == 1 else (-1, 1)
        return np.where(zero.reshape(shape), np.zeros((), x.dtype), y)
    import torch  # a tensor: gather on its device
    idx = torch.as_tensor(keep, device=x.device)
    y = torch.index_select(x, axis, idx)
    z = torch.as_tensor(zero, device=x.device).reshape((1, -1) if axis == 1 else (-1, 1))
    return torch.where(z, torch.zeros((), dtype=x.dtype, device=x.device), y)
