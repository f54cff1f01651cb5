"""NVFP4-style two-level scaling, exact (SPEC 3.1; UE5M3 reuses it, SPEC 3.3).

Every FP32 step of a profile is one exact operation rounded to float32 (RNE),
in the order the upstream code performs it.  A profile is a frozen
``TwoLevelRule``; ``quantize`` runs it on a 2D input.  Each rule variant is one
named function here: ``te_s_enc`` (the per-tensor S_enc), ``per_tensor_scale``,
``block_scale_f32`` (the block-scale order), ``block_scale_code`` (its cast),
``encode_factor`` (the element factor) and ``four_over_six``.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from fractions import Fraction

from ..exact import Exact, Kind, exact
from ..errors import check_choice
from ..formats import FORMATS, get_format
from ..rounding import Mode, Policy, encode, parse_mode
from ..blocked import BlockScaled
from . import f32 as F
from .common import amax as _amax, as_matrix, check_target, scalar_exact, check_tile, matrix_of_ints, pad_matrix, transpose
from .elem import cast_elem, torch_fp8_code
from .rules import (BlockScale, Copy, ElemCast, ElemNan, EncodeRule, FourOverSix, Pad, PreRound,
                    RhtAccum, TensorScale, ZeroAmax, check_flag, check_positive_fraction, choose,
                    unreachable)

__all__ = ["TwoLevelRule", "quantize", "rht16", "hadamard_matrix", "TE_RHT_SIGNS", "NVFP4_RULES",
           "exact_sum", "te_s_enc", "per_tensor_scale", "block_scale_f32", "block_scale_code",
           "encode_factor", "te_encode_factor", "TWO_LEVEL_ELEM_CASTS"]

# Transformer Engine's fixed wgrad RHT signs (reference_nvfp4.get_wgrad_sign_vector).
TE_RHT_SIGNS = (1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1)
E2M1 = "float4_e2m1fn"
SIX = exact(6)
INV6 = F.div(F.ONE, SIX)         # fl(1/6)
# the element casts a two-level rule may name (its elements are E2M1: no torch float8 cast)
TWO_LEVEL_ELEM_CASTS = (ElemCast.RNE, ElemCast.TE_REF, ElemCast.TORCHAO)


@dataclass(frozen=True)
class TwoLevelRule:
    """One exact two-level (per-tensor FP32 x per-block scale) FP4 rule.

    scale_fmt     the block scales' format (a FORMATS name)
    target        block-scale target T (finite > 0)
    tensor_scale  TensorScale.TE: S_enc = fl(fl(T*6) / amax), min FLT_MAX, S_enc == 0 -> 1;
                  TORCHAO: decode scale pts = fl(amax / 2688) (or given); NONE: single level
    zero_amax     with TE: amax == 0 gives S_enc = 1 (ONE, the CUDA kernel) or stays
                  FLT_MAX (FLT_MAX, TE's Python reference)
    block_scale   TE_MUL: fl(vec_max * fl(S_enc * fl(1/6)));  DIV_FIRST (TE 2025-09):
                  fl(fl(vec_max / 6) * S_enc);  TORCHAO: fl(fl(vec_max / 6) / pts);
                  SINGLE: fl(vec_max / 6)
    scale_lo      lower clamp of the FP32 block scale before the cast (torchao: 2**-6)
    zero_scale_to_one  a block scale code of 0 is replaced by 1.0 (UE5M3 recipe)
    encode        TE: enc = min(fl(1 / fl(s * fl(1/S_enc))), FLT_MAX), q = fl(x * enc);
                  TORCHAO2: q = fl(x * fl(fl(1/pts) / s));  TORCHAO1: q = fl(x * fl(1/s));
                  DIVIDE: q = fl(x / s) (a zero scale gives +0 data: our choice)
    pre_round     None, or PreRound.BFLOAT16: q rounded to bf16 (RNE) before the E2M1 cast
    elem_cast     RNE (cvt.rn.satfinite: sign of zero kept), TE_REF (TE's interval table:
                  -0 and NaN -> code 0), TORCHAO (torchao bit trick)
    elem_nan      NaN element with elem_cast RNE: MAX (+6), ZERO (+0)
    four_over_six None, MAE or MSE: per block, map-to-4 (scale x 1.5) or map-to-6 chosen by
                  error (ties: map-to-6), TE reference order of FP32 operations; it needs the
                  TE reference's other fields (checked: TE, FLT_MAX, DIV_FIRST, TE encode,
                  TE_REF elements, an e4m3 scale format)
    rht_columnwise  columnwise copies get RHT16 (bf16 output) before amax and quantization
    rht_accum     EXACT: the exact sum rounded once to bf16 (SPEC 3.1).  TE's Python reference
                  computes the RHT as a bf16 torch matmul; on CPU (oneDNN) its FP32 accumulation
                  order depends on the GEMM shape (probed: different for 1..7 rows than for
                  thousands) and it flushes subnormals, so no fixed rule reproduces it where
                  partial sums round; where they are exact it equals EXACT (conformance cell)
    pad           ZERO: pad rows/cols to the tile with +0 (TE); RAISE: shapes must divide
    tiles         the (rows, cols) block shapes the rule allows

    Every field is checked at construction (strings are taken for the enum fields).
    """
    scale_fmt: str = "ue4m3"
    target: Fraction = Fraction(448)
    tensor_scale: TensorScale = TensorScale.TE
    zero_amax: ZeroAmax = ZeroAmax.ONE
    block_scale: BlockScale = BlockScale.TE_MUL
    scale_lo: Fraction | None = None
    zero_scale_to_one: bool = False
    encode: EncodeRule = EncodeRule.TE
    pre_round: PreRound | None = None
    elem_cast: ElemCast = ElemCast.RNE
    elem_nan: ElemNan = ElemNan.MAX
    four_over_six: FourOverSix | None = None
    rht_columnwise: bool = False
    rht_accum: RhtAccum = RhtAccum.EXACT
    pad: Pad = Pad.ZERO
    tiles: tuple = ((1, 16), (16, 16))

    def __post_init__(self):
        put = lambda k, v: object.__setattr__(self, k, v)  # noqa: E731 (frozen)
        check_choice("scale_fmt", self.scale_fmt, FORMATS)
        put("target", check_target(self.target))
        put("tensor_scale", choose("tensor_scale", self.tensor_scale, TensorScale))
        put("zero_amax", choose("zero_amax", self.zero_amax, ZeroAmax))
        put("block_scale", choose("block_scale", self.block_scale, BlockScale))
        if self.scale_lo is not None:
            put("scale_lo", check_positive_fraction("scale_lo", self.scale_lo))
        check_flag("zero_scale_to_one", self.zero_scale_to_one)
        put("encode", choose("encode", self.encode, EncodeRule))
        put("pre_round", choose("pre_round", self.pre_round, PreRound, optional=True))
        put("elem_cast", choose("elem_cast", self.elem_cast, ElemCast, TWO_LEVEL_ELEM_CASTS))
        put("elem_nan", choose("elem_nan", self.elem_nan, ElemNan, (ElemNan.MAX, ElemNan.ZERO)))
        put("four_over_six", choose("four_over_six", self.four_over_six, FourOverSix,
                                    optional=True))
        check_flag("rht_columnwise", self.rht_columnwise)
        put("rht_accum", choose("rht_accum", self.rht_accum, RhtAccum))
        put("pad", choose("pad", self.pad, Pad))
        put("tiles", _check_tiles(self.tiles))
        _check_combination(self)


def _check_tiles(tiles) -> tuple:
    try:
        t = tuple((int(a), int(b)) for a, b in tiles)
    except (TypeError, ValueError):
        t = ()
    if not t or any(a < 1 or b < 1 for a, b in t):
        raise ValueError(f"tiles: {tiles!r} is not a non-empty tuple of (rows, cols) pairs >= 1")
    return t


def _needs(rule, why: str, **want) -> None:
    for k, v in want.items():
        have = getattr(rule, k)
        if have not in v:
            raise ValueError(f"{k}: {have!r} does not go with {why}; valid choices: "
                             + ", ".join(str(m) for m in v))


def _check_combination(rule: TwoLevelRule) -> None:
    """Fields that read a per-tensor scale need one; 4over6 computes TE's reference order."""
    S = TensorScale
    if rule.block_scale in (BlockScale.TE_MUL, BlockScale.DIV_FIRST):
        _needs(rule, f"block_scale {rule.block_scale} (it reads S_enc)", tensor_scale=(S.TE,))
    if rule.block_scale is BlockScale.TORCHAO or rule.encode in (EncodeRule.TE,
                                                                  EncodeRule.TORCHAO2):
        _needs(rule, f"block_scale {rule.block_scale} / encode {rule.encode} (they read the "
               "per-tensor scale)", tensor_scale=(S.TE, S.TORCHAO))
    if rule.four_over_six is not None:
        _needs(rule, f"four_over_six {rule.four_over_six} (TE's reference order)",
               tensor_scale=(S.TE,), zero_amax=(ZeroAmax.FLT_MAX,),
               block_scale=(BlockScale.DIV_FIRST,), encode=(EncodeRule.TE,),
               elem_cast=(ElemCast.TE_REF,), pre_round=(None,), scale_lo=(None,),
               zero_scale_to_one=(False,), scale_fmt=("ue4m3", "float8_e4m3fn"))


