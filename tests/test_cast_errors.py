"""Boundary validation of fp4ref.cast: each bad input gets a clear exception
naming the parameter, the value and the valid choices."""
from __future__ import annotations

import pytest
import torch

from fp4ref.cast import (as_torch_dtype, dequantize, pack_fp4, quantize, quantize_profile,
                         round_to, unpack_fp4)
from reference.profiles import get_cast_profile
from reference.rounding import Policy

X = torch.tensor([0.5, -1.25, 3.0, 100.0], dtype=torch.float32)


def test_unknown_format_lists_choices():
    with pytest.raises(ValueError, match=r"fmt: unknown value 'e4m3'.*float8_e4m3fn"):
        quantize(X, "e4m3")
    with pytest.raises(ValueError, match="float4_e2m1fn"):
        dequantize(torch.zeros(2, dtype=torch.uint8), "fp4")


def test_unknown_mode_lists_choices():
    with pytest.raises(ValueError, match=r"mode: unknown value 'nearest'.*RNE.*SR"):
        quantize(X, "float8_e4m3fn", "nearest")
    with pytest.raises(ValueError, match="mode"):
        round_to(X, "float8_e4m3fn", 3)


def test_unknown_policy_names():
    with pytest.raises(ValueError, match=r"policy field: unknown name 'overfl'.*overflow"):
        quantize(X, "float8_e4m3fn", "rne", {"overfl": "ieee"})
    with pytest.raises(ValueError, match=r"policy.nan: unknown value 'quiet'.*CANONICAL"):
        quantize(X, "float8_e4m3fn", "rne", {"nan": "quiet"})
    with pytest.raises(ValueError, match=r"policy.overflow.*valid choices: SATFINITE"):
        quantize(X, "float4_e2m1fn", "rne", Policy.make(overflow="ieee"))
    with pytest.raises(TypeError, match="policy"):
        quantize(X, "float8_e4m3fn", "rne", "satfinite")


def test_unknown_backend():
    with pytest.raises(ValueError, match=r"backend: unknown value 'cuda'.*torch"):
        quantize(X, "float8_e4m3fn", backend="cuda")


def test_triton_backend_refused_where_it_cannot_run():
    with pytest.raises(ValueError, match="backend: triton"):
        quantize(X, "float8_e4m3fn", backend="triton")  # CPU tensor
    with pytest.raises(ValueError, match="backend: triton"):
        quantize(X.double(), "bfloat16", backend="triton")


def test_non_tensor_and_non_floating_inputs():
    with pytest.raises(TypeError, match="x: expected a torch.Tensor"):
        quantize([1.0, 2.0], "float8_e4m3fn")
    for dt in (torch.int32, torch.uint8, torch.bool, torch.complex64, torch.float8_e4m3fn):
        with pytest.raises(TypeError, match=r"x: dtype .* valid choices: torch.float32"):
            quantize(torch.zeros(3, dtype=dt), "float8_e4m3fn")
    with pytest.raises(TypeError):
        quantize_profile(torch.zeros(3, dtype=torch.int64), "torch.float8_e4m3fn")


def test_sr_needs_rbits_and_nbits():
    with pytest.raises(ValueError, match="rbits/nbits: mode SR needs"):
        quantize(X, "float8_e4m3fn", "sr")
    with pytest.raises(ValueError, match="rbits/nbits"):
        quantize(X, "float8_e4m3fn", "sr", nbits=8)
    with pytest.raises(ValueError, match="rbits/nbits"):
        quantize(X, "float8_e4m3fn", "sr", rbits=torch.zeros(4, dtype=torch.int64))


