"""Bit dumps of every emulator, simulator and fast path on fixed seeded inputs.

A refactor that claims "behaviour unchanged" is checked by running this before and after
it: every entry is the SHA-256 of the raw output bytes of one public call on inputs drawn
from a fixed seed, on the CPU and (where present) on CUDA.  Byte-identical dumps before and
after, not tolerances.

    python scripts/bit_dump.py --out before.json                # record
    python scripts/bit_dump.py --compare before.json            # exit 1 on any changed entry
    python scripts/bit_dump.py --only sim --compare before.json # one section while working
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from fractions import Fraction

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

SECTIONS = ("cast", "recipes", "emulate", "sim", "probe_matrix", "blockscaled", "scaled_mm", "mma")


def _digest(x) -> str:
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().contiguous()
        if x.dtype in (torch.float8_e4m3fn, torch.float8_e5m2) or "float4" in str(x.dtype) \
                or "e8m0" in str(x.dtype):
            x = x.view(torch.uint8)
        b = x.numpy().tobytes() if x.dtype != torch.bfloat16 else x.view(torch.int16).numpy().tobytes()
    elif isinstance(x, np.ndarray):
        b = np.ascontiguousarray(x).tobytes()
    else:
        b = repr(x).encode()
    return hashlib.sha256(b).hexdigest()[:24]


def _devices() -> list[str]:
    return ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def sec_cast(out: dict) -> None:
    from fp4ref import quantize, Mode
    from reference.formats import FORMATS
    g = _gen(1)
    x = torch.randn(4096, generator=g) * torch.exp2(torch.randint(-30, 30, (4096,), generator=g).float())
    x[:8] = torch.tensor([0.0, -0.0, float("inf"), float("-inf"), float("nan"), 1e-45, -3e38, 0.25])
    for dev in _devices():
        for name, spec in FORMATS.items():
            if spec.nbits > 16:
                continue
            for mode in (Mode.RNE, Mode.RTZ, Mode.RNA, Mode.RUP, Mode.RDN):
                xs = x if spec.has_inf or spec.has_nan else torch.nan_to_num(x, 0.0, 1e30, -1e30)
                try:
                    out[f"cast/{dev}/{name}/{mode.name}"] = _digest(quantize(xs.to(dev), name, mode))
                except (ValueError, NotImplementedError) as e:
                    out[f"cast/{dev}/{name}/{mode.name}"] = f"error: {type(e).__name__}"


def sec_recipes(out: dict) -> None:
    from fp4ref.quant import RECIPE_PROFILES, quantize
    g = _gen(2)
    x = (torch.randn(64, 256, generator=g) * torch.exp(2 * torch.randn(64, 256, generator=g)))
    x[0, :16] = 0.0
    for dev in _devices():
        for prof in RECIPE_PROFILES:
            try:
                q = quantize(x.to(dev), prof)
                out[f"recipes/{dev}/{prof}"] = _digest(q.codes) + ":" + _digest(q.scale_codes) + ":" + \
                    (_digest(q.tensor_scale) if q.tensor_scale is not None else "-")
            except (ValueError, NotImplementedError, TypeError) as e:
                out[f"recipes/{dev}/{prof}"] = f"error: {type(e).__name__}"


def _blocked_operands(seed: int, M: int, N: int, K: int, block: int, sfmt: str):
    rng = np.random.default_rng(seed)
    e2m1 = np.array([0, .5, 1, 1.5, 2, 3, 4, 6])
    a = rng.choice(e2m1, (M, K)) * rng.choice([-1, 1], (M, K))
    b = rng.choice(e2m1, (K, N)) * rng.choice([-1, 1], (K, N))
    lo, hi = (-8, 8) if sfmt in ("ue4m3", "float8_e4m3fn") else (-20, 20)
    sa = np.exp2(rng.integers(lo, hi, (M, K // block))).astype(np.float64)
    sb = np.exp2(rng.integers(lo, hi, (K // block, N))).astype(np.float64)
    if sfmt in ("ue4m3", "float8_e4m3fn"):
        sa *= rng.choice([1, 1.125, 1.25, 1.75], sa.shape)
        sb *= rng.choice([1, 1.5, 1.875], sb.shape)
    return a, b, sa, sb


def _dense_operands(seed: int, M: int, N: int, K: int, spread: int = 12):
    rng = np.random.default_rng(seed)
    a = (rng.standard_normal((M, K)) * np.exp2(rng.integers(-spread, spread + 1, (M, K)))).astype(np.float32)
    b = (rng.standard_normal((K, N)) * np.exp2(rng.integers(-spread, spread + 1, (K, N)))).astype(np.float32)
    return a.astype(np.float64), b.astype(np.float64)


def _models():
    """Every preset, plus models drawn from the family by the probe tests' generator."""
    from probes.testing import random_hidden
    from reference.gemm import PRESETS
    ms = [(n, m, None) for n, m in PRESETS.items()]
    for s in range(24):
        caps, m = random_hidden(1000 + s)
        ms.append((f"family{s}", m, caps))
    return ms


