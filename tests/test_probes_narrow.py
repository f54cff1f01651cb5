"""Narrow outputs (anchored probes, the alpha pool aimed at output ties) and uneven split-K
slices in the inference."""
from __future__ import annotations

import itertools
from fractions import Fraction

from probes import probes as P
from probes.backends.virtual import virtual_device
from probes.device import Capabilities
from probes.infer import Inference, canonical, predict
from reference.notation import short
from probes.testing import observationally_equivalent
from reference.formats import get_format
from reference.gemm import AlignRef, AlphaMode, GemmModel, split_bounds
from reference.rounding import Mode, round_exact

E4M3_BF16 = Capabilities("float8_e4m3fn", "float8_e4m3fn", "bfloat16", alpha="rowwise",
                         k_multiple=16, max_k=1024, max_batch=16)


def _exact_sum(ops) -> Fraction:
    return sum((Fraction(float(x)) * Fraction(float(y)) for x, y in zip(ops.a, ops.b)), Fraction(0))


def _is_tie(S: Fraction, fmt: str) -> bool:
    """S lies exactly halfway between two neighbours of the format (checked by rounding)."""
    dn = round_exact(S, fmt, Mode.RTZ)[0]
    up = round_exact(S, fmt, Mode.RUP if S > 0 else Mode.RDN)[0]
    return dn != up and 2 * abs(S) == dn + up


def test_anchored_probes_sit_on_output_ties():
    ctx = P.ProbeContext(E4M3_BF16, 256)
    pool = P.cached_pool(P.inner_pool, ctx)
    anchored = [p for p in pool if "@tie" in p.name]
    assert len(anchored) > 100
    n_ties = 0
    for p in anchored:
        base = sum((P._term_value(t) for t in p.terms[:-1]), Fraction(0))
        S = _exact_sum(p.ops)                       # from the realized operands
        assert S == base + P._term_value(p.terms[-1])
        if base != 0 and round_exact(base, "bfloat16", Mode.RNE)[0] == abs(base):
            assert _is_tie(S, "bfloat16"), p.name   # representable sum + anchor: a tie
            n_ties += 1
    assert n_ties > 20


def test_anchors_show_what_the_output_rounding_hides():
    """Exact fused steps vs W = 13 RTZ alignment: identical bf16 outputs on every plain
    inner probe, different outputs on anchored ones."""
    ctx = P.ProbeContext(E4M3_BF16, 256)
    pool = P.cached_pool(P.inner_pool, ctx)
    plain = [p for p in pool if "@tie" not in p.name]
    anch = [p for p in pool if "@tie" in p.name]
    m1 = GemmModel("exact-step", output="bfloat16", fma_width=32, acc_frac_bits=13)
    m2 = m1.replace(align_bits=13, align_mode=Mode.RTZ, align_ref=AlignRef.EXPONENT_SUM)
    pr = predict([m1, m2], plain)
    assert (pr[0] == pr[1]).all()        # the bf16 rounding hides the alignment's losses
    pa = predict([m1, m2], anch)
    assert (pa[0] != pa[1]).sum() >= 4


def test_alpha_pool_for_narrow_outputs_separates_every_pair_of_modes():
    ctx = P.ProbeContext(E4M3_BF16, 256)
    pool = P.alpha_pool(ctx)
    assert len(pool) >= 16
    ms = [GemmModel("a", output="bfloat16", alpha_mode=a) for a in AlphaMode]
    pr = predict(ms, pool)
    for i, j in itertools.combinations(range(len(ms)), 2):
        assert (pr[i] != pr[j]).any(), (ms[i].alpha_mode, ms[j].alpha_mode)


def test_uneven_split_k_is_inferred():
    caps = Capabilities("float32", "float32", "float32", max_k=1024, max_batch=16)
    hidden = GemmModel("hidden", output="float32", split_k=3, split_tile=32)
    assert split_bounds(hidden, 256) == [(0, 96), (96, 192), (192, 256)]  # not an equal split
    dev = virtual_device(hidden, caps, "uneven", diag_only=True)
    res = Inference(dev, quick=True, k_core=256).run()
    assert res.status == "fit", res.notes[:3]
    got = canonical(res.model.replace(name="hidden"), caps)
    ok, why = observationally_equivalent(got, canonical(hidden, caps), caps, 256)
    assert ok, (short(got), why)
    assert any("uneven" in n for n in res.notes)


def test_output_tie_helper_is_not_trivially_true():
    f = get_format("bfloat16")
    one = Fraction(1)
    assert _is_tie(one + Fraction(1, 1 << (f.man_bits + 1)), "bfloat16")
    assert not _is_tie(one, "bfloat16")
    assert not _is_tie(one + Fraction(1, 1 << (f.man_bits + 2)), "bfloat16")
