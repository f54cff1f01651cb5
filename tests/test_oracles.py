"""Third-party casts (ml_dtypes 0.6.0, torch 2.13 CPU) agree bit for bit with their
named profiles (reference.profiles), through the fast path and the reference."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch

from fp4ref.cast import quantize_profile
from fp4ref.strategies import float32_neighbourhood, grid_points, tie_points
from reference.formats import get_format
from reference.profiles import CAST_PROFILES
from tests.cast_helpers import all_bf16, all_fp16, class_keys, ref_codes_each
from tests.cast_helpers import torch_single_thread  # noqa: F401  (autouse fixture)

PROFILES = list(CAST_PROFILES)
N_RANDOM = 1 << 20  # plus the tie neighbourhoods: > 10**6 float32 inputs per profile


def _installed(lib: str) -> str:
    return {"torch": torch.__version__.split("+")[0], "ml_dtypes": ml_dtypes.__version__}[lib]


def library_cast(name: str, x: torch.Tensor) -> np.ndarray:
    """Codes from the library itself (uint8 numpy); skips when the installed
    version is not the one the profile was measured on."""
    p = CAST_PROFILES[name]
    lib, ver = p.library.split()
    if not _installed(lib).startswith(ver):
        pytest.skip(f"profile {name} is for {p.library}; installed {lib} {_installed(lib)}")
    lib, fmt = name.split(".", 1)
    if lib == "torch":
        return x.to(getattr(torch, fmt)).view(torch.uint8).numpy()
    a = x.view(torch.int16).numpy().view(ml_dtypes.bfloat16) if x.dtype == torch.bfloat16 \
        else x.numpy()
    with np.errstate(all="ignore"):
        return a.astype(getattr(ml_dtypes, fmt)).view(np.uint8)


def _fast(name, x):
    return quantize_profile(x, name).numpy()


def _diff(name, x, got, exp):
    bad = np.nonzero(got != exp)[0]
    return [(repr(float(x[i])), hex(int(got[i])), hex(int(exp[i]))) for i in bad[:5]]


def _float32_inputs(fmt) -> torch.Tensor:
    fmt = get_format(fmt)
    ties = float32_neighbourhood(tie_points(fmt) + grid_points(fmt), ulps=2)
    g = torch.Generator().manual_seed(17)
    bits = torch.randint(-2**31, 2**31 - 1, (N_RANDOM // 2,), dtype=torch.int32, generator=g)
    lo, hi = fmt.emin - fmt.man_bits - 4, min(fmt.emax + 4, 127)   # log-uniform over the range
    e = torch.randint(lo, hi, (N_RANDOM // 2,), generator=g).float()
    m = 1 + torch.rand(N_RANDOM // 2, generator=g)
    s = torch.where(torch.rand(N_RANDOM // 2, generator=g) < 0.5, -1.0, 1.0)
    spread = s * m * torch.exp2(e)
    return torch.cat([ties, bits.view(torch.float32), spread])


@pytest.mark.parametrize("name", PROFILES)
def test_profile_matches_library_on_every_bf16_and_fp16_pattern(name):
    for x in (all_bf16(), all_fp16()):
        got, exp = _fast(name, x), library_cast(name, x)
        assert np.array_equal(got, exp), _diff(name, x, got, exp)


@pytest.mark.parametrize("name", PROFILES)
def test_profile_matches_library_on_float32_ties_and_random(name):
    p = CAST_PROFILES[name]
    x = _float32_inputs(p.fmt)
    assert x.numel() >= 10**6
    got, exp = _fast(name, x), library_cast(name, x)
    assert np.array_equal(got, exp), _diff(name, x, got, exp)


@pytest.mark.parametrize("name", PROFILES)
def test_reference_profile_matches_library_directly(name):
    """The reference itself (no fast path) on every tie neighbourhood and one input
    per rounding class of all bf16/fp16 patterns."""
    p = CAST_PROFILES[name]
    fmt = get_format(p.fmt)
    ties = float32_neighbourhood(tie_points(fmt), ulps=1)
    x16 = torch.cat([all_bf16().float(), all_fp16().float()])
    _, first = np.unique(class_keys(x16.double().numpy(), fmt), return_index=True)
    x = torch.cat([ties, x16[torch.from_numpy(first)]])
    exp = library_cast(name, x)
    got = ref_codes_each(x.tolist(), fmt, p.mode, p.policy)
    assert np.array_equal(got, exp.astype(np.int64)), _diff(name, x, got, exp)


@pytest.mark.parametrize("name", PROFILES)
def test_float64_inputs_go_through_float32_like_the_library(name):
    p = CAST_PROFILES[name]
    fmt = get_format(p.fmt)
    mids = torch.tensor([float(t) for t in tie_points(fmt) if float(t) < 3e38], dtype=torch.float64)
    eps = torch.tensor([-2.0**-35, 2.0**-35, -2.0**-60, 2.0**-60], dtype=torch.float64)
    x = (mids[:, None] * (1 + eps[None, :])).reshape(-1)
    x = torch.cat([x, -x])
    got = quantize_profile(x, name).numpy()
    library_cast(name, x[:1].float())  # version check
    lib, fmtname = name.split(".", 1)
    if lib == "torch":
        exp = x.to(getattr(torch, fmtname)).view(torch.uint8).numpy()
    else:
        with np.errstate(all="ignore"):
            exp = x.numpy().astype(getattr(ml_dtypes, fmtname)).view(np.uint8)
    assert np.array_equal(got, exp), _diff(name, x, got, exp)
    assert p.via_float32


def test_profiles_are_well_formed():
    for name, p in CAST_PROFILES.items():
        assert p.name == name and name.endswith(p.fmt)
        p.policy.validate(get_format(p.fmt))
        assert p.library.split()[0] in ("ml_dtypes", "torch") and p.description
