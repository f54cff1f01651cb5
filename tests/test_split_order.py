"""Split-K slice results added in a measured order (``reference.schedule.SplitOrder``: a chain
of groups), and the crafted probe that reads the order from a device's outputs
(``probes.explain.crafted_combine_probe``).

Oracles: test_split_tree's Fraction walk (its own FP32 RNE add), here with its own reading of
the order text; the hidden order of virtual devices; and H200 outputs of cuBLAS fp32's
sm80_xmma 32x128x8 in-place split-K at 26x1402x11025 (tests/data/xmma_order_h200.npz:
crafted-probe outputs and native outputs on numpy-seeded random operands)."""
from __future__ import annotations

import re
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch

from fp4ref.gemm import emulate
from probes.backends.virtual import virtual_device
from probes.device import Capabilities
from probes.explain import crafted_combine_probe, explain_shape, order_from_distances, slice_ks
from reference.gemm import GemmModel, SplitReduce
from reference.notation import parse_short, sentence, short
from reference.schedule import SplitOrder
from tests.test_split_tree import _add, _operands, _u32, _walkers

BASE = "F=1 align=exact acc=23:RNE G=- split={} out=float32:RNE"
DATA = Path(__file__).parent / "data" / "xmma_order_h200.npz"
H200_ORDER = "order=0+24+47," + ",".join(f"{q}+{q + 24}" for q in range(1, 23)) + ",23"


def oracle(a, b, bounds, text: str) -> np.float32:
    """dot(a, b): per slice an FP32 FMA chain from +0, then the groups of ``text`` (read
    here: 'order=' then groups of slices joined by '+', separated by ','), each in order,
    then the group sums in order."""
    parts = []
    for lo, hi in bounds:
        acc = (Fraction(0), False)
        for k in range(lo, hi):
            p = Fraction(float(a[k])) * Fraction(float(b[k]))
            acc = _add(acc, (p, p == 0 and bool(np.signbit(a[k]) != np.signbit(b[k]))))
        parts.append(acc)
    total = None
    for grp in text[len("order="):].split(","):
        idx = [int(x) for x in grp.split("+")]
        g = parts[idx[0]]
        for i in idx[1:]:
            g = _add(g, parts[i])
        total = g if total is None else _add(total, g)
    v, negz = total
    return np.float32(-0.0) if v == 0 and negz else np.float32(float(v))


def random_order(rng, S: int) -> str:
    perm = [int(x) for x in rng.permutation(S)]
    cuts = sorted(int(x) for x in rng.choice(np.arange(1, S), size=int(rng.integers(1, S)), replace=False))
    groups = [perm[a:b] for a, b in zip([0] + cuts, cuts + [S])]
    return "order=" + ",".join("+".join(str(i) for i in g) for g in groups)


@pytest.mark.parametrize("seed", range(6))
def test_order_matches_independent_oracle(seed):
    rng = np.random.default_rng(seed)
    S, L = int(rng.integers(3, 9)), int(rng.integers(2, 9))
    K = S * L
    text = random_order(rng, S)
    m = parse_short(BASE.format(S) .replace(f"split={S}", f"split={S}:{text}"))
    assert isinstance(m.split_reduce, SplitOrder) and m.split_reduce.value == text
    A, B = _operands(rng, 2, K, 3)
    bounds = [(s * L, (s + 1) * L) for s in range(S)]
    want = np.array([[oracle(A[i], B[:, j], bounds, text) for j in range(3)] for i in range(2)], np.float32)
    for name, got in _walkers(m, A, B).items():
        bad = int((_u32(got) != _u32(want)).sum())
        assert bad == 0, f"{name}: {bad} of {want.size} outputs differ ({short(m)})"


def test_order_differs_from_serial_and_describes_itself():
    # slices [1, 2^-30, -1]: in order (1 + 2^-30) - 1 = 0; order 0+2,1: (1 - 1) + 2^-30
    A = np.array([[1.0, 2.0 ** -30, -1.0]], np.float32)
    B = np.ones((3, 1), np.float32)
    m = parse_short("F=1 align=exact acc=23:RNE G=- split=3:order=0+2,1 out=float32:RNE")
    for name, got in _walkers(m, A, B).items():
        assert _u32(got)[0, 0] == _u32(np.float32(2.0 ** -30)), name
    assert short(m) == "F=1 align=exact acc=23:RNE G=- split=3:order=0+2,1 out=float32:RNE"
    assert parse_short(short(m)) == m and GemmModel.from_dict(m.to_dict()) == m
    assert m.to_dict()["split_reduce"] == "order=0+2,1"
    assert "measured order" in sentence(m) and "0+2,1" in sentence(m)


