"""fp4ref.cast (fast path) == reference, bit for bit."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest
import torch
from hypothesis import given, strategies as st

from fp4ref.cast import (as_torch_dtype, dequantize, pack_fp4, quantize, round_to, unpack_fp4)
from fp4ref.strategies import float32_tensors, interesting_float32
from reference.formats import CodeClass, get_format, small_formats
from reference.profiles import CAST_PROFILES
from reference.rounding import (DETERMINISTIC_MODES, Mode, NanPolicy, Policy, default_policy,
                                encode)
from tests.cast_helpers import (RAISES, all_16bit_f32, all_policies, as_u, classes_16bit,
                                ofat_policies, ref_codes, ref_codes_each)
from tests.cast_helpers import torch_single_thread  # noqa: F401  (autouse fixture)

SMALL = [f.name for f in small_formats()]
# Long sweeps: marked slow, and run only when asked for (-m slow, or FP4REF_SLOW=1),
# since the default `pytest tests` does not deselect the marker.
slow = [pytest.mark.slow, pytest.mark.skipif(
    "'slow' not in config.getoption('markexpr') and os.environ.get('FP4REF_SLOW') != '1'",
    reason="slow sweep: run with -m slow or FP4REF_SLOW=1")]


def _slow(f):
    for m in reversed(slow):
        f = m(f)
    return f
WIDE = ["bfloat16", "float16", "tf32", "float32"]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _check_sweep(x, fmt, mode, pol):
    exp = ref_codes(x, fmt, mode, pol, cls=classes_16bit(fmt) if x is all_16bit_f32() else None)
    ok = exp != RAISES
    if not ok.all():  # a RAISE policy: the fast path raises when such an input is present
        with pytest.raises(ValueError):
            quantize(x, fmt, mode, pol)
    xs = x[torch.from_numpy(ok)]
    got = as_u(quantize(xs, fmt, mode, pol))
    bad = np.nonzero(got != exp[ok])[0]
    assert bad.size == 0, (fmt, mode, pol, [(float(xs[i]), hex(int(got[i])), hex(int(exp[ok][i])))
                                            for i in bad[:5]])


# --- every bf16 and fp16 bit pattern, every mode, every policy field value ----
@pytest.mark.parametrize("mode", DETERMINISTIC_MODES, ids=lambda m: m.name)
@pytest.mark.parametrize("fmt", SMALL)
def test_all_16bit_patterns_every_policy_value(fmt, mode):
    x = all_16bit_f32()
    for pol in ofat_policies(fmt):
        _check_sweep(x, fmt, mode, pol)


@pytest.mark.parametrize("fmt", SMALL)
def test_all_16bit_patterns_profiles(fmt):
    x = all_16bit_f32()
    for p in CAST_PROFILES.values():
        if p.fmt == fmt:
            for mode in DETERMINISTIC_MODES:
                _check_sweep(x, fmt, mode, p.policy)


@_slow
@pytest.mark.parametrize("mode", DETERMINISTIC_MODES, ids=lambda m: m.name)
@pytest.mark.parametrize("fmt", SMALL)
def test_all_16bit_patterns_policy_cross_product(fmt, mode):
    x = all_16bit_f32()
    for pol in all_policies(fmt):
        _check_sweep(x, fmt, mode, pol)


def test_16bit_inputs_in_their_own_dtype():
    # bf16 / fp16 tensors are accepted directly and equal their float32 widening
    x = all_16bit_f32()
    for src in (torch.bfloat16, torch.float16):
        xs = x.to(src)
        for fmt in ("float4_e2m1fn", "float8_e4m3fn", "float8_e8m0fnu", "bfloat16", "float16"):
            pol = None if get_format(fmt).has_nan else {"nan": "to_zero"}
            assert torch.equal(quantize(xs, fmt, "rne", pol), quantize(xs.float(), fmt, "rne", pol))


# --- wide targets and float64 inputs ------------------------------------------
def _rand_f32(n, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-2**31, 2**31 - 1, (n,), dtype=torch.int32, generator=g).view(torch.float32)


def _rand_f64(n, seed):
    g = np.random.default_rng(seed)
    bits = g.integers(-2**63, 2**63 - 1, size=n, dtype=np.int64)
    return torch.from_numpy(bits.view(np.float64).copy())


@pytest.mark.parametrize("mode", DETERMINISTIC_MODES, ids=lambda m: m.name)
@pytest.mark.parametrize("fmt", WIDE)
def test_wide_targets_from_float32(fmt, mode):
    x = torch.cat([_rand_f32(1500, 1), all_16bit_f32()[::97]])
    exp = ref_codes_each(x.tolist(), fmt, mode, None)
    got = as_u(quantize(x, fmt, mode))
    assert np.array_equal(got, exp)


def _near_grid_f64(fmt, n, seed):
    """float64 values just off the format's ties and grid points (the double-rounding traps)."""
    fmt = get_format(fmt)
    rng = np.random.default_rng(seed)
    lo = fmt.emin - (fmt.man_bits if fmt.subnormals else 3)
    e = rng.integers(lo, min(fmt.emax + 2, 1023), size=n)
    k = rng.integers(1 << fmt.man_bits, 2 << fmt.man_bits, size=n).astype(np.float64)
    half = rng.integers(0, 2, size=n) * 0.5
    base = np.ldexp(k + half, (e - fmt.man_bits).astype(np.int64))
    nudge = rng.integers(-3, 4, size=n)
    v = base
    for s in (1, -1):  # move by |nudge| float64 ulps
        for _ in range(3):
            m = (nudge * s) > 0
            v = np.where(m, np.nextafter(v, s * np.inf), v)
            nudge = np.where(m, nudge - s, nudge)
    v = np.where(rng.integers(0, 2, size=n) == 1, -v, v)
    return torch.from_numpy(v)


