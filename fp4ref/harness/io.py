"""The project's one atomic file writer: readers see the old file or the whole new one.

Used by the harness (bench, conform, verify-exhaustive) and by probes/ and reports/ (they
import downward from here).  Protocol: serialize first (a bad object leaves nothing
behind), write a temp file in the target directory, fsync it, give it the mode open()
would, os.replace() it over the target, fsync the directory so the rename is durable.
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["write_json_atomic", "write_text_atomic", "write_bytes_atomic"]


def _umask_mode() -> int:
    """The mode open() would give a new file (0644 under the usual umask 022); mkstemp's
    temp files are 0600, which the rename would otherwise keep."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def write_bytes_atomic(path: "str | os.PathLike", data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (see the module doc); returns the path."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fchmod(f.fileno(), _umask_mode())
            os.fsync(f.fileno())
        os.replace(tmp, p)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    try:  # make the rename durable too
        dfd = os.open(p.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass
    return p


def write_json_atomic(path: "str | os.PathLike", obj: Any) -> Path:
    """``obj`` as JSON (indent 1, keys in insertion order, UTF-8, no NaN/Infinity: a
    non-finite float is a ValueError before anything is written), newline-terminated."""
    data = (json.dumps(obj, indent=1, sort_keys=False, allow_nan=False, ensure_ascii=False)
            + "\n").encode("utf-8")
    return write_bytes_atomic(path, data)


def write_text_atomic(path: "str | os.PathLike", text: str) -> Path:
    """``text`` (HTML, Markdown, ...) as UTF-8, written as-is."""
    return write_bytes_atomic(path, text.encode("utf-8"))
