"""`fp4ref verify-exhaustive`: all 2**32 float32 inputs, fast path vs a table rounder.

The check is independent of both the fast path and the reference rounding:
it looks up |x| in the format's sorted finite values (torch.searchsorted over
exact float64 values, one grid step above max appended, and e8m0's grid
continued below its min), picks a neighbour by the mode, and applies the
format's verify policy.  Chunked; on CUDA when available; every fast backend
available on the device (torch, and Triton on CUDA) is checked.
"""
from __future__ import annotations

import argparse
import sys
import time

import torch

from reference.errors import check_choice
from reference.formats import FormatSpec, small_formats
from reference.rounding import (InfPolicy, Mode, NanPolicy, Negative, NoZero, Overflow, Policy,
                                Subnormal, default_policy, parse_mode)

from ..cast import quantize
from .io import write_json_atomic
from .launch import close_group, gather, init_group, launch_env, shard, share_code

__all__ = ["main", "verify_policy", "table_quantize", "merge_results", "run_slice"]

_TOTAL = 1 << 32


def verify_policy(fmt: FormatSpec) -> Policy:
    """The format's default policy; NaN -> +0 where the default would raise."""
    p = default_policy(fmt)
    if p.nan is NanPolicy.RAISE:
        p = Policy(p.overflow, p.inf, NanPolicy.TO_ZERO, p.subnormal, p.no_zero, p.negative)
    return p


class _Table:
    def __init__(self, fmt: FormatSpec, device):
        vals = [(c, v) for c, v in fmt.finite_values]
        q = fmt.quantum(fmt.emax)
        vals.append((fmt.max_code_magnitude + 1, fmt.max_finite + q))  # first value past max
        if not fmt.subnormals:  # e8m0: continue the grid down past float32's range
            lo = [(k + fmt.bias, 2.0 ** k) for k in range(-151, fmt.emin)]
            vals = [(c, v) for c, v in lo] + vals
        self.vals = torch.tensor([float(v) for _, v in vals], dtype=torch.float64, device=device)
        self.codes = torch.tensor([c for c, _ in vals], dtype=torch.int64, device=device)
        self.top = float(vals[-1][1])