@pytest.mark.parametrize("mode", DETERMINISTIC_MODES, ids=lambda m: m.name)
@pytest.mark.parametrize("fmt", SMALL + WIDE)
def test_float64_inputs_round_directly(fmt, mode):
    x = torch.cat([_near_grid_f64(fmt, 600, 7), _rand_f64(300, 8)])
    pol = None if get_format(fmt).has_nan else Policy.make(
        overflow="satfinite", inf="saturate", nan="to_zero")
    exp = ref_codes_each(x.tolist(), fmt, mode, pol)
    got = as_u(quantize(x, fmt, mode, pol))
    assert np.array_equal(got, exp)


def test_float64_is_not_rounded_through_float32():
    # 1.125 + 2**-40: a float32 step would make it the tie 1.125 and give 1.0 (RNE)
    x = torch.tensor([1.125 + 2**-40, 464 + 2**-30, 2.0**-1074, -(2.0**-1074)], dtype=torch.float64)
    got = quantize(x, "float8_e5m2", "rne").tolist()
    assert got[0] == 0x3D and got[2] == 0x00 and got[3] == 0x80
    assert quantize(x[1:2], "float8_e4m3fn", "rne", {"overflow": "nan"}).item() == 0x7F
    y = round_to(x, "bfloat16", "rne")
    assert y.dtype == torch.float64


def test_float32_target_is_identity_on_float32():
    x = torch.cat([_rand_f32(20000, 3), all_16bit_f32()])
    got = quantize(x, "float32", "rne", {"overflow": "ieee", "inf": "propagate", "nan": "preserve_sign"})
    xb = x.view(torch.int32)
    nan = torch.isnan(x)
    assert torch.equal(got[~nan], xb[~nan])
    assert torch.equal(got[nan] < 0, xb[nan] < 0)


def test_fp16_bf16_rne_match_numpy_and_ml_dtypes():
    x = torch.cat([_rand_f32(200000, 4), all_16bit_f32()])
    xn = x.numpy()
    with np.errstate(all="ignore"):
        h = xn.astype(np.float16).view(np.uint16).astype(np.int64)
        b = xn.astype(ml_dtypes.bfloat16).view(np.uint16).astype(np.int64)
    fin = np.isfinite(xn)  # NaN payloads differ; NaN classes checked elsewhere
    assert np.array_equal(as_u(quantize(x, "float16", "rne"))[fin], h[fin])
    assert np.array_equal(as_u(quantize(x, "bfloat16", "rne"))[fin], b[fin])


