"""Split-K slice combination as a halving tree (``GemmModel.split_reduce`` TREE; cuBLAS's fp32
gemv reduces its 32 lane partials by an xor-shuffle butterfly, lane 0's result).

The oracle here is independent of reference.gemm / reference.schedule: Fractions, its own
round-to-FP32-RNE, its own slice bounds and its own tree.  Every walker (the exact
reference, the numpy simulator, the torch emulator with and without its fast paths) must
give its bit patterns."""
from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
import torch

from fp4ref.gemm import emulate
from probes.sim import Operands, bits_to_float, simulate, simulate_gemm
from reference.gemm import PRESETS, GemmModel, SplitReduce, dot
from reference.notation import from_dict, parse_short, sentence, short, to_dict

BASE = "F=1 align=exact acc=23:RNE G=- split={}:tree out=float32:RNE"


# --- the oracle -------------------------------------------------------------------------------
def _floor_log2(x: Fraction) -> int:
    e = x.numerator.bit_length() - x.denominator.bit_length()
    if Fraction(2) ** e > x:
        e -= 1
    return e


def _rne32(x: Fraction) -> Fraction:
    """x (nonzero) rounded to float32, ties to even; subnormals kept; no overflow here."""
    a = abs(x)
    q = Fraction(2) ** (max(_floor_log2(a), -126) - 23)
    n = a / q
    fl = n.numerator // n.denominator
    r = n - fl
    if r > Fraction(1, 2) or (r == Fraction(1, 2) and fl % 2 == 1):
        fl += 1
    out = fl * q
    assert out < Fraction(2) ** 128, "operands must not overflow FP32"
    return out if x > 0 else -out


def _add(x, y):
    """(value, negative-zero flag) + (value, flag), rounded once to FP32 RNE; an exact zero
    sum is -0 only when both terms are -0."""
    s = x[0] + y[0]
    if s == 0:
        return (Fraction(0), x[0] == 0 and y[0] == 0 and x[1] and y[1])
    return (_rne32(s), False)


def _bounds(K: int, S: int, T: int | None):
    L = K // S if T is None else -(-(-(-K // S)) // T) * T
    return [(lo, min(K, lo + L)) for lo in range(0, K, L)]


def oracle(a, b, S: int, T: int | None = None) -> np.float32:
    """dot(a, b) under BASE: per slice an FP32 FMA chain from +0, then the halving tree."""
    parts = []
    for lo, hi in _bounds(len(a), S, T):
        acc = (Fraction(0), False)
        for k in range(lo, hi):
            p = Fraction(float(a[k])) * Fraction(float(b[k]))
            acc = _add(acc, (p, p == 0 and bool(np.signbit(a[k]) != np.signbit(b[k]))))
        parts.append(acc)
    n = len(parts)
    while n > 1:
        h = (n + 1) // 2
        for i in range(n - h):
            parts[i] = _add(parts[i], parts[i + h])
        n = h
    v, negz = parts[0]
    return np.float32(-0.0) if v == 0 and negz else np.float32(float(v))


