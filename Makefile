# fp4ref: every target sets up its own environment (scripts/python.sh).
SHELL := /bin/bash
# The interpreter, set up on first use (a .venv here; the system python3 on the GPU machine),
# with fp4ref installed editable; PYTHONPATH covers a machine where that install failed.
PY = $(shell scripts/python.sh)
export PYTHONPATH := $(CURDIR)$(if $(PYTHONPATH),:$(PYTHONPATH))
PYTEST_ARGS ?=
HYPOTHESIS_PROFILE ?= ci

.PHONY: env test test-slow test-gpu test-thorough check-layers probe validate-shapes probe-fleet bench verify-exhaustive report conform gate clean

env:
	@echo "python: $(PY)"

## Tests on CPU (CI runs this, then test-slow). GPU tests skip without a GPU; slow sweeps are test-slow's.
test:
	@$(PY) -m pytest -q -n 2 --dist worksteal -m "not slow" --hypothesis-profile=$(HYPOTHESIS_PROFILE) $(PYTEST_ARGS) tests

## The long sweeps (marker slow: every 16-bit pattern x policy cross product, the Triton
## interpreter sweep, the H200 _scaled_mm rowwise bf16-output inference); CI runs it after test.
test-slow:
	@FP4REF_SLOW_TESTS=1 $(PY) -m pytest -q -n 2 --dist worksteal -m slow --durations=10 \
		--hypothesis-profile=$(HYPOTHESIS_PROFILE) $(PYTEST_ARGS) tests

## GPU tests only (marker gpu), thorough hypothesis profile.
test-gpu:
	@$(PY) -m pytest -q -m gpu --hypothesis-profile=ci $(PYTEST_ARGS) tests

test-thorough:
	@$(PY) -m pytest -q -n 2 --hypothesis-profile=thorough $(PYTEST_ARGS) tests

## The import rules of docs/CONTRIBUTING.md: downward only, no private names across packages,
## no cycles (also part of make test).
check-layers:
	@$(PY) -m pytest -q tests/test_layering.py

## The main job: probe every native GEMM found here, write reports/<device>/<timestamp>/.
## Bounded to 5 minutes: devices still running then are reported as unfinished, not dropped.
## After its probe each device is checked at --random-shapes (default 4) uniformly drawn shapes
## within what is left of the budget (report: extra.random_shapes; docs/shapes.md).
PROBE_TIME_LIMIT ?= 290
probe:
	@$(PY) -m fp4ref probe --time-limit-s $(PROBE_TIME_LIMIT) $(PROBE_ARGS)

## Native GEMMs against their emulation at uniformly drawn shapes (M, N <= 4096, K <= 16384;
## refused shapes logged and redrawn), bit for bit, per device.  The JSONL log is appended and
## resumed (default reports/baselines/shapes/<machine>.jsonl; commit it: shapes accumulate).
## VALIDATE_SHAPES_ARGS='--devices cuda-cublas-* --shapes 200 --time-limit-s 500' make validate-shapes
VALIDATE_SHAPES_BASELINE ?= reports/baselines/redesign/h200-probe-after.json
VALIDATE_SHAPES_ARGS ?= --shapes 100
validate-shapes:
	@$(PY) -m fp4ref validate-shapes --baseline $(VALIDATE_SHAPES_BASELINE) $(VALIDATE_SHAPES_ARGS)

## Every GPU of this node (torchrun, one process per GPU) against the baseline's models.
## FLEET_GPUS=8 FLEET_OUT=reports/fleet make probe-fleet; multi-node / Slurm: docs/fleet.md.
FLEET_GPUS ?= 1
FLEET_OUT ?= reports/fleet
FLEET_BASELINE ?= reports/baselines/h200-580.159.04.json
probe-fleet:
	@$(PY) -m torch.distributed.run --standalone --nproc-per-node $(FLEET_GPUS) -m fp4ref fleet \
		--fingerprint --baseline $(FLEET_BASELINE) --out $(FLEET_OUT) $(FLEET_ARGS)

bench:
	@$(PY) -m fp4ref bench $(BENCH_ARGS)

## All 2**32 float32 inputs per format of 8 bits or fewer (GPU when present).
verify-exhaustive:
	@$(PY) -m fp4ref verify-exhaustive $(VERIFY_ARGS)

report:
	@$(PY) -m fp4ref report $(REPORT_ARGS)

conform:
	@$(PY) -m fp4ref conform $(CONFORM_ARGS)

gate:
	@$(PY) -m fp4ref gate $(GATE_ARGS)

clean:
	rm -rf .venv .pytest_cache .hypothesis
