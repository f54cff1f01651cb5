#!/usr/bin/env bash
# Prints the python interpreter fp4ref should use, setting one up if needed; every
# setup step goes to stderr with its elapsed time (stdout carries only the path).
# Order: $FP4REF_PYTHON; an existing .venv; a system python3 that already has the
# core packages (the GPU machine, which has no network: no venv there); else a new
# .venv with the pinned CPU build of torch (see shared/PLATFORM.md).
# The package itself is installed editable (pip install -e . --no-deps), so
# `import fp4ref` and the `fp4ref` command work from any folder; where pip cannot
# (offline, read-only site-packages) a .pth file or, last, PYTHONPATH (Makefile) serves.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
t0=$SECONDS
say() { echo "fp4ref setup [$((SECONDS - t0))s]: $*" >&2; }
need='import torch, numpy, mpmath, hypothesis, pytest, rich'

# True when $1 imports fp4ref from this checkout while run outside it (no cwd help).
has_self() {
  (cd / && "$1" -c 'import os, sys, fp4ref
sys.exit(os.path.dirname(os.path.dirname(os.path.realpath(fp4ref.__file__))) != sys.argv[1])' \
    "$(realpath "$root")") >/dev/null 2>&1
}

# Editable install of this checkout into interpreter $1; fallbacks keep `import fp4ref` working.
install_self() {
  local py=$1
  say "installing fp4ref itself into $py (pip install -e . --no-deps --no-build-isolation)"
  if "$py" -m pip install -e . --no-deps --no-build-isolation --disable-pip-version-check \
      >&2; then
    say "fp4ref installed (editable): import fp4ref and the fp4ref command work from any folder"
    return 0
  fi
  # offline or no setuptools: a .pth file puts the checkout on sys.path (no fp4ref command)
  local site
  site=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  if [ -w "$site" ] && echo "$root" > "$site/fp4ref-checkout.pth"; then
    say "pip install -e failed; wrote $site/fp4ref-checkout.pth (import fp4ref works;" \
        "use '$py -m fp4ref' for the command)"
    return 0
  fi
  say "could not install fp4ref into $py; make targets set PYTHONPATH=$root," \
      "elsewhere run: PYTHONPATH=$root $py -m fp4ref ..."
  return 1
}

if [ -n "${FP4REF_PYTHON:-}" ]; then echo "$FP4REF_PYTHON"; exit 0; fi

if [ -x .venv/bin/python ] && [ -f .venv/.fp4ref-ready ]; then
  has_self "$PWD/.venv/bin/python" || install_self "$PWD/.venv/bin/python" || true
  echo "$PWD/.venv/bin/python"; exit 0
fi

if [ -z "${FP4REF_FORCE_VENV:-}" ] && python3 -c "$need" >/dev/null 2>&1; then
  py=$(command -v python3)
  # try the install once per checkout; a failure is remembered (no retry on every make call)
  if ! has_self "$py" && [ ! -f build/.fp4ref-install-failed ]; then
    install_self "$py" || { mkdir -p build && touch build/.fp4ref-install-failed; }
  fi
  echo "$py"; exit 0
fi

say "creating .venv: torch 2.13.0 CPU build, numpy, mpmath, hypothesis, pytest, rich," \
    "ml_dtypes, torchao, jinja2, triton (about 1 GB; 1-2 minutes)"
python3 -m venv .venv
say "venv created; installing requirements-dev.txt (pip's progress follows)"
.venv/bin/pip install --disable-pip-version-check --progress-bar on -r requirements-dev.txt >&2
say "requirements installed"
# Transformer Engine: only its pure-Python wheel; the compiled extension needs CUDA.
.venv/bin/pip install -q --disable-pip-version-check --no-deps transformer-engine==2.20.2 >&2 \
  && say "transformer-engine python package installed" \
  || say "transformer-engine python package unavailable; its conformance cells will be skipped"
install_self "$PWD/.venv/bin/python" || true
touch .venv/.fp4ref-ready
say "ready: $PWD/.venv/bin/python"
echo "$PWD/.venv/bin/python"
