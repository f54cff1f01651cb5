"""Bad input: clear errors naming the parameter, the value and the valid choices."""
import os

import pytest
import torch

from reference.recipes import RECIPE_PROFILES, get_profile, quantize as rq
from fp4ref.quant import quantize as fq


@pytest.mark.parametrize("q", [rq, fq])
def test_unknown_profile(q):
    with pytest.raises(ValueError, match=r"profile: unknown value 'nvfp5'; valid choices: .*te_nvfp4"):
        q(torch.ones(1, 16), "nvfp5")


def test_registry_records():
    assert len(RECIPE_PROFILES) == len(set(RECIPE_PROFILES))
    for name, p in RECIPE_PROFILES.items():
        assert p.name == name and p.summary and p.source and p.pad in ("zero", "raise")
    assert get_profile("te_nvfp4_ref").cell
    with pytest.raises(ValueError, match="tensor-scale rule"):
        fq(torch.ones(1, 16), "te_fp8_delayed")


@pytest.mark.parametrize("q", [rq, fq])
@pytest.mark.parametrize("profile,kw,match", [
    ("te_nvfp4", dict(tile=(2, 16)), r"tile: unknown value \(2, 16\); valid choices: 1x16, 16x16"),
    ("torchao_nvfp4", dict(tile=(16, 16)), r"tile: .*valid choices: 1x16"),
    ("te_nvfp4", dict(copy="diagonal"), r"copy: unknown value 'diagonal'; valid choices"),
    ("te_nvfp4", dict(mode="sr"), r"rbits"),
    ("te_nvfp4", dict(rbits=torch.zeros(1, 16, dtype=torch.int64), nbits=8), r"rbits"),
    ("ocp_mx_floor", dict(elem_fmt="float3"), r"elem_fmt: unknown value 'float3'"),
    ("ue5m3", dict(target=0), r"T: 0 is not a valid block-scale target"),
    ("ue5m3", dict(tile=(1, 64)), r"tile"),
])
def test_bad_arguments(q, profile, kw, match):
    with pytest.raises(ValueError, match=match):
        q(torch.ones(1, 16), profile, **kw)


@pytest.mark.parametrize("q", [rq, fq])
def test_shapes_not_multiple_of_block(q):
    # profiles that pad (TE) zero-pad; torchao / MX raise (documented per profile)
    x = torch.ones(3, 20)
    assert q(x, "te_nvfp4").shape == (3, 20)
    assert q(x, "te_nvfp4", tile=(16, 16)).scale_codes.__len__() == 1
    with pytest.raises(ValueError, match="not a multiple of the 1x16 block"):
        q(x, "torchao_nvfp4")
    with pytest.raises(ValueError, match="not a multiple of the MX block 32"):
        q(x, "ocp_mx_floor")
    with pytest.raises(ValueError, match="multiple of the block 32"):
        q(x, "quartet_fwd")


def test_padded_profile_pads_with_zeros():
    x = torch.randn(3, 20)
    p = torch.nn.functional.pad(x, (0, 12))
    a, b = fq(x, "te_nvfp4_ref"), fq(p, "te_nvfp4_ref")
    assert torch.equal(a.codes, b.codes[:, :20]) and torch.equal(a.scale_codes, b.scale_codes)
    assert rq(x, "te_nvfp4_ref").codes == tuple(map(tuple, b.codes[:, :20].tolist()))


@pytest.mark.parametrize("bad,exc,match", [
    (torch.ones(2, 16, dtype=torch.int32), TypeError, r"x: dtype torch.int32 is not"),
    (torch.ones(16), ValueError, r"x: expected a 2D"),
    (torch.ones(2, 2, 16), ValueError, r"x: expected a 2D"),
    (torch.ones(0, 16), ValueError, r"x: empty tensor"),
    (torch.ones(2, 0), ValueError, r"x: empty tensor"),
    ([[1.0, 2.0]], TypeError, r"x: expected a torch.Tensor"),
])
def test_bad_tensors_fast(bad, exc, match):
    with pytest.raises(exc, match=match):
        fq(bad, "te_nvfp4")


@pytest.mark.parametrize("bad,exc,match", [
    (torch.ones(2, 16, dtype=torch.int32), TypeError, r"x: dtype torch.int32 is not"),
    (torch.ones(16), ValueError, r"x: expected a 2D"),
    (torch.ones(0, 16), ValueError, r"x: empty"),
    ([], ValueError, r"x: empty"),
])
def test_bad_tensors_reference(bad, exc, match):
    with pytest.raises(exc, match=match):
        rq(bad, "te_nvfp4")