def hadamard_matrix(n: int) -> list[list[int]]:
    """Sylvester Hadamard matrix: H[i][j] = (-1)**popcount(i & j)."""
    if n < 1 or n & (n - 1):
        raise ValueError(f"n: {n!r} is not a power of two")
    return [[-1 if bin(i & j).count("1") & 1 else 1 for j in range(n)] for i in range(n)]


def exact_sum(terms) -> Exact:
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
    if choose("rht_accum", accum, RhtAccum) is not RhtAccum.EXACT:
        unreachable("rht_accum", accum)
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
                r.append(F.bf16(exact_sum(terms)))
        out.append(r)
    return out


# --- the rule, one function per variant ------------------------------------------------
def te_s_enc(T: Exact, amax: Exact, zero_amax: ZeroAmax) -> Exact:
    """The NVFP4 per-tensor encode scale (TensorScale.TE): S_enc = min(fl(fl(T*6) / amax),
    FLT_MAX), replaced by 1 where it is 0 and, with ZeroAmax.ONE, where amax is 0."""
    s_enc = F.tmin(F.div(F.mul(T, SIX), amax), F.FLT_MAX)
    if zero_amax is ZeroAmax.ONE:
        return F.ONE if F.is_zero(s_enc) or F.is_zero(amax) else s_enc
    if zero_amax is ZeroAmax.FLT_MAX:
        return F.ONE if F.is_zero(s_enc) else s_enc
    unreachable("zero_amax", zero_amax)


