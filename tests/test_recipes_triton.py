"""Fused Triton quantizers == torch paths (== exact reference), on a CUDA GPU."""
import pytest
import torch
from hypothesis import given, settings, strategies as st

from fp4ref.quant import mx as FM, nvfp4 as FN, ue5m3 as FU
from fp4ref.quant.inputs import block_tensors

pytestmark = pytest.mark.gpu


def _cuda(x):
    return x.to("cuda")


@settings(max_examples=40)
@given(x=block_tensors([1, 7, 33], [32, 96, 160], 16), amax=st.sampled_from([None, 1.0, 1e-3]))
def test_two_level_kernel(x, amax):
    from fp4ref.quant import triton_quant as TQ
    if not TQ.available(_cuda(x)):
        pytest.skip("triton not installed")
    x = _cuda(x)
    for fn in (lambda b: FN.quantize(x, "te_nvfp4", amax=amax, backend=b),
               lambda b: FU.quantize(x, amax=amax, backend=b),
               lambda b: FU.quantize(x, amax=amax, target=2048, backend=b)):
        assert fn("triton").same_bits(fn("torch"))


@settings(max_examples=40)
@given(x=block_tensors([1, 7, 33], [32, 96, 160], 32))
def test_mx_kernel(x):
    from fp4ref.quant import triton_quant as TQ
    if not TQ.available(_cuda(x)):
        pytest.skip("triton not installed")
    x = _cuda(x)
    assert FM.quantize(x, "ocp_mx_floor", backend="triton").same_bits(
        FM.quantize(x, "ocp_mx_floor", backend="torch"))


def test_large_tensor_and_amax():
    from fp4ref.quant import triton_quant as TQ
    x = torch.randn(1024, 4096, device="cuda").to(torch.bfloat16)
    if not TQ.available(x):
        pytest.skip("triton not installed")
    x[3, 5] = float("nan")
    assert torch.isnan(TQ.amax(x))
    x[3, 5] = 7.0
    assert TQ.amax(x).item() == x.float().abs().max().item()
    assert FN.quantize(x, "te_nvfp4", backend="triton").same_bits(
        FN.quantize(x, "te_nvfp4", backend="torch"))


def test_cuda_torch_path_equals_cpu_reference():
    from fp4ref.quant import quantize as fq
    from reference.recipes import quantize as rq
    x = torch.randn(4, 64)
    x[0, 0] = 0.0
    for p in ("te_nvfp4", "ue5m3", "ocp_mx_floor", "torchao_mx_rceil", "quartet_fwd",
              "te_nvfp4_4over6"):
        kw = {"backend": "torch"} if p in ("te_nvfp4", "ue5m3", "ocp_mx_floor") else {}
        assert fq(_cuda(x), p, **kw).same_bits(rq(x, p)), p
