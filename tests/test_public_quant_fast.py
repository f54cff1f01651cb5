"""The public quantizer calls (``fp4ref.quantize_recipe(..., backend="triton")``) run the fused
kernels and nothing else: same bits as the torch backend (Triton interpreter on CPU), and
no host sync, no float32 copy of the input, no unpacking of the codes in the call itself."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

import fp4ref  # noqa: E402
from fp4ref.quant import pack_codes  # noqa: E402
from fp4ref.quant import triton_quant as TQ  # noqa: E402

_DEV = "cuda" if torch.cuda.is_available() else "cpu"

# (profile, keywords): amax given as a float32 device tensor (a cached amax), as a Python
# number, and current scaling (amax None); UE5M3 with its own target too
CASES = [("te_nvfp4", {}), ("te_nvfp4", {"amax": 3.0}), ("te_nvfp4", {"amax": "tensor"}),
         ("ue5m3", {}), ("ue5m3", {"amax": 1e-3}), ("ue5m3", {"amax": "tensor", "target": 2048}),
         ("ue5m3", {"amax": -0.0}), ("ocp_mx_floor", {})]


def _x(dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(11)
    x = torch.randn(8, 64, generator=g) * torch.exp2(torch.randint(-6, 6, (8, 64), generator=g))
    x[1, 3], x[2, 40], x[5, 0] = float("nan"), float("inf"), -0.0
    return x.to(dtype).to(_DEV)


def _kw(kw, x):
    kw = dict(kw)
    if kw.get("amax") == "tensor":
        kw["amax"] = torch.full((), 2.5, dtype=torch.float32, device=x.device)
    return kw


def _bits(t):
    return t.reshape(-1).contiguous().view(torch.int32).cpu().tolist()


@pytest.mark.triton_interpret    # without CUDA: tests/test_interpreter.py runs it
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("profile,kw", CASES)
def test_public_triton_equals_torch(profile, kw, dtype):
    x = _x(dtype)
    if not TQ.available(x):
        pytest.skip("needs triton and CUDA or TRITON_INTERPRET=1")
    a = fp4ref.quantize_recipe(x, profile, backend="triton", **_kw(kw, x))
    b = fp4ref.quantize_recipe(x, profile, backend="torch", **_kw(kw, x))
    assert torch.equal(a.packed().cpu(), pack_codes(b.codes.cpu()))   # before .codes is read
    assert a.same_bits(b)
    for k in ("amax", "s_enc"):
        if k in b.meta:
            assert _bits(a.meta[k]) == _bits(b.meta[k]), k


class _Ops(torch.utils._python_dispatch.TorchDispatchMode):
    """Records every aten op run inside it."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func.overloadpacket.__name__))
        return func(*args, **(kwargs or {}))


# metadata-only ops (views); "full" makes a Python-number amax a device scalar without a copy
_VIEWS = {"view", "unbind", "reshape", "_reshape_alias", "select", "slice", "alias", "as_strided",
          "unsqueeze", "squeeze", "detach", "t", "transpose", "expand", "contiguous"}


@pytest.mark.parametrize("profile,kw", CASES)
def test_public_path_runs_only_the_kernel(profile, kw, monkeypatch):
    """With the kernels stubbed out, the public call runs views only: no .item()/.cpu()
    (_local_scalar_dense, _to_copy), no float32 copy of x, no unpacking."""
    x = _x()
    M, K = x.shape
    q, s16 = torch.zeros(M, K // 2, dtype=torch.uint8), torch.zeros(M, K // 16, dtype=torch.uint8)
    par = torch.zeros(4)
    monkeypatch.setattr(TQ, "available", lambda t=None: True)
    monkeypatch.setattr(TQ, "two_level_1x16_amax", lambda *a, **k: (q, s16, par))
    monkeypatch.setattr(TQ, "mx_floor_e2m1", lambda t: (q, s16[:, :K // 32]))
    kw = _kw(kw, x)
    with _Ops() as rec:
        out = fp4ref.quantize_recipe(x, profile, backend="triton", **kw)
    allowed = _VIEWS | ({"full"} if isinstance(kw.get("amax"), float) else set())
    assert set(rec.ops) <= allowed, rec.ops
    assert out.packed() is q


def test_packed_tensor_codes_and_errors():
    from fp4ref.quant.blocked import BlockScaledTensor
    p = torch.tensor([[0x21, 0xF3]], dtype=torch.uint8)
    sc = torch.zeros(1, 1, dtype=torch.uint8)
    t = BlockScaledTensor.from_packed((1, 3), p, "float4_e2m1fn", sc, "ue4m3", (1, 16))
    assert t.packed() is p
    assert t.codes.tolist() == [[1, 2, 3]]                # low nibble first; odd K trimmed
    assert t.packed().tolist() == [[0x21, 0x03]]          # re-packed from the codes now
    with pytest.raises(ValueError, match="packed"):
        BlockScaledTensor.from_packed((1, 5), p, "float4_e2m1fn", sc, "ue4m3", (1, 16))
    with pytest.raises(ValueError, match="elem_fmt"):
        BlockScaledTensor.from_packed((1, 3), p, "float8_e4m3fn", sc, "ue4m3", (1, 16))
    with pytest.raises(AttributeError, match="nope"):
        t.nope