def per_tensor_scale(rule: TwoLevelRule, T: Exact, amax: Exact, given=None):
    """(ts, S_enc): the per-tensor scale the block scales and element factors read (TE:
    fl(1/S_enc); TORCHAO: pts = fl(amax / 2688), or ``given``; NONE: None) and S_enc (TE
    only, else None)."""
    kind = rule.tensor_scale
    if kind is TensorScale.TE:
        s_enc = te_s_enc(T, amax, rule.zero_amax)
        return F.div(F.ONE, s_enc), s_enc
    if kind is TensorScale.TORCHAO:
        pts = F.f32(scalar_exact(given)) if given is not None else F.div(amax, F.const(448 * 6))
        return pts, None
    if kind is TensorScale.NONE:
        if given is not None:
            raise ValueError("tensor_scale: this profile has no per-tensor scale")
        return None, None
    unreachable("tensor_scale", kind)


def block_scale_f32(order: BlockScale, vmax: Exact, s_enc, ts) -> Exact:
    """The NVFP4 block-scale rule: the FP32 scale of a block whose amax is vmax."""
    if order is BlockScale.TE_MUL:
        return F.mul(vmax, F.mul(s_enc, INV6))
    if order is BlockScale.DIV_FIRST:
        return F.mul(F.div(vmax, SIX), s_enc)
    if order is BlockScale.TORCHAO:
        return F.div(F.div(vmax, SIX), ts)
    if order is BlockScale.SINGLE:
        return F.div(vmax, SIX)
    unreachable("block_scale", order)


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