def test_backend_choice():
    with pytest.raises(ValueError, match="backend: unknown value 'cuda'"):
        fq(torch.ones(1, 16), "te_nvfp4", backend="cuda")
    # (only an interpreter process, tests/test_interpreter.py, has TRITON_INTERPRET=1)
    if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        with pytest.raises(ValueError, match="backend: triton needs"):
            fq(torch.ones(1, 16), "te_nvfp4", backend="triton")


# --- typed rules: every rule field is checked at construction -------------------------
from dataclasses import fields as _fields  # noqa: E402

from reference.recipes import Family, rules as RL  # noqa: E402
from reference.recipes.mx import MX_RULES, MXRule  # noqa: E402
from reference.recipes.nvfp4 import NVFP4_RULES, TwoLevelRule  # noqa: E402


@pytest.mark.parametrize("field", [f.name for f in _fields(TwoLevelRule)])
def test_two_level_rule_rejects_unknown_values(field):
    name = {"target": "T"}.get(field, field)      # the block-scale target is T everywhere
    with pytest.raises(ValueError, match=rf"^{name}: "):
        TwoLevelRule(**{field: "bogus"})


@pytest.mark.parametrize("field", [f.name for f in _fields(MXRule)])
def test_mx_rule_rejects_unknown_values(field):
    with pytest.raises(ValueError, match=rf"^{field}: "):
        MXRule(**{field: "bogus"})


def test_rule_fields_are_enum_members_and_accept_their_strings():
    r = TwoLevelRule(block_scale="div_first", elem_cast="te_ref", pad="raise")
    assert r.block_scale is RL.BlockScale.DIV_FIRST and r.block_scale == "div_first"
    assert r.elem_cast is RL.ElemCast.TE_REF and r.pad is RL.Pad.RAISE
    assert MXRule("ceil").scale_mode is RL.ScaleMode.CEIL
    with pytest.raises(ValueError, match=r"block_scale: unknown value 'te-mul'; valid choices: "
                                         r"te_mul, div_first, torchao, single"):
        TwoLevelRule(block_scale="te-mul")
    # an E2M1 rule cannot name a float8 cast; an e2m1 NaN has no NaN code
    with pytest.raises(ValueError, match=r"elem_cast: unknown value 'torch'"):
        TwoLevelRule(elem_cast="torch")
    with pytest.raises(ValueError, match=r"elem_nan: unknown value 'nan'"):
        TwoLevelRule(elem_nan="nan")
    with pytest.raises(ValueError, match=r"elem_cast: unknown value 'te_ref'"):
        MXRule(elem_cast="te_ref")


def test_rule_combinations_are_checked():
    # a block scale / encode that reads a per-tensor scale needs one
    with pytest.raises(ValueError, match=r"tensor_scale: .*does not go with block_scale te_mul"):
        TwoLevelRule(tensor_scale="none")
    with pytest.raises(ValueError, match=r"tensor_scale: .*does not go with"):
        TwoLevelRule(tensor_scale="none", block_scale="single")       # encode TE reads 1/S_enc
    # 4over6 computes TE's reference order only
    with pytest.raises(ValueError, match=r"zero_amax: .*does not go with four_over_six mae"):
        TwoLevelRule(four_over_six="mae", block_scale="div_first", elem_cast="te_ref")
    for name in ("te_nvfp4_4over6", "te_nvfp4_4over6_mse"):
        assert NVFP4_RULES[name].block_scale is RL.BlockScale.DIV_FIRST


def test_choose_lists_the_allowed_choices():
    with pytest.raises(ValueError, match=r"^pre_round: unknown value 'fp16'; valid choices: "
                                         r"None, bfloat16$"):
        RL.choose("pre_round", "fp16", RL.PreRound, optional=True)
    assert RL.choose("pre_round", None, RL.PreRound, optional=True) is None
    assert RL.choose("pad", RL.Pad.ZERO, RL.Pad) is RL.Pad.ZERO


def test_one_registry_exact_and_fast():
    from fp4ref.quant import FAST_QUANTIZERS
    assert set(FAST_QUANTIZERS) == set(RECIPE_PROFILES)
    for name, p in RECIPE_PROFILES.items():
        assert isinstance(p.family, Family)
        assert (p.exact is None) == (p.family is Family.FP8_SCALING), name
    for name in MX_RULES:
        assert RECIPE_PROFILES[name].rule is MX_RULES[name]
    # a registered RecipeProfile works as the profile argument; another one does not
    x = torch.ones(1, 16)
    assert fq(x, get_profile("te_nvfp4")).same_bits(fq(x, "te_nvfp4"))
    from dataclasses import replace
    other = replace(get_profile("te_nvfp4"), rule=NVFP4_RULES["te_nvfp4_2509"])
    with pytest.raises(ValueError, match="not the registered one"):
        fq(x, other)
