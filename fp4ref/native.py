"""The native GEMM at any shape: a schedule table and ``emulate_native``.

Libraries pick their kernel (and split-K) by shape, so one model per device is not enough:
``ScheduleTable`` records, per environment (device name, torch / CUDA / cuBLAS versions,
driver, SM count, CUBLAS_WORKSPACE_CONFIG, torch's BLAS backend) and shape (M, N, K), the
model that shape runs (a ``ShapeSchedule``, found by ``probes.explain``).
``emulate_native(device, a, b, ...)`` looks the shape up and runs ``fp4ref.gemm.emulate``
with that model; at an unknown shape it probes (when the device object is present and a
prober is registered: importing ``probes`` registers one) or says plainly that the shape is
unknown.  This layer never imports ``probes``: the prober is handed in.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from reference.gemm import GemmModel
from reference.notation import from_dict, short, to_dict
from reference.schedule import SplitReduce

__all__ = ["interleaved", "chunked", "KWIDTH4_ORDER", "gather_k", "KLayout", "residue_first", "segment_k_raster",
           "segment_k_split", "segmented",
           "TileSchedule", "tile_select", "schedule_parts", "run_schedule", "emulate_schedule", "ShapeSchedule", "ScheduleTable", "SOURCES", "TABLE_SCHEMA", "environment_key", "env_slug",
           "emulate_native", "register_shape_prober", "shape_prober", "alpha_factors", "cublaslt_library",
           "DEFAULT_TABLE"]

SOURCES = ("probe", "table", "heuristic")
TABLE_SCHEMA = "fp4ref.schedule_table/1"


def _shape(shape) -> tuple:
    try:
        t = tuple(int(x) for x in shape)
    except (TypeError, ValueError):
        t = ()
    if len(t) != 3 or min(t) < 1 or any(isinstance(x, bool) for x in shape):
        raise ValueError(f"shape: expected (M, N, K), three integers >= 1, got {shape!r}")
    return t


def residue_first(K: int, k_tile: int, split_k: int = 1, split_align: int = 1):
    """(index, slice lengths) of a kernel that cuts K into ``split_k`` slices (each but the
    last ceil(K / split_k) rounded up to ``split_align``) and reads each slice in k-tiles of
    ``k_tile`` with the partial tile FIRST, zero-filled to a whole tile (CUTLASS 2.x
    kernels at unaligned K: the residue is loaded in the first iteration).  index[j] is the k
    of padded position j, -1 where the kernel multiplies a zero fill; the family model then
    runs on operands gathered by that index, slices of the returned (padded) lengths."""
    import numpy as np
    from reference.schedule import split_bounds
    bounds = split_bounds(K, split_k, split_align) if K else [(0, 0)]
    parts, lens = [], []
    for lo, hi in bounds:
        r = (hi - lo) % k_tile
        if r:  # the partial tile leads, zero-filled to a whole tile
            parts += [np.arange(lo, lo + r), np.full(k_tile - r, -1), np.arange(lo + r, hi)]
        else:
            parts.append(np.arange(lo, hi))
        lens.append(hi - lo + (k_tile - r if r else 0))
    return np.concatenate(parts).astype(np.int64), lens


def interleaved(K: int, k_tile: int, split_k: int = 1):
    """(index, slice lengths) of a kernel that deals K round robin: k-tiles of ``k_tile``
    (the partial one LAST), slice s holding tiles s, s + split_k, s + 2 split_k, ...
    (cuBLAS's sm80_xmma FFMA kernels with split-K), each slice zero-filled (-1) to the
    longest slice's length; the slices' results are added in slice order."""
    import numpy as np
    starts = np.arange(0, K, k_tile)
    slices = [np.concatenate([np.arange(t, min(t + k_tile, K)) for t in starts[s::split_k]] or
                             [np.zeros(0, np.int64)]) for s in range(split_k)]
    L = max(len(x) for x in slices)
    index = np.concatenate([np.concatenate([x, np.full(L - len(x), -1)]) for x in slices])
    return index.astype(np.int64), [L] * split_k


def gather_k(x, index, axis: int):
    """``x`` (numpy array or torch tensor) taken at ``index`` along ``axis`` (K), +0 where
    index is -1: the operands a K order's zero fill gives the hardware."""
    import numpy as np
    keep, zero = np.maximum(index, 0), index < 0
    shape = (1, -1) if axis == 1 else (-1, 1)
    if isinstance(x, np.ndarray):
        return np.where(zero.reshape(shape), np.zeros((), x.dtype), np.take(x, keep, axis=axis))
    import torch
    y = torch.index_select(x, axis, torch.as_tensor(keep, device=x.device))
    z = torch.as_tensor(zero, device=x.device).reshape(shape)
    return torch.where(z, torch.zeros((), dtype=x.dtype, device=x.device), y)


def chunked(K: int, order) -> tuple:
    """(index, [length]): K zero-filled at its END to whole chunks of len(order) products, each
    chunk read in ``order`` (positions within the chunk).  Triton's masked K loop feeding
    mma.sync m16n8k16 from 8-bit operands upcast to f16 (kWidth 4): per 32 k, the first
    instruction takes k mod 4 in {0, 1}, the second k mod 4 in {2, 3} (``KWIDTH4_ORDER``)."""
    import numpy as np
    L = len(order)
    Kp = -(-K // L) * L
    index = np.arange(Kp, dtype=np.int64).reshape(-1, L)[:, list(order)].reshape(-1)
    index[index >= K] = -1
    return index, [Kp]


KWIDTH4_ORDER = tuple(k for half in (0, 1) for k in range(32) if (k % 4) // 2 == half)


@dataclass(frozen=True)
class KLayout:
    """How a kernel orders K: k-tiles of ``k_tile`` in ``split_k`` slices, either contiguous
    slices rounded up to ``split_align`` with the partial tile first (``residue_first``:
    CUTLASS 2.x), with ``interleave`` tiles dealt round robin (``interleaved``: cuBLAS
    sm80_xmma FFMA), or with ``chunk`` (the order within each k_tile = len(chunk) products)
    one slice read chunk by chunk, zero-filled at the end (``chunked``: Triton's MMAv2
    operand layout), or with ``segments`` cut into ``split_k`` runs of whole k-tiles, the
    longer ones last (``segmented``: cuBLAS sm_90 segment-K).  ``pad(a, b)`` gives the operands the schedule's model runs on (zero
    products are neutral in every fused step, and the hardware multiplies the same zero
    fill, -0 sums included)."""
    k_tile: int
    split_k: int = 1
    split_align: int = 1
    interleave: bool = False
    chunk: tuple = ()
    segments: bool = False

    def __post_init__(self):
        object.__setattr__(self, "chunk", tuple(int(x) for x in self.chunk))
        if self.segments and (self.chunk or self.interleave):
            raise ValueError("KLayout.segments: invalid value True with chunk or interleave; valid choices: "
                             "segments alone")
        if self.chunk and (sorted(self.chunk) != list(range(self.k_tile)) or self.split_k != 1 or self.interleave):
            raise ValueError(f"KLayout.chunk: invalid value {self.chunk!r}; valid choices: a permutation of "
                             f"range(k_tile={self.k_tile}), with split_k 1 and no interleave")

    def index(self, K: int):
        """(index, slice lengths): the padded product order at length K (-1: zero fill)."""
        if self.chunk:
            return chunked(K, self.chunk)
        if self.interleave:
            return interleaved(K, self.k_tile, self.split_k)
        if self.segments:
            return segmented(K, self.k_tile, self.split_k)
        return residue_first(K, self.k_tile, self.split_k, self.split_align)

    def pad(self, a, b):
        """(a', b'): ``a`` [.., K] and ``b`` [K, ..] (tensors) with the zero fill inserted."""
        index, _ = self.index(int(a.shape[1]))
        import numpy as np
        if len(index) == a.shape[1] and np.array_equal(index, np.arange(len(index))):
            return a, b  # K as given
        return gather_k(a, index, 1), gather_k(b, index, 0)

    def model(self, base: GemmModel, K: int) -> GemmModel:
        """``base`` with the padded slices of a length-K dot as its split-K schedule."""
        _, lens = self.index(K)
        if len(lens) == 1:
            return base.replace(split_k=1, split_tile=None)
        return base.replace(split_k=len(lens), split_tile=lens[0])

    def to_dict(self) -> dict:
        d = {"k_tile": self.k_tile, "split_k": self.split_k, "split_align": self.split_align}
        if self.interleave:
            d["interleave"] = True
        if self.chunk:
            d["chunk"] = list(self.chunk)
        if self.segments:
            d["segments"] = True
        return d


def segment_k_raster(tiles_m: int, tiles_n: int) -> "np.ndarray":
    """int [tiles_m, tiles_n]: the launch order of a cuBLAS sm_90 segment-K kernel's output
    tiles (m', n' in cuBLAS's column-major C^T): pairs of m' (pair g = m' // 2, the last one
    tile wide when tiles_m is odd), n' rising for even g and falling for odd g."""
    import numpy as np
    m = np.arange(tiles_m)[:, None]
    n = np.arange(tiles_n)[None, :]
    g = m // 2
    width = np.minimum(2, tiles_m - 2 * g)
    along = np.where(g % 2 == 0, n, tiles_n - 1 - n)
    return g * 2 * tiles_n + along * width + (m % 2)


def segment_k_split(tiles_m: int, tiles_n: int, sms: int) -> tuple:
    """(bool [tiles_m, tiles_n], s): the tiles a cuBLAS sm_90 segment-K kernel cuts into s K
    segments, so that its last partial wave fills the SMs (H200 dumps, 132 SMs,
    scripts/fit_segment_k.py: 12963 of 12963 outputs but one shape).  T = tiles_m * tiles_n:
    2 T <= sms: every tile, s = sms // T; T <= sms: the last tile in launch order, s = (sms - T)
    // 4 (seen once: T = 72, s = 15); T > sms: the last r = T mod sms tiles, s = sms // r, when
    2 r <= sms.  Not this rule: 2500x1900x9000 (T = 150, r = 18 ran 24 tiles in 4)."""
    import numpy as np
    T = tiles_m * tiles_n
    order = segment_k_raster(tiles_m, tiles_n)
    if 2 * T <= sms:
        return np.ones((tiles_m, tiles_n), dtype=bool), sms // T
    if T <= sms:
        return order == T - 1, max(1, (sms - T) // 4)
    r = T % sms
    if r == 0 or 2 * r > sms:
        return np.zeros((tiles_m, tiles_n), dtype=bool), 1
    return order >= T - r, sms // r


def segmented(K: int, block: int, s: int) -> tuple:
    """(index, [length] * s): K in ceil(K / block) blocks cut into s segments of whole blocks,
    the last n mod s segments one block longer; each shorter segment zero-filled at its end to
    the longer length, so that the family's split (split_tile = that length) reproduces them."""
    import numpy as np
    n = -(-K // block)
    if not 1 <= s <= max(n, 1):
        raise ValueError(f"s: invalid value {s!r}; valid choices: 1 .. {max(n, 1)} segments of {block}")
    base, rem = divmod(n, s)
    units = np.cumsum([0] + [base] * (s - rem) + [base + 1] * rem)
    L = (base + (rem > 0)) * block
    parts = []
    for j in range(s):
        lo, hi = int(units[j]) * block, min(int(units[j + 1]) * block, K)
        parts.append(np.arange(lo, hi, dtype=np.int64))
        if j < s - 1:
            parts.append(np.full(L - (hi - lo), -1, dtype=np.int64))
    return np.concatenate(parts), [L] * (s - 1) + [K - int(units[s - 1]) * block]


@dataclass(frozen=True)
class TileSchedule:
    """Output tiles that run another schedule than the shape's: a cuBLAS sm_90 segment-K
    kernel (tiles of ``tile_cols`` torch columns x ``tile_rows`` torch rows: cuBLAS computes
    the column-major C^T) cuts some tiles' K into segments of ``block`` (``segment_k_split``
    over ``sms`` SMs), each segment reduced as ``model`` and their results added pairwise."""
    tile_rows: int
    tile_cols: int
    sms: int
    block: int
    model: GemmModel

    def __post_init__(self):
        for name in ("tile_rows", "tile_cols", "sms", "block"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"TileSchedule.{name}: invalid value {v!r}; valid choices: an int >= 1")
        if not isinstance(self.model, GemmModel):
            raise TypeError(f"TileSchedule.model: expected a reference.gemm.GemmModel, got {type(self.model).__name__}")

    def split(self, M: int, N: int, K: int) -> tuple:
        """(bool [ceil(M / tile_rows), ceil(N / tile_cols)] over torch's tile grid, s)."""
        tail, s = segment_k_split(-(-N // self.tile_cols), -(-M // self.tile_rows), self.sms)
        s = min(s, max(1, -(-K // self.block)))
        return tail.T, s

    def active(self, M: int, N: int, K: int) -> bool:
        """Whether any tile of an M x N x K result runs in more than one segment."""
        tail, s = self.split(M, N, K)
        return s > 1 and bool(tail.any())

    def alt(self, K: int, s: int) -> tuple:
        """(KLayout or None, model) of a tile cut into s segments at length K."""
        if s == 1:
            return None, self.model
        lay = KLayout(self.block, s, 1, segments=True)
        return lay, lay.model(self.model, K).replace(split_reduce=SplitReduce.PAIRWISE)

    def to_dict(self) -> dict:
        return {"tile_rows": self.tile_rows, "tile_cols": self.tile_cols, "sms": self.sms,
                "block": self.block, "model": short(self.model)}

    @classmethod
    def from_dict(cls, d: dict) -> "TileSchedule":
        from reference.notation import parse_short
        return cls(int(d["tile_rows"]), int(d["tile_cols"]), int(d["sms"]), int(d["block"]),
                   parse_short(d["model"]))


@dataclass(frozen=True)
class ShapeSchedule:
    """What a device's GEMM runs at one shape: ``model`` (its split-K and group size
    included), the profiler's kernel names and their ``family``, where the answer came from
    (``source``: probe, table or heuristic) and its evidence (``matches`` of
    ``checked_outputs`` sampled outputs bit-exact).  ``env``: the environment key."""
    device: str
    shape: tuple
    model: GemmModel
    kernels: tuple = ()
    family: str = ""
    source: str = "probe"
    checked_outputs: int = 0
    matches: int = 0
    wall_s: float = 0.0
    block: int | None = None
    env: dict = field(default_factory=dict, compare=False, hash=False)
    layout: KLayout | None = None   # None: the model runs on the operands as given
    predicted_split: int | None = None  # the library heuristic's split-K count, where read
    tiles: TileSchedule | None = None   # output tiles that run another model (segment-K)

    def __post_init__(self):
        object.__setattr__(self, "shape", _shape(self.shape))
        object.__setattr__(self, "kernels", tuple(self.kernels))
        if self.source not in SOURCES:
            raise ValueError(f"source: unknown value {self.source!r}; valid choices: {', '.join(SOURCES)}")
        if not isinstance(self.model, GemmModel):
            raise TypeError(f"model: expected a reference.gemm.GemmModel, got {type(self.model).__name__}")

    @property
    def exact(self) -> bool:
        """Every checked output bit-exact (and at least one checked)."""
        return self.checked_outputs > 0 and self.matches == self.checked_outputs

    def to_dict(self) -> dict:
        return {"device": self.device, "shape": list(self.shape), "model": to_dict(self.model),
                "short": short(self.model), "kernels": list(self.kernels), "family": self.family,
                "source": self.source, "checked_outputs": int(self.checked_outputs),
                "matches": int(self.matches), "wall_s": round(float(self.wall_s), 4),
                "block": self.block, "env": dict(self.env),
                "layout": None if self.layout is None else self.layout.to_dict(),
                "predicted_split": self.predicted_split,
                **({} if self.tiles is None else {"tiles": self.tiles.to_dict()})}

    @classmethod
    def from_dict(cls, d: dict) -> "ShapeSchedule":
        return cls(d["device"], tuple(d["shape"]), from_dict(d["model"]), tuple(d.get("kernels", ())),
                   d.get("family", ""), d.get("source", "probe"), int(d.get("checked_outputs", 0)),
                   int(d.get("matches", 0)), float(d.get("wall_s", 0.0)), d.get("block"),
                   dict(d.get("env") or {}), KLayout(**d["layout"]) if d.get("layout") else None,
                   d.get("predicted_split"), TileSchedule.from_dict(d["tiles"]) if d.get("tiles") else None)

    def replace(self, **kw) -> "ShapeSchedule":
        from dataclasses import replace
        return replace(self, **kw)


def cublaslt_library():
    """The cuBLASLt library torch uses (ctypes.CDLL), or None.  By soname first (torch has
    loaded it: the same copy comes back), then from the nvidia-cublas wheel's folder."""
    import ctypes
    import torch  # noqa: F401  (loads torch's own libcublasLt first)
    names = ["libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so.11", "libcublasLt.so"]
    try:
        import nvidia.cublas as nc  # the pip wheel torch depends on, where present
        names += [os.path.join(p, "lib", n) for p in nc.__path__ for n in names[:3]]
    except ImportError:
        pass
    for lib in names:
        try:
            return ctypes.CDLL(lib)
        except OSError:
            continue
    return None


def _cublas_version():
    """cuBLASLt's runtime version, or None where it cannot be loaded."""
    import ctypes
    lib = cublaslt_library()
    if lib is None or not hasattr(lib, "cublasLtGetVersion"):
        return None
    lib.cublasLtGetVersion.restype = ctypes.c_size_t
    return int(lib.cublasLtGetVersion())


def _driver_version():
    import ctypes
    try:
        cu = ctypes.CDLL("libcuda.so.1")
        v = ctypes.c_int(0)
        return int(v.value) if cu.cuDriverGetVersion(ctypes.byref(v)) == 0 else None
    except (OSError, AttributeError):
        return None


def environment_key(device_name: str) -> dict:
    """Everything a library's kernel choice may depend on, besides the shape."""
    import torch
    key = {"device": str(device_name), "torch": torch.__version__, "cuda": torch.version.cuda,
           "cublas": None, "driver": None, "gpu": None, "sm_count": None,
           "workspace": os.environ.get("CUBLAS_WORKSPACE_CONFIG"), "blas_backend": None}
    if torch.cuda.is_available() and str(device_name).startswith("cuda"):
        p = torch.cuda.get_device_properties(0)
        key.update(gpu=p.name, sm_count=int(p.multi_processor_count), cublas=_cublas_version(),
                   driver=_driver_version())
        try:
            key["blas_backend"] = str(torch.backends.cuda.preferred_blas_library())
        except Exception:  # older torch: no such setting, the default (cuBLAS) applies
            key["blas_backend"] = None
    return key


def env_slug(key: dict) -> str:
    """A file name for a key: the device name and a short hash of the whole key."""
    h = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:10]
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", str(key.get("device", "device"))) + "-" + h


def _canon(key: dict) -> str:
    return json.dumps(key, sort_keys=True)


class ScheduleTable:
    """(environment key, shape) -> ShapeSchedule; JSON on disk (``load``/``save``, atomic)."""

    def __init__(self, entries=()):
        self._by: dict = {}
        for e in entries:
            self.add(e)

    def __len__(self) -> int:
        return len(self._by)

    def entries(self) -> list:
        return list(self._by.values())

    def add(self, entry: ShapeSchedule) -> ShapeSchedule:
        """Record ``entry`` under its own env key (or ``{"device": name}`` when it has none)."""
        if not isinstance(entry, ShapeSchedule):
            raise TypeError(f"entry: expected a ShapeSchedule, got {type(entry).__name__}")
        env = entry.env or {"device": entry.device}
        self._by[(_canon(env), entry.shape)] = entry.replace(env=dict(env))
        return entry

    def lookup(self, key, shape) -> ShapeSchedule | None:
        """The entry for ``shape`` under ``key``: a full environment key (dict), or a device
        name (str: any environment of that device; ValueError if two disagree)."""
        shape = _shape(shape)
        if isinstance(key, dict):
            return self._by.get((_canon(key), shape))
        if not isinstance(key, str):
            raise TypeError(f"key: expected an environment key (dict) or a device name (str), "
                            f"got {type(key).__name__}")
        hits = [e for (k, s), e in self._by.items() if s == shape and e.device == key]
        if len({short(e.model) for e in hits}) > 1:
            raise ValueError(f"key: device {key!r} has {len(hits)} environments recording shape {shape} "
                             f"with different models; pass the full environment key (environment_key)")
        return hits[0] if hits else None

    def shapes(self, device: str) -> list:
        return sorted({s for (_, s), e in self._by.items() if e.device == device})

    def models(self, device: str) -> list:
        """The distinct models recorded for ``device``, most shapes first."""
        count: dict = {}
        for e in self._by.values():
            if e.device == device:
                count[e.model] = count.get(e.model, 0) + 1
        return sorted(count, key=lambda m: -count[m])

    def to_dict(self) -> dict:
        envs: dict = {}
        for (k, _), e in sorted(self._by.items(), key=lambda kv: (kv[0][0], kv[0][1])):
            envs.setdefault(k, []).append({**e.to_dict(), "env": None})
        return {"schema": TABLE_SCHEMA,
                "environments": [{"key": json.loads(k), "shapes": v} for k, v in envs.items()]}

    @classmethod
    def from_dict(cls, d: dict) -> "ScheduleTable":
        if not isinstance(d, dict) or d.get("schema") != TABLE_SCHEMA:
            raise ValueError(f"schedule table: expected schema {TABLE_SCHEMA!r}, "
                             f"got {d.get('schema') if isinstance(d, dict) else type(d).__name__!r}")
        t = cls()
        for env in d["environments"]:
            for e in env["shapes"]:
                t.add(ShapeSchedule.from_dict({**e, "env": env["key"]}))
        return t

    @classmethod
    def load(cls, path) -> "ScheduleTable":
        """The table in ``path``; an empty table when the file does not exist."""
        p = Path(path)
        if not p.exists():
            return cls()
        try:
            d = json.loads(p.read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"path: {p} is not JSON ({e})") from e
        return cls.from_dict(d)

    def save(self, path) -> Path:
        from .harness.io import write_json_atomic
        return write_json_atomic(path, self.to_dict())


DEFAULT_TABLE = ScheduleTable()  # what emulate_native uses (and fills) when given no table
_PROBER: list = []


def register_shape_prober(fn: Callable | None) -> None:
    """``fn(device, shape, *, table) -> ShapeSchedule``: how emulate_native learns a shape
    it does not know, when the device object is present (None unregisters)."""
    if fn is not None and not callable(fn):
        raise TypeError(f"fn: expected a callable prober, got {type(fn).__name__}")
    _PROBER[:] = [] if fn is None else [fn]


def shape_prober():
    """The registered prober, or None."""
    return _PROBER[0] if _PROBER else None


def alpha_factors(alpha):
    """Device-protocol alpha (sa, sb) -> emulate's factors: 1-D sa is per row ([M, 1]),
    1-D sb per column ([1, N]); scalars and 2-D tensors as given."""
    if alpha is None:
        return None
    import torch
    if not isinstance(alpha, (tuple, list)) or len(alpha) != 2:
        return alpha
    sa, sb = (torch.as_tensor(x, dtype=torch.float32) if not isinstance(x, (int, float)) else float(x)
              for x in alpha)
    if isinstance(sa, torch.Tensor) and sa.dim() == 1:
        sa = sa.reshape(-1, 1)
    if isinstance(sb, torch.Tensor) and sb.dim() == 1:
        sb = sb.reshape(1, -1)
    return [sa, sb]


def emulate_native(device, a, b, *, scales_a=None, scales_b=None, alpha=None, table=None):
    """What ``device``'s native GEMM writes for ``a`` [M, K] @ ``b`` [K, N] (decoded values,
    torch tensors or arrays), bit for bit: the schedule of this shape from ``table``
    (default: DEFAULT_TABLE), run by fp4ref.gemm.emulate.  ``device``: a device name, or
    an object with ``.name`` (then an unknown shape is probed on it and recorded).
    ``alpha``: None or (sa, sb), scalars or [M] / [N] vectors.  Returns float32 [M, N]."""
    import torch
    name = device if isinstance(device, str) else getattr(device, "name", None)
    if not isinstance(name, str):
        raise TypeError(f"device: expected a device name or an object with .name, got {type(device).__name__}")
    table = DEFAULT_TABLE if table is None else table
    a, b = torch.as_tensor(a), torch.as_tensor(b)
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"a, b: need [M, K] and [K, N], got {tuple(a.shape)} and {tuple(b.shape)}")
    shape = (int(a.shape[0]), int(b.shape[1]), int(a.shape[1]))
    entry = table.lookup(name, shape)
    if entry is None and not isinstance(device, str) and shape_prober() is not None:
        entry = shape_prober()(device, shape, table=table)
        table.add(entry)
    if entry is None:
        M, N, K = shape
        raise ValueError(f"shape {shape} is unknown for {name} in this table ({len(table.shapes(name))} "
                         f"known shape(s) for it); run `fp4ref explain {name} --shape {M},{N},{K}` "
                         f"on that machine")
    if not entry.exact:
        raise ValueError(f"shape {shape}: the schedule recorded for {name} ({short(entry.model)}) matched "
                         f"{entry.matches} of {entry.checked_outputs} checked outputs, so it is not "
                         f"bit-exact there (kernels: {', '.join(entry.kernels) or 'unknown'})")
    return emulate_schedule(entry, a, b, scales_a=scales_a, scales_b=scales_b, alpha=alpha)


def emulate_schedule(entry: ShapeSchedule, a, b, *, scales_a=None, scales_b=None, alpha=None,
                     rows=None, cols=None):
    """fp4ref.gemm.emulate of one schedule: its K order (layout) applied to the operands, its
    model, and per output tile its tile schedule's other model.  ``a``, ``b``: the whole
    operands, or with ``rows`` / ``cols`` (indices into entry.shape's M and N) the rows of A
    and columns of B of those outputs only (alpha already restricted to them)."""
    import torch
    from .gemm import emulate
    a, b = torch.as_tensor(a), torch.as_tensor(b)
    sa = None if scales_a is None else torch.as_tensor(scales_a)
    sb = None if scales_b is None else torch.as_tensor(scales_b)
    if (entry.layout is not None or entry.tiles is not None) and (sa is not None or sb is not None):
        raise ValueError(f"scales_a, scales_b: the schedule of {entry.device} at {entry.shape} reorders K "
                         "or cuts it per output tile; block scales are not supported there")
    kw = dict(scales_a=sa, scales_b=sb, block=entry.block if sa is not None else None, alpha=alpha_factors(alpha))

    def run(layout, model):
        x, y = (a, b) if layout is None else layout.pad(a, b)
        return emulate(model, x, y, **kw)
    return run_schedule(entry, run, entry.shape, rows, cols)


def schedule_parts(schedule) -> tuple:
    """(model, KLayout or None, TileSchedule or None) of a schedule: a GemmModel, a
    (model, KLayout[, TileSchedule]) tuple or a ShapeSchedule."""
    if isinstance(schedule, ShapeSchedule):
        return schedule.model, schedule.layout, schedule.tiles
    if isinstance(schedule, tuple):
        return (*schedule, None)[:3]
    return schedule, None, None


def run_schedule(schedule, run, shape, rows=None, cols=None):
    """A schedule's outputs (``rows`` x ``cols`` of an M x N x K ``shape``; all by default)
    from a backend's ``run(layout, model)`` (its operands in that K order, that model): the
    shape's model, with the outputs of a tile schedule's other tiles from their own."""
    model, layout, tiles = schedule_parts(schedule)
    out = run(layout, model)
    return out if tiles is None else tile_select(tiles, out, run, shape, rows, cols)


def tile_select(tiles: TileSchedule, out, run, shape, rows=None, cols=None):
    """``out`` (torch or numpy: the ``rows`` x ``cols`` outputs of an M x N x K ``shape``;
    all of them by default) with the outputs of ``tiles``' other tiles taken from
    ``run(layout, model)`` of their schedule (run only when such a tile is there)."""
    import numpy as np
    M, N, K = shape
    tail, s = tiles.split(M, N, K)
    r = np.arange(M) if rows is None else np.asarray(rows, dtype=np.int64)
    c = np.arange(N) if cols is None else np.asarray(cols, dtype=np.int64)
    mask = tail[(r // tiles.tile_rows)[:, None], (c // tiles.tile_cols)[None, :]]
    if not mask.any():
        return out
    alt = run(*tiles.alt(K, s))
    if isinstance(out, np.ndarray):
        return np.where(mask, alt, out)
    import torch
    return torch.where(torch.as_tensor(mask, device=out.device), alt, out)