def block_scale_code(s: Exact, rule: TwoLevelRule) -> tuple[int, Exact]:
    """An FP32 block scale clamped (to [scale_lo, max], else to +-max after min FLT_MAX) and
    cast RNE to the rule's scale format: (code, value); a zero becomes 1.0 where the rule
    says so."""
    sfmt = rule.scale_fmt
    smax = exact(get_format(sfmt).max_finite)
    if rule.scale_lo is not None:
        s = F.clamp(s, exact(rule.scale_lo), smax)
    else:
        s = F.clamp(F.tmin(s, F.FLT_MAX), -smax, smax)
    sc = _scale_code(s, sfmt)
    sf = F.widen(sc, sfmt)
    if rule.zero_scale_to_one and sf.is_zero:
        return get_format(sfmt).encode_magnitude(Fraction(1)), F.ONE
    return sc, sf


def te_encode_factor(sf: Exact, dec: Exact) -> Exact:
    """EncodeRule.TE: enc = min(fl(1 / fl(s * dec)), FLT_MAX), dec = fl(1/S_enc)."""
    return F.tmin(F.div(F.ONE, F.mul(sf, dec)), F.FLT_MAX)


def encode_factor(enc: EncodeRule, sf: Exact, ts) -> Exact | None:
    """The factor q = fl(x * factor) of a block whose scale value is sf; None for DIVIDE
    (q = fl(x / sf))."""
    if enc is EncodeRule.TE:
        return te_encode_factor(sf, ts)
    if enc is EncodeRule.TORCHAO2:
        return F.div(F.div(F.ONE, ts), sf)
    if enc is EncodeRule.TORCHAO1:
        return F.div(F.ONE, sf)
    if enc is EncodeRule.DIVIDE:
        return None
    unreachable("encode", enc)


def _pre_round(q: Exact, pre: PreRound | None) -> Exact:
    if pre is None:
        return q
    if pre is PreRound.BFLOAT16:
        return F.bf16(q)
    unreachable("pre_round", pre)


# --- quantize ------------------------------------------------------------------------
def _operand(x, rule: TwoLevelRule, copy: Copy) -> list[list[Exact]]:
    """x as exact rows, blocks along them: x itself, or x.T (RHT16 first if the rule says)."""
    m = as_matrix(x)
    if copy is Copy.COLUMNWISE:
        m = transpose(m)
        if rule.rht_columnwise:
            m = rht16(m, accum=rule.rht_accum)
    return m


def _random_bits(mode: Mode, rbits, nbits, rows: int, cols: int):
    if mode is Mode.SR:
        if rbits is None or nbits is None:
            raise ValueError("rbits/nbits: mode SR needs explicit random bits per element")
        rb = matrix_of_ints(rbits, "rbits")
        if len(rb) != rows or any(len(r) != cols for r in rb):
            raise ValueError(f"rbits: shape must equal the quantized operand's {rows}x{cols}")
        return rb
    if rbits is not None:
        raise ValueError(f"rbits: random bits are only used by mode SR, not {mode.name}")
    return None


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
    copy = choose("copy", copy, Copy)
    bm, bk = check_tile(tile, rule.tiles)
    mode = parse_mode(mode)
    m = _operand(x, rule, copy)
    rows = len(m)
    cols = len(m[0]) if rows else 0
    if rule.pad is Pad.RAISE and (rows % bm or cols % bk):
        raise ValueError(f"x: shape {rows}x{cols} is not a multiple of the {bm}x{bk} block; "
                         f"profile {profile or rule} does not pad (valid: multiples of {bm}x{bk})")
    rb = _random_bits(mode, rbits, nbits, rows, cols)
    T = F.f32(exact(check_target(rule.target if target is None else target)))  # an FP32 constant
    p = pad_matrix(m, bm, bk)
    g_amax = F.f32(scalar_exact(amax)) if amax is not None else _amax(v for r in p for v in r)
    ts, s_enc = per_tensor_scale(rule, T, g_amax, tensor_scale)
    meta = {"amax": g_amax} if s_enc is None else {"amax": g_amax, "s_enc": s_enc}
    if rule.four_over_six is not None:
        codes, scodes = four_over_six(p, rule, bm, bk, g_amax, T, s_enc, ts)
    else:
        codes, scodes = _blocks(p, rule, (bm, bk), s_enc, ts, mode, rb, nbits, (rows, cols))
    return BlockScaled(
        shape=(rows, cols), codes=tuple(tuple(r[:cols]) for r in codes[:rows]),
        elem_fmt=E2M1, scale_codes=tuple(tuple(r) for r in scodes), scale_fmt=rule.scale_fmt,
        block=(bm, bk), tensor_scale=((ts,),) if ts is not None else None, profile=profile,
        meta=meta)