def test_order_levels_land_in_slot_zero():
    """Every order's adds put the result in v[0] (adds commute bit for bit): the groups and
    the chain as the text says, whichever group holds slice 0."""
    rng = np.random.default_rng(3)
    for _ in range(50):
        S = int(rng.integers(2, 12))
        order = SplitOrder.parse(random_order(rng, S))
        tree = [str(i) for i in range(S)]
        for level in order.levels():
            assert len({x for pair in level for x in pair}) == 2 * len(level)  # independent adds
            for d, s in level:
                tree[d] = "{" + "+".join(sorted([tree[d], tree[s]])) + "}"
        want = None
        for g in order.groups:
            t = str(g[0])
            for i in g[1:]:
                t = "{" + "+".join(sorted([t, str(i)])) + "}"
            want = t if want is None else "{" + "+".join(sorted([want, t])) + "}"
        assert tree[0] == want, order.value


@pytest.mark.parametrize("text,err", [("order=0+1,1", "exactly once"), ("order=0+x", "joined by '+'"),
                                      ("order=0,1,2,3", "exactly split_k = 3")])
def test_bad_orders_name_the_problem(text, err):
    with pytest.raises(ValueError, match=re.escape(err)):
        parse_short(f"F=1 align=exact acc=23:RNE G=- split=3:{text} out=float32:RNE")


FP32 = Capabilities("float32", "float32", "float32", max_k=16384)


def _order_device(order_text: str | None, S: int, L: int, reduce=None):
    m = parse_short(BASE.format(f"{S}/T{L}"))
    if order_text:
        m = m.replace(split_reduce=SplitOrder.parse(order_text))
    if reduce is not None:
        m = m.replace(split_reduce=reduce)
    return virtual_device(m, FP32, "virtual-order", by_shape=lambda M, N, K: m), m


@pytest.mark.parametrize("seed", range(8))
def test_combine_probe_reads_hidden_orders(seed):
    rng = np.random.default_rng(100 + seed)
    S, L = int(rng.integers(3, 20)), int(rng.integers(1, 6))
    text = random_order(rng, S)
    dev, m = _order_device(text, S, L)
    shape = (int(rng.integers(2, 9)), int(rng.integers(S, 40)), S * L)
    got = crafted_combine_probe(dev, shape, slice_ks(m, shape[2]))
    assert got is not None
    # the same adds: equal on random operands bit for bit (orders may differ in spelling)
    A, B = _operands(rng, 3, shape[2], 4)
    want = emulate(m, torch.from_numpy(A), torch.from_numpy(B)).numpy()
    found = emulate(m.replace(split_reduce=got), torch.from_numpy(A), torch.from_numpy(B)).numpy()
    assert (_u32(found) == _u32(want)).all(), (text, got)


def test_combine_probe_serial_tree_and_limits():
    dev, m = _order_device(None, 9, 4)
    assert crafted_combine_probe(dev, (4, 12, 36), slice_ks(m, 36)) is SplitReduce.SERIAL
    dev, m = _order_device(None, 8, 4, reduce=SplitReduce.PAIRWISE)  # ((01)(23))((45)(67))
    assert crafted_combine_probe(dev, (4, 12, 32), slice_ks(m, 32)) is None
    assert crafted_combine_probe(dev, (1, 2, 32), slice_ks(m, 32), max_calls=4) is None  # too many calls


def test_order_from_distances_rejects_non_trees():
    D = np.array([[0, 2, 3], [2, 0, 2], [3, 2, 0]])  # 0~1 and 1~2 meet first: no tree
    assert order_from_distances(D) is None


