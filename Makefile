# Every target bootstraps what it needs on a fresh machine.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# The test environment is pinned to the CPU build of torch 2.13.0; a bare
# "torch" requirement would pull a multi-GB CUDA build.
TORCH ?= torch==2.13.0
TORCH_LATEST ?= torch==2.14.1
PYTEST_ARGS ?=
# make test                 the suite against the editable install in .venv, less the slow
#                           end-to-end group (tests marked `slow`): the dev loop
# make test INSTALL=wheel   the built wheel in a fresh venv: the slow group and the packaging
#                           tests (CI runs both, so every test runs in CI; the whole suite
#                           against the wheel is `scripts/test-installed.sh full`, or tox)
INSTALL ?= editable

.PHONY: all test test-min test-latest check demo bench lint docs native clean

all: test

$(STAMP): pyproject.toml setup.py
	test -x $(PY) || PYTHON=$(PYTHON) scripts/torch-venv.sh $(VENV) "$(TORCH)"
	$(PY) -m pip install -q --disable-pip-version-check "$(TORCH)"
	$(PY) -m pip install -q --disable-pip-version-check -e ".[test,lint,docs]" "$(TORCH)"
	touch $(STAMP)

# The native harness is built once before the tests (as CI should), so no test pays
# for the build; without a compiler the tests use the pure-Python fallback.
ifeq ($(INSTALL),wheel)
test:
	@echo "Testing the package as users install it: sdist + wheel built, the wheel installed"
	@echo "in a fresh venv (.whl/), the slow group and the packaging tests run from a copy"
	@echo "without the sources (~40 slow tests: about 7 min on 2 cores)."
	TORCH="$(TORCH)" PYTHON="$(PYTHON)" scripts/test-installed.sh wheel $(PYTEST_ARGS)
else
test: $(STAMP)
	-$(PY) -m pytest_backends build-native
	@echo "Running the test suite on 2 xdist workers, the slow group left out (~2,100 tests:"
	@echo "about 10 min on 2 cores); make test INSTALL=wheel runs the slow group."
	$(PY) -m pytest -n 2 -q --durations=5 -m "not slow" $(PYTEST_ARGS)
endif

# The declared floor (pytest 8.0, pluggy 1.3, pytest-xdist 3.3, hypothesis 6.80) and the
# newest torch pip allows here: each against the installed wheel, on a focused subset.
test-min:
	TORCH="$(TORCH)" PYTHON="$(PYTHON)" scripts/test-installed.sh min $(PYTEST_ARGS)

test-latest:
	TORCH_LATEST="$(TORCH_LATEST)" PYTHON="$(PYTHON)" scripts/test-installed.sh latest $(PYTEST_ARGS)

# What CI runs (.ci/run): lint, docs, the README's Quick start commands as it writes them,
# then the installed wheel, the minimum versions and the newest torch.
check: lint docs
	python3 scripts/quickstart.py README.md | while read -r command; do \
		echo "README: $$command"; bash -c "$$command" || exit 1; done
	$(MAKE) test INSTALL=wheel
	$(MAKE) test-min
	$(MAKE) test-latest

# The demo exits non-zero only if the plugin misbehaves; its planted failures are the point.
demo: $(STAMP)
	-$(PY) -m pytest_backends build-native
	$(PY) demo/run_demo.py demo-output

# pytest-torch is only a point of comparison for the determinism benchmark: it is
# installed beside the venv (it registers a pytest plugin of its own) and put
# on PYTHONPATH for that benchmark alone.
BENCH_DEPS := .bench-deps
bench: $(STAMP)
	test -d $(BENCH_DEPS) || $(PY) -m pip install -q --disable-pip-version-check --no-deps \
		--target $(BENCH_DEPS) "pytest-torch==1.1.1" || true
	PYTEST_BACKENDS_BENCH_DEPS=$(BENCH_DEPS) $(PY) benchmarks/run_all.py

lint: $(STAMP)
	$(VENV)/bin/ruff check pytest_backends tests benchmarks examples demo setup.py
	$(VENV)/bin/ruff format --check pytest_backends tests benchmarks examples demo setup.py
	$(VENV)/bin/mypy --strict pytest_backends

docs: $(STAMP)
	$(PY) -m sphinx -W --keep-going -b html docs docs/_build/html

native: $(STAMP)
	$(PY) -m pytest_backends build-native

clean:
	rm -rf $(VENV) .whl docs/_build .pytest_cache .mypy_cache .ruff_cache demo-output
