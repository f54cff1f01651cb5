#!/usr/bin/env bash
# Prints the python interpreter fp4ref should use, setting one up if needed.
# Order: $FP4REF_PYTHON; an existing .venv; a system python3 that already has
# the core packages (e.g. the GPU machine, which has no network); else a new
# .venv with the pinned CPU build of torch (see shared/PLATFORM.md).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -n "${FP4REF_PYTHON:-}" ]; then echo "$FP4REF_PYTHON"; exit 0; fi
need='import torch, numpy, mpmath, hypothesis, pytest, rich'
if [ -x .venv/bin/python ] && [ -f .venv/.fp4ref-ready ]; then echo "$PWD/.venv/bin/python"; exit 0; fi
if [ -z "${FP4REF_FORCE_VENV:-}" ] && python3 -c "$need" >/dev/null 2>&1; then
  command -v python3; exit 0
fi
{
  echo "fp4ref: creating .venv (torch 2.13.0 CPU build, numpy, mpmath, hypothesis, pytest, rich, ml_dtypes, torchao, jinja2, transformer-engine python package)"
  python3 -m venv .venv
  .venv/bin/pip install -q --disable-pip-version-check -r requirements-dev.txt
  # Transformer Engine: only its pure-Python wheel; the compiled extension needs CUDA.
  .venv/bin/pip install -q --disable-pip-version-check --no-deps transformer-engine==2.20.2 || \
    echo "fp4ref: transformer-engine python package unavailable; its conformance cells will be skipped"
  touch .venv/.fp4ref-ready
} >&2
echo "$PWD/.venv/bin/python"