def table_quantize(x: torch.Tensor, fmt: FormatSpec, mode: Mode, policy: Policy,
                   table: _Table | None = None) -> torch.Tensor:
    """Independent rounding of float32 ``x`` (codes as int64)."""
    ok = (policy.overflow in (Overflow.SATFINITE, Overflow.IEEE)
          and policy.nan in (NanPolicy.CANONICAL, NanPolicy.TO_ZERO)
          and policy.subnormal is Subnormal.KEEP
          and (policy.no_zero is NoZero.NAN or fmt.has_zero)
          and (policy.negative is Negative.NAN or fmt.signed) and mode is not Mode.SR)
    if not ok:
        raise ValueError(f"table_quantize: policy {policy} / mode {mode.name} is outside what "
                         "the independent table rounder implements")
    t = table or _Table(fmt, x.device)
    bits = x.view(torch.int32)
    neg = bits < 0
    a = x.to(torch.float64).abs()
    nan = torch.isnan(x)
    inf = torch.isinf(x)
    zero = a == 0
    beyond = a >= t.top
    j = torch.clamp(torch.searchsorted(t.vals, torch.nan_to_num(a, 0.0, 0.0, 0.0), right=True) - 1,
                    0, len(t.vals) - 2)
    lo, hi = t.vals[j], t.vals[j + 1]
    clo, chi = t.codes[j], t.codes[j + 1]
    mid = (lo + hi) / 2          # exact: one bit more than the format's values
    exact = a == lo
    pos = ~neg | (not fmt.signed)
    if mode is Mode.RNE:
        c = torch.where(a < mid, clo, torch.where(a > mid, chi, torch.where(clo % 2 == 0, clo, chi)))
    elif mode is Mode.RNA:
        c = torch.where(a < mid, clo, chi)
    elif mode is Mode.RTZ:
        c = clo
    elif mode is Mode.RUP:
        c = torch.where(exact | ~pos, clo, chi)
    elif mode is Mode.RDN:
        c = torch.where(exact | pos, clo, chi)
    else:  # RTO
        c = torch.where(exact | (clo % 2 == 1), clo, chi)
    maxc = fmt.max_code_magnitude
    sm = fmt.sign_mask if fmt.signed else 0
    sgn = torch.where(neg & (sm != 0), sm, 0)
    nan_c = fmt.nan_code if fmt.has_nan else 0
    # overflow: rounds past max, or |x| at/after the first value past max
    over = (c > maxc) | beyond
    if policy.overflow is Overflow.SATFINITE:
        ovf = maxc | sgn
    else:
        to_inf = {Mode.RNE: True, Mode.RNA: True, Mode.RTZ: False, Mode.RTO: False}.get(mode)
        to_inf = (pos if mode is Mode.RUP else ~pos) if to_inf is None else torch.full_like(neg, to_inf)
        big = (fmt.inf_code | sgn) if fmt.has_inf else torch.full_like(sgn, nan_c)
        ovf = torch.where(to_inf, big, maxc | sgn)
    out = torch.where(over, ovf, c | sgn)
    if not fmt.has_zero:
        out = torch.where(c < 0, nan_c, out)       # NoZero.NAN: below min -> NaN
        out = torch.where(zero, nan_c, out)
    else:
        out = torch.where(zero, sgn, out)
    if policy.inf is InfPolicy.SATURATE:
        out = torch.where(inf, maxc | sgn, out)
    else:
        out = torch.where(inf, (fmt.inf_code | sgn) if fmt.has_inf else torch.full_like(sgn, nan_c), out)
    if not fmt.signed:
        out = torch.where(neg & ~zero & ~nan, nan_c, out)  # Negative.NAN
    out = torch.where(nan, nan_c if policy.nan is NanPolicy.CANONICAL else 0, out)
    return out


def _pol_str(p: Policy) -> str:
    return " ".join(f"{k}={v.value}" for k, v in p.__dict__.items())


def _fields(fmt: FormatSpec, code: int) -> str:
    try:
        s, e, m = fmt.fields(code)
        return f"0x{code:02x} (s={s} e={e} m={m}) = {fmt.decode(code)}"
    except ValueError:
        return f"0x{code:x} (invalid)"


def _describe_input(b: int) -> str:
    b &= 0xFFFFFFFF
    x = torch.tensor([b - (1 << 32) if b >= 1 << 31 else b], dtype=torch.int32).view(torch.float32)
    return f"0x{b:08x} (s={b >> 31} e={(b >> 23) & 0xFF} m=0x{b & 0x7FFFFF:06x}) = {x.item()!r}"


def _patterns(start: int, n: int, stride: int, device) -> torch.Tensor:
    i = torch.arange(start, start + n, dtype=torch.int64, device=device)
    if stride > 1:  # --limit: spread over all patterns, odd offsets within each stride
        i = i * stride + (i * 2654435761) % stride
    i = torch.where(i >= (1 << 31), i - (1 << 32), i)
    return i.to(torch.int32)


def merge_results(parts: list, max_report: int = 10) -> dict:
    """Per-rank {fmt: {mode: {backend: record}}} summed into one (inputs, mismatches; the
    slowest rank's seconds; the first ``max_report`` examples in rank order)."""
    out: dict = {}
    for part in parts:
        for fmt, modes in part.items():
            for mode, bes in modes.items():
                for be, r in bes.items():
                    m = out.setdefault(fmt, {}).setdefault(mode, {}).setdefault(
                        be, {"inputs": 0, "mismatches": 0, "seconds": 0.0, "examples": []})
                    m["inputs"] += r["inputs"]
                    m["mismatches"] += r["mismatches"]
                    m["seconds"] = max(m["seconds"], r["seconds"])
                    m["examples"] = (m["examples"] + r["examples"])[:max_report]
    return out


