"""Host side of the public fused quantizer calls (issue 15, deliverable 7): the argument
checks are cached per argument set, the launch's grid and keywords per launch key, and
``tensor_scale`` / ``meta`` are made from the kernel's par on first access.  The kernels are
stubbed (recording their launches), so this runs on CPU without Triton launching anything;
the bits of the real kernels are checked by tests/test_public_quant_fast.py (interpreter)."""
from __future__ import annotations

import dataclasses

import pytest
import torch

pytest.importorskip("triton")

import fp4ref  # noqa: E402
from fp4ref.quant import triton_quant as TQ  # noqa: E402
from fp4ref.quant.blocked import BlockScaledTensor  # noqa: E402


class _Kernel:
    """A Triton kernel stand-in: records (grid, keywords) of each launch, runs nothing."""

    def __init__(self):
        self.calls = []

    def __getitem__(self, grid):
        return lambda *args, **kw: self.calls.append((tuple(grid), dict(kw), args))


class _Ops(torch.utils._python_dispatch.TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func.overloadpacket.__name__))
        return func(*args, **(kwargs or {}))


@pytest.fixture
def kernels(monkeypatch):
    k2, kmx = _Kernel(), _Kernel()
    monkeypatch.setattr(TQ, "_two_level_flat_kernel", k2)
    monkeypatch.setattr(TQ, "_mx_flat_kernel", kmx)
    monkeypatch.setattr(TQ, "available", lambda t=None: True)
    monkeypatch.setattr(TQ, "_LAUNCH", {})
    monkeypatch.setattr(TQ, "_BEST", {})
    monkeypatch.delenv("FP4REF_QUANT_LEGACY", raising=False)
    return k2, kmx


def _x(rows=16, cols=64):
    return torch.randn(rows, cols, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)


AMAX = torch.full((), 2.5, dtype=torch.float32)
CALLS = {"te_nvfp4": dict(amax=AMAX), "ue5m3": dict(amax=AMAX), "ocp_mx_floor": {}}


def _ops(profile, x):
    fp4ref.quantize_recipe(x, profile, backend="triton", **CALLS[profile])   # warm the caches
    with _Ops() as rec:
        fp4ref.quantize_recipe(x, profile, backend="triton", **CALLS[profile])
    return rec.ops


def test_public_calls_allocate_outputs_and_view_only(kernels):
    """Host work per call, as torch ops: the outputs' allocations and one dtype view each of
    x and q, nothing else (each op costs microseconds of host time on CUDA).  NVFP4 / UE5M3
    with amax given make one more allocation than MXFP4 (the kernel's par), nothing more."""
    x = _x()
    ops = {p: _ops(p, x) for p in CALLS}
    for p, o in ops.items():
        assert set(o) <= {"empty", "view", "detach"}, (p, o)
        assert o.count("view") == 2, (p, o)
    assert ops["te_nvfp4"].count("empty") == ops["ue5m3"].count("empty") == 3
    assert ops["ocp_mx_floor"].count("empty") == 2
    assert len(ops["te_nvfp4"]) == len(ops["ocp_mx_floor"]) + 1


def test_cached_launch_equals_first(kernels):
    """The second launch (cached grid and keywords) is the first one's, per key; another
    target (c = fl(6T)) or scale format gets its own keywords."""
    k2, kmx = kernels
    x = _x()
    for _ in range(2):
        fp4ref.quantize_recipe(x, "te_nvfp4", amax=AMAX, backend="triton")
        fp4ref.quantize_recipe(x, "ue5m3", amax=AMAX, backend="triton", target=2048)
        fp4ref.quantize_recipe(x, "ocp_mx_floor", backend="triton")
    (g0, kw0, _), (g1, kw1, _), (g2, kw2, _), (g3, kw3, _) = k2.calls
    assert (g0, kw0) == (g2, kw2) and (g1, kw1) == (g3, kw3)
    assert (kw0["C"], kw0["SBIAS"], kw0["ZERO_TO_ONE"]) == (448.0 * 6, 7, False)
    assert (kw1["C"], kw1["SBIAS"], kw1["ZERO_TO_ONE"]) == (2048.0 * 6, 15, True)
    assert kw0["FUSED"] and not kw0["CANON"] and g0 == (1,)
    assert kmx.calls[0][:2] == kmx.calls[1][:2]
    # the kernel gets x and q as int32 / int64 views of the same memory, amax as given
    args = k2.calls[0][2]
    assert args[0].dtype == torch.int32 and args[0].data_ptr() == x.data_ptr()
    assert args[1].dtype == torch.int64 and args[4] is AMAX and args[5] == x.numel() // 16


