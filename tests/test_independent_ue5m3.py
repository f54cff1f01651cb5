"""Independent UE5M3 recipe (tests/independent/twolevel.py) vs reference.recipes.quantize(x,
'ue5m3'): element codes, UE5M3 scale codes and the FP32 decode scale, bit for bit."""
import math

from hypothesis import given, settings, strategies as st

import reference.recipes as R
from reference.rounding import Mode
from tests.independent import twolevel
from tests.independent.bridge import lists, rows
from tests.independent.formats import decode
from tests.independent.num import from_float, to_fraction

SPECIAL = [0.0, -0.0, 0.5, 0.25, 0.75, 1.25, 3.0, 5.0, 6.0, -6.0, 448.0, 61440.0, 1e-30, -2e-38,
           1.401298464324817e-45, 3.4028234663852886e38, 2.0 ** -17, 2.0 ** -18]
# cached amax values are FP32 tensor values: take float32-representable ones
F32_1E_3 = 0.0010000000474974513
elems = st.one_of(st.sampled_from(SPECIAL), st.floats(width=32, allow_nan=False, allow_infinity=False))


def check(x, tile, **kw):
    mine = twolevel.quantize(rows(x), tile=tile, **{k: v for k, v in kw.items() if k != "p_kw"})
    q = R.quantize(x, "ue5m3", tile=tile, **kw.get("p_kw", {}))
    assert mine[0] == lists(q.codes)
    assert mine[1] == lists(q.scale_codes)
    assert to_fraction(mine[2])[2] == q.tensor_scale[0][0].mag


@settings(max_examples=20)
@given(st.data(), st.sampled_from([(1, 16), (1, 32), (16, 16)]))
def test_current_scaling(data, tile):
    r = data.draw(st.sampled_from([1, 2]) if tile[0] == 1 else st.just(16))
    c = tile[1] * data.draw(st.sampled_from([1, 2]))
    x = [[data.draw(elems) for _ in range(c)] for _ in range(r)]
    check(x, tile)


@given(st.data(), st.sampled_from([448.0, 2048.0]),
       st.sampled_from([1.0, 3.0, 448.0, F32_1E_3, 0.0, 2.0 ** -20, 2.0 ** 100]))
def test_cached_amax_and_target(data, T, amax):
    x = [[data.draw(elems) for _ in range(16)] for _ in range(2)]
    check(x, (1, 16), target=T, amax=from_float(amax),
          p_kw={"target": T, "amax": amax})


@given(st.data())
def test_sr_dy(data):
    nb = 8
    x = [[data.draw(elems) for _ in range(16)] for _ in range(2)]
    rb = [[data.draw(st.integers(0, 255)) for _ in range(16)] for _ in range(2)]
    check(x, (1, 16), mode="sr", rbits=rb, nbits=nb, p_kw={"mode": Mode.SR, "rbits": rb, "nbits": nb})


def ue5m3_points():
    """Every positive finite UE5M3 value, its midpoint to the next, and a nudge each side."""
    vals = [decode(c, "ue5m3") for c in range(0, 31 * 8)]
    fl = [math.ldexp(v.m, v.e) for v in vals]
    pts = list(fl)
    for a, b in zip(fl, fl[1:]):
        mid = (a + b) / 2
        pts += [mid, math.nextafter(mid, 0), math.nextafter(mid, math.inf)]
    return pts + [61440.0 * 1.03, 61440.0 * 1.0625, 1e6]


def test_every_ue5m3_scale_and_tie():
    _sweep(ue5m3_points() + [2.0 ** -18 * 1.0000001])


@given(st.lists(st.sampled_from([math.inf, -math.inf, math.nan, 1.0, -0.0, 7.0]), min_size=16,
                max_size=16))
def test_nonfinite_elements_with_cached_amax(row):
    check([row], (1, 16), amax=from_float(4.0), p_kw={"amax": 4.0})


def _sweep(points):
    # amax_cached = T = 448 gives S_enc = 6 and fl(6 * fl(1/6)) = 1, so s = vec_max exactly:
    # the block scale code is the UE5M3 RNE code of vec_max (0 replaced by 1.0).
    for v in points:
        x = [[v] + [0.0] * 15]
        check(x, (1, 16), amax=from_float(448.0), p_kw={"amax": 448.0})
