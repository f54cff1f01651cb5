"""Random-shape validation (issue 13): the native GEMM against its emulation at shapes nobody
probed, bit for bit.

Shapes are drawn uniformly (M, N in [1, max_mn], K in [1, max_k], never rounded to multiples).
A shape the device refuses (DeviceError, e.g. ``_scaled_mm`` needs K % 16 == 0 and
N % 16 == 0) is counted as refused and another is drawn, so the accepted shapes are uniform
among the shapes the device accepts.  Per accepted shape: the shape is explained
(probes.explain.explain_shape: the model and schedule the GEMM runs there), a fresh random
batch runs natively, at least ``outputs`` sampled outputs are emulated (fp4ref.gemm.emulate,
on the batch's device) and their bit patterns compared.  One JSONL line per shape, flushed:
an interrupted run loses nothing, and a rerun resumes the same seeded draw sequence.

    fp4ref validate-shapes --baseline REPORT.json --devices 'cuda-*' --shapes 100 \
        --time-limit-s 500 --log reports/baselines/shapes/nvidia-h200.jsonl
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import re
import statistics
import time
from pathlib import Path

import numpy as np

from reference.notation import from_dict, short

from .device import AdapterError, DeviceError
from .kernels import device_model

__all__ = ["draw_shapes", "declared_refusal", "validate_shapes", "summarize", "read_log", "sample_grid", "compare_bits",
           "environment_key", "default_log_path", "load_base_models", "summary_table", "main",
           "bounded_run", "random_shapes_record", "MAX_DRAWS_PER_SHAPE", "MIN_BOUNDED_S", "EXPLAIN_OUTPUTS",
           "LOG_VERSION", "BLOCK", "MAX_DECLARED"]

# Draws per accepted shape before a device is declared to accept (almost) nothing: with
# _scaled_mm's K % 16 and N % 16 rule one draw in 256 is accepted on average, so 4096 draws
# miss an accepted shape with probability (255/256)**4096 ~ 1e-7.
MAX_DRAWS_PER_SHAPE = 4096
LOG_VERSION = 2  # 2: refused draws counted into the next line (refused_before)


def draw_shapes(rng, n: int, *, max_mn: int = 4096, max_k: int = 16384) -> list[tuple[int, int, int]]:
    """``n`` shapes (M, N, K), each uniform on [1, max_mn]^2 x [1, max_k] (no rounding)."""
    for name, v in (("n", n), ("max_mn", max_mn), ("max_k", max_k)):
        lo = 0 if name == "n" else 1
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < lo:
            raise ValueError(f"{name}: must be an integer >= {lo}, got {v!r}")
    # rows in order: a draw of n then of m gives the same stream as one draw of n + m
    rows = rng.integers(1, np.array([max_mn, max_mn, max_k]) + 1, size=(n, 3))
    return [(int(m), int(nn), int(k)) for m, nn, k in rows]


# --- the explanation of a shape (probes.explain, helper "explain") ------------------------------
# Outputs on which explain_shape confirms its candidate.  The validation proper is the fresh
# batch's ``outputs`` (4096) afterwards; the emulation costs per K step, so a full-size
# confirmation too would double the cost of a shape (cuBLAS fp32 at K ~ 16k: about a minute each).
EXPLAIN_OUTPUTS = 1024


def _explain_fn(budget_s: float | None = None):
    """probes.explain.explain_shape, confirming on EXPLAIN_OUTPUTS outputs (``budget_s``: its
    search bound, where given)."""
    from .explain import explain_shape
    kw = {"outputs": EXPLAIN_OUTPUTS} if budget_s is None else {"outputs": EXPLAIN_OUTPUTS, "budget_s": budget_s}
    return lambda dev, shape, **k: explain_shape(dev, shape, **kw, **k)


def environment_key(dev) -> dict:
    """fp4ref.native's environment key of the device (versions, GPU, SM count, workspace,
    BLAS backend): a log line counts as done on resume only under the same key."""
    from fp4ref.native import environment_key as key
    return key(dev.name)


# --- one shape ----------------------------------------------------------------------------------
def sample_grid(M: int, N: int, outputs: int, rng) -> tuple[np.ndarray, np.ndarray]:
    """Rows and columns (sorted) whose cross product holds at least ``outputs`` outputs (all
    of them when M * N <= outputs): one emulation of a rows x cols block, not scattered
    outputs, since the emulator's cost is per K step, not per output."""
    if M * N <= outputs:
        return np.arange(M), np.arange(N)
    nr = min(M, math.isqrt(outputs - 1) + 1)
    nc = min(N, -(-outputs // nr))
    nr = min(M, -(-outputs // nc))
    rows = np.sort(rng.choice(M, size=nr, replace=False))
    return rows, np.sort(rng.choice(N, size=nc, replace=False))


_OUT_DTYPES = {"float32": ("float32", "int32", 8), "bfloat16": ("bfloat16", "int16", 4),
               "float16": ("float16", "int16", 4)}


def _code(x: float, fmt: str) -> str:
    """The output-format bit pattern of a float32 value as hex ('0x3f80' for bf16 1.0)."""
    import torch
    dt, it, digits = _OUT_DTYPES[fmt]
    v = int(torch.tensor([x], dtype=torch.float32).to(getattr(torch, dt)).view(getattr(torch, it))[0])
    return f"0x{v & ((1 << (4 * digits)) - 1):0{digits}x}"


def compare_bits(native, emulated):
    """Elementwise: same float32 bit pattern (both hold exact output-format values, so this
    is the output bits compared; -0 != +0), or both NaN (any payload)."""
    import torch
    nb = native.to(torch.float32).contiguous().view(torch.int32)
    eb = emulated.to(torch.float32).contiguous().view(torch.int32)
    return (nb == eb) | (torch.isnan(native) & torch.isnan(emulated))


def _emulate_sampled(sched, batch, rows, cols):
    """The schedule's emulation (fp4ref.native.emulate_schedule: K order, model, tiles) of
    the rows x cols block of outputs, on the batch's device."""
    import torch
    from fp4ref.native import emulate_schedule
    dev = batch.a.device
    sub = batch.sub(torch.as_tensor(rows, device=dev), torch.as_tensor(cols, device=dev))
    return emulate_schedule(sched, sub.a, sub.b, scales_a=sub.scales_a, scales_b=sub.scales_b,
                            alpha=sub.alpha, rows=rows, cols=cols)


def _first_mismatch(eq, native, emulated, rows, cols, fmt) -> dict | None:
    import torch
    bad = torch.nonzero(~eq)
    if bad.numel() == 0:
        return None
    i, j = (int(x) for x in bad[0])
    nv, ev = float(native[i, j]), float(emulated[i, j])
    return {"index": [int(rows[i]), int(cols[j])], "native_bits": _code(nv, fmt),
            "emulated_bits": _code(ev, fmt), "native": repr(nv), "emulated": repr(ev)}


def _one_shape(dev, shape, base_model, table, seed, outputs, explain) -> dict:
    """The log fields of one shape (refused or compared); DeviceError only from the device."""
    import torch
    M, N, K = shape
    t0 = time.perf_counter()
    try:
        batch = dev.draw(M, N, K, seed)
        native = dev.call_tensors(batch)
    except AdapterError:   # the tool failed, not the library: an error line (_run_shape)
        raise
    except DeviceError as e:
        return {"refused": str(e)[:300], "wall_s": round(time.perf_counter() - t0, 3)}
    sched = explain(dev, tuple(shape), base_model=base_model, table=table, seed=seed + 1)
    kernels = list(sched.kernels) or dev.kernels(batch)
    rows, cols = sample_grid(M, N, outputs, np.random.default_rng(seed + 2))
    emulated = _emulate_sampled(sched, batch, rows, cols).cpu()
    sub = native.to(torch.float32)[torch.as_tensor(rows, device=native.device)][
        :, torch.as_tensor(cols, device=native.device)].cpu()
    eq = compare_bits(sub, emulated)
    return {"refused": None, "kernels": kernels, "family": sched.family,
            "model": short(sched.model), "source": sched.source, "explained": int(sched.matches),
            "explain_outputs": int(sched.checked_outputs), "explain_s": round(float(sched.wall_s), 3),
            "layout": None if sched.layout is None else sched.layout.to_dict(),
            **({} if sched.tiles is None else {"tiles": sched.tiles.to_dict()}),
            "predicted_split": sched.predicted_split,
            "outputs": int(eq.numel()), "matches": int(eq.sum()),
            "first_mismatch": _first_mismatch(eq, sub, emulated, rows, cols, dev.caps.output),
            "wall_s": round(time.perf_counter() - t0, 3)}


# --- the log ------------------------------------------------------------------------------------
def read_log(path) -> list[dict]:
    """The records of a JSONL log ([] if there is none).  A torn last line (a run killed
    mid-write) is skipped: that shape simply runs again on resume."""
    p = Path(path)
    if not p.exists():
        return []
    out = []
    for line in p.read_text(encoding="utf-8").splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and "device" in rec and "shape" in rec:
            out.append(rec)
    return out


class _Log:
    """Append-only JSONL, one flushed line per shape (concurrent writers append whole lines)."""

    def __init__(self, path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        torn = self.path.exists() and self.path.stat().st_size and not self.path.read_bytes().endswith(b"\n")
        self.f = open(self.path, "a", encoding="utf-8")
        if torn:  # a killed writer left half a line: end it so the next record stands alone
            self.f.write("\n")
            self.f.flush()

    def write(self, rec: dict) -> None:
        self.f.write(json.dumps(rec, sort_keys=False) + "\n")
        self.f.flush()

    def close(self):
        self.f.close()


def _stable_seed(*parts) -> int:
    """A seed from names and numbers that does not depend on Python's hash salt."""
    return int(hashlib.sha1("|".join(map(str, parts)).encode()).hexdigest()[:12], 16)


BLOCK = 4096                # shapes drawn at a time (the stream does not depend on it)
MAX_DECLARED = 1 << 24      # draws a device's declared capabilities may refuse in a row


def _declared_rule(dev) -> tuple[int, int] | None:
    """(M and N multiple, K multiple) that ``dev`` requires by its declared capabilities, for
    a device drawing its batches through the protocol's default (probes.device), which raises
    DeviceError for exactly the other shapes; None where the library itself decides (a
    backend's own draw: _scaled_mm takes any M, whatever its caps declare for probes)."""
    if dev.tensors is not None and dev.tensors.draw is not None:
        return None
    mm, km = dev.caps.mn_multiple, math.lcm(dev.caps.k_multiple, dev.caps.block or 1)
    return None if mm == km == 1 else (mm, km)


def declared_refusal(dev, shape) -> str | None:
    """Why ``dev`` refuses ``shape`` by its declared capabilities (see _declared_rule), checked
    without a call, so that a kernel taking only multiples of 64 x 64 x 128 (one draw in
    524288) costs microseconds per refusal; None if it does not."""
    rule = _declared_rule(dev)
    if rule is None or not (shape[0] % rule[0] or shape[1] % rule[0] or shape[2] % rule[1]):
        return None
    return (f"{dev.name}: shape {tuple(shape)} refused by its declared capabilities: M and N multiples "
            f"of {rule[0]}, K of {rule[1]}")


def _missed(r: dict) -> bool:
    """An accepted line that is not bit-exact (a tool error included)."""
    return bool(r.get("error")) or "outputs" not in r or r["matches"] != r["outputs"]


def latest_lines(records) -> dict:
    """{(device, env, seed, draw): the last line} of accepted draws: a retried shape's new
    line supersedes the old one (refused lines are not keyed: each counts)."""
    out = {}
    for r in records:
        if r.get("refused") is None:
            key = (r["device"], json.dumps(r.get("env"), sort_keys=True), r.get("seed"), r.get("draw"))
            out[key + tuple(r.get("shape") or ())] = r
    return out


class _Sequence:
    """One device's seeded draw sequence.  Resumes after the last draw in the log; refused
    draws are counted into the next record (``refused_before``), not logged one by one
    (_scaled_mm refuses 255 of 256)."""

    def __init__(self, dev, seed, env, max_mn, max_k, records, retry=False):
        self.dev, self.seed, self.env = dev, seed, env
        self.rng = np.random.default_rng(_stable_seed(seed, dev.name, max_mn, max_k))
        self.max_mn, self.max_k = max_mn, max_k
        mine = [r for r in records if r["device"] == dev.name and r.get("env") == env and r.get("seed") == seed]
        self.done = {tuple(r["shape"]) for r in mine if r.get("refused") is None}
        self.accepted = len(self.done)
        # retry: the accepted shapes whose latest line missed, checked again first (the tool
        # got better; their new lines supersede the old ones in the summary)
        self.retry = [(int(r["draw"]), tuple(r["shape"])) for r in latest_lines(mine).values()
                      if r.get("refused") is None and _missed(r)] if retry else []
        self.retried = {d for d, _ in self.retry}
        start = max((int(r.get("draw", -1)) for r in mine), default=-1) + 1
        self.base, self.buf, self.ok = 0, [], np.zeros(0, bool)
        while self.base + BLOCK <= start:  # fast-forward over the logged part of the stream
            draw_shapes(self.rng, BLOCK, max_mn=max_mn, max_k=max_k)
            self.base += BLOCK
        self._refill()
        self.pos = start - self.base
        self.called = self.declared = 0    # refusals in a row (the caps), since the last accepted
        self.refused, self.example = 0, None  # refusals since the last record, one message
        self.last = (start - 1, None)
        self.stopped = None
        self.walls: list = []     # seconds per unit of K of this run's accepted shapes

    def _refill(self):
        self.buf = draw_shapes(self.rng, BLOCK, max_mn=self.max_mn, max_k=self.max_k)
        rule = _declared_rule(self.dev)
        if rule is None:
            self.ok = np.ones(len(self.buf), bool)
        else:
            a = np.array(self.buf)
            self.ok = (a[:, 0] % rule[0] == 0) & (a[:, 1] % rule[0] == 0) & (a[:, 2] % rule[1] == 0)

    def estimate(self, K: int) -> float:
        """Seconds the next shape may take: the emulation's cost is per K step, so the median
        cost per unit of K so far, times K (0 before the first shape)."""
        return statistics.median(self.walls) * K if self.walls else 0.0

    def next_new(self):
        """(draw index, shape) of the next shape to run (declared refusals counted and
        skipped, logged shapes skipped); None past a cap of refusals in a row."""
        if self.retry:
            return self.retry.pop(0)
        while self.called < MAX_DRAWS_PER_SHAPE and self.declared < MAX_DECLARED:
            if self.pos >= len(self.buf):
                self.base += len(self.buf)
                self._refill()
                self.pos = 0
            hits = np.flatnonzero(self.ok[self.pos:])
            skip = int(hits[0]) if hits.size else len(self.buf) - self.pos
            if skip:
                self.note_refusal(declared_refusal(self.dev, self.buf[self.pos]), skip, declared=True)
                self.pos += skip
                self.last = (self.base + self.pos - 1, self.buf[self.pos - 1])
                continue
            index, shape = self.base + self.pos, self.buf[self.pos]
            self.pos += 1
            self.last = (index, shape)
            if shape not in self.done:
                return index, shape
        return None

    def cap_record(self) -> dict:
        """The line that ends a device at the cap: its last draw, refused, with every refusal
        since the previous line (itself included) in ``refused_before``."""
        msg = (f"{MAX_DRAWS_PER_SHAPE} draws in a row refused by the device" if self.called >= MAX_DRAWS_PER_SHAPE
               else f"{MAX_DECLARED} draws in a row refused by the declared capabilities")
        self.stopped = msg + ": it accepts (almost) no shape"
        rec = self.record(*self.last, {"refused": self.example or msg, "capped": True, "wall_s": 0.0})
        return rec

    def note_refusal(self, message, n=1, declared=False):
        self.refused += n
        self.example = self.example or message
        if declared:
            self.declared += n
        else:
            self.called += n

    def record(self, index, shape, fields) -> dict:
        """The log line of a shape run; refusals counted since the previous line go with it."""
        refused = fields.get("refused") is not None
        if not refused:  # accepted, whether it then validated or raised in the tool
            self.accepted += shape not in self.done
            self.done.add(shape)
            self.called = self.declared = 0
            self.walls.append(fields["wall_s"] / shape[2])
        rec = {"v": LOG_VERSION, "device": self.dev.name, "env": self.env, "seed": self.seed,
               "draw": int(index), "shape": list(shape), **fields, "refused_before": self.refused,
               **({"retry": True} if int(index) in self.retried and not refused else {}),
               "refused_example": None if refused else self.example,
               "utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        self.refused, self.example = 0, None
        return rec


def validate_shapes(devices, *, base_models: dict, shapes_per_device: int, seed: int = 0,
                    log_path, time_limit_s: float | None = None, table=None, outputs: int = 4096,
                    max_mn: int = 4096, max_k: int | None = 16384, explain=None, explain_budget_s: float | None = None,
                    retry_misses: bool = False,
                    progress=None) -> dict:
    """Validate each device on ``shapes_per_device`` accepted random shapes in all (shapes
    already in the log count; a rerun resumes the same seeded sequence), round robin so that
    a time limit leaves every device with shapes.  ``base_models``: {device name: GemmModel}
    (a device without one is skipped).  K is drawn up to min(``max_k``, caps.max_k): the
    longest K a device declares (CPU BLAS devices 256, the CUDA ones 16384).
    ``explain``: explain_shape's signature (default probes.explain.explain_shape, its
    candidate search bounded by ``explain_budget_s`` where given).
    Returns {"log", "new", "stopped", "devices": {name: {"accepted", "target", "stopped"}},
    "skipped": {name: why}}; ``stopped`` says how far a time limit or Ctrl-C let it get."""
    for name, v, lo in (("shapes_per_device", shapes_per_device, 0), ("outputs", outputs, 1)):
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise ValueError(f"{name}: must be an integer >= {lo}, got {v!r}")
    if time_limit_s is not None and not (time_limit_s > 0):
        raise ValueError(f"time_limit_s: must be a number of seconds > 0 or None, got {time_limit_s!r}")
    explain = explain or _explain_fn(explain_budget_s)
    deadline = None if time_limit_s is None else time.perf_counter() + time_limit_s
    records = read_log(log_path)
    seqs, skipped = [], {}
    for dev in devices:
        if base_models.get(dev.name) is None:
            skipped[dev.name] = "no base model (not in the baseline report, or no model there)"
            continue
        seqs.append(_Sequence(dev, seed, environment_key(dev), max_mn,
                              dev.caps.max_k if max_k is None else min(max_k, dev.caps.max_k), records,
                              retry=retry_misses))
    log, count, stopped = _Log(log_path), [0], None
    try:
        stopped = _round_robin(seqs, base_models, shapes_per_device, table, outputs, explain,
                               log, deadline, progress, count)
    except KeyboardInterrupt:
        stopped = "interrupted (Ctrl-C); every finished shape is in the log"
    finally:
        log.close()
    return {"log": str(log_path), "new": count[0], "stopped": stopped, "skipped": skipped,
            "devices": {s.dev.name: {"accepted": s.accepted, "target": shapes_per_device,
                                     "stopped": s.stopped} for s in seqs}}


def _round_robin(seqs, base_models, target, table, outputs, explain, log, deadline, progress, count):
    """One accepted shape per device per round (refused draws in between are cheap) until
    each has ``target`` or the time is spent; ``count[0]``: lines written.  Returns why it
    stopped early (None: every device has its shapes or stopped on its own)."""
    active = [s for s in seqs if s.accepted < target or s.retry]
    while active:
        for s in list(active):
            if deadline is not None and time.perf_counter() >= deadline:
                for t in active:
                    t.stopped = f"time limit: {t.accepted} of {target} shapes done"
                return f"time limit reached; {len(active)} devices unfinished"
            if not _turn(s, base_models[s.dev.name], table, outputs, explain, log, deadline, progress, count) \
                    or (s.accepted >= target and not s.retry):
                active.remove(s)
    return None


def _turn(s, base_model, table, outputs, explain, log, deadline, progress, count) -> bool:
    """Draw shapes for one device until one is accepted (refusals are counted into its line);
    False when the device stops (a cap of refusals in a row, or its next shape would end
    after the deadline)."""
    while True:   # until one shape is accepted (a retried one included)
        nxt = s.next_new()
        if nxt is None:
            log.write(s.cap_record())
            count[0] += 1
            return False
        index, shape = nxt
        est = s.estimate(shape[2])
        if deadline is not None and time.perf_counter() + est > deadline:  # a resumed run draws it again
            s.stopped = f"time limit: {s.accepted} shapes done (the next one ~{est:.0f} s)"
            return False
        fields = _run_shape(s, shape, base_model, table, outputs, explain, index)
        if fields.get("refused") is not None:
            s.note_refusal(fields["refused"])
            continue
        log.write(s.record(index, shape, fields))
        count[0] += 1
        if progress:
            progress(s.dev.name, shape, fields)
        return True


def _run_shape(s, shape, base_model, table, outputs, explain, index) -> dict:
    """One shape's fields; a failure of the tool itself (not a refusal) is logged as an error."""
    t0 = time.perf_counter()
    try:
        return _one_shape(s.dev, shape, base_model, table, _stable_seed(s.seed, s.dev.name, index),
                          outputs, explain)
    except KeyboardInterrupt:
        raise
    except Exception as e:
        return {"refused": None, "error": f"{type(e).__name__}: {str(e)[:300]}",
                "wall_s": round(time.perf_counter() - t0, 3)}


# --- summary ------------------------------------------------------------------------------------
WORST = 5


def summarize(log_path_or_records) -> dict:
    """{device: counts} from a log (path) or its records: shapes tried (drawn), refused,
    errors (accepted, but the tool failed), validated, bit-exact shapes, sampled and bit-exact
    outputs, the environment keys seen, one refusal message, and the ``WORST`` shapes (fewest
    matching outputs, kernel names).  A line's ``refused_before`` counts the refused draws
    before it (a refused line: itself included; a line without it, written one per refusal,
    counts itself).  A shape checked again (``--retry-misses``) counts once, by its latest
    line; ``superseded`` counts the older lines."""
    recs = (read_log(log_path_or_records) if isinstance(log_path_or_records, (str, os.PathLike))
            else list(log_path_or_records))
    out: dict = {}
    latest = {id(r) for r in latest_lines(recs).values()}
    for r in recs:
        d = out.setdefault(r["device"], {"tried": 0, "refused": 0, "errors": 0, "validated": 0,
                                         "bit_exact_shapes": 0, "outputs": 0, "bit_exact_outputs": 0,
                                         "envs": [], "refusal": None, "worst": [], "superseded": 0})
        if r.get("refused") is None and id(r) not in latest:
            d["superseded"] += 1   # a retried shape: its newer line counts
            continue
        if r.get("env") not in d["envs"]:
            d["envs"].append(r.get("env"))
        refused = r.get("refused") is not None
        n = int(r.get("refused_before", 1 if refused else 0))
        d["refused"] += n
        d["tried"] += n + (not refused)
        d["refusal"] = d["refusal"] or r.get("refused_example") or (r["refused"] if refused else None)
        if refused:
            continue
        if r.get("error") or "outputs" not in r:
            d["errors"] += 1
            d["worst"].append(_worst_row(r))
        else:
            d["validated"] += 1
            d["outputs"] += int(r["outputs"])
            d["bit_exact_outputs"] += int(r["matches"])
            if r["matches"] == r["outputs"]:
                d["bit_exact_shapes"] += 1
            else:
                d["worst"].append(_worst_row(r))
    for d in out.values():
        d["worst"] = sorted(d["worst"], key=lambda w: (w["fraction"], w["shape"]))[:WORST]
    return out


def _worst_row(r) -> dict:
    n, ok = int(r.get("outputs") or 0), int(r.get("matches") or 0)
    return {"shape": list(r["shape"]), "outputs": n, "matches": ok,
            "fraction": round(ok / n, 6) if n else 0.0, "kernels": list(r.get("kernels") or []),
            "family": r.get("family") or "", "model": r.get("model") or "",
            "source": r.get("source") or "", "error": r.get("error"),
            "first_mismatch": r.get("first_mismatch")}


def _main_kernel(w) -> str:
    """The GEMM kernel of a worst-shape row (not a memset or reduce helper), else its error."""
    ks = w.get("kernels") or []
    gemm = [k for k in ks if re.search(r"gemm|gemv|Kernel|matmul", k) and "Memset" not in k]
    return (gemm or ks or [w.get("error") or w.get("family") or "?"])[0]


def _pct(a, b) -> str:
    return f"{100 * a / b:.2f}%" if b else "-"


def summary_table(summary: dict, title: str = "random-shape validation"):
    """A rich Table of summarize()'s counts, one row per device (worst shape named)."""
    from rich.table import Table
    from rich.text import Text
    t = Table(title=title)
    for col in ("device", "tried", "refused", "validated", "bit-exact shapes", "bit-exact outputs",
                "worst shape (kernel)"):
        t.add_column(col, overflow="fold")
    for name, d in summary.items():
        w = d["worst"][0] if d["worst"] else None
        ws = "-" if w is None else f"{w['shape']} {w['matches']}/{w['outputs']} {_main_kernel(w)[:90]}"
        t.add_row(Text(name), str(d["tried"]), str(d["refused"]), str(d["validated"]),
                  f"{d['bit_exact_shapes']} ({_pct(d['bit_exact_shapes'], d['validated'])})",
                  f"{d['bit_exact_outputs']} of {d['outputs']} ({_pct(d['bit_exact_outputs'], d['outputs'])})",
                  Text(ws))
    return t


# --- command ------------------------------------------------------------------------------------
def default_log_path(root="reports/baselines/shapes") -> Path:
    """reports/baselines/shapes/<machine>.jsonl: the GPU's name (or cpu-<arch>) as a slug."""
    import platform
    import torch
    name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else f"cpu-{platform.machine()}"
    return Path(root) / (re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") + ".jsonl")


def load_base_models(path) -> dict:
    """{device name: GemmModel} of a probe report's devices that have a model."""
    from .backends import canonical_name
    try:
        rep = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ValueError(f"--baseline: cannot read {str(path)!r} as a report: {e}") from None
    out = {}
    for d in rep.get("devices") or []:
        if isinstance(d, dict) and d.get("model"):
            out[canonical_name(d["name"])] = from_dict(d["model"])
    return out


def _parser():
    import argparse
    p = argparse.ArgumentParser(prog="fp4ref validate-shapes", description=__doc__.split("\n\n")[0])
    p.add_argument("--baseline", default=None, help="probe report whose device models are the base models "
                                                    "(needed unless --summary-only)")
    p.add_argument("--devices", default="", help="comma-separated names or globs (default: every available "
                                                  "device with a model in the baseline)")
    p.add_argument("--shapes", type=int, default=100, help="accepted shapes per device in the log, in all")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log", default=None, help="JSONL log, appended (default reports/baselines/shapes/<machine>.jsonl)")
    p.add_argument("--summary-json", default=None, help="also write the summary here (JSON)")
    p.add_argument("--time-limit-s", type=float, default=None)
    p.add_argument("--outputs", type=int, default=4096, help="sampled outputs per shape (all when M*N is smaller)")
    p.add_argument("--max-mn", type=int, default=4096)
    p.add_argument("--max-k", type=int, default=16384, help="largest K drawn (at most each device's caps.max_k)")
    p.add_argument("--retry-misses", action="store_true",
                   help="check again first the logged shapes whose latest line is not bit-exact "
                        "(after a tool fix; the new line supersedes the old in the summary)")
    p.add_argument("--explain-budget-s", type=float, default=10.0,
                   help="seconds the per-shape schedule search may take before it keeps its best candidate")
    p.add_argument("--table", default=None, help="schedule table (fp4ref.native.ScheduleTable JSON): shapes in "
                                                 "it are validated as recorded, new ones added and saved")
    p.add_argument("--summary-only", action="store_true", help="summarize the log, run nothing")
    return p


def _pick(names, pattern):
    import fnmatch
    pats = [x.strip() for x in pattern.split(",") if x.strip()]
    return [n for n in names if not pats or any(fnmatch.fnmatch(n, q) for q in pats)]


def main(argv=None) -> int:
    """`fp4ref validate-shapes`: run (or resume) the validation, then print the summary."""
    from rich.console import Console
    args = _parser().parse_args(argv)
    log = Path(args.log) if args.log else default_log_path()
    con = Console(stderr=True)
    res = None
    if not args.summary_only:
        res = _run_cli(args, log, con)
    summary = summarize(log)
    Console().print(summary_table(summary, f"random-shape validation: {log}"))
    if args.summary_json:
        from fp4ref.harness.io import write_json_atomic
        write_json_atomic(args.summary_json, {"log": str(log), "run": res, "devices": summary})
    for name, d in (res or {}).get("devices", {}).items():
        if d["stopped"]:
            con.print(f"{name}: {d['accepted']} of {d['target']} shapes in the log; stopped: {d['stopped']}",
                      markup=False, highlight=False)
    if res and res["stopped"]:
        con.print(f"stopped: {res['stopped']}", markup=False, highlight=False)
    return 130 if res and (res["stopped"] or "").startswith("interrupted") else 0


def _run_cli(args, log, con) -> dict:
    from .backends import detect
    if not args.baseline:
        raise ValueError("--baseline: needed to run shapes (a probe report with each device's model), "
                         "e.g. reports/baselines/redesign/h200-probe-after.json; or pass --summary-only")
    models = load_base_models(args.baseline)
    found = detect(include=lambda s: bool(_pick([s.name], args.devices)))
    for d in found:  # no model in the report: the kernel table's row for this device, if one
        if d.name not in models and (row := device_model(d.name)) is not None:
            models[d.name] = row
    # default: every available hardware device with a base model (virtual ones when named)
    devs = [d.device for d in found if d.device is not None
            and (args.devices or (d.name in models and d.kind != "virtual"))]
    if not devs:
        raise ValueError(f"--devices: {args.devices!r} selects no available device; available: "
                         + ", ".join(d.name for d in found if d.device is not None))

    def show(name, shape, f):
        what = "refused" if f.get("refused") else f.get("error") or f"{f['matches']}/{f['outputs']}"
        con.print(f"{name} {list(shape)}: {what} ({f['wall_s']:.1f} s)", markup=False, highlight=False)
    table = None
    if args.table:
        from fp4ref.native import ScheduleTable
        table = ScheduleTable.load(args.table) if Path(args.table).exists() else ScheduleTable()
    try:
        return _validate_cli(args, devs, models, log, table, show, con)
    finally:
        if table is not None:
            table.save(args.table)


def _validate_cli(args, devs, models, log, table, show, con) -> dict:
    res = validate_shapes(devs, base_models=models, shapes_per_device=args.shapes, seed=args.seed,
                          log_path=log, time_limit_s=args.time_limit_s, outputs=args.outputs, table=table,
                          max_mn=args.max_mn, max_k=args.max_k, explain_budget_s=args.explain_budget_s,
                          retry_misses=args.retry_misses,
                          progress=show)
    for name, why in res["skipped"].items():
        con.print(f"skipped {name}: {why}", markup=False)
    return res


# --- the bounded form inside `make probe` -------------------------------------------------------
MIN_BOUNDED_S = 15.0  # a probe run's random-shape step starts only with this much time left


def bounded_run(dev, model, *, shapes: int, seed: int, log_path, until: float | None,
                max_mn: int = 4096, max_k: int = 16384, outputs: int = 4096) -> dict:
    """`make probe`'s random-shape step for one device: up to ``shapes`` accepted shapes in
    the log, stopping cleanly before time.time() ``until`` (None: no limit).  Returns the
    report record (random_shapes_record)."""
    params = {"requested": shapes, "seed": seed, "max_mn": max_mn, "max_k": min(max_k, dev.caps.max_k),
              "outputs_per_shape": outputs}
    left = None if until is None else until - time.time()
    if left is not None and left < MIN_BOUNDED_S:
        return random_shapes_record(log_path, dev.name, stopped=f"not started: {max(left, 0):.0f} s of the "
                                    f"run's time budget left (needs {MIN_BOUNDED_S:.0f} s)", **params)
    res = validate_shapes([dev], base_models={dev.name: model}, shapes_per_device=shapes, seed=seed,
                          log_path=log_path, time_limit_s=left, max_mn=max_mn, max_k=max_k, outputs=outputs,
                          explain_budget_s=10.0 if left is None else max(1.0, min(10.0, left / 4)))
    stopped = res["devices"].get(dev.name, {}).get("stopped") or res["stopped"]
    return random_shapes_record(log_path, dev.name, stopped=stopped, **params)


def random_shapes_record(log_path, name: str, *, stopped: str | None = None, **params) -> dict:
    """A device's random shapes as the probe report records them (extra.random_shapes): the
    counts of summarize(), the worst shapes, one row per accepted shape (refused ones are
    counted only: _scaled_mm refuses ~255 of 256 draws), why it stopped early, if it did."""
    recs = [r for r in read_log(log_path) if r.get("device") == name] if Path(log_path).exists() else []
    s = summarize(recs).get(name) or {"tried": 0, "refused": 0, "errors": 0, "validated": 0, "refusal": None,
                                      "bit_exact_shapes": 0, "outputs": 0, "bit_exact_outputs": 0, "worst": []}
    rows = [{"shape": list(r["shape"]), "outputs": int(r.get("outputs") or 0), "matches": int(r.get("matches") or 0),
             "family": r.get("family") or "", "kernels": list(r.get("kernels") or []), "model": r.get("model") or "",
             "source": r.get("source") or "", "wall_s": r.get("wall_s"), "error": r.get("error"),
             "first_mismatch": r.get("first_mismatch")} for r in recs if r.get("refused") is None]
    counts = {k: s[k] for k in ("tried", "refused", "errors", "validated", "bit_exact_shapes", "outputs",
                                "bit_exact_outputs")}
    return {**params, **counts, "refusal": s["refusal"], "stopped": stopped, "worst": s["worst"], "shapes": rows}