def _parse(argv):
    ap = argparse.ArgumentParser(prog="fp4ref verify-exhaustive", description=__doc__.split("\n")[0])
    ap.add_argument("--formats", default=",".join(f.name for f in small_formats()),
                    help="comma-separated formats of <= 8 bits (default: all)")
    ap.add_argument("--modes", default="rne,rtz", help="comma-separated modes (default: rne,rtz)")
    ap.add_argument("--limit", type=int, default=None,
                    help="check this many inputs spread over all 2**32 (quick smoke run; default: all)")
    ap.add_argument("--chunk", type=int, default=0, help="inputs per chunk (default 2**26 CUDA, 2**22 CPU)")
    ap.add_argument("--device", default="auto", help="auto, cpu or cuda")
    ap.add_argument("--backend", default="all", help="all (every one available), torch or triton")
    ap.add_argument("--extra", default="", help="comma-separated extra float32 bit patterns (hex)")
    ap.add_argument("--max-report", type=int, default=10, help="mismatches printed per format/mode")
    ap.add_argument("--out", default="", help="write the summary JSON here (atomically)")
    return ap.parse_args(argv)


def _setup(args) -> dict:
    """Validated options (ValueError names the bad option, its value and the valid choices)."""
    if args.limit is not None and args.limit <= 0:
        raise ValueError(f"--limit: must be a positive number of inputs, got {args.limit} "
                         "(omit --limit to check all 2**32 inputs)")
    small = {f.name: f for f in small_formats()}
    fmts = [small[check_choice("formats", f.strip(), small)] for f in args.formats.split(",") if f.strip()]
    modes = [parse_mode(m.strip()) for m in args.modes.split(",") if m.strip()]
    if Mode.SR in modes:
        raise ValueError("modes: SR needs random bits; valid choices: "
                         + ", ".join(m.name for m in Mode if m is not Mode.SR))
    dev = check_choice("device", args.device, ("auto", "cpu", "cuda"))
    if dev == "auto":
        dev = "cuda" if torch.cuda.is_available() else "cpu"
    from .. import cast_triton
    avail = ["torch"] + (["triton"] if dev == "cuda" and cast_triton.available() else [])
    backend = check_choice("backend", args.backend, ("all", "torch", "triton"))
    backends = avail if backend == "all" else [check_choice("backend", backend, avail)]
    extra = [int(s, 16) for s in args.extra.split(",") if s.strip()]
    total = min(args.limit, _TOTAL) if args.limit else _TOTAL
    return {"fmts": fmts, "modes": modes, "dev": dev, "device": torch.device(dev), "backends": backends,
            "extra": extra, "total": total, "stride": _TOTAL // total,
            "chunk": args.chunk or (1 << 26 if dev == "cuda" else 1 << 22)}


def _check(cfg, fmt, mode, be, table, pol, lo, hi, extra, max_report) -> dict:
    """Inputs [lo, hi) of the pattern sequence (plus ``extra`` patterns) for one format, mode
    and backend: counts and the first mismatches."""
    device, chunk, stride = cfg["device"], cfg["chunk"], cfg["stride"]
    cnt, bad, ex, t0 = 0, 0, [], time.time()
    for k, s in enumerate(range(lo, hi, chunk)):
        b = _patterns(s, min(chunk, hi - s), stride, device)
        if k == 0 and extra:
            b = torch.cat([torch.tensor([e - (1 << 32) if e >= 1 << 31 else e for e in extra],
                                        dtype=torch.int32, device=device), b])
        x = b.view(torch.float32)
        got = quantize(x, fmt, mode, pol, backend=be).to(torch.int64)
        exp = table_quantize(x, fmt, mode, pol, table)
        mism = got != exp
        cnt += x.numel()
        nb = int(mism.sum())
        if nb:
            bad += nb
            idx = torch.nonzero(mism).flatten()[: max(0, max_report - len(ex))]
            for i in idx.tolist():
                e = {"input": _describe_input(int(b[i])), "expected": _fields(fmt, int(exp[i])),
                     "got": _fields(fmt, int(got[i]))}
                ex.append(e)
                print(f"  MISMATCH {fmt.name} {mode.name} [{be}] x={e['input']}: "
                      f"expected {e['expected']}, got {e['got']}")
    if cfg["dev"] == "cuda":
        torch.cuda.synchronize()
    return {"inputs": cnt, "mismatches": bad, "seconds": round(time.time() - t0, 3), "examples": ex}


