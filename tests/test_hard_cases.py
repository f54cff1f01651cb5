"""Hard inputs reach every quantizer profile and the block-scaled GEMM: block maxima on
e4m3 scale ties, bf16 subnormals and bf16 max, NaN / Inf blocks, all-zero blocks and exact
cancellation (fp4ref.strategies.hard_block_tensors; each kind is a hypothesis event, and an
@example per kind makes every run hit each one).  Fast (torch path) == exact reference."""
from __future__ import annotations

import pytest
import torch
from hypothesis import example, given, settings

from fp4ref.quant import quantize as fq
from fp4ref.strategies import HARD_BLOCKS, hard_block, hard_block_tensors
from reference.recipes import RECIPE_PROFILES, quantize as rq

PROFILES = [k for k, p in RECIPE_PROFILES.items()
            if p.family in ("nvfp4", "mx", "ue5m3") and k != "microxcaling"]


def _one_kind(kind, rows=2, cols=32, block=16):
    vals = []
    for r in range(rows):
        for c in range(cols // block):
            vals += hard_block(kind, block, 3 - 5 * r + c, [r * 7 + c * 3 + i for i in range(8)])
    return ([kind], torch.tensor(vals, dtype=torch.float32).reshape(rows, cols))


def _examples(f):
    for kind in HARD_BLOCKS:
        f = example(drawn=_one_kind(kind))(f)
    return f


@pytest.mark.parametrize("profile", PROFILES)
@settings(max_examples=max(8, settings().max_examples // 6))
@given(drawn=hard_block_tensors([1, 2], [32, 64], 16))
@_examples
def test_fast_equals_reference_on_hard_blocks(profile, drawn):
    kinds, x = drawn
    for dt in (torch.float32, torch.bfloat16):
        xs = x.to(dt)
        try:
            want = rq(xs, profile)
        except ValueError as e:    # a profile that rejects NaN / Inf input: both must
            with pytest.raises(ValueError):
                fq(xs, profile, backend="torch") if _has_backend(profile) else fq(xs, profile)
            assert str(e)
            continue
        got = fq(xs, profile, backend="torch") if _has_backend(profile) else fq(xs, profile)
        assert got.same_bits(want), (profile, kinds, dt)


def _has_backend(profile: str) -> bool:
    return RECIPE_PROFILES[profile].family in ("nvfp4", "mx", "ue5m3")


def test_each_hard_kind_is_what_it_claims():
    """The strategy's blocks, checked from their definitions (not from a quantizer)."""
    import math
    bf = lambda t: torch.equal(t.to(torch.bfloat16).float().view(torch.int32),  # noqa: E731
                               t.view(torch.int32)) or bool(torch.isnan(t).any())
    for kind in HARD_BLOCKS:
        _, x = _one_kind(kind)
        assert bf(x), kind                       # exact in bfloat16
    _, s = _one_kind("bf16_subnormal")
    nz = s[s != 0].abs()
    assert nz.numel() and bool((nz < 2.0 ** -126).all())
    _, m = _one_kind("bf16_max")
    assert float(m.abs().max()) == float(torch.finfo(torch.bfloat16).max)
    _, z = _one_kind("all_zero")
    assert bool((z == 0).all()) and bool(torch.signbit(z).any())
    _, c = _one_kind("cancel")
    assert bool((c.view(-1, 16).sum(1) == 0).all())
    _, n = _one_kind("nan_inf")
    assert bool(torch.isnan(n).any()) and bool(torch.isinf(n).any())
    _, t = _one_kind("scale_tie")
    amax = t.view(-1, 16).abs().amax(1) / 6
    frac = [math.frexp(float(a))[0] * 2 for a in amax]       # in [1, 2)
    assert all((f * 16) % 2 == 1 for f in frac), frac        # 1 + (2i+1)/16: an e4m3 midpoint
