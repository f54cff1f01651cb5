"""Quantization throughput as a fraction of copy bandwidth (``fp4ref bench --sections quant``).

For each quantizer: time per call (median of timed repeats; CUDA events on a GPU),
bytes read + written, and that rate divided by the rate of a same-size torch copy
(bytes read + written by ``dst.copy_(src)``).  Two byte counts per row:
``bytes_moved`` (what the kernels touch, e.g. the extra amax pass of current
scaling) and ``bytes_logical`` (input once + outputs).  torchao's quantizers on
the same tensor sit beside ours.  The public calls (``fp4ref.quantize_recipe(...,
backend="triton")``: NVFP4 / UE5M3 with amax given and with current scaling, MXFP4) are
timed beside the internal kernel entry points, with ``ratio_public_internal``.  Target on the H200: >= 60% of copy bandwidth
(logical bytes) for the fused kernels.  Ratios are reported, never asserted.
Timing (CUDA): ``seconds`` is the sustained time per call (10 calls back to back between
two events, for the copy baseline too), the best of three medians taken in turn with a
copy of the same tensor; the ratios use that paired copy (``copy_seconds_paired``), so
clock drift during the run cancels.  ``seconds_single_call`` is one call between two
events, so it also counts host launch latency (about 10-30 us of Python + Triton launch),
which a lone call of a ~50 us kernel cannot hide; ``seconds_device`` is the GPU time alone
(the launches queue up behind a GPU spin, ``triton_quant.gpu_time``).
"""
from __future__ import annotations

import torch

from .timing import timer

__all__ = ["run", "PUBLIC_PAIRS"]


class _Bench:
    """One input tensor, its copy baseline and the rows measured against it."""

    def __init__(self, device):
        from ..quant.triton_quant import gpu_time
        self.device = device
        self.cuda = cuda = device.type == "cuda"
        self.gpu_time = gpu_time
        M = K = 8192 if cuda else 1024
        self.shape = [M, K]
        self.reps = 20 if cuda else 3
        self.timeit = timer(device, batch=10 if cuda else 1)
        self.timeit1 = timer(device)
        g = torch.Generator(device="cpu").manual_seed(0)
        self.x = x = torch.randn(M, K, generator=g, dtype=torch.float32).to(torch.bfloat16).to(device)
        self.N = M * K
        self.dst = dst = torch.empty_like(x)
        t_copy = self.timeit(lambda: dst.copy_(x), self.reps)
        self.copy_bytes = copy_bytes = 2 * self.N * 2
        self.copy_bw = copy_bytes / t_copy
        self.rows = [{"section": "quant", "name": "torch copy (baseline)", "device": str(device),
                      "shape": [M, K], "dtype": "bfloat16", "seconds": t_copy,
                      "seconds_single_call": self.timeit1(lambda: dst.copy_(x), self.reps),
                      "bytes_moved": copy_bytes, "bytes_logical": copy_bytes,
                      "gb_per_s": self.copy_bw / 1e9, "frac_copy_bw": 1.0, "frac_copy_bw_logical": 1.0}]

    def _times(self, fn):
        """(paired copy s, s, paired copy device s, device s, single call s).  The copy is timed
        again right before each quantizer (and the two interleaved three times, best kept):
        clock and thermal drift during the run cancel."""
        copy = lambda: self.dst.copy_(self.x)  # noqa: E731
        tc, t, tcd, td = (float("inf"),) * 4
        for _ in range(3):
            tc = min(tc, self.timeit(copy, self.reps))
            t = min(t, self.timeit(fn, self.reps))
            if self.cuda:   # device time alone: the launches queue up behind a GPU spin
                tcd = min(tcd, self.gpu_time(copy, 10) / 1e4)
                td = min(td, self.gpu_time(fn, 10) / 1e4)
        return tc, t, tcd, td, self.timeit1(fn, self.reps)

    def add(self, name, fn, moved, logical, note=""):
        try:
            fn()
            tc, t, tcd, td, t1 = self._times(fn)
        except Exception as e:  # noqa: BLE001 - report, never fake
            self.rows.append({"section": "quant", "name": name, "device": str(self.device),
                              "skipped": True, "reason": f"{type(e).__name__}: {e}"})
            return
        bw = self.copy_bytes / tc
        self.rows.append({
            "section": "quant", "name": name, "device": str(self.device), "shape": self.shape,
            "dtype": "bfloat16", "seconds": t, "seconds_single_call": t1, "copy_seconds_paired": tc,
            "frac_copy_bw_logical_single_call": (logical / t1) / bw, "bytes_moved": moved,
            "bytes_logical": logical, "gb_per_s": moved / t / 1e9, "frac_copy_bw": (moved / t) / bw,
            "frac_copy_bw_logical": (logical / t) / bw,
            "frac_copy_bw_logical_vs_first_copy": (logical / t) / self.copy_bw,
            **({"seconds_device": td, "copy_seconds_device": tcd,
                "frac_copy_bw_logical_device": (logical / td) / (self.copy_bytes / tcd)}
               if self.cuda else {}),
            "note": note})