def run_slice(cfg: dict, lo: int, hi: int, extra=(), max_report: int = 10, quiet: bool = False) -> dict:
    """{fmt: {mode: {backend: record}}} over inputs [lo, hi) of every format and mode."""
    results = {}
    for fmt in cfg["fmts"]:
        pol = verify_policy(fmt)
        table = _Table(fmt, cfg["device"])
        res = results[fmt.name] = {}
        t_fmt = time.time()
        for mode in cfg["modes"]:
            res[mode.name] = {}
            for be in cfg["backends"]:
                r = res[mode.name][be] = _check(cfg, fmt, mode, be, table, pol, lo, hi, extra, max_report)
                if not quiet:
                    print(f"{fmt.name:<16} {mode.name:<4} [{be:<6}] {r['inputs']} inputs, "
                          f"{r['mismatches']} mismatches, {r['seconds']:.2f} s")
        if not quiet:
            print(f"{fmt.name:<16} total {time.time() - t_fmt:.2f} s  (policy {_pol_str(pol)})")
    return results


def main(argv: list[str] | None = None) -> int:
    try:
        args = _parse(list(sys.argv[1:] if argv is None else argv))
    except SystemExit as e:  # argparse: usage errors
        return int(e.code or 0)
    try:
        cfg = _setup(args)
        env = launch_env()
    except ValueError as e:
        print(f"fp4ref verify-exhaustive: {e}", file=sys.stderr)
        return 2
    grouped = init_group(env)
    try:
        return _run(args, cfg, env, grouped)
    finally:
        close_group(grouped)


def _run(args, cfg: dict, env: dict, grouped: bool) -> int:
    total, rank, world = cfg["total"], env["rank"], env["world_size"]
    lo, hi = shard(total, rank, world)
    fmts, modes, t_all = cfg["fmts"], cfg["modes"], time.time()
    spread = " (all)" if total == _TOTAL else f" (stride {cfg['stride']})"
    print(f"verify-exhaustive: {total} float32 inputs per format/mode{spread}, device {cfg['dev']}, "
          f"backends {','.join(cfg['backends'])}, modes {','.join(m.name for m in modes)}"
          + (f"; rank {rank} of {world}: inputs [{lo}, {hi})" if world > 1 else ""))
    extra = cfg["extra"] if rank == 0 else []  # checked once, by rank 0
    parts = gather(run_slice(cfg, lo, hi, extra, args.max_report, quiet=world > 1), env, grouped)
    code = 0
    if rank == 0:
        results = merge_results(parts, args.max_report)
        n_bad = sum(r["mismatches"] for m in results.values() for bes in m.values() for r in bes.values())
        summary = {"ok": n_bad == 0, "mismatches": n_bad, "inputs_per_format_mode": total + len(cfg["extra"]),
                   "exhaustive": total == _TOTAL, "device": cfg["dev"], "backends": cfg["backends"],
                   "modes": [m.name for m in modes], "seconds": round(time.time() - t_all, 3), "ranks": world,
                   "policies": {f.name: _pol_str(verify_policy(f)) for f in fmts}, "results": results}
        if args.out:
            write_json_atomic(args.out, summary)
        print(f"verify-exhaustive: {'OK' if n_bad == 0 else 'FAILED'}: {n_bad} mismatches, "
              f"{time.time() - t_all:.1f} s" + (f" on {world} ranks" if world > 1 else ""))
        code = 0 if n_bad == 0 else 1
    return share_code(code, grouped)  # every rank exits with the merged result's code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
