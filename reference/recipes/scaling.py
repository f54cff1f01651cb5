"""Scale lifecycles as explicit state objects (SPEC 3.3, 3.6), exact FP32 steps.

Every object is keyed by an operand role (any hashable, e.g. ("fc1", "x")), so
each operand of each linear has its own cache / history.

``SampleAndHold`` and ``CalibratedFrozen`` caches are deliberately NOT part of
``state_dict()``: the UE5M3 paper does not serialize them into checkpoints, so
a resumed run re-samples at its first step.  Only the configuration is saved.
"""
from __future__ import annotations

from fractions import Fraction

from ..exact import Exact, exact
from . import f32 as F
from .common import check_positive_int, scalar_exact

__all__ = ["CurrentScaling", "SampleAndHold", "CalibratedFrozen", "TEDelayedScaling",
           "te_current_scale", "FP8_MAX"]

FP8_MAX = {"float8_e4m3fn": Fraction(448), "float8_e5m2": Fraction(57344)}


def _amax_arg(amax) -> Exact:
    v = F.f32(scalar_exact(amax))
    if v.negative and not v.is_nan and not v.is_zero:
        raise ValueError(f"amax: {v} is negative; an amax is max|x| >= 0")
    return v


class SampleAndHold:
    """Delayed scaling, sample-and-hold: a role's cached amax is refreshed from the
    current tensor's amax on its 1st, (D+1)th, (2D+1)th ... call and held in between.
    D = 1 is current scaling."""

    def __init__(self, delay: int = 50):
        self.delay = check_positive_int("D", delay)
        self._cache: dict = {}
        self._step: dict = {}

    def observe(self, role, amax) -> Exact:
        """Record this step's amax for ``role``; return the amax to scale with."""
        a = _amax_arg(amax)
        n = self._step.get(role, 0)
        if n % self.delay == 0 or role not in self._cache:
            self._cache[role] = a
        self._step[role] = n + 1
        return self._cache[role]

    def cached(self, role) -> Exact | None:
        return self._cache.get(role)

    def state_dict(self) -> dict:
        # caches deliberately excluded (not serialized into checkpoints)
        return {"kind": "sample_and_hold", "delay": self.delay}

    def load_state_dict(self, sd: dict) -> None:
        self.delay = check_positive_int("D", sd["delay"])
        self._cache.clear()
        self._step.clear()


class CurrentScaling(SampleAndHold):
    """D = 1: every call uses the current tensor's amax."""

    def __init__(self):
        super().__init__(1)

    def state_dict(self) -> dict:
        return {"kind": "current", "delay": 1}


class CalibratedFrozen:
    """Amax = running max over the first N calibration calls of a role, then fixed.
    During calibration the current amax is used (our choice)."""

    def __init__(self, n_calibration: int = 64):
        self.n = check_positive_int("N", n_calibration)
        self._max: dict = {}
        self._seen: dict = {}

    def observe(self, role, amax) -> Exact:
        a = _amax_arg(amax)
        k = self._seen.get(role, 0)
        if k < self.n:
            prev = self._max.get(role)
            self._max[role] = a if prev is None else F.tmax(prev, a)
            self._seen[role] = k + 1
            return a
        return self._max[role]

    def frozen(self, role) -> bool:
        return self._seen.get(role, 0) >= self.n

    def state_dict(self) -> dict:
        return {"kind": "calibrated_frozen", "n_calibration": self.n}

    def load_state_dict(self, sd: dict) -> None:
        self.n = check_positive_int("N", sd["n_calibration"])
        self._max.clear()
        self._seen.clear()


class TEDelayedScaling:
    """Transformer Engine FP8 delayed scaling (quantization._amax_and_scale_update):
    history of length L (slot 0 = the current step's amax), algorithm "max" or
    "most_recent", margin.  ``update`` computes the new scale from the history,
    then rolls it by one with the new slot 0 set to 0:
        sf = fl(fl(fp8_max / amax) / 2**margin); keep the previous scale when amax is
        not > 0 or not finite; an infinite sf becomes FLT_MAX."""

    def __init__(self, fmt: str = "float8_e4m3fn", history_len: int = 1024,
                 algo: str = "max", margin: int = 0):
        from ..errors import check_choice
        self.fmt = check_choice("fmt", fmt, FP8_MAX)
        self.history_len = check_positive_int("history_len", history_len)
        self.algo = check_choice("algo", algo, ("max", "most_recent"))
        if isinstance(margin, bool) or not isinstance(margin, int) or margin < 0:
            raise ValueError(f"margin: {margin!r} is not an integer >= 0")
        self.margin = margin
        self._hist: dict = {}
        self._scale: dict = {}

    def history(self, role) -> list[Exact]:
        return self._hist.setdefault(role, [F.ZERO] * self.history_len)

    def scale(self, role) -> Exact:
        return self._scale.get(role, F.ONE)

    def record(self, role, amax) -> None:
        self.history(role)[0] = _amax_arg(amax)

    def update(self, role) -> Exact:
        h = self.history(role)
        if self.algo == "max":
            amax = h[0]
            for v in h[1:]:
                amax = F.tmax(amax, v)
        else:
            amax = h[0]
        if len(h) > 1:
            h[:] = h[1:] + h[:1]
        h[0] = F.ZERO
        prev = self.scale(role)
        sf = F.div(F.div(exact(FP8_MAX[self.fmt]), amax), exact(Fraction(2) ** self.margin))
        if not F.lt(F.ZERO, amax):
            sf = prev
        if not amax.is_finite:
            sf = prev
        if sf.is_inf:
            sf = F.FLT_MAX
        self._scale[role] = sf
        return sf


def te_current_scale(amax, fmt: str = "float8_e4m3fn", *, pow2: bool = False,
                     variant: str = "kernel", eps=0, x_dtype_max=None) -> Exact:
    """FP8 current scaling.  variant "kernel" (SPEC 3.6): fp8_max / amax (RNE), amax 0,
    inf or NaN -> 1.0; pow2 truncates the mantissa.  variant "ref" (TE 2.20.2
    reference_current_scaling._scale_from_amax_tensor): amax = max(amax, eps); an
    infinite scale becomes ``x_dtype_max`` (the input dtype's max!); pow2 keeps the
    exponent and gives 0 for amax = inf; amax 0 -> 1; NaN stays NaN."""
    from ..errors import check_choice
    check_choice("variant", variant, ("kernel", "ref"))
    fmax = exact(FP8_MAX[check_choice("fmt", fmt, FP8_MAX)])
    a = F.f32(scalar_exact(amax))
    if variant == "kernel":
        if a.is_nan or a.is_inf or a.is_zero:
            return F.ONE
        s = F.div(fmax, a)
        if s.is_inf:
            s = F.FLT_MAX
        if pow2:
            s = F.from_bits(F.bits(s) & 0xFF800000)
        return s
    a = F.tmax(a, F.f32(exact(eps)))
    s = F.div(fmax, a)
    if s.is_inf and not s.negative:
        s = F.f32(exact(x_dtype_max if x_dtype_max is not None else F.F32.max_finite))
    if pow2:  # frexp/ldexp keep 2**(exponent-1); frexp(NaN), frexp(0), frexp(inf) -> 0.5
        if s.is_finite and s.mag != 0:
            s = F.from_bits(F.bits(s) & 0xFF800000)
        else:
            s = exact(Fraction(1, 2))
        if a.is_inf and not a.negative:
            s = F.ZERO
    if a.is_zero:
        s = F.ONE
    return s