# --- stochastic rounding ----------------------------------------------------------
def _sr_inputs(fmt, count=32):
    """Dense subset: values between grid points across the range, both signs."""
    fmt = get_format(fmt)
    vals = [v for _, v in fmt.finite_values if v > 0]
    rng = np.random.default_rng(5)
    idx = np.linspace(0, len(vals) - 2, count // 2).astype(int)
    out = []
    for i in idx:
        lo, hi = vals[i], vals[i + 1]
        t = Fraction(int(rng.integers(1, 255)), 256)
        out.append(float(lo + (hi - lo) * t))
    top = fmt.max_finite + fmt.quantum(fmt.emax) * Fraction(3, 4)   # saturating SR above max
    out += [float(top), float(fmt.min_normal / 3)]
    out += [-v for v in out]
    return torch.tensor(out, dtype=torch.float32)


@pytest.mark.parametrize("fmt", SMALL)
def test_sr_all_rbits_matches_reference(fmt):
    xs = _sr_inputs(fmt)
    pol = None if get_format(fmt).has_nan else Policy.make(nan="to_zero")
    for nbits in range(1, 9):
        R = 1 << nbits
        x = xs.repeat_interleave(R)
        r = torch.arange(R, dtype=torch.int64).repeat(len(xs))
        got = as_u(quantize(x, fmt, "sr", pol, rbits=r, nbits=nbits))
        exp = [encode(v, fmt, Mode.SR, pol, rbits=rb, nbits=nbits).code
               for v, rb in zip(x.tolist(), r.tolist())]
        assert np.array_equal(got, np.array(exp)), (fmt, nbits)


@pytest.mark.parametrize("fmt", SMALL + WIDE)
def test_sr_wide_rbits_matches_reference(fmt):
    x = torch.cat([_rand_f32(300, 11), all_16bit_f32()[::331]])
    g = torch.Generator().manual_seed(12)
    pol = None if get_format(fmt).has_nan else {"nan": "to_zero"}
    P = None if pol is None else Policy.make(**pol)
    for nbits in (13, 32, 62):
        r = torch.randint(0, 2**62, x.shape, generator=g) >> (62 - nbits)
        got = as_u(quantize(x, fmt, "sr", pol, rbits=r, nbits=nbits))
        exp = [encode(v, fmt, Mode.SR, P, rbits=rb, nbits=nbits).code
               for v, rb in zip(x.tolist(), r.tolist())]
        assert np.array_equal(got, np.array(exp)), (fmt, nbits)


@pytest.mark.parametrize("fmt", ["float8_e4m3fn", "bfloat16", "float32"])
def test_sr_float64_and_rbits_dtypes(fmt):
    x = _near_grid_f64(fmt, 300, 3)
    g = torch.Generator().manual_seed(4)
    r8 = torch.randint(0, 256, x.shape, dtype=torch.int64, generator=g).to(torch.uint8)
    for r, nb in ((r8, 8), (r8.to(torch.int16), 8), (r8.to(torch.int32), 8),
                  (torch.randint(0, 2**40, x.shape, generator=g), 40)):
        got = as_u(quantize(x, fmt, "sr", rbits=r, nbits=nb))
        exp = [encode(v, fmt, Mode.SR, rbits=rb, nbits=nb).code
               for v, rb in zip(x.tolist(), r.tolist())]
        assert np.array_equal(got, np.array(exp))


# --- hypothesis: fast == reference on delicate float32 inputs -------------------
@pytest.mark.parametrize("fmt", SMALL + WIDE)
@given(data=st.data())
def test_hypothesis_fast_equals_reference(fmt, data):
    x = data.draw(float32_tensors(fmt, max_size=16))
    spec = get_format(fmt)
    pol = default_policy(spec) if spec.has_nan else Policy.make(
        overflow="satfinite", inf="saturate", nan="to_zero_flip_sign")
    xs = x.tolist()
    for mode in DETERMINISTIC_MODES:
        got = as_u(quantize(x, fmt, mode, pol))
        assert got.tolist() == [encode(v, fmt, mode, pol).code for v in xs], mode
    nbits = data.draw(st.integers(1, 24))
    r = data.draw(st.lists(st.integers(0, (1 << nbits) - 1), min_size=len(x), max_size=len(x)))
    got = as_u(quantize(x, fmt, "sr", pol, rbits=torch.tensor(r, dtype=torch.int64), nbits=nbits))
    assert got.tolist() == [encode(v, fmt, Mode.SR, pol, rbits=rb, nbits=nbits).code
                            for v, rb in zip(xs, r)]


@given(v=interesting_float32("float8_e4m3fn"))
def test_round_to_is_dequantize_of_quantize(v):
    x = torch.tensor([v], dtype=torch.float32)
    q = quantize(x, "float8_e4m3fn", "rne")
    y = round_to(x, "float8_e4m3fn", "rne")
    assert y.dtype == torch.float32
    assert y.view(torch.int32).equal(dequantize(q, "float8_e4m3fn").view(torch.int32))


# --- codes decode and re-encode to themselves --------------------------------------
@pytest.mark.parametrize("fmt", SMALL)
def test_every_code_reencodes_to_itself(fmt):
    spec = get_format(fmt)
    codes = torch.arange(spec.ncodes, dtype=torch.int64).to(torch.uint8)
    vals = dequantize(codes, spec)
    isnan = torch.isnan(vals)
    pol = default_policy(spec)
    if spec.has_nan:  # keep infinities and NaN signs
        pol = Policy.make(overflow="ieee" if spec.has_inf else "satfinite", inf="propagate",
                          nan="preserve_sign")
    for mode in DETERMINISTIC_MODES:
        back = quantize(vals, spec, mode, pol)
        assert torch.equal(back[~isnan], codes[~isnan])
        # NaN codes come back as the canonical NaN with their sign
        for c, b in zip(codes[isnan].tolist(), back[isnan].tolist()):
            assert spec.classify(b) is CodeClass.NAN and b == (c & spec.sign_mask) | spec.nan_code
        for c in range(spec.ncodes):  # and the reference agrees code by code
            if spec.classify(c) is not CodeClass.NAN:
                assert encode(spec.decode(c), spec, mode, pol).code == c


# --- dequantize --------------------------------------------------------------------
@pytest.mark.parametrize("fmt", SMALL + ["bfloat16", "float16"])
def test_dequantize_every_code_equals_reference_decode(fmt):
    spec = get_format(fmt)
    dt = torch.uint8 if spec.nbits <= 8 else torch.int32
    codes = torch.arange(spec.ncodes, dtype=torch.int64).to(dt)
    got = dequantize(codes, spec)
    assert got.dtype == torch.float32
    for c, v in zip(range(spec.ncodes), got.tolist()):
        d = spec.decode(c)
        if d.is_nan:
            assert math.isnan(v) and (math.copysign(1, v) < 0) == d.negative
        else:
            assert Fraction(v) == d.to_fraction() if d.is_finite else v == float(d)
            assert math.copysign(1, v) == (-1 if d.negative else 1)


def test_dequantize_tf32_float32_samples():
    g = torch.Generator().manual_seed(9)
    c19 = torch.randint(0, 1 << 19, (3000,), generator=g, dtype=torch.int32)
    v = dequantize(c19, "tf32")
    spec = get_format("tf32")
    for c, x in zip(c19.tolist()[:600], v.tolist()[:600]):
        d = spec.decode(c)
        assert (math.isnan(x) and d.is_nan) or x == float(d)
    c32 = _rand_f32(1000, 2).view(torch.int32)
    assert torch.equal(dequantize(c32, "float32").view(torch.int32), c32)


# --- packed fp4 and torch dtype views ------------------------------------------------
def test_pack_unpack_round_trip_and_low_nibble_first():
    g = torch.Generator().manual_seed(1)
    codes = torch.randint(0, 16, (4, 6, 32), generator=g, dtype=torch.int64).to(torch.uint8)
    p = pack_fp4(codes)
    assert p.shape == (4, 6, 16) and p.dtype == torch.uint8
    assert torch.equal(unpack_fp4(p), codes)
    assert torch.equal(p & 0xF, codes[..., 0::2]) and torch.equal(p >> 4, codes[..., 1::2])
    assert pack_fp4(torch.tensor([0x1, 0x2], dtype=torch.uint8)).item() == 0x21
    assert torch.equal(unpack_fp4(as_torch_dtype(p, "float4_e2m1fn")), codes)


def test_pack_matches_torchao_and_float4_x2_semantics():
    kern = pytest.importorskip("torchao.prototype.mx_formats.kernels")
    g = torch.Generator().manual_seed(2)
    x = (torch.randn(8, 64, generator=g) * 3).float()
    # torchao's own e2m1 cast + packing (first element in the low nibble)
    ref_codes_u = kern.f32_to_f4_unpacked(x)
    ours = quantize(x, "float4_e2m1fn", "rne")
    assert torch.equal(ours, ref_codes_u)
    packed = pack_fp4(ours)
    assert torch.equal(packed, kern.pack_uint4(ref_codes_u))
    assert torch.equal(unpack_fp4(packed), kern.unpack_uint4(packed))
    v = as_torch_dtype(packed, "float4_e2m1fn")
    assert v.dtype == torch.float4_e2m1fn_x2 and v.data_ptr() == packed.data_ptr()
    assert torch.equal(kern.f4_unpacked_to_f32(unpack_fp4(v.view(torch.uint8))),
                       dequantize(ours, "float4_e2m1fn"))


@pytest.mark.parametrize("fmt", ["float8_e4m3fn", "float8_e5m2", "float8_e8m0fnu"])
def test_as_torch_dtype_is_a_zero_copy_view_torch_decodes(fmt):
    codes = torch.arange(256, dtype=torch.int64).to(torch.uint8)
    v = as_torch_dtype(codes, fmt)
    assert v.dtype == getattr(torch, fmt) and v.data_ptr() == codes.data_ptr()
    a, b = v.float(), dequantize(codes, fmt)
    nan = torch.isnan(b)
    assert torch.equal(torch.isnan(a), nan)
    assert torch.equal(a[~nan].view(torch.int32), b[~nan].view(torch.int32))


# --- verify-exhaustive (smoke) and bench ---------------------------------------------------
def test_verify_smoke_cpu(tmp_path, capsys):
    from fp4ref.harness import verify
    out = tmp_path / "v.json"
    rc = verify.main(["--limit", str(1 << 16), "--formats", "float4_e2m1fn,float8_e8m0fnu,ue5m3",
                      "--modes", "rne,rna,rtz,rup,rdn,rto", "--device", "cpu", "--out", str(out)])
    assert rc == 0
    rep = json.loads(out.read_text())
    assert rep["ok"] and rep["mismatches"] == 0
    assert set(rep["results"]) == {"float4_e2m1fn", "float8_e8m0fnu", "ue5m3"}
    assert "float4_e2m1fn" in capsys.readouterr().out
    assert verify.main(["--formats", "float8_e4m3", "--limit", "16"]) == 2
    assert verify.main(["--modes", "sr", "--limit", "16"]) == 2


def test_verify_reports_a_broken_fast_path(monkeypatch, capsys):
    from fp4ref.harness import verify
    real = verify.quantize

    def broken(x, fmt, mode, policy=None, **kw):
        q = real(x, fmt, mode, policy, **kw)
        return q ^ (x.view(torch.int32) == 0x3F400000).to(q.dtype)   # flip 0.75's code
    monkeypatch.setattr(verify, "quantize", broken)
    rc = verify.main(["--limit", str(1 << 16), "--formats", "float4_e2m1fn", "--modes", "rne",
                      "--device", "cpu", "--extra", "0x3F400000"])
    assert rc == 1
    assert "0x3f400000" in capsys.readouterr().out.lower()


def test_bench_rows_cpu():
    from fp4ref.harness import bench_cast
    rows = bench_cast.run("cpu", n=1 << 14, ref_n=64)
    names = {r["name"] for r in rows}
    assert any("e2m1" in n for n in names) and any("e4m3" in n for n in names)
    for r in rows:
        assert r["device"] == "cpu" and r["elements_per_s"] > 0 and r["baseline"] == "reference"
        assert r["ratio"] > 0


# --- GPU: Triton kernel == torch path ------------------------------------------------------
def _gpu_inputs():
    x = torch.cat([all_16bit_f32(), _rand_f32(1 << 20, 21)]).cuda()
    return x


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", SMALL)
def test_gpu_triton_equals_torch_path(fmt):
    pytest.importorskip("triton")
    from fp4ref import cast_triton
    assert cast_triton.available()
    spec = get_format(fmt)
    x = _gpu_inputs()
    pols = ofat_policies(spec) + [p.policy for p in CAST_PROFILES.values() if p.fmt == fmt]
    g = torch.Generator(device="cuda").manual_seed(0)
    for pol in pols:
        if pol.nan is NanPolicy.RAISE or pol.negative.name == "RAISE" and not spec.signed:
            continue
        for mode in Mode:
            kw = {}
            if mode is Mode.SR:
                kw = dict(rbits=torch.randint(0, 1 << 20, x.shape, device="cuda", generator=g),
                          nbits=20)
            a = quantize(x, spec, mode, pol, backend="torch", **kw)
            b = quantize(x, spec, mode, pol, backend="triton", **kw)
            assert torch.equal(a, b), (fmt, mode, pol, int((a != b).sum()))
            if mode is Mode.RNE:  # bf16 / fp16 inputs are widened inside the kernel
                for src in (torch.bfloat16, torch.float16):
                    xs = x[:1 << 17].to(src)
                    assert torch.equal(quantize(xs, spec, mode, pol, backend="triton"),
                                       quantize(xs, spec, mode, pol, backend="torch"))
            if pol == pols[0]:  # and the torch path agrees across devices
                c = quantize(x.cpu(), spec, mode, pol, backend="torch",
                             **{k: (v.cpu() if torch.is_tensor(v) else v) for k, v in kw.items()})
                assert torch.equal(a.cpu(), c)


@pytest.mark.gpu
def test_gpu_triton_raise_policies_and_dequantize():
    pytest.importorskip("triton")
    x = torch.tensor([1.0, float("nan")], device="cuda")
    with pytest.raises(ValueError):
        quantize(x, "float4_e2m1fn", "rne", backend="triton")
    with pytest.raises(ValueError):
        quantize(torch.tensor([-1.0], device="cuda"), "ue4m3", "rne",
                 {"negative": "raise"}, backend="triton")
    for fmt in SMALL:
        c = torch.arange(get_format(fmt).ncodes, device="cuda").to(torch.uint8)
        a, b = dequantize(c, fmt), dequantize(c.cpu(), fmt)
        assert torch.equal(a.cpu().view(torch.int32), b.view(torch.int32))


@_slow
def test_triton_interpreter_equals_torch_path():
    """Kernel logic under TRITON_INTERPRET=1 on CPU (numerics still need the GPU test)."""
    pytest.importorskip("triton")
    code = r"""
import torch
from fp4ref import cast, cast_triton
from reference.formats import small_formats
from reference.rounding import Mode, default_policy, Policy
pats = torch.arange(65536, dtype=torch.int32)
xs = [pats.to(torch.int16).view(torch.bfloat16), pats.to(torch.int16).view(torch.float16)]
g = torch.Generator().manual_seed(0)
for fmt in small_formats():
    pol = default_policy(fmt) if fmt.has_nan else Policy.make(overflow='satfinite', inf='saturate', nan='to_zero')
    for mode in Mode:
        for x in xs:
            r = torch.randint(0, 256, x.shape, generator=g) if mode is Mode.SR else None
            nb = 8 if r is not None else None
            plan = cast._plan(fmt, mode, pol)
            assert torch.equal(cast._quantize_torch(x, plan, r, nb), cast_triton.quantize_triton(x, plan, r, nb)), (fmt, mode)
print("ok")
"""
    env = dict(os.environ, TRITON_INTERPRET="1")
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       cwd=ROOT, timeout=900)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr[-3000:]

