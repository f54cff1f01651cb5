"""reference.notation: the one notation of GEMM models (JSON, short and sentence forms),
checked against hand-written literals, round trips, and the committed baselines."""
from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reference import notation as N
from reference.gemm import PRESETS, AlignRef, AlphaMode, GemmModel, ScalePoint, get_preset
from reference.rounding import Mode, Subnormal

ROOT = Path(__file__).resolve().parents[1]

# Hand-written: what each preset reads as (a change to the notation changes these on purpose).
SHORT = {
    "exact": "exact F=1073741824 align=exact acc=23:RNE G=- out=float32:RNE",
    "fp32_sequential": "fp32_sequential F=1 align=exact acc=23:RNE G=- out=float32:RNE",
    "decoded_fp32": "decoded_fp32 F=1 align=exact acc=23:RNE G=- out=float32:RNE",
    "probe_matched": "probe_matched F=64 align=exact acc=23:RNE G=64:RTZ out=float32:RNE",
    "probe_matched_lattice": "probe_matched_lattice F=64 align=exact acc=23:RNE G=64:RTZ L=1/1024 "
                             "out=float32:RNE",
    "blackwell_mxf4nvf4": "blackwell_mxf4nvf4 F=64 E=16 align=35:RTZ:scale-esum acc=23:RTZ:inf G=64:RTZ:chain "
                          "expf=float4_e2m1fn,float4_e2m1fn,ue4m3 out=float32:RNE",
    "blackwell_mxf8f6f4": "blackwell_mxf8f6f4 F=32 align=25:RTZ:scale-esum acc=23:RTZ:inf G=32:RTZ:chain "
                          "expf=float4_e2m1fn,float4_e2m1fn,float8_e8m0fnu out=float32:RNE",
}


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_read_as_written(name):
    m = get_preset(name)
    assert N.short(m, name=True) == SHORT[name]
    assert N.parse_short(SHORT[name]) == m
    assert N.short(m) == SHORT[name].split(" ", 1)[1]   # without the name


def test_every_optional_field_has_a_token():
    m = GemmModel("x", product_format="float32", fma_width=4, align_bits=26, align_mode=Mode.RNE,
                  align_ref=AlignRef.EXPONENT_SUM, acc_frac_bits=22, norm_mode=Mode.RTZ,
                  acc_subnormal=Subnormal.FLUSH, group_size=None, outer_mode=Mode.RTZ, lattice=Fraction(1, 64),
                  split_k=4, split_tile=128, alpha_mode=AlphaMode.REVERSED, output="bfloat16",
                  output_mode=Mode.RNA)
    s = N.short(m)
    assert s == ("F=4 align=26:RNE:esum acc=22:RTZ:FTZ G=-:RTZ split=4/T128 L=1/64 prod=float32 "
                 "alpha=REVERSED out=bfloat16:RNA")
    assert N.parse_short(s) == m.replace(name="custom")
    g = GemmModel(fma_width=16, group_size=16, scale_point=ScalePoint.GROUP)
    assert "scale=group" in N.short(g) and N.parse_short(N.short(g)) == g


def test_no_letter_means_two_things():
    """The clash this notation replaced: W was the alignment in one form, the accumulator in
    the other.  Neither W nor p is written now."""
    for m in PRESETS.values():
        toks = N.short(m).split()
        assert not any(t.startswith(("W", "p")) for t in toks), toks


_MODELS = st.builds(
    GemmModel, fma_width=st.sampled_from([1, 2, 16, 64]), align_bits=st.sampled_from([None, 12, 26, 35]),
    align_mode=st.sampled_from([Mode.RTZ, Mode.RDN, Mode.RNE, Mode.RNA, Mode.RUP]),
    align_ref=st.sampled_from(list(AlignRef)), acc_frac_bits=st.integers(1, 60),
    norm_mode=st.sampled_from([Mode.RNE, Mode.RTZ, Mode.RDN, Mode.RUP, Mode.RNA, Mode.RTO]),
    acc_subnormal=st.sampled_from([Subnormal.KEEP, Subnormal.FLUSH]),
    group_size=st.sampled_from([None, 64, 128]),
    outer_mode=st.sampled_from([Mode.RNE, Mode.RTZ, Mode.RUP]),
    lattice=st.sampled_from([None, Fraction(1, 1024), Fraction(3, 8)]),
    split_k=st.sampled_from([1, 2, 8]), split_tile=st.sampled_from([None, 16]),
    alpha_mode=st.sampled_from(list(AlphaMode)), output=st.sampled_from(["float32", "bfloat16"]),
    output_mode=st.sampled_from([Mode.RNE, Mode.RTZ]), product_format=st.sampled_from([None, "float32"]),
    exact_group=st.sampled_from([None, 16]), overflow_inf=st.booleans())