def test_internal_entry_launches_unfused(kernels):
    k2, _ = kernels
    par = torch.zeros(2)
    for _ in range(2):
        q, s = TQ.two_level_1x16(_x(), par, "ue5m3", True)
    assert k2.calls[0][:2] == k2.calls[1][:2] and not k2.calls[0][1]["FUSED"]
    assert k2.calls[0][2][3] is par and tuple(q.shape) == (16, 32) and tuple(s.shape) == (16, 4)
    with pytest.raises(ValueError, match="scale_fmt: unknown value 'ue9m9'.*ue4m3, ue5m3"):
        TQ.two_level_1x16(_x(), par, "ue9m9")


@pytest.mark.parametrize("call,exc,match", [
    (dict(backend="gpu"), ValueError, "backend: unknown value 'gpu'"),
    (dict(x=torch.zeros(16, 64, dtype=torch.float64)), TypeError, "x: dtype"),
    (dict(x=torch.zeros(2, 16, 64, dtype=torch.bfloat16)), ValueError, "x: expected a 2D"),
    (dict(target=True), ValueError, "T: True"),
    (dict(target=0), ValueError, "T: 0"),
    (dict(mode="nope"), ValueError, "mode"),
    (dict(copy="diagonal"), ValueError, "copy: unknown value 'diagonal'"),
    (dict(tile=(3, 3)), ValueError, "tile: unknown value"),
    (dict(amax="big"), TypeError, "amax: 'big' is not a number"),
    (dict(rbits=torch.zeros(16, 64, dtype=torch.int64), nbits=8), ValueError, "rbits"),
    (dict(profile="te_nvfp4_nope"), ValueError, "profile: unknown value"),
])
def test_bad_arguments_still_named_after_cached_calls(kernels, call, exc, match):
    """The cached checks never swallow an error: a bad argument after good calls with the
    same other arguments gets the full path's message (parameter, value, choices)."""
    kw = dict(x=_x(), profile="te_nvfp4", amax=AMAX, backend="triton")
    fp4ref.quantize_recipe(**kw)
    kw.update(call)
    with pytest.raises(exc, match=match):
        fp4ref.quantize_recipe(kw.pop("x"), kw.pop("profile"), **kw)
    kw = dict(x=_x(), profile="ocp_mx_floor", backend="triton")   # MX: the same checks
    fp4ref.quantize_recipe(**kw)
    if "mode" in call or "copy" in call or "backend" in call:
        kw.update(call)
        with pytest.raises(exc, match=match):
            fp4ref.quantize_recipe(kw.pop("x"), kw.pop("profile"), **kw)


def test_target_types_and_values_get_their_own_plans(kernels):
    """target 448 (int) and 448.0 give the same c; 2048 another; a tensor target is never
    cached (it could change in place) and still works."""
    k2, _ = kernels
    x = _x()
    for t in (448, 448.0, 2048, torch.tensor(1024.0)):
        fp4ref.quantize_recipe(x, "ue5m3", amax=AMAX, target=t, backend="triton")
    assert [c[1]["C"] for c in k2.calls] == [2688.0, 2688.0, 12288.0, 6144.0]


def test_fused_tensor_lazy_scale_and_meta():
    """_fused's tensor_scale ((1, 1) view of par[1]) and meta (amax = par[3], s_enc = par[2])
    appear on first access, bit for bit; dataclass machinery sees them."""
    p = torch.tensor([[0x21, 0xF3]], dtype=torch.uint8)
    sc = torch.tensor([[0x38]], dtype=torch.uint8)
    par = torch.tensor([1.5, -0.0, float("nan"), 3.0])
    t = BlockScaledTensor._fused((1, 4), p, sc, "ue4m3", (1, 16), "te_nvfp4", par)
    assert t.packed() is p and "tensor_scale" not in vars(t)
    assert tuple(t.tensor_scale.shape) == (1, 1)
    assert t.tensor_scale.view(torch.int32).item() == -2 ** 31           # -0 by its bits
    assert t.tensor_scale.data_ptr() == par.data_ptr() + 4                 # a view of par
    assert torch.isnan(t.meta["s_enc"]) and t.meta["amax"].item() == 3.0
    ref = BlockScaledTensor.from_packed((1, 4), p, "float4_e2m1fn", sc, "ue4m3", (1, 16),
                                        par[1:2].view(1, 1), None, "te_nvfp4")
    assert t.same_bits(ref) and t.codes.tolist() == [[1, 2, 3, 15]]
    u = BlockScaledTensor._fused((1, 4), p, sc, "ue4m3", (1, 16), "te_nvfp4", par.clone())
    assert dataclasses.replace(u).meta.keys() == {"amax", "s_enc"}
    m = BlockScaledTensor._fused((1, 4), p, sc, "float8_e8m0fnu", (1, 32), "ocp_mx_floor")
    assert m.tensor_scale is None and m.meta == {} and m.elem_fmt == "float4_e2m1fn"
    with pytest.raises(AttributeError, match="nope"):
        m.nope
