"""Flat-block fused quantizers (bf16) == the 2-D tile kernels (FP4REF_QUANT_LEGACY=1), bit for
bit.  Without CUDA both run in the Triton interpreter (logic only); the GPU equality with the
torch paths is tests/test_recipes_triton.py."""
from __future__ import annotations

import pytest
import torch

triton = pytest.importorskip("triton")
# without CUDA: run in a process of its own under TRITON_INTERPRET=1 (tests/test_interpreter.py)
pytestmark = pytest.mark.triton_interpret

from fp4ref.quant import triton_quant as TQ  # noqa: E402


def _inputs(M, K, seed):
    g = torch.Generator().manual_seed(seed)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    x = (torch.randn(M, K, generator=g) * torch.exp(8 * torch.randn(M, K, generator=g)))
    x = x.to(torch.bfloat16)
    raw = torch.randint(-32768, 32767, (M, K), generator=g, dtype=torch.int32).to(torch.int16)
    y = raw.view(torch.bfloat16)          # every bit pattern: NaN, inf, subnormals, -0
    x.view(-1)[::29] = 0.0
    x.view(-1)[3::31] = -0.0
    y.view(-1)[7::41] = float("inf")      # random bit patterns almost never hold one
    y.view(-1)[11::43] = float("-inf")
    return [x.to(dev), y.to(dev)]


def _both(fn, x, monkeypatch):
    monkeypatch.delenv("FP4REF_QUANT_LEGACY", raising=False)
    a = fn(x)
    monkeypatch.setenv("FP4REF_QUANT_LEGACY", "1")
    b = fn(x)
    monkeypatch.delenv("FP4REF_QUANT_LEGACY")
    return a, b


@pytest.mark.parametrize("shape", [(1, 32), (5, 96), (33, 160)])
def test_flat_equals_tiles(shape, monkeypatch):
    for x in _inputs(*shape, seed=shape[0] * 1000 + shape[1]):
        if not TQ.available(x):
            pytest.skip("needs triton and CUDA or TRITON_INTERPRET=1")
        dev = x.device
        for sf, z in (("ue4m3", False), ("ue5m3", True)):
            # [1e-30, 1e35]: s_f * dec overflows, enc = 0, and inf * 0 is a NaN product
            for p in ([1 / 6, 1.0], [448 / 6 / 3.0, 3.0 / 448], [1e30, 1e-30], [1e-30, 1e35]):
                par = torch.tensor(p, dtype=torch.float32, device=dev)
                (q1, s1), (q2, s2) = _both(lambda t: TQ.two_level_1x16(t, par, sf, z), x,
                                           monkeypatch)
                assert torch.equal(q1, q2) and torch.equal(s1, s2), (sf, z, p)
        (q1, s1), (q2, s2) = _both(TQ.mx_floor_e2m1, x, monkeypatch)
        assert torch.equal(q1, q2) and torch.equal(s1, s2)


def _tie_blocks():
    """Blocks of 16 whose products land on every E2M1 rounding tie and on the bf16 values
    next to it (amax 6 with the params below gives a block scale of exactly 1, and the MX
    scale of an amax-6 block is 2**0): the FMA-pipe rounding of the flat kernels against
    the tile kernels' integer rounding, ties to even included."""
    ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, 0.5, 3.0])
    b = ties.to(torch.bfloat16)
    up = (b.view(torch.int16) + 1).view(torch.bfloat16)
    down = (b.view(torch.int16) - 1).view(torch.bfloat16)
    vals = torch.cat([b, up, down]).to(torch.float32)
    vals = torch.cat([vals, -vals, torch.tensor([0.0, -0.0, 1e-3, -5.9])])
    n = vals.numel()
    rows = []
    for start in range(0, n, 15):
        blk = torch.zeros(32)
        blk[0] = 6.0
        chunk = vals[start:start + 15]
        blk[1:1 + chunk.numel()] = chunk
        blk[16] = -6.0
        blk[17:17 + chunk.numel()] = chunk.flip(0)
        rows.append(blk)
    return torch.stack(rows).to(torch.bfloat16)


def test_flat_ties_equal_tiles(monkeypatch):
    x = _tie_blocks()
    x = x.to("cuda" if torch.cuda.is_available() else "cpu")
    if not TQ.available(x):
        pytest.skip("needs triton and CUDA or TRITON_INTERPRET=1")
    par = torch.tensor([1 / 6, 1.0], dtype=torch.float32, device=x.device)
    for sf, z in (("ue4m3", False), ("ue5m3", True)):
        (q1, s1), (q2, s2) = _both(lambda t: TQ.two_level_1x16(t, par, sf, z), x, monkeypatch)
        assert torch.equal(s1, s2) and torch.equal(q1, q2), sf
        assert (s1 == (0x38 if sf == "ue4m3" else 0x78)).all()   # block scale exactly 1.0
    (q1, s1), (q2, s2) = _both(TQ.mx_floor_e2m1, x, monkeypatch)
    assert torch.equal(s1, s2) and torch.equal(q1, q2)
    assert (s1 == 127).all()
