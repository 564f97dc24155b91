# Two commands on a fresh machine (only the package registries needed):
#   make bench   the XLA comparison benchmark (a tiny interpreted suite without a GPU)
#   make test    the CPU test suite (kernels run in Triton's / Mosaic GPU's interpreters)
# On a GPU machine that already has jax, jaxlib and triton but no network:
#   make gpu-test, make gpu-bench   (jax-triton comes from the wheel in .whl/)

VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=
# `make test`'s pytest workers (pytest-xdist): one per core, since the kernel
# interpreters run on one core each; TEST_WORKERS=0 runs in one process.
TEST_WORKERS ?= auto
BENCH_ARGS ?=

.PHONY: test bench gpu-test gpu-bench gpu-env clean

# A venv with jaxgemm installed editable and one extra of pyproject.toml (README.md's
# install section says what each gives). Said before pip starts, since the first
# install takes a minute or two; pip then names each package as it collects it.
$(VENV)/.installed-%: pyproject.toml setup.py
	@echo "==> make: installing jaxgemm (editable) and its [$*] extra into $(VENV)/" \
	      "(README.md, Install: what each extra gives); about 80 s the first time"
	python3 -m venv $(VENV)
	$(PY) -m pip install --disable-pip-version-check --progress-bar off -e '.[$*]'
	touch $@

# `slow`: heavy transformation tests of kernels whose CPU interpreter is slow
# (tests/conftest.py); they run compiled in gpu-test.
test: $(VENV)/.installed-test
	$(VENV)/bin/pytest -m "not slow" -n $(TEST_WORKERS) $(PYTEST_ARGS)

bench: $(VENV)/.installed-bench
	$(PY) -m bench $(BENCH_ARGS)

# The GPU machine's own python3: nothing is downloaded there. `pip download
# --no-deps -d .whl jax-triton==0.3.1` (on a machine with network) puts the
# one missing wheel in .whl/.
gpu-env:
	@if ls .whl/*.whl >/dev/null 2>&1; then \
	  python3 -m pip install -q --no-index --no-deps --target .gpu-site .whl/*.whl; fi
	python3 -m pip install -q --no-deps --no-build-isolation -e .

# Several pytest workers share the one GPU (PYTEST_ARGS="-n 6" with pytest-xdist: the
# tier is compile-bound), so none may preallocate most of its memory.
gpu-test: gpu-env
	PYTHONPATH=$(CURDIR)/.gpu-site XLA_PYTHON_CLIENT_PREALLOCATE=false \
	  python3 -m pytest -m "gpu or slow" $(PYTEST_ARGS)

gpu-bench: gpu-env
	PYTHONPATH=$(CURDIR)/.gpu-site python3 -m bench $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .gpu-site
