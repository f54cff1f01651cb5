"""fp4ref.native: the schedule table (keys, lookup, JSON round trip) and emulate_native's
errors and lookups.  The probing side (explain finds the entries) is tests/test_explain.py."""
from __future__ import annotations

import json

import pytest
import torch

import fp4ref
from fp4ref.native import (ScheduleTable, ShapeSchedule, alpha_factors, emulate_native, env_slug,
                           environment_key, register_shape_prober, shape_prober)
from reference.gemm import dot
from reference.notation import parse_short

BF16 = parse_short("F=16 align=25:RTZ:esum acc=23:RTZ G=- out=float32:RNE")


def _entry(shape=(3, 4, 64), model=BF16, device="dev-a", env=None, matches=12, **kw):
    return ShapeSchedule(device, shape, model, ("k1", "k2"), "fam", "probe", 12, matches, 0.1,
                         None, env or {"device": device, "torch": "x"}, **kw)


def test_public_names():
    assert fp4ref.emulate_native is emulate_native and fp4ref.ScheduleTable is ScheduleTable


def test_environment_key_fields_and_slug():
    k = environment_key("cpu-torch-fp32")
    assert set(k) == {"device", "torch", "cuda", "cublas", "driver", "gpu", "sm_count", "workspace",
                      "blas_backend"}
    assert k["device"] == "cpu-torch-fp32" and k["torch"] == torch.__version__
    s = env_slug(k)
    assert s.startswith("cpu-torch-fp32-") and s == env_slug(dict(k)) and "/" not in env_slug({"device": "a/b"})


def test_table_round_trip(tmp_path):
    t = ScheduleTable([_entry(), _entry((5, 5, 32), BF16.replace(split_k=2)),
                       _entry(device="dev-b", env={"device": "dev-b", "torch": "y"})])
    p = t.save(tmp_path / "s" / "t.json")
    back = ScheduleTable.load(p)
    assert back.to_dict() == t.to_dict() and len(back) == 3
    e = back.lookup("dev-a", (5, 5, 32))
    assert e.model == BF16.replace(split_k=2) and e.kernels == ("k1", "k2") and e.exact
    assert back.lookup({"device": "dev-a", "torch": "x"}, (3, 4, 64)).model == BF16
    assert back.lookup({"device": "dev-a", "torch": "other"}, (3, 4, 64)) is None
    assert back.shapes("dev-a") == [(3, 4, 64), (5, 5, 32)]
    assert json.loads(p.read_text())["environments"][0]["shapes"][0]["short"]
    assert ScheduleTable.load(tmp_path / "missing.json").to_dict()["environments"] == []


def test_table_errors(tmp_path):
    t = ScheduleTable([_entry(), _entry(env={"device": "dev-a", "torch": "z"}, model=BF16.replace(split_k=2))])
    with pytest.raises(ValueError, match="different models"):
        t.lookup("dev-a", (3, 4, 64))
    with pytest.raises(ValueError, match="shape"):
        t.lookup("dev-a", (3, 4))
    with pytest.raises(TypeError, match="entry"):
        t.add({"device": "x"})
    (tmp_path / "bad.json").write_text('{"schema": "nope"}')
    with pytest.raises(ValueError, match="schema"):
        ScheduleTable.load(tmp_path / "bad.json")
    with pytest.raises(ValueError, match="source"):
        _entry().replace(source="guess")


def test_emulate_native_from_table_equals_reference():
    t = ScheduleTable([_entry((2, 3, 64), BF16.replace(split_k=2))])
    g = torch.Generator().manual_seed(0)
    a = torch.randn(2, 64, generator=g).bfloat16().float()
    b = torch.randn(64, 3, generator=g).bfloat16().float()
    out = emulate_native("dev-a", a, b, table=t)
    m = BF16.replace(split_k=2)
    for i in range(2):
        for j in range(3):
            want = float(dot(m, [float(x) for x in a[i]], [float(x) for x in b[:, j]]))
            assert out[i, j].item() == want


def test_emulate_native_errors():
    t = ScheduleTable([_entry(), _entry((1, 1, 16), matches=3)])
    with pytest.raises(ValueError, match=r"unknown for dev-a in this table \(2 known"):
        emulate_native("dev-a", torch.ones(2, 8), torch.ones(8, 2), table=t)
    with pytest.raises(ValueError, match="not bit-exact"):
        emulate_native("dev-a", torch.ones(1, 16), torch.ones(16, 1), table=t)
    with pytest.raises(ValueError, match=r"a, b: need \[M, K\]"):
        emulate_native("dev-a", torch.ones(2, 8), torch.ones(7, 2), table=t)
    with pytest.raises(TypeError, match="device"):
        emulate_native(3, torch.ones(2, 8), torch.ones(8, 2), table=t)


def test_prober_registration_restores():
    old = shape_prober()
    seen = []

    class Dev:
        name = "dev-p"

    def prober(dev, shape, *, table):
        seen.append(shape)
        return _entry(shape, device=dev.name, env={"device": dev.name})
    try:
        register_shape_prober(prober)
        t = ScheduleTable()
        emulate_native(Dev(), torch.ones(3, 64), torch.ones(64, 4), table=t)
        assert seen == [(3, 4, 64)] and t.lookup("dev-p", (3, 4, 64)) is not None
        with pytest.raises(TypeError, match="prober"):
            register_shape_prober(5)
    finally:
        register_shape_prober(old)


def test_alpha_factors():
    assert alpha_factors(None) is None
    sa, sb = alpha_factors((torch.ones(3), torch.ones(4)))
    assert sa.shape == (3, 1) and sb.shape == (1, 4)
    assert alpha_factors((2.0, 0.5)) == [2.0, 0.5]