def _each_block(p, bm: int, bk: int):
    """(zeroed codes, zeroed scale codes) of the padded operand p, and its blocks in order as
    (block row, block col, cells, block amax)."""
    pr, pc = len(p), (len(p[0]) if p else 0)
    codes = [[0] * pc for _ in range(pr)]
    scodes = [[0] * (pc // bk) for _ in range(pr // bm)]

    def blocks():
        for br in range(pr // bm):
            for bc in range(pc // bk):
                blk = [(r, c) for r in range(br * bm, br * bm + bm)
                       for c in range(bc * bk, bc * bk + bk)]
                yield br, bc, blk, _amax(p[r][c] for r, c in blk)
    return codes, scodes, blocks()


def _blocks(p, rule, tile, s_enc, ts, mode, rb, nbits, shape):
    """Codes and scale codes of the padded operand p, block by block.  SR takes the random
    bits of in-shape elements; padding elements round RNE."""
    (bm, bk), (rows, cols) = tile, shape
    codes, scodes, blocks = _each_block(p, bm, bk)
    for br, bc, blk, vmax in blocks:
        sc, sf = block_scale_code(block_scale_f32(rule.block_scale, vmax, s_enc, ts), rule)
        scodes[br][bc] = sc
        mult = encode_factor(rule.encode, sf, ts)
        for r, c in blk:
            v = p[r][c]
            if mult is None:
                q = F.ZERO if sf.is_zero else F.div(v, sf)
            else:
                q = F.mul(v, mult)
            q = _pre_round(F.clamp(q, exact(-6), SIX), rule.pre_round)
            kw = {}
            if mode is Mode.SR and r < rows and c < cols:
                kw = dict(rbits=rb[r][c], nbits=nbits)
            emode = mode if (mode is not Mode.SR or kw) else Mode.RNE
            codes[r][c] = cast_elem(q, E2M1, rule.elem_cast, emode, nan=rule.elem_nan, **kw)
    return codes, scodes


def four_over_six(p, rule, bm, bk, g_amax, T, s_enc, dec):
    """TE 2.20.2 ``_quantize_blockwise_4over6_reference`` (non fast-math), op for op: per
    block the map-to-4 (scale x 1.5) and map-to-6 candidates; map-to-4 iff its error is
    smaller.  (Element rounding is RNE whatever the mode, as TE's reference.)"""
    denom = F.mul(SIX, T)
    codes, scodes, blocks = _each_block(p, bm, bk)
    for br, bc, blk, vmax in blocks:
        base = block_scale_f32(rule.block_scale, vmax, s_enc, dec)
        cand4 = _four_six_candidate(p, blk, F.mul(base, exact(Fraction(3, 2))), rule, dec,
                                    g_amax, denom, bm, bk)
        cand6 = _four_six_candidate(p, blk, base, rule, dec, g_amax, denom, bm, bk)
        sc, q, _ = cand4 if F.lt(cand4[2], cand6[2]) else cand6
        scodes[br][bc] = sc
        for (r, c), code in q.items():
            codes[r][c] = code
    return codes, scodes


def _four_six_candidate(p, blk, s, rule, dec, g_amax, denom, bm, bk):
    """(scale code, {cell: code}, block error) of one candidate scale s: per row the FP32
    sum over the 16 columns in order, then the rows' CUDA warp tree ([0:h] + [h:2h])."""
    e448 = exact(448)
    sc = torch_fp8_code(F.clamp(s, -e448, e448), "float8_e4m3fn")
    sf = F.widen(sc, get_format("float8_e4m3fn"))
    enc = te_encode_factor(sf, dec)
    q = {(r, c): cast_elem(F.clamp(F.mul(p[r][c], enc), exact(-6), SIX), E2M1, rule.elem_cast)
         for r, c in blk}
    e2m1 = get_format(E2M1)
    rows_e = []
    for r in range(blk[0][0], blk[0][0] + bm):
        e = F.ZERO
        for c in range(blk[0][1], blk[0][1] + bk):
            val = F.div(F.mul(F.mul(e2m1.decode(q[(r, c)]), sf), g_amax), denom)
            d = F.sub(val, p[r][c])
            e = F.add(e, _four_six_error(d, rule.four_over_six))
        rows_e.append(e)
    while len(rows_e) > 1:
        h = len(rows_e) // 2
        rows_e = [F.add(rows_e[i], rows_e[i + h]) for i in range(h)]
    return sc, q, rows_e[0]


def _four_six_error(d: Exact, kind: FourOverSix) -> Exact:
    if kind is FourOverSix.MAE:
        return F.fabs(d)
    if kind is FourOverSix.MSE:
        return F.mul(d, d)
    unreachable("four_over_six", kind)


_TE = TwoLevelRule()
_TE_REF = replace(_TE, zero_amax=ZeroAmax.FLT_MAX, elem_cast=ElemCast.TE_REF)
_TORCHAO = TwoLevelRule(scale_fmt="float8_e4m3fn", scale_lo=Fraction(1, 64),
                        elem_cast=ElemCast.TORCHAO, pad=Pad.RAISE, tiles=((1, 16),),
                        tensor_scale=TensorScale.TORCHAO, block_scale=BlockScale.TORCHAO,
                        encode=EncodeRule.TORCHAO2)
NVFP4_RULES = {
    # CUDA kernel semantics as SPEC 3.1 states them (S_enc = 1 at amax 0; satfinite cvt).
    "te_nvfp4": _TE,
    # 2025-09 ordering: divide first.
    "te_nvfp4_2509": replace(_TE, block_scale=BlockScale.DIV_FIRST),
    # TE 2.20.2 Python reference: S_enc stays FLT_MAX at amax 0; cast_to_fp4x2 quirks.
    "te_nvfp4_ref": _TE_REF,
    "te_nvfp4_ref_rht": replace(_TE_REF, rht_columnwise=True),
    "te_nvfp4_rht": replace(_TE, rht_columnwise=True),
    # TE 2.20.2 4over6 (e4m3 max 256 as the target; base scale divides first)
    "te_nvfp4_4over6": replace(_TE_REF, four_over_six=FourOverSix.MAE, target=Fraction(256),
                               block_scale=BlockScale.DIV_FIRST),
    "te_nvfp4_4over6_mse": replace(_TE_REF, four_over_six=FourOverSix.MSE, target=Fraction(256),
                                   block_scale=BlockScale.DIV_FIRST),
    "torchao_nvfp4": _TORCHAO,
    "torchao_nvfp4_1level": replace(_TORCHAO, tensor_scale=TensorScale.NONE,
                                    block_scale=BlockScale.SINGLE, encode=EncodeRule.TORCHAO1),
    "pytorch_test_nvfp4": TwoLevelRule(tensor_scale=TensorScale.NONE,
                                       block_scale=BlockScale.SINGLE, encode=EncodeRule.DIVIDE,
                                       pre_round=PreRound.BFLOAT16, elem_cast=ElemCast.TORCHAO,
                                       pad=Pad.RAISE, tiles=((1, 16),)),
}
