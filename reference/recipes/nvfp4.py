"""NVFP4-style two-level scaling, exact (SPEC 3.1; UE5M3 reuses it, SPEC 3.3).

Every FP32 step of a profile is one exact operation rounded to float32 (RNE),
in the order the upstream code performs it.  A profile is a frozen
``TwoLevelRule``; ``quantize`` runs it on a 2D input.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from fractions import Fraction

from ..errors import check_choice
from ..exact import Exact, Kind, exact
from ..formats import get_format
from ..rounding import Mode, Policy, encode, parse_mode
from ..blocked import BlockScaled
from . import f32 as F
from .common import amax as _amax, as_matrix, check_target, scalar_exact, check_tile, matrix_of_ints, pad_matrix, transpose
from .elem import cast_elem, torch_fp8_code

__all__ = ["TwoLevelRule", "quantize", "rht16", "hadamard_matrix", "TE_RHT_SIGNS", "NVFP4_RULES"]

# Transformer Engine's fixed wgrad RHT signs (reference_nvfp4.get_wgrad_sign_vector).
TE_RHT_SIGNS = (1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1)


@dataclass(frozen=True)
class TwoLevelRule:
    """One exact two-level (per-tensor FP32 x per-block scale) FP4 rule.

    tensor_scale  "te": S_enc = fl(fl(T*6) / amax), min FLT_MAX, S_enc == 0 -> 1;
                  "torchao": decode scale pts = fl(amax / 2688) (or given);
                  "none": single level
    zero_amax     with "te": amax == 0 gives S_enc = 1 ("one", the CUDA kernel) or stays
                  FLT_MAX ("flt_max", TE's Python reference)
    block_scale   "te_mul": fl(vec_max * fl(S_enc * fl(1/6)));  "div_first" (TE 2025-09):
                  fl(fl(vec_max / 6) * S_enc);  "torchao": fl(fl(vec_max / 6) / pts);
                  "single": fl(vec_max / 6)
    scale_lo      lower clamp of the FP32 block scale before the cast (torchao: 2**-6)
    zero_scale_to_one  a block scale code of 0 is replaced by 1.0 (UE5M3 recipe)
    encode        "te": enc = min(fl(1 / fl(s * fl(1/S_enc))), FLT_MAX), q = fl(x * enc);
                  "torchao2": q = fl(x * fl(fl(1/pts) / s));  "torchao1": q = fl(x * fl(1/s));
                  "divide": q = fl(x / s) (a zero scale gives +0 data: our choice)
    pre_round     None, or "bfloat16": q rounded to bf16 (RNE) before the E2M1 cast
    elem_cast     "rne" (cvt.rn.satfinite: sign of zero kept), "te_ref" (TE's interval table:
                  -0 and NaN -> code 0), "torchao" (torchao bit trick)
    elem_nan      NaN element with elem_cast "rne": "max" (+6), "zero" (+0)
    four_over_six None, "mae" or "mse": per block, map-to-4 (scale x 1.5) or map-to-6 chosen by
                  error (ties: map-to-6), TE reference order of FP32 operations
    rht_columnwise  columnwise copies get RHT16 (bf16 output) before amax and quantization
    rht_accum     "exact": the exact sum rounded once to bf16 (SPEC 3.1).  TE's Python reference
                  computes the RHT as a bf16 torch matmul; on CPU (oneDNN) its FP32 accumulation
                  order depends on the GEMM shape (probed: different for 1..7 rows than for
                  thousands) and it flushes subnormals, so no fixed rule reproduces it where
                  partial sums round; where they are exact it equals "exact" (conformance cell)
    pad           "zero": pad rows/cols to the tile with +0 (TE); "raise": shapes must divide
    """
    scale_fmt: str = "ue4m3"
    target: Fraction = Fraction(448)
    tensor_scale: str = "te"
    zero_amax: str = "one"
    block_scale: str = "te_mul"
    scale_lo: Fraction | None = None
    zero_scale_to_one: bool = False
    encode: str = "te"
    pre_round: str | None = None
    elem_cast: str = "rne"
    elem_nan: str = "max"
    four_over_six: str | None = None
    rht_columnwise: bool = False
    rht_accum: str = "exact"
    pad: str = "zero"
    tiles: tuple = ((1, 16), (16, 16))


def hadamard_matrix(n: int) -> list[list[int]]:
    """Sylvester Hadamard matrix: H[i][j] = (-1)**popcount(i & j)."""
    if n < 1 or n & (n - 1):
        raise ValueError(f"n: {n!r} is not a power of two")
    return [[-1 if bin(i & j).count("1") & 1 else 1 for j in range(n)] for i in range(n)]


def _exact_sum(terms) -> Exact:
    """Exact sum with IEEE specials (NaN wins; inf + -inf -> NaN; zeros: +0 unless all -0)."""
    terms = list(terms)
    if any(t.is_nan for t in terms):
        return Exact(Kind.NAN, False)
    infs = {t.negative for t in terms if t.is_inf}
    if len(infs) == 2:
        return Exact(Kind.NAN, False)
    if infs:
        return Exact(Kind.INF, infs.pop())
    s = sum((t.to_fraction() for t in terms), Fraction(0))
    if s == 0:
        return F.NEG_ZERO if terms and all(t.negative for t in terms) else F.ZERO
    return exact(s)


def rht16(m: list[list[Exact]], signs=TE_RHT_SIGNS, accum: str = "exact") -> list[list[Exact]]:
    """RHT along rows in groups of 16: y = bf16( (x * signs) @ H16 / 4 ).

    (TE: x @ (diag(signs) @ H * 1/4), output in bf16.)  ``accum``: see TwoLevelRule."""
    check_choice("rht_accum", accum, ("exact",))
    n = len(signs)
    H = hadamard_matrix(n)
    scale = Fraction(1, 4) if n == 16 else None
    if scale is None:
        raise ValueError(f"signs: RHT16 needs 16 signs, got {n}")
    out = []
    for row in m:
        if len(row) % n:
            raise ValueError(f"x: inner dimension {len(row)} is not a multiple of the Hadamard "
                             f"size {n}")
        r = []
        for g in range(0, len(row), n):
            xs = row[g:g + n]
            for j in range(n):
                terms = []
                for i in range(n):
                    c = signs[i] * H[i][j]
                    t = xs[i] if c > 0 else -xs[i]
                    terms.append(t if not t.is_finite else Exact(Kind.FINITE, t.negative, t.mag * scale))
                r.append(F.bf16(_exact_sum(terms)))
        out.append(r)
    return out


def _scale_code(s: Exact, fmt: str) -> int:
    spec = get_format(fmt)
    if spec.name in ("float8_e4m3fn", "ue4m3"):
        c = torch_fp8_code(s, "float8_e4m3fn")
        if spec.name == "ue4m3":
            if c & 0x80:
                raise AssertionError("negative e4m3 block scale")  # cannot happen: s >= 0
        return c
    pol = Policy.make(overflow="satfinite", inf="saturate", nan="canonical")
    return encode(s, spec, Mode.RNE, pol).code


def quantize(x, rule: TwoLevelRule, *, profile: str = "", tile=(1, 16), amax=None,
             tensor_scale=None, target=None, mode=Mode.RNE, rbits=None, nbits=None,
             copy: str = "rowwise") -> BlockScaled:
    """Quantize a 2D input with a two-level rule.

    amax          override of the per-tensor amax (delayed / calibrated scaling); default
                  max|x| of the (transformed) operand
    tensor_scale  torchao: a given per-tensor decode scale (pts) instead of amax / 2688
    target        block-scale target T (UE5M3); default rule.target
    mode, rbits, nbits  element rounding; SR takes one random integer per element
    copy          "rowwise" (blocks along rows) or "columnwise" (of x.T, RHT if the rule says)
    """
    check_choice("copy", copy, ("rowwise", "columnwise"))
    bm, bk = check_tile(tile, rule.tiles)
    mode = parse_mode(mode)
    m = as_matrix(x)
    if copy == "columnwise":
        m = transpose(m)
        if rule.rht_columnwise:
            m = rht16(m, accum=rule.rht_accum)
    rows = len(m)
    cols = len(m[0]) if rows else 0
    if rule.pad == "raise" and (rows % bm or cols % bk):
        raise ValueError(f"x: shape {rows}x{cols} is not a multiple of the {bm}x{bk} block; "
                         f"profile {profile or rule} does not pad (valid: multiples of {bm}x{bk})")
    if mode is Mode.SR:
        if rbits is None or nbits is None:
            raise ValueError("rbits/nbits: mode SR needs explicit random bits per element")
        rb = matrix_of_ints(rbits, "rbits")
        if len(rb) != rows or any(len(r) != cols for r in rb):
            raise ValueError(f"rbits: shape must equal the quantized operand's {rows}x{cols}")
    elif rbits is not None:
        raise ValueError(f"rbits: random bits are only used by mode SR, not {mode.name}")
    T = F.f32(exact(check_target(rule.target if target is None else target)))  # an FP32 constant
    p = pad_matrix(m, bm, bk)
    pr, pc = len(p), (len(p[0]) if p else 0)
    meta = {}

    # --- per-tensor scale ------------------------------------------------------
    g_amax = F.f32(scalar_exact(amax)) if amax is not None else _amax(v for r in p for v in r)
    meta["amax"] = g_amax
    six = exact(6)
    ts = None
    if rule.tensor_scale == "te":
        s_enc = F.tmin(F.div(F.mul(T, six), g_amax), F.FLT_MAX)
        if F.is_zero(s_enc) or (rule.zero_amax == "one" and F.is_zero(g_amax)):
            s_enc = F.ONE
        dec = F.div(F.ONE, s_enc)
        meta["s_enc"] = s_enc
        ts = dec
    elif rule.tensor_scale == "torchao":
        pts = F.f32(scalar_exact(tensor_scale)) if tensor_scale is not None else \
            F.div(g_amax, F.const(448 * 6))
        ts = pts
    elif tensor_scale is not None:
        raise ValueError("tensor_scale: this profile has no per-tensor scale")

    nb_r, nb_c = pr // bm, pc // bk
    codes = [[0] * pc for _ in range(pr)]
    scodes = [[0] * nb_c for _ in range(nb_r)]
    sfmt = rule.scale_fmt
    sfmt_max = exact(get_format(sfmt).max_finite)
    if rule.four_over_six:
        _four_over_six(p, rule, bm, bk, g_amax, T, codes, scodes)
    else:
        inv6 = F.div(F.ONE, six)
        for br in range(nb_r):
            for bc in range(nb_c):
                blk = [(r, c) for r in range(br * bm, br * bm + bm) for c in range(bc * bk, bc * bk + bk)]
                vmax = _amax(p[r][c] for r, c in blk)
                if rule.block_scale == "te_mul":
                    s = F.mul(vmax, F.mul(meta["s_enc"], inv6))
                elif rule.block_scale == "div_first":
                    s = F.mul(F.div(vmax, six), meta["s_enc"])
                elif rule.block_scale == "torchao":
                    s = F.div(F.div(vmax, six), ts)
                else:
                    s = F.div(vmax, six)
                if rule.scale_lo is not None:
                    s = F.clamp(s, exact(rule.scale_lo), sfmt_max)
                else:
                    s = F.clamp(F.tmin(s, F.FLT_MAX), -sfmt_max, sfmt_max)
                sc = _scale_code(s, sfmt)
                sf = F.widen(sc, sfmt)
                if rule.zero_scale_to_one and sf.is_zero:
                    sc = get_format(sfmt).encode_magnitude(Fraction(1))
                    sf = F.ONE
                scodes[br][bc] = sc
                if rule.encode == "te":
                    mult = F.tmin(F.div(F.ONE, F.mul(sf, ts)), F.FLT_MAX)
                elif rule.encode == "torchao2":
                    mult = F.div(F.div(F.ONE, ts), sf)
                elif rule.encode == "torchao1":
                    mult = F.div(F.ONE, sf)
                else:
                    mult = None
                for r, c in blk:
                    v = p[r][c]
                    if mult is None:
                        q = F.ZERO if sf.is_zero else F.div(v, sf)
                    else:
                        q = F.mul(v, mult)
                    q = F.clamp(q, exact(-6), six)
                    if rule.pre_round == "bfloat16":
                        q = F.bf16(q)
                    kw = {}
                    if mode is Mode.SR and r < rows and c < cols:
                        kw = dict(rbits=rb[r][c], nbits=nbits)
                    emode = mode if (mode is not Mode.SR or kw) else Mode.RNE
                    codes[r][c] = cast_elem(q, "float4_e2m1fn", rule.elem_cast, emode,
                                            nan=rule.elem_nan, **kw)
    return BlockScaled(
        shape=(rows, cols), codes=tuple(tuple(r[:cols]) for r in codes[:rows]),
        elem_fmt="float4_e2m1fn", scale_codes=tuple(tuple(r) for r in scodes), scale_fmt=sfmt,
        block=(bm, bk), tensor_scale=((ts,),) if ts is not None else None, profile=profile,
        meta=meta)


def _four_over_six(p, rule, bm, bk, g_amax, T, codes, scodes):
    """TE 2.20.2 ``_quantize_blockwise_4over6_reference`` (non fast-math), op for op."""
    six = exact(6)
    e448 = exact(448)
    s_enc = F.tmin(F.div(F.mul(T, six), g_amax), F.FLT_MAX)
    if F.is_zero(s_enc):
        s_enc = F.ONE
    dec = F.div(F.ONE, s_enc)
    denom = F.mul(six, T)
    sfmt = get_format("float8_e4m3fn")
    pr, pc = len(p), len(p[0])
    errs = {}
    cand = {}
    for br in range(pr // bm):
        for bc in range(pc // bk):
            blk = [(r, c) for r in range(br * bm, br * bm + bm) for c in range(bc * bk, bc * bk + bk)]
            vmax = _amax(p[r][c] for r, c in blk)
            base = F.mul(F.div(vmax, six), s_enc)
            out = {}
            for name, s in (("4", F.mul(base, exact(Fraction(3, 2)))), ("6", base)):
                sc = torch_fp8_code(F.clamp(s, -e448, e448), "float8_e4m3fn")
                sf = F.widen(sc, sfmt)
                enc = F.tmin(F.div(F.ONE, F.mul(sf, dec)), F.FLT_MAX)
                q = {}
                for r, c in blk:
                    q[(r, c)] = cast_elem(F.clamp(F.mul(p[r][c], enc), exact(-6), six),
                                          "float4_e2m1fn", rule.elem_cast)
                out[name] = (sc, sf, q)
                # per-row error, summed over the 16 columns in order (FP32)
                for r in range(br * bm, br * bm + bm):
                    e = F.ZERO
                    for c in range(bc * bk, bc * bk + bk):
                        v = get_format("float4_e2m1fn").decode(q[(r, c)])
                        val = F.div(F.mul(F.mul(v, sf), g_amax), denom)
                        d = F.sub(val, p[r][c])
                        e = F.add(e, F.fabs(d) if rule.four_over_six == "mae" else F.mul(d, d))
                    errs[(name, r, bc)] = e
            cand[(br, bc)] = out
    for (br, bc), out in cand.items():
        def blockerr(name):
            rows_e = [errs[(name, r, bc)] for r in range(br * bm, br * bm + bm)]
            while len(rows_e) > 1:  # CUDA warp tree order: [0:h] + [h:2h]
                h = len(rows_e) // 2
                rows_e = [F.add(rows_e[i], rows_e[i + h]) for i in range(h)]
            return rows_e[0]
        pick4 = F.lt(blockerr("4"), blockerr("6"))
        sc, sf, q = out["4" if pick4 else "6"]
        scodes[br][bc] = sc
        for (r, c), code in q.items():
            codes[r][c] = code


_TE = TwoLevelRule()
NVFP4_RULES = {
    # CUDA kernel semantics as SPEC 3.1 states them (S_enc = 1 at amax 0; satfinite cvt).
    "te_nvfp4": _TE,
    # 2025-09 ordering: divide first.
    "te_nvfp4_2509": replace(_TE, block_scale="div_first"),
    # TE 2.20.2 Python reference: S_enc stays FLT_MAX at amax 0; cast_to_fp4x2 quirks.
    "te_nvfp4_ref": replace(_TE, zero_amax="flt_max", elem_cast="te_ref"),
    "te_nvfp4_ref_rht": replace(_TE, zero_amax="flt_max", elem_cast="te_ref", rht_columnwise=True),
    "te_nvfp4_rht": replace(_TE, rht_columnwise=True),
    "te_nvfp4_4over6": replace(_TE, zero_amax="flt_max", elem_cast="te_ref", four_over_six="mae",
                               target=Fraction(256)),
    "te_nvfp4_4over6_mse": replace(_TE, zero_amax="flt_max", elem_cast="te_ref",
                                   four_over_six="mse", target=Fraction(256)),
    "torchao_nvfp4": TwoLevelRule(scale_fmt="float8_e4m3fn", tensor_scale="torchao",
                                  block_scale="torchao", scale_lo=Fraction(1, 64),
                                  encode="torchao2", elem_cast="torchao", pad="raise",
                                  tiles=((1, 16),)),
    "torchao_nvfp4_1level": TwoLevelRule(scale_fmt="float8_e4m3fn", tensor_scale="none",
                                         block_scale="single", scale_lo=Fraction(1, 64),
                                         encode="torchao1", elem_cast="torchao", pad="raise",
                                         tiles=((1, 16),)),
    "pytorch_test_nvfp4": TwoLevelRule(tensor_scale="none", block_scale="single",
                                       encode="divide", pre_round="bfloat16",
                                       elem_cast="torchao", pad="raise", tiles=((1, 16),)),
}
