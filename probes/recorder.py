"""Bit-exact comparison of a device's outputs with a model's: the validation record.

``ValidationRecorder`` counts matching codes, keeps the first mismatches as rows (hex bits,
decoded values, ULP distance, via reference.bits) and a ULP histogram of all of them; its
``to_dict()`` is the report's ``validation`` object (docs/report-schema.md).
"""
from __future__ import annotations

from reference.bits import decode_str, to_hex, ulp_distance
from reference.formats import CodeClass, get_format

__all__ = ["ValidationRecorder", "validation_record", "mismatch_record", "NONFINITE_BUCKET"]

NONFINITE_BUCKET = "nonfinite"  # ulp_histogram key for mismatches involving NaN


def mismatch_record(index, shape, fmt: str, expected_code: int, got_code: int) -> dict:
    """A mismatch row from two codes: hex bits, decoded values and ULP distance (reference.formats)."""
    return {"index": list(index) if isinstance(index, (tuple, list)) else int(index),
            "shape": [int(s) for s in shape], "format": fmt,
            "expected_bits": to_hex(int(expected_code), fmt), "got_bits": to_hex(int(got_code), fmt),
            "expected": decode_str(int(expected_code), fmt), "got": decode_str(int(got_code), fmt),
            "ulp": ulp_distance(int(expected_code), int(got_code), fmt)}


def _is_nan_code(code: int, spec) -> bool:
    return spec.classify(code) is CodeClass.NAN


class ValidationRecorder:
    """Accumulates bit-exact comparisons of one output format into a validation record.

    ``add(shape, expected_codes, got_codes)`` takes flat or nested int sequences or
    integer numpy arrays of codes (e.g. ``t.view(torch.int32)`` for float32).  Two NaN codes
    count as a match (NaN is compared by isnan); everything else by its bits (-0 != +0).
    Keeps the first ``keep`` mismatches as table rows; the ULP histogram counts all.
    """

    def __init__(self, fmt: str, keep: int = 50):
        self.spec = get_format(fmt)
        self.fmt = self.spec.name
        self.keep = keep
        self.outputs = 0
        self.matches = 0
        self.shapes: list[list[int]] = []
        self.mismatches: list[dict] = []
        self.hist: dict[str, int] = {}

    def add(self, shape, expected_codes, got_codes) -> int:
        """Compare one GEMM's outputs; returns the number of mismatches."""
        import numpy as np
        e = np.asarray(expected_codes).astype(np.int64).ravel()
        g = np.asarray(got_codes).astype(np.int64).ravel()
        if e.shape != g.shape:
            raise ValueError(f"got_codes: {g.size} codes but expected_codes has {e.size}")
        mask = (1 << self.spec.nbits) - 1
        e &= mask  # signed views (int32 of float32) -> unsigned codes
        g &= mask
        bad = np.nonzero(e != g)[0]
        nbad = 0
        for i in bad.tolist():
            ce, cg = int(e[i]), int(g[i])
            if _is_nan_code(ce, self.spec) and _is_nan_code(cg, self.spec):
                continue
            nbad += 1
            u = ulp_distance(ce, cg, self.spec)
            key = NONFINITE_BUCKET if u is None else str(u)
            self.hist[key] = self.hist.get(key, 0) + 1
            if len(self.mismatches) < self.keep:
                idx = np.unravel_index(i, np.asarray(expected_codes).shape)
                self.mismatches.append(mismatch_record([int(j) for j in idx], shape, self.fmt, ce, cg))
        self.outputs += int(e.size)
        self.matches += int(e.size) - nbad
        self.shapes.append([int(s) for s in shape])
        return nbad

    def to_dict(self) -> dict:
        if self.outputs == 0:
            raise ValueError("ValidationRecorder: no outputs were added; set validation to None instead")
        return validation_record(self.outputs, self.matches, self.shapes, self.mismatches, self.hist)


def validation_record(outputs: int, matches: int, shapes, mismatches, ulp_histogram) -> dict:
    def sort_key(k):
        return (1, 0) if k == NONFINITE_BUCKET else (0, int(k))
    return {"outputs": int(outputs), "matches": int(matches),
            "agreement_pct": 100.0 * matches / outputs, "shapes": [list(s) for s in shapes],
            "mismatches": list(mismatches),
            "ulp_histogram": {k: ulp_histogram[k] for k in sorted(ulp_histogram, key=sort_key)}}
