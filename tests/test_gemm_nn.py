"""fp4ref.nn.Linear: its three GEMMs are the recipe's quantized operands through the GEMM
model (bit for bit), recipe state behaves as documented, and the LM script runs."""
from __future__ import annotations

import json
import math
import os

import pytest
import torch

from fp4ref.gemm import emulate
from fp4ref.nn import Linear, QOperand, TENVFP4Quantizer, UE5M3Quantizer, qgemm

from .gemm_helpers import same_bits


def _manual(model, qa: QOperand, qb: QOperand):
    return emulate(model, qa.values, qb.values.t(), scales_a=qa.scales, scales_b=qb.scales.t(),
                   block=qa.block, alpha=[qa.alpha, qb.alpha])


@pytest.mark.parametrize("make", [lambda: TENVFP4Quantizer(seed=3), lambda: UE5M3Quantizer(seed=3)],
                         ids=["te_nvfp4", "ue5m3"])
@pytest.mark.parametrize("model", ["probe_matched", "decoded_fp32"])
def test_linear_gemms_are_the_recipe_through_the_model(make, model):
    torch.manual_seed(0)
    lin = Linear(32, 48, bias=True, quantizer=make(), model=model, backend="emulate")
    x = torch.randn(2, 16, 32, requires_grad=True)
    y = lin(x)
    gy = torch.randn_like(y)
    y.backward(gy)
    # replay with a fresh quantizer of the same seed: same operands, same order of calls
    q = make()
    x2 = x.detach().reshape(-1, 32)
    w = lin.weight.detach()
    yref = _manual(model, q.quantize(x2, "x"), q.quantize(w, "w")) + lin.bias.detach()
    assert same_bits(y.detach().reshape(-1, 48), yref)
    dy = gy.reshape(-1, 48)
    qdy = q.quantize(dy, "dy")
    dx = _manual(model, qdy, q.quantize(w, "w_t"))
    dw = _manual(model, q.quantize(dy, "dy_t"), q.quantize(x2, "x_t"))
    assert same_bits(x.grad.reshape(-1, 32), dx)
    assert same_bits(lin.weight.grad, dw)
    assert same_bits(lin.bias.grad, dy.sum(0))


def test_quantized_operands_decode_the_gemm_inputs():
    """dX = dY W and dW = dY^T X: the operand copies have the right orientation."""
    torch.manual_seed(1)
    q = UE5M3Quantizer()
    x = torch.randn(32, 64)
    for role, ref in (("x", x), ("x_t", x.t())):
        op = q.quantize(x, role)
        deq = op.values * op.scales.repeat_interleave(op.block, 1) * op.alpha
        assert deq.shape == ref.shape
        assert float((deq - ref).norm() / ref.norm()) < 0.25  # FP4 quantization, orientation check


def test_sample_and_hold_and_state_dict():
    torch.manual_seed(2)
    q = UE5M3Quantizer(delay=3)
    lin = Linear(16, 16, quantizer=q, backend="emulate")
    x = torch.randn(16, 16)
    amaxes = []
    for step in range(5):
        lin(x * (step + 1)).sum().backward()
        amaxes.append(float(q.cached_amax("x")))
    a0 = float(x.abs().max())
    assert amaxes == [a0, a0, a0, 4 * a0, 4 * a0]  # refreshed on calls 1 and 4 (D = 3)
    sd = lin.state_dict()
    assert set(sd) == {"weight", "bias"}  # no amax caches in checkpoints (documented)
    lin2 = Linear(16, 16, quantizer=UE5M3Quantizer(delay=3), backend="emulate")
    lin2.load_state_dict(sd)
    assert torch.equal(lin2.weight, lin.weight) and torch.equal(lin2.bias, lin.bias)
    assert lin2.quantizer.cached_amax("x") is None
    q3 = UE5M3Quantizer()
    q3.load_state_dict(q.state_dict())
    assert q3.cached_amax("x") is None and q3.hold.delay == 3


def test_bad_input():
    with pytest.raises(ValueError, match="quantizer: object does not implement"):
        Linear(16, 16, quantizer=object())
    with pytest.raises(ValueError, match="role: unknown value 'z'; valid choices: x, w, dy"):
        UE5M3Quantizer().quantize(torch.randn(16, 16), "z")
    with pytest.raises(ValueError, match=r"x: shape \(16, 20\)"):
        TENVFP4Quantizer().quantize(torch.randn(16, 20), "x")
    with pytest.raises(ValueError, match="backend: unknown value 'cuda'"):
        Linear(16, 16, quantizer=UE5M3Quantizer(), backend="cuda")
    with pytest.raises(ValueError, match="model: unknown value 'nope'"):
        Linear(16, 16, quantizer=UE5M3Quantizer(), model="nope")
    q = UE5M3Quantizer()
    a = q.quantize(torch.randn(16, 32), "x")
    b = QOperand(a.values, a.scales.repeat_interleave(2, 1)[:, :1], 1.0, 32)
    with pytest.raises(ValueError, match="qb.block"):
        qgemm("probe_matched", a, b)


def test_unquantized_linear_is_torch_linear():
    torch.manual_seed(3)
    lin = Linear(16, 8)
    x = torch.randn(4, 16)
    assert torch.equal(lin(x), torch.nn.functional.linear(x, lin.weight, lin.bias))


def test_train_lm_tiny(tmp_path):
    import importlib.util
    path = os.path.join(os.path.dirname(__file__), "..", "scripts", "train_lm.py")
    spec = importlib.util.spec_from_file_location("train_lm", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--out", str(tmp_path), "--tiny", "--device", "cpu"]) == 0
    data = json.loads((tmp_path / "losses.json").read_text())
    assert set(data["runs"]) == {"bf16", "te_nvfp4", "ue5m3"}
    for r in data["runs"].values():
        assert len(r["loss"]) == 3 and all(math.isfinite(v) for v in r["loss"])
    assert (tmp_path / "losses.png").exists() or (tmp_path / "losses.svg").exists()


@pytest.mark.gpu
@pytest.mark.parametrize("make", [TENVFP4Quantizer, UE5M3Quantizer], ids=["te_nvfp4", "ue5m3"])
def test_gpu_linear_triton_equals_emulator(make):
    torch.manual_seed(4)
    x = torch.randn(2048, 256, device="cuda")
    w = torch.randn(768, 256, device="cuda")
    dy = torch.randn(2048, 768, device="cuda")
    for model in ("probe_matched", "probe_matched_lattice", "decoded_fp32"):
        q = make()
        pairs = [(q.quantize(x, "x"), q.quantize(w, "w")), (q.quantize(dy, "dy"), q.quantize(w, "w_t")),
                 (q.quantize(dy, "dy_t"), q.quantize(x, "x_t"))]
        for qa, qb in pairs:
            assert same_bits(qgemm(model, qa, qb, "triton"), qgemm(model, qa, qb, "emulate"))