# --- operands ---------------------------------------------------------------------------------
def _operands(rng, M: int, K: int, N: int):
    """Random normal FP32 values over a wide exponent range, exact zeros, exact cancellations
    inside and across slices."""
    A = (rng.standard_normal((M, K)) * np.exp2(rng.integers(-12, 12, (M, K)))).astype(np.float32)
    B = rng.standard_normal((K, N)).astype(np.float32)
    A[rng.random((M, K)) < 0.08] = 0.0
    B[rng.random((K, N)) < 0.05] = -0.0
    for i in range(M):  # cancellations: a[k'] = -a[k], b[k'] = b[k] (exact pairs)
        ks = rng.choice(K, size=(K // 4, 2), replace=False)
        A[i, ks[:, 1]] = -A[i, ks[:, 0]]
        if i == 0:
            B[ks[:, 1], :] = B[ks[:, 0], :]
    return A, B


def _u32(x) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(x, np.float32)).view(np.uint32)


def _walkers(m: GemmModel, A, B) -> dict:
    M, N = A.shape[0], B.shape[1]
    out = {"dot": np.array([[np.float32(float(dot(m, A[i].tolist(), B[:, j].tolist())))
                             for j in range(N)] for i in range(M)], np.float32),
           "simulate_gemm": bits_to_float(simulate_gemm(m, A, B), m.output).astype(np.float32)}
    ta, tb = torch.from_numpy(A), torch.from_numpy(B)
    for p in ("auto", "generic", "fast_torch"):
        out[f"emulate[{p}]"] = emulate(m, ta, tb, _paths=p).numpy()
    ops = [Operands(A[i].astype(np.float64), B[:, j].astype(np.float64)) for i in range(M) for j in range(N)]
    out["simulate"] = bits_to_float(simulate([m] * len(ops), ops), m.output).astype(np.float32).reshape(M, N)
    return out


CASES = [(2, None, 48), (3, None, 48), (5, None, 60), (8, None, 64), (32, None, 128),
         (3, 4, 20), (5, 8, 70), (32, 4, 120), (32, 8, 256)]


@pytest.mark.parametrize("S,T,K", CASES)
def test_tree_matches_independent_oracle(S, T, K):
    rng = np.random.default_rng(1000 * S + K)
    m = parse_short(BASE.format(f"{S}" + ("" if T is None else f"/T{T}")))
    assert m.split_reduce is SplitReduce.TREE and m.split_tile == T
    A, B = _operands(rng, 3, K, 4)
    want = np.array([[oracle(A[i], B[:, j], S, T) for j in range(4)] for i in range(3)], np.float32)
    for name, got in _walkers(m, A, B).items():
        bad = int((_u32(got) != _u32(want)).sum())
        assert bad == 0, f"{name}: {bad} of {want.size} outputs differ from the oracle (S={S}, T={T}, K={K})"


def _crafted():
    """Slice results [1, 2^-30, -1, 0] (K=4, split=4): in order 1 + 2^-30 rounds to 1, then 0;
    the tree adds 1 + -1 = 0 and 2^-30 + 0 first, then 2^-30."""
    A = np.array([[1.0, 2.0 ** -30, -1.0, 0.0]], np.float32)
    B = np.ones((4, 1), np.float32)
    return A, B


def test_tree_differs_from_serial():
    A, B = _crafted()
    tree = parse_short(BASE.format(4))
    serial = tree.replace(split_reduce=SplitReduce.SERIAL)
    assert short(serial) == "F=1 align=exact acc=23:RNE G=- split=4 out=float32:RNE"
    for name, got in _walkers(tree, A, B).items():
        assert _u32(got)[0, 0] == _u32(np.float32(2.0 ** -30)), name
    for name, got in _walkers(serial, A, B).items():
        assert _u32(got)[0, 0] == _u32(np.float32(0.0)), name
    # three slices [1, -1, 2^-30]: in order (1 - 1) + 2^-30; the tree (1 + 2^-30) - 1 = 0
    A3 = np.array([[1.0, -1.0, 2.0 ** -30]], np.float32)
    for name, got in _walkers(parse_short(BASE.format(3)), A3, B[:3]).items():
        assert _u32(got)[0, 0] == 0, name
    for name, got in _walkers(parse_short(BASE.format(3)).replace(split_reduce="serial"), A3, B[:3]).items():
        assert _u32(got)[0, 0] == _u32(np.float32(2.0 ** -30)), name


def test_tree_mixed_batch_and_other_families():
    """Serial and tree rows in one simulate call; an aligned, grouped model (emulate's fast
    path with groups and the aligned recurrence) against the exact reference."""
    rng = np.random.default_rng(7)
    A, B = _operands(rng, 2, 96, 3)
    models = [parse_short(BASE.format(6)), parse_short(BASE.format(6)).replace(split_reduce="SERIAL"),
              parse_short("F=4 align=26:RTZ acc=23:RNE G=8:RTZ split=6:tree out=float32:RNE"),
              parse_short("F=1 align=exact acc=13:RTZ G=- split=12:tree out=bfloat16:RNE")]
    ops = [Operands(A[i].astype(np.float64), B[:, j].astype(np.float64)) for i in range(2) for j in range(3)]
    rows = [(m, op) for m in models for op in ops]
    got = simulate([m for m, _ in rows], [op for _, op in rows])
    for (m, op), key in zip(rows, got):
        ref = dot(m, op.a.tolist(), op.b.tolist())
        want = _u32(np.float32(float(ref)))
        assert _u32(bits_to_float(np.array([key]), m.output).astype(np.float32))[0] == want, short(m)
    for m in models[2:]:
        w = _walkers(m, A, B)
        for name, x in w.items():
            assert (_u32(x) == _u32(w["dot"])).all(), (short(m), name)


def test_tree_leading_zero_slices_and_uneven_steps():
    """Leading +0 products spanning whole slices (the simulator skips them: those slices are
    +0 in the tree), and a plan whose steps differ in width (the simulator's per-layout walk)."""
    rng = np.random.default_rng(11)
    A, B = _operands(rng, 2, 64, 3)
    A[:, :20] = 0.0
    B[:20, :] = np.abs(B[:20, :])
    want = np.array([[oracle(A[i], B[:, j], 8) for j in range(3)] for i in range(2)], np.float32)
    for name, got in _walkers(parse_short(BASE.format(8)), A, B).items():
        assert (_u32(got) == _u32(want)).all(), name
    A, B = _operands(rng, 2, 88, 3)
    m = parse_short("F=16 align=26:RNE acc=23:RTZ G=- split=3/T4:tree out=float32:RNE")
    assert not m.plan(88).uniform and len(m.plan(88).slices) == 3
    w = _walkers(m, A, B)
    for name, x in w.items():
        assert (_u32(x) == _u32(w["dot"])).all(), name
    assert not (_u32(w["dot"]) == _u32(_walkers(m.replace(split_reduce="serial"), A, B)["dot"])).all()


def test_notation_round_trip():
    s = "F=1 align=exact acc=23:RNE G=- split=32/T4:tree out=float32:RNE"
    m = parse_short(s)
    assert (m.split_k, m.split_tile, m.split_reduce) == (32, 4, SplitReduce.TREE)
    assert short(m) == s and parse_short(short(m)) == m
    s1 = "F=1 align=exact acc=23:RNE G=- split=1:tree out=float32:RNE"
    m1 = parse_short(s1)
    assert m1.split_k == 1 and m1.split_reduce is SplitReduce.TREE and short(m1) == s1
    assert short(m1.replace(split_reduce=SplitReduce.SERIAL)) == "F=1 align=exact acc=23:RNE G=- out=float32:RNE"
    d = to_dict(m)
    assert d["split_reduce"] == "TREE" and from_dict(d) == m and GemmModel.from_dict(d) == m
    assert "tree" in sentence(m)
    named = parse_short("gemv " + s)
    assert short(named, name=True) == "gemv " + s and parse_short(short(named, name=True)) == named
    assert m.plan(128) != m.replace(split_reduce="serial").plan(128)
    assert m.plan(128).split_reduce is SplitReduce.TREE
    assert m.plan(128).layout != m.replace(split_reduce="serial").plan(128).layout


def test_default_keeps_existing_forms():
    strings = ["F=16 align=26:RTZ acc=23:RNE G=128:RNE out=bfloat16:RNE",
               "F=8 align=25:RTZ:esum acc=23:RTZ G=- out=float32:RNE",
               "F=1 align=exact acc=23:RNE G=- split=3/T128 out=float32:RNE",
               "F=1 align=exact acc=23:RNE G=- split=4 out=float32:RNE"]
    for s in strings:
        m = parse_short(s)
        assert m.split_reduce is SplitReduce.SERIAL and short(m) == s
        assert "split_reduce" not in to_dict(m)
    for m in PRESETS.values():
        assert m.split_reduce is SplitReduce.SERIAL
        assert "split_reduce" not in to_dict(m) and ":tree" not in short(m)
        assert parse_short(short(m, name=True)) == m and from_dict(to_dict(m)) == m
        assert "tree" not in sentence(m)


def test_validation():
    for bad in ("bogus", 3, None):
        with pytest.raises(ValueError) as e:
            GemmModel(split_k=4, split_reduce=bad)
        msg = str(e.value)
        assert "split_reduce" in msg and repr(bad) in msg and "SERIAL" in msg and "TREE" in msg, msg
    assert GemmModel(split_reduce="tree").split_reduce is SplitReduce.TREE
    assert GemmModel(split_reduce="SERIAL").split_reduce is SplitReduce.SERIAL
    with pytest.raises(ValueError, match="split_reduce"):
        from_dict({"split_k": 2, "split_reduce": "butterfly"})
    with pytest.raises(ValueError, match="split.*unknown part 'serial'"):
        parse_short("F=1 align=exact acc=23:RNE G=- split=4:serial out=float32:RNE")
    with pytest.raises(ValueError, match="split"):
        parse_short("F=1 align=exact acc=23:RNE G=- split=4:tree:x out=float32:RNE")