def test_sr_rbits_shape_dtype_range_device():
    r = torch.zeros(4, dtype=torch.int64)
    with pytest.raises(ValueError, match=r"rbits: shape \(3,\) does not match"):
        quantize(X, "float8_e4m3fn", "sr", rbits=torch.zeros(3, dtype=torch.int64), nbits=8)
    with pytest.raises(ValueError, match="rbits: dtype torch.float32 is not an integer"):
        quantize(X, "float8_e4m3fn", "sr", rbits=torch.zeros(4), nbits=8)
    with pytest.raises(ValueError, match="rbits: dtype torch.bool"):
        quantize(X, "float8_e4m3fn", "sr", rbits=torch.zeros(4, dtype=torch.bool), nbits=8)
    with pytest.raises(ValueError, match=r"rbits: values must lie in \[0, 2\*\*8\)"):
        quantize(X, "float8_e4m3fn", "sr", rbits=torch.tensor([0, 1, 256, 3]), nbits=8)
    with pytest.raises(ValueError, match="rbits: values must lie"):
        quantize(X, "float8_e4m3fn", "sr", rbits=torch.tensor([0, -1, 2, 3]), nbits=8)
    with pytest.raises(ValueError, match="rbits: expected an integer torch.Tensor"):
        quantize(X, "float8_e4m3fn", "sr", rbits=[0, 1, 2, 3], nbits=8)
    for nb in (0, 63, True, 8.0):
        with pytest.raises(ValueError, match="nbits"):
            quantize(X, "float8_e4m3fn", "sr", rbits=r, nbits=nb)
    with pytest.raises(ValueError, match="only used by mode SR"):
        quantize(X, "float8_e4m3fn", "rne", rbits=r, nbits=8)
    if torch.cuda.is_available():
        with pytest.raises(ValueError, match="rbits: device"):
            quantize(X.cuda(), "float8_e4m3fn", "sr", rbits=r, nbits=8)


def test_raise_policies():
    with pytest.raises(ValueError, match="NaN cannot be encoded in float4_e2m1fn"):
        quantize(torch.tensor([1.0, float("nan")]), "float4_e2m1fn")  # default: no NaN code
    with pytest.raises(ValueError, match="negative values cannot be encoded in unsigned ue4m3"):
        quantize(torch.tensor([1.0, -2.0]), "ue4m3", "rne", {"negative": "raise"})
    # -0 and NaN are not "negative values"
    assert quantize(torch.tensor([-0.0]), "ue4m3", "rne", {"negative": "raise"}).item() == 0


def test_dequantize_bad_codes():
    with pytest.raises(TypeError, match="codes: dtype torch.float32 is not an integer"):
        dequantize(torch.zeros(2), "float8_e4m3fn")
    with pytest.raises(TypeError, match="codes: expected a torch.Tensor"):
        dequantize([1, 2], "float8_e4m3fn")
    with pytest.raises(ValueError, match=r"codes: values must lie in \[0, 16\)"):
        dequantize(torch.tensor([3, 16], dtype=torch.uint8), "float4_e2m1fn")
    with pytest.raises(ValueError, match=r"\[0, 128\) for ue4m3"):
        dequantize(torch.tensor([200], dtype=torch.uint8), "ue4m3")
    with pytest.raises(ValueError, match="bfloat16"):
        dequantize(torch.tensor([-1], dtype=torch.int32), "bfloat16")


def test_pack_unpack_errors():
    with pytest.raises(ValueError, match="last dimension must be even"):
        pack_fp4(torch.zeros(3, dtype=torch.uint8))
    with pytest.raises(TypeError, match="uint8"):
        pack_fp4(torch.zeros(4, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"\[0, 16\)"):
        pack_fp4(torch.tensor([1, 17], dtype=torch.uint8))
    with pytest.raises(TypeError, match="packed: dtype torch.int16"):
        unpack_fp4(torch.zeros(2, dtype=torch.int16))
    with pytest.raises(TypeError, match="packed: expected a torch.Tensor"):
        unpack_fp4(b"\x12")


def test_as_torch_dtype_errors():
    with pytest.raises(ValueError, match=r"fmt: unknown value 'ue4m3'.*float8_e4m3fn"):
        as_torch_dtype(torch.zeros(2, dtype=torch.uint8), "ue4m3")
    with pytest.raises(TypeError, match="uint8"):
        as_torch_dtype(torch.zeros(2, dtype=torch.int32), "float8_e4m3fn")


def test_unknown_profile_lists_choices():
    with pytest.raises(ValueError, match=r"profile: unknown value 'torch.e4m3'.*torch.float8_e4m3fn"):
        get_cast_profile("torch.e4m3")
    with pytest.raises(ValueError, match="profile"):
        quantize_profile(X, "numpy.float8")