def run(device=None) -> list[dict]:
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    b = _Bench(device)
    N = b.N
    out_nv = N // 2 + N // 16 + 4            # packed e2m1 + ue4m3 scales + fp32 tensor scale
    out_mx = N // 2 + N // 32
    _fused_rows(b, out_nv, out_mx)
    _pair_public(b.rows)
    _torch_rows(b, out_nv, out_mx)
    _torchao_rows(b, out_nv, out_mx)
    return b.rows


def _fused_rows(b: _Bench, out_nv: int, out_mx: int) -> None:
    """The Triton kernels' internal entry points, then the public calls on the same tensor:
    bytes_moved of current scaling counts the input twice (torch max|x|, then the kernel)."""
    from ..quant import nvfp4 as FN
    from ..quant import triton_quant as TQ
    x, N, add = b.x, b.N, b.add
    if not TQ.available(x):
        return
    from ..quant.nvfp4 import s_enc_params
    amax = TQ.amax(x)
    _, dec, mult = s_enc_params(amax, 448.0)
    p_nv = torch.stack((mult, dec))
    _, dec5, mult5 = s_enc_params(amax, 448.0)
    p_ue = torch.stack((mult5, dec5))
    add("fp4ref NVFP4 te_nvfp4 1x16, current scaling (Triton: amax pass + fused quantize)",
        lambda: FN.quantize_packed(x, "te_nvfp4"), 2 * N * 2 + out_nv, N * 2 + out_nv,
        "internal: nvfp4.quantize_packed, packed codes")
    add("fp4ref NVFP4 te_nvfp4 1x16, amax given (Triton fused, one pass)",
        lambda: TQ.two_level_1x16(x, p_nv, "ue4m3", False), N * 2 + out_nv, N * 2 + out_nv,
        "internal: triton_quant.two_level_1x16, per-tensor scales given")
    add("fp4ref UE5M3 B=16 T=448, cached amax (Triton fused, one pass)",
        lambda: TQ.two_level_1x16(x, p_ue, "ue5m3", True), N * 2 + out_nv, N * 2 + out_nv,
        "internal: triton_quant.two_level_1x16, per-tensor scales given")
    add("fp4ref MXFP4 ocp_mx_floor (Triton fused, one pass)",
        lambda: TQ.mx_floor_e2m1(x), N * 2 + out_mx, N * 2 + out_mx,
        "internal: triton_quant.mx_floor_e2m1")
    _public_rows(add, x, amax, N * 2, out_nv, out_mx)


def _torch_rows(b: _Bench, out_nv: int, out_mx: int) -> None:
    from ..quant import mx as FM
    from ..quant import nvfp4 as FN
    from ..quant import ue5m3 as FU
    x, N = b.x, b.N
    b.add("fp4ref NVFP4 te_nvfp4 1x16 (torch path)",
          lambda: FN.quantize(x, "te_nvfp4", backend="torch"), 2 * N * 2 + out_nv, N * 2 + out_nv,
          "unfused torch ops; codes kept unpacked (one byte per element)")
    b.add("fp4ref UE5M3 B=16 T=448 (torch path)",
          lambda: FU.quantize(x, amax=1.0, backend="torch"), N * 2 + out_nv, N * 2 + out_nv,
          "unfused torch ops")
    b.add("fp4ref MXFP4 ocp_mx_floor (torch path)",
          lambda: FM.quantize(x, "ocp_mx_floor", backend="torch"), N * 2 + out_mx,
          N * 2 + out_mx, "unfused torch ops")