def test_explain_finds_a_hidden_order(monkeypatch):
    """With the split count the library predicts (cuBLASLt's heuristic on the H200: 48 at
    26x1402x11025), explain reads the hidden order and confirms it."""
    import probes.explain as ex
    monkeypatch.setattr(ex, "heuristic_split", lambda name, shape: 12)
    rng = np.random.default_rng(5)
    S, L = 12, 8
    text = random_order(rng, S)
    dev, m = _order_device(text, S, L)
    base = parse_short("F=1 align=exact acc=23:RNE G=- out=float32:RNE")
    e = explain_shape(dev, (6, 20, S * L), base_model=base, seed=1, outputs=120, extra_models=(m.replace(
        split_reduce=SplitReduce.SERIAL),))
    assert e.exact, e
    assert isinstance(e.model.split_reduce, SplitOrder)
    from fp4ref.native import ScheduleTable
    t = ScheduleTable()
    t.add(e)
    again = ScheduleTable.from_dict(t.to_dict()).lookup(dev.name, (6, 20, S * L))
    assert again.model == e.model  # the order survives the schedule table file


def _h200():
    if not DATA.exists():
        pytest.skip(f"{DATA} missing")
    return np.load(DATA)


def test_h200_probe_outputs_give_the_order_and_it_fits():
    """The H200's crafted-probe outputs (two reference sets of 26 slices against probes in every
    column) read as one chain of groups; with it the model equals the native outputs on random
    operands at the sampled columns (the serial order does not)."""
    d = _h200()
    S, (M, N, K) = 48, (26, 1402, 11025)
    D = np.full((S, S), -1, np.int64)
    for tag in ("probe0_16", "probe22_0"):
        out, refs, probes = d[tag + "|out"], d[tag + "|refs"], d[tag + "|probes"]
        for j, s in enumerate(probes):
            for i, r in enumerate(refs):
                if r != s:
                    v = S - int(out[i, j])
                    assert D[r, s] in (-1, v)
                    D[r, s] = D[s, r] = v
    assert (D >= 0).sum() > S * S // 2  # the pairs read (the rest follow from the tree)
    order = order_from_distances(D)
    assert isinstance(order, SplitOrder) and order.value == H200_ORDER
    from fp4ref.native import KLayout
    rng = np.random.default_rng(7)  # the operands the GPU script drew
    A = rng.standard_normal((M, K), dtype=np.float32)
    B = rng.standard_normal((K, N), dtype=np.float32)
    cols = d["random|cols"]
    lay = KLayout(8, 48, interleave=True)
    x, y = lay.pad(torch.from_numpy(A[:4]), torch.from_numpy(B[:, cols]))
    model = lay.model(parse_short("F=1 align=exact acc=23:RNE G=- out=float32:RNE"), K)
    native = d["random|out"][:4]
    fit = emulate(model.replace(split_reduce=order), x, y).numpy()
    assert (_u32(fit) == _u32(native)).all()
    serial = emulate(model, x, y).numpy()
    assert (_u32(serial) != _u32(native)).sum() > native.size // 2


@pytest.mark.gpu
def test_combine_probe_on_cuda_fp32():
    """On the GPU: cuBLAS fp32 at 26x1402x11025 (the H200 runs a 48-slice in-place split-K
    there) is explained exactly, its combine order read by the crafted probe, whatever the
    order; a different split or kernel elsewhere must be exact as well."""
    from probes.backends import detect
    found = detect(include=lambda s: s.name == "cuda-cublas-fp32")
    if not found or found[0].device is None:
        pytest.skip("cuda-cublas-fp32 not available here")
    e = explain_shape(found[0].device, (26, 1402, 11025), outputs=2048, budget_s=90,
                      base_model=parse_short("F=1 align=exact acc=23:RNE G=- out=float32:RNE"))
    assert e.exact, (e.kernels, short(e.model), e.matches, e.checked_outputs)


def test_probe_readings_must_agree():
    """Two readings of one slice pair (repeated columns, or r/s swapped) must be equal, and
    every reading a whole count; the diagonal (r == s) is not read."""
    from probes.explain import _record
    D = np.full((4, 4), -1, np.int64)
    refs, probes = np.array([0, 1]), np.array([1, 2, 3, 1])
    d = np.array([[2.0, 3.0, 4.0, 2.0], [9.0, 3.0, 4.0, 9.0]])
    assert _record(D, d, refs, probes)
    assert D[0, 1] == D[1, 0] == 2 and D[1, 2] == 3 and D[1, 3] == 4 and D[1, 1] == -1
    assert not _record(D.copy(), d + np.array([[0, 0, 0, 1], [0, 0, 0, 0]]), refs, probes)  # tiles differ
    assert not _record(D.copy(), d + 0.5, refs, probes)                                    # not a count
    assert not _record(D.copy(), np.array([[5.0]]), np.array([1]), np.array([0]))         # != D[1, 0]
