"""Scale lifecycles (SPEC 3.3, 3.6): state objects, literals, torch twins, TE reference."""
import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

from reference.recipes import f32 as F
from reference.recipes.scaling import (CalibratedFrozen, CurrentScaling, SampleAndHold,
                                       TEDelayedScaling, te_current_scale)
from fp4ref.quant import scaling as TS


def _v(e):
    return float(e)


def test_sample_and_hold_sequence_and_state_dict():
    s = SampleAndHold(3)
    seq = [1.0, 5.0, 7.0, 2.0, 9.0, 9.5, 0.5]
    got = [_v(s.observe("fc1.x", a)) for a in seq]
    assert got == [1.0, 1.0, 1.0, 2.0, 2.0, 2.0, 0.5]   # refreshed on calls 1, 4, 7
    assert _v(s.observe("fc1.w", 3.0)) == 3.0           # separate cache per role
    sd = s.state_dict()
    assert sd == {"kind": "sample_and_hold", "delay": 3}  # caches deliberately not saved
    s2 = SampleAndHold(50)
    s2.load_state_dict(sd)
    assert s2.delay == 3 and s2.cached("fc1.x") is None
    c = CurrentScaling()
    assert [_v(c.observe("r", a)) for a in seq] == seq


@pytest.mark.parametrize("D", [0, -1, 1.5, "2", True])
def test_bad_delay(D):
    with pytest.raises(ValueError, match="D"):
        SampleAndHold(D)


def test_calibrated_frozen():
    c = CalibratedFrozen(3)
    assert [_v(c.observe("a", v)) for v in (2.0, 8.0, 4.0)] == [2.0, 8.0, 4.0]
    assert c.frozen("a")
    assert [_v(c.observe("a", v)) for v in (100.0, 0.0)] == [8.0, 8.0]
    with pytest.raises(ValueError, match="N"):
        CalibratedFrozen(0)
    with pytest.raises(ValueError, match="amax"):
        c.observe("b", -1.0)


def test_te_delayed_scaling_literals():
    d = TEDelayedScaling("float8_e4m3fn", history_len=3, margin=1)
    d.record("x", 2.0)
    assert _v(d.update("x")) == 448 / 2 / 2          # (fp8_max / amax) / 2**margin
    assert [_v(v) for v in d.history("x")] == [0.0, 0.0, 2.0]  # rolled, slot 0 reset
    d.record("x", 1.0)
    assert _v(d.update("x")) == 448 / 2 / 2          # max over history is still 2
    d.record("x", 0.5)
    d.update("x")
    d.record("x", 0.25)
    assert _v(d.update("x")) == 448 / 1 / 2          # 2.0 fell out of the 3-slot window
    e = TEDelayedScaling(history_len=1)
    e.record("y", 0.0)
    assert _v(e.update("y")) == 1.0                  # amax 0 keeps the previous scale
    e.record("y", float("inf"))
    assert _v(e.update("y")) == 1.0
    e.record("y", 1e-45)
    assert e.update("y") == F.FLT_MAX                # infinite scale -> FLT_MAX
    with pytest.raises(ValueError, match="algo"):
        TEDelayedScaling(algo="mean")
    with pytest.raises(ValueError, match="margin"):
        TEDelayedScaling(margin=-1)


def test_te_current_scale_literals():
    assert _v(te_current_scale(2.0)) == 224.0
    assert _v(te_current_scale(3.0)) == float(torch.tensor(448.0) / torch.tensor(3.0))
    for a in (0.0, float("inf"), float("nan")):
        assert _v(te_current_scale(a)) == 1.0
    assert _v(te_current_scale(3.0, pow2=True)) == 128.0
    assert _v(te_current_scale(2.0, "float8_e5m2")) == 28672.0
    # TE's Python reference: NaN amax -> NaN; pow2 of a NaN amax -> 0.5; inf amax pow2 -> 0
    assert te_current_scale(float("nan"), variant="ref").is_nan
    assert _v(te_current_scale(float("nan"), pow2=True, variant="ref")) == 0.5
    assert _v(te_current_scale(float("inf"), pow2=True, variant="ref")) == 0.0


@settings(max_examples=30)
@given(st.lists(st.one_of(st.floats(width=32, allow_nan=True), st.just(0.0),
                          st.just(1e-45)), min_size=1, max_size=8),
       st.sampled_from(["float8_e4m3fn", "float8_e5m2"]), st.booleans(),
       st.sampled_from(["kernel", "ref"]))
def test_torch_twin_equals_reference(vals, fmt, pow2, variant):
    a = torch.tensor(vals, dtype=torch.float32).abs()
    t = TS.te_current_scale(a, fmt, pow2=pow2, variant=variant)
    for i, v in enumerate(a.tolist()):
        e = te_current_scale(a[i:i + 1], fmt, pow2=pow2, variant=variant)
        if e.is_nan:
            assert math.isnan(t[i].item())
        else:
            assert t[i].view(torch.int32).item() & 0xFFFFFFFF == F.bits(e)


def test_delayed_torch_twin():
    prev = torch.tensor([3.0, 3.0, 3.0, 3.0])
    amax = torch.tensor([2.0, 0.0, float("inf"), 1e-45])
    out = TS.te_delayed_scale(amax, prev, margin=0)
    assert out.tolist() == [224.0, 3.0, 3.0, F.F32.max_finite and float(F.F32.max_finite)]