def _torchao_rows(b: _Bench, out_nv: int, out_mx: int) -> None:
    """torchao's quantizers on the same tensor, beside ours (skipped, with the reason, when
    torchao does not import)."""
    x, N = b.x, b.N
    try:
        from torchao.prototype.mx_formats.nvfp4_tensor import NVFP4Tensor, per_tensor_amax_to_scale
        from torchao.prototype.mx_formats.mx_tensor import to_mx
        from torchao.prototype.mx_formats.config import ScaleCalculationMode

        def ao_nv():
            pts = per_tensor_amax_to_scale(torch.max(torch.abs(x)))
            return NVFP4Tensor.to_nvfp4(x, 16, per_tensor_scale=pts)
        b.add("torchao NVFP4Tensor.to_nvfp4 two-level (torch path)", ao_nv,
              2 * N * 2 + out_nv, N * 2 + out_nv)
        b.add("torchao to_mx MXFP4 FLOOR (torch path)",
              lambda: to_mx(x, torch.float4_e2m1fn_x2, 32, ScaleCalculationMode.FLOOR),
              N * 2 + out_mx, N * 2 + out_mx)
    except Exception as e:  # noqa: BLE001
        b.rows.append({"section": "quant", "name": "torchao quantizers", "device": str(b.device),
                       "skipped": True, "reason": f"torchao not importable: {type(e).__name__}: {e}"})


# public row -> the internal row it should match (ratio_public_internal = t_internal / t)
PUBLIC_PAIRS = {
    "public quantize_recipe te_nvfp4, amax given":
        "fp4ref NVFP4 te_nvfp4 1x16, amax given (Triton fused, one pass)",
    "public quantize_recipe ue5m3, amax given":
        "fp4ref UE5M3 B=16 T=448, cached amax (Triton fused, one pass)",
    "public quantize_recipe ocp_mx_floor":
        "fp4ref MXFP4 ocp_mx_floor (Triton fused, one pass)",
    "public quantize_recipe te_nvfp4, current scaling":
        "fp4ref NVFP4 te_nvfp4 1x16, current scaling (Triton: amax pass + fused quantize)",
    "public quantize_recipe ue5m3, current scaling":
        "fp4ref NVFP4 te_nvfp4 1x16, current scaling (Triton: amax pass + fused quantize)",
}


def _public_rows(add, x, amax, in_bytes, out_nv, out_mx):
    """The calls users make: fp4ref.quantize_recipe(..., backend="triton") returning a
    BlockScaledTensor (codes packed until read), amax as a float32 device tensor (a cached
    amax) or None (current scaling: two reads of the input)."""
    import fp4ref   # the public name itself: that is the call users make
    q = fp4ref.quantize_recipe
    names = list(PUBLIC_PAIRS)
    add(names[0], lambda: q(x, "te_nvfp4", amax=amax, backend="triton"),
        in_bytes + out_nv, in_bytes + out_nv, "public API, one fused kernel")
    add(names[1], lambda: q(x, "ue5m3", amax=amax, backend="triton"),
        in_bytes + out_nv, in_bytes + out_nv, "public API, one fused kernel")
    add(names[2], lambda: q(x, "ocp_mx_floor", backend="triton"),
        in_bytes + out_mx, in_bytes + out_mx, "public API, one fused kernel")
    add(names[3], lambda: q(x, "te_nvfp4", backend="triton"), 2 * in_bytes + out_nv,
        in_bytes + out_nv, "public API: torch max|x| + one fused kernel; frac_copy_bw counts "
        "both reads of the input")
    add(names[4], lambda: q(x, "ue5m3", backend="triton"), 2 * in_bytes + out_nv,
        in_bytes + out_nv, "public API: torch max|x| + one fused kernel; frac_copy_bw counts "
        "both reads of the input")


def _pair_public(rows) -> None:
    """Puts the internal row's figures beside each public row (the ratio shows overhead)."""
    by_name = {r["name"]: r for r in rows if "seconds" in r}
    for r in rows:
        ref = by_name.get(PUBLIC_PAIRS.get(r.get("name"), ""))
        if ref is not None and "seconds" in r:
            r["internal_name"] = ref["name"]
            r["internal_frac_copy_bw"] = ref["frac_copy_bw"]
            r["ratio_public_internal"] = ref["seconds"] / r["seconds"]


if __name__ == "__main__":  # pragma: no cover
    for r in run():
        print(r)
