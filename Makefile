# Every target bootstraps its own virtualenv on a fresh machine.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# The test environment is pinned to the CPU build of torch 2.13.0; a bare
# "torch" requirement would pull a multi-GB CUDA build.
TORCH ?= torch==2.13.0
PYTEST_ARGS ?=

.PHONY: all test demo bench lint docs native clean

all: test

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check "$(TORCH)"
	$(PY) -m pip install -q --disable-pip-version-check -e ".[test,lint,docs]" "$(TORCH)"
	touch $(STAMP)

# The native harness is built once before the tests (as CI should), so no test pays
# for the build; without a compiler the tests use the pure-Python fallback.
test: $(STAMP)
	-$(PY) -m pytest_backends build-native
	$(PY) -m pytest -n 2 -q $(PYTEST_ARGS)

demo: $(STAMP)
	$(PY) -m pytest examples -p no:randomly --backends-matrix --backends-verify \
		--backends-report=examples-report.json --backends-html=examples-report.html -q -rs || true
	@echo "JSON report: examples-report.json   HTML grid: examples-report.html"

# pytest-torch is only a point of comparison for the determinism benchmark: it is
# installed beside the venv (it registers a pytest plugin of its own) and put
# on PYTHONPATH for that benchmark alone.
BENCH_DEPS := .bench-deps
bench: $(STAMP)
	test -d $(BENCH_DEPS) || $(PY) -m pip install -q --disable-pip-version-check --no-deps \
		--target $(BENCH_DEPS) "pytest-torch==1.1.1" || true
	PYTEST_BACKENDS_BENCH_DEPS=$(BENCH_DEPS) $(PY) benchmarks/run_all.py

lint: $(STAMP)
	$(VENV)/bin/ruff check pytest_backends tests benchmarks examples
	$(VENV)/bin/ruff format --check pytest_backends tests benchmarks examples
	$(VENV)/bin/mypy --strict pytest_backends

docs: $(STAMP)
	$(PY) -m sphinx -W --keep-going -b html docs docs/_build/html

native: $(STAMP)
	$(PY) -m pytest_backends build-native

clean:
	rm -rf $(VENV) docs/_build .pytest_cache .mypy_cache .ruff_cache