def _operands_for(name, m, caps, seed):
    """(a, b, scales_a, scales_b, block) matching the model's operands."""
    M, N = 6, 5
    K = 256
    if caps is not None and caps.block_scaled:
        a, b, sa, sb = _blocked_operands(seed, M, N, K, caps.block, caps.scale_format)
        return a, b, sa, sb, caps.block
    if name.startswith(("probe_matched", "blackwell")):
        sf = "float8_e8m0fnu" if name == "blackwell_mxf8f6f4" else "ue4m3"
        blk = 32 if name == "blackwell_mxf8f6f4" else 16
        a, b, sa, sb = _blocked_operands(seed, M, N, K, blk, sf)
        return a, b, sa, sb, blk
    if caps is not None:
        from probes.validate import random_operands
        rng = np.random.default_rng(seed)
        a, b, sa, sb = random_operands(caps, M, N, K, rng)
        return a, b, sa, sb, (caps.block if sa is not None else None)
    a, b = _dense_operands(seed, M, N, K)
    return a, b, None, None, None


def sec_emulate(out: dict) -> None:
    from fp4ref.gemm import emulate
    for i, (name, m, caps) in enumerate(_models()):
        a, b, sa, sb, blk = _operands_for(name, m, caps, 10 + i)
        for dev in _devices():
            t = lambda x: None if x is None else torch.tensor(x, dtype=torch.float32, device=dev)
            kw = dict(scales_a=t(sa), scales_b=t(sb), block=blk) if sa is not None else {}
            try:
                out[f"emulate/{dev}/{name}"] = _digest(emulate(m, t(a), t(b), **kw))
            except (ValueError, NotImplementedError) as e:
                out[f"emulate/{dev}/{name}"] = f"error: {type(e).__name__}: {e}"[:200]


def sec_sim(out: dict) -> None:
    from probes.sim import simulate_gemm
    for i, (name, m, caps) in enumerate(_models()):
        a, b, sa, sb, blk = _operands_for(name, m, caps, 10 + i)
        kw = dict(scales_a=sa, scales_b=sb, block=blk) if sa is not None else {}
        try:
            out[f"sim/{name}"] = _digest(simulate_gemm(m, a, b, **kw))
        except (ValueError, NotImplementedError) as e:
            out[f"sim/{name}"] = f"error: {type(e).__name__}: {e}"[:200]


def sec_probe_matrix(out: dict) -> None:
    """The probe simulator's key matrix: family candidates x crafted + random probes."""
    from probes.probes import ProbeContext, inner_pool, random_pool, width_pool
    from probes.sim import simulate_matrix
    from probes.testing import random_hidden
    for s in range(6):
        caps, _ = random_hidden(2000 + s)
        ctx = ProbeContext(caps, 256)
        probes = width_pool(ctx, 64)[:40] + inner_pool(ctx)[:40] + random_pool(ctx, 20, seed=s)
        ops = [p.ops for p in probes]
        models = [random_hidden(3000 + 10 * s + j)[1] for j in range(12)]
        try:
            out[f"probe_matrix/{s}"] = _digest(simulate_matrix(models, ops))
        except Exception as e:  # noqa: BLE001 (a dump records what the code does)
            out[f"probe_matrix/{s}"] = f"error: {type(e).__name__}: {e}"[:200]


def sec_blockscaled(out: dict) -> None:
    if not torch.cuda.is_available():
        return
    from fp4ref.gemm_triton import blockscaled_mm, quantize_operand
    g = _gen(5)
    for fmt in ("nvfp4", "mxfp4", "ue5m3"):
        for dist in ("gauss", "heavy"):
            xa = torch.randn(192, 512, generator=g)
            xb = torch.randn(160, 512, generator=g)
            if dist == "heavy":
                xa = xa * torch.exp(3 * torch.randn(192, 512, generator=g))
                xb = xb * torch.exp(3 * torch.randn(160, 512, generator=g))
            ca, sa, ta = quantize_operand(xa.cuda(), fmt)
            cb, sb, tb = quantize_operand(xb.cuda(), fmt)
            for model in ("probe_matched", "probe_matched_lattice"):
                for force in (None, "pair", "block", "fix"):
                    key = f"blockscaled/cuda/{fmt}/{dist}/{model}/{force}"
                    try:
                        out[key] = _digest(blockscaled_mm(ca, sa, cb, sb, fmt=fmt, model=model,
                                                          alpha=ta * tb, force=force))
                    except (ValueError, NotImplementedError) as e:
                        out[key] = f"error: {type(e).__name__}"


