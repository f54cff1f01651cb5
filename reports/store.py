"""Where reports live: reports/<machine>/<UTC stamp>/report.json, and finding the newest."""
from __future__ import annotations

import datetime as _dt
import os
from pathlib import Path
from typing import Iterable

from .environment import machine_slug
from .schema import ReportError

__all__ = ["run_dir", "find_reports", "newest_report"]


def run_dir(root: "str | os.PathLike" = "reports", group: str | None = None,
            environment: dict | None = None, created: str | None = None) -> Path:
    """reports/<group>/<UTC stamp>/ (group: machine_slug() by default); a fresh directory name
    that the reports/*/*/report.json lookup of `fp4ref report` and `fp4ref gate` finds.
    ``created``: the report's start time (utc_now() form), so the folder is named by when
    the run started, as its 'created' field says; default now."""
    group = group or machine_slug(environment)
    stamp = (created.replace("-", "").replace(":", "") if created
             else _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ"))
    p = Path(root) / group / stamp
    n = 1
    while p.exists():
        n += 1
        p = Path(root) / group / f"{stamp}-{n}"
    return p


def find_reports(root: "str | os.PathLike" = "reports") -> list[Path]:
    """reports/*/*/report.json, oldest first (by modification time, then path)."""
    files = [p for p in Path(root).glob("*/*/report.json") if p.is_file()]
    return sorted(files, key=lambda p: (p.stat().st_mtime_ns, str(p)))


def newest_report(root: "str | os.PathLike" = "reports", exclude: Iterable = ()) -> Path:
    ex = {Path(e).resolve() for e in exclude}
    files = [p for p in find_reports(root) if p.resolve() not in ex]
    if not files:
        raise ReportError(f"no report found: nothing matches {Path(root) / '*' / '*' / 'report.json'}; "
                          "run `make probe` or pass --input/--current")
    return files[-1]
