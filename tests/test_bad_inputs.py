"""A hostile user's inputs: every bad CLI argument or API call is a clean error naming the
parameter (exit 2, or ValueError/TypeError), never another exception or a traceback.

The CLI is driven in-process through reports.cli.main(argv).  No property example starts a
real probe run: every generated argument list is invalid, and the ones that would pass
argument parsing are refused before any device is probed.
"""
from __future__ import annotations

import contextlib
import io
import math
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import fp4ref
from reports.cli import main as fp4ref_main

# --- the CLI ------------------------------------------------------------------------------------
INT_OPTIONS = {"--validate-outputs": 1, "--seed": 0, "--jobs": 1, "--max-shapes": 0}
SECONDS_OPTIONS = ("--time-limit-s", "--shape-budget-s")


def run_cli(argv) -> tuple[int, str]:
    """(exit code, stderr + stdout) of one in-process command; any other exception fails."""
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        try:
            rc = fp4ref_main(list(argv))
        except SystemExit as e:  # argparse
            rc = e.code
    return rc, err.getvalue() + out.getvalue()


def _not_int(s: str) -> bool:
    try:
        int(s)
    except ValueError:
        return True
    return False


def _not_positive_seconds(s: str) -> bool:
    try:
        v = float(s)
    except ValueError:
        return True
    return not (math.isfinite(v) and v > 0)


@st.composite
def bad_probe_numbers(draw):
    if draw(st.booleans()):
        opt = draw(st.sampled_from(sorted(INT_OPTIONS)))
        lo = INT_OPTIONS[opt]
        val = draw(st.one_of(st.integers(max_value=lo - 1).map(str),
                             st.text(max_size=8).filter(_not_int)))
    else:
        opt = draw(st.sampled_from(SECONDS_OPTIONS))
        val = draw(st.one_of(st.floats(max_value=0).map(repr), st.sampled_from(["nan", "inf", "-inf"]),
                             st.text(max_size=8).filter(_not_positive_seconds)))
    return ["probe", opt, val], opt


def _word(s: str) -> bool:
    return not s.startswith("-") and s.strip() == s and s != ""


@st.composite
def bad_choices(draw):
    """Commands given a name outside the valid choices (checked before any work)."""
    junk = draw(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=12)
                .filter(_word))
    case = draw(st.sampled_from(["bench-device", "bench-sections", "verify-formats", "verify-modes",
                                 "verify-limit", "command"]))
    if case == "bench-device":
        return (["bench", "--device", junk], "--device") if junk not in ("cpu", "cuda") else (
            ["bench", "--device", "tpu"], "--device")
    if case == "bench-sections":
        return ["bench", "--sections", "zz" + junk.replace(",", "")], "section"
    if case == "verify-formats":
        return ["verify-exhaustive", "--formats", "zz" + junk.replace(",", ""), "--limit", "1"], "formats"
    if case == "verify-modes":
        return ["verify-exhaustive", "--modes", "zz" + junk.replace(",", ""), "--limit", "1"], "mode"
    if case == "verify-limit":
        return ["verify-exhaustive", "--limit", str(draw(st.integers(max_value=0)))], "--limit"
    return ["zz" + junk], "valid choices"


@given(bad_probe_numbers())
def test_probe_numeric_arguments(case):
    argv, opt = case
    rc, text = run_cli(argv)
    assert rc == 2 and opt in text and "Traceback" not in text, text


@given(bad_choices())
def test_bad_names_and_limits(case):
    argv, needle = case
    rc, text = run_cli(argv)
    assert rc == 2 and needle in text and "Traceback" not in text, (argv, text)


@settings(max_examples=8)
@given(st.sampled_from(["math:pi", "builtins:int", "os:sep", "no_such_module_zz:dev", "tests:nothing",
                        "json:dumps", ":dev", "nomodule"]))
def test_probe_bad_extra(spec):
    out = Path(tempfile.mkdtemp(prefix="fp4ref-test-"))
    try:
        rc, text = run_cli(["probe", "--extra", spec, "--out", str(out)])
        assert rc == 2 and "--extra" in text and "Traceback" not in text, text
        assert not list(out.glob("*/*")), "no run folder for a refused run"
    finally:
        shutil.rmtree(out, ignore_errors=True)