@settings(max_examples=300, deadline=None)
@given(_MODELS)
def test_short_and_json_forms_round_trip(m):
    assert N.parse_short(N.short(m)) == m
    assert N.from_dict(json.loads(json.dumps(N.to_dict(m)))) == m
    assert N.sentence(m) == " ".join(N.sentences(m))


@pytest.mark.parametrize("text, needle", [
    ("F=16 W=23", "unknown token 'W=23'"),
    ("F=x", "F='x' is not an integer"),
    ("F=1 align=26:RXX", "align: unknown part 'RXX'"),
    ("F=1 F=2", "F= given twice"),
    ("F=1 acc=23:RNE:chain", "acc: unknown part 'chain'"),
    ("F=1 alpha=SIDEWAYS", "alpha"),
    ("F=1 out=float99:RNE", "float99"),
])
def test_bad_short_forms_name_the_token(text, needle):
    with pytest.raises(ValueError, match=needle.replace("(", r"\(")):
        N.parse_short(text)


def test_json_form_reads_older_spellings_and_names_unknown_fields():
    m = N.from_dict({"promotion_interval": 64, "output_format": "bfloat16", "fma_width": 64})
    assert (m.group_size, m.output, m.fma_width) == (64, "bfloat16", 64)
    with pytest.raises(ValueError, match=r"unknown fields \['swizzle'\]"):
        N.from_dict({"fma_width": 1, "swizzle": True})
    assert N.partition({"fma_width": 1, "swizzle": True}) == ({"fma_width": 1}, {"swizzle": True})
    assert set(N.PARAMETERS) == {f for f in GemmModel.__dataclass_fields__}


@pytest.mark.parametrize("path", sorted((ROOT / "reports" / "baselines").glob("h200-580*.json")))
def test_committed_baselines_read_and_round_trip(path):
    """Every model a committed probe report holds parses, and writes back to the same JSON."""
    r = json.loads(path.read_text())
    models = [d["model"] for d in r["devices"] if d.get("model")]
    models += [e["model"] for d in r["devices"] for e in (d.get("extra") or {}).get("shape_models", [])
               if e.get("model")]
    assert models
    for d in models:
        assert N.to_dict(N.from_dict(d)) == d


def test_sentences_say_what_the_gemm_does():
    assert N.sentences(get_preset("probe_matched")) == [
        "Products a*b are exact (no rounding). Block scales, if any, multiply each product exactly.",
        "64 products plus the running accumulator are added in one fused step; inside the step the sum is exact.",
        "After each step the accumulator is normalized to 23 fraction bits (FP32 precision), "
        "round to nearest, ties to even (RNE).",
        "Every 64 products the partial sum is added (promoted) into a separate FP32 accumulator, in order; "
        "those additions are truncated, i.e. rounded toward zero (RTZ).",
        "Output: round to nearest, ties to even (RNE) to float32.",
    ]
    words = N.sentence(get_preset("probe_matched_lattice"))
    assert "snapped to multiples of 1/1024 (2^-10), ties to even" in words


def test_hypothesis_names():
    assert N.hypothesis_name(get_preset("probe_matched")) == "seed probe_matched"
    assert N.hypothesis_name(get_preset("probe_matched_lattice")) == "seed probe_matched with the 1/1024 lattice"
    assert N.hypothesis_name(get_preset("blackwell_mxf4nvf4")) == (
        "Blackwell mxf4nvf4 chain (instruction K 64, exact groups of 16, 35 fraction bits RTZ, "
        "RTZ per instruction, aligned by scale exponent sum)")
    assert N.hypothesis_name(get_preset("fp32_sequential")) == "general family"


@pytest.mark.parametrize("field, member", [("align_ref", r) for r in AlignRef] + [("scale_point", s) for s in ScalePoint]
                         + [("alpha_mode", a) for a in AlphaMode] + [("acc_subnormal", s) for s in
                                                                     (Subnormal.KEEP, Subnormal.FLUSH)])
def test_every_enum_member_has_a_short_form_and_words(field, member):
    """A new member of a model enum must get its token and words (an error, not a silent drop)."""
    m = GemmModel(fma_width=16, group_size=16, align_bits=26).replace(**{field: member})
    assert N.parse_short(N.short(m)) == m
    assert N.sentences(m)