def sec_scaled_mm(out: dict) -> None:
    """Random codes and scale bytes (NaN scales included) in torch._scaled_mm's layout."""
    from fp4ref.quant import to_swizzled
    from fp4ref.scaled_gemm import MODELS, scaled_mm
    rng = np.random.default_rng(6)
    M, N, K = 128, 64, 256
    for recipe, sdt, blk in (("nvfp4", torch.float8_e4m3fn, 16), ("mxfp4", torch.float8_e8m0fnu, 32)):
        a = torch.tensor(rng.integers(0, 256, (M, K // 2)), dtype=torch.uint8)
        w = torch.tensor(rng.integers(0, 256, (N, K // 2)), dtype=torch.uint8)
        hi = 0x7F if recipe == "nvfp4" else 0xFF
        sa = torch.tensor(rng.integers(0, hi + 1, (M, K // blk)), dtype=torch.uint8)
        sb = torch.tensor(rng.integers(0, hi + 1, (N, K // blk)), dtype=torch.uint8)
        if recipe == "nvfp4":  # mostly finite scales near 1, a few NaN bytes
            sa = torch.tensor(rng.integers(0x28, 0x48, (M, K // blk)), dtype=torch.uint8)
            sb = torch.tensor(rng.integers(0x28, 0x48, (N, K // blk)), dtype=torch.uint8)
            sa[3, 1] = 0x7F
        SA, SB = to_swizzled(sa).view(sdt), to_swizzled(sb).view(sdt)
        A, W = a.view(torch.float4_e2m1fn_x2), w.view(torch.float4_e2m1fn_x2)
        for dev in _devices():
            for model in MODELS:
                for od in (torch.float32, torch.bfloat16):
                    key = f"scaled_mm/{dev}/{recipe}/{model}/{str(od)[6:]}"
                    try:
                        y = scaled_mm(A.to(dev), W.to(dev).t(), SA.to(dev), SB.to(dev), model=model,
                                      alpha=torch.tensor(0.375, device=dev), out_dtype=od)
                        out[key] = _digest(y)
                    except (ValueError, NotImplementedError, TypeError) as e:
                        out[key] = f"error: {type(e).__name__}: {e}"[:200]


def sec_mma(out: dict) -> None:
    from fp4ref.mma_tile import mma
    from reference.mma import resolve
    cases = [("mxf4nvf4", dict(scale_format="ue4m3", block=16)), ("mxf4nvf4", dict(scale_format="ue8m0", block=32)),
             ("mxf8f6f4", dict(a_format="e4m3", b_format="e5m2")), ("mxf8f6f4", dict(a_format="e2m1", b_format="e3m2")),
             ("f8f6f4", dict(a_format="e4m3", b_format="e4m3")), ("f16", dict(a_format="bf16", b_format="bf16")),
             ("tf32", {}), ("wgmma", dict(arch="hopper", a_format="e4m3", b_format="e4m3"))]
    for i, (kind, kw) in enumerate(cases):
        arch = kw.pop("arch", "blackwell")
        ins = resolve(kind, arch=arch, **kw)
        rng = np.random.default_rng(40 + i)
        M, N, K = 128, 8, ins.k
        from reference.formats import get_format
        na, nb = get_format(ins.a_format).ncodes, get_format(ins.b_format).ncodes
        dt = torch.uint8 if max(na, nb) <= 256 else torch.int32
        a = torch.tensor(rng.integers(0, na, (M, K)), dtype=dt)
        b = torch.tensor(rng.integers(0, nb, (K, N)), dtype=dt)
        c = torch.tensor(rng.integers(0, 1 << 32, (M, N), dtype=np.uint64).astype(np.uint32).view(np.float32))
        sk = {}
        if getattr(ins, "block", None):
            nbk = K // ins.block
            sk = dict(scale_a=torch.tensor(rng.integers(0, 256, (M, nbk)), dtype=torch.uint8),
                      scale_b=torch.tensor(rng.integers(0, 256, (nbk, N)), dtype=torch.uint8))
        for dev in _devices():
            key = f"mma/{dev}/{i}-{kind}"
            try:
                out[key] = _digest(mma(kind, a.to(dev), b.to(dev), c.to(dev), arch=arch, **sk, **kw))
            except (ValueError, NotImplementedError, TypeError) as e:
                out[key] = f"error: {type(e).__name__}: {e}"[:200]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="write the dump (JSON) here")
    ap.add_argument("--compare", help="compare with this dump; exit 1 on any difference")
    ap.add_argument("--only", action="append", choices=SECTIONS, help="run only these sections")
    args = ap.parse_args(argv)
    out: dict[str, str] = {}
    for sec in args.only or SECTIONS:
        t0 = time.time()
        globals()[f"sec_{sec}"](out)
        print(f"{sec}: {sum(k.startswith(sec + '/') for k in out)} entries, {time.time() - t0:.1f} s",
              file=sys.stderr)
    if args.out:
        tmp = args.out + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"torch": torch.__version__, "cuda": torch.cuda.is_available(), "dump": out}, f,
                      indent=1, sort_keys=True)
        os.replace(tmp, args.out)
    if args.compare:
        with open(args.compare) as f:
            ref = json.load(f)["dump"]
        keys = [k for k in out if k in ref]
        bad = [k for k in keys if ref[k] != out[k]]
        missing = [k for k in ref if k not in out and (not args.only or k.split("/")[0] in args.only)
                   and (torch.cuda.is_available() or "/cuda" not in k)]
        for k in bad:
            print(f"CHANGED {k}: {ref[k]} -> {out[k]}")
        for k in missing:
            print(f"MISSING {k}")
        print(f"{len(keys) - len(bad)} of {len(keys)} entries byte-identical; {len(bad)} changed, "
              f"{len(missing)} missing")
        return 1 if bad or missing else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