def test_fixed_bad_cli_inputs(tmp_path):
    cases = [
        (["probe", "--devices", "zz-no-such-device", "--out", str(tmp_path)], "valid choices"),
        (["gate", "--baseline", str(tmp_path / "none.json"), "--current", str(tmp_path / "none.json")],
         "none.json"),
        (["report", "--input", str(tmp_path / "none.json")], "none.json"),
        (["probe", "--out", "/proc/no-such-dir/x"], "--out"),
    ]
    if not torch.cuda.is_available():
        cases += [(["bench", "--device", "cuda"], "--device"),
                  (["verify-exhaustive", "--device", "cuda", "--limit", "1"], "--device")]
    for argv, needle in cases:
        rc, text = run_cli(argv)
        assert rc == 2 and needle in text and "Traceback" not in text, (argv, text)


# --- the public API -------------------------------------------------------------------------------
_E2M1 = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0}  # SPEC: the E2M1 magnitudes (float4_e2m1fn)


@given(st.text(max_size=10))
def test_mode_lists_choices(value):
    if value.lower() in {m.value for m in fp4ref.Mode}:
        assert fp4ref.Mode(value.lower()).value == value.lower()
        return
    with pytest.raises(ValueError, match="valid choices: RNE .*RNA"):
        fp4ref.Mode(value)


@given(st.sampled_from(["fmt", "mode", "profile", "model", "overflow", "backend"]), st.text(min_size=1, max_size=10))
def test_api_bad_names(param, value):
    x = torch.ones(16, 16)
    calls = {"fmt": (lambda v: fp4ref.quantize(x, v), fp4ref.FORMATS),
             "mode": (lambda v: fp4ref.quantize(x, "float8_e4m3fn", v), [m.name.lower() for m in fp4ref.Mode]),
             "profile": (lambda v: fp4ref.quantize_recipe(x, v), fp4ref.RECIPE_PROFILES),
             "model": (lambda v: fp4ref.emulate(v, x, x), fp4ref.GEMM_PRESETS),
             "overflow": (lambda v: fp4ref.Policy.make(overflow=v), ["satfinite", "ieee", "nan"]),
             "backend": (lambda v: fp4ref.quantize(x, "float8_e4m3fn", backend=v), ["auto", "torch", "triton"])}
    fn, valid = calls[param]
    if value in valid or value.lower() in [str(v).lower() for v in valid]:
        return  # a valid name: a spec-defined result, not an error
    with pytest.raises(ValueError, match=f"{param}.*valid choices"):
        fn(value)


@given(st.lists(st.floats(allow_nan=True, allow_infinity=True, width=32), min_size=4, max_size=4),
       st.booleans())
def test_emulate_probe_matched_needs_fp4_operands(vals, on_b):
    bad = torch.tensor(vals, dtype=torch.float32).reshape(2, 2)
    ok = torch.tensor([[1.0, -0.5], [6.0, 0.0]])
    a, b = (ok, bad) if on_b else (bad, ok)
    if all(abs(v) in _E2M1 for v in vals):
        got = fp4ref.emulate("probe_matched", a, b)
        assert got.shape == (2, 2)
        return
    with pytest.raises(ValueError, match=("b" if on_b else "a") + r": element \[\d, \d\] = .* not an FP4"):
        fp4ref.emulate("probe_matched", a, b)


@given(st.sampled_from(["max_k", "k_multiple", "mn_multiple", "max_batch", "probe_mn"]),
       st.one_of(st.integers(max_value=-1), st.just(0), st.sampled_from([1.5, "8", None, True])))
def test_capabilities_rejected_at_construction(field, value):
    from probes.device import Capabilities
    if field == "probe_mn" and value == 0:
        assert Capabilities("float32", "float32", probe_mn=0).probe_mn == 0  # 0: the batch size
        return
    with pytest.raises((ValueError, TypeError), match=field):
        Capabilities("float32", "float32", **{field: value})


def test_capabilities_bad_names():
    from probes.device import Capabilities
    for kw, needle in (({"a_format": "fp5"}, "a_format"), ({"output": "float8_e4m3fn"}, "output"),
                       ({"alpha": "colwise"}, "alpha")):
        args = {"a_format": "float32", "b_format": "float32", **kw}
        with pytest.raises(ValueError, match=f"{needle}: unknown value"):
            Capabilities(**args)
    _ = np
