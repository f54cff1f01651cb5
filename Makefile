# fp4ref: every target sets up its own environment (scripts/python.sh).
SHELL := /bin/bash
PY = $(shell scripts/python.sh)
PYTEST_ARGS ?=
HYPOTHESIS_PROFILE ?= ci

.PHONY: env test test-gpu test-thorough probe bench verify-exhaustive report conform gate clean

env:
	@echo "python: $(PY)"

## Tests on CPU (CI runs this). GPU tests skip without a GPU.
test:
	@$(PY) -m pytest -q -n 2 --dist worksteal --hypothesis-profile=$(HYPOTHESIS_PROFILE) $(PYTEST_ARGS) tests

## GPU tests only (marker gpu), thorough hypothesis profile.
test-gpu:
	@$(PY) -m pytest -q -m gpu --hypothesis-profile=ci $(PYTEST_ARGS) tests

test-thorough:
	@$(PY) -m pytest -q -n 2 --hypothesis-profile=thorough $(PYTEST_ARGS) tests

## The main job: probe every native GEMM found here, write reports/<device>/<timestamp>/.
## Bounded to 5 minutes: devices still running then are reported as unfinished, not dropped.
PROBE_TIME_LIMIT ?= 290
probe:
	@$(PY) -m fp4ref probe --time-limit-s $(PROBE_TIME_LIMIT) $(PROBE_ARGS)

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
